// model/run/train.cpp: the training loop and sampling (see model/run/train.h).
#include "train.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <set>
#include <utility>
#include <vector>

#include "../../data/errors.h"
#include "../../data/tokens.h"
#include "../../kernels/philox.h"
#include "../formats/json_io.h"
#include "dist.h"
#include "schedule.h"

namespace tg {

RunShape run_shape(const Config& c) {
  RunShape run;
  run.B = c.batch_size;
  run.T = c.block_size;
  run.accum = c.grad_accum;
  run.dropout = c.dropout;
  run.attention = attention_path(c.attention);
  run.both_paths = c.attention == Attention::Check;
  run.gelu = c.gelu;
  run.precision = c.precision;
  run.seed = c.seed;
  run.grad_clip = c.grad_clip;
  run.beta1 = c.beta1;
  run.beta2 = c.beta2;
  run.weight_decay = c.weight_decay;
  if (c.zero == 1 && dist::world() > 1) {
    run.shard_ranks = dist::world();
    run.shard_rank = dist::rank();
  }
  return run;
}

namespace {

// Reads a batch (read()). Alone, its bad input (InputError: a token id past the vocabulary) is
// thrown as it is. On data-parallel ranks it is kept in bad and false returned: the other ranks
// wait in the collective that follows, which this one joins, and which tells every rank of it.
template <class Read>
bool read_batch(std::string& bad, Read&& read) {
  try {
    read();
    return true;
  } catch (const InputError& e) {
    if (!dist::active()) throw;
    bad = e.what();
    return false;
  }
}

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

// Faults the tests inject through the environment, read once when train() begins.
struct TestFaults {
  std::set<int> nan_steps;  // TG_INJECT_NAN="3,4,7": these steps' losses become NaN (the NaN guard's test)
  int fail_step = -1;       // TG_INJECT_FAIL="rank:step": this rank throws at that step while the others
                            // wait for it in the step's all-reduce (-1: none, or another rank's)

  static TestFaults from_env() {
    TestFaults f;
    const char* env = std::getenv("TG_INJECT_NAN");
    for (const char* p = env; p && *p;) {
      char* end = nullptr;
      long v = std::strtol(p, &end, 10);
      if (end == p) break;
      f.nan_steps.insert((int)v);
      p = *end == ',' ? end + 1 : end;
    }
    const char* fail = std::getenv("TG_INJECT_FAIL");
    int rank = -1, step = -1;
    if (fail && std::sscanf(fail, "%d:%d", &rank, &step) == 2 && rank == dist::rank()) f.fail_step = step;
    return f;
  }
};

// metrics.jsonl as train() writes it: each line through the hook until one cannot be written;
// from then on the lines are held back (a checkpoint keeps them, a resumed run writes them)
// and the run stops after its step (TrainLoop::stop_if_metrics_lost).
class MetricsLog {
 public:
  explicit MetricsLog(std::function<void(const std::string& line)> sink) : sink_(std::move(sink)) {}
  void write(const std::string& line) {
    if (!sink_) return;
    if (error_.empty()) {
      try {
        sink_(line);
        return;
      } catch (const RuntimeError& e) {
        error_ = e.what();
      }
    }
    held_.push_back(line);
  }
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }  // the failed write's
  const std::vector<std::string>& held() const { return held_; }

 private:
  std::function<void(const std::string& line)> sink_;
  std::string error_;
  std::vector<std::string> held_;
};

// An evaluation of both splits (done: at this step).
struct Evaluation {
  bool done = false;
  double train = 0, val = 0;
};

// The forward and backward of a step: its mean loss, the norm of its summed gradient, and when
// it began (a step's time runs to the end of its update).
struct StepLoss {
  float loss = 0;
  double norm = 0;
  Clock::time_point t0;
};

// The steps train() runs, and what they share: the log, the metrics, the timings, the summary.
class TrainLoop {
 public:
  TrainLoop(Backend& be, const Config& c, const data::Dataset& ds, std::ostream& log, const TrainHooks& hooks,
            const Progress& start, TestFaults faults)
      : be_(be), c_(c), ds_(ds), log_(log), hooks_(hooks), start_(start), faults_(std::move(faults)),
        metrics_(hooks.metrics), x_((size_t)c.batch_size * c.block_size), y_(x_.size()),
        live_(&log == &std::cout && isatty(STDOUT_FILENO) && !dist::active()),
        resume_cmd_("train_gpt --resume --out-dir " + c.out_dir) {
    s_.best_val_loss = INFINITY;
    tokens_per_step_ = (double)c.batch_size * c.block_size * c.grad_accum * dist::world();
    // MFU as llm.c counts it: 6 N FLOPs per token for the matmuls of forward and backward plus
    // 6 L C T for attention, against the device's dense bf16 peak (none when unknown)
    const size_t n_params = param_count(param_table(model_config(c, ds.vocab_size(), ds.padded_vocab())));
    flops_per_token_ = 6.0 * (double)n_params + 6.0 * c.n_layer * (double)c.n_embd * c.block_size;
    peak_ = be.peak_flops() * dist::world();  // every rank's device
  }

