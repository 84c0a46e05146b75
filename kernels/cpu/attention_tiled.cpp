// kernels/cpu/attention_tiled.cpp: FlashAttention-2 (Dao 2023, algorithms 1 and 2) in plain
// loops: the spec of the fused GPU kernels (contract in kernels/cpu/attention_tiled.h; same
// math, dropout mask and qkv / out layout as kernels/cpu/attention_naive.h).
// Per batch b and head h, Q, K, V are the (T, HS) slices of qkv; the query rows are cut into
// tiles Q_i of Br rows, the key / value rows into tiles K_j, V_j of Bc rows (the last tile of
// each may be short; Br, Bc may exceed T). s = 1 / (1 - p) = key.scale, M the Philox mask.
// Forward (algorithm 1), per Q_i:
//   m_i = -inf, l_i = 0, O_i = 0
//   for each K_j, V_j (causal: tiles with first key > last query of Q_i are skipped):
//     S_ij  = Q_i K_j^T / sqrt(HS)             (-inf at j > i inside the diagonal tile)
//     m_new = max(m_i, rowmax(S_ij)),  P~_ij = exp(S_ij - m_new)
//     l_i   = exp(m_i - m_new) l_i + rowsum(P~_ij)           (softmax sum: before dropout)
//     O_i   = exp(m_i - m_new) O_i + (P~_ij o M_ij s) V_j,  m_i = m_new
//   O_i = O_i / l_i,  lse_i = m_i + log(l_i)
// Only out and lse (B, NH, T) are stored; nothing of size T x T.
// Backward (algorithm 2): D_i = rowsum(dO_i o O_i) (equal to sum_j P_ij dP_ij, since
// O_i = sum_j Pd_ij V_j); then for each K_j, V_j (outer) and each Q_i (inner):
//   P_ij = exp(S_ij - lse_i),  Pd_ij = P_ij o M_ij s               (recomputed, same mask)
//   dV_j += Pd_ij^T dO_i,  dPd_ij = dO_i V_j^T,  dP_ij = dPd_ij o M_ij s
//   dS_ij = P_ij o (dP_ij - D_i),  dQ_i += dS_ij K_j / sqrt(HS),  dK_j += dS_ij^T Q_i / sqrt(HS)
// dK_j, dV_j live in a tile accumulator and are added to dqkv after the inner loop; dQ_i is
// added to dqkv directly. Arithmetic in T. The (b, h) pairs run in parallel.
// The mask dump (optional) is written where the forward applies dropout to P~_ij, so it
// records the decisions the tiled loop really used.
#include "attention_tiled.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace cpu {

namespace {

// OpenMP only when there is enough work: a parallel region costs microseconds (much more on
// a loaded machine), and the small shapes of the tests would be dominated by it.
inline bool parallel_worth_it(int B, int NH, int Tn, int HS) {
  return (long)B * NH * Tn * Tn * HS >= (1L << 16);
}

// Geometry of one (b, h): where the Q / K / V slices start and the row stride of qkv.
struct Head {
  int Tn, HS;
  size_t ld;    // 3C
  size_t qoff;  // offset of Q[0, 0] of this (b, h) inside qkv (K at +C, V at +2C)
  size_t ooff;  // offset of out[b, 0, h*HS]
  size_t C;
  uint32_t bh;
};

// Load rows r0 .. r0+n-1 of a (T, HS) slice with row stride ld into a dense (n, HS) tile.
template <typename T>
void load_tile(T* tile, const T* src, size_t ld, int r0, int n, int HS) {
  for (int r = 0; r < n; ++r) {
    const T* row = src + (size_t)(r0 + r) * ld;
    for (int c = 0; c < HS; ++c) tile[(size_t)r * HS + c] = row[c];
  }
}

// S_ij = Q_i K_j^T / sqrt(HS), (nr, nc); -inf at key j > query i when causal.
template <typename T>
void compute_scores(T* Sij, const T* Qi, const T* Kj, int nr, int nc, int HS, T sc, int i0,
                    int j0, bool causal) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int r = 0; r < nr; ++r) {
    for (int c = 0; c < nc; ++c) {
      if (causal && j0 + c > i0 + r) {
        Sij[(size_t)r * nc + c] = ninf;
        continue;
      }
      T d = 0;
      for (int x = 0; x < HS; ++x) d += Qi[(size_t)r * HS + x] * Kj[(size_t)c * HS + x];
      Sij[(size_t)r * nc + c] = d * sc;
    }
  }
}

