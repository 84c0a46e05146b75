// model/net/gpt_cuda.cu: the GPT on the GPU (see model/net/gpt_cuda.cuh): the GPU's ops (kernels/*.cu)
// under the call sequence of model/net/gpt_net.h, the one allocation, the staging of the tokens,
// and AdamW; the twin of model/net/gpt_cpu.cpp.
#include "gpt_cuda.cuh"

#include <algorithm>
#include <cstring>

#include "../../kernels/attention.cuh"
#include "../../kernels/attention_decode.cuh"
#include "../../kernels/cross_entropy.cuh"
#include "../../kernels/dropout.cuh"
#include "../../kernels/encoder.cuh"
#include "../../kernels/flash_attn.cuh"
#include "../../kernels/gelu.cuh"
#include "../../kernels/layernorm.cuh"
#include "../../kernels/matmul.cuh"
#include "../../kernels/residual.cuh"
#include "shards.h"

namespace tg {

namespace {

// The ops of model/net/gpt_net.h on the GPU, enqueued on ctx.stream. The kernels add their
// activation gradients (+=): an op that overwrites (=) zeroes its output first.
template <typename T>
struct CudaOps {
  const gpu::Context& ctx;
  const RunShape& run;
  net::OpTrace* trace;  // null: not recorded
  using Key = philox::DropoutKey;
  void rec(const char* name, const char* writes, std::initializer_list<long long> sizes, const Key* key = nullptr) {
    if (trace) trace->add(name, writes, sizes, key);
  }
  template <typename U>
  void clear(U* p, size_t n) { cudaCheck(cudaMemsetAsync(p, 0, n * sizeof(U), ctx.stream)); }

  bool go_on() const { return true; }
  void encoder_forward(T* out, const int32_t* inp, const T* wte, const T* wpe, int b, int t, int C) {
    rec("encoder_forward", "=", {b, t, C});
    gpu::encoder_forward(ctx, out, inp, wte, wpe, b, t, C);
  }
  void dropout_forward(T* out, const T* inp, const Key& key, int b, int t, int C) {
    rec("dropout_forward", "=", {b, t, C}, &key);
    gpu::dropout_forward(ctx, out, inp, key, b, t, C);
  }
  void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* bias, int N, int C) {
    rec("layernorm_forward", "=", {N, C, bias != nullptr});
    gpu::layernorm_forward(ctx, out, mean, rstd, inp, w, bias, N, C);
  }
  void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
    rec("matmul_forward", "=", {N, C, OC, bias != nullptr});
    gpu::matmul_forward(ctx, out, inp, w, bias, N, C, OC);
  }
  void attention_forward(T* out, net::AttentionSaved<T, float> saved, const T* qkv, const Key& key, int b, int t,
                         int C, int NH) {
    rec("attention_forward", "=", {b, t, C, NH}, &key);
    gpu::attention_forward(ctx, run.attention, out, gpu::AttentionSaved<T>{saved.att, saved.lse, saved.keep}, qkv, key,
                           b, t, C, NH, true);
  }
  void gelu_forward(T* out, const T* inp, size_t n, GeluForm form) {
    rec("gelu_forward", "=", {(long long)n, (int)form});
    gpu::gelu_forward(ctx, out, inp, n, form);
  }
  void residual_forward(T* out, const T* x, const T* y, size_t n) {
    rec("residual_forward", "=", {(long long)n});
    gpu::residual_forward(ctx, out, x, y, n);
  }
  void cross_entropy_forward(float* losses, const T* logits, const int32_t* targets, int N, int V, int Vp) {
    rec("cross_entropy_forward", "=", {N, V, Vp});
    gpu::cross_entropy_forward(ctx, losses, logits, targets, N, V, Vp);
  }
  void cross_entropy_forward_backward(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                                      double n_step, int N, int V, int Vp) {
    rec("cross_entropy_forward_backward", "= =", {(long long)n_step, N, V, Vp});
    gpu::cross_entropy_forward_backward(ctx, losses, dlogits, logits, targets, 1.0f / (float)n_step, N, V, Vp);
  }
  void zero(T* p, size_t n) {
    rec("zero", "=", {(long long)n});
    clear(p, n);
  }
  const T* dropout_backward(T* dinp, const T* dout, const Key& key, int b, int t, int C) {
    rec("dropout_backward", "=", {b, t, C}, &key);
    clear(dinp, (size_t)b * t * C);
    gpu::dropout_backward(ctx, dinp, dout, key, b, t, C);
    return dinp;
  }
  void matmul_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* w, int N, int C,
                       int OC) {
    rec("matmul_backward", "= += +=", {N, C, OC, dbias != nullptr});
    clear(dinp, (size_t)N * C);
    gpu::matmul_backward(ctx, dinp, dweight, dbias, dout, inp, w, N, C, OC);
  }
  void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n, GeluForm form) {
    rec("gelu_backward", "=", {(long long)n, (int)form});
    clear(dinp, n);
    gpu::gelu_backward(ctx, dinp, inp, dout, n, form);
  }
  void layernorm_backward(T* dinp, float* dw, float* db, const T* dout, const T* inp, const T* w, const float* mean,
                          const float* rstd, int N, int C) {
    rec("layernorm_backward", "+= += +=", {N, C, db != nullptr});
    gpu::layernorm_backward(ctx, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, net::AttentionSaved<T, float> saved,
                          const Key& key, int b, int t, int C, int NH) {
    rec("attention_backward", "+=", {b, t, C, NH}, &key);
    gpu::attention_backward(ctx, run.attention, dqkv, dout, qkv, out,
                            gpu::AttentionSaved<T>{saved.att, saved.lse, saved.keep}, key, b, t, C, NH, true);
  }
  void encoder_backward(float* dwte, float* dwpe, const T* dout, const int32_t*, const uint32_t* order_keys,
                        const uint32_t* order_vals, int b, int t, int C) {
    rec("encoder_backward", "+= +=", {b, t, C});
    gpu::encoder_backward(ctx, dwte, dwpe, dout, order_keys, order_vals, b, t, C);
  }
  void attention_decode_forward(T* out, T* kcache, T* vcache, const T* qkv, int pos, int C, int NH, int maxT) {
    rec("attention_decode_forward", "=", {pos, C, NH, maxT});
    gpu::attention_decode_forward(ctx, out, kcache, vcache, qkv, pos, C, NH, maxT);
  }
  void attention_decode_prime(T* kcache, T* vcache, const T* qkv, int n, int C, int NH, int maxT) {
    rec("attention_decode_prime", "=", {n, C, NH, maxT});
    gpu::attention_decode_prime(ctx, kcache, vcache, qkv, n, C, NH, maxT);
  }
  void copy(T* dst, const T* src, size_t n) {
    rec("copy", "=", {(long long)n});
    cudaCheck(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream));
  }
};

}  // namespace

