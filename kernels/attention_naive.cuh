// kernels/attention_naive.cuh: multi-head self-attention on the GPU, materialized (the (T, T)
// score matrix of every head lives in memory): cuBLAS strided-batched GEMMs around one fused
// softmax + dropout kernel. Exactly the math of the CPU twin kernels/cpu/attention_naive.h:
//   S = Q K^T / sqrt(HS) (j > i excluded when causal), P = softmax_rows(S) saved in att,
//   Pd = P o M / (1 - p) (M: philox::attn_keep(key, b*NH + h, i, j)), O = Pd V.
// forward overwrites out and att (att is exactly 0 above the causal diagonal; mask, when not
// null, gets the applied keep decisions and is untouched above the diagonal); backward
// accumulates (+=) into dqkv. T is float or gpu::bf16; every GEMM accumulates in fp32.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cuda_common.cuh"
#include "philox.h"

namespace gpu {

template <typename T>
void attention_naive_forward(const Context& ctx,
                             T* out,        // (B, T, C)
                             T* att,        // (B, NH, T, T) probabilities before dropout
                             const T* qkv,  // (B, T, 3C)
                             const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal,
                             uint8_t* mask);  // (B, NH, T, T) keep decisions applied, or null

template <typename T>
void attention_naive_backward(const Context& ctx,
                              T* dqkv,        // (B, T, 3C) +=
                              const T* dout,  // (B, T, C)
                              const T* qkv,   // (B, T, 3C)
                              const T* att,   // (B, NH, T, T) from the forward
                              const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal);

// ctx.scratch needed by both launchers; elem_size = sizeof(T).
size_t attention_naive_scratch_bytes(int B, int Tn, int C, int NH, size_t elem_size);

}  // namespace gpu
