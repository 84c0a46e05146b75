// tests/emu/test_kernel_profiler.cpp: the memory hook sees every access of kernel code, and the
// kernel profiler's counters (tests/emu/kernel_profiler.h) are the ones Nsight Compute defines,
// on kernels whose answer is worked out by hand: coalesced and transposed copies, a shared tile
// with and without its padding column, 8- and 16-byte shared accesses in their phases, a
// broadcast, a divergent branch, ldmatrix rows with and without padding, mma.sync and cp.async.
//
// This file is compiled like kernels/*.cu (the Makefile's EMU_HOOK_FLAGS), so that its kernels
// carry the hook.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../../kernels/cuda_common.cuh"
#include "../../kernels/flash_attn_common.cuh"
#include "child_process.h"
#include "kernel_profiler.h"

namespace {

using tg_test::has;

template <typename T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMemset(p, 0, n * sizeof(T)) == cudaSuccess);
  return p;
}

void run() { REQUIRE(cudaDeviceSynchronize() == cudaSuccess); }

// ---- kernels with a known answer ------------------------------------------------------------------
__global__ void copy_kernel(float* out, const float* in) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = in[i];
}

// out = in^T for a 32 x 32 matrix read column by column: each warp's lanes 128 bytes apart
__global__ void column_read_kernel(float* out, const float* in) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = in[(i % 32) * 32 + i / 32];
}

// the same through a shared tile (PAD = 1: the padding column that spreads a column over banks)
template <int PAD>
__global__ void tile_transpose_kernel(float* out, const float* in) {
  __shared__ float tile[32][32 + PAD];
  const int x = threadIdx.x, y = threadIdx.y;
  tile[y][x] = in[y * 32 + x];
  __syncthreads();
  out[y * 32 + x] = tile[x][y];
}

// 8- and 16-byte shared accesses: lane l touches element l * STRIDE of V-wide vectors
template <typename V, int STRIDE>
__global__ void vector_smem_kernel(float* out) {
  V* s = gpu::dynamic_smem<V>();
  const int l = threadIdx.x;
  V v{};
  s[l * STRIDE] = v;
  __syncthreads();
  v = s[l * STRIDE];
  out[l] = reinterpret_cast<const float*>(&v)[0];
}

// every lane reads the same word, of shared and of global memory; one lane writes a static
// __shared__ scalar (a constant-index access AddressSanitizer's instrumentation would skip)
__global__ void broadcast_kernel(float* out, const float* in) {
  __shared__ float total;
  if (threadIdx.x == 0) total = in[0] + 1.f;
  __syncthreads();
  out[threadIdx.x] = total + in[0];
}

// half the lanes, then a loop: one site executed four times per lane
__global__ void divergent_kernel(float* out, const float* in, int passes) {
  const int i = threadIdx.x;
  if (i % 2 == 0) out[i] = in[i];
  for (int k = 1; k <= passes; ++k) out[k * 32 + i] = 2.f;
}

// one ldmatrix.x4 per warp from rows ROW_BYTES apart, then one mma
template <int ROW_BYTES>
__global__ void ldmatrix_kernel(float* out) {
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int l = threadIdx.x;
  for (int b = 0; b < 16; ++b) s[l * ROW_BYTES + b] = 0;
  __syncthreads();
  uint32_t a[4];
  gpu::flash::ldmatrix_x4(a, gpu::flash::smem_u32(s + l * ROW_BYTES));
  float d[4] = {0, 0, 0, 0};
  gpu::flash::mma_bf16_16816(d, a, a[0], a[1]);
  out[l] = d[0];
}

// one cp.async.cg 16 per lane, then a wait
__global__ void cp_async_kernel(float* out, const float* in) {
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int l = threadIdx.x;
  gpu::flash::cp_async_16(s + 16 * l, in + 4 * l, true);
  gpu::flash::cp_async_commit();
  gpu::flash::cp_async_wait<0>();
  out[l] = reinterpret_cast<const float*>(s)[4 * l];
}

