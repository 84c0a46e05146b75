// tests/cpu/test_ops.cpp: the CPU reference ops (kernels/cpu/*.h) checked in double.
//   - every input gradient of every op against central differences (testutil::check_gradient)
//     of L = dot(out, R) with a fixed random R, on odd shapes;
//   - forward values against independent hand computations (layernorm, cross-entropy, gelu);
//   - backward accumulates: two calls give twice the gradient;
//   - the float instantiation agrees with the double one (matmul, layernorm).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/residual.h"
#include "kernels/philox.h"
#include "tests/cpu/test_util.h"

using testutil::check_gradient;
using testutil::dot;
using testutil::random_vec;
using Vec = std::vector<double>;

namespace {

// |a - b| <= rtol * (|a| + |b|) + atol for every element; reports the worst one.
void check_close(const char* what, const Vec& a, const Vec& b, double rtol = 1e-12,
                 double atol = 1e-14) {
  REQUIRE(a.size() == b.size());
  size_t bad = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::fabs(a[i] - b[i]) > rtol * (std::fabs(a[i]) + std::fabs(b[i])) + atol) {
      bad = i;
      break;
    }
  INFO(what << ": first mismatch at " << bad << " of " << a.size() << ": "
            << (bad < a.size() ? a[bad] : 0.0) << " vs " << (bad < a.size() ? b[bad] : 0.0));
  CHECK(bad == a.size());
}

Vec scaled(const Vec& v, double s) {
  Vec r(v);
  for (auto& x : r) x *= s;
  return r;
}

// max |f - d| / max |d|: the float instantiation against the double one.
double rel_diff(const std::vector<float>& f, const Vec& d) {
  double num = 0, den = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    num = std::max(num, std::fabs((double)f[i] - d[i]));
    den = std::max(den, std::fabs(d[i]));
  }
  return num / den;
}

std::vector<float> to_float(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

// For the large shapes the loss is a sum of tens of thousands of terms, |L| ~ 100, and its
// rounding to double alone (eps |L| / h ~ 1e-9 in the central difference) would exceed
// check_gradient's atol on near-zero gradients. So there L is accumulated in long double and
// reported relative to its value at the unperturbed inputs: L(x) - L(x0) has the same
// derivative and is tiny, so rounding it to double costs nothing.
long double long_dot(const Vec& a, const Vec& b) {
  long double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (long double)a[i] * b[i];
  return s;
}

std::function<double()> centered(std::function<long double()> raw) {
  const long double base = raw();
  return [raw, base] { return (double)(raw() - base); };
}

}  // namespace

// ---- encoder -------------------------------------------------------------------------------

TEST_CASE("ops: encoder gradients (dwte with repeated tokens, dwpe)") {
  const int B = 2, Tn = 7, C = 13, V = 5, maxT = 9;
  auto inp = testutil::random_tokens((size_t)B * Tn, V);
  inp[3] = inp[0];  // repeated tokens for certain (14 tokens over V = 5 repeat anyway)
  inp[Tn + 4] = inp[0];
  Vec wte = random_vec(V * C), wpe = random_vec(maxT * C), R = random_vec(B * Tn * C);
  Vec out(B * Tn * C);
  auto loss = [&] {
    cpu::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, Tn, C);
    return dot(out, R);
  };
  Vec dwte(V * C, 0.0), dwpe(maxT * C, 0.0);
  cpu::encoder_backward(dwte.data(), dwpe.data(), R.data(), inp.data(), B, Tn, C);
  check_gradient("encoder dwte", loss, wte.data(), dwte.data(), wte.size());
  check_gradient("encoder dwpe", loss, wpe.data(), dwpe.data(), wpe.size());

  // Forward by hand for one element; backward accumulates.
  loss();
  CHECK(out[(1 * Tn + 4) * C + 6] == wte[inp[Tn + 4] * C + 6] + wpe[4 * C + 6]);
  Vec dwte2 = dwte, dwpe2 = dwpe;
  cpu::encoder_backward(dwte2.data(), dwpe2.data(), R.data(), inp.data(), B, Tn, C);
  check_close("encoder dwte accumulates", dwte2, scaled(dwte, 2));
  check_close("encoder dwpe accumulates", dwpe2, scaled(dwpe, 2));
}

