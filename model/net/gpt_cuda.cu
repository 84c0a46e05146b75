// model/net/gpt_cuda.cu: the GPT call sequence on the GPU (see model/net/gpt_cuda.cuh), line for line
// the twin of model/net/gpt_cpu.cpp: the same ops in the same order under the same names, with
// gpu:: launchers in place of cpu:: functions.
#include "gpt_cuda.cuh"

#include <algorithm>
#include <cstring>

#include "../../kernels/attention_decode.cuh"
#include "../../kernels/cross_entropy.cuh"
#include "../../kernels/dropout.cuh"
#include "../../kernels/encoder.cuh"
#include "../../kernels/gelu.cuh"
#include "../../kernels/layernorm.cuh"
#include "../../kernels/matmul.cuh"
#include "shards.h"
#include "../../kernels/residual.cuh"

namespace tg {

// Hands out 256-byte aligned regions of one allocation, gpu::kRegionGapBytes apart; with base
// null it only counts. With a base, the bytes between two regions (alignment padding and gap)
// are given to gpu::mark_no_access: nothing on a GPU; under the emulator they are poisoned, so
// a buffer one row short is reported at its first write past the end instead of spilling into
// its neighbour.
template <typename T>
class GPTCuda<T>::Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename U>
  U* take(size_t n) {
    const size_t off = ((used_ ? used_ + gpu::kRegionGapBytes : 0) + 255) / 256 * 256;
    if (base_ && off > used_) gpu::mark_no_access(base_ + used_, off - used_);
    used_ = off + n * sizeof(U);
    return base_ ? reinterpret_cast<U*>(base_ + off) : nullptr;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

template <typename T>
void GPTCuda<T>::carve(Buffers& b, Carver& a, const ModelConfig& m, const RunShape& run, size_t n_params,
                       size_t n_tensors) {
  const size_t BT = (size_t)run.B * run.T, C = m.n_embd, V = m.vp();  // logits rows: Vp
  const bool naive = run.both_paths || run.attention == gpu::AttentionPath::Naive;
  const bool flash = run.both_paths || run.attention == gpu::AttentionPath::Flash;
  const RankShard shard(n_params, run);
  Acts& acts_ = b.acts;
  Scratch& d_ = b.d;
  // parameters, gradients, AdamW state
  b.params = a.template take<float>(std::max(n_params, shard.padded));
  b.grads = a.template take<float>(std::max(n_params, shard.padded));
  b.m = a.template take<float>(shard.opt_elems);
  b.v = a.template take<float>(shard.opt_elems);
  b.params_t = std::is_same<T, float>::value ? reinterpret_cast<T*>(b.params) : a.template take<T>(n_params);
  b.tensors = a.template take<gpu::AdamWTensor>(n_tensors);
  // activations
  acts_.inp = a.template take<int32_t>(BT);
  acts_.targets = a.template take<int32_t>(BT);
  acts_.order_keys = a.template take<uint32_t>(BT);
  acts_.order_vals = a.template take<uint32_t>(BT);
  acts_.encoded = a.template take<T>(BT * C);
  acts_.h.resize(m.n_layer);
  for (Layer& l : acts_.h) {
    for (T** buf : {&l.ln1, &l.atty, &l.attproj, &l.res2, &l.ln2, &l.fcproj, &l.res3}) *buf = a.template take<T>(BT * C);
    for (float** buf : {&l.ln1_mean, &l.ln1_rstd, &l.ln2_mean, &l.ln2_rstd}) *buf = a.template take<float>(BT);
    l.qkv = a.template take<T>(BT * 3 * C);
    l.fch = a.template take<T>(BT * 4 * C);
    l.fch_gelu = a.template take<T>(BT * 4 * C);
    // the two attention paths save different things for the backward
    l.saved = {};
    if (naive) l.saved.att = a.template take<T>(gpu::attention_saved_elems(gpu::AttentionPath::Naive, run.B, run.T, m.n_head));
    if (flash) l.saved.lse = a.template take<float>(gpu::attention_saved_elems(gpu::AttentionPath::Flash, run.B, run.T, m.n_head));
  }
  acts_.lnf = a.template take<T>(BT * C);
  acts_.lnf_mean = a.template take<float>(BT);
  acts_.lnf_rstd = a.template take<float>(BT);
  acts_.logits = a.template take<T>(BT * V);
  acts_.dlogits = a.template take<T>(BT * V);
  acts_.losses = a.template take<float>(BT);
  acts_.stats = a.template take<float>(4);
  // activation gradients
  for (T** buf : {&d_.dres, &d_.dln, &d_.dbtc, &d_.datty}) *buf = a.template take<T>(BT * C);
  d_.dqkv = a.template take<T>(BT * 3 * C);
  d_.dfch = a.template take<T>(BT * 4 * C);
  d_.dfch_gelu = a.template take<T>(BT * 4 * C);
  // the KV cache and the one-row buffers of decode_step
  Decode& dec = b.dec;
  const size_t cache = (size_t)m.n_layer * m.block_size * C;
  dec.k = a.template take<T>(cache);
  dec.v = a.template take<T>(cache);
  for (T** buf : {&dec.x, &dec.ln, &dec.atty, &dec.proj}) *buf = a.template take<T>(C);
  dec.qkv = a.template take<T>(3 * C);
  dec.fch = a.template take<T>(4 * C);
  dec.fch_gelu = a.template take<T>(4 * C);
  dec.logits = a.template take<T>(V);
  dec.mean = a.template take<float>(1);
  dec.rstd = a.template take<float>(1);
  dec.token = a.template take<int32_t>(1);
}

size_t gpt_cuda_scratch_bytes(const ModelConfig& m, const RunShape& run, size_t elem_size, size_t n_params) {
  const int B = run.B, Tn = run.T, C = m.n_embd, NH = m.n_head, Vp = m.vp(), N = B * Tn;
  size_t s = std::max({gpu::encoder_backward_scratch_bytes(B, Tn, C), gpu::layernorm_backward_scratch_bytes(N, C),
                       gpu::global_norm_scratch_bytes(n_params),
                       gpu::matmul_scratch_bytes(N, std::max({3 * C, 4 * C, Vp}))});
  for (gpu::AttentionPath p : {gpu::AttentionPath::Naive, gpu::AttentionPath::Flash})
    if (run.both_paths || p == run.attention) s = std::max(s, gpu::attention_scratch_bytes(p, B, Tn, C, NH, elem_size));
  return s;
}

template <typename T>
size_t GPTCuda<T>::bytes_needed(const ModelConfig& m, const RunShape& run) {
  const std::vector<ParamSpec> table = param_table(m);
  const size_t n = param_count(table);
  Buffers b{};
  Carver count(nullptr);
  carve(b, count, m, run, n, table.size());
  return count.used() + gpt_cuda_scratch_bytes(m, run, sizeof(T), n) + gpu::kCublasWorkspaceBytes;
}

template <typename T>
GPTCuda<T>::GPTCuda(const ModelConfig& mc, const RunShape& run) : m_(mc), run_(run) {
  table = param_table(m_);
  n_params = param_count(table);
  Carver count(nullptr);
  carve(buf_, count, m_, run_, n_params, table.size());
  arena_bytes_ = count.used();
  ctx_.create(gpt_cuda_scratch_bytes(m_, run_, sizeof(T), n_params));
  ctx_.precision = std::is_same<T, float>::value ? gpu::Precision::FP32 : gpu::Precision::BF16;
  try {
    cudaCheck(cudaMalloc(&arena_, arena_bytes_));
    cudaCheck(cudaMemsetAsync(arena_, 0, arena_bytes_, ctx_.stream));
    cudaCheck(cudaMallocHost(&host_tokens_, 4 * (size_t)run_.B * run_.T * sizeof(int32_t)));
    order_counts_.resize((size_t)m_.vocab_size + 1);
    cudaCheck(cudaEventCreateWithFlags(&tokens_copied_, cudaEventDisableTiming));
  } catch (...) {
    if (host_tokens_) cudaFreeHost(host_tokens_);
    if (arena_) cudaFree(arena_);
    ctx_.destroy();
    throw;
  }
  Carver fill(arena_);
  carve(buf_, fill, m_, run_, n_params, table.size());
  P = bind_params(buf_.params_t, m_);
  G = bind_params(buf_.grads, m_);
  // the per-tensor weight decay of the fused AdamW kernel: of each tensor's part in the shard
  // (all of every tensor unsharded), offsets from the shard's start; a tensor the shard
  // boundary cuts keeps its decay on both sides
  const RankShard shard(n_params, run_);
  shard_begin_ = shard.begin;
  shard_count_ = shard.count;
  padded_ = shard.padded;
  const size_t b0 = shard_begin_;
  std::vector<gpu::AdamWTensor> tensors;
  for (const ParamSpec& p : table) {
    const size_t lo = std::max(p.offset, b0), hi = std::min(p.offset + p.numel, b0 + shard_count_);
    if (lo < hi) tensors.push_back({lo - b0, hi - lo, p.decay ? (float)run_.weight_decay : 0.0f});
  }
  n_tensors_ = (int)tensors.size();
  cudaCheck(cudaMemcpyAsync(buf_.tensors, tensors.data(), tensors.size() * sizeof(gpu::AdamWTensor),
                            cudaMemcpyHostToDevice, ctx_.stream));
  cudaCheck(cudaStreamSynchronize(ctx_.stream));
}

template <typename T>
GPTCuda<T>::~GPTCuda() {
  if (ctx_.stream) cudaStreamSynchronize(ctx_.stream);
  if (arena_) cudaFree(arena_);
  if (host_tokens_) cudaFreeHost(host_tokens_);
  if (tokens_copied_) cudaEventDestroy(tokens_copied_);
  ctx_.destroy();
}

template <typename T>
philox::DropoutKey GPTCuda<T>::key(uint32_t layer, uint32_t site) const {
  double p = train_ ? run_.dropout : 0.0;
  philox::DropoutKey k = philox::make_dropout_key(run_.seed, step_, layer, site, p);
  const uint32_t rows = (uint32_t)micro_ * (uint32_t)run_.B;
  k.row0 = site == philox::kSiteAttnProbs ? rows * (uint32_t)m_.n_head : rows;
  return k;
}

template <typename T>
void GPTCuda<T>::forward(const int32_t* x, const int32_t* targets, int b, int t, bool train, uint32_t step, int micro,
                         int accum) {
  b_ = b; t_ = t; train_ = train; step_ = step; micro_ = train ? micro : 0;
  const gpu::Context& ctx = ctx_;
  const int C = m_.n_embd, NH = m_.n_head, V = m_.vocab_size, Vp = m_.vp(), N = b * t;
  upload_tokens(x, targets, N, acts_.inp, acts_.targets, train);

  gpu::encoder_forward(ctx, acts_.encoded, acts_.inp, P.wte, P.wpe, b, t, C);
  gpu::dropout_forward(ctx, acts_.encoded, acts_.encoded, key(0, philox::kSiteEmbedding), b, t, C);
  const T* residual = acts_.encoded;
  for (int li = 0; li < m_.n_layer; ++li) {
    Layer& a = acts_.h[li];
    const LayerParams<T>& p = P.h[li];
    // x = x + drop(c_proj(attn(ln_1(x))))
    gpu::layernorm_forward(ctx, a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1w, p.ln1b, N, C);
    gpu::matmul_forward(ctx, a.qkv, a.ln1, p.qkvw, p.qkvb, N, C, 3 * C);
    gpu::attention_forward(ctx, run_.attention, a.atty, a.saved, a.qkv, key(li, philox::kSiteAttnProbs), b, t, C, NH, true);
    gpu::matmul_forward(ctx, a.attproj, a.atty, p.attprojw, p.attprojb, N, C, C);
    gpu::dropout_forward(ctx, a.attproj, a.attproj, key(li, philox::kSiteAttnProj), b, t, C);
    gpu::residual_forward(ctx, a.res2, residual, a.attproj, (size_t)N * C);
    // x = x + drop(mlp.c_proj(gelu(c_fc(ln_2(x)))))
    gpu::layernorm_forward(ctx, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, N, C);
    gpu::matmul_forward(ctx, a.fch, a.ln2, p.fcw, p.fcb, N, C, 4 * C);
    gpu::gelu_forward(ctx, a.fch_gelu, a.fch, (size_t)N * 4 * C, run_.gelu);
    gpu::matmul_forward(ctx, a.fcproj, a.fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
    gpu::dropout_forward(ctx, a.fcproj, a.fcproj, key(li, philox::kSiteMlp), b, t, C);
    gpu::residual_forward(ctx, a.res3, a.res2, a.fcproj, (size_t)N * C);
    residual = a.res3;
  }
  gpu::layernorm_forward(ctx, acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, residual, P.lnfw, P.lnfb, N, C);
  gpu::matmul_forward(ctx, acts_.logits, acts_.lnf, P.wte, (const T*)nullptr, N, C, Vp);
  if (!targets) return;
  if (train)
    gpu::cross_entropy_forward_backward(ctx, acts_.losses, acts_.dlogits, acts_.logits, acts_.targets, 1.0f / (float)((double)N * accum), N, V, Vp);
  else
    gpu::cross_entropy_forward(ctx, acts_.losses, acts_.logits, acts_.targets, N, V, Vp);
  gpu::loss_mean(ctx, acts_.stats, acts_.losses, N);
}

template <typename T>
void GPTCuda<T>::upload_tokens(const int32_t* x, const int32_t* targets, int n, int32_t* dx, int32_t* dtargets,
                               bool order) {
  // the staging buffer is free once the previous copies out of it are done (long since, in a
  // training loop: the previous step ended in read_stats())
  cudaCheck(cudaEventSynchronize(tokens_copied_));
  int32_t* staged = host_tokens_;
  std::copy(x, x + n, staged);
  if (targets) std::copy(targets, targets + n, staged + n);
  cudaCheck(cudaMemcpyAsync(dx, staged, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, ctx_.stream));
  if (targets)
    cudaCheck(cudaMemcpyAsync(dtargets, staged + n, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, ctx_.stream));
  if (order) {  // the order of the encoder backward's sums, computed here from the host's tokens
    uint32_t* keys = reinterpret_cast<uint32_t*>(staged + 2 * (size_t)n);
    uint32_t* vals = reinterpret_cast<uint32_t*>(staged + 3 * (size_t)n);
    gpu::encoder_backward_order(keys, vals, order_counts_.data(), x, n, m_.vocab_size);
    cudaCheck(cudaMemcpyAsync(acts_.order_keys, keys, (size_t)n * sizeof(uint32_t), cudaMemcpyHostToDevice, ctx_.stream));
    cudaCheck(cudaMemcpyAsync(acts_.order_vals, vals, (size_t)n * sizeof(uint32_t), cudaMemcpyHostToDevice, ctx_.stream));
  }
  cudaCheck(cudaEventRecord(tokens_copied_, ctx_.stream));
}

template <typename T>
void GPTCuda<T>::decode_reset() {
  window_.clear();
}

template <typename T>
void GPTCuda<T>::decode_step(int32_t token) {
  if ((int)window_.size() == m_.block_size) {  // full: the window slides by one, re-prime it all
    window_.erase(window_.begin());
    window_.push_back(token);
    decode_prime();
  } else {
    window_.push_back(token);
    decode_row(token);
  }
}

template <typename T>
void GPTCuda<T>::decode_prime() {
  const int n = (int)window_.size(), C = m_.n_embd, NH = m_.n_head, V = m_.vp(), maxT = m_.block_size;
  Decode& d = buf_.dec;
  if (run_.B >= 1 && run_.T >= n) {
    // one forward over the window; its qkv rows hold every layer's keys and values
    forward(window_.data(), nullptr, 1, n, false, 0);
    for (int li = 0; li < m_.n_layer; ++li)
      gpu::attention_decode_prime(ctx_, d.k + (size_t)li * maxT * C, d.v + (size_t)li * maxT * C, acts_.h[li].qkv, n,
                                  C, NH, maxT);
    cudaCheck(cudaMemcpyAsync(d.logits, acts_.logits + (size_t)(n - 1) * V, (size_t)V * sizeof(T),
                              cudaMemcpyDeviceToDevice, ctx_.stream));
  } else {
    // the run shape is too small for one forward: replay the tokens one row at a time
    const std::vector<int32_t> tokens = window_;
    window_.clear();
    for (int32_t tok : tokens) {
      window_.push_back(tok);
      decode_row(tok);
    }
  }
}

template <typename T>
void GPTCuda<T>::decode_row(int32_t token) {
  const gpu::Context& ctx = ctx_;
  const int C = m_.n_embd, NH = m_.n_head, V = m_.vp(), maxT = m_.block_size;
  const int pos = (int)window_.size() - 1;  // 0 <= pos < block_size
  Decode& d = buf_.dec;
  upload_tokens(&token, nullptr, 1, d.token, nullptr, false);
  // x = wte[token] + wpe[pos]: the encoder op with T = 1 on wpe shifted to row pos
  gpu::encoder_forward(ctx, d.x, d.token, P.wte, P.wpe + (size_t)pos * C, 1, 1, C);
  for (int li = 0; li < m_.n_layer; ++li) {
    const LayerParams<T>& p = P.h[li];
    // x = x + c_proj(attn(ln_1(x)))
    gpu::layernorm_forward(ctx, d.ln, d.mean, d.rstd, d.x, p.ln1w, p.ln1b, 1, C);
    gpu::matmul_forward(ctx, d.qkv, d.ln, p.qkvw, p.qkvb, 1, C, 3 * C);
    gpu::attention_decode_forward(ctx, d.atty, d.k + (size_t)li * maxT * C, d.v + (size_t)li * maxT * C, d.qkv, pos,
                                  C, NH, maxT);
    gpu::matmul_forward(ctx, d.proj, d.atty, p.attprojw, p.attprojb, 1, C, C);
    gpu::residual_forward(ctx, d.x, d.x, d.proj, (size_t)C);
    // x = x + mlp.c_proj(gelu(c_fc(ln_2(x))))
    gpu::layernorm_forward(ctx, d.ln, d.mean, d.rstd, d.x, p.ln2w, p.ln2b, 1, C);
    gpu::matmul_forward(ctx, d.fch, d.ln, p.fcw, p.fcb, 1, C, 4 * C);
    gpu::gelu_forward(ctx, d.fch_gelu, d.fch, (size_t)4 * C, run_.gelu);
    gpu::matmul_forward(ctx, d.proj, d.fch_gelu, p.fcprojw, p.fcprojb, 1, 4 * C, C);
    gpu::residual_forward(ctx, d.x, d.x, d.proj, (size_t)C);
  }
  gpu::layernorm_forward(ctx, d.ln, d.mean, d.rstd, d.x, P.lnfw, P.lnfb, 1, C);
  gpu::matmul_forward(ctx, d.logits, d.ln, P.wte, (const T*)nullptr, 1, C, V);
}

template <typename T>
void GPTCuda<T>::backward(bool accumulate) {
  const gpu::Context& ctx = ctx_;
  const int b = b_, t = t_, C = m_.n_embd, NH = m_.n_head, Vp = m_.vp(), N = b * t;
  const size_t NC = (size_t)N * C;
  auto zero = [&](T* p, size_t n) { cudaCheck(cudaMemsetAsync(p, 0, n * sizeof(T), ctx.stream)); };
  if (!accumulate) cudaCheck(cudaMemsetAsync(buf_.grads, 0, n_params * sizeof(float), ctx.stream));
  // logits = ln_f(x) wte^T
  zero(d_.dln, NC);
  gpu::matmul_backward(ctx, d_.dln, G.wte, (float*)nullptr, acts_.dlogits, acts_.lnf, P.wte, N, C, Vp);
  const T* last = m_.n_layer ? acts_.h.back().res3 : acts_.encoded;
  zero(d_.dres, NC);  // dres: the gradient of the residual stream, walked down the blocks
  gpu::layernorm_backward(ctx, d_.dres, G.lnfw, G.lnfb, d_.dln, last, P.lnfw, acts_.lnf_mean, acts_.lnf_rstd, N, C);
  for (int li = m_.n_layer - 1; li >= 0; --li) {
    Layer& a = acts_.h[li];
    const LayerParams<T>& p = P.h[li];
    LayerParams<float>& g = G.h[li];
    const T* residual = li == 0 ? acts_.encoded : acts_.h[li - 1].res3;
    // res3 = res2 + drop(fcproj): dres is d res3, and flows on unchanged into d res2
    zero(d_.dbtc, NC);
    gpu::dropout_backward(ctx, d_.dbtc, d_.dres, key(li, philox::kSiteMlp), b, t, C);
    zero(d_.dfch_gelu, NC * 4);
    gpu::matmul_backward(ctx, d_.dfch_gelu, g.fcprojw, g.fcprojb, d_.dbtc, a.fch_gelu, p.fcprojw, N, 4 * C, C);
    zero(d_.dfch, NC * 4);
    gpu::gelu_backward(ctx, d_.dfch, a.fch, d_.dfch_gelu, NC * 4, run_.gelu);
    zero(d_.dln, NC);
    gpu::matmul_backward(ctx, d_.dln, g.fcw, g.fcb, d_.dfch, a.ln2, p.fcw, N, C, 4 * C);
    gpu::layernorm_backward(ctx, d_.dres, g.ln2w, g.ln2b, d_.dln, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd, N, C);
    // res2 = residual + drop(attproj): dres is now d res2, and flows on into d residual
    zero(d_.dbtc, NC);
    gpu::dropout_backward(ctx, d_.dbtc, d_.dres, key(li, philox::kSiteAttnProj), b, t, C);
    zero(d_.datty, NC);
    gpu::matmul_backward(ctx, d_.datty, g.attprojw, g.attprojb, d_.dbtc, a.atty, p.attprojw, N, C, C);
    zero(d_.dqkv, NC * 3);
    gpu::attention_backward(ctx, run_.attention, d_.dqkv, d_.datty, a.qkv, a.atty, a.saved, key(li, philox::kSiteAttnProbs),
                            b, t, C, NH, true);
    zero(d_.dln, NC);
    gpu::matmul_backward(ctx, d_.dln, g.qkvw, g.qkvb, d_.dqkv, a.ln1, p.qkvw, N, C, 3 * C);
    gpu::layernorm_backward(ctx, d_.dres, g.ln1w, g.ln1b, d_.dln, residual, p.ln1w, a.ln1_mean, a.ln1_rstd, N, C);
  }
  // encoded = drop(wte[x] + wpe)
  zero(d_.dbtc, NC);
  gpu::dropout_backward(ctx, d_.dbtc, d_.dres, key(0, philox::kSiteEmbedding), b, t, C);
  gpu::encoder_backward(ctx, G.wte, G.wpe, d_.dbtc, acts_.order_keys, acts_.order_vals, b, t, C);
  gpu::global_norm_squared(ctx, acts_.stats + 1, buf_.grads, n_params);
}

template <typename T>
void GPTCuda<T>::update(float lr, int t) {
  const gpu::Context& ctx = ctx_;
  const float* scale = nullptr;
  if ((float)run_.grad_clip > 0) {
    gpu::clip_scale(ctx, acts_.stats + 2, acts_.stats + 1, (float)run_.grad_clip);
    scale = acts_.stats + 2;
  }
  gpu::AdamWArgs args{lr, (float)run_.beta1, (float)run_.beta2, 1e-8f, t};
  // ZeRO-1: the shard alone; the T copy follows the all-gather (params_changed)
  const bool copy = !std::is_same<T, float>::value && padded_ == 0;
  const size_t b0 = shard_begin_;
  gpu::adamw_update(ctx, buf_.params + b0, copy ? buf_.params_t : (T*)nullptr, buf_.grads + b0, buf_.m, buf_.v,
                    shard_count_, buf_.tensors, n_tensors_, args, scale);
}

template <typename T>
void GPTCuda<T>::grads_changed() {
  gpu::global_norm_squared(ctx_, acts_.stats + 1, buf_.grads, n_params);
}

template <typename T>
float* GPTCuda<T>::shard_norm_squared() {
  if (shard_count_ == 0) cudaCheck(cudaMemsetAsync(acts_.stats + 1, 0, sizeof(float), ctx_.stream));
  else gpu::global_norm_squared(ctx_, acts_.stats + 1, buf_.grads + shard_begin_, shard_count_);
  return acts_.stats + 1;
}

template <typename T>
void GPTCuda<T>::params_changed() {
  if (!std::is_same<T, float>::value) gpu::copy_params(ctx_, buf_.params_t, buf_.params, n_params);
}

template <typename T>
StepStats GPTCuda<T>::read_stats() {
  float s[2];
  cudaCheck(cudaMemcpyAsync(s, acts_.stats, sizeof s, cudaMemcpyDeviceToHost, ctx_.stream));
  cudaCheck(cudaStreamSynchronize(ctx_.stream));
  return StepStats{s[0], s[1]};
}

namespace {
template <typename U>
std::vector<U> download(const U* d, size_t n, cudaStream_t stream) {
  std::vector<U> h(n);
  cudaCheck(cudaMemcpyAsync(h.data(), d, n * sizeof(U), cudaMemcpyDeviceToHost, stream));
  cudaCheck(cudaStreamSynchronize(stream));
  return h;
}
template <typename T>
std::vector<float> to_floats(const std::vector<T>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = gpu::to_float(v[i]);
  return f;
}
}  // namespace

template <typename T>
std::vector<float> GPTCuda<T>::download_params() const { return download(buf_.params, n_params, ctx_.stream); }

template <typename T>
std::vector<float> GPTCuda<T>::download_grads() const { return download(buf_.grads, n_params, ctx_.stream); }

template <typename T>
void GPTCuda<T>::download_adam(std::vector<float>& m, std::vector<float>& v) const {
  m = download(buf_.m, shard_count_, ctx_.stream);
  v = download(buf_.v, shard_count_, ctx_.stream);
}

template <typename T>
std::vector<float> GPTCuda<T>::download_logits() const {
  return to_floats(download(acts_.logits, (size_t)b_ * t_ * m_.vp(), ctx_.stream));
}

template <typename T>
void GPTCuda<T>::download_logits_row(int row, float* out) const {
  const size_t V = m_.vocab_size, Vp = m_.vp();
  std::vector<float> f = to_floats(download(acts_.logits + (size_t)row * Vp, V, ctx_.stream));
  std::copy(f.begin(), f.end(), out);
}

template <typename T>
void GPTCuda<T>::download_decode_logits(float* out) const {
  const std::vector<float> f = to_floats(download(buf_.dec.logits, (size_t)m_.vocab_size, ctx_.stream));
  std::copy(f.begin(), f.end(), out);
}

template <typename T>
void GPTCuda<T>::upload_state(const float* params, const float* m, const float* v) {
  const size_t bytes = n_params * sizeof(float), shard = shard_count_ * sizeof(float), b0 = shard_begin_;
  cudaCheck(cudaMemcpyAsync(buf_.params, params, bytes, cudaMemcpyHostToDevice, ctx_.stream));
  if (m && shard) cudaCheck(cudaMemcpyAsync(buf_.m, m + b0, shard, cudaMemcpyHostToDevice, ctx_.stream));
  else if (shard) cudaCheck(cudaMemsetAsync(buf_.m, 0, shard, ctx_.stream));
  if (v && shard) cudaCheck(cudaMemcpyAsync(buf_.v, v + b0, shard, cudaMemcpyHostToDevice, ctx_.stream));
  else if (shard) cudaCheck(cudaMemsetAsync(buf_.v, 0, shard, ctx_.stream));
  if (!std::is_same<T, float>::value) gpu::copy_params(ctx_, buf_.params_t, buf_.params, n_params);
  cudaCheck(cudaStreamSynchronize(ctx_.stream));  // the host buffers may go away after return
}

template <typename T>
typename GPTCuda<T>::LayerView GPTCuda<T>::layer(int li) const {
  const Layer& a = acts_.h[li];
  return LayerView{a.qkv, a.atty, a.saved, a.attproj, a.fcproj};
}

template class GPTCuda<float>;
template class GPTCuda<gpu::bf16>;

}  // namespace tg
