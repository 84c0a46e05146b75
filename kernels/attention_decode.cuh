// kernels/attention_decode.cuh: attention of one new position against a KV cache, for
// generation on the GPU (CPU twin kernels/cpu/attention_decode.h, where the math is). For each
// head: append the new row's key and value to the cache at pos, then
//   out_h = softmax_j(q_h . k_j / sqrt(HS), j = 0 .. pos) (v_0 .. v_pos)
// in float, stored as T. attention_decode_prime fills cache rows 0 .. n-1 from the qkv of a
// forward over n positions. The caches are one layer's, (NH, maxT, HS) of T. out overwritten.
#pragma once
#include "cuda_common.cuh"

namespace gpu {

template <typename T>
void attention_decode_forward(const Context& ctx,
                              T* out,        // (C)
                              T* kcache,     // (NH, maxT, HS), row pos written
                              T* vcache,     // (NH, maxT, HS), row pos written
                              const T* qkv,  // (3C) the new position's q, k, v
                              int pos, int C, int NH, int maxT);

template <typename T>
void attention_decode_prime(const Context& ctx,
                            T* kcache,     // (NH, maxT, HS), rows 0 .. n-1 written
                            T* vcache,     // (NH, maxT, HS), rows 0 .. n-1 written
                            const T* qkv,  // (n, 3C)
                            int n, int C, int NH, int maxT);

}  // namespace gpu
