// kernels/flash_attn_common.cuh: what the flash-attention forward (flash_attn_fwd.cu) and
// backward (flash_attn_bwd.cu) share. Not a launcher header: device helpers only.
//   - the static switch (head dim and dropout become template parameters in one place; causal
//     stays a run-time flag, FwdParams::causal);
//   - the params structs (the backward's extends the forward's);
//   - thin PTX wrappers: cp.async (16-byte, zero-filling), ldmatrix (.x4, plain and .trans),
//     mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32;
//   - warp-level tile products on those, the tile loader, and the score masking / dropout
//     helpers written for the m16n8 accumulator layout.
//
// The m16n8k16 fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16", bf16), with
// g = lane / 4 and t = lane % 4; every 32-bit register holds two bf16, lower column (or k)
// in the low half:
//   A (16 x 16, row-major): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1],
//                           a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col"):      b0 = B[2t, 2t+1][g],  b1 = B[2t+8, 2t+9][g]
//   C (16 x 8, fp32):       c0, c1 = C[g][2t, 2t+1],  c2, c3 = C[g+8][2t, 2t+1]
// ldmatrix.x4: lanes 8m .. 8m+7 give the row addresses of 8x8 matrix m (m = 0..3); register
// r_m of lane l then holds M_m[l/4][2(l%4), 2(l%4)+1] (plain) or M_m[2(l%4), 2(l%4)+1][l/4]
// (.trans). A warp's accumulator "element e of n-tile nt" below is register e of the C
// fragment of columns 8nt .. 8nt+7: row g + 8*(e/2), column 8nt + 2t + (e%2).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cuda_common.cuh"
#include "flash_attn.cuh"
#include "philox.h"

