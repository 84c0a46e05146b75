// kernels/cpu/matmul.cpp: the linear layer y = x W^T + b, the CPU reference (contract in
// kernels/cpu/matmul.h). With X (N, C), W (OC, C), Y (N, OC), all row-major:
//   forward   Y = X W^T + 1 b^T
//   backward  dX += dY W,   dW += dY^T X,   db += column sums of dY.
// The buffers are viewed in place as row-major Eigen matrices (Eigen::Map, no copies) and the
// products go to Eigen's blocked GEMM, which is multi-threaded through OpenMP when the
// project is built with -fopenmp. .noalias() writes the product straight into the output.
// The float path with N >= kGemmMinRows rows goes to gemm_f32 instead (kernels/cpu/gemm.h: a
// packed AVX2 + FMA or AVX-512 product, about 1.4x Eigen's single-threaded speed on the CPU
// step's shapes with AVX2, tests/bench/bench_gemm.cpp), when the build has one; fewer rows
// (the decoder's one row) stay with Eigen's matrix-vector product. The forward then writes the bias first and
// adds the product to it: b + XW^T, the same sum as XW^T + b.
#include "matmul.h"

#include <algorithm>
#include <type_traits>

#include "eigen.h"
#include "gemm.h"
#include "real.h"

namespace cpu {

namespace {
constexpr int kGemmMinRows = 16;
template <typename T>
constexpr bool fast_gemm() { return std::is_same<T, float>::value && kGemmF32Fast; }
}  // namespace

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C,
                    int OC) {
  if constexpr (fast_gemm<T>()) {
    if (N >= kGemmMinRows) {
      if (bias)
        for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + (size_t)n * OC);
      gemm_f32(N, OC, C, inp, C, 1, weight, 1, C, out, OC, bias != nullptr);  // Y (+)= X W^T
      return;
    }
  }
  MapMat<T> Y(out, N, OC);
  MapConstMat<T> X(inp, N, C);
  MapConstMat<T> W(weight, OC, C);
  Y.noalias() = X * W.transpose();
  if (bias) Y.rowwise() += Eigen::Map<const RowVec<T>>(bias, OC);
}

namespace {
// The backward of both entry points: dX += dY W (dinp_add) or dX = dY W.
template <typename T>
void backward(T* dinp, bool dinp_add, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
              int C, int OC) {
  MapConstMat<T> dY(dout, N, OC);
  MapConstMat<T> X(inp, N, C);
  MapConstMat<T> W(weight, OC, C);
  bool fast = false;
  if constexpr (fast_gemm<T>()) {
    if (N >= kGemmMinRows) {
      if (dinp) gemm_f32(N, C, OC, dout, OC, 1, weight, C, 1, dinp, C, dinp_add);  // dX (+)= dY W
      gemm_f32(OC, C, N, dout, 1, OC, inp, C, 1, dweight, C, true);                // dW += dY^T X
      fast = true;
    }
  }
  if (!fast) {
    if (dinp) {
      MapMat<T> dX(dinp, N, C);
      if (dinp_add) dX.noalias() += dY * W;
      else dX.noalias() = dY * W;
    }
    MapMat<T> dW(dweight, OC, C);
    dW.noalias() += dY.transpose() * X;
  }
  if (dbias) {
    Eigen::Map<RowVec<T>> db(dbias, OC);
    db += dY.colwise().sum();
  }
}
}  // namespace

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                     const T* weight, int N, int C, int OC) {
  backward(dinp, true, dweight, dbias, dout, inp, weight, N, C, OC);
}

template <typename T>
void matmul_backward_overwrite(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                               int C, int OC) {
  backward(dinp, false, dweight, dbias, dout, inp, weight, N, C, OC);
}

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void matmul_forward<Real>(Real*, const Real*, const Real*, const Real*, int, int, int);
template void matmul_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, int, int, int);
template void matmul_backward_overwrite<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, int, int,
                                              int);

}  // namespace cpu
