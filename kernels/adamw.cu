// kernels/adamw.cu: fused AdamW, global gradient norm and clip factor on the GPU (contract in
// kernels/adamw.cuh, CPU twin kernels/cpu/adamw.cpp). Per element i of tensor k, step t >= 1:
//   g = grads[i] * s                          (s = *grad_scale, the clip factor, or 1)
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2                     (m, v overwritten)
//   w -= lr wd_k w                            (decoupled decay, applied first)
//   w -= lr (m rbc1) / (sqrt(v rbc2) + eps)   rbc = 1 / (1 - b^t), computed once in double on
//                                             the host and passed as floats
//   params[i] = w, params_copy[i] = (T) w     (overwritten; the copy when not null)
// One kernel over all N parameters: a block takes chunks of kAdamElemsPerThread x kAdamThreads
// consecutive elements (grid-stride over chunks), a thread every kAdamThreads-th element of its
// chunk (a warp's loads coalesced). The tensor of element i (for its weight decay) is found by a
// binary search of the tensors' offsets in the device array `tensors`, done again only when a
// thread's next element leaves the tensor it found last (no host-side mapping). The search's
// loads are one address for the whole warp (one sector for 8 bytes): done for every element,
// they were a quarter of the kernel's requests and took its sector efficiency to 80%; once per
// tensor and chunk, the kernel moves within 1.05x of its compulsory bytes
// (tests/emu/test_kernel_counters.cpp).
// global_norm_squared: sum g^2 with double accumulators: a fixed grid (its size depends only
// on N) of block partials in ctx.scratch, then one block adds them in a fixed order. Bitwise
// the same on every run; no atomics.
#include "adamw.cuh"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace gpu {

namespace {

constexpr int kAdamThreads = 256;
constexpr int kAdamElemsPerThread = 16;  // a block's chunk: 4096 consecutive elements
constexpr int kNormThreads = 256;
constexpr int kNormMaxBlocks = 1024;
constexpr int kNormElemsPerThread = 16;  // at least, before the grid is capped

int norm_blocks(size_t N) {
  const long long b = ceil_div((long long)N, (long long)kNormThreads * kNormElemsPerThread);
  return (int)std::max(1LL, std::min(b, (long long)kNormMaxBlocks));
}

// The per-step scalars, passed by value.
struct AdamWHyper {
  float lr, beta1, beta2, eps;
  float rbc1, rbc2;  // 1 / (1 - beta1^t), 1 / (1 - beta2^t)
};

template <typename T, bool kCopy>
__global__ void __launch_bounds__(kAdamThreads)
    adamw_kernel(float* params,               // (N)
                 T* params_copy,              // (N) when kCopy
                 const float* grads,          // (N)
                 float* m,                    // (N)
                 float* v,                    // (N)
                 size_t N,
                 const AdamWTensor* tensors,  // (n_tensors)
                 int n_tensors, AdamWHyper h,
                 const float* grad_scale) {   // (1) or null
  const float gs = grad_scale ? *grad_scale : 1.0f;
  size_t k_begin = 1, k_end = 0;  // the elements [k_begin, k_end) of the last tensor found
  float wd = 0.0f;                // its weight decay
  constexpr size_t kChunk = (size_t)kAdamThreads * kAdamElemsPerThread;
  for (size_t base = blockIdx.x * kChunk; base < N; base += (size_t)gridDim.x * kChunk) {
#pragma unroll 1
    for (int e = 0; e < kAdamElemsPerThread; ++e) {
      const size_t i = base + (size_t)e * kAdamThreads + threadIdx.x;
      if (i >= N) break;
      if (i < k_begin || i >= k_end) {
        // the last tensor k with offset <= i (tensors are in order and cover [0, N))
        int lo = 0, hi = n_tensors - 1;
        while (lo < hi) {
          const int mid = (lo + hi + 1) >> 1;
          if (tensors[mid].offset <= i) lo = mid;
          else hi = mid - 1;
        }
        k_begin = tensors[lo].offset;
        k_end = lo + 1 < n_tensors ? tensors[lo + 1].offset : N;
        wd = tensors[lo].weight_decay;
      }
      const float g = grads[i] * gs;
      const float mi = h.beta1 * m[i] + (1.0f - h.beta1) * g;
      const float vi = h.beta2 * v[i] + (1.0f - h.beta2) * g * g;
      m[i] = mi;
      v[i] = vi;
      const float mhat = mi * h.rbc1, vhat = vi * h.rbc2;
      float w = params[i];
      w -= (h.lr * wd) * w;
      w -= h.lr * (mhat / (sqrtf(vhat) + h.eps));
      params[i] = w;
      if (kCopy) params_copy[i] = from_float<T>(w);
    }
  }
}

// partial[blockIdx.x] = sum of g^2 over the grid-stride elements of the block, in double.
__global__ void __launch_bounds__(kNormThreads) norm_partial_kernel(double* partial, const float* grads, size_t N) {
  __shared__ double shared[32];
  double s = 0.0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x) {
    const double g = grads[i];
    s += g * g;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out[0] = sum of the nparts partials, in a fixed order.
__global__ void __launch_bounds__(kNormThreads) norm_final_kernel(float* out, const double* partial, int nparts) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = (float)s;
}

__global__ void clip_scale_kernel(float* scale, const float* norm_squared, float max_norm) {
  const double ns = norm_squared[0];
  float f = 1.0f;
  if (max_norm > 0.0f && isfinite(ns)) {
    const double factor = (double)max_norm / (sqrt(ns) + 1e-6);
    if (factor < 1.0) f = (float)factor;
  }
  scale[0] = f;
}

template <typename T>
__global__ void __launch_bounds__(kAdamThreads) copy_params_kernel(T* dst, const float* src, size_t N) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = from_float<T>(src[i]);
}

}  // namespace

