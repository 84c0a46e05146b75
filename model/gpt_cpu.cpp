// model/gpt_cpu.cpp: the GPT call sequence on the CPU reference (see model/gpt_cpu.h and the
// architecture in model/gpt.h). Activations are allocated once for (B, T); a forward over a
// smaller (b, t) uses the front of each buffer. decode_step (the KV-cache decoder) has its own
// cache and one-row buffers.
#include "gpt_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "../kernels/cpu/attention_decode.h"
#include "../kernels/cpu/attention_naive.h"
#include "../kernels/cpu/attention_tiled.h"
#include "../kernels/cpu/cross_entropy.h"
#include "../kernels/cpu/dropout.h"
#include "../kernels/cpu/encoder.h"
#include "../kernels/cpu/gelu.h"
#include "../kernels/cpu/layernorm.h"
#include "../kernels/cpu/matmul.h"
#include "../kernels/cpu/residual.h"
#include "stop.h"

namespace tg {

namespace {
template <typename T>
void zero(Buffer<T>& v, size_t n) { std::memset(v.data(), 0, n * sizeof(T)); }
}  // namespace

template <typename T>
GPTCpu<T>::GPTCpu(const ModelConfig& mc, const RunShape& run) : m_(mc), run_(run) {
  table = param_table(m_);
  size_t n = param_count(table);
  params.assign(n, 0);
  grads.assign(n, 0);
  m.assign(n, 0);
  v.assign(n, 0);
  P = bind_params(params.data(), m_);
  G = bind_params(grads.data(), m_);

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
    if (run.flash) l.lse.resize((size_t)run.B * NH * run.T);
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
philox::DropoutKey GPTCpu<T>::key(uint32_t layer, uint32_t site) const {
  double p = train_ ? run_.dropout : 0.0;
  philox::DropoutKey k = philox::make_dropout_key(run_.seed, step_, layer, site, p);
  const uint32_t rows = (uint32_t)micro_ * (uint32_t)run_.B;
  k.row0 = site == philox::kSiteAttnProbs ? rows * (uint32_t)m_.n_head : rows;
  return k;
}

template <typename T>
double GPTCpu<T>::forward(const int32_t* x, const int32_t* targets, int b, int t, bool train, uint32_t step,
                          int micro, int accum) {
  b_ = b; t_ = t; train_ = train; step_ = step; micro_ = train ? micro : 0;
  std::copy(x, x + (size_t)b * t, inp_.begin());
  const int C = m_.n_embd, NH = m_.n_head, V = m_.vocab_size, Vp = m_.vp(), N = b * t;

  cpu::encoder_forward(acts_.encoded.data(), x, P.wte, P.wpe, b, t, C);
  cpu::dropout_forward(acts_.encoded.data(), acts_.encoded.data(), key(0, philox::kSiteEmbedding), b, t, C);
  const T* residual = acts_.encoded.data();
  for (int li = 0; li < m_.n_layer; ++li) {
    throw_if_stop_requested();  // a stop cuts the pass short (model/stop.h)
    Layer& a = acts_.h[li];
    const LayerParams<T>& p = P.h[li];
    // x = x + drop(c_proj(attn(ln_1(x))))
    cpu::layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), residual, p.ln1w, p.ln1b, N, C);
    cpu::matmul_forward(a.qkv.data(), a.ln1.data(), p.qkvw, p.qkvb, N, C, 3 * C);
    if (run_.flash)
      cpu::attention_tiled_forward(a.atty.data(), a.lse.data(), a.qkv.data(), key(li, philox::kSiteAttnProbs), b, t,
                                   C, NH, true, run_.Br, run_.Bc, nullptr);
    else
      cpu::attention_naive_forward(a.atty.data(), a.att.data(), a.qkv.data(), key(li, philox::kSiteAttnProbs), b, t,
                                   C, NH, true, nullptr);
    cpu::matmul_forward(a.attproj.data(), a.atty.data(), p.attprojw, p.attprojb, N, C, C);
    cpu::dropout_forward(a.attproj.data(), a.attproj.data(), key(li, philox::kSiteAttnProj), b, t, C);
    cpu::residual_forward(a.res2.data(), residual, a.attproj.data(), (size_t)N * C);
    throw_if_stop_requested();
    // x = x + drop(mlp.c_proj(gelu(c_fc(ln_2(x)))))
    cpu::layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), p.ln2w, p.ln2b, N, C);
    cpu::matmul_forward(a.fch.data(), a.ln2.data(), p.fcw, p.fcb, N, C, 4 * C);
    cpu::gelu_forward(a.fch_gelu.data(), a.fch.data(), (size_t)N * 4 * C, run_.gelu);
    cpu::matmul_forward(a.fcproj.data(), a.fch_gelu.data(), p.fcprojw, p.fcprojb, N, 4 * C, C);
    cpu::dropout_forward(a.fcproj.data(), a.fcproj.data(), key(li, philox::kSiteMlp), b, t, C);
    cpu::residual_forward(a.res3.data(), a.res2.data(), a.fcproj.data(), (size_t)N * C);
    residual = a.res3.data();
  }
  cpu::layernorm_forward(acts_.lnf.data(), acts_.lnf_mean.data(), acts_.lnf_rstd.data(), residual, P.lnfw, P.lnfb, N, C);
  cpu::matmul_forward(acts_.logits.data(), acts_.lnf.data(), P.wte, (const T*)nullptr, N, C, Vp);
  if (!targets) return 0.0;
  if (train)
    cpu::cross_entropy_forward_backward(acts_.losses.data(), acts_.dlogits.data(), acts_.logits.data(), targets,
                                        (T)(1.0 / ((double)N * accum)), N, V, Vp);
  else
    cpu::cross_entropy_forward(acts_.losses.data(), acts_.logits.data(), targets, N, V, Vp);
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += acts_.losses[i];
  return sum / N;
}

