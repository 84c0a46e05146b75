// kernels/flash_attn_hopper.cuh: the flash-attention forward with dropout for Hopper (sm_90a),
// on wgmma: the same contract, outputs and dropout masks as gpu::flash_attn_forward<bf16>
// (kernels/flash_attn.cuh), whose mma.sync kernels run everywhere else. Math and design in
// kernels/flash_attn_hopper.cu.
//
// Status: executed and checked under the emulator only (tests/gpu/test_flash_attn_gpu.cu, the
// "hopper" cases). flash_attn_forward<bf16> runs it in place of the mma.sync forward only when
// asked (TG_FLASH_HOPPER=1, flash_attn_hopper_chosen) until it has passed on an H100.
#pragma once
#include <cstdint>

#include "cuda_common.cuh"
#include "philox.h"

namespace gpu {

// The head sizes the Hopper forward takes: 64 and 128.
bool flash_attn_hopper_head_size(int HS);

// Whether the Hopper kernels can run on ctx's device: compute capability 9.0 (their code is
// built for sm_90a alone, which runs on 9.0 and nothing else).
bool flash_attn_hopper_device(const Context& ctx);

// Whether flash_attn_forward<bf16> runs the Hopper forward for heads of size HS on ctx's device:
// TG_FLASH_HOPPER=1 in the environment (read at each call; unset or 0: no; another value throws
// std::invalid_argument), compute capability 9.0, and a tile head size
// (flash_attn_tile_head_size) of 64 or 128.
bool flash_attn_hopper_chosen(const Context& ctx, int HS);

// As flash_attn_forward<bf16> with causal = true: out (B, T, C) and lse (B, NH, T) overwritten,
// mask (B, NH, T, T) the keep decisions when not null (entries above the diagonal untouched).
// Throws std::invalid_argument for a shape or head size it does not take, or a device that is
// not compute capability 9.0.
void flash_attn_forward_hopper(const Context& ctx, bf16* out, float* lse, const bf16* qkv,
                               const philox::DropoutKey& key, int B, int Tn, int C, int NH, uint8_t* mask);

}  // namespace gpu
