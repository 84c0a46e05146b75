// tests/cpu/test_accum.cpp: gradient accumulation (--grad-accum) on the CPU backend, the
// micro-batches' data and dropout keys, and the gpt2-124m preset.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <vector>

#include "../../data/dataset.h"
#include "../../model/net/backend.h"
#include "../../model/run/config.h"
#include "../../model/run/train.h"
#include "../../data/errors.h"
#include "test_util.h"

using namespace tg;

namespace {

Config accum_config(int B, double dropout) {
  Config c;
  apply_preset(c, "baby");
  c.n_layer = 2; c.n_head = 2; c.n_embd = 16; c.block_size = 8; c.batch_size = B;
  c.dropout = dropout;
  return c;
}

ModelConfig model_of(const Config& c, int V) {
  ModelConfig m;
  m.vocab_size = V; m.block_size = c.block_size; m.n_layer = c.n_layer; m.n_head = c.n_head; m.n_embd = c.n_embd;
  m.bias = c.bias;
  return m;
}

// max |a - b| / max |b|
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, (double)std::fabs(a[i] - b[i]));
    s = std::max(s, (double)std::fabs(b[i]));
  }
  return d / s;
}

}  // namespace

TEST_CASE("grad-accum: 2 micro-batches of B give the gradient of one batch of 2B (dropout on too)") {
  for (double p : {0.0, 0.2}) {
    INFO("dropout " << p);
    const int B = 3, T = 8, V = 29;
    Config small = accum_config(B, p), big = accum_config(2 * B, p);
    auto bs = make_cpu_backend(model_of(small, V), run_shape(small)), bb = make_cpu_backend(model_of(big, V), run_shape(big));
    auto x = testutil::random_tokens((size_t)2 * B * T, V), y = testutil::random_tokens(x.size(), V);
    for (int step = 0; step < 3; ++step) {
      // each step from the same state: the big model's, so that the comparison is of one step's
      // accumulation, not of the AdamW-amplified drift of the steps before
      if (step > 0) {
        std::vector<float> m, v;
        bb->adam_state(m, v);
        bs->set_state(bb->params().data(), m.data(), v.data());
      }
      const float lb = bb->forward_backward(x.data(), y.data(), step);
      const float l0 = bs->forward_backward(x.data(), y.data(), step, 0, 2);
      const float l1 = bs->forward_backward(x.data() + B * T, y.data() + B * T, step, 1, 2);
      CHECK((l0 + l1) / 2 == doctest::Approx(lb).epsilon(1e-5));
      const std::vector<float> gs = bs->grads(), gb = bb->grads();
      CHECK(rel_diff(gs, gb) < 1e-5);  // the sums of two halves, rounded, then added
      CHECK(bs->grad_norm() == doctest::Approx(bb->grad_norm()).epsilon(1e-5));
      bs->update(1e-2f, step + 1, bs->grad_norm());
      bb->update(1e-2f, step + 1, bb->grad_norm());
      // AdamW divides each gradient by its own scale: a weight whose gradient is near 0 may move
      // by up to lr either way on rounding alone; the mean difference stays at rounding
      const std::vector<float> ps = bs->params(), pb = bb->params();
      double sum = 0, worst = 0;
      for (size_t i = 0; i < ps.size(); ++i) {
        sum += std::fabs((double)ps[i] - pb[i]);
        worst = std::max(worst, std::fabs((double)ps[i] - pb[i]));
      }
      CHECK(sum / ps.size() <= 1e-6);
      CHECK(worst <= 2 * 1e-2 * (step + 1));
    }
  }
}

TEST_CASE("grad-accum: micro-batch 0 of 1 is the plain step, bitwise; micro 0 overwrites, later ones add") {
  const int B = 2, T = 8, V = 17;
  Config c = accum_config(B, 0.1);
  auto a = make_cpu_backend(model_of(c, V), run_shape(c)), b = make_cpu_backend(model_of(c, V), run_shape(c));
  auto x = testutil::random_tokens((size_t)B * T, V), y = testutil::random_tokens(x.size(), V);
  CHECK(a->forward_backward(x.data(), y.data(), 5) == b->forward_backward(x.data(), y.data(), 5, 0, 1));
  CHECK(a->grads() == b->grads());
  // micro 0 of 2 after other gradients: overwritten, half the plain gradient (a power of two: exact)
  b->forward_backward(x.data(), y.data(), 5, 0, 2);
  std::vector<float> half = b->grads(), full = a->grads();
  for (size_t i = 0; i < full.size(); ++i) REQUIRE(half[i] == full[i] / 2);
  // the same micro-batch again as micro 1 would be keyed as other rows (other masks): with the
  // masks off it adds exactly the same half
  Config c0 = accum_config(B, 0.0);
  auto d = make_cpu_backend(model_of(c0, V), run_shape(c0));
  d->forward_backward(x.data(), y.data(), 5, 0, 2);
  const std::vector<float> h0 = d->grads();
  d->forward_backward(x.data(), y.data(), 5, 1, 2);
  const std::vector<float> h1 = d->grads();
  // (the kernels add into the gradients as they go: the same to rounding, not bitwise)
  std::vector<float> twice(h0.size());
  for (size_t i = 0; i < h0.size(); ++i) twice[i] = 2 * h0[i];
  CHECK(rel_diff(h1, twice) < 1e-5);
}

