// model/net/gpt_cpu.h: the GPT forward / backward / AdamW call sequence on the CPU reference
// (kernels/cpu). Templated on the scalar: float trains, double is what the whole-model
// gradient check runs. The CUDA backend follows the same sequence with the same names.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "../../kernels/gelu_form.h"
#include "../../kernels/philox.h"
#include "gpt.h"
#include "run_shape.h"

namespace tg {

// Every buffer starts on a 64-byte boundary. Vectorised reductions (Eigen's sums, for one)
// peel their first elements up to an aligned address, so their summation order, and thus
// the last bit of the result, depends on the address modulo 64: with the base aligned it is
// fixed by the layout alone, and a run is bitwise the same in any process.
template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <typename U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const Aligned64&) const { return true; }
  bool operator!=(const Aligned64&) const { return false; }
};
template <typename T>
using Buffer = std::vector<T, Aligned64<T>>;

// Threads. forward and backward cut the batch into S = min(run.slices or the OpenMP threads, b)
// slices of whole sequences and run the call sequence below on each slice, in one parallel
// region, one slice per thread: every op of the network works on rows (or on sequences, for
// attention) independently, so a slice needs nothing from another and there is no barrier
// between ops. Dropout masks stay keyed by the sequence's place in the batch (DropoutKey::row0
// is shifted by the slice's first sequence). The weight gradients are sums over all rows:
// slice 0 adds into grads, slice s > 0 into its own partial copy, and the partials are then
// added into grads in slice order. The result depends on S, never on how the runtime schedules
// threads; S = 1 is the plain call sequence (the kernels then use OpenMP inside, as before).
template <typename T>
class GPTCpu {
 public:
  GPTCpu(const ModelConfig& m, const RunShape& run);

  const ModelConfig& model() const { return m_; }
  const RunShape& run() const { return run_; }
  std::vector<ParamSpec> table;
  Buffer<T> params, grads, m, v;  // flat, in table order; m, v: AdamW moments (of this rank's shard, model/net/shards.h)
  GPTParams<T> P, G;                   // views of params and grads

  // Forward over x (b, t) with b <= B, t <= T. With targets: returns the mean loss and
  // (when train) leaves dlogits ready for backward. Dropout only when train and p > 0,
  // keyed by (seed, step, layer, site). Without targets returns 0 (logits are filled).
  // forward and backward throw Interrupted between two half-layers once a stop is requested
  // (model/run/stop.h): their outputs are then partial, the parameters untouched.
  // Gradient accumulation: micro-batch `micro` of `accum` (a step of --grad-accum accum)
  // scales the loss gradient by 1 / (b t accum) and keys its dropout masks as rows
  // micro*B .. of one batch of accum*B (philox::DropoutKey::row0); micro 0 of 1 is a plain step.
  double forward(const int32_t* x, const int32_t* targets, int b, int t, bool train, uint32_t step,
                 int micro = 0, int accum = 1);
  // Gradients of the mean loss of the last forward(train = true) into grads: overwritten, or
  // added to them when accumulate (micro-batches after the first of a step).
  void backward(bool accumulate = false);
  // Clips the gradients by their global norm `norm` (when run.grad_clip > 0) and applies AdamW
  // with lr as update number t (1-based), to this rank's shard of the parameters (all of them
  // unsharded). Elementwise: one parallel region, each thread taking its share of every tensor
  // (the same result for any split); a tensor the shard boundary cuts keeps its decay.
  void update(float lr, int t, double norm);
  // Logits of the last forward: (b, t, Vp) (ModelConfig::vp(); the first V of each row are the vocabulary).
  const T* logits() const { return acts_.logits.data(); }
  // The qkv (B, T, 3C) of layer li in the last forward (the input of its attention).
  const T* layer_qkv(int li) const { return acts_.h[li].qkv.data(); }
  // The outputs of the dropout sites in the last forward, (B, T, C) each: the embedding, and
  // layer li's attention and MLP projections.
  const T* encoded() const { return acts_.encoded.data(); }
  const T* layer_attproj(int li) const { return acts_.h[li].attproj.data(); }
  const T* layer_fcproj(int li) const { return acts_.h[li].fcproj.data(); }
  size_t memory_bytes() const { return (size_t)bytes_needed(m_, run_); }
  // Bytes the constructor allocates for a model and run shape (parameters, gradients, AdamW
  // state, activations and their gradients, the decode_step KV cache): checked before allocating.
  static double bytes_needed(const ModelConfig& m, const RunShape& run);

