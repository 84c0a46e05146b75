// tests/gpu/test_model_gpu.cu: the whole CUDA backend against the CPU reference: step-0
// logits, loss and every parameter gradient of a tiny model (model/net/gpt_cuda.cuh vs
// model/net/gpt_cpu.h in double), twenty training steps with dropout against the CPU backend
// within derived bounds (both attention paths, fp32 and bf16), the dropout masks of every site
// byte for byte, bitwise-repeatable runs, identical initial weights, and --attention check.
// On a GPU and, in make test, under the SIMT emulator (tests/emu).
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "../../kernels/attention_naive.cuh"
#include "../../kernels/cpu/attention_naive.h"
#include "../../kernels/cpu/dropout.h"
#include "../../kernels/flash_attn.cuh"
#include "../../model/net/attention_check.h"
#include "../../model/net/backend.h"
#include "../../model/net/gpt_cpu.h"
#include "../../model/net/gpt_cuda.cuh"
#include "../../model/run/config.h"
#include "../../model/run/train.h"
#include "counters_step.cuh"
#include "gpu_util.cuh"

using tg_test::random_tokens;

namespace {

using tg::ModelConfig;

// A tiny model: 2 layers, head size 32 (a flash head size), odd vocabulary, T below a tile.
ModelConfig tiny_model(bool bias) { return ModelConfig{11, 19, 2, 2, 64, bias}; }

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
void check_step0(bool bias, gpu::AttentionPath path, double p, GeluForm gelu = GeluForm::Tanh, int padded_vocab = 0) {
  ModelConfig m = tiny_model(bias);
  m.padded_vocab = padded_vocab;
  const int B = 3, T = 17, V = m.vocab_size;
  const uint32_t step = 5;
  tg::RunShape rs;
  rs.B = B; rs.T = T; rs.dropout = p; rs.seed = 4242; rs.attention = path; rs.gelu = gelu;
  tg::GPTCpu<double> ref(m, rs);
  std::vector<float> w(ref.params.size());
  tg::init_params(w.data(), ref.table, 77);
  std::copy(w.begin(), w.end(), ref.params.begin());
  if (!std::is_same<S, float>::value)  // the forward reads bf16 weights: give the reference the same
    for (size_t i = 0; i < w.size(); ++i) ref.params[i] = gpu::to_float(gpu::from_float<S>(w[i]));

  tg::GPTCuda<S> gpt(m, rs);
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
  // a padded vocabulary: the padded rows of wte get no gradient at all
  for (size_t i = (size_t)V * m.n_embd; i < (size_t)m.vp() * m.n_embd; ++i) REQUIRE(g[i] == 0.0f);
}

tg::Config tiny_config(const std::string& precision, const std::string& attention, double dropout) {
  tg::Config c;
  tg::apply_preset(c, "baby");
  c.n_layer = 2; c.n_head = 2; c.n_embd = 64; c.block_size = 32; c.batch_size = 4;
  c.dropout = dropout;
  c.precision = precision == "bf16" ? tg::Precision::BF16 : tg::Precision::FP32;
  c.attention = attention == "naive" ? tg::Attention::Naive : attention == "check" ? tg::Attention::Check : tg::Attention::Flash;
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

TG_GPU_TEST("gpu model: the erf GELU: step-0 logits, loss and every gradient match the CPU reference") {
  check_step0<float>(false, gpu::AttentionPath::Flash, 0.17, GeluForm::Erf);
  check_step0<gpu::bf16>(true, gpu::AttentionPath::Naive, 0.17, GeluForm::Erf);
}

TG_GPU_TEST("gpu model: a padded vocabulary (V 11 -> Vp 64): step-0 logits, loss and gradients match the CPU") {
  check_step0<float>(false, gpu::AttentionPath::Flash, 0.1, GeluForm::Tanh, 64);
}

TG_GPU_TEST("gpu model: grad-accum 2 with dropout tracks the CPU backend (masks keyed per micro-batch)") {
  tg::Config c = tiny_config("fp32", "flash", 0.1);
  c.batch_size = 2; c.block_size = 16; c.grad_accum = 2;
  auto cpu = tg::make_cpu_backend(model_of(c), tg::run_shape(c));
  auto gpu_be = tg::make_cuda_backend(model_of(c), tg::run_shape(c));
  const size_t BT = (size_t)c.batch_size * c.block_size;
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    float lc = 0, lg = 0;
    for (int k = 0; k < 2; ++k) {
      std::vector<int32_t> x = random_tokens(BT, 13, 300 + 2 * s + k), y(BT);
      for (size_t i = 0; i < BT; ++i) y[i] = (x[i] * 7 + 3) % 13;
      lc += cpu->forward_backward(x.data(), y.data(), (uint32_t)s, k, 2);
      lg += gpu_be->forward_backward(x.data(), y.data(), (uint32_t)s, k, 2);
    }
    CHECK(std::fabs(lg - lc) <= 1e-5 * std::fabs(lc));
    const double nc = cpu->grad_norm(), ng = gpu_be->grad_norm();
    CHECK(std::fabs(ng - nc) <= 1e-4 * nc);
    cpu->update((float)c.lr, s + 1, nc);
    // the GPU clips by its own copy of grad_norm() (on the device): another norm is refused,
    // before anything changes, not silently ignored
    if (s == 0) CHECK_THROWS_AS(gpu_be->update((float)c.lr, s + 1, 2 * ng), std::logic_error);
    gpu_be->update((float)c.lr, s + 1, ng);
  }
  const std::vector<float> wc = cpu->params(), wg = gpu_be->params();
  // the bounds of the 20-step test: AdamW normalises each gradient, so a weight whose gradient
  // is near 0 may move by up to lr either way on rounding alone; the mean stays at rounding
  double worst = 0, sum = 0;
  for (size_t i = 0; i < wc.size(); ++i) {
    const double d = std::fabs((double)wc[i] - wg[i]);
    worst = std::max(worst, d);
    sum += d;
  }
  CHECK(sum / wc.size() <= 1e-6);
  CHECK(worst <= 2 * c.lr * 3);
  // the control: micro-batch 1 keyed as micro-batch 0 draws other masks, visibly
  std::vector<int32_t> x = random_tokens(BT, 13, 400), y(BT);
  for (size_t i = 0; i < BT; ++i) y[i] = (x[i] * 7 + 3) % 13;
  // (the gradient of the same tokens as micro-batch 0 and as micro-batch 1, the second got as
  // the difference the accumulation adds)
  gpu_be->forward_backward(x.data(), y.data(), 7, 0, 2);
  const std::vector<float> g0 = gpu_be->grads();
  gpu_be->forward_backward(x.data(), y.data(), 7, 1, 2);
  const std::vector<float> g01 = gpu_be->grads();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < g0.size(); ++i) {
    diff = std::max(diff, std::fabs((double)(g01[i] - g0[i]) - g0[i]));
    scale = std::max(scale, (double)std::fabs(g0[i]));
  }
  CHECK(diff > 1e-2 * scale);
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
  auto cpu = tg::make_cpu_backend(model_of(c), tg::run_shape(c));
  auto gpu_be = tg::make_cuda_backend(model_of(c), tg::run_shape(c));
  const std::vector<float> a = cpu->params(), b = gpu_be->params();
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// 20 training steps on both backends from the same initial weights and batches, dropout 0.1
// at every site, lr 1e-3 constant (tiny_config: the loss falls from ~2.5 to ~1.0), and the
// bounds the CUDA backend must stay within at every step and at the end. Write u32 = 2^-24,
// u = 2^-8 (bf16).
//   fp32, the loss at each step: |L_cuda - L_cpu| <= 1e-5 L. Both backends evaluate the same
//     fp32 expressions in different summation orders. On a path from the weights to a token's
//     loss there are ~30 fp32 roundings of sums of up to 4C = 256 terms, each off by ~sqrt(256)
//     u32 typically: ~30 * 16 * u32 = 3e-5 per token, averaged over the 128 tokens of a batch
//     (independent errors): ~3e-6. The weights the later steps start from differ too little to
//     add to that (below). Measured: at most 1.1e-7 (one float ulp) over 20 steps, both paths.
//   fp32, the weights after 20 steps, per tensor: mean |w_cuda - w_cpu| <= 1e-6. Each AdamW
//     update is lr m^/(sqrt(v^) + eps) with m^/sqrt(v^) a smooth function of the gradients,
//     which differ by ~3e-6 relative (as the loss): ~1e-3 * 3e-6 per step, 20 steps: 6e-8 per
//     element. One element can differ more, where its gradient is within the rounding noise of
//     0 and changes sign (measured once: 1.4e-5); in a 64-element tensor that adds 2.2e-7 to
//     the mean, hence 1e-6. Measured: at most 5.6e-9.
//   bf16, the loss: |L_cuda - L_cpu| <= 4u L = 1.6% L. The bf16 run rounds every activation
//     it stores and the weights the forward reads to bf16, each a relative error <= u; at
//     first order ~4 of them lie in sequence on any path to the loss (weight, attention or
//     MLP output, residual stream, logits), which in the worst case add up. Measured: at most
//     1.3e-3.
//   bf16, the weights: per tensor, mean |dw| <= 5e-4, half of one step's largest update (lr),
//     above the measured 7e-5: the gradients differ by ~1% relative, and the elements whose
//     gradient is within that noise of 0 can move the other way at every step.
//   both: every element within 2 lr * steps = 0.04, the most two AdamW runs can differ by
//     (each update is at most lr (1 - b1) / sqrt(1 - b2) = lr in size, plus the decay):
//     this catches NaN and garbage; the means above catch the rest. Measured: 9.4e-3 (bf16).
// A wrong op fails these by orders of magnitude: a transposed or mis-strided operand, a lost
// dropout scale or a missing gradient term moves the loss by more than 1e-2 relative within a
// step or two, and the weights of the tensor it touches by lr per step.
TG_GPU_TEST("gpu model: 20 steps with dropout 0.1 track the CPU backend within the derived bounds") {
  const int steps = 20;
  for (const char* precision : {"fp32", "bf16"})
    for (const char* attention : {"naive", "flash"}) {
      CAPTURE(precision);
      CAPTURE(attention);
      const bool fp32 = std::string(precision) == "fp32";
      const tg::Config c = tiny_config(precision, attention, 0.1);
      auto cpu = tg::make_cpu_backend(model_of(c), tg::run_shape(c));
      auto gpu_be = tg::make_cuda_backend(model_of(c), tg::run_shape(c));
      CHECK(gpu_be->precision() == precision);
      const std::vector<float> lc = train_losses(*cpu, c, steps), lg = train_losses(*gpu_be, c, steps);
      const double rel = fp32 ? 1e-5 : 4 * gpu::unit_roundoff<gpu::bf16>();
      for (int s = 0; s < steps; ++s) {
        CAPTURE(s);
        CHECK(std::fabs(lg[s] - lc[s]) <= rel * std::fabs(lc[s]));
      }
      CHECK(lc[steps - 1] < 0.6 * lc[0]);  // it learns
      const std::vector<float> wc = cpu->params(), wg = gpu_be->params();
      const double mean_bound = fp32 ? 1e-6 : 5e-4, max_bound = 2 * c.lr * steps;
      for (const tg::ParamSpec& p : tg::param_table(model_of(c))) {
        INFO(p.name);
        double sum = 0, mx = 0;
        for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
          const double d = std::fabs((double)wc[i] - wg[i]);
          sum += std::isfinite(d) ? d : INFINITY;
          mx = std::isfinite(d) ? std::max(mx, d) : INFINITY;
        }
        CHECK(sum / p.numel <= mean_bound);
        CHECK(mx <= max_bound);
      }
    }
}

