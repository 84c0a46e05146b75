// tests/emu/test_flash_emu.cpp: the fused flash-attention kernels (kernels/flash_attn_fwd.cu,
// kernels/flash_attn_bwd.cu, unmodified) EXECUTED on the CPU by the SIMT emulator of
// tests/emu/simt_emulator.h (what it emulates and what it cannot show: its header), through
// the real launchers gpu::flash_attn_forward / gpu::flash_attn_backward, against the CPU spec
// cpu::attention_tiled_forward / _backward run in double on the same (T-rounded) inputs.
// This is how CI, which has no GPU, runs the kernels; tests/gpu/ repeats this on a device.
//
// Every case (check_case) checks, for T = bf16 (tensor-core kernels) and T = float (SIMT):
//   - O, lse, dQ, dK, dV against the fp64 spec within the tolerances derived below, the
//     worst element and its index reported on failure;
//   - the += contract: dqkv starts from random values (of the size of the gradient) and the
//     kernels' result minus the start is compared;
//   - guard elements past the ends of out, lse, dqkv (and the mask) come back untouched;
//   - cp.async reads only qkv and dout (registered as the only global buffers), every shared
//     memory access in bounds and aligned, barriers and warp collectives used correctly
//     (checked by the emulator; a violation throws and fails the case).
// What the test cases cover (the emulator switches fibers at every warp collective, so the
// matrix is kept small: the whole suite takes about 40 s on 2 cores):
//   1, 2. T in {1, 17, 97} x HS in {32, 64, 128} x causal x p in {0, 0.17}, bf16 and
//         float; B = 2, NH = 2 (batch and head offsets both exercised; the float path, the
//         slower one to emulate, with NH = 1 at T = 97).
//   3. bf16, T = 130 (two full 64-key tiles and a partial one): HS in {32, 64, 128}, causal,
//      p = 0.17 (p = 0 only at HS = 64), B = 1, NH = 2.
//   4. float, T = 130 (four full 32-row tiles and a partial one; T = 97 already has three and
//      a partial one): HS = 64 causal p = 0 and HS = 128 causal p = 0.17 (and HS = 32 in 5).
//   5. the mask hook equals the CPU mask byte for byte, including the entries above the
//      causal diagonal that both leave untouched (sentinel 0xAB); p = 0.17 and p = 0 (where
//      the bf16 forward runs its dropout path with threshold 0 to fill the hook).
//   6. two runs are bitwise identical (O, lse, dqkv, mask), the second with the emulator's
//      warps and lanes scheduled in the opposite order in every CTA.
//   7. the emulator's own checks fire (a deadlocked barrier, a tile read before its cp.async
//      wait, a store past the dynamic shared memory), so the checks above are not vacuous.
//
// Tolerances. Inputs are rounded to T first and the spec runs in double on the rounded values,
// so only the kernels' own arithmetic is measured. u = 2^-8 is the bf16 unit roundoff,
// u32 = 2^-24 the fp32 one.
//   bf16, O, dQ, dK, dV: |x - ref| <= 4u max|ref| = 1.5625e-2 of the tensor's max (plus
//     u |x| per element for the final rounding of the += result). On any path from the inputs
//     to an output the bf16 kernels round three times to bf16: P~ (forward) or P, dS
//     (backward) before their second tensor-core product, O before D = rowsum(dO o O) (the
//     contract: D from the stored O), and the stored result itself; fp32 accumulation adds
//     ~HS u32, nothing at this scale. Each rounding is at most u relative, so the worst case
//     is ~3u of the tensor's magnitude; the roundings of the P or dS elements enter sums with
//     random signs, so typically the error is ~1u (~3e-3 measured). 4u leaves a margin of 4x
//     over the measurement, while a wrong causal or tail mask, a wrong tile, a swapped
//     fragment index or a missing rescale changes whole rows by O(1) of their size (7% and
//     far more, measured with planted bugs).
//   float, O, dQ, dK, dV: |x - ref| <= 4 n u32 max|ref|, n = T + HS: every output is at most
//     three chained fp32 sums of at most max(T, HS) terms (S, then P V or dS K, with D and
//     the row sums in between), each within gamma_n ~ n u32 of the sum of |terms|, which for
//     these inputs is of the order of the tensor's max (6e-5 at T = 130, HS = 128: loose
//     against the ~1e-6 measured, and still 1000x below any of the bugs above).
//   dQ, dK (both): plus an absolute floor for the error inherited from D = rowsum(dO o O),
//     derived at d_floors (it matters where the spec's dQ, dK are exactly 0: T = 1).
//   lse (both): |lse - ref| <= 64 u32 (1 + max|ref|): fp32 in both kernels; the row sum l of
//     up to T terms (T u32 relative at worst, < 2e-5 here), the exp2 / log rounding and the
//     fp32 m scale + log l. A missing rescale moves lse by O(1).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../kernels/cpu/attention_tiled.h"
#include "../../kernels/flash_attn.cuh"
#include "../../kernels/philox.h"
#include "../common/qkv_slices.h"
#include "../cpu/test_util.h"
#include "emu_internal.h"

