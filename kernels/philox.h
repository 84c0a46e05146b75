// kernels/philox.h: the one random-number generator of train_gpt.
//
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. philox4x32_10(counter, key) is a pure function: four 32-bit words
// in, four 32-bit words out, ten rounds. It is __host__ __device__, so the CPU reference, the
// naive GPU path and the fused flash kernels all call this one function.
//
// Dropout. Whether element (b, h, i, j) of layer l at site s on step t is kept is a pure
// function of (seed, t, l, s, b, h, i, j), never of tile sizes or thread layout:
//     key     = { seed & 0xffffffff, seed >> 32 }
//     counter = { j / 4, i, b * NH + h, (t << 10) | (l << 3) | s }
//     r       = philox4x32_10(counter, key)[j % 4]
//     keep    = r >= threshold,   threshold = round(p * 2^32)
// so P(keep) = 1 - threshold / 2^32, which is p honoured to 2^-32 (not quantised to 1/256
// or 1/16). Kept values are scaled by 1 / (1 - p). For the (B, T, C) sites the same mapping
// is used with h = 0, i = t (position) and j = c (channel).
//
// The attention probabilities (site 1, every attention path) take 16 bits a decision, so that
// one call decides 8 columns: their mask is made three times a step inside compute-bound
// kernels (the forward, the dK/dV and the dQ kernels), where with 32 bits a decision the
// Philox calls took more time than the two products (an H200 ran 2.3 to 2.4 times the
// instructions with p = 0.2 as with p = 0):
//     counter = { j / 8, i, b * NH + h, (t << 10) | (l << 3) | s }
//     r       = bits 16 (j % 2) .. 16 (j % 2) + 15 of word (j % 8) / 2 of philox4x32_10(counter, key)
//     keep    = r >= threshold16,   threshold16 = round(p * 2^16) (from threshold, saturated)
// so p is honoured to 2^-17 there (still not 1/256, and the scale is the same 1 / (1 - p)).
// Limits that keep the packing unique: t < 2^22, l < 128, s < 8 (checked by the config).
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define TG_HD __host__ __device__ __forceinline__
#else
#define TG_HD inline
#endif

namespace philox {

struct U32x4 { uint32_t v[4]; };

// The Philox4x32 round constants (multipliers and Weyl key increments), as published.
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

TG_HD void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__) || defined(TG_SIMT_EMULATION)
  // device code (and the emulator's, tests/emu/simt_emulator.h): the high word by __umulhi, the
  // same bits. ptxas makes one IMAD.WIDE.U32 of the two products either way, but from the 64-bit
  // product's high word it also emitted an add of zero a multiply: 20 instructions a call.
  hi = __umulhi(a, b);
  lo = a * b;
#else
  uint64_t p = (uint64_t)a * (uint64_t)b;
  hi = (uint32_t)(p >> 32);
  lo = (uint32_t)p;
#endif
}

// One Philox round: two 32x32->64 multiplies, xor with the other lanes and the key.
TG_HD void one_round(uint32_t c[4], uint32_t k0, uint32_t k1) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo(kM0, c[0], hi0, lo0);
  mulhilo(kM1, c[2], hi1, lo1);
  uint32_t n0 = hi1 ^ c[1] ^ k0, n1 = lo1, n2 = hi0 ^ c[3] ^ k1, n3 = lo0;
  c[0] = n0; c[1] = n1; c[2] = n2; c[3] = n3;
}

// Philox4x32-10: ten rounds, the key bumped by the Weyl constants between rounds.
TG_HD U32x4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                          uint32_t k0, uint32_t k1) {
  uint32_t c[4] = {c0, c1, c2, c3};
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    one_round(c, k0, k1);
    k0 += kW0; k1 += kW1;
  }
  return U32x4{{c[0], c[1], c[2], c[3]}};
}

// Dropout sites, in nanoGPT's order inside the network.
enum Site : uint32_t {
  kSiteEmbedding = 0,  // after token + position embedding (layer 0)
  kSiteAttnProbs = 1,  // on the attention probabilities
  kSiteAttnProj  = 2,  // after the attention output projection
  kSiteMlp       = 3,  // after the MLP output projection
  kSiteCount     = 4,
};
// Streams that are not dropout but use the same generator. They put the stream id in
// counter[3], where dropout puts (t << 10) | (l << 3) | s with s < 4: ids 4..7 (low three
// bits >= 4) can never equal a dropout word, so no two uses share a counter.
constexpr uint32_t kStreamInit = 4;    // weight init:    counter {element group lo, hi, tensor, 4}
constexpr uint32_t kStreamBatch = 5;   // train batches:  counter {b, step, 0, 5}
constexpr uint32_t kStreamEval = 6;    // eval batches:   counter {b, k, split, 6}
constexpr uint32_t kStreamSample = 7;  // sampling:       counter {token index, 0, 0, 7}

// The four words of stream `stream` at counter (a, b, c).
TG_HD U32x4 stream_words(uint64_t seed, uint32_t stream, uint32_t a, uint32_t b, uint32_t c) {
  return philox4x32_10(a, b, c, stream, (uint32_t)seed, (uint32_t)(seed >> 32));
}

