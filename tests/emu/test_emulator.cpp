// tests/emu/test_emulator.cpp: the emulator's own checks fire. Every fault the emulator claims
// to catch (tests/emu/simt_emulator.cpp and tests/emu/cuda_runtime_emu.cpp say which) is
// provoked here on purpose, so that a model or kernel test that passes under the emulator means
// something: a launch outside the device's limits, dynamic shared memory above 48 KB without
// opting in, a read past a buffer, into a carved region's gap, from the host, a misaligned
// vector access, a deadlocked barrier, a partial-warp collective, a tile read before its
// cp.async landed, a missing stream synchronisation, and the sticky-error contract.
//
// A fault that kills the process (AddressSanitizer, UndefinedBehaviorSanitizer) or makes the
// device's error sticky for the rest of the process runs in a forked child; the test checks its
// exit status and what it printed on stderr (the report, and the emulator's line that names the
// kernel, block and thread).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../../kernels/cuda_common.cuh"
#include "child_process.h"
#include "emu_internal.h"

namespace {

using tg_test::ChildResult;
using tg_test::in_child;
using tg_test::has;
using tg_test::device_alloc;
using tg_test::download;

// ---- kernels that do something wrong on purpose -----------------------------------------------
__global__ void copy_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

// reads in[n] (one past the end) when over is set
__global__ void read_past_kernel(float* out, const float* in, int n, int over) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i + (i == n - 1 ? over : 0)];
}

struct alignas(16) F4 {
  float v[4];
};
__global__ void float4_kernel(float* out, const float* in) {
  const F4 x = *reinterpret_cast<const F4*>(in);  // in must be 16-byte aligned
  out[threadIdx.x] = x.v[0];
}

__global__ void skip_barrier_kernel(float* out) {
  if (threadIdx.x != 32) __syncthreads();  // thread 32 exits without reaching the barrier
  out[threadIdx.x] = 1.f;
}

__global__ void shuffle_kernel(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
}

// each lane's view of its warp's votes, in a block of two warps: for __ballot_sync lane l votes
// l % 3 == 0; for __any_sync lane 31 of warp 0 alone votes yes; for __all_sync lane 7 of warp 0
// alone votes no
__global__ void vote_kernel(unsigned* out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  out[3 * threadIdx.x] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  out[3 * threadIdx.x + 1] = (unsigned)__any_sync(0xffffffffu, warp == 0 && lane == 31);
  out[3 * threadIdx.x + 2] = (unsigned)__all_sync(0xffffffffu, warp == 1 || lane != 7);
}

__global__ void smem_kernel(float* out, int past) {
  float* s = gpu::dynamic_smem<float>();
  s[threadIdx.x] = (float)threadIdx.x;
  if (past && threadIdx.x == 0) s[blockDim.x] = 1.f;  // one float past the launch's shared memory
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

__global__ void early_read_kernel(float* out, const float* src) {
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int t = (int)threadIdx.x;
  gpu::flash::cp_async_16(s + 16 * t, src + 4 * t, true);
  gpu::flash::cp_async_commit();
  float v;
  std::memcpy(&v, s + 16 * t, 4);  // not waited for yet
  gpu::flash::cp_async_wait<0>();
  float w;
  std::memcpy(&w, s + 16 * t, 4);
  out[2 * t] = v;
  out[2 * t + 1] = w;
}

__global__ void tid_kernel(int* out) {
  const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  out[b * blockDim.x * blockDim.y * blockDim.z + t] = t * 1000 + b;
}

}  // namespace

TEST_CASE("emulator: the device is an emulated H100 by name, with the part's limits") {
  cudaDeviceProp p{};
  REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
  CHECK(std::string(p.name).rfind("EMULATED", 0) == 0);
  CHECK(p.major == 9);
  CHECK(p.multiProcessorCount == 132);
  CHECK(p.sharedMemPerBlock == 48 * 1024);
  CHECK(p.sharedMemPerBlockOptin == 227 * 1024);
  int n = 0;
  CHECK(cudaGetDeviceCount(&n) == cudaSuccess);
  CHECK(n == 1);
  const ChildResult a100 = in_child([] {
    setenv("TG_EMU_DEVICE", "a100", 1);
    cudaDeviceProp q{};
    cudaGetDeviceProperties(&q, 0);
    return q.major == 8 && q.multiProcessorCount == 108 && q.sharedMemPerBlockOptin == 163 * 1024 ? 0 : 1;
  });
  INFO("child stderr: " << a100.err);
  CHECK(a100.exit_code == 0);
}

