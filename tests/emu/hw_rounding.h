// tests/emu/hw_rounding.h: the emulator's hardware-rounding mode. By default the emulator rounds
// as IEEE arithmetic does (every fused multiply-add of an mma.sync and of a cuBLAS product to
// nearest, the device math functions as the host's libm). In this mode it rounds as the GPU may:
//
// Tensor cores (mma.sync m16n8k16 and the bf16 GEMMs of the cuBLAS stand-in). Measured on the
// V100, T4 and A100 by Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor
// cores", PeerJ Computer Science 7:e330 (2021), https://doi.org/10.7717/peerj-cs.330, and modelled
// bit for bit for the V100, A100, H100 and B200 by Khattak and Mikaitis, "Accurate models of
// NVIDIA tensor cores", arXiv:2512.07004 (2025): the products of the bf16 inputs are exact; a
// block of products and the accumulator are added in one fused step whose significands are
// aligned to the largest magnitude among them and truncated there, with no guard bits and no
// normalisation between the additions; the step's sum is truncated (rounded toward zero) to fp32
// and is the accumulator of the next block. The block is the number of products fused in one step:
// 4 is the smallest reported (V100, T4); later parts fuse more and keep more bits, so a run at
// block 4 truncates at least as often as theirs. TG_EMU_HW_ROUNDING=4, 8 or 16 picks the block
// (1 means 4); the result differs from the default by rounding only.
//
// Device math. The CUDA C++ Programming Guide's table of single-precision functions (appendix
// "Mathematical Functions", maximum ulp error over the full range, default compilation flags):
// expf 2, exp2f 2, logf 1, erfcf 4 (the functions the kernels call; sqrtf and the division are
// IEEE-rounded, 0 ulp). In this mode each returns the host libm's result moved by its maximum
// error, up or down as a hash of the function and the argument's bits says: deterministic (one
// argument always gives one result, as on the GPU), both directions.
#pragma once
#include <cstdint>

namespace emu {

// 0: off; otherwise the tensor-core block. Read from TG_EMU_HW_ROUNDING at first use.
int hw_rounding_block();
void set_hw_rounding_block(int block);  // for tests: 0 turns the mode off

// c + sum_{k < n} a[k*sa] b[k*sb] as a tensor core accumulates it in blocks of `block` products
// (block 4, 8 or 16), the a and b values exactly representable in bf16.
float tensor_core_dot(float c, const float* a, int sa, const float* b, int sb, int n, int block);
// The same for `count` products that share a: c[w] = tensor_core_dot(c[w], a, sa, b + w bw, sb, n,
// block) for w < count.
void tensor_core_dots(float* c, int count, const float* a, int sa, const float* b, long bw, int sb, int n, int block);

// C (rows x cols, row stride ldc) += A (rows x 16, row stride 16) B (16 x cols, row stride ldb),
// as mma.sync m16n8k16 and wgmma's m64nNk16 accumulate: each element's 16 products in k's order,
// fused one at a time and rounded to nearest (fmaf), or in the hardware-rounding mode as
// tensor_core_dot does at the mode's block.
void tensor_core_mma(float* c, int ldc, const float* a, const float* b, int ldb, int rows, int cols);

// The device math functions: f is the host libm's value at x, max_ulp the Programming Guide's
// bound, fn an identifier of the function (for the hash).
float device_math(float f, float x, int max_ulp, uint32_t fn);

}  // namespace emu
