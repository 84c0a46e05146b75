// kernels/cpu/cross_entropy.h: fused softmax + cross-entropy over the vocabulary.
//   loss[n]  = logsumexp(logits[n, :]) - logits[n, target[n]]
//   dlogits  = (softmax(logits[n, :]) - onehot(target[n])) * dloss
// cross_entropy_forward overwrites losses (N). cross_entropy_forward_backward computes the
// losses and overwrites dlogits in the same pass over the logits (dloss is dL/dloss[n], the
// same for every n: 1/N for the mean loss).
// Padded vocabulary: rows are Vp >= V long (Vp = 0 means V); only the first V columns are the
// vocabulary: the softmax runs over them alone and the padded columns' dlogits are 0, so a
// padded logit is never predicted and never trained.
#pragma once
#include <cstdint>

namespace cpu {

template <typename T>
void cross_entropy_forward(T* losses,              // (N)
                           const T* logits,         // (N, Vp)
                           const int32_t* targets,  // (N)
                           int N, int V, int Vp = 0);

template <typename T>
void cross_entropy_forward_backward(T* losses,              // (N)
                                    T* dlogits,             // (N, Vp) overwritten
                                    const T* logits,        // (N, Vp)
                                    const int32_t* targets,  // (N)
                                    T dloss, int N, int V, int Vp = 0);

}  // namespace cpu
