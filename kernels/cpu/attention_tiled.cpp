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
// added to dqkv directly. Arithmetic in T. Each tile product (Q_i K_j^T, P V_j, ...) is one
// product of row-major maps of the tiles (tile_product: Eigen's, or the float GEMM of
// kernels/cpu/gemm.h), written as the equation it computes; the
// softmax, causal mask and dropout are plain loops. A causal tile that crosses the diagonal
// is multiplied in bands of 32 query rows (or keys), each band's product stopping where the
// whole band is masked (for_row_bands): only terms that are exactly 0 are skipped. The (b, h)
// pairs run in parallel.
// The mask dump (optional) is written where the forward applies dropout to P~_ij, so it
// records the decisions the tiled loop really used.
#include "attention_tiled.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_common.h"
#include "eigen.h"
#include "gemm.h"
#include "real.h"

namespace cpu {

namespace {

// Geometry of one (b, h): where its Q / K / V slices start and their row strides.
struct Head {
  int Tn, HS;
  size_t ld;    // 3C: row stride of qkv
  size_t C;     // row stride of out / dout
  size_t qoff;  // offset of Q[0, 0] of this (b, h) inside qkv (K at +C, V at +2C)
  size_t ooff;  // offset of out[b, 0, h*HS]
  uint32_t bh;
};

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

// Rows r0 .. r0+n-1 of a (T, HS) slice with row stride ld, as an (n, HS) matrix (no copy).
template <typename T>
StridedConstMat<T> load_tile(const T* src, size_t ld, int r0, int n, int HS) {
  return StridedConstMat<T>(src + (size_t)r0 * ld, n, HS, Eigen::OuterStride<>((Eigen::Index)ld));
}
template <typename T>
StridedMat<T> tile(T* src, size_t ld, int r0, int n, int HS) {
  return StridedMat<T>(src + (size_t)r0 * ld, n, HS, Eigen::OuterStride<>((Eigen::Index)ld));
}

// C = A B (add = false) or C += A B for tiles: Eigen's product, or in float (with a vector
// kernel: AVX2 + FMA or AVX-512) gemm_f32 (kernels/cpu/gemm.h) on the tiles' own strides,
// about 1.5x Eigen's speed at these sizes (AVX2). A and B may be transposes of maps.
template <typename X>
long row_stride(const X& x) { return X::IsRowMajor ? (long)x.outerStride() : (long)x.innerStride(); }
template <typename X>
long col_stride(const X& x) { return X::IsRowMajor ? (long)x.innerStride() : (long)x.outerStride(); }
template <typename Dst, typename A, typename B>
void tile_product(Dst&& C, const A& a, const B& b, bool add) {
  using T = typename std::decay_t<Dst>::Scalar;
  if constexpr (std::is_same<T, float>::value && kGemmF32Fast) {
    gemm_f32((int)C.rows(), (int)C.cols(), (int)a.cols(), a.data(), row_stride(a), col_stride(a), b.data(),
             row_stride(b), col_stride(b), C.data(), row_stride(C), add);
  } else {
    if (add) C.noalias() += a * b;
    else C.noalias() = a * b;
  }
}

// The unmasked front of row r of a tile: keys j0 .. j0 + cend - 1. Causal: keys up to the
// query i0 + r (0 for a row wholly above the diagonal); else the whole row.
inline int unmasked(int i0, int j0, int r, int nc, bool causal) {
  return causal ? std::max(0, std::min(nc, i0 + r + 1 - j0)) : nc;
}

// The causal structure of a tile in bands of kBand query rows: rows r0 .. r1 - 1 see keys
// 0 .. ke - 1 of the tile at most (ke: the last row's unmasked front); keys past ke are masked
// for the whole band. The products below skip those parts, which hold exact zeros (P, dS) or
// are never read (S, dP), so the sums are those of the whole tile: on the diagonal tile of
// T = 64 with bands of 32 rows, each product does 3/4 of the whole tile's work. A tile with
// nothing masked (or no causal mask) is one band.
constexpr int kBand = 32;
template <typename F>
void for_row_bands(int i0, int j0, int nr, int nc, bool causal, F&& f) {
  if (!causal || unmasked(i0, j0, 0, nc, true) == nc) return f(0, nr, nc);
  for (int r0 = 0; r0 < nr; r0 += kBand) {
    const int r1 = std::min(nr, r0 + kBand), ke = unmasked(i0, j0, r1 - 1, nc, true);
    if (ke > 0) f(r0, r1, ke);
  }
}
// The same by bands of kBand keys: keys c0 .. c1 - 1 are seen by query rows rs .. nr - 1 at
// most (rs: the first row that sees key c0).
template <typename F>
void for_key_bands(int i0, int j0, int nr, int nc, bool causal, F&& f) {
  if (!causal || unmasked(i0, j0, 0, nc, true) == nc) return f(0, nc, 0);
  for (int c0 = 0; c0 < nc; c0 += kBand) {
    const int c1 = std::min(nc, c0 + kBand), rs = std::max(0, c0 + j0 - i0);
    if (rs < nr) f(c0, c1, rs);
  }
}

// row[c] = exp(row[c] sc - shift) for c < cend (Eigen's vectorised exp) and 0 from cend to nc:
// the scaled scores' exponentials, with the causal mask's entries exactly 0.
template <typename T>
void exp_row(T* row, int cend, int nc, T sc, T shift) {
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> p(row, cend);
  p = (p * sc - shift).exp();
  std::fill(row + cend, row + nc, T(0));
}

// Online softmax update, in place, on the raw scores Q_i K_j^T (scaled by sc here: since sc > 0
// and rounding is monotone, the row maximum of the scaled scores is sc times that of the raw
// ones): Sij becomes P~_ij = exp(S_ij - m_new) (0 where masked); alpha_r = exp(m_i - m_new);
// l_i = alpha l_i + rowsum(P~_ij); m_i = m_new.
template <typename T>
void online_softmax_update(MapMat<T>& Sij, T sc, int i0, int j0, int nr, int nc, bool causal, T* mi, T* li,
                           T* alpha) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int r = 0; r < nr; ++r) {
    T* row = &Sij(r, 0);
    const int cend = unmasked(i0, j0, r, nc, causal);
    T m_new = mi[r];
    if (cend > 0) m_new = std::max(m_new, Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(row, cend).maxCoeff() * sc);
    if (m_new == ninf) {  // nothing unmasked yet in this row: P~ = 0, state unchanged
      std::fill(row, row + nc, T(0));
      alpha[r] = 1;
      continue;
    }
    exp_row(row, cend, nc, sc, m_new);
    const T rowsum = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(row, cend).sum();
    alpha[r] = std::exp(mi[r] - m_new);  // 0 on the first tile (m_i = -inf)
    li[r] = alpha[r] * li[r] + rowsum;
    mi[r] = m_new;
  }
}

