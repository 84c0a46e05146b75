// kernels/cross_entropy.cuh: fused softmax + cross-entropy over the vocabulary on the GPU (CPU
// twin: kernels/cpu/cross_entropy.h).
//   loss[n]  = logsumexp(logits[n, :]) - logits[n, target[n]]
//   dlogits  = (softmax(logits[n, :]) - onehot(target[n])) * dloss
// cross_entropy_forward overwrites losses; cross_entropy_forward_backward overwrites losses
// and dlogits in the same pass (dlogits may be the logits buffer itself). fp32 math. A target
// outside [0, V) gives a NaN loss (and no -dloss term). loss_mean overwrites out.
// Padded vocabulary: rows are Vp >= V long (Vp = 0 means V); the softmax runs over the first V
// columns only and the padded columns' dlogits are 0 (never predicted, never trained).
#pragma once
#include <cstdint>

#include "cuda_common.cuh"

namespace gpu {

template <typename T>
void cross_entropy_forward(const Context& ctx,
                           float* losses,           // (N)
                           const T* logits,         // (N, Vp)
                           const int32_t* targets,  // (N)
                           int N, int V, int Vp = 0);

template <typename T>
void cross_entropy_forward_backward(const Context& ctx,
                                    float* losses,           // (N)
                                    T* dlogits,              // (N, Vp) overwritten, may be logits
                                    const T* logits,         // (N, Vp)
                                    const int32_t* targets,  // (N)
                                    float dloss, int N, int V, int Vp = 0);

// out[0] = sum_n losses[n] / N, accumulated in double in a fixed order (one block).
void loss_mean(const Context& ctx,
               float* out,            // (1) device
               const float* losses,   // (N)
               int N);

}  // namespace gpu
