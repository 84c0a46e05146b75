// kernels/cpu/dropout.cpp: dropout on a (B, T, C) activation, the CPU reference (contract in
// kernels/cpu/dropout.h, generator in kernels/philox.h). Element (b, t, c) is kept when
// philox::dropout_keep(key, b, t, c), i.e. word c % 4 of the Philox block for columns
// 4*(c/4) .. 4*(c/4)+3 is >= key.threshold; so one dropout_words call serves four columns.
// The words of a row are generated into a small buffer first (a loop of Philox calls alone,
// which vectorises), then applied.
//   forward  out  = keep ? inp * scale : 0
//   backward dinp += keep ? dout * scale : 0      (the same mask, regenerated)
// key.threshold == 0 is the identity (copy / plain +=). Rows run in parallel when large.
#include "dropout.h"
#include "real.h"

#include <cstddef>

namespace cpu {

namespace {
constexpr long kParallelMin = 1L << 15;

constexpr int kBlock = 256;  // columns per block of words (a multiple of 4)

// The raw words for columns c0 .. c0+n-1 (c0 a multiple of 4, n <= kBlock) of row (b, t):
// words[k] is the word that decides column c0 + k. One Philox call serves four columns; the
// loop holds nothing but the Philox calls, so the compiler can vectorise it.
inline void row_words(uint32_t* words, const philox::DropoutKey& key, int b, int t, int c0,
                      int n) {
  const philox::DropoutKey k = key;  // a local copy: the stores to words cannot alias it
  const int groups = (n + 3) / 4;
  for (int g = 0; g < groups; ++g) {
    const philox::U32x4 r =
        philox::dropout_words(k, (uint32_t)b, (uint32_t)t, (uint32_t)(c0 + 4 * g));
    words[4 * g + 0] = r.v[0];
    words[4 * g + 1] = r.v[1];
    words[4 * g + 2] = r.v[2];
    words[4 * g + 3] = r.v[3];
  }
}

// Calls f(c0, n, words) for the column blocks of row bt = b * Tn + t.
template <typename F>
inline void for_each_block(const philox::DropoutKey& key, long bt, int Tn, int C, F&& f) {
  alignas(64) uint32_t words[kBlock];
  const int b = (int)(bt / Tn), t = (int)(bt % Tn);
  for (int c0 = 0; c0 < C; c0 += kBlock) {
    const int n = (C - c0 < kBlock) ? C - c0 : kBlock;
    row_words(words, key, b, t, c0, n);
    f(c0, n, words);
  }
}
}  // namespace

template <typename T>
void dropout_forward(T* out, const T* inp, const philox::DropoutKey& key, int B, int Tn,
                     int C) {
  const long rows = (long)B * Tn;
  if (key.threshold == 0) {
    if (out != inp)
      for (size_t i = 0; i < (size_t)rows * C; ++i) out[i] = inp[i];
    return;
  }
  const T scale = (T)key.scale;
#pragma omp parallel for schedule(static) if (rows * C >= kParallelMin)
  for (long bt = 0; bt < rows; ++bt) {
    const T* x = inp + (size_t)bt * C;
    T* o = out + (size_t)bt * C;
    const uint32_t thr = key.threshold;
    for_each_block(key, bt, Tn, C, [&](int c0, int n, const uint32_t* w) {
      for (int k = 0; k < n; ++k) o[c0 + k] = w[k] >= thr ? x[c0 + k] * scale : (T)0;
    });
  }
}

template <typename T>
void dropout_backward(T* dinp, const T* dout, const philox::DropoutKey& key, int B, int Tn,
                      int C) {
  const long rows = (long)B * Tn;
  if (key.threshold == 0) {
    for (size_t i = 0; i < (size_t)rows * C; ++i) dinp[i] += dout[i];
    return;
  }
  const T scale = (T)key.scale;
#pragma omp parallel for schedule(static) if (rows * C >= kParallelMin)
  for (long bt = 0; bt < rows; ++bt) {
    const T* d = dout + (size_t)bt * C;
    T* di = dinp + (size_t)bt * C;
    const uint32_t thr = key.threshold;
    for_each_block(key, bt, Tn, C, [&](int c0, int n, const uint32_t* w) {
      for (int k = 0; k < n; ++k) di[c0 + k] += w[k] >= thr ? d[c0 + k] * scale : (T)0;
    });
  }
}

#ifndef TG_CPU_DOUBLE  // defined once, in the float object
void dropout_mask(unsigned char* mask, const philox::DropoutKey& key, int B, int Tn, int C) {
  const long rows = (long)B * Tn;
#pragma omp parallel for schedule(static) if (rows * C >= kParallelMin)
  for (long bt = 0; bt < rows; ++bt) {
    unsigned char* mk = mask + (size_t)bt * C;
    const uint32_t thr = key.threshold;
    for_each_block(key, bt, Tn, C, [&](int c0, int n, const uint32_t* w) {
      for (int k = 0; k < n; ++k) mk[c0 + k] = w[k] >= thr ? 1 : 0;
    });
  }
}
#endif

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void dropout_forward<Real>(Real*, const Real*, const philox::DropoutKey&, int, int, int);
template void dropout_backward<Real>(Real*, const Real*, const philox::DropoutKey&, int, int, int);

}  // namespace cpu
