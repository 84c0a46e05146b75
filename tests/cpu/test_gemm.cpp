// tests/cpu/test_gemm.cpp: the float product of the CPU fast path (kernels/cpu/gemm.h) against a
// double loop, and the float linear layer that uses it (kernels/cpu/matmul.cpp) against the
// double one.
//
// Tolerance, derived. gemm_f32 computes each C element as one chain of K float FMAs from 0
// (per k block; blocks and the old C added after), each rounding once with unit roundoff
// u = 2^-24, so with S = sum_k |a_ik b_kj| and c0 = |C_old| (accumulating)
//   |C - C_exact| <= (K + 2) u (S + c0)      (first order; the +2: the adds of blocks and C_old)
// A wrong index, a dropped or doubled k, a skipped edge row or column, or a read of the old C
// when overwriting gives an error of the order of S itself and fails. Inputs are fresh random
// numbers each run, never zeros; sizes straddle both tilings' tiles (6 x 16 and 12 x 32) and k
// blocks (384 and 192). Every kernel this build has runs: the native one (AVX2 or AVX-512) and
// the portable twins of both tilings, so the AVX-512 tiling's blocking and edges are checked on
// a machine without AVX-512 too; the native kernel must equal its twin bit for bit.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <limits>
#include <thread>
#include <vector>

#include "kernels/cpu/gelu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matmul.h"
#include "tests/cpu/test_util.h"

using testutil::random_vec;

namespace {

constexpr double kU = 1.0 / (1 << 24);  // float's unit roundoff

// A strided view of a float buffer and the same numbers in double.
struct Operand {
  std::vector<float> f;
  long rs, cs;
  float at(int i, int j) const { return f[(size_t)(i * rs + j * cs)]; }
};

// An (rows, cols) operand stored row-major (trans = false) or as its transpose (column-major),
// with ld >= the stored row length (padding between rows filled with NaN: never read).
Operand make_operand(int rows, int cols, bool trans, int pad) {
  const int inner = trans ? rows : cols, outer = trans ? cols : rows, ld = inner + pad;
  Operand o;
  o.f.assign((size_t)outer * ld, std::numeric_limits<float>::quiet_NaN());
  auto v = random_vec<float>((size_t)outer * inner);
  for (int r = 0; r < outer; ++r)
    for (int c = 0; c < inner; ++c) o.f[(size_t)r * ld + c] = v[(size_t)r * inner + c];
  o.rs = trans ? 1 : ld;
  o.cs = trans ? ld : 1;
  return o;
}

// The kernels this build has (gemm_f32 itself is the native one).
std::vector<cpu::GemmKernel> built_kernels() {
  std::vector<cpu::GemmKernel> ks;
  for (auto k : {cpu::GemmKernel::Avx2, cpu::GemmKernel::Avx512, cpu::GemmKernel::Portable8, cpu::GemmKernel::Portable16})
    if (cpu::gemm_kernel_built(k)) ks.push_back(k);
  return ks;
}

// Runs the kernel on (M, N, K) with the given layouts and checks every element against the
// bound above; C has ldc = N + cpad, the padding must come back untouched.
void check_gemm(cpu::GemmKernel kern, int M, int N, int K, bool ta, bool tb, bool accumulate, int pad) {
  INFO("kernel " << std::string(cpu::gemm_kernel_name(kern)));
  CAPTURE(M); CAPTURE(N); CAPTURE(K); CAPTURE(ta); CAPTURE(tb); CAPTURE(accumulate); CAPTURE(pad);
  const Operand A = make_operand(M, K, ta, pad), B = make_operand(K, N, tb, pad);
  const long ldc = N + pad;
  const float sentinel = -12345.f;
  std::vector<float> c((size_t)M * ldc, sentinel), c_old;
  auto init = random_vec<float>((size_t)M * N, -2, 2);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      // overwriting must not read the old C: NaN there would show in the result
      c[(size_t)i * ldc + j] = accumulate ? init[(size_t)i * N + j] : std::numeric_limits<float>::quiet_NaN();
  c_old = c;
  cpu::gemm_f32_using(kern, M, N, K, A.f.data(), A.rs, A.cs, B.f.data(), B.rs, B.cs, c.data(), ldc, accumulate);
  double worst = 0;
  int wi = 0, wj = 0;
  bool ok = true, pad_ok = true;
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double ref = accumulate ? (double)c_old[(size_t)i * ldc + j] : 0.0, s = accumulate ? std::fabs(ref) : 0.0;
      for (int k = 0; k < K; ++k) {
        const double p = (double)A.at(i, k) * (double)B.at(k, j);
        ref += p;
        s += std::fabs(p);
      }
      const double err = std::fabs((double)c[(size_t)i * ldc + j] - ref), bound = (K + 2) * kU * s;
      const double ratio = std::isfinite(err) ? err / bound : 1e30;
      if (ratio > worst) { worst = ratio; wi = i; wj = j; }
      if (!(err <= bound)) ok = false;
    }
    for (long j = N; j < ldc; ++j) pad_ok &= c[(size_t)i * ldc + j] == sentinel;
  }
  INFO("worst element (" << wi << ", " << wj << "): error / bound " << worst);
  CHECK(ok);
  CHECK(pad_ok);
}

}  // namespace