namespace gpu {
namespace flash {

// 2^x by the special-function unit alone (ex2.approx.ftz.f32), for the bf16 kernels' softmax and
// recomputed probabilities: exp2f adds, for results below 2^-126, a compare and a halving and a
// squaring under predicates (3 of the HS 64 forward's 13 instructions an element off the
// diagonal, ptxas sm_90a); here such results flush to zero (an input below 2^-126 in magnitude
// reads as zero), and every other result is exp2f's, bit for bit. The emulator build
// (tests/emu/simt_emulator.h) gives it.
#ifndef TG_SIMT_EMULATION
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#endif

// ---- the static switch: runtime flags -> template parameters, used once per launcher --------
// (BOOL_SWITCH is kernels/cuda_common.cuh's, the one for every kernel file)

// HSV must already be one of 32, 64, 128, 256 (flash_attn_tile_head_size).
#define FLASH_HEADDIM_SWITCH(HSV, NAME, ...)  \
  [&] {                                       \
    if ((HSV) == 32) {                        \
      constexpr static int NAME = 32;         \
      return __VA_ARGS__();                   \
    } else if ((HSV) == 64) {                 \
      constexpr static int NAME = 64;         \
      return __VA_ARGS__();                   \
    } else if ((HSV) == 128) {                \
      constexpr static int NAME = 128;        \
      return __VA_ARGS__();                   \
    } else {                                  \
      constexpr static int NAME = 256;        \
      return __VA_ARGS__();                   \
    }                                         \
  }()

constexpr float kLog2e = 1.4426950408889634f;

// ---- params ------------------------------------------------------------------------------------
template <typename Act>  // activation storage type: float or bf16
struct FwdParams {
  const Act* qkv;          // (B, T, 3C): Q at columns [0, C), K at [C, 2C), V at [2C, 3C), head h at h*HS
  Act* out;                // (B, T, C) forward: overwritten; backward: read only (D = rowsum(dO o O))
  float* lse;              // (B, NH, T) lse_i = m_i + log(l_i), natural log of the scaled scores;
                           // forward: overwritten; backward: read only
  uint8_t* mask;           // (B, NH, T, T) forward debug dump of the keep decisions, or null
  uint8_t* keep;           // the keep decisions' bytes (flash_attn_keep_offset), or null: the bf16
                           // forward stores them, the bf16 backward reads them instead of Philox
  philox::DropoutKey key;  // selects the dropout mask M (kernels/philox.h); key.threshold used as is
  float dropout_scale;     // s = 1 / (1 - p): kept values are scaled by s; exactly 1 without dropout
  float scale;             // 1 / sqrt(HS): S_ij = Q_i K_j^T * scale
  float scale_log2;        // scale * log2(e): exp(S - m) = exp2(QK^T * scale_log2 - m * scale_log2)
  int B, T, C, NH, HS;     // batch, sequence length, channels, heads, head size (C = NH * HS)
  bool causal;             // keys after the query masked (j > i) and the tiles wholly past the
                           // diagonal skipped; false: every key of the sequence
  long long ld_qkv;        // 3C: row stride of qkv / dqkv in elements
  long long ld_out;        // C: row stride of out / dout in elements
};

// The Hopper forward (kernels/flash_attn_hopper.cu) on params p of head size 64, 128 or 256,
// with or without the dropout path: what flash_attn_forward<bf16> runs when
// flash_attn_hopper_chosen.
void launch_fwd_hopper(const Context& ctx, const FwdParams<bf16>& p, bool dropout);

template <typename Act>
struct BwdParams : FwdParams<Act> {
  const Act* dout;  // (B, T, C) upstream gradient dO
  Act* dqkv;        // (B, T, 3C) +=: dQ, dK, dV at the columns of Q, K, V
  float* D;         // (B, NH, T) scratch: D_i = rowsum(dO_i o O_i), written by the preprocessing pass
  // the Hopper dK / dV kernel with dQ inside (kernels/flash_attn_hopper.cu), else null; scratch:
  float* dq_sums;   // (B, NH, T, HS) dQ's fp32 sums, each query tile's added to key tile by key tile
  int* dq_flags;    // (B, NH, splits, ceil(T / Br)) per query tile (and split of a head's columns
                    // among CTAs), the key tiles whose terms its sums hold
};

// The Hopper backward's dK / dV and dQ kernels (kernels/flash_attn_hopper.cu) on params p of head
// size 64, 128 or 256, after the D pass: what flash_attn_backward<bf16> runs when
// flash_attn_hopper_chosen (the warp-specialized ones with flash_attn_hopper_ws_backward).
void launch_bwd_hopper(const Context& ctx, const BwdParams<bf16>& p, bool dropout);

// The fields the forward and backward launchers fill alike.
template <typename Act>
inline void fill_fwd_params(FwdParams<Act>& p, const Act* qkv, Act* out, float* lse, uint8_t* mask,
                            const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal) {
  const int HS = C / NH;
  p.qkv = qkv;
  p.out = out;
  p.lse = lse;
  p.mask = mask;
  p.key = key;
  p.dropout_scale = key.threshold != 0 ? key.scale : 1.f;
  p.scale = (float)(1.0 / std::sqrt((double)HS));
  p.scale_log2 = (float)(kLog2e / std::sqrt((double)HS));
  p.B = B;
  p.T = Tn;
  p.C = C;
  p.NH = NH;
  p.HS = HS;
  p.causal = causal;
  p.ld_qkv = 3LL * C;
  p.ld_out = C;
}

// A head size the tiles do not have (flash_attn_tile_head_size(HS) != HS): the launchers run the
// kernels on copies of the heads widened to HSp = flash_attn_tile_head_size(HS) in ctx.scratch,
// with the scale of HS.
struct Padding {
  int HS = 0, HSp = 0;  // the heads' size, and the kernels'
  bool active() const { return HSp != HS; }
  // bytes of a padded (rows, groups, HSp) buffer in ctx.scratch, 256-byte aligned (sized for fp32,
  // the wider activation type)
  size_t bytes(long long rows, int groups) const { return ((size_t)rows * groups * HSp * sizeof(float) + 255) / 256 * 256; }
};

// dst (rows, groups, to_hs) = src (rows, groups, from_hs), each head's first min(from_hs, to_hs)
// columns copied and the rest of dst's zeroed: widens heads to the kernels' size, and narrows
// them back.
template <typename T>
void copy_heads(const Context& ctx, T* dst, int to_hs, const T* src, int from_hs, long long rows, int groups);

// The kernels' scale for heads of size HS (fill_fwd_params takes it from C / NH: the padded size).
template <typename Act>
inline void set_scale(FwdParams<Act>& p, int HS) {
  p.scale = (float)(1.0 / std::sqrt((double)HS));
  p.scale_log2 = (float)(kLog2e / std::sqrt((double)HS));
}

// The most dynamic shared memory a block of the forward's (flash_attn_fwd.cu) or the backward's
// (flash_attn_bwd.cu) mma.sync (bf16) or SIMT (float) kernels takes at tile head size HSp.
size_t fwd_smem_bytes(int HSp, bool bf16);
size_t bwd_smem_bytes(int HSp, bool bf16);

// ---- host-side checks shared by the launchers ------------------------------------------------
// Throws std::invalid_argument when `need` bytes of shared memory a block exceed ctx's device's
// opt-in limit (head size HS, run as HSp).
inline void check_smem(const Context& ctx, size_t need, int HS, int HSp, const char* who) {
  if (ctx.smem_per_block_optin == 0 || need <= ctx.smem_per_block_optin) return;
  throw std::invalid_argument(std::string(who) + ": head size " + std::to_string(HS) +
                              (HSp != HS ? " (run as " + std::to_string(HSp) + ")" : std::string()) + " needs " +
                              std::to_string(need) + " bytes of shared memory a block; this GPU allows " +
                              std::to_string(ctx.smem_per_block_optin) +
                              "; use the naive attention path (--attention naive) or a smaller head size");
}

// Validates the shape (throws std::invalid_argument naming what is wrong) and returns HS.
inline int check_shape(int B, int Tn, int C, int NH, const char* who) {
  if (B < 1 || Tn < 1 || NH < 1 || C < 1 || C % NH != 0)
    throw std::invalid_argument(std::string(who) + ": need B, T, NH >= 1 and C a multiple of NH (B=" +
                                std::to_string(B) + ", T=" + std::to_string(Tn) + ", C=" + std::to_string(C) +
                                ", NH=" + std::to_string(NH) + ")");
  const int HS = C / NH;
  std::string why;
  if (!flash_attn_supported(HS, &why))
    throw std::invalid_argument(std::string(who) + ": head size " + std::to_string(HS) + " (C / NH): " + why);
  return HS;
}

// Whether the launchers hand the kernels the caller's keep buffer (flash_attn_keep_offset): with
// dropout on, causal (its layout holds the causal triangle alone) and T <= kFlashKeepMaxT;
// otherwise the kernels make every keep decision by its Philox call.
inline bool keep_buffer_used(const philox::DropoutKey& key, int Tn, bool causal) {
  return key.threshold != 0 && causal && Tn <= kFlashKeepMaxT;
}

inline void check_aligned(const void* p, size_t bytes, const char* who, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    throw std::invalid_argument(std::string(who) + ": " + what + " must be " + std::to_string(bytes) +
                                "-byte aligned");
}

#ifndef TG_SIMT_EMULATION  // the emulator build (tests/emu/simt_emulator.h) provides this section
// ---- PTX wrappers ------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous; when !valid nothing is read and the 16 bytes are
// zero-filled (src-size 0). gmem must be a valid address either way.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// d (16 x 8, fp32) += a (16 x 16, bf16) b (16 x 8, bf16), one warp.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif  // TG_SIMT_EMULATION

// Two floats -> one register of two bf16 (lo in the low half), round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

// ---- tiles in shared memory --------------------------------------------------------------------
// A tile of R rows of a head's (T, HS) slice is stored [R][HS + kPad] bf16: the 16-byte pad
// makes the row stride (HS*2 + 16 bytes) an odd multiple of 16 bytes modulo 128, so the 8
// row addresses of one ldmatrix 8x8 matrix fall in 8 different 16-byte bank groups (no
// bank conflicts), and every row start stays 16-byte aligned for cp.async.
constexpr int kPad = 8;

// Tile sizes of the bf16 kernels that own query rows (the forward, the backward's dQ kernel):
// Warps warps of 16 query rows each (Br = 16 Warps), Bc = 64 keys per tile (32 for HS = 256, so
// that the tiles fit an A100's shared memory); shared memory holds QBufs query-side tiles
// [Br][HS + kPad] (Q_i; Q_i and dO_i for dQ) and two stages of K_j and V_j [Bc][HS + kPad].
template <int HS, int Warps, int QBufs>
struct QueryTile {
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBr = 16 * kWarps;
  static constexpr int kBc = HS > 128 ? 32 : 64;
  static constexpr int kStride = HS + kPad;
  static constexpr size_t kSmemBytes = (size_t)(QBufs * kBr + 4 * kBc) * kStride * sizeof(bf16);
};

// load tile: rows row0 .. row0+R-1 of the (T, HS) slice starting at g (row stride ld
// elements) into s [R][HS + kPad], asynchronously (cp.async, 16 bytes per thread per step,
// consecutive threads on consecutive 16-byte chunks of a row); rows >= Tn are zero-filled,
// so scores against them are 0 (masked by the caller) and P V never meets garbage.
// (The copies of any tile layout: 16-byte chunk k of tile row r goes to s + offset(r, k).)
// Where the threads cover whole rows (P = NThreads / (HS / 8) rows a pass) and the layout puts rows
// P apart RowStep P units of T apart at every chunk (RowStep > 0), each thread copies the same
// chunk k of rows r, r + P, r + 2P, .. from one source and one destination address, not one a
// chunk, and a tile with no rows past Tn (every tile but a sequence's last: a uniform branch)
// copies without the row tests: fewer instructions and registers (the Hopper dQ kernel's loop that
// is not pipelined, at HS 128: 158 registers where it had 202).
template <int R, int HS, int NThreads, int RowStep = 0, typename T, typename Offset>
__device__ __forceinline__ void load_tile_chunks(T* s, const bf16* g, long long ld, int row0, int Tn, Offset offset) {
  constexpr int kChunks = HS / 8;  // 16-byte chunks per row
  constexpr int kTotal = R * kChunks;
  static_assert(kTotal % NThreads == 0, "tile chunks must divide evenly among the threads");
  constexpr int P = NThreads / kChunks;
  if constexpr (RowStep > 0 && NThreads % kChunks == 0 && R % P == 0) {
    const int r = (int)threadIdx.x / kChunks, k = (int)threadIdx.x % kChunks;
    const bf16* src = g + (long long)(row0 + r) * ld + 8 * k;
    T* dst = s + offset(r, k);
    if (row0 + R <= Tn) {
#pragma unroll
      for (int q = 0; q < R / P; ++q) cp_async_16(dst + q * P * RowStep, src + q * P * ld, true);
    } else {
      const int left = Tn - row0 - r;  // pass q's row is inside while q P < left
#pragma unroll
      for (int q = 0; q < R / P; ++q) {
        const bool valid = q * P < left;
        cp_async_16(dst + q * P * RowStep, valid ? src + q * P * ld : g, valid);  // (g: row 0 exists, T >= 1)
      }
    }
  } else {
#pragma unroll
    for (int it = 0; it < kTotal / NThreads; ++it) {
      const int c = it * NThreads + (int)threadIdx.x;
      const int r = c / kChunks, k = c % kChunks;
      const int row = row0 + r;
      const bool valid = row < Tn;
      const bf16* src = g + (long long)(valid ? row : 0) * ld + k * 8;  // row 0 exists: T >= 1
      cp_async_16(s + offset(r, k), src, valid);
    }
  }
}
template <int R, int HS, int NThreads>
__device__ __forceinline__ void load_tile_async(bf16* s, const bf16* g, long long ld, int row0, int Tn) {
  constexpr int S = HS + kPad;
  load_tile_chunks<R, HS, NThreads, S>(s, g, ld, row0, Tn, [](int r, int k) { return r * S + k * 8; });
}

// ---- fragment index maps (host and device, so that they can be checked on the host) -------------
struct RowCol {
  int r, c;
};
// The (row, column) element offset of the 8-element row that `lane` addresses in an ldmatrix.x4
// load of, respectively: the A operand (16 rows x k-step kk) of a row-major tile; the B operand
// of n-tiles 2np, 2np+1 for k-step kk from a tile stored N x K (plain); the B operand of
// n-tiles 2np, 2np+1 for k-step kk from a tile stored K x N (.trans). Derivations below.
__host__ __device__ constexpr RowCol ldsm_a(int lane, int kk) { return {lane % 16, kk * 16 + (lane / 16) * 8}; }
__host__ __device__ constexpr RowCol ldsm_b(int lane, int np, int kk) {
  return {np * 16 + (lane % 8) + (lane / 16) * 8, kk * 16 + ((lane / 8) % 2) * 8};
}
__host__ __device__ constexpr RowCol ldsm_bt(int lane, int kk, int np) {
  return {kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, np * 16 + (lane / 16) * 8};
}
// Element e (0..3) of n-tile nt of a warp's 16 x N accumulator held by `lane`: row g + 8(e/2),
// column 8nt + 2t + e%2 (g = lane/4, t = lane%4).
__host__ __device__ constexpr RowCol c_elem(int lane, int nt, int e) {
  return {lane / 4 + 8 * (e / 2), 8 * nt + 2 * (lane % 4) + (e % 2)};
}

// ---- warp-level tile products on tensor cores -------------------------------------------------
// acc (16 x N) += A B^T: A = 16 rows x K of a shared tile at sA, B = N rows x K at sB (row
// stride S elements for both), e.g. S_ij = Q_i K_j^T. Both operands come through plain
// ldmatrix:
//   A, k-step kk: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
//     (rows 8-15, k 8-15) = a0..a3; lane l addresses row l%16, column 16kk + 8(l/16).
//   B = (rows of sB)^T, "col" operand = N x K row-major = sB itself; for n-tiles 2np, 2np+1
//     (rows 16np .. 16np+15 of sB): matrices (rows 0-7, k 0-7) = b0 of n-tile 2np,
//     (rows 0-7, k 8-15) = b1 of 2np, (rows 8-15, k 0-7) = b0 of 2np+1, (rows 8-15, k 8-15)
//     = b1 of 2np+1; lane l (m = l/8) addresses row 16np + l%8 + 8(m/2), column 16kk + 8(m%2).
//     Check: lane l of b0 gets M[l/4][2(l%4)..] = sB[row g][k 2t..] = B[k 2t..][n g].
// fp32 path: rows row0 .. row0+R-1 of a (T, HS) fp32 slice into s [R][LD] (plain loads by the
// whole CTA), zeros past T.
template <int R, int HS, int LD>
__device__ __forceinline__ void load_tile_f32(float* s, const float* g, long long ld, int row0, int Tn) {
  for (int c = threadIdx.x; c < R * HS; c += blockDim.x) {
    const int r = c / HS, d = c % HS, row = row0 + r;
    s[r * LD + d] = row < Tn ? g[(long long)row * ld + d] : 0.f;
  }
}

// The k-steps run in rolled groups of at most 8 (HS = 256: two), each unrolled: ptxas otherwise
// loads every step's fragments ahead at once and the dK / dV kernel spills.
template <int K, int N, int S>
__device__ __forceinline__ void warp_gemm_ss(float (&acc)[N / 8][4], const bf16* sA, const bf16* sB, int lane) {
  static_assert(K % 16 == 0 && N % 16 == 0, "tile sizes must be multiples of 16");
  constexpr int kGroup = K / 16 < 8 ? K / 16 : 8;
#pragma unroll 1
  for (int k0 = 0; k0 < K / 16; k0 += kGroup) {
#pragma unroll
    for (int kx = 0; kx < kGroup; ++kx) {
      const int kk = k0 + kx;
      uint32_t a[4];
      const RowCol ra = ldsm_a(lane, kk);
      ldmatrix_x4(a, smem_u32(sA + ra.r * S + ra.c));
#pragma unroll
      for (int np = 0; np < N / 16; ++np) {
        uint32_t b[4];
        const RowCol rb = ldsm_b(lane, np, kk);
        ldmatrix_x4(b, smem_u32(sB + rb.r * S + rb.c));
        mma_bf16_16816(acc[2 * np], a, b[0], b[1]);
        mma_bf16_16816(acc[2 * np + 1], a, b[2], b[3]);
      }
    }
  }
}

// acc (16 x N) += P B: P = 16 x K in registers as K/8 C fragments (fp32, rounded to bf16
// here), B = K rows x N of a shared tile at sB (row stride S), e.g. O_i += P_ij V_j.
//   A from C fragments, k-step kk (columns 16kk .. 16kk+15 of P): a0 = C[g][2t..] of n-tile
//     2kk = (c0, c1), a1 = (c2, c3) of 2kk, a2 = (c0, c1) of 2kk+1, a3 = (c2, c3) of 2kk+1.
//   B = sB (K x N row-major) read with ldmatrix.trans: lane l of b0 gets M[2t..][g] =
//     sB[k 2t..][n g] = B[k 2t..][n g]; for n-tiles 2np, 2np+1: matrices (k 0-7, n 0-7) = b0
//     of 2np, (k 8-15, n 0-7) = b1 of 2np, (k 0-7, n 8-15) = b0 of 2np+1, (k 8-15, n 8-15)
//     = b1 of 2np+1; lane l (m = l/8) addresses row 16kk + l%8 + 8(m%2), column 16np + 8(m/2).
// With Masked, element e of n-tile nt of P enters as 0 unless bit 4nt+e of keep is set.
// P (K/8 n-tiles of a warp's 16-row accumulators, fp32) as the A fragments of K/16 k-steps of
// 16 columns, rounded to bf16: a0 = (c0, c1) of n-tile 2kk, a1 = (c2, c3) of 2kk, a2 = (c0, c1)
// of 2kk+1, a3 = (c2, c3) of 2kk+1 (mma.m16n8k16's A layout, which is also each warp's share of a
// wgmma m64nNk16's A). With Masked, element e of n-tile nt enters as 0 unless bit 4nt+e of keep
// is set.
template <int K, bool Masked>
__device__ __forceinline__ void pack_a(uint32_t (&a)[K / 16][4], const float (&p)[K / 8][4], uint32_t keep) {
  static_assert(K % 16 == 0 && (!Masked || K / 2 <= 32), "tile sizes");
  auto el = [&](int nt, int e) -> float {
    if constexpr (Masked) return ((keep >> (4 * nt + e)) & 1u) ? p[nt][e] : 0.f;
    return p[nt][e];
  };
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    a[kk][0] = pack_bf16x2(el(2 * kk, 0), el(2 * kk, 1));
    a[kk][1] = pack_bf16x2(el(2 * kk, 2), el(2 * kk, 3));
    a[kk][2] = pack_bf16x2(el(2 * kk + 1, 0), el(2 * kk + 1, 1));
    a[kk][3] = pack_bf16x2(el(2 * kk + 1, 2), el(2 * kk + 1, 3));
  }
}

// (Desc: the k-steps of 16 last-first, as dQ's sums over the keys run)
template <int K, int N, int S, bool Masked, bool Desc = false>
__device__ __forceinline__ void warp_gemm_rs(float (&acc)[N / 8][4], const float (&p)[K / 8][4], uint32_t keep,
                                             const bf16* sB, int lane) {
  static_assert(K % 16 == 0 && N % 16 == 0, "tile sizes");
  uint32_t a[K / 16][4];
  pack_a<K, Masked>(a, p, keep);
#pragma unroll
  for (int step = 0; step < K / 16; ++step) {
    const int kk = Desc ? K / 16 - 1 - step : step;
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b[4];
      const RowCol rb = ldsm_bt(lane, kk, np);
      ldmatrix_x4_trans(b, smem_u32(sB + rb.r * S + rb.c));
      mma_bf16_16816(acc[2 * np], a[kk], b[0], b[1]);
      mma_bf16_16816(acc[2 * np + 1], a[kk], b[2], b[3]);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
}

// A dQ kernel's CTA, both families (grid (B*NH, ceil(T / Br)), the query tiles last-first): its
// batch-head bh; the first query row of the CTA (i0), of the warp (iw0) and of the lane's c0 (i_g);
// batch b's first element in qkv and dqkv (qkv_b) and head h's first column (h_col); the head's Q,
// K, V and dO; and the n_j key tiles of Bc it visits.
struct DqCta {
  uint32_t bh;
  int i0, iw0, i_g;
  long long qkv_b, h_col;
  const bf16 *Q, *K, *V, *dO;
  int n_j;
};
template <int HS, int Br, int Bc>
__device__ __forceinline__ DqCta dq_cta(const BwdParams<bf16>& p, int warp, int lane) {
  const uint32_t bh = blockIdx.x;
  const int b = (int)bh / p.NH, h = (int)bh % p.NH;
  const int i0 = (gridDim.y - 1 - blockIdx.y) * Br;
  const int iw0 = i0 + 16 * warp;
  const long long qkv_b = (long long)b * p.T * p.ld_qkv, h_col = (long long)h * HS;
  const bf16* Q = p.qkv + qkv_b + h_col;
  const int j_end = p.causal ? min(p.T, i0 + Br) : p.T;
  return DqCta{bh, i0, iw0, iw0 + lane / 4, qkv_b, h_col, Q, Q + p.C, Q + 2LL * p.C,
               p.dout + (long long)b * p.T * p.ld_out + h_col, (j_end + Bc - 1) / Bc};
}

// lse_i log2(e) and D_i of the lane's rows i_g, i_g + 8 (+inf past T: P = 0 there), for the dQ
// kernels of both families
__device__ __forceinline__ void row_lse_d(float (&lse2)[2], float (&Di)[2], const BwdParams<bf16>& p, uint32_t bh,
                                          int i_g) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = i_g + 8 * r;
    lse2[r] = i < p.T ? p.lse[(long long)bh * p.T + i] * kLog2e : INFINITY;
    Di[r] = i < p.T ? p.D[(long long)bh * p.T + i] : 0.f;
  }
}

