// model/run/train.cpp: the training loop and sampling (see model/run/train.h).
#include "train.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <csignal>
#include <cstdlib>
#include <set>
#include <vector>

#include "../../data/errors.h"
#include "../../data/tokens.h"
#include "../../kernels/philox.h"
#include "../formats/json_io.h"
#include "dist.h"
#include "schedule.h"

namespace tg {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// A duration as people read it: 45s, 12m05s, 2h03m.
std::string hms(double seconds) {
  const long t = std::lround(std::max(0.0, seconds));
  char buf[32];
  if (t < 60) std::snprintf(buf, sizeof buf, "%lds", t);
  else if (t < 3600) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t % 3600 / 60);
  return buf;
}

// A number for metrics.jsonl, rounded as printf's format f rounds it. JSON has no NaN or Inf:
// those stay non-finite, and nlohmann-json writes them as null.
double jnum(const char* f, double x) { return std::isfinite(x) ? std::strtod(fmt(f, x).c_str(), nullptr) : x; }

// A metrics.jsonl line: the fields in order, keys and values written by nlohmann-json, spaced
// as Python's json.dumps spaces them: {"step": 3, "train_loss": 4.17433, "lr": 0.0006, ...}.
std::string metrics_line(const jsonio::Out& fields) {
  std::string s = "{";
  for (size_t i = 0; i < fields.keys().size(); ++i) {
    if (s.size() > 1) s += ", ";
    s += jsonio::dump(fields.keys()[i]) + ": " + jsonio::dump(fields.values()[i]);
  }
  return s + "}";
}
std::string metrics_line(const std::vector<std::pair<std::string, jsonio::Out>>& fields) {
  jsonio::Out o = jsonio::Out::object();
  for (const auto& [key, value] : fields) o[key] = value;
  return metrics_line(o);
}

// Steps whose loss is replaced by NaN, from the environment variable TG_INJECT_NAN ("3,4,7"):
// the hook tests use to exercise the NaN guard.
std::set<int> injected_nan_steps() {
  std::set<int> steps;
  const char* env = std::getenv("TG_INJECT_NAN");
  for (const char* p = env; p && *p;) {
    char* end = nullptr;
    long v = std::strtol(p, &end, 10);
    if (end == p) break;
    steps.insert((int)v);
    p = *end == ',' ? end + 1 : end;
  }
  return steps;
}

// The step at which this rank throws, from TG_INJECT_FAIL="rank:step" (-1: none): the hook tests
// use to make one data-parallel rank fail while the others wait for it in the step's all-reduce.
int injected_failure_step() {
  const char* env = std::getenv("TG_INJECT_FAIL");
  int rank = -1, step = -1;
  if (!env || std::sscanf(env, "%d:%d", &rank, &step) != 2 || rank != dist::rank()) return -1;
  return step;
}

volatile std::sig_atomic_t g_stop = 0, g_defer = 0, g_pending = 0;

}  // namespace

void request_stop() { g_stop = 1; }
bool stop_requested() { return g_stop != 0; }
void forget_stop_request() { g_stop = 0; }
void defer_stop_requests() { g_defer = 1; }
bool stop_pending() { return g_pending != 0; }

void install_stop_handler() {
  struct sigaction sa = {};
  sa.sa_handler = [](int) {
    if (g_defer) g_pending = 1;
    else request_stop();
  };
  // it stays installed: a signal often comes twice (timeout and Ctrl-C signal the whole process
  // group as well), and the second must not kill the run as it writes its checkpoint
  sa.sa_flags = 0;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGXFSZ, SIG_IGN);
}

double estimate_loss(Backend& be, const Config& c, const data::Dataset& ds, int split,
                     const std::function<void(int k)>& on_batch) {
  // data parallel: rank r evaluates batches r, r + W, r + 2W, ...; the batches' losses are
  // then summed over the ranks (each slot holds one rank's loss, the others' 0: exact) and
  // added in batch order on every rank, in double as one process adds them: the same bits
  std::vector<int32_t> x((size_t)c.batch_size * c.block_size), y(x.size());
  std::vector<double> loss((size_t)c.eval_iters, 0.0);
  for (int k = dist::rank(); k < c.eval_iters; k += dist::world()) {
    throw_if_stop_requested();
    ds.eval_batch(c.seed, (uint32_t)split, (uint32_t)k, c.batch_size, c.block_size, x.data(), y.data());
    loss[(size_t)k] = be.eval_loss(x.data(), y.data());
    if (on_batch) on_batch(k);
  }
  dist::all_reduce_sum(loss.data(), loss.size());
  double sum = 0;
  for (double l : loss) sum += l;
  return sum / c.eval_iters;
}

