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
// The tile is MR rows of NV vector registers (NR = NV x the register's floats); per k, NV loads
// of B, MR broadcasts of A and MR x NV FMAs. Two tilings, chosen when compiling:
//   AVX2 + FMA: 6 x 16 (12 ymm accumulators; 15 of the 16 registers), KC = 384: a B panel,
//               kc x 64 bytes, at most 24 KB, stays in a 32 KB L1 while the tiles stream A;
//   AVX-512F:   12 x 32 (24 zmm accumulators of the 32 registers), KC = 192: a B panel, kc x 128
//               bytes, again at most 24 KB (half of the 48 KB L1 of the cores that have it).
// A row-major A is read in place (MR rows, each contiguous in k); only B is always packed.
// Partial tiles at the edges (M or N not a multiple of the tile) are computed from zero-padded
// panels into a scratch tile and copied.
//
// Each tiling also compiles as portable C++ (Portable<W>: W floats, one std::fma per lane, so
// the same roundings in the same order): the tests run the AVX-512 tiling on machines without
// it, and check each native kernel against its portable twin bit for bit (the AVX-512 kernel
// itself, on such machines, over SIMDe: see TG_GEMM_AVX512_SIMDE below). A build without AVX2
// runs the portable AVX2 tiling (matmul.cpp then keeps Eigen's product).
//
// Summation order: each C element is one chain of FMAs over k, in order, started from 0; the
// chain's sum is then added to C (or written, for the first k block when not accumulating).
// K <= KC is one chain. Eigen's product sums in a different order in places, so the two differ
// by rounding (bench_gemm prints the largest difference).
#include "gemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