  // Incremental decoding with a KV cache (evaluation: no dropout). The cache holds the keys
  // and values of every layer and head, (L, NH, block_size, HS) each, allocated once by the
  // constructor, for the positions 0 .. pos - 1 of the current window of tokens.
  //
  // decode_reset() empties the window. decode_step(token) appends token at position pos and
  // runs the whole network for that one row: ln_1, the qkv matmul of one row (its k and v go
  // into the cache at pos), attention of the new query against the cached rows 0 .. pos of
  // each head, softmax(q K^T / sqrt(HS)) V in T, c_proj, the MLP, ln_f and the lm head. It
  // returns the (V) logits of that position, equal (to rounding) to the last row of the
  // logits of forward() over the window; they stay valid until the next decode call. The
  // embedding is cpu::encoder_forward with Tn = 1 on the wpe pointer shifted to row pos.
  //
  // Cropping, as nanoGPT's generate(): the model sees at most block_size tokens, positions
  // counted from the start of the window. When the window is full (pos == block_size), it
  // becomes its last block_size - 1 tokens followed by token, at positions 0 .. block_size - 1:
  // every key and value changes with the shift (they depend on the position embedding), so
  // the whole cache is re-primed and, past block_size, each token costs a whole window, as in
  // nanoGPT. The re-priming is one forward() over the window, whose keys and values are
  // copied into the cache and whose last row gives the logits (it overwrites the activations
  // and logits() of the last forward), when the run shape holds it (B >= 1, T >= block_size);
  // otherwise decode_reset() and the window replayed one row at a time. The two agree to
  // rounding.
  // Precondition: 0 <= token < vocab_size.
  void decode_reset();
  const T* decode_step(int32_t token);
  // Number of tokens in the current window (the position the next decode_step takes, unless
  // the window is full).
  int decode_pos() const { return (int)window_.size(); }

 private:
  struct Layer {
    Buffer<T> ln1, ln1_mean, ln1_rstd, qkv, atty, att, lse, attproj, res2;
    Buffer<T> ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, res3;
  };
  struct Acts {
    Buffer<T> encoded;  // (B, T, C) after the embedding dropout
    std::vector<Layer> h;
    Buffer<T> lnf, lnf_mean, lnf_rstd, logits, losses, dlogits;
  };
  struct Scratch {  // gradients of activations, reused by every layer
    Buffer<T> dres, dln, dbtc, datty, dqkv, dfch, dfch_gelu;
  };
  struct Decode {  // the KV cache and the one-row activations of decode_step
    Buffer<T> k, v;  // (L, NH, block_size, HS)
    Buffer<T> x, ln, mean, rstd, qkv, atty, proj, fch, fch_gelu, logits;
  };
  // The dropout key of a site for a slice whose first sequence is b0 of the batch.
  philox::DropoutKey key(uint32_t layer, uint32_t site, int b0) const;
  static int slices(const RunShape& run);  // S for a batch of run.B
  // Runs body(s, S, b0, b1) for the slices s of a batch of b (sequences b0 .. b1 - 1), in
  // parallel; false when a body returned false (a stop was requested).
  template <typename F>
  bool for_each_slice(int b, F&& body);
  bool forward_slice(int b0, int b1, const int32_t* targets, int accum);
  bool backward_slice(int b0, int b1, GPTParams<T>& gs);  // gradients added into gs
  void decode_row(int32_t token);  // one row at position window_.size() - 1
  void decode_prime();             // the cache and logits for all of window_ (see decode_step)

  ModelConfig m_;
  RunShape run_;
  Acts acts_;
  Scratch d_;
  std::vector<int32_t> inp_;  // (B, T) tokens of the last forward
  int b_ = 0, t_ = 0;         // shape of the last forward
  bool train_ = false;
  uint32_t step_ = 0;
  int micro_ = 0;
  Decode dec_;
  int slices_ = 1;
  size_t shard_begin_ = 0, shard_count_ = 0;  // the parameters update() updates (m and v hold them)
  std::vector<Buffer<T>> gpart_;   // partial gradients of slices 1 .. S - 1, as grads
  std::vector<GPTParams<T>> Gpart_;  // views of gpart_
  std::vector<int32_t> window_;  // tokens whose keys and values are in the cache, position order
};

}  // namespace tg
