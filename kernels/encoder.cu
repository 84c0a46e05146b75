// kernels/encoder.cu: token + position embedding on the GPU (contract in kernels/encoder.cuh,
// CPU twin kernels/cpu/encoder.cpp).
//   forward   out[b,t,c] = wte[inp[b,t],c] + wpe[t,c]                  (overwrites out)
//   backward  dwpe[t,c] += sum_b dout[b,t,c]                           (b = 0, 1, ... in order)
//             dwte[v,c] += sum over the positions (b,t) with inp[b,t] = v of dout[b,t,c]
// No float atomics: the backward is bitwise the same on every run.
//   dwpe: one thread per (t, c) sums over b in order.
//   dwte: the N = B*T pairs (token, position) are sorted by token with cub's radix sort,
//         which is stable, so each token's positions come out in increasing order: a fixed
//         order that depends only on inp. The sorted list is cut into chunks of kChunk
//         entries. Pass 1, one thread per (chunk, c): sums each run of equal tokens in the
//         chunk in order; a run whose token lies wholly inside the chunk is added to dwte
//         at once (no other thread touches that row), a run that continues into the previous
//         or the next chunk is written to the chunk's head / tail partial. Pass 2, one thread
//         per (last chunk of a token that spans chunks, c): adds the partials of that token's
//         chunks to dwte, first chunk to last. Work is even whatever the token histogram
//         (V = 65 with a few very frequent tokens, or V = 50257), and the rounding error is
//         that of a two-level sum: at most (kChunk + N / kChunk + 1) u sum |dout|.
// Scratch (ctx.scratch, encoder_backward_scratch_bytes): 4 N words for the sort double
// buffers, (N / kChunk) * 2 * C floats of partials, and cub's temp storage.
#include "encoder.cuh"

#include <cub/device/device_radix_sort.cuh>
#include <algorithm>
#include <stdexcept>
#include <string>

namespace gpu {

namespace {

constexpr int kChunk = 32;          // sorted entries per chunk of the dwte pass
constexpr int kChunksPerBlock = 8;  // blockDim = (32 channels, kChunksPerBlock chunks)
constexpr int kRowThreads = 128;    // threads per row in the forward

// Bits of a token id in [0, V): the radix sort only looks at these.
int token_bits(int V) {
  int bits = 1;
  while (bits < 31 && (1LL << bits) < (long long)V) ++bits;
  return bits;
}

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

size_t sort_temp_bytes(int N, int V) {
  size_t bytes = 0;
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr), vals(nullptr, nullptr);
  cudaCheck(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, vals, N, 0, token_bits(V)));
  return bytes;
}

// The carve-up of ctx.scratch (offsets in bytes).
struct ScratchLayout {
  size_t keys0, keys1, vals0, vals1, partial, temp, total;
  ScratchLayout(int N, int C, size_t temp_bytes) {
    const size_t words = align256((size_t)N * sizeof(uint32_t));
    const size_t nchunks = (size_t)ceil_div(N, kChunk);
    keys0 = 0;
    keys1 = keys0 + words;
    vals0 = keys1 + words;
    vals1 = vals0 + words;
    partial = vals1 + words;
    temp = partial + align256(nchunks * 2 * (size_t)C * sizeof(float));
    total = temp + align256(temp_bytes);
  }
};

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

