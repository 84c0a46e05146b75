// tests/gpu/test_model_gpu.cu: the whole CUDA backend against the CPU reference: step-0
// logits, loss and every parameter gradient of a tiny model (model/gpt_cuda.cuh vs
// model/gpt_cpu.h in double), ten training steps with dropout against the CPU backend,
// bitwise-repeatable runs, identical initial weights, and --attention check.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../../model/backend.h"
#include "../../model/config.h"
#include "../../model/gpt_cpu.h"
#include "../../model/gpt_cuda.cuh"
#include "gpu_util.cuh"

namespace {

using tg::ModelConfig;

// A tiny model: 2 layers, head size 32 (a flash head size), odd vocabulary, T below a tile.
ModelConfig tiny_model(bool bias) { return ModelConfig{11, 19, 2, 2, 64, bias}; }

std::vector<int32_t> random_tokens(size_t n, int V, uint64_t salt) {
  std::mt19937_64 g(tg_test::test_seed() * 31 + salt);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = (int32_t)(g() % V);
  return t;
}

// max |a - b| over a tensor, divided by max |b| of that tensor (b the double reference).
double scaled_error(const float* a, const double* b, size_t n) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs((double)a[i] - b[i]);
    err = std::isfinite(d) ? std::max(err, d) : INFINITY;
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale > 0 ? err / scale : err;
}

// Tolerance of a whole-model quantity, relative to the largest element of its tensor. Each
// value passes through ~6 ops per layer (layernorm, matmul, attention, matmul, GELU, matmul),
// each rounding to the storage type with sums of up to K = 4C = 256 terms; with the rounding
// errors of a sum growing like sqrt(K) u and a factor ~10 of headroom for the cancellation in
// layernorm and softmax gradients: fp32 (u = 2^-24): 6 * 2 * sqrt(256) * 6e-8 * 10 ~ 1e-4;
// bf16 (u = 2^-8): the same count gives ~0.4, but the bf16 errors are random and partly
// cancel; 5e-2 is what a bf16 forward / backward reaches in practice (llm.c's test uses 1e-2
// absolute on GPT-2's gradients). A wrong op (a missing term, a wrong mask, a transposed
// operand) moves a gradient by O(1) of its scale, far above either bound.
template <typename T>
double model_tolerance() { return std::is_same<T, float>::value ? 1e-4 : 5e-2; }

template <typename S>
void check_step0(bool bias, gpu::AttentionPath path, double p) {
  const ModelConfig m = tiny_model(bias);
  const int B = 3, T = 17, V = m.vocab_size;
  const uint32_t step = 5;
  tg::RunShape rs;
  rs.B = B; rs.T = T; rs.dropout = p; rs.seed = 4242; rs.flash = path == gpu::AttentionPath::Flash;
  tg::GPTCpu<double> ref(m, rs);
  std::vector<float> w(ref.params.size());
  tg::init_params(w.data(), ref.table, 77);
  std::copy(w.begin(), w.end(), ref.params.begin());
  if (!std::is_same<S, float>::value)  // the forward reads bf16 weights: give the reference the same
    for (size_t i = 0; i < w.size(); ++i) ref.params[i] = gpu::to_float(gpu::from_float<S>(w[i]));

  tg::CudaRunShape cr;
  cr.B = B; cr.T = T; cr.dropout = p; cr.seed = 4242; cr.path = path;
  tg::GPTCuda<S> gpt(m, cr);
  gpt.upload_state(w.data(), nullptr, nullptr);

  const std::vector<int32_t> x = random_tokens((size_t)B * T, V, 1), y = random_tokens((size_t)B * T, V, 2);
  const double loss_ref = ref.forward(x.data(), y.data(), B, T, true, step);
  ref.backward();
  gpt.forward(x.data(), y.data(), B, T, true, step);
  gpt.backward();
  const tg::StepStats st = gpt.read_stats();

  const double tol = model_tolerance<S>();
  const std::vector<float> logits = gpt.download_logits();
  CHECK(scaled_error(logits.data(), ref.logits(), logits.size()) <= tol);
  CHECK(std::fabs(st.loss - loss_ref) <= tol * std::fabs(loss_ref));
  const std::vector<float> g = gpt.download_grads();
  double norm2 = 0;
  for (const tg::ParamSpec& s : ref.table) {
    INFO(s.name);
    const double e = scaled_error(g.data() + s.offset, ref.grads.data() + s.offset, s.numel);
    CHECK(e <= tol);
    for (size_t i = 0; i < s.numel; ++i) norm2 += ref.grads[s.offset + i] * ref.grads[s.offset + i];
  }
  CHECK(std::fabs(st.norm_squared - norm2) <= 2 * tol * norm2);
}

tg::Config tiny_config(const std::string& precision, const std::string& attention, double dropout) {
  tg::Config c;
  tg::apply_preset(c, "baby");
  c.n_layer = 2; c.n_head = 2; c.n_embd = 64; c.block_size = 32; c.batch_size = 4;
  c.dropout = dropout;
  c.precision = precision;
  c.attention = attention;
  c.seed = 99;
  c.lr = 1e-3;
  return c;
}

ModelConfig model_of(const tg::Config& c) { return ModelConfig{13, c.block_size, c.n_layer, c.n_head, c.n_embd, c.bias}; }