TEST_CASE("gemm: every kernel, every layout, odd sizes, overwrite and accumulate against a double loop") {
  std::printf("[test_gemm] gemm_f32's kernel in this build: %s\n", cpu::gemm_kernel_name(cpu::gemm_kernel_native()));
  // sizes below, at and past the 6 x 16 and 12 x 32 tiles (and the 96-row block of a
  // transposed A); K past the k blocks (192, 384) and split unevenly
  const int Ms[] = {1, 5, 6, 7, 11, 12, 13, 97, 102};
  const int Ns[] = {1, 15, 16, 17, 33, 65};
  const int Ks[] = {1, 3, 64, 193, 385, 777};
  for (auto kern : built_kernels())
    for (int M : Ms)
      for (int N : Ns)
        for (int K : Ks)
          for (int layout = 0; layout < 4; ++layout)
            check_gemm(kern, M, N, K, layout & 1, layout & 2, (M + N + K + layout) % 2 == 0, (M + K) % 3);
  // each (layout, accumulate) once more on a shape of the CPU step's kind
  for (auto kern : built_kernels())
    for (int layout = 0; layout < 4; ++layout)
      for (bool acc : {false, true}) check_gemm(kern, 96, 129, 200, layout & 1, layout & 2, acc, 4);
}

TEST_CASE("gemm: the native kernel equals its portable twin bit for bit") {
  // Avx2 computes what Portable8 computes and Avx512 what Portable16 computes, rounding for
  // rounding (one FMA chain per element, the same blocks, the same adds): any difference is a
  // kernel that reads or orders something else. Without a vector kernel gemm_f32 is Portable8.
  const cpu::GemmKernel native = cpu::gemm_kernel_native();
  const cpu::GemmKernel twin = native == cpu::GemmKernel::Avx512 ? cpu::GemmKernel::Portable16 : cpu::GemmKernel::Portable8;
  INFO("native " << std::string(cpu::gemm_kernel_name(native)) << ", twin " << std::string(cpu::gemm_kernel_name(twin)));
  for (int layout = 0; layout < 4; ++layout)
    for (auto [M, N, K] : {std::array<int, 3>{384, 384, 128}, {384, 65, 512}, {64, 64, 32}, {101, 47, 777}, {13, 33, 193}}) {
      CAPTURE(layout); CAPTURE(M); CAPTURE(N); CAPTURE(K);
      const bool ta = layout & 1, tb = layout & 2, acc = (M + layout) % 2 == 1;
      const Operand A = make_operand(M, K, ta, 1), B = make_operand(K, N, tb, 2);
      std::vector<float> c1 = random_vec<float>((size_t)M * N), c2 = c1;
      cpu::gemm_f32(M, N, K, A.f.data(), A.rs, A.cs, B.f.data(), B.rs, B.cs, c1.data(), N, acc);
      cpu::gemm_f32_using(twin, M, N, K, A.f.data(), A.rs, A.cs, B.f.data(), B.rs, B.cs, c2.data(), N, acc);
      CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0);
    }
  // a kernel this build lacks is refused, not run
  if (!cpu::gemm_kernel_built(cpu::GemmKernel::Avx512)) {
    float x = 1.f, y = 0.f;
    CHECK_THROWS_AS(cpu::gemm_f32_using(cpu::GemmKernel::Avx512, 1, 1, 1, &x, 1, 1, &x, 1, 1, &y, 1, false),
                    std::invalid_argument);
  }
}