namespace {

using gpu::bf16;

constexpr double kU32 = 5.9604644775390625e-8;  // 2^-24
constexpr uint8_t kMaskSentinel = 0xAB;
constexpr double kGuard = 12288.0;  // 1.5 * 2^13: exact in bf16 and float
constexpr size_t kGuardElems = 64;

struct Case {
  int B, Tn, NH, HS;
  bool causal;
  double p;
  bool mask;  // ask for the mask hook
  int C() const { return NH * HS; }
  size_t nqkv() const { return (size_t)B * Tn * 3 * C(); }
  size_t nout() const { return (size_t)B * Tn * C(); }
  size_t nlse() const { return (size_t)B * NH * Tn; }
  size_t natt() const { return (size_t)B * NH * Tn * Tn; }
};

std::string describe(const Case& c, const char* type) {
  std::ostringstream s;
  s << type << " B=" << c.B << " T=" << c.Tn << " NH=" << c.NH << " HS=" << c.HS << (c.causal ? " causal" : " full")
    << " p=" << c.p << (c.mask ? " mask-hook" : "");
  return s.str();
}

template <typename T>
const char* type_name() {
  return std::is_same_v<T, bf16> ? "bf16" : "float";
}

// Values rounded to the storage type T (what the kernels see), back in double.
template <typename T>
std::vector<double> rounded(std::vector<double> v) {
  for (double& x : v) x = gpu::to_float(gpu::from_float<T>((float)x));
  return v;
}
template <typename T>
std::vector<T> to_t(const std::vector<double>& v, size_t guard = 0) {
  std::vector<T> r(v.size() + guard, gpu::from_float<T>((float)kGuard));
  for (size_t i = 0; i < v.size(); ++i) r[i] = gpu::from_float<T>((float)v[i]);
  return r;
}

// The q, k or v third (part 0, 1, 2) of a (B, T, 3C) buffer.
using tg_test::max_abs;

std::vector<double> third(const std::vector<double>& a, const Case& c, int part) {
  return tg_test::qkv_part(a, (size_t)c.B * c.Tn, c.C(), part);
}

struct Result {
  std::vector<double> out, lse, dqkv;  // dqkv: the final buffer (start + gradient)
  std::vector<uint8_t> mask;
};

// The fp64 spec on the rounded inputs (dqkv from zero).
Result cpu_reference(const Case& c, const std::vector<double>& qkv, const std::vector<double>& dout,
                     const philox::DropoutKey& key) {
  Result r;
  r.out.assign(c.nout(), 0.0);
  r.lse.assign(c.nlse(), 0.0);
  if (c.mask) r.mask.assign(c.natt(), kMaskSentinel);
  cpu::attention_tiled_forward<double>(r.out.data(), r.lse.data(), qkv.data(), key, c.B, c.Tn, c.C(), c.NH, c.causal,
                                       64, 64, c.mask ? r.mask.data() : nullptr);
  r.dqkv.assign(c.nqkv(), 0.0);
  cpu::attention_tiled_backward<double>(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), key, c.B,
                                        c.Tn, c.C(), c.NH, c.causal, 64, 64);
  return r;
}

