// kernels/attention_naive.cu: multi-head self-attention, materialized, on the GPU (contract in
// kernels/attention_naive.cuh; CPU twin kernels/cpu/attention_naive.h / .cpp, same math).
// Per batch b and head h (bh = b*NH + h), Q, K, V the (T, HS) slices of qkv, sc = 1/sqrt(HS),
// s = key.scale = 1/(1-p) (1 without dropout), M_ij = philox::attn_keep(key, bh, i, j):
//   forward   S = sc Q K^T                      cuBLAS strided-batched GEMM over B*NH, fp32 out
//             P = softmax_rows(S) (j > i -> 0)  } one fused kernel, fp32 math:
//             Pd = P o M s                      }   att = P (T), Pd (T), mask hook
//             O = Pd V                          GEMM, fp32 out, then into out (B, T, C) as T
//   backward  dPd = dO V^T                      GEMM, fp32 out
//             dP = dPd o M s, D_i = sum_j P_ij dP_ij, dS = P o (dP - D)   fused kernel, fp32
//             (Pd regenerated from att and the same M: the mask is never stored)
//             dV = Pd^T dO, dK = sc dS^T Q, dQ = sc dS K   GEMMs, fp32 out
//             dqkv += (dQ, dK, dV)              one scatter-add kernel
// out, att (and mask) are overwritten by the forward; dqkv is accumulated (+=) by the backward.
// att is written in full: exactly 0 above the causal diagonal; the mask hook is written only
// where the CPU twin writes it (j <= i when causal), with the keep decisions applied (all 1
// without dropout). The rounding of Pd is the same in both directions:
// Pd = T(float(att) * s), so the backward's Pd is bit for bit the forward's.
//
// cuBLAS is column-major: the row-major (T, HS) buffer of a head read column-major with ld HS
// is its transpose (HS, T), and a row-major (T, T) buffer with ld T is its transpose. So each
// product X = A B (row-major) is computed as X^T = B^T A^T:
//   S   = sc Q K^T  ->  S^T   (T, T)  = sc K Q^T:   A = K  op T (m = T, k = HS), B = Q  op N (n = T)
//   O   = Pd V      ->  O^T   (HS, T) = V^T Pd^T:   A = V  op N (m = HS, k = T), B = Pd op N (n = T)
//   dPd = dO V^T    ->  dPd^T (T, T)  = V dO^T:     A = V  op T (m = T, k = HS), B = dO op N (n = T)
//   dV  = Pd^T dO   ->  dV^T  (HS, T) = dO^T Pd:    A = dO op N (m = HS, k = T), B = Pd op T (n = T)
//   dK  = sc dS^T Q ->  dK^T  (HS, T) = sc Q^T dS:  A = Q  op N (m = HS, k = T), B = dS op T (n = T)
//   dQ  = sc dS K   ->  dQ^T  (HS, T) = sc K^T dS^T: A = K op N (m = HS, k = T), B = dS op N (n = T)
// with lda/ldb/ldc = HS for the (T, HS) operands and T for the (T, T) ones; batch strides T*HS
// and T*T. All GEMMs: A and B in T, C in float, CUBLAS_COMPUTE_32F (fp32 accumulation; for
// T = float no TF32, for bf16 tensor cores). cuBLAS is bitwise reproducible run to run on one
// stream; the kernels reduce in a fixed order; nothing uses atomics.
//
// Scratch layout (ctx.scratch; every region starts at a multiple of 256 bytes), with
// BTC = B*T*C = B*NH*T*HS and BHTT = B*NH*T*T:
//   R0..R3  4 x BTC floats of room each (a "head region", (B, NH, T, HS))
//   R4      BHTT floats              S (forward) / dPd (backward)
//   R5      BHTT elements of T       Pd (only with dropout in the forward; otherwise Pd = att)
//   R6      BHTT elements of T       dS (backward)
//   forward:  R0 = Q, R1 = K, R2 = V (T);  R4 = S;  R5 = Pd;  R0 = O (float; Q is dead)
//   backward: R0 = Q, R1 = K, R2 = V, R3 = dO (T);  R4 = dPd;  R5 = Pd, R6 = dS;
//             R2 = dV (float; V is dead after dPd), R3 = dK (float; dO is dead after dV),
//             R0 = dQ (float; Q is dead after dK); then dqkv += (R0, R3, R2).
// Without dropout and without the causal mask, the backward reads Pd straight from att.
#include "attention_naive.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace gpu {