namespace {

std::vector<uint8_t> nonzero(const std::vector<double>& v) {  // 1 where not 0
  std::vector<uint8_t> m(v.size());
  for (size_t i = 0; i < v.size(); ++i) m[i] = v[i] != 0;
  return m;
}

// At a training step, the keep decisions of every dropout site of the CUDA model equal the
// CPU's: the (B, T, C) sites by the zeros of their outputs, against cpu::dropout_mask, the spec
// (which the CPU backend's zeros must equal too); the attention
// probabilities through the mask hook of both GPU paths on the layer's qkv with the model's
// key, against the CPU twin's mask.
template <typename S>
void check_masks(uint32_t step) {
  const ModelConfig m = tiny_model(true);
  const int B = 3, T = 17, C = m.n_embd, NH = m.n_head;
  const double p = 0.1;
  tg::RunShape rs;
  rs.B = B;
  rs.T = T;
  rs.dropout = p;
  rs.seed = 777;
  tg::GPTCpu<float> ref(m, rs);
  tg::init_params(ref.params.data(), ref.table, 5);
  tg::RunShape cr = rs;
  cr.both_paths = true;  // scratch for both attention paths
  tg::GPTCuda<S> gpt(m, cr);
  gpt.upload_state(ref.params.data(), nullptr, nullptr);
  const std::vector<int32_t> x = random_tokens((size_t)B * T, m.vocab_size, 3),
                             y = random_tokens((size_t)B * T, m.vocab_size, 4);
  ref.forward(x.data(), y.data(), B, T, true, step);
  gpt.forward(x.data(), y.data(), B, T, true, step);
  const size_t BTC = (size_t)B * T * C;
  auto site = [&](const char* what, const float* cpu_out, const S* gpu_out, uint32_t layer, uint32_t s) {
    INFO(std::string(what) << " of layer " << layer);
    std::vector<unsigned char> spec(BTC);
    cpu::dropout_mask(spec.data(), philox::make_dropout_key(777, step, layer, s, p), B, T, C);
    const std::vector<double> gv = tg_test::download_doubles(gpu_out, BTC);
    const std::vector<uint8_t> c = nonzero(std::vector<double>(cpu_out, cpu_out + BTC));
    CHECK(std::vector<uint8_t>(spec.begin(), spec.end()) == c);
    // dropped: exactly 0; kept: not 0, unless the value cancels to 0 in S (a bf16 embedding
    // wte + wpe of two values within 2^-8 of each other), which the CPU's fp32 value shows
    double scale = 0;
    for (size_t i = 0; i < BTC; ++i) scale = std::max(scale, (double)std::fabs(cpu_out[i]));
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < BTC; ++i) {
      const bool bad = spec[i] ? gv[i] == 0 && std::fabs(cpu_out[i]) > 2 * gpu::unit_roundoff<S>() * scale : gv[i] != 0;
      if (bad && diff++ == 0) first = i;
    }
    INFO(diff << " of " << BTC << " differ from the mask; first at " << first << ": cuda " << gv[first] << ", cpu "
              << cpu_out[first]);
    CHECK(diff == 0);
  };
  site("embedding", ref.encoded(), gpt.encoded(), 0, philox::kSiteEmbedding);
  const size_t natt = (size_t)B * NH * T * T;
  tg_test::DeviceArray<S> out(BTC), att(natt);
  tg_test::DeviceArray<float> lse((size_t)B * NH * T);
  tg_test::DeviceArray<uint8_t> mask(natt);
  for (int li = 0; li < m.n_layer; ++li) {
    const auto L = gpt.layer(li);
    site("attention projection", ref.layer_attproj(li), L.attproj, li, philox::kSiteAttnProj);
    site("MLP projection", ref.layer_fcproj(li), L.fcproj, li, philox::kSiteMlp);
    const philox::DropoutKey key = philox::make_dropout_key(777, step, li, philox::kSiteAttnProbs, p);
    std::vector<double> o(BTC), a(natt);
    std::vector<uint8_t> want(natt, 0);
    const std::vector<double> qkv = tg_test::download_doubles(L.qkv, 3 * BTC);
    cpu::attention_naive_forward<double>(o.data(), a.data(), qkv.data(), key, B, T, C, NH, true, want.data());
    for (bool flash : {false, true}) {
      INFO((flash ? "flash" : "naive") << " attention mask of layer " << li);
      cudaCheck(cudaMemset(mask.ptr, 0, natt));
      cudaCheck(cudaDeviceSynchronize());
      if (flash)
        gpu::flash_attn_forward<S>(gpt.ctx(), out.ptr, lse.ptr, L.qkv, key, B, T, C, NH, true, mask.ptr);
      else
        gpu::attention_naive_forward<S>(gpt.ctx(), out.ptr, att.ptr, L.qkv, key, B, T, C, NH, true, mask.ptr);
      std::vector<uint8_t> got(natt);
      cudaCheck(cudaDeviceSynchronize());
      cudaCheck(cudaMemcpy(got.data(), mask.ptr, natt, cudaMemcpyDeviceToHost));
      CHECK(got == want);
    }
  }
}

}  // namespace

