// tests/gpu/test_philox_gpu.cu: kernels/philox.h gives Random123's known answers and the same
// words and dropout decisions on the device as on the host (the function is shared, but its
// multiply has a device form, __umulhi; this checks the compiled device code, its multiplies and
// round loop, against the host build, and, where the emulator builds both sides alike, against
// the published vectors).
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

// Random123's known-answer vectors for Philox4x32-10 (also tests/cpu/test_philox.cpp's): counter,
// key, the words
struct Kat {
  uint32_t c[4], k[2], want[4];
};
__global__ void philox_kat_kernel(const Kat* kat, uint32_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const Kat& v = kat[i];
  const philox::U32x4 r = philox::philox4x32_10(v.c[0], v.c[1], v.c[2], v.c[3], v.k[0], v.k[1]);
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

TG_GPU_TEST("gpu philox: device words are Random123's known answers") {
  const std::vector<Kat> kat = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}};
  const int n = (int)kat.size();
  Kat* d_kat = nullptr;
  uint32_t* d = nullptr;
  TG_CUDA_CHECK(cudaMalloc(&d_kat, kat.size() * sizeof(Kat)));
  TG_CUDA_CHECK(cudaMalloc(&d, 4 * n * sizeof(uint32_t)));
  TG_CUDA_CHECK(cudaMemcpy(d_kat, kat.data(), kat.size() * sizeof(Kat), cudaMemcpyHostToDevice));
  gpu::launch(philox_kat_kernel, 1, 32, 0, nullptr, (const Kat*)d_kat, d, n);
  std::vector<uint32_t> got(4 * n);
  TG_CUDA_CHECK(cudaMemcpy(got.data(), d, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  TG_CUDA_CHECK(cudaFree(d));
  TG_CUDA_CHECK(cudaFree(d_kat));
  for (int i = 0; i < n; ++i)
    for (int w = 0; w < 4; ++w) CHECK(got[4 * i + w] == kat[i].want[w]);
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
