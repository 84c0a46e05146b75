// tests/cpu/test_train.cpp: the training loop: reproducibility, the NaN guard, and stops cut short.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../../data/dataset.h"
#include "../../model/net/backend.h"
#include "../../data/errors.h"
#include "../../model/run/train.h"

using namespace tg;

namespace {

data::Dataset small_dataset() {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "To be, or not to be: that is the question. ";
  data::Dataset ds;
  ds.path = "(in memory)";
  ds.tok = data::CharTokenizer::from_text(text);
  std::vector<int32_t> ids = ds.tok.encode(text);
  size_t n_train = (size_t)(ids.size() * 0.9);
  ds.train.assign(ids.begin(), ids.begin() + n_train);
  ds.val.assign(ids.begin() + n_train, ids.end());
  return ds;
}

Config small_config(int max_iters) {
  Config c;
  apply_preset(c, "baby");
  c.n_layer = 1; c.n_head = 2; c.n_embd = 16; c.block_size = 8; c.batch_size = 4;
  c.dropout = 0.1; c.max_iters = max_iters; c.warmup_iters = 2; c.lr_decay_iters = 10;
  c.eval_interval = 0; c.eval_iters = 2;
  return c;
}

struct Result {
  std::vector<float> params;
  TrainSummary summary;
  std::string log, metrics;
};

ModelConfig model_of(const Config& c, const data::Dataset& ds) {
  return model_config(c, ds.tok.vocab_size());
}

// A run of c from start on be, NaN injected at the steps inject names; metrics lines go to
// r.metrics, then to the hook given (which may throw, or request a stop).
Result run_on(Backend& be, const Config& c, const char* inject, TrainHooks hooks = {}, const Progress& start = {}) {
  if (inject) setenv("TG_INJECT_NAN", inject, 1);
  else unsetenv("TG_INJECT_NAN");
  data::Dataset ds = small_dataset();
  std::ostringstream log, metrics;
  const auto then = hooks.metrics;
  hooks.metrics = [&](const std::string& line) {
    if (then) then(line);
    metrics << line << "\n";
  };
  Result r;
  try {
    r.summary = train(be, c, ds, log, hooks, start);
  } catch (...) {
    unsetenv("TG_INJECT_NAN");
    forget_stop_request();
    throw;
  }
  unsetenv("TG_INJECT_NAN");
  forget_stop_request();
  r.params = be.params();
  r.log = log.str();
  r.metrics = metrics.str();
  return r;
}

Result run(const Config& c, const char* inject, const TrainHooks& hooks = {}) {
  auto be = make_cpu_backend(model_of(c, small_dataset()), run_shape(c));
  return run_on(*be, c, inject, hooks);
}

// The message of the RuntimeError f throws ("" and a failed check when none).
std::string runtime_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const RuntimeError& e) {
    return e.what();
  }
  FAIL_CHECK("no RuntimeError thrown");
  return "";
}

// What a checkpoint hook was called with, and the backend's state then.
struct Saved {
  Progress p;
  std::vector<std::string> unlogged;
  std::vector<float> params, m, v;
};

}  // namespace

TEST_CASE("train: the same seed gives bitwise the same run; another seed does not") {
  Config c = small_config(6);
  Result a = run(c, nullptr), b = run(c, nullptr);
  CHECK(a.params == b.params);
  CHECK(a.summary.final_val_loss == b.summary.final_val_loss);
  c.seed += 1;
  CHECK(run(c, nullptr).params != a.params);
}

TEST_CASE("train: a NaN step applies no update and the run goes on") {
  // steps 0..4 with step 4 poisoned end with the weights of a clean run of steps 0..3
  Result poisoned = run(small_config(5), "4");
  Result clean = run(small_config(4), nullptr);
  CHECK(poisoned.summary.skipped == 1);
  CHECK(poisoned.summary.steps == 5);
  CHECK(poisoned.params == clean.params);
  CHECK(poisoned.log.find("step 4: loss nan") != std::string::npos);
  CHECK(poisoned.metrics.find("{\"step\": 4, \"train_loss\": null, \"skipped\": true}") != std::string::npos);
  // a poisoned step in the middle: the run completes with finite losses
  Result middle = run(small_config(6), "2");
  CHECK(middle.summary.skipped == 1);
  CHECK(std::isfinite(middle.summary.final_val_loss));
}