  // A checkpoint holds the state before a step: every ckpt_interval steps, not at the first
  // step of this process nor at the end (finish writes that one).
  bool checkpoint_due(int step) const {
    return c_.ckpt_interval > 0 && step > start_.step && step < c_.max_iters && step % c_.ckpt_interval == 0;
  }
  bool eval_due(int step) const { return step >= c_.max_iters || (c_.eval_interval > 0 && step % c_.eval_interval == 0); }

  // A checkpoint that every rank comes to: ZeRO-1's shards of the AdamW state are gathered on
  // rank 0 first (a collective). Its path ("" without a hook); a failure throws, or with error
  // given goes there.
  std::string checkpoint(const Progress& p, std::string* error = nullptr) {
    be_.gather_state();
    return save(p, error);
  }

  // Both splits' mean losses (estimate_loss: spread over the ranks; rank 0 logs them). On a
  // terminal an evaluation that lasts more than two seconds shows its progress in place.
  Evaluation evaluate(int step) {
    const auto t0 = Clock::now();
    double shown = 0;
    std::function<void(int)> show;
    if (live_)
      show = [&, t0](int done) {
        const double t = seconds_since(t0);
        if (t < 2 || t - shown < 0.25) return;
        shown = t;
        const double frac = (double)(done + 1) / (2.0 * c_.eval_iters);
        log_ << "\r\033[K" << "step " << step << ": evaluating, batch " << done + 1 << "/" << 2 * c_.eval_iters
             << " | ETA " << hms(t / frac - t) << std::flush;
      };
    Evaluation ev;
    ev.done = true;
    ev.train = estimate_loss(be_, c_, ds_, 0, show);
    ev.val = estimate_loss(be_, c_, ds_, 1, show ? [&](int k) { show(c_.eval_iters + k); } : std::function<void(int)>());
    eval_s_ = seconds_since(t0);
    s_.best_val_loss = std::min(s_.best_val_loss, ev.val);
    clear_live_line();
    log_ << "step " << step << ": train loss " << fmt("%.4f", ev.train) << ", val loss " << fmt("%.4f", ev.val)
         << std::endl;
    return ev;
  }

  // The end of the run (step max_iters): the final evaluation's metrics line, the last checkpoint.
  void finish(const Progress& p, const Evaluation& ev, double lr) {
    s_.final_train_loss = ev.train;
    s_.final_val_loss = ev.val;
    metrics_.write(metrics_line({{"step", p.step},
                                 {"train_loss", nullptr},
                                 {"val_loss", jnum("%.6f", ev.val)},
                                 {"eval_train_loss", jnum("%.6f", ev.train)},
                                 {"lr", jnum("%.6e", lr)},
                                 {"ms", nullptr},
                                 {"tokens_per_s", nullptr},
                                 {"final", true}}));
    stop_if_metrics_lost(p, checkpoint(p));
  }

