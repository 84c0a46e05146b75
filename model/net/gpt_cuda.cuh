// model/net/gpt_cuda.cuh: the GPT forward / backward / AdamW call sequence on the GPU (kernels/*.cu),
// the twin of model/net/gpt_cpu.h: same order, same names, same dropout keys. Templated on the
// storage type T of activations: float (--precision fp32: every op in fp32, TF32 off) or bf16
// (--precision bf16: activations and the weights the forward reads in bf16, matmuls on tensor
// cores with fp32 accumulation; master weights, gradients of parameters, AdamW moments,
// layernorm statistics, softmax and the loss in fp32).
//
// Memory: everything the step touches is carved from ONE device allocation made by the
// constructor: the training state (carve()) and the table of buffers (net::buffer_table), which
// bytes_needed() runs without allocating, so the two cannot disagree; plus the op scratch and the
// cuBLAS workspace of the gpu::Context.
// Nothing is allocated after the constructor. One stream (ctx.stream); the step enqueues work
// and synchronises only in read_stats(), where the loss and the gradient norm are read (the
// tokens are staged in pinned host memory, so their copies do not wait for the stream either).
#pragma once
#include <cstdint>
#include <vector>

#include "../../kernels/adamw.cuh"
#include "../../kernels/attention.cuh"
#include "../../kernels/cuda_common.cuh"
#include "../../kernels/gelu_form.h"
#include "../../kernels/philox.h"
#include "gpt.h"
#include "gpt_net.h"
#include "run_shape.h"

namespace tg {

// The loss and gradient norm of a step, as read back by read_stats().
struct StepStats {
  float loss = 0;        // mean loss of the last forward with targets
  float norm_squared = 0;  // sum of squared gradients of the last backward
};

template <typename T>
class GPTCuda {
 public:
  // Makes the gpu::Context and the one allocation. Throws gpu::CudaError.
  GPTCuda(const ModelConfig& m, const RunShape& run);
  ~GPTCuda();
  GPTCuda(const GPTCuda&) = delete;
  GPTCuda& operator=(const GPTCuda&) = delete;

  const ModelConfig& model() const { return model_; }
  const RunShape& run() const { return run_; }
  const gpu::Context& ctx() const { return ctx_; }
  std::vector<ParamSpec> table;
  size_t n_params = 0;

  // Device bytes of the size table (one allocation), plus op scratch and cuBLAS workspace.
  static size_t bytes_needed(const ModelConfig& m, const RunShape& run);
  size_t memory_bytes() const { return arena_bytes_ + ctx_.scratch_bytes + ctx_.cublas_workspace_bytes; }

  // Forward over x (b, t) (host tokens, copied to the device), b <= B, t <= T. With targets
  // (host), the losses, their mean (read_stats().loss) and, when train, dlogits. Dropout only
  // when train and p > 0, keyed by (seed, step, layer, site) as the CPU backend.
  // micro, accum: micro-batch `micro` of a step of --grad-accum accum, as GPTCpu::forward (loss
  // gradient scaled by 1 / (b t accum), dropout masks of rows micro*B .. of a batch of accum*B).
  void forward(const int32_t* x, const int32_t* targets, int b, int t, bool train, uint32_t step, int micro = 0,
               int accum = 1);
  // Gradients of the mean loss of the last forward(train = true) into grads (overwritten, or
  // added to them when accumulate), and their squared global norm (read_stats().norm_squared).
  void backward(bool accumulate = false);
  // Clips (by the norm of the last backward, when grad_clip > 0) and applies AdamW with lr as
  // update number t (1-based); refreshes the T copy of the weights. Unlike GPTCpu::update it
  // takes no norm: the one it clips by is on the device (read_stats().norm_squared), so the
  // update follows the backward on the stream with no wait for the host.
  void update(float lr, int t);
  // Waits for the stream and reads the loss and the squared gradient norm.
  StepStats read_stats();
  // The fp32 gradients on the device (n_params floats, table order), for the data-parallel
  // all-reduce (model/net/backend_cuda.cu), enqueued on ctx().stream; after it, grads_changed()
  // recomputes the squared norm that update() clips by and read_stats() reads.
  float* device_grads() { return st_.grads; }
  void grads_changed();
  // ZeRO-1: the device's master weights (padded, table order), the squared norm of this rank's
  // shard of the gradients written where read_stats() reads the norm (returned: the device
  // float, for the ranks' sum), and the T copy of the weights refreshed after they were gathered.
  float* device_params() { return st_.params; }
  float* shard_norm_squared();
  void params_changed();
  size_t shard_count() const { return shard_count_; }

