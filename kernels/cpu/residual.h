// kernels/cpu/residual.h: residual add.
//   out = inp1 + inp2;  backward: dinp1 += dout, dinp2 += dout
// out may alias inp1 or inp2. dinp1 and dinp2 may be the same buffer (then it gets 2 dout).
#pragma once
#include <cstddef>

namespace cpu {

template <typename T>
void residual_forward(T* out, const T* inp1, const T* inp2, size_t N);  // all (N)

template <typename T>
void residual_backward(T* dinp1, T* dinp2, const T* dout, size_t N);  // all (N), +=

}  // namespace cpu