TEST_CASE("gemm: a general stride, K = 0, and the same result on every call and thread") {
  // A with neither stride 1: every other column of a wider buffer
  const int M = 23, N = 37, K = 41;
  auto a = random_vec<float>((size_t)M * 2 * K), b = random_vec<float>((size_t)K * N);
  std::vector<float> c((size_t)M * N, 0.f);
  cpu::gemm_f32(M, N, K, a.data(), 2 * K, 2, b.data(), N, 1, c.data(), N, false);
  double worst = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0, s = 0;
      for (int k = 0; k < K; ++k) {
        ref += (double)a[(size_t)i * 2 * K + 2 * k] * b[(size_t)k * N + j];
        s += std::fabs((double)a[(size_t)i * 2 * K + 2 * k] * b[(size_t)k * N + j]);
      }
      worst = std::max(worst, std::fabs(c[(size_t)i * N + j] - ref) / ((K + 2) * kU * s));
    }
  CHECK(worst <= 1.0);

  // K = 0: overwrite gives zeros, accumulate leaves C alone
  std::vector<float> z((size_t)M * N, 7.f);
  cpu::gemm_f32(M, N, 0, a.data(), K, 1, b.data(), N, 1, z.data(), N, true);
  CHECK(std::all_of(z.begin(), z.end(), [](float x) { return x == 7.f; }));
  cpu::gemm_f32(M, N, 0, a.data(), K, 1, b.data(), N, 1, z.data(), N, false);
  CHECK(std::all_of(z.begin(), z.end(), [](float x) { return x == 0.f; }));

  // deterministic: the packing buffers are reused between calls and are per thread; a larger
  // call in between (the buffers grow) and another thread give the same bits
  const int M2 = 384, N2 = 130, K2 = 512;
  auto x = random_vec<float>((size_t)M2 * K2), w = random_vec<float>((size_t)N2 * K2);
  std::vector<float> y1((size_t)M2 * N2), y2(y1.size()), y3(y1.size()), big((size_t)M2 * 600);
  auto wb = random_vec<float>((size_t)600 * K2);
  cpu::gemm_f32(M2, N2, K2, x.data(), K2, 1, w.data(), 1, K2, y1.data(), N2, false);
  cpu::gemm_f32(M2, 600, K2, x.data(), K2, 1, wb.data(), 1, K2, big.data(), 600, false);
  cpu::gemm_f32(M2, N2, K2, x.data(), K2, 1, w.data(), 1, K2, y2.data(), N2, false);
  std::thread t([&] { cpu::gemm_f32(M2, N2, K2, x.data(), K2, 1, w.data(), 1, K2, y3.data(), N2, false); });
  t.join();
  CHECK(y1 == y2);
  CHECK(y1 == y3);
}

