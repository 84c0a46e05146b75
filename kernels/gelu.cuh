// kernels/gelu.cuh: GELU, tanh form, on the GPU (CPU twin: kernels/cpu/gelu.h).
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// forward overwrites out; backward accumulates (+=) into dinp (the exact derivative of the
// tanh form).
#pragma once
#include <cstddef>

#include "cuda_common.cuh"

namespace gpu {

template <typename T>
void gelu_forward(const Context& ctx,
                  T* out,        // (N)
                  const T* inp,  // (N)
                  size_t N);

template <typename T>
void gelu_backward(const Context& ctx,
                   T* dinp,        // (N) +=
                   const T* inp,   // (N)
                   const T* dout,  // (N)
                   size_t N);

}  // namespace gpu
