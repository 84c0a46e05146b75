// kernels/cpu/attention_tiled.h: the flash-attention algorithm in plain loops (FlashAttention-2,
// Dao 2023, algorithms 1 and 2): the spec of the fused GPU kernels. Same math, same dropout
// mask and same qkv / out layout as attention_naive.h, but nothing of size T x T is stored.
// forward, per (b, h) and per query tile Q_i of Br rows:
//   m_i = -inf, l_i = 0, O_i = 0
//   for each key tile K_j, V_j of Bc rows (tiles wholly above the causal diagonal skipped):
//     S_ij = Q_i K_j^T / sqrt(HS)  (causal mask inside the diagonal tile)
//     m_new = max(m_i, rowmax(S_ij));  P~_ij = exp(S_ij - m_new)
//     l_i = exp(m_i - m_new) l_i + rowsum(P~_ij)                      (before dropout)
//     O_i = exp(m_i - m_new) O_i + (P~_ij o M_ij / (1 - p)) V_j;  m_i = m_new
//   O_i = O_i / l_i;  lse_i = m_i + log(l_i)
// backward, per (b, h): D_i = rowsum(dO_i o O_i); for each K_j, V_j tile and each Q_i tile:
//   P_ij = exp(S_ij - lse_i) (recomputed), Pd_ij = P_ij o M_ij / (1 - p)
//   dV_j += Pd_ij^T dO_i;  dPd_ij = dO_i V_j^T;  dP_ij = dPd_ij o M_ij / (1 - p)
//   dS_ij = P_ij o (dP_ij - D_i);  dQ_i += dS_ij K_j / sqrt(HS);  dK_j += dS_ij^T Q_i / sqrt(HS)
// forward overwrites out and lse (and mask when not null); backward accumulates into dqkv.
#pragma once
#include <cstdint>
#include "../philox.h"

namespace cpu {

template <typename T>
void attention_tiled_forward(T* out,        // (B, T, C)
                             T* lse,        // (B, NH, T) row logsumexp of S
                             const T* qkv,  // (B, T, 3C)
                             const philox::DropoutKey& key, int B, int Tn, int C, int NH,
                             bool causal, int Br, int Bc,
                             uint8_t* mask);  // (B, NH, T, T) keep decisions applied, or null;
                                              // entries above the causal diagonal untouched

template <typename T>
void attention_tiled_backward(T* dqkv,        // (B, T, 3C) +=
                              const T* dout,  // (B, T, C)
                              const T* qkv,   // (B, T, 3C)
                              const T* out,   // (B, T, C) from the forward
                              const T* lse,   // (B, NH, T) from the forward
                              const philox::DropoutKey& key, int B, int Tn, int C, int NH,
                              bool causal, int Br, int Bc);

}  // namespace cpu
