// tests/gpu/test_attention_naive_gpu.cu: gpu::attention_naive_forward / _backward
// (kernels/attention_naive.cu) against the CPU twin cpu::attention_naive_* run in double on the
// same inputs (rounded to T), for T = float and bf16: B*NH in {1, 3, 4}, T in {1, 2, 17, 97,
// 128, 129} (emulated: {1, 17, 129}), HS in {32, 64, 128}, causal on and off, dropout p in
// {0, 0.17}. Checked per case:
//   - out, att against the reference within the derived bounds below (att exactly 0 above the
//     causal diagonal: out and att start as random garbage);
//   - the mask hook equals the CPU mask byte for byte, including the entries above the causal
//     diagonal that both must leave untouched (both start as 0xAB); with p = 0.17 about 17% of
//     the applied entries are dropped (so the test is not vacuous);
//   - a forward with mask = null gives the same bits as with the hook (the path the model runs)
//     and so does a second run (determinism);
//   - dqkv starts as random values: the backward must add (+=); against the reference within
//     the bounds below; a second backward from the same start gives the same bits.
//
// Tolerance derivation. u = unit_roundoff<T>() (2^-8 bf16, 2^-24 float), u32 = 2^-24. Inputs
// are the same T values on both sides; the reference is exact to double precision. Per row i
// (j over the jn columns in play), with |S|_ij = sc sum_d |q_id k_jd|:
//   S:   fp32 GEMM of HS products, scaled:  |dS_ij| <= eS_ij = (HS+2) u32 |S|_ij.
//   exponent s_j - m: abs error E_i <= 2 max_j eS_ij + 2 u32 max_j |S_ij| (s_j, m, the subtraction).
//   P_ij = exp(s_j - m) / l: relative error Rel_i <= 2 E_i + (jn + 8) u32 (numerator, the
//        weighted mean of the denominator's errors, expf 2 ulp, the fp32 sum of jn positive
//        terms, 1/l and the product), then att adds the rounding to T:
//        |att - P| <= 2 P (u + Rel_i)                                     (factor 2: margin)
//   Pd = T(T(P) s): relative error <= Rel_i + 2u (+ u32).
//   O_ic = sum_j Pd_ij v_jc in fp32, rounded to T:
//        |out - O| <= 2 (u |O| + (Rel_i + 2u + (jn+2) u32) sum_j Pd_ij |v_jc|).
// Backward, with epsP = u + max_i Rel_i (the error of att as the backward reads it),
// dPabs_ij = s M_ij sum_d |dO_id v_jd| >= |dP_ij|, Dabs_i = sum_j P_ij dPabs_ij >= |D_i| and
// w_ij = P_ij (dPabs_ij + Dabs_i):
//   dP:  fp32 GEMM of HS products (and * s):   |ddP_ij| <= (HS+2) u32 dPabs_ij
//   D:   |dD_i| <= (epsP + (HS+2) u32 + (T+1) u32) Dabs_i
//   dS = T(P (dP - D)): |ddS_ij| <= epsdS w_ij, epsdS = 2 epsP + u + 2 (HS+2) u32 + (T+3) u32
//        (the error of P times |dP - D|, P times the errors of dP and D, two fp32 roundings,
//        the rounding to T)
//   dQ_ic = sc sum_j dS_ij k_jc (fp32 GEMM, then += in fp32 and one rounding to T):
//        |err| <= 2 ((u + u32) |ref| + (epsdS + (T+3) u32) sc sum_j w_ij |k_jc|);  dK alike
//        with sc sum_i w_ij |q_ic|;
//   dV_jc = sum_i Pd_ij dO_ic:  |err| <= 2 ((u + u32) |ref| + (epsP + u + (T+2) u32) sum_i Pd_ij |dO_ic|).
// With bf16 these are ~1% of the magnitude of the terms; a dropped scale s, a missing -D, a
// wrong mask or a transposed operand is off by far more. Inputs: q, k uniform in [-2, 2]
// (peaked softmax rows), v, dout, the starting dqkv uniform in [-1, 1].
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../../kernels/attention_naive.cuh"
#include "../../kernels/cpu/attention_naive.h"
#include "../../kernels/philox.h"
#include "gpu_util.cuh"

using tg_test::DeviceArray;
using tg_test::random_vector;
using tg_test::bitwise_equal;
using tg_test::kSentinel;
using tg_test::kU32;