// ---- masking in the query-major accumulator layout ---------------------------------------------
// (forward and dQ: rows = queries i, columns = keys j). Element (nt, e) of the lane with
// i_g = absolute query row of its c0 (first row of the warp + g) and j_t = absolute key
// column of its c0 in n-tile 0 (j0 + 2t) is row i_g + 8(e/2), column j_t + 8nt + e%2.
// -inf where j >= T (keys past the end) or, causal, j > i.
template <int NT>
__device__ __forceinline__ void mask_scores(float (&s)[NT][4], int i_g, int j_t, int Tn, bool causal) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = i_g + 8 * (e / 2), j = j_t + 8 * nt + (e % 2);
      if (j >= Tn || (causal && j > i)) s[nt][e] = -INFINITY;
    }
}

// ---- dropout in the query-major accumulator layout ---------------------------------------------
// The keep decisions of query i and keys j .. j+7 (j a multiple of 8), one byte (bit u: key
// j + u): stored_keep_byte reads the one the forward stored in `in`; keep_byte makes it by its
// Philox call (philox::attn_keep_byte) and, when `out` is not null, stores it there for the
// backward. The buffers hold the causal pairs of queries < T (flash_attn_keep_offset; the
// launchers pass them for causal attention only); elsewhere the byte read is 0, for elements the
// masking has already zeroed (keys all after the query, or a query >= T).
__device__ __forceinline__ uint32_t stored_keep_byte(const uint8_t* in, int Tn, uint32_t bh, uint32_t i, uint32_t j) {
  return i < (uint32_t)Tn && j <= i ? (uint32_t)in[flash_attn_keep_offset(Tn, bh, i, j / 8)] : 0u;
}
__device__ __forceinline__ uint32_t keep_byte(const philox::DropoutKey& key, uint32_t thr, uint8_t* out, int Tn,
                                              uint32_t bh, uint32_t i, uint32_t j) {
  const uint32_t byte = philox::attn_keep_byte(philox::attn_words(key, bh, i, j), thr);
  if (out && i < (uint32_t)Tn && j <= i) out[flash_attn_keep_offset(Tn, bh, i, j / 8)] = (uint8_t)byte;
  return byte;
}