namespace {

constexpr int kWarpsPerBlock = 8;  // the softmax kernels: one warp per row (b, h, i)
constexpr int kRowThreads = 32 * kWarpsPerBlock;
constexpr int kElemThreads = 256;  // the permute / scatter kernels

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("attention_naive: ") + what);
}

// The scratch regions (see the layout at the top of the file).
struct Scratch {
  static size_t align(size_t bytes) { return (bytes + 255) / 256 * 256; }
  size_t head_bytes, tt32_bytes, ttT_bytes;
  char* base;
  Scratch(int B, int Tn, int C, int NH, size_t elem_size, void* scratch) : base(static_cast<char*>(scratch)) {
    const size_t btc = (size_t)B * Tn * C, bhtt = (size_t)B * NH * Tn * Tn;
    head_bytes = align(btc * sizeof(float));
    tt32_bytes = align(bhtt * sizeof(float));
    ttT_bytes = align(bhtt * elem_size);
  }
  size_t total() const { return 4 * head_bytes + tt32_bytes + 2 * ttT_bytes; }
  void* head(int r) const { return base + (size_t)r * head_bytes; }                        // R0..R3
  float* scores() const { return reinterpret_cast<float*>(base + 4 * head_bytes); }        // R4
  void* pd() const { return base + 4 * head_bytes + tt32_bytes; }                          // R5
  void* ds() const { return base + 4 * head_bytes + tt32_bytes + ttT_bytes; }              // R6
};

// ---- permutations between (B, T, parts*C) and (B, NH, T, HS) -----------------------------

// dst_p[b, h, t, d] = src[b, t, p*C + h*HS + d] for p < parts (parts = 3: qkv -> Q, K, V;
// parts = 1: dout -> dO). One thread per element of src, so reads are coalesced.
template <typename T>
__global__ void split_heads_kernel(T* __restrict__ dst0,       // (B, NH, T, HS)
                                   T* __restrict__ dst1,       // (B, NH, T, HS) or unused
                                   T* __restrict__ dst2,       // (B, NH, T, HS) or unused
                                   const T* __restrict__ src,  // (B, T, parts*C)
                                   int B, int Tn, int NH, int HS, int parts) {
  const int C = NH * HS, row = parts * C;
  const size_t total = (size_t)B * Tn * row;
  for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const int bt = (int)(idx / row), c = (int)(idx - (size_t)bt * row);
    const int b = bt / Tn, t = bt - b * Tn;
    const int p = c / C, hc = c - p * C, h = hc / HS, d = hc - h * HS;
    T* dst = p == 0 ? dst0 : p == 1 ? dst1 : dst2;
    dst[((size_t)(b * NH + h) * Tn + t) * HS + d] = src[idx];
  }
}

// out[b, t, h*HS + d] = T(y[b, h, t, d]). One thread per element of out (coalesced writes).
template <typename T>
__global__ void merge_heads_kernel(T* __restrict__ out,            // (B, T, C)
                                   const float* __restrict__ y,    // (B, NH, T, HS)
                                   int B, int Tn, int NH, int HS) {
  const int C = NH * HS;
  const size_t total = (size_t)B * Tn * C;
  for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const int bt = (int)(idx / C), c = (int)(idx - (size_t)bt * C);
    const int b = bt / Tn, t = bt - b * Tn, h = c / HS, d = c - h * HS;
    out[idx] = from_float<T>(y[((size_t)(b * NH + h) * Tn + t) * HS + d]);
  }
}