TEST_CASE("emulator: thread and block indices of 3-D launches, and partial warps") {
  const dim3 grid(3, 2, 2), block(5, 3, 2);  // 30 threads a block: one partial warp
  const size_t n = 12 * 30;
  int* d = device_alloc<int>(n);
  gpu::launch(tid_kernel, grid, block, 0, nullptr, d);
  const std::vector<int> h = download(d, n);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += h[i] != (int)((i % 30) * 1000 + i / 30);
  CHECK(bad == 0);
  cudaFree(d);
}

TEST_CASE("emulator: __ballot_sync, __any_sync and __all_sync give every lane the warp's votes") {
  unsigned* d = device_alloc<unsigned>(3 * 64);
  gpu::launch(vote_kernel, 1, 64, 0, nullptr, d);
  const std::vector<unsigned> h = download(d, 3 * 64);
  unsigned thirds = 0;
  for (int l = 0; l < 32; l += 3) thirds |= 1u << l;
  for (int t = 0; t < 64; ++t) {
    CAPTURE(t);
    CHECK(h[3 * t] == thirds);
    CHECK(h[3 * t + 1] == (t < 32 ? 1u : 0u));  // lane 31 of warp 0 alone votes yes
    CHECK(h[3 * t + 2] == (t < 32 ? 0u : 1u));  // lane 7 of warp 0 votes no
  }
  cudaFree(d);
}

TEST_CASE("emulator: launch configurations outside the device's limits fail at the launch, then clear") {
  float* d = device_alloc<float>(64);
  auto launch_raw = [&](dim3 grid, dim3 block, size_t smem) {
    emu::launch_kernel(copy_kernel, grid, block, smem, nullptr, d, d, 0);
    return cudaGetLastError();
  };
  CHECK(launch_raw(1, 1025, 0) == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
  CHECK(launch_raw(1, dim3(32, 32, 2), 0) == cudaErrorInvalidConfiguration);
  CHECK(launch_raw(dim3(1, 65536), 32, 0) == cudaErrorInvalidConfiguration);
  CHECK(launch_raw(dim3(0), 32, 0) == cudaErrorInvalidConfiguration);
  CHECK(launch_raw(1, 32, 48 * 1024) == cudaSuccess);
  // above 48 KB only after cudaFuncSetAttribute for that kernel, up to the opt-in limit
  CHECK(launch_raw(1, 32, 48 * 1024 + 16) == cudaErrorInvalidValue);
  CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(copy_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             100 * 1024) == cudaSuccess);
  CHECK(launch_raw(1, 32, 100 * 1024) == cudaSuccess);
  CHECK(launch_raw(1, 32, 100 * 1024 + 16) == cudaErrorInvalidValue);
  CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(copy_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             228 * 1024) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);  // a failed call is the last error too
  CHECK(cudaGetLastError() == cudaSuccess);
  // gpu::launch turns the same failure into one line naming the kernel, its configuration and
  // the way round it
  std::string what;
  try {
    gpu::launch(copy_kernel, 1, 2048, 0, nullptr, d, d, 0);
  } catch (const gpu::CudaError& e) {
    what = e.what();
  }
  CAPTURE(what);
  CHECK(what.find("CUDA kernel launch failed: invalid configuration argument (kernel ") == 0);
  CHECK(what.find("copy_kernel(float*, float const*, int), grid (1,1,1), block (2048,1,1), 0 bytes") != std::string::npos);
  CHECK(what.find("pass --device cpu") != std::string::npos);
  CHECK(what.find('\n') == std::string::npos);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  cudaFree(d);
}