// M_ij = philox::attn_keep(key, bh, i, j): one Philox call decides the 8 columns 8(j/8) ..
// 8(j/8)+7 of row i, one n-tile of one row (j0 is a multiple of 8). The quad of lanes t = 0..3
// (rows g and g+8; in each n-tile lane t owns columns 2t, 2t+1) covers two n-tiles nt, nt+1 of
// both rows with four calls, one a lane: lane t decides row g + 8 (t % 2) of n-tile nt + t / 2. The quad then
// gathers the four keep bytes (two shuffles), byte t of one word, and each lane takes its two
// columns' bits of each: every element's decision is still that of its own (bh, i, j), whatever
// the tile or thread layout. (NT odd: the last n-tile's calls are those of lanes t < 2 alone.)
// It comes in two halves, so that a kernel can fetch a key tile's bytes a step before it needs
// them (their global loads then wait under that step's products): fetch_keep_calls puts the
// bytes of the lane's calls in KeepCalls (c: n-tiles 2c, 2c + 1), from `in` (the forward's stored
// ones, stored_keep_byte: global loads, none waited for here) or made (keep_byte: Philox; stored
// to `out` when not null); keep_bits_from_calls gathers them (all 32 lanes must call it) into the lane's keep
// bits, bit 4nt+e for element (nt, e). dropout_keep_bits is both at once.
template <int NT>
struct KeepCalls {
  static_assert(NT * 4 <= 32, "keep bits must fit one register");
  static constexpr int kCalls = (NT + 1) / 2;
  uint32_t byte[kCalls];
};
template <int NT>
__device__ __forceinline__ void fetch_keep_calls(KeepCalls<NT>& kc, const philox::DropoutKey& key, uint32_t bh,
                                                 int i_g, int j0, int lane, const uint8_t* in, uint8_t* out, int Tn) {
  const int t = lane % 4;
  const uint32_t row = (uint32_t)(i_g + 8 * (t & 1));  // this lane's Philox row
  // call c: n-tile 2c + t / 2 (past the last n-tile when NT is odd: a call whose byte no lane
  // takes, made so that the shuffles stay warp-wide)
  if (in) {
#pragma unroll
    for (int c = 0; c < KeepCalls<NT>::kCalls; ++c)
      kc.byte[c] = stored_keep_byte(in, Tn, bh, row, (uint32_t)(j0 + 8 * (2 * c + t / 2)));
    return;
  }
  const uint32_t thr = philox::attn_threshold(key);
#pragma unroll
  for (int c = 0; c < KeepCalls<NT>::kCalls; ++c)
    kc.byte[c] = keep_byte(key, thr, out, Tn, bh, row, (uint32_t)(j0 + 8 * (2 * c + t / 2)));
}
template <int NT>
__device__ __forceinline__ uint32_t keep_bits_from_calls(const KeepCalls<NT>& kc, int lane) {
  const int t = lane % 4;
  uint32_t bits = 0;
#pragma unroll
  for (int c = 0; c < KeepCalls<NT>::kCalls; ++c) {
    const int nt = 2 * c;
    uint32_t all = kc.byte[c] << (8 * t);
    all |= __shfl_xor_sync(0xffffffffu, all, 1);
    all |= __shfl_xor_sync(0xffffffffu, all, 2);
    // byte 0: row g of n-tile nt, 1: row g+8 of nt, 2: row g of nt+1, 3: row g+8 of nt+1
#pragma unroll
    for (int h = 0; h < 2 && nt + h < NT; ++h) {
      const uint32_t top = (all >> (16 * h + 2 * t)) & 3u;      // row g:   columns 2t, 2t+1 -> e = 0, 1
      const uint32_t bot = (all >> (16 * h + 8 + 2 * t)) & 3u;  // row g+8: columns 2t, 2t+1 -> e = 2, 3
      bits |= (top | (bot << 2)) << (4 * (nt + h));
    }
  }
  return bits;
}
template <int NT>
__device__ __forceinline__ uint32_t dropout_keep_bits(const philox::DropoutKey& key, uint32_t bh, int i_g, int j0,
                                                      int lane, const uint8_t* in, uint8_t* out, int Tn) {
  KeepCalls<NT> kc;
  fetch_keep_calls(kc, key, bh, i_g, j0, lane, in, out, Tn);
  return keep_bits_from_calls(kc, lane);
}