// dqkv[b, t, p*C + h*HS + d] += g_p[b, h, t, d] for p = 0, 1, 2 (g = dQ, dK, dV), in fp32
// with one rounding to T.
template <typename T>
__global__ void scatter_add_heads_kernel(T* __restrict__ dqkv,          // (B, T, 3C) +=
                                         const float* __restrict__ g0,  // (B, NH, T, HS) dQ
                                         const float* __restrict__ g1,  // (B, NH, T, HS) dK
                                         const float* __restrict__ g2,  // (B, NH, T, HS) dV
                                         int B, int Tn, int NH, int HS) {
  const int C = NH * HS, row = 3 * C;
  const size_t total = (size_t)B * Tn * row;
  for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const int bt = (int)(idx / row), c = (int)(idx - (size_t)bt * row);
    const int b = bt / Tn, t = bt - b * Tn;
    const int p = c / C, hc = c - p * C, h = hc / HS, d = hc - h * HS;
    const float* g = p == 0 ? g0 : p == 1 ? g1 : g2;
    dqkv[idx] = from_float<T>(to_float(dqkv[idx]) + g[((size_t)(b * NH + h) * Tn + t) * HS + d]);
  }
}

// ---- the fused softmax + dropout kernels ---------------------------------------------------
// One warp per row (bh, i) of the (T, T) matrix of a head; rows = B*NH*T. In pass k lane `lane`
// owns column j = 32 k + lane, so each load and store of a pass covers 32 consecutive elements
// (coalesced: 100% sector efficiency at every width). Every lane walks its columns in a fixed
// order and the warp combines them with the fixed butterfly of warp_sum / warp_max, so the bits do
// not change from run to run. With Cached (T <= 32 kCachedCols = 1024, every preset) a lane keeps
// its columns of the row in registers, so each buffer is read once and written once: the bytes
// moved are the compulsory bytes (emulated counts, tests/emu/test_kernel_counters.cpp). Longer
// rows are read again in each pass.
//
// The keep decisions: one Philox call (philox::attn_words) decides the 8 columns j0 .. j0 + 7
// (j0 a multiple of 8; bit c of philox::attn_keep_byte for column j0 + c, as philox::attn_keep).
// For each 1024 columns from c0 (once for a cached row), lane L makes the calls of columns
// c0 + 256 g + 8 L .. + 7 for g < 4 and packs the decisions into the 4 bytes of one word; in
// pass k lane L reads the word of lane 4 (k mod 8) + L / 8 with one shuffle and takes bit
// L mod 8 of byte (k / 8) mod 4. One call per 8 columns, as in the CPU twin.

constexpr int kCachedCols = 32;  // columns of a row a lane keeps in registers (rows of T <= 1024)

struct RowIndex {
  uint32_t bh;  // b*NH + h
  int i;        // query row
  int jn;       // columns in play: i + 1 when causal, else T
  size_t off;   // start of the row in a (B, NH, T, T) buffer
};

template <bool IsCausal>
__device__ __forceinline__ RowIndex row_index(long long row, int Tn) {
  RowIndex r;
  r.bh = (uint32_t)(row / Tn);
  r.i = (int)(row - (long long)r.bh * Tn);
  r.jn = IsCausal ? r.i + 1 : Tn;
  r.off = (size_t)row * Tn;
  return r;
}

// The keep decisions of the lane's columns c0 + 256 g + 8 lane + c (g < 4, c < 8) as bit 8 g + c;
// 0 from the end of the columns in play on (no Philox call there), all kept without dropout.
template <bool IsDropout>
__device__ __forceinline__ uint32_t keep_bytes(const philox::DropoutKey& key, const RowIndex& r, int c0, int lane) {
  if (!IsDropout) return 0xffffffffu;
  const uint32_t thr = philox::attn_threshold(key);
  uint32_t bits = 0;
#pragma unroll 1
  for (int g = 0; g < 4; ++g) {
    const int j0 = c0 + 256 * g + 8 * lane;
    if (j0 >= r.jn) break;
    bits |= philox::attn_keep_byte(philox::attn_words(key, r.bh, (uint32_t)r.i, (uint32_t)j0), thr) << (8 * g);
  }
  return bits;
}