TG_GPU_TEST("gpu model: the dropout masks of every site equal the CPU backend's, byte for byte") {
  for (uint32_t step : {0u, 7u}) {
    CAPTURE(step);
    check_masks<float>(step);
    check_masks<gpu::bf16>(step);
  }
}

namespace {

// Logits of KV-cache decoding against the last row of a full forward over the same window,
// token by token past block_size (the cropped window re-primed at each step), for a run shape
// that holds the window (re-primed by one forward) and one that does not (replayed row by row).
template <typename S>
void check_decode(int run_T) {
  const ModelConfig m = tiny_model(true);  // block_size 19
  CAPTURE(run_T);
  tg::RunShape cr;
  cr.B = 1; cr.T = run_T;
  tg::GPTCuda<S> gpt(m, cr);
  std::vector<float> w(gpt.n_params);
  tg::init_params(w.data(), gpt.table, 31);
  gpt.upload_state(w.data(), nullptr, nullptr);
  tg::RunShape full;  // a second model for the full forwards over a whole window
  full.B = 1; full.T = m.block_size;
  tg::GPTCuda<S> ref(m, full);
  ref.upload_state(w.data(), nullptr, nullptr);
  const std::vector<int32_t> tokens = random_tokens((size_t)m.block_size + 5, m.vocab_size, 9);
  std::vector<int32_t> window;
  std::vector<float> got(m.vocab_size), want(m.vocab_size);
  gpt.decode_reset();
  for (size_t i = 0; i < tokens.size(); ++i) {
    CAPTURE(i);
    if ((int)window.size() == m.block_size) window.erase(window.begin());
    window.push_back(tokens[i]);
    gpt.decode_step(tokens[i]);
    gpt.download_decode_logits(got.data());
    ref.forward(window.data(), nullptr, 1, (int)window.size(), false, 0);
    ref.download_logits_row((int)window.size() - 1, want.data());
    const std::vector<double> want_d(want.begin(), want.end());
    CHECK(scaled_error(got.data(), want_d.data(), want.size()) <= model_tolerance<S>());
  }
}

}  // namespace

