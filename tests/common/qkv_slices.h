// tests/common/qkv_slices.h: helpers the attention tests of every suite share (tests/gpu runs
// the kernels on a device, tests/emu under the SIMT emulator): the q, k or v third of a
// (rows, 3C) buffer, and the largest magnitude of a tensor (the scale tolerances refer to).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace tg_test {

// Columns [part C, (part + 1) C) of every row of a (rows, 3C) buffer: q (0), k (1) or v (2).
inline std::vector<double> qkv_part(const std::vector<double>& a, size_t rows, size_t C, int part) {
  std::vector<double> r(rows * C);
  for (size_t i = 0; i < rows; ++i)
    for (size_t k = 0; k < C; ++k) r[i * C + k] = a[i * 3 * C + part * C + k];
  return r;
}

inline double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace tg_test
