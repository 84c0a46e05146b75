// kernels/cpu/adamw.cpp: AdamW and global-norm gradient clipping, the CPU reference (contract
// in kernels/cpu/adamw.h). Per element, step t >= 1, as torch.optim.AdamW:
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//   w -= lr wd w             (decoupled decay, applied first)
//   w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// The bias corrections are computed once in double. global_norm = sqrt(sum g^2) accumulated
// in double, in a fixed order whatever the thread count (per chunk, then the chunks in order);
// clip_grad_norm multiplies
// by max_norm / (norm + 1e-6) when that factor is below 1, as torch.nn.utils.clip_grad_norm_.
#include "adamw.h"
#include "real.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cpu {

namespace {
constexpr long kParallelMin = 1L << 15;
}

template <typename T>
void adamw_update(T* params, const T* grads, T* m, T* v, size_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t) {
  const T b1 = (T)beta1, b2 = (T)beta2, one = (T)1;
  const T rbc1 = (T)(1.0 / (1.0 - std::pow((double)beta1, t)));
  const T rbc2 = (T)(1.0 / (1.0 - std::pow((double)beta2, t)));
  const T lrt = (T)lr, epst = (T)eps, decay = (T)lr * (T)weight_decay;
#pragma omp parallel for schedule(static) if ((long)N >= kParallelMin)
  for (long i = 0; i < (long)N; ++i) {
    const T g = grads[i];
    const T mi = b1 * m[i] + (one - b1) * g;
    const T vi = b2 * v[i] + (one - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const T mhat = mi * rbc1, vhat = vi * rbc2;
    T w = params[i];
    w -= decay * w;
    w -= lrt * (mhat / (std::sqrt(vhat) + epst));
    params[i] = w;
  }
}

template <typename T>
void norm_partials(const T* grads, size_t N, double* part) {
  // Chunks of kNormChunk elements, each summed with SIMD lanes (a fixed order for a given
  // build): the sums do not depend on the thread count.
  const long chunks = (long)((N + kNormChunk - 1) / kNormChunk);
#pragma omp parallel for schedule(static) if ((long)N >= kParallelMin)
  for (long k = 0; k < chunks; ++k) {
    const size_t i0 = (size_t)k * kNormChunk, i1 = std::min(N, i0 + kNormChunk);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = i0; i < i1; ++i) s += (double)grads[i] * (double)grads[i];
    part[(size_t)k] = s;
  }
}

template <typename T>
double global_norm(const T* grads, size_t N) {
  std::vector<double> part((N + kNormChunk - 1) / kNormChunk);
  norm_partials(grads, N, part.data());
  double s = 0.0;
  for (double p : part) s += p;  // in order
  return std::sqrt(s);
}

template <typename T>
double clip_grad_norm(T* grads, size_t N, double norm, double max_norm) {
  const double factor = max_norm / (norm + 1e-6);
  if (!(factor < 1.0)) return 1.0;
  const T f = (T)factor;
  for (size_t i = 0; i < N; ++i) grads[i] *= f;
  return factor;
}

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void adamw_update<Real>(Real*, const Real*, Real*, Real*, size_t, float, float, float, float, float, int);
template void norm_partials<Real>(const Real*, size_t, double*);
template double global_norm<Real>(const Real*, size_t);
template double clip_grad_norm<Real>(Real*, size_t, double, double);

}  // namespace cpu
