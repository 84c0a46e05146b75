// tests/gpu/main.cu: the doctest runner of the GPU suite (build/test_gpu). Every test case is
// registered with TG_GPU_TEST, which marks it skipped when no CUDA device is visible, so a
// machine without a GPU reports them as skipped, never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "gpu_util.cuh"

int main(int argc, char** argv) {
  if (!tg_test::gpu_available()) std::printf("[test_gpu] no CUDA device visible: every GPU test is skipped\n");
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