TrainSummary train(Backend& be, const Config& c, const data::Dataset& ds, std::ostream& log, const TrainHooks& hooks,
                   const Progress& start) {
  TrainSummary s;
  s.best_val_loss = INFINITY;
  std::vector<int32_t> x((size_t)c.batch_size * c.block_size), y(x.size());
  std::vector<double> step_ms;
  const double tokens_per_step = (double)c.batch_size * c.block_size * c.grad_accum * dist::world();
  // MFU as llm.c counts it: 6 N FLOPs per token for the matmuls of forward and backward plus
  // 6 L C T for attention, against the device's dense bf16 peak (none when unknown)
  const ModelConfig mc{ds.vocab_size(), c.block_size, c.n_layer, c.n_head, c.n_embd, c.bias, ds.padded_vocab()};
  const double flops_per_token =
      6.0 * (double)param_count(param_table(mc)) + 6.0 * c.n_layer * (double)c.n_embd * c.block_size;
  const double peak = be.peak_flops() * dist::world();  // every rank's device
  const std::set<int> injected = injected_nan_steps();
  const int fail_at = injected_failure_step();
  // a live progress line when the log is a terminal; plain lines otherwise
  // (not under mpirun: OpenMPI gives the ranks a pseudo-terminal wherever its own output goes)
  const bool progress = &log == &std::cout && isatty(STDOUT_FILENO) && !dist::active();
  const std::string resume_cmd = "train_gpt --resume --out-dir " + c.out_dir;
  double ms_sum = 0;

  // metrics lines: once one cannot be written, the rest of the step's lines are kept for the
  // checkpoint (unlogged) and the run stops after the step (stop_if_metrics_lost)
  std::vector<std::string> unlogged;
  std::string metrics_error;
  auto write_metrics = [&](const std::string& line) {
    if (!hooks.metrics) return;
    if (metrics_error.empty()) {
      try {
        hooks.metrics(line);
        return;
      } catch (const RuntimeError& e) {
        metrics_error = e.what();
      }
    }
    unlogged.push_back(line);
  };
  // a checkpoint of the state as of p: its path, or what went wrong ("" without a hook)
  auto save = [&](const Progress& p, std::string* error) -> std::string {
    if (!hooks.checkpoint) return "";
    if (!error) return hooks.checkpoint(p, unlogged);
    try {
      return hooks.checkpoint(p, unlogged);
    } catch (const RuntimeError& e) {
      *error = e.what();
      return "";
    }
  };
  // a checkpoint that every rank comes to: ZeRO-1's shards of the AdamW state are gathered on
  // rank 0 first (a collective); rank 0's own checkpoints (stop_if_metrics_lost) cannot gather
  // them, and a sharded run's fails there with the backend's line
  auto save_all = [&](const Progress& p, std::string* error) -> std::string {
    be.gather_state();
    return save(p, error);
  };
  auto stop_if_metrics_lost = [&](const Progress& p, const std::string& saved) {
    if (metrics_error.empty()) return;
    std::string error, path = saved.empty() ? save(p, &error) : saved;
    const std::string state =
        !path.empty() ? "the run stopped before step " + std::to_string(p.step) + " and saved its state and the " +
                            std::to_string(unlogged.size()) + " unwritten line(s) in " + path
        : !error.empty() ? "the run stopped before step " + std::to_string(p.step) +
                               " and its checkpoint could not be written either (" + error + ")"
                         : "the run stopped before step " + std::to_string(p.step);
    throw RuntimeError(metrics_error + "; " + state + "; expected a --out-dir with free space; free some, then continue with: " +
                       resume_cmd);
  };

  Progress p = start;
  const auto t_start = Clock::now();
  const std::string resume_hint = "; Ctrl-C stops it with a checkpoint (continue with: " + resume_cmd + ")";
  bool long_run_checked = false;
  double eval_s = 0;  // the last evaluation's time, for the time left
  // the time left, from the steps timed so far and the evaluations still to come
  auto time_left_s = [&](int next_step) {
    if (step_ms.empty()) return 0.0;
    const int evals = c.eval_interval > 0 ? (c.max_iters - 1) / c.eval_interval - (next_step - 1) / c.eval_interval : 0;
    return ms_sum / step_ms.size() * (c.max_iters - next_step) / 1e3 + eval_s * (std::max(evals, 0) + 1);
  };
  // an evaluation of both splits; on a terminal one that lasts more than two seconds shows its
  // progress in place
  auto evaluate = [&](int step, double& train_est, double& val) {
    const auto t0 = Clock::now();
    double shown = 0;
    std::function<void(int)> show;
    if (progress)
      show = [&, t0](int done) {
        const double t = seconds_since(t0);
        if (t < 2 || t - shown < 0.25) return;
        shown = t;
        const double frac = (double)(done + 1) / (2.0 * c.eval_iters);
        log << "\r\033[K" << "step " << step << ": evaluating, batch " << done + 1 << "/" << 2 * c.eval_iters
            << " | ETA " << hms(t / frac - t) << std::flush;
      };
    train_est = estimate_loss(be, c, ds, 0, show);
    val = estimate_loss(be, c, ds, 1, show ? [&](int k) { show(c.eval_iters + k); } : std::function<void(int)>());
    eval_s = seconds_since(t0);
  };
  for (;; ) {
    const int step = p.step;
    // a checkpoint holds the state before this step: every ckpt_interval steps
    std::string saved;
    const bool ckpt_now = c.ckpt_interval > 0 && step > start.step && step < c.max_iters && step % c.ckpt_interval == 0;
    if (ckpt_now) saved = save_all(p, nullptr);
    try {
      // SIGINT / SIGTERM, honoured before every step (skipped ones included) and, through
      // Interrupted, inside steps and evaluations
      if (step < c.max_iters) throw_if_stop_requested();
      const double lr = lr_at(step, c.lr, c.min_lr, c.warmup_iters, c.lr_decay_iters);
      const bool last = step >= c.max_iters;
      const bool eval = last || (c.eval_interval > 0 && step % c.eval_interval == 0);
      double train_est = 0, val = 0;
      // evaluations are spread over the ranks (estimate_loss); rank 0 logs them
      if (eval) {
        evaluate(step, train_est, val);
        s.best_val_loss = std::min(s.best_val_loss, val);
        if (progress) log << "\r\033[K";
        log << "step " << step << ": train loss " << fmt("%.4f", train_est) << ", val loss " << fmt("%.4f", val)
            << std::endl;
      }
      if (last) {
        s.final_train_loss = train_est;
        s.final_val_loss = val;
        write_metrics(metrics_line({{"step", step},
                                    {"train_loss", nullptr},
                                    {"val_loss", jnum("%.6f", val)},
                                    {"eval_train_loss", jnum("%.6f", train_est)},
                                    {"lr", jnum("%.6e", lr)},
                                    {"ms", nullptr},
                                    {"tokens_per_s", nullptr},
                                    {"final", true}}));
        stop_if_metrics_lost(p, save_all(p, nullptr));
        break;
      }
      const auto t0 = Clock::now();
      // --grad-accum N: N micro-batches, micro-batch k being rows k B .. of the step's batch
      // of N B (data/dataset.h), gradients accumulated; the step's loss is their mean. On W
      // data-parallel ranks (model/run/dist.h) the step is W N micro-batches: rank r runs
      // r N .. r N + N - 1 of them, exactly those a single process with --grad-accum W N runs
      // at those indices (the same rows, the same dropout keys); one all-reduce sums the
      // gradients, one more the losses with the ranks' pending stops.
      const int first = dist::rank() * c.grad_accum, micro_batches = dist::world() * c.grad_accum;
      double sums[2] = {0, 0};  // the losses of this rank's micro-batches; a stop pending here
      for (int k = first; k < first + c.grad_accum; ++k) {
        ds.train_batch(c.seed, (uint32_t)step, c.batch_size, c.block_size, x.data(), y.data(),
                       (uint32_t)k * (uint32_t)c.batch_size);
        sums[0] += be.forward_backward(x.data(), y.data(), (uint32_t)step, k, micro_batches, first);
      }
      if (step == fail_at)
        throw RuntimeError("failure injected by TG_INJECT_FAIL at step " + std::to_string(step) + " (a test hook); expected none; unset TG_INJECT_FAIL");
      if (dist::active()) {
        be.reduce_grads();
        sums[1] = stop_pending() ? 1 : 0;
        dist::all_reduce_sum(sums, 2);
        if (sums[1] > 0) {  // a rank was signalled: every rank stops before this step
          request_stop();
          throw Interrupted{};
        }
      }
      float loss = (float)(sums[0] / micro_batches);
      const double norm = be.grad_norm();
      if (injected.count(step)) loss = NAN;
      // NaN guard: a non-finite loss or gradient norm skips the update (weights and AdamW state
      // stay as they were); kMaxBadSteps of them in a row stop the run
      if (!std::isfinite(loss) || !std::isfinite(norm)) {
        ++s.skipped;
        s.steps = step + 1;
        p = Progress{step + 1, p.updates, p.bad_steps + 1};
        if (progress) log << "\r\033[K";
        log << "step " << step << ": loss " << loss << ", gradient norm " << norm << ": not finite, update skipped ("
            << p.bad_steps << " in a row)" << std::endl;
        write_metrics(metrics_line({{"step", step}, {"train_loss", nullptr}, {"skipped", true}}));
        stop_if_metrics_lost(p, "");
        if (p.bad_steps >= kMaxBadSteps) {
          // the weights are those of the last good step: saved with the count reset, so that a
          // resume with other hyperparameters goes on from them
          std::string error;
          const std::string path = save_all(Progress{p.step, p.updates, 0}, &error);
          dist::barrier();  // every rank stops here: none ends the job while rank 0 writes that checkpoint
          const std::string kept = !path.empty()    ? "; the last good weights are saved in " + path
                                   : !error.empty() ? "; the last good weights could not be saved (" + error + ")"
                                                    : "";
          throw RuntimeError(std::to_string(kMaxBadSteps) + " steps in a row (the last at step " + std::to_string(step) +
                             ") had a non-finite loss or gradient norm" + kept +
                             "; expected finite values; lower --lr (now " + fmt("%g", c.lr) +
                             ") or raise --warmup-iters (now " + std::to_string(c.warmup_iters) +
                             ") and check --data" + (path.empty() ? "" : ", then continue with: " + resume_cmd +
                                                                            " --lr " + fmt("%g", c.lr / 2)));
        }
        continue;
      }
      be.update((float)lr, p.updates + 1, norm);
      p = Progress{step + 1, p.updates + 1, 0};
      const double ms = seconds_since(t0) * 1e3;
      step_ms.push_back(ms);
      ms_sum += ms;
      s.steps = step + 1;
      if (progress) log << "\r\033[K";  // clear the live line before a log line
      if (step % c.log_interval == 0 || eval) {
        const double tps = tokens_per_step / (ms / 1e3);
        log << "step " << step << "/" << c.max_iters << " | loss " << fmt("%.4f", loss) << " | lr " << fmt("%.3e", lr)
            << " | norm " << fmt("%.4f", norm) << " | " << fmt("%.1f", ms) << " ms | " << fmt("%.0f", tps) << " tok/s";
        if (peak > 0) log << " | mfu " << fmt("%.1f", 100.0 * flops_per_token * tps / peak) << "%";
        log << " | ETA " << hms(time_left_s(step + 1)) << std::endl;
        jsonio::Out line = jsonio::Out::object();
        line["step"] = step;
        line["train_loss"] = jnum("%.6f", loss);
        if (eval) {
          line["val_loss"] = jnum("%.6f", val);
          line["eval_train_loss"] = jnum("%.6f", train_est);
        }
        line["lr"] = jnum("%.6e", lr);
        line["grad_norm"] = jnum("%.6f", norm);
        line["ms"] = jnum("%.3f", ms);
        line["tokens_per_s"] = jnum("%.1f", tps);
        if (peak > 0) line["mfu"] = jnum("%.4f", flops_per_token * tps / peak);
        write_metrics(metrics_line(line));
      } else if (progress) {  // on a terminal, between logged steps: where the run is, in place
        log << "step " << step << "/" << c.max_iters << " | loss " << fmt("%.4f", loss) << " | "
            << fmt("%.1f", ms) << " ms/step | ETA " << hms(time_left_s(step + 1)) << std::flush;
      }
      stop_if_metrics_lost(p, "");
      // a CPU run that will take long says so, once its first three steps (or ten seconds of
      // them) predict it
      if (!long_run_checked && (step_ms.size() >= 3 || ms_sum > 1e4)) {
        long_run_checked = true;
        if (be.device_name().rfind("cpu", 0) == 0 && time_left_s(step + 1) > 600) {
          if (progress) log << "\r\033[K";
          log << "note: on the CPU this run will take about " << hms(time_left_s(step + 1)) << " more ("
              << c.max_iters - step - 1 << " steps at " << fmt(ms_sum / step_ms.size() < 10 ? "%.1f" : "%.0f", ms_sum / step_ms.size())
              << " ms, evaluations included); a GPU or --preset baby is much faster" << resume_hint << std::endl;
        }
      }
    } catch (const Interrupted&) {
      // the step or evaluation was cut short and changed nothing: the run stops before it
      if (step > start.step) s.checkpoint = ckpt_now ? saved : save_all(p, nullptr);
      s.stopped = true;
      break;
    }
  }
  if (progress) log << "\r\033[K" << std::flush;
  s.wall_s = seconds_since(t_start);
  if (!step_ms.empty()) {
    std::sort(step_ms.begin(), step_ms.end());
    s.median_step_ms = step_ms[step_ms.size() / 2];
  }
  return s;
}

