// tests/gpu/test_matmul_gpu.cu: gpu::matmul_forward / matmul_backward (kernels/matmul.cu)
// against the CPU twin cpu::matmul_* run in double on the same inputs (rounded to T), for
// T = float and bf16, on sizes that are not multiples of 8 (C, OC in {65, 96, 200}; N in
// {1, 7, 97, 300}: 300 spans three dbias chunks of 128 rows), with and without bias / dinp /
// dbias, with 256-byte aligned buffers and with buffers one element off (what cuBLASLt sees
// for a tensor at an odd offset of the parameter buffer), and with only the bias one element
// off. The forward must take the cuBLASLt path exactly when every pointer, the bias included,
// is 16-byte aligned, and the cublasGemmEx fallback otherwise (kernels/matmul.cu), both with
// the same results; a second call of a shape reuses its Lt plan. Every buffer has guard
// elements on both sides that must come back untouched.
//
// Tolerance. Let u = unit_roundoff<T>() (2^-24 float, 2^-8 bf16), u32 = 2^-24. Both sides see
// the same T inputs; the reference is exact to double precision. The GPU forms each output as
// an fp32 sum of n products (n = C for y, OC for dinp, N for dweight / dbias) plus the bias or
// the starting value, in some order we do not know; a product of two T values is rounded at
// most once in fp32 (exact for bf16). So (Higham, Accuracy and Stability, 3.1)
//     |fp32 result - exact| <= gamma_(n+1) * sum|terms| ~ (n+1) u32 * mag,
// mag = sum over the terms of their absolute values (the same product on |inputs|, computed
// by the CPU twin on absolute values), and the one final rounding to T adds u * |ref|:
//     |got - ref| <= 2 * (u |ref| + (n + 2) u32 mag),
// the factor 2 covering second-order terms. Where a start value of type T is added by the GEMM
// (beta = 1: dinp, and the forward's fallback, which broadcasts the bias into out first) cuBLAS
// on an H100 rounds the product to T before adding it (tests/emu/cublas_emu.cpp, which does the
// same), so there the bound gains 2 u prod, prod the product's own sum |terms| (for T = float
// that term is below the accumulation term's). The cuBLASLt forward rounds once: its plans
// exclude split-K, whose algorithms round before the bias epilogue (kernels/matmul.cu). This is
// a worst-case bound, and still tight
// enough to fail a TF32 GEMM in the fp32 runs: TF32 rounds every input to 2^-11, a random
// error of std ~ 0.8 * 2^-11 * sqrt(n/9) for inputs uniform in [-1, 1] (~5e-4 sqrt(n) at the
// worst of thousands of elements), against the bound 2 (n+2) 2^-24 n/4 ~ 3e-8 n^2: 30x over at
// n = 65, 6x at n = 200, 3x at n = 300. It fails any transpose / leading-dimension / bias /
// += mistake by orders of magnitude.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../../kernels/cpu/matmul.h"
#include "../../kernels/matmul.cuh"
#include "gpu_util.cuh"

using tg_test::DeviceArray;
using tg_test::random_vector;
using tg_test::bitwise_equal;
using tg_test::kU32;

