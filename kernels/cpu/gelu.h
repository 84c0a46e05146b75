// kernels/cpu/gelu.h: GELU, tanh form (as GPT-2 and nanoGPT's nn.GELU(approximate='tanh')).
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// forward overwrites out; backward accumulates (+=) into dinp.
#pragma once
#include <cstddef>

namespace cpu {

template <typename T>
void gelu_forward(T* out, const T* inp, size_t N);  // (N), (N)

template <typename T>
void gelu_backward(T* dinp,        // (N) +=
                   const T* inp,   // (N)
                   const T* dout,  // (N)
                   size_t N);

}  // namespace cpu