constexpr uint32_t kMaxStep = 1u << 22, kMaxLayer = 128u;

// Everything that selects one dropout mask: the run's seed, the step, the layer, the site,
// and the probability (as the exact 32-bit threshold). Passed by value to kernels.
struct DropoutKey {
  uint64_t seed;
  uint32_t step;
  uint32_t layer;
  uint32_t site;
  uint32_t threshold;  // round(p * 2^32); 0 means no dropout
  float scale;         // 1 / (1 - p)
  // Added to the batch (or batch-head) index of every mask: micro-batch k of a step with
  // gradient accumulation (--grad-accum) draws the masks of rows k*B .. k*B + B - 1 of one
  // batch of N*B (k*B for the residual sites, k*B*NH for the attention probabilities), so N
  // micro-batches of B see the masks one batch of N*B would. 0 without accumulation.
  uint32_t row0 = 0;
};

// round(p * 2^32) for p in [0, 1), saturated below 2^32.
inline uint32_t dropout_threshold(double p) {
  double t = p * 4294967296.0 + 0.5;
  if (t <= 0.0) return 0u;
  if (t >= 4294967295.0) return 4294967295u;
  return (uint32_t)t;
}

inline DropoutKey make_dropout_key(uint64_t seed, uint32_t step, uint32_t layer, uint32_t site,
                                   double p) {
  return DropoutKey{seed, step, layer, site, dropout_threshold(p), (float)(1.0 / (1.0 - p))};
}

TG_HD uint32_t dropout_word3(const DropoutKey& k) {
  return (k.step << 10) | (k.layer << 3) | k.site;
}

// The four raw words for columns 4*(j/4) .. 4*(j/4)+3 of row i of batch-head bh.
TG_HD U32x4 dropout_words(const DropoutKey& k, uint32_t bh, uint32_t i, uint32_t j) {
  return philox4x32_10(j >> 2, i, bh + k.row0, dropout_word3(k), (uint32_t)k.seed,
                       (uint32_t)(k.seed >> 32));
}

// Word w (0..3) of r, chosen by selects rather than a dynamic index, so that on the GPU r
// stays in registers (a dynamic index would put it in local memory).
TG_HD uint32_t word(const U32x4& r, uint32_t w) {
  return w == 0 ? r.v[0] : w == 1 ? r.v[1] : w == 2 ? r.v[2] : r.v[3];
}

// true when element (bh, i, j) is kept.
TG_HD bool dropout_keep(const DropoutKey& k, uint32_t bh, uint32_t i, uint32_t j) {
  return word(dropout_words(k, bh, i, j), j & 3u) >= k.threshold;
}

// ---- the attention probabilities' rule (16 bits a decision, 8 columns a call) ----
constexpr uint32_t kAttnGroup = 8;  // columns decided by one Philox call

// round(p * 2^16) from the key's round(p * 2^32), saturated below 2^16; 0 when threshold is 0.
TG_HD uint32_t attn_threshold(const DropoutKey& k) {
  const uint32_t t = (uint32_t)(((uint64_t)k.threshold + 0x8000u) >> 16);
  return t > 0xFFFFu ? 0xFFFFu : t;
}

// The four raw words for columns 8*(j/8) .. 8*(j/8)+7 of row i of batch-head bh.
TG_HD U32x4 attn_words(const DropoutKey& k, uint32_t bh, uint32_t i, uint32_t j) {
  return philox4x32_10(j >> 3, i, bh + k.row0, dropout_word3(k), (uint32_t)k.seed,
                       (uint32_t)(k.seed >> 32));
}

// The keep decisions of the 8 columns of one call: bit u for column 8*(j/8) + u (the low
// half of word u/2 for even u, the high half for odd u, kept when >= thr), with thr =
// attn_threshold(key). Each half is compared whole-word against thr << 16 (exact, thr < 2^16):
// the high half's test is word >= thr << 16, the low half's (word << 16) >= thr << 16, so that
// no half is extracted (ptxas made each bit a mask or shift, a compare, a select and a shift).
TG_HD uint32_t attn_keep_byte(const U32x4& r, uint32_t thr) {
  const uint32_t t16 = thr << 16;
  uint32_t bits = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int w = 0; w < 4; ++w)
    bits |= ((r.v[w] << 16 >= t16 ? 1u : 0u) | (r.v[w] >= t16 ? 2u : 0u)) << (2 * w);
  return bits;
}

// true when attention probability (bh, i, j) is kept.
TG_HD bool attn_keep(const DropoutKey& k, uint32_t bh, uint32_t i, uint32_t j) {
  return (attn_keep_byte(attn_words(k, bh, i, j), attn_threshold(k)) >> (j & 7u)) & 1u;
}

// Uniform integer in [0, n) from one 32-bit word (multiply-shift; bias < n / 2^32).
TG_HD uint32_t uniform_below(uint32_t r, uint32_t n) {
  return (uint32_t)(((uint64_t)r * (uint64_t)n) >> 32);
}

}  // namespace philox
