// kernels/cpu/attention_decode.h: attention of one new position against a KV cache, for
// generation (the CPU reference; GPU twin kernels/attention_decode.cuh). For each head h, with
// q, k, v the head's slices of the new row's qkv and the cache rows 0 .. pos of that head:
//   kcache[h][pos] = k,  vcache[h][pos] = v                      (the new row is appended)
//   s_j = q . kcache[h][j] / sqrt(HS),  p = softmax(s) over j = 0 .. pos
//   out[h*HS .. h*HS+HS-1] = sum_j p_j vcache[h][j]               (overwrites out)
// No mask is needed (the cache holds exactly the positions up to pos, which a causal query at
// pos sees) and no dropout (generation is evaluation). attention_decode_prime fills rows
// 0 .. n-1 of the caches from the qkv of a forward over n positions (its keys and values).
// The caches are (NH, maxT, HS): one layer's.
#pragma once

namespace cpu {

template <typename T>
void attention_decode_forward(T* out,        // (C)
                              T* kcache,     // (NH, maxT, HS), row pos written
                              T* vcache,     // (NH, maxT, HS), row pos written
                              const T* qkv,  // (3C) the new position's q, k, v
                              int pos, int C, int NH, int maxT);

template <typename T>
void attention_decode_prime(T* kcache,     // (NH, maxT, HS), rows 0 .. n-1 written
                            T* vcache,     // (NH, maxT, HS), rows 0 .. n-1 written
                            const T* qkv,  // (n, 3C)
                            int n, int C, int NH, int maxT);

}  // namespace cpu