// A device copy of a host vector (cudaMalloc, so the emulator bounds every access), and back.
template <typename T>
struct DeviceCopy {
  T* ptr = nullptr;
  size_t n;
  explicit DeviceCopy(const std::vector<T>& h) : n(h.size()) {
    if (n == 0) return;
    REQUIRE(cudaMalloc(&ptr, n * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceCopy() { cudaFree(ptr); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    if (n) REQUIRE(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

// The real launchers on the emulated device: forward (with the mask hook when asked), backward
// into dqkv_start. Every output buffer carries kGuardElems guard elements past its end, which
// must come back untouched.
template <typename T>
Result run_flash(const Case& c, const std::vector<double>& qkv, const std::vector<double>& dout,
                 const std::vector<double>& dqkv_start, const philox::DropoutKey& key) {
  std::vector<float> lse0(c.nlse() + kGuardElems, (float)kGuard);
  std::fill(lse0.begin(), lse0.begin() + (long)c.nlse(), -7.f);
  DeviceCopy<T> d_qkv(to_t<T>(qkv)), d_dout(to_t<T>(dout));
  DeviceCopy<T> d_out(to_t<T>(std::vector<double>(c.nout(), -7.0), kGuardElems));
  DeviceCopy<float> d_lse(lse0);
  DeviceCopy<T> d_dqkv(to_t<T>(dqkv_start, kGuardElems));
  DeviceCopy<uint8_t> d_mask(std::vector<uint8_t>(c.mask ? c.natt() + kGuardElems : 0, kMaskSentinel));
  gpu::Context ctx;
  ctx.create(gpu::flash_attn_scratch_bytes(c.B, c.Tn, c.C(), c.NH));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the uploads ran on the legacy stream
  try {
    gpu::flash_attn_forward<T>(ctx, d_out.ptr, d_lse.ptr, d_qkv.ptr, key, c.B, c.Tn, c.C(), c.NH, c.causal,
                               c.mask ? d_mask.ptr : nullptr);
    gpu::flash_attn_backward<T>(ctx, d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, key, c.B, c.Tn, c.C(),
                                c.NH, c.causal);
  } catch (const std::exception& e) {
    FAIL(e.what());
  }
  REQUIRE(cudaStreamSynchronize(ctx.stream) == cudaSuccess);
  ctx.destroy();
  Result r;
  auto back = [](const auto& v, size_t n, std::vector<double>& dst, const char* what) {
    dst.resize(n);
    size_t bad = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const double x = gpu::to_float(v[i]);
      if (i < n) dst[i] = x;
      else bad += x != kGuard;
    }
    INFO(bad << " guard elements past the end of " << what << " overwritten");
    CHECK(bad == 0);
  };
  back(d_out.download(), c.nout(), r.out, "out");
  back(d_lse.download(), c.nlse(), r.lse, "lse");
  back(d_dqkv.download(), c.nqkv(), r.dqkv, "dqkv");
  if (c.mask) {
    std::vector<uint8_t> m = d_mask.download();
    size_t bad = 0;
    for (size_t i = c.natt(); i < m.size(); ++i) bad += m[i] != kMaskSentinel;
    INFO(bad << " guard bytes past the end of the mask overwritten");
    CHECK(bad == 0);
    m.resize(c.natt());
    r.mask = std::move(m);
  }
  return r;
}

// max over elements of |got - ref| - slack_rel |final| must be <= tol max|ref|; reports the
// worst element.
void check_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref,
                 const std::vector<double>* final_values, double slack_rel, double tol_rel, double tol_abs_extra = 0) {
  const double scale = max_abs(ref);
  const double bound = tol_rel * scale + tol_abs_extra;
  double worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double e = std::fabs(got[i] - ref[i]);
    if (final_values) e -= slack_rel * std::fabs((*final_values)[i]);
    if (!(e <= worst)) {  // NaN counts as worst
      worst = e;
      at = i;
      if (std::isnan(e)) break;
    }
  }
  INFO(what << ": worst element " << at << " of " << ref.size() << ": got " << got[at] << ", spec " << ref[at]
            << ", error " << worst << " > bound " << bound << " (= " << worst / std::max(scale, 1e-300)
            << " of max|spec| " << scale << ")");
  CHECK(worst <= bound);
}

// The error the dQ, dK of the kernels inherit from D_i = rowsum(dO_i o O_i) (the contract: D
// from the stored, T-rounded O), which the spec does not have: where P_ij = 1 (T = 1, the
// first causal row) the spec's dS = P (dP - D) is exactly 0 and the kernels' is ~u |dO| |O|,
// so a tolerance relative to max|spec| alone would be 0. With
//   e_i = |sum_d dO_id (O_kernel - O_spec)_id| + 4 HS u32 s max|v| sum_d |dO_id|
// (the rounding of O, and the fp32 sums of D and dP), dS_ij moves by at most P_ij e_i, so
//   dQ_i by sc max|k| e_i (sum_j P_ij = 1),  dK_j by sc max|q| sum_i P_ij e_i;
// returned with a factor 1.25, as absolute floors {dQ, dK}.
std::pair<double, double> d_floors(const Case& c, const std::vector<double>& qkv, const std::vector<double>& dout,
                                   const std::vector<double>& out_kernel, const Result& ref,
                                   const philox::DropoutKey& key) {
  const size_t C = c.C(), C3 = 3 * C;
  const double sc = 1.0 / std::sqrt((double)c.HS), s = key.threshold ? (double)key.scale : 1.0;
  const double mq = max_abs(third(qkv, c, 0)), mk = max_abs(third(qkv, c, 1)), mv = max_abs(third(qkv, c, 2));
  double fq = 0, fk = 0;
  std::vector<double> e(c.Tn);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.NH; ++h) {
      for (int i = 0; i < c.Tn; ++i) {
        const size_t o = ((size_t)b * c.Tn + i) * C + (size_t)h * c.HS;
        double dd = 0, da = 0;
        for (int d = 0; d < c.HS; ++d) {
          dd += dout[o + d] * (out_kernel[o + d] - ref.out[o + d]);
          da += std::fabs(dout[o + d]);
        }
        e[i] = std::fabs(dd) + 4 * c.HS * kU32 * s * mv * da;
        fq = std::max(fq, sc * mk * e[i]);
      }
      for (int j = 0; j < c.Tn; ++j) {  // sum_i P_ij e_i, P from the spec's lse
        double acc = 0;
        for (int i = c.causal ? j : 0; i < c.Tn; ++i) {
          const double* q = &qkv[((size_t)b * c.Tn + i) * C3 + (size_t)h * c.HS];
          const double* k = &qkv[((size_t)b * c.Tn + j) * C3 + C + (size_t)h * c.HS];
          double dot = 0;
          for (int d = 0; d < c.HS; ++d) dot += q[d] * k[d];
          acc += std::exp(dot * sc - ref.lse[((size_t)b * c.NH + h) * c.Tn + i]) * e[i];
        }
        fk = std::max(fk, sc * mq * acc);
      }
    }
  return {1.25 * fq, 1.25 * fk};
}

// One case: spec, kernels, every comparison of the header. Returns the kernels' result (for
// the bitwise test).
template <typename T>
Result check_case(const Case& c, int schedule = 0) {
  const std::string what = describe(c, type_name<T>());
  INFO(what);
  const bool is_bf16 = std::is_same_v<T, bf16>;
  const double u = gpu::unit_roundoff<T>();
  const philox::DropoutKey key =
      philox::make_dropout_key(testutil::run_seed() ^ 0x5eed5eedull, 41, 3, philox::kSiteAttnProbs, c.p);
  const std::vector<double> qkv = rounded<T>(testutil::random_vec(c.nqkv()));
  const std::vector<double> dout = rounded<T>(testutil::random_vec(c.nout()));
  const Result ref = cpu_reference(c, qkv, dout, key);

  // dqkv starts from random values of the size of each third's gradient (the += contract)
  std::vector<double> start(c.nqkv());
  {
    const double mx[3] = {max_abs(third(ref.dqkv, c, 0)), max_abs(third(ref.dqkv, c, 1)), max_abs(third(ref.dqkv, c, 2))};
    const std::vector<double> r = testutil::random_vec(c.nqkv());
    const size_t C = c.C();
    for (size_t i = 0; i < start.size(); ++i) start[i] = r[i] * std::max(mx[(i % (3 * C)) / C], 1e-3);
    start = rounded<T>(start);
  }
  emu::set_schedule(schedule);
  const Result got = run_flash<T>(c, qkv, dout, start, key);

  const double tol = is_bf16 ? 4 * u : 4.0 * (c.Tn + c.HS) * kU32;
  check_close("O", got.out, ref.out, nullptr, 0, tol);
  check_close("lse", got.lse, ref.lse, nullptr, 0, 64 * kU32, 64 * kU32);
  std::vector<double> grad(c.nqkv());
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = got.dqkv[i] - start[i];
  const std::pair<double, double> fl = d_floors(c, qkv, dout, got.out, ref, key);
  const char* names[3] = {"dQ", "dK", "dV"};
  const double floors[3] = {fl.first, fl.second, 0.0};
  for (int part = 0; part < 3; ++part) {
    const std::vector<double> fin = third(got.dqkv, c, part);
    check_close(names[part], third(grad, c, part), third(ref.dqkv, c, part), &fin, u, tol, floors[part]);
  }
  if (c.mask) {
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < c.natt(); ++i)
      if (got.mask[i] != ref.mask[i] && diff++ == 0) first = i;
    const size_t TT = (size_t)c.Tn * c.Tn;
    INFO("mask hook: " << diff << " of " << c.natt() << " bytes differ from the CPU mask; first at bh="
                       << first / TT << " i=" << (first % TT) / c.Tn << " j=" << first % c.Tn << ": kernel "
                       << (diff ? (int)got.mask[first] : 0) << ", spec " << (diff ? (int)ref.mask[first] : 0));
    CHECK(diff == 0);
  }
  return got;
}

// The full matrix at T in {1, 17, 97}; the float kernels (the slower ones to emulate: a
// shuffle per key) run T = 97 with NH = 1 (their head offsets are covered at T = 1, 17).
template <typename T>
void small_matrix() {
  for (int Tn : {1, 17, 97})
    for (int HS : {32, 64, 128})
      for (bool causal : {true})
        for (double p : {0.0, 0.17})
          check_case<T>(Case{2, Tn, (std::is_same_v<T, float> && Tn == 97) ? 1 : 2, HS, causal, p, false});
}

bool bitwise_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

template <typename T>
void two_runs(const Case& c) {
  INFO(describe(c, type_name<T>()));
  // the same seed for both runs: check_case draws its inputs from testutil::rng(), so replay
  const uint64_t s = testutil::rng()();
  testutil::rng().seed(s);
  const Result a = check_case<T>(c, 0);
  testutil::rng().seed(s);
  const Result b = check_case<T>(c, 1);
  CHECK(bitwise_equal(a.out, b.out));
  CHECK(bitwise_equal(a.lse, b.lse));
  CHECK(bitwise_equal(a.dqkv, b.dqkv));
  CHECK(a.mask == b.mask);
}

}  // namespace

