// kernels/encoder.cuh: token + position embedding on the GPU (CPU twin: kernels/cpu/encoder.h).
//   out[b, t, :] = wte[inp[b, t], :] + wpe[t, :]
// forward overwrites out; backward accumulates (+=) into dwte and dwpe (float), deterministically
// (no float atomics: see kernels/encoder.cu). Token ids must lie in [0, V).
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_common.cuh"

namespace gpu {

template <typename T>
void encoder_forward(const Context& ctx,
                     T* out,              // (B, T, C)
                     const int32_t* inp,  // (B, T) token ids in [0, V)
                     const T* wte,        // (V, C)
                     const T* wpe,        // (maxT, C), maxT >= Tn
                     int B, int Tn, int C);

template <typename T>
void encoder_backward(const Context& ctx,
                      float* dwte,         // (V, C)    +=
                      float* dwpe,         // (maxT, C) +=
                      const T* dout,       // (B, T, C)
                      const int32_t* inp,  // (B, T) token ids in [0, V)
                      int B, int Tn, int C, int V);

// Bytes of ctx.scratch encoder_backward needs (sort buffers, chunk partials, cub temp storage).
// Queries cub for its temp size, so it needs a current CUDA device.
size_t encoder_backward_scratch_bytes(int B, int Tn, int C, int V);

}  // namespace gpu