  // --grad-accum N: N micro-batches, micro-batch k being rows k B .. of the step's batch of N B
  // (data/dataset.h), gradients accumulated; the step's loss is their mean. On W data-parallel
  // ranks (model/run/dist.h) the step is W N micro-batches: rank r runs r N .. r N + N - 1 of
  // them, exactly those a single process with --grad-accum W N runs at those indices (the same
  // rows, the same dropout keys); one all-reduce sums the gradients, one more the losses with
  // the ranks' pending stops (a rank was signalled: every rank stops before this step) and their
  // bad input (a batch of one rank's rows held a token id past the vocabulary: every rank throws
  // that rank's error).
  StepLoss forward_backward(int step) {
    StepLoss st;
    st.t0 = Clock::now();
    const int first = dist::rank() * c_.grad_accum, micro_batches = dist::world() * c_.grad_accum;
    double sums[3] = {0, 0, 0};  // the losses of this rank's micro-batches; a stop pending here; bad input here
    std::string bad;
    for (int k = first; k < first + c_.grad_accum; ++k) {
      if (!read_batch(bad, [&] {
            ds_.train_batch(c_.seed, (uint32_t)step, c_.batch_size, c_.block_size, x_.data(), y_.data(),
                            (uint32_t)k * (uint32_t)c_.batch_size);
          }))
        break;
      sums[0] += be_.forward_backward(x_.data(), y_.data(), (uint32_t)step, k, micro_batches, first);
    }
    if (step == faults_.fail_step)
      throw RuntimeError("failure injected by TG_INJECT_FAIL at step " + std::to_string(step) +
                         " (a test hook); expected none; unset TG_INJECT_FAIL");
    if (dist::active()) {
      be_.reduce_grads();
      sums[1] = stop_pending() ? 1 : 0;
      sums[2] = bad.empty() ? 0 : 1;
      dist::all_reduce_sum(sums, 3);
      if (sums[2] > 0) throw InputError(dist::first_error(bad), true);
      if (sums[1] > 0) {
        request_stop();
        throw Interrupted{};
      }
    }
    st.loss = (float)(sums[0] / micro_batches);
    st.norm = be_.grad_norm();
    if (faults_.nan_steps.count(step)) st.loss = NAN;
    return st;
  }

  // The NaN guard: a step whose loss or gradient norm is not finite applies no update (weights
  // and AdamW state stay as they were); kMaxBadSteps of them in a row stop the run, with a
  // checkpoint of the last good weights. Returns where the run stands after the step.
  Progress skip_update(const Progress& before, const StepLoss& st) {
    const int step = before.step;
    ++s_.skipped;
    s_.steps = step + 1;
    const Progress p{step + 1, before.updates, before.bad_steps + 1};
    clear_live_line();
    log_ << "step " << step << ": loss " << st.loss << ", gradient norm " << st.norm << ": not finite, update skipped ("
         << p.bad_steps << " in a row)" << std::endl;
    metrics_.write(metrics_line({{"step", step}, {"train_loss", nullptr}, {"skipped", true}}));
    stop_if_metrics_lost(p);
    if (p.bad_steps < kMaxBadSteps) return p;
    // the weights are those of the last good step: saved with the count reset, so that a
    // resume with other hyperparameters goes on from them
    std::string error;
    const std::string path = checkpoint(Progress{p.step, p.updates, 0}, &error);
    dist::barrier();  // every rank stops here: none ends the job while rank 0 writes that checkpoint
    const std::string kept = !path.empty()    ? "; the last good weights are saved in " + path
                             : !error.empty() ? "; the last good weights could not be saved (" + error + ")"
                                              : "";
    throw RuntimeError(std::to_string(kMaxBadSteps) + " steps in a row (the last at step " + std::to_string(step) +
                       ") had a non-finite loss or gradient norm" + kept + "; expected finite values; lower --lr (now " +
                       fmt("%g", c_.lr) + ") or raise --warmup-iters (now " + std::to_string(c_.warmup_iters) +
                       ") and check --data" +
                       (path.empty() ? "" : ", then continue with: " + resume_cmd_ + " --lr " + fmt("%g", c_.lr / 2)));
  }