// ---- layernorm -----------------------------------------------------------------------------

static void layernorm_gradients(bool with_bias, int N, int C, size_t max_checks) {
  Vec inp = random_vec(N * C, -2, 2), w = random_vec(C, 0.5, 1.5), b = random_vec(C);
  Vec R = random_vec(N * C);
  const double* bias = with_bias ? b.data() : nullptr;
  Vec out(N * C), mean(N), rstd(N);
  auto loss = centered([&] {
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bias, N,
                           C);
    return long_dot(out, R);
  });
  Vec dinp(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
  double* dbias = with_bias ? db.data() : nullptr;
  cpu::layernorm_backward(dinp.data(), dw.data(), dbias, R.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  check_gradient("layernorm dinp", loss, inp.data(), dinp.data(), inp.size(), max_checks);
  check_gradient("layernorm dweight", loss, w.data(), dw.data(), w.size(), max_checks);
  if (with_bias) check_gradient("layernorm dbias", loss, b.data(), db.data(), b.size());
  else CHECK(std::all_of(db.begin(), db.end(), [](double x) { return x == 0.0; }));

  loss();  // mean, rstd at the unperturbed input again
  Vec dinp2 = dinp, dw2 = dw, db2 = db;
  cpu::layernorm_backward(dinp2.data(), dw2.data(), with_bias ? db2.data() : nullptr, R.data(),
                          inp.data(), w.data(), mean.data(), rstd.data(), N, C);
  check_close("layernorm dinp accumulates", dinp2, scaled(dinp, 2));
  check_close("layernorm dweight accumulates", dw2, scaled(dw, 2));
  check_close("layernorm dbias accumulates", db2, scaled(db, 2));
}

TEST_CASE("ops: layernorm gradients with bias") { layernorm_gradients(true, 14, 13, 0); }
TEST_CASE("ops: layernorm gradients with bias = null") { layernorm_gradients(false, 14, 13, 0); }
TEST_CASE("ops: layernorm gradients, large (OpenMP rows)") {
  layernorm_gradients(true, 300, 129, 97);
}

TEST_CASE("ops: layernorm forward against a hand computation") {
  const int N = 5, C = 13;
  Vec inp = random_vec(N * C, -3, 5), ones(C, 1.0), zeros(C, 0.0);
  Vec w = random_vec(C), b = random_vec(C);
  Vec out(N * C), mean(N), rstd(N), out2(N * C);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), ones.data(),
                         zeros.data(), N, C);
  cpu::layernorm_forward(out2.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(),
                         N, C);
  for (int n = 0; n < N; ++n) {
    const double* x = &inp[n * C];
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;  // biased, as PyTorch
    CHECK(mean[n] == doctest::Approx(m).epsilon(1e-13));
    CHECK(rstd[n] == doctest::Approx(1.0 / std::sqrt(v + 1e-5)).epsilon(1e-13));
    // Before the affine map: mean 0, variance v / (v + eps) (i.e. 1 up to eps).
    double om = 0, ov = 0;
    for (int c = 0; c < C; ++c) om += out[n * C + c];
    om /= C;
    for (int c = 0; c < C; ++c) ov += (out[n * C + c] - om) * (out[n * C + c] - om);
    ov /= C;
    CHECK(std::fabs(om) < 1e-14);
    CHECK(ov == doctest::Approx(v / (v + 1e-5)).epsilon(1e-12));
    CHECK(std::fabs(ov - 1.0) < 1e-4);
    for (int c = 0; c < C; ++c)
      CHECK(out2[n * C + c] ==
            doctest::Approx((x[c] - m) / std::sqrt(v + 1e-5) * w[c] + b[c]).epsilon(1e-12));
  }
}