// Records the keep decisions of the elements a lane owns into the (T, T) mask of one (b, h)
// (mask_bh points at its [0][0]): only i < T, j < T and, causal, j <= i (the CPU twin leaves
// the entries above the diagonal untouched).
template <int NT>
__device__ __forceinline__ void write_mask(uint8_t* mask_bh, uint32_t bits, int i_g, int j_t, int Tn, bool causal) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = i_g + 8 * (e / 2), j = j_t + 8 * nt + (e % 2);
      if (i < Tn && j < Tn && (!causal || j <= i)) mask_bh[(long long)i * Tn + j] = (uint8_t)((bits >> (4 * nt + e)) & 1u);
    }
}

// ---- the forward's row state, shared by the mma.sync and the Hopper (wgmma) kernels: both hold
// a warp's scores and output in the same per-warp accumulator layout (16 rows a warp, element e
// of n-tile nt) ------------------------------------------------------------------------------------

// online softmax update, per lane for its rows g (r = 0) and g+8 (r = 1), columns of s:
//   m_new = max(m_i, rowmax(S_ij))             (row max across the quad: lanes 4g .. 4g+3)
//   P~_ij = exp(S_ij - m_new)                   in place in s
//   alpha = exp(m_i - m_new);  l_i = alpha l_i + rowsum(P~_ij);  O_i = alpha O_i;  m_i = m_new
// l_i is the lane's partial sum over its own columns (the quad sum is taken once, at the
// end, in a fixed order). A row with nothing unmasked yet (m_new = -inf) keeps its state and
// gets P~ = 0, as in the CPU twin. online_softmax_scores does all but O_i's rescaling, whose
// alpha it returns; online_softmax_update does both.
template <int NT>
__device__ __forceinline__ void online_softmax_scores(float (&s)[NT][4], float (&alpha)[2], float (&m)[2], float (&l)[2],
                                                      float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m[r];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const bool empty = mx == -INFINITY;
    const float m_scaled = empty ? 0.f : mx * scale_log2;
    alpha[r] = empty ? 1.f : exp2_ftz(m[r] * scale_log2 - m_scaled);  // 0 on the first tile
    float rowsum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        s[nt][e] = exp2_ftz(fmaf(s[nt][e], scale_log2, -m_scaled));  // exp2(-inf) = 0 at masked entries
        rowsum += s[nt][e];
      }
    l[r] = alpha[r] * l[r] + rowsum;
    m[r] = mx;
  }
}

