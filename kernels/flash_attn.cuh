// kernels/flash_attn.cuh: fused flash attention (FlashAttention-2, Dao 2023) with dropout on the
// GPU: the forward never stores the (T, T) scores, only O and the row logsumexp; the backward
// recomputes P tile by tile from Q, K and lse and regenerates the same Philox dropout mask (or,
// bf16, reads the keep decisions its forward stored: flash_attn_keep_offset).
// Math and contract in kernels/flash_attn_fwd.cu and kernels/flash_attn_bwd.cu; CPU twin
// (the spec) in kernels/cpu/attention_tiled.h. T = bf16 runs on tensor cores (mma.sync bf16,
// fp32 accumulate); T = float runs a plain fp32 SIMT kernel (no TF32).
// forward overwrites out and lse (and mask and keep when not null); backward accumulates (+=) into
// dqkv.
// Head sizes: multiples of 8 up to 256 (flash_attn_tile_head_size: 32, 64, 128, 256 run as they
// are, the others padded through ctx.scratch).
// causal: keys after their query masked (the GPT's attention); false: every query attends to every
// key of its sequence. Both kernel families take either (a run-time flag of the kernels, so that
// it costs no second instantiation).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda_common.cuh"
#include "philox.h"

namespace gpu {

// The head size the kernels run a head size HS at: HS itself for 32, 64, 128 and 256 (their
// tiles); the next of those for the other multiples of 8 up to 256, whose heads the launchers
// copy into that width with zero columns (zeros add nothing to Q K^T; V's zero columns give O
// zero columns, dropped; the softmax scale stays 1 / sqrt(HS)); 0 for any other HS.
int flash_attn_tile_head_size(int HS);

// true when the flash kernels take head size HS (flash_attn_tile_head_size(HS) != 0); otherwise
// *why (when not null) gets the sentence naming the sizes they take (the caller says what to
// change).
bool flash_attn_supported(int HS, std::string* why);

// The most dynamic shared memory a block of the mma.sync (bf16) or SIMT (float) flash kernels
// takes at head size HS (its tile size's), forward and backward: a device whose opt-in limit per
// block is smaller cannot run them (consumer parts of compute capability 8.6 and 8.9 allow 99 KB:
// HS 128 needs 102 KB there; the Hopper kernels run on 9.0, whose 227 KB fit every size); 0 for
// an HS the kernels do not take. The launchers check it against ctx.smem_per_block_optin and
// throw std::invalid_argument saying so.
size_t flash_attn_smem_bytes(int HS, bool bf16);

// The attention dropout's keep decisions as the bf16 forward stores them for its backward (the
// `keep` buffers below), so that the backward reads them where it would regenerate them: byte
// (bh, i, g) is philox::attn_keep_byte of the Philox call of query i and keys 8g .. 8g+7 (bit u:
// key 8g + u), stored for the causal pairs (i < T, 8g <= i) only. Per (b, h), 32-byte blocks of 16
// queries by 2 groups (16 keys), the blocks of the causal triangle (key block <= query block) row
// after row: block (i / 16, g / 2) holds group g's 16 bytes at 16 (g % 2), in query order. So the
// kernels' accesses are whole sectors: a warp of the forward and dQ kernels (16 queries, two
// groups) touches one block, and the dK / dV kernels' loads (make_mask_tile) take one block a warp.
// A (b, h) takes 16 R (R + 1) bytes, R = ceil(T / 16): about T^2 / 16, 1/32 of a (T, T) bf16
// score matrix. Offsets within a (b, h) are 32-bit: the launchers store and read keep decisions
// only for causal attention with T <= kFlashKeepMaxT (2^28 bytes a (b, h)) and otherwise make
// them again (flash::keep_buffer_used).
constexpr int kFlashKeepMaxT = 65536;
TG_HD uint32_t flash_attn_keep_bh_bytes(int Tn) {
  const uint32_t R = ((uint32_t)Tn + 15) / 16;
  return 16 * R * (R + 1);
}
TG_HD uint32_t flash_attn_keep_in_bh(uint32_t i, uint32_t g) {
  // block (i / 16, g / 2) at 32 (rb (rb + 1) / 2 + g / 2), group g's 16 bytes at 16 (g % 2) in it:
  // 32 (g / 2) + 16 (g % 2) = 16 g, so a query row block's groups follow one another
  const uint32_t rb = i / 16;
  return 16 * (rb * (rb + 1) + g) + (i & 15);
}
TG_HD size_t flash_attn_keep_offset(int Tn, uint32_t bh, uint32_t i, uint32_t g) {
  return (size_t)bh * flash_attn_keep_bh_bytes(Tn) + flash_attn_keep_in_bh(i, g);
}

// The bytes of the keep buffer of a (B, NH, T) attention (flash_attn_keep_offset's layout); 0 for
// T > kFlashKeepMaxT, where the kernels ignore the buffer.
size_t flash_attn_keep_bytes(int B, int NH, int Tn);

// Scratch the forward and backward need in ctx.scratch: the backward's D = rowsum(dO o O),
// (B, NH, T) floats; for a padded head size also the padded copies of qkv, out, dout and dqkv.
size_t flash_attn_scratch_bytes(int B, int Tn, int C, int NH);

template <typename T>
void flash_attn_forward(const Context& ctx,
                        T* out,          // (B, T, C) overwritten
                        float* lse,      // (B, NH, T) overwritten: row logsumexp of S = Q K^T / sqrt(HS)
                        const T* qkv,    // (B, T, 3C)
                        const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal,
                        uint8_t* mask,   // (B, NH, T, T) keep decisions applied, or null; causal:
                                         // entries above the diagonal untouched
                        uint8_t* keep = nullptr);  // flash_attn_keep_bytes: with dropout on (key.threshold
                                                   // != 0) and causal, the bf16 kernels store their keep
                                                   // decisions here for the backward; otherwise untouched

template <typename T>
void flash_attn_backward(const Context& ctx,
                         T* dqkv,           // (B, T, 3C) +=
                         const T* dout,     // (B, T, C)
                         const T* qkv,      // (B, T, 3C)
                         const T* out,      // (B, T, C) from the forward
                         const float* lse,  // (B, NH, T) from the forward
                         const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal,
                         const uint8_t* keep = nullptr);  // the forward's keep buffer for this key and
                                                          // shape, or null: the bf16 kernels read
                                                          // the decisions there instead of making
                                                          // them again (the same bits; causal
                                                          // only, as the forward stores them); the
                                                          // fp32 kernels always make them

}  // namespace gpu
