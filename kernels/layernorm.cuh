// kernels/layernorm.cuh: layer normalisation over the last dimension on the GPU (CPU twin:
// kernels/cpu/layernorm.h).
//   mean = sum_c x_c / C,  rstd = 1 / sqrt(sum_c (x_c - mean)^2 / C + 1e-5)
//   out_c = (x_c - mean) * rstd * weight_c + bias_c
// forward overwrites out, mean, rstd; backward accumulates (+=) into dinp, dweight, dbias,
// deterministically (per-block partial column sums in ctx.scratch, reduced in a fixed order).
// bias may be null (then dbias is null too).
#pragma once
#include <cstddef>

#include "cuda_common.cuh"

namespace gpu {

template <typename T>
void layernorm_forward(const Context& ctx,
                       T* out,           // (N, C)
                       float* mean,      // (N)
                       float* rstd,      // (N)
                       const T* inp,     // (N, C)
                       const T* weight,  // (C)
                       const T* bias,    // (C) or null
                       int N, int C);

template <typename T>
void layernorm_backward(const Context& ctx,
                        T* dinp,            // (N, C) +=
                        float* dweight,     // (C)    +=
                        float* dbias,       // (C)    += or null
                        const T* dout,      // (N, C)
                        const T* inp,       // (N, C)
                        const T* weight,    // (C)
                        const float* mean,  // (N)
                        const float* rstd,  // (N)
                        int N, int C);

// Bytes of ctx.scratch layernorm_backward needs (the per-block partial dweight / dbias).
size_t layernorm_backward_scratch_bytes(int N, int C);

}  // namespace gpu