TEST_CASE("gemm: the float linear layer (fast path) against the double one") {
  // matmul.cpp sends float products with N >= 16 rows to gemm_f32 (with a vector kernel); the
  // double instantiation is Eigen's product. Odd sizes, with and without bias and dinp.
  // Bound per element as above with K the summed dimension, in the float inputs' values.
  for (int N : {16, 17, 100, 391})
    for (int C : {7, 128, 130})
      for (int OC : {5, 65, 96}) {
        CAPTURE(N); CAPTURE(C); CAPTURE(OC);
        const bool with_bias = (N + C + OC) % 2 == 1, with_dinp = N != 100;
        auto inpf = random_vec<float>((size_t)N * C), wf = random_vec<float>((size_t)OC * C);
        auto bf = random_vec<float>(OC), doutf = random_vec<float>((size_t)N * OC);
        auto dinp0 = random_vec<float>((size_t)N * C), dw0 = random_vec<float>((size_t)OC * C);
        auto db0 = random_vec<float>(OC);
        std::vector<double> inp(inpf.begin(), inpf.end()), w(wf.begin(), wf.end()), b(bf.begin(), bf.end());
        std::vector<double> dout(doutf.begin(), doutf.end()), dinp(dinp0.begin(), dinp0.end());
        std::vector<double> dw(dw0.begin(), dw0.end()), db(db0.begin(), db0.end()), out((size_t)N * OC);
        std::vector<float> outf((size_t)N * OC), dinpf = dinp0, dwf = dw0, dbf = db0;
        cpu::matmul_forward(outf.data(), inpf.data(), wf.data(), with_bias ? bf.data() : nullptr, N, C, OC);
        cpu::matmul_forward(out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
        cpu::matmul_backward(with_dinp ? dinpf.data() : nullptr, dwf.data(), dbf.data(), doutf.data(), inpf.data(),
                             wf.data(), N, C, OC);
        cpu::matmul_backward(with_dinp ? dinp.data() : nullptr, dw.data(), db.data(), dout.data(), inp.data(),
                             w.data(), N, C, OC);
        // |x| sums for the bounds: inputs in [-1, 1], so S <= K + |C_old| (+ |b|)
        auto within = [](const std::vector<float>& got, const std::vector<double>& want, int K, const char* what) {
          double worst = 0;
          size_t wk = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            const double r = std::fabs(got[i] - want[i]) / ((K + 3) * kU * (K + 2));
            if (!(r <= worst)) { worst = r; wk = i; }
          }
          INFO(what << ": worst element " << wk << ", error / bound " << worst);
          CHECK(worst <= 1.0);
        };
        within(outf, out, C, "out");
        if (with_dinp) within(dinpf, dinp, OC, "dinp");
        else CHECK(dinpf == dinp0);
        within(dwf, dw, N, "dweight");
        within(dbf, db, N, "dbias");
      }
}

TEST_CASE("gemm: the _overwrite backwards equal zeroing and accumulating (matmul, gelu)") {
  // the CPU step writes its one-contribution activation gradients with these (model/net/gpt_cpu.cpp);
  // dinp starts as NaN, so a read of it would show
  const float nanf = std::numeric_limits<float>::quiet_NaN();
  for (int N : {5, 16, 100})  // below and above the gemm threshold of matmul.cpp
    for (int fast_float = 0; fast_float < 2; ++fast_float) {
      CAPTURE(N); CAPTURE(fast_float);
      const int C = 37, OC = 70;
      auto run = [&](auto zero) {
        using T = decltype(zero);
        auto inp = random_vec<T>((size_t)N * C), w = random_vec<T>((size_t)OC * C), dout = random_vec<T>((size_t)N * OC);
        auto dw0 = random_vec<T>((size_t)OC * C), db0 = random_vec<T>(OC);
        // the same buffers for both calls: Eigen's vectorised sums (dbias) depend on alignment
        std::vector<T> dinp((size_t)N * C, T(0)), dw = dw0, db = db0;
        cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
        const std::vector<T> dinp_a = dinp, dw_a = dw, db_a = db;
        std::fill(dinp.begin(), dinp.end(), (T)nanf);
        dw = dw0;
        db = db0;
        cpu::matmul_backward_overwrite(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
        CHECK(dinp == dinp_a);
        CHECK(dw == dw_a);
        CHECK(db == db_a);
        for (GeluForm form : {GeluForm::Tanh, GeluForm::Erf}) {
          auto x = random_vec<T>(5000, -4, 4), d = random_vec<T>(5000);
          std::vector<T> g(x.size(), T(0));
          cpu::gelu_backward(g.data(), x.data(), d.data(), x.size(), form);
          const std::vector<T> ga = g;
          std::fill(g.begin(), g.end(), (T)nanf);
          cpu::gelu_backward_overwrite(g.data(), x.data(), d.data(), x.size(), form);
          CHECK(g == ga);
        }
      };
      if (fast_float) run(0.f);
      else run(0.0);
    }
}
