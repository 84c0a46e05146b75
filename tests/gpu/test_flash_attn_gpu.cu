// tests/gpu/test_flash_attn_gpu.cu: the fused flash-attention kernels (kernels/flash_attn.cuh)
// against the CPU spec cpu::attention_tiled_forward / _backward run in double on the same
// (T-rounded) inputs, and against the plain GPU path gpu::attention_naive_* (same precision).
//   1. bf16, FlashAttention's rule: max |flash - ref| <= 2 max |naive - ref| + floor for O
//      and lse, <= 3x + floor for dQ, dK, dV; T in {1, 2, 17, 97, 128, 129, 255, 1023, 1025},
//      HS in {32, 64, 128}, causal, p in {0, 0.17}; and the padded head sizes 40, 80, 96, 200
//      (run as 64, 128, 128, 256) and 256 at fewer T; and not causal (every key of the sequence)
//      at fewer T and sizes.
//   2. float (the SIMT path): within a tolerance derived below from the fp32 unit roundoff.
//   3. the mask hook equals the CPU mask byte for byte (causal: entries above the diagonal left
//      untouched by both); with p = 0.17 about 17% are dropped; the hook does not change out.
//   4. 250 repeated forward + backward runs with B*NH = 528 are bitwise identical (bf16; 20 for
//      float).
//   5. dqkv += (random start), no writes past the ends of out / lse / dqkv.
//   6. scaled inputs (q x5, k x3): no NaN or Inf, and still the rule of 1.
//   7. head sizes that are not multiples of 8 up to 256 are rejected with a message naming the
//      sizes taken.
// Fresh random inputs each run (TG_TEST_SEED replays one); the dropout seed derives from it.
// Uploads are followed by cudaDeviceSynchronize: DeviceArray::upload is a pageable cudaMemcpy,
// which may return before the copy lands, and the launchers run on ctx.stream (non-blocking).
//
// The floors added to the ratio rule of 1 (they matter only where the plain path happens to be
// nearly exact, e.g. T = 1, where O = V): u = 2^-8 the bf16 unit roundoff, u32 = 2^-24.
//   O:        u max|O_ref|: the final rounding of O to bf16 (flash and naive round different
//             fp32 values, so one of them can be off by that rounding while the other is exact).
//   lse:      64 u32 (1 + max|lse_ref|): lse is fp32 in both; exp2 / log approximations (2 ulp
//             each), the rounding of m scale + log l, and the fp32 sums of T terms (typically
//             ~ sqrt(T) ulp) put a few tens of ulp of error in lse regardless of the plain
//             path's luck.
//   dQ/dK/dV: 2 u max|ref| of that tensor: one rounding to bf16 each for flash and naive.
//   dQ/dK, plus the error flash inherits from D_i = rowsum(dO_i o O_i) (the contract: O is the
//             stored, T-rounded output), which the naive path does not have (it takes
//             D_i = sum_j P_ij dP_ij from the same dP, so where P_ij = 1 -- T = 1, the first
//             causal row -- its dS is exactly 0 while flash's is P (dP - D) ~ u |dO| |O|):
//             e_i = |sum_d dO_id (O_flash - O_ref)_id| + 4 HS u32 s max|v| sum_d |dO_id| (the
//             fp32 sums of D and dP), then 1.25 sc max|k| max_i e_i for dQ (sum_j P_ij = 1) and
//             1.25 sc max|q| max_j sum_i P_ij e_i for dK.
// The plain path for lse is a host fp32 loop (max, sum of expf, logf) on the same inputs: the
// naive GPU path saves P, not lse.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../kernels/attention_naive.cuh"
#include "../../kernels/cpu/attention_tiled.h"
#include "../common/qkv_slices.h"
#include "../../kernels/flash_attn.cuh"
#include "../../kernels/flash_attn_hopper.cuh"
#include "../../kernels/philox.h"
#include "gpu_util.cuh"

using tg_test::DeviceArray;
using tg_test::max_abs_diff;
using tg_test::random_vector;

using tg_test::bitwise_equal;
using tg_test::kSentinel;
using tg_test::kU32;

namespace {

struct Shape {
  int B, Tn, NH, HS;
  int C() const { return NH * HS; }
  size_t nqkv() const { return (size_t)B * Tn * 3 * C(); }
  size_t nout() const { return (size_t)B * Tn * C(); }
  size_t nlse() const { return (size_t)B * NH * Tn; }
  size_t natt() const { return (size_t)B * NH * Tn * Tn; }
};

// Whether this device gives a block the shared memory the flash kernels' tiles take at head size
// HS (GeForce parts of compute capability 8.6 and 8.9 allow 99 KB a block: head sizes above 64,
// padded to 128 and 256, do not fit there; the launchers refuse them and train_gpt runs the naive
// path). A size that does not fit is not run; the case says so once per size.
bool flash_fits(int HS, bool bf16) {
  int dev = 0;
  cudaDeviceProp prop{};
  cudaCheck(cudaGetDevice(&dev));
  cudaCheck(cudaGetDeviceProperties(&prop, dev));
  const size_t need = gpu::flash_attn_smem_bytes(HS, bf16);
  if (need <= prop.sharedMemPerBlockOptin) return true;
  static std::set<std::pair<int, bool>> said;
  if (said.insert({HS, bf16}).second)
    MESSAGE("head size " << HS << (bf16 ? " (bf16)" : " (fp32)") << " not run: the flash kernels need " << need
                         << " bytes of shared memory a block, this GPU allows " << prop.sharedMemPerBlockOptin);
  return false;
}

std::string describe(const Shape& s, bool causal, double p) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.Tn) + " NH=" + std::to_string(s.NH) +
         " HS=" + std::to_string(s.HS) + (causal ? " causal" : " full") + " p=" + std::to_string(p);
}

philox::DropoutKey attn_key(double p, uint32_t layer = 3) {
  return philox::make_dropout_key(tg_test::test_seed() ^ 0x5eed5eedull, 41, layer, philox::kSiteAttnProbs, p);
}

size_t scratch_for(const Shape& s, size_t elem) {
  return std::max(gpu::flash_attn_scratch_bytes(s.B, s.Tn, s.C(), s.NH),
                  gpu::attention_naive_scratch_bytes(s.B, s.Tn, s.C(), s.NH, elem));
}

// Inputs: qkv with q, k, v uniform in [-1, 1) (q scaled by qs, k by ks), dout in [-1, 1).
std::vector<double> make_qkv(const Shape& s, uint64_t salt, double qs = 1, double ks = 1) {
  std::vector<double> v = random_vector(s.nqkv(), salt);
  const size_t C = s.C();
  for (size_t r = 0; r < (size_t)s.B * s.Tn; ++r)
    for (size_t c = 0; c < 2 * C; ++c) v[r * 3 * C + c] *= c < C ? qs : ks;
  return v;
}

// The q, k or v third (part 0, 1, 2) of a (B, T, 3C) buffer.
using tg_test::max_abs;

std::vector<double> third(const std::vector<double>& a, const Shape& s, int part) {
  return tg_test::qkv_part(a, (size_t)s.B * s.Tn, s.C(), part);
}

bool all_finite(const std::vector<double>& a) {
  for (double x : a)
    if (!std::isfinite(x)) return false;
  return true;
}

struct Result {
  std::vector<double> out, lse, dqkv;
  std::vector<uint8_t> mask;
};

