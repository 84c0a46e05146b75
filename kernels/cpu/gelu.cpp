// kernels/cpu/gelu.cpp: GELU, the CPU reference (contract in kernels/cpu/gelu.h).
//
// The tanh form. With s = sqrt(2/pi), u = s (x + 0.044715 x^3) and th = tanh(u):
//   gelu(x)  = 0.5 x (1 + th)
//   gelu'(x) = 0.5 (1 + th) + 0.5 x (1 - th^2) s (1 + 3 * 0.044715 x^2)
// the exact derivative of the forward (not of the erf form). Evaluated through the identity
// 0.5 (1 + tanh(u)) = sigma(2u) = 1 / (1 + exp(-2u)): with q = sigma(2u),
//   gelu(x) = x q,   gelu'(x) = q + 2 x q (1 - q) s (1 + 3 * 0.044715 x^2)
// (as 0.5 (1 - th^2) = 2 q (1 - q)): the same function, one exp instead of a tanh, and no
// cancellation in 1 + th for negative x; exp overflowing to inf far left gives q = 0 and
// finite results. The elementwise loop is written as Eigen array expressions over chunks
// of the buffers, because Eigen's exp is vectorised (about 10x faster in float than a loop
// calling std::tanh, which matters: the MLP activation is the largest elementwise tensor).
// Chunks run in parallel when N is large.
//
// The erf form, with Phi the standard normal CDF and phi its density:
//   gelu(x)  = x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))) = 0.5 x erfc(-x / sqrt(2))
//   gelu'(x) = Phi(x) + x phi(x),   phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
// Phi through erfc: no cancellation in 1 + erf for negative x. A plain loop over std::erfc and
// std::exp in T.
#include "gelu.h"

#include <algorithm>
#include <cmath>

#include "eigen.h"
#include "real.h"

namespace cpu {

namespace {
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;
constexpr long kParallelMin = 1L << 15;
constexpr long kChunk = 2048;  // elements per chunk (a chunk's q fits in L1)
constexpr double kInvSqrt2 = 0.70710678118654752440;      // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;    // 1 / sqrt(2 pi)

template <typename T>
using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
template <typename T>
using ChunkArr = Eigen::Array<T, Eigen::Dynamic, 1, Eigen::ColMajor, kChunk, 1>;  // on the stack
}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, size_t N, GeluForm form) {
  if (form == GeluForm::Erf) {
#pragma omp parallel for schedule(static) if ((long)N >= kParallelMin)
    for (long i = 0; i < (long)N; ++i) out[i] = (T)0.5 * inp[i] * std::erfc(-inp[i] * (T)kInvSqrt2);
    return;
  }
  const T m2s = (T)(-2 * kSqrt2OverPi), a = (T)kCubic, one = (T)1;
  const long chunks = ((long)N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if ((long)N >= kParallelMin)
  for (long k = 0; k < chunks; ++k) {
    const long i0 = k * kChunk, n = std::min<long>(kChunk, (long)N - i0);
    Eigen::Map<const Arr<T>> x(inp + i0, n);
    Eigen::Map<Arr<T>> y(out + i0, n);
    y = x / (one + (m2s * (x + a * x.cube())).exp());  // x q
  }
}

namespace {
// The backward of both entry points: dinp += gelu'(x) dout (Add) or dinp = gelu'(x) dout.
template <bool Add, typename T>
void backward(T* dinp, const T* inp, const T* dout, size_t N, GeluForm form) {
  if (form == GeluForm::Erf) {
#pragma omp parallel for schedule(static) if ((long)N >= kParallelMin)
    for (long i = 0; i < (long)N; ++i) {
      const T x = inp[i];
      const T cdf = (T)0.5 * std::erfc(-x * (T)kInvSqrt2), pdf = (T)kInvSqrt2Pi * std::exp((T)-0.5 * x * x);
      const T g = (cdf + x * pdf) * dout[i];
      dinp[i] = Add ? dinp[i] + g : g;
    }
    return;
  }
  const T s = (T)kSqrt2OverPi, m2s = (T)(-2 * kSqrt2OverPi), a = (T)kCubic, one = (T)1,
          two = (T)2, three = (T)3;
  const long chunks = ((long)N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if ((long)N >= kParallelMin)
  for (long k = 0; k < chunks; ++k) {
    const long i0 = k * kChunk, n = std::min<long>(kChunk, (long)N - i0);
    Eigen::Map<const Arr<T>> x(inp + i0, n), d(dout + i0, n);
    Eigen::Map<Arr<T>> di(dinp + i0, n);
    const ChunkArr<T> q = (one + (m2s * (x + a * x.cube())).exp()).inverse();
    if (Add) di += (q + two * s * x * q * (one - q) * (one + three * a * x.square())) * d;
    else di = (q + two * s * x * q * (one - q) * (one + three * a * x.square())) * d;
  }
}

}  // namespace

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t N, GeluForm form) {
  backward<true>(dinp, inp, dout, N, form);
}

template <typename T>
void gelu_backward_overwrite(T* dinp, const T* inp, const T* dout, size_t N, GeluForm form) {
  backward<false>(dinp, inp, dout, N, form);
}

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void gelu_forward<Real>(Real*, const Real*, size_t, GeluForm);
template void gelu_backward<Real>(Real*, const Real*, const Real*, size_t, GeluForm);
template void gelu_backward_overwrite<Real>(Real*, const Real*, const Real*, size_t, GeluForm);

}  // namespace cpu