namespace {

using tg_test::within;

struct Case {
  int B, Tn, NH, HS;
  bool causal;
  double p;
};

std::vector<Case> all_cases() {
  std::vector<Case> cs;
  for (int Tn : tg_test::device_sizes<int>({1, 2, 17, 97, 128, 129}, {1, 17, 129}))
    for (int cfg = 0; cfg < 3; ++cfg)
      for (bool causal : {false, true})
        for (double p : {0.0, 0.17})
          cs.push_back(cfg == 0   ? Case{1, Tn, 3, 32, causal, p}
                       : cfg == 1 ? Case{2, Tn, 2, 64, causal, p}
                                  : Case{1, Tn, 1, 128, causal, p});
  return cs;
}

std::vector<uint8_t> download_bytes(const DeviceArray<uint8_t>& a) {
  std::vector<uint8_t> h(a.n);
  cudaCheck(cudaDeviceSynchronize());
  cudaCheck(cudaMemcpy(h.data(), a.ptr, a.n, cudaMemcpyDeviceToHost));
  return h;
}

// The bounds of the derivation at the top, from the reference P (att), the mask and the inputs.
struct Bounds {
  std::vector<double> att, out, dqkv;
};

Bounds derive_bounds(const Case& cs, double u, const philox::DropoutKey& key, const std::vector<double>& qkv,
                     const std::vector<double>& dout, const std::vector<double>& att,
                     const std::vector<uint8_t>& mask, const std::vector<double>& out_ref,
                     const std::vector<double>& dqkv_ref) {
  const int B = cs.B, Tn = cs.Tn, NH = cs.NH, HS = cs.HS, C = NH * HS;
  const size_t C3 = 3 * (size_t)C;
  const double sc = 1.0 / std::sqrt((double)HS);
  const bool drop = key.threshold != 0;
  const double s = drop ? (double)key.scale : 1.0;
  Bounds bd;
  bd.att.assign(att.size(), 0.0);
  bd.out.assign(out_ref.size(), 0.0);
  bd.dqkv.assign(dqkv_ref.size(), 0.0);
  std::vector<double> magq(dqkv_ref.size(), 0.0);  // (B, T, 3C): sums of |terms| of dq, dk, dv
  std::vector<double> rel((size_t)B * NH * Tn);
  double rel_max = 0;
  // forward: Rel_i, att and out bounds
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const size_t bh = (size_t)b * NH + h;
      auto q = [&](int i, int d) { return qkv[((size_t)b * Tn + i) * C3 + (size_t)h * HS + d]; };
      auto k = [&](int i, int d) { return qkv[((size_t)b * Tn + i) * C3 + C + (size_t)h * HS + d]; };
      auto v = [&](int i, int d) { return qkv[((size_t)b * Tn + i) * C3 + 2 * C + (size_t)h * HS + d]; };
      for (int i = 0; i < Tn; ++i) {
        const int jn = cs.causal ? i + 1 : Tn;
        double max_es = 0, max_s = 0;
        for (int j = 0; j < jn; ++j) {
          double sabs = 0, sv = 0;
          for (int d = 0; d < HS; ++d) {
            sabs += std::fabs(q(i, d) * k(j, d));
            sv += q(i, d) * k(j, d);
          }
          max_es = std::max(max_es, (HS + 2) * kU32 * sc * sabs);
          max_s = std::max(max_s, std::fabs(sc * sv));
        }
        const double E = 2 * max_es + 2 * kU32 * max_s;
        const double R = 2 * E + (jn + 8) * kU32;
        rel[bh * Tn + i] = R;
        rel_max = std::max(rel_max, R);
        const size_t arow = (bh * Tn + i) * Tn;
        for (int j = 0; j < jn; ++j) bd.att[arow + j] = 2 * att[arow + j] * (u + R);
        for (int c = 0; c < HS; ++c) {
          double oabs = 0;
          for (int j = 0; j < jn; ++j) {
            const double keep = drop ? mask[arow + j] : 1.0;
            oabs += att[arow + j] * keep * s * std::fabs(v(j, c));
          }
          const size_t o = ((size_t)b * Tn + i) * C + (size_t)h * HS + c;
          bd.out[o] = 2 * (u * std::fabs(out_ref[o]) + (R + 2 * u + (jn + 2) * kU32) * oabs);
        }
      }
      // backward magnitudes
      for (int i = 0; i < Tn; ++i) {
        const int jn = cs.causal ? i + 1 : Tn;
        const size_t arow = (bh * Tn + i) * Tn;
        const double* doi = &dout[((size_t)b * Tn + i) * C + (size_t)h * HS];
        std::vector<double> dpabs(jn);
        double dabs = 0;
        for (int j = 0; j < jn; ++j) {
          const double keep = drop ? mask[arow + j] : 1.0;
          double a = 0;
          for (int d = 0; d < HS; ++d) a += std::fabs(doi[d] * v(j, d));
          dpabs[j] = s * keep * a;
          dabs += att[arow + j] * dpabs[j];
        }
        for (int j = 0; j < jn; ++j) {
          const double keep = drop ? mask[arow + j] : 1.0;
          const double w = att[arow + j] * (dpabs[j] + dabs), pd = att[arow + j] * keep * s;
          double* mq = &magq[((size_t)b * Tn + i) * C3 + (size_t)h * HS];
          double* mk = &magq[((size_t)b * Tn + j) * C3 + C + (size_t)h * HS];
          double* mv = &magq[((size_t)b * Tn + j) * C3 + 2 * C + (size_t)h * HS];
          for (int c = 0; c < HS; ++c) {
            mq[c] += sc * w * std::fabs(k(j, c));
            mk[c] += sc * w * std::fabs(q(i, c));
            mv[c] += pd * std::fabs(doi[c]);
          }
        }
      }
    }
  const double epsP = u + rel_max;
  const double epsdS = 2 * epsP + u + 2 * (HS + 2) * kU32 + (Tn + 3) * kU32;
  const double eps_qk = epsdS + (Tn + 3) * kU32, eps_v = epsP + u + (Tn + 2) * kU32;
  for (size_t idx = 0; idx < dqkv_ref.size(); ++idx) {
    const int part = (int)((idx % C3) / C);
    bd.dqkv[idx] = 2 * ((u + kU32) * std::fabs(dqkv_ref[idx]) + (part == 2 ? eps_v : eps_qk) * magq[idx]);
  }
  return bd;
}