// The fp64 spec: the tiled CPU algorithm in double on the rounded inputs (dqkv from zero; left
// empty without the backward).
Result cpu_reference(const Shape& s, const std::vector<double>& qkv, const std::vector<double>& dout,
                     const philox::DropoutKey& key, bool causal, bool want_mask, bool backward = true) {
  Result r;
  r.out.assign(s.nout(), 0.0);
  r.lse.assign(s.nlse(), 0.0);
  if (want_mask) r.mask.assign(s.natt(), kSentinel);
  cpu::attention_tiled_forward<double>(r.out.data(), r.lse.data(), qkv.data(), key, s.B, s.Tn, s.C(), s.NH, causal,
                                       64, 64, want_mask ? r.mask.data() : nullptr);
  if (!backward) return r;
  r.dqkv.assign(s.nqkv(), 0.0);
  cpu::attention_tiled_backward<double>(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), key, s.B,
                                        s.Tn, s.C(), s.NH, causal, 64, 64);
  return r;
}

// The flash path on the device: forward (mask hook when asked), backward into dqkv_init (zeros
// when null; left as it is without the backward). Buffers carry `guard` extra elements past their
// ends, filled with a sentinel, which must come back untouched.
template <typename T>
Result run_flash(const gpu::Context& ctx, const Shape& s, const std::vector<double>& qkv,
                 const std::vector<double>& dout, const philox::DropoutKey& key, bool causal, bool want_mask,
                 const std::vector<double>* dqkv_init = nullptr, size_t guard = 0, bool backward = true) {
  const double kGuard = 12288.0;  // 1.5 * 2^13: exact in bf16 and float (12345 is not a bf16 value)
  auto padded = [&](const std::vector<double>& v) {
    std::vector<double> r(v);
    r.resize(v.size() + guard, kGuard);
    return r;
  };
  DeviceArray<T> d_qkv(qkv), d_dout(dout);
  DeviceArray<T> d_out(padded(std::vector<double>(s.nout(), -7.0)));
  DeviceArray<float> d_lse(padded(std::vector<double>(s.nlse(), -7.0)));
  DeviceArray<T> d_dqkv(padded(dqkv_init ? *dqkv_init : std::vector<double>(s.nqkv(), 0.0)));
  DeviceArray<uint8_t> d_mask(want_mask ? s.natt() : 0);
  if (want_mask) cudaCheck(cudaMemset(d_mask.ptr, kSentinel, s.natt()));
  cudaCheck(cudaDeviceSynchronize());  // uploads and memsets done before ctx.stream (non-blocking) reads them
  gpu::flash_attn_forward<T>(ctx, d_out.ptr, d_lse.ptr, d_qkv.ptr, key, s.B, s.Tn, s.C(), s.NH, causal,
                             want_mask ? d_mask.ptr : nullptr);
  if (backward)
    gpu::flash_attn_backward<T>(ctx, d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, key, s.B, s.Tn, s.C(),
                                s.NH, causal);
  Result r;
  r.out = d_out.download();
  r.lse = d_lse.download();
  r.dqkv = d_dqkv.download();
  for (auto* v : {&r.out, &r.lse, &r.dqkv}) {
    const size_t n = v->size() - guard;
    for (size_t i = n; i < v->size(); ++i) CHECK_MESSAGE((*v)[i] == kGuard, "write past the end of a buffer");
    v->resize(n);
  }
  if (want_mask) {
    r.mask.resize(s.natt());
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(r.mask.data(), d_mask.ptr, s.natt(), cudaMemcpyDeviceToHost));
  }
  return r;
}

// The plain same-precision path on the device (out and dqkv from zero).
template <typename T>
Result run_naive(const gpu::Context& ctx, const Shape& s, const std::vector<double>& qkv,
                 const std::vector<double>& dout, const philox::DropoutKey& key, bool causal) {
  DeviceArray<T> d_qkv(qkv), d_dout(dout), d_out(s.nout()), d_att(s.natt()), d_dqkv(s.nqkv());
  cudaCheck(cudaDeviceSynchronize());  // uploads done before ctx.stream (non-blocking) reads them
  gpu::attention_naive_forward<T>(ctx, d_out.ptr, d_att.ptr, d_qkv.ptr, key, s.B, s.Tn, s.C(), s.NH, causal, nullptr);
  gpu::attention_naive_backward<T>(ctx, d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_att.ptr, key, s.B, s.Tn, s.C(), s.NH,
                                   causal);
  Result r;
  r.out = d_out.download();
  r.dqkv = d_dqkv.download();
  return r;
}

// The plain fp32 lse on the host: per row, S in fp32 (sequential dot), m = max, l = sum of
// expf(S - m) in order, lse = m + logf(l).
std::vector<double> plain_lse_f32(const Shape& s, const std::vector<double>& qkv, bool causal) {
  const size_t C = s.C(), C3 = 3 * C;
  const float sc = (float)(1.0 / std::sqrt((double)s.HS));
  std::vector<double> lse(s.nlse());
  std::vector<float> row(s.Tn);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.Tn; ++i) {
        const int jn = causal ? i + 1 : s.Tn;
        const double* q = &qkv[((size_t)b * s.Tn + i) * C3 + (size_t)h * s.HS];
        float m = -INFINITY;
        for (int j = 0; j < jn; ++j) {
          const double* k = &qkv[((size_t)b * s.Tn + j) * C3 + C + (size_t)h * s.HS];
          float d = 0.f;
          for (int c = 0; c < s.HS; ++c) d += (float)q[c] * (float)k[c];
          row[j] = d * sc;
          m = std::max(m, row[j]);
        }
        float l = 0.f;
        for (int j = 0; j < jn; ++j) l += std::exp(row[j] - m);
        lse[((size_t)b * s.NH + h) * s.Tn + i] = m + std::log(l);
      }
  return lse;
}

// The floors of dQ and dK for the error flash inherits from D = rowsum(dO o O) with O the
// T-rounded output it stored (see the header): {dQ floor, dK floor}.
std::pair<double, double> d_floors(const Shape& s, const std::vector<double>& qkv, const std::vector<double>& dout,
                                   const std::vector<double>& out_flash, const std::vector<double>& out_ref,
                                   const std::vector<double>& lse_ref, const philox::DropoutKey& key, bool causal) {
  const size_t C = s.C(), C3 = 3 * C;
  const double sc = 1.0 / std::sqrt((double)s.HS);
  const double sd = key.threshold != 0 ? (double)key.scale : 1.0;
  double qmax = 0, kmax = 0, vmax = 0;
  for (size_t r = 0; r < (size_t)s.B * s.Tn; ++r)
    for (size_t c = 0; c < C; ++c) {
      qmax = std::max(qmax, std::fabs(qkv[r * C3 + c]));
      kmax = std::max(kmax, std::fabs(qkv[r * C3 + C + c]));
      vmax = std::max(vmax, std::fabs(qkv[r * C3 + 2 * C + c]));
    }
  double emax = 0, colmax = 0;
  std::vector<double> e(s.Tn), col(s.Tn);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      for (int i = 0; i < s.Tn; ++i) {
        const size_t o = ((size_t)b * s.Tn + i) * C + (size_t)h * s.HS;
        double dd = 0, dabs = 0;
        for (int d = 0; d < s.HS; ++d) {
          dd += dout[o + d] * (out_flash[o + d] - out_ref[o + d]);
          dabs += std::fabs(dout[o + d]);
        }
        e[i] = std::fabs(dd) + 4 * s.HS * kU32 * sd * vmax * dabs;
        emax = std::max(emax, e[i]);
      }
      std::fill(col.begin(), col.end(), 0.0);
      for (int i = 0; i < s.Tn; ++i) {
        const double* q = &qkv[((size_t)b * s.Tn + i) * C3 + (size_t)h * s.HS];
        const double lse = lse_ref[((size_t)b * s.NH + h) * s.Tn + i];
        for (int j = 0; j < (causal ? i + 1 : s.Tn); ++j) {
          const double* k = &qkv[((size_t)b * s.Tn + j) * C3 + C + (size_t)h * s.HS];
          double dot = 0;
          for (int d = 0; d < s.HS; ++d) dot += q[d] * k[d];
          col[j] += std::exp(sc * dot - lse) * e[i];
        }
      }
      for (int j = 0; j < s.Tn; ++j) colmax = std::max(colmax, col[j]);
    }
  return {1.25 * sc * kmax * emax, 1.25 * sc * qmax * colmax};
}