TEST_CASE("flash emulated, bf16: O, lse, dQ, dK, dV match the fp64 spec (T = 1, 17, 97)") { small_matrix<bf16>(); }

TEST_CASE("flash emulated, float: O, lse, dQ, dK, dV match the fp64 spec (T = 1, 17, 97)") { small_matrix<float>(); }

TEST_CASE("flash emulated, bf16: T = 130, two full key tiles and a partial one") {
  for (int HS : {32, 64, 128})
    for (bool causal : {true})
      for (double p : {0.0, 0.17})
        if (p > 0 || HS == 64) check_case<bf16>(Case{1, 130, 2, HS, causal, p, false});
}

TEST_CASE("flash emulated, float: T = 130, four full tiles and a partial one") {
  check_case<float>(Case{1, 130, 2, 64, true, 0.0, false});
  check_case<float>(Case{1, 130, 2, 128, true, 0.17, false});
}

TEST_CASE("flash emulated: the mask hook equals the CPU mask byte for byte") {
  check_case<bf16>(Case{1, 130, 2, 32, true, 0.17, true});
  check_case<float>(Case{1, 130, 2, 32, true, 0.17, true});
  check_case<bf16>(Case{2, 17, 1, 64, true, 0.0, true});
  check_case<float>(Case{2, 17, 1, 64, true, 0.0, true});
}

