// model/net/gpt_cpu.cpp: the GPT on the CPU reference (see model/net/gpt_cpu.h): the CPU's ops
// (kernels/cpu) under the call sequence of model/net/gpt_net.h, the batch slices, the memory,
// and AdamW. The table of buffers is allocated once for (B, T); a forward over a smaller
// (b, t) uses the front of each buffer.
#include "gpt_cpu.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "../../kernels/cpu/adamw.h"
#include "../../kernels/cpu/attention.h"
#include "../../kernels/cpu/attention_decode.h"
#include "../../kernels/cpu/cross_entropy.h"
#include "../../kernels/cpu/dropout.h"
#include "../../kernels/cpu/encoder.h"
#include "../../kernels/cpu/gelu.h"
#include "../../kernels/cpu/layernorm.h"
#include "../../kernels/cpu/matmul.h"
#include "../../kernels/cpu/residual.h"
#include "../run/stop.h"
#include "shards.h"

namespace tg {

namespace {

// The ops of model/net/gpt_net.h on the CPU reference. The backward's overwriting ops (=) are the
// kernels' _overwrite variants; a dropout that drops nothing is the identity and gives dout back.
template <typename T>
struct CpuOps {
  const RunShape& run;
  net::OpTrace* trace;  // null: not recorded
  using Key = philox::DropoutKey;
  void rec(const char* name, const char* writes, std::initializer_list<long long> sizes, const Key* key = nullptr) {
    if (trace) trace->add(name, writes, sizes, key);
  }

  bool go_on() const { return !stop_requested(); }
  void encoder_forward(T* out, const int32_t* inp, const T* wte, const T* wpe, int b, int t, int C) {
    rec("encoder_forward", "=", {b, t, C});
    cpu::encoder_forward(out, inp, wte, wpe, b, t, C);
  }
  void dropout_forward(T* out, const T* inp, const Key& key, int b, int t, int C) {
    rec("dropout_forward", "=", {b, t, C}, &key);
    cpu::dropout_forward(out, inp, key, b, t, C);
  }
  void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* bias, int N, int C) {
    rec("layernorm_forward", "=", {N, C, bias != nullptr});
    cpu::layernorm_forward(out, mean, rstd, inp, w, bias, N, C);
  }
  void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
    rec("matmul_forward", "=", {N, C, OC, bias != nullptr});
    cpu::matmul_forward(out, inp, w, bias, N, C, OC);
  }
  void attention_forward(T* out, net::AttentionSaved<T, T> saved, const T* qkv, const Key& key, int b, int t, int C,
                         int NH) {
    rec("attention_forward", "=", {b, t, C, NH}, &key);
    cpu::attention_forward(run.attention, out, {saved.att, saved.lse}, qkv, key, b, t, C, NH, true, run.Br, run.Bc);
  }
  void gelu_forward(T* out, const T* inp, size_t n, GeluForm form) {
    rec("gelu_forward", "=", {(long long)n, (int)form});
    cpu::gelu_forward(out, inp, n, form);
  }
  void residual_forward(T* out, const T* x, const T* y, size_t n) {
    rec("residual_forward", "=", {(long long)n});
    cpu::residual_forward(out, x, y, n);
  }
  void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int N, int V, int Vp) {
    rec("cross_entropy_forward", "=", {N, V, Vp});
    cpu::cross_entropy_forward(losses, logits, targets, N, V, Vp);
  }
  void cross_entropy_forward_backward(T* losses, T* dlogits, const T* logits, const int32_t* targets, double n_step,
                                      int N, int V, int Vp) {
    rec("cross_entropy_forward_backward", "= =", {(long long)n_step, N, V, Vp});
    cpu::cross_entropy_forward_backward(losses, dlogits, logits, targets, (T)(1.0 / n_step), N, V, Vp);
  }
  void zero(T* p, size_t n) {
    rec("zero", "=", {(long long)n});
    std::memset(p, 0, n * sizeof(T));
  }
  const T* dropout_backward(T* dinp, const T* dout, const Key& key, int b, int t, int C) {
    rec("dropout_backward", "=", {b, t, C}, &key);
    if (key.threshold == 0) return dout;  // p = 0: the identity
    std::memset(dinp, 0, (size_t)b * t * C * sizeof(T));
    cpu::dropout_backward(dinp, dout, key, b, t, C);
    return dinp;
  }
  void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* w, int N, int C, int OC) {
    rec("matmul_backward", "= += +=", {N, C, OC, dbias != nullptr});
    cpu::matmul_backward_overwrite(dinp, dweight, dbias, dout, inp, w, N, C, OC);
  }
  void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n, GeluForm form) {
    rec("gelu_backward", "=", {(long long)n, (int)form});
    cpu::gelu_backward_overwrite(dinp, inp, dout, n, form);
  }
  void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean,
                          const T* rstd, int N, int C) {
    rec("layernorm_backward", "+= += +=", {N, C, db != nullptr});
    cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, net::AttentionSaved<T, T> saved,
                          const Key& key, int b, int t, int C, int NH) {
    rec("attention_backward", "+=", {b, t, C, NH}, &key);
    cpu::attention_backward(run.attention, dqkv, dout, qkv, out, {saved.att, saved.lse}, key, b, t, C, NH, true,
                            run.Br, run.Bc);
  }
  void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* inp, const uint32_t*, const uint32_t*, int b,
                        int t, int C) {
    rec("encoder_backward", "+= +=", {b, t, C});
    cpu::encoder_backward(dwte, dwpe, dout, inp, b, t, C);
  }
  void attention_decode_forward(T* out, T* kcache, T* vcache, const T* qkv, int pos, int C, int NH, int maxT) {
    rec("attention_decode_forward", "=", {pos, C, NH, maxT});
    cpu::attention_decode_forward(out, kcache, vcache, qkv, pos, C, NH, maxT);
  }
  void attention_decode_prime(T* kcache, T* vcache, const T* qkv, int n, int C, int NH, int maxT) {
    rec("attention_decode_prime", "=", {n, C, NH, maxT});
    cpu::attention_decode_prime(kcache, vcache, qkv, n, C, NH, maxT);
  }
  void copy(T* dst, const T* src, size_t n) {
    rec("copy", "=", {(long long)n});
    std::copy(src, src + n, dst);
  }
};

