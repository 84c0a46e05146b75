// model/net/backend.h: what the training loop asks of a backend (CPU or CUDA). One
// backend owns the parameters, gradients, AdamW state and activations of one model, all
// allocated once when it is made (the CPU attention ops still allocate small per-head tile
// scratch on each call).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpt.h"
#include "run_shape.h"

namespace tg {

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu (2 threads)", later the GPU's name
  virtual std::string device_name() const = 0;
  // bytes held for parameters, gradients, optimizer state and activations
  virtual size_t memory_bytes() const = 0;
  // "fp32" or "bf16": the storage type of activations and of the weights the forward reads
  virtual std::string precision() const { return "fp32"; }
  // The device's dense bf16 tensor-core peak in FLOP/s, for MFU; 0 when unknown (no MFU printed).
  virtual double peak_flops() const { return 0; }
  // What the attention path's name leaves out, for the start-up line: " (head size 40 padded to
  // 64 in the flash kernels)" where the CUDA kernels run a head size padded; "" otherwise.
  virtual std::string attention_note() const { return ""; }
  // Forward and backward of one training batch x, y (B, T) with dropout keyed by step. With
  // gradient accumulation (--grad-accum accum), micro-batch `micro` (0 .. accum - 1) of the
  // step: the gradient of its mean loss divided by accum is added to the gradients (micro 0:
  // overwrites them), and its dropout masks are those of rows micro*B .. micro*B + B - 1 of one
  // batch of accum*B (philox::DropoutKey::row0). So accum micro-batches of B give the gradient
  // of one batch of accum*B made of them, to float rounding (each micro-batch's sums are
  // rounded, then added). micro 0 of 1 is today's plain step, bitwise. Returns the mean loss
  // of this micro-batch.
  // Data parallelism (model/run/dist.h): rank r of N with --grad-accum a runs micro-batches
  // r a .. r a + a - 1 of accum = N a; first_micro (r a) is the one that overwrites the
  // gradients, the others add to them (alone: 0, as above).
  virtual float forward_backward(const int32_t* x, const int32_t* y, uint32_t step, int micro = 0, int accum = 1,
                                 int first_micro = 0) = 0;
  // Data parallelism: sums the gradients of this step over the ranks (one all-reduce of the
  // flat gradient buffer: MPI on the CPU, NCCL on a GPU), after the rank's last micro-batch and
  // before grad_norm(), so that every rank sees the step's whole gradient and clips and updates
  // alike. A no-op in a single process.
  virtual void reduce_grads() = 0;
  // The global L2 norm of the gradients of the last forward_backward (after the last
  // micro-batch of a step: of the accumulated gradients; after reduce_grads(): of the sum).
  virtual double grad_norm() = 0;
  // ZeRO-1 (--zero 1 on several ranks, model/net/shards.h): each rank holds m and v of its shard
  // alone; reduce_grads() reduce-scatters the gradients (each rank gets the sum of its shard),
  // grad_norm() adds the shards' partial sums in order (every rank the same norm), update()
  // updates the rank's shard of the weights and all-gathers them. gather_state() (collective:
  // every rank calls it, at a checkpoint) gathers the shards of m and v on rank 0, where
  // host_state() and adam_state() then give them whole until the next update(); adam_state()
  // throws RuntimeError on rank 0 when they were not gathered since. set_state() takes the
  // rank's shard of m and v. Without sharding gather_state() does nothing.
  virtual bool sharded() const { return false; }
  virtual void gather_state() {}
  // Clips the gradients to the run's global norm (when grad_clip > 0; norm is grad_norm(), as
  // both backends require) and applies AdamW with learning rate lr as update number t
  // (1-based): GPTCpu::update and GPTCuda::update, the twins. GPTCuda clips by its own copy of
  // the norm, on the device (where grad_norm() read it from), so that its update is queued
  // without waiting for the host; BackendCuda checks that the norm given is that one.
  virtual void update(float lr, int t, double norm) = 0;
  // Mean loss of one batch x, y (B, T), no dropout, no gradients.
  virtual float eval_loss(const int32_t* x, const int32_t* y) = 0;
  // Generation with a KV cache (no dropout): generate_reset() empties the context;
  // generate_step(token, out) appends token to it and writes the logits (V) of that position to
  // out. The model sees at most block_size tokens, cropped from the left as nanoGPT does: once
  // the context is full, each step runs on the last block_size tokens at positions 0 ..
  // block_size - 1 (GPTCpu::decode_step says how the CPU backend re-primes its cache).
  virtual void generate_reset() = 0;
  virtual void generate_step(int32_t token, float* out) = 0;
  // The parameters, and the gradients of the last forward_backward, in param_table order
  // (ZeRO-1: after reduce_grads() only this rank's shard of them is the sum over the ranks).
  virtual std::vector<float> params() const = 0;
  virtual std::vector<float> grads() const = 0;
  // The AdamW moments m and v, and setting the whole training state (params, m, v) back
  // from a checkpoint.
  virtual void adam_state(std::vector<float>& m, std::vector<float>& v) const = 0;
  virtual void set_state(const float* params, const float* m, const float* v) = 0;
  // The training state where it lies in host memory, for a checkpoint to be written straight
  // from it: the backend's own params, m and v (param_count floats each), valid until its next
  // update; all null when it keeps them elsewhere (a checkpoint then copies them out with
  // params() and adam_state(): 12 bytes per parameter of host memory for the moment).
  struct HostState {
    const float* params = nullptr;
    const float* m = nullptr;
    const float* v = nullptr;
  };
  virtual HostState host_state() const { return {}; }

