// model/backend.h: what the training loop asks of a backend (CPU now, CUDA to come). One
// backend owns the parameters, gradients, AdamW state and activations of one model, all
// allocated once when it is made (the CPU attention ops still allocate small per-head tile
// scratch on each call).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "gpt.h"

namespace tg {

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu (2 threads)", later the GPU's name
  virtual std::string device_name() const = 0;
  // bytes held for parameters, gradients, optimizer state and activations
  virtual size_t memory_bytes() const = 0;
  // Forward and backward of one training batch x, y (B, T) with dropout keyed by step
  // (gradients overwritten, not accumulated). Returns the mean loss.
  virtual float forward_backward(const int32_t* x, const int32_t* y, uint32_t step) = 0;
  // The global L2 norm of the gradients of the last forward_backward.
  virtual double grad_norm() = 0;
  // Clips the gradients to the configured global norm (when grad_clip > 0; norm is
  // grad_norm()) and applies AdamW with learning rate lr as update number t (1-based).
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
  // The parameters, and the gradients of the last forward_backward, in param_table order.
  virtual std::vector<float> params() const = 0;
  virtual std::vector<float> grads() const = 0;
  // The AdamW moments m and v, and setting the whole training state (params, m, v) back
  // from a checkpoint.
  virtual void adam_state(std::vector<float>& m, std::vector<float>& v) const = 0;
  virtual void set_state(const float* params, const float* m, const float* v) = 0;
};

// The CPU backend (kernels/cpu, float). Throws InputError when the config cannot be run.
std::unique_ptr<Backend> make_cpu_backend(const Config& c, const ModelConfig& m);

}  // namespace tg
