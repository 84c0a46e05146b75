// tests/gpu/main.cu: the doctest runner of the GPU suite (build/test_gpu). Every test case is
// registered with TG_GPU_TEST, which marks it skipped when no CUDA device is visible, so a
// machine without a GPU reports them as skipped, never as passed. (doctest itself is
// tests/common/doctest_impl.cpp.)
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "gpu_util.cuh"

namespace tg_test {

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* s = std::getenv("TG_TEST_SEED");
    return s ? std::strtoull(s, nullptr, 10)
             : (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007ull;
  }();
  return seed;
}

}  // namespace tg_test

int main(int argc, char** argv) {
  if (!tg_test::gpu_available()) std::printf("[test_gpu] no CUDA device visible: every GPU test is skipped\n");
  else std::printf("[test_gpu] random inputs seeded with TG_TEST_SEED=%llu\n", (unsigned long long)tg_test::test_seed());
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