  // --attention check (model/net/attention_check.h runs it): check_forward is one training
  // forward of x, y (B, T) with dropout keyed by step; then check_layer runs both attention
  // paths, naive and flash, on layer `layer`'s qkv of that forward with the masks of that step,
  // forward and backward (of dout, (B, T, C)), and gives their outputs as floats.
  struct AttentionOutputs {
    std::vector<float> out[2], dqkv[2];  // [0] naive, [1] flash: O (B, T, C), dQKV (B, T, 3C)
  };
  virtual void check_forward(const int32_t* x, const int32_t* y, uint32_t step) = 0;
  virtual AttentionOutputs check_layer(int layer, uint32_t step, const std::vector<float>& dout) = 0;
};

// The backend `device` asks for (model/net/backend.cpp), made for model m and run shape run:
// the CUDA backend when the device is cuda, or auto with a GPU visible and the build holding the
// CUDA backend; else the CPU backend. *note gets the line that says why when the device was not
// asked for explicitly (or that the GPU is emulated), else "". Throws RuntimeError for --device
// cuda where there is no GPU or no CUDA backend, InputError for what cannot run where it would
// (bf16 on the CPU, and what make_cpu_backend and make_cuda_backend refuse).
std::unique_ptr<Backend> make_backend(Device device, const ModelConfig& m, const RunShape& run, std::string* note,
                                      double host_bytes_held = 0);

// The GPUs the CUDA backend of this program sees: none in a program linked without it (built
// without the CUDA toolkit, and build/test_cpu); emulated in train_gpt_emu (the SIMT emulator).
struct CudaDevices {
  bool built = false;  // the CUDA backend is linked in
  int count = 0;       // visible devices
  bool emulated = false;
};
CudaDevices cuda_devices();

// The CPU backend (kernels/cpu, float). Throws InputError when the run cannot be made, the
// model not fitting in memory among them: what it allocates plus host_bytes_held, what the
// caller holds besides for the run (its data, a checkpoint being loaded), against 90% of the
// machine's memory. Writing a checkpoint adds nothing (it is streamed from host_state()).
std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& m, const RunShape& run, double host_bytes_held = 0);

// The CUDA backend (kernels/*.cu, model/net/backend_cuda.cu) on this rank's device (local rank
// r of a data-parallel run: GPU r), precision from run.precision (auto: bf16 on compute
// capability 8.0 and newer). Throws InputError when the run cannot go there (the model does not
// fit in free device memory, a head size the flash kernels do not support) and RuntimeError
// when the device fails. Only in a program linked with the CUDA backend (cuda_devices().built).
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& m, const RunShape& run);
// (model/net/backend_cuda.cu) The devices it sees; cuda_devices() asks it when it is linked in.
CudaDevices cuda_backend_devices();

}  // namespace tg