TEST_CASE("train: kMaxBadSteps NaN steps in a row stop the run with a clear error") {
  CHECK(run(small_config(10), "1,2,3,4").summary.skipped == 4);  // one short of the limit: goes on
  try {
    run(small_config(10), "1,2,3,4,5");
    FAIL("the run did not stop");
  } catch (const RuntimeError& e) {
    std::string m = e.what();
    CHECK(m.find("5 steps in a row (the last at step 5)") != std::string::npos);
    CHECK(m.find("expected") != std::string::npos);
  }
}

TEST_CASE("train: kMaxBadSteps in a row save the last good weights with the count reset, and name what to change") {
  Config c = small_config(10);
  c.out_dir = "out/nan";
  std::vector<Saved> saved;
  auto be = make_cpu_backend(model_of(c, small_dataset()), run_shape(c));
  TrainHooks hooks;
  hooks.checkpoint = [&](const Progress& p, const std::vector<std::string>& unlogged) {
    saved.push_back({p, unlogged, be->params(), {}, {}});
    return std::string("out/nan/ckpt-00000008");
  };
  const std::string msg = runtime_error([&] { run_on(*be, c, "3,4,5,6,7", hooks); });
  CHECK(msg.find("5 steps in a row (the last at step 7) had a non-finite loss or gradient norm; the last good weights "
                 "are saved in out/nan/ckpt-00000008; expected finite values; lower --lr (now 0.001) or raise "
                 "--warmup-iters (now 2) and check --data, then continue with: train_gpt --resume --out-dir out/nan "
                 "--lr 0.0005") != std::string::npos);
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].p.step == 8);
  CHECK(saved[0].p.updates == 3);
  CHECK(saved[0].p.bad_steps == 0);
  CHECK(saved[0].params == run(small_config(3), nullptr).params);  // steps 0..2, the last good ones
}

TEST_CASE("train: a stop requested during NaN-skipped steps is honoured before the next one, with a checkpoint") {
  Config c = small_config(10);
  std::vector<Saved> saved;
  auto be = make_cpu_backend(model_of(c, small_dataset()), run_shape(c));
  TrainHooks hooks;
  hooks.metrics = [](const std::string& line) {
    if (line == "{\"step\": 4, \"train_loss\": null, \"skipped\": true}") request_stop();
  };
  hooks.checkpoint = [&](const Progress& p, const std::vector<std::string>& unlogged) {
    Saved s{p, unlogged, be->params(), {}, {}};
    be->adam_state(s.m, s.v);
    saved.push_back(s);
    return std::string("ckpt");
  };
  Result stopped = run_on(*be, c, "3,4,5,6,7", hooks);
  CHECK(stopped.summary.stopped);
  CHECK(stopped.summary.checkpoint == "ckpt");
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].p.step == 5);
  CHECK(saved[0].p.updates == 3);
  CHECK(saved[0].p.bad_steps == 2);
  // resumed from there, the NaN guard counts on: the run stops at step 7 as an uninterrupted one
  auto again = make_cpu_backend(model_of(c, small_dataset()), run_shape(c));
  again->set_state(saved[0].params.data(), saved[0].m.data(), saved[0].v.data());
  CHECK(runtime_error([&] { run_on(*again, c, "3,4,5,6,7", {}, saved[0].p); }).find("5 steps in a row (the last at step 7)") !=
        std::string::npos);
  CHECK(runtime_error([&] { run(c, "3,4,5,6,7"); }).find("5 steps in a row (the last at step 7)") != std::string::npos);
}