TG_GPU_TEST("gpu model: KV-cache decoding gives a full forward's logits, past block_size too") {
  for (int run_T : {19, 8}) {
    check_decode<float>(run_T);
    check_decode<gpu::bf16>(run_T);
  }
}

TG_GPU_TEST("gpu model: the same seed twice gives bitwise identical losses and weights") {
  for (const char* attention : {"naive", "flash"}) {
    CAPTURE(attention);
    const tg::Config c = tiny_config("bf16", attention, 0.1);
    auto a = tg::make_cuda_backend(model_of(c), tg::run_shape(c));
    auto b = tg::make_cuda_backend(model_of(c), tg::run_shape(c));
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
    auto be = tg::make_cuda_backend(model_of(c), tg::run_shape(c));
    const size_t BT = (size_t)c.batch_size * c.block_size;
    const std::vector<int32_t> x = random_tokens(BT, 13, 7), y = random_tokens(BT, 13, 8);
    const auto diffs = tg::attention_check(*be, model_of(c), tg::run_shape(c), x.data(), y.data(), 3);
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
  tg::RunShape r;
  r.B = 4; r.T = 1024;
  r.attention = gpu::AttentionPath::Flash;
  const size_t flash = tg::GPTCuda<gpu::bf16>::bytes_needed(m, r);
  r.attention = gpu::AttentionPath::Naive;
  const size_t naive = tg::GPTCuda<gpu::bf16>::bytes_needed(m, r);
  // naive saves (B, NH, T, T) bf16 probabilities per layer: 2 layers * 4*4*1024*1024*2 bytes
  CHECK(naive > flash + (size_t)2 * 4 * 4 * 1024 * 1024 * 2 - (size_t)2 * 4 * 4 * 1024 * 4);
  tg::GPTCuda<gpu::bf16> g(m, r);
  CHECK(g.memory_bytes() == naive);
}

namespace {

// The first op where two traces part (or where the shorter ends), "" when they are the same.
std::string first_difference(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i)
    if (i >= a.size() || i >= b.size() || a[i] != b[i])
      return "op " + std::to_string(i) + ": cpu '" + (i < a.size() ? a[i] : "(end)") + "', cuda '" +
             (i < b.size() ? b[i] : "(end)") + "'";
  return "";
}

}  // namespace

