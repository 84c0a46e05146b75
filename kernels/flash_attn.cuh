// kernels/flash_attn.cuh: fused flash attention (FlashAttention-2, Dao 2023) with dropout on the
// GPU: the forward never stores the (T, T) scores, only O and the row logsumexp; the backward
// recomputes P tile by tile from Q, K and lse and regenerates the same Philox dropout mask.
// Math and contract in kernels/flash_attn_fwd.cu and kernels/flash_attn_bwd.cu; CPU twin
// (the spec) in kernels/cpu/attention_tiled.h. T = bf16 runs on tensor cores (mma.sync bf16,
// fp32 accumulate); T = float runs a plain fp32 SIMT kernel (no TF32).
// forward overwrites out and lse (and mask when not null); backward accumulates (+=) into dqkv.
// Head sizes: multiples of 8 up to 256 (flash_attn_tile_head_size: 32, 64, 128, 256 run as they
// are, the others padded through ctx.scratch).
// causal must be true: the kernels are instantiated causal only (std::invalid_argument otherwise;
// see flash::check_causal in kernels/flash_attn_common.cuh).
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

// Scratch the forward and backward need in ctx.scratch: the backward's D = rowsum(dO o O),
// (B, NH, T) floats; for a padded head size also the padded copies of qkv, out, dout and dqkv.
size_t flash_attn_scratch_bytes(int B, int Tn, int C, int NH);

template <typename T>
void flash_attn_forward(const Context& ctx,
                        T* out,          // (B, T, C) overwritten
                        float* lse,      // (B, NH, T) overwritten: row logsumexp of S = Q K^T / sqrt(HS)
                        const T* qkv,    // (B, T, 3C)
                        const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal,
                        uint8_t* mask);  // (B, NH, T, T) keep decisions applied, or null; entries
                                         // above the causal diagonal untouched

template <typename T>
void flash_attn_backward(const Context& ctx,
                         T* dqkv,           // (B, T, 3C) +=
                         const T* dout,     // (B, T, C)
                         const T* qkv,      // (B, T, 3C)
                         const T* out,      // (B, T, C) from the forward
                         const float* lse,  // (B, NH, T) from the forward
                         const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal);

}  // namespace gpu
