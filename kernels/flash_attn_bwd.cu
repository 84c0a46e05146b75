// kernels/flash_attn_bwd.cu: the fused flash-attention backward with dropout (FlashAttention-2,
// Dao 2023, algorithm 2), deterministic. CPU twin (the spec): cpu::attention_tiled_backward in
// kernels/cpu/attention_tiled.cpp; launcher contract in kernels/flash_attn.cuh.
//
// Per batch b and head h (bh = b*NH + h), with lse_i from the forward, s = 1 / (1 - p) and
// M_ij = philox::attn_keep(key, bh, i, j) (the forward's mask, bit for bit: regenerated, or with
// bf16 read from the keep bytes the forward stored, flash_attn_keep_offset: one byte load where
// a Philox4x32-10 call was, 20 multiplies, 20 three-way xors and the key schedule's adds):
//   D_i    = rowsum(dO_i o O_i)                      (preprocessing pass, into ctx.scratch)
//   P_ij   = exp(S_ij - lse_i),  S_ij = Q_i K_j^T / sqrt(HS)   (recomputed; 0 at j >= T and,
//            causal (p.causal, a run-time flag), at j > i)
//   Pd_ij  = P_ij o M_ij s
//   dV_j  += Pd_ij^T dO_i,   dPd_ij = dO_i V_j^T,   dP_ij = dPd_ij o M_ij s
//   dS_ij  = P_ij o (dP_ij - D_i)
//   dQ_i  += dS_ij K_j / sqrt(HS),   dK_j += dS_ij^T Q_i / sqrt(HS)
// Writes: dqkv (B, T, 3C) accumulated (+=): dQ into the Q columns, dK and dV into the K and
// V columns. ctx.scratch holds D (flash_attn_scratch_bytes).
//
// No floating-point atomics; every sum has a fixed order, so repeated runs are bitwise equal.
// Two kernels after the D pass, each owning what it writes:
//   dK/dV kernel: one CTA per (K_j, V_j tile of Bc keys, bh), looping over the query tiles
//     Q_i, dO_i (two shared stages, cp.async), dK_j and dV_j accumulated in registers and
//     added to dqkv once at the end. It computes the transposed tiles S_ij^T = K_j Q_i^T
//     (each warp owns 16 keys), so P^T, dP^T, dS^T are already in the A-operand layout of
//     dV_j += Pd^T dO_i and dK_j += dS^T Q_i. The keep bytes of the tile are made once per
//     tile into shared memory by all threads (one Philox call per 8 keys of a query row, or its
//     stored byte) and each lane reads its bits back in the transposed layout.
//   dQ kernel: one CTA per (Q_i tile, bh), looping over K_j, V_j (two stages) from the last key
//     tile down (bf16: the Hopper kernels' order, the same bits), recomputing P_ij and dP_ij in
//     the forward's layout (same dropout helper as the forward), dQ_i in registers, added to dqkv
//     at the end.
// T = bf16: all five tile products on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate;
// ldmatrix operands). T = float: the same two-kernel scheme in plain fp32 SIMT (no TF32).
//
// Without a GPU (emulated counts, tests/emu/test_kernel_counters.cpp; ptxas, build/kernel_resources.txt):
// no shared-memory bank conflicts (ldmatrix rows padded as in the forward; the keep bytes
// stored by 16 consecutive queries of two groups a warp), no spills or local memory, 8 warps resident per SM on
// an H100 at HS = 64 (two 4-warp CTAs: 177-223 registers; a third needs 168 or fewer). dQ, dK,
// dV are read-added-written from the mma fragments as bf16x2: 50% of the sectors a warp's access
// touches, 85-91% for the kernels at gpt2-124m's T = 1024.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "flash_attn.cuh"
#include "flash_attn_common.cuh"
#include "flash_attn_hopper.cuh"

