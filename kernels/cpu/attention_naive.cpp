// kernels/cpu/attention_naive.cpp: multi-head causal self-attention, materialized: the CPU
// reference (contract in kernels/cpu/attention_naive.h). Per batch b and head h, with Q, K, V
// the (T, HS) slices of qkv (HS = C / NH) and s = 1 / (1 - p) the dropout scale (key.scale):
//   S_ij = Q_i . K_j / sqrt(HS)                   (j > i excluded when causal: P_ij = 0)
//   P_i  = softmax(S_i)                            saved in att (before dropout)
//   Pd_ij = P_ij M_ij s                            M from philox::attn_keep(key, bh, i, j)
//   O_i  = sum_j Pd_ij V_j                         written to out[b, i, h*HS : h*HS+HS]
// Backward, with dO the upstream gradient:
//   dPd_ij = dO_i . V_j,  dV_j += Pd_ij dO_i,  dP_ij = dPd_ij M_ij s,
//   D_i = sum_j P_ij dP_ij,  dS_ij = P_ij (dP_ij - D_i),
//   dQ_i += sum_j dS_ij K_j / sqrt(HS),  dK_j += sum_i dS_ij Q_i / sqrt(HS).
// The backward regenerates M from the key (nothing but att is saved). key.threshold == 0 is
// "no dropout": Philox is not called and every applied entry counts as kept.
// Arithmetic is in T (float accumulation for float, all double for double); the dot products
// are "omp simd" reductions (vectorised: partial sums per lane, then combined). The (b, h)
// pairs run in parallel; each writes only its own head's columns of out / dqkv, so no races.
#include "attention_naive.h"

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "attention_common.h"
#include "real.h"

namespace cpu {

namespace {

// keep[j] for j in [0, jn) of row i of batch-head bh: one Philox call per 8 columns (the same
// decisions as philox::attn_keep, bit j % 8 of the call's keep byte for column j).
void keep_row(uint8_t* keep, const philox::DropoutKey& key, uint32_t bh, int i, int jn) {
  const uint32_t thr = philox::attn_threshold(key);
  uint32_t byte = 0;
  for (int j = 0; j < jn; ++j) {
    if ((j & 7) == 0) byte = philox::attn_keep_byte(philox::attn_words(key, bh, (uint32_t)i, (uint32_t)j), thr);
    keep[j] = (byte >> (j & 7)) & 1u;
  }
}

}  // namespace

template <typename T>
void attention_naive_forward(T* out, T* att, const T* qkv, const philox::DropoutKey& key, int B,
                             int Tn, int C, int NH, bool causal, uint8_t* mask) {
  const int HS = C / NH;
  const size_t C3 = 3 * (size_t)C;
  const T sc = T(1) / std::sqrt(T(HS));
  const bool drop = key.threshold != 0;
  const T s = drop ? (T)key.scale : T(1);
#pragma omp parallel for collapse(2) schedule(static) if (attention_parallel_worth_it(B, NH, Tn, HS))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const uint32_t bh = (uint32_t)(b * NH + h);
      const T* q = qkv + (size_t)b * Tn * C3 + (size_t)h * HS;
      const T* k = q + C;
      const T* v = q + 2 * (size_t)C;
      T* a = att + (size_t)bh * Tn * Tn;
      uint8_t* mk = mask ? mask + (size_t)bh * Tn * Tn : nullptr;
      std::vector<uint8_t> keep((size_t)Tn, 1);
      for (int i = 0; i < Tn; ++i) {
        const int jn = causal ? i + 1 : Tn;
        const T* qi = q + (size_t)i * C3;
        T* ai = a + (size_t)i * Tn;
        // S_i and its max
        T mx = -std::numeric_limits<T>::infinity();
        for (int j = 0; j < jn; ++j) {
          const T* kj = k + (size_t)j * C3;
          T d = 0;
#pragma omp simd reduction(+ : d)
          for (int c = 0; c < HS; ++c) d += qi[c] * kj[c];
          d *= sc;
          ai[j] = d;
          if (d > mx) mx = d;
        }
        // P_i = softmax(S_i); excluded entries exactly 0
        T sum = 0;
        for (int j = 0; j < jn; ++j) {
          const T e = std::exp(ai[j] - mx);
          ai[j] = e;
          sum += e;
        }
        const T inv = T(1) / sum;
        for (int j = 0; j < jn; ++j) ai[j] *= inv;
        for (int j = jn; j < Tn; ++j) ai[j] = 0;
        // M_i
        if (drop) keep_row(keep.data(), key, bh, i, jn);
        if (mk)
          for (int j = 0; j < jn; ++j) mk[(size_t)i * Tn + j] = keep[j];
        // O_i = sum_j P_ij M_ij s V_j
        T* oi = out + ((size_t)b * Tn + i) * C + (size_t)h * HS;
        for (int c = 0; c < HS; ++c) oi[c] = 0;
        for (int j = 0; j < jn; ++j) {
          if (!keep[j]) continue;
          const T pd = ai[j] * s;
          const T* vj = v + (size_t)j * C3;
          for (int c = 0; c < HS; ++c) oi[c] += pd * vj[c];
        }
      }
    }
  }
}

