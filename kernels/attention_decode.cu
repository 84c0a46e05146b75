// kernels/attention_decode.cu: one query against a KV cache (contract in
// kernels/attention_decode.cuh, CPU twin kernels/cpu/attention_decode.cpp). One block per head,
// kDecodeThreads threads:
//   1. the new row's k, v go into the cache at pos; q goes to shared memory (float);
//   2. s_j = q . k_j / sqrt(HS) for j = 0 .. pos: warp w takes the keys j = w, w + kWarps, ...,
//      its lanes the HS products, summed by warp_sum; s in shared memory;
//   3. m = max_j s_j, l = sum_j exp(s_j - m) by the fixed-order block reductions; p_j =
//      exp(s_j - m) / l in place;
//   4. out_h[c] = sum_j p_j v_j[c], j in order, one thread per c.
// The rows written in 1 are read in 2 and 4 by other threads of the block, after a
// __syncthreads (which orders global memory within a block); no two blocks touch one head's
// cache. Dynamic shared memory: HS + pos + 1 floats. Deterministic (no atomics).
#include "attention_decode.cuh"

#include <stdexcept>
#include <string>

namespace gpu {

namespace {

constexpr int kDecodeThreads = 128;
constexpr int kWarps = kDecodeThreads / 32;

template <typename T>
__global__ void __launch_bounds__(kDecodeThreads)
    attention_decode_kernel(T* out,        // (C)
                            T* kcache,     // (NH, maxT, HS)
                            T* vcache,     // (NH, maxT, HS)
                            const T* qkv,  // (3C)
                            int pos, int C, int HS, int maxT, float scale) {
  __shared__ float red[32];
  float* sq = dynamic_smem<float>();  // (HS) q
  float* s = sq + HS;                  // (pos + 1) scores, then probabilities
  const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T* kh = kcache + (size_t)h * maxT * HS;
  T* vh = vcache + (size_t)h * maxT * HS;
  const T* q = qkv + (size_t)h * HS;
  // 1. append k, v at pos; q to shared memory
  for (int c = threadIdx.x; c < HS; c += kDecodeThreads) {
    kh[(size_t)pos * HS + c] = q[C + c];
    vh[(size_t)pos * HS + c] = q[2 * C + c];
    sq[c] = to_float(q[c]);
  }
  __syncthreads();
  // 2. scores
  for (int j = warp; j <= pos; j += kWarps) {
    const T* kj = kh + (size_t)j * HS;
    float dot = 0.f;
    for (int c = lane; c < HS; c += 32) dot += sq[c] * to_float(kj[c]);
    dot = warp_sum(dot);
    if (lane == 0) s[j] = dot * scale;
  }
  __syncthreads();
  // 3. softmax
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= pos; j += kDecodeThreads) m = fmaxf(m, s[j]);
  m = block_max(m, red);
  float l = 0.f;
  for (int j = threadIdx.x; j <= pos; j += kDecodeThreads) l += expf(s[j] - m);
  l = block_sum(l, red);
  const float inv = 1.f / l;
  for (int j = threadIdx.x; j <= pos; j += kDecodeThreads) s[j] = expf(s[j] - m) * inv;
  __syncthreads();
  // 4. out_h = P V
  for (int c = threadIdx.x; c < HS; c += kDecodeThreads) {
    float acc = 0.f;
    for (int j = 0; j <= pos; ++j) acc += s[j] * to_float(vh[(size_t)j * HS + c]);
    out[(size_t)h * HS + c] = from_float<T>(acc);
  }
}

// kcache[h][t] = k of row t, vcache[h][t] = v of row t, for t < n: one thread per element.
template <typename T>
__global__ void attention_decode_prime_kernel(T* kcache, T* vcache, const T* qkv, int n, int C, int HS, int maxT) {
  const size_t total = (size_t)n * C;
  for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
    const int t = (int)(idx / C), hc = (int)(idx % C), h = hc / HS, d = hc % HS;
    const size_t dst = ((size_t)h * maxT + t) * HS + d, src = (size_t)t * 3 * C + hc;
    kcache[dst] = qkv[src + C];
    vcache[dst] = qkv[src + 2 * C];
  }
}

void check(int pos_or_n, int C, int NH, int maxT, const char* who, bool is_n) {
  if (C <= 0 || NH <= 0 || C % NH != 0 || maxT <= 0 || (is_n ? pos_or_n < 0 || pos_or_n > maxT : pos_or_n < 0 || pos_or_n >= maxT))
    throw std::invalid_argument(std::string(who) + ": need C a positive multiple of NH and " +
                                (is_n ? "0 <= n <= maxT" : "0 <= pos < maxT") + " (C=" + std::to_string(C) +
                                ", NH=" + std::to_string(NH) + ", maxT=" + std::to_string(maxT) + ", " +
                                (is_n ? "n=" : "pos=") + std::to_string(pos_or_n) + ")");
}

}  // namespace

template <typename T>
void attention_decode_forward(const Context& ctx, T* out, T* kcache, T* vcache, const T* qkv, int pos, int C, int NH,
                              int maxT) {
  check(pos, C, NH, maxT, "attention_decode_forward", false);
  const int HS = C / NH;
  const size_t smem = (size_t)(HS + pos + 1) * sizeof(float);
  launch(attention_decode_kernel<T>, NH, kDecodeThreads, smem, ctx.stream, out, kcache, vcache, qkv, pos, C, HS, maxT,
         1.f / std::sqrt((float)HS));
}

template <typename T>
void attention_decode_prime(const Context& ctx, T* kcache, T* vcache, const T* qkv, int n, int C, int NH, int maxT) {
  check(n, C, NH, maxT, "attention_decode_prime", true);
  if (n == 0) return;
  launch(attention_decode_prime_kernel<T>, grid_1d((size_t)n * C, 256), 256, 0, ctx.stream, kcache, vcache, qkv, n, C,
         C / NH, maxT);
}

#define TG_INSTANTIATE(T)                                                                                          \
  template void attention_decode_forward<T>(const Context&, T*, T*, T*, const T*, int, int, int, int);            \
  template void attention_decode_prime<T>(const Context&, T*, T*, const T*, int, int, int, int);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