// ---- matmul --------------------------------------------------------------------------------

static void matmul_gradients(bool with_bias) {
  const int N = 14, C = 13, OC = 5;
  Vec inp = random_vec(N * C), w = random_vec(OC * C), b = random_vec(OC), R = random_vec(N * OC);
  const double* bias = with_bias ? b.data() : nullptr;
  Vec out(N * OC);
  auto loss = [&] {
    cpu::matmul_forward(out.data(), inp.data(), w.data(), bias, N, C, OC);
    return dot(out, R);
  };
  Vec dinp(N * C, 0.0), dw(OC * C, 0.0), db(OC, 0.0);
  double* dbias = with_bias ? db.data() : nullptr;
  cpu::matmul_backward(dinp.data(), dw.data(), dbias, R.data(), inp.data(), w.data(), N, C, OC);
  check_gradient("matmul dinp", loss, inp.data(), dinp.data(), inp.size());
  check_gradient("matmul dweight", loss, w.data(), dw.data(), w.size());
  if (with_bias) check_gradient("matmul dbias", loss, b.data(), db.data(), b.size());
  else CHECK(std::all_of(db.begin(), db.end(), [](double x) { return x == 0.0; }));

  // Forward by hand.
  loss();
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = with_bias ? b[o] : 0.0;
      for (int c = 0; c < C; ++c) s += inp[n * C + c] * w[o * C + c];
      CHECK(out[n * OC + o] == doctest::Approx(s).epsilon(1e-13));
    }

  Vec dinp2 = dinp, dw2 = dw, db2 = db;
  cpu::matmul_backward(dinp2.data(), dw2.data(), with_bias ? db2.data() : nullptr, R.data(),
                       inp.data(), w.data(), N, C, OC);
  check_close("matmul dinp accumulates", dinp2, scaled(dinp, 2));
  check_close("matmul dweight accumulates", dw2, scaled(dw, 2));
  check_close("matmul dbias accumulates", db2, scaled(db, 2));

  // dinp = null: no input gradient, the same weight gradient.
  Vec dw3(OC * C, 0.0), db3(OC, 0.0);
  cpu::matmul_backward<double>(nullptr, dw3.data(), with_bias ? db3.data() : nullptr, R.data(),
                               inp.data(), w.data(), N, C, OC);
  check_close("matmul dweight with dinp = null", dw3, dw);
}

TEST_CASE("ops: matmul gradients with bias") { matmul_gradients(true); }
TEST_CASE("ops: matmul gradients without bias") { matmul_gradients(false); }

// ---- gelu ----------------------------------------------------------------------------------

TEST_CASE("ops: gelu gradient and values") {
  const size_t N = 91;
  Vec inp = random_vec(N, -4, 4), R = random_vec(N), out(N);
  auto loss = [&] {
    cpu::gelu_forward(out.data(), inp.data(), N);
    return dot(out, R);
  };
  Vec dinp(N, 0.0);
  cpu::gelu_backward(dinp.data(), inp.data(), R.data(), N);
  check_gradient("gelu dinp", loss, inp.data(), dinp.data(), N);
  Vec dinp2 = dinp;
  cpu::gelu_backward(dinp2.data(), inp.data(), R.data(), N);
  check_close("gelu dinp accumulates", dinp2, scaled(dinp, 2));

  // Reference values of the tanh form (0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))).
  Vec x = {1.0, -1.0, 2.0, 0.0}, y(4);
  cpu::gelu_forward(y.data(), x.data(), 4);
  CHECK(y[0] == doctest::Approx(0.8411919906082768).epsilon(1e-14));
  CHECK(y[1] == doctest::Approx(-0.15880800939172324).epsilon(1e-14));
  CHECK(y[2] == doctest::Approx(1.954597694087775).epsilon(1e-14));
  CHECK(y[3] == 0.0);

  // Every input against the tanh formula written out here, far tails included (exp(-2u)
  // overflows for x << 0: the result must stay finite, ~0, with a finite gradient).
  Vec xs = random_vec(200, -6, 6);
  for (double t : {-200.0, -30.0, -9.0, 9.0, 30.0, 200.0}) xs.push_back(t);
  Vec ys(xs.size()), gs(xs.size(), 0.0), ones(xs.size(), 1.0);
  cpu::gelu_forward(ys.data(), xs.data(), xs.size());
  cpu::gelu_backward(gs.data(), xs.data(), ones.data(), xs.size());
  const double s = std::sqrt(2.0 / std::acos(-1.0));
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x0 = xs[i], th = std::tanh(s * (x0 + 0.044715 * x0 * x0 * x0));
    const double want = 0.5 * x0 * (1.0 + th);
    const double dwant = 0.5 * (1.0 + th) +
                         0.5 * x0 * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x0 * x0);
    CAPTURE(x0);
    CHECK(std::isfinite(ys[i]));
    CHECK(std::isfinite(gs[i]));
    CHECK(std::fabs(ys[i] - want) <= 1e-14 * std::fabs(want) + 1e-15);
    CHECK(std::fabs(gs[i] - dwant) <= 1e-13 * std::fabs(dwant) + 1e-14);
  }
}