template <typename T>
void GPTCpu<T>::backward(bool accumulate) {
  const int b = b_, t = t_, C = m_.n_embd, NH = m_.n_head, V = m_.vp(), N = b * t;  // the head's matmul: Vp
  const size_t NC = (size_t)N * C;
  if (!accumulate) std::fill(grads.begin(), grads.end(), T(0));
  // logits = ln_f(x) wte^T
  zero(d_.dln, NC);
  cpu::matmul_backward(d_.dln.data(), G.wte, (T*)nullptr, acts_.dlogits.data(), acts_.lnf.data(), P.wte, N, C, V);
  const T* last = m_.n_layer ? acts_.h.back().res3.data() : acts_.encoded.data();
  zero(d_.dres, NC);  // dres: the gradient of the residual stream, walked down the blocks
  cpu::layernorm_backward(d_.dres.data(), G.lnfw, G.lnfb, d_.dln.data(), last, P.lnfw, acts_.lnf_mean.data(),
                          acts_.lnf_rstd.data(), N, C);
  for (int li = m_.n_layer - 1; li >= 0; --li) {
    throw_if_stop_requested();
    Layer& a = acts_.h[li];
    const LayerParams<T>& p = P.h[li];
    LayerParams<T>& g = G.h[li];
    const T* residual = li == 0 ? acts_.encoded.data() : acts_.h[li - 1].res3.data();
    // res3 = res2 + drop(fcproj): dres is d res3, and flows on unchanged into d res2
    zero(d_.dbtc, NC);
    cpu::dropout_backward(d_.dbtc.data(), d_.dres.data(), key(li, philox::kSiteMlp), b, t, C);
    zero(d_.dfch_gelu, NC * 4);
    cpu::matmul_backward(d_.dfch_gelu.data(), g.fcprojw, g.fcprojb, d_.dbtc.data(), a.fch_gelu.data(), p.fcprojw, N,
                         4 * C, C);
    zero(d_.dfch, NC * 4);
    cpu::gelu_backward(d_.dfch.data(), a.fch.data(), d_.dfch_gelu.data(), NC * 4, run_.gelu);
    zero(d_.dln, NC);
    cpu::matmul_backward(d_.dln.data(), g.fcw, g.fcb, d_.dfch.data(), a.ln2.data(), p.fcw, N, C, 4 * C);
    cpu::layernorm_backward(d_.dres.data(), g.ln2w, g.ln2b, d_.dln.data(), a.res2.data(), p.ln2w, a.ln2_mean.data(),
                            a.ln2_rstd.data(), N, C);
    throw_if_stop_requested();
    // res2 = residual + drop(attproj): dres is now d res2, and flows on into d residual
    zero(d_.dbtc, NC);
    cpu::dropout_backward(d_.dbtc.data(), d_.dres.data(), key(li, philox::kSiteAttnProj), b, t, C);
    zero(d_.datty, NC);
    cpu::matmul_backward(d_.datty.data(), g.attprojw, g.attprojb, d_.dbtc.data(), a.atty.data(), p.attprojw, N, C, C);
    zero(d_.dqkv, NC * 3);
    if (run_.flash)
      cpu::attention_tiled_backward(d_.dqkv.data(), d_.datty.data(), a.qkv.data(), a.atty.data(), a.lse.data(),
                                    key(li, philox::kSiteAttnProbs), b, t, C, NH, true, run_.Br, run_.Bc);
    else
      cpu::attention_naive_backward(d_.dqkv.data(), d_.datty.data(), a.qkv.data(), a.att.data(),
                                    key(li, philox::kSiteAttnProbs), b, t, C, NH, true);
    zero(d_.dln, NC);
    cpu::matmul_backward(d_.dln.data(), g.qkvw, g.qkvb, d_.dqkv.data(), a.ln1.data(), p.qkvw, N, C, 3 * C);
    cpu::layernorm_backward(d_.dres.data(), g.ln1w, g.ln1b, d_.dln.data(), residual, p.ln1w, a.ln1_mean.data(),
                            a.ln1_rstd.data(), N, C);
  }
  // encoded = drop(wte[x] + wpe)
  zero(d_.dbtc, NC);
  cpu::dropout_backward(d_.dbtc.data(), d_.dres.data(), key(0, philox::kSiteEmbedding), b, t, C);
  cpu::encoder_backward(G.wte, G.wpe, d_.dbtc.data(), inp_.data(), b, t, C);
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
double GPTCpu<T>::bytes_needed(const ModelConfig& m, const RunShape& run) {
  // in double: a config far too large for any machine must not wrap around
  const double BT = (double)run.B * run.T, C = m.n_embd, NH = m.n_head, V = m.vp(), L = m.n_layer;
  const double att = run.flash ? (double)run.B * NH * run.T : (double)run.B * NH * run.T * run.T;
  double n = 4 * (double)param_count(param_table(m));  // params, grads, m, v
  n += BT * C;                                     // encoded
  n += L * (BT * C * (7 + 3 + 8) + 4 * BT + att);  // per block (see the constructor)
  n += BT * C + 3 * BT + 2 * BT * V;               // ln_f, losses, logits, dlogits
  n += BT * C * (4 + 3 + 8);                       // activation-gradient scratch
  n += 2 * L * m.block_size * C + C * (4 + 3 + 8) + 2 + V;  // KV cache, decode rows
  return n * sizeof(T) + BT * sizeof(int32_t);
}

template class GPTCpu<float>;
template class GPTCpu<double>;

}  // namespace tg
