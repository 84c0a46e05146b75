// tests/emu/test_hw_rounding.cpp: the hardware-rounding mode (tests/emu/hw_rounding.h) rounds as
// the published measurements of the tensor cores say, for inputs chosen so that round-to-nearest,
// truncation, guard bits and the block size each give a different answer; the device math
// functions move by at most their documented ulps, both ways, the same way for one argument.
// The emulated suite passes in the mode (make test runs the kernel and model tests so).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hw_rounding.h"
#include "simt_emulator.h"

namespace {

// c + sum a_k b_k by the tensor-core model
float tc(float c, const std::vector<float>& a, const std::vector<float>& b, int block) {
  return emu::tensor_core_dot(c, a.data(), 1, b.data(), 1, (int)a.size(), block);
}

// distance in ulps between two floats of one sign
int64_t ulps(float x, float y) {
  int32_t i, j;
  std::memcpy(&i, &x, 4);
  std::memcpy(&j, &y, 4);
  return std::llabs((int64_t)i - (int64_t)j);
}

}  // namespace

TEST_CASE("hardware rounding: a tensor-core step is exact products, aligned to the largest term, truncated, no guard bits") {
  const float e24 = std::ldexp(1.f, -24), e23 = std::ldexp(1.f, -23);
  // the product of two bf16 values is exact (1 - 2^-8)^2 = 1 - 2^-7 + 2^-16
  const float below = 1.f - std::ldexp(1.f, -8);
  CHECK(tc(0.f, {below}, {below}, 4) == 1.f - std::ldexp(1.f, -7) + std::ldexp(1.f, -16));
  // truncation, not round-to-nearest: 2 + 0.75 ulp(2) stays 2 (nearest: 2 + ulp), -2 likewise
  CHECK(tc(0.f, {1.f, 1.f}, {2.f, e23 + e24}, 4) == 2.f);
  CHECK(tc(0.f, {1.f, 1.f}, {-2.f, -(e23 + e24)}, 4) == -2.f);
  CHECK(std::fmaf(1.f, e23 + e24, 2.f) == 2.f + std::ldexp(1.f, -22));
  // no guard bits: 1 - (1 - 2^-24) aligned to 1's ulp loses the 2^-24 of the addend
  CHECK(tc(-(1.f - e24), {1.f}, {1.f}, 4) == e23);
  // terms below the largest's last bit vanish, each on its own (exact: 1 + 2^-22)
  CHECK(tc(1.f, {0.5f, 0.5f, 0.5f, 0.5f}, {e23, e23, e23, e23}, 4) == 1.f);
  // the block: four 2^-24 products then 1. In blocks of 4 the small ones are summed exactly in
  // the first step and kept as the accumulator (1 + 2^-22); fused with the 1 in one block of 8
  // they vanish
  const std::vector<float> a = {1.f, 1.f, 1.f, 1.f, 1.f}, b = {e24, e24, e24, e24, 1.f};
  CHECK(tc(0.f, a, b, 4) == 1.f + std::ldexp(1.f, -22));
  CHECK(tc(0.f, a, b, 8) == 1.f);
  CHECK(tc(0.f, a, b, 16) == 1.f);
  // infinities and NaN propagate as in IEEE arithmetic
  CHECK(std::isinf(tc(INFINITY, {1.f}, {1.f}, 4)));
  CHECK(std::isnan(tc(INFINITY, {1.f}, {-INFINITY}, 4)));
}

TEST_CASE("hardware rounding: device math moves by at most its documented ulps, both ways, deterministically") {
  const int before = emu::hw_rounding_block();  // the suite may run in the mode (make test does)
  emu::set_hw_rounding_block(4);
  int up = 0, down = 0;
  for (int i = 0; i < 2000; ++i) {
    const float x = -20.f + 0.0173f * (float)i;
    const float e = gpu::expf(x), e2 = gpu::exp2f(x), c = gpu::erfcf(x * 0.2f);
    CHECK(e == gpu::expf(x));  // one argument, one result
    CHECK(ulps(e, ::expf(x)) <= 2);
    CHECK(ulps(e2, ::exp2f(x)) <= 2);
    CHECK(ulps(c, ::erfcf(x * 0.2f)) <= 4);
    if (x > 0) CHECK(ulps(gpu::logf(x), ::logf(x)) <= 1);
    up += e > ::expf(x), down += e < ::expf(x);
  }
  CHECK(up > 500);
  CHECK(down > 500);
  CHECK(gpu::expf(-200.f) == 0.f);         // never across zero
  CHECK(std::isinf(gpu::expf(200.f)));     // nor from infinity
  emu::set_hw_rounding_block(0);
  CHECK(gpu::expf(0.37f) == ::expf(0.37f));  // off: the host's libm
  emu::set_hw_rounding_block(before);
}
