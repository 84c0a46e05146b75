// kernels/cpu/residual.cpp: the residual add, the CPU reference (contract in
// kernels/cpu/residual.h). out = inp1 + inp2; both inputs get the output gradient unchanged:
// dinp1 += dout, dinp2 += dout. Elementwise with no restrict pointers, so out may alias an
// input and dinp1 may be dinp2 (that element then gets dout twice).
#include "residual.h"
#include "real.h"

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

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void residual_forward<Real>(Real*, const Real*, const Real*, size_t);
template void residual_backward<Real>(Real*, Real*, const Real*, size_t);

}  // namespace cpu
