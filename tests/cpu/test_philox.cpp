// tests/cpu/test_philox.cpp: the generator of kernels/philox.h and the CPU dropout built on it.
//   (a) Random123's known-answer vectors for Philox4x32-10;
//   (b) word-for-word equality with cuRAND's host Philox generator (when built with cuRAND);
//   (c) keep fractions, (d) exact thresholds, (e) masks keyed by seed/step/layer/site,
//   (f) dropout_forward values and unbiasedness.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/dropout.h"
#include "kernels/philox.h"
#include "tests/cpu/test_util.h"

#ifdef TG_HAVE_CURAND
#include <curand.h>
#endif

namespace {

void check_words(const philox::U32x4& r, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  CHECK(r.v[0] == a);
  CHECK(r.v[1] == b);
  CHECK(r.v[2] == c);
  CHECK(r.v[3] == d);
}

std::vector<unsigned char> mask_of(const philox::DropoutKey& key, int B, int Tn, int C) {
  std::vector<unsigned char> m((size_t)B * Tn * C);
  cpu::dropout_mask(m.data(), key, B, Tn, C);
  return m;
}

double fraction_kept(const std::vector<unsigned char>& m) {
  size_t k = 0;
  for (unsigned char x : m) k += x;
  return (double)k / (double)m.size();
}

double fraction_different(const std::vector<unsigned char>& a,
                          const std::vector<unsigned char>& b) {
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += a[i] != b[i];
  return (double)d / (double)a.size();
}

}  // namespace