// FlashAttention's rule for one tensor: err_flash <= k err_plain + floor.
bool ratio_rule(const char* what, const std::vector<double>& flash, const std::vector<double>& plain,
                const std::vector<double>& ref, double k, double floor, const std::string& where) {
  const double ef = max_abs_diff(flash, ref), ep = max_abs_diff(plain, ref);
  const bool ok = ef <= k * ep + floor;  // false for NaN
  if (!ok)
    MESSAGE(where << ": " << what << " flash error " << ef << " > " << k << " x plain error " << ep << " + floor "
                  << floor);
  return ok;
}

// Cases of the bf16 / float comparisons. B*NH = 4 up to T = 255, 1 for T = 1023, 1025 (so the
// fp64 reference stays fast).
std::vector<std::pair<Shape, bool>> cases() {
  std::vector<std::pair<Shape, bool>> cs;
  for (int Tn : tg_test::device_sizes<int>({1, 2, 17, 97, 128, 129, 255, 1023, 1025}, {1, 17, 129}))
    for (int HS : {32, 64, 128})
      for (bool causal : {true}) cs.push_back({Tn <= 255 ? Shape{2, Tn, 2, HS} : Shape{1, Tn, 1, HS}, causal});
  // head sizes the tiles do not have, run padded (flash_attn_tile_head_size), and the widest tile
  for (int Tn : tg_test::device_sizes<int>({1, 17, 129, 255}, {17}))
    for (int HS : {40, 80, 96, 200, 256}) cs.push_back({Shape{2, Tn, 2, HS}, true});
  // HS = 256 (32-key tiles; the dK / dV columns split over two CTAs) across several tiles of
  // every kernel
  cs.push_back({Shape{1, 97, 2, 256}, true});
  // not causal: a partial tile, several query and key tiles each seeing every key tile, a padded
  // head size and the widest tile (reduced: HS 32, the emulated H100's mma.sync size, at a
  // partial tile and at several; its Hopper sizes not causal are the Hopper case's below)
  const std::vector<Shape> full = tg_test::device_sizes<Shape>(
      {{2, 1, 2, 32}, {2, 17, 2, 32}, {2, 129, 2, 32}, {1, 1025, 1, 32}, {2, 1, 2, 64}, {2, 17, 2, 64}, {2, 129, 2, 64},
       {1, 1025, 1, 64}, {2, 17, 2, 128}, {2, 129, 2, 128}, {1, 1025, 1, 128}, {2, 17, 2, 96}, {1, 97, 2, 256}},
      {{2, 17, 2, 32}, {2, 129, 2, 32}});
  for (const Shape& s : full) cs.push_back({s, false});
  return cs;
}

// body() on each bf16 kernel family this device runs: mma.sync, then the Hopper kernels where
// the device is compute capability 9.0 (under the emulator only where `emulated` says so: the
// Hopper case below checks their outputs and masks there, and the emulator's schedule is the same
// every run).
template <typename F>
void for_each_bf16_family(F body, bool emulated) {
  for (const bool hopper : {false, true}) {
    if (hopper && (!tg_test::hopper_available() || (tg_test::kEmulated && !emulated))) continue;
    const tg_test::FlashKernels family(hopper);
    INFO("bf16 kernels: " << (hopper ? "Hopper wgmma" : "mma.sync"));
    body();
  }
}

// Checks flash (bf16) against the fp64 reference with the ratio rule; returns false on failure.
// hopper: on the Hopper kernels, the keep decisions also checked byte for byte against the CPU's
// (through the mask hook), and the outputs left in *hopper_out.
bool check_bf16_case(const gpu::Context& ctx, const Shape& s, bool causal, double p, uint64_t salt, double qs = 1,
                     double ks = 1, Result* hopper_out = nullptr) {
  const bool hopper = hopper_out != nullptr;
  const std::string where = describe(s, causal, p) + (hopper ? " (hopper)" : "");
  const philox::DropoutKey key = attn_key(p);
  const std::vector<double> qkv = tg_test::round_to<gpu::bf16>(make_qkv(s, salt, qs, ks));
  const std::vector<double> dout = tg_test::round_to<gpu::bf16>(random_vector(s.nout(), salt + 1));
  const Result ref = cpu_reference(s, qkv, dout, key, causal, hopper);
  const Result fl = [&] {
    const tg_test::FlashKernels family(hopper);
    return run_flash<gpu::bf16>(ctx, s, qkv, dout, key, causal, hopper);
  }();
  const Result nv = run_naive<gpu::bf16>(ctx, s, qkv, dout, key, causal);
  const double u = gpu::unit_roundoff<gpu::bf16>();
  bool ok = all_finite(fl.out) && all_finite(fl.lse) && all_finite(fl.dqkv);
  if (!ok) MESSAGE(where << ": NaN or Inf in the flash outputs");
  if (hopper) {
    size_t diff = 0;
    for (size_t i = 0; i < ref.mask.size(); ++i) diff += fl.mask[i] != ref.mask[i];
    if (diff) MESSAGE(where << ": " << diff << " mask entries differ from the CPU mask");
    ok &= diff == 0;
    *hopper_out = fl;
  }
  ok &= ratio_rule("O", fl.out, nv.out, ref.out, 2, u * max_abs(ref.out), where);
  ok &= ratio_rule("lse", fl.lse, plain_lse_f32(s, qkv, causal), ref.lse, 2, 64 * kU32 * (1 + max_abs(ref.lse)), where);
  const char* names[3] = {"dQ", "dK", "dV"};
  const std::pair<double, double> fd = d_floors(s, qkv, dout, fl.out, ref.out, ref.lse, key, causal);
  const double d_floor[3] = {fd.first, fd.second, 0.0};
  for (int part = 0; part < 3; ++part) {
    const std::vector<double> r = third(ref.dqkv, s, part);
    ok &= ratio_rule(names[part], third(fl.dqkv, s, part), third(nv.dqkv, s, part), r, 3,
                     2 * u * max_abs(r) + d_floor[part], where);
  }
  return ok;
}

}  // namespace

TG_GPU_TEST("flash attention bf16: O, lse within 2x and dQ, dK, dV within 3x of the naive bf16 error") {
  uint64_t salt = 100;
  for (const auto& cs : cases())
    for (double p : {0.0, 0.17}) {
      const Shape s = cs.first;
      const bool causal = cs.second;
      const uint64_t case_salt = salt += 10;
      if (!flash_fits(s.HS, true)) continue;
      tg_test::TestContext tc(scratch_for(s, sizeof(gpu::bf16)), gpu::Precision::BF16);
      CHECK_MESSAGE(check_bf16_case(tc.ctx, s, causal, p, case_salt), describe(s, causal, p));
    }
}

TG_GPU_TEST("flash attention bf16: scaled inputs (q x5, k x3) stay finite and within the rule") {
  for (int HS : {32, 64, 128})
    for (bool causal : {true}) {
      if (!flash_fits(HS, true)) continue;
      const Shape s = tg_test::reduced_matrix() ? Shape{1, 129, 1, HS} : Shape{2, 255, 2, HS};
      tg_test::TestContext tc(scratch_for(s, sizeof(gpu::bf16)), gpu::Precision::BF16);
      CHECK_MESSAGE(check_bf16_case(tc.ctx, s, causal, 0.17, 7000 + HS + causal, 5.0, 3.0), describe(s, causal, 0.17));
    }
}

