// kernels/cpu/cross_entropy.cpp: fused softmax + cross-entropy, the CPU reference (contract in
// kernels/cpu/cross_entropy.h). Per row z of length V with target y, stably with m = max z:
//   lse = m + log(sum_v exp(z_v - m)),  loss = lse - z_y
//   dlogits_v = (exp(z_v - m) / sum - [v == y]) * dloss
// The exponential sum is accumulated in double. forward_backward keeps exp(z_v - m) in
// dlogits during the sum and rescales it in place, one pass over the logits for the
// exponentials. Rows run in parallel when N * V is large.
#include "cross_entropy.h"
#include "real.h"

#include <cmath>
#include <cstddef>

namespace cpu {

namespace {
constexpr long kParallelMin = 1L << 15;
}

template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int N, int V, int Vp) {
  if (Vp <= 0) Vp = V;
#pragma omp parallel for schedule(static) if ((long)N * V >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const T* z = logits + (size_t)n * Vp;
    T m = z[0];
    for (int v = 1; v < V; ++v) m = z[v] > m ? z[v] : m;
    double s = 0.0;
    for (int v = 0; v < V; ++v) s += (double)std::exp(z[v] - m);
    const double lse = (double)m + std::log(s);
    losses[n] = (T)(lse - (double)z[targets[n]]);
  }
}

template <typename T>
void cross_entropy_forward_backward(T* losses, T* dlogits, const T* logits,
                                    const int32_t* targets, T dloss, int N, int V, int Vp) {
  if (Vp <= 0) Vp = V;
#pragma omp parallel for schedule(static) if ((long)N * V >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const T* z = logits + (size_t)n * Vp;
    T* dz = dlogits + (size_t)n * Vp;
    T m = z[0];
    for (int v = 1; v < V; ++v) m = z[v] > m ? z[v] : m;
    double s = 0.0;
    for (int v = 0; v < V; ++v) {
      const T e = std::exp(z[v] - m);
      dz[v] = e;
      s += (double)e;
    }
    const double lse = (double)m + std::log(s);
    const int y = targets[n];
    losses[n] = (T)(lse - (double)z[y]);
    const T inv = (T)(1.0 / s);
    for (int v = 0; v < V; ++v) dz[v] = dz[v] * inv * dloss;
    dz[y] -= dloss;
    for (int v = V; v < Vp; ++v) dz[v] = 0;  // padded columns: never trained
  }
}

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void cross_entropy_forward<Real>(Real*, const Real*, const int32_t*, int, int, int);
template void cross_entropy_forward_backward<Real>(Real*, Real*, const Real*, const int32_t*, Real, int, int, int);

}  // namespace cpu
