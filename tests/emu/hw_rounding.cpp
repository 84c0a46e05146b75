// tests/emu/hw_rounding.cpp: the hardware-rounding mode of tests/emu/hw_rounding.h.
#include "hw_rounding.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace emu {
namespace {

int g_block = -1;  // -1: not read from the environment yet

// float(d) rounded toward zero (d finite, within fp32's range)
float to_float_rz(double d) {
  float f = (float)d;
  if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.f);
  return f;
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

float tensor_core_dot(float c, const float* a, int sa, const float* b, int sb, int n, int block) {
  for (int k0 = 0; k0 < n; k0 += block) {
    const int kn = k0 + block < n ? k0 + block : n;
    // the step's terms: the accumulator and the exact products (bf16 x bf16: 16 significant bits)
    double t[17];
    int nt = 0, emax = INT32_MIN;
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
    for (int i = 0; i < nt; ++i)
      if (t[i] != 0) {
        int e;
        std::frexp(t[i], &e);  // |t| in [2^(e-1), 2^e)
        if (e > emax) emax = e;
      }
    if (emax == INT32_MIN) {  // all zero
      c = (float)(t[0] + 0.0);
      continue;
    }
    // aligned to the largest: fp32's 24 significant bits below 2^emax, no guard bits; each term
    // truncated there (toward zero), the sum of the truncated terms exact in double
    const double unit = std::ldexp(1.0, emax - 24);
    double s = 0;
    for (int i = 0; i < nt; ++i) s += std::trunc(t[i] / unit) * unit;
    c = std::fabs(s) >= (double)3.4028234663852886e38 ? (float)s : to_float_rz(s);
  }
  return c;
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
