// kernels/cpu/adamw.h: AdamW (Loshchilov & Hutter), global-norm gradient clipping.
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   mhat = m / (1 - b1^t);  vhat = v / (1 - b2^t)          (t = 1 for the first update)
//   w -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * w)
// which is PyTorch's torch.optim.AdamW: the decay is decoupled (w *= 1 - lr*wd first) and
// the caller passes weight_decay = 0 for tensors that are not decayed (biases, layernorm).
// adamw_update overwrites params, m, v in place.
#pragma once
#include <cstddef>

namespace cpu {

template <typename T>
void adamw_update(T* params,       // (N)
                  const T* grads,  // (N)
                  T* m, T* v,      // (N) first and second moments
                  size_t N, float lr, float beta1, float beta2, float eps, float weight_decay,
                  int t);

// sqrt(sum_i g_i^2), accumulated in double.
template <typename T>
double global_norm(const T* grads, size_t N);

// g *= max_norm / (norm + 1e-6) when that factor is < 1 (torch.nn.utils.clip_grad_norm_).
// Returns the factor applied (1 when no clipping).
template <typename T>
double clip_grad_norm(T* grads, size_t N, double norm, double max_norm);

}  // namespace cpu