  // A step done (its update applied): its time, and every log_interval steps (and at an
  // evaluation) its line in the log and in metrics.jsonl; between those, on a terminal, a live
  // line in place.
  void log_step(int step, const StepLoss& st, const Evaluation& ev, double lr) {
    const double ms = seconds_since(st.t0) * 1e3;
    step_ms_.push_back(ms);
    ms_sum_ += ms;
    s_.steps = step + 1;
    clear_live_line();
    if (step % c_.log_interval == 0 || ev.done) {
      const double tps = tokens_per_step_ / (ms / 1e3);
      log_ << "step " << step << "/" << c_.max_iters << " | loss " << fmt("%.4f", st.loss) << " | lr "
           << fmt("%.3e", lr) << " | norm " << fmt("%.4f", st.norm) << " | " << fmt("%.1f", ms) << " ms | "
           << fmt("%.0f", tps) << " tok/s";
      if (peak_ > 0) log_ << " | mfu " << fmt("%.1f", 100.0 * flops_per_token_ * tps / peak_) << "%";
      log_ << " | ETA " << hms(time_left_s(step + 1)) << std::endl;
      jsonio::Out line = jsonio::Out::object();
      line["step"] = step;
      line["train_loss"] = jnum("%.6f", st.loss);
      if (ev.done) {
        line["val_loss"] = jnum("%.6f", ev.val);
        line["eval_train_loss"] = jnum("%.6f", ev.train);
      }
      line["lr"] = jnum("%.6e", lr);
      line["grad_norm"] = jnum("%.6f", st.norm);
      line["ms"] = jnum("%.3f", ms);
      line["tokens_per_s"] = jnum("%.1f", tps);
      if (peak_ > 0) line["mfu"] = jnum("%.4f", flops_per_token_ * tps / peak_);
      metrics_.write(metrics_line(line));
    } else if (live_) {
      log_ << "step " << step << "/" << c_.max_iters << " | loss " << fmt("%.4f", st.loss) << " | " << fmt("%.1f", ms)
           << " ms/step | ETA " << hms(time_left_s(step + 1)) << std::flush;
    }
  }

  // A metrics line that could not be written stops the run after its step: a checkpoint
  // holding the unwritten lines (saved, when one was just written), then RuntimeError.
  void stop_if_metrics_lost(const Progress& p, const std::string& saved = "") {
    if (!metrics_.failed()) return;
    std::string error, path = saved.empty() ? save(p, &error) : saved;
    const std::string state =
        !path.empty() ? "the run stopped before step " + std::to_string(p.step) + " and saved its state and the " +
                            std::to_string(metrics_.held().size()) + " unwritten line(s) in " + path
        : !error.empty() ? "the run stopped before step " + std::to_string(p.step) +
                               " and its checkpoint could not be written either (" + error + ")"
                         : "the run stopped before step " + std::to_string(p.step);
    throw RuntimeError(metrics_.error() + "; " + state +
                       "; expected a --out-dir with free space; free some, then continue with: " + resume_cmd_);
  }

  // A CPU run that will take long says so, once its first three steps (or ten seconds of them)
  // predict it.
  void note_long_run(int step) {
    if (long_run_checked_ || (step_ms_.size() < 3 && ms_sum_ <= 1e4)) return;
    long_run_checked_ = true;
    if (be_.device_name().rfind("cpu", 0) != 0 || time_left_s(step + 1) <= 600) return;
    clear_live_line();
    log_ << "note: on the CPU this run will take about " << hms(time_left_s(step + 1)) << " more ("
         << c_.max_iters - step - 1 << " steps at "
         << fmt(ms_sum_ / step_ms_.size() < 10 ? "%.1f" : "%.0f", ms_sum_ / step_ms_.size())
         << " ms, evaluations included); a GPU or --preset baby is much faster"
         << "; Ctrl-C stops it with a checkpoint (continue with: " << resume_cmd_ << ")" << std::endl;
  }

  // A stop request ended the run, with the checkpoint written for it ("" when none).
  void stopped(const std::string& checkpoint) {
    s_.checkpoint = checkpoint;
    s_.stopped = true;
  }

  TrainSummary summary() {
    if (live_) log_ << "\r\033[K" << std::flush;
    s_.wall_s = seconds_since(t_start_);
    if (!step_ms_.empty()) {
      std::sort(step_ms_.begin(), step_ms_.end());
      s_.median_step_ms = step_ms_[step_ms_.size() / 2];
    }
    return s_;
  }

