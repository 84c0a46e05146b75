// tests/cpu/test_optim.cpp: AdamW and gradient clipping (kernels/cpu/adamw.h) against hand
// computations written out here with the textbook formulas.
#include <cmath>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "tests/cpu/test_util.h"

namespace {

// Three AdamW steps on 4 parameters, by hand in double, against adamw_update<T>.
template <typename T>
void adamw_three_steps(float weight_decay, double tol) {
  const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  const double w0[4] = {0.5, -1.2, 2.0, 0.0};
  const double g[3][4] = {{0.1, -0.3, 0.0, 2.0},  // a zero gradient: no Adam move at step 1
                          {-0.2, 0.25, 0.05, 1.0},
                          {0.3, 0.1, -0.4, -0.5}};

  // The hand computation (the float hyperparameters as the function receives them).
  const double b1 = beta1, b2 = beta2, a = lr, e = eps, wd = weight_decay;
  double w[4], m[4] = {0, 0, 0, 0}, v[4] = {0, 0, 0, 0};
  double want_w[3][4], want_m[3][4], want_v[3][4];
  for (int k = 0; k < 4; ++k) w[k] = w0[k];
  for (int t = 1; t <= 3; ++t) {
    for (int k = 0; k < 4; ++k) {
      const double gk = g[t - 1][k];
      m[k] = b1 * m[k] + (1 - b1) * gk;
      v[k] = b2 * v[k] + (1 - b2) * gk * gk;
      const double mhat = m[k] / (1 - std::pow(b1, t));
      const double vhat = v[k] / (1 - std::pow(b2, t));
      w[k] = w[k] - a * (mhat / (std::sqrt(vhat) + e) + wd * w[k]);
      want_w[t - 1][k] = w[k];
      want_m[t - 1][k] = m[k];
      want_v[t - 1][k] = v[k];
    }
  }

  std::vector<T> p(w0, w0 + 4), mm(4, T(0)), vv(4, T(0)), gr(4);
  for (int t = 1; t <= 3; ++t) {
    for (int k = 0; k < 4; ++k) gr[k] = (T)g[t - 1][k];
    cpu::adamw_update(p.data(), gr.data(), mm.data(), vv.data(), 4, lr, beta1, beta2, eps,
                      weight_decay, t);
    for (int k = 0; k < 4; ++k) {
      CAPTURE(t);
      CAPTURE(k);
      CHECK(p[k] == doctest::Approx(want_w[t - 1][k]).epsilon(tol));
      CHECK(mm[k] == doctest::Approx(want_m[t - 1][k]).epsilon(tol));
      CHECK(vv[k] == doctest::Approx(want_v[t - 1][k]).epsilon(tol));
    }
    if (t == 1) {
      // First step: mhat / sqrt(vhat) = g / |g|, so each weight moves by about lr against the
      // sign of its gradient (plus the decay), and not at all where g = 0.
      for (int k = 0; k < 4; ++k) {
        const double s = g[0][k] > 0 ? 1.0 : (g[0][k] < 0 ? -1.0 : 0.0);
        CHECK((double)p[k] == doctest::Approx(w0[k] - a * (s + wd * w0[k])).epsilon(1e-6));
      }
    }
  }
}

}  // namespace

TEST_CASE("optim: adamw, 3 steps against a hand computation, weight_decay 0") {
  adamw_three_steps<double>(0.0f, 1e-13);
}

TEST_CASE("optim: adamw, 3 steps against a hand computation, weight_decay 0.1") {
  adamw_three_steps<double>(0.1f, 1e-13);
}

TEST_CASE("optim: adamw float instantiation follows the same computation") {
  adamw_three_steps<float>(0.0f, 2e-6);
  adamw_three_steps<float>(0.1f, 2e-6);
}

TEST_CASE("optim: global_norm") {
  const double gd[2] = {3.0, 4.0};
  const float gf[2] = {3.0f, 4.0f};
  CHECK(cpu::global_norm(gd, 2) == 5.0);
  CHECK(cpu::global_norm(gf, 2) == 5.0);
  // Accumulated in double: 2^24 + 1 ones would stall a float sum at 2^24.
  std::vector<float> ones((1u << 24) + 1, 1.0f);
  CHECK(cpu::global_norm(ones.data(), ones.size()) == std::sqrt(16777217.0));
}

TEST_CASE("optim: clip_grad_norm scales to max_norm, leaves small gradients untouched") {
  std::vector<double> g = {3.0, 4.0};
  double f = cpu::clip_grad_norm(g.data(), 2, cpu::global_norm(g.data(), 2), 1.0);
  CHECK(f == doctest::Approx(1.0 / (5.0 + 1e-6)).epsilon(1e-15));
  CHECK(g[0] == doctest::Approx(3.0 / (5.0 + 1e-6)).epsilon(1e-15));
  CHECK(g[1] == doctest::Approx(4.0 / (5.0 + 1e-6)).epsilon(1e-15));
  CHECK(cpu::global_norm(g.data(), 2) == doctest::Approx(1.0).epsilon(1e-6));

  std::vector<float> gf = {3.0f, 4.0f};
  CHECK(cpu::clip_grad_norm(gf.data(), 2, 5.0, 2.0) == doctest::Approx(2.0 / (5.0 + 1e-6)));
  CHECK(gf[0] == doctest::Approx(1.2).epsilon(1e-6));
  CHECK(gf[1] == doctest::Approx(1.6).epsilon(1e-6));

  std::vector<double> small = {0.3, 0.4};
  CHECK(cpu::clip_grad_norm(small.data(), 2, cpu::global_norm(small.data(), 2), 1.0) == 1.0);
  CHECK(small[0] == 0.3);
  CHECK(small[1] == 0.4);
}