TEST_CASE("philox: Random123 known-answer vectors") {
  using philox::philox4x32_10;
  check_words(philox4x32_10(0, 0, 0, 0, 0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu,
              0x9b00dbd8u);
  check_words(philox4x32_10(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                            0xffffffffu),
              0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
  // The digits-of-pi vector of the same file.
  check_words(philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u,
                            0x299f31d0u),
              0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

// cuRAND's host generator runs 65536 Philox subsequences: output word n = 4 q + w with
// q = 65536 a + s is word w of philox4x32_10({a, 0, s, 0}, {seed lo, seed hi}).
#ifdef TG_HAVE_CURAND
TEST_CASE("philox: equals cuRAND's host PHILOX4_32_10 generator, every word of 2^19") {
  const size_t n = size_t(1) << 19;
  for (uint64_t seed : {uint64_t(1337), uint64_t(0x00c0ffee12345678ull)}) {
    CAPTURE(seed);
    curandGenerator_t g;
    REQUIRE(curandCreateGeneratorHost(&g, CURAND_RNG_PSEUDO_PHILOX4_32_10) ==
            CURAND_STATUS_SUCCESS);
    REQUIRE(curandSetPseudoRandomGeneratorSeed(g, (unsigned long long)seed) ==
            CURAND_STATUS_SUCCESS);
    std::vector<unsigned int> ref(n);
    REQUIRE(curandGenerate(g, ref.data(), n) == CURAND_STATUS_SUCCESS);
    curandDestroyGenerator(g);
    size_t mismatches = 0, first = n;
    for (size_t q = 0; q < n / 4; ++q) {
      const uint32_t a = (uint32_t)(q >> 16), s = (uint32_t)(q & 0xffff);
      const philox::U32x4 r = philox::philox4x32_10(a, 0, s, 0, (uint32_t)seed,
                                                    (uint32_t)(seed >> 32));
      for (int w = 0; w < 4; ++w)
        if (r.v[w] != ref[4 * q + w]) {
          if (!mismatches) first = 4 * q + w;
          ++mismatches;
        }
    }
    INFO("first mismatching word " << first);
    CHECK(mismatches == 0);
  }
}
#else
TEST_CASE("philox: equals cuRAND's host PHILOX4_32_10 generator, every word of 2^19" *
          doctest::skip()) {}
#endif

TEST_CASE("philox: dropout_mask equals dropout_keep element by element") {
  const auto key = philox::make_dropout_key(0xfedcba9876543210ull, 12345, 3, 2, 0.3);
  for (int C : {13, 1027, 64}) {
    const int B = 2, Tn = 7;
    auto m = mask_of(key, B, Tn, C);
    size_t bad = 0;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < Tn; ++t)
        for (int c = 0; c < C; ++c)
          bad += m[((size_t)b * Tn + t) * C + c] != (unsigned char)philox::dropout_keep(key, b, t, c);
    CAPTURE(C);
    CHECK(bad == 0);
  }
}

TEST_CASE("philox: keep fraction is 1 - p") {
  const int B = 4, Tn = 256, C = 1024;  // 2^20 elements
  for (double p : {0.1, 0.2, 0.5, 0.9}) {
    CAPTURE(p);
    const auto key = philox::make_dropout_key(42, 7, 1, philox::kSiteMlp, p);
    CHECK(std::fabs(fraction_kept(mask_of(key, B, Tn, C)) - (1.0 - p)) < 0.01);
  }
  const auto none = philox::make_dropout_key(42, 7, 1, philox::kSiteMlp, 0.0);
  CHECK(fraction_kept(mask_of(none, B, Tn, C)) == 1.0);
}

TEST_CASE("philox: dropout threshold is round(p * 2^32)") {
  for (double p : {0.0, 1e-9, 0.1, 0.17, 0.25, 0.3, 0.5, 0.9, 0.999})
    CHECK(philox::dropout_threshold(p) == (uint32_t)std::llround(p * 4294967296.0));
  // 0.17 * 2^32 = 730144440.32
  CHECK(philox::dropout_threshold(0.17) == 730144440u);
  CHECK(philox::dropout_threshold(0.5) == 2147483648u);
  CHECK(philox::dropout_threshold(1.0) == 4294967295u);  // saturated
  const auto key = philox::make_dropout_key(1, 2, 3, 1, 0.3);
  CHECK(key.threshold == philox::dropout_threshold(0.3));
  CHECK(key.scale == (float)(1.0 / 0.7));
}

TEST_CASE("philox: the attention probabilities' rule, 16 bits a decision and 8 columns a call, as documented") {
  // threshold16 = round(p * 2^16), saturated; 0 for p = 0
  for (double p : {0.0, 1e-9, 0.1, 0.17, 0.2, 0.5, 0.9, 0.999}) {
    CAPTURE(p);
    const auto key = philox::make_dropout_key(1, 2, 3, philox::kSiteAttnProbs, p);
    CHECK(philox::attn_threshold(key) == (uint32_t)std::llround(p * 65536.0));
  }
  CHECK(philox::attn_threshold(philox::make_dropout_key(1, 2, 3, 1, 1.0)) == 65535u);
  CHECK(philox::attn_threshold(philox::make_dropout_key(1, 2, 3, 1, 0.9999999)) == 65535u);
  // keep(bh, i, j) = half j % 2 of word (j % 8) / 2 of philox4x32_10({j / 8, i, bh + row0,
  // (step << 10) | (layer << 3) | site}, seed) >= threshold16, restated here from kernels/philox.h
  auto key = philox::make_dropout_key(0x0123456789abcdefull, 77, 5, philox::kSiteAttnProbs, 0.3);
  key.row0 = 9;
  const uint32_t thr = (uint32_t)std::llround(0.3 * 65536.0);
  size_t bad = 0, kept = 0, n = 0;
  for (uint32_t bh : {0u, 1u, 13u})
    for (uint32_t i = 0; i < 70; ++i)
      for (uint32_t j = 0; j < 300; ++j) {
        const philox::U32x4 r = philox::philox4x32_10(j / 8, i, bh + 9, (77u << 10) | (5u << 3) | 1u, 0x89abcdefu,
                                                      0x01234567u);
        const uint32_t half = (r.v[(j % 8) / 2] >> (16 * (j % 2))) & 0xFFFFu;
        const bool want = half >= thr;
        bad += philox::attn_keep(key, bh, i, j) != want;
        kept += want;
        ++n;
      }
  CHECK(bad == 0);
  CHECK(std::fabs((double)kept / (double)n - 0.7) < 0.01);
  // attn_keep_byte compares each half through the whole word (the high half: word >= thr << 16;
  // the low: word << 16 >= thr << 16): at the halves' edges, beside each half taken apart, for
  // thresholds from 0 to the largest
  const uint32_t edges[] = {0u, 1u, 2u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFEu, 0xFFFFu};
  size_t wrong = 0;
  for (uint32_t t : edges)
    for (uint32_t lo : edges)
      for (uint32_t hi : edges)
        for (uint32_t dt : {0u, 1u, 0xFFFFu}) {
          const uint32_t thr = std::min<uint32_t>(t + (dt == 0xFFFFu ? 0u : dt), 0xFFFFu);
          const uint32_t w = (hi << 16) | lo, other = (lo << 16) | hi;
          const philox::U32x4 r{{w, other, ~w, w ^ 0x00010001u}};
          uint32_t want = 0;
          for (int k = 0; k < 4; ++k)
            want |= ((uint32_t)((r.v[k] & 0xFFFFu) >= thr) | ((uint32_t)((r.v[k] >> 16) >= thr) << 1)) << (2 * k);
          wrong += philox::attn_keep_byte(r, thr) != want;
        }
  CHECK(wrong == 0);
  // p = 0 (threshold 0): every element kept
  const auto none = philox::make_dropout_key(3, 4, 5, philox::kSiteAttnProbs, 0.0);
  for (uint32_t j = 0; j < 64; ++j) CHECK(philox::attn_keep(none, 2, 3, j));
}

TEST_CASE("philox: the mask changes with seed, step, layer, site, position; fixed by the key") {
  const int B = 4, Tn = 64, C = 1024;  // 2^18 elements
  const double p = 0.3, expect = 2 * p * (1 - p);
  const philox::DropoutKey base = philox::make_dropout_key(1234, 5, 2, philox::kSiteAttnProj, p);
  const auto m0 = mask_of(base, B, Tn, C);
  CHECK(m0 == mask_of(base, B, Tn, C));
  CHECK(m0 == mask_of(philox::make_dropout_key(1234, 5, 2, philox::kSiteAttnProj, p), B, Tn, C));

  auto variant = [&](const char* what, philox::DropoutKey k) {
    const double d = fraction_different(m0, mask_of(k, B, Tn, C));
    INFO(what << ": fraction of elements that differ " << d << ", expected " << expect);
    CHECK(std::fabs(d - expect) < 0.01);
  };
  philox::DropoutKey k = base;
  k.seed = base.seed + 1;
  variant("seed + 1", k);
  k = base;
  k.seed = base.seed + (uint64_t(1) << 32);  // the high word of the seed counts too
  variant("seed + 2^32", k);
  k = base;
  k.step = base.step + 1;
  variant("step + 1", k);
  k = base;
  k.layer = base.layer + 1;
  variant("layer + 1", k);
  k = base;
  k.site = philox::kSiteMlp;
  variant("site", k);

  // Different batch rows and positions get different masks.
  const size_t half = m0.size() / 2, row = (size_t)C;
  std::vector<unsigned char> b01(m0.begin(), m0.begin() + half), b23(m0.begin() + half, m0.end());
  CHECK(std::fabs(fraction_different(b01, b23) - expect) < 0.01);
  std::vector<unsigned char> t0(m0.begin(), m0.end() - row), t1(m0.begin() + row, m0.end());
  CHECK(std::fabs(fraction_different(t0, t1) - expect) < 0.01);
}

TEST_CASE("philox: dropout_forward keeps inp * scale exactly, drops to 0, is unbiased") {
  const int B = 4, Tn = 256, C = 1024;
  const size_t N = (size_t)B * Tn * C;
  const auto key = philox::make_dropout_key(777, 9, 0, philox::kSiteEmbedding, 0.3);
  const auto m = mask_of(key, B, Tn, C);
  const auto inp = testutil::random_vec<float>(N, -2, 2);
  std::vector<float> out(N);
  cpu::dropout_forward(out.data(), inp.data(), key, B, Tn, C);
  size_t bad = 0;
  for (size_t i = 0; i < N; ++i) bad += out[i] != (m[i] ? inp[i] * key.scale : 0.0f);
  CHECK(bad == 0);

  // In place (out aliasing inp) gives the same.
  std::vector<float> io = inp;
  cpu::dropout_forward(io.data(), io.data(), key, B, Tn, C);
  CHECK(io == out);

  // A constant input: E[out] = x.
  const float x = 1.5f;
  std::vector<float> cst(N, x), oc(N);
  cpu::dropout_forward(oc.data(), cst.data(), key, B, Tn, C);
  double s = 0;
  for (float v : oc) s += v;
  // std of the mean: x sqrt(p / (1 - p)) / sqrt(N) ~ 1e-3; allow 5x.
  CHECK(std::fabs(s / N - x) < 5e-3);
}
