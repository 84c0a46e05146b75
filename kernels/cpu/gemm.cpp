// kernels/cpu/gemm.cpp: C = (accumulate ? C : 0) + A B in float (contract in kernels/cpu/gemm.h).
//
// The blocking of a packed GEMM (Goto and van de Geijn, "Anatomy of high-performance matrix
// multiplication", 2008), cut down to what the CPU step's shapes need (M = 384 rows of a
// thread's slice, N and K from 65 to 512):
//   for each block of kc <= KC values of k:   pack B[k block, :] into panels of NR columns,
//                                             each kc x NR, k-major (NR values per k)
//     for each block of MC rows of A:         (A transposed: pack them into MR-row panels)
//       for each NR-column panel of B, each MR-row panel of A:
//         the micro-kernel: an MR x NR tile of C in registers, one rank-1 update per k
// MR x NR = 6 x 16: 12 accumulators of 8 floats (two per row), per k two loads of B, six
// broadcasts of A and 12 FMAs; 15 of the 16 ymm registers. A row-major A is read in place (6
// rows, each contiguous in k); only B is always packed (a B panel, kc x 64 bytes, stays in L1
// while the tiles below it stream A from L2). Partial tiles at the edges (M or N not a
// multiple of the tile) are computed from zero-padded panels into a scratch tile and copied.
//
// Summation order: each C element is one chain of FMAs over k, in order, started from 0; the
// chain's sum is then added to C (or written, for the first k block when not accumulating).
// K <= KC (every shape of the baby preset) is one chain. Eigen's product sums in a different
// order in places, so the two differ by rounding (bench_gemm prints the largest difference).
#include "gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace cpu {

