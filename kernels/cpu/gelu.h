// kernels/cpu/gelu.h: GELU, the CPU reference, in either form (kernels/gelu_form.h):
//   Tanh  gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (GPT-2, llm.c; the default)
//   Erf   gelu(x) = 0.5 x (1 + erf(x / sqrt(2)))                      (exact; nanoGPT's nn.GELU())
// The backward is the exact derivative of the chosen form.
// forward overwrites out; backward accumulates (+=) into dinp.
#pragma once
#include <cstddef>

#include "../gelu_form.h"

namespace cpu {

template <typename T>
void gelu_forward(T* out, const T* inp, size_t N,  // (N), (N)
                  GeluForm form = GeluForm::Tanh);

template <typename T>
void gelu_backward(T* dinp,        // (N) +=
                   const T* inp,   // (N)
                   const T* dout,  // (N)
                   size_t N, GeluForm form = GeluForm::Tanh);

// gelu_backward with dinp overwritten (=) instead of accumulated (the CPU step: no zeroing
// pass first); the same result as zeroing dinp and calling gelu_backward.
template <typename T>
void gelu_backward_overwrite(T* dinp,        // (N) =
                             const T* inp,   // (N)
                             const T* dout,  // (N)
                             size_t N, GeluForm form = GeluForm::Tanh);

}  // namespace cpu