// a bf16 pair copied whole: on the device one 32-bit access each way
__global__ void bf16x2_copy_kernel(__nv_bfloat162* out, const __nv_bfloat162* in) {
  out[threadIdx.x] = in[threadIdx.x];
}

// reads in[n] (one past the end) in the last thread
__global__ void overrun_kernel(float* out, const float* in, int n) {
  const int i = threadIdx.x;
  if (i < n) out[i] = in[i + (i == n - 1 ? 1 : 0)];
}

}  // namespace

TEST_CASE("kernel profiler: a coalesced copy moves what it asks for; a column read needs a sector a lane") {
  float* in = device_alloc<float>(1024);
  float* out = device_alloc<float>(1024);
  emu::KernelProfiler prof;
  gpu::launch(copy_kernel, 4, 256, 0, nullptr, out, in);
  gpu::launch(column_read_kernel, 4, 256, 0, nullptr, out, in);
  run();
  REQUIRE(prof.launches().size() == 2);
  const emu::KernelCounters& c = prof.launches()[0];
  CHECK(has(c.kernel, "copy_kernel"));
  CHECK(c.load.requests == 32);  // 1024 threads = 32 warps, one load each
  CHECK(c.load.sectors == 32 * 4);
  CHECK(c.load.ideal_sectors == 32 * 4);
  CHECK(c.load.bytes == 4096);
  CHECK(c.load.efficiency() == doctest::Approx(1.0));
  CHECK(c.store.sectors == 128);
  CHECK(c.unique_read_bytes == 4096);
  CHECK(c.unique_write_bytes == 4096);
  CHECK(c.moved_bytes() == 8192);
  CHECK(c.shared_load.requests + c.shared_store.requests == 0);

  const emu::KernelCounters& t = prof.launches()[1];
  CHECK(t.load.requests == 32);
  CHECK(t.load.sectors == 32 * 32);  // every lane its own sector
  CHECK(t.load.ideal_sectors == 32 * 4);
  CHECK(t.load.efficiency() == doctest::Approx(0.125));
  CHECK(t.unique_read_bytes == 4096);  // the compulsory traffic is the same: every byte read once
  CHECK(t.store.efficiency() == doctest::Approx(1.0));
  REQUIRE(t.sites.size() == 2);
  CHECK(has(emu::source_line(t.sites[0].pc), "test_kernel_profiler.cpp:"));
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("kernel profiler: a 32 x 32 shared tile read by column conflicts 32-way, padded not at all") {
  float* in = device_alloc<float>(1024);
  float* out = device_alloc<float>(1024);
  emu::KernelProfiler prof;
  gpu::launch(tile_transpose_kernel<0>, 1, dim3(32, 32), 0, nullptr, out, in);
  gpu::launch(tile_transpose_kernel<1>, 1, dim3(32, 32), 0, nullptr, out, in);
  run();
  REQUIRE(prof.launches().size() == 2);
  const emu::KernelCounters& bare = prof.launches()[0];
  CHECK(bare.shared_store.requests == 32);
  CHECK(bare.shared_store.conflicts() == 0);  // rows: 32 banks once
  CHECK(bare.shared_load.requests == 32);
  CHECK(bare.shared_load.wavefronts == 32 * 32);  // a column: one bank, 32 words
  CHECK(bare.shared_load.conflicts() == 32 * 31);
  const emu::KernelCounters& padded = prof.launches()[1];
  CHECK(padded.shared_load.wavefronts == 32);
  CHECK(padded.shared_load.conflicts() == 0);
  CHECK(padded.shared_store.conflicts() == 0);
  // the report names the conflicting site by its source line
  const std::string r = prof.report();
  CHECK(has(r, "conflicts"));
  CHECK(has(r, "test_kernel_profiler.cpp:"));
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("kernel profiler: 8-byte accesses in two phases, 16-byte ones in four") {
  float* out = device_alloc<float>(32);
  emu::KernelProfiler prof;
  gpu::launch(vector_smem_kernel<float2, 1>, 1, 32, 32 * 8, nullptr, out);
  gpu::launch(vector_smem_kernel<float4, 1>, 1, 32, 32 * 16, nullptr, out);
  gpu::launch(vector_smem_kernel<float4, 2>, 1, 32, 64 * 16, nullptr, out);
  run();
  REQUIRE(prof.launches().size() == 3);
  CHECK(prof.launches()[0].shared_store.wavefronts == 2);
  CHECK(prof.launches()[0].shared_store.conflicts() == 0);
  CHECK(prof.launches()[1].shared_load.wavefronts == 4);
  CHECK(prof.launches()[1].shared_load.conflicts() == 0);
  // 32 bytes apart: lanes l and l + 4 of a quarter share banks, 2 wavefronts a phase
  CHECK(prof.launches()[2].shared_load.wavefronts == 8);
  CHECK(prof.launches()[2].shared_load.conflicts() == 4);
  cudaFree(out);
}

TEST_CASE("kernel profiler: a broadcast is one wavefront; a static __shared__ scalar is seen") {
  float* in = device_alloc<float>(32);
  float* out = device_alloc<float>(64);
  emu::KernelProfiler prof;
  gpu::launch(broadcast_kernel, 1, 64, 0, nullptr, out, in);
  run();
  const emu::KernelCounters& c = prof.launches().at(0);
  CHECK(c.shared_store.requests == 1);  // lane 0 of warp 0 alone
  CHECK(c.shared_store.wavefronts == 1);
  CHECK(c.shared_load.requests == 2);  // both warps, every lane the same word
  CHECK(c.shared_load.wavefronts == 2);
  CHECK(c.shared_load.conflicts() == 0);
  // global: the lone read of in[0] and the two warps' broadcast reads, a sector each, 4 bytes of 32
  CHECK(c.load.requests == 3);
  CHECK(c.load.sectors == 3);
  CHECK(c.load.bytes == 12);
  CHECK(c.unique_read_bytes == 32);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("kernel profiler: inactive lanes do not count; a site in a loop is one request per pass") {
  float* in = device_alloc<float>(32);
  float* out = device_alloc<float>(160);
  emu::KernelProfiler prof;
  gpu::launch(divergent_kernel, 1, 32, 0, nullptr, out, in, 4);
  run();
  const emu::KernelCounters& c = prof.launches().at(0);
  CHECK(c.load.requests == 1);
  CHECK(c.load.sectors == 4);        // 16 lanes spread over the 128 bytes
  CHECK(c.load.ideal_sectors == 2);  // 16 lanes x 4 bytes
  CHECK(c.load.efficiency() == doctest::Approx(0.5));
  CHECK(c.store.requests == 1 + 4);
  CHECK(c.sites.size() == 3);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("kernel profiler: ldmatrix rows in four phases of eight, mma.sync counted per warp") {
  float* out = device_alloc<float>(64);
  emu::KernelProfiler prof;
  gpu::launch(ldmatrix_kernel<128>, 1, 64, 64 * 128, nullptr, out);  // rows 128 bytes apart: one bank group
  gpu::launch(ldmatrix_kernel<144>, 1, 64, 64 * 144, nullptr, out);  // + 16 bytes: every row its own banks
  run();
  REQUIRE(prof.launches().size() == 2);
  const emu::KernelCounters& bare = prof.launches()[0];
  const emu::SiteCounters* ld = nullptr;
  for (const emu::SiteCounters& s : bare.sites)
    if (s.kind == emu::AccessKind::LdMatrix) ld = &s;
  REQUIRE(ld != nullptr);
  CHECK(ld->shared.requests == 2);
  CHECK(ld->shared.wavefronts == 2 * 4 * 8);
  CHECK(ld->shared.conflicts() == 2 * 4 * 7);
  CHECK(bare.mma == 2);
  CHECK(bare.mma_flops == 2 * 4096);
  for (const emu::SiteCounters& s : prof.launches()[1].sites)
    if (s.kind == emu::AccessKind::LdMatrix) {
      CHECK(s.shared.wavefronts == 2 * 4);
      CHECK(s.shared.conflicts() == 0);
    }
  cudaFree(out);
}

TEST_CASE("kernel profiler: cp.async is a 16-byte global read and shared write per lane") {
  float* in = device_alloc<float>(128);
  float* out = device_alloc<float>(32);
  emu::KernelProfiler prof;
  gpu::launch(cp_async_kernel, 1, 32, 512, nullptr, out, in);
  run();
  const emu::KernelCounters& c = prof.launches().at(0);
  CHECK(c.cp_async_bytes == 512);
  CHECK(c.load.requests == 1);
  CHECK(c.load.sectors == 16);
  CHECK(c.load.efficiency() == doctest::Approx(1.0));
  CHECK(c.shared_store.requests == 1);
  CHECK(c.shared_store.wavefronts == 4);
  CHECK(c.shared_load.conflicts() == 3);  // lanes 16 bytes apart reading 4 bytes: banks 0, 4, .. 28 hold 4 words each
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("kernel profiler: a __nv_bfloat162 copied member by member on the host counts as the device's one 4-byte access") {
  __nv_bfloat162* in = device_alloc<__nv_bfloat162>(32);
  __nv_bfloat162* out = device_alloc<__nv_bfloat162>(32);
  emu::KernelProfiler prof;
  gpu::launch(bf16x2_copy_kernel, 1, 32, 0, nullptr, out, in);
  run();
  const emu::KernelCounters& c = prof.launches().at(0);
  CHECK(c.load.requests == 1);
  CHECK(c.load.sectors == 4);
  CHECK(c.load.efficiency() == doctest::Approx(1.0));
  CHECK(c.store.requests == 1);
  CHECK(c.store.sectors == 4);
  for (const emu::SiteCounters& s : c.sites) CHECK(s.width == 4);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("kernel profiler: library GEMMs are counted with their FLOPs and operand bytes") {
  float* a = device_alloc<float>(6 * 4);
  float* b = device_alloc<float>(4 * 5);
  float* c = device_alloc<float>(6 * 5);
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  emu::KernelProfiler prof;
  const float one = 1.f, zero = 0.f;
  REQUIRE(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 6, 5, 4, &one, a, CUDA_R_32F, 6, b, CUDA_R_32F, 4, &zero, c,
                       CUDA_R_32F, 6, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  run();
  REQUIRE(prof.gemms().size() == 1);
  const emu::GemmEvent& g = prof.gemms()[0];
  CHECK(g.m == 6);
  CHECK(g.n == 5);
  CHECK(g.k == 4);
  CHECK(g.a_bytes == 6 * 4 * 4);
  CHECK(g.b_bytes == 4 * 5 * 4);
  CHECK(g.c_read_bytes == 0);
  CHECK(g.d_bytes == 6 * 5 * 4);
  CHECK(prof.launches().empty());  // no kernel: host copies and library calls are not kernel accesses
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
}

TEST_CASE("memory hook: a hooked kernel reading past its buffer is still reported by AddressSanitizer") {
  const tg_test::ChildResult r = tg_test::in_child([] {
    float* in = nullptr;
    float* out = nullptr;
    cudaMalloc(&in, 64 * sizeof(float));
    cudaMalloc(&out, 64 * sizeof(float));
    gpu::launch(overrun_kernel, 1, 64, 0, nullptr, out, in, 64);
    cudaDeviceSynchronize();
    return 0;  // not reached
  });
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code != 0);
  CHECK(has(r.err, "AddressSanitizer"));
  CHECK(has(r.err, "overrun_kernel"));
  CHECK(has(r.err, "thread (63,0,0)"));
}
