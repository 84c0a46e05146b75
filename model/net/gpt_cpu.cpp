// model/net/gpt_cpu.cpp: the GPT call sequence on the CPU reference (see model/net/gpt_cpu.h and the
// architecture in model/net/gpt.h). Activations are allocated once for (B, T); a forward over a
// smaller (b, t) uses the front of each buffer. decode_step (the KV-cache decoder) has its own
// cache and one-row buffers.
#include "gpt_cpu.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "../../kernels/cpu/adamw.h"
#include "../../kernels/cpu/attention_decode.h"
#include "../../kernels/cpu/attention_naive.h"
#include "../../kernels/cpu/attention_tiled.h"
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

template <typename T>
GPTCpu<T>::GPTCpu(const ModelConfig& mc, const RunShape& run) : m_(mc), run_(run) {
  table = param_table(m_);
  size_t n = param_count(table);
  params.assign(n, 0);
  grads.assign(n, 0);
  const RankShard shard(n, run);
  shard_begin_ = shard.begin;
  shard_count_ = shard.count;
  m.assign(shard.opt_elems, 0);
  v.assign(shard.opt_elems, 0);
  P = bind_params(params.data(), m_);
  G = bind_params(grads.data(), m_);
  slices_ = slices(run);
  gpart_.resize(slices_ - 1);
  for (Buffer<T>& g : gpart_) {
    g.assign(n, 0);
    Gpart_.push_back(bind_params(g.data(), m_));
  }

  const size_t BT = (size_t)run.B * run.T, C = m_.n_embd, NH = m_.n_head, V = m_.vp();  // logits rows: Vp
  acts_.encoded.resize(BT * C);
  acts_.h.resize(m_.n_layer);
  for (Layer& l : acts_.h) {
    for (auto* buf : {&l.ln1, &l.atty, &l.attproj, &l.res2, &l.ln2, &l.fcproj, &l.res3}) buf->resize(BT * C);
    for (auto* buf : {&l.ln1_mean, &l.ln1_rstd, &l.ln2_mean, &l.ln2_rstd}) buf->resize(BT);
    l.qkv.resize(BT * 3 * C);
    l.fch.resize(BT * 4 * C);
    l.fch_gelu.resize(BT * 4 * C);
    // the two attention paths save different things for the backward
    if (run.attention == AttentionPath::Flash) l.lse.resize((size_t)run.B * NH * run.T);
    else l.att.resize((size_t)run.B * NH * run.T * run.T);
  }
  acts_.lnf.resize(BT * C);
  acts_.lnf_mean.resize(BT);
  acts_.lnf_rstd.resize(BT);
  acts_.logits.resize(BT * V);
  acts_.dlogits.resize(BT * V);
  acts_.losses.resize(BT);
  for (auto* buf : {&d_.dres, &d_.dln, &d_.dbtc, &d_.datty}) buf->resize(BT * C);
  d_.dqkv.resize(BT * 3 * C);
  d_.dfch.resize(BT * 4 * C);
  d_.dfch_gelu.resize(BT * 4 * C);
  inp_.resize(BT);

  // the KV cache and the one-row buffers of decode_step
  const size_t maxT = m_.block_size, L = m_.n_layer;
  dec_.k.assign(L * maxT * C, 0);  // (L, NH, maxT, HS): NH * HS = C
  dec_.v.assign(L * maxT * C, 0);
  for (auto* buf : {&dec_.x, &dec_.ln, &dec_.atty, &dec_.proj}) buf->resize(C);
  dec_.mean.resize(1);
  dec_.rstd.resize(1);
  dec_.qkv.resize(3 * C);
  dec_.fch.resize(4 * C);
  dec_.fch_gelu.resize(4 * C);
  dec_.logits.resize(V);
  window_.reserve(maxT);
}

