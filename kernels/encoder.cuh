// kernels/encoder.cuh: token + position embedding on the GPU (CPU twin: kernels/cpu/encoder.h).
//   out[b, t, :] = wte[inp[b, t], :] + wpe[t, :]
// forward overwrites out; backward accumulates (+=) into dwte and dwpe (float), deterministically
// (no float atomics: see kernels/encoder.cu), in the order encoder_backward_order gives (each
// token's positions in increasing order). Token ids must lie in [0, V).
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

// The order of the dwte sums, computed on the host from the tokens (inp, host memory): the
// N = B*T positions b*T + t sorted by token id, each token's positions in increasing order (a
// counting sort, O(N + V)); keys[i] is the token at position vals[i]. The caller uploads keys
// and vals for encoder_backward. counts: V + 1 words of work space (nothing is allocated here).
// Throws std::invalid_argument for a token outside [0, V).
void encoder_backward_order(uint32_t* keys,      // (N) out: token ids, ascending
                            uint32_t* vals,      // (N) out: their positions b*T + t
                            uint32_t* counts,    // (V + 1) work space
                            const int32_t* inp,  // (N) token ids in [0, V), host memory
                            long long N, int V);

template <typename T>
void encoder_backward(const Context& ctx,
                      float* dwte,           // (V, C)    +=
                      float* dwpe,           // (maxT, C) +=
                      const T* dout,         // (B, T, C)
                      const uint32_t* keys,  // (B*T) encoder_backward_order's keys, on the device
                      const uint32_t* vals,  // (B*T) its vals, on the device
                      int B, int Tn, int C);

// Bytes of ctx.scratch encoder_backward needs (the chunk partials).
size_t encoder_backward_scratch_bytes(int B, int Tn, int C);

}  // namespace gpu
