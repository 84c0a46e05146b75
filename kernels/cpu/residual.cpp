// kernels/cpu/residual.cpp: the residual add, the CPU reference (contract in
// kernels/cpu/residual.h). out = inp1 + inp2; both inputs get the output gradient unchanged:
// dinp1 += dout, dinp2 += dout. Elementwise with no restrict pointers, so out may alias an
// input and dinp1 may be dinp2 (that element then gets dout twice).
#include "residual.h"

namespace cpu {

namespace {
constexpr long kParallelMin = 1L << 15;
}

template <typename T>
void residual_forward(T* out, const T* inp1, const T* inp2, size_t N) {
#pragma omp parallel for schedule(static) if ((long)N >= kParallelMin)
  for (long i = 0; i < (long)N; ++i) out[i] = inp1[i] + inp2[i];
}

template <typename T>
void residual_backward(T* dinp1, T* dinp2, const T* dout, size_t N) {
#pragma omp parallel for schedule(static) if ((long)N >= kParallelMin)
  for (long i = 0; i < (long)N; ++i) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

// float for train_gpt; double, for the tests' gradient checks, in the objects the Makefile
// compiles from this file with TG_CPU_DOUBLE (CPU_DOUBLE_OBJS), linked into the tests only
#ifndef TG_CPU_DOUBLE
template void residual_forward<float>(float*, const float*, const float*, size_t);
template void residual_backward<float>(float*, float*, const float*, size_t);
#else
template void residual_forward<double>(double*, const double*, const double*, size_t);
template void residual_backward<double>(double*, double*, const double*, size_t);
#endif

}  // namespace cpu
