// tests/gpu/test_ops_gpu.cu: the element-wise and reduction ops of the CUDA backend
// (kernels/{encoder,layernorm,gelu,residual,dropout,cross_entropy,adamw}.cu) against their CPU
// twins (kernels/cpu/*.h) run in double on the same inputs rounded to T, for T = float and
// T = bf16, on odd sizes, with fresh random inputs each run (TG_TEST_SEED replays one).
// Tolerances are derived next to each check from u_f = 2^-24 (the float the kernels compute
// in), u_T = unit_roundoff<T>() (the storage rounding of T outputs) and the length of the sums
// involved. Backward ops start their gradient buffers from random values (the += contract),
// and the reductions that must be deterministic are run twice and compared bitwise.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../../kernels/adamw.cuh"
#include "../../kernels/cpu/adamw.h"
#include "../../kernels/cpu/cross_entropy.h"
#include "../../kernels/cpu/dropout.h"
#include "../../kernels/cpu/encoder.h"
#include "../../kernels/cpu/gelu.h"
#include "../../kernels/cpu/layernorm.h"
#include "../../kernels/cpu/residual.h"
#include "../../kernels/cross_entropy.cuh"
#include "../../kernels/dropout.cuh"
#include "../../kernels/encoder.cuh"
#include "../../kernels/gelu.cuh"
#include "../../kernels/layernorm.cuh"
#include "../../kernels/residual.cuh"
#include "../common/qkv_slices.h"
#include "gpu_util.cuh"

using tg_test::bitwise_equal;
using tg_test::max_abs;
using tg_test::random_tokens;

namespace {

using tg_test::all_close;
using tg_test::DeviceArray;
using tg_test::random_vector;
using tg_test::round_to;
using tg_test::TestContext;

constexpr double kUf = 5.9604644775390625e-8;  // unit roundoff of float (2^-24)

template <typename T>
const char* type_name() {
  return std::is_same<T, float>::value ? "float" : "bf16";
}

// A device buffer of plain values (token ids, targets, AdamW tensor table), copied as bytes.
template <typename U>
struct DeviceBuf {
  U* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuf(const std::vector<U>& host) : n(host.size()) {
    cudaCheck(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(U)));
    if (n) cudaCheck(cudaMemcpy(ptr, host.data(), n * sizeof(U), cudaMemcpyHostToDevice));
  }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  ~DeviceBuf() {
    if (ptr) cudaFree(ptr);
  }
};

// Uploads with cudaMemcpy may still be in flight when a kernel starts on the context's
// non-blocking stream: every test syncs the device between setup and launch.
void sync() { cudaCheck(cudaDeviceSynchronize()); }

// Values of magnitude in [0.5, 1.5) with random signs: never zero (so a zero marks a drop).
std::vector<double> nonzero_vector(size_t n, uint64_t salt) {
  std::vector<double> a = random_vector(n, salt, 0.5, 1.5), s = random_vector(n, salt + 1);
  for (size_t i = 0; i < n; ++i) a[i] = s[i] < 0 ? -a[i] : a[i];
  return a;
}

// Relative error of a value computed in float and then stored as T: the rounding to T (u_T),
// plus 2 u_f for the float rounding before it (a double rounding, float then bf16, can land
// up to u_f beyond u_T).
template <typename T>
double store_rtol() {
  return gpu::unit_roundoff<T>() + 2 * kUf;
}

// ---- encoder ----------------------------------------------------------------------------------

template <typename T>
void check_encoder_forward(int B, int Tn, int C, int V) {
  INFO(type_name<T>() << " encoder_forward B=" << B << " T=" << Tn << " C=" << C << " V=" << V);
  const int maxT = Tn + 3;
  TestContext tc;
  DeviceArray<T> wte(random_vector((size_t)V * C, 1)), wpe(random_vector((size_t)maxT * C, 2));
  DeviceArray<T> out((size_t)B * Tn * C);
  const std::vector<int32_t> tok = random_tokens((size_t)B * Tn, V, 3);
  DeviceBuf<int32_t> inp(tok);
  sync();
  gpu::encoder_forward(tc.ctx, out.ptr, inp.ptr, wte.ptr, wpe.ptr, B, Tn, C);
  std::vector<double> ref((size_t)B * Tn * C);
  cpu::encoder_forward(ref.data(), tok.data(), wte.rounded().data(), wpe.rounded().data(), B, Tn, C);
  // one float add of two T values, stored as T: |err| <= store_rtol |ref|
  CHECK(all_close(out.download(), ref, store_rtol<T>(), 1e-30, "encoder_forward"));
}

