// tests/emu/hw_rounding.cpp: the hardware-rounding mode of tests/emu/hw_rounding.h.
#include "hw_rounding.h"

#include "emu_internal.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace emu {
namespace {

// tensor_core_dot's arithmetic helpers, inlined into it and, like it, out of the sanitizers' reach
#define TG_EMU_UNCHECKED_INLINE TG_EMU_UNCHECKED __attribute__((always_inline)) inline

int g_block = -1;  // -1: not read from the environment yet

// float(d) rounded toward zero (d finite, within fp32's range): one step back toward zero where
// the nearest float is larger in magnitude (its bits less one: a finite, non-zero float's next
// smaller magnitude, of either sign)
TG_EMU_UNCHECKED_INLINE float to_float_rz(double d) {
  float f = (float)d;
  if (std::fabs((double)f) > std::fabs(d)) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    --u;
    std::memcpy(&f, &u, sizeof f);
  }
  return f;
}

// e with |t| in [2^(e-1), 2^e), for t finite and non-zero (frexp's exponent, from the bits when
// t is normal: a product of two bf16 values or an fp32 accumulator always is)
TG_EMU_UNCHECKED_INLINE int exponent_of(double t) {
  uint64_t u;
  std::memcpy(&u, &t, sizeof u);
  const int biased = (int)((u >> 52) & 0x7ff);
  if (biased != 0) return biased - 1022;
  int e;
  std::frexp(t, &e);
  return e;
}

// 2^x as a double, for x a normal exponent (-1022 .. 1023)
TG_EMU_UNCHECKED_INLINE double pow2(int x) {
  const uint64_t u = (uint64_t)(x + 1023) << 52;
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
}

}  // namespace

int hw_rounding_block() {
  if (g_block < 0) {
    const char* v = std::getenv("TG_EMU_HW_ROUNDING");
    const int n = v && *v ? std::atoi(v) : 0;
    g_block = n == 1 ? 4 : (n == 4 || n == 8 || n == 16) ? n : 0;
    if (v && *v && std::strcmp(v, "0") != 0 && g_block == 0)
      std::fprintf(stderr, "SIMT emulator: TG_EMU_HW_ROUNDING=%s ignored: expected 1, 4, 8 or 16 (the tensor-core block)\n", v);
  }
  return g_block;
}

void set_hw_rounding_block(int block) { g_block = block; }

namespace {

// The sum of u[0 .. n) pairwise (u overwritten): a short chain of dependent additions, and the
// same value as any other order where every partial sum is exact
template <int N>
TG_EMU_UNCHECKED_INLINE double pairwise_sum(double* u, int n) {
#pragma GCC unroll 17
  for (int w = 1; w < n; w *= 2)
#pragma GCC unroll 17
    for (int i = 0; i + w < n; i += 2 * w) u[i] += u[i + w];
  return u[0];
}

// One step of the accumulation: t[0] the accumulator, t[1 .. nt) the step's exact products
// (bf16 x bf16: 16 significant bits), the sum as the tensor core forms it (nt at most N: a
// full block's N, so that its loops unroll)
template <int N>
TG_EMU_UNCHECKED_INLINE float accumulate_step(const double* t, int nt = N) {
  bool finite = true;
#pragma GCC unroll 17
  for (int i = 0; i < nt; ++i) finite &= std::fabs(t[i]) <= 1.7976931348623157e308;
  if (!finite) {  // inf or NaN: IEEE propagation
    double s = 0;
    for (int i = 0; i < nt; ++i) s += t[i];
    return (float)s;
  }
  double u[N];
#pragma GCC unroll 17
  for (int i = 0; i < nt; ++i) u[i] = std::fabs(t[i]);
  // the exponent grows with |t|: the largest term's is the step's
#pragma GCC unroll 17
  for (int w = 1; w < nt; w *= 2)
#pragma GCC unroll 17
    for (int i = 0; i + w < nt; i += 2 * w) u[i] = u[i + w] > u[i] ? u[i + w] : u[i];
  const double largest = u[0];
  if (largest == 0) return (float)(t[0] + 0.0);  // all zero
  const int emax = exponent_of(largest);  // |t| in [2^(emax-1), 2^emax) for the largest
  // aligned to the largest: fp32's 24 significant bits below 2^emax, no guard bits; each term
  // truncated there (toward zero). (Scaling by a power of two is exact, and a term's multiple of
  // the unit, below 2^24 in magnitude, is truncated by the conversion to an integer.) The
  // truncated terms are multiples of the unit below 2^24 of it, so their sum is exact in double
  // in any order: summed pairwise.
  if (emax - 24 >= -1022 && 24 - emax >= -1022) {
    const double unit = pow2(emax - 24), inv = pow2(24 - emax);
#pragma GCC unroll 17
    for (int i = 0; i < nt; ++i) u[i] = (double)(int64_t)(t[i] * inv) * unit;
  } else {
    const double unit = std::ldexp(1.0, emax - 24);
#pragma GCC unroll 17
    for (int i = 0; i < nt; ++i) u[i] = std::trunc(t[i] / unit) * unit;
  }
  const double s = pairwise_sum<N>(u, nt);
  return std::fabs(s) >= (double)3.4028234663852886e38 ? (float)s : to_float_rz(s);
}

// W dot products that share a, c[w] += a . b_w (b_w = b + w bw), each in blocks of B products
// (the last one short where n is not a multiple of B). A full block's loops unroll, and the W
// independent steps sit side by side, so the processor overlaps their chains of dependent
// operations.
template <int B, int W>
TG_EMU_UNCHECKED_INLINE void dots_in_blocks(float* c, const float* a, long sa, const float* b, long bw, long sb, int n) {
  double t[W][B + 1];
  for (int k0 = 0; k0 < n; k0 += B) {
    const int kn = n - k0 < B ? n - k0 : B;
    for (int w = 0; w < W; ++w) {
      t[w][0] = c[w];
      for (int k = 0; k < kn; ++k) t[w][k + 1] = (double)a[(k0 + k) * sa] * (double)b[w * bw + (k0 + k) * sb];
    }
    if (kn == B)
      for (int w = 0; w < W; ++w) c[w] = accumulate_step<B + 1>(t[w]);
    else
      for (int w = 0; w < W; ++w) c[w] = accumulate_step<B + 1>(t[w], kn + 1);
  }
}

template <int B>
TG_EMU_UNCHECKED_INLINE void dots(float* c, int count, const float* a, long sa, const float* b, long bw, long sb, int n) {
  int w = 0;
  for (; w + 4 <= count; w += 4) dots_in_blocks<B, 4>(c + w, a, sa, b + w * bw, bw, sb, n);
  for (; w < count; ++w) dots_in_blocks<B, 1>(c + w, a, sa, b + w * bw, bw, sb, n);
}

}  // namespace