TEST_CASE("ops: gelu, erf form: gradient and values") {
  const size_t N = 91;
  Vec inp = random_vec(N, -4, 4), R = random_vec(N), out(N);
  auto loss = [&] {
    cpu::gelu_forward(out.data(), inp.data(), N, GeluForm::Erf);
    return dot(out, R);
  };
  Vec dinp(N, 0.0);
  cpu::gelu_backward(dinp.data(), inp.data(), R.data(), N, GeluForm::Erf);
  check_gradient("gelu (erf) dinp", loss, inp.data(), dinp.data(), N);
  // x Phi(x), Phi the standard normal CDF: Phi(1) = 0.8413447460685429, Phi(2) = 0.9772498680518208
  Vec x = {1.0, -1.0, 2.0, 0.0, -8.0}, y(5);
  cpu::gelu_forward(y.data(), x.data(), 5, GeluForm::Erf);
  CHECK(y[0] == doctest::Approx(0.8413447460685429).epsilon(1e-14));
  CHECK(y[1] == doctest::Approx(-0.15865525393145707).epsilon(1e-14));
  CHECK(y[2] == doctest::Approx(1.9544997361036416).epsilon(1e-14));
  CHECK(y[3] == 0.0);
  CHECK(y[4] == doctest::Approx(-8.0 * 6.220960574271785e-16).epsilon(1e-12));  // no cancellation far left
  // the two forms differ (by about 1e-4 at x = 2): they are different functions
  Vec t(5);
  cpu::gelu_forward(t.data(), x.data(), 5);
  CHECK(std::fabs(t[2] - y[2]) > 5e-5);
}

TEST_CASE("ops: gelu gradient, large (OpenMP)") {
  const size_t N = 40000;
  Vec inp = random_vec(N, -4, 4), R = random_vec(N), out(N);
  auto loss = centered([&] {
    cpu::gelu_forward(out.data(), inp.data(), N);
    return long_dot(out, R);
  });
  Vec dinp(N, 0.0);
  cpu::gelu_backward(dinp.data(), inp.data(), R.data(), N);
  check_gradient("gelu dinp (large)", loss, inp.data(), dinp.data(), N, 101);
}

// ---- residual ------------------------------------------------------------------------------