// dwte / dwpe start random; tokens drawn with a skew (token 0 gets about half of the
// positions, so it spans many chunks of the sorted list) unless uniform.
template <typename T>
void check_encoder_backward(int B, int Tn, int C, int V, bool skewed) {
  INFO(type_name<T>() << " encoder_backward B=" << B << " T=" << Tn << " C=" << C << " V=" << V
                      << (skewed ? " skewed" : " uniform"));
  const int maxT = Tn + 2;
  const size_t N = (size_t)B * Tn;
  std::vector<int32_t> tok = random_tokens(N, V, 10);
  if (skewed) {
    const std::vector<double> u = random_vector(N, 11, 0.0, 1.0);
    for (size_t i = 0; i < N; ++i)
      if (u[i] < 0.5) tok[i] = 0;
  }
  TestContext tc(gpu::encoder_backward_scratch_bytes(B, Tn, C));
  std::vector<uint32_t> keys(N), vals(N), counts((size_t)V + 1);
  gpu::encoder_backward_order(keys.data(), vals.data(), counts.data(), tok.data(), (long long)N, V);
  DeviceBuf<uint32_t> dkeys(keys), dvals(vals);
  DeviceArray<T> dout(random_vector(N * C, 12));
  const std::vector<double> dwte0 = random_vector((size_t)V * C, 13), dwpe0 = random_vector((size_t)maxT * C, 14);
  DeviceArray<float> dwte(dwte0), dwpe(dwpe0), dwte2(dwte0), dwpe2(dwpe0);
  sync();
  gpu::encoder_backward(tc.ctx, dwte.ptr, dwpe.ptr, dout.ptr, dkeys.ptr, dvals.ptr, B, Tn, C);
  gpu::encoder_backward(tc.ctx, dwte2.ptr, dwpe2.ptr, dout.ptr, dkeys.ptr, dvals.ptr, B, Tn, C);
  const std::vector<double> d = dout.rounded();
  std::vector<double> ref_wte = round_to<float>(dwte0), ref_wpe = round_to<float>(dwpe0);
  cpu::encoder_backward(ref_wte.data(), ref_wpe.data(), d.data(), tok.data(), B, Tn, C);
  // Sum bounds: dwte[v, c] is (dwte0 + (sum of chunk sums)), each chunk sum <= 32 terms in
  // order, then <= N/32 + 1 chunk partials in order: |err| <= (32 + N/32 + 2) u_f (|dwte0| +
  // sum |dout|) over that token's positions; bounded by the largest such sum over (v, c).
  // dwpe[t, c]: B terms in order plus the +=: |err| <= (B + 1) u_f (|dwpe0| + sum_b |dout|).
  std::vector<double> abs_wte(dwte0.size(), 0.0), abs_wpe(dwpe0.size(), 0.0);
  for (size_t bt = 0; bt < N; ++bt)
    for (int c = 0; c < C; ++c) {
      abs_wte[(size_t)tok[bt] * C + c] += std::fabs(d[bt * C + c]);
      abs_wpe[(bt % Tn) * C + c] += std::fabs(d[bt * C + c]);
    }
  const double s_wte = max_abs(abs_wte) + max_abs(dwte0), s_wpe = max_abs(abs_wpe) + max_abs(dwpe0);
  const std::vector<double> g_wte = dwte.download(), g_wpe = dwpe.download();
  CHECK(all_close(g_wte, ref_wte, 0.0, (32.0 + N / 32.0 + 2) * kUf * s_wte, "encoder_backward dwte"));
  CHECK(all_close(g_wpe, ref_wpe, 0.0, (B + 1.0) * kUf * s_wpe, "encoder_backward dwpe"));
  // no float atomics: a second run from the same start is bitwise the same
  CHECK(bitwise_equal(g_wte, dwte2.download()));
  CHECK(bitwise_equal(g_wpe, dwpe2.download()));
}

// ---- layernorm --------------------------------------------------------------------------------

template <typename T>
void check_layernorm_forward(int N, int C, bool with_bias) {
  INFO(type_name<T>() << " layernorm_forward N=" << N << " C=" << C << (with_bias ? " bias" : " no bias"));
  TestContext tc;
  // an offset of 3 so that a one-pass variance (or a missing mean) would show
  std::vector<double> x0 = random_vector((size_t)N * C, 20);
  for (double& v : x0) v += 3.0;
  DeviceArray<T> inp(x0), w(random_vector(C, 21, 0.5, 1.5)), b(random_vector(C, 22)), out((size_t)N * C);
  DeviceArray<float> mean(N), rstd(N);
  sync();
  gpu::layernorm_forward(tc.ctx, out.ptr, mean.ptr, rstd.ptr, inp.ptr, w.ptr, with_bias ? b.ptr : (T*)nullptr, N, C);
  const std::vector<double> x = inp.rounded(), wr = w.rounded(), br = b.rounded();
  std::vector<double> ref((size_t)N * C), rm(N), rr(N);
  cpu::layernorm_forward(ref.data(), rm.data(), rr.data(), x.data(), wr.data(), with_bias ? br.data() : nullptr, N, C);
  // Float sums of C terms (32 lanes in order, then a 5-level butterfly): relative error
  // k = (C/32 + 6) u_f of the sum of magnitudes. mean: |err| <= k max|x|. var: relative
  // error <= k + 2 u_f (the squares), so rstd: <= k/2 + 3 u_f; take k + 8 u_f.
  const double k = (C / 32.0 + 6) * kUf;
  CHECK(all_close(mean.download(), rm, 0.0, k * max_abs(x), "layernorm mean"));
  CHECK(all_close(rstd.download(), rr, k + 8 * kUf, 1e-30, "layernorm rstd"));
  // out = (x - m) r w + b: the error of m times r w, the relative error of r times |xhat w|,
  // a few u_f per operation, then the rounding to T (u_T |ref|).
  const double rmax = max_abs(rr), wmax = max_abs(wr);
  const double atol = k * max_abs(x) * rmax * wmax + (k + 16 * kUf) * (max_abs(x) * 2 * rmax * wmax + max_abs(br));
  CHECK(all_close(out.download(), ref, store_rtol<T>(), atol, "layernorm out"));
}

