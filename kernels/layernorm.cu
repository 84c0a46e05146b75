// kernels/layernorm.cu: layer normalisation on the GPU (contract in kernels/layernorm.cuh, CPU
// twin kernels/cpu/layernorm.cpp). Per row x of length C, in float:
//   mean = sum x / C,  var = sum (x - mean)^2 / C (two passes),  rstd = 1 / sqrt(var + 1e-5)
//   xhat = (x - mean) rstd,  out = xhat o weight + bias                 (overwrites out, mean, rstd)
// Backward, with g = dout o weight:
//   dinp    += rstd (g - mean_c(g) - xhat mean_c(g o xhat))
//   dweight += sum_rows dout o xhat,   dbias += sum_rows dout          (accumulated, +=)
// Forward: one warp per row, the row read once into registers (C <= 1024), weight and bias
// read once per block of 8 rows into shared memory: global traffic within 1.1x of the
// compulsory bytes (x, out, mean, rstd; tests/emu/test_kernel_counters.cpp), where reading x three
// times and the weights per row moved 2.5x. Backward: a fixed grid of kBwdThreads-thread blocks
// (the count depends only on N), each over a contiguous range of rows, one warp per row, x and
// dout read once into registers, the weight once per block into shared memory; each warp adds
// its rows' dout o xhat (and dout) to its own shared-memory row of length C (no two threads
// touch one address), the block sums its warps' rows in warp order into its partial in
// ctx.scratch, and a second kernel adds the partials to dweight / dbias in block order. No
// float atomics: the result is bitwise the same on every run.
#include "layernorm.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gpu {