namespace {
// Draws c.sample_tokens tokens after idx (the prompt's ids, at least one) from the first V
// logits, writing decode(token) of each to out as it comes; returns decode of the whole.
std::string sample_ids(Backend& be, const Config& c, std::vector<int32_t> idx, int V,
                       const std::function<std::string(const int32_t*, size_t)>& decode, std::ostream& out) {
  std::vector<float> logits(V);
  std::vector<double> prob(V);
  std::vector<int> order(V);
  // the prompt goes through the KV cache one token at a time; logits are then those of its
  // last position (the backend crops the context to block_size tokens as nanoGPT does)
  be.generate_reset();
  for (int32_t t : idx) be.generate_step(t, logits.data());
  for (int n = 0; n < c.sample_tokens && !stop_requested(); ++n) {
    if (n > 0) be.generate_step(idx.back(), logits.data());
    for (float l : logits)
      if (!std::isfinite(l))
        throw RuntimeError("the model's logits are not finite, so there is nothing to sample; expected a model "
                           "that trained without diverging; lower --lr or raise --warmup-iters");
    // temperature, then keep the top_k largest logits, then softmax
    for (int v = 0; v < V; ++v) order[v] = v;
    int k = (c.top_k > 0 && c.top_k < V) ? c.top_k : V;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return logits[a] > logits[b]; });
    const double mx = logits[order[0]] / c.temperature;
    double sum = 0;
    std::fill(prob.begin(), prob.end(), 0.0);
    for (int r = 0; r < k; ++r) sum += prob[order[r]] = std::exp(logits[order[r]] / c.temperature - mx);
    // top-p (nucleus): of those, the most likely whose probabilities first reach top_p of the
    // total (at least one); order[0 .. k) is already by decreasing probability. 1 keeps all.
    if (c.top_p < 1) {
      double kept = 0;
      int r = 0;
      while (r < k && (r == 0 || kept < c.top_p * sum)) kept += prob[order[r++]];
      k = r;
      sum = kept;
    }
    // one uniform in [0, 1) from the sampling stream, keyed by the token's position
    philox::U32x4 w = philox::stream_words(c.seed, philox::kStreamSample, (uint32_t)idx.size(), 0, 0);
    double u = (w.v[0] + 0.5) / 4294967296.0 * sum, acc = 0;
    int next = order[k - 1];
    for (int r = 0; r < k; ++r) {
      acc += prob[order[r]];
      if (u < acc) { next = order[r]; break; }
    }
    idx.push_back(next);
    out << decode(&idx.back(), 1) << std::flush;
  }
  out << "\n";
  return decode(idx.data(), idx.size());
}
}  // namespace

