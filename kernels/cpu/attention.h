// kernels/cpu/attention.h: multi-head causal self-attention on the CPU reference, the one place
// on the CPU that reads the naive / flash choice (the twin of kernels/attention.cuh). Both paths
// compute, per batch b and head h, O = dropout(softmax(Q K^T / sqrt(HS), causal)) V with the
// same mask; what they save for the backward differs:
//   naive (kernels/cpu/attention_naive.h): the probabilities P, (B, NH, T, T);
//   flash (kernels/cpu/attention_tiled.h): the row logsumexp, (B, NH, T) (and O itself), in
//   tiles of Br rows and Bc columns.
// forward overwrites out and the saved buffer; backward accumulates (+=) into dqkv.
#pragma once
#include <cstdint>

#include "../attention_path.h"
#include "../philox.h"
#include "attention_naive.h"
#include "attention_tiled.h"

namespace cpu {

template <typename T>
struct AttentionSaved {
  T* att = nullptr;  // (B, NH, T, T) naive: softmax probabilities before dropout
  T* lse = nullptr;  // (B, NH, T)    flash: row logsumexp of the scaled scores
};

template <typename T>
void attention_forward(AttentionPath path,
                       T* out,                   // (B, T, C)
                       AttentionSaved<T> saved,  // see above
                       const T* qkv,             // (B, T, 3C)
                       const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal, int Br, int Bc) {
  if (path == AttentionPath::Flash)
    attention_tiled_forward(out, saved.lse, qkv, key, B, Tn, C, NH, causal, Br, Bc, nullptr);
  else
    attention_naive_forward(out, saved.att, qkv, key, B, Tn, C, NH, causal, nullptr);
}

template <typename T>
void attention_backward(AttentionPath path,
                        T* dqkv,                  // (B, T, 3C) +=
                        const T* dout,            // (B, T, C)
                        const T* qkv,             // (B, T, 3C)
                        const T* out,             // (B, T, C) from the forward
                        AttentionSaved<T> saved,  // from the forward
                        const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal, int Br, int Bc) {
  if (path == AttentionPath::Flash)
    attention_tiled_backward(dqkv, dout, qkv, out, saved.lse, key, B, Tn, C, NH, causal, Br, Bc);
  else
    attention_naive_backward(dqkv, dout, qkv, saved.att, key, B, Tn, C, NH, causal);
}

}  // namespace cpu
