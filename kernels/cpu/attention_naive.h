// kernels/cpu/attention_naive.h: multi-head self-attention, materialized (the CPU reference).
//   for each batch b and head h, with Q, K, V the (T, HS) slices of qkv:
//   S = Q K^T / sqrt(HS)            (j > i set to -inf when causal)
//   P = softmax_rows(S)             saved in att for the backward
//   Pd = P o M / (1 - p)            M the dropout mask of kernels/philox.h (site attn probs)
//   O = Pd V                        written to out at columns h*HS .. h*HS+HS-1
// backward: dPd = dO V^T, dV = Pd^T dO, dP = dPd o M / (1 - p), D_i = sum_j P_ij dP_ij,
//   dS = P o (dP - D), dQ = dS K / sqrt(HS), dK = dS^T Q / sqrt(HS).
// forward overwrites out and att (and mask when not null); backward accumulates into dqkv.
// qkv holds q, k, v side by side: qkv[b, t, 0:C] = q, [C:2C] = k, [2C:3C] = v, head h at
// offset h*HS inside each. key.threshold == 0 means no dropout.
#pragma once
#include <cstdint>
#include "../philox.h"

namespace cpu {

template <typename T>
void attention_naive_forward(T* out,        // (B, T, C)
                             T* att,        // (B, NH, T, T) probabilities before dropout
                             const T* qkv,  // (B, T, 3C)
                             const philox::DropoutKey& key, int B, int Tn, int C, int NH,
                             bool causal,
                             uint8_t* mask);  // (B, NH, T, T) keep decisions applied, or null;
                                              // entries above the causal diagonal untouched

template <typename T>
void attention_naive_backward(T* dqkv,        // (B, T, 3C) +=
                              const T* dout,  // (B, T, C)
                              const T* qkv,   // (B, T, 3C)
                              const T* att,   // (B, NH, T, T) from the forward
                              const philox::DropoutKey& key, int B, int Tn, int C, int NH,
                              bool causal);

}  // namespace cpu
