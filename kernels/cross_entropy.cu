// kernels/cross_entropy.cu: fused softmax + cross-entropy on the GPU (contract in
// kernels/cross_entropy.cuh, CPU twin kernels/cpu/cross_entropy.cpp). One block per row z of
// length V with target y, in float:
//   pass 1 (online logsumexp): each thread keeps a running max m and sum s of exp(z_v - m)
//          over its columns v = tid, tid + blockDim, ...; the block combines them as
//          M = max m,  S = sum s exp(m - M)  (fixed-order block reductions), lse = M + log S
//   loss = lse - z_y                                                    (overwrites losses)
//   pass 2 (forward_backward only): dlogits_v = (exp(z_v - M) / S - [v == y]) dloss
//                                                                       (overwrites dlogits)
// dlogits may alias logits: z_y is read by every thread before the first block reduction
// (which syncs), and in pass 2 each thread overwrites only the columns it alone reads.
// Block size: one warp when V <= 1024 (char-level vocabularies), else 512 threads. Reading the
// logits twice in all (once for the loss alone). loss_mean: one block, double accumulation.
// Traffic (emulated counts, docs/BENCHMARKS.md): at V = 50304 (gpt2-124m) 99.6% sector
// efficiency but 1.5x the compulsory bytes moved, the row read twice; reading it once would
// keep the row on chip, 100 KB of shared memory per block in bf16 and 201 KB in fp32 (more than
// an A100's 163 KB a block). At V = 65 a row starts mid-sector: 53% efficiency, a kernel of
// far below 1% of the step's bytes.
#include "cross_entropy.cuh"

#include <cmath>
#include <stdexcept>

namespace gpu {

namespace {

constexpr int kSmallV = 1024;  // up to this V a row is one warp
constexpr int kMeanThreads = 1024;

template <typename T, int kThreads, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(float* losses,           // (N)
                         T* dlogits,              // (N, V) when kBackward
                         const T* logits,         // (N, V)
                         const int32_t* targets,  // (N)
                         float dloss, int V, int Vp) {
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  const T* z = logits + row * Vp;
  const int y = targets[row];
  const bool y_ok = y >= 0 && y < V;
  const float zy = y_ok ? to_float(z[y]) : NAN;  // before any write to dlogits

  float m = -INFINITY, s = 0.0f;
  for (int v = threadIdx.x; v < V; v += kThreads) {
    const float x = to_float(z[v]);
    if (x > m) {
      s = s * expf(m - x) + 1.0f;  // first column: 0 * exp(-inf) + 1
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  const float M = block_max(m, shared);
  const float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), shared);
  if (threadIdx.x == 0) losses[row] = M + logf(S) - zy;
  if (kBackward) {
    T* dz = dlogits + row * Vp;
    const float inv = 1.0f / S;
    for (int v = threadIdx.x; v < V; v += kThreads) {
      const float p = expf(to_float(z[v]) - M) * inv;
      dz[v] = from_float<T>((p - (v == y ? 1.0f : 0.0f)) * dloss);
    }
    for (int v = V + threadIdx.x; v < Vp; v += kThreads) dz[v] = from_float<T>(0.0f);  // padded: never trained
  }
}

template <typename T, bool kBackward>
void run(const Context& ctx, float* losses, T* dlogits, const T* logits, const int32_t* targets, float dloss, int N,
         int V, int Vp) {
  if (Vp <= 0) Vp = V;
  if (N < 0 || V <= 0 || Vp < V) throw std::invalid_argument("cross_entropy: bad size");
  if (N == 0) return;
  if (kBackward && dlogits != logits) {
    const size_t n = (size_t)N * Vp;
    if (!(dlogits + n <= logits || logits + n <= dlogits))
      throw std::invalid_argument("cross_entropy_forward_backward: dlogits partially overlaps logits");
  }
  if (V <= kSmallV)
    launch(cross_entropy_kernel<T, 32, kBackward>, N, 32, 0, ctx.stream, losses, dlogits, logits, targets, dloss, V, Vp);
  else
    launch(cross_entropy_kernel<T, 512, kBackward>, N, 512, 0, ctx.stream, losses, dlogits, logits, targets, dloss, V, Vp);
}

__global__ void __launch_bounds__(kMeanThreads) loss_mean_kernel(float* out, const float* losses, int N) {
  __shared__ double shared[32];
  double s = 0.0;
  for (long long i = threadIdx.x; i < N; i += kMeanThreads) s += (double)losses[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = (float)(s / N);
}

}  // namespace

template <typename T>
void cross_entropy_forward(const Context& ctx, float* losses, const T* logits, const int32_t* targets, int N, int V,
                           int Vp) {
  run<T, false>(ctx, losses, (T*)nullptr, logits, targets, 0.0f, N, V, Vp);
}

template <typename T>
void cross_entropy_forward_backward(const Context& ctx, float* losses, T* dlogits, const T* logits,
                                    const int32_t* targets, float dloss, int N, int V, int Vp) {
  run<T, true>(ctx, losses, dlogits, logits, targets, dloss, N, V, Vp);
}

void loss_mean(const Context& ctx, float* out, const float* losses, int N) {
  if (N <= 0) throw std::invalid_argument("loss_mean: N must be positive");
  launch(loss_mean_kernel, 1, kMeanThreads, 0, ctx.stream, out, losses, N);
}

#define TG_INSTANTIATE(T)                                                                                     \
  template void cross_entropy_forward<T>(const Context&, float*, const T*, const int32_t*, int, int, int);   \
  template void cross_entropy_forward_backward<T>(const Context&, float*, T*, const T*, const int32_t*, float, \
                                                  int, int, int);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