// Tolerance of the float (SIMT) path against the fp64 reference. u = 2^-24; every output is a
// sum of at most T products whose factors come from dot products of HS terms, all in fp32
// FMAs (no TF32), so with gamma_n <= n u:
//   S_ij: |dS| <= HS u sigma, sigma = max sc sum_d |q_id k_jd|; that error enters
//         exp(S - m) relatively (twice: S and m), as does u sigma for the subtraction;
//   P, l: T-term sums and the expf / logf / divide roundings;
// so every quantity below carries a relative error of at most
//   eps = 4 u (T + HS (1 + 2 sigma) + 16)
// (4: the chained roundings, P into l and O, dP and D into dS) of the sum of the absolute
// values of its terms:
//   O_ic:   s sum_j P_ij M_ij |v_jc|                     <= s max|v|
//   lse_i:  1 + |lse_i|
//   dV_jc:  s sum_i P_ij M_ij |dO_ic|                    <= s max|dO| max_j sum_i P_ij
//   dQ_ic:  sc sum_j P_ij (|dP_ij| + |D_i|) |k_jc|       <= sc max|k| max_i W_i
//   dK_jc:  sc sum_i P_ij (|dP_ij| + |D_i|) |q_ic|       <= sc max|q| max_j W'_j
// with |dP_ij| <= s M_ij sum_d |dO_id v_jd| and |D_i| <= sum_j P_ij |dP_ij|, evaluated on the
// host in double. This is ~1e-4 relative at T = 1025: far below a bf16 (4e-3) or TF32
// (5e-4 per input) computation, and far below any indexing or masking mistake.
namespace {

struct F32Bounds {
  double O, lse, dQ, dK, dV;
};

F32Bounds f32_bounds(const Shape& s, const std::vector<double>& qkv, const std::vector<double>& dout,
                     const std::vector<double>& lse_ref, const philox::DropoutKey& key, bool causal) {
  const size_t C = s.C(), C3 = 3 * C;
  const double sc = 1.0 / std::sqrt((double)s.HS);
  const bool drop = key.threshold != 0;
  const double sd = drop ? (double)key.scale : 1.0;
  double sigma = 0, qmax = 0, kmax = 0, vmax = 0, colP = 0, wq = 0, wk = 0;
  for (size_t r = 0; r < (size_t)s.B * s.Tn; ++r)
    for (size_t c = 0; c < C; ++c) {
      qmax = std::max(qmax, std::fabs(qkv[r * C3 + c]));
      kmax = std::max(kmax, std::fabs(qkv[r * C3 + C + c]));
      vmax = std::max(vmax, std::fabs(qkv[r * C3 + 2 * C + c]));
    }
  const double dOmax = max_abs(dout);
  std::vector<double> prow(s.Tn), dprow(s.Tn), col(s.Tn), wcol(s.Tn);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const uint32_t bh = (uint32_t)(b * s.NH + h);
      auto q = [&](int i) { return &qkv[((size_t)b * s.Tn + i) * C3 + (size_t)h * s.HS]; };
      auto k = [&](int j) { return &qkv[((size_t)b * s.Tn + j) * C3 + C + (size_t)h * s.HS]; };
      auto v = [&](int j) { return &qkv[((size_t)b * s.Tn + j) * C3 + 2 * C + (size_t)h * s.HS]; };
      std::fill(col.begin(), col.end(), 0.0);
      std::fill(wcol.begin(), wcol.end(), 0.0);
      for (int i = 0; i < s.Tn; ++i) {
        const int jn = causal ? i + 1 : s.Tn;
        const double* dOi = &dout[((size_t)b * s.Tn + i) * C + (size_t)h * s.HS];
        const double lse = lse_ref[(size_t)bh * s.Tn + i];
        double Dabs = 0;
        for (int j = 0; j < jn; ++j) {
          double dot = 0, sabs = 0, dpabs = 0;
          for (int d = 0; d < s.HS; ++d) {
            dot += q(i)[d] * k(j)[d];
            sabs += std::fabs(q(i)[d] * k(j)[d]);
            dpabs += std::fabs(dOi[d] * v(j)[d]);
          }
          sigma = std::max(sigma, sc * sabs);
          const bool keep = !drop || philox::attn_keep(key, bh, (uint32_t)i, (uint32_t)j);
          prow[j] = std::exp(sc * dot - lse);
          dprow[j] = keep ? sd * dpabs : 0.0;
          Dabs += prow[j] * dprow[j];
          col[j] += prow[j];
        }
        double w = 0;
        for (int j = 0; j < jn; ++j) {
          const double wij = prow[j] * (dprow[j] + Dabs);
          w += wij;
          wcol[j] += wij;
        }
        wq = std::max(wq, w);
      }
      for (int j = 0; j < s.Tn; ++j) {
        colP = std::max(colP, col[j]);
        wk = std::max(wk, wcol[j]);
      }
    }
  const double eps = 4 * kU32 * (s.Tn + s.HS * (1 + 2 * sigma) + 16);
  return F32Bounds{eps * sd * vmax, eps * (1 + max_abs(lse_ref)), eps * sc * kmax * wq, eps * sc * qmax * wk,
                   eps * sd * dOmax * colP};
}

bool within(const char* what, const std::vector<double>& got, const std::vector<double>& ref, double tol,
            const std::string& where) {
  const double e = max_abs_diff(got, ref);
  const bool ok = e <= tol;
  if (!ok) {
    size_t worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - ref[i]) <= std::fabs(got[worst] - ref[worst]))) worst = i;
    MESSAGE(where << ": " << what << " max error " << e << " > tolerance " << tol << "; worst at " << worst << ": got "
                  << got[worst] << ", expected " << ref[worst]);
  }
  return ok;
}

}  // namespace

TG_GPU_TEST("flash attention float: SIMT path within the derived fp32 tolerance of the fp64 reference") {
  uint64_t salt = 30000;
  for (const auto& cs : cases()) {
    const Shape s = cs.first;
    const bool causal = cs.second;
    if (s.Tn == 1023) continue;  // 1025 covers the long, non-multiple case
    if (!flash_fits(s.HS, false)) continue;
    for (double p : {0.0, 0.17}) {
      const std::string where = describe(s, causal, p);
      const philox::DropoutKey key = attn_key(p);
      tg_test::TestContext tc(scratch_for(s, sizeof(float)), gpu::Precision::FP32);
      const std::vector<double> qkv = tg_test::round_to<float>(make_qkv(s, salt += 10));  // the device's inputs
      const std::vector<double> dout = tg_test::round_to<float>(random_vector(s.nout(), salt + 1));
      const Result ref = cpu_reference(s, qkv, dout, key, causal, false);
      const Result fl = run_flash<float>(tc.ctx, s, qkv, dout, key, causal, false);
      const F32Bounds tol = f32_bounds(s, qkv, dout, ref.lse, key, causal);
      bool ok = within("O", fl.out, ref.out, tol.O, where);
      ok &= within("lse", fl.lse, ref.lse, tol.lse, where);
      ok &= within("dQ", third(fl.dqkv, s, 0), third(ref.dqkv, s, 0), tol.dQ, where);
      ok &= within("dK", third(fl.dqkv, s, 1), third(ref.dqkv, s, 1), tol.dK, where);
      ok &= within("dV", third(fl.dqkv, s, 2), third(ref.dqkv, s, 2), tol.dV, where);
      CHECK_MESSAGE(ok, where);
    }
  }
}

