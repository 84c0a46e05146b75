// kernels/flash_attn_hopper.cuh: the flash-attention forward with dropout for Hopper (sm_90a),
// on wgmma: the same contract, outputs and dropout masks as gpu::flash_attn_forward<bf16>
// (kernels/flash_attn.cuh), whose mma.sync kernels run everywhere else. Math and design in
// kernels/flash_attn_hopper.cu.
//
// Status: checked under the emulator and on an H100 (tests/gpu/test_flash_attn_gpu.cu, the
// "hopper" cases: their outputs there were the mma.sync kernels' bit for bit, and a whole
// shakespeare-char run on them gave the mma.sync run's losses at every step); head size 256
// under the emulator only so far. The forward's key tiles of 128 (the default since; tiles of 64,
// as then, with TG_FLASH_HOPPER=6) are checked under the emulator only. The backward with dQ
// inside its dK / dV kernel (TG_FLASH_HOPPER=3) gives the same bits on the H200 and is slower
// there.
// flash_attn_forward / _backward<bf16> run them in place of the mma.sync kernels on compute
// capability 9.0 unless TG_FLASH_HOPPER=0 (flash_attn_hopper_chosen).
#pragma once
#include <cstdint>

#include "cuda_common.cuh"
#include "philox.h"

namespace gpu {

// The head sizes the Hopper kernels take: 64, 128 and 256.
bool flash_attn_hopper_head_size(int HS);

// Whether the Hopper kernels can run on ctx's device: compute capability 9.0 (their code is
// built for sm_90a alone, which runs on 9.0 and nothing else).
bool flash_attn_hopper_device(const Context& ctx);

// Whether flash_attn_forward / _backward<bf16> run the Hopper kernels for heads of size HS on
// ctx's device: compute capability 9.0, a tile head size (flash_attn_tile_head_size) of 64,
// 128 or 256, and TG_FLASH_HOPPER unset or 1 to 7 in the environment (read at each call;
// 0: the mma.sync kernels; another value throws std::invalid_argument).
bool flash_attn_hopper_chosen(const Context& ctx, int HS);

// Whether the Hopper backward runs its warp-specialized kernels (a producer warp streaming the
// tiles with TMA to two consumer warpgroups; kernels/flash_attn_hopper.cu)
// in place of the cp.async ones: TG_FLASH_HOPPER=2. Slower than them on the H200 but at head size
// 64 without dropout (in a one-warpgroup form), so not the default.
bool flash_attn_hopper_ws_backward();

// Whether the Hopper backward computes dQ inside its dK / dV kernel (sums
// passed from key tile to key tile in order, in flash_attn_scratch_bytes' scratch) rather than in a
// second kernel that recomputes S and dP: TG_FLASH_HOPPER=3 (on the H200 it was slower than the
// two kernels, the default), for causal attention (its sums pass in the causal mask's order; not
// causal runs the two kernels). The bits are the same either way.
bool flash_attn_hopper_fused_dq();

// Whether the Hopper forward with dropout has its producer warpgroup make the keep decisions
// (passed to the consumers through a ring in shared memory) rather than its consumer warpgroups
// between their products: TG_FLASH_HOPPER=4 (head sizes 64 and 128, whose forward has a producer
// warpgroup; the backward is the default's). The bits are the same either way; it has not run on a
// GPU yet, so it is not the default.
bool flash_attn_hopper_keep_producer();

// Whether the Hopper backward's kernels are pipelined over their tiles (the dK / dV kernel at head
// sizes 64 and 128 issues the next query tile's S^T and dP^T before this tile's dV and dK have
// retired, the dQ kernel at 128 the next key tile's S and dP before this tile's dQ product has):
// yes unless TG_FLASH_HOPPER=5, which runs their twins that wait for each tile's products before
// the next tile's, kept to time the pipelining beside them. The bits are the same either way.
bool flash_attn_hopper_pipelined();

// Whether the Hopper forward takes its keys in tiles of 128 at head sizes 64 and 128 (tiles of 64
// at 256): yes unless TG_FLASH_HOPPER=6, which runs it on tiles of 64 there too, kept to time the
// wider tiles beside them. The tiles change where the online softmax rescales, so O and lse
// differ from the tiles of 64 within rounding (tiles of 64 give the mma.sync kernels' bits under
// the emulator).
bool flash_attn_hopper_wide_key_tiles();

// Whether the Hopper forward at head size 64 without dropout, on key tiles of 128, runs three
// consumer warpgroups (192 query rows a CTA, 160 registers a thread each) rather than two: yes
// unless TG_FLASH_HOPPER=7, kept to time the third beside them. Each warpgroup computes its own
// rows, so the bits are the same either way.
bool flash_attn_hopper_three_consumers();

// Whether the Hopper forward's consumer warpgroups (two or three, head sizes 64 and 128) take turns
// at issuing each key tile's products (FlashAttention-3's pingpong schedule, so that one's
// softmax runs while another's products do): yes unless TG_FLASH_HOPPER=8, kept to time the turns
// beside them. Scheduling alone: the bits are the same either way.
bool flash_attn_hopper_turns();

// Whether the Hopper forward with dropout (p > 0) at head size 64 runs three consumer warpgroups on
// key tiles of 64 (192 query rows a CTA, 160 registers a thread each: 12 consumer warps an SM)
// rather than two on key tiles of 128 (235 registers each: 8): TG_FLASH_HOPPER=9, not the default.
// Its time follows its instructions, issued on about half the cycles by two warps a scheduler (ncu
// on the H200): a third warp would issue on more of them, the tiles of 64 costing 8% more
// instructions. It has not run on a GPU. Its bits are those of TG_FLASH_HOPPER=6's forward.
bool flash_attn_hopper_dropout_three_consumers();

// As flash_attn_forward<bf16> with causal = true: out (B, T, C) and lse (B, NH, T) overwritten,
// mask (B, NH, T, T) the keep decisions when not null (entries above the diagonal untouched).
// Throws std::invalid_argument for a shape or head size it does not take, or a device that is
// not compute capability 9.0.
void flash_attn_forward_hopper(const Context& ctx, bf16* out, float* lse, const bf16* qkv,
                               const philox::DropoutKey& key, int B, int Tn, int C, int NH, uint8_t* mask);

}  // namespace gpu
