// kernels/flash_attn_fwd.cu: the fused flash-attention forward with dropout (FlashAttention-2,
// Dao 2023, algorithm 1). CPU twin (the spec): cpu::attention_tiled_forward in
// kernels/cpu/attention_tiled.cpp; launcher contract in kernels/flash_attn.cuh.
//
// Per batch b and head h (bh = b*NH + h), Q, K, V the (T, HS) slices of qkv, the query rows
// cut into tiles Q_i of Br rows (one CTA each) and the keys into tiles K_j, V_j of Bc rows,
// s = 1 / (1 - p) = key.scale, M the Philox mask (M_ij = philox::attn_keep(key, bh, i, j)):
//   m_i = -inf, l_i = 0, O_i = 0
//   for each K_j, V_j (causal: tiles wholly above the diagonal skipped; p.causal, a run-time flag):
//     S_ij  = Q_i K_j^T / sqrt(HS)          (-inf at j >= T and, causal, at j > i)
//     m_new = max(m_i, rowmax(S_ij)),  P~_ij = exp(S_ij - m_new)
//     l_i   = exp(m_i - m_new) l_i + rowsum(P~_ij)          (softmax sum: BEFORE dropout)
//     O_i   = exp(m_i - m_new) O_i + (P~_ij o M_ij) V_j,  m_i = m_new
//   O_i = O_i * s / l_i   (the dropout scale s folded into the final normalisation),
//   lse_i = m_i + log(l_i)
// Writes: out (B, T, C) and lse (B, NH, T) overwritten; mask (B, NH, T, T) when not null: the
// keep decisions, written by the same code that applies them (entries above the causal
// diagonal untouched). Nothing of size T x T is stored otherwise.
//
// T = bf16 (tensor cores): one CTA of kWarps warps per (Q_i, bh), each warp owning 16 query
// rows; Q_i loaded once to shared memory, K_j / V_j streamed through two shared stages with
// cp.async (tile j+1 in flight while tile j is used); S_ij and O_i += P V_j by
// mma.sync m16n8k16 bf16 with fp32 accumulators (operands through ldmatrix); m_i, l_i, O_i
// and the dropout bits live in registers. In the scores m_i is kept in raw Q K^T units and
// exp(x) is computed as exp2(x log2 e) (FlashAttention-2's trick: one FMA per element).
// T = float: a SIMT kernel with the same tiles-and-online-softmax algorithm in plain fp32
// FMAs (no tensor cores, so no TF32), one warp per query row at a time, lane c on key c of
// the tile: for tight comparisons with the CPU reference.
//
// Without a GPU (emulated counts, tests/emu/test_kernel_counters.cpp; ptxas, build/kernel_resources.txt):
// no shared-memory bank conflicts (the tiles' 16-byte row pad puts an ldmatrix's 8 rows in 8
// bank groups), no spills or local memory, 8 warps resident per SM on an H100 and an A100 at
// HS = 64 (one 8-warp CTA: 145-188 registers a thread; a second CTA needs 128 or fewer). The
// output is stored from the mma fragments, a lane holding 2 adjacent columns of a row: a warp's
// bf16x2 store covers 8 rows x 16 bytes, 50% of the sectors it touches (91.7% for the kernel
// at gpt2-124m's T = 1024, where the loads dominate).
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "flash_attn.cuh"
#include "flash_attn_common.cuh"
#include "flash_attn_hopper.cuh"

namespace gpu {

int flash_attn_tile_head_size(int HS) {
  if (HS < 8 || HS > 256 || HS % 8 != 0) return 0;
  return HS <= 32 ? 32 : HS <= 64 ? 64 : HS <= 128 ? 128 : 256;
}

bool flash_attn_supported(int HS, std::string* why) {
  if (flash_attn_tile_head_size(HS) != 0) return true;
  if (why)
    *why = "the flash attention kernels take head sizes that are multiples of 8 up to 256 (32, 64, 128 and 256 as "
           "they are, the others padded to the next of those)";
  return false;
}

namespace flash {

// ---- padded heads: widening and narrowing copies ---------------------------------------------
// dst[r][g][d] = d < from_hs ? src[r][g][d] : 0, over rows x groups x to_hs elements
template <typename T>
__global__ void copy_heads_kernel(T* __restrict__ dst, int to_hs, const T* __restrict__ src, int from_hs,
                                  long long n) {
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
    const long long head = e / to_hs;
    const int d = (int)(e - head * to_hs);
    dst[e] = d < from_hs ? src[head * from_hs + d] : from_float<T>(0.f);
  }
}

template <typename T>
void copy_heads(const Context& ctx, T* dst, int to_hs, const T* src, int from_hs, long long rows, int groups) {
  const long long n = rows * groups * to_hs;
  launch(copy_heads_kernel<T>, grid_1d((size_t)n, 256), 256, 0, ctx.stream, dst, to_hs, src, from_hs, n);
}
template void copy_heads<float>(const Context&, float*, int, const float*, int, long long, int);
template void copy_heads<bf16>(const Context&, bf16*, int, const bf16*, int, long long, int);

}  // namespace flash