TEST_CASE("flash emulated: two runs are bitwise identical, under opposite thread orders") {
  two_runs<bf16>(Case{1, 97, 2, 64, true, 0.17, true});
  two_runs<float>(Case{1, 97, 2, 32, true, 0.17, true});
}

// On a part with 99 KB of shared memory a block (the emulated GeForce RTX 4090, compute
// capability 8.9, as the consumer parts of 8.6 and 8.9), the launchers refuse the head sizes
// whose tiles need more, with one sentence naming both sizes, before any launch (out and lse
// untouched), and run the sizes that fit: flash_attn_smem_bytes says which.
TEST_CASE("flash emulated: on a part with 99 KB of shared memory a block, head sizes whose tiles need more are refused, the others run") {
  struct Part {
    std::string before;
    bool had = false;
    Part() {
      if (const char* v = std::getenv("TG_EMU_DEVICE")) had = true, before = v;
      setenv("TG_EMU_DEVICE", "rtx4090", 1);
    }
    ~Part() {
      if (had) setenv("TG_EMU_DEVICE", before.c_str(), 1);
      else unsetenv("TG_EMU_DEVICE");
    }
  } part;
  CHECK(gpu::flash_attn_smem_bytes(64, true) == 56832);   // the dK / dV kernel's tiles
  CHECK(gpu::flash_attn_smem_bytes(96, true) == 104448);  // run as 128
  CHECK(gpu::flash_attn_smem_bytes(128, false) == 66048);  // the SIMT backward
  CHECK(gpu::flash_attn_smem_bytes(256, true) == 135936);  // the dK / dV kernel
  CHECK(gpu::flash_attn_smem_bytes(12, true) == 0);
  const philox::DropoutKey key = philox::make_dropout_key(1, 0, 0, 0, 0.1);
  for (const int HS : {64, 96, 128}) {
    CAPTURE(HS);
    const Case c{1, 17, 2, HS, true, 0.1, false};
    const std::vector<double> qkv = testutil::random_vec(c.nqkv());
    DeviceCopy<bf16> d_qkv(to_t<bf16>(qkv)), d_out(to_t<bf16>(std::vector<double>(c.nout(), -7.0))),
        d_dqkv(to_t<bf16>(std::vector<double>(c.nqkv(), 0.0)));
    DeviceCopy<float> d_lse(std::vector<float>(c.nlse(), -7.f));
    gpu::Context ctx;
    ctx.create(gpu::flash_attn_scratch_bytes(c.B, c.Tn, c.C(), c.NH));
    CHECK(ctx.smem_per_block_optin == 101376);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const bool fits = gpu::flash_attn_smem_bytes(HS, true) <= ctx.smem_per_block_optin;
    CHECK(fits == (HS == 64));
    if (fits) {
      CHECK_NOTHROW(gpu::flash_attn_forward<bf16>(ctx, d_out.ptr, d_lse.ptr, d_qkv.ptr, key, c.B, c.Tn, c.C(), c.NH,
                                                  true, nullptr));
      CHECK_NOTHROW(gpu::flash_attn_backward<bf16>(ctx, d_dqkv.ptr, d_out.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, key,
                                                   c.B, c.Tn, c.C(), c.NH, true));
    } else {
      CHECK_THROWS_WITH_AS(gpu::flash_attn_forward<bf16>(ctx, d_out.ptr, d_lse.ptr, d_qkv.ptr, key, c.B, c.Tn, c.C(),
                                                         c.NH, true, nullptr),
                           doctest::Contains("bytes of shared memory a block; this GPU allows 101376"),
                           std::invalid_argument);
      CHECK_THROWS_WITH_AS(gpu::flash_attn_backward<bf16>(ctx, d_dqkv.ptr, d_out.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr,
                                                          key, c.B, c.Tn, c.C(), c.NH, true),
                           doctest::Contains("--attention naive"), std::invalid_argument);
      const std::vector<bf16> out = d_out.download();
      CHECK(std::all_of(out.begin(), out.end(), [](bf16 v) { return gpu::to_float(v) == -7.f; }));
    }
    REQUIRE(cudaStreamSynchronize(ctx.stream) == cudaSuccess);
    ctx.destroy();
  }
}