template <typename T>
void check_layernorm_backward(int N, int C, bool with_bias) {
  INFO(type_name<T>() << " layernorm_backward N=" << N << " C=" << C << (with_bias ? " bias" : " no bias"));
  TestContext tc(gpu::layernorm_backward_scratch_bytes(N, C));
  std::vector<double> x0 = random_vector((size_t)N * C, 30);
  for (double& v : x0) v = 2.0 * v + 1.0;
  DeviceArray<T> inp(x0), w(random_vector(C, 31, 0.5, 1.5)), dout(random_vector((size_t)N * C, 32));
  const std::vector<double> x = inp.rounded(), wr = w.rounded(), d = dout.rounded();
  // mean / rstd as a forward would save them: from the rounded input, rounded to float
  std::vector<double> mh(N), rh(N), scratch_out((size_t)N * C);
  cpu::layernorm_forward(scratch_out.data(), mh.data(), rh.data(), x.data(), wr.data(), (const double*)nullptr, N, C);
  DeviceArray<float> mean(mh), rstd(rh);
  const std::vector<double> m = mean.rounded(), r = rstd.rounded();
  const std::vector<double> dinp0 = random_vector((size_t)N * C, 33), dw0 = random_vector(C, 34),
                            db0 = random_vector(C, 35);
  DeviceArray<T> dinp(dinp0), dinp2(dinp0);
  DeviceArray<float> dw(dw0), db(db0), dw2(dw0), db2(db0);
  sync();
  float* dbp = with_bias ? db.ptr : nullptr;
  float* dbp2 = with_bias ? db2.ptr : nullptr;
  gpu::layernorm_backward(tc.ctx, dinp.ptr, dw.ptr, dbp, dout.ptr, inp.ptr, w.ptr, mean.ptr, rstd.ptr, N, C);
  gpu::layernorm_backward(tc.ctx, dinp2.ptr, dw2.ptr, dbp2, dout.ptr, inp.ptr, w.ptr, mean.ptr, rstd.ptr, N, C);
  std::vector<double> rdi = round_to<T>(dinp0);
  std::vector<double> rdw = round_to<float>(dw0), rdb = round_to<float>(db0);
  cpu::layernorm_backward(rdi.data(), rdw.data(), with_bias ? rdb.data() : nullptr, d.data(), x.data(), wr.data(),
                          m.data(), r.data(), N, C);
  // dinp = dinp0 + r (g - mean g - xhat mean(g xhat)): the two row sums carry (C/32 + 6) u_f
  // of sum|g| and sum|g xhat|, each product / difference a few u_f: |err| <= (C/32 + 12) u_f
  // r_max g_max (1 + xhat_max)^2 + u_f |dinp0|, then the rounding to T (u_T |ref|).
  double xh = 0, gmax = 0;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      xh = std::max(xh, std::fabs((x[(size_t)n * C + c] - m[n]) * r[n]));
      gmax = std::max(gmax, std::fabs(d[(size_t)n * C + c] * wr[c]));
    }
  const double atol_di = (C / 32.0 + 12) * kUf * max_abs(r) * gmax * (1 + xh) * (1 + xh) + kUf * max_abs(dinp0);
  CHECK(all_close(dinp.download(), rdi, store_rtol<T>(), atol_di, "layernorm dinp"));
  // dweight / dbias: N terms (+ the start value), each term dout xhat with a few u_f of its own:
  // whatever the order, |err| <= (N + 4) u_f (|start| + sum_n |dout xhat|) (resp. |dout|).
  double sw = 0, sb = 0;
  for (int c = 0; c < C; ++c) {
    double a = 0, e = 0;
    for (int n = 0; n < N; ++n) {
      a += std::fabs(d[(size_t)n * C + c] * (x[(size_t)n * C + c] - m[n]) * r[n]);
      e += std::fabs(d[(size_t)n * C + c]);
    }
    sw = std::max(sw, a);
    sb = std::max(sb, e);
  }
  const std::vector<double> gdw = dw.download(), gdb = db.download(), gdi = dinp.download();
  CHECK(all_close(gdw, rdw, 0.0, (N + 4.0) * kUf * (sw + max_abs(dw0)), "layernorm dweight"));
  if (with_bias) CHECK(all_close(gdb, rdb, 0.0, (N + 4.0) * kUf * (sb + max_abs(db0)), "layernorm dbias"));
  else CHECK(bitwise_equal(gdb, round_to<float>(db0)));  // untouched without bias
  // deterministic: a second run from the same start is bitwise the same
  CHECK(bitwise_equal(gdi, dinp2.download()));
  CHECK(bitwise_equal(gdw, dw2.download()));
  CHECK(bitwise_equal(gdb, db2.download()));
}

// ---- gelu -------------------------------------------------------------------------------------

