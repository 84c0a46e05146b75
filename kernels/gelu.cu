// kernels/gelu.cu: GELU on the GPU (contract in kernels/gelu.cuh, CPU twin
// kernels/cpu/gelu.cpp). The tanh form, with s = sqrt(2/pi), u = s (x + 0.044715 x^3) and
// q = 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)):
//   forward   out   = x q                                                   (overwrites out)
//   backward  dinp += (q + 2 s x q (1 - q) (1 + 3 * 0.044715 x^2)) dout    (accumulates)
// the same evaluation as the CPU twin (one exp, no cancellation in 1 + tanh for negative x;
// exp overflowing to inf far left gives q = 0 and finite results). The erf form, with Phi the
// normal CDF and phi its density:
//   forward   out   = x Phi(x) = 0.5 x erfc(-x / sqrt(2))
//   backward  dinp += (Phi(x) + x phi(x)) dout,   phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
// Phi through erfc, as the CPU twin (no cancellation in 1 + erf for negative x). The form is a
// template parameter. Computed in float with the accurate expf and erfcf. Elementwise, grid-stride, 16-byte packs (4 floats or 8 bf16) when every
// pointer is 16-byte aligned, then the tail (or everything, when misaligned) one by one.
#include "gelu.cuh"

#include <cstdint>

namespace gpu {

namespace {

constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr int kGeluThreads = 256;

__device__ __forceinline__ float gelu_q(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 1.0f / (1.0f + expf(-2.0f * u));
}

template <bool Erf>
__device__ __forceinline__ float gelu_value(float x) {
  if (Erf) return 0.5f * x * erfcf(-x * kInvSqrt2);
  return x * gelu_q(x);
}

// d gelu / dx
template <bool Erf>
__device__ __forceinline__ float gelu_grad(float x) {
  if (Erf) return 0.5f * erfcf(-x * kInvSqrt2) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
  const float q = gelu_q(x);
  return q + 2.0f * kSqrt2OverPi * x * q * (1.0f - q) * (1.0f + 3.0f * kCubic * x * x);
}

template <typename T, int P, bool Erf>
__global__ void __launch_bounds__(kGeluThreads) gelu_forward_kernel(T* out, const T* inp, size_t npacks) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < npacks; i += (size_t)gridDim.x * blockDim.x) {
    const Pack<T, P> x = reinterpret_cast<const Pack<T, P>*>(inp)[i];
    Pack<T, P> y;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      y.v[k] = from_float<T>(gelu_value<Erf>(to_float(x.v[k])));
    }
    reinterpret_cast<Pack<T, P>*>(out)[i] = y;
  }
}

template <typename T, int P, bool Erf>
__global__ void __launch_bounds__(kGeluThreads) gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t npacks) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < npacks; i += (size_t)gridDim.x * blockDim.x) {
    const Pack<T, P> x = reinterpret_cast<const Pack<T, P>*>(inp)[i];
    const Pack<T, P> d = reinterpret_cast<const Pack<T, P>*>(dout)[i];
    Pack<T, P> di = reinterpret_cast<const Pack<T, P>*>(dinp)[i];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      di.v[k] = from_float<T>(to_float(di.v[k]) + gelu_grad<Erf>(to_float(x.v[k])) * to_float(d.v[k]));
    }
    reinterpret_cast<Pack<T, P>*>(dinp)[i] = di;
  }
}

template <typename T, bool Erf>
void forward(const Context& ctx, T* out, const T* inp, size_t N) {
  constexpr int P = 16 / sizeof(T);
  const size_t head = aligned16(out) && aligned16(inp) ? N / P * P : 0;  // elements done in packs
  if (head) {
    launch(gelu_forward_kernel<T, P, Erf>, grid_1d(head / P, kGeluThreads), kGeluThreads, 0, ctx.stream, out, inp, head / P);
  }
  if (N > head) {
    launch(gelu_forward_kernel<T, 1, Erf>, grid_1d(N - head, kGeluThreads), kGeluThreads, 0, ctx.stream, out + head,
           inp + head, N - head);
  }
}

template <typename T, bool Erf>
void backward(const Context& ctx, T* dinp, const T* inp, const T* dout, size_t N) {
  constexpr int P = 16 / sizeof(T);
  const size_t head = aligned16(dinp) && aligned16(inp) && aligned16(dout) ? N / P * P : 0;
  if (head) {
    launch(gelu_backward_kernel<T, P, Erf>, grid_1d(head / P, kGeluThreads), kGeluThreads, 0, ctx.stream, dinp, inp, dout,
           head / P);
  }
  if (N > head) {
    launch(gelu_backward_kernel<T, 1, Erf>, grid_1d(N - head, kGeluThreads), kGeluThreads, 0, ctx.stream, dinp + head,
           inp + head, dout + head, N - head);
  }
}

}  // namespace

template <typename T>
void gelu_forward(const Context& ctx, T* out, const T* inp, size_t N, GeluForm form) {
  if (N == 0) return;
  if (form == GeluForm::Erf) forward<T, true>(ctx, out, inp, N);
  else forward<T, false>(ctx, out, inp, N);
}

template <typename T>
void gelu_backward(const Context& ctx, T* dinp, const T* inp, const T* dout, size_t N, GeluForm form) {
  if (N == 0) return;
  if (form == GeluForm::Erf) backward<T, true>(ctx, dinp, inp, dout, N);
  else backward<T, false>(ctx, dinp, inp, dout, N);
}

#define TG_INSTANTIATE(T)                                                       \
  template void gelu_forward<T>(const Context&, T*, const T*, size_t, GeluForm);          \
  template void gelu_backward<T>(const Context&, T*, const T*, const T*, size_t, GeluForm);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
