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

// sqrt(sum_i g_i^2), accumulated in double: the partial sums of norm_partials added in order.
template <typename T>
double global_norm(const T* grads, size_t N);

// The partial sums of global_norm: part[k] = sum of g_i^2 over chunk k, elements
// [k kNormChunk, min(N, (k + 1) kNormChunk)), ceil(N / kNormChunk) of them (overwritten). A
// vector cut at multiples of kNormChunk (ZeRO-1's shards, model/net/shards.h) has the same chunks.
constexpr size_t kNormChunk = 1 << 13;
template <typename T>
void norm_partials(const T* grads, size_t N, double* part);

// g *= max_norm / (norm + 1e-6) when that factor is < 1 (torch.nn.utils.clip_grad_norm_).
// Returns the factor applied (1 when no clipping).
template <typename T>
double clip_grad_norm(T* grads, size_t N, double norm, double max_norm);

}  // namespace cpu