TEST_CASE("train: a metrics line that cannot be written stops the run after its step, its checkpoint holding the line") {
  Config c = small_config(10);
  c.out_dir = "out/full";
  std::vector<Saved> saved;
  bool ckpt_fails = false;
  TrainHooks hooks;
  hooks.metrics = [](const std::string& line) {
    if (line.rfind("{\"step\": 2,", 0) == 0) throw RuntimeError("cannot write M: No space left on device");
  };
  hooks.checkpoint = [&](const Progress& p, const std::vector<std::string>& unlogged) {
    if (ckpt_fails) throw RuntimeError("cannot write C: No space left on device");
    saved.push_back({p, unlogged, {}, {}, {}});
    return std::string("out/full/ckpt-00000003");
  };
  std::string msg = runtime_error([&] { run(c, nullptr, hooks); });
  CHECK(msg == "cannot write M: No space left on device; the run stopped before step 3 and saved its state and the 1 "
               "unwritten line(s) in out/full/ckpt-00000003; expected a --out-dir with free space; free some, then "
               "continue with: train_gpt --resume --out-dir out/full");
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].p.step == 3);
  REQUIRE(saved[0].unlogged.size() == 1);
  CHECK(saved[0].unlogged[0].rfind("{\"step\": 2, \"train_loss\": ", 0) == 0);
  ckpt_fails = true;
  msg = runtime_error([&] { run(c, nullptr, hooks); });
  CHECK(msg.find("the run stopped before step 3 and its checkpoint could not be written either (cannot write C: No space "
                 "left on device)") != std::string::npos);
}

TEST_CASE("train: one update is clipping plus AdamW, decay on 2-D tensors only") {
  // Two updates of the backend against the formulas written out here in double.
  Config c = small_config(2);
  c.grad_clip = 0.05;  // small enough to clip
  c.weight_decay = 0.3;
  data::Dataset ds = small_dataset();
  ModelConfig m;
  m.vocab_size = ds.tok.vocab_size(); m.block_size = c.block_size; m.n_layer = c.n_layer;
  m.n_head = c.n_head; m.n_embd = c.n_embd; m.bias = true;
  auto be = make_cpu_backend(m, run_shape(c));
  const auto table = param_table(m);
  std::vector<int32_t> x((size_t)c.batch_size * c.block_size), y(x.size());
  const std::vector<float> p0 = be->params();
  std::vector<double> w(p0.begin(), p0.end()), mom(w.size(), 0.0), vel(w.size(), 0.0);
  const double lr = 1e-3, eps = 1e-8;
  for (int t = 1; t <= 2; ++t) {
    data::train_batch(ds.train, c.seed, t, c.batch_size, c.block_size, x.data(), y.data());
    be->forward_backward(x.data(), y.data(), t);
    std::vector<float> g = be->grads();
    double sq = 0;
    for (float gi : g) sq += (double)gi * gi;
    const double norm = be->grad_norm();
    CHECK(norm == doctest::Approx(std::sqrt(sq)).epsilon(1e-6));
    REQUIRE(norm > c.grad_clip);
    const double clip = c.grad_clip / (norm + 1e-6);
    be->update((float)lr, t, norm);
    std::vector<float> got = be->params();
    double worst = 0;
    size_t decayed = 0;
    for (const ParamSpec& p : table) {
      const double wd = p.shape.size() >= 2 ? c.weight_decay : 0.0;
      decayed += wd > 0;
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        const double gi = g[i] * clip;
        mom[i] = c.beta1 * mom[i] + (1 - c.beta1) * gi;
        vel[i] = c.beta2 * vel[i] + (1 - c.beta2) * gi * gi;
        const double mhat = mom[i] / (1 - std::pow(c.beta1, t)), vhat = vel[i] / (1 - std::pow(c.beta2, t));
        w[i] = w[i] - lr * wd * w[i] - lr * mhat / (std::sqrt(vhat) + eps);
        worst = std::max(worst, std::fabs(got[i] - w[i]) / (std::fabs(w[i]) + 1e-3));
      }
    }
    CHECK(decayed > 0);
    CAPTURE(t);
    CHECK(worst < 1e-5);  // float arithmetic against double: a few ulp of |w|
    for (size_t i = 0; i < w.size(); ++i) w[i] = got[i];  // go on from the backend's own floats
  }
}