// Losses of n training steps (fixed random batches), lr constant.
std::vector<float> train_losses(tg::Backend& be, const tg::Config& c, int n) {
  std::vector<float> losses;
  for (int s = 0; s < n; ++s) {
    const size_t BT = (size_t)c.batch_size * c.block_size;
    std::vector<int32_t> x = random_tokens(BT, 13, 100 + s), y(BT);
    for (size_t i = 0; i < BT; ++i) y[i] = (x[i] * 7 + 3) % 13;  // a learnable map
    losses.push_back(be.forward_backward(x.data(), y.data(), (uint32_t)s));
    be.update((float)c.lr, s + 1, be.grad_norm());
  }
  return losses;
}

}  // namespace

TG_GPU_TEST("gpu model: step-0 logits, loss and every gradient match the CPU reference (fp32)") {
  for (gpu::AttentionPath path : {gpu::AttentionPath::Naive, gpu::AttentionPath::Flash})
    for (bool bias : {false, true})
      for (double p : {0.0, 0.17}) {
        CAPTURE(path == gpu::AttentionPath::Flash);
        CAPTURE(bias);
        CAPTURE(p);
        check_step0<float>(bias, path, p);
      }
}

TG_GPU_TEST("gpu model: step-0 logits, loss and every gradient match the CPU reference (bf16)") {
  for (gpu::AttentionPath path : {gpu::AttentionPath::Naive, gpu::AttentionPath::Flash})
    for (double p : {0.0, 0.17}) {
      CAPTURE(path == gpu::AttentionPath::Flash);
      CAPTURE(p);
      check_step0<gpu::bf16>(true, path, p);
    }
}

TG_GPU_TEST("gpu model: the CUDA backend starts from the CPU backend's weights, bitwise") {
  const tg::Config c = tiny_config("fp32", "flash", 0.1);
  auto cpu = tg::make_cpu_backend(c, model_of(c));
  auto gpu_be = tg::make_cuda_backend(c, model_of(c));
  const std::vector<float> a = cpu->params(), b = gpu_be->params();
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TG_GPU_TEST("gpu model: 10 steps with dropout stay within 1% of the CPU backend's losses") {
  for (const char* precision : {"fp32", "bf16"})
    for (const char* attention : {"naive", "flash"}) {
      CAPTURE(precision);
      CAPTURE(attention);
      const tg::Config c = tiny_config(precision, attention, 0.1);
      auto cpu = tg::make_cpu_backend(c, model_of(c));
      auto gpu_be = tg::make_cuda_backend(c, model_of(c));
      CHECK(gpu_be->precision() == precision);
      const std::vector<float> lc = train_losses(*cpu, c, 10), lg = train_losses(*gpu_be, c, 10);
      for (int s = 0; s < 10; ++s) {
        CAPTURE(s);
        CHECK(std::fabs(lg[s] - lc[s]) <= 0.01 * std::fabs(lc[s]));
      }
      CHECK(lc[9] < lc[0]);  // it learns
    }
}

TG_GPU_TEST("gpu model: the same seed twice gives bitwise identical losses and weights") {
  for (const char* attention : {"naive", "flash"}) {
    CAPTURE(attention);
    const tg::Config c = tiny_config("bf16", attention, 0.1);
    auto a = tg::make_cuda_backend(c, model_of(c));
    auto b = tg::make_cuda_backend(c, model_of(c));
    const std::vector<float> la = train_losses(*a, c, 6), lb = train_losses(*b, c, 6);
    CHECK(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0);
    const std::vector<float> pa = a->params(), pb = b->params();
    CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)) == 0);
  }
}

TG_GPU_TEST("gpu model: --attention check finds the two paths equal to the precision's rounding") {
  for (const char* precision : {"fp32", "bf16"}) {
    CAPTURE(precision);
    tg::Config c = tiny_config(precision, "check", 0.2);
    auto be = tg::make_cuda_backend(c, model_of(c));
    const size_t BT = (size_t)c.batch_size * c.block_size;
    const std::vector<int32_t> x = random_tokens(BT, 13, 7), y = random_tokens(BT, 13, 8);
    const auto diffs = be->attention_check(x.data(), y.data(), 3);
    REQUIRE(diffs.size() == (size_t)c.n_layer);
    // fp32: both paths sum ~T terms in different orders (~1e-6); bf16: O and dQKV are rounded
    // to bf16 (2^-8) and P is rounded to bf16 on both paths at different points
    const double bound = std::string(precision) == "fp32" ? 1e-4 : 5e-2;
    for (const auto& d : diffs) {
      CHECK(d.o <= bound);
      CHECK(d.dq <= bound);
      CHECK(d.dk <= bound);
      CHECK(d.dv <= bound);
    }
  }
}

TG_GPU_TEST("gpu model: the flash path saves less than naive, and the size table is what is allocated") {
  const ModelConfig m{65, 1024, 2, 4, 256, false};
  tg::CudaRunShape r;
  r.B = 4; r.T = 1024;
  r.path = gpu::AttentionPath::Flash;
  const size_t flash = tg::GPTCuda<gpu::bf16>::bytes_needed(m, r);
  r.path = gpu::AttentionPath::Naive;
  const size_t naive = tg::GPTCuda<gpu::bf16>::bytes_needed(m, r);
  // naive saves (B, NH, T, T) bf16 probabilities per layer: 2 layers * 4*4*1024*1024*2 bytes
  CHECK(naive > flash + (size_t)2 * 4 * 4 * 1024 * 1024 * 2 - (size_t)2 * 4 * 4 * 1024 * 4);
  tg::GPTCuda<gpu::bf16> g(m, r);
  CHECK(g.memory_bytes() == naive);
}
