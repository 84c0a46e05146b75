// kernels/cpu/matmul.cpp: the linear layer y = x W^T + b, the CPU reference (contract in
// kernels/cpu/matmul.h). With X (N, C), W (OC, C), Y (N, OC), all row-major:
//   forward   Y = X W^T + 1 b^T
//   backward  dX += dY W,   dW += dY^T X,   db += column sums of dY.
// The buffers are viewed in place as row-major Eigen matrices (Eigen::Map, no copies) and the
// products go to Eigen's blocked GEMM, which is multi-threaded through OpenMP when the
// project is built with -fopenmp. .noalias() writes the product straight into the output.
#include "matmul.h"

#include "eigen.h"

namespace cpu {

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C,
                    int OC) {
  MapMat<T> Y(out, N, OC);
  MapConstMat<T> X(inp, N, C);
  MapConstMat<T> W(weight, OC, C);
  Y.noalias() = X * W.transpose();
  if (bias) Y.rowwise() += Eigen::Map<const RowVec<T>>(bias, OC);
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                     const T* weight, int N, int C, int OC) {
  MapConstMat<T> dY(dout, N, OC);
  MapConstMat<T> X(inp, N, C);
  MapConstMat<T> W(weight, OC, C);
  if (dinp) {
    MapMat<T> dX(dinp, N, C);
    dX.noalias() += dY * W;
  }
  MapMat<T> dW(dweight, OC, C);
  dW.noalias() += dY.transpose() * X;
  if (dbias) {
    Eigen::Map<RowVec<T>> db(dbias, OC);
    db += dY.colwise().sum();
  }
}

// float for train_gpt; double, for the tests' gradient checks, in the objects the Makefile
// compiles from this file with TG_CPU_DOUBLE (CPU_DOUBLE_OBJS), linked into the tests only
#ifndef TG_CPU_DOUBLE
template void matmul_forward<float>(float*, const float*, const float*, const float*, int, int,
                                    int);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*,
                                     const float*, int, int, int);
#else
template void matmul_forward<double>(double*, const double*, const double*, const double*, int,
                                     int, int);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*,
                                      const double*, int, int, int);
#endif

}  // namespace cpu