namespace {

// The CPU backend, with a stop requested as forward_backward of step stop_step begins, or as
// eval call number stop_eval (0-based) begins: the CPU model then throws Interrupted from
// inside the pass, as it does when SIGINT comes during a step or an evaluation.
struct StoppingBackend : Backend {
  std::unique_ptr<Backend> in;
  int stop_step = -1, stop_eval = -1, evals = 0;
  explicit StoppingBackend(std::unique_ptr<Backend> b) : in(std::move(b)) {}
  std::string device_name() const override { return in->device_name(); }
  size_t memory_bytes() const override { return in->memory_bytes(); }
  float forward_backward(const int32_t* x, const int32_t* y, uint32_t step, int micro = 0, int accum = 1,
                         int first_micro = 0) override {
    if ((int)step == stop_step) request_stop();
    return in->forward_backward(x, y, step, micro, accum, first_micro);
  }
  void reduce_grads() override { in->reduce_grads(); }
  double grad_norm() override { return in->grad_norm(); }
  void update(float lr, int t, double norm) override { in->update(lr, t, norm); }
  float eval_loss(const int32_t* x, const int32_t* y) override {
    if (evals++ == stop_eval) request_stop();
    return in->eval_loss(x, y);
  }
  void generate_reset() override { in->generate_reset(); }
  void generate_step(int32_t token, float* out) override { in->generate_step(token, out); }
  std::vector<float> params() const override { return in->params(); }
  std::vector<float> grads() const override { return in->grads(); }
  void adam_state(std::vector<float>& m, std::vector<float>& v) const override { in->adam_state(m, v); }
  void set_state(const float* p, const float* m, const float* v) override { in->set_state(p, m, v); }
  void check_forward(const int32_t* x, const int32_t* y, uint32_t step) override { in->check_forward(x, y, step); }
  AttentionOutputs check_layer(int layer, uint32_t step, const std::vector<float>& dout) override {
    return in->check_layer(layer, step, dout);
  }
};

// A run of c on a StoppingBackend set up by setup; the checkpoints its hook saw.
Result run_stopping(const Config& c, const std::function<void(StoppingBackend&)>& setup, std::vector<Saved>& saved) {
  StoppingBackend be(make_cpu_backend(model_of(c, small_dataset()), run_shape(c)));
  setup(be);
  TrainHooks hooks;
  hooks.checkpoint = [&](const Progress& p, const std::vector<std::string>& unlogged) {
    Saved s{p, unlogged, be.params(), {}, {}};
    be.adam_state(s.m, s.v);
    saved.push_back(s);
    return std::string("ckpt");
  };
  return run_on(be, c, nullptr, hooks);
}

// The run resumed from a checkpoint to c.max_iters.
Result resumed(const Config& c, const Saved& from) {
  auto be = make_cpu_backend(model_of(c, small_dataset()), run_shape(c));
  be->set_state(from.params.data(), from.m.data(), from.v.data());
  return run_on(*be, c, nullptr, {}, from.p);
}

}  // namespace

TEST_CASE("train: a stop during a step cuts it short; the checkpoint is the state before it, and resumes bitwise") {
  const Config c = small_config(8);
  std::vector<Saved> saved;
  const Result stopped = run_stopping(c, [](StoppingBackend& be) { be.stop_step = 5; }, saved);
  CHECK(stopped.summary.stopped);
  CHECK(stopped.summary.steps == 5);
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].p.step == 5);
  CHECK(saved[0].p.updates == 5);
  CHECK(stopped.metrics.find("\"step\": 5") == std::string::npos);  // step 5 left no trace
  CHECK(saved[0].params == run(small_config(5), nullptr).params);
  CHECK(resumed(c, saved[0]).params == run(c, nullptr).params);
}

TEST_CASE("train: a stop during an evaluation cuts it short, with a checkpoint of the state before that step") {
  Config c = small_config(8);
  c.eval_interval = 4;
  c.eval_iters = 3;
  std::vector<Saved> saved;
  // evaluations at steps 0 and 4, 2 * 3 batches each: eval call 8 is step 4's third batch
  const Result stopped = run_stopping(c, [](StoppingBackend& be) { be.stop_eval = 8; }, saved);
  CHECK(stopped.summary.stopped);
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].p.step == 4);
  CHECK(stopped.log.find("step 4: train loss") == std::string::npos);
  CHECK(resumed(c, saved[0]).params == run(c, nullptr).params);
}