// The rows of sequences b0 .. of a pass of length t: every buffer of the table shifted to them.
template <typename T>
net::Acts<T, T> rows_of(const net::Acts<T, T>& a, size_t b0, size_t t, const ModelConfig& m) {
  const size_t n0 = b0 * t, C = m.n_embd, Vp = m.vp(), H = (size_t)m.n_head * t;  // H: attention rows of a sequence
  net::Acts<T, T> s = a;
  s.inp += n0;
  s.targets += n0;
  s.encoded += n0 * C;
  for (net::Layer<T, T>& l : s.h) {
    for (T** p : {&l.ln1, &l.atty, &l.attproj, &l.res2, &l.ln2, &l.fcproj, &l.res3}) *p += n0 * C;
    for (T** p : {&l.ln1_mean, &l.ln1_rstd, &l.ln2_mean, &l.ln2_rstd}) *p += n0;
    l.qkv += n0 * 3 * C;
    l.fch += n0 * 4 * C;
    l.fch_gelu += n0 * 4 * C;
    if (l.saved.att) l.saved.att += b0 * H * t;
    if (l.saved.lse) l.saved.lse += b0 * H;
  }
  s.lnf += n0 * C;
  s.lnf_mean += n0;
  s.lnf_rstd += n0;
  s.logits += n0 * Vp;
  s.dlogits += n0 * Vp;
  s.losses += n0;
  return s;
}

template <typename T>
net::Scratch<T> rows_of(const net::Scratch<T>& d, size_t b0, size_t t, const ModelConfig& m) {
  const size_t n0 = b0 * t, C = m.n_embd;
  net::Scratch<T> s = d;
  for (T** p : {&s.dres, &s.dln, &s.dbtc, &s.datty}) *p += n0 * C;
  s.dqkv += n0 * 3 * C;
  s.dfch += n0 * 4 * C;
  s.dfch_gelu += n0 * 4 * C;
  return s;
}