namespace gpu {

namespace {
size_t round_256(size_t n) { return (n + 255) / 256 * 256; }

// The scratch before the Hopper backward's dQ sums: D (B, NH, T), then for a head size the tiles
// do not have the widened qkv, out, dout and dqkv (the forward uses the first two from the start).
size_t scratch_before_dq_sums(int B, int Tn, int NH, const flash::Padding& pad) {
  const size_t d_bytes = round_256((size_t)B * NH * Tn * sizeof(float));
  if (!pad.active() || pad.HSp == 0) return d_bytes;
  const long long rows = (long long)B * Tn;
  return d_bytes + 2 * pad.bytes(rows, 3 * NH) + 2 * pad.bytes(rows, NH);
}

// The Hopper backward's dQ sums (B, NH, T, HSp) fp32 and its flags where its dK / dV kernel
// computes dQ (flash_attn_hopper_fused_dq; the Hopper head sizes), else 0: a flag per query tile
// of 32 rows or more, per 128 columns of a head
size_t dq_sums_bytes(int B, int Tn, int NH, int HSp) {
  if (!flash_attn_hopper_head_size(HSp)) return 0;
  const size_t flags = (size_t)B * NH * ceil_div(Tn, 32) * (HSp > 128 ? HSp / 128 : 1);
  return round_256((size_t)B * NH * Tn * HSp * sizeof(float)) + round_256(flags * sizeof(int));
}
}  // namespace

size_t flash_attn_scratch_bytes(int B, int Tn, int C, int NH) {
  const flash::Padding pad{C / NH, flash_attn_tile_head_size(C / NH)};
  return scratch_before_dq_sums(B, Tn, NH, pad) + dq_sums_bytes(B, Tn, NH, pad.HSp);
}

namespace flash {
namespace {

// ---- preprocessing: D_i = rowsum(dO_i o O_i) ---------------------------------------------------
// One warp per (b, i, h) row, rows ordered (b, i, h) so that consecutive warps read
// consecutive HS-wide pieces of a (B, T, C) row; lanes take columns lane, lane+32, ... and
// the warp sum is a fixed butterfly. grid-stride over B*T*NH rows.
template <typename T>
__global__ void flash_bwd_dot_do_o_kernel(const BwdParams<T> p) {
  const long long rows = (long long)p.B * p.T * p.NH;
  const int lane = threadIdx.x % 32;
  const long long warps_total = (long long)gridDim.x * (blockDim.x / 32);
  for (long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps_total) {
    const int h = (int)(r % p.NH);
    const long long bi = r / p.NH;  // b*T + i
    const int b = (int)(bi / p.T), i = (int)(bi % p.T);
    const long long off = bi * p.ld_out + (long long)h * p.HS;
    float acc = 0.f;
    for (int d = lane; d < p.HS; d += 32) acc = fmaf(to_float(p.dout[off + d]), to_float(p.out[off + d]), acc);
    acc = warp_sum(acc);
    if (lane == 0) p.D[((long long)b * p.NH + h) * p.T + i] = acc;
  }
}

// ---- bf16: the dK / dV kernel ------------------------------------------------------------------
// Bc = 64 keys per CTA (4 warps x 16 keys); Br query rows per inner tile: 64 for HS <= 64, 32
// above (registers: dK_j, dV_j take Cols/2 floats each per lane, S^T and dP^T Br/2 each).
// Cols = the columns of dK_j and dV_j a CTA owns: HS up to 128; at HS = 256 two CTAs (grid z)
// share a key tile, each computing S^T and dP^T over all 256 columns (the same values, by the
// same code) and accumulating dK_j, dV_j for its 128 (2 x 256 floats a lane do not fit the 255
// registers).
// Shared: K_j, V_j [Bc][HS+8]; two stages of Q_i, dO_i [Br][HS+8], lse_i * log2(e) and D_i
// [Br]; the keep bytes [Bc / 8][Br] (a row per group of 8 keys, a byte per query, in the order
// mask_tile_column gives: make_mask_tile).
//   HS = 32: 32 KB, HS = 64: 56 KB, HS = 128: 69 KB, HS = 256: 133 KB.
template <int HS>
struct DkvTile {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBc = 16 * kWarps;
  static constexpr int kBr = HS >= 128 ? 32 : 64;
  static constexpr int kCols = HS > 128 ? 128 : HS;
  static constexpr int kSplits = HS / kCols;  // CTAs per key tile (grid z)
  static constexpr int kStride = HS + kPad;
  static constexpr int kMaskStride = kBr;  // the keep bytes' rows: one a group of 8 keys
  static constexpr size_t kTileBytes = (size_t)(2 * kBc + 4 * kBr) * kStride * sizeof(bf16);
  static constexpr size_t kSmemBytes = kTileBytes + 4 * kBr * sizeof(float) + (size_t)(kBc / 8) * kMaskStride;
};

// grid (B*NH, ceil(T / Bc), kSplits).
template <int HS, bool IsDropout>
__global__ void __launch_bounds__(DkvTile<HS>::kThreads, 1) flash_bwd_dkdv_bf16_kernel(const BwdParams<bf16> p) {
  using Tile = DkvTile<HS>;
  constexpr int Br = Tile::kBr, Bc = Tile::kBc, S = Tile::kStride, MS = Tile::kMaskStride,
                NThreads = Tile::kThreads, Cols = Tile::kCols;
  unsigned char* const smem = dynamic_smem<unsigned char>();
  bf16* sK = reinterpret_cast<bf16*>(smem);  // K_j  [Bc][S]
  bf16* sV = sK + Bc * S;                    // V_j  [Bc][S]
  bf16* sQ = sV + Bc * S;                    // Q_i  [2][Br][S]
  bf16* sdO = sQ + 2 * Br * S;               // dO_i [2][Br][S]
  float* sL = reinterpret_cast<float*>(smem + Tile::kTileBytes);  // lse_i log2(e) [2][Br]
  float* sD = sL + 2 * Br;                                         // D_i [2][Br]
  uint8_t* sM = reinterpret_cast<uint8_t*>(sD + 2 * Br);           // keep bytes [Bc / 8][MS]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const uint32_t bh = blockIdx.x;
  const int b = (int)bh / p.NH, h = (int)bh % p.NH;
  const int j0 = blockIdx.y * Bc;     // first key of K_j
  const int jw0 = j0 + 16 * warp;     // first key of this warp
  const int k_g = jw0 + g;            // key of this lane's c0, c1 (c2, c3: +8)
  const int c0 = Tile::kSplits > 1 ? (int)blockIdx.z * Cols : 0;  // first column of dK_j, dV_j owned
  const long long qkv_b = (long long)b * p.T * p.ld_qkv;
  const bf16* Q = p.qkv + qkv_b + (long long)h * HS;
  const bf16* K = Q + p.C;
  const bf16* V = Q + 2LL * p.C;
  const bf16* dO = p.dout + (long long)b * p.T * p.ld_out + (long long)h * HS;
  const float* lse = p.lse + (long long)bh * p.T;
  const float* Dg = p.D + (long long)bh * p.T;

  // causal: query tiles that end before j0 see only keys after their queries
  const int it0 = p.causal ? j0 / Br : 0;
  const int n_it = (p.T + Br - 1) / Br;

  // load tile: Q_i, dO_i into a stage (its lse_i log2(e), +inf past T: P = 0 there, and D_i:
  // the caller's, row_stats)
  static_assert(Br <= NThreads, "a query's lse and D a thread");
  auto load_q_tile = [&](int it, int stage) {
    load_tile_async<Br, HS, NThreads>(sQ + stage * Br * S, Q, p.ld_qkv, it * Br, p.T);
    load_tile_async<Br, HS, NThreads>(sdO + stage * Br * S, dO, p.ld_out, it * Br, p.T);
  };
  load_tile_async<Bc, HS, NThreads>(sK, K, p.ld_qkv, j0, p.T);
  load_tile_async<Bc, HS, NThreads>(sV, V, p.ld_qkv, j0, p.T);
  load_q_tile(it0, 0);
  load_row_stats<Br, NThreads>(sL, sD, lse, Dg, it0 * Br, p.T, (int)threadIdx.x);
  cp_async_commit();

  float dk[Cols / 8][4], dv[Cols / 8][4];
  zero(dk);
  zero(dv);
  // the keep bytes of the next query tile, fetched a step ahead (as the Hopper dK / dV kernel's);
  // not at HS 256, whose 255 registers (sm_80) spilled the bytes kept
  constexpr bool kFetchAhead = IsDropout && HS <= 128;
  MaskTileBytes<Br, Bc, NThreads> mask_next;
  if constexpr (kFetchAhead) fetch_mask_tile(mask_next, p.key, bh, it0 * Br, j0, (int)threadIdx.x, p.keep, p.T);
  constexpr bool kStatsLate = HS <= 128;
  for (int it = it0; it < n_it; ++it) {
    const int i0 = it * Br, stage = (it - it0) % 2;
    const RowStats stats_next =
        dkdv_step_start<Br, Bc, MS, NThreads, IsDropout, kFetchAhead, kStatsLate>(
            load_q_tile, it, n_it, stage, sL, sD, lse, Dg, sM, mask_next, p.key, bh, j0, p.keep, p.T);
    __syncthreads();  // K_j, V_j, this stage and the keep bits visible to every warp
    // a warp whose 16 keys all come after the tile's last query has nothing unmasked here
    if (!(p.causal && i0 + Br - 1 < jw0)) {
      const bf16* sQi = sQ + stage * Br * S;
      const bf16* sdOi = sdO + stage * Br * S;
      const float* sLi = sL + stage * Br;
      const float* sDi = sD + stage * Br;
      // S_ij^T = K_j Q_i^T (raw), masked
      float st[Br / 8][4];
      zero(st);
      warp_gemm_ss<HS, Br, S>(st, sK + 16 * warp * S, sQi, lane);
      if (i0 + Br > p.T || (p.causal && i0 < jw0 + 15)) mask_scores_t<Br / 8>(st, k_g, i0 + 2 * t, p.T, p.causal);
      // P_ij^T = exp(S_ij^T - lse_i) (lse of the column's query)
      probs_key_major(st, sLi, p.scale_log2, t);
      // dV_j += (P_ij o M_ij)^T dO_i   (the scale s is applied once, at the end)
      const uint32_t bits = IsDropout ? keep_bits_from_tile<Br / 8, MS>(sM, warp, lane) : ~0u;
      warp_gemm_rs<Br, Cols, S, IsDropout>(dv, st, bits, sdOi + c0, lane);
      // dPd_ij^T = V_j dO_i^T
      float dpt[Br / 8][4];
      zero(dpt);
      warp_gemm_ss<HS, Br, S>(dpt, sV + 16 * warp * S, sdOi, lane);
      // dP = dPd o M s, dS_ij^T = P_ij^T o (dP_ij^T - D_i), in place in dpt
      dscores_key_major<Br / 8, IsDropout>(dpt, st, sDi, bits, p.dropout_scale, t);
      // dK_j += dS_ij^T Q_i   (the 1/sqrt(HS) is applied once, at the end)
      warp_gemm_rs<Br, Cols, S, false>(dk, dpt, 0u, sQi + c0, lane);
    }
    // (the next stage was last read in the step before, behind its closing barrier)
    if (kStatsLate && it + 1 < n_it)
      store_row_stats<Br>(sL + (1 - stage) * Br, sD + (1 - stage) * Br, stats_next, i0 + Br, p.T, (int)threadIdx.x);
    __syncthreads();  // every warp is done with this stage and the keep bits
  }
  // dqkv[K_j] += dK_j / sqrt(HS), dqkv[V_j] += dV_j s
  bf16* dqkv_b = p.dqkv + qkv_b;
  add_to_dqkv(dqkv_b, p.ld_qkv, (long long)p.C + (long long)h * HS + c0, dk, p.scale, k_g, p.T, lane);
  add_to_dqkv(dqkv_b, p.ld_qkv, 2LL * p.C + (long long)h * HS + c0, dv, p.dropout_scale, k_g, p.T, lane);
}

// ---- bf16: the dQ kernel -----------------------------------------------------------------------
// Br = 64 query rows per CTA (4 warps x 16 rows), Bc = 64 keys per tile (32 at HS = 256).
// Shared: Q_i, dO_i [Br][HS+8]; two stages of K_j, V_j [Bc][HS+8]:
//   HS = 32: 30 KB, HS = 64: 54 KB, HS = 128: 102 KB, HS = 256: 132 KB.
template <int HS>
using DqTile = QueryTile<HS, 4, 2>;

// grid (B*NH, ceil(T / Br)); query tiles last-first (causal: longest first).
template <int HS, bool IsDropout>
__global__ void __launch_bounds__(DqTile<HS>::kThreads, 1) flash_bwd_dq_bf16_kernel(const BwdParams<bf16> p) {
  using Tile = DqTile<HS>;
  constexpr int Br = Tile::kBr, Bc = Tile::kBc, S = Tile::kStride, NThreads = Tile::kThreads;
  unsigned char* const smem = dynamic_smem<unsigned char>();
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // Q_i  [Br][S]
  bf16* sdO = sQ + Br * S;                   // dO_i [Br][S]
  bf16* sK = sdO + Br * S;                   // K_j  [2][Bc][S]
  bf16* sV = sK + 2 * Bc * S;                // V_j  [2][Bc][S]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const auto [bh, i0, iw0, i_g, qkv_b, h_col, Q, K, V, dO, n_j] = dq_cta<HS, Br, Bc>(p, warp, lane);

  // load tile: Q_i, dO_i once; the last key tile's K, V into stage 0 (the keys run last-first)
  load_tile_async<Br, HS, NThreads>(sQ, Q, p.ld_qkv, i0, p.T);
  load_tile_async<Br, HS, NThreads>(sdO, dO, p.ld_out, i0, p.T);
  load_tile_async<Bc, HS, NThreads>(sK, K, p.ld_qkv, (n_j - 1) * Bc, p.T);
  load_tile_async<Bc, HS, NThreads>(sV, V, p.ld_qkv, (n_j - 1) * Bc, p.T);
  cp_async_commit();

  float lse2[2], Di[2];
  row_lse_d(lse2, Di, p, bh, i_g);

  float dq[HS / 8][4];
  zero(dq);
  // each step's keep bytes fetched a step ahead (keep_calls_step)
  KeepCalls<Bc / 8> keep_next;
  if constexpr (IsDropout) fetch_keep_calls(keep_next, p.key, bh, i_g, (n_j - 1) * Bc, lane, p.keep, nullptr, p.T);
  // the keys last-first: dQ_i's sums in the order of the Hopper kernels' (the fused one hands them
  // from the diagonal key tile down to tile 0), so that both families give the same bits
  for (int jt = n_j - 1; jt >= 0; --jt) {
    const int j0 = jt * Bc, stage = (n_j - 1 - jt) % 2;
    KeepCalls<Bc / 8> kc;
    if constexpr (IsDropout)
      kc = keep_calls_step(keep_next, p.key, bh, i_g, j0 - Bc, lane, p.keep, p.T);
    if (jt > 0) {
      load_tile_async<Bc, HS, NThreads>(sK + (1 - stage) * Bc * S, K, p.ld_qkv, j0 - Bc, p.T);
      load_tile_async<Bc, HS, NThreads>(sV + (1 - stage) * Bc * S, V, p.ld_qkv, j0 - Bc, p.T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (!(p.causal && j0 > iw0 + 15)) {
      const bf16* sKj = sK + stage * Bc * S;
      const bf16* sVj = sV + stage * Bc * S;
      // S_ij = Q_i K_j^T (raw), masked; P_ij = exp(S_ij - lse_i)
      float s[Bc / 8][4];
      zero(s);
      warp_gemm_ss<HS, Bc, S>(s, sQ + 16 * warp * S, sKj, lane);
      if (j0 + Bc > p.T || (p.causal && j0 + Bc - 1 > iw0)) mask_scores<Bc / 8>(s, i_g, j0 + 2 * (lane % 4), p.T, p.causal);
      probs_query_major(s, lse2, p.scale_log2);
      // dPd_ij = dO_i V_j^T
      float dp[Bc / 8][4];
      zero(dp);
      warp_gemm_ss<HS, Bc, S>(dp, sdO + 16 * warp * S, sVj, lane);
      // dP_ij = dPd_ij o M_ij s (the forward's keep bits), dS_ij = P_ij o (dP_ij - D_i), in place
      const uint32_t bits = IsDropout ? keep_bits_from_calls(kc, lane) : ~0u;
      dscores_query_major<Bc / 8, IsDropout>(dp, s, Di, bits, p.dropout_scale);
      // dQ_i += dS_ij K_j   (the 1/sqrt(HS) is applied once, at the end)
      warp_gemm_rs<Bc, HS, S, false, true>(dq, dp, 0u, sKj, lane);
    }
    __syncthreads();
  }
  // dqkv[Q_i] += dQ_i / sqrt(HS)
  add_to_dqkv(p.dqkv + qkv_b, p.ld_qkv, h_col, dq, p.scale, i_g, p.T, lane);
}

// ---- T = float: SIMT ---------------------------------------------------------------------------
// The same two kernels in fp32 FMAs. 8 warps per CTA, 32-row tiles (lane c <-> the c-th
// query or key of the inner tile); dot products are sequential over HS, sums over the
// inner tile are shuffles in index order: fixed order everywhere. Shared tiles indexed by
// the lane get a +1 pad (conflict-free), tiles read by row broadcast none.
struct SimtTile {
  static constexpr int kWarps = 8, kThreads = 256, kTile = 32, kPerWarp = kTile / kWarps;
};
template <int HS>
constexpr size_t simt_bwd_smem_bytes() {
  return (size_t)(2 * SimtTile::kTile * HS + 2 * SimtTile::kTile * (HS + 1) + 2 * SimtTile::kTile) * sizeof(float);
}

// dK / dV: one CTA per (32 keys, bh), each warp owning 4 keys; loops over 32-query tiles.
// Shared: K_j, V_j [32][HS] (row broadcast), Q_i, dO_i [32][HS+1] (lane = query), lse_i, D_i.
// At HS 32 three CTAs an SM or more (80 registers or fewer: ptxas, left to itself, gave the dropout
// kernel 84 on sm_90 once causal became a run-time flag).
template <int HS, bool IsDropout>
__global__ void __launch_bounds__(SimtTile::kThreads, HS == 32 ? 3 : 1) flash_bwd_dkdv_f32_kernel(const BwdParams<float> p) {
  constexpr int NTile = SimtTile::kTile, KPW = SimtTile::kPerWarp, KD = HS / 32;
  unsigned char* const smem = dynamic_smem<unsigned char>();
  float* sK = reinterpret_cast<float*>(smem);  // [32][HS]
  float* sV = sK + NTile * HS;                 // [32][HS]
  float* sQ = sV + NTile * HS;                 // [32][HS+1]
  float* sdO = sQ + NTile * (HS + 1);          // [32][HS+1]
  float* sL = sdO + NTile * (HS + 1);          // [32] lse_i
  float* sD = sL + NTile;                      // [32] D_i
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t bh = blockIdx.x;
  const int b = (int)bh / p.NH, h = (int)bh % p.NH;
  const int j0 = blockIdx.y * NTile;
  const long long qkv_b = (long long)b * p.T * p.ld_qkv;
  const float* Q = p.qkv + qkv_b + (long long)h * HS;
  const float* K = Q + p.C;
  const float* V = Q + 2LL * p.C;
  const float* dO = p.dout + (long long)b * p.T * p.ld_out + (long long)h * HS;

  load_tile_f32<NTile, HS, HS>(sK, K, p.ld_qkv, j0, p.T);
  load_tile_f32<NTile, HS, HS>(sV, V, p.ld_qkv, j0, p.T);
  float dk[KPW][KD], dv[KPW][KD];
#pragma unroll
  for (int kk = 0; kk < KPW; ++kk)
#pragma unroll
    for (int k = 0; k < KD; ++k) dk[kk][k] = dv[kk][k] = 0.f;

  for (int i0 = p.causal ? j0 : 0; i0 < p.T; i0 += NTile) {
    __syncthreads();  // the previous query tile is consumed (K_j, V_j visible on the first)
    load_tile_f32<NTile, HS, HS + 1>(sQ, Q, p.ld_qkv, i0, p.T);
    load_tile_f32<NTile, HS, HS + 1>(sdO, dO, p.ld_out, i0, p.T);
    if (threadIdx.x < NTile) {
      const int i = i0 + threadIdx.x;
      sL[threadIdx.x] = i < p.T ? p.lse[(long long)bh * p.T + i] : 0.f;
      sD[threadIdx.x] = i < p.T ? p.D[(long long)bh * p.T + i] : 0.f;
    }
    __syncthreads();
    const int i = i0 + lane;  // this lane's query
#pragma unroll
    for (int kk = 0; kk < KPW; ++kk) {
      const int kr = warp * KPW + kk, j = j0 + kr;
      if (j >= p.T || (p.causal && i0 + NTile - 1 < j)) continue;  // warp-uniform
      const bool valid = i < p.T && (!p.causal || j <= i);
      // S_ij = Q_i . K_j / sqrt(HS), P_ij = exp(S_ij - lse_i); dPd_ij = dO_i . V_j
      float sdot = 0.f, dpd = 0.f;
#pragma unroll 8
      for (int d = 0; d < HS; ++d) {
        sdot = fmaf(sQ[lane * (HS + 1) + d], sK[kr * HS + d], sdot);
        dpd = fmaf(sdO[lane * (HS + 1) + d], sV[kr * HS + d], dpd);
      }
      const float pij = valid ? expf(sdot * p.scale - sL[lane]) : 0.f;
      // Pd = P o M s, dP = dPd o M s, dS = P o (dP - D_i)
      bool keep = true;
      if constexpr (IsDropout) keep = philox::attn_keep(p.key, bh, (uint32_t)i, (uint32_t)j);
      const float pd = keep ? pij * p.dropout_scale : 0.f;
      const float dp = keep ? dpd * p.dropout_scale : 0.f;
      const float ds = pij * (dp - sD[lane]);
      // dV_j += Pd_ij^T dO_i, dK_j += dS_ij^T Q_i, queries in order
      for (int c = 0; c < NTile; ++c) {
        const float pdc = __shfl_sync(0xffffffffu, pd, c), dsc = __shfl_sync(0xffffffffu, ds, c);
#pragma unroll
        for (int k = 0; k < KD; ++k) {
          dv[kk][k] = fmaf(pdc, sdO[c * (HS + 1) + lane + 32 * k], dv[kk][k]);
          dk[kk][k] = fmaf(dsc, sQ[c * (HS + 1) + lane + 32 * k], dk[kk][k]);
        }
      }
    }
  }
  // dqkv[K_j] += dK_j / sqrt(HS), dqkv[V_j] += dV_j
#pragma unroll
  for (int kk = 0; kk < KPW; ++kk) {
    const int j = j0 + warp * KPW + kk;
    if (j >= p.T) continue;
    float* dst = p.dqkv + qkv_b + (long long)j * p.ld_qkv + (long long)h * HS;
#pragma unroll
    for (int k = 0; k < KD; ++k) {
      dst[p.C + lane + 32 * k] += dk[kk][k] * p.scale;
      dst[2LL * p.C + lane + 32 * k] += dv[kk][k];
    }
  }
}

// dQ: one CTA per (32 queries, bh), each warp owning 4 query rows; loops over 32-key tiles.
// Shared: Q_i, dO_i [32][HS] (row broadcast), K_j, V_j [32][HS+1] (lane = key).
template <int HS, bool IsDropout>
__global__ void __launch_bounds__(SimtTile::kThreads, 1) flash_bwd_dq_f32_kernel(const BwdParams<float> p) {
  constexpr int NTile = SimtTile::kTile, RPW = SimtTile::kPerWarp, KD = HS / 32;
  unsigned char* const smem = dynamic_smem<unsigned char>();
  float* sQ = reinterpret_cast<float*>(smem);  // [32][HS]
  float* sdO = sQ + NTile * HS;                // [32][HS]
  float* sK = sdO + NTile * HS;                // [32][HS+1]
  float* sV = sK + NTile * (HS + 1);           // [32][HS+1]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t bh = blockIdx.x;
  const int b = (int)bh / p.NH, h = (int)bh % p.NH;
  const int i0 = (gridDim.y - 1 - blockIdx.y) * NTile;
  const long long qkv_b = (long long)b * p.T * p.ld_qkv;
  const float* Q = p.qkv + qkv_b + (long long)h * HS;
  const float* K = Q + p.C;
  const float* V = Q + 2LL * p.C;
  const float* dO = p.dout + (long long)b * p.T * p.ld_out + (long long)h * HS;
  const int j_end = p.causal ? min(p.T, i0 + NTile) : p.T;

  load_tile_f32<NTile, HS, HS>(sQ, Q, p.ld_qkv, i0, p.T);
  load_tile_f32<NTile, HS, HS>(sdO, dO, p.ld_out, i0, p.T);
  float dq[RPW][KD], lse[RPW], Dr[RPW];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int i = i0 + warp * RPW + rr;
    lse[rr] = i < p.T ? p.lse[(long long)bh * p.T + i] : 0.f;
    Dr[rr] = i < p.T ? p.D[(long long)bh * p.T + i] : 0.f;
#pragma unroll
    for (int k = 0; k < KD; ++k) dq[rr][k] = 0.f;
  }
  for (int j0 = 0; j0 < j_end; j0 += NTile) {
    __syncthreads();
    load_tile_f32<NTile, HS, HS + 1>(sK, K, p.ld_qkv, j0, p.T);
    load_tile_f32<NTile, HS, HS + 1>(sV, V, p.ld_qkv, j0, p.T);
    __syncthreads();
    const int j = j0 + lane;  // this lane's key
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int r = warp * RPW + rr, i = i0 + r;
      if (i >= p.T || (p.causal && j0 > i)) continue;  // warp-uniform
      const bool valid = j < p.T && (!p.causal || j <= i);
      // S_ij = Q_i . K_j / sqrt(HS), P_ij = exp(S_ij - lse_i); dPd_ij = dO_i . V_j
      float sdot = 0.f, dpd = 0.f;
#pragma unroll 8
      for (int d = 0; d < HS; ++d) {
        sdot = fmaf(sQ[r * HS + d], sK[lane * (HS + 1) + d], sdot);
        dpd = fmaf(sdO[r * HS + d], sV[lane * (HS + 1) + d], dpd);
      }
      const float pij = valid ? expf(sdot * p.scale - lse[rr]) : 0.f;
      // dP = dPd o M s, dS = P o (dP - D_i)
      bool keep = true;
      if constexpr (IsDropout) keep = philox::attn_keep(p.key, bh, (uint32_t)i, (uint32_t)j);
      const float dp = keep ? dpd * p.dropout_scale : 0.f;
      const float ds = pij * (dp - Dr[rr]);
      // dQ_i += dS_ij K_j, keys in order
      for (int c = 0; c < NTile; ++c) {
        const float dsc = __shfl_sync(0xffffffffu, ds, c);
#pragma unroll
        for (int k = 0; k < KD; ++k) dq[rr][k] = fmaf(dsc, sK[c * (HS + 1) + lane + 32 * k], dq[rr][k]);
      }
    }
  }
  // dqkv[Q_i] += dQ_i / sqrt(HS)
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int i = i0 + warp * RPW + rr;
    if (i >= p.T) continue;
    float* dst = p.dqkv + qkv_b + (long long)i * p.ld_qkv + (long long)h * HS;
#pragma unroll
    for (int k = 0; k < KD; ++k) dst[lane + 32 * k] += dq[rr][k] * p.scale;
  }
}

template <int HS>
size_t bwd_smem_of(bool bf16) {
  return bf16 ? std::max(DkvTile<HS>::kSmemBytes, DqTile<HS>::kSmemBytes) : simt_bwd_smem_bytes<HS>();
}

// One (T, HS, dropout) instantiation: the D pass, then dK/dV, then dQ, on ctx.stream.
template <typename T, int HS, bool IsDropout>
void run_bwd(const Context& ctx, const BwdParams<T>& p) {
  {
    const long long rows = (long long)p.B * p.T * p.NH;
    const int threads = 256;
    launch(flash_bwd_dot_do_o_kernel<T>, dim3(grid_1d((size_t)rows * 32, threads)), threads, 0, ctx.stream, p);
  }
  if constexpr (std::is_same_v<T, bf16>) {
    if (flash_attn_hopper_chosen(ctx, HS)) return launch_bwd_hopper(ctx, p, IsDropout);
    using Kv = DkvTile<HS>;
    using Dq = DqTile<HS>;
    const long long kv_tiles = ceil_div(p.T, Kv::kBc), q_tiles = ceil_div(p.T, Dq::kBr);
    if (kv_tiles > 65535 || q_tiles > 65535) throw std::invalid_argument("flash_attn_backward: T too large for the grid");
    launch(flash_bwd_dkdv_bf16_kernel<HS, IsDropout>,
           dim3((unsigned)(p.B * p.NH), (unsigned)kv_tiles, (unsigned)Kv::kSplits), Kv::kThreads, Kv::kSmemBytes,
           ctx.stream, p);
    launch(flash_bwd_dq_bf16_kernel<HS, IsDropout>, dim3((unsigned)(p.B * p.NH), (unsigned)q_tiles),
           Dq::kThreads, Dq::kSmemBytes, ctx.stream, p);
  } else {
    const long long tiles = ceil_div(p.T, SimtTile::kTile);
    if (tiles > 65535) throw std::invalid_argument("flash_attn_backward: T too large for the grid");
    const dim3 grid((unsigned)(p.B * p.NH), (unsigned)tiles);
    launch(flash_bwd_dkdv_f32_kernel<HS, IsDropout>, grid, SimtTile::kThreads, simt_bwd_smem_bytes<HS>(),
           ctx.stream, p);
    launch(flash_bwd_dq_f32_kernel<HS, IsDropout>, grid, SimtTile::kThreads, simt_bwd_smem_bytes<HS>(),
           ctx.stream, p);
  }
}

}  // namespace

size_t bwd_smem_bytes(int HSp, bool bf16) {
  if (flash_attn_tile_head_size(HSp) != HSp) return 0;
  return FLASH_HEADDIM_SWITCH(HSp, kHS, [&] { return bwd_smem_of<kHS>(bf16); });
}

}  // namespace flash