namespace flash {
namespace {

// ---- tile sizes (bf16) -------------------------------------------------------------------------
// Br = 128 query rows (8 warps x 16 rows), Bc = 64 keys (32 at HS = 256). Shared memory:
// Q_i [Br][HS+8] + two stages of K_j and V_j [Bc][HS+8], bf16:
//   HS = 32: 30 KB, HS = 64: 54 KB, HS = 128: 102 KB, HS = 256: 132 KB (opt-in dynamic shared
//   memory; two CTAs per SM on sm_90 up to HS = 128, one on sm_80). At HS = 256 a lane's O_i
//   takes 128 fp32 registers.
template <int HS>
using FwdTile = QueryTile<HS, 8, 1>;

// grid (B*NH, ceil(T / Br)); the query tiles are taken last-first so that, causal, the
// longest CTAs start first. At HS 32 two CTAs an SM (128 registers or fewer a thread): ptxas,
// left to itself, gave the dropout kernel 130 on sm_90 once causal became a run-time flag.
template <int HS, bool IsDropout>
__global__ void __launch_bounds__(FwdTile<HS>::kThreads, HS == 32 ? 2 : 1) flash_fwd_bf16_kernel(const FwdParams<bf16> p) {
  using Tile = FwdTile<HS>;
  constexpr int Br = Tile::kBr, Bc = Tile::kBc, S = Tile::kStride, NThreads = Tile::kThreads;
  unsigned char* const smem = dynamic_smem<unsigned char>();
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // Q_i   [Br][S]
  bf16* sK = sQ + Br * S;                    // K_j   [2][Bc][S]
  bf16* sV = sK + 2 * Bc * S;                // V_j   [2][Bc][S]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t bh = blockIdx.x;
  const int b = (int)bh / p.NH, h = (int)bh % p.NH;
  const int i0 = (gridDim.y - 1 - blockIdx.y) * Br;  // first query row of Q_i
  const int iw0 = i0 + 16 * warp;                     // first row of this warp
  const int i_g = iw0 + lane / 4;                     // row of this lane's c0, c1 (c2, c3: +8)
  const bf16* Q = p.qkv + (long long)b * p.T * p.ld_qkv + (long long)h * HS;  // Q[0][0] of (b, h)
  const bf16* K = Q + p.C;
  const bf16* V = Q + 2LL * p.C;

  // causal: key tiles past the last query row of Q_i are wholly above the diagonal
  const int j_end = p.causal ? min(p.T, i0 + Br) : p.T;
  const int n_j = (j_end + Bc - 1) / Bc;

  // load tile: Q_i once, K_0 and V_0 into stage 0 (one cp.async group)
  load_tile_async<Br, HS, NThreads>(sQ, Q, p.ld_qkv, i0, p.T);
  load_tile_async<Bc, HS, NThreads>(sK, K, p.ld_qkv, 0, p.T);
  load_tile_async<Bc, HS, NThreads>(sV, V, p.ld_qkv, 0, p.T);
  cp_async_commit();

  // m_i = -inf, l_i = 0, O_i = 0
  float o[HS / 8][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int jt = 0; jt < n_j; ++jt) {
    const int j0 = jt * Bc, stage = jt % 2;
    if (jt + 1 < n_j) {  // K_{j+1}, V_{j+1} into the other stage while this one is used
      load_tile_async<Bc, HS, NThreads>(sK + (1 - stage) * Bc * S, K, p.ld_qkv, j0 + Bc, p.T);
      load_tile_async<Bc, HS, NThreads>(sV + (1 - stage) * Bc * S, V, p.ld_qkv, j0 + Bc, p.T);
      cp_async_commit();
      cp_async_wait<1>();  // everything but the group just issued has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // Q_i, K_j, V_j visible to every warp
    // a warp whose 16 rows all lie above this tile's first key has nothing unmasked here
    if (!(p.causal && j0 > iw0 + 15)) {
      // S_ij = Q_i K_j^T (raw; the 1/sqrt(HS) is folded into scale_log2)
      float s[Bc / 8][4];
      zero(s);
      warp_gemm_ss<HS, Bc, S>(s, sQ + 16 * warp * S, sK + stage * Bc * S, lane);
      if (j0 + Bc > p.T || (p.causal && j0 + Bc - 1 > iw0)) mask_scores<Bc / 8>(s, i_g, j0 + 2 * (lane % 4), p.T, p.causal);
      // m_new = max(m_i, rowmax S_ij), P~_ij = exp(S_ij - m_new), l_i = e^(m_i - m_new) l_i + rowsum(P~_ij)
      online_softmax_update(s, o, m, l, p.scale_log2);
      // P~_ij o M_ij
      if constexpr (IsDropout) apply_dropout<Bc / 8>(s, p, bh, i_g, j0, lane);
      // O_i += (P~_ij o M_ij) V_j   (O_i already rescaled by e^(m_i - m_new))
      warp_gemm_rs<Bc, HS, S, false>(o, s, 0u, sV + stage * Bc * S, lane);
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  // O_i = diag(l_i)^-1 O_i s, lse_i = m_i + log(l_i)
  write_out_lse(p, o, m, l, bh, b, h, i_g, lane);
}

// ---- T = float: SIMT ---------------------------------------------------------------------------
// One CTA of 8 warps per (Q_i of 32 rows, bh); each warp owns 4 rows and takes them one at
// a time; for a row, lane c computes S_ic against key j0 + c of the tile (a sequential FMA
// dot product over HS), the row max / sum are warp reductions in a fixed butterfly order,
// and lane c accumulates output columns c, c+32, ... with P broadcast by shuffles in key
// order. Shared: Q_i [32][HS], K_j [32][HS+1] (the pad puts the 32 lanes' rows in 32
// different banks), V_j [32][HS].
struct SimtTile {
  static constexpr int kWarps = 8, kThreads = 256, kBr = 32, kBc = 32, kRowsPerWarp = kBr / kWarps;
};
template <int HS>
constexpr size_t simt_fwd_smem_bytes() {
  return (size_t)(SimtTile::kBr * HS + SimtTile::kBc * (HS + 1) + SimtTile::kBc * HS) * sizeof(float);
}

template <int HS, bool IsDropout>
__global__ void __launch_bounds__(SimtTile::kThreads, 1) flash_fwd_f32_kernel(const FwdParams<float> p) {
  constexpr int Br = SimtTile::kBr, Bc = SimtTile::kBc, RPW = SimtTile::kRowsPerWarp, KD = HS / 32;
  unsigned char* const smem = dynamic_smem<unsigned char>();
  float* sQ = reinterpret_cast<float*>(smem);  // Q_i [Br][HS]
  float* sK = sQ + Br * HS;                    // K_j [Bc][HS+1]
  float* sV = sK + Bc * (HS + 1);              // V_j [Bc][HS]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t bh = blockIdx.x;
  const int b = (int)bh / p.NH, h = (int)bh % p.NH;
  const int i0 = (gridDim.y - 1 - blockIdx.y) * Br;
  const float* Q = p.qkv + (long long)b * p.T * p.ld_qkv + (long long)h * HS;
  const float* K = Q + p.C;
  const float* V = Q + 2LL * p.C;
  const int j_end = p.causal ? min(p.T, i0 + Br) : p.T;

  load_tile_f32<Br, HS, HS>(sQ, Q, p.ld_qkv, i0, p.T);
  float o[RPW][KD], m[RPW], l[RPW];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.f;
#pragma unroll
    for (int k = 0; k < KD; ++k) o[rr][k] = 0.f;
  }
  for (int j0 = 0; j0 < j_end; j0 += Bc) {
    __syncthreads();  // the previous K_j, V_j are consumed
    load_tile_f32<Bc, HS, HS + 1>(sK, K, p.ld_qkv, j0, p.T);
    load_tile_f32<Bc, HS, HS>(sV, V, p.ld_qkv, j0, p.T);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const int r = warp * RPW + rr, i = i0 + r, j = j0 + lane;
      if (i >= p.T || (p.causal && j0 > i)) continue;  // warp-uniform
      const bool valid = j < p.T && (!p.causal || j <= i);
      // S_ij = Q_i . K_j / sqrt(HS), -inf where masked
      float dot = 0.f;
#pragma unroll 8
      for (int d = 0; d < HS; ++d) dot = fmaf(sQ[r * HS + d], sK[lane * (HS + 1) + d], dot);
      const float sij = valid ? dot * p.scale : -INFINITY;
      // m_new = max(m_i, rowmax S_ij); P~ = exp(S - m_new); l_i = e^(m_i - m_new) l_i + rowsum(P~)
      const float m_new = fmaxf(m[rr], warp_max(sij));
      if (m_new == -INFINITY) continue;  // nothing unmasked yet: state unchanged
      float pij = expf(sij - m_new);
      const float alpha = expf(m[rr] - m_new);
      l[rr] = alpha * l[rr] + warp_sum(pij);
      m[rr] = m_new;
      // P~_ij o M_ij (and the mask dump)
      if constexpr (IsDropout) {
        const bool keep = philox::attn_keep(p.key, bh, (uint32_t)i, (uint32_t)j);
        if (p.mask && valid) p.mask[((long long)bh * p.T + i) * p.T + j] = keep ? 1 : 0;
        if (!keep) pij = 0.f;
      }
      // O_i = e^(m_i - m_new) O_i + (P~_ij o M_ij) V_j, keys in order
#pragma unroll
      for (int k = 0; k < KD; ++k) o[rr][k] *= alpha;
      for (int c = 0; c < Bc; ++c) {
        const float pc = __shfl_sync(0xffffffffu, pij, c);
#pragma unroll
        for (int k = 0; k < KD; ++k) o[rr][k] = fmaf(pc, sV[c * HS + lane + 32 * k], o[rr][k]);
      }
    }
  }
  // O_i = diag(l_i)^-1 O_i s, lse_i = m_i + log(l_i)
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int i = i0 + warp * RPW + rr;
    if (i >= p.T) continue;
    const float inv = p.dropout_scale / l[rr];
    float* dst = p.out + ((long long)b * p.T + i) * p.ld_out + (long long)h * HS;
#pragma unroll
    for (int k = 0; k < KD; ++k) dst[lane + 32 * k] = o[rr][k] * inv;
    if (lane == 0) p.lse[(long long)bh * p.T + i] = m[rr] + logf(l[rr]);
  }
}

template <int HS>
size_t fwd_smem_of(bool bf16) {
  return bf16 ? FwdTile<HS>::kSmemBytes : simt_fwd_smem_bytes<HS>();
}

// One (T, HS, dropout) instantiation: grid and launch.
template <typename T, int HS, bool IsDropout>
void run_fwd(const Context& ctx, const FwdParams<T>& p) {
  if constexpr (std::is_same_v<T, bf16>) {
    using Tile = FwdTile<HS>;
    const long long tiles = ceil_div(p.T, Tile::kBr);
    if (tiles > 65535) throw std::invalid_argument("flash_attn_forward: T too large for the grid");
    launch(flash_fwd_bf16_kernel<HS, IsDropout>, dim3((unsigned)(p.B * p.NH), (unsigned)tiles),
           Tile::kThreads, Tile::kSmemBytes, ctx.stream, p);
  } else {
    const long long tiles = ceil_div(p.T, SimtTile::kBr);
    if (tiles > 65535) throw std::invalid_argument("flash_attn_forward: T too large for the grid");
    launch(flash_fwd_f32_kernel<HS, IsDropout>, dim3((unsigned)(p.B * p.NH), (unsigned)tiles),
           SimtTile::kThreads, simt_fwd_smem_bytes<HS>(), ctx.stream, p);
  }
}

}  // namespace

size_t fwd_smem_bytes(int HSp, bool bf16) {
  if (flash_attn_tile_head_size(HSp) != HSp) return 0;
  return FLASH_HEADDIM_SWITCH(HSp, kHS, [&] { return fwd_smem_of<kHS>(bf16); });
}

}  // namespace flash