// Out of the sanitizers' reach, as tensor_core_mma below: its own small arrays and the caller's
// rows, by their bounds (their checks were a sixth of the 20-step model test's time in this mode).
TG_EMU_UNCHECKED void tensor_core_dots(float* c, int count, const float* a, int sa, const float* b, long bw, int sb,
                                        int n, int block) {
  switch (block) {
    case 4: return dots<4>(c, count, a, sa, b, bw, sb, n);
    case 8: return dots<8>(c, count, a, sa, b, bw, sb, n);
    case 16: return dots<16>(c, count, a, sa, b, bw, sb, n);
  }
  std::fprintf(stderr, "SIMT emulator: tensor-core block %d: expected 4, 8 or 16\n", block);
  std::abort();
}

float tensor_core_dot(float c, const float* a, int sa, const float* b, int sb, int n, int block) {
  tensor_core_dots(&c, 1, a, sa, b, 0, sb, n, block);
  return c;
}

// Out of the sanitizers' reach: the loops walk the callers' fixed arrays by their bounds, and
// UBSan's bounds checks kept the k loop from vectorising (a third of an emulated Hopper case's time).
TG_EMU_UNCHECKED void tensor_core_mma(float* c, int ldc, const float* a, const float* b, int ldb, int rows,
                                       int cols) {
  if (const int block = hw_rounding_block()) {
    for (int r = 0; r < rows; ++r) tensor_core_dots(c + r * ldc, cols, a + r * 16, 1, b, 1, ldb, 16, block);
    return;
  }
  for (int r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    for (int k = 0; k < 16; ++k) {
      const float ar = a[r * 16 + k];
      const float* bk = b + k * ldb;
      for (int j = 0; j < cols; ++j) cr[j] = std::fmaf(ar, bk[j], cr[j]);
    }
  }
}

float device_math(float f, float x, int max_ulp, uint32_t fn) {
  if (!std::isfinite(f) || f == 0.f) return f;
  uint32_t h;
  std::memcpy(&h, &x, sizeof h);
  h ^= fn * 0x9E3779B9u;  // a 32-bit mix (murmur3's finaliser) of the function and the argument
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  const float toward = (h & 1) ? INFINITY : -INFINITY;
  float g = f;
  for (int i = 0; i < max_ulp; ++i) g = std::nextafter(g, toward);
  // never across zero or to infinity: the bound is relative to a finite, non-zero result
  if (!std::isfinite(g) || g == 0.f || std::signbit(g) != std::signbit(f)) return f;
  return g;
}

}  // namespace emu