namespace {

constexpr float kEps = 1e-5f;            // cpu::kLayerNormEps
constexpr int kFwdThreads = 256;         // 8 rows per block in the forward
constexpr int kBwdThreads = 128;         // 4 warps per block in the backward
constexpr int kBwdWarps = kBwdThreads / 32;
constexpr int kBwdMaxBlocks = 512;       // partials per column at most
constexpr int kBwdMinRowsPerBlock = 8;
// A lane keeps its row's values of columns lane + 32k, k < kRowRegs, in registers: rows of up to
// 1024 columns (forward) and 768 (backward, two values a column: 32 spilled on sm_90) are read
// from global memory once; longer ones read their tail again.
constexpr int kRowRegs = 32;
constexpr int kBwdRowRegs = 24;

// The number of backward blocks: a function of N only (so is the scratch size, and the
// summation order does not depend on the device).
int bwd_blocks(int N) {
  return (int)std::max<long long>(1, std::min<long long>(ceil_div(N, kBwdMinRowsPerBlock), kBwdMaxBlocks));
}

// Dynamic shared memory: the weight, then the bias when kBias (C floats each).
template <typename T, bool kBias>
__global__ void __launch_bounds__(kFwdThreads)
    layernorm_forward_kernel(T* out,           // (N, C)
                             float* mean,      // (N)
                             float* rstd,      // (N)
                             const T* inp,     // (N, C)
                             const T* weight,  // (C)
                             const T* bias,    // (C) or null
                             int N, int C) {
  float* const sw = dynamic_smem<float>();  // weight (C), then bias (C), as floats
  float* const sb = sw + C;
  for (int c = threadIdx.x; c < C; c += kFwdThreads) {
    sw[c] = to_float(weight[c]);
    if (kBias) sb[c] = to_float(bias[c]);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const long long row = (long long)blockIdx.x * (kFwdThreads / 32) + (threadIdx.x >> 5);
  if (row >= N) return;
  const T* x = inp + (size_t)row * C;
  T* o = out + (size_t)row * C;
  // x[lane + 32k] in xr[k] for the first kRowRegs * 32 columns, read again past them
  float xr[kRowRegs];
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kRowRegs; ++k) {
    const int c = lane + 32 * k;
    xr[k] = c < C ? to_float(x[c]) : 0.0f;
    if (c < C) s += xr[k];
  }
  for (int c = lane + 32 * kRowRegs; c < C; c += 32) s += to_float(x[c]);
  const float m = warp_sum(s) / (float)C;
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kRowRegs; ++k)
    if (lane + 32 * k < C) {
      const float d = xr[k] - m;
      ss += d * d;
    }
  for (int c = lane + 32 * kRowRegs; c < C; c += 32) {
    const float d = to_float(x[c]) - m;
    ss += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(ss) / (float)C + kEps);
  auto write = [&](int c, float xc) {
    float y = (xc - m) * r * sw[c];
    if (kBias) y += sb[c];
    o[c] = from_float<T>(y);
  };
#pragma unroll
  for (int k = 0; k < kRowRegs; ++k)
    if (lane + 32 * k < C) write(lane + 32 * k, xr[k]);
  for (int c = lane + 32 * kRowRegs; c < C; c += 32) write(c, to_float(x[c]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// Block b: rows [b * rows_per_block, ...); dynamic shared memory: kBwdWarps rows of C floats
// for dweight, as many for dbias when kBias, then the weight (C floats).
template <typename T, bool kBias>
__global__ void __launch_bounds__(kBwdThreads)
    layernorm_backward_kernel(T* dinp,            // (N, C) +=
                              float* part_dw,     // (gridDim.x, C) overwritten
                              float* part_db,     // (gridDim.x, C) overwritten, when kBias
                              const T* dout,      // (N, C)
                              const T* inp,       // (N, C)
                              const T* weight,    // (C)
                              const float* mean,  // (N)
                              const float* rstd,  // (N)
                              int N, int C, int rows_per_block) {
  float* const smem = dynamic_smem<float>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* dw_s = smem + (size_t)warp * C;                          // this warp's dweight row
  float* db_s = smem + (size_t)(kBwdWarps + warp) * C;            // this warp's dbias row
  float* const sw = smem + (size_t)(kBias ? 2 : 1) * kBwdWarps * C;  // weight, as floats
  for (int c = lane; c < C; c += 32) {
    dw_s[c] = 0.0f;
    if (kBias) db_s[c] = 0.0f;
  }
  for (int c = threadIdx.x; c < C; c += kBwdThreads) sw[c] = to_float(weight[c]);
  __syncthreads();
  const long long r0 = (long long)blockIdx.x * rows_per_block;
  const long long r1 = min(r0 + rows_per_block, (long long)N);
  for (long long row = r0 + warp; row < r1; row += kBwdWarps) {
    const T* x = inp + (size_t)row * C;
    const T* d = dout + (size_t)row * C;
    T* di = dinp + (size_t)row * C;
    const float m = mean[row], r = rstd[row];
    // xhat and dout of columns lane + 32k in registers (the first kBwdRowRegs * 32), read again past them
    float xh[kBwdRowRegs], dr[kBwdRowRegs];
    float sg = 0.0f, sgx = 0.0f;  // sum g, sum g xhat
    auto sums = [&](int c, float xhat, float dc) {
      const float g = dc * sw[c];
      sg += g;
      sgx += g * xhat;
    };
#pragma unroll
    for (int k = 0; k < kBwdRowRegs; ++k) {
      const int c = lane + 32 * k;
      xh[k] = c < C ? (to_float(x[c]) - m) * r : 0.0f;
      dr[k] = c < C ? to_float(d[c]) : 0.0f;
      if (c < C) sums(c, xh[k], dr[k]);
    }
    for (int c = lane + 32 * kBwdRowRegs; c < C; c += 32) sums(c, (to_float(x[c]) - m) * r, to_float(d[c]));
    const float mg = warp_sum(sg) / (float)C, mgx = warp_sum(sgx) / (float)C;
    auto update = [&](int c, float xhat, float dc) {
      const float g = dc * sw[c];
      di[c] = from_float<T>(to_float(di[c]) + r * (g - mg - xhat * mgx));
      dw_s[c] += dc * xhat;
      if (kBias) db_s[c] += dc;
    };
#pragma unroll
    for (int k = 0; k < kBwdRowRegs; ++k)
      if (lane + 32 * k < C) update(lane + 32 * k, xh[k], dr[k]);
    for (int c = lane + 32 * kBwdRowRegs; c < C; c += 32) update(c, (to_float(x[c]) - m) * r, to_float(d[c]));
  }
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += kBwdThreads) {
    float sw = 0.0f, sb = 0.0f;
#pragma unroll
    for (int w = 0; w < kBwdWarps; ++w) {
      sw += smem[(size_t)w * C + c];
      if (kBias) sb += smem[(size_t)(kBwdWarps + w) * C + c];
    }
    part_dw[(size_t)blockIdx.x * C + c] = sw;
    if (kBias) part_db[(size_t)blockIdx.x * C + c] = sb;
  }
}

// dst[c] += sum_{b = 0..nparts-1} part[b, c], in a fixed order: thread (x, y) of block bx sums
// the parts b = y, y + 8, ... of column c = 32 bx + x, then y = 0 adds the 8 sums in order.
// blockIdx.y picks the pair (0: dweight, 1: dbias).
__global__ void __launch_bounds__(256)
    layernorm_column_sum_kernel(float* dw, const float* part_dw, float* db, const float* part_db, int nparts, int C) {
  __shared__ float s[8][33];
  float* dst = blockIdx.y == 0 ? dw : db;
  const float* part = blockIdx.y == 0 ? part_dw : part_db;
  const int c = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < C)
    for (int b = threadIdx.y; b < nparts; b += 8) acc += part[(size_t)b * C + c];
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.0f;
#pragma unroll
    for (int y = 0; y < 8; ++y) t += s[y][threadIdx.x];
    dst[c] += t;
  }
}

}  // namespace