TEST_CASE("ops: residual gradients, aliasing") {
  const size_t N = 2 * 7 * 13;
  Vec a = random_vec(N), b = random_vec(N), R = random_vec(N), out(N);
  auto loss = [&] {
    cpu::residual_forward(out.data(), a.data(), b.data(), N);
    return dot(out, R);
  };
  Vec da(N, 0.0), db(N, 0.0);
  cpu::residual_backward(da.data(), db.data(), R.data(), N);
  check_gradient("residual dinp1", loss, a.data(), da.data(), N);
  check_gradient("residual dinp2", loss, b.data(), db.data(), N);
  cpu::residual_backward(da.data(), db.data(), R.data(), N);
  check_close("residual dinp1 accumulates", da, scaled(R, 2));
  check_close("residual dinp2 accumulates", db, scaled(R, 2));

  // dinp1 == dinp2: the shared buffer gets dout twice (the gradient of out = x + x).
  Vec dx(N, 0.0);
  cpu::residual_backward(dx.data(), dx.data(), R.data(), N);
  check_close("residual aliased dinp", dx, scaled(R, 2));
  auto loss_xx = [&] {
    cpu::residual_forward(out.data(), a.data(), a.data(), N);
    return dot(out, R);
  };
  check_gradient("residual out = x + x", loss_xx, a.data(), dx.data(), N);

  // out aliasing inp1 (the in-place residual stream).
  Vec s = a;
  cpu::residual_forward(s.data(), s.data(), b.data(), N);
  for (size_t i = 0; i < N; ++i) CHECK(s[i] == a[i] + b[i]);
}

// ---- dropout -------------------------------------------------------------------------------

TEST_CASE("ops: dropout gradient through the fixed mask (p = 0.3)") {
  const int B = 2, Tn = 7, C = 13;
  const size_t N = (size_t)B * Tn * C;
  const auto key = philox::make_dropout_key(0x1234567890abull, 17, 2, philox::kSiteMlp, 0.3);
  Vec inp = random_vec(N), R = random_vec(N), out(N);
  auto loss = [&] {
    cpu::dropout_forward(out.data(), inp.data(), key, B, Tn, C);
    return dot(out, R);
  };
  Vec dinp(N, 0.0);
  cpu::dropout_backward(dinp.data(), R.data(), key, B, Tn, C);
  check_gradient("dropout dinp", loss, inp.data(), dinp.data(), N);
  Vec dinp2 = dinp;
  cpu::dropout_backward(dinp2.data(), R.data(), key, B, Tn, C);
  check_close("dropout dinp accumulates", dinp2, scaled(dinp, 2));

  // The mask really drops something here, and the values follow it.
  std::vector<unsigned char> mask(N);
  cpu::dropout_mask(mask.data(), key, B, Tn, C);
  size_t dropped = 0;
  loss();
  for (size_t i = 0; i < N; ++i) {
    dropped += !mask[i];
    CHECK(out[i] == (mask[i] ? inp[i] * (double)key.scale : 0.0));
  }
  CHECK(dropped > N / 10);
  CHECK(dropped < N / 2);

  // p = 0 (threshold 0): identity forward, plain += backward.
  const auto none = philox::make_dropout_key(1, 1, 0, philox::kSiteMlp, 0.0);
  REQUIRE(none.threshold == 0u);
  cpu::dropout_forward(out.data(), inp.data(), none, B, Tn, C);
  CHECK(out == inp);
  Vec d0 = inp;
  cpu::dropout_backward(d0.data(), R.data(), none, B, Tn, C);
  for (size_t i = 0; i < N; ++i) CHECK(d0[i] == inp[i] + R[i]);
}

TEST_CASE("ops: dropout gradient, large (OpenMP rows, C % 4 != 0)") {
  const int B = 3, Tn = 101, C = 131;
  const size_t N = (size_t)B * Tn * C;
  const auto key = philox::make_dropout_key(99, 3, 1, philox::kSiteAttnProj, 0.3);
  Vec inp = random_vec(N), R = random_vec(N), out(N);
  auto loss = centered([&] {
    cpu::dropout_forward(out.data(), inp.data(), key, B, Tn, C);
    return long_dot(out, R);
  });
  Vec dinp(N, 0.0);
  cpu::dropout_backward(dinp.data(), R.data(), key, B, Tn, C);
  check_gradient("dropout dinp (large)", loss, inp.data(), dinp.data(), N, 211);
}

// ---- cross-entropy -------------------------------------------------------------------------