// Online softmax update, in place: Sij becomes P~_ij = exp(S_ij - m_new);
// alpha_r = exp(m_i - m_new); l_i = alpha l_i + rowsum(P~_ij); m_i = m_new.
template <typename T>
void online_softmax_update(T* Sij, T* mi, T* li, T* alpha, int nr, int nc) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int r = 0; r < nr; ++r) {
    T* row = Sij + (size_t)r * nc;
    T m_new = mi[r];
    for (int c = 0; c < nc; ++c) m_new = std::max(m_new, row[c]);
    if (m_new == ninf) {  // nothing unmasked yet in this row: P~ = 0, state unchanged
      for (int c = 0; c < nc; ++c) row[c] = 0;
      alpha[r] = 1;
      continue;
    }
    T rowsum = 0;
    for (int c = 0; c < nc; ++c) {
      row[c] = std::exp(row[c] - m_new);  // exp(-inf) = 0 at masked entries
      rowsum += row[c];
    }
    alpha[r] = std::exp(mi[r] - m_new);  // 0 on the first tile (m_i = -inf)
    li[r] = alpha[r] * li[r] + rowsum;
    mi[r] = m_new;
  }
}

// M_ij for rows i0 .. i0+nr-1, columns j0 .. j0+nc-1 (keep[r * nc + c]); entries above the
// causal diagonal are left as they are (never used). One Philox call per 4 aligned columns.
void dropout_tile_mask(uint8_t* keep, const philox::DropoutKey& key, uint32_t bh, int i0,
                       int j0, int nr, int nc, bool causal) {
  for (int r = 0; r < nr; ++r) {
    const int i = i0 + r;
    const int jend = causal ? std::min(j0 + nc, i + 1) : j0 + nc;
    philox::U32x4 w{};
    for (int j = j0; j < jend; ++j) {
      if (j == j0 || (j & 3) == 0) w = philox::dropout_words(key, bh, (uint32_t)i, (uint32_t)j);
      keep[(size_t)r * nc + (j - j0)] = w.v[j & 3] >= key.threshold ? 1 : 0;
    }
  }
}

// Dropout on P~_ij in place: P~_ij o M_ij s (s = 1 / (1 - p)); records M_ij in the dump.
template <typename T>
void apply_dropout(T* Pij, uint8_t* keep, const philox::DropoutKey& key, const Head& hd, int i0,
                   int j0, int nr, int nc, bool causal, uint8_t* mask) {
  const bool drop = key.threshold != 0;
  if (drop) dropout_tile_mask(keep, key, hd.bh, i0, j0, nr, nc, causal);
  const T s = (T)key.scale;
  for (int r = 0; r < nr; ++r) {
    const int i = i0 + r;
    const int cend = causal ? std::min(nc, i + 1 - j0) : nc;
    uint8_t* mrow = mask ? mask + ((size_t)hd.bh * hd.Tn + i) * hd.Tn + j0 : nullptr;
    for (int c = 0; c < cend; ++c) {
      const uint8_t k = drop ? keep[(size_t)r * nc + c] : 1;
      if (drop) Pij[(size_t)r * nc + c] = k ? Pij[(size_t)r * nc + c] * s : T(0);
      if (mrow) mrow[c] = k;
    }
  }
}

