// kernels/flash_attn_hopper.cu: flash attention with dropout on Hopper (sm_90a): wgmma for the
// matrix products, TMA and mbarriers for the forward's loads (contract in
// kernels/flash_attn_hopper.cuh). The algorithms are kernels/flash_attn_fwd.cu's and
// kernels/flash_attn_bwd.cu's (FlashAttention-2's algorithms 1 and 2, deterministic), whose CPU
// twins (cpu::attention_tiled_forward / _backward) are the spec.
//
// The forward, per (Q_i, bh): one CTA of two consumer warpgroups, each owning 64 query rows
// (Br = 128), and a producer warpgroup (384 threads, warp specialization; three consumers, Br =
// 192, 512 threads at HS 64 without dropout: fwd_consumers; at HS = 256 one consumer warpgroup,
// Br = 64, and a producer warp, 160 threads). The producer's first lane loads Q_i once
// and streams K_j, V_j (Bc = 128 keys at HS 64 and 128, 64 at 256: launch_fwd_tiles) through a
// ring of kStages shared stages with TMA (cp.async.bulk.tensor, 2-D boxes of 64 columns from one
// tensor map over qkv): each stage has a "full" mbarrier (the producer's
// arrive.expect_tx; the boxes' bytes complete it) and an "empty" one (one arrival per consumer
// warpgroup once its wgmmas on the stage have retired); the producer refills a stage only after its
// empty phase completes. Per key tile and warpgroup:
//   S (64 x Bc) = Q K^T    HS/16 wgmma m64n{Bc}k16, A = Q and B = K from shared memory
//   O (64 x HS) += P V     Bc/16 wgmma m64n{HS}k16, A = P from registers, B = V from shared
//                          memory (MN-major: V is stored key-major, the wgmma's k)
// software-pipelined within the warpgroup (FlashAttention-3's intra-warpgroup overlap): tile j's S
// is issued before tile j-1's P V, and tile j's softmax and dropout run while that P V product does
// (wgmma.wait_group 1, then 0; O is rescaled under the next S); three stages, since a warpgroup
// holds two. Without dropout the consumer warpgroups also take turns at issuing each tile's
// products (FlashAttention-3's pingpong schedule: an mbarrier a warpgroup, arrived on by the one
// before it in the cycle), so that one's products run while another's softmax does. The
// accumulators of a wgmma m64nNk16 give each warp of the warpgroup 16 rows in exactly the layout of
// mma.m16n8k16's C fragments over N / 8 n-tiles (PTX ISA, "Register Fragments and Shared Memory
// Matrix Layouts": warp w holds rows 16w .. 16w+15, element 2h + c of n-tile j is row 16w + 8h + g,
// column 8j+2t+c), so the masking, the online softmax, the dropout (one Philox call per 8 columns,
// keyed by position) and the output are the mma.sync kernel's own functions
// (kernels/flash_attn_common.cuh): the keep decisions are the same bytes by construction, and so is
// every other step but the sums inside the two products. A box of rows past the end of a batch's
// sequence reads the next sequence's rows (zeros past the tensor): those keys are masked (-inf, P =
// 0) and those query rows never written, as with the mma.sync kernel's zero-filled rows.
//
// With TG_FLASH_HOPPER=4 (not yet the default) the producer warpgroup also makes the keep
// decisions and hands them to the consumers through a ring in shared memory (KeepRing below).
//
// Shared memory: every tile is stored as HS / 64 column blocks of [rows][64] bf16 (128-byte
// rows) with the 128-byte swizzle: the 16-byte chunk k of row r sits at chunk k ^ (r % 8)
// (sw128_offset), the layout a TMA box with CU_TENSOR_MAP_SWIZZLE_128B lands in and wgmma reads
// through a descriptor with swizzle mode 128B; the 8 rows of a core matrix fall in 8 different
// bank groups. Tiles start on 1024-byte boundaries (the swizzle's period). Descriptors
// (kernels/hopper_ptx.cuh, make_smem_desc):
//   K-major (a product over the tile's columns, e.g. Q and K in S = Q K^T): rows 8 apart by
//            SBO = 1024 bytes; k-step kk starts at column block kk / 4, 32 (kk % 4) bytes into
//            the row (inside one 128-byte swizzle row);
//   MN-major (a product over the tile's rows, e.g. V in P V): rows 8 apart by SBO = 1024, column
//            blocks of 64 apart by LBO = rows x 128 bytes; k-step kk starts at row 16 kk
//            (2048 kk bytes).
// The backward's kernels load with cp.async (see below); cp.async writes through the
// generic proxy and wgmma reads through the async proxy, so each thread fences
// (fence.proxy.async) after its copies land, before the barrier that precedes the wgmmas. Their
// warp-specialized twins (TG_FLASH_HOPPER=2, not yet the default) load with TMA as the forward does.
//
// With TG_FLASH_HOPPER=3 the backward is one kernel (measured slower on the H200, so not the
// default: docs/BENCHMARKS.md): the dK / dV kernel computes dQ too (FusedDq; at HS 256 each of the
// two CTAs of a key tile its 128 columns of dQ, with a flag of its own). Per
// (query tile i, key tile j) it has dS_ij in registers as dK's A operand; it stores it to shared
// memory transposed (stmatrix .trans), as the B operand of dQ_i^T += K_j^T dS_ij^T (wgmma, A = K_j
// MN-major: the product runs over the keys, K_j's rows), with dQ_i's fp32 sums so far loaded as
// the accumulators. The sums pass from key tile to key tile through global memory, in a fixed
// order: from the query tile's diagonal key tile, which starts them, down to key tile 0, which adds
// dQ_i / sqrt(HS) to dqkv; the CTA of each other key tile waits on a flag until the tile above it
// has stored them, adds its terms, stores them and raises the flag. The dQ kernels (here and
// mma.sync's) sum over the keys in the same order, last-first in steps of 16, so each element of dQ
// gets the same products in the same order everywhere (the same bits), and no kernel recomputes S
// and dP for dQ: 5 products a tile pair where the two kernels make 7.
// The order is the causal mask's own: key tile j starts at query tile j Bc / Br, Bc / Br tiles
// before tile j + 1's first, so when a head's key tiles start together each reaches a query tile
// Bc / Br tile times after the tile above it, and none waits. The grid is (key tiles, heads): a
// head's key tiles last-first, then the next head's, so that the CTAs running at once are a few
// heads' key tiles, and a tile's sums come back to L2 a few tile times after they left it (the
// first version, with tile 0 first and the heads before the key tiles, sent them to DRAM and
// back: on the H200 44% of its bandwidth, 2.1 TB/s, for the sums of HS 128 at T 4k).
//
// Built for sm_90a alone (the Makefile's HOPPER_GENCODE): the instructions exist nowhere else.
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "flash_attn.cuh"
#include "flash_attn_common.cuh"
#include "flash_attn_hopper.cuh"
#include "hopper_ptx.cuh"

namespace gpu {

hopper::EncodeTiled hopper::encode_tiled() {
#ifdef TG_SIMT_EMULATION
  return &cuTensorMapEncodeTiled;
#else
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !f)
      throw std::runtime_error("the driver has no cuTensorMapEncodeTiled (the Hopper kernels' TMA); update the "
                               "NVIDIA driver to CUDA 12.0 or newer");
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
#endif
}

bool flash_attn_hopper_head_size(int HS) { return HS == 64 || HS == 128 || HS == 256; }

bool flash_attn_hopper_device(const Context& ctx) { return ctx.cc_major == 9 && ctx.cc_minor == 0; }

namespace {
// TG_FLASH_HOPPER: "" (unset), "0" to "9"; anything else throws
std::string hopper_setting() {
  const char* v = std::getenv("TG_FLASH_HOPPER");
  const std::string s = v ? v : "";
  if (!s.empty() && (s.size() != 1 || s[0] < '0' || s[0] > '9'))
    throw std::invalid_argument("TG_FLASH_HOPPER is '" + s + "'; expected 1 (the Hopper kernels on compute capability "
                                "9.0, the default), 2 (them with the warp-specialized TMA backward), 3 (them with "
                                "dQ inside the dK / dV kernel), 4 (them with the forward's keep decisions made by its "
                                "producer warpgroup), 5 (them with the backward's kernels not pipelined over their tiles), "
                                "6 (them with the forward on key tiles of 64), 7 (them with the forward's two consumer "
                                "warpgroups where it takes three), 8 (them with the forward's consumer warpgroups not taking "
                                "turns at their products), 9 (them with the forward's dropout at head size 64 on three "
                                "consumer warpgroups and key tiles of 64) or 0 (the mma.sync kernels); set one of them, "
                                "or unset it");
  return s;
}
}  // namespace

bool flash_attn_hopper_chosen(const Context& ctx, int HS) {
  return hopper_setting() != "0" && flash_attn_hopper_device(ctx) &&
         flash_attn_hopper_head_size(flash_attn_tile_head_size(HS));
}

bool flash_attn_hopper_ws_backward() { return hopper_setting() == "2"; }

bool flash_attn_hopper_fused_dq() { return hopper_setting() == "3"; }

bool flash_attn_hopper_keep_producer() { return hopper_setting() == "4"; }

bool flash_attn_hopper_pipelined() { return hopper_setting() != "5"; }

bool flash_attn_hopper_wide_key_tiles() { return hopper_setting() != "6"; }

bool flash_attn_hopper_three_consumers() { return hopper_setting() != "7"; }

bool flash_attn_hopper_turns() { return hopper_setting() != "8"; }

bool flash_attn_hopper_dropout_three_consumers() { return hopper_setting() == "9"; }

namespace flash {
namespace {

using hopper::align_1024;

// the forward's registers a thread after setmaxnreg, producer and consumer warpgroups (below);
// with a producer warpgroup that makes the keep decisions too (KeepRing) 40 and 232:
// 40 + 2 x 232 = 504 = 3 x 168 (at 32 its loop spilled a few words)
// With three consumer warpgroups (HS 64 without dropout, key tiles of 128) 24 and 160:
// 24 + 3 x 160 = 504 <= 4 x 128, the registers a thread ptxas gives a block of 512 at entry
constexpr int kFwdProducerRegs = 24, kFwdConsumerRegs = 240, kFwdKeepProducerRegs = 40, kFwdKeepConsumerRegs = 232,
              kFwdConsumer3Regs = 160;

// The forward's consumer warpgroups by default: one at HS = 256, whose 64 x 256 O takes 128
// registers a lane (ptxas gives a CTA of three warpgroups' registers 168 a thread, of two 255);
// two at HS 64 and 128; three (Br = 192, FlashAttention-3's count at this size) at HS 64 without
// dropout on key tiles of 128, whose consumers need at most 160 registers (ptxas: highest R151 in
// 240), so that an SM holds 12 consumer warps where it held 8 (launch_fwd_tiles)
__host__ __device__ constexpr int fwd_consumers(int HS, int Bc, bool dropout) {
  return HS > 128 ? 1 : HS == 64 && Bc == 128 && !dropout ? 3 : 2;
}

template <int HS, int Bc = 64, int Consumers = fwd_consumers(HS, 64, true)>
struct HopperFwdTile {
  static constexpr int kConsumers = Consumers;
  // With two consumers the producer is a whole warpgroup (FlashAttention-3's split): its one
  // issuing lane needs few registers, so the warpgroup gives back all but kFwdProducerRegs a thread
  // (setmaxnreg.dec) and the consumers take them (.inc kFwdConsumerRegs): 24 + 2 x 240 = 3 x 168, the
  // registers a thread ptxas gives the whole block at entry under __launch_bounds__(384, 1); with
  // three, kFwdConsumer3Regs. With one consumer (HS 256) a producer warp, as before: the consumer
  // has 255 registers already.
  static constexpr bool kProducerWarpgroup = kConsumers >= 2;
  static constexpr int kConsumerRegs = kConsumers == 3 ? kFwdConsumer3Regs : kFwdConsumerRegs;
  static_assert(kFwdProducerRegs + kConsumers * kConsumerRegs <= 65536 / (128 * (kConsumers + 1)) * (kConsumers + 1),
                "the consumers' registers after setmaxnreg exceed what the block starts with");
  static constexpr int kThreads = 128 * kConsumers + (kProducerWarpgroup ? 128 : 32);
  static constexpr int kBr = 64 * kConsumers;             // query rows
  static constexpr int kBc = Bc;                          // keys per tile (launch_fwd_tiles)
  static_assert(kConsumers >= 1 && kConsumers <= 3 && (Bc == 64 || (Bc == 128 && kConsumers >= 2)),
                "one to three consumers; key tiles of 64, or 128 with two or three consumers");
  // K_j, V_j stages in the ring: three, since a consumer holds two (V_{j-1} under its P V
  // product while K_j is under S's) and the third is the tile in flight
  static constexpr int kStages = 3;
  static constexpr int kQBytes = kBr * HS * 2;
  static constexpr int kKVBytes = kBc * HS * 2;  // one K or V tile
  // Q_i, the stages, and the slack that aligns them to 1024 bytes
  static constexpr size_t kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes;
  static_assert(kSmemBytes <= 227 * 1024, "the forward's tiles exceed an H100's 227 KB of shared memory a block");
  // Whether tile j's softmax overlaps tile j-1's P V product (below): it keeps S and P live
  // together. With dropout at HS = 256 that spilled once the keep bytes were stored (ptxas, nvcc
  // 13.0: 255 registers, 8 bytes of spill stores), so there the products run one after the other;
  // at HS = 128 it spilled in 168 registers (28 bytes of spill stores) and fits in the consumers'
  // 240
  __host__ __device__ static constexpr bool overlap(bool dropout) { return !(dropout && HS > 128); }
  // Whether the consumers take turns at issuing their products (flash_fwd_hopper_kernel): where
  // there are two or three, without dropout. With it a consumer's work on the CUDA cores is about
  // three times its products' (the keep decisions: about 705 instructions a warp for 64 keys where
  // 230 without, ptxas sm_90a), so the tensor cores wait whatever the order; and at HS 128 the
  // turns' registers spilled 32 bytes (ptxas, nvcc 13.0)
  __host__ __device__ static constexpr bool turns(bool dropout) { return kConsumers >= 2 && !dropout; }
  // The keep ring (TG_FLASH_HOPPER=4, with a producer warpgroup): stages of one word a consumer
  // lane, its keep bits of a key tile
  static constexpr int kKeepStages = 4;
  static constexpr int kKeepWords = 128 * kConsumers;
};

// Byte offset of 16-byte chunk k (0 .. HS/8 - 1) of row r in a tile of R rows stored as column
// blocks of [R][64] bf16 with the 128-byte swizzle (R a multiple of 8, the tile 1024-aligned).
__host__ __device__ constexpr uint32_t sw128_offset(int R, int r, int k) {
  return (uint32_t)((k / 8) * R * 128 + r * 128 + (((k % 8) ^ (r % 8)) << 4));
}

// Rows row0 .. row0+R-1 of a (T, HS) slice at g (row stride ld elements) into the swizzled tile
// at s, asynchronously (cp.async, consecutive threads on consecutive chunks of a row); rows >= Tn
// zero-filled.
// (load_tile_chunks: rows P apart, P a multiple of 8, are P 128-byte rows apart at every chunk,
// the swizzle's pattern repeating every 8 rows; other P take the copies one by one)
template <int R, int HS, int NThreads>
__device__ __forceinline__ void load_tile_sw128(unsigned char* s, const bf16* g, long long ld, int row0, int Tn) {
  constexpr int P = NThreads / (HS / 8);
  load_tile_chunks<R, HS, NThreads, P % 8 == 0 ? 128 : 0>(s, g, ld, row0, Tn,
                                                         [](int r, int k) { return sw128_offset(R, r, k); });
}

// The descriptors of a swizzled tile of R rows (see the header comment): K-major (the product
// runs over the tile's columns: Q, K, V, dO as S = Q K^T's and dP's operands), the rows from row0,
// k-step kk; MN-major (the product runs over the tile's rows: V, dO, Q, K as the second operand
// of P V, P^T dO, dS^T Q, dS K), k-step kk = rows 16 kk .. 16 kk + 15.
// (K-major: the tile's descriptor advanced, hopper::desc_advance; MN-major made whole, which at HS
// 256 keeps the dK / dV kernel with dQ inside from spilling, at 255 registers)
template <int R>
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t tile, int row0, int kk) {
  return hopper::desc_advance(hopper::make_smem_desc(tile, 16, 1024, hopper::Swizzle::B128),
                              (uint32_t)((kk / 4) * R * 128 + row0 * 128 + (kk % 4) * 32));
}
template <int R>
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t tile, int kk) {
  return hopper::make_smem_desc(tile + (uint32_t)(kk * 2048), R * 128, 1024, hopper::Swizzle::B128);
}

