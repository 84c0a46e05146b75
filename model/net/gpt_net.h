// model/net/gpt_net.h: the GPT's call sequence, stated once for both backends: the forward, the
// backward, the KV-cache decoder and the dropout keys (the architecture and the parameters:
// model/net/gpt.h). It runs over
//   - one table of buffers, buffer_table(): the same table counts the bytes and points every
//     buffer into one allocation, on the CPU as on the GPU;
//   - an interface of ops, each backend's: CpuOps (model/net/gpt_cpu.cpp, kernels/cpu) and
//     CudaOps (model/net/gpt_cuda.cu, kernels/*.cu).
// The backends (GPTCpu, GPTCuda) keep only what truly differs: the CPU's batch slices and stop
// checks, the GPU's stream, arena and pinned staging of the tokens.
//
// The ops. Each is a method of the backend's ops, with these arguments in this order (N = b t
// rows; = overwrites, += adds):
//   encoder_forward(out=, inp, wte, wpe, b, t, C)                      out = wte[inp] + wpe[pos]
//   dropout_forward(out=, inp, key, b, t, C)                           out may be inp
//   layernorm_forward(out=, mean=, rstd=, inp, w, bias, N, C)
//   matmul_forward(out=, inp, w, bias, N, C, OC)                       out = inp w^T + bias
//   attention_forward(out=, saved=, qkv, key, b, t, C, NH)             causal, on the run's path
//   gelu_forward(out=, inp, n, form)
//   residual_forward(out=, x, y, n)                                    out = x + y, may be x
//   cross_entropy_forward(losses=, logits, targets, N, V, Vp)
//   cross_entropy_forward_backward(losses=, dlogits=, logits, targets, n_step, N, V, Vp)
//                                                                      dlogits of the loss / n_step
//   zero(p=, n)
//   dropout_backward(dinp=, dout, key, b, t, C) -> the input's gradient: dinp, or dout itself
//                                                  when the key drops nothing
//   matmul_backward(dinp=, dweight+=, dbias+=, dout, inp, w, N, C, OC)
//   gelu_backward(dinp=, inp, dout, n, form)
//   layernorm_backward(dinp+=, dweight+=, dbias+=, dout, inp, w, mean, rstd, N, C)
//   attention_backward(dqkv+=, dout, qkv, out, saved, key, b, t, C, NH)
//   encoder_backward(dwte+=, dwpe+=, dout, inp, order_keys, order_vals, b, t, C)
//   attention_decode_forward(out=, kcache, vcache, qkv, pos, C, NH, maxT)  writes row pos of the caches
//   attention_decode_prime(kcache=, vcache=, qkv, n, C, NH, maxT)
//   copy(dst=, src, n)
//   go_on() -> false when the pass is to stop here (the CPU's stop request; the GPU's never)
// The backward's convention: an activation gradient with one contribution is overwritten by
// the op that makes it (=); the residual stream's gradient dres, to which every block adds, and
// dqkv, which the attention kernels add into, are zeroed first. Parameter gradients are always
// added to (+=): the backends zero them, or not when accumulating micro-batches.
//
// Each backend records its ops into an OpTrace when given one (name, shape, = or +=, dropout
// key), so a test can check that both issue the same sequence (tests/gpu/test_model_gpu.cu).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../../kernels/philox.h"
#include "gpt.h"
#include "run_shape.h"

