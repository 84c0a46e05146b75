// tests/emu/flash_bwd_emu.cpp: the real flash-attention backward (kernels/flash_attn_bwd.cu,
// unmodified) compiled by g++ for the host emulator of tests/emu/simt_emulator.h. (The forward
// and the backward sources each define helpers of the same names in an unnamed namespace, so
// they are two translation units, as in the nvcc build.)
#include "simt_emulator.h"

#include "../../kernels/flash_attn_bwd.cu"
