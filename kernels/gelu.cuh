// kernels/gelu.cuh: GELU on the GPU, in either form (kernels/gelu_form.h; CPU twin:
// kernels/cpu/gelu.h):
//   Tanh  gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (GPT-2, llm.c; the default)
//   Erf   gelu(x) = 0.5 x (1 + erf(x / sqrt(2)))                      (exact; nanoGPT's nn.GELU())
// forward overwrites out; backward accumulates (+=) into dinp (the exact derivative of the
// chosen form).
#pragma once
#include <cstddef>

#include "cuda_common.cuh"
#include "gelu_form.h"

namespace gpu {

template <typename T>
void gelu_forward(const Context& ctx,
                  T* out,        // (N)
                  const T* inp,  // (N)
                  size_t N, GeluForm form = GeluForm::Tanh);

template <typename T>
void gelu_backward(const Context& ctx,
                   T* dinp,        // (N) +=
                   const T* inp,   // (N)
                   const T* dout,  // (N)
                   size_t N, GeluForm form = GeluForm::Tanh);

}  // namespace gpu