TEST_CASE("grad-accum: micro-batch k of a step is rows kB.. of the step's batch of N*B, bitwise") {
  std::vector<int32_t> tokens = testutil::random_tokens(5000, 50);
  const int B = 3, T = 7, N = 4;
  std::vector<int32_t> bx((size_t)N * B * T), by(bx.size()), x((size_t)B * T), y(x.size());
  data::train_batch(tokens, 99, 12, N * B, T, bx.data(), by.data());
  for (int k = 0; k < N; ++k) {
    data::train_batch(tokens, 99, 12, B, T, x.data(), y.data(), (uint32_t)(k * B));
    CHECK(std::equal(x.begin(), x.end(), bx.begin() + (size_t)k * B * T));
    CHECK(std::equal(y.begin(), y.end(), by.begin() + (size_t)k * B * T));
  }
  // row0 0 is the plain batch (what every run without accumulation draws)
  std::vector<int32_t> p((size_t)B * T), q(p.size());
  data::train_batch(tokens, 99, 12, B, T, p.data(), q.data());
  data::train_batch(tokens, 99, 12, B, T, x.data(), y.data(), 0);
  CHECK(p == x);
}

TEST_CASE("preset gpt2-124m is llm.c's GPT-2 small recipe; --grad-accum is checked and saved") {
  const char* argv[] = {"train_gpt", "--preset", "gpt2-124m"};
  ParsedArgs a = parse_args(3, argv, "baby");
  const Config& c = a.config;
  CHECK(c.n_layer == 12); CHECK(c.n_head == 12); CHECK(c.n_embd == 768); CHECK(c.block_size == 1024);
  CHECK(c.batch_size == 64); CHECK(c.grad_accum == 8);
  CHECK((long long)c.batch_size * c.block_size * c.grad_accum == 524288);
  CHECK(c.lr == 6e-4); CHECK(c.min_lr == 0.0); CHECK(c.warmup_iters == 700); CHECK(c.weight_decay == 0.1);
  CHECK(c.max_iters == 18865); CHECK(c.lr_decay_iters == 18865);
  CHECK(c.beta2 == 0.95); CHECK(c.bias); CHECK(c.dropout == 0.0);
  CHECK(describe(c).find("batch_size 64 x grad_accum 8 = 524288 tokens per step") != std::string::npos);

  const char* argv2[] = {"train_gpt", "--grad-accum", "3"};
  CHECK(parse_args(3, argv2, "baby").config.grad_accum == 3);
  const char* bad[] = {"train_gpt", "--grad-accum", "0"};
  CHECK_THROWS_AS(parse_args(3, bad, "baby"), InputError);
  CHECK(fixed_on_resume("grad-accum"));
  Config d;
  apply_preset(d, "baby");
  CHECK(d.grad_accum == 1);
  // a config saved before --grad-accum existed reads as 1
  std::string text = config_to_text(d);
  const size_t at = text.find("grad_accum=1\n");
  REQUIRE(at != std::string::npos);
  text.erase(at, std::string("grad_accum=1\n").size());
  CHECK(config_from_text(text).grad_accum == 1);
  // nor the number of ranks (model/run/dist.h): one
  const size_t w = text.find("world=1\n");
  REQUIRE(w != std::string::npos);
  text.erase(w, std::string("world=1\n").size());
  CHECK(config_from_text(text).world == 1);
}

#include <nlohmann/json.hpp>

#include "../common/cli_util.h"

namespace {
// The train_loss of every step of a run's metrics.jsonl (NaN where none).
std::vector<double> train_losses(const std::string& metrics) {
  std::vector<double> out;
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("train_loss") && j["train_loss"].is_number()) out.push_back(j["train_loss"]);
  }
  return out;
}
}  // namespace

TEST_CASE("cli: --grad-accum 2 x B trains as --batch-size 2B (to rounding), is saved, and cannot change on --resume") {
  using namespace cli;
  const fs::path base = fresh_dir("tg_cli_accum");
  const std::string common = "--device cpu --max-iters 4 --ckpt-interval 2 --n-layer 1 --n-head 2 --n-embd 16 "
                             "--block-size 8 --eval-interval 0 --eval-iters 1 --sample-tokens 0 --dropout 0.1 --data " +
                             data_path();
  Run acc = run_train_gpt(common + " --batch-size 2 --grad-accum 2 --out-dir " + (base / "acc").string());
  CAPTURE(acc.err);
  REQUIRE(acc.code == 0);
  CHECK(acc.out.find("batch_size 2 x grad_accum 2 = 32 tokens per step") != std::string::npos);
  Run big = run_train_gpt(common + " --batch-size 4 --out-dir " + (base / "big").string());
  REQUIRE(big.code == 0);
  const std::vector<double> la = train_losses(slurp((base / "acc" / "metrics.jsonl").string())),
                            lb = train_losses(slurp((base / "big" / "metrics.jsonl").string()));
  REQUIRE(la.size() == 4);
  REQUIRE(lb.size() == la.size());
  for (size_t i = 0; i < la.size(); ++i) CHECK(la[i] == doctest::Approx(lb[i]).epsilon(1e-5));
  // the checkpoint's config holds it; a resume may not change it (it changes the data per step)
  Run change = run_train_gpt("--resume --grad-accum 3 --max-iters 6 --out-dir " + (base / "acc").string());
  CHECK(change.code == 2);
  CHECK(change.err.find("grad-accum") != std::string::npos);
  Run same = run_train_gpt("--resume --max-iters 6 --out-dir " + (base / "acc").string());
  CAPTURE(same.err);
  CHECK(same.code == 0);
  CHECK(same.out.find("x grad_accum 2") != std::string::npos);
  fs::remove_all(base);
}

