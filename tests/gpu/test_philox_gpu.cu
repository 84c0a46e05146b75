// tests/gpu/test_philox_gpu.cu: kernels/philox.h gives the same words and the same dropout
// decisions on the device as on the host (the function is shared; this checks the compiled
// device code, e.g. 64-bit multiplies and the round loop, against the host build).
#include <vector>

#include "../../kernels/philox.h"
#include "gpu_util.cuh"

namespace {

__global__ void philox_words_kernel(uint32_t* out, int n, uint32_t k0, uint32_t k1) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  philox::U32x4 r = philox::philox4x32_10(i, 7 * i, 0x1234u, 0xffffffffu - i, k0, k1);
  for (int w = 0; w < 4; ++w) out[4 * i + w] = r.v[w];
}

__global__ void dropout_mask_kernel(uint8_t* mask, philox::DropoutKey key, int BH, int T) {
  long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long long)BH * T * T) return;
  int j = idx % T, i = (idx / T) % T, bh = idx / ((long long)T * T);
  // bit 0: the (B, T, C) sites' rule, bit 1: the attention probabilities'
  mask[idx] = (uint8_t)(philox::dropout_keep(key, bh, i, j) | (philox::attn_keep(key, bh, i, j) << 1));
}

}  // namespace

TG_GPU_TEST("gpu philox: device words equal host words") {
  const int n = 1 << 16;
  uint32_t* d = nullptr;
  TG_CUDA_CHECK(cudaMalloc(&d, 4 * n * sizeof(uint32_t)));
  gpu::launch(philox_words_kernel, (n + 255) / 256, 256, 0, nullptr, d, n, 0xdeadbeefu, 42u);
  std::vector<uint32_t> got(4 * n);
  TG_CUDA_CHECK(cudaMemcpy(got.data(), d, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  TG_CUDA_CHECK(cudaFree(d));
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    philox::U32x4 r = philox::philox4x32_10(i, 7 * i, 0x1234u, 0xffffffffu - i, 0xdeadbeefu, 42u);
    for (int w = 0; w < 4; ++w) mismatches += got[4 * i + w] != r.v[w];
  }
  CHECK(mismatches == 0);
}

TG_GPU_TEST("gpu philox: device dropout masks equal host masks (both rules)") {
  const int BH = 6, T = 97;
  philox::DropoutKey key = philox::make_dropout_key(1337, 12, 3, philox::kSiteAttnProbs, 0.17);
  const size_t n = (size_t)BH * T * T;
  uint8_t* d = nullptr;
  TG_CUDA_CHECK(cudaMalloc(&d, n));
  gpu::launch(dropout_mask_kernel, (unsigned)((n + 255) / 256), 256, 0, nullptr, d, key, BH, T);
  std::vector<uint8_t> got(n);
  TG_CUDA_CHECK(cudaMemcpy(got.data(), d, n, cudaMemcpyDeviceToHost));
  TG_CUDA_CHECK(cudaFree(d));
  size_t mismatches = 0;
  for (int bh = 0; bh < BH; ++bh)
    for (int i = 0; i < T; ++i)
      for (int j = 0; j < T; ++j)
        mismatches += got[((size_t)bh * T + i) * T + j] !=
                      (uint8_t)(philox::dropout_keep(key, bh, i, j) | (philox::attn_keep(key, bh, i, j) << 1));
  CHECK(mismatches == 0);
}