namespace {

constexpr int MR = 6, NR = 16;
constexpr int KC = 384, MC = 96;  // K is cut into ceil(K / KC) blocks of equal size

// A per-thread buffer of floats, 64-byte aligned, grown on demand and kept.
struct Scratch {
  float* p = nullptr;
  size_t n = 0;
  ~Scratch() { std::free(p); }
  float* get(size_t want) {
    if (want > n) {
      std::free(p);
      n = (want + 15) / 16 * 16;
      p = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
      if (!p) throw std::bad_alloc();
    }
    return p;
  }
};

#if defined(__AVX2__) && defined(__FMA__)
// dst[t * ldd + r] = src[r * lds + t] for an 8 x 8 block: eight row loads, the usual
// unpack / shuffle / lane-permute transpose, eight row stores.
inline void transpose_8x8(const float* src, long lds, float* dst, long ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

// Packs B[k0 .. k0 + kc, j0 .. j0 + nc] into ceil(nc / NR) panels, each kc x NR (k-major);
// columns past nc are zero.
void pack_b(float* dst, const float* b, long rs, long cs, int k0, int kc, int j0, int nc) {
  for (int jp = 0; jp < nc; jp += NR, dst += (size_t)kc * NR) {
    const int n = std::min(NR, nc - jp);
    if (cs == 1 && n == NR) {  // B row-major: NR contiguous values per k
      for (int k = 0; k < kc; ++k) std::memcpy(dst + (size_t)k * NR, b + (long)(k0 + k) * rs + j0 + jp, NR * sizeof(float));
    } else if (rs == 1) {  // B transposed (the rows of W in x W^T): gather NR rows
      const float* col0 = b + (long)(j0 + jp) * cs + k0;  // column j of B: col0 + j * cs
      int k = 0;
#if defined(__AVX2__) && defined(__FMA__)
      if (n == NR)
        for (; k + 8 <= kc; k += 8)
          for (int h = 0; h < NR; h += 8) transpose_8x8(col0 + h * cs + k, cs, dst + (size_t)k * NR + h, NR);
#endif
      for (int j = 0; j < NR; ++j)
        for (int kk = k; kk < kc; ++kk) dst[(size_t)kk * NR + j] = j < n ? col0[j * cs + kk] : 0.f;
    } else {
      for (int k = 0; k < kc; ++k)
        for (int j = 0; j < NR; ++j)
          dst[(size_t)k * NR + j] = j < n ? b[(long)(k0 + k) * rs + (long)(j0 + jp + j) * cs] : 0.f;
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)

// C tile (MR x NR, rows ldc apart) = or += A[0 .. MR, 0 .. kc] times one packed B panel. A is
// read in place: row i at a + i * lda when ARow, else (A transposed) column k at a + k * lda.
template <bool ARow>
inline void kernel_6x16(int kc, const float* __restrict a, long lda, const float* __restrict b, float* c, long ldc,
                        bool add) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
  __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
  __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
  __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  const long ri = ARow ? lda : 1, kstep = ARow ? 1 : lda;  // strides of A's rows and of k
  const float *a0 = a, *a3 = a + 3 * ri;
  for (int k = 0; k < kc; ++k, a0 += kstep, a3 += kstep, b += NR) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    __m256 ai = _mm256_broadcast_ss(a0);
    c00 = _mm256_fmadd_ps(ai, b0, c00); c01 = _mm256_fmadd_ps(ai, b1, c01);
    ai = _mm256_broadcast_ss(a0 + ri);
    c10 = _mm256_fmadd_ps(ai, b0, c10); c11 = _mm256_fmadd_ps(ai, b1, c11);
    ai = _mm256_broadcast_ss(a0 + 2 * ri);
    c20 = _mm256_fmadd_ps(ai, b0, c20); c21 = _mm256_fmadd_ps(ai, b1, c21);
    ai = _mm256_broadcast_ss(a3);
    c30 = _mm256_fmadd_ps(ai, b0, c30); c31 = _mm256_fmadd_ps(ai, b1, c31);
    ai = _mm256_broadcast_ss(a3 + ri);
    c40 = _mm256_fmadd_ps(ai, b0, c40); c41 = _mm256_fmadd_ps(ai, b1, c41);
    ai = _mm256_broadcast_ss(a3 + 2 * ri);
    c50 = _mm256_fmadd_ps(ai, b0, c50); c51 = _mm256_fmadd_ps(ai, b1, c51);
  }
  auto put = [add](float* p, __m256 lo, __m256 hi) {
    if (add) {
      lo = _mm256_add_ps(_mm256_loadu_ps(p), lo);
      hi = _mm256_add_ps(_mm256_loadu_ps(p + 8), hi);
    }
    _mm256_storeu_ps(p, lo);
    _mm256_storeu_ps(p + 8, hi);
  };
  put(c + 0 * ldc, c00, c01);
  put(c + 1 * ldc, c10, c11);
  put(c + 2 * ldc, c20, c21);
  put(c + 3 * ldc, c30, c31);
  put(c + 4 * ldc, c40, c41);
  put(c + 5 * ldc, c50, c51);
}

#else

// The same tile in plain loops (a build without AVX2 + FMA; matmul.cpp then uses Eigen).
template <bool ARow>
inline void kernel_6x16(int kc, const float* a, long lda, const float* b, float* c, long ldc, bool add) {
  float acc[MR][NR] = {};
  for (int k = 0; k < kc; ++k, b += NR)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += a[ARow ? i * lda + k : k * lda + i] * b[j];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) c[i * ldc + j] = add ? c[i * ldc + j] + acc[i][j] : acc[i][j];
}

#endif

// One k block: C[0 .. M, 0 .. N] = or += A[0 .. M, k block] B[k block, 0 .. N], B packed in bp.
// ARow: A's rows at a + i * lda, read in place; the last M % MR rows go through a zero-padded
// copy (ap, MR x kc, k-major). Else (A transposed: column k at a + k * lda) each block of MC
// rows is first packed into ap as MR-row panels, each kc x MR (k-major): read in place, a
// panel's kc columns would lie lda apart, on a few L1 sets when lda is a multiple of 512
// floats. Partial tiles go through a scratch tile.
template <bool ARow>
void block(int M, int N, int kc, const float* a, long lda, const float* bp, float* ap, float* c, long ldc, bool add) {
  alignas(32) float edge[MR * NR];
  const int Mfull = M / MR * MR;
  if (ARow && Mfull < M) {
    for (int k = 0; k < kc; ++k)
      for (int i = 0; i < MR; ++i) ap[k * MR + i] = Mfull + i < M ? a[(long)(Mfull + i) * lda + k] : 0.f;
  }
  for (int i0 = 0; i0 < M; i0 += MC) {
    const int mc = std::min(MC, M - i0);
    if (!ARow) {
      for (int ip = 0; ip < mc; ip += MR) {
        float* dst = ap + (size_t)ip * kc;
        const int m = std::min(MR, mc - ip);
        for (int k = 0; k < kc; ++k) {
          const float* col = a + (long)k * lda + i0 + ip;
          if (m == MR) std::memcpy(dst + k * MR, col, MR * sizeof(float));
          else
            for (int i = 0; i < MR; ++i) dst[k * MR + i] = i < m ? col[i] : 0.f;
        }
      }
    }
    for (int jp = 0; jp < N; jp += NR) {
      const int n = std::min(NR, N - jp);
      const float* bpanel = bp + (size_t)jp * kc;
      for (int ip = i0; ip < i0 + mc; ip += MR) {
        const int m = std::min(MR, M - ip);
        float* ct = c + (long)ip * ldc + jp;
        float* dst = m == MR && n == NR ? ct : edge;
        const long ldd = dst == ct ? ldc : NR;
        const bool dadd = dst == ct && add;
        if (!ARow) kernel_6x16<false>(kc, ap + (size_t)(ip - i0) * kc, MR, bpanel, dst, ldd, dadd);
        else if (m == MR) kernel_6x16<true>(kc, a + (long)ip * lda, lda, bpanel, dst, ldd, dadd);
        else kernel_6x16<false>(kc, ap, MR, bpanel, dst, ldd, dadd);
        if (dst == edge)
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j)
              ct[(long)i * ldc + j] = add ? ct[(long)i * ldc + j] + edge[i * NR + j] : edge[i * NR + j];
      }
    }
  }
}

}  // namespace