// offset: start the buffers one element into an allocation (misaligned: the scalar path).
template <typename T>
void check_gelu(size_t N, size_t offset, GeluForm form = GeluForm::Tanh) {
  INFO(type_name<T>() << " gelu N=" << N << " offset=" << offset << (form == GeluForm::Erf ? " erf" : " tanh"));
  TestContext tc;
  std::vector<double> xs = random_vector(N + offset, 40, -6.0, 6.0);
  DeviceArray<T> inp(xs), out(N + offset), dout(random_vector(N + offset, 41));
  const std::vector<double> di0 = random_vector(N + offset, 42);
  DeviceArray<T> dinp(di0);
  sync();
  gpu::gelu_forward(tc.ctx, out.ptr + offset, inp.ptr + offset, N, form);
  gpu::gelu_backward(tc.ctx, dinp.ptr + offset, inp.ptr + offset, dout.ptr + offset, N, form);
  const std::vector<double> x = inp.rounded(), d = dout.rounded();
  std::vector<double> ref_out(N + offset, 0.0), ref_di = round_to<T>(di0);
  cpu::gelu_forward(ref_out.data() + offset, x.data() + offset, N, form);
  cpu::gelu_backward(ref_di.data() + offset, x.data() + offset, d.data() + offset, N, form);
  // q = 1 / (1 + exp(-2u)), 2u = 2s(x + 0.044715 x^3): computed with relative error <= 4 u_f,
  // i.e. absolute error <= 4 u_f |2u| <= 4 u_f * 25 for |x| <= 6; expf adds 2 ulp; so q has
  // relative error <= 104 u_f, and out = x q (one more rounding) <= 106 u_f: rtol 128 u_f plus
  // the rounding to T. The derivative's terms (<= 16 in size for |x| <= 6) carry the same
  // relative error: |err| <= 128 u_f (|dinp0| + 16 |dout|) + u_T |ref|. The erf form is
  // tighter (erfcf and expf within a few ulp, terms <= 1.1 in size), so the same bounds hold.
  std::vector<double> got_out = out.download(), got_di = dinp.download();
  CHECK(all_close(got_out, ref_out, 128 * kUf + store_rtol<T>(), 1e-30, "gelu_forward"));
  CHECK(all_close(got_di, ref_di, store_rtol<T>(), 128 * kUf * (max_abs(di0) + 16 * max_abs(d)),
                  "gelu_backward"));
}

// ---- residual ---------------------------------------------------------------------------------

template <typename T>
void check_residual(size_t N) {
  INFO(type_name<T>() << " residual N=" << N);
  TestContext tc;
  const std::vector<double> a0 = random_vector(N, 50), b0 = random_vector(N, 51), d0 = random_vector(N, 52),
                            g1 = random_vector(N, 53), g2 = random_vector(N, 54);
  DeviceArray<T> a(a0), b(b0), out(N), dout(d0), da(g1), db(g2), dsame(g1), alias(a0), alias2(b0);
  sync();
  gpu::residual_forward(tc.ctx, out.ptr, a.ptr, b.ptr, N);
  gpu::residual_forward(tc.ctx, alias.ptr, alias.ptr, b.ptr, N);    // out == inp1
  gpu::residual_forward(tc.ctx, alias2.ptr, a.ptr, alias2.ptr, N);  // out == inp2
  gpu::residual_backward(tc.ctx, da.ptr, db.ptr, dout.ptr, N);
  gpu::residual_backward(tc.ctx, dsame.ptr, dsame.ptr, dout.ptr, N);  // dinp1 == dinp2: += 2 dout
  const std::vector<double> ar = a.rounded(), br = b.rounded(), d = dout.rounded();
  std::vector<double> ref(N), r1 = round_to<T>(g1), r2 = round_to<T>(g2), rs = round_to<T>(g1);
  cpu::residual_forward(ref.data(), ar.data(), br.data(), N);
  cpu::residual_backward(r1.data(), r2.data(), d.data(), N);
  cpu::residual_backward(rs.data(), rs.data(), d.data(), N);
  // each output is one float add of T values (2 dout is exact), stored as T
  const double u = store_rtol<T>();
  CHECK(all_close(out.download(), ref, u, 1e-30, "residual_forward"));
  CHECK(all_close(alias.download(), ref, u, 1e-30, "residual_forward out == inp1"));
  CHECK(all_close(alias2.download(), ref, u, 1e-30, "residual_forward out == inp2"));
  CHECK(all_close(da.download(), r1, u, 1e-30, "residual_backward dinp1"));
  CHECK(all_close(db.download(), r2, u, 1e-30, "residual_backward dinp2"));
  CHECK(all_close(dsame.download(), rs, u, 1e-30, "residual_backward dinp1 == dinp2"));
}

// ---- dropout ----------------------------------------------------------------------------------