// O_i = alpha O_i, the rows' rescaling (apart from the scores' update, so that a kernel whose O is
// still being accumulated asynchronously applies it once that product has retired)
template <int NO>
__device__ __forceinline__ void rescale_rows(float (&o)[NO][4], const float (&alpha)[2]) {
#pragma unroll
  for (int no = 0; no < NO; ++no)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[no][e] *= alpha[e / 2];
}

template <int NT, int NO>
__device__ __forceinline__ void online_softmax_update(float (&s)[NT][4], float (&o)[NO][4], float (&m)[2],
                                                      float (&l)[2], float scale_log2) {
  float alpha[2];
  online_softmax_scores(s, alpha, m, l, scale_log2);
  rescale_rows(o, alpha);
}

// P~_ij o M_ij with the keep bits of the lane's elements (bit 4nt+e for element (nt, e), as
// dropout_keep_bits returns them); the same bits go to the mask dump when it is requested.
template <int NT>
__device__ __forceinline__ void apply_keep_bits(float (&s)[NT][4], const FwdParams<bf16>& p, uint32_t bits,
                                                uint32_t bh, int i_g, int j0, int lane) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (!((bits >> (4 * nt + e)) & 1u)) s[nt][e] = 0.f;
  if (p.mask) write_mask<NT>(p.mask + (long long)bh * p.T * p.T, bits, i_g, j0 + 2 * (lane % 4), p.T, p.causal);
}

// apply dropout: P~_ij o M_ij (the scale s comes at the end), with M_ij from
// dropout_keep_bits; the same bits go to the mask dump when it is requested, and their bytes to
// p.keep when it is not null.
template <int NT>
__device__ __forceinline__ void apply_dropout(float (&s)[NT][4], const FwdParams<bf16>& p, uint32_t bh, int i_g,
                                              int j0, int lane) {
  apply_keep_bits<NT>(s, p, dropout_keep_bits<NT>(p.key, bh, i_g, j0, lane, nullptr, p.keep, p.T), bh, i_g, j0,
                      lane);
}

// write O and LSE: l_i = quad sum of the lane partials; O_i = O_i * s / l_i to out (rows < T),
// lse_i = m_i / sqrt(HS) + log(l_i) (m_i is in raw Q K^T units) by the lane with t = 0.
template <int NO>
__device__ __forceinline__ void write_out_lse(const FwdParams<bf16>& p, float (&o)[NO][4], const float (&m)[2],
                                              const float (&l)[2], uint32_t bh, int b, int h, int i_g, int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lt = l[r] + __shfl_xor_sync(0xffffffffu, l[r], 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const int i = i_g + 8 * r;
    if (i >= p.T) continue;
    const float inv = p.dropout_scale / lt;
    bf16* dst = p.out + ((long long)b * p.T + i) * p.ld_out + (long long)h * p.HS + 2 * t;
#pragma unroll
    for (int no = 0; no < NO; ++no)
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * no) = __floats2bfloat162_rn(o[no][2 * r] * inv, o[no][2 * r + 1] * inv);
    if (t == 0) p.lse[(long long)bh * p.T + i] = m[r] * p.scale + logf(lt);
  }
}

// ---- the backward's tile helpers, shared by the mma.sync and the Hopper (wgmma) kernels (the
// same per-warp accumulator layout: 16 rows a warp, warp = the warp's index in its CTA, or in its
// warpgroup for the Hopper kernels) ------------------------------------------------------------------

// A query tile's lse_i and D_i (queries i0 .. i0+Br-1, one a thread: tid < Br) into a dK / dV
// kernel's stage, as lse_i log2(e) (+inf past T: P = 0 there) and D_i (0 past T): load_row_stats
// at once, or in two halves like the keep bytes below, so that no step waits a global load's
// latency before its barrier: fetch_row_stats issues the loads (with the tile's Q_i, dO_i copies)
// and store_row_stats, later in the step, writes what they brought.
struct RowStats {
  float lse, d;
};
template <int Br>
__device__ __forceinline__ RowStats fetch_row_stats(const float* lse, const float* Dg, int i0, int Tn, int tid) {
  const bool in = tid < Br && i0 + tid < Tn;
  return {in ? lse[i0 + tid] : 0.f, in ? Dg[i0 + tid] : 0.f};
}
template <int Br>
__device__ __forceinline__ void store_row_stats(float* sL, float* sD, const RowStats& r, int i0, int Tn, int tid) {
  if (tid >= Br) return;
  const bool in = i0 + tid < Tn;
  sL[tid] = in ? r.lse * kLog2e : INFINITY;
  sD[tid] = in ? r.d : 0.f;
}
template <int Br, int NThreads>
__device__ __forceinline__ void load_row_stats(float* sL, float* sD, const float* lse, const float* Dg, int i0, int Tn,
                                               int tid) {
  for (int r = tid; r < Br; r += NThreads) {
    const int i = i0 + r;
    sL[r] = i < Tn ? lse[i] * kLog2e : INFINITY;
    sD[r] = i < Tn ? Dg[i] : 0.f;
  }
}

// Where query q (0 .. Br-1) of a tile has its keep byte in a row of sM: the queries that a lane t
// of the key-major layout reads (8 nt + 2 t + e, nt < Br / 8, e < 2: keep_bits_from_tile) side by
// side, at 2 (Br / 8) t + 2 nt + e, so that it reads them in one load.
template <int Br>
__device__ __forceinline__ int mask_tile_column(int q) {
  return (q % 8 / 2) * (Br / 4) + 2 * (q / 8) + q % 2;
}