// The AVX-512 kernel is built for AVX-512F + FMA, or, in the test binary
// build/test_gemm_avx512 only, over SIMDe's AVX-512 (libsimde-dev): the same intrinsics'
// names, each computed with AVX2 instructions (a 512-bit FMA as two fused 256-bit ones, so
// the same roundings), so that the kernel's own code runs and is checked on a machine without
// AVX-512. SIMDe's aligned load does not fault on a misaligned address as the instruction
// does, so that build checks the alignment itself.
#if defined(TG_GEMM_AVX512_SIMDE)
#if !defined(__AVX2__) || !defined(__FMA__)
#error "TG_GEMM_AVX512_SIMDE needs an AVX2 + FMA build (a fused 512-bit FMA out of two 256-bit ones)"
#endif
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <cstdint>
#include <cstdio>
#define TG_GEMM_AVX512 1
#define TG_GEMM_CHECK_ALIGNED(p, bytes)                                                  \
  do {                                                                                   \
    if (reinterpret_cast<std::uintptr_t>(p) % (bytes)) {                                 \
      std::fprintf(stderr, "gemm.cpp: aligned load from %p, not %d-byte aligned\n",      \
                   static_cast<const void*>(p), (bytes));                                \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
#elif defined(__AVX512F__) && defined(__FMA__)
#define TG_GEMM_AVX512 1
#endif
#ifndef TG_GEMM_CHECK_ALIGNED
#define TG_GEMM_CHECK_ALIGNED(p, bytes) ((void)0)
#endif

namespace cpu {

namespace {

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

// The micro-kernel's vector: W floats and the operations the kernel uses. load reads a packed
// B panel (aligned to the vector: panels start 64-byte aligned and are NR floats per k).
template <int Wd>
struct Portable {
  static constexpr int W = Wd;
  struct T {
    float v[W];
  };
  static T zero() { return T{}; }
  static T load(const float* p) { return loadu(p); }
  static T loadu(const float* p) {
    T r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static T bcast(const float* p) {
    T r;
    std::fill(r.v, r.v + W, *p);
    return r;
  }
  static T fma(const T& a, const T& b, const T& c) {
    T r;
    for (int i = 0; i < W; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return r;
  }
  static T add(const T& a, const T& b) {
    T r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] + b.v[i];
    return r;
  }
  static void storeu(float* p, const T& v) { std::memcpy(p, v.v, sizeof v.v); }
};

#if defined(__AVX2__) && defined(__FMA__)
struct Avx2 {
  static constexpr int W = 8;
  using T = __m256;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_load_ps(p); }
  static T loadu(const float* p) { return _mm256_loadu_ps(p); }
  static T bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static void storeu(float* p, T v) { _mm256_storeu_ps(p, v); }
};
#endif

#if defined(TG_GEMM_AVX512)
struct Avx512 {
  static constexpr int W = 16;
  using T = __m512;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) {
    TG_GEMM_CHECK_ALIGNED(p, 64);
    return _mm512_load_ps(p);
  }
  static T loadu(const float* p) { return _mm512_loadu_ps(p); }
  static T bcast(const float* p) { return _mm512_set1_ps(*p); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static void storeu(float* p, T v) { _mm512_storeu_ps(p, v); }
};
#endif

// A tiling: MR x (NV vectors of V) tiles, k blocks of at most KC, MC rows of a transposed A
// packed at a time (a multiple of MR).
template <class Vec, int MR_, int NV_, int KC_, int MC_>
struct Tiling {
  using V = Vec;
  static constexpr int MR = MR_, NV = NV_, NR = NV_ * Vec::W, KC = KC_, MC = MC_;
  static_assert(MR % 3 == 0 && MC % MR == 0 && KC % 8 == 0, "rows in groups of three; MC whole panels; KC whole transposes");
};
template <class V>
using Tiling8 = Tiling<V, 6, 2, 384, 96>;  // the AVX2 kernel's
template <class V>
using Tiling16 = Tiling<V, 12, 2, 192, 96>;  // the AVX-512 kernel's

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
template <int NR>
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

// C tile (MR x NR, rows ldc apart) = or += A[0 .. MR, 0 .. kc] times one packed B panel. A is
// read in place: row i at a + i * lda when ARow, else (A transposed) column k at a + k * lda.
// Rows are addressed from one pointer per three (base, + ri, + 2 ri: x86 address scales), the
// loops unrolled whole so that every accumulator lives in a register.
template <class Tl, bool ARow>
inline void kernel(int kc, const float* __restrict a, long lda, const float* __restrict b, float* c, long ldc,
                   bool add) {
  using V = typename Tl::V;
  using T = typename V::T;
  constexpr int MR = Tl::MR, NV = Tl::NV, W = V::W, G = MR / 3;
  T acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = V::zero();
  const long ri = ARow ? lda : 1, kstep = ARow ? 1 : lda;  // strides of A's rows and of k
  const float* ag[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) ag[g] = a + 3 * g * ri;
  for (int k = 0; k < kc; ++k, b += Tl::NR) {
    T bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = V::load(b + j * W);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const T ai = V::bcast(ag[i / 3] + (i % 3) * ri);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = V::fma(ai, bv[j], acc[i][j]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) ag[g] += kstep;
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      float* p = c + i * ldc + j * W;
      V::storeu(p, add ? V::add(V::loadu(p), acc[i][j]) : acc[i][j]);
    }
}

// One k block: C[0 .. M, 0 .. N] = or += A[0 .. M, k block] B[k block, 0 .. N], B packed in bp.
// ARow: A's rows at a + i * lda, read in place; the last M % MR rows go through a zero-padded
// copy (ap, MR x kc, k-major). Else (A transposed: column k at a + k * lda) each block of MC
// rows is first packed into ap as MR-row panels, each kc x MR (k-major): read in place, a
// panel's kc columns would lie lda apart, on a few L1 sets when lda is a multiple of 512
// floats. Partial tiles go through a scratch tile.
template <class Tl, bool ARow>
void block(int M, int N, int kc, const float* a, long lda, const float* bp, float* ap, float* c, long ldc, bool add) {
  constexpr int MR = Tl::MR, NR = Tl::NR, MC = Tl::MC;
  alignas(64) float edge[MR * NR];
  const int Mfull = M / MR * MR;
  if (ARow && Mfull < M) {
    for (int k = 0; k < kc; ++k)
      for (int i = 0; i < MR; ++i) ap[k * MR + i] = Mfull + i < M ? a[(long)(Mfull + i) * lda + k] : 0.f;
  }
  for (int i0 = 0; i0 < M; i0 += MC) {
    const int mc = std::min(MC, M - i0);
    if (!ARow) {  // k outer: each column's mc values read once, in order
      const int mfull = mc / MR * MR;
      for (int k = 0; k < kc; ++k) {
        const float* col = a + (long)k * lda + i0;
        float* dst = ap + (size_t)k * MR;
        for (int ip = 0; ip < mfull; ip += MR) std::memcpy(dst + (size_t)ip * kc, col + ip, MR * sizeof(float));
        if (mfull < mc)
          for (int i = 0; i < MR; ++i) dst[(size_t)mfull * kc + i] = mfull + i < mc ? col[mfull + i] : 0.f;
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
        if (!ARow) kernel<Tl, false>(kc, ap + (size_t)(ip - i0) * kc, MR, bpanel, dst, ldd, dadd);
        else if (m == MR) kernel<Tl, true>(kc, a + (long)ip * lda, lda, bpanel, dst, ldd, dadd);
        else kernel<Tl, false>(kc, ap, MR, bpanel, dst, ldd, dadd);
        if (dst == edge)
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j)
              ct[(long)i * ldc + j] = add ? ct[(long)i * ldc + j] + edge[i * NR + j] : edge[i * NR + j];
      }
    }
  }
}

template <class Tl>
void gemm(int M, int N, int K, const float* a, long a_rs, long a_cs, const float* b, long b_rs, long b_cs, float* c,
          long ldc, bool accumulate) {
  constexpr int MR = Tl::MR, NR = Tl::NR, KC = Tl::KC, MC = Tl::MC;
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int i = 0; i < M; ++i) std::fill(c + (long)i * ldc, c + (long)i * ldc + N, 0.f);
    return;
  }
  thread_local Scratch sa, sb;
  // nkb blocks of kcmax (the last one shorter): the least count of blocks, their size rounded
  // up to whole 8 x 8 transposes of pack_b (KC is a multiple of 8, so kcmax stays <= KC)
  const int nkb = (K + KC - 1) / KC, kcmax = ((K + nkb - 1) / nkb + 7) / 8 * 8;
  float* bp = sb.get((size_t)kcmax * ((N + NR - 1) / NR * NR));
  float* ap = sa.get((size_t)kcmax * (MC + MR));
  for (int k0 = 0; k0 < K; k0 += kcmax) {
    const int kc = std::min(kcmax, K - k0);
    const bool add = accumulate || k0 > 0;
    pack_b<NR>(bp, b, b_rs, b_cs, k0, kc, 0, N);
    if (a_cs == 1) {
      block<Tl, true>(M, N, kc, a + k0, a_rs, bp, ap, c, ldc, add);
    } else if (a_rs == 1) {
      block<Tl, false>(M, N, kc, a + (long)k0 * a_cs, a_cs, bp, ap, c, ldc, add);
    } else {  // a general stride: A's k block copied into row-major form first
      float* ar = sa.get((size_t)kcmax * (MC + MR) + (size_t)M * kc) + (size_t)kcmax * (MC + MR);
      ap = sa.p;
      for (int i = 0; i < M; ++i)
        for (int k = 0; k < kc; ++k) ar[(size_t)i * kc + k] = a[(long)i * a_rs + (long)(k0 + k) * a_cs];
      block<Tl, true>(M, N, kc, ar, kc, bp, ap, c, ldc, add);
    }
  }
}

}  // namespace

