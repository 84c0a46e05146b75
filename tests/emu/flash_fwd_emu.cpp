// tests/emu/flash_fwd_emu.cpp: the real flash-attention forward (kernels/flash_attn_fwd.cu,
// unmodified) compiled by g++ for the host emulator of tests/emu/simt_emulator.h.
#include "simt_emulator.h"

#include "../../kernels/flash_attn_fwd.cu"
