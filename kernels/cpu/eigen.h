// kernels/cpu/eigen.h: Eigen for the CPU reference, included in one place: row-major matrix
// types and maps of raw buffers (no copies). Only .cpp files of kernels/cpu include it; Eigen
// stays out of .cu files.
#pragma once

// Eigen 3.4's AVX-512 packet code trips GCC 12's -Wmaybe-uninitialized / -Wunused-variable
// inside Eigen's own headers; silenced for those headers only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wunused-variable"
#include <Eigen/Core>
#pragma GCC diagnostic pop

namespace cpu {

template <typename T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using RowVec = Eigen::Matrix<T, 1, Eigen::Dynamic>;
template <typename T>
using MapMat = Eigen::Map<RowMat<T>>;
template <typename T>
using MapConstMat = Eigen::Map<const RowMat<T>>;
// A (rows, cols) block of a row-major buffer whose rows are ld elements apart (a head's
// slice of qkv or out).
template <typename T>
using StridedMat = Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using StridedConstMat = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;

}  // namespace cpu