// The state, then the table of buffers, in 256-byte aligned regions gpu::kRegionGapBytes apart;
// with a base, the bytes between two regions (alignment padding and gap) go to
// gpu::mark_no_access: nothing on a GPU; under the emulator they are poisoned, so a buffer one
// row short is reported at its first write past the end instead of spilling into its neighbour.
template <typename T>
void GPTCuda<T>::carve(State& st, net::Buffers<T, float>& b, net::Carver& a, const ModelConfig& m,
                       const RunShape& run, size_t n_params, size_t n_tensors) {
  const RankShard shard(n_params, run);
  // parameters, gradients, AdamW state
  st.params = a.take<float>(std::max(n_params, shard.padded));
  st.grads = a.take<float>(std::max(n_params, shard.padded));
  st.m = a.take<float>(shard.opt_elems);
  st.v = a.take<float>(shard.opt_elems);
  st.params_t = std::is_same<T, float>::value ? reinterpret_cast<T*>(st.params) : a.take<T>(n_params);
  st.tensors = a.take<gpu::AdamWTensor>(n_tensors);
  // the bf16 flash kernels' keep decisions, stored by each layer's forward for its backward (the
  // table gives them room where the run takes the flash path)
  const bool keep = std::is_same<T, gpu::bf16>::value && run.dropout > 0;
  net::buffer_table(b, a, m, run, keep ? gpu::flash_attn_keep_bytes(run.B, m.n_head, run.T) : 0);
}

namespace {
net::Carver carver(char* base) { return net::Carver(base, 256, gpu::kRegionGapBytes, gpu::mark_no_access); }
}  // namespace

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
  State st{};
  net::Buffers<T, float> b{};
  net::Carver count = carver(nullptr);
  carve(st, b, count, m, run, n, table.size());
  return count.used() + gpt_cuda_scratch_bytes(m, run, sizeof(T), n) + gpu::kCublasWorkspaceBytes;
}