// Thread 0 initialises a ring's mbarriers: `once` (the tiles loaded once, one arrival), and per
// stage "full" (full_count arrivals, one with expect_tx) and "empty" (empty_count arrivals);
// then the CTA synchronises, so that no thread waits on an uninitialised barrier.
template <int NS>
__device__ __forceinline__ void init_ring(uint64_t* once, uint64_t (&full)[NS], uint32_t full_count,
                                          uint64_t (&empty)[NS], uint32_t empty_count) {
  if (threadIdx.x == 0) {
    hopper::mbarrier_init(once, 1);
    for (int st = 0; st < NS; ++st) {
      hopper::mbarrier_init(&full[st], full_count);
      hopper::mbarrier_init(&empty[st], empty_count);
    }
    hopper::fence_mbarrier_init();
  }
  __syncthreads();
}

// The producer's ring of key tiles (the forward's and the warp-specialized dQ kernel's): for each
// key tile jt < n_j (in order, or last-first with Desc), the n-th loaded once the consumers have
// released stage n % NS, K_j and V_j as Blocks boxes each of Bc rows from the qkv map (columns
// C + h HS and 2C + h HS on, rows from row0 + Bc jt) into the stage's TB-byte tiles at sK and sV,
// completing full[st]. By one thread.
// (Box: the map's box rows, Bc or a divisor of it: each column block of a tile is Bc / Box boxes)
template <int HS, int Bc, int NS, int TB, bool Desc = false, int Box = Bc>
__device__ __forceinline__ void produce_kv_stage(unsigned char* sK, unsigned char* sV, const CUtensorMap* map,
                                                 uint64_t (&full)[NS], uint64_t (&empty)[NS], int n, int n_j, int C,
                                                 int h, int row0) {
  constexpr int Blocks = HS / 64;
  static_assert(Bc % Box == 0, "a tile's rows are whole boxes");
  const int jt = Desc ? n_j - 1 - n : n, st = n % NS, use = n / NS;
  if (use > 0) hopper::mbarrier_wait_parity(&empty[st], (use - 1) & 1);  // the consumers released it
  hopper::mbarrier_arrive_expect_tx(&full[st], 2 * TB);
  for (int blk = 0; blk < Blocks; ++blk)
    for (int r = 0; r < Bc; r += Box) {
      const int off = st * TB + blk * Bc * 128 + r * 128, row = row0 + jt * Bc + r;
      hopper::tma_load_2d(sK + off, map, C + h * HS + 64 * blk, row, &full[st]);
      hopper::tma_load_2d(sV + off, map, 2 * C + h * HS + 64 * blk, row, &full[st]);
    }
}
template <int HS, int Bc, int NS, int TB, bool Desc = false, int Box = Bc>
__device__ __forceinline__ void produce_kv_ring(unsigned char* sK, unsigned char* sV, const CUtensorMap* map,
                                                uint64_t (&full)[NS], uint64_t (&empty)[NS], int n_j, int C, int h,
                                                int row0) {
  for (int n = 0; n < n_j; ++n)
    produce_kv_stage<HS, Bc, NS, TB, Desc, Box>(sK, sV, map, full, empty, n, n_j, C, h, row0);
}

// The keep ring's words of one key tile (queries i0 .. i0 + 16 Warps - 1, keys j0 .. j0 + 63), by
// the 128 threads tid of a producer warpgroup: word 32 w + l is the keep bits that consumer warp w
// (rows i0 + 16 w ..) lane l would get from dropout_keep_bits<8> (bit 4nt+e for its element
// (nt, e)), from the same Philox calls (philox::attn_keep_byte, keep_byte: their bytes stored to
// p.keep when it is not null, as the consumers' calls store them). A warp takes blocks of 16 rows:
// lane (rr = lane % 16, q = lane / 16) makes the bytes of row rr and key groups q, q + 2, q + 4,
// q + 6 (so that each call step's stores to p.keep fill one 32-byte block of it), takes bits 2t,
// 2t + 1 of each for the word of every lane t of its row's quad, and three shuffles gather each
// word whole in one lane: row rr's words of t = 2r, 2r + 1 (r = rr / 8) in the lanes of both rows
// of a word (xor 8), then word t = 2r + q in lane (rr, q) (xor 16), which stores it.
template <int Warps>
__device__ __forceinline__ void make_keep_words(uint32_t* words, const FwdParams<bf16>& p, uint32_t bh, int i0, int j0,
                                                int tid) {
  static_assert(Warps % 4 == 0, "row blocks divide among the warpgroup's four warps");
  const int lane = tid % 32, rr = lane % 16, q = lane / 16, r = rr / 8;
  const uint32_t thr = philox::attn_threshold(p.key);
#pragma unroll 1
  for (int rb = tid / 32; rb < Warps; rb += 4) {
    const uint32_t i = (uint32_t)(i0 + 16 * rb + rr);
    uint32_t w[4] = {0u, 0u, 0u, 0u};  // the words of t = 0 .. 3, bits of row r, key groups of parity q
#pragma unroll 1
    for (int m = 0; m < 4; ++m) {
      const uint32_t byte = keep_byte(p.key, thr, p.keep, p.T, bh, i, (uint32_t)(j0 + 8 * (q + 2 * m)));
#pragma unroll
      for (int t = 0; t < 4; ++t) w[t] |= ((byte >> (2 * t)) & 3u) << (8 * m);
    }
    // group nt = q + 2m's bits of row r sit at 4 nt + 2 r = 8 m + 4 q + 2 r
#pragma unroll
    for (int t = 0; t < 4; ++t) w[t] <<= 4 * q + 2 * r;
    const uint32_t k0 = (r ? w[2] : w[0]) | __shfl_xor_sync(0xffffffffu, r ? w[0] : w[2], 8);  // t = 2r
    const uint32_t k1 = (r ? w[3] : w[1]) | __shfl_xor_sync(0xffffffffu, r ? w[1] : w[3], 8);  // t = 2r + 1
    const uint32_t word = (q ? k1 : k0) | __shfl_xor_sync(0xffffffffu, q ? k0 : k1, 16);       // t = 2r + q
    words[32 * rb + 4 * (rr % 8) + 2 * r + q] = word;
  }
}