// Dropout on a tile in place: X_ij o M_ij s (s = 1 / (1 - p)), for rows i0 .. i0+nr-1 and
// columns j0 .. j0+nc-1; entries above the causal diagonal are 0 already and left alone.
// M_ij = philox::attn_keep (kernels/philox.h), one Philox call per 8 aligned columns. When
// mask is not null the decisions are recorded there (all kept when p = 0). Row r of the call
// is row rbase + r of Xij (a band of the tile).
template <typename T>
void apply_dropout(MapMat<T>& Xij, const philox::DropoutKey& key, const Head& hd, int i0, int j0, int nr, int nc,
                   bool causal, uint8_t* mask, int rbase = 0) {
  const bool drop = key.threshold != 0;
  if (!drop && !mask) return;
  const T s = (T)key.scale;
  for (int r = 0; r < nr; ++r) {
    const int i = i0 + r;
    const int cend = causal ? std::min(nc, i + 1 - j0) : nc;
    uint8_t* mrow = mask ? mask + ((size_t)hd.bh * hd.Tn + i) * hd.Tn + j0 : nullptr;
    const uint32_t thr = philox::attn_threshold(key);
    uint32_t byte = 0;
    for (int c = 0; c < cend; ++c) {
      const int j = j0 + c;
      bool keep = true;
      if (drop) {
        if (c == 0 || (j & 7) == 0)
          byte = philox::attn_keep_byte(philox::attn_words(key, hd.bh, (uint32_t)i, (uint32_t)j), thr);
        keep = (byte >> (j & 7)) & 1u;
        Xij(rbase + r, c) = keep ? Xij(rbase + r, c) * s : T(0);
      }
      if (mrow) mrow[c] = keep;
    }
  }
}

// P_ij = exp(S_ij / sqrt(HS) - lse_i) in place on the raw scores (0 where masked).
template <typename T>
void recompute_probs(MapMat<T>& Sij, T sc, const T* lse_i, int i0, int j0, int nr, int nc, bool causal) {
  for (int r = 0; r < nr; ++r) exp_row(&Sij(r, 0), unmasked(i0, j0, r, nc, causal), nc, sc, lse_i[r]);
}