// Whether column 32 k + lane is kept, from each lane's keep_bytes of the 1024 columns that hold
// pass k. The whole warp calls it (a shuffle).
template <bool IsDropout>
__device__ __forceinline__ bool pass_keep(uint32_t bytes, int k, int lane) {
  if (!IsDropout) return true;
  const uint32_t bits = __shfl_sync(0xffffffffu, bytes, 4 * (k & 7) + (lane >> 3));
  return (bits >> (8 * ((k >> 3) & 3) + (lane & 7))) & 1u;
}

// Forward, row (bh, i):  m = max_j S_ij,  l = sum_j exp(S_ij - m),  P_ij = exp(S_ij - m) / l,
// att_ij = T(P_ij) (0 for j >= jn), Pd_ij = T(float(att_ij) * s) if kept else 0,
// mask_ij = kept (j < jn only).
template <typename T, bool IsCausal, bool IsDropout, bool Cached>
__global__ void __launch_bounds__(kRowThreads)
    softmax_dropout_forward_kernel(T* __restrict__ att,            // (B, NH, T, T)
                                   T* __restrict__ pd,             // (B, NH, T, T), written with dropout
                                   uint8_t* __restrict__ mask,     // (B, NH, T, T) or null
                                   const float* __restrict__ s,    // (B, NH, T, T) scaled scores
                                   philox::DropoutKey key, int Tn, long long rows) {
  const long long row = (long long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x & 31;
  const RowIndex r = row_index<IsCausal>(row, Tn);
  const float* s_i = s + r.off;
  const int kn = (r.jn + 31) / 32, kt = (Tn + 31) / 32;  // passes over the columns in play, over the row
  float e[Cached ? kCachedCols : 1];                      // Cached: S_ij, then exp(S_ij - m)

  // m_i = max_j S_ij, l_i = sum_j exp(S_ij - m_i) over j < jn (jn >= 1: both finite, l >= 1)
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < (Cached ? kCachedCols : kn); ++k) {
    if (Cached && k >= kn) break;
    const int j = 32 * k + lane;
    if (j < r.jn) {
      const float x = s_i[j];
      if constexpr (Cached) e[k] = x;
      m = fmaxf(m, x);
    }
  }
  m = warp_max(m);
  float l = 0.f;
#pragma unroll
  for (int k = 0; k < (Cached ? kCachedCols : kn); ++k) {
    if (Cached && k >= kn) break;
    const int j = 32 * k + lane;
    if (j < r.jn) {
      float x;
      if constexpr (Cached) x = e[k] = expf(e[k] - m);
      else x = expf(s_i[j] - m);
      l += x;
    }
  }
  l = warp_sum(l);
  const float inv_l = 1.f / l;

  // att_i, Pd_i, mask_i
  T* att_i = att + r.off;
  T* pd_i = IsDropout ? pd + r.off : nullptr;
  uint8_t* mask_i = mask ? mask + r.off : nullptr;
  const float scale = key.scale;
  uint32_t keep_word = 0;
#pragma unroll
  for (int k = 0; k < (Cached ? kCachedCols : kt); ++k) {
    if (Cached && k >= kt) break;
    if (IsDropout && (k & 31) == 0) keep_word = keep_bytes<IsDropout>(key, r, 32 * k, lane);
    const bool keep = pass_keep<IsDropout>(keep_word, k, lane);
    const int j = 32 * k + lane;
    if (j >= Tn) continue;
    // one store a pass for each buffer, its columns in play and the zeros beyond them together
    const bool in_play = j < r.jn;
    float x = 0.f;
    if (in_play) {
      if constexpr (Cached) x = e[k];
      else x = expf(s_i[j] - m);
    }
    const T p = from_float<T>(in_play ? x * inv_l : 0.f);
    att_i[j] = p;
    if (IsDropout) pd_i[j] = from_float<T>(in_play && keep ? to_float(p) * scale : 0.f);
    if (mask_i && in_play) mask_i[j] = keep ? 1 : 0;
  }
}