std::string sample(Backend& be, const Config& c, const data::CharTokenizer& tok, std::ostream& out) {
  std::vector<int32_t> idx = tok.encode(c.prompt);
  out << c.prompt << std::flush;
  if (c.sample_tokens <= 0) {
    out << "\n";
    return c.prompt;
  }
  if (idx.empty())
    throw InputError("--prompt is empty; expected at least one character to start the sample from; pass --prompt "
                     "TEXT (the default is a newline) or --sample-tokens 0");
  return sample_ids(be, c, idx, tok.vocab_size(),
                    [&](const int32_t* ids, size_t n) { return tok.decode(ids, n); }, out);
}

std::string sample_tokens(Backend& be, const Config& c, int V, const data::Gpt2Tokenizer* tok, std::ostream& out) {
  const int32_t start = tok && tok->eot >= 0 ? tok->eot : data::kGpt2Vocab - 1;  // <|endoftext|>
  if (tok && (int)tok->tokens.size() < V)
    throw InputError("--tokenizer holds " + std::to_string(tok->tokens.size()) + " tokens but the data has " +
                     std::to_string(V) + "; expected llm.c's GPT-2 tokenizer (50257 tokens); pass gpt2_tokenizer.bin");
  if (c.sample_tokens <= 0) return "";
  // with the tokenizer: the tokens' bytes; without: the ids, space-separated
  auto decode = [&](const int32_t* ids, size_t n) -> std::string {
    if (tok) return tok->decode(ids, n);
    std::string s;
    for (size_t i = 0; i < n; ++i) s += (i ? " " : "") + std::to_string(ids[i]);
    return s;
  };
  out << decode(&start, 1) << std::flush;
  return sample_ids(be, c, {start}, V,
                    [&](const int32_t* ids, size_t n) { return (tok || n > 1 ? "" : " ") + decode(ids, n); }, out);
}

}  // namespace tg