template <typename T>
void adamw_update(const Context& ctx, float* params, T* params_copy, const float* grads, float* m, float* v, size_t N,
                  const AdamWTensor* tensors, int n_tensors, const AdamWArgs& args, const float* grad_scale) {
  if (N == 0) return;
  if (tensors == nullptr || n_tensors <= 0) throw std::invalid_argument("adamw_update: no tensors");
  if (args.t < 1) throw std::invalid_argument("adamw_update: step t must be >= 1, got " + std::to_string(args.t));
  AdamWHyper h;
  h.lr = args.lr;
  h.beta1 = args.beta1;
  h.beta2 = args.beta2;
  h.eps = args.eps;
  h.rbc1 = (float)(1.0 / (1.0 - std::pow((double)args.beta1, args.t)));
  h.rbc2 = (float)(1.0 / (1.0 - std::pow((double)args.beta2, args.t)));
  const unsigned grid = grid_1d(ceil_div(N, kAdamElemsPerThread), kAdamThreads);
  if (params_copy)
    launch(adamw_kernel<T, true>, grid, kAdamThreads, 0, ctx.stream, params, params_copy, grads, m, v, N, tensors,
           n_tensors, h, grad_scale);
  else
    launch(adamw_kernel<T, false>, grid, kAdamThreads, 0, ctx.stream, params, params_copy, grads, m, v, N, tensors,
           n_tensors, h, grad_scale);
}

size_t global_norm_scratch_bytes(size_t N) { return (size_t)norm_blocks(N) * sizeof(double); }

void global_norm_squared(const Context& ctx, float* out, const float* grads, size_t N) {
  const int nblocks = norm_blocks(N);
  const size_t need = global_norm_scratch_bytes(N);
  if (ctx.scratch == nullptr || ctx.scratch_bytes < need)
    throw std::invalid_argument("global_norm_squared: ctx.scratch holds " + std::to_string(ctx.scratch_bytes) +
                                " bytes, needs " + std::to_string(need) + " (global_norm_scratch_bytes)");
  double* partial = static_cast<double*>(ctx.scratch);
  launch(norm_partial_kernel, nblocks, kNormThreads, 0, ctx.stream, partial, grads, N);
  launch(norm_final_kernel, 1, kNormThreads, 0, ctx.stream, out, partial, nblocks);
}

void clip_scale(const Context& ctx, float* scale, const float* norm_squared, float max_norm) {
  launch(clip_scale_kernel, 1, 1, 0, ctx.stream, scale, norm_squared, max_norm);
}

template <typename T>
void copy_params(const Context& ctx, T* dst, const float* src, size_t N) {
  if (N == 0) return;
  launch(copy_params_kernel<T>, grid_1d(N, kAdamThreads), kAdamThreads, 0, ctx.stream, dst, src, N);
}

#define TG_INSTANTIATE(T)                                                                                    \
  template void adamw_update<T>(const Context&, float*, T*, const float*, float*, float*, size_t,            \
                                const AdamWTensor*, int, const AdamWArgs&, const float*);                    \
  template void copy_params<T>(const Context&, T*, const float*, size_t);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