template <typename T>
philox::DropoutKey GPTCpu<T>::key(uint32_t layer, uint32_t site, int b0) const {
  double p = train_ ? run_.dropout : 0.0;
  philox::DropoutKey k = philox::make_dropout_key(run_.seed, step_, layer, site, p);
  const uint32_t rows = (uint32_t)micro_ * (uint32_t)run_.B + (uint32_t)b0;
  k.row0 = site == philox::kSiteAttnProbs ? rows * (uint32_t)m_.n_head : rows;
  return k;
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
double GPTCpu<T>::forward(const int32_t* x, const int32_t* targets, int b, int t, bool train, uint32_t step,
                          int micro, int accum) {
  b_ = b; t_ = t; train_ = train; step_ = step; micro_ = train ? micro : 0;
  std::copy(x, x + (size_t)b * t, inp_.begin());
  const bool done = for_each_slice(b, [&](int, int, int b0, int b1) {
    return forward_slice(b0, b1, targets, accum);
  });
  if (!done) throw Interrupted{};  // a stop cut the pass short (model/run/stop.h)
  if (!targets) return 0.0;
  const int N = b * t;
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += acts_.losses[i];
  return sum / N;
}

template <typename T>
bool GPTCpu<T>::forward_slice(int b0, int b1, const int32_t* targets, int accum) {
  const int b = b1 - b0, t = t_, C = m_.n_embd, NH = m_.n_head, V = m_.vocab_size, Vp = m_.vp(), N = b * t;
  const size_t n0 = (size_t)b0 * t;  // first row of the slice
  // rows n0 .. n0 + N - 1 of a (B, T, width) buffer
  auto rows = [n0](Buffer<T>& buf, size_t width) { return buf.data() + n0 * width; };
  const size_t H = (size_t)NH * t;  // lse rows of one sequence

  cpu::encoder_forward(rows(acts_.encoded, C), inp_.data() + n0, P.wte, P.wpe, b, t, C);
  cpu::dropout_forward(rows(acts_.encoded, C), rows(acts_.encoded, C), key(0, philox::kSiteEmbedding, b0), b, t, C);
  const T* residual = rows(acts_.encoded, C);
  for (int li = 0; li < m_.n_layer; ++li) {
    if (stop_requested()) return false;
    Layer& a = acts_.h[li];
    const LayerParams<T>& p = P.h[li];
    T *ln1 = rows(a.ln1, C), *qkv = rows(a.qkv, 3 * C), *atty = rows(a.atty, C), *attproj = rows(a.attproj, C);
    T *res2 = rows(a.res2, C), *ln2 = rows(a.ln2, C), *fch = rows(a.fch, 4 * C), *fch_gelu = rows(a.fch_gelu, 4 * C);
    T *fcproj = rows(a.fcproj, C), *res3 = rows(a.res3, C);
    // x = x + drop(c_proj(attn(ln_1(x))))
    cpu::layernorm_forward(ln1, a.ln1_mean.data() + n0, a.ln1_rstd.data() + n0, residual, p.ln1w, p.ln1b, N, C);
    cpu::matmul_forward(qkv, ln1, p.qkvw, p.qkvb, N, C, 3 * C);
    if (run_.attention == AttentionPath::Flash)
      cpu::attention_tiled_forward(atty, a.lse.data() + b0 * H, qkv, key(li, philox::kSiteAttnProbs, b0), b, t, C, NH,
                                   true, run_.Br, run_.Bc, nullptr);
    else
      cpu::attention_naive_forward(atty, a.att.data() + b0 * H * t, qkv, key(li, philox::kSiteAttnProbs, b0), b, t, C,
                                   NH, true, nullptr);
    cpu::matmul_forward(attproj, atty, p.attprojw, p.attprojb, N, C, C);
    cpu::dropout_forward(attproj, attproj, key(li, philox::kSiteAttnProj, b0), b, t, C);
    cpu::residual_forward(res2, residual, attproj, (size_t)N * C);
    if (stop_requested()) return false;
    // x = x + drop(mlp.c_proj(gelu(c_fc(ln_2(x)))))
    cpu::layernorm_forward(ln2, a.ln2_mean.data() + n0, a.ln2_rstd.data() + n0, res2, p.ln2w, p.ln2b, N, C);
    cpu::matmul_forward(fch, ln2, p.fcw, p.fcb, N, C, 4 * C);
    cpu::gelu_forward(fch_gelu, fch, (size_t)N * 4 * C, run_.gelu);
    cpu::matmul_forward(fcproj, fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
    cpu::dropout_forward(fcproj, fcproj, key(li, philox::kSiteMlp, b0), b, t, C);
    cpu::residual_forward(res3, res2, fcproj, (size_t)N * C);
    residual = res3;
  }
  T* lnf = rows(acts_.lnf, C);
  cpu::layernorm_forward(lnf, acts_.lnf_mean.data() + n0, acts_.lnf_rstd.data() + n0, residual, P.lnfw, P.lnfb, N, C);
  cpu::matmul_forward(rows(acts_.logits, Vp), lnf, P.wte, (const T*)nullptr, N, C, Vp);
  if (!targets) return true;
  if (train_)
    cpu::cross_entropy_forward_backward(acts_.losses.data() + n0, rows(acts_.dlogits, Vp), rows(acts_.logits, Vp),
                                        targets + n0, (T)(1.0 / ((double)b_ * t * accum)), N, V, Vp);
  else
    cpu::cross_entropy_forward(acts_.losses.data() + n0, rows(acts_.logits, Vp), targets + n0, N, V, Vp);
  return true;
}

template <typename T>
void GPTCpu<T>::backward(bool accumulate) {
  // Slice 0 adds into grads (zeroed first unless accumulating); slice s > 0 into its own zeroed
  // partial gradient gpart_[s - 1]; the partials are then added into grads, in slice order.
  const bool done = for_each_slice(b_, [&](int s, int, int b0, int b1) {
    if (s == 0) {
      if (!accumulate) std::fill(grads.begin(), grads.end(), T(0));
      return backward_slice(b0, b1, G);
    }
    std::fill(gpart_[s - 1].begin(), gpart_[s - 1].end(), T(0));
    return backward_slice(b0, b1, Gpart_[s - 1]);
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
bool GPTCpu<T>::backward_slice(int b0, int b1, GPTParams<T>& gs) {
  const int b = b1 - b0, t = t_, C = m_.n_embd, NH = m_.n_head, V = m_.vp(), N = b * t;  // the head's matmul: Vp
  const size_t n0 = (size_t)b0 * t, NC = (size_t)N * C, H = (size_t)NH * t;
  auto rows = [n0](Buffer<T>& buf, size_t width) { return buf.data() + n0 * width; };
  // Activation gradients with one contribution (dln, dfch_gelu, dfch, datty) are written by
  // the _overwrite ops, not zeroed and accumulated into; dres and dqkv are zeroed here.
  auto zeroed = [n0, N](Buffer<T>& buf, size_t width) {
    T* p = buf.data() + n0 * width;
    std::memset(p, 0, (size_t)N * width * sizeof(T));
    return p;
  };
  T *dres = rows(d_.dres, C), *dbtc = rows(d_.dbtc, C);
  // d(inp) of the dropout site whose output gradient is dres: dres itself when nothing is
  // dropped (p = 0: the dropout is the identity), else dbtc
  auto drop_backward = [&](const philox::DropoutKey& k) -> const T* {
    if (k.threshold == 0) return dres;
    std::memset(dbtc, 0, NC * sizeof(T));
    cpu::dropout_backward(dbtc, dres, k, b, t, C);
    return dbtc;
  };
  // logits = ln_f(x) wte^T
  T* dln = rows(d_.dln, C);
  cpu::matmul_backward_overwrite(dln, gs.wte, (T*)nullptr, rows(acts_.dlogits, V), rows(acts_.lnf, C), P.wte, N, C, V);
  const T* last = m_.n_layer ? acts_.h.back().res3.data() + n0 * C : acts_.encoded.data() + n0 * C;
  std::memset(dres, 0, NC * sizeof(T));  // dres: the gradient of the residual stream, walked down the blocks
  cpu::layernorm_backward(dres, gs.lnfw, gs.lnfb, dln, last, P.lnfw, acts_.lnf_mean.data() + n0,
                          acts_.lnf_rstd.data() + n0, N, C);
  for (int li = m_.n_layer - 1; li >= 0; --li) {
    if (stop_requested()) return false;
    Layer& a = acts_.h[li];
    const LayerParams<T>& p = P.h[li];
    LayerParams<T>& g = gs.h[li];
    const T* residual = li == 0 ? rows(acts_.encoded, C) : rows(acts_.h[li - 1].res3, C);
    // res3 = res2 + drop(fcproj): dres is d res3, and flows on unchanged into d res2
    const T* dfcproj = drop_backward(key(li, philox::kSiteMlp, b0));
    T* dfch_gelu = rows(d_.dfch_gelu, 4 * C);
    cpu::matmul_backward_overwrite(dfch_gelu, g.fcprojw, g.fcprojb, dfcproj, rows(a.fch_gelu, 4 * C), p.fcprojw, N, 4 * C, C);
    T* dfch = rows(d_.dfch, 4 * C);
    cpu::gelu_backward_overwrite(dfch, rows(a.fch, 4 * C), dfch_gelu, NC * 4, run_.gelu);
    cpu::matmul_backward_overwrite(dln, g.fcw, g.fcb, dfch, rows(a.ln2, C), p.fcw, N, C, 4 * C);
    cpu::layernorm_backward(dres, g.ln2w, g.ln2b, dln, rows(a.res2, C), p.ln2w, a.ln2_mean.data() + n0,
                            a.ln2_rstd.data() + n0, N, C);
    if (stop_requested()) return false;
    // res2 = residual + drop(attproj): dres is now d res2, and flows on into d residual
    const T* dattproj = drop_backward(key(li, philox::kSiteAttnProj, b0));
    T* datty = rows(d_.datty, C);
    cpu::matmul_backward_overwrite(datty, g.attprojw, g.attprojb, dattproj, rows(a.atty, C), p.attprojw, N, C, C);
    T* dqkv = zeroed(d_.dqkv, 3 * C);
    if (run_.attention == AttentionPath::Flash)
      cpu::attention_tiled_backward(dqkv, datty, rows(a.qkv, 3 * C), rows(a.atty, C), a.lse.data() + b0 * H,
                                    key(li, philox::kSiteAttnProbs, b0), b, t, C, NH, true, run_.Br, run_.Bc);
    else
      cpu::attention_naive_backward(dqkv, datty, rows(a.qkv, 3 * C), a.att.data() + b0 * H * t,
                                    key(li, philox::kSiteAttnProbs, b0), b, t, C, NH, true);
    cpu::matmul_backward_overwrite(dln, g.qkvw, g.qkvb, dqkv, rows(a.ln1, C), p.qkvw, N, C, 3 * C);
    cpu::layernorm_backward(dres, g.ln1w, g.ln1b, dln, residual, p.ln1w, a.ln1_mean.data() + n0,
                            a.ln1_rstd.data() + n0, N, C);
  }
  // encoded = drop(wte[x] + wpe)
  const T* denc = drop_backward(key(0, philox::kSiteEmbedding, b0));
  cpu::encoder_backward(gs.wte, gs.wpe, denc, inp_.data() + n0, b, t, C);
  return true;
}

template <typename T>
void GPTCpu<T>::decode_reset() {
  window_.clear();
}

template <typename T>
const T* GPTCpu<T>::decode_step(int32_t token) {
  if ((int)window_.size() == m_.block_size) {  // full: the window slides by one, re-prime it all
    window_.erase(window_.begin());
    window_.push_back(token);
    decode_prime();
  } else {
    window_.push_back(token);
    decode_row(token);
  }
  return dec_.logits.data();
}

template <typename T>
void GPTCpu<T>::decode_prime() {
  const int n = (int)window_.size(), C = m_.n_embd, NH = m_.n_head, V = m_.vp(), maxT = m_.block_size;
  if (run_.B >= 1 && run_.T >= n) {
    // one forward over the window; its qkv rows hold every layer's keys and values
    forward(window_.data(), nullptr, 1, n, false, 0);
    for (int li = 0; li < m_.n_layer; ++li)
      cpu::attention_decode_prime(dec_.k.data() + (size_t)li * maxT * C, dec_.v.data() + (size_t)li * maxT * C,
                                  acts_.h[li].qkv.data(), n, C, NH, maxT);
    const T* last = acts_.logits.data() + (size_t)(n - 1) * V;
    std::copy(last, last + V, dec_.logits.begin());
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
void GPTCpu<T>::decode_row(int32_t token) {
  const int C = m_.n_embd, NH = m_.n_head, V = m_.vp(), maxT = m_.block_size;
  const int pos = (int)window_.size() - 1;  // 0 <= pos < block_size
  Decode& d = dec_;
  // x = wte[token] + wpe[pos]: the encoder op with Tn = 1 on wpe shifted to row pos
  cpu::encoder_forward(d.x.data(), &token, P.wte, P.wpe + (size_t)pos * C, 1, 1, C);
  for (int li = 0; li < m_.n_layer; ++li) {
    const LayerParams<T>& p = P.h[li];
    // x = x + c_proj(attn(ln_1(x)))
    cpu::layernorm_forward(d.ln.data(), d.mean.data(), d.rstd.data(), d.x.data(), p.ln1w, p.ln1b, 1, C);
    cpu::matmul_forward(d.qkv.data(), d.ln.data(), p.qkvw, p.qkvb, 1, C, 3 * C);
    cpu::attention_decode_forward(d.atty.data(), d.k.data() + (size_t)li * maxT * C, d.v.data() + (size_t)li * maxT * C,
                                  d.qkv.data(), pos, C, NH, maxT);
    cpu::matmul_forward(d.proj.data(), d.atty.data(), p.attprojw, p.attprojb, 1, C, C);
    cpu::residual_forward(d.x.data(), d.x.data(), d.proj.data(), (size_t)C);
    // x = x + mlp.c_proj(gelu(c_fc(ln_2(x))))
    cpu::layernorm_forward(d.ln.data(), d.mean.data(), d.rstd.data(), d.x.data(), p.ln2w, p.ln2b, 1, C);
    cpu::matmul_forward(d.fch.data(), d.ln.data(), p.fcw, p.fcb, 1, C, 4 * C);
    cpu::gelu_forward(d.fch_gelu.data(), d.fch.data(), (size_t)4 * C, run_.gelu);
    cpu::matmul_forward(d.proj.data(), d.fch_gelu.data(), p.fcprojw, p.fcprojb, 1, 4 * C, C);
    cpu::residual_forward(d.x.data(), d.x.data(), d.proj.data(), (size_t)C);
  }
  cpu::layernorm_forward(d.ln.data(), d.mean.data(), d.rstd.data(), d.x.data(), P.lnfw, P.lnfb, 1, C);
  cpu::matmul_forward(d.logits.data(), d.ln.data(), P.wte, (const T*)nullptr, 1, C, V);
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
double GPTCpu<T>::bytes_needed(const ModelConfig& m, const RunShape& run) {
  // in double: a config far too large for any machine must not wrap around
  const double BT = (double)run.B * run.T, C = m.n_embd, NH = m.n_head, V = m.vp(), L = m.n_layer;
  const double att = run.attention == AttentionPath::Flash ? (double)run.B * NH * run.T : (double)run.B * NH * run.T * run.T;
  const double np = (double)param_count(param_table(m));
  double n = (2 + slices(run) - 1) * np + 2 * (double)RankShard((size_t)np, run).opt_elems;  // params, grads, partial grads; m, v
  n += BT * C;                                     // encoded
  n += L * (BT * C * (7 + 3 + 8) + 4 * BT + att);  // per block (see the constructor)
  n += BT * C + 3 * BT + 2 * BT * V;               // ln_f, losses, logits, dlogits
  n += BT * C * (4 + 3 + 8);                       // activation-gradient scratch
  n += 2 * L * m.block_size * C + C * (4 + 3 + 8) + 2 + V;  // KV cache, decode rows
  return n * sizeof(T) + BT * sizeof(int32_t);
}

// float for train_gpt; double, for the tests' gradient checks, in the objects the Makefile
// compiles from this file with TG_CPU_DOUBLE (CPU_DOUBLE_OBJS), linked into the tests only
#ifndef TG_CPU_DOUBLE
template class GPTCpu<float>;
#else
template class GPTCpu<double>;
#endif

}  // namespace tg
