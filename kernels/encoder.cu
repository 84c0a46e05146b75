// kernels/encoder.cu: token + position embedding on the GPU (contract in kernels/encoder.cuh,
// CPU twin kernels/cpu/encoder.cpp).
//   forward   out[b,t,c] = wte[inp[b,t],c] + wpe[t,c]                  (overwrites out)
//   backward  dwpe[t,c] += sum_b dout[b,t,c]                           (b = 0, 1, ... in order)
//             dwte[v,c] += sum over the positions (b,t) with inp[b,t] = v of dout[b,t,c]
// No float atomics: the backward is bitwise the same on every run.
//   dwpe: one thread per (t, c) sums over b in order.
//   dwte: the N = B*T pairs (token, position) sorted by token, each token's positions in
//         increasing order (encoder_backward_order: a counting sort on the host, from the
//         tokens the caller stages anyway, uploaded with them): a fixed order that depends
//         only on inp. The sorted list is cut into chunks of kChunk
//         entries. Pass 1, one thread per (chunk, c): sums each run of equal tokens in the
//         chunk in order; a run whose token lies wholly inside the chunk is added to dwte
//         at once (no other thread touches that row), a run that continues into the previous
//         or the next chunk is written to the chunk's head / tail partial. Pass 2, one thread
//         per (last chunk of a token that spans chunks, c): adds the partials of that token's
//         chunks to dwte, first chunk to last. Work is even whatever the token histogram
//         (V = 65 with a few very frequent tokens, or V = 50257), and the rounding error is
//         that of a two-level sum: at most (kChunk + N / kChunk + 1) u sum |dout|.
// Scratch (ctx.scratch, encoder_backward_scratch_bytes): (N / kChunk) * 2 * C floats of partials.
#include "encoder.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gpu {

namespace {

constexpr int kChunk = 32;          // sorted entries per chunk of the dwte pass
constexpr int kChunksPerBlock = 8;  // blockDim = (32 channels, kChunksPerBlock chunks)
constexpr int kForwardThreads = 128;  // threads per row in the forward

// Bytes of the partials: (nchunks, 2, C) floats.
size_t partial_bytes(long long N, int C) { return (size_t)ceil_div(N, kChunk) * 2 * (size_t)C * sizeof(float); }

// out[bt, :] = wte[inp[bt], :] + wpe[t, :]: a block per row (grid-stride over rows).
template <typename T>
__global__ void encoder_forward_kernel(T* out,              // (B, T, C)
                                       const int32_t* inp,  // (B, T)
                                       const T* wte,        // (V, C)
                                       const T* wpe,        // (maxT, C)
                                       long long rows, int Tn, int C) {
  for (long long bt = blockIdx.x; bt < rows; bt += gridDim.x) {
    const int t = (int)(bt % Tn);
    const T* we = wte + (size_t)inp[bt] * C;
    const T* pe = wpe + (size_t)t * C;
    T* o = out + (size_t)bt * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = from_float<T>(to_float(we[c]) + to_float(pe[c]));
  }
}

// dwpe[t, c] += sum_{b = 0..B-1} dout[b, t, c], in that order; one thread per (t, c).
template <typename T>
__global__ void encoder_backward_wpe_kernel(float* dwpe,     // (maxT, C) +=
                                            const T* dout,  // (B, T, C)
                                            int B, int Tn, int C) {
  const size_t TC = (size_t)Tn * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < TC; i += (size_t)gridDim.x * blockDim.x) {
    float s = 0.0f;
    for (int b = 0; b < B; ++b) s += to_float(dout[(size_t)b * TC + i]);
    dwpe[i] += s;
  }
}