GemmKernel gemm_kernel_native() {
#if defined(TG_GEMM_AVX512)
  return GemmKernel::Avx512;
#elif defined(__AVX2__) && defined(__FMA__)
  return GemmKernel::Avx2;
#else
  return GemmKernel::Portable8;
#endif
}

bool gemm_kernel_built(GemmKernel k) {
  switch (k) {
    case GemmKernel::Avx2: return kGemmF32Fast;
    case GemmKernel::Avx512: return gemm_kernel_native() == GemmKernel::Avx512;
    case GemmKernel::Portable8:
    case GemmKernel::Portable16: return true;
  }
  return false;
}

const char* gemm_kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::Avx2: return "AVX2 + FMA, 6 x 16";
#if defined(TG_GEMM_AVX512_SIMDE)
    case GemmKernel::Avx512: return "AVX-512F, 12 x 32, over SIMDe (emulated in AVX2)";
#else
    case GemmKernel::Avx512: return "AVX-512F, 12 x 32";
#endif
    case GemmKernel::Portable8: return "portable C++, the AVX2 tiling";
    case GemmKernel::Portable16: return "portable C++, the AVX-512 tiling";
  }
  return "?";
}

void gemm_f32_using(GemmKernel k, int M, int N, int K, const float* a, long a_rs, long a_cs, const float* b,
                    long b_rs, long b_cs, float* c, long ldc, bool accumulate) {
  switch (k) {
#if defined(__AVX2__) && defined(__FMA__)
    case GemmKernel::Avx2: return gemm<Tiling8<Avx2>>(M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
#endif
#if defined(TG_GEMM_AVX512)
    case GemmKernel::Avx512: return gemm<Tiling16<Avx512>>(M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
#endif
    case GemmKernel::Portable8:
      return gemm<Tiling8<Portable<8>>>(M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
    case GemmKernel::Portable16:
      return gemm<Tiling16<Portable<16>>>(M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
    default: throw std::invalid_argument(std::string("gemm_f32_using: kernel not in this build: ") + gemm_kernel_name(k));
  }
}

void gemm_f32(int M, int N, int K, const float* a, long a_rs, long a_cs, const float* b, long b_rs, long b_cs,
              float* c, long ldc, bool accumulate) {
  gemm_f32_using(gemm_kernel_native(), M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, accumulate);
}

}  // namespace cpu