// offset: the buffers start that many elements into their allocations (offset 1 with C % 4 == 0:
// the element-wise path of a C that would allow the vector path, as for a misaligned view).
template <typename T>
void check_dropout(int B, int Tn, int C, size_t offset = 0) {
  INFO(type_name<T>() << " dropout B=" << B << " T=" << Tn << " C=" << C << " offset=" << offset);
  TestContext tc;
  const size_t n = (size_t)B * Tn * C, na = n + offset;
  const philox::DropoutKey key = philox::make_dropout_key(tg_test::test_seed() + 77, 13, 2, philox::kSiteMlp, 0.17);
  const std::vector<double> x0 = nonzero_vector(na, 60), d0 = nonzero_vector(na, 61), g0 = random_vector(na, 62);
  DeviceArray<T> inp(x0), out(na), inplace(x0), dout(d0), dinp(g0);
  // the n elements of an allocation's view, as double
  auto view = [offset](const std::vector<double>& v) { return std::vector<double>(v.begin() + offset, v.end()); };
  sync();
  gpu::dropout_forward(tc.ctx, out.ptr + offset, inp.ptr + offset, key, B, Tn, C);
  gpu::dropout_forward(tc.ctx, inplace.ptr + offset, inplace.ptr + offset, key, B, Tn, C);  // out == inp
  gpu::dropout_backward(tc.ctx, dinp.ptr + offset, dout.ptr + offset, key, B, Tn, C);
  const std::vector<double> x = view(inp.rounded()), d = view(dout.rounded()), g = view(g0);
  std::vector<unsigned char> mask(n);
  cpu::dropout_mask(mask.data(), key, B, Tn, C);
  std::vector<double> ref(n), rdi = round_to<T>(g);
  cpu::dropout_forward(ref.data(), x.data(), key, B, Tn, C);
  cpu::dropout_backward(rdi.data(), d.data(), key, B, Tn, C);
  const std::vector<double> got = view(out.download());
  // the set of zeroed elements is exactly the CPU mask's (inputs are never 0)
  size_t mismatches = 0, dropped = 0;
  for (size_t i = 0; i < n; ++i) {
    mismatches += (got[i] == 0.0) != (mask[i] == 0);
    dropped += mask[i] == 0;
  }
  CHECK(mismatches == 0);
  // and the mask is a real one: about 17% dropped (5 sigma of a binomial)
  const double sigma = std::sqrt(n * 0.17 * 0.83);
  CHECK(std::fabs((double)dropped - 0.17 * n) < 5 * sigma + 1);
  // kept values: x * scale in float, stored as T
  const double u = store_rtol<T>();
  CHECK(all_close(got, ref, u, 1e-30, "dropout_forward"));
  CHECK(all_close(view(inplace.download()), ref, u, 1e-30, "dropout_forward in place"));
  // dinp0 + (x scale): the product rounded in float, the sum in float then to T:
  // |err| <= u_f (|dinp0| + scale |dout|) + store_rtol |ref|
  CHECK(all_close(view(dinp.download()), rdi, u, 2 * kUf * (max_abs(g) + key.scale * max_abs(d)), "dropout_backward"));
  // the elements before the view are untouched
  if (offset) {
    CHECK(out.download()[0] == 0.0);
    CHECK(bitwise_equal(std::vector<double>(1, dinp.download()[0]), round_to<T>(std::vector<double>(1, g0[0]))));
  }

  // p = 0: identity (forward a copy, backward a plain +=)
  const philox::DropoutKey none = philox::make_dropout_key(1, 0, 0, philox::kSiteMlp, 0.0);
  DeviceArray<T> out0(na), dinp0(g0);
  sync();
  gpu::dropout_forward(tc.ctx, out0.ptr + offset, inp.ptr + offset, none, B, Tn, C);
  gpu::dropout_backward(tc.ctx, dinp0.ptr + offset, dout.ptr + offset, none, B, Tn, C);
  std::vector<double> rdi0 = round_to<T>(g);
  for (size_t i = 0; i < n; ++i) rdi0[i] += d[i];
  CHECK(bitwise_equal(view(out0.download()), x));
  CHECK(all_close(view(dinp0.download()), rdi0, u, 1e-30, "dropout_backward p = 0"));
}

// ---- cross-entropy ----------------------------------------------------------------------------

template <typename T>
void check_cross_entropy(int N, int V) {
  INFO(type_name<T>() << " cross_entropy N=" << N << " V=" << V);
  TestContext tc;
  const size_t n = (size_t)N * V;
  const std::vector<double> z0 = random_vector(n, 70, -4.0, 4.0);
  std::vector<int32_t> y = random_tokens(N, V, 71);
  y[0] = 0;
  y[N - 1] = V - 1;
  DeviceArray<T> logits(z0), dlogits(n), inplace(z0);
  DeviceArray<float> losses(N), losses_fb(N), losses_in(N);
  DeviceBuf<int32_t> targets(y);
  const float dloss = 1.0f / N;
  sync();
  gpu::cross_entropy_forward(tc.ctx, losses.ptr, logits.ptr, targets.ptr, N, V);
  gpu::cross_entropy_forward_backward(tc.ctx, losses_fb.ptr, dlogits.ptr, logits.ptr, targets.ptr, dloss, N, V);
  gpu::cross_entropy_forward_backward(tc.ctx, losses_in.ptr, inplace.ptr, inplace.ptr, targets.ptr, dloss, N, V);
  const std::vector<double> z = logits.rounded();
  std::vector<double> rl(N), rl2(N), rd(n);
  cpu::cross_entropy_forward(rl.data(), z.data(), y.data(), N, V);
  cpu::cross_entropy_forward_backward(rl2.data(), rd.data(), z.data(), y.data(), (double)dloss, N, V);
  // S = sum exp(z - M): each term with relative error <= 2 ulp (expf) + 8 u_f (the rounding of
  // z - M, |z - M| <= 8), summed in float over ceil(V/32) (V <= 1024: a warp per row) or
  // ceil(V/512) terms per thread and a tree: relative error of S <= (terms + 20) u_f =: k.
  // loss = M + log S - z_y: log S carries k absolutely, logf and the two adds a few u_f of
  // |lse| each: atol = k + 8 u_f (1 + max|lse|). (k (1 + max|lse|) would be ~10x looser: at
  // V = 50257 it let a kernel that skipped a few columns pass.) The losses are float for every T.
  const double terms = V <= 1024 ? std::ceil(V / 32.0) : std::ceil(V / 512.0);
  const double k = (terms + 20) * kUf;
  double lse_max = 0;
  for (int i = 0; i < N; ++i) lse_max = std::max(lse_max, std::fabs(rl[i] + z[(size_t)i * V + y[i]]));
  const double atol_loss = k + 8 * kUf * (1 + lse_max);
  CHECK(all_close(losses.download(), rl, 0.0, atol_loss, "cross_entropy_forward loss"));
  CHECK(all_close(losses_fb.download(), rl, 0.0, atol_loss, "cross_entropy_forward_backward loss"));
  CHECK(all_close(losses_in.download(), rl, 0.0, atol_loss, "cross_entropy in place loss"));
  // dlogits = (p - [v == y]) dloss, p = exp(z - M) / S with relative error <= k + 4 u_f, the
  // subtraction of 1 another u_f: |err| <= (k + 6 u_f) dloss + store_rtol |ref|.
  const double u = store_rtol<T>();
  CHECK(all_close(dlogits.download(), rd, u, (k + 6 * kUf) * dloss, "cross_entropy dlogits"));
  CHECK(all_close(inplace.download(), rd, u, (k + 6 * kUf) * dloss, "cross_entropy dlogits in place"));
}