#include "../../model/net/gpt.h"

TEST_CASE("padded vocabulary: the model of V tokens padded to Vp trains as the unpadded one; padded rows stay 0") {
  CHECK(padded_vocab_for(50257) == 50304);
  CHECK(padded_vocab_for(65) == 128);
  CHECK(padded_vocab_for(128) == 128);
  const int B = 2, T = 8, V = 29;
  Config c = accum_config(B, 0.1);
  c.weight_decay = 0.5;  // decay would move padded rows that were not 0
  ModelConfig m = model_of(c, V), mp = m;
  mp.padded_vocab = 128;
  CHECK(m.vp() == V);
  CHECK(mp.vp() == 128);
  const std::vector<ParamSpec> t = param_table(m), tp = param_table(mp);
  CHECK(tp[0].shape == std::vector<int>{128, c.n_embd});
  CHECK(param_count(tp) == param_count(t) + (size_t)(128 - V) * c.n_embd);
  auto a = make_cpu_backend(m, run_shape(c)), b = make_cpu_backend(mp, run_shape(c));
  // the same weights for the real rows (the init is keyed by element index), 0 in the padded ones
  const size_t wte_real = (size_t)V * c.n_embd, pad = (size_t)(128 - V) * c.n_embd;
  auto same_real = [&](const std::vector<float>& u, const std::vector<float>& p, double tol) {
    bool ok = true;
    for (size_t i = 0; i < u.size(); ++i) {
      const size_t j = i < wte_real ? i : i + pad;
      ok = ok && std::fabs(u[i] - p[j]) <= tol * (1 + std::fabs(u[i]));
    }
    return ok;
  };
  CHECK(same_real(a->params(), b->params(), 0));
  // the unpadded layout padded: zeros in the padded rows of wte
  auto padded = [&](const std::vector<float>& u) {
    std::vector<float> p(u.size() + pad, 0.0f);
    for (size_t i = 0; i < u.size(); ++i) p[i < wte_real ? i : i + pad] = u[i];
    return p;
  };
  for (int step = 0; step < 4; ++step) {
    auto x = testutil::random_tokens((size_t)B * T, V), y = testutil::random_tokens(x.size(), V);
    if (step > 0) {  // each step from the same state (not the AdamW-amplified drift of the steps before)
      std::vector<float> m, v;
      a->adam_state(m, v);
      b->set_state(padded(a->params()).data(), padded(m).data(), padded(v).data());
    }
    const float la = a->forward_backward(x.data(), y.data(), step), lb = b->forward_backward(x.data(), y.data(), step);
    CHECK(la == doctest::Approx(lb).epsilon(1e-5));
    const std::vector<float> gb = b->grads();
    for (size_t i = wte_real; i < wte_real + pad; ++i) REQUIRE(gb[i] == 0.0f);  // never trained
    std::vector<float> ga = a->grads(), gb_real(ga.size());
    for (size_t i = 0; i < ga.size(); ++i) gb_real[i] = gb[i < wte_real ? i : i + pad];
    CHECK(rel_diff(gb_real, ga) < 1e-5);
    a->update(1e-2f, step + 1, a->grad_norm());
    b->update(1e-2f, step + 1, b->grad_norm());
    const std::vector<float> pb = b->params();
    for (size_t i = wte_real; i < wte_real + pad; ++i) REQUIRE(pb[i] == 0.0f);  // still 0 after decay
    // (AdamW: a near-0 gradient may move its weight by up to lr on rounding; the mean stays at rounding)
    const std::vector<float> pa = a->params();
    double sum = 0, worst = 0;
    for (size_t i = 0; i < pa.size(); ++i) {
      const double d = std::fabs((double)pa[i] - pb[i < wte_real ? i : i + pad]);
      sum += d;
      worst = std::max(worst, d);
    }
    CHECK(sum / pa.size() <= 1e-6);
    CHECK(worst <= 2 * 1e-2 * (step + 1));
  }
  // generation gives the V real logits (the caller's buffer holds V)
  std::vector<float> la(V), lb(V);
  a->generate_reset();
  b->generate_reset();
  for (int32_t tok : {3, 7, 28}) {
    a->generate_step(tok, la.data());
    b->generate_step(tok, lb.data());
  }
  for (int v = 0; v < V; ++v) CHECK(la[v] == doctest::Approx(lb[v]).epsilon(1e-5));
}