size_t flash_attn_keep_bytes(int B, int NH, int Tn) {
  return Tn > kFlashKeepMaxT ? 0 : (size_t)B * NH * flash_attn_keep_bh_bytes(Tn);
}

template <typename T>
void flash_attn_forward(const Context& ctx, T* out, float* lse, const T* qkv, const philox::DropoutKey& key, int B,
                        int Tn, int C, int NH, bool causal, uint8_t* mask, uint8_t* keep) {
  const int HS = flash::check_shape(B, Tn, C, NH, "flash_attn_forward");
  if (!out || !lse || !qkv) throw std::invalid_argument("flash_attn_forward: null buffer");
  if constexpr (std::is_same_v<T, bf16>) {
    flash::check_aligned(qkv, 16, "flash_attn_forward", "qkv");  // cp.async moves 16 bytes
    flash::check_aligned(out, 4, "flash_attn_forward", "out");   // bf16x2 stores
  }
  // a head size the tiles do not have: the kernels read widened copies of the heads from
  // ctx.scratch and write a widened O there, narrowed into out at the end
  const flash::Padding pad{HS, flash_attn_tile_head_size(HS)};
  bool hopper = false;
  if constexpr (std::is_same_v<T, bf16>) hopper = flash_attn_hopper_chosen(ctx, HS);
  if (!hopper)
    flash::check_smem(ctx, flash::fwd_smem_bytes(pad.HSp, std::is_same_v<T, bf16>), HS, pad.HSp, "flash_attn_forward");
  const long long rows = (long long)B * Tn;
  const T* qkv_k = qkv;
  T* out_k = out;
  if (pad.active()) {
    const size_t need = flash_attn_scratch_bytes(B, Tn, C, NH);
    if (!ctx.scratch || ctx.scratch_bytes < need)
      throw std::invalid_argument("flash_attn_forward: head size " + std::to_string(HS) + " runs padded to " +
                                  std::to_string(pad.HSp) + " in ctx.scratch, which holds " +
                                  std::to_string(ctx.scratch_bytes) + " bytes of the " + std::to_string(need) +
                                  " it needs (flash_attn_scratch_bytes)");
    char* at = static_cast<char*>(ctx.scratch);
    T* qkv_p = reinterpret_cast<T*>(at);
    out_k = reinterpret_cast<T*>(at + pad.bytes(rows, 3 * NH));
    flash::copy_heads(ctx, qkv_p, pad.HSp, qkv, HS, rows, 3 * NH);
    qkv_k = qkv_p;
  }
  flash::FwdParams<T> p{};
  flash::fill_fwd_params(p, qkv_k, out_k, lse, mask, key, B, Tn, NH * pad.HSp, NH, causal);
  flash::set_scale(p, HS);
  if constexpr (std::is_same_v<T, bf16>) p.keep = flash::keep_buffer_used(key, Tn, causal) ? keep : nullptr;
  // with the mask dump and p = 0 the dropout path runs with threshold 0 (every element kept,
  // s = 1: the same result) so that the dump is written by the code that applies dropout
  const bool dropout = key.threshold != 0 || mask != nullptr;
  // the one place where the runtime flags become template parameters (causal stays p.causal)
  if (hopper) {
    if constexpr (std::is_same_v<T, bf16>) flash::launch_fwd_hopper(ctx, p, dropout);
  } else {
    FLASH_HEADDIM_SWITCH(pad.HSp, kHS, [&] {
      BOOL_SWITCH(dropout, kDropout, [&] { flash::run_fwd<T, kHS, kDropout>(ctx, p); });
    });
  }
  if (pad.active()) flash::copy_heads(ctx, out, HS, out_k, pad.HSp, rows, NH);
}

template void flash_attn_forward<float>(const Context&, float*, float*, const float*, const philox::DropoutKey&, int,
                                        int, int, int, bool, uint8_t*, uint8_t*);
template void flash_attn_forward<bf16>(const Context&, bf16*, float*, const bf16*, const philox::DropoutKey&, int,
                                       int, int, int, bool, uint8_t*, uint8_t*);

}  // namespace gpu