// Pass 1 of dwte. Thread (x, y) of block (bx, by): channel c = 32 by + x, chunk k = 8 bx + y
// (entries [32 k, 32 k + 32) of the sorted list). The run sums go either to dwte (the token
// lies wholly inside the chunk) or to partial[k][0] (the head run, when its token began in an
// earlier chunk) and partial[k][1] (the tail run, when its token goes on into the next chunk;
// a run that is both goes to both).
template <typename T>
__global__ void __launch_bounds__(32 * kChunksPerBlock)
    encoder_backward_chunks_kernel(float* dwte,            // (V, C) +=
                                   float* partial,         // (nchunks, 2, C) written where spanning
                                   const T* dout,          // (B, T, C)
                                   const uint32_t* keys,   // (N) sorted token ids
                                   const uint32_t* vals,   // (N) their positions b*T + t
                                   int N, int C) {
  __shared__ uint32_t skeys[kChunksPerBlock][kChunk];
  __shared__ uint32_t svals[kChunksPerBlock][kChunk];
  const int y = threadIdx.y, x = threadIdx.x;
  const long long k = (long long)blockIdx.x * kChunksPerBlock + y;
  const long long i0 = k * kChunk;
  if (i0 + x < N) {
    skeys[y][x] = keys[i0 + x];
    svals[y][x] = vals[i0 + x];
  }
  __syncthreads();
  const int c = blockIdx.y * 32 + x;
  if (c >= C || i0 >= N) return;
  const int n = (int)min((long long)kChunk, N - i0);

  // all the loads first (independent of the run logic, so they are all in flight at once)
  float d[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) d[j] = j < n ? to_float(dout[(size_t)svals[y][j] * C + c]) : 0.0f;

  const bool head_cont = i0 > 0 && keys[i0 - 1] == skeys[y][0];       // head token began earlier
  const bool tail_cont = i0 + n < N && keys[i0 + n] == skeys[y][n - 1];  // tail token goes on
  float* part = partial + (size_t)k * 2 * C + c;
  auto flush = [&](uint32_t tok, float s, bool is_head, bool is_tail) {
    if ((is_head && head_cont) || (is_tail && tail_cont)) {
      if (is_head) part[0] = s;
      if (is_tail) part[C] = s;
    } else {
      dwte[(size_t)tok * C + c] += s;
    }
  };
  uint32_t cur = skeys[y][0];
  float s = 0.0f;
  bool head = true;
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    if (j < n) {
      const uint32_t tok = skeys[y][j];
      if (tok != cur) {
        flush(cur, s, head, false);
        cur = tok;
        s = 0.0f;
        head = false;
      }
      s += d[j];
    }
  }
  flush(cur, s, head, true);
}

// Pass 2 of dwte. Thread (x, y) of block (bx, by): chunk k, channel c as in pass 1. When the
// head token of chunk k began in an earlier chunk and ends in chunk k, this thread owns that
// token: it finds the chunk ks holding its first entry (binary search in the sorted keys) and
// adds partial[ks][1] + partial[ks+1][0] + ... + partial[k][0], in that order, to dwte.
__global__ void __launch_bounds__(32 * kChunksPerBlock)
    encoder_backward_spans_kernel(float* dwte,           // (V, C) +=
                                  const float* partial,  // (nchunks, 2, C)
                                  const uint32_t* keys,  // (N) sorted token ids
                                  int N, int C) {
  const int c = blockIdx.y * 32 + threadIdx.x;
  const long long k = (long long)blockIdx.x * kChunksPerBlock + threadIdx.y;
  const long long i0 = k * kChunk;
  if (c >= C || i0 >= N || k == 0) return;
  const uint32_t tok = keys[i0];
  if (keys[i0 - 1] != tok) return;                       // chunk k starts a new token
  if (i0 + kChunk < N && keys[i0 + kChunk] == tok) return;  // the token goes on: a later chunk owns it
  // first entry of tok: lower bound in keys[0, i0)
  long long lo = 0, hi = i0 - 1;  // keys[hi] == tok
  while (lo < hi) {
    const long long mid = lo + (hi - lo) / 2;
    if (keys[mid] < tok) lo = mid + 1;
    else hi = mid;
  }
  const long long ks = lo / kChunk;
  float s = partial[(size_t)ks * 2 * C + C + c];
#pragma unroll 4
  for (long long q = ks + 1; q <= k; ++q) s += partial[(size_t)q * 2 * C + c];
  dwte[(size_t)tok * C + c] += s;
}

}  // namespace