// O_i = diag(alpha) O_i + Pd_ij V_j.
template <typename T>
void rescale_and_accumulate(T* Oi, const T* alpha, const T* Pd, const T* Vj, int nr, int nc,
                            int HS) {
  for (int r = 0; r < nr; ++r) {
    T* o = Oi + (size_t)r * HS;
    for (int x = 0; x < HS; ++x) o[x] *= alpha[r];
    for (int c = 0; c < nc; ++c) {
      const T p = Pd[(size_t)r * nc + c];
      if (p == T(0)) continue;
      const T* vv = Vj + (size_t)c * HS;
      for (int x = 0; x < HS; ++x) o[x] += p * vv[x];
    }
  }
}

// O_i = diag(l_i)^-1 O_i, written to out rows i0 .. i0+nr-1 of this head.
template <typename T>
void write_output(T* out, const T* Oi, const T* li, const Head& hd, int i0, int nr) {
  for (int r = 0; r < nr; ++r) {
    T* o = out + hd.ooff + (size_t)(i0 + r) * hd.C;
    const T inv = T(1) / li[r];
    for (int x = 0; x < hd.HS; ++x) o[x] = Oi[(size_t)r * hd.HS + x] * inv;
  }
}

// lse_i = m_i + log(l_i).
template <typename T>
void write_lse(T* lse, const T* mi, const T* li, const Head& hd, int i0, int nr) {
  for (int r = 0; r < nr; ++r) lse[(size_t)hd.bh * hd.Tn + i0 + r] = mi[r] + std::log(li[r]);
}

// D_i = rowsum(dO_i o O_i) for every row of this head.
template <typename T>
void compute_D(T* D, const T* dout, const T* out, const Head& hd) {
  for (int i = 0; i < hd.Tn; ++i) {
    const T* o = out + hd.ooff + (size_t)i * hd.C;
    const T* d = dout + hd.ooff + (size_t)i * hd.C;
    T acc = 0;
    for (int x = 0; x < hd.HS; ++x) acc += d[x] * o[x];
    D[i] = acc;
  }
}

// P_ij = exp(S_ij - lse_i) in place (masked -inf entries give 0).
template <typename T>
void recompute_probs(T* Sij, const T* lse_i, int nr, int nc) {
  for (int r = 0; r < nr; ++r)
    for (int c = 0; c < nc; ++c) {
      T& x = Sij[(size_t)r * nc + c];
      x = std::exp(x - lse_i[r]);
    }
}

Head make_head(int b, int h, int Tn, int C, int NH) {
  Head hd;
  hd.Tn = Tn;
  hd.HS = C / NH;
  hd.C = (size_t)C;
  hd.ld = 3 * (size_t)C;
  hd.qoff = (size_t)b * Tn * hd.ld + (size_t)h * hd.HS;
  hd.ooff = (size_t)b * Tn * C + (size_t)h * hd.HS;
  hd.bh = (uint32_t)(b * NH + h);
  return hd;
}

}  // namespace