// The tiles of one thread, kept from call to call: a thread allocates them the first time it
// needs tiles of that size (or larger), never again in the steady state of a training run.
// Tiles of nr x nc <= Br x Bc are maps over the front of S, P, dS.
template <typename T>
struct TileScratch {
  RowMat<T> S, O, P, dS, dK, dV;
  Eigen::Matrix<T, Eigen::Dynamic, 1> m, l, alpha, D;
};
template <typename T>
TileScratch<T>& tile_scratch(int Br, int Bc, int HS, int Tn) {
  thread_local TileScratch<T> w;
  auto fit = [](auto& x, Eigen::Index r, Eigen::Index c) {
    if (x.rows() < r || x.cols() < c) x.resize(std::max(r, (Eigen::Index)x.rows()), std::max(c, (Eigen::Index)x.cols()));
  };
  for (RowMat<T>* x : {&w.S, &w.P, &w.dS}) fit(*x, Br, Bc);
  fit(w.O, Br, HS);
  fit(w.dK, Bc, HS);
  fit(w.dV, Bc, HS);
  for (auto* x : {&w.m, &w.l, &w.alpha}) fit(*x, Br, 1);
  fit(w.D, Tn, 1);
  return w;
}

}  // namespace

template <typename T>
void attention_tiled_forward(T* out, T* lse, const T* qkv, const philox::DropoutKey& key, int B, int Tn, int C,
                             int NH, bool causal, int Br, int Bc, uint8_t* mask) {
  const int HS = C / NH;
  const T sc = T(1) / std::sqrt(T(HS));
  const T ninf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for collapse(2) schedule(static) if (attention_parallel_worth_it(B, NH, Tn, HS))
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const Head hd = make_head(b, h, Tn, C, NH);
      const T* Q = qkv + hd.qoff;
      const T* K = Q + C;
      const T* V = Q + 2 * (size_t)C;
      TileScratch<T>& w = tile_scratch<T>(Br, Bc, HS, Tn);
      auto Oi = w.O.topLeftCorner(Br, HS);
      T *mi = w.m.data(), *li = w.l.data(), *alpha = w.alpha.data();
      for (int i0 = 0; i0 < Tn; i0 += Br) {
        const int nr = std::min(Br, Tn - i0);
        const auto Qi = load_tile(Q, hd.ld, i0, nr, HS);
        // m_i = -inf, l_i = 0, O_i = 0
        std::fill(mi, mi + Br, ninf);
        std::fill(li, li + Br, T(0));
        Oi.setZero();
        for (int j0 = 0; j0 < Tn; j0 += Bc) {
          if (causal && j0 > i0 + nr - 1) break;  // tile wholly above the diagonal
          const int nc = std::min(Bc, Tn - j0);
          const auto Kj = load_tile(K, hd.ld, j0, nc, HS);
          const auto Vj = load_tile(V, hd.ld, j0, nc, HS);
          // S_ij = Q_i K_j^T / sqrt(HS) (the scale applied inside the softmax update)
          MapMat<T> Sij(w.S.data(), nr, nc);
          for_row_bands(i0, j0, nr, nc, causal, [&](int r0, int r1, int ke) {
            tile_product(Sij.block(r0, 0, r1 - r0, ke), Qi.middleRows(r0, r1 - r0), Kj.topRows(ke).transpose(), false);
          });
          // m_new = max(m_i, rowmax S_ij), P~_ij = exp(S_ij - m_new), l_i = e^(m_i - m_new) l_i + rowsum(P~_ij)
          online_softmax_update(Sij, sc, i0, j0, nr, nc, causal, mi, li, alpha);
          // P~_ij o M_ij / (1 - p)
          apply_dropout(Sij, key, hd, i0, j0, nr, nc, causal, mask);
          // O_i = diag(e^(m_i - m_new)) O_i + (P~_ij o M_ij / (1 - p)) V_j (O_i is still 0 on the first tile)
          if (j0 > 0)
            for (int r = 0; r < nr; ++r) Oi.row(r) *= alpha[r];
          for_row_bands(i0, j0, nr, nc, causal, [&](int r0, int r1, int ke) {
            tile_product(Oi.middleRows(r0, r1 - r0), Sij.block(r0, 0, r1 - r0, ke), Vj.topRows(ke), true);
          });
        }
        // O_i = diag(l_i)^-1 O_i, lse_i = m_i + log(l_i)
        auto out_i = tile(out + hd.ooff, hd.C, i0, nr, HS);
        for (int r = 0; r < nr; ++r) {
          out_i.row(r) = Oi.row(r) / li[r];
          lse[(size_t)hd.bh * Tn + i0 + r] = mi[r] + std::log(li[r]);
        }
      }
    }
  }
}