namespace {

using tg_test::within;

std::vector<double> absv(std::vector<double> v) {
  for (double& x : v) x = std::fabs(x);
  return v;
}

// A device array of T with `pad` guard elements on each side of the payload; the guards hold
// random values that no launcher may change.
template <typename T>
struct Guarded {
  size_t n, pad;
  std::vector<double> full;
  DeviceArray<T> a;
  Guarded(const std::vector<double>& payload, size_t pad_, uint64_t salt)
      : n(payload.size()), pad(pad_), full(random_vector(payload.size() + 2 * pad_, salt)), a(full.size()) {
    std::copy(payload.begin(), payload.end(), full.begin() + pad);
    a.upload(full);
    full = a.download();  // as the device holds them (rounded to T)
  }
  T* ptr() { return a.ptr + pad; }
  std::vector<double> payload() const {
    const std::vector<double> d = a.download();
    return std::vector<double>(d.begin() + pad, d.begin() + pad + n);
  }
  std::vector<double> initial() const { return std::vector<double>(full.begin() + pad, full.begin() + pad + n); }
  void reset() { a.upload(full); }
  bool guards_intact() const {
    const std::vector<double> d = a.download();
    for (size_t i = 0; i < pad; ++i)
      if (d[i] != full[i] || d[pad + n + i] != full[pad + n + i]) return false;
    return true;
  }
};

struct GemmShape {
  int N, C, OC;
};
const GemmShape kShapes[] = {{1, 65, 96}, {7, 96, 65}, {97, 200, 65}, {97, 65, 200}, {300, 96, 65}, {97, 96, 96}};

// pad: elements before each buffer; 256 / sizeof(T) keeps cudaMalloc's 256-byte alignment,
// 1 makes every pointer only sizeof(T)-aligned.
template <typename T>
size_t pad_for(bool aligned) {
  return aligned ? 256 / sizeof(T) : 1;
}

// bias_aligned = false: every buffer aligned but the bias, one element off (what a bias at an
// odd offset of the parameter buffer gives): the forward must not take the cuBLASLt path.
template <typename T>
void check_forward(const gpu::Context& ctx, GemmShape s, bool with_bias, bool aligned, uint64_t salt,
                   bool bias_aligned = true) {
  const int N = s.N, C = s.C, OC = s.OC;
  const double u = gpu::unit_roundoff<T>();
  const size_t pad = pad_for<T>(aligned);
  Guarded<T> x(random_vector((size_t)N * C, salt + 1), pad, salt + 11);
  Guarded<T> w(random_vector((size_t)OC * C, salt + 2), pad, salt + 12);
  Guarded<T> b(random_vector((size_t)OC, salt + 3), bias_aligned ? pad : 1, salt + 13);
  Guarded<T> y(random_vector((size_t)N * OC, salt + 4), pad, salt + 14);  // garbage: must be overwritten
  cudaCheck(cudaDeviceSynchronize());

  const gpu::MatmulPathCounts before = gpu::matmul_path_counts(ctx);
  gpu::matmul_forward<T>(ctx, y.ptr(), x.ptr(), w.ptr(), with_bias ? b.ptr() : nullptr, N, C, OC);
  const std::vector<double> got = y.payload();
  // the cuBLASLt path exactly when every pointer, the bias included, is 16-byte aligned
  const bool lt = aligned && (bias_aligned || !with_bias);
  const gpu::MatmulPathCounts after = gpu::matmul_path_counts(ctx);
  CHECK(after.lt - before.lt == (lt ? 1u : 0u));
  CHECK(after.fallback - before.fallback == (lt ? 0u : 1u));

  const std::vector<double> xr = x.initial(), wr = w.initial(), br = b.initial();
  std::vector<double> ref((size_t)N * OC), mag((size_t)N * OC);
  cpu::matmul_forward<double>(ref.data(), xr.data(), wr.data(), with_bias ? br.data() : nullptr, N, C, OC);
  const std::vector<double> xa = absv(xr), wa = absv(wr), ba = absv(br);
  cpu::matmul_forward<double>(mag.data(), xa.data(), wa.data(), with_bias ? ba.data() : nullptr, N, C, OC);
  std::vector<double> prod(ref.size());  // sum |terms| of X W^T alone
  cpu::matmul_forward<double>(prod.data(), xa.data(), wa.data(), nullptr, N, C, OC);
  const bool start_value = !lt && with_bias;  // the fallback: out = bias, then out += X W^T
  std::vector<double> bound(ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    bound[i] = 2 * (u * std::fabs(ref[i]) + (start_value ? u * prod[i] : 0) + (C + 2) * kU32 * mag[i]);

  const std::string what = std::string("matmul_forward<") + (sizeof(T) == 4 ? "float" : "bf16") +
                           "> N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
                           (with_bias ? " bias" : " no bias") + (aligned ? " aligned" : " misaligned") +
                           (bias_aligned ? "" : ", bias misaligned");
  CHECK_MESSAGE(within(got, ref, bound, what), what);
  CHECK_MESSAGE(y.guards_intact(), what << ": wrote outside out");

  // determinism: a second run gives the same bits
  y.reset();
  gpu::matmul_forward<T>(ctx, y.ptr(), x.ptr(), w.ptr(), with_bias ? b.ptr() : nullptr, N, C, OC);
  CHECK_MESSAGE(bitwise_equal(y.payload(), got), what << ": second run differs");
}

template <typename T>
void check_backward(const gpu::Context& ctx, GemmShape s, bool with_dinp, bool with_dbias, bool aligned,
                    uint64_t salt) {
  const int N = s.N, C = s.C, OC = s.OC;
  const double u = gpu::unit_roundoff<T>();
  const size_t pad = pad_for<T>(aligned), padf = aligned ? 64 : 1;
  Guarded<T> x(random_vector((size_t)N * C, salt + 1), pad, salt + 11);
  Guarded<T> w(random_vector((size_t)OC * C, salt + 2), pad, salt + 12);
  Guarded<T> dy(random_vector((size_t)N * OC, salt + 3), pad, salt + 13);
  // the gradients start from random values: the launcher must add, not overwrite
  Guarded<T> dx(random_vector((size_t)N * C, salt + 4), pad, salt + 14);
  Guarded<float> dw(random_vector((size_t)OC * C, salt + 5), padf, salt + 15);
  Guarded<float> db(random_vector((size_t)OC, salt + 6), padf, salt + 16);
  cudaCheck(cudaDeviceSynchronize());

  auto run = [&] {
    gpu::matmul_backward<T>(ctx, with_dinp ? dx.ptr() : nullptr, dw.ptr(), with_dbias ? db.ptr() : nullptr, dy.ptr(),
                            x.ptr(), w.ptr(), N, C, OC);
  };
  run();
  const std::vector<double> got_dx = dx.payload(), got_dw = dw.payload(), got_db = db.payload();

  const std::vector<double> xr = x.initial(), wr = w.initial(), dyr = dy.initial();
  std::vector<double> ref_dx = dx.initial(), ref_dw = dw.initial(), ref_db = db.initial();
  cpu::matmul_backward<double>(with_dinp ? ref_dx.data() : nullptr, ref_dw.data(),
                               with_dbias ? ref_db.data() : nullptr, dyr.data(), xr.data(), wr.data(), N, C, OC);
  std::vector<double> mag_dx = absv(dx.initial()), mag_dw = absv(dw.initial()), mag_db = absv(db.initial());
  const std::vector<double> xa = absv(xr), wa = absv(wr), dya = absv(dyr);
  cpu::matmul_backward<double>(mag_dx.data(), mag_dw.data(), mag_db.data(), dya.data(), xa.data(), wa.data(), N, C,
                               OC);
  auto bounds = [](const std::vector<double>& ref, const std::vector<double>& mag, double uo, int n) {
    std::vector<double> b(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) b[i] = 2 * (uo * std::fabs(ref[i]) + (n + 2) * kU32 * mag[i]);
    return b;
  };
  // dinp += dY W in T: the product dY W is rounded to T before it is added (see the top)
  std::vector<double> bound_dx = bounds(ref_dx, mag_dx, u, OC);
  if (with_dinp) {
    std::vector<double> prod_dx((size_t)N * C, 0.0), unused_dw((size_t)OC * C, 0.0);
    cpu::matmul_backward<double>(prod_dx.data(), unused_dw.data(), nullptr, dya.data(), xa.data(), wa.data(), N, C,
                                 OC);
    for (size_t i = 0; i < bound_dx.size(); ++i) bound_dx[i] += 2 * u * prod_dx[i];
  }

  const std::string what = std::string("matmul_backward<") + (sizeof(T) == 4 ? "float" : "bf16") + "> N=" +
                           std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
                           (with_dinp ? " dinp" : " no dinp") + (with_dbias ? " dbias" : " no dbias") +
                           (aligned ? " aligned" : " misaligned");
  if (with_dinp) CHECK_MESSAGE(within(got_dx, ref_dx, bound_dx, what + " dinp"), what);
  else CHECK_MESSAGE(bitwise_equal(got_dx, dx.initial()), what << ": dinp is null but the buffer changed");
  CHECK_MESSAGE(within(got_dw, ref_dw, bounds(ref_dw, mag_dw, kU32, N), what + " dweight"), what);
  if (with_dbias) CHECK_MESSAGE(within(got_db, ref_db, bounds(ref_db, mag_db, kU32, N), what + " dbias"), what);
  else CHECK_MESSAGE(bitwise_equal(got_db, db.initial()), what << ": dbias is null but the buffer changed");
  CHECK_MESSAGE(dx.guards_intact(), what << ": wrote outside dinp");
  CHECK_MESSAGE(dw.guards_intact(), what << ": wrote outside dweight");
  CHECK_MESSAGE(db.guards_intact(), what << ": wrote outside dbias");

  // determinism: from the same starting buffers a second run gives the same bits
  dx.reset();
  dw.reset();
  db.reset();
  run();
  CHECK_MESSAGE(bitwise_equal(dx.payload(), got_dx), what << ": second run differs (dinp)");
  CHECK_MESSAGE(bitwise_equal(dw.payload(), got_dw), what << ": second run differs (dweight)");
  CHECK_MESSAGE(bitwise_equal(db.payload(), got_db), what << ": second run differs (dbias)");
}

size_t max_scratch() {
  size_t s = 0;
  for (const GemmShape& sh : kShapes) s = std::max(s, gpu::matmul_scratch_bytes(sh.N, sh.OC));
  return s;
}

template <typename T>
void forward_suite() {
  tg_test::TestContext tc(max_scratch(), sizeof(T) == 4 ? gpu::Precision::FP32 : gpu::Precision::BF16);
  uint64_t salt = 100;
  for (const GemmShape& s : kShapes) {
    for (bool bias : {true, false})
      for (bool aligned : {true, false}) check_forward<T>(tc.ctx, s, bias, aligned, salt += 100);
    check_forward<T>(tc.ctx, s, true, true, salt += 100, false);
  }
}

template <typename T>
void backward_suite() {
  tg_test::TestContext tc(max_scratch(), sizeof(T) == 4 ? gpu::Precision::FP32 : gpu::Precision::BF16);
  uint64_t salt = 50000;
  for (const GemmShape& s : kShapes)
    for (int variant = 0; variant < 4; ++variant) {
      const bool dinp = variant != 1, dbias = variant != 2, aligned = variant != 3;
      check_backward<T>(tc.ctx, s, dinp, dbias, aligned, salt += 100);
    }
}

}  // namespace

TG_GPU_TEST(
    "gpu matmul_forward<float> matches the double CPU twin (odd sizes, bias or null, misaligned; Lt or fallback)") {
  forward_suite<float>();
}

TG_GPU_TEST(
    "gpu matmul_forward<bf16> matches the double CPU twin (odd sizes, bias or null, misaligned; Lt or fallback)") {
  forward_suite<gpu::bf16>();
}

TG_GPU_TEST("gpu matmul_backward<float>: += into dinp, dweight, dbias; null dinp / dbias; deterministic") {
  backward_suite<float>();
}

TG_GPU_TEST("gpu matmul_backward<bf16>: += into dinp, dweight, dbias; null dinp / dbias; deterministic") {
  backward_suite<gpu::bf16>();
}