size_t layernorm_backward_scratch_bytes(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return 2 * (size_t)bwd_blocks(N) * C * sizeof(float);
}

template <typename T>
void layernorm_forward(const Context& ctx, T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int N, int C) {
  if (N < 0 || C <= 0) throw std::invalid_argument("layernorm_forward: bad size");
  if (N == 0) return;
  const unsigned grid = (unsigned)ceil_div(N, kFwdThreads / 32);
  if (bias)
    launch(layernorm_forward_kernel<T, true>, grid, kFwdThreads, 2 * C * sizeof(float), ctx.stream, out, mean, rstd, inp, weight, bias, N,
           C);
  else
    launch(layernorm_forward_kernel<T, false>, grid, kFwdThreads, C * sizeof(float), ctx.stream, out, mean, rstd, inp, weight, bias, N,
           C);
}

template <typename T>
void layernorm_backward(const Context& ctx, T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                        const T* weight, const float* mean, const float* rstd, int N, int C) {
  if (N < 0 || C <= 0) throw std::invalid_argument("layernorm_backward: bad size");
  if (N == 0) return;
  const size_t need = layernorm_backward_scratch_bytes(N, C);
  if (ctx.scratch == nullptr || ctx.scratch_bytes < need)
    throw std::invalid_argument("layernorm_backward: ctx.scratch holds " + std::to_string(ctx.scratch_bytes) +
                                " bytes, needs " + std::to_string(need) + " (layernorm_backward_scratch_bytes)");
  const int nblocks = bwd_blocks(N);
  const int rows_per_block = (int)ceil_div(N, nblocks);
  float* part_dw = static_cast<float*>(ctx.scratch);
  float* part_db = part_dw + (size_t)nblocks * C;
  const bool has_bias = dbias != nullptr;
  const size_t smem = ((size_t)(has_bias ? 2 : 1) * kBwdWarps + 1) * C * sizeof(float);
  auto kernel = has_bias ? layernorm_backward_kernel<T, true> : layernorm_backward_kernel<T, false>;
  launch(kernel, nblocks, kBwdThreads, smem, ctx.stream, dinp, part_dw, part_db, dout, inp, weight, mean, rstd, N, C,
         rows_per_block);
  const dim3 grid((unsigned)ceil_div(C, 32), has_bias ? 2 : 1);
  launch(layernorm_column_sum_kernel, grid, dim3(32, 8), 0, ctx.stream, dweight, part_dw, dbias, part_db, nblocks, C);
}

#define TG_INSTANTIATE(T)                                                                                      \
  template void layernorm_forward<T>(const Context&, T*, float*, float*, const T*, const T*, const T*, int, int); \
  template void layernorm_backward<T>(const Context&, T*, float*, float*, const T*, const T*, const T*,           \
                                      const float*, const float*, int, int);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