// keys = inp (as unsigned), vals = 0, 1, ..., N-1: the input of the stable sort.
// (64-bit index: N may be up to 2^31 - kChunk, and i + stride would overflow an int.)
__global__ void encoder_sort_init_kernel(uint32_t* keys, uint32_t* vals, const int32_t* inp, int N) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < N; i += (long long)gridDim.x * blockDim.x) {
    keys[i] = (uint32_t)inp[i];
    vals[i] = (uint32_t)i;
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

size_t encoder_backward_scratch_bytes(int B, int Tn, int C, int V) {
  const long long N = (long long)B * Tn;
  if (N <= 0 || C <= 0 || V <= 0) return 0;
  if (N > (1LL << 31) - kChunk) throw std::invalid_argument("encoder_backward_scratch_bytes: B*T must be below 2^31");
  return ScratchLayout((int)N, C, sort_temp_bytes((int)N, V)).total;
}

template <typename T>
void encoder_forward(const Context& ctx, T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int Tn,
                     int C) {
  if (B < 0 || Tn < 0 || C < 0) throw std::invalid_argument("encoder_forward: negative size");
  const long long rows = (long long)B * Tn;
  if (rows == 0 || C == 0) return;
  const unsigned grid = (unsigned)std::min<long long>(rows, 65535LL * 32);
  launch(encoder_forward_kernel<T>, grid, kRowThreads, 0, ctx.stream, out, inp, wte, wpe, rows, Tn, C);
}

template <typename T>
void encoder_backward(const Context& ctx, float* dwte, float* dwpe, const T* dout, const int32_t* inp, int B, int Tn,
                      int C, int V) {
  if (B < 0 || Tn < 0 || C < 0 || V <= 0) throw std::invalid_argument("encoder_backward: bad size");
  const long long N = (long long)B * Tn;
  if (N == 0 || C == 0) return;
  if (N > (1LL << 31) - kChunk) throw std::invalid_argument("encoder_backward: B*T must be below 2^31");
  if (ceil_div(C, 32) > 65535) throw std::invalid_argument("encoder_backward: C too large");

  // dwpe: sum over b in order
  launch(encoder_backward_wpe_kernel<T>, grid_1d((size_t)Tn * C, 256), 256, 0, ctx.stream, dwpe, dout, B, Tn, C);

  // dwte: stable sort of (token, position), then the two chunk passes
  const size_t temp_bytes = sort_temp_bytes((int)N, V);
  const ScratchLayout L((int)N, C, temp_bytes);
  if (ctx.scratch == nullptr || ctx.scratch_bytes < L.total)
    throw std::invalid_argument("encoder_backward: ctx.scratch holds " + std::to_string(ctx.scratch_bytes) +
                                " bytes, needs " + std::to_string(L.total) + " (encoder_backward_scratch_bytes)");
  char* base = static_cast<char*>(ctx.scratch);
  uint32_t* keys0 = reinterpret_cast<uint32_t*>(base + L.keys0);
  uint32_t* keys1 = reinterpret_cast<uint32_t*>(base + L.keys1);
  uint32_t* vals0 = reinterpret_cast<uint32_t*>(base + L.vals0);
  uint32_t* vals1 = reinterpret_cast<uint32_t*>(base + L.vals1);
  float* partial = reinterpret_cast<float*>(base + L.partial);
  void* temp = base + L.temp;

  launch(encoder_sort_init_kernel, grid_1d((size_t)N, 256), 256, 0, ctx.stream, keys0, vals0, inp, (int)N);
  cub::DoubleBuffer<uint32_t> keys(keys0, keys1), vals(vals0, vals1);
  size_t tb = temp_bytes;
  cudaCheck(cub::DeviceRadixSort::SortPairs(temp, tb, keys, vals, (int)N, 0, token_bits(V), ctx.stream));

  const long long nchunks = ceil_div(N, kChunk);
  const dim3 block(32, kChunksPerBlock);
  const dim3 grid((unsigned)ceil_div(nchunks, kChunksPerBlock), (unsigned)ceil_div(C, 32));
  launch(encoder_backward_chunks_kernel<T>, grid, block, 0, ctx.stream, dwte, partial, dout, keys.Current(),
         vals.Current(), (int)N, C);
  launch(encoder_backward_spans_kernel, grid, block, 0, ctx.stream, dwte, partial, keys.Current(), (int)N, C);
}

#define TG_INSTANTIATE(T)                                                                                 \
  template void encoder_forward<T>(const Context&, T*, const int32_t*, const T*, const T*, int, int, int); \
  template void encoder_backward<T>(const Context&, float*, float*, const T*, const int32_t*, int, int, int, int);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