template <typename T>
void attention_naive_backward(T* dqkv, const T* dout, const T* qkv, const T* att,
                              const philox::DropoutKey& key, int B, int Tn, int C, int NH,
                              bool causal) {
  const int HS = C / NH;
  const size_t C3 = 3 * (size_t)C;
  const T sc = T(1) / std::sqrt(T(HS));
  const bool drop = key.threshold != 0;
  const T s = drop ? (T)key.scale : T(1);
#pragma omp parallel for collapse(2) schedule(static) if (attention_parallel_worth_it(B, NH, Tn, HS))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const uint32_t bh = (uint32_t)(b * NH + h);
      const size_t off = (size_t)b * Tn * C3 + (size_t)h * HS;
      const T* q = qkv + off;
      const T* k = q + C;
      const T* v = q + 2 * (size_t)C;
      T* dq = dqkv + off;
      T* dk = dq + C;
      T* dv = dq + 2 * (size_t)C;
      const T* a = att + (size_t)bh * Tn * Tn;
      std::vector<uint8_t> keep((size_t)Tn, 1);
      std::vector<T> dp((size_t)Tn);
      for (int i = 0; i < Tn; ++i) {
        const int jn = causal ? i + 1 : Tn;
        const T* ai = a + (size_t)i * Tn;
        const T* doi = dout + ((size_t)b * Tn + i) * C + (size_t)h * HS;
        if (drop) keep_row(keep.data(), key, bh, i, jn);
        // dPd_ij = dO_i . V_j, dV_j += Pd_ij dO_i, dP_ij = dPd_ij M_ij s, D_i = sum_j P_ij dP_ij
        T D = 0;
        for (int j = 0; j < jn; ++j) {
          if (!keep[j]) {
            dp[j] = 0;
            continue;
          }
          const T* vj = v + (size_t)j * C3;
          T* dvj = dv + (size_t)j * C3;
          const T pd = ai[j] * s;
          T dpd = 0;
#pragma omp simd reduction(+ : dpd)
          for (int c = 0; c < HS; ++c) {
            dpd += doi[c] * vj[c];
            dvj[c] += pd * doi[c];
          }
          dp[j] = dpd * s;
          D += ai[j] * dp[j];
        }
        // dS_ij = P_ij (dP_ij - D_i); dQ_i += dS_ij K_j / sqrt(HS); dK_j += dS_ij Q_i / sqrt(HS)
        const T* qi = q + (size_t)i * C3;
        T* dqi = dq + (size_t)i * C3;
        for (int j = 0; j < jn; ++j) {
          const T ds = ai[j] * (dp[j] - D) * sc;
          const T* kj = k + (size_t)j * C3;
          T* dkj = dk + (size_t)j * C3;
          for (int c = 0; c < HS; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
        }
      }
    }
  }
}

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void attention_naive_forward<Real>(Real*, Real*, const Real*, const philox::DropoutKey&, int, int, int, int,
                                            bool, uint8_t*);
template void attention_naive_backward<Real>(Real*, const Real*, const Real*, const Real*, const philox::DropoutKey&,
                                             int, int, int, int, bool);

}  // namespace cpu