// Both backends issue the same sequence of ops (model/net/gpt_net.h): names, sizes, = or +=,
// dropout keys, for a training forward and backward (a second micro-batch, with dropout), an
// evaluation forward, and KV-cache decoding past block_size (rows, then a re-primed window).
// A backend that adds, drops, reorders or reshapes an op, or keys a mask otherwise, fails here.
TG_GPU_TEST("gpu model: the CPU and CUDA backends issue the same ops, forward, backward and decode") {
  const ModelConfig m = tiny_model(true);  // block_size 19
  for (gpu::AttentionPath path : {gpu::AttentionPath::Flash, gpu::AttentionPath::Naive}) {
    CAPTURE(tg::name(path));
    tg::RunShape rs;
    rs.B = 2; rs.T = m.block_size;  // the run shape holds a whole window: decoding re-primes by one forward
    rs.dropout = 0.1;
    rs.attention = path;
    rs.slices = 1;  // the CPU records a batch run as one slice
    tg::GPTCpu<float> cpu(m, rs);
    tg::GPTCuda<float> cuda(m, rs);
    tg::init_params(cpu.params.data(), cpu.table, 3);
    cuda.upload_state(cpu.params.data(), nullptr, nullptr);
    const int B = rs.B, T = rs.T;
    const std::vector<int32_t> x = random_tokens((size_t)B * T, m.vocab_size, 5),
                               y = random_tokens((size_t)B * T, m.vocab_size, 6);
    tg::net::OpTrace on_cpu, on_cuda;
    cpu.set_trace(&on_cpu);
    cuda.set_trace(&on_cuda);
    cpu.forward(x.data(), y.data(), B, T, true, 7, 1, 2);
    cuda.forward(x.data(), y.data(), B, T, true, 7, 1, 2);
    cpu.backward(true);
    cuda.backward(true);
    cpu.forward(x.data(), y.data(), B, T - 4, false, 0);
    cuda.forward(x.data(), y.data(), B, T - 4, false, 0);
    cpu.decode_reset();
    cuda.decode_reset();
    for (int i = 0; i < m.block_size + 2; ++i) {
      cpu.decode_step(x[i]);
      cuda.decode_step(x[i]);
    }
    (void)cuda.read_stats();
    INFO(first_difference(on_cpu.ops, on_cuda.ops));
    CHECK(on_cpu.ops == on_cuda.ops);
    // and the trace holds what it is to hold: 2 training dropouts per layer plus the embedding's,
    // forward and backward each, keyed with p > 0; a re-primed window
    const auto count = [&](const std::string& what) {
      size_t n = 0;
      for (const std::string& op : on_cpu.ops) n += op.find(what) != std::string::npos;
      return n;
    };
    CHECK(count("dropout_forward = 2 19 64 key(seed 1337 step 7") == (size_t)(2 * m.n_layer + 1));
    CHECK(count("dropout_backward = 2 19 64 key(seed 1337 step 7") == (size_t)(2 * m.n_layer + 1));
    CHECK(count("attention_decode_prime") == (size_t)(2 * m.n_layer));
    CHECK(count("attention_decode_forward") == (size_t)(m.block_size * m.n_layer));
  }
}

#ifndef TG_SIMT_EMULATION
// The step whose kernels tests/emu/test_kernel_counters.cpp holds to their counters under the
// emulator, on the GPU: .ci/gpu_check.sh counters runs this case under Nsight Compute.
TG_GPU_TEST("gpu model: one step at the kernel counters' shape, both attention paths, finite loss") {
  for (gpu::AttentionPath path : {gpu::AttentionPath::Flash, gpu::AttentionPath::Naive}) {
    tg_test::CountersStep<> step(path);
    CHECK(std::isfinite(step.run()));
  }
}
#endif