void gemm_f32(int M, int N, int K, const float* a, long a_rs, long a_cs, const float* b, long b_rs, long b_cs,
              float* c, long ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int i = 0; i < M; ++i) std::fill(c + (long)i * ldc, c + (long)i * ldc + N, 0.f);
    return;
  }
  thread_local Scratch sa, sb;
  const int nkb = (K + KC - 1) / KC, kcmax = (K + nkb - 1) / nkb;
  float* bp = sb.get((size_t)kcmax * ((N + NR - 1) / NR * NR));
  float* ap = sa.get((size_t)kcmax * (MC + MR));
  for (int k0 = 0; k0 < K; k0 += kcmax) {
    const int kc = std::min(kcmax, K - k0);
    const bool add = accumulate || k0 > 0;
    pack_b(bp, b, b_rs, b_cs, k0, kc, 0, N);
    if (a_cs == 1) {
      block<true>(M, N, kc, a + k0, a_rs, bp, ap, c, ldc, add);
    } else if (a_rs == 1) {
      block<false>(M, N, kc, a + (long)k0 * a_cs, a_cs, bp, ap, c, ldc, add);
    } else {  // a general stride: A's k block copied into row-major form first
      float* ar = sa.get((size_t)kcmax * (MC + MR) + (size_t)M * kc) + (size_t)kcmax * (MC + MR);
      ap = sa.p;
      for (int i = 0; i < M; ++i)
        for (int k = 0; k < kc; ++k) ar[(size_t)i * kc + k] = a[(long)i * a_rs + (long)(k0 + k) * a_cs];
      block<true>(M, N, kc, ar, kc, bp, ap, c, ldc, add);
    }
  }
}

}  // namespace cpu
