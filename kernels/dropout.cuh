// kernels/dropout.cuh: dropout on a (B, T, C) activation on the GPU (CPU twin:
// kernels/cpu/dropout.h). The mask is philox::dropout_keep(key, b, t, c) (kernels/philox.h),
// never stored: the backward regenerates it.
//   forward   out   = keep ? inp * key.scale : 0      (overwrites out; out may alias inp)
//   backward  dinp += keep ? dout * key.scale : 0     (accumulates)
// key.threshold == 0 (p = 0) is the identity: a copy (none when out == inp) / a plain +=.
#pragma once
#include "cuda_common.cuh"
#include "philox.h"

namespace gpu {

template <typename T>
void dropout_forward(const Context& ctx,
                     T* out,        // (B, T, C), may be inp
                     const T* inp,  // (B, T, C)
                     const philox::DropoutKey& key, int B, int Tn, int C);

template <typename T>
void dropout_backward(const Context& ctx,
                      T* dinp,        // (B, T, C) +=
                      const T* dout,  // (B, T, C)
                      const philox::DropoutKey& key, int B, int Tn, int C);

}  // namespace gpu