template <typename T>
void attention_tiled_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse,
                              const philox::DropoutKey& key, int B, int Tn, int C, int NH, bool causal, int Br,
                              int Bc) {
  const int HS = C / NH;
  const T sc = T(1) / std::sqrt(T(HS));
#pragma omp parallel for collapse(2) schedule(static) if (attention_parallel_worth_it(B, NH, Tn, HS))
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
      TileScratch<T>& w = tile_scratch<T>(Br, Bc, HS, Tn);
      auto dKj = w.dK.topLeftCorner(Bc, HS);
      auto dVj = w.dV.topLeftCorner(Bc, HS);
      // D_i = rowsum(dO_i o O_i), for every row of this head
      auto D = w.D.head(Tn);
      D = (load_tile(dout + hd.ooff, hd.C, 0, Tn, HS).array() * load_tile(out + hd.ooff, hd.C, 0, Tn, HS).array())
              .rowwise()
              .sum();
      for (int j0 = 0; j0 < Tn; j0 += Bc) {
        const int nc = std::min(Bc, Tn - j0);
        const auto Kj = load_tile(K, hd.ld, j0, nc, HS);
        const auto Vj = load_tile(V, hd.ld, j0, nc, HS);
        dKj.setZero();
        dVj.setZero();
        for (int i0 = 0; i0 < Tn; i0 += Br) {
          const int nr = std::min(Br, Tn - i0);
          if (causal && j0 > i0 + nr - 1) continue;  // tile wholly above the diagonal
          const auto Qi = load_tile(Q, hd.ld, i0, nr, HS);
          const auto dOi = load_tile(dout + hd.ooff, hd.C, i0, nr, HS);
          // S_ij = Q_i K_j^T / sqrt(HS), P_ij = exp(S_ij - lse_i)
          MapMat<T> Pij(w.P.data(), nr, nc), dSij(w.dS.data(), nr, nc);
          for_row_bands(i0, j0, nr, nc, causal, [&](int r0, int r1, int ke) {
            tile_product(Pij.block(r0, 0, r1 - r0, ke), Qi.middleRows(r0, r1 - r0), Kj.topRows(ke).transpose(), false);
          });
          recompute_probs(Pij, sc, lse_h + i0, i0, j0, nr, nc, causal);
          // Pd_ij = P_ij o M_ij / (1 - p), the same mask as the forward (P_ij itself when p = 0);
          // dV_j += Pd_ij^T dO_i
          if (key.threshold != 0) {
            dSij = Pij;
            apply_dropout(dSij, key, hd, i0, j0, nr, nc, causal, (uint8_t*)nullptr);
          }
          const MapMat<T>& Pd = key.threshold != 0 ? dSij : Pij;
          for_key_bands(i0, j0, nr, nc, causal, [&](int c0, int c1, int rs) {
            tile_product(dVj.middleRows(c0, c1 - c0), Pd.block(rs, c0, nr - rs, c1 - c0).transpose(),
                         dOi.middleRows(rs, nr - rs), true);
          });
          for_row_bands(i0, j0, nr, nc, causal, [&](int r0, int r1, int ke) {
            const int nb = r1 - r0;
            auto dS = dSij.block(r0, 0, nb, ke);
            // dPd_ij = dO_i V_j^T, dP_ij = dPd_ij o M_ij / (1 - p)
            tile_product(dS, dOi.middleRows(r0, nb), Vj.topRows(ke).transpose(), false);
            apply_dropout(dSij, key, hd, i0 + r0, j0, nb, ke, causal, (uint8_t*)nullptr, r0);
            // dS_ij = P_ij o (dP_ij - D_i), then / sqrt(HS) for the two products below (one
            // pass); 0 past the band's keys
            dS = (Pij.block(r0, 0, nb, ke).array() * (dS.array().colwise() - D.segment(i0 + r0, nb).array()) * sc)
                     .matrix();
            dSij.block(r0, ke, nb, nc - ke).setZero();
            // dQ_i += (dS_ij / sqrt(HS)) K_j (into dqkv)
            tile_product(tile(dQ, hd.ld, i0 + r0, nb, HS), dS, Kj.topRows(ke), true);
          });
          // dK_j += (dS_ij / sqrt(HS))^T Q_i
          for_key_bands(i0, j0, nr, nc, causal, [&](int c0, int c1, int rs) {
            tile_product(dKj.middleRows(c0, c1 - c0), dSij.block(rs, c0, nr - rs, c1 - c0).transpose(),
                         Qi.middleRows(rs, nr - rs), true);
          });
        }
        // dK_j, dV_j into dqkv
        tile(dK, hd.ld, j0, nc, HS) += dKj.topRows(nc);
        tile(dV, hd.ld, j0, nc, HS) += dVj.topRows(nc);
      }
    }
  }
}

// the explicit instantiations, for this build's Real (kernels/cpu/real.h: float, or double
// in the tests' TG_CPU_DOUBLE objects)
template void attention_tiled_forward<Real>(Real*, Real*, const Real*, const philox::DropoutKey&, int, int, int, int,
                                            bool, int, int, uint8_t*);
template void attention_tiled_backward<Real>(Real*, const Real*, const Real*, const Real*, const Real*,
                                             const philox::DropoutKey&, int, int, int, int, bool, int, int);

}  // namespace cpu
