// kernels/cpu/cross_entropy.h: fused softmax + cross-entropy over the vocabulary.
//   loss[n]  = logsumexp(logits[n, :]) - logits[n, target[n]]
//   dlogits  = (softmax(logits[n, :]) - onehot(target[n])) * dloss
// cross_entropy_forward overwrites losses (N). cross_entropy_forward_backward computes the
// losses and overwrites dlogits in the same pass over the logits (dloss is dL/dloss[n], the
// same for every n: 1/N for the mean loss).
#pragma once
#include <cstdint>

namespace cpu {

template <typename T>
void cross_entropy_forward(T* losses,              // (N)
                           const T* logits,         // (N, V)
                           const int32_t* targets,  // (N)
                           int N, int V);

template <typename T>
void cross_entropy_forward_backward(T* losses,              // (N)
                                    T* dlogits,             // (N, V) overwritten
                                    const T* logits,        // (N, V)
                                    const int32_t* targets,  // (N)
                                    T dloss, int N, int V);

}  // namespace cpu