static void cross_entropy_gradients(int N, int V, double dloss, size_t max_checks) {
  Vec logits = random_vec(N * V, -3, 3);
  auto targets = testutil::random_tokens(N, V);
  Vec losses(N);
  auto loss = centered([&] {
    cpu::cross_entropy_forward(losses.data(), logits.data(), targets.data(), N, V);
    long double s = 0;
    for (double l : losses) s += l;
    return s * dloss;
  });
  Vec losses2(N), dlogits(N * V, 123.0);  // overwritten, not accumulated
  cpu::cross_entropy_forward_backward(losses2.data(), dlogits.data(), logits.data(),
                                      targets.data(), dloss, N, V);
  loss();
  check_close("cross_entropy losses of forward_backward", losses2, losses);
  check_gradient("cross_entropy dlogits", loss, logits.data(), dlogits.data(), logits.size(),
                 max_checks);
}

TEST_CASE("ops: cross_entropy dlogits") { cross_entropy_gradients(14, 11, 0.37, 0); }
TEST_CASE("ops: cross_entropy dlogits, large (OpenMP rows)") {
  cross_entropy_gradients(300, 129, 1.0 / 300, 157);  // the mean loss
}

TEST_CASE("ops: cross_entropy forward against a hand computation, stable") {
  // logits (1, 2, 3), target 0: loss = log(e + e^2 + e^3) - 1 = 2.40760596444438...
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0), S = e1 + e2 + e3;
  Vec logits = {1, 2, 3}, loss(1), dlogits(3);
  std::vector<int32_t> target = {0};
  cpu::cross_entropy_forward(loss.data(), logits.data(), target.data(), 1, 3);
  CHECK(loss[0] == doctest::Approx(std::log(S) - 1.0).epsilon(1e-14));
  CHECK(loss[0] == doctest::Approx(2.40760596444438).epsilon(1e-13));
  cpu::cross_entropy_forward_backward(loss.data(), dlogits.data(), logits.data(), target.data(),
                                      0.5, 1, 3);
  CHECK(dlogits[0] == doctest::Approx((e1 / S - 1.0) * 0.5).epsilon(1e-14));
  CHECK(dlogits[1] == doctest::Approx(e2 / S * 0.5).epsilon(1e-14));
  CHECK(dlogits[2] == doctest::Approx(e3 / S * 0.5).epsilon(1e-14));

  // Shifted by 1000 (exp overflows without the max subtraction): same loss and gradient.
  Vec big = {1001, 1002, 1003}, lb(1), db(3);
  cpu::cross_entropy_forward_backward(lb.data(), db.data(), big.data(), target.data(), 0.5, 1,
                                      3);
  CHECK(std::isfinite(lb[0]));
  CHECK(lb[0] == doctest::Approx(loss[0]).epsilon(1e-12));
  for (int v = 0; v < 3; ++v) CHECK(db[v] == doctest::Approx(dlogits[v]).epsilon(1e-12));
  std::vector<float> bigf = {1001.f, 1002.f, 1003.f}, lf(1);
  cpu::cross_entropy_forward(lf.data(), bigf.data(), target.data(), 1, 3);
  CHECK(lf[0] == doctest::Approx(loss[0]).epsilon(1e-6));
}

// ---- float instantiation -------------------------------------------------------------------

