// kernels/residual.cuh: the residual add on the GPU (CPU twin: kernels/cpu/residual.h).
//   out = inp1 + inp2;  backward: dinp1 += dout, dinp2 += dout
// forward overwrites out, which may alias inp1 or inp2 (exactly); backward accumulates (+=),
// and dinp1 may equal dinp2 (that buffer then gets 2 dout). Partial overlaps are rejected.
#pragma once
#include <cstddef>

#include "cuda_common.cuh"

namespace gpu {

template <typename T>
void residual_forward(const Context& ctx,
                      T* out,         // (N), may be inp1 or inp2
                      const T* inp1,  // (N)
                      const T* inp2,  // (N)
                      size_t N);

template <typename T>
void residual_backward(const Context& ctx,
                       T* dinp1,       // (N) +=
                       T* dinp2,       // (N) +=, may be dinp1
                       const T* dout,  // (N)
                       size_t N);

}  // namespace gpu