 private:
  // rank 0's checkpoint of the state as of p, with the metrics lines held back: its path, or
  // what went wrong when error is given ("" without a hook). A sharded run's fails here unless
  // the state was gathered (checkpoint()).
  std::string save(const Progress& p, std::string* error) {
    if (!hooks_.checkpoint) return "";
    if (!error) return hooks_.checkpoint(p, metrics_.held());
    try {
      return hooks_.checkpoint(p, metrics_.held());
    } catch (const RuntimeError& e) {
      *error = e.what();
      return "";
    }
  }
  // the time left, from the steps timed so far and the evaluations still to come
  double time_left_s(int next_step) const {
    if (step_ms_.empty()) return 0.0;
    const int evals =
        c_.eval_interval > 0 ? (c_.max_iters - 1) / c_.eval_interval - (next_step - 1) / c_.eval_interval : 0;
    return ms_sum_ / step_ms_.size() * (c_.max_iters - next_step) / 1e3 + eval_s_ * (std::max(evals, 0) + 1);
  }
  // a live progress line is cleared before a line of the log
  void clear_live_line() {
    if (live_) log_ << "\r\033[K";
  }

  Backend& be_;
  const Config& c_;
  const data::Dataset& ds_;
  std::ostream& log_;
  const TrainHooks& hooks_;
  const Progress start_;
  const TestFaults faults_;
  MetricsLog metrics_;
  std::vector<int32_t> x_, y_;  // a micro-batch's tokens and targets (B, T)
  // a live progress line when the log is a terminal; plain lines otherwise (not under mpirun:
  // OpenMPI gives the ranks a pseudo-terminal wherever its own output goes)
  const bool live_;
  const std::string resume_cmd_;
  double tokens_per_step_ = 0, flops_per_token_ = 0, peak_ = 0;
  const Clock::time_point t_start_ = Clock::now();
  std::vector<double> step_ms_;
  double ms_sum_ = 0;
  double eval_s_ = 0;  // the last evaluation's time, for the time left
  bool long_run_checked_ = false;
  TrainSummary s_;
};

}  // namespace

double estimate_loss(Backend& be, const Config& c, const data::Dataset& ds, int split,
                     const std::function<void(int k)>& on_batch) {
  // data parallel: rank r evaluates batches r, r + W, r + 2W, ...; the batches' losses are
  // then summed over the ranks (each slot holds one rank's loss, the others' 0: exact) and
  // added in batch order on every rank, in double as one process adds them: the same bits. One
  // slot more counts the ranks whose batch held bad input: every rank then throws the first's.
  std::vector<int32_t> x((size_t)c.batch_size * c.block_size), y(x.size());
  std::vector<double> loss((size_t)c.eval_iters + 1, 0.0);
  std::string bad;
  for (int k = dist::rank(); k < c.eval_iters; k += dist::world()) {
    throw_if_stop_requested();
    if (!read_batch(bad, [&] { ds.eval_batch(c.seed, (uint32_t)split, (uint32_t)k, c.batch_size, c.block_size, x.data(), y.data()); }))
      break;
    loss[(size_t)k] = be.eval_loss(x.data(), y.data());
    if (on_batch) on_batch(k);
  }
  loss.back() = bad.empty() ? 0 : 1;
  dist::all_reduce_sum(loss.data(), loss.size());
  if (loss.back() > 0) throw InputError(dist::first_error(bad), true);
  loss.pop_back();
  double sum = 0;
  for (double l : loss) sum += l;
  return sum / c.eval_iters;
}