// ---- AdamW, global norm, clip ---------------------------------------------------------------

template <typename T>
void check_adamw(bool with_scale, bool with_copy) {
  INFO(type_name<T>() << " adamw" << (with_scale ? " clip factor" : " no clip factor")
                      << (with_copy ? " copy" : " no copy"));
  TestContext tc;
  const std::vector<size_t> sizes = {1, 67, 1000, 3, 4099, 33};
  const std::vector<float> decays = {0.0f, 0.1f, 0.05f, 0.0f, 0.2f, 0.01f};
  std::vector<gpu::AdamWTensor> table;
  size_t N = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    table.push_back({N, sizes[i], decays[i]});
    N += sizes[i];
  }
  const std::vector<double> w0 = random_vector(N, 80), g0 = random_vector(N, 81), m0 = random_vector(N, 82, -0.1, 0.1),
                            v0 = random_vector(N, 83, 0.0, 0.01);
  DeviceArray<float> w(w0), g(g0), m(m0), v(v0);
  DeviceArray<T> copy(N);
  DeviceBuf<gpu::AdamWTensor> tensors(table);
  const float scale = 0.37f;
  DeviceArray<float> scale_d(std::vector<double>{scale});
  const gpu::AdamWArgs args{1e-3f, 0.9f, 0.95f, 1e-8f, 7};
  sync();
  gpu::adamw_update(tc.ctx, w.ptr, with_copy ? copy.ptr : (T*)nullptr, g.ptr, m.ptr, v.ptr, N, tensors.ptr,
                    (int)table.size(), args, with_scale ? scale_d.ptr : nullptr);
  // reference: the clip factor applied to the gradients first, then AdamW tensor by tensor
  std::vector<double> rw = round_to<float>(w0), rg = round_to<float>(g0), rm = round_to<float>(m0),
                      rv = round_to<float>(v0);
  const double g_abs_max = max_abs(rg), m_abs_max = max_abs(rm), v_abs_max = max_abs(rv);
  if (with_scale)
    for (double& x : rg) x *= (double)scale;
  const std::vector<double> m_old = rm;
  for (const gpu::AdamWTensor& t : table)
    cpu::adamw_update(rw.data() + t.offset, rg.data() + t.offset, rm.data() + t.offset, rv.data() + t.offset, t.numel,
                      args.lr, args.beta1, args.beta2, args.eps, t.weight_decay, args.t);
  // m = b1 m + (1 - b1) g s: a few roundings of terms <= max|m| + max|g|; v likewise with g^2.
  CHECK(all_close(m.download(), rm, 4 * kUf, 4 * kUf * (m_abs_max + g_abs_max), "adamw m"));
  CHECK(all_close(v.download(), rv, 4 * kUf, 4 * kUf * (v_abs_max + g_abs_max * g_abs_max), "adamw v"));
  // w = w (1 - lr wd) - lr r, r = mhat / (sqrt(vhat) + eps). m carries 4 u_f of
  // |b1 m_old| + |(1 - b1) g| (it may cancel), v (all terms >= 0) 3 u_f relative, so sqrt(vhat)
  // 2 u_f; rbc1 and rbc2 one rounding each, the add and the divide one each: |err of r| <=
  // 12 u_f R with R = rbc1 (|b1 m_old| + |(1 - b1) g|) / (sqrt(vhat) + eps) >= |r|. So
  // |err| <= 4 u_f |w| + 16 u_f lr R_max.
  double R_max = 0;
  const double rbc1 = 1.0 / (1.0 - std::pow((double)args.beta1, args.t)),
               rbc2 = 1.0 / (1.0 - std::pow((double)args.beta2, args.t));
  for (size_t i = 0; i < N; ++i) {
    const double mag = (double)args.beta1 * std::fabs(m_old[i]) + (1.0 - (double)args.beta1) * std::fabs(rg[i]);
    R_max = std::max(R_max, rbc1 * mag / (std::sqrt(rv[i] * rbc2) + args.eps));
  }
  const std::vector<double> got_w = w.download();
  CHECK(all_close(got_w, rw, 4 * kUf, 16 * kUf * args.lr * R_max, "adamw params"));
  if (with_copy) CHECK(bitwise_equal(copy.download(), round_to<T>(got_w)));  // exactly the params rounded to T
  else CHECK(max_abs(copy.download()) == 0.0);                                // untouched
}