  // Host copies (synchronising): float master weights, parameter gradients, AdamW moments,
  // and the logits (b, t, Vp) of the last forward (ModelConfig::vp(): the first V of a row are the vocabulary).
  std::vector<float> download_params() const;
  std::vector<float> download_grads() const;
  void download_adam(std::vector<float>& m, std::vector<float>& v) const;
  std::vector<float> download_logits() const;
  // Logits of position `row` of sequence 0 of the last forward, (V) floats into out.
  void download_logits_row(int row, float* out) const;

  // Generation with a KV cache (no dropout), as GPTCpu::decode_reset / decode_step (model/net/gpt_cpu.h
  // says how the window is cropped past block_size): decode_step appends token to the window
  // and runs the network for that one position against every layer's cached keys and values
  // (kernels/attention_decode.cuh); download_decode_logits gives its (V) logits. When the window
  // is full it slides by one and is re-primed by one forward over it (when the run shape holds
  // it, B >= 1 and T >= block_size, as the backend's does; otherwise replayed row by row).
  void decode_reset();
  void decode_step(int32_t token);
  void download_decode_logits(float* out) const;
  // Sets the master weights and AdamW moments (host, n_params each; m, v may be null = zero;
  // ZeRO-1 keeps this rank's shard of them) and the T copy of the weights. download_adam gives
  // the moments held: this rank's shard (shard_count() elements; all of them unsharded).
  void upload_state(const float* params, const float* m, const float* v);

  // The saved attention buffers of layer li (for --attention check and the tests).
  struct LayerView {
    T* qkv;        // (B, T, 3C)
    T* atty;       // (B, T, C)
    gpu::AttentionSaved<T> saved;
    T* attproj;  // (B, T, C) after its dropout
    T* fcproj;   // (B, T, C) after its dropout
  };
  LayerView layer(int li) const;
  // The embedding after its dropout, (B, T, C).
  const T* encoded() const { return buf_.acts.encoded; }
  // The backward's scratch for the gradients of the attention's input, dqkv (B, T, 3C), and of
  // its output, datty (B, T, C): unused between two calls, so --attention check writes there.
  T* dqkv_scratch() const { return buf_.d.dqkv; }
  T* datty_scratch() const { return buf_.d.datty; }

  // Records the ops of the calls that follow into trace (null: none), for the test that both
  // backends issue the same sequence.
  void set_trace(net::OpTrace* trace) { trace_ = trace; }

 private:
  // The training state, carved before the table of buffers.
  struct State {
    float *params, *grads, *m, *v;  // fp32 master weights, gradients (n_params, ZeRO-1: padded), AdamW moments (the shard)
    T* params_t;                    // the weights the forward reads: params itself when T is float
    gpu::AdamWTensor* tensors;      // (at most table.size()) the tensors' parts in the shard, with their weight decay
  };
  // Points the state and the table of buffers into one allocation (or, with a counting
  // net::Carver, only sums the bytes).
  static void carve(State& st, net::Buffers<T, float>& b, net::Carver& a, const ModelConfig& m, const RunShape& run,
                    size_t n_params, size_t n_tensors);
  // Copies n tokens (and n targets, when not null) through the pinned staging buffer to the
  // device, ordered on the stream; with order, also the encoder backward's order of x
  // (the table's order_keys, order_vals).
  void upload_tokens(const int32_t* x, const int32_t* targets, int n, int32_t* dx, int32_t* dtargets, bool order);

  ModelConfig model_;
  RunShape run_;
  gpu::Context ctx_;
  char* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  // ZeRO-1 (model/net/shards.h RankShard): the shard [shard_begin_, shard_begin_ + shard_count_) this
  // rank updates (all n_params unsharded); params and grads padded to padded_ elements (0 unsharded)
  size_t shard_begin_ = 0, shard_count_ = 0, padded_ = 0;
  int n_tensors_ = 0;       // tensors (parts of tensors) in the shard: st_.tensors
  int32_t* host_tokens_ = nullptr;  // pinned (4, B, T): inputs, targets, the encoder order's keys and vals
  std::vector<uint32_t> order_counts_;  // (V + 1) work space of gpu::encoder_backward_order
  cudaEvent_t tokens_copied_ = nullptr;  // recorded after the copies out of host_tokens_
  State st_{};
  net::Buffers<T, float> buf_{};
  GPTParams<T> P;      // views of st_.params_t
  GPTParams<float> G;  // views of st_.grads
  net::Pass pass_;     // of the last forward
  std::vector<int32_t> window_;  // the tokens whose keys and values are cached, position order
  net::OpTrace* trace_ = nullptr;
};

// Bytes of the largest op scratch the run needs (every op's <op>_scratch_bytes).
size_t gpt_cuda_scratch_bytes(const ModelConfig& m, const RunShape& run, size_t elem_size, size_t n_params);

}  // namespace tg