// The Hopper kernels (wgmma, kernels/flash_attn_hopper.cuh, through flash_attn_forward / _backward
// with TG_FLASH_HOPPER=1; head sizes 64, 128 and 256, and 40, 96 and 200 padded to them) against
// the same fp64 spec: O, lse, dQ, dK, dV by the ratio rules of the bf16 case above, the keep
// decisions byte for byte the CPU's (the mask hook); and beside the mma.sync kernels on the same
// inputs: O within a bf16 rounding, lse to the fp32 sums' few ulp (the two differ in the order of
// the sums inside their matrix products, and at HS 64 and 128 in the forward's key tiles: 128
// where mma.sync's are 64), the gradients' largest difference reported; causal, and
// not causal at the tile head sizes (T 17 and 129).
TG_HOPPER_TEST("flash attention hopper (wgmma): forward and backward by the ratio rules, masks the CPU's") {
  uint64_t salt = 80000;
  for (int Tn : tg_test::device_sizes<int>({1, 17, 64, 129, 255}, {1, 17, 129}))
    for (int HS : {40, 64, 96, 128, 200, 256})  // (40, 96, 200: padded to 64, 128, 256, at T = 17)
      for (const bool causal : {true, false})
        for (double p : {0.0, 0.17}) {
          if (HS % 64 != 0 && Tn != 17) continue;
          // not causal: the tile head sizes, at a partial tile and at several query and key tiles
          // (reduced: 64 at several; 128 and 256 at a partial one, with dropout)
          if (!causal && (HS % 64 != 0 || (Tn != 17 && Tn != 129))) continue;
          if (!causal && tg_test::reduced_matrix() && ((HS == 64) != (Tn == 129) || (HS != 64 && p == 0))) continue;
          const Shape s{Tn <= 129 ? 2 : 1, Tn, 2, HS};
          const std::string where = describe(s, causal, p) + " (hopper)";
          tg_test::TestContext tc(scratch_for(s, sizeof(gpu::bf16)), gpu::Precision::BF16);
          Result hw;
          CHECK_MESSAGE(check_bf16_case(tc.ctx, s, causal, p, salt += 10, 1, 1, &hw), where);
          // the same inputs on the mma.sync kernels
          const philox::DropoutKey key = attn_key(p);
          const std::vector<double> qkv = tg_test::round_to<gpu::bf16>(make_qkv(s, salt));
          const std::vector<double> dout = tg_test::round_to<gpu::bf16>(random_vector(s.nout(), salt + 1));
          const Result mma = [&] {
            const tg_test::FlashKernels family(false);
            return run_flash<gpu::bf16>(tc.ctx, s, qkv, dout, key, causal, false);
          }();
          const double u = gpu::unit_roundoff<gpu::bf16>();
          CHECK_MESSAGE(max_abs_diff(hw.out, mma.out) <= 2 * u * max_abs(mma.out), where << ": O beside mma.sync");
          CHECK_MESSAGE(max_abs_diff(hw.lse, mma.lse) <= 64 * kU32 * (1 + max_abs(mma.lse)), where << ": lse beside mma.sync");
          MESSAGE(where << ": largest difference from the mma.sync kernels: O " << max_abs_diff(hw.out, mma.out) << ", lse "
                        << max_abs_diff(hw.lse, mma.lse) << ", dqkv " << max_abs_diff(hw.dqkv, mma.dqkv));
          // the warp-specialized backward (TG_FLASH_HOPPER=2; pipelined over the query tiles at HS
          // 64 and 128, as the default): the same tile steps in the same order, so the same bits
          {
            const Result ws = [&] {
              const tg_test::FlashKernels family("2");
              return run_flash<gpu::bf16>(tc.ctx, s, qkv, dout, key, causal, false);
            }();
            CHECK_MESSAGE(bitwise_equal(ws.dqkv, hw.dqkv), where << ": the warp-specialized backward's dqkv differs, largest "
                                                                << max_abs_diff(ws.dqkv, hw.dqkv));
          }
          // dQ inside the dK / dV kernel (TG_FLASH_HOPPER=3; causal, the attention it takes) rather
          // than in a kernel of its own (padded or not): the same products in the same order, so
          // the same bits
          if (causal) {
            const Result fused = [&] {
              const tg_test::FlashKernels family("3");
              return run_flash<gpu::bf16>(tc.ctx, s, qkv, dout, key, causal, false);
            }();
            CHECK_MESSAGE(bitwise_equal(fused.dqkv, hw.dqkv), where << ": dQ inside the dK / dV kernel gives another dqkv, largest difference "
                                                                  << max_abs_diff(fused.dqkv, hw.dqkv));
          }
          // the backward's kernels not pipelined over their tiles (TG_FLASH_HOPPER=5; tiles of head
          // size 64 and 128, the sizes where they differ from the default's): the same products in
          // the same order, so the same bits
          if (HS <= 128) {
            const Result seq = [&] {
              const tg_test::FlashKernels family("5");
              return run_flash<gpu::bf16>(tc.ctx, s, qkv, dout, key, causal, false);
            }();
            CHECK_MESSAGE(bitwise_equal(seq.dqkv, hw.dqkv), where << ": the backward not pipelined gives another dqkv, largest "
                                                                << max_abs_diff(seq.dqkv, hw.dqkv));
          }
          // Without dropout the forward's kernel is not the one the mask hook ran above (the dropout
          // kernel at p = 0): the default's consumer warpgroups take turns at their products, and at
          // HS 64 there are three (192 query rows a CTA). Against the same forward with its
          // consumers not taking turns (TG_FLASH_HOPPER=8) and, at HS 64, with two consumers
          // (TG_FLASH_HOPPER=7; each warpgroup computes its own rows): the same products in the same
          // order, so the same bits, and the dropout kernel's O
          if (HS <= 128 && p == 0) {
            auto family_run = [&](const char* family) {
              const tg_test::FlashKernels k(family);
              return run_flash<gpu::bf16>(tc.ctx, s, qkv, dout, key, causal, false);
            };
            const Result dflt = family_run("1");
            auto same = [&](const Result& r, const char* what) {
              CHECK_MESSAGE(bitwise_equal(dflt.out, r.out), where << ": O of the default forward is not " << what << "'s");
              CHECK_MESSAGE(bitwise_equal(dflt.lse, r.lse), where << ": lse of the default forward is not " << what << "'s");
              CHECK_MESSAGE(bitwise_equal(dflt.dqkv, r.dqkv), where << ": dqkv of the default forward is not " << what << "'s");
            };
            same(family_run("8"), "the consumers not taking turns");
            if (HS <= 64) same(family_run("7"), "two consumer warpgroups");
            CHECK_MESSAGE(bitwise_equal(dflt.out, hw.out), where << ": O of the default forward is not the dropout kernel's");
          }
          // the forward on key tiles of 64 (TG_FLASH_HOPPER=6; tiles of 128 are the default at HS
          // 64 and 128): the online softmax rescales O at other keys, so O and lse
          // within rounding of the default's, and under the emulator the mma.sync kernels' bit for
          // bit (their tiles of 64 keys, their sums in the same order); the backward is the
          // default's, fed the forward's O and lse
          if (HS <= 128) {
            const Result narrow = [&] {
              const tg_test::FlashKernels family("6");
              return run_flash<gpu::bf16>(tc.ctx, s, qkv, dout, key, causal, false);
            }();
            CHECK_MESSAGE(max_abs_diff(narrow.out, hw.out) <= 2 * u * max_abs(hw.out), where << ": O on key tiles of 64");
            CHECK_MESSAGE(max_abs_diff(narrow.lse, hw.lse) <= 64 * kU32 * (1 + max_abs(hw.lse)),
                          where << ": lse on key tiles of 64");
            if (tg_test::kEmulated) {
              CHECK_MESSAGE(bitwise_equal(narrow.out, mma.out), where << ": O on key tiles of 64 is not mma.sync's, largest "
                                                                     << max_abs_diff(narrow.out, mma.out));
              CHECK_MESSAGE(bitwise_equal(narrow.lse, mma.lse), where << ": lse on key tiles of 64 is not mma.sync's");
            }
            // With dropout, forwards whose bits are those of the tiles of 64 (their tiles, their sums
            // in the same order), with the mask hook: the CPU's mask byte for byte, and O, lse and
            // dqkv bit for bit. The keep decisions made by the forward's producer warpgroup
            // (TG_FLASH_HOPPER=4, whose forward takes key tiles of 64): the same Philox calls. The
            // forward on three consumer warpgroups and key tiles of 64 (TG_FLASH_HOPPER=9, HS 64):
            // each warpgroup computes its own rows on the same tiles.
            auto as_narrow = [&](const char* setting, const char* what) {
              const Result r = [&] {
                const tg_test::FlashKernels family(setting);
                return run_flash<gpu::bf16>(tc.ctx, s, qkv, dout, key, causal, true);
              }();
              CHECK_MESSAGE(r.mask == hw.mask, where << ": the keep decisions " << what << " differ from the CPU's");
              CHECK_MESSAGE(bitwise_equal(r.out, narrow.out), where << ": O " << what << " differs, largest "
                                                                    << max_abs_diff(r.out, narrow.out));
              CHECK_MESSAGE(bitwise_equal(r.lse, narrow.lse), where << ": lse " << what << " differs");
              CHECK_MESSAGE(bitwise_equal(r.dqkv, narrow.dqkv), where << ": dqkv " << what << " differs");
            };
            if (p > 0) as_narrow("4", "by the producer warpgroup");
            if (p > 0 && HS <= 64) as_narrow("9", "with dropout on three consumers");
          }
        }
}

