// model/net/gpt_cpu.h: the GPT on the CPU reference (kernels/cpu): the call sequence of
// model/net/gpt_net.h over the CPU's ops, its memory, and AdamW. Templated on the scalar: float
// trains, double is what the whole-model gradient check runs.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "../../kernels/gelu_form.h"
#include "../../kernels/philox.h"
#include "gpt.h"
#include "gpt_net.h"
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
// slices of whole sequences and run the call sequence (model/net/gpt_net.h) on each slice, in one parallel
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
  GPTCpu(const GPTCpu&) = delete;
  GPTCpu& operator=(const GPTCpu&) = delete;

  const ModelConfig& model() const { return model_; }
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
  const T* logits() const { return buf_.acts.logits; }
  // The qkv (B, T, 3C) of layer li in the last forward (the input of its attention).
  const T* layer_qkv(int li) const { return buf_.acts.h[li].qkv; }
  // The outputs of the dropout sites in the last forward, (B, T, C) each: the embedding, and
  // layer li's attention and MLP projections.
  const T* encoded() const { return buf_.acts.encoded; }
  const T* layer_attproj(int li) const { return buf_.acts.h[li].attproj; }
  const T* layer_fcproj(int li) const { return buf_.acts.h[li].fcproj; }
  size_t memory_bytes() const { return (size_t)bytes_needed(model_, run_); }
  // Bytes the constructor allocates for a model and run shape: parameters, gradients (and the
  // slices' partial gradients), AdamW state, and the table of buffers (model/net/gpt_net.h:
  // activations and their gradients, the decode_step KV cache), counted by that table itself;
  // checked before allocating.
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
  // embedding is the encoder op with t = 1 on the wpe pointer shifted to row pos.
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
  // rounding. (The window's logic: net::decode_step, model/net/gpt_net.h.)
  // Precondition: 0 <= token < vocab_size.
  void decode_reset();
  const T* decode_step(int32_t token);
  // Number of tokens in the current window (the position the next decode_step takes, unless
  // the window is full).
  int decode_pos() const { return (int)window_.size(); }

  // Records the ops of the passes that follow into trace (null: none), for the test that both
  // backends issue the same sequence; only a batch run as one slice is recorded.
  void set_trace(net::OpTrace* trace) { trace_ = trace; }

 private:
  struct FreeArena {
    void operator()(char* p) const { std::free(p); }
  };
  // Runs body(s, S, b0, b1) for the slices s of a batch of b (sequences b0 .. b1 - 1), in
  // parallel; false when a body returned false (a stop was requested).
  template <typename F>
  bool for_each_slice(int b, F&& body);
  static int slices(const RunShape& run);  // S for a batch of run.B
  // The pass over sequences b0 .. b1 - 1 of the last forward.
  net::Pass pass(int b0, int b1) const;

  ModelConfig model_;
  RunShape run_;
  std::unique_ptr<char, FreeArena> arena_;  // the table of buffers, one 64-byte aligned allocation
  net::Buffers<T, T> buf_{};
  int b_ = 0, t_ = 0;  // shape of the last forward
  bool train_ = false;
  uint32_t step_ = 0;
  int micro_ = 0, accum_ = 1;
  int slices_ = 1;
  size_t shard_begin_ = 0, shard_count_ = 0;  // the parameters update() updates (m and v hold them)
  std::vector<Buffer<T>> gpart_;   // partial gradients of slices 1 .. S - 1, as grads
  std::vector<GPTParams<T>> Gpart_;  // views of gpart_
  std::vector<int32_t> window_;  // tokens whose keys and values are in the cache, position order
  net::OpTrace* trace_ = nullptr;
};

}  // namespace tg