// The keep bytes of the tile (queries i0 .. i0+Br-1, keys j0 .. j0+Bc-1) into
// sM[group][mask_tile_column(query)] (row stride MS bytes, a group = 8 keys, bit u of a byte: key 8
// group + u), by the NThreads threads tid = 0 .. NThreads-1 (a CTA, or one warp making its own 16
// keys' two rows): one Philox call per (query, 8 keys), philox::attn_keep's, or with `in` not null
// the byte the forward stored (stored_keep_byte; i0 and j0 multiples of 16).
// A warp's 32 calls are 16 consecutive queries of two consecutive key groups, the 32-byte block
// of the stored bytes (flash_attn_keep_offset): one sector. Its 32 one-byte stores fill 4 words of
// each of the two rows, Br / 4 bytes apart in a row (2 or 4 banks: the words' banks are
// {0, 2, 4, 6} or {0, 4, 8, 12} plus the block's); with MS = Br (8 or 16 banks) the second row's
// are the other banks, so one wavefront.
// It comes in two halves, so that a kernel can fetch the next tile's bytes into registers (their
// global loads, or the Philox calls) while it computes this one, and store them once its barrier
// has freed sM: MaskTileBytes holds a thread's bytes between the two.
template <int Br, int Bc, int NThreads>
struct MaskTileBytes {
  static constexpr int kGroups = Bc / 8, kCalls = Br * kGroups, kPerThread = kCalls / NThreads;
  static_assert(kCalls % NThreads == 0 && NThreads % 32 == 0, "Philox calls must divide evenly among the warps");
  static_assert(Br % 16 == 0 && Bc % 16 == 0, "blocks of 16 queries by 16 keys");
  uint32_t byte[kPerThread];
  // call it of thread tid: query q, key group kg of the tile
  __device__ __forceinline__ static void where(int it, int tid, int& q, int& kg) {
    const int c = it * NThreads + tid, blk = c / 32, w = c % 32;
    q = 16 * (blk % (Br / 16)) + w % 16;
    kg = 2 * (blk / (Br / 16)) + w / 16;
  }
};
template <int Br, int Bc, int NThreads>
__device__ __forceinline__ void fetch_mask_tile(MaskTileBytes<Br, Bc, NThreads>& m, const philox::DropoutKey& key,
                                                uint32_t bh, int i0, int j0, int tid, const uint8_t* in, int Tn) {
  using M = MaskTileBytes<Br, Bc, NThreads>;
  if (in) {  // (the loads together, predicated: no branch between them)
#pragma unroll
    for (int it = 0; it < M::kPerThread; ++it) {
      int q, kg;
      M::where(it, tid, q, kg);
      m.byte[it] = stored_keep_byte(in, Tn, bh, (uint32_t)(i0 + q), (uint32_t)(j0 + 8 * kg));
    }
    return;
  }
  const uint32_t thr = philox::attn_threshold(key);
#pragma unroll
  for (int it = 0; it < M::kPerThread; ++it) {
    int q, kg;
    M::where(it, tid, q, kg);
    m.byte[it] = keep_byte(key, thr, nullptr, Tn, bh, (uint32_t)(i0 + q), (uint32_t)(j0 + 8 * kg));
  }
}
template <int Br, int Bc, int MS, int NThreads>
__device__ __forceinline__ void store_mask_tile(uint8_t* sM, const MaskTileBytes<Br, Bc, NThreads>& m, int tid) {
  static_assert(MS % (Br / 4) == 0 && MS >= Br, "rows of a byte a query, a lane's queries aligned for one load");
#pragma unroll
  for (int it = 0; it < MaskTileBytes<Br, Bc, NThreads>::kPerThread; ++it) {
    int q, kg;
    MaskTileBytes<Br, Bc, NThreads>::where(it, tid, q, kg);
    sM[kg * MS + mask_tile_column<Br>(q)] = (uint8_t)m.byte[it];
  }
}
template <int Br, int Bc, int MS, int NThreads>
__device__ __forceinline__ void make_mask_tile(uint8_t* sM, const philox::DropoutKey& key, uint32_t bh, int i0, int j0,
                                               int tid, const uint8_t* in, int Tn) {
  MaskTileBytes<Br, Bc, NThreads> m;
  fetch_mask_tile(m, key, bh, i0, j0, tid, in, Tn);
  store_mask_tile<Br, Bc, MS, NThreads>(sM, m, tid);
}
// A dK / dV kernel's step it (query tile i0): its keep bytes into sM, before the step's barrier.
// Ahead: they were fetched into `next` a step before (the caller fetches the first tile's before
// its loop), and the next tile's (`more`: there is one) are fetched now, so that their global
// loads or Philox calls run under this step's products; else they are made now.
template <int Br, int Bc, int MS, int NThreads, bool Ahead>
__device__ __forceinline__ void mask_tile_step(uint8_t* sM, MaskTileBytes<Br, Bc, NThreads>& next,
                                               const philox::DropoutKey& key, uint32_t bh, int i0, int j0, int tid,
                                               const uint8_t* in, int Tn, bool more) {
  if constexpr (Ahead) {
    store_mask_tile<Br, Bc, MS, NThreads>(sM, next, tid);
    if (more) fetch_mask_tile(next, key, bh, i0 + Br, j0, tid, in, Tn);
  } else {
    make_mask_tile<Br, Bc, MS, NThreads>(sM, key, bh, i0, j0, tid, in, Tn);
  }
}