// Backward, row (bh, i), with P = att:  dP_ij = dPd_ij M_ij s,  D_i = sum_j P_ij dP_ij,
// dS_ij = T(P_ij (dP_ij - D_i)) (0 for j >= jn),  Pd_ij = T(P_ij s) if kept else 0 (written
// when WritePd: with dropout or causal; otherwise the caller reads Pd = att).
// The second argument of __launch_bounds__ (2 CTAs an SM, up to 128 registers) lets ptxas keep a
// cached row's 2 x 32 floats in registers: with the maximum block size alone it stopped at 80
// registers and spilled (sm_80 and sm_90).
template <typename T, bool IsCausal, bool IsDropout, bool Cached>
__global__ void __launch_bounds__(kRowThreads, 2)
    softmax_dropout_backward_kernel(T* __restrict__ ds,             // (B, NH, T, T)
                                    T* __restrict__ pd,             // (B, NH, T, T) or unused
                                    const float* __restrict__ dpd,  // (B, NH, T, T)
                                    const T* __restrict__ att,      // (B, NH, T, T)
                                    philox::DropoutKey key, int Tn, long long rows) {
  constexpr bool WritePd = IsDropout || IsCausal;
  const long long row = (long long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x & 31;
  const RowIndex r = row_index<IsCausal>(row, Tn);
  const float* dpd_i = dpd + r.off;
  const T* att_i = att + r.off;
  const float scale = IsDropout ? key.scale : 1.f;
  const int kn = (r.jn + 31) / 32, kt = (Tn + 31) / 32;  // passes over the columns in play, over the row
  float pc[Cached ? kCachedCols : 1], dpc[Cached ? kCachedCols : 1];  // Cached: P_ij, dP_ij

  // D_i = sum_j P_ij dP_ij over the kept j < jn
  float D = 0.f;
  uint32_t keep_word = 0;
#pragma unroll
  for (int k = 0; k < (Cached ? kCachedCols : kn); ++k) {
    if (Cached && k >= kn) break;
    if (IsDropout && (k & 31) == 0) keep_word = keep_bytes<IsDropout>(key, r, 32 * k, lane);
    const bool keep = pass_keep<IsDropout>(keep_word, k, lane);
    const int j = 32 * k + lane;
    if (j < r.jn) {
      const float p = to_float(att_i[j]);
      const float g = dpd_i[j];  // read if dropped too: the warp's load then covers whole sectors
      const float dp = keep ? g * scale : 0.f;
      if constexpr (Cached) {
        pc[k] = p;
        dpc[k] = dp;
      }
      if (keep) D += p * dp;
    }
  }
  D = warp_sum(D);

  // dS_i, Pd_i
  T* ds_i = ds + r.off;
  T* pd_i = WritePd ? pd + r.off : nullptr;
#pragma unroll
  for (int k = 0; k < (Cached ? kCachedCols : kt); ++k) {
    if (Cached && k >= kt) break;
    if (!Cached && IsDropout && (k & 31) == 0) keep_word = keep_bytes<IsDropout>(key, r, 32 * k, lane);
    const bool keep = pass_keep<IsDropout>(keep_word, k, lane);
    const int j = 32 * k + lane;
    if (j >= Tn) continue;
    // one store a pass for each buffer, its columns in play and the zeros beyond them together
    const bool in_play = j < r.jn;
    float p = 0.f, dp = 0.f;
    if (in_play) {
      if constexpr (Cached) {
        p = pc[k];
        dp = dpc[k];
      } else {
        p = to_float(att_i[j]);
        dp = keep ? dpd_i[j] * scale : 0.f;
      }
    }
    ds_i[j] = from_float<T>(in_play ? p * (dp - D) : 0.f);
    if (WritePd) pd_i[j] = from_float<T>(in_play && keep ? p * scale : 0.f);
  }
}

// ---- GEMM ----------------------------------------------------------------------------------

// C_b = alpha op(A_b) op(B_b) + beta C_b for b < batch (column-major, cuBLAS conventions);
// A and B in T, C in float, fp32 accumulation.
template <typename T>
void gemm_batched(const Context& ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                  const T* A, int lda, long long stride_a, const T* Bm, int ldb, long long stride_b, float beta,
                  float* Cm, int ldc, long long stride_c, int batch) {
  cublasCheck(cublasGemmStridedBatchedEx(ctx.cublas, ta, tb, m, n, k, &alpha, A, cuda_type<T>(), lda, stride_a, Bm,
                                         cuda_type<T>(), ldb, stride_b, &beta, Cm, CUDA_R_32F, ldc, stride_c, batch,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void check_shape(const Context& ctx, int B, int Tn, int C, int NH, size_t elem_size) {
  require(B > 0 && Tn > 0 && C > 0 && NH > 0, "B, T, C, NH must be positive");
  require(C % NH == 0, "C must be a multiple of NH");
  require((long long)B * NH <= 0x7fffffffLL, "B*NH must fit in an int (the GEMM batch count)");
  require(ceil_div((long long)B * NH * Tn, kWarpsPerBlock) <= 0x7fffffffLL, "B*NH*T too large for the row grid");
  require(ctx.scratch != nullptr && ctx.scratch_bytes >= attention_naive_scratch_bytes(B, Tn, C, NH, elem_size),
          "ctx.scratch is smaller than attention_naive_scratch_bytes(B, T, C, NH, sizeof(T))");
}

}  // namespace

size_t attention_naive_scratch_bytes(int B, int Tn, int C, int NH, size_t elem_size) {
  if (B <= 0 || Tn <= 0 || C <= 0 || NH <= 0) return 0;
  return Scratch(B, Tn, C, NH, elem_size, nullptr).total();
}

template <typename T>
void attention_naive_forward(const Context& ctx, T* out, T* att, const T* qkv, const philox::DropoutKey& key, int B,
                             int Tn, int C, int NH, bool causal, uint8_t* mask) {
  check_shape(ctx, B, Tn, C, NH, sizeof(T));
  require(out && att && qkv, "forward: out, att and qkv must not be null");
  const int HS = C / NH, BH = B * NH;
  const long long stride_h = (long long)Tn * HS, stride_tt = (long long)Tn * Tn, rows = (long long)BH * Tn;
  const float sc = 1.f / std::sqrt((float)HS);
  const bool dropout = key.threshold != 0;
  const Scratch sp(B, Tn, C, NH, sizeof(T), ctx.scratch);
  T* q = static_cast<T*>(sp.head(0));
  T* k = static_cast<T*>(sp.head(1));
  T* v = static_cast<T*>(sp.head(2));
  float* s = sp.scores();
  T* pd = dropout ? static_cast<T*>(sp.pd()) : att;  // without dropout Pd = P = att
  float* y = static_cast<float*>(sp.head(0));         // O, over Q (dead after S)

  launch(split_heads_kernel<T>, grid_1d((size_t)B * Tn * 3 * C, kElemThreads), kElemThreads, 0, ctx.stream, q, k, v,
         qkv, B, Tn, NH, HS, 3);
  // S^T = sc K Q^T
  gemm_batched<T>(ctx, CUBLAS_OP_T, CUBLAS_OP_N, Tn, Tn, HS, sc, k, HS, stride_h, q, HS, stride_h, 0.f, s, Tn,
                  stride_tt, BH);
  // P, Pd, mask
  const unsigned row_blocks = (unsigned)ceil_div(rows, kWarpsPerBlock);
  BOOL_SWITCH(causal, kCausal, [&] {
    BOOL_SWITCH(dropout, kDropout, [&] {
      BOOL_SWITCH(Tn <= 32 * kCachedCols, kCached, [&] {
        launch(softmax_dropout_forward_kernel<T, kCausal, kDropout, kCached>, row_blocks, kRowThreads, 0, ctx.stream,
               att, pd, mask, s, key, Tn, rows);
      });
    });
  });
  // O^T = V^T Pd^T
  gemm_batched<T>(ctx, CUBLAS_OP_N, CUBLAS_OP_N, HS, Tn, Tn, 1.f, v, HS, stride_h, pd, Tn, stride_tt, 0.f, y, HS,
                  stride_h, BH);
  launch(merge_heads_kernel<T>, grid_1d((size_t)B * Tn * C, kElemThreads), kElemThreads, 0, ctx.stream, out, y, B, Tn,
         NH, HS);
}

template <typename T>
void attention_naive_backward(const Context& ctx, T* dqkv, const T* dout, const T* qkv, const T* att,
                              const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal) {
  check_shape(ctx, B, Tn, C, NH, sizeof(T));
  require(dqkv && dout && qkv && att, "backward: dqkv, dout, qkv and att must not be null");
  const int HS = C / NH, BH = B * NH;
  const long long stride_h = (long long)Tn * HS, stride_tt = (long long)Tn * Tn, rows = (long long)BH * Tn;
  const float sc = 1.f / std::sqrt((float)HS);
  const bool dropout = key.threshold != 0;
  const Scratch sp(B, Tn, C, NH, sizeof(T), ctx.scratch);
  T* q = static_cast<T*>(sp.head(0));
  T* k = static_cast<T*>(sp.head(1));
  T* v = static_cast<T*>(sp.head(2));
  T* dO = static_cast<T*>(sp.head(3));
  float* dpd = sp.scores();
  T* ds = static_cast<T*>(sp.ds());
  const T* pd = (dropout || causal) ? static_cast<const T*>(sp.pd()) : att;
  float* dq = static_cast<float*>(sp.head(0));  // over Q, dead after dK
  float* dk = static_cast<float*>(sp.head(3));  // over dO, dead after dV
  float* dv = static_cast<float*>(sp.head(2));  // over V, dead after dPd

  launch(split_heads_kernel<T>, grid_1d((size_t)B * Tn * 3 * C, kElemThreads), kElemThreads, 0, ctx.stream, q, k, v,
         qkv, B, Tn, NH, HS, 3);
  launch(split_heads_kernel<T>, grid_1d((size_t)B * Tn * C, kElemThreads), kElemThreads, 0, ctx.stream, dO, nullptr,
         nullptr, dout, B, Tn, NH, HS, 1);
  // dPd^T = V dO^T
  gemm_batched<T>(ctx, CUBLAS_OP_T, CUBLAS_OP_N, Tn, Tn, HS, 1.f, v, HS, stride_h, dO, HS, stride_h, 0.f, dpd, Tn,
                  stride_tt, BH);
  // dS, Pd
  const unsigned row_blocks = (unsigned)ceil_div(rows, kWarpsPerBlock);
  BOOL_SWITCH(causal, kCausal, [&] {
    BOOL_SWITCH(dropout, kDropout, [&] {
      BOOL_SWITCH(Tn <= 32 * kCachedCols, kCached, [&] {
        launch(softmax_dropout_backward_kernel<T, kCausal, kDropout, kCached>, row_blocks, kRowThreads, 0, ctx.stream,
               ds, static_cast<T*>(sp.pd()), dpd, att, key, Tn, rows);
      });
    });
  });
  // dV^T = dO^T Pd
  gemm_batched<T>(ctx, CUBLAS_OP_N, CUBLAS_OP_T, HS, Tn, Tn, 1.f, dO, HS, stride_h, pd, Tn, stride_tt, 0.f, dv, HS,
                  stride_h, BH);
  // dK^T = sc Q^T dS
  gemm_batched<T>(ctx, CUBLAS_OP_N, CUBLAS_OP_T, HS, Tn, Tn, sc, q, HS, stride_h, ds, Tn, stride_tt, 0.f, dk, HS,
                  stride_h, BH);
  // dQ^T = sc K^T dS^T
  gemm_batched<T>(ctx, CUBLAS_OP_N, CUBLAS_OP_N, HS, Tn, Tn, sc, k, HS, stride_h, ds, Tn, stride_tt, 0.f, dq, HS,
                  stride_h, BH);
  launch(scatter_add_heads_kernel<T>, grid_1d((size_t)B * Tn * 3 * C, kElemThreads), kElemThreads, 0, ctx.stream, dqkv,
         dq, dk, dv, B, Tn, NH, HS);
}

#define TG_INSTANTIATE(T)                                                                                          \
  template void attention_naive_forward<T>(const Context&, T*, T*, const T*, const philox::DropoutKey&, int, int, \
                                           int, int, bool, uint8_t*);                                             \
  template void attention_naive_backward<T>(const Context&, T*, const T*, const T*, const T*,                     \
                                            const philox::DropoutKey&, int, int, int, int, bool);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