template <typename T>
void attention_tiled_forward(T* out, T* lse, const T* qkv, const philox::DropoutKey& key, int B,
                             int Tn, int C, int NH, bool causal, int Br, int Bc, uint8_t* mask) {
  const int HS = C / NH;
  const T sc = T(1) / std::sqrt(T(HS));
  const T ninf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for collapse(2) schedule(static) if (parallel_worth_it(B, NH, Tn, HS))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const Head hd = make_head(b, h, Tn, C, NH);
      const T* Q = qkv + hd.qoff;
      const T* K = Q + C;
      const T* V = Q + 2 * (size_t)C;
      std::vector<T> Qi((size_t)Br * HS), Kj((size_t)Bc * HS), Vj((size_t)Bc * HS);
      std::vector<T> Sij((size_t)Br * Bc), Oi((size_t)Br * HS), mi(Br), li(Br), alpha(Br);
      std::vector<uint8_t> keep((size_t)Br * Bc);
      for (int i0 = 0; i0 < Tn; i0 += Br) {
        const int nr = std::min(Br, Tn - i0);
        load_tile(Qi.data(), Q, hd.ld, i0, nr, HS);
        // m_i = -inf, l_i = 0, O_i = 0
        std::fill(mi.begin(), mi.end(), ninf);
        std::fill(li.begin(), li.end(), T(0));
        std::fill(Oi.begin(), Oi.end(), T(0));
        for (int j0 = 0; j0 < Tn; j0 += Bc) {
          if (causal && j0 > i0 + nr - 1) break;  // tile wholly above the diagonal
          const int nc = std::min(Bc, Tn - j0);
          load_tile(Kj.data(), K, hd.ld, j0, nc, HS);
          load_tile(Vj.data(), V, hd.ld, j0, nc, HS);
          // S_ij = Q_i K_j^T / sqrt(HS)
          compute_scores(Sij.data(), Qi.data(), Kj.data(), nr, nc, HS, sc, i0, j0, causal);
          // m_new = max(m_i, rowmax S_ij), P~_ij = exp(S_ij - m_new),
          // l_i = e^(m_i - m_new) l_i + rowsum(P~_ij)
          online_softmax_update(Sij.data(), mi.data(), li.data(), alpha.data(), nr, nc);
          // P~_ij o M_ij / (1 - p)
          apply_dropout(Sij.data(), keep.data(), key, hd, i0, j0, nr, nc, causal, mask);
          // O_i = e^(m_i-m_new) O_i + (P~_ij o M_ij / (1 - p)) V_j
          rescale_and_accumulate(Oi.data(), alpha.data(), Sij.data(), Vj.data(), nr, nc, HS);
        }
        // O_i = diag(l_i)^-1 O_i, lse_i = m_i + log(l_i)
        write_output(out, Oi.data(), li.data(), hd, i0, nr);
        write_lse(lse, mi.data(), li.data(), hd, i0, nr);
      }
    }
  }
}