size_t encoder_backward_scratch_bytes(int B, int Tn, int C) {
  const long long N = (long long)B * Tn;
  if (N <= 0 || C <= 0) return 0;
  if (N > (1LL << 31) - kChunk) throw std::invalid_argument("encoder_backward_scratch_bytes: B*T must be below 2^31");
  return partial_bytes(N, C);
}

void encoder_backward_order(uint32_t* keys, uint32_t* vals, uint32_t* counts, const int32_t* inp, long long N, int V) {
  if (N < 0 || V <= 0) throw std::invalid_argument("encoder_backward_order: bad size");
  if (N > (1LL << 31) - kChunk) throw std::invalid_argument("encoder_backward_order: B*T must be below 2^31");
  // counts[v + 1] = occurrences of v, then counts[v] = the first slot of v (prefix sums)
  std::fill(counts, counts + (size_t)V + 1, 0u);
  for (long long i = 0; i < N; ++i) {
    if (inp[i] < 0 || inp[i] >= V)
      throw std::invalid_argument("encoder_backward_order: token " + std::to_string(inp[i]) + " at position " +
                                  std::to_string(i) + " outside [0, " + std::to_string(V) + ")");
    ++counts[inp[i] + 1];
  }
  for (int v = 0; v < V; ++v) counts[v + 1] += counts[v];
  for (long long i = 0; i < N; ++i) {  // positions in increasing order: each token's stay so
    const uint32_t slot = counts[inp[i]]++;
    keys[slot] = (uint32_t)inp[i];
    vals[slot] = (uint32_t)i;
  }
}

template <typename T>
void encoder_forward(const Context& ctx, T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int Tn,
                     int C) {
  if (B < 0 || Tn < 0 || C < 0) throw std::invalid_argument("encoder_forward: negative size");
  const long long rows = (long long)B * Tn;
  if (rows == 0 || C == 0) return;
  const unsigned grid = (unsigned)std::min<long long>(rows, 65535LL * 32);
  launch(encoder_forward_kernel<T>, grid, kForwardThreads, 0, ctx.stream, out, inp, wte, wpe, rows, Tn, C);
}

template <typename T>
void encoder_backward(const Context& ctx, float* dwte, float* dwpe, const T* dout, const uint32_t* keys,
                      const uint32_t* vals, int B, int Tn, int C) {
  if (B < 0 || Tn < 0 || C < 0) throw std::invalid_argument("encoder_backward: bad size");
  const long long N = (long long)B * Tn;
  if (N == 0 || C == 0) return;
  if (N > (1LL << 31) - kChunk) throw std::invalid_argument("encoder_backward: B*T must be below 2^31");
  if (ceil_div(C, 32) > 65535) throw std::invalid_argument("encoder_backward: C too large");

  // dwpe: sum over b in order
  launch(encoder_backward_wpe_kernel<T>, grid_1d((size_t)Tn * C, 256), 256, 0, ctx.stream, dwpe, dout, B, Tn, C);

  // dwte: the two chunk passes over the sorted (token, position) list
  const size_t needed = partial_bytes(N, C);
  if (ctx.scratch == nullptr || ctx.scratch_bytes < needed)
    throw std::invalid_argument("encoder_backward: ctx.scratch holds " + std::to_string(ctx.scratch_bytes) +
                                " bytes, needs " + std::to_string(needed) + " (encoder_backward_scratch_bytes)");
  float* partial = static_cast<float*>(ctx.scratch);
  const long long nchunks = ceil_div(N, kChunk);
  const dim3 block(32, kChunksPerBlock);
  const dim3 grid((unsigned)ceil_div(nchunks, kChunksPerBlock), (unsigned)ceil_div(C, 32));
  launch(encoder_backward_chunks_kernel<T>, grid, block, 0, ctx.stream, dwte, partial, dout, keys, vals, (int)N, C);
  launch(encoder_backward_spans_kernel, grid, block, 0, ctx.stream, dwte, partial, keys, (int)N, C);
}

#define TG_INSTANTIATE(T)                                                                                 \
  template void encoder_forward<T>(const Context&, T*, const int32_t*, const T*, const T*, int, int, int); \
  template void encoder_backward<T>(const Context&, float*, float*, const T*, const uint32_t*, const uint32_t*, int, \
                                    int, int);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
