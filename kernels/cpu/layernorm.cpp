// kernels/cpu/layernorm.cpp: layer normalisation over the last dimension, the CPU reference
// (contract in kernels/cpu/layernorm.h). Per row x of length C: mean = sum x / C, the biased
// variance var = sum (x - mean)^2 / C (as PyTorch), rstd = 1 / sqrt(var + 1e-5),
// xhat = (x - mean) rstd, out = xhat o weight + bias. Backward, with g = dout o weight:
//   dinp = rstd (g - mean(g) - xhat mean(g o xhat)),  dweight = sum_rows dout o xhat,
//   dbias = sum_rows dout.
// Row sums are accumulated in double (two-pass mean / variance), in SIMD lanes ("omp simd"
// reductions: partial sums per lane, then combined; a fixed order for a given build). Rows
// run in parallel when the tensor is large; the column sums dweight / dbias are a separate
// serial pass so the result does not depend on the number of threads.
#include "layernorm.h"
#include "real.h"

#include <cmath>
#include <cstddef>

namespace cpu {

namespace {
constexpr long kParallelMin = 1L << 15;  // N * C from which the row loops use OpenMP
}

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C) {
#pragma omp parallel for schedule(static) if ((long)N * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + (size_t)n * C;
    T* o = out + (size_t)n * C;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; ++c) s += (double)x[c];
    const double m = s / C;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; ++c) {
      const double d = (double)x[c] - m;
      ss += d * d;
    }
    const double r = 1.0 / std::sqrt(ss / C + kLayerNormEps);
    const T mt = (T)m, rt = (T)r;
    if (bias) {
      for (int c = 0; c < C; ++c) o[c] = (x[c] - mt) * rt * weight[c] + bias[c];
    } else {
      for (int c = 0; c < C; ++c) o[c] = (x[c] - mt) * rt * weight[c];
    }
    mean[n] = mt;
    rstd[n] = rt;
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int N, int C) {
#pragma omp parallel for schedule(static) if ((long)N * C >= kParallelMin)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + (size_t)n * C;
    const T* d = dout + (size_t)n * C;
    T* di = dinp + (size_t)n * C;
    const T m = mean[n], r = rstd[n];
    double sg = 0.0, sgx = 0.0;  // sum g, sum g * xhat
#pragma omp simd reduction(+ : sg, sgx)
    for (int c = 0; c < C; ++c) {
      const T xhat = (x[c] - m) * r;
      const T g = d[c] * weight[c];
      sg += (double)g;
      sgx += (double)g * (double)xhat;
    }
    const T mg = (T)(sg / C), mgx = (T)(sgx / C);
    for (int c = 0; c < C; ++c) {
      const T xhat = (x[c] - m) * r;
      const T g = d[c] * weight[c];
      di[c] += r * (g - mg - xhat * mgx);
    }
  }
  // Column sums: serial over rows, vectorised over C.
  for (int n = 0; n < N; ++n) {
    const T* x = inp + (size_t)n * C;
    const T* d = dout + (size_t)n * C;
    const T m = mean[n], r = rstd[n];
    for (int c = 0; c < C; ++c) dweight[c] += d[c] * ((x[c] - m) * r);
    if (dbias)
      for (int c = 0; c < C; ++c) dbias[c] += d[c];
  }
}

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void layernorm_forward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, int, int);
template void layernorm_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, const Real*,
                                       const Real*, int, int);

}  // namespace cpu