void check_global_norm(size_t N) {
  INFO("global_norm_squared N=" << N);
  TestContext tc(gpu::global_norm_scratch_bytes(N));
  const std::vector<double> g0 = random_vector(N, 90);
  DeviceArray<float> g(g0), out(1), out2(1);
  sync();
  gpu::global_norm_squared(tc.ctx, out.ptr, g.ptr, N);
  gpu::global_norm_squared(tc.ctx, out2.ptr, g.ptr, N);
  const std::vector<double> gr = g.rounded();
  const double norm = cpu::global_norm(gr.data(), N);
  // double accumulation (N u_d, negligible), then one rounding to float: <= u_f |ref| (+ 1 u_f)
  const std::vector<double> got = out.download();
  CHECK(all_close(got, {norm * norm}, 2 * kUf, 1e-30, "global_norm_squared"));
  CHECK(bitwise_equal(got, out2.download()));
}

}  // namespace

TG_GPU_TEST("gpu encoder_forward matches cpu::encoder_forward") {
  for (const std::vector<int>& s : std::vector<std::vector<int>>{{1, 1, 33, 7}, {3, 97, 67, 101}, {2, 1025, 45, 65}}) {
    check_encoder_forward<float>(s[0], s[1], s[2], s[3]);
    check_encoder_forward<gpu::bf16>(s[0], s[1], s[2], s[3]);
  }
}

// a host function, tested with the GPU ops it serves
TG_GPU_TEST("gpu encoder_backward_order: positions by token, each token's in increasing order") {
  for (const std::vector<int>& s : std::vector<std::vector<int>>{{1, 1}, {97, 5}, {1025, 65}, {333, 1000}, {64, 1}}) {
    const int N = s[0], V = s[1];
    INFO("N=" << N << " V=" << V);
    std::vector<int32_t> tok = random_tokens((size_t)N, V, 15);
    std::vector<uint32_t> keys(N), vals(N), counts((size_t)V + 1);
    gpu::encoder_backward_order(keys.data(), vals.data(), counts.data(), tok.data(), N, V);
    std::vector<int> seen(N, 0);
    for (int i = 0; i < N; ++i) {
      REQUIRE(vals[i] < (uint32_t)N);
      CHECK(keys[i] == (uint32_t)tok[vals[i]]);
      ++seen[vals[i]];
      if (i > 0) CHECK((keys[i - 1] < keys[i] || (keys[i - 1] == keys[i] && vals[i - 1] < vals[i])));
    }
    CHECK(std::count(seen.begin(), seen.end(), 1) == N);  // a permutation of the positions
  }
  std::vector<int32_t> bad = {0, 3, 1};
  std::vector<uint32_t> keys(3), vals(3), counts(4);
  CHECK_THROWS_WITH_AS(gpu::encoder_backward_order(keys.data(), vals.data(), counts.data(), bad.data(), 3, 3),
                       "encoder_backward_order: token 3 at position 1 outside [0, 3)", std::invalid_argument);
}

TG_GPU_TEST("gpu encoder_backward matches cpu::encoder_backward, deterministic, +=") {
  // (B, T, C, V, skewed): many repeats (V = 5, V = 1: one token spans every chunk), V = 1000,
  // N not a multiple of the chunk, a single position, and the char-level shape.
  struct Case { int B, Tn, C, V; bool skewed; };
  for (Case s : {Case{4, 97, 67, 5, false}, Case{3, 1025, 45, 5, true}, Case{2, 77, 33, 1, false},
                 Case{3, 1025, 70, 1000, false}, Case{5, 97, 67, 1000, true}, Case{1, 1, 31, 7, false},
                 tg_test::reduced_matrix() ? Case{4, 256, 384, 65, true} : Case{16, 1024, 384, 65, true}}) {
    check_encoder_backward<float>(s.B, s.Tn, s.C, s.V, s.skewed);
    check_encoder_backward<gpu::bf16>(s.B, s.Tn, s.C, s.V, s.skewed);
  }
}

TG_GPU_TEST("gpu layernorm_forward matches cpu::layernorm_forward") {
  for (const std::vector<int>& s : std::vector<std::vector<int>>{{1, 67}, {7, 45}, {97, 67}, {1025, 768}, {3, 1600}, {4, 1}, {33, 5}}) {
    for (bool bias : {true, false}) {
      check_layernorm_forward<float>(s[0], s[1], bias);
      check_layernorm_forward<gpu::bf16>(s[0], s[1], bias);
    }
  }
}

TG_GPU_TEST("gpu layernorm_backward matches cpu::layernorm_backward, deterministic, +=") {
  // 1600 columns with bias: 51 KB of shared memory (the opt-in path); C = 1 and C = 5: rows
  // narrower than a warp
  const std::vector<std::vector<int>> shapes = {{1, 67},     {7, 45},    {97, 67}, {1025, 384},
                                                {5000, 33},  {37, 1600}, {4, 1},   {33, 5}};
  for (const std::vector<int>& s : shapes) {
    for (bool bias : {true, false}) {
      check_layernorm_backward<float>(s[0], s[1], bias);
      check_layernorm_backward<gpu::bf16>(s[0], s[1], bias);
    }
  }
}

