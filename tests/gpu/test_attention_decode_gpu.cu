// tests/gpu/test_attention_decode_gpu.cu: gpu::attention_decode_forward / _prime
// (kernels/attention_decode.cu) against the CPU twin cpu::attention_decode_* in double on the
// same inputs (rounded to T), for T = float and bf16, HS in {32, 64, 128}, the first position,
// one past it, an odd one and the last one of the cache. Checked: the output; the appended
// cache row equals the new k and v exactly; the rows before pos are unchanged and the rows after
// it untouched; the prime copies every key and value of a (n, 3C) qkv into rows 0 .. n-1.
//
// Tolerance, per output element, with u32 = 2^-24 and u = unit_roundoff<T>(): each score is an
// fp32 dot product of HS terms, off by at most (HS + 2) u32 S_abs (S_abs = max_j sc sum_c
// |q_c k_jc|); the exponent s_j - m then by twice that plus 2 u32 |s|; each probability by that
// doubled (numerator and sum) plus (pos + 8) u32 relative; the output sums pos + 1 terms p_j v_j
// (another (pos + 2) u32) and is rounded to T once (u |ref|). So
//   |out - ref| <= 2 (u |ref| + (4 (HS + 2) u32 S_abs + 2 u32 |s|max + (2 pos + 10) u32) max|v|),
// the factor 2 for second-order terms. A wrong row, head or scale moves outputs by O(max|v|).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../../kernels/attention_decode.cuh"
#include "../../kernels/cpu/attention_decode.h"
#include "gpu_util.cuh"

using tg_test::DeviceArray;
using tg_test::random_vector;

using tg_test::kU32;

namespace {

template <typename T>
void check_decode(int HS, int pos, uint64_t salt) {
  const int NH = 2, C = NH * HS, maxT = 70;
  const double u = gpu::unit_roundoff<T>();
  const std::string what = std::string(sizeof(T) == 4 ? "float" : "bf16") + " HS=" + std::to_string(HS) +
                           " pos=" + std::to_string(pos);
  INFO(what);
  tg_test::TestContext tc;
  const size_t ncache = (size_t)NH * maxT * HS;
  DeviceArray<T> kc(random_vector(ncache, salt)), vc(random_vector(ncache, salt + 1));
  DeviceArray<T> qkv(random_vector(3 * (size_t)C, salt + 2)), out(random_vector((size_t)C, salt + 3));
  const std::vector<double> k0 = kc.rounded(), v0 = vc.rounded(), x = qkv.rounded();
  gpu::attention_decode_forward<T>(tc.ctx, out.ptr, kc.ptr, vc.ptr, qkv.ptr, pos, C, NH, maxT);
  const std::vector<double> got = out.download(), k1 = kc.download(), v1 = vc.download();

  std::vector<double> kr = k0, vr = v0, ref(C);
  cpu::attention_decode_forward<double>(ref.data(), kr.data(), vr.data(), x.data(), pos, C, NH, maxT);
  CHECK(k1 == kr);  // row pos appended exactly, every other row as it was
  CHECK(v1 == vr);

  const double sc = 1.0 / std::sqrt((double)HS);
  double s_abs = 0, s_max = 0, v_max = 0;
  for (int h = 0; h < NH; ++h)
    for (int j = 0; j <= pos; ++j) {
      double a = 0, d = 0;
      for (int c = 0; c < HS; ++c) {
        const double q = x[(size_t)h * HS + c], kk = kr[((size_t)h * maxT + j) * HS + c];
        a += std::fabs(q * kk);
        d += q * kk;
        v_max = std::max(v_max, std::fabs(vr[((size_t)h * maxT + j) * HS + c]));
      }
      s_abs = std::max(s_abs, sc * a);
      s_max = std::max(s_max, std::fabs(sc * d));
    }
  std::vector<double> bound(C);
  for (int i = 0; i < C; ++i)
    bound[i] = 2 * (u * std::fabs(ref[i]) +
                    (4 * (HS + 2) * kU32 * s_abs + 2 * kU32 * s_max + (2 * pos + 10) * kU32) * v_max);
  CHECK(tg_test::within(got, ref, bound, what));
}

template <typename T>
void check_prime(int HS, int n, uint64_t salt) {
  const int NH = 3, C = NH * HS, maxT = 40;
  INFO((sizeof(T) == 4 ? "float" : "bf16") << " prime HS=" << HS << " n=" << n);
  tg_test::TestContext tc;
  const size_t ncache = (size_t)NH * maxT * HS;
  DeviceArray<T> kc(random_vector(ncache, salt)), vc(random_vector(ncache, salt + 1));
  DeviceArray<T> qkv(random_vector((size_t)n * 3 * C, salt + 2));
  std::vector<double> kr = kc.rounded(), vr = vc.rounded();
  const std::vector<double> x = qkv.rounded();
  gpu::attention_decode_prime<T>(tc.ctx, kc.ptr, vc.ptr, qkv.ptr, n, C, NH, maxT);
  cpu::attention_decode_prime<double>(kr.data(), vr.data(), x.data(), n, C, NH, maxT);
  CHECK(kc.download() == kr);
  CHECK(vc.download() == vr);
}

}  // namespace

TG_GPU_TEST("gpu attention_decode matches cpu::attention_decode (output, appended cache row)") {
  uint64_t salt = 900;
  for (int HS : {32, 64, 128})
    for (int pos : {0, 1, 37, 69}) {
      check_decode<float>(HS, pos, salt += 10);
      check_decode<gpu::bf16>(HS, pos, salt += 10);
    }
}

TG_GPU_TEST("gpu attention_decode_prime copies every key and value of the window") {
  for (int HS : {32, 128})
    for (int n : {1, 17, 40}) {
      check_prime<float>(HS, n, 700 + HS + n);
      check_prime<gpu::bf16>(HS, n, 800 + HS + n);
    }
}
