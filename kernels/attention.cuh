// kernels/attention.cuh: multi-head causal self-attention on the GPU, the one place that reads
// the naive / flash choice. Both paths compute, per batch b and head h (Q, K, V the (T, HS)
// slices of qkv):
//   O = dropout(softmax(Q K^T / sqrt(HS), causal)) V
// with the same dropout mask (kernels/philox.h, keyed by (b*NH + h, i, j)). What they save for
// the backward differs:
//   naive (kernels/attention_naive.cuh): the probabilities P, (B, NH, T, T) in T;
//   flash (kernels/flash_attn.cuh):      the row logsumexp, (B, NH, T) in float (and O itself),
//                                        and with dropout the keep decisions when given room.
// forward overwrites out and the saved buffer; backward accumulates (+=) into dqkv.
// CPU twins: kernels/cpu/attention_naive.h and kernels/cpu/attention_tiled.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "attention_path.h"
#include "cuda_common.cuh"
#include "philox.h"

namespace gpu {

using AttentionPath = ::AttentionPath;  // kernels/attention_path.h

template <typename T>
struct AttentionSaved {
  T* att = nullptr;      // (B, NH, T, T) naive: softmax probabilities before dropout
  float* lse = nullptr;  // (B, NH, T)    flash: row logsumexp of the scaled scores
  uint8_t* keep = nullptr;  // flash, bf16, with dropout: the keep decisions (flash_attn_keep_bytes),
                            // or null: the backward makes them again (the same bits, more time)
};

// Elements of the saved buffer per (B, T, NH): T*T per row of heads for naive, one for flash.
size_t attention_saved_elems(AttentionPath path, int B, int Tn, int NH);

// Whether the path supports head size HS; when not, *why says what is supported.
bool attention_supported(AttentionPath path, int HS, std::string* why);

template <typename T>
void attention_forward(const Context& ctx, AttentionPath path,
                       T* out,                    // (B, T, C)
                       AttentionSaved<T> saved,   // see above
                       const T* qkv,              // (B, T, 3C)
                       const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal);

template <typename T>
void attention_backward(const Context& ctx, AttentionPath path,
                        T* dqkv,                   // (B, T, 3C) +=
                        const T* dout,             // (B, T, C)
                        const T* qkv,              // (B, T, 3C)
                        const T* out,              // (B, T, C) from the forward
                        AttentionSaved<T> saved,   // from the forward
                        const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal);

size_t attention_scratch_bytes(AttentionPath path, int B, int Tn, int C, int NH, size_t elem_size);

}  // namespace gpu