// grid (B*NH, ceil(T / Br)), query tiles last-first (causal: the longest CTAs start first).
// map: qkv as a (B T, 3C) tensor, boxes of 64 columns by Bc rows (Q_i: two boxes of rows a
// column block).
// KeepRing (TG_FLASH_HOPPER=4; with dropout and a producer warpgroup): the keep decisions are made
// by the producer warpgroup, whose four warps are otherwise idle, rather than by the consumers
// between their products: per key tile it writes each consumer lane's keep bits (make_keep_words)
// into a ring of kKeepStages stages in shared memory, each with a "full" mbarrier (an arrival by
// each producer thread after its store) and an "empty" one (an arrival by each consumer thread
// once it has read its word). The same Philox calls, so the same bits; the consumers' dropout is
// then one shared load a tile.
template <int HS, int KeyTile, int Consumers, bool IsDropout, bool KeepRing = false>
__global__ void __launch_bounds__(HopperFwdTile<HS, KeyTile, Consumers>::kThreads, 1)
    flash_fwd_hopper_kernel(const FwdParams<bf16> p, const __grid_constant__ CUtensorMap map, const bool turns) {
  using Tile = HopperFwdTile<HS, KeyTile, Consumers>;
  constexpr int Br = Tile::kBr, Bc = Tile::kBc, NS = Tile::kStages, Blocks = HS / 64, NC = Tile::kConsumers;
  constexpr int NK = Tile::kKeepStages, KW = Tile::kKeepWords;
  static_assert(!KeepRing || (IsDropout && Tile::kConsumers == 2 && Bc == 64),
                "the keep ring needs dropout, a producer warpgroup, two consumers and key tiles of 64");
  // the consumers' turns (Tile::turns): the kernel's own choice, and the caller's
  const bool pingpong = Tile::turns(IsDropout) && turns;
  __shared__ uint64_t bar_q, full[NS], empty[NS], turn[Tile::turns(IsDropout) ? NC : 1];
  __shared__ uint64_t keep_full[KeepRing ? NK : 1], keep_empty[KeepRing ? NK : 1];
  __shared__ uint32_t keep_words[KeepRing ? NK * KW : 1];
  unsigned char* const raw = dynamic_smem<unsigned char>();
  unsigned char* const sQ = align_1024(raw);
  unsigned char* const sK = sQ + Tile::kQBytes;            // [NS][Bc][HS]
  unsigned char* const sV = sK + NS * Tile::kKVBytes;       // [NS][Bc][HS]
  const uint32_t aQ = smem_u32(sQ), aK = smem_u32(sK), aV = smem_u32(sV);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wg = warp / 4;
  const uint32_t bh = blockIdx.x;
  const int i0 = (gridDim.y - 1 - blockIdx.y) * Br;  // first query row of Q_i
  // causal: key tiles past the last query row of Q_i are wholly above the diagonal
  const int j_end = p.causal ? min(p.T, i0 + Br) : p.T;
  const int n_j = (j_end + Bc - 1) / Bc;

  // full: the producer's arrive.expect_tx; empty: one arrival per consumer warpgroup. The keep
  // ring's: every producer thread, every consumer thread (initialised with the others, before
  // init_ring's fence and barrier)
  if (KeepRing && threadIdx.x == 0)
    for (int st = 0; st < NK; ++st) {
      hopper::mbarrier_init(&keep_full[st], 128);
      hopper::mbarrier_init(&keep_empty[st], 128 * Tile::kConsumers);
    }
  // turn[w]: every thread of the consumer warpgroup before w in the cycle (w - 1, or the last for 0)
  if (Tile::turns(IsDropout) && threadIdx.x == 0)
    for (int w = 0; w < NC; ++w) hopper::mbarrier_init(&turn[w], 128);
  init_ring(&bar_q, full, 1, empty, Tile::kConsumers);

  if (wg == Tile::kConsumers) {  // the producer: the first lane of its first warp issues every load
    if constexpr (Tile::kProducerWarpgroup)
      hopper::setmaxnreg_dec<KeepRing ? kFwdKeepProducerRegs : kFwdProducerRegs>();
    const int ptid = (int)threadIdx.x - 128 * Tile::kConsumers;
    const int b = (int)bh / p.NH, h = (int)bh % p.NH;
    const int row0 = b * p.T;  // row of (b, 0) in the (B T, 3C) tensor
    if (ptid == 0) {  // (the map's boxes are 64 rows: Q_i is Br / 64 of them a column block)
      hopper::mbarrier_arrive_expect_tx(&bar_q, Tile::kQBytes);
      for (int blk = 0; blk < Blocks; ++blk)
        for (int r = 0; r < Br; r += 64)
          hopper::tma_load_2d(sQ + blk * Br * 128 + r * 128, &map, h * HS + 64 * blk, row0 + i0 + r, &bar_q);
    }
    if constexpr (KeepRing) {
      // tile n's K, V (its first lane), then its keep words (the warpgroup) once their stage is free
      for (int n = 0; n < n_j; ++n) {
        if (ptid == 0)
          produce_kv_stage<HS, Bc, NS, Tile::kKVBytes, false, 64>(sK, sV, &map, full, empty, n, n_j, p.C, h, row0);
        const int sk = n % NK;
        if (n >= NK) hopper::mbarrier_wait_parity(&keep_empty[sk], (n / NK - 1) & 1);
        make_keep_words<Br / 16>(keep_words + sk * KW, p, bh, i0, n * Bc, ptid);
        hopper::mbarrier_arrive(&keep_full[sk]);
      }
    } else if (ptid == 0) {
      produce_kv_ring<HS, Bc, NS, Tile::kKVBytes, false, 64>(sK, sV, &map, full, empty, n_j, p.C, h, row0);
    }
    return;
  }

  // a consumer warpgroup: rows iwg0 .. iwg0+63
  if constexpr (Tile::kProducerWarpgroup) hopper::setmaxnreg_inc<KeepRing ? kFwdKeepConsumerRegs : Tile::kConsumerRegs>();
  const int iwg0 = i0 + 64 * wg;                // first row of this warpgroup
  // the warpgroup index as ptxas sees a value the same in every lane (a shuffle from lane 0), so
  // that Q's descriptors stay in uniform registers rather than moving there for each wgmma
  const int wg_uniform = __shfl_sync(0xffffffffu, wg, 0);
  const int iw0 = iwg0 + 16 * (warp % 4);       // first row of this warp
  const int i_g = iw0 + lane / 4;               // row of this lane's elements 0, 1 (2, 3: +8)
  float o[HS / 8][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float(&o_flat)[HS / 2] = reinterpret_cast<float(&)[HS / 2]>(o);
  hopper::mbarrier_wait_parity(&bar_q, 0);

  // The key tiles with anything unmasked for this warpgroup's 64 rows: a prefix, jt < n_wg (the
  // condition is the warpgroup's: its four warps issue the wgmmas together; not causal, every
  // tile). Software-pipelined where Tile::overlap, as FlashAttention-3 describes
  // (intra-warpgroup overlap): tile jt's S = Q K_j^T is issued, then O is rescaled by tile jt-1's
  // alpha (under S's product) and tile jt-1's O += P V issued, and the softmax (and dropout) of
  // tile jt runs on the CUDA cores while that P V product runs on the tensor cores. So O =
  // alpha_j O_{j-1} + P_j V_j as before, in the same order: the same bits as the unpipelined loop
  // (and as the mma.sync kernels).
  // (from wg_uniform: a loop count ptxas sees as uniform keeps the stages' descriptors in uniform
  // registers too)
  // A warpgroup whose rows are all past T has none (the last query tile's, where T is not a
  // multiple of Br: at T 1024 and Br 192 two of the three, whose products made 18% of the
  // forward's work) and only releases the stages and takes its turns (idle_from below).
  // (With one consumer, never: at HS 256 the test spilled 4 bytes with dropout.)
  const int n_wg = NC > 1 && i0 + 64 * wg_uniform >= p.T ? 0
                   : p.causal                              ? min(n_j, (i0 + 64 * wg_uniform + 63) / Bc + 1)
                                                           : n_j;
  float s[Bc / 8][4];
  float(&s_flat)[Bc / 2] = reinterpret_cast<float(&)[Bc / 2]>(s);
  uint32_t a[Bc / 16][4];  // P of the previous tile, bf16, as wgmma A fragments
  // S_ij = Q_i K_j^T (raw; the 1/sqrt(HS) is folded into scale_log2), issued and committed
  auto issue_s = [&](int jt) {
    const uint32_t tK = aK + (jt % NS) * Tile::kKVBytes;
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk)
      hopper::wgmma_bf16_ss<Bc, 0, 0>(s_flat, desc_kmajor<Br>(aQ, 64 * wg_uniform, kk), desc_kmajor<Bc>(tK, 0, kk),
                                      kk > 0);
    hopper::wgmma_commit_group();
  };
  // O_i += (P~_ij o M_ij) V_j from a (k-step kk = columns 16kk .. 16kk+15), issued and committed
  auto issue_pv = [&](int jt) {
    const uint32_t tV = aV + (jt % NS) * Tile::kKVBytes;
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) hopper::wgmma_bf16_rs<HS, 1>(o_flat, a[kk], desc_mnmajor<Bc>(tV, kk), true);
    hopper::wgmma_commit_group();
  };
  // S_ij masked, m_new, P~_ij = exp(S_ij - m_new), l_i, P~_ij o M_ij: all but O's rescaling
  auto softmax = [&](int jt, float (&alpha)[2]) {
    const int j0 = jt * Bc;
    if (j0 + Bc > p.T || (p.causal && j0 + Bc - 1 > iw0)) mask_scores<Bc / 8>(s, i_g, j0 + 2 * (lane % 4), p.T, p.causal);
    online_softmax_scores(s, alpha, m, l, p.scale_log2);
    if constexpr (KeepRing) {
      const int sk = jt % NK;
      hopper::mbarrier_wait_parity(&keep_full[sk], (jt / NK) & 1);
      const uint32_t bits = keep_words[sk * KW + threadIdx.x];  // consumer warp w's lane l: word 32 w + l
      hopper::mbarrier_arrive(&keep_empty[sk]);
      apply_keep_bits<Bc / 8>(s, p, bits, bh, i_g, j0, lane);
    } else if constexpr (IsDropout) {
      // a lane's keep bits of 64 keys fill a word: a tile of 128 keys takes two
#pragma unroll
      for (int half = 0; half < Bc / 64; ++half)
        apply_dropout<8>(reinterpret_cast<float(&)[8][4]>(s[8 * half]), p, bh, i_g, j0 + 64 * half, lane);
    }
  };
  // the warpgroup's wgmmas on the stage have retired (its reads of the stage are over): one
  // arrival, by its first thread, releases it
  auto release = [&](int jt) {
    if (threadIdx.x % 128 == 0) hopper::mbarrier_arrive(&empty[jt % NS]);
  };
  // The consumers' turns (FlashAttention-3's pingpong schedule between warpgroups): each key tile
  // jt, the warpgroups issue their products in a fixed cycle, 0, 1 (, 2), and warpgroup 0 the next
  // tile's after the last one's of this tile, so that one's products run on the tensor cores while
  // another's softmax runs, rather than all of them meeting at the tensor cores at once. Warpgroup
  // w waits on turn[w] (completion jt: the warpgroup before it issued tile jt; for 0, completion
  // jt - 1: the last one issued tile jt - 1) and arrives on the next one's once it has issued. Every
  // warpgroup takes a turn at every tile jt < n_j, those past its rows too, without products.
  // Scheduling alone: the same products in the same order, so the same bits.
  auto take_turn = [&](int jt) {
    if (pingpong && (wg_uniform > 0 || jt > 0))
      hopper::mbarrier_wait_parity(&turn[wg_uniform], (wg_uniform > 0 ? jt : jt - 1) & 1);
  };
  auto pass_turn = [&] {
    if (pingpong) hopper::mbarrier_arrive(&turn[wg_uniform + 1 < NC ? wg_uniform + 1 : 0]);
  };

  // the tiles past this warpgroup's rows (from j0): nothing to compute, the stage released once
  // landed (and the keep ring's once written: an arrival before would count towards an earlier
  // phase), the turns taken
  auto idle_from = [&](int j0) {
    for (int jt = j0; jt < n_j; ++jt) {
      hopper::mbarrier_wait_parity(&full[jt % NS], (jt / NS) & 1);
      release(jt);
      take_turn(jt);
      pass_turn();
      if constexpr (KeepRing) {
        hopper::mbarrier_wait_parity(&keep_full[jt % NK], (jt / NK) & 1);
        hopper::mbarrier_arrive(&keep_empty[jt % NK]);
      }
    }
  };
  if (NC > 1 && n_wg == 0) {  // a warpgroup whose rows are all past T: nothing to write either
    idle_from(0);
    return;
  }

  float alpha[2] = {1.f, 1.f};  // (each softmax sets it before a rescaling reads it)
  // O's rescaling by the last softmax's alpha, unless no row of the warp has a new maximum (every
  // alpha exactly 1, whose products would give O's own bits): a warp-wide vote, so that the branch
  // is uniform (not at HS 256, where with dropout the vote's registers spilled: ptxas, 28 bytes).
  // Where the products overlap the softmax it runs once the next tile's S is issued, under that
  // product (o is not among its registers), before the P V product that accumulates into o, as
  // FlashAttention-3 places it: off the chain between one tile's products and the next's. The
  // same multiplies between the same two products, so the same bits.
  auto rescale = [&] {
    if (HS > 128 || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) rescale_rows(o, alpha);
  };
  constexpr bool kOverlap = Tile::overlap(IsDropout);
  hopper::mbarrier_wait_parity(&full[0], 0);  // K_0, V_0 landed
  take_turn(0);
  hopper::wgmma_fence();
  issue_s(0);
  pass_turn();
  hopper::wgmma_wait_group<0>();
  softmax(0, alpha);
  if constexpr (!kOverlap) rescale();
  pack_a<Bc, false>(a, s, 0u);
  for (int jt = 1; jt < n_wg; ++jt) {
    if constexpr (kOverlap) {
      hopper::mbarrier_wait_parity(&full[jt % NS], (jt / NS) & 1);  // K_j, V_j landed
      take_turn(jt);
      hopper::wgmma_fence();  // a was written by ordinary code since the last wgmma
      issue_s(jt);
      rescale();  // by tile jt - 1's alpha, under S_ij's product
      hopper::wgmma_fence();  // o was rescaled by ordinary code
      issue_pv(jt - 1);
      pass_turn();
      hopper::wgmma_wait_group<1>();  // S_ij (committed first) is in s; P_{j-1} V_{j-1} may run on
      softmax(jt, alpha);
      hopper::wgmma_wait_group<0>();  // O += P_{j-1} V_{j-1} retired: a and o are free
    } else {
      hopper::wgmma_fence();
      issue_pv(jt - 1);
      hopper::wgmma_wait_group<0>();
      hopper::mbarrier_wait_parity(&full[jt % NS], (jt / NS) & 1);
      hopper::wgmma_fence();
      issue_s(jt);
      hopper::wgmma_wait_group<0>();
      softmax(jt, alpha);
    }
    release(jt - 1);
    if constexpr (!kOverlap) rescale();
    pack_a<Bc, false>(a, s, 0u);
  }
  if constexpr (kOverlap) rescale();  // by the last tile's alpha
  hopper::wgmma_fence();
  issue_pv(n_wg - 1);
  hopper::wgmma_wait_group<0>();
  release(n_wg - 1);
  idle_from(n_wg);
  // O_i = diag(l_i)^-1 O_i s, lse_i = m_i + log(l_i)
  // (b and h made here, from bh as a shuffle gives it, which ptxas cannot take from before the
  // loop: held across it, at HS 128 with dropout on key tiles of 128, they were spilled)
  const int bh_out = __shfl_sync(0xffffffffu, (int)bh, 0);
  write_out_lse(p, o, m, l, bh, bh_out / p.NH, bh_out % p.NH, i_g, lane);
}

// ---- the backward: the dK / dV and dQ kernels of kernels/flash_attn_bwd.cu (same algorithm,
// same tiles, same order of every sum over tiles) with their five products on wgmma. Each CTA is
// one warpgroup (its four warps own 16 rows each, as the mma.sync kernels' four warps do), so the
// masking, keep-bit and output helpers are theirs. Operands (all tiles swizzled as above):
//   dK / dV kernel (64 keys; Br queries a tile: 64, 32 for HS = 128 and 256; at 256 two CTAs
//   share a key tile, each owning 128 columns of dK and dV: N = Cols below):
//     S^T  = K Q^T      A = K (K-major), B = Q (K-major)          wgmma m64n{Br}k16 ss
//     dV  += Pd^T dO    A = P^T o M^T from registers, B = dO (MN-major)    m64n{Cols}k16 rs
//     dP^T = V dO^T     A = V (K-major), B = dO (K-major)          m64n{Br}k16 ss
//     dK  += dS^T Q     A = dS^T from registers, B = Q (MN-major)  m64n{Cols}k16 rs
//   dQ kernel (64 queries, 64 keys a tile):
//     S = Q K^T, dP = dO V^T (ss), dQ += dS K (rs, B = K MN-major).
// The masks: the dK / dV kernel's keep bits come from the shared tile make_mask_tile writes (one
// Philox call per 8 keys of a query, or the byte the forward stored in p.keep), the dQ kernel's
// from dropout_keep_bits (the same two sources), as in flash_attn_bwd.cu.

// acc (the warpgroup's 64 x N) = A B^T over HS: A the 64 rows of tile a (RA rows) from row0, B the
// N rows of tile b; both K-major. Issued and committed as one group; the caller fences before and
// waits after (the registers acc are the wgmmas' until their group retires).
template <int HS, int N, int RA, int RB>
__device__ __forceinline__ void wg_issue_ss(float (&acc)[N / 8][4], uint32_t a, int row0, uint32_t b) {
  float(&flat)[N / 2] = reinterpret_cast<float(&)[N / 2]>(acc);
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk)
    hopper::wgmma_bf16_ss<N, 0, 0>(flat, desc_kmajor<RA>(a, row0, kk), desc_kmajor<RB>(b, 0, kk), kk > 0);
  hopper::wgmma_commit_group();
}

// acc (64 x HS) += A B: A (64 x K) from the registers a, B the K rows x HS of tile b (K rows,
// MN-major), the k-steps of 16 in order, or last-first with Desc (dQ's sums over the keys).
// Issued and committed as one group, as wg_issue_ss (a too stays the wgmmas' until it retires).
template <int K, int HS, bool Desc = false>
__device__ __forceinline__ void wg_issue_rs(float (&acc)[HS / 8][4], const uint32_t (&a)[K / 16][4], uint32_t b) {
  float(&flat)[HS / 2] = reinterpret_cast<float(&)[HS / 2]>(acc);
#pragma unroll
  for (int step = 0; step < K / 16; ++step) {
    const int kk = Desc ? K / 16 - 1 - step : step;
    hopper::wgmma_bf16_rs<HS, 1>(flat, a[kk], desc_mnmajor<K>(b, kk), true);
  }
  hopper::wgmma_commit_group();
}

// The backward's tiles issue their four or three products so that the CUDA cores' work overlaps
// the tensor cores' (as the forward's loop does): the two products over the shared tiles (S and
// dP) are issued together, P is made while the second runs, and in the dK / dV kernel dS while
// dV's product runs. Each accumulator gets the same products in the same order as when each was
// waited for: the same bits. Not at HS 256, whose dK / dV kernel has 246-248 registers: the P
// fragments kept for dV's product while dS's are made would not fit.
template <int HS>
__host__ __device__ constexpr bool bwd_overlap() { return HS <= 128; }

// The first products of a backward tile: s = A_s B_s^T and, overlapped (else the caller issues it
// later), dp = A_dp B_dp^T, one group each; both K-major over HS, A of RA rows (the warpgroup's 64
// from the tile's first), B of N. The dK / dV kernels' S^T = K_j Q_i^T and dPd^T = V_j dO_i^T, the
// dQ kernels' S = Q_i K_j^T and dPd = dO_i V_j^T.
template <int HS, int N, int RA>
__device__ __forceinline__ void bwd_issue_sdp(float (&s)[N / 8][4], float (&dp)[N / 8][4], uint32_t a_s, uint32_t a_dp,
                                              uint32_t b_s, uint32_t b_dp) {
  hopper::wgmma_fence();
  wg_issue_ss<HS, N, RA, N>(s, a_s, 0, b_s);
  if constexpr (bwd_overlap<HS>()) wg_issue_ss<HS, N, RA, N>(dp, a_dp, 0, b_dp);
}

