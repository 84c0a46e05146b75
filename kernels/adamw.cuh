// kernels/adamw.cuh: AdamW over all parameters in one fused kernel, the global gradient norm and
// the clip factor, on the GPU (CPU twin: kernels/cpu/adamw.h).
//   g = grad * grad_scale (the clip factor; 1 when grad_scale is null)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   w -= lr wd w                                   (decoupled decay first, wd per tensor)
//   w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// adamw_update overwrites params, m, v (and params_copy, the T copy of the updated params,
// when not null); grads are only read. global_norm_squared and clip_scale overwrite their
// one-float outputs; copy_params overwrites dst.
#pragma once
#include <cstddef>

#include "cuda_common.cuh"

namespace gpu {

// One per parameter tensor: [offset, offset + numel) of the flat parameter vector, with its
// weight decay. The tensors are contiguous and in order and cover [0, N).
struct AdamWTensor {
  size_t offset;
  size_t numel;
  float weight_decay;
};

struct AdamWArgs {
  float lr, beta1, beta2, eps;
  int t;  // step, >= 1 (t = 1 for the first update)
};

template <typename T>
void adamw_update(const Context& ctx,
                  float* params,               // (N) fp32 master weights
                  T* params_copy,              // (N) params rounded to T after the update, or null
                  const float* grads,          // (N)
                  float* m,                    // (N) first moment
                  float* v,                    // (N) second moment
                  size_t N,
                  const AdamWTensor* tensors,  // (n_tensors) device array
                  int n_tensors, const AdamWArgs& args,
                  const float* grad_scale);    // (1) device scalar multiplying every gradient, or null

// out[0] = sum_i grads[i]^2 (double partial sums in a fixed grid, then one block in order).
void global_norm_squared(const Context& ctx,
                         float* out,          // (1) device
                         const float* grads,  // (N)
                         size_t N);
size_t global_norm_scratch_bytes(size_t N);

// scale[0] = max_norm / (sqrt(norm_squared[0]) + 1e-6) when that is < 1 and max_norm > 0, else 1
// (1 too when the norm is not finite: the caller skips the update then).
void clip_scale(const Context& ctx,
                float* scale,               // (1) device
                const float* norm_squared,  // (1) device
                float max_norm);

// dst = src rounded to T: the T copy of the master weights.
template <typename T>
void copy_params(const Context& ctx,
                 T* dst,            // (N)
                 const float* src,  // (N)
                 size_t N);

}  // namespace gpu
