// tests/gpu/hopper_test_util.cuh: what the Hopper instruction tests share: bf16 bits of a small
// value, a bf16 tensor in device memory with its tensor map, and a kernel that lands two TMA
// boxes (tests/gpu/test_hopper_ptx.cu checks their bytes; tests/emu/test_hopper.cpp, built with
// the race checker's memory hook, its mode that reads a box too early). The kernels are in an
// unnamed namespace: each file compiles its own copy, with its own flags.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "../../kernels/cuda_common.cuh"
#include "../../kernels/hopper_ptx.cuh"
#include "gpu_util.cuh"

namespace tg_test {

// The bf16 bits of f, truncated: exact for the small integers and halves the tests use.
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

// A bf16 tensor of dim1 rows of dim0 elements, rows `pitch` bytes apart, element (x, y) = 1 + x +
// 100 y (never 0, the fill, nor 0xFFFF, the emulator's in-flight poison).
struct Tensor2d {
  int dim0, dim1, pitch;
  uint16_t* dev = nullptr;
  uint16_t at(int x, int y) const { return x < 0 || y < 0 || x >= dim0 || y >= dim1 ? 0 : (uint16_t)(1 + x + 100 * y); }
  void upload() {
    std::vector<uint16_t> h((size_t)(pitch / 2 * dim1), 0);
    for (int y = 0; y < dim1; ++y)
      for (int x = 0; x < dim0; ++x) h[(size_t)(y * (pitch / 2) + x)] = at(x, y);
    dev = device_alloc<uint16_t>(h.size());
    REQUIRE(cudaMemcpy(dev, h.data(), h.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  CUtensorMap map(int box0, int box1, CUtensorMapSwizzle swizzle) const {
    CUtensorMap m;
    const cuuint64_t dims[2] = {(cuuint64_t)dim0, (cuuint64_t)dim1}, strides[1] = {(cuuint64_t)pitch};
    const cuuint32_t box[2] = {(cuuint32_t)box0, (cuuint32_t)box1}, ones[2] = {1, 1};
    REQUIRE(gpu::hopper::encode_tiled()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, dev, dims, strides, box, ones,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
    return m;
  }
};

}  // namespace tg_test

namespace {

// The dynamic shared memory tma_kernel takes (4096 bytes from a 1024-byte boundary), and the bytes
// its boxes land.
constexpr size_t kTmaSmem = 4096 + 1024;
constexpr int kTmaBytes = 2048 + 16 * 5 * 2;

// Two boxes on one mbarrier, each partly outside the tensor: a 64 x 16 box with the 128B swizzle at
// (56, 30) to shared byte 0 and a 16 x 5 box without swizzle at (-8, -2) to byte 2048 (from the
// first 1024-byte boundary of the dynamic shared memory: launch with kTmaSmem bytes); then the raw
// shared bytes, kTmaBytes of them, to out. (A box's innermost coordinate starts on 16 bytes: at
// 60 or -3 an H100 stops with an illegal instruction.)
// MODE 1: thread 5 reads the first box before waiting (a race).
template <int MODE>
__global__ void tma_kernel(const __grid_constant__ CUtensorMap wide, const __grid_constant__ CUtensorMap narrow, uint16_t* out) {
  __shared__ uint64_t bar;
  unsigned char* s = gpu::hopper::align_1024(gpu::dynamic_smem<unsigned char>());
  const int t = threadIdx.x;
  if (t == 0) {
    gpu::hopper::mbarrier_init(&bar, 1);
    gpu::hopper::fence_mbarrier_init();
  }
  __syncthreads();
  if (t == 0) {
    gpu::hopper::mbarrier_arrive_expect_tx(&bar, kTmaBytes);
    gpu::hopper::tma_load_2d(s, &wide, 56, 30, &bar);
    gpu::hopper::tma_load_2d(s + 2048, &narrow, -8, -2, &bar);
  }
  __syncthreads();
  uint16_t early = 0;
  if (MODE == 1 && t == 5) std::memcpy(&early, s + 16, 2);
  gpu::hopper::mbarrier_wait_parity(&bar, 0);
  for (int i = t; i < kTmaBytes / 2; i += blockDim.x) {
    uint16_t v;
    std::memcpy(&v, s + 2 * i, 2);
    out[i] = (uint16_t)(v + early);
  }
}

}  // namespace