TEST_CASE("ops: float matches double (matmul, layernorm, gelu)") {
  const int N = 300, C = 128, OC = 200;
  Vec inp = random_vec(N * C), w = random_vec(OC * C, -0.2, 0.2), b = random_vec(OC);
  Vec dout = random_vec(N * OC);
  auto inpf = to_float(inp), wf = to_float(w), bf = to_float(b), doutf = to_float(dout);

  Vec out(N * OC), dinp(N * C, 0.0), dw(OC * C, 0.0), db(OC, 0.0);
  std::vector<float> outf(N * OC), dinpf(N * C, 0.f), dwf(OC * C, 0.f), dbf(OC, 0.f);
  cpu::matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
  cpu::matmul_forward(outf.data(), inpf.data(), wf.data(), bf.data(), N, C, OC);
  cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N,
                       C, OC);
  cpu::matmul_backward(dinpf.data(), dwf.data(), dbf.data(), doutf.data(), inpf.data(),
                       wf.data(), N, C, OC);
  CHECK(rel_diff(outf, out) < 1e-5);
  CHECK(rel_diff(dinpf, dinp) < 1e-5);
  CHECK(rel_diff(dwf, dw) < 1e-5);
  CHECK(rel_diff(dbf, db) < 1e-5);

  Vec lw = random_vec(C, 0.5, 1.5), lb = random_vec(C), lout(N * C), mean(N), rstd(N);
  Vec ldout = random_vec(N * C), ldinp(N * C, 0.0), ldw(C, 0.0), ldb(C, 0.0);
  auto lwf = to_float(lw), lbf = to_float(lb), ldoutf = to_float(ldout);
  std::vector<float> loutf(N * C), meanf(N), rstdf(N), ldinpf(N * C, 0.f), ldwf(C, 0.f),
      ldbf(C, 0.f);
  Vec inp3 = random_vec(N * C, 2, 4);  // an offset mean, as real activations have
  auto inp3f = to_float(inp3);
  cpu::layernorm_forward(lout.data(), mean.data(), rstd.data(), inp3.data(), lw.data(),
                         lb.data(), N, C);
  cpu::layernorm_forward(loutf.data(), meanf.data(), rstdf.data(), inp3f.data(), lwf.data(),
                         lbf.data(), N, C);
  cpu::layernorm_backward(ldinp.data(), ldw.data(), ldb.data(), ldout.data(), inp3.data(),
                          lw.data(), mean.data(), rstd.data(), N, C);
  cpu::layernorm_backward(ldinpf.data(), ldwf.data(), ldbf.data(), ldoutf.data(), inp3f.data(),
                          lwf.data(), meanf.data(), rstdf.data(), N, C);
  CHECK(rel_diff(loutf, lout) < 1e-5);
  CHECK(rel_diff(meanf, mean) < 1e-5);
  CHECK(rel_diff(rstdf, rstd) < 1e-5);
  CHECK(rel_diff(ldinpf, ldinp) < 1e-5);
  CHECK(rel_diff(ldwf, ldw) < 1e-5);
  CHECK(rel_diff(ldbf, ldb) < 1e-5);

  // gelu (the float path uses a vectorised exp): elementwise relative error.
  const size_t G = 50000;
  Vec gx = random_vec(G, -6, 6), gd = random_vec(G), gy(G), gdx(G, 0.0);
  auto gxf = to_float(gx), gdf = to_float(gd);
  std::vector<float> gyf(G), gdxf(G, 0.f);
  cpu::gelu_forward(gy.data(), gx.data(), G);
  cpu::gelu_forward(gyf.data(), gxf.data(), G);
  cpu::gelu_backward(gdx.data(), gx.data(), gd.data(), G);
  cpu::gelu_backward(gdxf.data(), gxf.data(), gdf.data(), G);
  double worst_y = 0, worst_d = 0;
  for (size_t i = 0; i < G; ++i) {
    // Compared with the double op at the float-rounded input (the input rounding is not
    // the op's error); 1e-5 relative, with a floor of 1e-7 absolute (1e-5 of 1e-2): gelu'
    // crosses zero near x = -0.75 as a difference of O(1) terms, where float keeps only
    // ~1e-8 absolute.
    double xd = gxf[i], yd, dd = 0, one = gdf[i];
    cpu::gelu_forward(&yd, &xd, 1);
    cpu::gelu_backward(&dd, &xd, &one, 1);
    worst_y = std::max(worst_y, std::fabs(gyf[i] - yd) / (std::fabs(yd) + 1e-2));
    worst_d = std::max(worst_d, std::fabs(gdxf[i] - dd) / (std::fabs(dd) + 1e-2));
  }
  CHECK(worst_y < 1e-5);
  CHECK(worst_d < 1e-5);
}