// The Hopper forward skips a warp's rescaling of O where no row of the warp has a new maximum
// (every alpha exactly 1, a product that would give O's own bits). Here key 0 of every sequence
// holds each query's largest score by far (an attention sink: q and k share a large first
// component), so from the second key tile on no row's maximum moves and every warp skips: on key
// tiles of 64 (TG_FLASH_HOPPER=6) O, lse and dqkv stay the mma.sync kernels' bit for bit under the
// emulator (the mma.sync forward always rescales), and the default's within the bf16 rules.
TG_HOPPER_TEST("flash attention hopper (wgmma): the rescaling skipped where no row has a new maximum gives the same bits") {
  uint64_t salt = 91000;
  for (int HS : {64, 128})
    for (double p : {0.0, 0.17}) {
      const Shape s{1, 320, 2, HS};
      const std::string where = describe(s, true, p) + " (hopper, a sink at key 0)";
      tg_test::TestContext tc(scratch_for(s, sizeof(gpu::bf16)), gpu::Precision::BF16);
      std::vector<double> qkv = make_qkv(s, salt += 10, 0.25, 0.25);
      const size_t C = s.C();
      for (int t = 0; t < s.Tn; ++t)
        for (int h = 0; h < s.NH; ++h) {
          qkv[(size_t)t * 3 * C + (size_t)h * HS] = 2.0;                   // q: first component 2
          qkv[(size_t)t * 3 * C + C + (size_t)h * HS] = t == 0 ? 4.0 : 0.0;  // k: 4 at key 0, else 0
        }
      qkv = tg_test::round_to<gpu::bf16>(qkv);
      const std::vector<double> dout = tg_test::round_to<gpu::bf16>(random_vector(s.nout(), salt + 1));
      const philox::DropoutKey key = attn_key(p);
      auto run = [&](const char* family) {
        const tg_test::FlashKernels k(family);
        return run_flash<gpu::bf16>(tc.ctx, s, qkv, dout, key, true, false);
      };
      const Result mma = run("0"), narrow = run("6"), wide = run("1");
      const double u = gpu::unit_roundoff<gpu::bf16>();
      if (tg_test::kEmulated) {
        CHECK_MESSAGE(bitwise_equal(narrow.out, mma.out), where << ": O differs from mma.sync's, largest "
                                                               << max_abs_diff(narrow.out, mma.out));
        CHECK_MESSAGE(bitwise_equal(narrow.lse, mma.lse), where << ": lse differs from mma.sync's");
        CHECK_MESSAGE(bitwise_equal(narrow.dqkv, mma.dqkv), where << ": dqkv differs from mma.sync's");
      }
      CHECK_MESSAGE(max_abs_diff(wide.out, mma.out) <= 2 * u * max_abs(mma.out), where << ": O on key tiles of 128");
      CHECK_MESSAGE(max_abs_diff(wide.lse, mma.lse) <= 64 * kU32 * (1 + max_abs(mma.lse)), where << ": lse on key tiles of 128");
    }
}

TG_HOPPER_TEST("flash attention hopper (wgmma): head sizes other than 64, 128 and 256 are refused") {
  tg_test::TestContext tc(0, gpu::Precision::BF16);
  const philox::DropoutKey key = attn_key(0.0);
  for (int HS : {32, 40, 96, 192}) {
    const Shape s{1, 8, 2, HS};
    DeviceArray<gpu::bf16> d_qkv(s.nqkv()), d_out(s.nout());
    DeviceArray<float> d_lse(s.nlse());
    CHECK_THROWS_WITH_AS(gpu::flash_attn_forward_hopper(tc.ctx, d_out.ptr, d_lse.ptr, d_qkv.ptr, key, s.B, s.Tn, s.C(),
                                                        s.NH, nullptr),
                         doctest::Contains("the Hopper kernels take 64, 128 and 256"), std::invalid_argument);
  }
}