TrainSummary train(Backend& be, const Config& c, const data::Dataset& ds, std::ostream& log, const TrainHooks& hooks,
                   const Progress& start) {
  TrainLoop loop(be, c, ds, log, hooks, start, TestFaults::from_env());
  Progress p = start;
  for (;;) {
    const int step = p.step;
    // once in a while: a checkpoint of the state before this step
    const bool ckpt_now = loop.checkpoint_due(step);
    const std::string saved = ckpt_now ? loop.checkpoint(p) : "";
    try {
      // SIGINT / SIGTERM, honoured before every step (skipped ones included) and, through
      // Interrupted, inside steps and evaluations
      if (step < c.max_iters) throw_if_stop_requested();
      const double lr = lr_at(step, c.lr, c.min_lr, c.warmup_iters, c.lr_decay_iters);
      // once in a while, and at the end: evaluate
      const Evaluation ev = loop.eval_due(step) ? loop.evaluate(step) : Evaluation{};
      if (step >= c.max_iters) {  // the end: the final metrics line, the last checkpoint
        loop.finish(p, ev, lr);
        break;
      }
      // the step: forward and backward, the gradients summed over the ranks, then AdamW
      const StepLoss st = loop.forward_backward(step);
      if (!std::isfinite(st.loss) || !std::isfinite(st.norm)) {  // the NaN guard: no update
        p = loop.skip_update(p, st);
        continue;
      }
      be.update((float)lr, p.updates + 1, st.norm);
      p = Progress{step + 1, p.updates + 1, 0};
      // the log and metrics.jsonl: every log_interval steps
      loop.log_step(step, st, ev, lr);
      loop.stop_if_metrics_lost(p);
      loop.note_long_run(step);
    } catch (const Interrupted&) {
      // the step or evaluation was cut short and changed nothing: the run stops before it
      loop.stopped(step > start.step ? (ckpt_now ? saved : loop.checkpoint(p)) : "");
      break;
    }
  }
  return loop.summary();
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
  // last position (the backend crops the context to block_size tokens as nanoGPT does). Once
  // the window is full, each step recomputes it from its own tokens alone (net::decode_step),
  // so of a longer prompt only the last block_size + 1 tokens go in: the same bits, where every
  // token of a book-long prompt cost a pass over the window
  be.generate_reset();
  const size_t skip = idx.size() > (size_t)c.block_size + 1 ? idx.size() - (size_t)c.block_size - 1 : 0;
  for (size_t i = skip; i < idx.size(); ++i) be.generate_step(idx[i], logits.data());
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

std::vector<int32_t> token_prompt(const Config& c, int V, const data::BpeTokenizer* tok) {
  if (tok && tok->vocab_size() < V)
    throw InputError("the tokenizer " + tok->origin() + " holds " + std::to_string(tok->vocab_size()) +
                     " tokens but the model has " + std::to_string(V) + "; expected the tokenizer the model was trained "
                     "with; pass that --tokenizer");
  std::vector<int32_t> start = {tok && tok->eot() >= 0 ? tok->eot() : data::kGpt2Vocab - 1};  // <|endoftext|>
  if (!c.prompt.empty()) {
    if (!tok || !tok->can_encode())
      throw InputError(std::string("--prompt with token data and ") + (tok ? "llm.c's tokenizer file, which only decodes" : "no tokenizer") +
                       "; expected a tokenizer that encodes; pass --tokenizer DIR of a Hugging Face GPT-2 directory "
                       "(vocab.json + merges.txt, or tokenizer.json) or tiktoken's gpt2.tiktoken, or drop --prompt "
                       "(the sample then starts from <|endoftext|>)");
    start = tok->encode(c.prompt, "--prompt");
    for (int32_t id : start)
      if (id >= V)
        throw InputError("--prompt encodes to token id " + std::to_string(id) + ", outside the model's " + std::to_string(V) +
                         " tokens; expected the tokenizer the model was trained with; pass that --tokenizer");
    if (start.empty())
      throw InputError("--prompt is empty; expected at least one character to start the sample from; pass --prompt TEXT "
                       "or drop it (the sample then starts from <|endoftext|>)");
  }
  if (start[0] >= V)
    throw InputError("the tokenizer " + (tok ? tok->origin() : std::string()) + " has no <|endoftext|> below the model's " +
                     std::to_string(V) + " tokens to start the sample from; expected a --prompt; pass --prompt TEXT");
  return start;
}

std::string sample_tokens(Backend& be, const Config& c, int V, const data::BpeTokenizer* tok, std::ostream& out) {
  const std::vector<int32_t> start = token_prompt(c, V, tok);
  if (c.sample_tokens <= 0) return "";
  // with the tokenizer: the tokens' bytes; without: the ids, space-separated
  auto decode = [&](const int32_t* ids, size_t n) -> std::string {
    if (tok) return tok->decode(ids, n);
    std::string s;
    for (size_t i = 0; i < n; ++i) s += (i ? " " : "") + std::to_string(ids[i]);
    return s;
  };
  out << decode(start.data(), start.size()) << std::flush;
  return sample_ids(be, c, start, V,
                    [&](const int32_t* ids, size_t n) { return (tok || n > 1 ? "" : " ") + decode(ids, n); }, out);
}

}  // namespace tg