// The dQ terms of one (query tile, key tile) in the dK / dV kernel that computes dQ too
// (the CTA's Cols columns of dQ): dQ_i's fp32 sums so far come in at sums ([Br][Cols + 4] in
// shared memory, landed by cp.async; not read for the query tile's first key tile, the diagonal
// one, whose sums start at zero), get dS_ij K_j added by wgmma, and go out, rows below n_rows: to
// out (row i0 of the head's (T, HS) sums in global memory, at the CTA's first column), or from the
// query tile's last key tile (key tile 0) to dqkv (row i0, the CTA's first Q column; row stride
// ld) as dQ_i / sqrt(HS), as add_to_dqkv adds the dQ kernel's.
struct FusedDq {
  uint32_t tS;        // dS_ij (queries x keys): the B tile of dQ_i^T's product, [Br][Bc] (shared)
  uint32_t tK;        // K_j's column block of the CTA's first column (shared)
  const float* sums;  // the sums so far (shared)
  float* out;         // (global)
  bf16* dqkv;         // (global)
  long long ld;
  float scale;        // 1 / sqrt(HS)
  int n_rows;         // the tile's rows before T
  bool first, last;   // the query tile's first key tile (its diagonal one); its last (key tile 0)
};

// floats a row of the dQ sums in shared memory: rows 2 apart are 8 banks apart, so that a warp's
// loads of its accumulators' elements (for_each_dqt) are free of conflicts
__host__ __device__ constexpr int dq_sum_stride(int HS) { return HS + 4; }

