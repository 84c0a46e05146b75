// tests/gpu/gpu_util.cuh: what the GPU tests share: device detection, the skip decorator,
// and the check macro.
#pragma once
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

namespace tg_test {

inline bool gpu_available() {
  static const bool yes = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return yes;
}

}  // namespace tg_test

// A GPU test case: skipped (and counted as skipped) without a visible device.
#define TG_GPU_TEST(name) TEST_CASE(name * doctest::skip(!tg_test::gpu_available()))

#define TG_CUDA_CHECK(call)                                                                          \
  do {                                                                                               \
    cudaError_t err_ = (call);                                                                       \
    if (err_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(err_), __FILE__, __LINE__, \
                   #call);                                                                           \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)