TG_GPU_TEST("gpu gelu forward / backward match cpu::gelu, both forms") {
  for (size_t n : {(size_t)1, (size_t)7, (size_t)1025, (size_t)4099, (size_t)65536}) {
    for (size_t offset : {(size_t)0, (size_t)1}) {
      for (GeluForm form : {GeluForm::Tanh, GeluForm::Erf}) {
        check_gelu<float>(n, offset, form);
        check_gelu<gpu::bf16>(n, offset, form);
      }
    }
  }
}

TG_GPU_TEST("gpu residual forward / backward match cpu::residual (aliasing included)") {
  for (size_t n : {(size_t)1, (size_t)7, (size_t)1025, (size_t)65543}) {
    check_residual<float>(n);
    check_residual<gpu::bf16>(n);
  }
}

TG_GPU_TEST("gpu dropout: same mask as cpu::dropout_mask, values and += as cpu::dropout") {
  // C = 67: groups of 4 with a short tail (scalar path); C = 64: vector path
  for (const std::vector<int>& s : std::vector<std::vector<int>>{{3, 97, 67}, {2, 33, 64}, {1, 1, 5}, {4, 64, 384}}) {
    check_dropout<float>(s[0], s[1], s[2]);
    check_dropout<gpu::bf16>(s[0], s[1], s[2]);
  }
  // C % 4 == 0 but the views start one element into their buffers: the element-wise path
  check_dropout<float>(2, 33, 64, 1);
  check_dropout<gpu::bf16>(2, 33, 64, 1);
}

TG_GPU_TEST("gpu cross_entropy matches cpu::cross_entropy (warp and block rows, in place)") {
  for (const std::vector<int>& s : std::vector<std::vector<int>>{{7, 65}, {97, 1000}, {33, 1025}, {5, 50257}, {1, 1}}) {
    check_cross_entropy<float>(s[0], s[1]);
    check_cross_entropy<gpu::bf16>(s[0], s[1]);
  }
}

TG_GPU_TEST("gpu loss_mean is the mean") {
  for (int N : {1, 7, 1025, 16384}) {
    INFO("loss_mean N=" << N);
    TestContext tc;
    const std::vector<double> l0 = random_vector(N, 95, 0.0, 10.0);
    DeviceArray<float> losses(l0), out(1);
    sync();
    gpu::loss_mean(tc.ctx, out.ptr, losses.ptr, N);
    const std::vector<double> l = losses.rounded();
    double s = 0;
    for (double x : l) s += x;
    // double accumulation, then one rounding to float
    CHECK(all_close(out.download(), {s / N}, 2 * kUf, 1e-30, "loss_mean"));
  }
}

TG_GPU_TEST("gpu adamw_update matches cpu::adamw_update per tensor (clip factor first)") {
  for (bool scale : {true, false}) {
    for (bool copy : {true, false}) {
      check_adamw<float>(scale, copy);
      check_adamw<gpu::bf16>(scale, copy);
    }
  }
}

TG_GPU_TEST("gpu global_norm_squared matches cpu::global_norm, deterministic") {
  for (size_t n : {(size_t)1, (size_t)1025, (size_t)(1 << 20) + 7, (size_t)10000019}) check_global_norm(n);
}

TG_GPU_TEST("gpu clip_scale follows cpu::clip_grad_norm") {
  TestContext tc;
  struct Case { double norm_sq; float max_norm; };
  for (Case c : {Case{16.0, 1.0f}, Case{16.0, 10.0f}, Case{0.0, 1.0f}, Case{2.5e-3, 0.01f}, Case{16.0, 0.0f},
                 Case{INFINITY, 1.0f}, Case{NAN, 1.0f}}) {
    INFO("clip_scale norm^2=" << c.norm_sq << " max_norm=" << c.max_norm);
    DeviceArray<float> ns(std::vector<double>{c.norm_sq}), scale(1);
    sync();
    gpu::clip_scale(tc.ctx, scale.ptr, ns.ptr, c.max_norm);
    const double nsf = ns.rounded()[0];
    double expect = 1.0;  // max_norm <= 0 or a non-finite norm: no clipping
    if (c.max_norm > 0 && std::isfinite(nsf))
      expect = (float)cpu::clip_grad_norm((double*)nullptr, 0, std::sqrt(nsf), (double)c.max_norm);
    CHECK(scale.download()[0] == expect);
  }
}

TG_GPU_TEST("gpu copy_params rounds the master weights to T") {
  TestContext tc;
  const size_t N = 1025;
  DeviceArray<float> src(random_vector(N, 99));
  DeviceArray<float> dst_f(N);
  DeviceArray<gpu::bf16> dst_b(N);
  sync();
  gpu::copy_params(tc.ctx, dst_f.ptr, src.ptr, N);
  gpu::copy_params(tc.ctx, dst_b.ptr, src.ptr, N);
  const std::vector<double> s = src.rounded();
  CHECK(bitwise_equal(dst_f.download(), s));
  CHECK(bitwise_equal(dst_b.download(), round_to<gpu::bf16>(s)));
}
