// kernels/dropout.cu: dropout on a (B, T, C) activation on the GPU (contract in
// kernels/dropout.cuh, CPU twin kernels/cpu/dropout.cpp, generator kernels/philox.h).
//   forward   out   = keep ? inp * scale : 0                         (overwrites out)
//   backward  dinp += keep ? dout * scale : 0                        (accumulates)
// keep(b, t, c) = philox::dropout_keep(key, b, t, c): word c % 4 of the Philox block for
// columns 4 (c / 4) .. 4 (c / 4) + 3 of row (b, t), compared with key.threshold. One thread
// per group of 4 columns [4g, 4g + 4) of a row: one Philox call gives its four words. When
// C % 4 == 0 and the buffers are aligned to 4 elements a group is one vector access (16 bytes
// for float, 8 for bf16), else the group's (up to 4) columns are accessed one by one (the
// last group of a row may be short). The mask depends only on (key, b, t, c), never on the
// thread layout. threshold == 0: forward is a copy (cudaMemcpyAsync, nothing when out == inp),
// backward a plain += (kDrop = false).
#include "dropout.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace gpu {

namespace {

constexpr int kDropoutThreads = 256;

template <typename T>
struct alignas(sizeof(T) * 4) Vec4 {
  T v[4];
};

// keep[k] for the 4 columns c0 + k of row (b, t) (c0 a multiple of 4): word k of one Philox
// call, as philox::dropout_keep(key, b, t, c0 + k); all true when !kDrop.
template <bool kDrop>
__device__ __forceinline__ void group_keep(bool keep[4], const philox::DropoutKey& key, uint32_t b, uint32_t t,
                                           uint32_t c0) {
  if (kDrop) {
    const philox::U32x4 r = philox::dropout_words(key, b, t, c0);
#pragma unroll
    for (int k = 0; k < 4; ++k) keep[k] = r.v[k] >= key.threshold;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) keep[k] = true;
  }
}

// kForward: dst = keep ? src * scale : 0;  else: dst += keep ? src * scale : 0 (scale = 1
// when !kDrop). kVec: C % 4 == 0 and dst, src aligned to 4 elements.
template <typename T, bool kForward, bool kDrop, bool kVec>
__global__ void __launch_bounds__(kDropoutThreads)
    dropout_kernel(T* dst,        // (B, T, C)
                   const T* src,  // (B, T, C)
                   philox::DropoutKey key, int Tn, int C, long long rows) {
  const int groups = (C + 3) / 4;  // per row
  const long long total = rows * groups;
  const float scale = kDrop ? key.scale : 1.0f;
  for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
       idx += (long long)gridDim.x * blockDim.x) {
    const long long bt = idx / groups;
    const int c0 = (int)(idx - bt * groups) * 4;
    const uint32_t b = (uint32_t)(bt / Tn), t = (uint32_t)(bt % Tn);
    bool keep[4];
    group_keep<kDrop>(keep, key, b, t, (uint32_t)c0);
    const size_t base = (size_t)bt * C + c0;
    if (kVec) {
      const Vec4<T> x = *reinterpret_cast<const Vec4<T>*>(src + base);
      Vec4<T> y;
      if (!kForward) y = *reinterpret_cast<const Vec4<T>*>(dst + base);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float v = keep[k] ? to_float(x.v[k]) * scale : 0.0f;
        y.v[k] = from_float<T>(kForward ? v : to_float(y.v[k]) + v);
      }
      *reinterpret_cast<Vec4<T>*>(dst + base) = y;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (c0 + k < C) {
          const float v = keep[k] ? to_float(src[base + k]) * scale : 0.0f;
          dst[base + k] = from_float<T>(kForward ? v : to_float(dst[base + k]) + v);
        }
      }
    }
  }
}

template <typename T, bool kForward, bool kDrop>
void run(const Context& ctx, T* dst, const T* src, const philox::DropoutKey& key, int B, int Tn, int C) {
  const long long rows = (long long)B * Tn;
  const size_t groups = (size_t)rows * ((C + 3) / 4);
  const bool vec = C % 4 == 0 && ((uintptr_t)dst % (4 * sizeof(T))) == 0 && ((uintptr_t)src % (4 * sizeof(T))) == 0;
  const unsigned grid = grid_1d(groups, kDropoutThreads);
  if (vec)
    launch(dropout_kernel<T, kForward, kDrop, true>, grid, kDropoutThreads, 0, ctx.stream, dst, src, key, Tn, C, rows);
  else
    launch(dropout_kernel<T, kForward, kDrop, false>, grid, kDropoutThreads, 0, ctx.stream, dst, src, key, Tn, C, rows);
}

void check_sizes(const char* who, int B, int Tn, int C) {
  if (B < 0 || Tn < 0 || C < 0) throw std::invalid_argument(std::string(who) + ": negative size");
}

}  // namespace

template <typename T>
void dropout_forward(const Context& ctx, T* out, const T* inp, const philox::DropoutKey& key, int B, int Tn, int C) {
  check_sizes("dropout_forward", B, Tn, C);
  const size_t n = (size_t)B * Tn * C;
  if (n == 0) return;
  if (out != inp && !(out + n <= inp || inp + n <= out))
    throw std::invalid_argument("dropout_forward: out partially overlaps inp");
  if (key.threshold == 0) {
    if (out != inp) cudaCheck(cudaMemcpyAsync(out, inp, n * sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream));
    return;
  }
  run<T, true, true>(ctx, out, inp, key, B, Tn, C);
}

template <typename T>
void dropout_backward(const Context& ctx, T* dinp, const T* dout, const philox::DropoutKey& key, int B, int Tn,
                      int C) {
  check_sizes("dropout_backward", B, Tn, C);
  const size_t n = (size_t)B * Tn * C;
  if (n == 0) return;
  if (!(dinp + n <= dout || dout + n <= dinp)) throw std::invalid_argument("dropout_backward: dinp overlaps dout");
  if (key.threshold == 0)
    run<T, false, false>(ctx, dinp, dout, key, B, Tn, C);
  else
    run<T, false, true>(ctx, dinp, dout, key, B, Tn, C);
}

#define TG_INSTANTIATE(T)                                                                                      \
  template void dropout_forward<T>(const Context&, T*, const T*, const philox::DropoutKey&, int, int, int); \
  template void dropout_backward<T>(const Context&, T*, const T*, const philox::DropoutKey&, int, int, int);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