TEST_CASE("emulator: device memory reads as NaN until written; copies run in stream order") {
  const int n = 300;
  float* a = device_alloc<float>(n);
  float* b = device_alloc<float>(n);
  CHECK(std::isnan(download(a, 1)[0]));  // cudaMalloc gives no initial values
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = (float)i;
  REQUIRE(cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  gpu::launch(copy_kernel, 2, 256, 0, nullptr, b, a, n);  // the legacy stream: after the copy
  const std::vector<float> got = download(b, n);
  CHECK(got == h);
  cudaFree(a);
  cudaFree(b);
}

TEST_CASE("emulator: a missing synchronisation between streams shows as wrong data") {
  const int n = 256;
  float* a = device_alloc<float>(n);
  float* b = device_alloc<float>(n);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const std::vector<float> ones(n, 1.f);
  // the copy goes to the legacy stream and may land after the kernel on the non-blocking s
  REQUIRE(cudaMemcpy(a, ones.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  gpu::launch(copy_kernel, 1, 256, 0, s, b, a, n);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(std::isnan(download(b, 1)[0]));  // the kernel ran first: it copied uninitialised memory
  // synchronised: the data is there
  REQUIRE(cudaMemcpy(a, ones.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  gpu::launch(copy_kernel, 1, 256, 0, s, b, a, n);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(download(b, 1)[0] == 1.f);
  // a pinned source is read when the copy runs: changing it before then changes what lands
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, n * sizeof(float)) == cudaSuccess);
  for (int i = 0; i < n; ++i) pinned[i] = 2.f;
  REQUIRE(cudaMemcpyAsync(a, pinned, n * sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);
  for (int i = 0; i < n; ++i) pinned[i] = 3.f;
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(download(a, 1)[0] == 3.f);
  // a pageable source is staged at the call
  std::vector<float> pageable(n, 4.f);
  REQUIRE(cudaMemcpyAsync(a, pageable.data(), n * sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);
  pageable.assign(n, 5.f);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(download(a, 1)[0] == 4.f);
  cudaFreeHost(pinned);
  cudaStreamDestroy(s);
  cudaFree(a);
  cudaFree(b);
}

TEST_CASE("emulator: copies outside device memory are refused with cudaErrorInvalidValue") {
  float* a = device_alloc<float>(10);
  std::vector<float> h(11);
  CHECK(cudaMemcpy(a, h.data(), 11 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(h.data(), a, 11 * sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(h.data(), h.data() + 1, sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemset(a + 5, 0, 6 * sizeof(float)) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
  cudaFree(a);
}

TEST_CASE("emulator: a dynamic shared memory tile read before its cp.async landed is NaN") {
  float* src = device_alloc<float>(4 * 64);
  float* out = device_alloc<float>(2 * 64);
  std::vector<float> h(4 * 64, 7.f);
  REQUIRE(cudaMemcpy(src, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  gpu::launch(early_read_kernel, 1, 64, 64 * 16, nullptr, out, src);
  const std::vector<float> got = download(out, 2 * 64);
  CHECK(std::isnan(got[10]));  // before the wait
  CHECK(got[11] == 7.f);       // after
  cudaFree(src);
  cudaFree(out);
}

TEST_CASE("emulator: a fault is sticky (deadlocked barrier, partial-warp shuffle)") {
  const ChildResult deadlock = in_child([] {
    float* d = nullptr;
    cudaMalloc(&d, 64 * sizeof(float));
    gpu::launch(skip_barrier_kernel, 1, 64, 0, nullptr, d);  // the launch itself is fine
    const cudaError_t sync = cudaDeviceSynchronize();
    float* e = nullptr;
    const cudaError_t later = cudaMalloc(&e, 16);  // every later call returns the sticky error
    return sync == cudaErrorLaunchFailure && later == cudaErrorLaunchFailure && cudaGetLastError() == sync ? 0 : 1;
  });
  INFO("child stderr: " << deadlock.err);
  CHECK(deadlock.exit_code == 0);
  CHECK(has(deadlock.err, "deadlock in block (0,0,0)"));
  CHECK(has(deadlock.err, "skip_barrier_kernel"));
  const ChildResult partial = in_child([] {
    float* d = nullptr;
    cudaMalloc(&d, 48 * sizeof(float));
    gpu::launch(shuffle_kernel, 1, 48, 0, nullptr, d);  // warp 1 has 16 threads
    return cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1;
  });
  INFO("child stderr: " << partial.err);
  CHECK(partial.exit_code == 0);
  CHECK(has(partial.err, "__shfl_xor_sync with a full mask in a warp of 16 threads"));
}

TEST_CASE("emulator: a read one element past a buffer is reported, naming the kernel, block and thread") {
  const ChildResult r = in_child([] {
    const int n = 100;
    float* in = nullptr;
    float* out = nullptr;
    cudaMalloc(&in, n * sizeof(float));
    cudaMalloc(&out, n * sizeof(float));
    cudaMemset(in, 0, n * sizeof(float));
    gpu::launch(read_past_kernel, 1, 128, 0, nullptr, out, in, n, 1);
    cudaDeviceSynchronize();
    return 0;  // not reached
  });
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code != 0);
  CHECK(has(r.err, "AddressSanitizer"));
  CHECK(has(r.err, "the report above comes from kernel"));
  CHECK(has(r.err, "read_past_kernel"));
  CHECK(has(r.err, "thread (99,0,0)"));
  // the same kernel without the overrun runs clean (so the report above is the overrun's)
  const ChildResult ok = in_child([] {
    float* in = nullptr;
    float* out = nullptr;
    cudaMalloc(&in, 100 * sizeof(float));
    cudaMalloc(&out, 100 * sizeof(float));
    cudaMemset(in, 0, 100 * sizeof(float));
    gpu::launch(read_past_kernel, 1, 128, 0, nullptr, out, in, 100, 0);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
  });
  INFO("child stderr: " << ok.err);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("emulator: a region carved from one allocation cannot spill into the next") {
  // two regions of 100 floats with a gap between them, as net::Carver (model/net/gpt_net.h) lays
  // them for model/net/gpt_cuda.cu
  const ChildResult r = in_child([] {
    char* arena = nullptr;
    const size_t region = 100 * sizeof(float), second = 1024 + gpu::kRegionGapBytes + 1024;
    cudaMalloc(&arena, second + region);
    gpu::mark_no_access(arena + region, second - region);
    float* a = reinterpret_cast<float*>(arena);
    float* b = reinterpret_cast<float*>(arena + second);
    cudaMemset(arena, 0, second + region);  // a memset over the whole allocation is fine
    gpu::launch(copy_kernel, 1, 128, 0, nullptr, b, a, 101);  // a is one element short
    cudaDeviceSynchronize();
    return 0;
  });
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code != 0);
  CHECK(has(r.err, "AddressSanitizer"));
  CHECK(has(r.err, "copy_kernel"));
  CHECK(has(r.err, "thread (100,0,0)"));
}

TEST_CASE("emulator: host code that dereferences device memory is reported") {
  const ChildResult r = in_child([] {
    float* d = nullptr;
    cudaMalloc(&d, 16 * sizeof(float));
    volatile float x = d[3];  // on a GPU: a segmentation fault
    (void)x;
    return 0;
  });
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code != 0);
  CHECK(has(r.err, "AddressSanitizer"));
  CHECK(has(r.err, "comes from host code"));
}

TEST_CASE("emulator: a misaligned 16-byte vector access is reported") {
  const ChildResult r = in_child([] {
    float* d = nullptr;
    cudaMalloc(&d, 64 * sizeof(float));
    cudaMemset(d, 0, 64 * sizeof(float));
    gpu::launch(float4_kernel, 1, 32, 0, nullptr, d + 32, d + 1);  // 4-byte aligned only
    cudaDeviceSynchronize();
    return 0;
  });
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code != 0);
  CHECK(has(r.err, "misaligned address"));
  CHECK(has(r.err, "float4_kernel"));
}

TEST_CASE("emulator: a store past the launch's dynamic shared memory is reported") {
  const ChildResult ok = in_child([] {
    float* d = nullptr;
    cudaMalloc(&d, 64 * sizeof(float));
    gpu::launch(smem_kernel, 1, 64, 64 * sizeof(float), nullptr, d, 0);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
  });
  INFO("child stderr: " << ok.err);
  CHECK(ok.exit_code == 0);
  const ChildResult r = in_child([] {
    float* d = nullptr;
    cudaMalloc(&d, 64 * sizeof(float));
    gpu::launch(smem_kernel, 1, 64, 64 * sizeof(float), nullptr, d, 1);
    cudaDeviceSynchronize();
    return 0;
  });
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code != 0);
  CHECK(has(r.err, "AddressSanitizer"));
  CHECK(has(r.err, "smem_kernel"));
}

TEST_CASE("emulator: a host pointer passed to a kernel is a fault") {
  const ChildResult r = in_child([] {
    std::vector<float> host(64);
    float* d = nullptr;
    cudaMalloc(&d, 64 * sizeof(float));
    emu::launch_kernel(copy_kernel, 1, 64, 0, nullptr, d, host.data(), 64);
    return cudaGetLastError() == cudaErrorIllegalAddress && cudaDeviceSynchronize() == cudaErrorIllegalAddress ? 0 : 1;
  });
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code == 0);
  CHECK(has(r.err, "argument 1"));
  CHECK(has(r.err, "not device memory"));
}