namespace {

// The keep buffer (flash_attn_keep_bytes) on the kernel family in force: with p > 0 the forward
// stores every causal keep byte, the byte the CPU's Philox call gives (philox::attn_keep_byte;
// the buffer starts as each byte's complement, so a byte never written is caught), each in its
// own place, and nothing else (the bytes between and past them keep their sentinel); O and lse
// are those of a forward without it; the backward reading it gives the dqkv of a backward making
// the decisions again, bit for bit. With p = 0, or not causal (the layout holds the causal
// triangle alone: the kernels make every decision), nothing is written and nothing read.
void keep_buffer_case(const Shape& s, bool causal, double p, uint64_t salt, const std::string& family) {
  const std::string where = describe(s, causal, p) + " (" + family + ")";
  const philox::DropoutKey key = attn_key(p);
  tg_test::TestContext tc(scratch_for(s, sizeof(gpu::bf16)), gpu::Precision::BF16);
  const std::vector<double> qkv = make_qkv(s, salt), dout = random_vector(s.nout(), salt + 1);
  const std::vector<double> init = random_vector(s.nqkv(), salt + 2);
  // the bytes expected (p = 0: the starting ones), the buffer's start, and a guard past its end
  const size_t nkeep = gpu::flash_attn_keep_bytes(s.B, s.NH, s.Tn), guard = 64;
  std::vector<unsigned char> want(nkeep + guard, kSentinel), start(nkeep + guard, kSentinel);
  std::vector<char> seen(nkeep, 0);  // each causal byte its own place in the buffer
  size_t clashes = 0, off_layout = 0;
  const uint32_t thr = philox::attn_threshold(key);
  for (uint32_t bh = 0; bh < (uint32_t)(s.B * s.NH); ++bh)
    for (uint32_t g = 0; 8 * g < (uint32_t)s.Tn; ++g)
      for (uint32_t i = 8 * g; i < (uint32_t)s.Tn; ++i) {
        const size_t at = gpu::flash_attn_keep_offset(s.Tn, bh, i, g);
        REQUIRE(at < nkeep);
        // the layout kernels/flash_attn.cuh states: 32-byte blocks of 16 queries by 2 groups, the
        // causal triangle's blocks row after row, group g's 16 bytes at 16 (g % 2), query order
        const uint32_t rb = i / 16;
        off_layout += gpu::flash_attn_keep_in_bh(i, g) != 32 * (rb * (rb + 1) / 2 + g / 2) + 16 * (g % 2) + i % 16;
        const uint8_t byte = (uint8_t)philox::attn_keep_byte(philox::attn_words(key, bh, i, 8 * g), thr);
        start[at] = (uint8_t)~byte;
        want[at] = p > 0 && causal ? byte : start[at];
        clashes += seen[at]++ != 0;
      }
  CHECK_MESSAGE(clashes == 0, where << ": " << clashes << " keep bytes share their place with another");
  CHECK_MESSAGE(off_layout == 0, where << ": " << off_layout << " keep bytes away from the stated layout");
  DeviceArray<gpu::bf16> d_qkv(qkv), d_dout(dout), d_out(s.nout()), d_out2(s.nout()), d_dqkv(init), d_dqkv2(init);
  DeviceArray<float> d_lse(s.nlse()), d_lse2(s.nlse());
  DeviceArray<uint8_t> d_keep(nkeep + guard);
  cudaCheck(cudaMemcpy(d_keep.ptr, start.data(), start.size(), cudaMemcpyHostToDevice));
  cudaCheck(cudaDeviceSynchronize());
  gpu::flash_attn_forward<gpu::bf16>(tc.ctx, d_out.ptr, d_lse.ptr, d_qkv.ptr, key, s.B, s.Tn, s.C(), s.NH, causal,
                                     nullptr, d_keep.ptr);
  gpu::flash_attn_forward<gpu::bf16>(tc.ctx, d_out2.ptr, d_lse2.ptr, d_qkv.ptr, key, s.B, s.Tn, s.C(), s.NH, causal,
                                     nullptr);
  gpu::flash_attn_backward<gpu::bf16>(tc.ctx, d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, key, s.B, s.Tn,
                                      s.C(), s.NH, causal, d_keep.ptr);
  gpu::flash_attn_backward<gpu::bf16>(tc.ctx, d_dqkv2.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, key, s.B,
                                      s.Tn, s.C(), s.NH, causal, nullptr);
  cudaCheck(cudaStreamSynchronize(tc.ctx.stream));
  const std::vector<unsigned char> keep = d_keep.bytes();
  size_t wrong = 0, first = 0;
  for (size_t k = 0; k < keep.size(); ++k)
    if (keep[k] != want[k] && wrong++ == 0) first = k;
  CHECK_MESSAGE(wrong == 0, where << ": " << wrong << " bytes of the keep buffer (of " << nkeep << ", and " << guard
                                  << " past it) are not the expected ones, the first at byte " << first);
  CHECK_MESSAGE(d_out.bytes() == d_out2.bytes(), where << ": O differs when the forward stores the keep bytes");
  CHECK_MESSAGE(d_lse.bytes() == d_lse2.bytes(), where << ": lse differs when the forward stores the keep bytes");
  CHECK_MESSAGE(d_dqkv.bytes() == d_dqkv2.bytes(),
                where << ": dqkv from the stored keep bytes differs from the recomputing backward's, largest "
                      << max_abs_diff(d_dqkv.download(), d_dqkv2.download()));
}

template <typename T>
void mask_hook_test() {
  uint64_t salt = 50000;
  for (int Tn : tg_test::device_sizes<int>({1, 17, 129, 255}, {129}))
    for (int HS : {32, 40, 64, 128})  // (40: padded to 64)
      for (bool causal : {true, false})
        for (double p : {0.0, 0.17}) {
          if (!causal && (HS != 64 || p == 0)) continue;
          if (!flash_fits(HS, std::is_same_v<T, gpu::bf16>)) continue;
          const Shape s{2, Tn, 2, HS};
          const std::string where = describe(s, causal, p);
          const philox::DropoutKey key = attn_key(p, 5);
          tg_test::TestContext tc(scratch_for(s, sizeof(T)));
          const std::vector<double> qkv = tg_test::round_to<T>(make_qkv(s, salt += 10));
          const std::vector<double> dout = tg_test::round_to<T>(random_vector(s.nout(), salt + 1));
          // (forward only: the mask, O and lse are what this case checks)
          const Result ref = cpu_reference(s, qkv, dout, key, causal, true, false);
          const Result with = run_flash<T>(tc.ctx, s, qkv, dout, key, causal, true, nullptr, 0, false);
          const Result without = run_flash<T>(tc.ctx, s, qkv, dout, key, causal, false, nullptr, 0, false);
          size_t diff = 0, applied = 0, dropped = 0;
          for (size_t i = 0; i < ref.mask.size(); ++i) {
            diff += with.mask[i] != ref.mask[i];
            applied += ref.mask[i] != kSentinel;
            dropped += ref.mask[i] == 0;
          }
          CHECK_MESSAGE(diff == 0, where << ": " << diff << " mask entries differ from the CPU mask");
          const size_t expect = (size_t)s.B * s.NH * (causal ? (size_t)Tn * (Tn + 1) / 2 : (size_t)Tn * Tn);
          CHECK_MESSAGE(applied == expect, where << ": " << applied << " entries written, expected " << expect);
          if (p > 0 && applied >= 4000) {
            const double frac = (double)dropped / applied;  // binomial: sd <= 0.0060 at n = 4000
            CHECK_MESSAGE(std::fabs(frac - p) < 0.04, where << ": dropped fraction " << frac);
          }
          if (p == 0) CHECK_MESSAGE(dropped == 0, where);
          // the hook changes nothing in what the kernel computes: with p > 0 both runs take the
          // same instantiation (bitwise equal); with p = 0 the hook runs the dropout path with
          // threshold 0 (all kept, s = 1), another instantiation, so equal up to rounding
          if (p > 0) {
            CHECK_MESSAGE(bitwise_equal(with.out, without.out), where << ": out differs with the mask hook");
            CHECK_MESSAGE(bitwise_equal(with.lse, without.lse), where << ": lse differs with the mask hook");
          } else {
            const double u = gpu::unit_roundoff<T>();
            CHECK_MESSAGE(max_abs_diff(with.out, without.out) <= 2 * u * max_abs(without.out),
                          where << ": out differs with the mask hook");
            CHECK_MESSAGE(max_abs_diff(with.lse, without.lse) <= 64 * kU32 * (1 + max_abs(without.lse)),
                          where << ": lse differs with the mask hook");
          }
        }
}

template <typename T>
void determinism_test() {
  // B*NH = 132*4 heads: more CTAs than any current GPU has SMs in every kernel; T = 193: two
  // query tiles of the forward, four key tiles (the last partial), causal with dropout
  // (reduced: 2 x 2 heads, three runs)
  const Shape s = tg_test::reduced_matrix() ? Shape{2, 193, 2, 64} : Shape{132, 193, 4, 64};
  if (!flash_fits(s.HS, std::is_same_v<T, gpu::bf16>)) return;
  const int reps = tg_test::reduced_matrix() ? 3 : std::is_same_v<T, gpu::bf16> ? 250 : 20;
  const philox::DropoutKey key = attn_key(0.17);
  tg_test::TestContext tc(scratch_for(s, sizeof(T)));
  const std::vector<double> qkv = make_qkv(s, 60001), dout = random_vector(s.nout(), 60002);
  const std::vector<double> init = random_vector(s.nqkv(), 60003);
  // (each run's results compared as raw device bytes, and dqkv reset from a device copy: with
  // doubles on the host both ways the bf16 runs of both families took minutes on an H200)
  DeviceArray<T> d_qkv(qkv), d_dout(dout), d_out(s.nout()), d_dqkv(s.nqkv()), d_init(init);
  DeviceArray<float> d_lse(s.nlse());
  std::vector<unsigned char> out0, lse0, dqkv0;
  int mismatches = 0;
  for (int r = 0; r < reps; ++r) {
    d_dqkv.copy_from(d_init);  // (synchronizes: it lands before ctx.stream, non-blocking, reads it)
    gpu::flash_attn_forward<T>(tc.ctx, d_out.ptr, d_lse.ptr, d_qkv.ptr, key, s.B, s.Tn, s.C(), s.NH, true, nullptr);
    gpu::flash_attn_backward<T>(tc.ctx, d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, key, s.B, s.Tn,
                                s.C(), s.NH, true);
    cudaCheck(cudaStreamSynchronize(tc.ctx.stream));
    std::vector<unsigned char> out = d_out.bytes(), lse = d_lse.bytes(), dqkv = d_dqkv.bytes();
    if (r == 0) {
      out0 = std::move(out);
      lse0 = std::move(lse);
      dqkv0 = std::move(dqkv);
      CHECK(all_finite(d_out.download()));
      CHECK(all_finite(d_dqkv.download()));
    } else {
      mismatches += out != out0 || lse != lse0 || dqkv != dqkv0;
    }
  }
  CHECK_MESSAGE(mismatches == 0, mismatches << " of " << reps - 1 << " runs differ from the first");
}

// dqkv starts random: the backward must add. With g0 the result from a zero start, the result
// from `init` is T(init + acc) and g0 = T(acc), so |got - (init + g0)| <= u |init + acc| + u |acc|
// <= 2 u (|init + g0| + |g0|) (the factor 2 covers acc vs g0). Overwriting misses by |init|,
// adding twice by |g0|. Also: nothing written past the ends of out, lse and dqkv.
template <typename T>
void accumulate_test() {
  const double u = gpu::unit_roundoff<T>();
  uint64_t salt = 70000;
  for (int Tn : tg_test::device_sizes<int>({1, 97, 129}, {129}))
    for (int HS : {32, 40, 128})  // (40: padded to 64, through copies of dqkv in scratch)
      for (bool causal : {true}) {
        if (!flash_fits(HS, std::is_same_v<T, gpu::bf16>)) continue;
        const Shape s{2, Tn, 3, HS};
        const std::string where = describe(s, causal, 0.17);
        const philox::DropoutKey key = attn_key(0.17);
        tg_test::TestContext tc(scratch_for(s, sizeof(T)));
        const std::vector<double> qkv = tg_test::round_to<T>(make_qkv(s, salt += 10));
        const std::vector<double> dout = tg_test::round_to<T>(random_vector(s.nout(), salt + 1));
        const std::vector<double> init = tg_test::round_to<T>(random_vector(s.nqkv(), salt + 2));
        const Result zero = run_flash<T>(tc.ctx, s, qkv, dout, key, causal, false, nullptr, 4096);
        const Result acc = run_flash<T>(tc.ctx, s, qkv, dout, key, causal, false, &init, 4096);
        size_t bad = 0, worst = 0;
        double worst_ratio = 0;
        for (size_t i = 0; i < init.size(); ++i) {
          const double want = init[i] + zero.dqkv[i];
          const double bound = 2 * u * (std::fabs(want) + std::fabs(zero.dqkv[i]));
          const double err = std::fabs(acc.dqkv[i] - want);
          if (!(err <= bound)) ++bad;
          if (!(err / bound <= worst_ratio)) { worst_ratio = err / bound; worst = i; }
        }
        CHECK_MESSAGE(bad == 0, where << ": " << bad << " dqkv entries not init + gradient; worst at " << worst
                                      << ": got " << acc.dqkv[worst] << ", init " << init[worst] << ", gradient "
                                      << zero.dqkv[worst]);
      }
}

}  // namespace

