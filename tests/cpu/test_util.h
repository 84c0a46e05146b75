// tests/cpu/test_util.h: what several CPU test files share: fresh random inputs and the
// central-difference gradient check.
//
// The gradient check. For a scalar loss L(x) (tests use L = sum(out(x) o R) with a fixed
// random R, so every output element contributes) the numerical derivative is the five-point
// central difference
//   g_num = (8 (L(x + h e_k) - L(x - h e_k)) - (L(x + 2h e_k) - L(x - 2h e_k))) / (12 h).
// In double its error has two parts: truncation, h^4/30 |L^(5)| ~ 3e-22 |L^(5)| for h = 1e-5,
// and rounding, ~ 1.5 eps |L| / h ~ 2e-11 |L|. The plain two-point difference had a
// truncation error of h^2/6 |L'''| ~ 2e-11 |L'''|: on the whole model, whose loss is strongly
// curved in some embedding weights, that reached 2e-8 (1.8x the bound below) for one random
// draw in CI, and grew 100x with h = 1e-4 as truncation does. With |L| of order 1..100 on
// these tiny shapes both parts now stay far below
//   |g - g_num| <= rtol (|g| + |g_num|) + atol,   rtol = 1e-6, atol = 1e-9,
// while a wrong term (a missing factor, a sign, an off-by-one index) gives an error of order
// |g| itself and fails.
#pragma once
#include <doctest/doctest.h>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace testutil {

// A fresh seed each run (printed, so a failure can be replayed with TG_TEST_SEED=...).
inline uint64_t run_seed() {
  static uint64_t seed = [] {
    const char* env = std::getenv("TG_TEST_SEED");
    uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("[test_util] TG_TEST_SEED=%llu\n", (unsigned long long)s);
    return s;
  }();
  return seed;
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 g(run_seed());
  return g;
}

// n values uniform in [lo, hi] (never all zeros).
template <typename T = double>
std::vector<T> random_vec(size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = (T)u(rng());
  return v;
}

inline std::vector<int32_t> random_tokens(size_t n, int V) {
  std::uniform_int_distribution<int32_t> u(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = u(rng());
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

constexpr double kGradRtol = 1e-6, kGradAtol = 1e-9, kGradStep = 1e-5;

// Checks analytic[k] against the central difference of loss() in x[k], for every k (or for
// max_checks indices spread over x when x is large). loss() must read x afresh each call.
// Reports the worst element and its index.
inline void check_gradient(const std::string& what, const std::function<double()>& loss,
                           double* x, const double* analytic, size_t n, size_t max_checks = 0) {
  size_t stride = (max_checks && n > max_checks) ? (n + max_checks - 1) / max_checks : 1;
  double worst = 0;
  size_t worst_k = 0;
  double worst_a = 0, worst_n = 0;
  bool ok = true;
  for (size_t k = 0; k < n; k += stride) {
    const double saved = x[k];
    auto at = [&](double dx) {
      x[k] = saved + dx;
      return loss();
    };
    const double h = kGradStep;
    const double num = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
    x[k] = saved;
    double err = std::fabs(analytic[k] - num);
    double bound = kGradRtol * (std::fabs(analytic[k]) + std::fabs(num)) + kGradAtol;
    double ratio = err / bound;
    if (ratio > worst) { worst = ratio; worst_k = k; worst_a = analytic[k]; worst_n = num; }
    if (err > bound) ok = false;
  }
  INFO(what << ": worst element " << worst_k << " of " << n << ": analytic " << worst_a
            << ", numerical " << worst_n << ", error/bound " << worst);
  CHECK(ok);
}

}  // namespace testutil