namespace tg {
namespace net {

// ---- the buffers: one table, T the activations' type, S the statistics' (layernorm mean and
// rstd, the flash path's lse, the losses): the CPU's T, the GPU's float

template <typename T, typename S>
struct AttentionSaved {  // what the attention saves for its backward, on the path(s) the run takes
  T* att = nullptr;  // (B, NH, T, T) naive: softmax probabilities before dropout
  S* lse = nullptr;  // (B, NH, T)    flash: row logsumexp of the scaled scores
  uint8_t* keep = nullptr;  // flash with dropout, where the backend stores the keep decisions for its
                            // backward (the CUDA one in bf16: gpu::flash_attn_keep_bytes)
};

template <typename T, typename S>
struct Layer {
  T *ln1, *qkv, *atty, *attproj, *res2, *ln2, *fch, *fch_gelu, *fcproj, *res3;  // (B, T, C or 3C or 4C)
  S *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;                                // (B, T)
  AttentionSaved<T, S> saved;
};

template <typename T, typename S>
struct Acts {
  int32_t *inp, *targets;             // (B, T) tokens of the last forward
  uint32_t *order_keys, *order_vals;  // (B*T) the GPU's encoder backward order of inp
  T* encoded;                         // (B, T, C) after the embedding dropout
  std::vector<Layer<T, S>> h;
  T *lnf, *logits, *dlogits;  // (B, T, C), (B, T, Vp), (B, T, Vp)
  S *lnf_mean, *lnf_rstd, *losses;  // (B, T)
  float* stats;  // (4) the GPU's loss, squared gradient norm and clip factor, read back
};

template <typename T>
struct Scratch {  // gradients of activations, reused by every layer
  T *dres, *dln, *dbtc, *datty, *dqkv, *dfch, *dfch_gelu;
};

template <typename T, typename S>
struct Decode {  // the KV cache and the one-row activations of decode_step
  T *k, *v;  // (L, NH, block_size, HS) each
  T *x, *ln, *qkv, *atty, *proj, *fch, *fch_gelu, *logits;
  S *mean, *rstd;
  int32_t* token;
};

template <typename T, typename S>
struct Buffers {
  Acts<T, S> acts;
  Scratch<T> d;
  Decode<T, S> dec;
};

// Hands out regions of one allocation, each `align`-byte aligned and at least `gap` bytes after
// the previous one; with base null it only counts. With a base, the bytes between two regions
// go to mark (the emulator poisons them, so a buffer one row short is reported at its first
// write past its end). bytes() is the count in double, where a size too large for any machine
// does not wrap around.
class Carver {
 public:
  Carver(char* base, size_t align, size_t gap = 0, void (*mark)(const void*, size_t) = nullptr)
      : base_(base), align_(align), gap_(gap), mark_(mark) {}
  template <typename U>
  U* take(size_t n) {
    const size_t off = ((used_ ? used_ + gap_ : 0) + align_ - 1) / align_ * align_;
    if (base_ && mark_ && off > used_) mark_(base_ + used_, off - used_);
    used_ = off + n * sizeof(U);
    approx_ += (double)n * sizeof(U) + (double)(gap_ + align_);
    return base_ ? reinterpret_cast<U*>(base_ + off) : nullptr;
  }
  size_t used() const { return used_; }
  double bytes() const { return approx_ < 0x1p60 ? (double)used_ : approx_; }

