// kernels/residual.cu: the residual add on the GPU (contract in kernels/residual.cuh, CPU twin
// kernels/cpu/residual.cpp).
//   forward   out = inp1 + inp2                      (overwrites out; out may be inp1 or inp2)
//   backward  dinp1 += dout, dinp2 += dout           (accumulates)
// When dinp1 == dinp2 the buffer gets dinp + 2 dout, computed in float and rounded once (the
// kSame template flag, chosen in the launcher). Each element is read and written by one
// thread, so exact aliasing is safe; partial overlap is rejected by the launcher.
// Elementwise, grid-stride, 16-byte packs when every pointer is 16-byte aligned, then the tail.
#include "residual.cuh"

#include <cstdint>
#include <stdexcept>

namespace gpu {

namespace {

constexpr int kResidualThreads = 256;

template <typename T, int P>
__global__ void __launch_bounds__(kResidualThreads)
    residual_forward_kernel(T* out, const T* inp1, const T* inp2, size_t npacks) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < npacks; i += (size_t)gridDim.x * blockDim.x) {
    const Pack<T, P> a = reinterpret_cast<const Pack<T, P>*>(inp1)[i];
    const Pack<T, P> b = reinterpret_cast<const Pack<T, P>*>(inp2)[i];
    Pack<T, P> o;
#pragma unroll
    for (int k = 0; k < P; ++k) o.v[k] = from_float<T>(to_float(a.v[k]) + to_float(b.v[k]));
    reinterpret_cast<Pack<T, P>*>(out)[i] = o;
  }
}

template <typename T, int P, bool kSame>
__global__ void __launch_bounds__(kResidualThreads) residual_backward_kernel(T* dinp1, T* dinp2, const T* dout, size_t npacks) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < npacks; i += (size_t)gridDim.x * blockDim.x) {
    const Pack<T, P> d = reinterpret_cast<const Pack<T, P>*>(dout)[i];
    Pack<T, P> a = reinterpret_cast<const Pack<T, P>*>(dinp1)[i];
    if (kSame) {
#pragma unroll
      for (int k = 0; k < P; ++k) a.v[k] = from_float<T>(to_float(a.v[k]) + 2.0f * to_float(d.v[k]));
      reinterpret_cast<Pack<T, P>*>(dinp1)[i] = a;
    } else {
      Pack<T, P> b = reinterpret_cast<const Pack<T, P>*>(dinp2)[i];
#pragma unroll
      for (int k = 0; k < P; ++k) {
        a.v[k] = from_float<T>(to_float(a.v[k]) + to_float(d.v[k]));
        b.v[k] = from_float<T>(to_float(b.v[k]) + to_float(d.v[k]));
      }
      reinterpret_cast<Pack<T, P>*>(dinp1)[i] = a;
      reinterpret_cast<Pack<T, P>*>(dinp2)[i] = b;
    }
  }
}

// [a, a + n) and [b, b + n) are the same range or disjoint.
template <typename T>
bool same_or_disjoint(const T* a, const T* b, size_t n) {
  return a == b || a + n <= b || b + n <= a;
}

template <typename T, bool kSame>
void launch_backward(const Context& ctx, T* dinp1, T* dinp2, const T* dout, size_t N) {
  constexpr int P = 16 / sizeof(T);
  const size_t head = aligned16(dinp1) && aligned16(dinp2) && aligned16(dout) ? N / P * P : 0;
  if (head) {
    launch(residual_backward_kernel<T, P, kSame>, grid_1d(head / P, kResidualThreads), kResidualThreads, 0, ctx.stream, dinp1, dinp2,
           dout, head / P);
  }
  if (N > head) {
    launch(residual_backward_kernel<T, 1, kSame>, grid_1d(N - head, kResidualThreads), kResidualThreads, 0, ctx.stream, dinp1 + head,
           dinp2 + head, dout + head, N - head);
  }
}

}  // namespace

template <typename T>
void residual_forward(const Context& ctx, T* out, const T* inp1, const T* inp2, size_t N) {
  if (N == 0) return;
  if (!same_or_disjoint<T>(out, inp1, N) || !same_or_disjoint<T>(out, inp2, N))
    throw std::invalid_argument("residual_forward: out partially overlaps an input");
  constexpr int P = 16 / sizeof(T);
  const size_t head = aligned16(out) && aligned16(inp1) && aligned16(inp2) ? N / P * P : 0;
  if (head) {
    launch(residual_forward_kernel<T, P>, grid_1d(head / P, kResidualThreads), kResidualThreads, 0, ctx.stream, out, inp1, inp2,
           head / P);
  }
  if (N > head) {
    launch(residual_forward_kernel<T, 1>, grid_1d(N - head, kResidualThreads), kResidualThreads, 0, ctx.stream, out + head, inp1 + head,
           inp2 + head, N - head);
  }
}

template <typename T>
void residual_backward(const Context& ctx, T* dinp1, T* dinp2, const T* dout, size_t N) {
  if (N == 0) return;
  if (!same_or_disjoint<T>(dinp1, dinp2, N) || !same_or_disjoint<T>(dinp1, dout, N) ||
      !same_or_disjoint<T>(dinp2, dout, N) || dinp1 == dout || dinp2 == dout)
    throw std::invalid_argument("residual_backward: dinp1 / dinp2 / dout overlap (only dinp1 == dinp2 is allowed)");
  if (dinp1 == dinp2) launch_backward<T, true>(ctx, dinp1, dinp2, dout, N);
  else launch_backward<T, false>(ctx, dinp1, dinp2, dout, N);
}

#define TG_INSTANTIATE(T)                                                             \
  template void residual_forward<T>(const Context&, T*, const T*, const T*, size_t); \
  template void residual_backward<T>(const Context&, T*, T*, const T*, size_t);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