// f(v, hs, q) for each of the lane's accumulators v of dQ_i^T (the CTA's Cols columns of dQ by Br,
// as Cols / 64 wgmma slabs of 64 rows, columns the tile's queries): column hs of dQ_i (from the
// CTA's first), row q of the tile
template <int Cols, int Br, typename F>
__device__ __forceinline__ void for_each_dqt(float (&dqt)[Cols / 64][Br / 8][4], int warp, int lane, F&& f) {
#pragma unroll
  for (int sl = 0; sl < Cols / 64; ++sl)
#pragma unroll
    for (int nt = 0; nt < Br / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        f(dqt[sl][nt][e], 64 * sl + 16 * warp + 8 * (e / 2) + lane / 4, 8 * nt + 2 * (lane % 4) + e % 2);
}

// One query tile of the dK / dV kernels: dK_j, dV_j (the warpgroup's 64 keys, from jw0 - 16 warp;
// the CTA's Cols columns, col_off bytes into the MN-major tiles) += dS^T Q_i, Pd^T dO_i, with
// K_j, V_j at aK, aV, Q_i, dO_i (queries i0 .. i0+Br-1) at tQ, tdO, their lse_i log2(e) and D_i at
// sLi, sDi, and the keep bytes at sM ([Bc / 8][MS], make_mask_tile's; read with dropout only).
// Fuse: and dQ_i's sums += dS_ij K_j as fq says, in the same order of products as the dQ kernel's
// register sums (the same bits); only in a kernel whose block is the one warpgroup (it
// synchronises the block). KR: the rows of the K_j, V_j tiles aK and aV point into (the
// warpgroup's 64 rows start at aK, aV; KR = 128 where two warpgroups share a tile of 128 keys).
//
// In parts: bwd_issue_sdp issues S^T (and, overlapped, dP^T), dkdv_products waits for them and issues
// dV's and dK's products (and with Fuse stores dS); dkdv_tile calls the two and waits for every
// product of the tile before it returns. The default kernel at HS <= 128 (flash_bwd_dkdv_hopper_kernel,
// kPipe) and the warp-specialized one there call the parts themselves, so that the next query tile's
// S^T and dP^T run while this one's dV and dK do.
// The groups pending on entry: bwd_issue_sdp's (one or two) and nothing after them; on return dV's and
// dK's (with Fuse: and dS_ij stored to fq.tS).
template <int HS, int Br, int Bc, int MS, int Cols, bool IsDropout, bool Fuse = false, int KR = Bc>
__device__ __forceinline__ void dkdv_products(float (&dk)[Cols / 8][4], float (&dv)[Cols / 8][4],
                                              float (&st)[Br / 8][4], float (&dpt)[Br / 8][4], int Tn, bool causal,
                                              float scale_log2, float dropout_scale, uint32_t aV, uint32_t tQ,
                                              uint32_t tdO, uint32_t col_off, const float* sLi, const float* sDi,
                                              const uint8_t* sM, int i0, int jw0, int k_g, int warp, int lane,
                                              const FusedDq& fq) {
  constexpr bool Ov = bwd_overlap<HS>();
  const int t = lane % 4;
  hopper::wgmma_wait_group<Ov ? 1 : 0>();  // S^T is in st (groups retire in order)
  // S^T masked; P_ij^T = exp(S_ij^T - lse_i) (lse of the column's query)
  if (i0 + Br > Tn || (causal && i0 < jw0 + 15)) mask_scores_t<Br / 8>(st, k_g, i0 + 2 * t, Tn, causal);
  probs_key_major(st, sLi, scale_log2, t);
  // dV_j += (P_ij o M_ij)^T dO_i   (the scale s is applied once, at the end)
  const uint32_t bits = IsDropout ? keep_bits_from_tile<Br / 8, MS>(sM, warp, lane) : ~0u;
  uint32_t pa[Br / 16][4];
  pack_a<Br, IsDropout>(pa, st, bits);
  hopper::wgmma_fence();  // pa written by ordinary code
  wg_issue_rs<Br, Cols>(dv, pa, tdO + col_off);
  if constexpr (!Ov) {
    hopper::wgmma_wait_group<0>();
    hopper::wgmma_fence();
    wg_issue_ss<HS, Br, KR, Br>(dpt, aV, 0, tdO);
  }
  hopper::wgmma_wait_group<Ov ? 1 : 0>();  // dPd^T is in dpt (dV's product may still run)
  // dP = dPd o M s, dS_ij^T = P_ij^T o (dP_ij^T - D_i), in place in dpt
  dscores_key_major<Br / 8, IsDropout>(dpt, st, sDi, bits, dropout_scale, t);
  // dK_j += dS_ij^T Q_i   (the 1/sqrt(HS) is applied once, at the end)
  uint32_t da[Br / 16][4];
  pack_a<Br, false>(da, dpt, 0u);
  if constexpr (Fuse) {
    // dS_ij into fq.tS before dK's product takes da: each 16 x 16 block of dS_ij^T's A fragments
    // as four 8 x 8 matrices stored transposed (lanes 8m .. 8m+7 address the rows of matrix m:
    // queries 16 kk + 8 (m / 2) + lane % 8, keys from 16 warp + 8 (m % 2), one 16-byte chunk)
    const int m = lane / 8;
#pragma unroll
    for (int kk = 0; kk < Br / 16; ++kk)
      hopper::stmatrix_x4_trans(fq.tS + sw128_offset(Br, 16 * kk + 8 * (m / 2) + lane % 8, 2 * warp + m % 2), da[kk]);
    hopper::fence_proxy_async();  // for the async proxy, which reads it as an operand
  }
  hopper::wgmma_fence();
  wg_issue_rs<Br, Cols>(dk, da, tQ + col_off);
}
template <int HS, int Br, int Bc, int MS, int Cols, bool IsDropout, bool Fuse = false, int KR = Bc>
__device__ __forceinline__ void dkdv_tile(float (&dk)[Cols / 8][4], float (&dv)[Cols / 8][4], int Tn, bool causal,
                                          float scale_log2, float dropout_scale, uint32_t aK, uint32_t aV,
                                          uint32_t tQ, uint32_t tdO, uint32_t col_off, const float* sLi, const float* sDi, const uint8_t* sM,
                                          int i0, int jw0, int k_g, int warp, int lane, const FusedDq& fq = {}) {
  float st[Br / 8][4], dpt[Br / 8][4];
  bwd_issue_sdp<HS, Br, KR>(st, dpt, aK, aV, tQ, tdO);
  dkdv_products<HS, Br, Bc, MS, Cols, IsDropout, Fuse, KR>(dk, dv, st, dpt, Tn, causal, scale_log2, dropout_scale, aV, tQ, tdO,
                                                           col_off, sLi, sDi, sM, i0, jw0, k_g, warp, lane, fq);
  if constexpr (Fuse) {
    // dQ_i^T (the Cols columns by Br, 64 a slab) += K_j^T dS_ij^T: A = K_j MN-major, B = dS_ij K-major
    cp_async_wait<0>();  // this thread's copies of the sums landed
    __syncthreads();     // and every thread's, and every warp's part of dS_ij
    const int g = lane / 4, t = lane % 4;
    float dqt[Cols / 64][Br / 8][4];
    for_each_dqt<Cols, Br>(dqt, warp, lane, [&](float& v, int hs, int q) {
      v = fq.first ? 0.f : fq.sums[q * dq_sum_stride(Cols) + hs];
    });
    hopper::wgmma_fence();  // dqt written by ordinary code
#pragma unroll
    for (int sl = 0; sl < Cols / 64; ++sl) {
      float(&flat)[Br / 2] = reinterpret_cast<float(&)[Br / 2]>(dqt[sl]);
#pragma unroll
      for (int kk = Bc / 16 - 1; kk >= 0; --kk)  // the keys last-first, as the dQ kernel's
        hopper::wgmma_bf16_ss<Br, 1, 0>(flat, desc_mnmajor<Bc>(fq.tK + (uint32_t)(sl * Bc * 128), kk),
                                        desc_kmajor<Br>(fq.tS, 0, kk), true);
    }
    hopper::wgmma_commit_group();
    hopper::wgmma_wait_group<0>();  // dV's, dK's and dQ's products retired: the tiles are free
    if (fq.last) {
      // dqkv += dQ_i / sqrt(HS) as bf16 pairs of adjacent columns: the lane holds rows q, q + 1
      // of column hs, and the lane of group g ^ 1 those of hs ^ 1, so the two swap one each
      const bool odd = g % 2;
#pragma unroll
      for (int sl = 0; sl < Cols / 64; ++sl)
#pragma unroll
        for (int nt = 0; nt < Br / 8; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float a0 = dqt[sl][nt][2 * h], a1 = dqt[sl][nt][2 * h + 1];  // (q, hs), (q + 1, hs)
            const float other = __shfl_xor_sync(0xffffffffu, odd ? a0 : a1, 4);
            const int hs = 64 * sl + 16 * warp + 8 * h + g - (odd ? 1 : 0), q = 8 * nt + 2 * t + (odd ? 1 : 0);
            if (q < fq.n_rows) add_scaled_pair(fq.dqkv + q * fq.ld + hs, fq.scale, odd ? other : a0, odd ? a1 : other);
          }
    } else {
      for_each_dqt<Cols, Br>(dqt, warp, lane, [&](float& v, int hs, int q) {
        if (q < fq.n_rows) fq.out[(long long)q * HS + hs] = v;
      });
    }
  } else {
    hopper::wgmma_wait_group<0>();  // dV's and dK's products retired: the tiles are free
  }
}

template <int HS>
struct HopperDkvTile {
  static constexpr int kThreads = 128;  // one warpgroup
  static constexpr int kBc = 64;
  static constexpr int kBr = HS >= 128 ? 32 : 64;
  // the columns of dK_j, dV_j a CTA owns: at HS = 256 two CTAs (grid z) share a key tile, as in
  // kernels/flash_attn_bwd.cu's DkvTile (S^T and dP^T over all 256 columns in each)
  static constexpr int kCols = HS > 128 ? 128 : HS;
  static constexpr int kSplits = HS / kCols;
  static constexpr int kMaskStride = kBr;  // the keep bytes' rows: one a group of 8 keys
  static constexpr int kMaskBytes = kBc / 8 * kMaskStride;
  static constexpr int kKVBytes = kBc * HS * 2, kQBytes = kBr * HS * 2;
  // The cp.async kernel's shared memory: K_j, V_j; Stages stages of Q_i, dO_i and of their lse_i,
  // D_i; MaskBufs tiles of keep bytes. Pipelined (HS <= 128, the next query tile's S^T and dP^T
  // issued before this one's dV and dK retire): three stages and two keep tiles, so that the
  // copies of tile i + 2 land in the stage that tile i - 1's products have left; else two and one.
  static constexpr bool kPipe = bwd_overlap<HS>();
  static constexpr int kStages = kPipe ? 3 : 2, kMaskBufs = kPipe ? 2 : 1;
  __host__ __device__ static constexpr size_t tiles_bytes(int stages, int mask_bufs) {
    return 2 * (size_t)kKVBytes + 2 * (size_t)stages * kQBytes + 2 * (size_t)stages * kBr * sizeof(float) +
           (size_t)mask_bufs * kMaskBytes;
  }
  static constexpr size_t kSmemBytes = 1024 + tiles_bytes(kStages, kMaskBufs);
  // The cp.async kernel computes dQ too (FusedDq), the CTA's Cols columns of it: each query
  // tile's dQ sums pass from key tile to key tile through global memory, the key tiles last-first
  // (flags, one a query tile and column split), so that no second kernel recomputes S and dP. Two
  // stages and one keep tile (not pipelined), then these:
  static constexpr int kSumStride = dq_sum_stride(kCols);
  static constexpr int kSBytes = kBr * kBc * 2, kSumBytes = kBr * kSumStride * 4;
  static constexpr size_t kSOffset = (tiles_bytes(2, 1) + 1023) / 1024 * 1024;  // dS_ij's tile, 1024-aligned
  static constexpr size_t kSmemBytesFused = 1024 + kSOffset + kSBytes + kSumBytes;
  static_assert(kSmemBytesFused <= 227 * 1024, "the fused dK / dV kernel's tiles exceed 227 KB");
  // The warp-specialized kernel: two consumer warpgroups, each with 64 keys of a key tile of 128
  // (kBcWs), sharing its Q_i, dO_i stages, and a producer warpgroup (one warp of it works: a whole
  // warpgroup so that setmaxnreg can move its registers to the consumers, as in the forward); three
  // stages (two at HS 256, whose K and V take 128 KB)
  static constexpr int kConsumersWs = 2;
  static constexpr int kThreadsWs = 128 * kConsumersWs + 128;
  static constexpr int kBcWs = kBc * kConsumersWs;
  static constexpr int kStagesWs = HS > 128 ? 2 : 3;
  static constexpr int kKVBytesWs = kBcWs * HS * 2;
  static constexpr size_t kSmemBytesWs = 1024 + 2 * (size_t)kKVBytesWs + 2 * (size_t)kStagesWs * kQBytes +
                                         2 * (size_t)kStagesWs * kBr * sizeof(float) +
                                         (size_t)(kBcWs / 8) * kMaskStride;
  static_assert(kSmemBytesWs <= 227 * 1024, "the warp-specialized dK / dV kernel's tiles exceed 227 KB");
};

// grid (B*NH, ceil(T / Bc), kSplits).
// Fuse: and dQ, the CTA's Cols columns of it; grid (ceil(T / Bc), B*NH, kSplits), key tiles
// last-first. Query tile i's sums get key tile j's terms from the CTA (j, bh, z) in the order
// j = d, d - 1, .. 0 from its diagonal key tile d = i Br / Bc: CTA j waits until
// p.dq_flags[bh][z][i] = d - j (zeroed before the launch), adds its terms to the sums in p.dq_sums
// (starting them, for j = d) and stores d - j + 1. The sums are the dQ kernel's: the same products
// in the same order. Thread 0 reads the next query tile's flag while the step's stores drain, so
// that one fence a step both releases and acquires. CTA j waits only on the CTA of key tile j + 1
// of its head, of lower linear index, which the hardware starts first (what the waits cost: the
// header comment).
// Pipe: pipelined where Tile::kPipe (the next query tile's S^T and dP^T issued before this one's dV
// and dK have retired); never with dQ inside, whose step ends in a wait for the sums' product.
// (flash_bwd_dkdv_hopper_kernel below, and its twin that is not pipelined.)
template <int HS, bool IsDropout, bool Fuse, bool Pipe>
__device__ __forceinline__ void dkdv_kernel(const BwdParams<bf16>& p) {
  using Tile = HopperDkvTile<HS>;
  constexpr int Br = Tile::kBr, Bc = Tile::kBc, MS = Tile::kMaskStride, NThreads = Tile::kThreads, Cols = Tile::kCols;
  static_assert(!(Fuse && Pipe), "dQ inside is not pipelined");
  constexpr bool kPipe = Tile::kPipe && Pipe;
  constexpr int NS = kPipe ? Tile::kStages : 2;
  unsigned char* const raw = dynamic_smem<unsigned char>();
  unsigned char* const sK = align_1024(raw);  // K_j  [Bc][HS]
  unsigned char* const sV = sK + Tile::kKVBytes;                                  // V_j  [Bc][HS]
  unsigned char* const sQ = sV + Tile::kKVBytes;                                  // Q_i  [NS][Br][HS]
  unsigned char* const sdO = sQ + NS * Tile::kQBytes;                             // dO_i [NS][Br][HS]
  float* sL = reinterpret_cast<float*>(sdO + NS * Tile::kQBytes);  // lse_i log2(e) [NS][Br]
  float* sD = sL + NS * Br;                                         // D_i [NS][Br]
  uint8_t* sM = reinterpret_cast<uint8_t*>(sD + NS * Br);           // keep bytes [kPipe ? 2 : 1][Bc / 8][MS]
  // with Fuse, after the others: dS_ij [Br][Bc] (1024-aligned) and dQ_i's sums [Br][kSumStride]
  unsigned char* const sS = sK + Tile::kSOffset;
  float* const sSum = reinterpret_cast<float*>(sS + Tile::kSBytes);
  const uint32_t aK = smem_u32(sK), aV = smem_u32(sV), aQ = smem_u32(sQ), adO = smem_u32(sdO);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4;
  // Fuse: grid (ceil(T / Bc), B*NH, kSplits), a head's key tiles last-first
  const uint32_t bh = Fuse ? blockIdx.y : blockIdx.x;
  const int b = (int)bh / p.NH, h = (int)bh % p.NH;
  const int jt = Fuse ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.y;
  const int j0 = jt * Bc;          // first key of K_j
  const int jw0 = j0 + 16 * warp;  // first key of this warp
  const int k_g = jw0 + g;         // key of this lane's elements 0, 1 (2, 3: +8)
  const int c0 = Tile::kSplits > 1 ? (int)blockIdx.z * Cols : 0;  // first column of dK_j, dV_j owned
  // a tile's columns c0 .. c0+Cols-1 start c0 / 64 column blocks of Br rows into it (the
  // MN-major operands dO_i and Q_i of dV and dK)
  const uint32_t col_off = (uint32_t)(c0 / 64) * Br * 128;
  const long long qkv_b = (long long)b * p.T * p.ld_qkv;
  const bf16* Q = p.qkv + qkv_b + (long long)h * HS;
  const bf16* K = Q + p.C;
  const bf16* V = Q + 2LL * p.C;
  const bf16* dO = p.dout + (long long)b * p.T * p.ld_out + (long long)h * HS;
  const float* lse = p.lse + (long long)bh * p.T;
  const float* Dg = p.D + (long long)bh * p.T;

  // causal: query tiles that end before j0 see only keys after their queries (with dQ inside,
  // always: run_bwd_hopper runs it for causal attention alone, its order of the sums being the
  // causal mask's, and the constant keeps its HS 256 form from spilling, as a run-time flag did)
  const bool causal = Fuse || p.causal;
  const int it0 = causal ? j0 / Br : 0;
  const int n_it = (p.T + Br - 1) / Br;

  // a query tile's stage: Q_i, dO_i copied (its lse_i, D_i: the caller's, row_stats)
  static_assert(Br <= NThreads, "a query's lse and D a thread");
  auto load_q_tile = [&](int it, int stage) {
    load_tile_sw128<Br, HS, NThreads>(sQ + stage * Tile::kQBytes, Q, p.ld_qkv, it * Br, p.T);
    load_tile_sw128<Br, HS, NThreads>(sdO + stage * Tile::kQBytes, dO, p.ld_out, it * Br, p.T);
  };
  load_tile_sw128<Bc, HS, NThreads>(sK, K, p.ld_qkv, j0, p.T);
  load_tile_sw128<Bc, HS, NThreads>(sV, V, p.ld_qkv, j0, p.T);
  load_q_tile(it0, 0);
  load_row_stats<Br, NThreads>(sL, sD, lse, Dg, it0 * Br, p.T, (int)threadIdx.x);
  cp_async_commit();

  int* const flags = Fuse ? p.dq_flags + ((long long)bh * Tile::kSplits + (c0 / Cols)) * n_it : nullptr;
  float* const sums = Fuse ? p.dq_sums + (long long)bh * p.T * HS + c0 : nullptr;  // the CTA's first column

  // Fuse: the key tiles before this one in query tile it's order: those from its diagonal one
  // (the first, holding the keys of its queries) down to this one, jt; the CTA's first Bc / Br
  // query tiles are its diagonal ones, so the loop starts without a wait
  auto tiles_before = [&](int it) { return it * Br / Bc - jt; };

  float dk[Cols / 8][4], dv[Cols / 8][4];
  zero(dk);
  zero(dv);
  // the keep bytes of the next query tile, fetched a step ahead (their global loads, or Philox
  // calls, under this step's products) and stored once the step's last barrier has freed sM; not
  // with dQ inside at HS 256, whose 255 registers spilled the bytes kept
  constexpr bool kFetchAhead = IsDropout && !(Fuse && HS > 128);
  MaskTileBytes<Br, Bc, NThreads> mask_next;
  if constexpr (kFetchAhead) fetch_mask_tile(mask_next, p.key, bh, it0 * Br, j0, (int)threadIdx.x, p.keep, p.T);
  if constexpr (kPipe) {
    // Step n (query tile it = it0 + n, stage n % 3, keep tile n % 2) finds its S^T and dP^T issued
    // and issues its dV and dK; then, past the barrier that makes tile it + 1's copies, lse, D and
    // keep bytes visible, it issues tile it + 1's S^T and dP^T, starts tile it + 2's copies into
    // stage (n + 2) % 3 (tile it - 1's, whose products retired before that barrier), and waits for
    // its own dV and dK (wait_group 2: the groups retire in order). Tile it + 1's lse, D and keep
    // bytes come into registers with the copies, and go to shared memory before that barrier: the
    // stage and keep tile they overwrite were last read in step n - 2 and n - 1, before the barrier
    // of step n - 1. The products and their order are dkdv_tile's: the same bits.
    const int tid = (int)threadIdx.x;
    RowStats stats_next{};
    const bool second = it0 + 1 < n_it;
    if (second) {
      load_q_tile(it0 + 1, 1);
      stats_next = fetch_row_stats<Br>(lse, Dg, (it0 + 1) * Br, p.T, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    if constexpr (IsDropout) store_mask_tile<Br, Bc, MS, NThreads>(sM, mask_next, tid);
    hopper::fence_proxy_async();
    __syncthreads();  // K_j, V_j, the first stage and its keep bytes visible to every warp
    float st[Br / 8][4], dpt[Br / 8][4];
    bwd_issue_sdp<HS, Br, Bc>(st, dpt, aK, aV, aQ, adO);
    if constexpr (IsDropout)
      if (second) fetch_mask_tile(mask_next, p.key, bh, (it0 + 1) * Br, j0, tid, p.keep, p.T);
    for (int it = it0;; ++it) {  // (it0 < n_it: every key tile has its diagonal query tile)
      const int n = it - it0, i0 = it * Br, stage = n % 3;
      dkdv_products<HS, Br, Bc, MS, Cols, IsDropout>(dk, dv, st, dpt, p.T, causal, p.scale_log2, p.dropout_scale, aV,
                                                     aQ + stage * Tile::kQBytes, adO + stage * Tile::kQBytes, col_off,
                                                     sL + stage * Br, sD + stage * Br, sM + (n % 2) * Tile::kMaskBytes,
                                                     i0, jw0, k_g, warp, lane, FusedDq{});
      if (it + 1 == n_it) {
        hopper::wgmma_wait_group<0>();
        break;
      }
      const int next = (n + 1) % 3;
      cp_async_wait<0>();  // this thread's copies of tile it + 1 landed
      store_row_stats<Br>(sL + next * Br, sD + next * Br, stats_next, i0 + Br, p.T, tid);
      if constexpr (IsDropout) store_mask_tile<Br, Bc, MS, NThreads>(sM + ((n + 1) % 2) * Tile::kMaskBytes, mask_next, tid);
      hopper::fence_proxy_async();
      __syncthreads();  // every thread's: tile it + 1 visible to every warp; tile it - 1's products retired
      bwd_issue_sdp<HS, Br, Bc>(st, dpt, aK, aV, aQ + next * Tile::kQBytes, adO + next * Tile::kQBytes);
      if (it + 2 < n_it) {
        load_q_tile(it + 2, (n + 2) % 3);
        stats_next = fetch_row_stats<Br>(lse, Dg, i0 + 2 * Br, p.T, tid);
        cp_async_commit();
        if constexpr (IsDropout) fetch_mask_tile(mask_next, p.key, bh, i0 + 2 * Br, j0, tid, p.keep, p.T);
      }
      hopper::wgmma_wait_group<2>();  // this tile's dV and dK retired (tile it + 1's S^T, dP^T may run)
    }
  } else {
    constexpr bool kStatsLate = HS <= 128;
    for (int it = it0; it < n_it; ++it) {
      const int i0 = it * Br, stage = (it - it0) % 2;
      const RowStats stats_next =
          dkdv_step_start<Br, Bc, MS, NThreads, IsDropout, kFetchAhead, kStatsLate>(
              load_q_tile, it, n_it, stage, sL, sD, lse, Dg, sM, mask_next, p.key, bh, j0, p.keep, p.T);
      hopper::fence_proxy_async();
      __syncthreads();  // K_j, V_j, this stage and the keep bits visible to every warp
      FusedDq fq{};
      if constexpr (Fuse) {
        // the sums so far (rows past T zeros), landing while S and dP are made
        constexpr int kRowChunks = Cols / 4;  // 16-byte chunks of the CTA's part of a row of fp32 sums
        if (tiles_before(it) > 0) {
#pragma unroll
          for (int c = (int)threadIdx.x; c < Br * kRowChunks; c += NThreads) {
            const int r = c / kRowChunks, k = c % kRowChunks;
            const bool valid = i0 + r < p.T;
            cp_async_16(sSum + r * Tile::kSumStride + 4 * k, sums + (long long)(valid ? i0 + r : 0) * HS + 4 * k, valid);
          }
          cp_async_commit();
        }
        fq = FusedDq{smem_u32(sS),
                     aK + (uint32_t)(c0 / 64) * Bc * 128,
                     sSum,
                     sums + (long long)i0 * HS,
                     p.dqkv + qkv_b + (long long)i0 * p.ld_qkv + h * HS + c0,
                     p.ld_qkv,
                     p.scale,
                     min(Br, p.T - i0),
                     tiles_before(it) == 0,
                     jt == 0};
      }
      dkdv_tile<HS, Br, Bc, MS, Cols, IsDropout, Fuse>(dk, dv, p.T, causal, p.scale_log2, p.dropout_scale, aK, aV,
                                                       aQ + stage * Tile::kQBytes, adO + stage * Tile::kQBytes, col_off,
                                                       sL + stage * Br, sD + stage * Br, sM, i0, jw0, k_g, warp, lane, fq);
      // (the next stage was last read in the step before, behind its closing barrier)
      if (kStatsLate && it + 1 < n_it)
        store_row_stats<Br>(sL + (1 - stage) * Br, sD + (1 - stage) * Br, stats_next, i0 + Br, p.T, (int)threadIdx.x);
      if constexpr (Fuse) {
        // thread 0 reads the next query tile's flag while the block's stores of this one's sums
        // drain; after the __syncthreads, one fence releases this tile's sums and, where the read saw
        // the value awaited, acquires the next one's (else it waits); the next step's first
        // __syncthreads passes the acquire on to the block. Key tile 0 is every query tile's last.
        const bool next = it + 1 < n_it && tiles_before(it + 1) > 0;
        const int seen = next && threadIdx.x == 0 ? hopper::flag_peek(flags + it + 1) : 0;
        __syncthreads();  // every warp is done with this stage and the keep bits, and its stores of the sums
        if (threadIdx.x == 0 && (jt > 0 || next)) {
          hopper::flag_handover(jt > 0 ? flags + it : nullptr, tiles_before(it) + 1, next ? flags + it + 1 : nullptr);
          if (next && seen != tiles_before(it + 1)) hopper::flag_wait(flags + it + 1, tiles_before(it + 1));
        }
      } else {
        __syncthreads();  // every warp is done with this stage and the keep bits
      }
    }
  }
  // dqkv[K_j] += dK_j / sqrt(HS), dqkv[V_j] += dV_j s
  bf16* dqkv_b = p.dqkv + qkv_b;
  add_to_dqkv(dqkv_b, p.ld_qkv, (long long)p.C + (long long)h * HS + c0, dk, p.scale, k_g, p.T, lane);
  add_to_dqkv(dqkv_b, p.ld_qkv, 2LL * p.C + (long long)h * HS + c0, dv, p.dropout_scale, k_g, p.T, lane);
}
template <int HS, bool IsDropout, bool Fuse>
__global__ void __launch_bounds__(HopperDkvTile<HS>::kThreads, 1) flash_bwd_dkdv_hopper_kernel(const BwdParams<bf16> p) {
  dkdv_kernel<HS, IsDropout, Fuse, !Fuse>(p);
}
// The default's twin with each query tile's products retired before the next tile's are issued
// (TG_FLASH_HOPPER=5, kept to time the pipelining beside it; HS 64 and 128, where it differs).
template <int HS, bool IsDropout>
__global__ void __launch_bounds__(HopperDkvTile<HS>::kThreads, 1) flash_bwd_dkdv_hopper_seq_kernel(const BwdParams<bf16> p) {
  dkdv_kernel<HS, IsDropout, false, false>(p);
}

// The dK / dV kernel warp-specialized: two consumer warpgroups (dkdv_tile; at HS 64 and 128 its
// parts, pipelined as the cp.async kernel's: the next query tile's S^T and dP^T issued before this
// one's dV and dK retire), each with 64 keys of the CTA's key tile of 128, and a producer warp. The
// producer's elected lane loads K_j, V_j once and streams Q_i, dO_i through a ring of kStagesWs
// stages with TMA (boxes of 64 columns by Br rows over qkv and dout); its 32 lanes write the
// stage's lse_i log2(e) and D_i into shared memory and each arrives on the stage's "full" mbarrier
// (the elected lane's arrival is the expect_tx one), so that the consumers see them with the boxes.
// Both warpgroups read each stage (one load of Q_i, dO_i for 128 keys), and nothing but the ring
// ties them: no block barrier. Each consumer warp makes the keep bits of its own 16 keys (a
// warp-local make_mask_tile), and each consumer thread arrives on "empty" when done with the stage
// (also for a query tile wholly before its warpgroup's keys, which it skips once the stage has
// landed, so that no arrival counts towards an earlier phase). Each warpgroup's sums over the query
// tiles are those of the one-warpgroup kernels for its 64 keys, in the same order: the same bits.
// Rows past the end of a batch's sequence read the next sequence's rows (zeros past the tensor):
// their queries have lse = +inf, so P = dS = 0 there. The producer warp is the first of a warpgroup
// whose registers setmaxnreg gives to the consumers (24 and 240 a thread, as the forward's): ptxas
// gives a block of 384 threads 168, where the consumers spilled. One CTA an SM of 8 consumer warps,
// as two CTAs of the cp.async kernel. Chosen by TG_FLASH_HOPPER=2.
// grid (B*NH, ceil(T / kBcWs), kSplits).
template <int HS, bool IsDropout>
__global__ void __launch_bounds__(HopperDkvTile<HS>::kThreadsWs, 1)
    flash_bwd_dkdv_hopper_ws_kernel(const BwdParams<bf16> p, const __grid_constant__ CUtensorMap qkv_map,
                                    const __grid_constant__ CUtensorMap dout_map) {
  using Tile = HopperDkvTile<HS>;
  constexpr int Br = Tile::kBr, Bc = Tile::kBc, BcW = Tile::kBcWs, MS = Tile::kMaskStride, Cols = Tile::kCols;
  constexpr int NS = Tile::kStagesWs, Blocks = HS / 64, NC = 128 * Tile::kConsumersWs;
  __shared__ uint64_t bar_kv, full[NS], empty[NS];
  unsigned char* const raw = dynamic_smem<unsigned char>();
  unsigned char* const sK = align_1024(raw);              // K_j  [BcW][HS]
  unsigned char* const sV = sK + Tile::kKVBytesWs;        // V_j  [BcW][HS]
  unsigned char* const sQ = sV + Tile::kKVBytesWs;        // Q_i  [NS][Br][HS]
  unsigned char* const sdO = sQ + NS * Tile::kQBytes;     // dO_i [NS][Br][HS]
  float* sL = reinterpret_cast<float*>(sdO + NS * Tile::kQBytes);  // lse_i log2(e) [NS][Br]
  float* sD = sL + NS * Br;                                          // D_i [NS][Br]
  uint8_t* sM = reinterpret_cast<uint8_t*>(sD + NS * Br);            // keep bytes [BcW / 8][MS]
  const uint32_t aK = smem_u32(sK), aV = smem_u32(sV), aQ = smem_u32(sQ), adO = smem_u32(sdO);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t bh = blockIdx.x;
  const int b = (int)bh / p.NH, h = (int)bh % p.NH;
  const int j0 = blockIdx.y * BcW;
  const int c0 = Tile::kSplits > 1 ? (int)blockIdx.z * Cols : 0;
  const int it0 = p.causal ? j0 / Br : 0, n_it = (p.T + Br - 1) / Br;

  // full: the producer warp's lanes (one with expect_tx); empty: every consumer thread
  init_ring(&bar_kv, full, 32, empty, NC);

  if (warp >= NC / 32) {  // the producer warpgroup: its first warp
    hopper::setmaxnreg_dec<kFwdProducerRegs>();
    if (warp > NC / 32) return;
    const int row0 = b * p.T;  // row of (b, 0) in the (B T, 3C) and (B T, C) tensors
    if (lane == 0) {
      hopper::mbarrier_arrive_expect_tx(&bar_kv, 2 * Tile::kKVBytesWs);
      for (int blk = 0; blk < Blocks; ++blk)
        for (int piece = 0; piece < BcW / Br; ++piece) {
          const int off = blk * BcW * 128 + piece * Br * 128, row = row0 + j0 + piece * Br;
          hopper::tma_load_2d(sK + off, &qkv_map, p.C + h * HS + 64 * blk, row, &bar_kv);
          hopper::tma_load_2d(sV + off, &qkv_map, 2 * p.C + h * HS + 64 * blk, row, &bar_kv);
        }
    }
    const float* lse = p.lse + (long long)bh * p.T;
    const float* Dg = p.D + (long long)bh * p.T;
    for (int it = it0; it < n_it; ++it) {
      const int i0 = it * Br, st = (it - it0) % NS, use = (it - it0) / NS;
      if (use > 0) hopper::mbarrier_wait_parity(&empty[st], (use - 1) & 1);  // the consumers released it
      for (int r = lane; r < Br; r += 32) {
        const int i = i0 + r;
        sL[st * Br + r] = i < p.T ? lse[i] * kLog2e : INFINITY;
        sD[st * Br + r] = i < p.T ? Dg[i] : 0.f;
      }
      if (lane == 0) {
        hopper::mbarrier_arrive_expect_tx(&full[st], 2 * Tile::kQBytes);
        for (int blk = 0; blk < Blocks; ++blk) {
          hopper::tma_load_2d(sQ + st * Tile::kQBytes + blk * Br * 128, &qkv_map, h * HS + 64 * blk, row0 + i0,
                              &full[st]);
          hopper::tma_load_2d(sdO + st * Tile::kQBytes + blk * Br * 128, &dout_map, h * HS + 64 * blk, row0 + i0,
                              &full[st]);
        }
      } else {
        hopper::mbarrier_arrive(&full[st]);
      }
    }
    return;
  }

  // a consumer warpgroup: keys j0 + 64 wg .. (its rows of K_j and V_j), from the query tile that
  // holds its first key (causal: the earlier ones see none of its keys)
  hopper::setmaxnreg_inc<kFwdConsumerRegs>();
  const int wg = warp / 4;
  const int jw0 = j0 + 16 * warp, k_g = jw0 + lane / 4;
  const int wg_uniform = __shfl_sync(0xffffffffu, wg, 0);  // (as the forward's; the loop's tests too)
  const int it_wg = p.causal ? (j0 + Bc * wg_uniform) / Br : 0;
  const uint32_t aKw = aK + (uint32_t)(wg_uniform * Bc * 128), aVw = aV + (uint32_t)(wg_uniform * Bc * 128);
  const uint32_t col_off = (uint32_t)(c0 / 64) * Br * 128;
  float dk[Cols / 8][4], dv[Cols / 8][4];
  zero(dk);
  zero(dv);
  // this warp's keep bytes (its 16 keys' groups 2 warp, 2 warp + 1), each query tile's fetched a
  // step ahead (as the cp.async kernel's)
  MaskTileBytes<Br, 16, 32> mask_next;
  if constexpr (IsDropout) fetch_mask_tile(mask_next, p.key, bh, it_wg * Br, jw0, lane, p.keep, p.T);
  hopper::mbarrier_wait_parity(&bar_kv, 0);
  // query tile it's stage and the parity of its "full" phase
  auto stage_of = [&](int it) { return (it - it0) % NS; };
  auto landed = [&](int it) { hopper::mbarrier_wait_parity(&full[stage_of(it)], ((it - it0) / NS) & 1); };
  // the warp's keep bits of query tile it into its rows of sM (fetched a step ahead), while the
  // stage lands; the warp's reads of the tile before are over (__syncwarp before)
  auto keep_step = [&](int it) {
    if constexpr (IsDropout) {
      mask_tile_step<Br, 16, MS, 32, true>(sM + 2 * warp * MS, mask_next, p.key, bh, it * Br, jw0, lane, p.keep, p.T,
                                           it + 1 < n_it);
      __syncwarp();
    }
  };
  // this thread's reads of a stage (its wgmmas retired, its lse and D loads done) are over: each
  // consumer thread arrives, so that each of its loads is ordered before the producer's next writes
  // of the stage by its own release (one arrival a warp after __syncwarp left the other lanes'
  // loads unordered for compute-sanitizer's racecheck on the H200)
  auto release = [&](int it) { hopper::mbarrier_arrive(&empty[stage_of(it)]); };
  int it = it0;
  for (; it < min(it_wg, n_it); ++it) {  // nothing of this warpgroup's: the stage released once landed
    landed(it);
    release(it);
  }
  if constexpr (Tile::kPipe) {
    // Pipelined as the cp.async kernel (kPipe there): step it finds its S^T and dP^T issued, issues
    // its dV and dK, then, once tile it + 1 has landed (and its keep bits are in sM), issues tile
    // it + 1's S^T and dP^T and waits for its own dV and dK alone (wait_group 2: the groups retire
    // in order) before it releases its stage. The same products in the same order: the same bits.
    if (it < n_it) {
      float st[Br / 8][4], dpt[Br / 8][4];
      keep_step(it);
      landed(it);
      bwd_issue_sdp<HS, Br, BcW>(st, dpt, aKw, aVw, aQ + stage_of(it) * Tile::kQBytes, adO + stage_of(it) * Tile::kQBytes);
      for (;; ++it) {
        const int stage = stage_of(it);
        dkdv_products<HS, Br, Bc, MS, Cols, IsDropout, false, BcW>(
            dk, dv, st, dpt, p.T, p.causal, p.scale_log2, p.dropout_scale, aVw, aQ + stage * Tile::kQBytes,
            adO + stage * Tile::kQBytes, col_off, sL + stage * Br, sD + stage * Br, sM, it * Br, jw0, k_g, warp, lane,
            FusedDq{});
        if (it + 1 == n_it) {
          hopper::wgmma_wait_group<0>();
          release(it);
          break;
        }
        // (this tile's keep bits were read into registers before its dV's product was issued)
        if constexpr (IsDropout) __syncwarp();
        keep_step(it + 1);
        landed(it + 1);
        bwd_issue_sdp<HS, Br, BcW>(st, dpt, aKw, aVw, aQ + stage_of(it + 1) * Tile::kQBytes,
                                   adO + stage_of(it + 1) * Tile::kQBytes);
        hopper::wgmma_wait_group<2>();  // this tile's dV and dK retired (tile it + 1's S^T, dP^T may run)
        release(it);
      }
    }
  } else {
    for (; it < n_it; ++it) {
      const int stage = stage_of(it);
      keep_step(it);
      landed(it);  // Q_i, dO_i, lse_i, D_i
      dkdv_tile<HS, Br, Bc, MS, Cols, IsDropout, false, BcW>(dk, dv, p.T, p.causal, p.scale_log2, p.dropout_scale, aKw,
                                                             aVw, aQ + stage * Tile::kQBytes, adO + stage * Tile::kQBytes,
                                                             col_off, sL + stage * Br, sD + stage * Br, sM, it * Br, jw0,
                                                             k_g, warp, lane);
      __syncwarp();  // the warp's reads of its keep bits are over before it writes the next tile's
      release(it);
    }
  }
  // dqkv[K_j] += dK_j / sqrt(HS), dqkv[V_j] += dV_j s
  bf16* dqkv_b = p.dqkv + (long long)b * p.T * p.ld_qkv;
  add_to_dqkv(dqkv_b, p.ld_qkv, (long long)p.C + (long long)h * HS + c0, dk, p.scale, k_g, p.T, lane);
  add_to_dqkv(dqkv_b, p.ld_qkv, 2LL * p.C + (long long)h * HS + c0, dv, p.dropout_scale, k_g, p.T, lane);
}

template <int HS>
struct HopperDqTile {
  static constexpr int kThreads = 128;         // one warpgroup
  // (Bc = 32 at HS = 256: S and dP take 16 registers a lane each, so that dQ's 128 fit)
  static constexpr int kBr = 64, kBc = HS > 128 ? 32 : 64;
  static constexpr int kQBytes = kBr * HS * 2;    // Q_i, dO_i
  static constexpr int kKVBytes = kBc * HS * 2;   // each K_j, V_j stage
  static constexpr size_t kSmemBytes = 1024 + 2 * (size_t)kQBytes + 4 * (size_t)kKVBytes;
  // Pipelined (the next key tile's S and dP issued before this one's dQ product retires) at HS 128
  // alone: there shared memory keeps the kernel at two CTAs an SM whatever its registers; at HS 64
  // its 130 / 148 registers give three, which the next tile's S and dP (64 more) would cut to two.
  static constexpr bool kPipe = HS == 128;
  // The warp-specialized kernel: two consumer warpgroups, each with 64 queries of a query tile of
  // 128 (kBrWs), sharing its K_j, V_j stages, and a producer warpgroup (its first warp's lane
  // issues the loads; setmaxnreg gives the rest of its registers to the consumers); three stages
  // (two at HS 256, whose Q and dO take 128 KB)
  static constexpr int kConsumersWs = 2;
  static constexpr int kThreadsWs = 128 * kConsumersWs + 128;
  static constexpr int kBrWs = kBr * kConsumersWs;
  static constexpr int kStagesWs = HS > 128 ? 2 : 3;
  static constexpr size_t kSmemBytesWs = 1024 + 2 * (size_t)kBrWs * HS * 2 + 2 * (size_t)kStagesWs * kKVBytes;
  static_assert(kSmemBytesWs <= 227 * 1024, "the warp-specialized dQ kernel's tiles exceed 227 KB");
};

// One key tile of the dQ kernels: dQ_i (the warpgroup's 64 query rows from iw0 - 16 warp) +=
// dS_ij K_j, with Q_i, dO_i at aQ, adO and K_j, V_j (keys j0 .. j0+Bc-1) at tK, tV; lse2, Di the
// lane's rows' lse_i log2(e) and D_i; kc the lane's keep bytes of the tile (keep_calls_step's,
// read with dropout only). QR: the rows of the Q_i, dO_i tiles aQ and adO point into (the
// warpgroup's 64 rows start there; QR = 128 where two warpgroups share a query tile of 128).
// In parts, as dkdv_tile: bwd_issue_sdp issues S (and, overlapped, dP), dq_products waits for them and
// issues dQ's product; the pipelined dQ kernel (HS 128) issues the next key tile's S and dP
// before this one's dQ product retires.
// The groups pending on entry: bwd_issue_sdp's and nothing after them; on return dQ's product.
template <int HS, int Br, int Bc, bool IsDropout, int QR = Br>
__device__ __forceinline__ void dq_products(float (&dq)[HS / 8][4], float (&s)[Bc / 8][4], float (&dp)[Bc / 8][4],
                                            const KeepCalls<Bc / 8>& kc, int Tn, bool causal, float scale_log2,
                                            float dropout_scale, uint32_t adO, uint32_t tK, uint32_t tV, int j0,
                                            int iw0, int i_g, const float (&lse2)[2], const float (&Di)[2], int lane) {
  constexpr bool Ov = bwd_overlap<HS>();
  hopper::wgmma_wait_group<Ov ? 1 : 0>();  // S is in s
  // S masked; P_ij = exp(S_ij - lse_i); the forward's keep bits
  if (j0 + Bc > Tn || (causal && j0 + Bc - 1 > iw0)) mask_scores<Bc / 8>(s, i_g, j0 + 2 * (lane % 4), Tn, causal);
  probs_query_major(s, lse2, scale_log2);
  const uint32_t bits = IsDropout ? keep_bits_from_calls(kc, lane) : ~0u;
  if constexpr (!Ov) {
    hopper::wgmma_fence();
    wg_issue_ss<HS, Bc, QR, Bc>(dp, adO, 0, tV);
  }
  hopper::wgmma_wait_group<0>();  // dPd is in dp
  // dP_ij = dPd_ij o M_ij s, dS_ij = P_ij o (dP_ij - D_i), in place
  dscores_query_major<Bc / 8, IsDropout>(dp, s, Di, bits, dropout_scale);
  // dQ_i += dS_ij K_j   (the 1/sqrt(HS) is applied once, at the end)
  uint32_t a[Bc / 16][4];
  pack_a<Bc, false>(a, dp, 0u);
  hopper::wgmma_fence();
  wg_issue_rs<Bc, HS, true>(dq, a, tK);
}
template <int HS, int Br, int Bc, bool IsDropout, int QR = Br>
__device__ __forceinline__ void dq_tile(float (&dq)[HS / 8][4], const KeepCalls<Bc / 8>& kc, int Tn, bool causal,
                                        float scale_log2, float dropout_scale, uint32_t aQ, uint32_t adO,
                                        uint32_t tK, uint32_t tV, int j0, int iw0, int i_g, const float (&lse2)[2],
                                        const float (&Di)[2], int lane) {
  float s[Bc / 8][4], dp[Bc / 8][4];
  bwd_issue_sdp<HS, Bc, QR>(s, dp, aQ, adO, tK, tV);
  dq_products<HS, Br, Bc, IsDropout, QR>(dq, s, dp, kc, Tn, causal, scale_log2, dropout_scale, adO, tK, tV, j0, iw0, i_g,
                                         lse2, Di, lane);
  hopper::wgmma_wait_group<0>();
}

// grid (B*NH, ceil(T / Br)); query tiles last-first.
// Pipe: pipelined where Tile::kPipe (flash_bwd_dq_hopper_kernel below, and its twin that is not).
template <int HS, bool IsDropout, bool Pipe>
__device__ __forceinline__ void dq_kernel(const BwdParams<bf16>& p) {
  using Tile = HopperDqTile<HS>;
  constexpr int Br = Tile::kBr, Bc = Tile::kBc, NThreads = Tile::kThreads, TB = Tile::kKVBytes;
  unsigned char* const raw = dynamic_smem<unsigned char>();
  unsigned char* const sQ = align_1024(raw);  // Q_i  [Br][HS]
  unsigned char* const sdO = sQ + Tile::kQBytes;                                  // dO_i [Br][HS]
  unsigned char* const sK = sdO + Tile::kQBytes;                                  // K_j  [2][Bc][HS]
  unsigned char* const sV = sK + 2 * TB;                                          // V_j  [2][Bc][HS]
  const uint32_t aQ = smem_u32(sQ), adO = smem_u32(sdO), aK = smem_u32(sK), aV = smem_u32(sV);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const auto [bh, i0, iw0, i_g, qkv_b, h_col, Q, K, V, dO, n_j] = dq_cta<HS, Br, Bc>(p, warp, lane);

  load_tile_sw128<Br, HS, NThreads>(sQ, Q, p.ld_qkv, i0, p.T);
  load_tile_sw128<Br, HS, NThreads>(sdO, dO, p.ld_out, i0, p.T);
  load_tile_sw128<Bc, HS, NThreads>(sK, K, p.ld_qkv, (n_j - 1) * Bc, p.T);
  load_tile_sw128<Bc, HS, NThreads>(sV, V, p.ld_qkv, (n_j - 1) * Bc, p.T);
  cp_async_commit();

  float lse2[2], Di[2];
  row_lse_d(lse2, Di, p, bh, i_g);

  float dq[HS / 8][4];
  zero(dq);
  // each step's keep bytes fetched a step ahead (keep_calls_step)
  KeepCalls<Bc / 8> keep_next;
  if constexpr (IsDropout) fetch_keep_calls(keep_next, p.key, bh, i_g, (n_j - 1) * Bc, lane, p.keep, nullptr, p.T);
  if constexpr (Tile::kPipe && Pipe) {
    // Step n (key tile jt = n_j - 1 - n, stage n % 2) finds its S and dP issued and issues dQ's
    // product; then, past the barrier that makes tile jt - 1's copies visible, it issues that
    // tile's S and dP, waits for its own dQ product (wait_group 2: the groups retire in order), and
    // past a second barrier (every warp's dQ product retired: the stage is free) starts tile
    // jt - 2's copies into its stage. The products and their order are dq_tile's: the same bits.
    if (n_j > 1) {
      load_tile_sw128<Bc, HS, NThreads>(sK + TB, K, p.ld_qkv, (n_j - 2) * Bc, p.T);
      load_tile_sw128<Bc, HS, NThreads>(sV + TB, V, p.ld_qkv, (n_j - 2) * Bc, p.T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    hopper::fence_proxy_async();
    __syncthreads();  // Q_i, dO_i and the first stage visible to every warp
    float s[Bc / 8][4], dp[Bc / 8][4];
    bwd_issue_sdp<HS, Bc, Br>(s, dp, aQ, adO, aK, aV);
    for (int jt = n_j - 1;; --jt) {  // (n_j >= 1: every query tile has its diagonal key tile)
      const int j0 = jt * Bc, stage = (n_j - 1 - jt) % 2;
      KeepCalls<Bc / 8> kc;
      if constexpr (IsDropout) kc = keep_calls_step(keep_next, p.key, bh, i_g, j0 - Bc, lane, p.keep, p.T);
      dq_products<HS, Br, Bc, IsDropout>(dq, s, dp, kc, p.T, p.causal, p.scale_log2, p.dropout_scale, adO, aK + stage * TB,
                                         aV + stage * TB, j0, iw0, i_g, lse2, Di, lane);
      if (jt == 0) {
        hopper::wgmma_wait_group<0>();
        break;
      }
      cp_async_wait<0>();  // this thread's copies of tile jt - 1 landed
      hopper::fence_proxy_async();
      __syncthreads();  // every thread's
      bwd_issue_sdp<HS, Bc, Br>(s, dp, aQ, adO, aK + (1 - stage) * TB, aV + (1 - stage) * TB);
      hopper::wgmma_wait_group<2>();  // this tile's dQ product retired (tile jt - 1's S, dP may run)
      if (jt >= 2) {
        __syncthreads();  // every warp's: the stage is free
        load_tile_sw128<Bc, HS, NThreads>(sK + stage * TB, K, p.ld_qkv, j0 - 2 * Bc, p.T);
        load_tile_sw128<Bc, HS, NThreads>(sV + stage * TB, V, p.ld_qkv, j0 - 2 * Bc, p.T);
        cp_async_commit();
      }
    }
  } else {
    for (int jt = n_j - 1; jt >= 0; --jt) {  // the keys last-first (dQ_i's sums in the fused kernel's order)
      const int j0 = jt * Bc, stage = (n_j - 1 - jt) % 2;
      KeepCalls<Bc / 8> kc;
      if constexpr (IsDropout) kc = keep_calls_step(keep_next, p.key, bh, i_g, j0 - Bc, lane, p.keep, p.T);
      if (jt > 0) {
        load_tile_sw128<Bc, HS, NThreads>(sK + (1 - stage) * TB, K, p.ld_qkv, j0 - Bc, p.T);
        load_tile_sw128<Bc, HS, NThreads>(sV + (1 - stage) * TB, V, p.ld_qkv, j0 - Bc, p.T);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      hopper::fence_proxy_async();
      __syncthreads();
      dq_tile<HS, Br, Bc, IsDropout>(dq, kc, p.T, p.causal, p.scale_log2, p.dropout_scale, aQ, adO, aK + stage * TB,
                                     aV + stage * TB, j0, iw0, i_g, lse2, Di, lane);
      __syncthreads();
    }
  }
  // dqkv[Q_i] += dQ_i / sqrt(HS)
  add_to_dqkv(p.dqkv + qkv_b, p.ld_qkv, h_col, dq, p.scale, i_g, p.T, lane);
}
template <int HS, bool IsDropout>
__global__ void __launch_bounds__(HopperDqTile<HS>::kThreads, 1) flash_bwd_dq_hopper_kernel(const BwdParams<bf16> p) {
  dq_kernel<HS, IsDropout, true>(p);
}
// The default's twin with each key tile's products retired before the next tile's are issued
// (TG_FLASH_HOPPER=5, as the dK / dV kernel's; HS 128, where it differs).
template <int HS, bool IsDropout>
__global__ void __launch_bounds__(HopperDqTile<HS>::kThreads, 1) flash_bwd_dq_hopper_seq_kernel(const BwdParams<bf16> p) {
  dq_kernel<HS, IsDropout, false>(p);
}

// The dQ kernel warp-specialized, as the forward: two consumer warpgroups (the dQ kernel's math,
// dq_tile), each with 64 queries of the CTA's query tile of 128, and a producer warpgroup whose
// first warp's elected lane loads Q_i and dO_i once and streams K_j, V_j, the keys last-first,
// through a ring of kStagesWs stages with TMA (boxes of 64 columns by Bc rows from tensor maps
// over qkv and dout), full / empty mbarriers as in the forward (each consumer warp arrives on
// "empty" once its wgmmas on the stage have retired: the stage's only readers). Both warpgroups
// read each stage (one load of K_j, V_j for 128 queries); the first skips the key tiles wholly
// after its queries (the first ones streamed), releasing them once landed. Each warpgroup's sums
// are the one-warpgroup kernel's for its 64 queries, in the same order: the same bits. Rows past
// the end of a batch's sequence read the next sequence's rows (zeros past the tensor): their keys
// are masked and their query rows have lse = +inf (P = 0) and are never written. setmaxnreg 24 /
// 240 as in the forward. Chosen by TG_FLASH_HOPPER=2.
// grid (B*NH, ceil(T / kBrWs)); query tiles last-first.
template <int HS, bool IsDropout>
__global__ void __launch_bounds__(HopperDqTile<HS>::kThreadsWs, 1)
    flash_bwd_dq_hopper_ws_kernel(const BwdParams<bf16> p, const __grid_constant__ CUtensorMap qkv_map,
                                  const __grid_constant__ CUtensorMap dout_map) {
  using Tile = HopperDqTile<HS>;
  constexpr int Br = Tile::kBr, BrW = Tile::kBrWs, Bc = Tile::kBc, NS = Tile::kStagesWs, TB = Tile::kKVBytes;
  constexpr int Blocks = HS / 64, NCW = 4 * Tile::kConsumersWs, QB = BrW * HS * 2;
  __shared__ uint64_t bar_q, full[NS], empty[NS];
  unsigned char* const raw = dynamic_smem<unsigned char>();
  unsigned char* const sQ = align_1024(raw);  // Q_i  [BrW][HS]
  unsigned char* const sdO = sQ + QB;         // dO_i [BrW][HS]
  unsigned char* const sK = sdO + QB;         // K_j  [NS][Bc][HS]
  unsigned char* const sV = sK + NS * TB;     // V_j  [NS][Bc][HS]
  const uint32_t aQ = smem_u32(sQ), adO = smem_u32(sdO), aK = smem_u32(sK), aV = smem_u32(sV);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // (the CTA's rows are the tile's BrW; the head's operands come by TMA, their pointers unused)
  const auto [bh, i0, iw0, i_g, qkv_b, h_col, Q, K, V, dO, n_j] = dq_cta<HS, BrW, Bc>(p, warp, lane);
  const int b = (int)bh / p.NH, h = (int)bh % p.NH;

  // full: the producer's arrive.expect_tx; empty: one arrival per consumer warp
  init_ring(&bar_q, full, 1, empty, NCW);

  if (warp >= NCW) {  // the producer warpgroup: the first lane of its first warp issues every load
    hopper::setmaxnreg_dec<kFwdProducerRegs>();
    if (warp == NCW && lane == 0) {
      const int row0 = b * p.T;  // row of (b, 0) in the (B T, 3C) and (B T, C) tensors
      hopper::mbarrier_arrive_expect_tx(&bar_q, 2 * QB);
      for (int blk = 0; blk < Blocks; ++blk)
        for (int piece = 0; piece < BrW / Bc; ++piece) {
          const int off = blk * BrW * 128 + piece * Bc * 128, row = row0 + i0 + piece * Bc;
          hopper::tma_load_2d(sQ + off, &qkv_map, h * HS + 64 * blk, row, &bar_q);
          hopper::tma_load_2d(sdO + off, &dout_map, h * HS + 64 * blk, row, &bar_q);
        }
      produce_kv_ring<HS, Bc, NS, TB, true>(sK, sV, &qkv_map, full, empty, n_j, p.C, h, row0);
    }
    return;
  }

  // a consumer warpgroup: queries i0 + 64 wg .. (its rows of Q_i and dO_i), the key tiles up to
  // its last query's (n_wg of them; the tiles after are the other warpgroup's alone; not causal,
  // every tile)
  hopper::setmaxnreg_inc<kFwdConsumerRegs>();
  const int wg = warp / 4;
  const int wg_uniform = __shfl_sync(0xffffffffu, wg, 0);  // (as the forward's; the loop's tests too)
  // (none where its queries are all past T, as the forward's)
  const int n_wg = i0 + Br * wg_uniform >= p.T ? 0
                   : p.causal                   ? min(n_j, (i0 + Br * wg_uniform + Br - 1) / Bc + 1)
                                                : n_j;
  const uint32_t aQw = aQ + (uint32_t)(wg_uniform * Br * 128), adOw = adO + (uint32_t)(wg_uniform * Br * 128);
  float lse2[2], Di[2];
  row_lse_d(lse2, Di, p, bh, i_g);
  float dq[HS / 8][4];
  zero(dq);
  // the keep bytes of the warpgroup's first key tile (n_wg - 1), then each step the next one's
  KeepCalls<Bc / 8> keep_next;
  if constexpr (IsDropout)
    if (n_wg > 0) fetch_keep_calls(keep_next, p.key, bh, i_g, (n_wg - 1) * Bc, lane, p.keep, nullptr, p.T);
  hopper::mbarrier_wait_parity(&bar_q, 0);
  for (int n = 0; n < n_j; ++n) {  // the keys last-first, as the producer loads them
    const int jt = n_j - 1 - n, st = n % NS;
    KeepCalls<Bc / 8> kc;
    if (IsDropout && jt < n_wg)
      kc = keep_calls_step(keep_next, p.key, bh, i_g, jt * Bc - Bc, lane, p.keep, p.T);
    hopper::mbarrier_wait_parity(&full[st], (n / NS) & 1);  // K_j, V_j landed
    if (jt < n_wg)
      dq_tile<HS, Br, Bc, IsDropout, BrW>(dq, kc, p.T, p.causal, p.scale_log2, p.dropout_scale, aQw, adOw, aK + st * TB,
                                          aV + st * TB, jt * Bc, iw0, i_g, lse2, Di, lane);
    // this warp's wgmmas on the stage have retired: its arrival releases it (with the other seven)
    __syncwarp();
    if (lane == 0) hopper::mbarrier_arrive(&empty[st]);
  }
  // dqkv[Q_i] += dQ_i / sqrt(HS)
  add_to_dqkv(p.dqkv + qkv_b, p.ld_qkv, h_col, dq, p.scale, i_g, p.T, lane);
}

CUtensorMap tile_map(const bf16* base, long long ld, long long rows, int box_rows);

template <int HS, bool IsDropout>
void run_bwd_hopper(const Context& ctx, const BwdParams<bf16>& p) {
  using Kv = HopperDkvTile<HS>;
  using Dq = HopperDqTile<HS>;
  const long long kv_tiles = ceil_div(p.T, Kv::kBc), q_tiles = ceil_div(p.T, Dq::kBr);
  if (kv_tiles > 65535 || q_tiles > 65535) throw std::invalid_argument("flash_attn_backward: T too large for the grid");
  const dim3 kv_grid((unsigned)(p.B * p.NH), (unsigned)kv_tiles, (unsigned)Kv::kSplits);
  const dim3 dq_grid((unsigned)(p.B * p.NH), (unsigned)q_tiles);
  if (flash_attn_hopper_ws_backward()) {
    // tensor maps over qkv and dout, boxes of each kernel's streamed tile rows
    const long long rows = (long long)p.B * p.T;
    const dim3 kv_grid_ws((unsigned)(p.B * p.NH), (unsigned)ceil_div(p.T, Kv::kBcWs), (unsigned)Kv::kSplits);
    launch(flash_bwd_dkdv_hopper_ws_kernel<HS, IsDropout>, kv_grid_ws, Kv::kThreadsWs, Kv::kSmemBytesWs, ctx.stream, p,
           tile_map(p.qkv, p.ld_qkv, rows, Kv::kBr), tile_map(p.dout, p.ld_out, rows, Kv::kBr));
    const dim3 dq_grid_ws((unsigned)(p.B * p.NH), (unsigned)ceil_div(p.T, Dq::kBrWs));
    launch(flash_bwd_dq_hopper_ws_kernel<HS, IsDropout>, dq_grid_ws, Dq::kThreadsWs, Dq::kSmemBytesWs, ctx.stream, p,
           tile_map(p.qkv, p.ld_qkv, rows, Dq::kBc), tile_map(p.dout, p.ld_out, rows, Dq::kBc));
    return;
  }
  // (the fused grid has the heads in y, at most 65535 of them: past that, the two kernels; its sums
  // pass in the causal mask's order: not causal, the two kernels too, the same bits)
  if (flash_attn_hopper_fused_dq() && p.causal && p.B * p.NH <= 65535) {
    if (!p.dq_sums || !p.dq_flags)
      throw std::logic_error("flash_attn_backward (Hopper): no scratch for the dQ sums (flash_attn_scratch_bytes)");
    cudaCheck(cudaMemsetAsync(p.dq_flags, 0, (size_t)p.B * p.NH * Kv::kSplits * ceil_div(p.T, Kv::kBr) * sizeof(int),
                              ctx.stream));
    launch(flash_bwd_dkdv_hopper_kernel<HS, IsDropout, true>, dim3((unsigned)kv_tiles, (unsigned)(p.B * p.NH), (unsigned)Kv::kSplits),
           Kv::kThreads, Kv::kSmemBytesFused, ctx.stream, p);
    return;
  }
  // (TG_FLASH_HOPPER=5: each kernel's twin that is not pipelined, where the two differ)
  void (*dkdv)(BwdParams<bf16>) = flash_bwd_dkdv_hopper_kernel<HS, IsDropout, false>;
  size_t dkdv_smem = Kv::kSmemBytes;
  if constexpr (Kv::kPipe)
    if (!flash_attn_hopper_pipelined()) {
      dkdv = flash_bwd_dkdv_hopper_seq_kernel<HS, IsDropout>;
      dkdv_smem = 1024 + Kv::tiles_bytes(2, 1);
    }
  launch(dkdv, kv_grid, Kv::kThreads, dkdv_smem, ctx.stream, p);
  void (*dq)(BwdParams<bf16>) = flash_bwd_dq_hopper_kernel<HS, IsDropout>;
  if constexpr (Dq::kPipe)
    if (!flash_attn_hopper_pipelined()) dq = flash_bwd_dq_hopper_seq_kernel<HS, IsDropout>;
  launch(dq, dq_grid, Dq::kThreads, Dq::kSmemBytes, ctx.stream, p);
}

// A (rows, ld) bf16 tensor at base (qkv: B T rows of 3C; dout: of C) as a 2-D tensor map: boxes of
// 64 columns (128 bytes, the swizzle's width) by box_rows rows, landing with the 128-byte swizzle;
// zeros past the tensor.
CUtensorMap tile_map(const bf16* base, long long ld, long long rows, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {(cuuint64_t)ld, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)ld * sizeof(bf16)};
  const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, ones[2] = {1, 1};
  const CUresult r = hopper::encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base), dims,
                                            strides, box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("flash attention (Hopper): cuTensorMapEncodeTiled failed (" + std::to_string((int)r) +
                             ") for a tensor of " + std::to_string(rows) + " x " + std::to_string(ld));
  return map;
}

// The forward's key tiles (Bc) and the kernel that runs them: 128 keys where there are two consumer
// warpgroups (HS 64 and 128), as FlashAttention-3 takes them, so that each tile's fixed work (the
// row maxima's shuffles, O's rescaling, the barrier waits, the loop) is spread over twice the keys.
// 64 at HS 256 (one consumer warpgroup), with the keep ring (its words are a key tile of 64), and
// with TG_FLASH_HOPPER=6 (the forward of before, kept to time the change beside it: tiles of 64
// give the mma.sync kernels' bits under the emulator). The dropout kernel takes the same tiles as
// the one without, since the mask dump runs it at p = 0 too and must give the same bits. The
// consumer warpgroups: fwd_consumers' (three at HS 64 without dropout; two with TG_FLASH_HOPPER=7,
// kept to time the third beside them), each with its own 64 rows, so the same bits whatever their
// number. The tensor map's boxes are 64 rows (Q_i of 192 rows is three).
template <int HS, int Bc, bool IsDropout, bool KeepRing = false, int Consumers = fwd_consumers(HS, Bc, IsDropout)>
void launch_fwd_tiles(const Context& ctx, const FwdParams<bf16>& p) {
  using Tile = HopperFwdTile<HS, Bc, Consumers>;
  const long long tiles = ceil_div(p.T, Tile::kBr);
  if (tiles > 65535) throw std::invalid_argument("flash_attn_forward_hopper: T too large for the grid");
  const dim3 grid((unsigned)(p.B * p.NH), (unsigned)tiles);
  const CUtensorMap map = tile_map(p.qkv, p.ld_qkv, (long long)p.B * p.T, 64);
  launch(flash_fwd_hopper_kernel<HS, Bc, Consumers, IsDropout, KeepRing>, grid, Tile::kThreads, Tile::kSmemBytes,
         ctx.stream, p, map, flash_attn_hopper_turns());
}

template <int HS, bool IsDropout>
void run_fwd_hopper(const Context& ctx, const FwdParams<bf16>& p) {
  if constexpr (HopperFwdTile<HS>::kProducerWarpgroup) {
    // the keep ring where asked for (there is a producer warpgroup to make it: not at HS 256)
    if constexpr (IsDropout)
      if (flash_attn_hopper_keep_producer()) return launch_fwd_tiles<HS, 64, true, true>(ctx, p);
    // three consumers with dropout where asked for (HS 64 on key tiles of 64: 156 registers of
    // their 160, where tiles of 128 need 235), and only at p > 0: the mask dump at p = 0 keeps the
    // tiles of the forward without dropout, whose bits it must give
    if constexpr (IsDropout && HS == 64)
      if (flash_attn_hopper_dropout_three_consumers() && p.key.threshold != 0)
        return launch_fwd_tiles<HS, 64, true, false, 3>(ctx, p);
    if (flash_attn_hopper_wide_key_tiles()) {
      if constexpr (fwd_consumers(HS, 128, IsDropout) == 3)
        if (!flash_attn_hopper_three_consumers()) return launch_fwd_tiles<HS, 128, IsDropout, false, 2>(ctx, p);
      return launch_fwd_tiles<HS, 128, IsDropout>(ctx, p);
    }
  }
  launch_fwd_tiles<HS, 64, IsDropout>(ctx, p);
}

}  // namespace

void launch_bwd_hopper(const Context& ctx, const BwdParams<bf16>& p, bool dropout) {
  if (p.HS == 64) {
    BOOL_SWITCH(dropout, kDropout, [&] { run_bwd_hopper<64, kDropout>(ctx, p); });
  } else if (p.HS == 128) {
    BOOL_SWITCH(dropout, kDropout, [&] { run_bwd_hopper<128, kDropout>(ctx, p); });
  } else {
    BOOL_SWITCH(dropout, kDropout, [&] { run_bwd_hopper<256, kDropout>(ctx, p); });
  }
}

void launch_fwd_hopper(const Context& ctx, const FwdParams<bf16>& p, bool dropout) {
  if (p.HS == 64) {
    BOOL_SWITCH(dropout, kDropout, [&] { run_fwd_hopper<64, kDropout>(ctx, p); });
  } else if (p.HS == 128) {
    BOOL_SWITCH(dropout, kDropout, [&] { run_fwd_hopper<128, kDropout>(ctx, p); });
  } else {
    BOOL_SWITCH(dropout, kDropout, [&] { run_fwd_hopper<256, kDropout>(ctx, p); });
  }
}

}  // namespace flash

void flash_attn_forward_hopper(const Context& ctx, bf16* out, float* lse, const bf16* qkv,
                               const philox::DropoutKey& key, int B, int Tn, int C, int NH, uint8_t* mask) {
  if (NH >= 1 && C >= 1 && C % NH == 0 && !flash_attn_hopper_head_size(C / NH))
    throw std::invalid_argument("flash_attn_forward_hopper: head size " + std::to_string(C / NH) +
                                " (C / NH); the Hopper kernels take 64, 128 and 256");
  flash::check_shape(B, Tn, C, NH, "flash_attn_forward_hopper");
  if (!flash_attn_hopper_device(ctx))
    throw std::invalid_argument("flash_attn_forward_hopper: the device is compute capability " +
                                std::to_string(ctx.cc_major) + "." + std::to_string(ctx.cc_minor) +
                                "; the Hopper kernels run on 9.0 only");
  if (!out || !lse || !qkv) throw std::invalid_argument("flash_attn_forward_hopper: null buffer");
  flash::check_aligned(qkv, 16, "flash_attn_forward_hopper", "qkv");  // cp.async moves 16 bytes
  flash::check_aligned(out, 4, "flash_attn_forward_hopper", "out");   // bf16x2 stores
  flash::FwdParams<bf16> p{};
  flash::fill_fwd_params(p, qkv, out, lse, mask, key, B, Tn, C, NH, /*causal=*/true);
  // as flash_attn_forward: with the mask dump the dropout path runs, threshold 0 or not
  flash::launch_fwd_hopper(ctx, p, key.threshold != 0 || mask != nullptr);
}

}  // namespace gpu