template <typename T>
void attention_tiled_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                              const philox::DropoutKey& key, int B, int Tn, int C, int NH,
                              bool causal, int Br, int Bc) {
  const int HS = C / NH;
  const T sc = T(1) / std::sqrt(T(HS));
  const bool drop = key.threshold != 0;
  const T s = drop ? (T)key.scale : T(1);
#pragma omp parallel for collapse(2) schedule(static) if (parallel_worth_it(B, NH, Tn, HS))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const Head hd = make_head(b, h, Tn, C, NH);
      const T* Q = qkv + hd.qoff;
      const T* K = Q + C;
      const T* V = Q + 2 * (size_t)C;
      T* dQ = dqkv + hd.qoff;
      T* dK = dQ + C;
      T* dV = dQ + 2 * (size_t)C;
      const T* lse_h = lse + (size_t)hd.bh * Tn;
      std::vector<T> Qi((size_t)Br * HS), dOi((size_t)Br * HS), Kj((size_t)Bc * HS),
          Vj((size_t)Bc * HS), dKj((size_t)Bc * HS), dVj((size_t)Bc * HS);
      std::vector<T> Pij((size_t)Br * Bc), dSij((size_t)Br * Bc), D(Tn);
      std::vector<uint8_t> keep((size_t)Br * Bc, 1);
      // D_i = rowsum(dO_i o O_i)
      compute_D(D.data(), dout, out, hd);
      for (int j0 = 0; j0 < Tn; j0 += Bc) {
        const int nc = std::min(Bc, Tn - j0);
        load_tile(Kj.data(), K, hd.ld, j0, nc, HS);
        load_tile(Vj.data(), V, hd.ld, j0, nc, HS);
        std::fill(dKj.begin(), dKj.end(), T(0));
        std::fill(dVj.begin(), dVj.end(), T(0));
        for (int i0 = 0; i0 < Tn; i0 += Br) {
          const int nr = std::min(Br, Tn - i0);
          if (causal && j0 > i0 + nr - 1) continue;  // tile wholly above the diagonal
          load_tile(Qi.data(), Q, hd.ld, i0, nr, HS);
          load_tile(dOi.data(), dout + hd.ooff, hd.C, i0, nr, HS);
          // S_ij = Q_i K_j^T / sqrt(HS), P_ij = exp(S_ij - lse_i)
          compute_scores(Pij.data(), Qi.data(), Kj.data(), nr, nc, HS, sc, i0, j0, causal);
          recompute_probs(Pij.data(), lse_h + i0, nr, nc);
          // M_ij, the same decisions as the forward
          if (drop) dropout_tile_mask(keep.data(), key, hd.bh, i0, j0, nr, nc, causal);
          for (int r = 0; r < nr; ++r) {
            const int cend = causal ? std::min(nc, i0 + r + 1 - j0) : nc;
            const T* dor = dOi.data() + (size_t)r * HS;
            const T Di = D[i0 + r];
            for (int c = 0; c < nc; ++c) {
              const size_t rc = (size_t)r * nc + c;
              if (c >= cend || !keep[rc]) {  // masked by causality or dropped: Pd = dP = 0
                dSij[rc] = Pij[rc] * (T(0) - Di);
                continue;
              }
              // dV_j += Pd_ij^T dO_i, dPd_ij = dO_i V_j^T
              const T pd = Pij[rc] * s;
              const T* vv = Vj.data() + (size_t)c * HS;
              T* dvv = dVj.data() + (size_t)c * HS;
              T dpd = 0;
              for (int x = 0; x < HS; ++x) {
                dvv[x] += pd * dor[x];
                dpd += dor[x] * vv[x];
              }
              // dP_ij = dPd_ij o M_ij / (1 - p), dS_ij = P_ij o (dP_ij - D_i)
              dSij[rc] = Pij[rc] * (dpd * s - Di);
            }
          }
          // dQ_i += dS_ij K_j / sqrt(HS) (into dqkv), dK_j += dS_ij^T Q_i / sqrt(HS)
          for (int r = 0; r < nr; ++r) {
            T* dq = dQ + (size_t)(i0 + r) * hd.ld;
            const T* qr = Qi.data() + (size_t)r * HS;
            for (int c = 0; c < nc; ++c) {
              const T ds = dSij[(size_t)r * nc + c] * sc;
              if (ds == T(0)) continue;
              const T* kk = Kj.data() + (size_t)c * HS;
              T* dkk = dKj.data() + (size_t)c * HS;
              for (int x = 0; x < HS; ++x) {
                dq[x] += ds * kk[x];
                dkk[x] += ds * qr[x];
              }
            }
          }
        }
        // dK_j, dV_j into dqkv
        for (int c = 0; c < nc; ++c) {
          T* dk = dK + (size_t)(j0 + c) * hd.ld;
          T* dv = dV + (size_t)(j0 + c) * hd.ld;
          for (int x = 0; x < HS; ++x) {
            dk[x] += dKj[(size_t)c * HS + x];
            dv[x] += dVj[(size_t)c * HS + x];
          }
        }
      }
    }
  }
}

template void attention_tiled_forward<float>(float*, float*, const float*,
                                             const philox::DropoutKey&, int, int, int, int, bool,
                                             int, int, uint8_t*);
template void attention_tiled_forward<double>(double*, double*, const double*,
                                              const philox::DropoutKey&, int, int, int, int,
                                              bool, int, int, uint8_t*);
template void attention_tiled_backward<float>(float*, const float*, const float*, const float*,
                                              const float*, const philox::DropoutKey&, int, int,
                                              int, int, bool, int, int);
template void attention_tiled_backward<double>(double*, const double*, const double*,
                                               const double*, const double*,
                                               const philox::DropoutKey&, int, int, int, int, bool,
                                               int, int);

}  // namespace cpu