 private:
  char* base_;
  size_t align_, gap_;
  void (*mark_)(const void*, size_t);
  size_t used_ = 0;
  double approx_ = 0;  // an upper bound of used_
};

// The table: every buffer of the step for a run of (B, T), taken from a in this order;
// keep_bytes a layer for its flash attention's keep decisions (0: none; taken on the flash path
// only).
template <typename T, typename S>
void buffer_table(Buffers<T, S>& b, Carver& a, const ModelConfig& m, const RunShape& run, size_t keep_bytes = 0) {
  const size_t BT = (size_t)run.B * run.T, C = m.n_embd, V = m.vp();  // logits rows: Vp
  const size_t rows = (size_t)run.B * m.n_head * run.T;                  // attention rows (B, NH, T)
  const bool naive = run.both_paths || run.attention == AttentionPath::Naive;
  const bool flash = run.both_paths || run.attention == AttentionPath::Flash;
  Acts<T, S>& acts = b.acts;
  acts.inp = a.take<int32_t>(BT);
  acts.targets = a.take<int32_t>(BT);
  acts.order_keys = a.take<uint32_t>(BT);
  acts.order_vals = a.take<uint32_t>(BT);
  acts.encoded = a.take<T>(BT * C);
  acts.h.resize(m.n_layer);
  for (Layer<T, S>& l : acts.h) {
    for (T** buf : {&l.ln1, &l.atty, &l.attproj, &l.res2, &l.ln2, &l.fcproj, &l.res3}) *buf = a.take<T>(BT * C);
    for (S** buf : {&l.ln1_mean, &l.ln1_rstd, &l.ln2_mean, &l.ln2_rstd}) *buf = a.take<S>(BT);
    l.qkv = a.take<T>(BT * 3 * C);
    l.fch = a.take<T>(BT * 4 * C);
    l.fch_gelu = a.take<T>(BT * 4 * C);
    // the two attention paths save different things for the backward
    l.saved = {};
    if (naive) l.saved.att = a.take<T>(rows * run.T);
    if (flash) l.saved.lse = a.take<S>(rows);
    if (flash && keep_bytes) l.saved.keep = a.take<uint8_t>(keep_bytes);
  }
  acts.lnf = a.take<T>(BT * C);
  acts.lnf_mean = a.take<S>(BT);
  acts.lnf_rstd = a.take<S>(BT);
  acts.logits = a.take<T>(BT * V);
  acts.dlogits = a.take<T>(BT * V);
  acts.losses = a.take<S>(BT);
  acts.stats = a.take<float>(4);
  // activation gradients
  Scratch<T>& d = b.d;
  for (T** buf : {&d.dres, &d.dln, &d.dbtc, &d.datty}) *buf = a.take<T>(BT * C);
  d.dqkv = a.take<T>(BT * 3 * C);
  d.dfch = a.take<T>(BT * 4 * C);
  d.dfch_gelu = a.take<T>(BT * 4 * C);
  // the KV cache and the one-row buffers of decode_step
  Decode<T, S>& dec = b.dec;
  const size_t cache = (size_t)m.n_layer * m.block_size * C;
  dec.k = a.take<T>(cache);
  dec.v = a.take<T>(cache);
  for (T** buf : {&dec.x, &dec.ln, &dec.atty, &dec.proj}) *buf = a.take<T>(C);
  dec.qkv = a.take<T>(3 * C);
  dec.fch = a.take<T>(4 * C);
  dec.fch_gelu = a.take<T>(4 * C);
  dec.logits = a.take<T>(V);
  dec.mean = a.take<S>(1);
  dec.rstd = a.take<S>(1);
  dec.token = a.take<int32_t>(1);
}

// ---- the dropout keys

// The keys of one pass: step `step`, p while training (else none), and the masks of rows
// `rows` .. of the batch (micro-batch k of a step of --grad-accum: rows k B ..; a CPU slice
// adds its first sequence), philox::DropoutKey::row0.
struct Keys {
  uint64_t seed = 0;
  uint32_t step = 0;
  double p = 0;
  uint32_t rows = 0;
  int NH = 1;
  philox::DropoutKey at(uint32_t layer, uint32_t site) const {
    philox::DropoutKey k = philox::make_dropout_key(seed, step, layer, site, p);
    k.row0 = site == philox::kSiteAttnProbs ? rows * (uint32_t)NH : rows;
    return k;
  }
};

// One pass over b sequences of t tokens.
struct Pass {
  int b = 0, t = 0;
  bool train = false;
  double n_step = 1;  // the rows the loss is the mean of: b t accum of the whole micro-batch
  Keys keys;
};

// The pass of a forward and its backward: micro-batch micro of a step of accum (dropout and the
// loss gradient while training), over sequences b0 .. b0 + b - 1 of a batch of b_all.
inline Pass make_pass(const RunShape& run, const ModelConfig& m, int b0, int b, int b_all, int t, bool train,
                      uint32_t step, int micro, int accum) {
  Pass s;
  s.b = b;
  s.t = t;
  s.train = train;
  s.n_step = (double)b_all * t * accum;
  s.keys.seed = run.seed;
  s.keys.step = step;
  s.keys.p = train ? run.dropout : 0.0;
  s.keys.rows = (uint32_t)(train ? micro : 0) * (uint32_t)run.B + (uint32_t)b0;
  s.keys.NH = m.n_head;
  return s;
}

// ---- the call sequence

// x = drop(wte[x] + wpe); each block: x = x + drop(c_proj(attn(ln_1(x)))), x = x +
// drop(mlp.c_proj(gelu(c_fc(ln_2(x))))); logits = ln_f(x) wte^T; with targets, the losses (and,
// training, dlogits). False when ops.go_on() stopped it.
template <class Ops, typename T, typename S, typename W>
bool forward(Ops& o, const Acts<T, S>& a, const GPTParams<W>& P, const ModelConfig& m, const RunShape& run,
             const Pass& s, bool targets) {
  const int b = s.b, t = s.t, C = m.n_embd, NH = m.n_head, V = m.vocab_size, Vp = m.vp(), N = b * t;
  const size_t NC = (size_t)N * C;
  o.encoder_forward(a.encoded, a.inp, P.wte, P.wpe, b, t, C);
  o.dropout_forward(a.encoded, a.encoded, s.keys.at(0, philox::kSiteEmbedding), b, t, C);
  const T* residual = a.encoded;
  for (int li = 0; li < m.n_layer; ++li) {
    if (!o.go_on()) return false;
    const Layer<T, S>& l = a.h[li];
    const LayerParams<W>& p = P.h[li];
    // x = x + drop(c_proj(attn(ln_1(x))))
    o.layernorm_forward(l.ln1, l.ln1_mean, l.ln1_rstd, residual, p.ln1w, p.ln1b, N, C);
    o.matmul_forward(l.qkv, l.ln1, p.qkvw, p.qkvb, N, C, 3 * C);
    o.attention_forward(l.atty, l.saved, l.qkv, s.keys.at(li, philox::kSiteAttnProbs), b, t, C, NH);
    o.matmul_forward(l.attproj, l.atty, p.attprojw, p.attprojb, N, C, C);
    o.dropout_forward(l.attproj, l.attproj, s.keys.at(li, philox::kSiteAttnProj), b, t, C);
    o.residual_forward(l.res2, residual, l.attproj, NC);
    if (!o.go_on()) return false;
    // x = x + drop(mlp.c_proj(gelu(c_fc(ln_2(x)))))
    o.layernorm_forward(l.ln2, l.ln2_mean, l.ln2_rstd, l.res2, p.ln2w, p.ln2b, N, C);
    o.matmul_forward(l.fch, l.ln2, p.fcw, p.fcb, N, C, 4 * C);
    o.gelu_forward(l.fch_gelu, l.fch, NC * 4, run.gelu);
    o.matmul_forward(l.fcproj, l.fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
    o.dropout_forward(l.fcproj, l.fcproj, s.keys.at(li, philox::kSiteMlp), b, t, C);
    o.residual_forward(l.res3, l.res2, l.fcproj, NC);
    residual = l.res3;
  }
  // logits = ln_f(x) wte^T
  o.layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, residual, P.lnfw, P.lnfb, N, C);
  o.matmul_forward(a.logits, a.lnf, P.wte, (const W*)nullptr, N, C, Vp);
  if (!targets) return true;
  if (s.train)
    o.cross_entropy_forward_backward(a.losses, a.dlogits, a.logits, a.targets, s.n_step, N, V, Vp);
  else
    o.cross_entropy_forward(a.losses, a.logits, a.targets, N, V, Vp);
  return true;
}

// The gradients of the pass's forward (training, with targets) added into g. False when
// ops.go_on() stopped it.
template <class Ops, typename T, typename S, typename W, typename G>
bool backward(Ops& o, const Acts<T, S>& a, const Scratch<T>& d, const GPTParams<W>& P, const GPTParams<G>& g,
              const ModelConfig& m, const RunShape& run, const Pass& s) {
  const int b = s.b, t = s.t, C = m.n_embd, NH = m.n_head, Vp = m.vp(), N = b * t;
  const size_t NC = (size_t)N * C;
  // logits = ln_f(x) wte^T
  o.matmul_backward(d.dln, g.wte, (G*)nullptr, a.dlogits, a.lnf, P.wte, N, C, Vp);
  const T* last = m.n_layer ? a.h.back().res3 : a.encoded;
  o.zero(d.dres, NC);  // dres: the gradient of the residual stream, walked down the blocks
  o.layernorm_backward(d.dres, g.lnfw, g.lnfb, d.dln, last, P.lnfw, a.lnf_mean, a.lnf_rstd, N, C);
  for (int li = m.n_layer - 1; li >= 0; --li) {
    if (!o.go_on()) return false;
    const Layer<T, S>& l = a.h[li];
    const LayerParams<W>& p = P.h[li];
    const LayerParams<G>& gl = g.h[li];
    const T* residual = li == 0 ? a.encoded : a.h[li - 1].res3;
    // res3 = res2 + drop(fcproj): dres is d res3, and flows on unchanged into d res2
    const T* dfcproj = o.dropout_backward(d.dbtc, d.dres, s.keys.at(li, philox::kSiteMlp), b, t, C);
    o.matmul_backward(d.dfch_gelu, gl.fcprojw, gl.fcprojb, dfcproj, l.fch_gelu, p.fcprojw, N, 4 * C, C);
    o.gelu_backward(d.dfch, l.fch, d.dfch_gelu, NC * 4, run.gelu);
    o.matmul_backward(d.dln, gl.fcw, gl.fcb, d.dfch, l.ln2, p.fcw, N, C, 4 * C);
    o.layernorm_backward(d.dres, gl.ln2w, gl.ln2b, d.dln, l.res2, p.ln2w, l.ln2_mean, l.ln2_rstd, N, C);
    if (!o.go_on()) return false;
    // res2 = residual + drop(attproj): dres is now d res2, and flows on into d residual
    const T* dattproj = o.dropout_backward(d.dbtc, d.dres, s.keys.at(li, philox::kSiteAttnProj), b, t, C);
    o.matmul_backward(d.datty, gl.attprojw, gl.attprojb, dattproj, l.atty, p.attprojw, N, C, C);
    o.zero(d.dqkv, NC * 3);
    o.attention_backward(d.dqkv, d.datty, l.qkv, l.atty, l.saved, s.keys.at(li, philox::kSiteAttnProbs), b, t, C, NH);
    o.matmul_backward(d.dln, gl.qkvw, gl.qkvb, d.dqkv, l.ln1, p.qkvw, N, C, 3 * C);
    o.layernorm_backward(d.dres, gl.ln1w, gl.ln1b, d.dln, residual, p.ln1w, l.ln1_mean, l.ln1_rstd, N, C);
  }
  // encoded = drop(wte[x] + wpe)
  const T* denc = o.dropout_backward(d.dbtc, d.dres, s.keys.at(0, philox::kSiteEmbedding), b, t, C);
  o.encoder_backward(g.wte, g.wpe, denc, a.inp, a.order_keys, a.order_vals, b, t, C);
  return true;
}

// ---- the KV-cache decoder (evaluation: no dropout; GPTCpu::decode_step says what it computes)

// The network for one row at position pos of the window, the token at *token: its keys and
// values go into row pos of every layer's cache, its logits (Vp) into d.logits.
template <class Ops, typename T, typename S, typename W>
void decode_row(Ops& o, const Decode<T, S>& d, const GPTParams<W>& P, const ModelConfig& m, const RunShape& run,
                const int32_t* token, int pos) {
  const int C = m.n_embd, NH = m.n_head, Vp = m.vp(), maxT = m.block_size;
  // x = wte[token] + wpe[pos]: the encoder op with t = 1 on wpe shifted to row pos
  o.encoder_forward(d.x, token, P.wte, P.wpe + (size_t)pos * C, 1, 1, C);
  for (int li = 0; li < m.n_layer; ++li) {
    const LayerParams<W>& p = P.h[li];
    T *kcache = d.k + (size_t)li * maxT * C, *vcache = d.v + (size_t)li * maxT * C;
    // x = x + c_proj(attn(ln_1(x)))
    o.layernorm_forward(d.ln, d.mean, d.rstd, d.x, p.ln1w, p.ln1b, 1, C);
    o.matmul_forward(d.qkv, d.ln, p.qkvw, p.qkvb, 1, C, 3 * C);
    o.attention_decode_forward(d.atty, kcache, vcache, d.qkv, pos, C, NH, maxT);
    o.matmul_forward(d.proj, d.atty, p.attprojw, p.attprojb, 1, C, C);
    o.residual_forward(d.x, d.x, d.proj, (size_t)C);
    // x = x + mlp.c_proj(gelu(c_fc(ln_2(x))))
    o.layernorm_forward(d.ln, d.mean, d.rstd, d.x, p.ln2w, p.ln2b, 1, C);
    o.matmul_forward(d.fch, d.ln, p.fcw, p.fcb, 1, C, 4 * C);
    o.gelu_forward(d.fch_gelu, d.fch, (size_t)4 * C, run.gelu);
    o.matmul_forward(d.proj, d.fch_gelu, p.fcprojw, p.fcprojb, 1, 4 * C, C);
    o.residual_forward(d.x, d.x, d.proj, (size_t)C);
  }
  o.layernorm_forward(d.ln, d.mean, d.rstd, d.x, P.lnfw, P.lnfb, 1, C);
  o.matmul_forward(d.logits, d.ln, P.wte, (const W*)nullptr, 1, C, Vp);
}

// After a forward (no targets) over a window of n tokens: every layer's keys and values from
// its qkv rows into the caches, and the last row's logits into d.logits.
template <class Ops, typename T, typename S>
void decode_prime(Ops& o, const Decode<T, S>& d, const Acts<T, S>& a, const ModelConfig& m, int n) {
  const int C = m.n_embd, NH = m.n_head, Vp = m.vp(), maxT = m.block_size;
  for (int li = 0; li < m.n_layer; ++li)
    o.attention_decode_prime(d.k + (size_t)li * maxT * C, d.v + (size_t)li * maxT * C, a.h[li].qkv, n, C, NH, maxT);
  o.copy(d.logits, a.logits + (size_t)(n - 1) * Vp, (size_t)Vp);
}

// decode_step's window: appends token and runs row(token, pos) for it; a full window (block_size
// tokens) slides by one and is re-primed: window(tokens, n) (a forward over it, then
// decode_prime) when the run shape holds it, else a replay of the window one row at a time.
template <class Window, class Row>
void decode_step(std::vector<int32_t>& window, int32_t token, const ModelConfig& m, const RunShape& run,
                 Window&& prime, Row&& row) {
  if ((int)window.size() < m.block_size) {
    window.push_back(token);
    return row(token, (int)window.size() - 1);
  }
  window.erase(window.begin());
  window.push_back(token);
  const int n = (int)window.size();
  if (run.B >= 1 && run.T >= n) return prime(window.data(), n);
  const std::vector<int32_t> tokens = window;
  window.clear();
  for (int32_t tok : tokens) {
    window.push_back(tok);
    row(tok, (int)window.size() - 1);
  }
}

// ---- the ops a backend issued, for the test that both issue the same (see the top)

struct OpTrace {
  std::vector<std::string> ops;
  // name, what it writes ("=", "+=", ...), its sizes and, for the ops that drop, the key
  void add(const char* name, const char* writes, std::initializer_list<long long> sizes,
           const philox::DropoutKey* key = nullptr) {
    std::string s = std::string(name) + " " + writes;
    for (long long n : sizes) s += " " + std::to_string(n);
    if (key) {
      char k[160];
      std::snprintf(k, sizeof k, " key(seed %llu step %u layer %u site %u threshold %u row0 %u)",
                    (unsigned long long)key->seed, key->step, key->layer, key->site, key->threshold, key->row0);
      s += k;
    }
    ops.push_back(s);
  }
};

}  // namespace net
}  // namespace tg