template <typename T>
void check_case(const gpu::Context& ctx, const Case& cs, uint64_t salt) {
  const int B = cs.B, Tn = cs.Tn, NH = cs.NH, HS = cs.HS, C = NH * HS;
  const size_t n_qkv = (size_t)B * Tn * 3 * C, n_out = (size_t)B * Tn * C, n_att = (size_t)B * NH * Tn * Tn;
  const double u = gpu::unit_roundoff<T>();
  const philox::DropoutKey key =
      philox::make_dropout_key(tg_test::test_seed(), 12, 3, philox::kSiteAttnProbs, cs.p);
  const std::string what = std::string("attention_naive<") + (sizeof(T) == 4 ? "float" : "bf16") +
                           "> B=" + std::to_string(B) + " T=" + std::to_string(Tn) + " NH=" + std::to_string(NH) +
                           " HS=" + std::to_string(HS) + (cs.causal ? " causal" : " full") +
                           " p=" + std::to_string(cs.p);

  std::vector<double> qkv_h = random_vector(n_qkv, salt + 1);
  for (size_t idx = 0; idx < n_qkv; ++idx)
    if ((idx % (3 * (size_t)C)) < 2 * (size_t)C) qkv_h[idx] *= 2;  // q, k in [-2, 2]
  DeviceArray<T> qkv(qkv_h);
  const std::vector<double> garbage_out = random_vector(n_out, salt + 2), garbage_att = random_vector(n_att, salt + 3);
  DeviceArray<T> out(garbage_out), att(garbage_att);
  DeviceArray<uint8_t> mask(n_att);
  const std::vector<uint8_t> sentinel(n_att, kSentinel);
  cudaCheck(cudaMemcpy(mask.ptr, sentinel.data(), n_att, cudaMemcpyHostToDevice));
  // a copy from pageable memory may return before it lands, and ctx.stream (non-blocking) does
  // not wait for the legacy stream: the forward must not start before the sentinel is there
  cudaCheck(cudaDeviceSynchronize());

  // ---- forward ----
  gpu::attention_naive_forward<T>(ctx, out.ptr, att.ptr, qkv.ptr, key, B, Tn, C, NH, cs.causal, mask.ptr);
  const std::vector<double> got_out = out.download(), got_att = att.download();
  const std::vector<uint8_t> got_mask = download_bytes(mask);

  const std::vector<double> qkv_r = qkv.rounded();
  std::vector<double> ref_out(n_out), ref_att(n_att);
  std::vector<uint8_t> ref_mask(n_att, kSentinel);
  cpu::attention_naive_forward<double>(ref_out.data(), ref_att.data(), qkv_r.data(), key, B, Tn, C, NH, cs.causal,
                                       ref_mask.data());

  CHECK_MESSAGE(got_mask == ref_mask, what << ": the mask hook differs from the CPU mask");
  if (cs.p > 0) {
    size_t applied = 0, dropped = 0;
    for (int bh = 0; bh < B * NH; ++bh)
      for (int i = 0; i < Tn; ++i)
        for (int j = 0; j < (cs.causal ? i + 1 : Tn); ++j) {
          ++applied;
          dropped += ref_mask[((size_t)bh * Tn + i) * Tn + j] == 0;
        }
    if (applied >= 2000) {  // binomial sd <= 0.0084: +-6 sd
      const double frac = (double)dropped / applied;
      CHECK_MESSAGE((frac > 0.12 && frac < 0.22), what << ": dropped fraction " << frac);
    }
  }

  // ---- backward (from the GPU's att, as the model runs it) ----
  const std::vector<double> dout_h = random_vector(n_out, salt + 4), dqkv0_h = random_vector(n_qkv, salt + 5);
  DeviceArray<T> dout(dout_h), dqkv(dqkv0_h);
  cudaCheck(cudaDeviceSynchronize());
  gpu::attention_naive_backward<T>(ctx, dqkv.ptr, dout.ptr, qkv.ptr, att.ptr, key, B, Tn, C, NH, cs.causal);
  const std::vector<double> got_dqkv = dqkv.download();

  const std::vector<double> dout_r = dout.rounded();
  std::vector<double> ref_dqkv = tg_test::round_to<T>(dqkv0_h);
  cpu::attention_naive_backward<double>(ref_dqkv.data(), dout_r.data(), qkv_r.data(), ref_att.data(), key, B, Tn, C,
                                        NH, cs.causal);

  const Bounds bd = derive_bounds(cs, u, key, qkv_r, dout_r, ref_att, ref_mask, ref_out, ref_dqkv);
  CHECK_MESSAGE(within(got_att, ref_att, bd.att, what + " att"), what);
  CHECK_MESSAGE(within(got_out, ref_out, bd.out, what + " out"), what);
  CHECK_MESSAGE(within(got_dqkv, ref_dqkv, bd.dqkv, what + " dqkv"), what);

  // ---- mask = null gives the same bits; so does a second run ----
  out.upload(garbage_out);
  att.upload(garbage_att);
  gpu::attention_naive_forward<T>(ctx, out.ptr, att.ptr, qkv.ptr, key, B, Tn, C, NH, cs.causal, nullptr);
  CHECK_MESSAGE(bitwise_equal(out.download(), got_out), what << ": out differs between runs (mask hook vs null)");
  CHECK_MESSAGE(bitwise_equal(att.download(), got_att), what << ": att differs between runs (mask hook vs null)");
  dqkv.upload(dqkv0_h);
  gpu::attention_naive_backward<T>(ctx, dqkv.ptr, dout.ptr, qkv.ptr, att.ptr, key, B, Tn, C, NH, cs.causal);
  CHECK_MESSAGE(bitwise_equal(dqkv.download(), got_dqkv), what << ": the second backward differs");
}

template <typename T>
void suite() {
  const std::vector<Case> cases = all_cases();
  size_t scratch = 0;
  for (const Case& cs : cases)
    scratch = std::max(scratch, gpu::attention_naive_scratch_bytes(cs.B, cs.Tn, cs.NH * cs.HS, cs.NH, sizeof(T)));
  tg_test::TestContext tc(scratch, sizeof(T) == 4 ? gpu::Precision::FP32 : gpu::Precision::BF16);
  uint64_t salt = 7000;
  for (const Case& cs : cases) check_case<T>(tc.ctx, cs, salt += 10);
}

}  // namespace

TG_GPU_TEST("gpu attention_naive<float>: forward, mask hook, backward (+=) match the double CPU twin; deterministic") {
  suite<float>();
}

TG_GPU_TEST("gpu attention_naive<bf16>: forward, mask hook, backward (+=) match the double CPU twin; deterministic") {
  suite<gpu::bf16>();
}