template <typename T>
GPTCuda<T>::GPTCuda(const ModelConfig& mc, const RunShape& run) : model_(mc), run_(run) {
  table = param_table(model_);
  n_params = param_count(table);
  net::Carver count = carver(nullptr);
  carve(st_, buf_, count, model_, run_, n_params, table.size());
  arena_bytes_ = count.used();
  ctx_.create(gpt_cuda_scratch_bytes(model_, run_, sizeof(T), n_params));
  ctx_.precision = std::is_same<T, float>::value ? gpu::Precision::FP32 : gpu::Precision::BF16;
  try {
    cudaCheck(cudaMalloc(&arena_, arena_bytes_));
    cudaCheck(cudaMemsetAsync(arena_, 0, arena_bytes_, ctx_.stream));
    cudaCheck(cudaMallocHost(&host_tokens_, 4 * (size_t)run_.B * run_.T * sizeof(int32_t)));
    order_counts_.resize((size_t)model_.vocab_size + 1);
    cudaCheck(cudaEventCreateWithFlags(&tokens_copied_, cudaEventDisableTiming));
  } catch (...) {
    if (host_tokens_) cudaFreeHost(host_tokens_);
    if (arena_) cudaFree(arena_);
    ctx_.destroy();
    throw;
  }
  net::Carver fill = carver(arena_);
  carve(st_, buf_, fill, model_, run_, n_params, table.size());
  P = bind_params(st_.params_t, model_);
  G = bind_params(st_.grads, model_);
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
  cudaCheck(cudaMemcpyAsync(st_.tensors, tensors.data(), tensors.size() * sizeof(gpu::AdamWTensor),
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
void GPTCuda<T>::forward(const int32_t* x, const int32_t* targets, int b, int t, bool train, uint32_t step, int micro,
                         int accum) {
  const net::Acts<T, float>& a = buf_.acts;
  const int N = b * t;
  pass_ = net::make_pass(run_, model_, 0, b, b, t, train, step, micro, accum);
  upload_tokens(x, targets, N, a.inp, a.targets, train);
  CudaOps<T> ops{ctx_, run_, trace_};
  net::forward(ops, a, P, model_, run_, pass_, targets != nullptr);
  if (targets) gpu::loss_mean(ctx_, a.stats, a.losses, N);
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
    gpu::encoder_backward_order(keys, vals, order_counts_.data(), x, n, model_.vocab_size);
    cudaCheck(cudaMemcpyAsync(buf_.acts.order_keys, keys, (size_t)n * sizeof(uint32_t), cudaMemcpyHostToDevice,
                              ctx_.stream));
    cudaCheck(cudaMemcpyAsync(buf_.acts.order_vals, vals, (size_t)n * sizeof(uint32_t), cudaMemcpyHostToDevice,
                              ctx_.stream));
  }
  cudaCheck(cudaEventRecord(tokens_copied_, ctx_.stream));
}

template <typename T>
void GPTCuda<T>::decode_reset() {
  window_.clear();
}

template <typename T>
void GPTCuda<T>::decode_step(int32_t token) {
  CudaOps<T> ops{ctx_, run_, trace_};
  const net::Decode<T, float>& d = buf_.dec;
  auto prime = [&](const int32_t* tokens, int n) {
    forward(tokens, nullptr, 1, n, false, 0);
    net::decode_prime(ops, d, buf_.acts, model_, n);
  };
  auto row = [&](int32_t tok, int pos) {
    upload_tokens(&tok, nullptr, 1, d.token, nullptr, false);
    net::decode_row(ops, d, P, model_, run_, d.token, pos);
  };
  net::decode_step(window_, token, model_, run_, prime, row);
}

template <typename T>
void GPTCuda<T>::backward(bool accumulate) {
  if (!accumulate) cudaCheck(cudaMemsetAsync(st_.grads, 0, n_params * sizeof(float), ctx_.stream));
  CudaOps<T> ops{ctx_, run_, trace_};
  net::backward(ops, buf_.acts, buf_.d, P, G, model_, run_, pass_);
  gpu::global_norm_squared(ctx_, buf_.acts.stats + 1, st_.grads, n_params);
}

template <typename T>
void GPTCuda<T>::update(float lr, int t) {
  const gpu::Context& ctx = ctx_;
  const float* scale = nullptr;
  if ((float)run_.grad_clip > 0) {
    gpu::clip_scale(ctx, buf_.acts.stats + 2, buf_.acts.stats + 1, (float)run_.grad_clip);
    scale = buf_.acts.stats + 2;
  }
  gpu::AdamWArgs args{lr, (float)run_.beta1, (float)run_.beta2, 1e-8f, t};
  // ZeRO-1: the shard alone; the T copy follows the all-gather (params_changed)
  const bool copy = !std::is_same<T, float>::value && padded_ == 0;
  const size_t b0 = shard_begin_;
  gpu::adamw_update(ctx, st_.params + b0, copy ? st_.params_t : (T*)nullptr, st_.grads + b0, st_.m, st_.v,
                    shard_count_, st_.tensors, n_tensors_, args, scale);
}

template <typename T>
void GPTCuda<T>::grads_changed() {
  gpu::global_norm_squared(ctx_, buf_.acts.stats + 1, st_.grads, n_params);
}

template <typename T>
float* GPTCuda<T>::shard_norm_squared() {
  if (shard_count_ == 0) cudaCheck(cudaMemsetAsync(buf_.acts.stats + 1, 0, sizeof(float), ctx_.stream));
  else gpu::global_norm_squared(ctx_, buf_.acts.stats + 1, st_.grads + shard_begin_, shard_count_);
  return buf_.acts.stats + 1;
}

template <typename T>
void GPTCuda<T>::params_changed() {
  if (!std::is_same<T, float>::value) gpu::copy_params(ctx_, st_.params_t, st_.params, n_params);
}

template <typename T>
StepStats GPTCuda<T>::read_stats() {
  float s[2];
  cudaCheck(cudaMemcpyAsync(s, buf_.acts.stats, sizeof s, cudaMemcpyDeviceToHost, ctx_.stream));
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
std::vector<float> GPTCuda<T>::download_params() const { return download(st_.params, n_params, ctx_.stream); }

template <typename T>
std::vector<float> GPTCuda<T>::download_grads() const { return download(st_.grads, n_params, ctx_.stream); }

template <typename T>
void GPTCuda<T>::download_adam(std::vector<float>& m, std::vector<float>& v) const {
  m = download(st_.m, shard_count_, ctx_.stream);
  v = download(st_.v, shard_count_, ctx_.stream);
}

template <typename T>
std::vector<float> GPTCuda<T>::download_logits() const {
  return to_floats(download(buf_.acts.logits, (size_t)pass_.b * pass_.t * model_.vp(), ctx_.stream));
}

template <typename T>
void GPTCuda<T>::download_logits_row(int row, float* out) const {
  const size_t V = model_.vocab_size, Vp = model_.vp();
  std::vector<float> f = to_floats(download(buf_.acts.logits + (size_t)row * Vp, V, ctx_.stream));
  std::copy(f.begin(), f.end(), out);
}

template <typename T>
void GPTCuda<T>::download_decode_logits(float* out) const {
  const std::vector<float> f = to_floats(download(buf_.dec.logits, (size_t)model_.vocab_size, ctx_.stream));
  std::copy(f.begin(), f.end(), out);
}

template <typename T>
void GPTCuda<T>::upload_state(const float* params, const float* m, const float* v) {
  const size_t bytes = n_params * sizeof(float), shard = shard_count_ * sizeof(float), b0 = shard_begin_;
  cudaCheck(cudaMemcpyAsync(st_.params, params, bytes, cudaMemcpyHostToDevice, ctx_.stream));
  if (m && shard) cudaCheck(cudaMemcpyAsync(st_.m, m + b0, shard, cudaMemcpyHostToDevice, ctx_.stream));
  else if (shard) cudaCheck(cudaMemsetAsync(st_.m, 0, shard, ctx_.stream));
  if (v && shard) cudaCheck(cudaMemcpyAsync(st_.v, v + b0, shard, cudaMemcpyHostToDevice, ctx_.stream));
  else if (shard) cudaCheck(cudaMemsetAsync(st_.v, 0, shard, ctx_.stream));
  if (!std::is_same<T, float>::value) gpu::copy_params(ctx_, st_.params_t, st_.params, n_params);
  cudaCheck(cudaStreamSynchronize(ctx_.stream));  // the host buffers may go away after return
}

template <typename T>
typename GPTCuda<T>::LayerView GPTCuda<T>::layer(int li) const {
  const net::Layer<T, float>& a = buf_.acts.h[li];
  return LayerView{a.qkv, a.atty, gpu::AttentionSaved<T>{a.saved.att, a.saved.lse, a.saved.keep}, a.attproj, a.fcproj};
}

template class GPTCuda<float>;
template class GPTCuda<gpu::bf16>;

}  // namespace tg