size_t flash_attn_smem_bytes(int HS, bool bf16) {
  const int HSp = flash_attn_tile_head_size(HS);
  if (HSp == 0) return 0;
  return std::max(flash::fwd_smem_bytes(HSp, bf16), flash::bwd_smem_bytes(HSp, bf16));
}

template <typename T>
void flash_attn_backward(const Context& ctx, T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                         const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal,
                         const uint8_t* keep) {
  const int HS = flash::check_shape(B, Tn, C, NH, "flash_attn_backward");
  if (!dqkv || !dout || !qkv || !out || !lse) throw std::invalid_argument("flash_attn_backward: null buffer");
  if constexpr (std::is_same_v<T, bf16>) {
    flash::check_aligned(qkv, 16, "flash_attn_backward", "qkv");    // cp.async moves 16 bytes
    flash::check_aligned(dout, 16, "flash_attn_backward", "dout");
    flash::check_aligned(dqkv, 4, "flash_attn_backward", "dqkv");   // bf16x2 read-add-write
  }
  const size_t need = flash_attn_scratch_bytes(B, Tn, C, NH);
  if (!ctx.scratch || ctx.scratch_bytes < need)
    throw std::invalid_argument("flash_attn_backward: ctx.scratch holds " + std::to_string(ctx.scratch_bytes) +
                                " bytes, the backward needs flash_attn_scratch_bytes = " + std::to_string(need));
  // a head size the tiles do not have: widened copies of qkv, out, dout and dqkv (its values, so
  // that the kernels' += rounds once, as unpadded) after D in ctx.scratch; dqkv narrowed back
  const flash::Padding pad{HS, flash_attn_tile_head_size(HS)};
  bool hopper = false;
  if constexpr (std::is_same_v<T, bf16>) hopper = flash_attn_hopper_chosen(ctx, HS);
  if (!hopper)
    flash::check_smem(ctx, flash::bwd_smem_bytes(pad.HSp, std::is_same_v<T, bf16>), HS, pad.HSp, "flash_attn_backward");
  const long long rows = (long long)B * Tn;
  const T *qkv_k = qkv, *out_k = out, *dout_k = dout;
  T* dqkv_k = dqkv;
  if (pad.active()) {
    char* at = static_cast<char*>(ctx.scratch) + round_256((size_t)B * NH * Tn * sizeof(float));
    T* qkv_p = reinterpret_cast<T*>(at);
    T* out_p = reinterpret_cast<T*>(at + pad.bytes(rows, 3 * NH));
    T* dqkv_p = reinterpret_cast<T*>(at + pad.bytes(rows, 3 * NH) + pad.bytes(rows, NH));
    T* dout_p = reinterpret_cast<T*>(at + 2 * pad.bytes(rows, 3 * NH) + pad.bytes(rows, NH));
    flash::copy_heads(ctx, qkv_p, pad.HSp, qkv, HS, rows, 3 * NH);
    flash::copy_heads(ctx, out_p, pad.HSp, out, HS, rows, NH);
    flash::copy_heads(ctx, dout_p, pad.HSp, dout, HS, rows, NH);
    flash::copy_heads(ctx, dqkv_p, pad.HSp, dqkv, HS, rows, 3 * NH);
    qkv_k = qkv_p, out_k = out_p, dout_k = dout_p, dqkv_k = dqkv_p;
  }
  flash::BwdParams<T> p{};
  // out and lse are only read here (the D pass, the recomputation of P)
  flash::fill_fwd_params<T>(p, qkv_k, const_cast<T*>(out_k), const_cast<float*>(lse), nullptr, key, B, Tn,
                            NH * pad.HSp, NH, causal);
  flash::set_scale(p, HS);
  p.dout = dout_k;
  p.dqkv = dqkv_k;
  p.D = static_cast<float*>(ctx.scratch);
  if (hopper && dq_sums_bytes(B, Tn, NH, pad.HSp) > 0) {
    char* at = static_cast<char*>(ctx.scratch) + scratch_before_dq_sums(B, Tn, NH, pad);
    p.dq_sums = reinterpret_cast<float*>(at);
    p.dq_flags = reinterpret_cast<int*>(at + round_256((size_t)B * NH * Tn * pad.HSp * sizeof(float)));
  }
  const bool dropout = key.threshold != 0;
  // (the kernels only read p.keep here)
  if constexpr (std::is_same_v<T, bf16>) p.keep = flash::keep_buffer_used(key, Tn, causal) ? const_cast<uint8_t*>(keep) : nullptr;
  // the one place where the runtime flags become template parameters (causal stays p.causal)
  FLASH_HEADDIM_SWITCH(pad.HSp, kHS, [&] {
    BOOL_SWITCH(dropout, kDropout, [&] { flash::run_bwd<T, kHS, kDropout>(ctx, p); });
  });
  if (pad.active()) flash::copy_heads(ctx, dqkv, HS, dqkv_k, pad.HSp, rows, 3 * NH);
}

template void flash_attn_backward<float>(const Context&, float*, const float*, const float*, const float*,
                                         const float*, const philox::DropoutKey&, int, int, int, int, bool,
                                         const uint8_t*);
template void flash_attn_backward<bf16>(const Context&, bf16*, const bf16*, const bf16*, const bf16*, const float*,
                                        const philox::DropoutKey&, int, int, int, int, bool, const uint8_t*);

}  // namespace gpu