// The table's bytes, in 64-byte aligned regions (see Aligned64), in double (bytes_needed).
template <typename T>
double table_bytes(const ModelConfig& m, const RunShape& run) {
  net::Buffers<T, T> b{};
  net::Carver count(nullptr, 64);
  net::buffer_table(b, count, m, run);
  return std::ceil(count.bytes() / 64) * 64;
}

}  // namespace

template <typename T>
GPTCpu<T>::GPTCpu(const ModelConfig& mc, const RunShape& run) : model_(mc), run_(run) {
  table = param_table(model_);
  size_t n = param_count(table);
  params.assign(n, 0);
  grads.assign(n, 0);
  const RankShard shard(n, run);
  shard_begin_ = shard.begin;
  shard_count_ = shard.count;
  m.assign(shard.opt_elems, 0);
  v.assign(shard.opt_elems, 0);
  P = bind_params(params.data(), model_);
  G = bind_params(grads.data(), model_);
  slices_ = slices(run);
  gpart_.resize(slices_ - 1);
  for (Buffer<T>& g : gpart_) {
    g.assign(n, 0);
    Gpart_.push_back(bind_params(g.data(), model_));
  }
  // the table of buffers (activations, their gradients, the KV cache), zeroed
  const size_t bytes = (size_t)table_bytes<T>(model_, run_);
  arena_.reset(static_cast<char*>(std::aligned_alloc(64, bytes)));
  if (!arena_) throw std::bad_alloc();
  std::memset(arena_.get(), 0, bytes);
  net::Carver fill(arena_.get(), 64);
  net::buffer_table(buf_, fill, model_, run_);
  window_.reserve(model_.block_size);
}

template <typename T>
int GPTCpu<T>::slices(const RunShape& run) {
  const int want = run.slices > 0 ? run.slices : omp_get_max_threads();
  return std::max(1, std::min(want, run.B));
}

template <typename T>
template <typename F>
bool GPTCpu<T>::for_each_slice(int b, F&& body) {
  const int S = std::max(1, std::min(slices_, b));
  std::atomic<bool> stopped{false};
  // One slice per thread; a team smaller than S (the runtime may give fewer threads) takes
  // several in turn, so the arithmetic depends on S alone, never on the team.
#pragma omp parallel num_threads(S) if (S > 1)
  for (int s = omp_get_thread_num(); s < S; s += omp_get_num_threads())
    if (!body(s, S, b * s / S, b * (s + 1) / S)) stopped = true;
  return !stopped;
}

template <typename T>
net::Pass GPTCpu<T>::pass(int b0, int b1) const {
  return net::make_pass(run_, model_, b0, b1 - b0, b_, t_, train_, step_, micro_, accum_);
}

template <typename T>
double GPTCpu<T>::forward(const int32_t* x, const int32_t* targets, int b, int t, bool train, uint32_t step,
                          int micro, int accum) {
  b_ = b; t_ = t; train_ = train; step_ = step; micro_ = micro; accum_ = accum;
  const net::Acts<T, T>& a = buf_.acts;
  const size_t n = (size_t)b * t;
  std::copy(x, x + n, a.inp);
  if (targets) std::copy(targets, targets + n, a.targets);
  const bool done = for_each_slice(b, [&](int, int S, int b0, int b1) {
    CpuOps<T> ops{run_, S == 1 ? trace_ : nullptr};
    return net::forward(ops, rows_of(a, b0, t, model_), P, model_, run_, pass(b0, b1), targets != nullptr);
  });
  if (!done) throw Interrupted{};  // a stop cut the pass short (model/run/stop.h)
  if (!targets) return 0.0;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += a.losses[i];
  return sum / (double)n;
}