// The start of step it of a dK / dV kernel with two stages (the mma.sync one's, and the Hopper one's
// that is not pipelined): the next query tile's copies into the other stage (load_q(it + 1,
// 1 - stage)) with its lse_i and D_i, this stage's copies waited for, and the step's keep bytes
// into sM (mask_tile_step, with dropout). The next tile's lse_i and D_i: with StatsLate returned,
// for store_row_stats once the step's products have freed that stage, else stored at once (HS 256,
// where the two registers held spilled).
template <int Br, int Bc, int MS, int NThreads, bool IsDropout, bool FetchAhead, bool StatsLate, typename LoadQ>
__device__ __forceinline__ RowStats dkdv_step_start(LoadQ&& load_q, int it, int n_it, int stage, float* sL, float* sD,
                                                    const float* lse, const float* Dg, uint8_t* sM,
                                                    MaskTileBytes<Br, Bc, NThreads>& mask_next,
                                                    const philox::DropoutKey& key, uint32_t bh, int j0,
                                                    const uint8_t* keep, int Tn) {
  const int i0 = it * Br, tid = (int)threadIdx.x;
  RowStats stats_next{};
  if (it + 1 < n_it) {
    load_q(it + 1, 1 - stage);
    if constexpr (StatsLate)
      stats_next = fetch_row_stats<Br>(lse, Dg, i0 + Br, Tn, tid);
    else
      load_row_stats<Br, NThreads>(sL + (1 - stage) * Br, sD + (1 - stage) * Br, lse, Dg, i0 + Br, Tn, tid);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  if constexpr (IsDropout)
    mask_tile_step<Br, Bc, MS, NThreads, FetchAhead>(sM, mask_next, key, bh, i0, j0, tid, keep, Tn, it + 1 < n_it);
  return stats_next;
}

// A dQ kernel's key tile: the lane's keep bytes for its step (KeepCalls, gathered there by
// keep_bits_from_calls), fetched into `next` a step before (the caller fetches the first tile's
// before its loop); the next tile's (keys j_next .., when j_next >= 0) are fetched now, so that
// their global loads or Philox calls run under this step's products.
template <int NT>
__device__ __forceinline__ KeepCalls<NT> keep_calls_step(KeepCalls<NT>& next, const philox::DropoutKey& key,
                                                         uint32_t bh, int i_g, int j_next, int lane, const uint8_t* in,
                                                         int Tn) {
  const KeepCalls<NT> cur = next;
  if (j_next >= 0) fetch_keep_calls(next, key, bh, i_g, j_next, lane, in, nullptr, Tn);
  return cur;
}

// The keep bits of the elements a lane owns in the key-major layout (rows = keys, columns =
// queries): element (nt, e) is key 16w + g + 8(e/2), query 8nt + 2t + e%2 (tile-relative), bit g
// of the byte of group 2w + e/2 and that query in make_mask_tile's sM; bit 4 nt + e of the result.
// A row's 2 NT bytes of the lane's queries are side by side (mask_tile_column), read in one load,
// sM and MS multiples of 2 NT bytes (the lanes of a quad row read the same: broadcast; the four t
// read 8 NT consecutive bytes: one wavefront). Of each word, bytes (nt, e) = (2m, 0), (2m, 1),
// (2m + 1, 0), (2m + 1, 1): their bits g, moved to bits 0, 8, 16, 24, and multiplied by 2^24 +
// 2^17 + 2^12 + 2^5, land at bits 24, 25, 28, 29 (the products' 16 bits are at distinct places:
// no carries), the result's 8m + 2 half + {0, 1, 4, 5} once shifted.
template <int NT, int MS>
__device__ __forceinline__ uint32_t keep_bits_from_tile(const uint8_t* sM, int warp, int lane) {
  static_assert(NT == 2 || NT == 4 || NT == 8, "a lane's 2 NT bytes of a row in one load");
  uint32_t bits = 0;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint8_t* at = sM + (2 * warp + half) * MS + 2 * NT * t;
    uint32_t w[NT / 2];
    if constexpr (NT == 8) {
      const uint4 c = *reinterpret_cast<const uint4*>(at);
      w[0] = c.x, w[1] = c.y, w[2] = c.z, w[3] = c.w;
    } else if constexpr (NT == 4) {
      const uint2 c = *reinterpret_cast<const uint2*>(at);
      w[0] = c.x, w[1] = c.y;
    } else {
      w[0] = *reinterpret_cast<const uint32_t*>(at);
    }
#pragma unroll
    for (int m = 0; m < NT / 2; ++m)
      bits |= (((w[m] >> g) & 0x01010101u) * 0x01021020u) >> 24 << (8 * m + 2 * half);
  }
  return bits;
}

// Masking in the key-major layout: element (nt, e) is key k_g + 8(e/2), query q_t + 8nt + e%2
// (absolute); -inf where the query is past T or, causal, q < k (key after the query).
template <int NT>
__device__ __forceinline__ void mask_scores_t(float (&s)[NT][4], int k_g, int q_t, int Tn, bool causal) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int k = k_g + 8 * (e / 2), q = q_t + 8 * nt + (e % 2);
      if (q >= Tn || (causal && q < k)) s[nt][e] = -INFINITY;
    }
}

// dst[0], dst[1] += scale * (a0, a1), read, added and rounded as one bf16x2 (4-byte aligned)
__device__ __forceinline__ void add_scaled_pair(bf16* dst, float scale, float a0, float a1) {
  __nv_bfloat162* q = reinterpret_cast<__nv_bfloat162*>(dst);
  const float2 old = __bfloat1622float2(*q);
  *q = __floats2bfloat162_rn(old.x + scale * a0, old.y + scale * a1);
}

// dqkv[rows, col0 .. col0+HS) += scale * acc for the rows r_g (c0, c1) and r_g+8 (c2, c3) that
// are < T; element (nt, e) goes to column col0 + 8nt + 2t + e%2 (bf16x2 read-add-write).
template <int NO>
__device__ __forceinline__ void add_to_dqkv(bf16* dqkv_b /*row 0 of batch b*/, long long ld, long long col0,
                                            const float (&acc)[NO][4], float scale, int r_g, int Tn, int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r_g + 8 * r;
    if (row >= Tn) continue;
    bf16* dst = dqkv_b + (long long)row * ld + col0 + 2 * t;
#pragma unroll
    for (int no = 0; no < NO; ++no) add_scaled_pair(dst + 8 * no, scale, acc[no][2 * r], acc[no][2 * r + 1]);
  }
}

// The recomputed probabilities and the score gradients of the backward, in place, for a warp's
// accumulators: key-major (the dK / dV kernels: rows keys, column q's lse log2(e) and D in sL
// and sD, tile-relative) and query-major (the dQ kernels: the lane's rows' lse log2(e) and D).
//   P = exp(S - lse) (exp2 of S scale log2(e) - lse log2(e));
//   dS = P o (dP - D), dP = dPd o M s with dropout (M from keep bits, s the dropout scale).
template <int NT>
__device__ __forceinline__ void probs_key_major(float (&st)[NT][4], const float* sL, float scale_log2, int t) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 L = *reinterpret_cast<const float2*>(sL + 8 * nt + 2 * t);
    st[nt][0] = exp2_ftz(fmaf(st[nt][0], scale_log2, -L.x));
    st[nt][1] = exp2_ftz(fmaf(st[nt][1], scale_log2, -L.y));
    st[nt][2] = exp2_ftz(fmaf(st[nt][2], scale_log2, -L.x));
    st[nt][3] = exp2_ftz(fmaf(st[nt][3], scale_log2, -L.y));
  }
}
template <int NT, bool IsDropout>
__device__ __forceinline__ void dscores_key_major(float (&dpt)[NT][4], const float (&st)[NT][4], const float* sD,
                                                  uint32_t bits, float dropout_scale, int t) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 Dq = *reinterpret_cast<const float2*>(sD + 8 * nt + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float dp = dpt[nt][e];
      if constexpr (IsDropout) dp = ((bits >> (4 * nt + e)) & 1u) ? dp * dropout_scale : 0.f;
      dpt[nt][e] = st[nt][e] * (dp - ((e % 2) ? Dq.y : Dq.x));
    }
  }
}
template <int NT>
__device__ __forceinline__ void probs_query_major(float (&s)[NT][4], const float (&lse2)[2], float scale_log2) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = exp2_ftz(fmaf(s[nt][e], scale_log2, -lse2[e / 2]));
}
template <int NT, bool IsDropout>
__device__ __forceinline__ void dscores_query_major(float (&dp)[NT][4], const float (&s)[NT][4], const float (&Di)[2],
                                                    uint32_t bits, float dropout_scale) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float d = dp[nt][e];
      if constexpr (IsDropout) d = ((bits >> (4 * nt + e)) & 1u) ? d * dropout_scale : 0.f;
      dp[nt][e] = s[nt][e] * (d - Di[e / 2]);
    }
}

}  // namespace flash
}  // namespace gpu
