// tests/emu/hw_rounding.cpp: the hardware-rounding mode of tests/emu/hw_rounding.h.
#include "hw_rounding.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace emu {
namespace {

// tensor_core_dot's arithmetic helpers, inlined into it and, like it, out of the sanitizers' reach
#define TG_EMU_UNCHECKED __attribute__((no_sanitize("address", "undefined"), always_inline)) inline

int g_block = -1;  // -1: not read from the environment yet

// float(d) rounded toward zero (d finite, within fp32's range)
TG_EMU_UNCHECKED float to_float_rz(double d) {
  float f = (float)d;
  if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.f);
  return f;
}

// e with |t| in [2^(e-1), 2^e), for t finite and non-zero (frexp's exponent, from the bits when
// t is normal: a product of two bf16 values or an fp32 accumulator always is)
TG_EMU_UNCHECKED int exponent_of(double t) {
  uint64_t u;
  std::memcpy(&u, &t, sizeof u);
  const int biased = (int)((u >> 52) & 0x7ff);
  if (biased != 0) return biased - 1022;
  int e;
  std::frexp(t, &e);
  return e;
}

// 2^x as a double, for x a normal exponent (-1022 .. 1023)
TG_EMU_UNCHECKED double pow2(int x) {
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

// Out of the sanitizers' reach, as tensor_core_mma below: its own small arrays and the caller's
// rows, by their bounds (their checks were a sixth of the 20-step model test's time in this mode)
__attribute__((no_sanitize("address", "undefined"))) float tensor_core_dot(float c, const float* a, int sa, const float* b,
                                                                         int sb, int n, int block) {
  for (int k0 = 0; k0 < n; k0 += block) {
    const int kn = k0 + block < n ? k0 + block : n;
    // the step's terms: the accumulator and the exact products (bf16 x bf16: 16 significant bits)
    double t[17];
    int nt = 0, emax;
    bool finite = std::isfinite(c);
    t[nt++] = c;
    for (int k = k0; k < kn; ++k) {
      t[nt] = (double)a[(long)k * sa] * (double)b[(long)k * sb];
      finite = finite && std::isfinite(t[nt]);
      ++nt;
    }
    if (!finite) {  // inf or NaN: IEEE propagation
      double s = 0;
      for (int i = 0; i < nt; ++i) s += t[i];
      c = (float)s;
      continue;
    }
    double largest = 0;  // the exponent grows with |t|: the largest term's is the step's
    for (int i = 0; i < nt; ++i) largest = std::fabs(t[i]) > largest ? std::fabs(t[i]) : largest;
    if (largest == 0) {  // all zero
      c = (float)(t[0] + 0.0);
      continue;
    }
    emax = exponent_of(largest);  // |t| in [2^(emax-1), 2^emax) for the largest
    // aligned to the largest: fp32's 24 significant bits below 2^emax, no guard bits; each term
    // truncated there (toward zero), the sum of the truncated terms exact in double. (Scaling by
    // a power of two is exact, and a term's multiple of the unit, below 2^24 in magnitude, is
    // truncated by the conversion to an integer.)
    double s = 0;
    if (emax - 24 >= -1022 && 24 - emax >= -1022) {
      const double unit = pow2(emax - 24), inv = pow2(24 - emax);
      for (int i = 0; i < nt; ++i) s += (double)(int64_t)(t[i] * inv) * unit;
    } else {
      const double unit = std::ldexp(1.0, emax - 24);
      for (int i = 0; i < nt; ++i) s += std::trunc(t[i] / unit) * unit;
    }
    c = std::fabs(s) >= (double)3.4028234663852886e38 ? (float)s : to_float_rz(s);
  }
  return c;
}

// Out of the sanitizers' reach: the loops walk the callers' fixed arrays by their bounds, and
// UBSan's bounds checks kept the k loop from vectorising (a third of an emulated Hopper case's time).
__attribute__((no_sanitize("address", "undefined"))) void tensor_core_mma(float* c, int ldc, const float* a,
                                                                        const float* b, int ldb, int rows, int cols) {
  if (const int block = hw_rounding_block()) {
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < cols; ++j) c[r * ldc + j] = tensor_core_dot(c[r * ldc + j], a + r * 16, 1, b + j, ldb, 16, block);
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