template <typename T>
void GPTCpu<T>::backward(bool accumulate) {
  // Slice 0 adds into grads (zeroed first unless accumulating); slice s > 0 into its own zeroed
  // partial gradient gpart_[s - 1]; the partials are then added into grads, in slice order.
  const bool done = for_each_slice(b_, [&](int s, int S, int b0, int b1) {
    CpuOps<T> ops{run_, S == 1 ? trace_ : nullptr};
    const net::Acts<T, T> a = rows_of(buf_.acts, b0, t_, model_);
    const net::Scratch<T> d = rows_of(buf_.d, b0, t_, model_);
    if (s == 0) {
      if (!accumulate) std::fill(grads.begin(), grads.end(), T(0));
      return net::backward(ops, a, d, P, G, model_, run_, pass(b0, b1));
    }
    std::fill(gpart_[s - 1].begin(), gpart_[s - 1].end(), T(0));
    return net::backward(ops, a, d, P, Gpart_[s - 1], model_, run_, pass(b0, b1));
  });
  if (!done) throw Interrupted{};
  const int S = std::max(1, std::min(slices_, b_));
  if (S == 1) return;
  const long n = (long)grads.size();
  T* __restrict g = grads.data();
  // partial by partial, each pass over plain pointers (the compiler vectorises it; indexing
  // gpart_ inside the loop reloaded each partial's data pointer per element): the same sum,
  // in the same order, for each element
  for (int s = 1; s < S; ++s) {
    const T* __restrict part = gpart_[s - 1].data();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) g[i] += part[i];
  }
}

template <typename T>
void GPTCpu<T>::decode_reset() {
  window_.clear();
}

template <typename T>
const T* GPTCpu<T>::decode_step(int32_t token) {
  CpuOps<T> ops{run_, trace_};
  auto prime = [&](const int32_t* tokens, int n) {
    forward(tokens, nullptr, 1, n, false, 0);
    net::decode_prime(ops, buf_.dec, buf_.acts, model_, n);
  };
  auto row = [&](int32_t tok, int pos) { net::decode_row(ops, buf_.dec, P, model_, run_, &tok, pos); };
  net::decode_step(window_, token, model_, run_, prime, row);
  return buf_.dec.logits;
}

template <typename T>
void GPTCpu<T>::update(float lr, int t, double norm) {
  const size_t b = shard_begin_, e = shard_begin_ + shard_count_;
  const float beta1 = (float)run_.beta1, beta2 = (float)run_.beta2, decay = (float)run_.weight_decay;
#pragma omp parallel
  {
    const size_t th = (size_t)omp_get_thread_num(), nth = (size_t)omp_get_num_threads();
    for (const ParamSpec& p : table) {
      const size_t lo = std::max(p.offset, b), hi = std::min(p.offset + p.numel, e);
      if (lo >= hi) continue;
      const size_t i0 = lo + (hi - lo) * th / nth, n = lo + (hi - lo) * (th + 1) / nth - i0;
      if (run_.grad_clip > 0) cpu::clip_grad_norm(grads.data() + i0, n, norm, run_.grad_clip);
      cpu::adamw_update(params.data() + i0, grads.data() + i0, m.data() + (i0 - b), v.data() + (i0 - b), n, lr, beta1,
                        beta2, 1e-8f, p.decay ? decay : 0.0f, t);
    }
  }
}

template <typename T>
double GPTCpu<T>::bytes_needed(const ModelConfig& mc, const RunShape& run) {
  // in double: a config far too large for any machine must not wrap around
  const double np = (double)param_count(param_table(mc));
  const double n = (1 + slices(run)) * np + 2 * (double)RankShard((size_t)np, run).opt_elems;  // params, grads, partial grads; m, v
  return n * sizeof(T) + table_bytes<T>(mc, run);
}

// float for train_gpt; double, for the tests' gradient checks, in the objects the Makefile
// compiles from this file with TG_CPU_DOUBLE (CPU_DOUBLE_OBJS), linked into the tests only
#ifndef TG_CPU_DOUBLE
template class GPTCpu<float>;
#else
template class GPTCpu<double>;
#endif

}  // namespace tg