// (the emulated suite runs a few shapes of each family: T 17 and 129 cover a partial tile, two
// query tiles and the diagonal ones; head size 40 runs padded to 64)
TG_GPU_TEST("flash attention bf16: the forward's keep buffer holds the CPU's keep bytes, and the backward reading it "
            "gives the same dqkv bit for bit") {
  uint64_t salt = 90000;
  struct Run {
    const char* family;  // TG_FLASH_HOPPER
    int Tn, HS;
    bool causal = true;
  };
  const std::vector<Run> runs = tg_test::device_sizes<Run>(
      {{"0", 1, 64}, {"0", 129, 64}, {"0", 255, 128}, {"0", 17, 40}, {"1", 1, 64}, {"1", 129, 64}, {"1", 255, 128},
       {"1", 17, 40}, {"1", 129, 256}, {"2", 129, 64}, {"2", 255, 128}, {"3", 129, 64}, {"4", 255, 128}, {"4", 129, 64},
       {"0", 129, 64, false}, {"1", 129, 64, false}},
      {{"0", 129, 64}, {"0", 17, 40}, {"1", 129, 64}, {"1", 17, 128}, {"2", 129, 64}, {"3", 129, 128}, {"4", 129, 128},
       {"0", 17, 64, false}, {"1", 17, 64, false}});
  for (const Run& r : runs) {
    if (r.family[0] != '0' && !tg_test::hopper_available()) continue;
    if (!flash_fits(r.HS, true)) continue;
    const tg_test::FlashKernels family(r.family);
    for (double p : {0.17, 0.0})
      keep_buffer_case(Shape{2, r.Tn, 2, r.HS}, r.causal, p, salt += 10,
                       r.family[0] == '0'   ? "mma.sync"
                       : r.family[0] == '1' ? "hopper"
                       : r.family[0] == '2' ? "hopper, warp-specialized backward"
                       : r.family[0] == '3' ? "hopper, dQ inside the dK / dV kernel"
                                            : "hopper, keep decisions by the forward's producer warpgroup");
  }
}

TG_GPU_TEST("flash attention mask hook equals the CPU mask byte for byte") {
  mask_hook_test<float>();
  for_each_bf16_family([] { mask_hook_test<gpu::bf16>(); }, false);
}

TG_GPU_TEST("flash attention: 250 repeated forward + backward runs are bitwise identical") {
  for_each_bf16_family([] { determinism_test<gpu::bf16>(); }, false);
  determinism_test<float>();
}

TG_GPU_TEST("flash attention backward accumulates into dqkv and writes nothing past the buffers") {
  accumulate_test<float>();
  for_each_bf16_family([] { accumulate_test<gpu::bf16>(); }, true);
}

TG_GPU_TEST("flash attention takes head sizes that are multiples of 8 up to 256 and rejects the others") {
  std::string why;
  for (int HS : {32, 64, 128, 256}) {
    CHECK(gpu::flash_attn_supported(HS, &why));
    CHECK(gpu::flash_attn_tile_head_size(HS) == HS);
  }
  // padded to the next tile
  const std::pair<int, int> padded[] = {{8, 32}, {24, 32}, {40, 64}, {48, 64}, {56, 64}, {72, 128}, {80, 128},
                                        {96, 128}, {120, 128}, {136, 256}, {200, 256}, {248, 256}};
  for (const auto& [HS, HSp] : padded) {
    CHECK(gpu::flash_attn_supported(HS, &why));
    CHECK(gpu::flash_attn_tile_head_size(HS) == HSp);
  }
  for (int HS : {0, 4, 12, 20, 100, 260, 264, 512}) {
    why.clear();
    CHECK_FALSE(gpu::flash_attn_supported(HS, &why));
    CHECK(gpu::flash_attn_tile_head_size(HS) == 0);
    CHECK_MESSAGE(why.find("multiples of 8 up to 256") != std::string::npos, why);
  }
  const Shape s{1, 8, 2, 20};
  tg_test::TestContext tc(scratch_for(s, sizeof(gpu::bf16)));
  DeviceArray<gpu::bf16> qkv(s.nqkv()), out(s.nout()), dqkv(s.nqkv());
  DeviceArray<float> lse(s.nlse());
  const philox::DropoutKey key = attn_key(0.0);
  CHECK_THROWS_AS(gpu::flash_attn_forward<gpu::bf16>(tc.ctx, out.ptr, lse.ptr, qkv.ptr, key, s.B, s.Tn, s.C(), s.NH,
                                                     true, nullptr),
                  std::invalid_argument);
  CHECK_THROWS_AS(gpu::flash_attn_backward<gpu::bf16>(tc.ctx, dqkv.ptr, out.ptr, qkv.ptr, out.ptr, lse.ptr, key, s.B,
                                                      s.Tn, s.C(), s.NH, true),
                  std::invalid_argument);
  CHECK_THROWS_AS(gpu::flash_attn_forward<float>(tc.ctx, nullptr, lse.ptr, nullptr, key, s.B, s.Tn, s.C(), s.NH,
                                                 false, nullptr),
                  std::invalid_argument);
}
