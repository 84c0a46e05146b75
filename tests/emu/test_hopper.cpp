// tests/emu/test_hopper.cpp: the faults and races the emulator reports about the Hopper
// instructions of kernels/hopper_ptx.cuh (tests/emu/hopper_emu.cpp, tests/emu/race_checker.cpp):
// a deadlocked mbarrier wait, an mbarrier misused, a warpgroup the block does not fill, a missing
// wgmma.fence, a descriptor past shared memory, a wgmma operand overwritten in flight, a TMA box
// read by a thread that did not wait, a ring's stage released before it is read; and the tensor
// map stand-in's refusals. What the instructions compute, checked on an H100 as under the
// emulator: tests/gpu/test_hopper_ptx.cu.
//
// This file is compiled like kernels/*.cu (the Makefile's EMU_HOOK_FLAGS), so that its kernels
// carry the memory hook for the race checker. A fault is sticky: those cases run in a child.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../../kernels/cuda_common.cuh"
#include "../../kernels/hopper_ptx.cuh"
#include "../gpu/hopper_test_util.cuh"
#include "child_process.h"
#include "emu_internal.h"
#include "race_checker.h"

namespace {

using gpu::hopper::Swizzle;
using tg_test::has;
using tg_test::Tensor2d;

// ---- mbarrier -----------------------------------------------------------------------------------
// A phase that never completes: one of two arrivals.
__global__ void mbarrier_deadlock_kernel(int* out) {
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) gpu::hopper::mbarrier_init(&bar, 2);
  __syncthreads();
  if (threadIdx.x == 0) gpu::hopper::mbarrier_arrive(&bar);
  gpu::hopper::mbarrier_wait_parity(&bar, 0);
  out[threadIdx.x] = 1;
}
// Two arrivals in a phase of count 1 that the first cannot complete (16 bytes are expected).
__global__ void mbarrier_overflow_kernel(int* out) {
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    gpu::hopper::mbarrier_init(&bar, 1);
    gpu::hopper::mbarrier_expect_tx(&bar, 16);
    gpu::hopper::mbarrier_arrive(&bar);  // pending 0, 16 bytes outstanding: the phase stays open
    gpu::hopper::mbarrier_arrive(&bar);  // a second arrival in a phase of count 1
  }
  out[threadIdx.x] = 1;
}
__global__ void mbarrier_uninitialised_kernel(int* out) {
  __shared__ uint64_t bar;
  gpu::hopper::mbarrier_arrive(&bar);
  out[threadIdx.x] = 1;
}

template <typename K>
tg_test::ChildResult run_child(K kernel, int threads, size_t smem) {
  return tg_test::in_child([kernel, threads, smem] {
    int* out = nullptr;
    cudaMalloc(&out, 256 * sizeof(int));
    if (smem > 48 * 1024) cudaFuncSetAttribute((const void*)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    gpu::launch(kernel, 1, threads, smem, nullptr, out);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
  });
}

// desc_advance (kernels/hopper_ptx.cuh) is make_smem_desc of the moved address for every shared
// address a tile can have (16-byte steps below 2^18) and the moves the kernels make (k-steps of 32
// bytes, rows of 128, column blocks of R x 128 bytes), with each swizzle mode and leading offsets
// the kernels use (PTX ISA: Matrix Descriptor Format)
TEST_CASE("hopper: a matrix descriptor advanced by desc_advance is the moved address's own (PTX ISA: Matrix Descriptor Format)") {
  const uint32_t moves[] = {0, 16, 32, 96, 128, 1024, 2048 + 64, 8192 + 32, 16384 + 96, 65536 + 4096 + 96, 131072 + 96};
  size_t checked = 0, wrong = 0;
  for (uint32_t addr = 0; addr < (1u << 18); addr += 16)
    for (uint32_t move : moves) {
      if (addr + move >= (1u << 18)) continue;
      for (uint32_t lbo : {16u, 4096u, 8192u, 32768u})
        for (Swizzle sw : {Swizzle::None, Swizzle::B128, Swizzle::B64, Swizzle::B32}) {
          const uint64_t d = gpu::hopper::make_smem_desc(addr, lbo, 1024, sw);
          wrong += gpu::hopper::desc_advance(d, move) != gpu::hopper::make_smem_desc(addr + move, lbo, 1024, sw);
          ++checked;
        }
    }
  CHECK(checked > 1000000);
  CHECK(wrong == 0);
}

TEST_CASE("hopper: an mbarrier wait that cannot complete is a deadlock; misuse of an mbarrier is a fault (PTX ISA: mbarrier.init, mbarrier.arrive, mbarrier.test_wait/mbarrier.try_wait)") {
  const tg_test::ChildResult dead = run_child(mbarrier_deadlock_kernel, 64, 0);
  INFO("child stderr: " << dead.err);
  CHECK(dead.exit_code == 3);
  CHECK(has(dead.err, "deadlock"));
  CHECK(has(dead.err, "64 threads wait (at mbarrier.try_wait.parity)"));
  const tg_test::ChildResult over = run_child(mbarrier_overflow_kernel, 32, 0);
  INFO("child stderr: " << over.err);
  CHECK(over.exit_code == 3);
  CHECK(has(over.err, "more arrivals in one phase than the mbarrier's count (1)"));
  const tg_test::ChildResult uninit = run_child(mbarrier_uninitialised_kernel, 32, 0);
  INFO("child stderr: " << uninit.err);
  CHECK(uninit.exit_code == 3);
  CHECK(has(uninit.err, "mbarrier.arrive on an mbarrier not initialised in this block"));
}

// MODE 0: a block of 96 threads (its warpgroup incomplete). MODE 1: no wgmma.fence. MODE 2: B's
// descriptor reaches past the 4 KB of dynamic shared memory. MODE 3: a correct wgmma, then thread
// 5 writes into B's tile before the wait_group (a race). MODE 4: that write after the wait_group.
// MODE 5: thread 40 writes B's tile after the __syncthreads, unordered before the wgmma's read.
// MODE 6: no fence.proxy.async after the stores (the async proxy need not see them). MODES 7 and 8
// (160 threads): a warp outside the warpgroup writes into B's tile once thread 0 has arrived on an
// mbarrier, as a ring's producer refills a stage its consumers released: MODE 7 arrives before the
// wait_group that retires the wgmma (a race, whichever thread the emulator runs first), 8 after it.
template <int MODE>
__global__ void wgmma_misuse_kernel(int* out) {
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int t = threadIdx.x;
  for (int i = t; i < 1024; i += blockDim.x) reinterpret_cast<uint32_t*>(s)[i] = 0x3F803F80u;  // bf16 1.0
  if (MODE != 6) gpu::hopper::fence_proxy_async();
  __shared__ uint64_t released;
  if (MODE >= 7 && t == 0) {
    gpu::hopper::mbarrier_init(&released, 1);
    gpu::hopper::fence_mbarrier_init();
  }
  __syncthreads();
  if (MODE >= 7 && t >= 128) {  // the refilling warp
    gpu::hopper::mbarrier_wait_parity(&released, 0);
    if (t == 128) s[2048 + 16] = 0;
    return;
  }
  if (MODE == 5 && t == 40) s[2048] = 0;
  const uint64_t desc_a = gpu::hopper::make_smem_desc(0, 1024, 128, Swizzle::None);
  const uint64_t desc_b = gpu::hopper::make_smem_desc(MODE == 2 ? 3968 : 2048, 128, 256, Swizzle::None);
  float d[4] = {};
  if (MODE != 1) gpu::hopper::wgmma_fence();
  gpu::hopper::wgmma_bf16_ss<8>(d, desc_a, desc_b, false);
  gpu::hopper::wgmma_commit_group();
  if (MODE == 3 && t == 5) s[2048 + 16] = 0;
  if (MODE == 7 && t == 0) gpu::hopper::mbarrier_arrive(&released);
  gpu::hopper::wgmma_wait_group<0>();
  if (MODE == 4 && t == 5) s[2048 + 16] = 0;
  if (MODE == 8 && t == 0) gpu::hopper::mbarrier_arrive(&released);
  out[t] = (int)d[0];
}

tg_test::ChildResult run_checked(void (*kernel)(int*), int threads) {
  return tg_test::in_child([kernel, threads] {
    emu::RaceChecker checker;
    int* out = nullptr;
    cudaMalloc(&out, 256 * sizeof(int));
    gpu::launch(kernel, 1, threads, 4096, nullptr, out);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
  });
}

}  // namespace

TEST_CASE("hopper: wgmma misuse is a fault: an incomplete warpgroup, no wgmma.fence, a descriptor past shared memory (PTX ISA: wgmma, wgmma.fence, Matrix Descriptor Format)") {
  const tg_test::ChildResult partial = run_child(wgmma_misuse_kernel<0>, 96, 4096);
  INFO("child stderr: " << partial.err);
  CHECK(partial.exit_code == 3);
  CHECK(has(partial.err, "wgmma.fence in warpgroup 0, which the block's 96 threads do not fill"));
  const tg_test::ChildResult unfenced = run_child(wgmma_misuse_kernel<1>, 128, 4096);
  INFO("child stderr: " << unfenced.err);
  CHECK(unfenced.exit_code == 3);
  CHECK(has(unfenced.err, "wgmma.mma_async with no wgmma.fence"));
  const tg_test::ChildResult past = run_child(wgmma_misuse_kernel<2>, 128, 4096);
  INFO("child stderr: " << past.err);
  CHECK(past.exit_code == 3);
  CHECK(has(past.err, "past the 4096 bytes of dynamic shared memory"));
}

TEST_CASE("racecheck: a wgmma operand overwritten before its wait_group, or released to another warp before it, written unordered before its issue, or stored with no fence.proxy.async, is a hazard (PTX ISA: wgmma.mma_async, wgmma.wait_group; Memory Consistency Model: proxies)") {
  // each mode of the kernel in a child: the hazard it must end with (exit 3), or none (it runs clean)
  auto expect = [](void (*kernel)(int*), int threads, const char* hazard) {
    const tg_test::ChildResult r = run_checked(kernel, threads);
    INFO("child stderr: " << r.err);
    CHECK(r.exit_code == (hazard ? 3 : 0));
    if (hazard) CHECK(has(r.err, hazard));
    if (hazard) CHECK(has(r.err, "tests/emu/test_hopper.cpp"));
  };
  expect(wgmma_misuse_kernel<3>, 128, "write to a wgmma operand before the wgmma.wait_group that retires it");
  expect(wgmma_misuse_kernel<5>, 128, "read-after-write hazard");
  expect(wgmma_misuse_kernel<6>, 128,
         "wgmma read of an operand its writer stored through the generic proxy and did not follow with fence.proxy.async");
  expect(wgmma_misuse_kernel<4>, 128, nullptr);
  // a stage released before the wait_group: the emulator ran the warpgroup's threads to their
  // wait_group first, so the write came after the retirement, unordered after it
  expect(wgmma_misuse_kernel<7>, 160, "write to a wgmma operand not ordered after the wgmma.wait_group that retired it");
  expect(wgmma_misuse_kernel<8>, 160, nullptr);
}

// ---- TMA ---------------------------------------------------------------------------------------
namespace {

// ---- setmaxnreg ----------------------------------------------------------------------------------
// A block of 384 threads (entry count 168: 65536 / 384, down to a multiple of 8). Warpgroup 2
// gives back DEC registers, warpgroups 0 and 1 ask for INC; each thread then writes its
// warpgroup's index. MODE 0: as written (the .inc waits for the .dec, which runs after it in the
// emulator's warp order). MODE 1: thread 130 gives a different count. MODE 2: the .dec raises.
template <int DEC, int INC, int MODE = 0>
__global__ void setmaxnreg_kernel(int* out) {
  const int wg = threadIdx.x / 128;
  if (wg == 2) {
    if (MODE == 2) gpu::hopper::setmaxnreg_dec<176>();
    else gpu::hopper::setmaxnreg_dec<DEC>();
  } else if (MODE == 1 && threadIdx.x == 130) {
    gpu::hopper::setmaxnreg_inc<INC - 8>();
  } else {
    gpu::hopper::setmaxnreg_inc<INC>();
  }
  out[threadIdx.x] = wg;
}

tg_test::ChildResult run_regs_child(void (*kernel)(int*), bool check_out) {
  return tg_test::in_child([kernel, check_out] {
    int* out = nullptr;
    cudaMalloc(&out, 384 * sizeof(int));
    gpu::launch(kernel, 1, 384, 0, nullptr, out);
    if (cudaDeviceSynchronize() != cudaSuccess) return 3;
    if (!check_out) return 0;
    std::vector<int> h(384);
    cudaMemcpy(h.data(), out, h.size() * sizeof(int), cudaMemcpyDeviceToHost);
    for (int t = 0; t < 384; ++t)
      if (h[t] != t / 128) return 4;
    return 0;
  });
}

}  // namespace

TEST_CASE("hopper: setmaxnreg moves registers through the CTA's pool; asking for more than the block has deadlocks; misuse is a fault (PTX ISA: setmaxnreg)") {
  CHECK(emu::setmaxnreg_entry_count(384) == 168);
  CHECK(emu::setmaxnreg_entry_count(288) == 168);  // 9 warps: three warpgroups' registers
  CHECK(emu::setmaxnreg_entry_count(256) == 256);
  CHECK(emu::setmaxnreg_entry_count(128) == 256);
  // FlashAttention-3's split: 24 + 2 x 240 = 504 = 3 x 168, the whole pool
  const tg_test::ChildResult fits = run_regs_child(setmaxnreg_kernel<24, 240>, true);
  INFO("child stderr: " << fits.err);
  CHECK(fits.exit_code == 0);
  // 24 + 2 x 248 > 3 x 168: the second .inc waits for registers no warpgroup will give back
  const tg_test::ChildResult over = run_regs_child(setmaxnreg_kernel<24, 248>, false);
  INFO("child stderr: " << over.err);
  CHECK(over.exit_code == 3);
  CHECK(has(over.err, "deadlock"));
  CHECK(has(over.err, "setmaxnreg.inc (waiting for the CTA's register pool)"));
  const tg_test::ChildResult mixed = run_regs_child(setmaxnreg_kernel<24, 240, 1>, false);
  INFO("child stderr: " << mixed.err);
  CHECK(mixed.exit_code == 3);
  CHECK(has(mixed.err, "setmaxnreg.inc: threads 0 and 2 of warpgroup 1 gave different counts"));
  const tg_test::ChildResult up = run_regs_child(setmaxnreg_kernel<24, 240, 2>, false);
  INFO("child stderr: " << up.err);
  CHECK(up.exit_code == 3);
  CHECK(has(up.err, "setmaxnreg.dec 176 in warpgroup 2, which holds 168 registers a thread (.dec may only lower it)"));
}

TEST_CASE("hopper: cuTensorMapEncodeTiled's stand-in refuses what the driver refuses (CUDA Driver API: cuTensorMapEncodeTiled)") {
  Tensor2d a{100, 37, 200};  // a row pitch that is not a multiple of 16
  a.upload();
  CUtensorMap m;
  const cuuint64_t dims[2] = {100, 37}, strides[1] = {200};
  const cuuint32_t box[2] = {64, 16}, ones[2] = {1, 1};
  CHECK(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.dev, dims, strides, box, ones,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);
  const cuuint64_t strides_ok[1] = {208};
  const cuuint32_t wide_box[2] = {128, 16};  // 256 bytes: wider than the 128B swizzle
  CHECK(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.dev, dims, strides_ok, wide_box, ones,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);
  cudaFree(a.dev);
}

TEST_CASE("racecheck: a TMA destination read before a wait on its mbarrier is a hazard (PTX ISA: cp.async.bulk.tensor, mbarrier.try_wait)") {
  const tg_test::ChildResult early = tg_test::in_child([] {
    emu::RaceChecker checker;
    Tensor2d a{100, 37, 208};
    a.upload();
    const CUtensorMap wide = a.map(64, 16, CU_TENSOR_MAP_SWIZZLE_128B), narrow = a.map(16, 5, CU_TENSOR_MAP_SWIZZLE_NONE);
    uint16_t* d_out = nullptr;
    cudaMalloc(&d_out, kTmaBytes);
    gpu::launch(tma_kernel<1>, 1, 128, kTmaSmem, nullptr, wide, narrow, d_out);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
  });
  INFO("child stderr: " << early.err);
  CHECK(early.exit_code == 3);
  CHECK(has(early.err, "access to a TMA destination by a thread that has not seen its mbarrier phase complete"));
}

namespace {

// One box whose innermost coordinate, c0 bf16 elements, is not on 16 bytes unless c0 % 8 == 0.
__global__ void tma_at_kernel(const __grid_constant__ CUtensorMap map, int c0, uint16_t* out) {
  __shared__ uint64_t bar;
  unsigned char* s = gpu::hopper::align_1024(gpu::dynamic_smem<unsigned char>());
  if (threadIdx.x == 0) {
    gpu::hopper::mbarrier_init(&bar, 1);
    gpu::hopper::mbarrier_arrive_expect_tx(&bar, 16 * 4 * 2);
    gpu::hopper::tma_load_2d(s, &map, c0, 0, &bar);
  }
  __syncthreads();
  gpu::hopper::mbarrier_wait_parity(&bar, 0);
  out[threadIdx.x] = reinterpret_cast<const uint16_t*>(s)[threadIdx.x];
}

}  // namespace

TEST_CASE("hopper: a TMA box whose innermost coordinate is not on 16 bytes is a fault, as an H100's illegal instruction (measured: columns 60 and -3 of bf16 stop there, -8, 64 and 96 load)") {
  auto run = [](int c0) {
    return tg_test::in_child([c0] {
      Tensor2d a{100, 37, 208};
      a.upload();
      const CUtensorMap map = a.map(16, 4, CU_TENSOR_MAP_SWIZZLE_NONE);
      uint16_t* d_out = nullptr;
      cudaMalloc(&d_out, 64 * sizeof(uint16_t));
      gpu::launch(tma_at_kernel, 1, 64, 2048, nullptr, map, c0, d_out);
      return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
    });
  };
  for (const int c0 : {-8, 64, 96}) {
    const tg_test::ChildResult ok = run(c0);
    INFO("column " << c0 << ": child stderr: " << ok.err);
    CHECK(ok.exit_code == 0);
  }
  for (const int c0 : {60, -3}) {
    const tg_test::ChildResult bad = run(c0);
    INFO("column " << c0 << ": child stderr: " << bad.err);
    CHECK(bad.exit_code == 3);
    CHECK(has(bad.err, "the box's innermost coordinate " + std::to_string(c0) + " is not on 16 bytes"));
  }
}

namespace {

// A producer / consumer ring (the Hopper attention kernels' pattern): thread 0 of warp 1 streams
// 6 boxes of 8 x 8 through 2 stages with TMA, each stage a "full" mbarrier (its bytes) and an
// "empty" one (an arrival by each of warp 0's lanes once it has read the stage); warp 0 waits on
// full, sums the stage and releases it. Only mbarriers order the refills after the reads. MODE 1
// releases a stage before reading it (a race: the producer may overwrite what is read). MODE 2
// has lane 0 alone arrive, after a warp collective: compute-sanitizer's racecheck on an H200 named
// that pattern a hazard (the collective orders the lanes among themselves, not for the producer).
template <int MODE>
__global__ void ring_kernel(const __grid_constant__ CUtensorMap map, float* out) {
  __shared__ uint64_t full[2], empty[2];
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int t = threadIdx.x;
  if (t == 0)
    for (int st = 0; st < 2; ++st)
      gpu::hopper::mbarrier_init(&full[st], 1), gpu::hopper::mbarrier_init(&empty[st], MODE == 0 ? 32 : 1);
  __syncthreads();
  if (t == 32) {  // the producer
    for (int i = 0; i < 6; ++i) {
      const int st = i % 2, use = i / 2;
      if (use > 0) gpu::hopper::mbarrier_wait_parity(&empty[st], (use - 1) & 1);
      gpu::hopper::mbarrier_arrive_expect_tx(&full[st], 8 * 8 * 2);
      gpu::hopper::tma_load_2d(s + 1024 * st, &map, 0, 8 * i, &full[st]);
    }
  } else if (t < 32) {  // the consumer warp
    float sum = 0;
    for (int i = 0; i < 6; ++i) {
      const int st = i % 2;
      gpu::hopper::mbarrier_wait_parity(&full[st], (i / 2) & 1);
      if (MODE == 1 && t == 0) gpu::hopper::mbarrier_arrive(&empty[st]);
      uint16_t v;
      std::memcpy(&v, s + 1024 * st + 2 * t, 2);
      sum += (float)v;
      if (MODE == 0) gpu::hopper::mbarrier_arrive(&empty[st]);  // each lane after its own read
      if (MODE == 2) {
        sum += __shfl_sync(0xffffffffu, 0.f, 0);  // a warp collective, then lane 0 alone
        if (t == 0) gpu::hopper::mbarrier_arrive(&empty[st]);
      }
    }
    out[t] = sum;
  }
}

}  // namespace

TEST_CASE("racecheck: mbarriers order a ring's refills after its reads, and a stage released before it is read, or by one lane for the warp, is a hazard (PTX ISA: mbarrier.arrive, mbarrier.try_wait)") {
  auto run = [](auto kernel) {
    return tg_test::in_child([kernel] {
      emu::RaceChecker checker;
      Tensor2d a{8, 48, 16};
      a.upload();
      const CUtensorMap map = a.map(8, 8, CU_TENSOR_MAP_SWIZZLE_NONE);
      float* d_out = nullptr;
      cudaMalloc(&d_out, 32 * sizeof(float));
      gpu::launch(kernel, 1, 64, 2048, nullptr, map, d_out);
      if (cudaDeviceSynchronize() != cudaSuccess) return 3;
      float h[32];
      cudaMemcpy(h, d_out, sizeof h, cudaMemcpyDeviceToHost);
      // lane l sums row 0, column l of the 6 boxes when l < 8 (row 0 of box i is tensor row 8 i)
      for (int l = 0; l < 8; ++l) {
        float want = 0;
        for (int i = 0; i < 6; ++i) want += (float)a.at(l, 8 * i);
        if (h[l] != want) return 4;
      }
      return 0;
    });
  };
  const tg_test::ChildResult ok = run(ring_kernel<0>);
  INFO("child stderr: " << ok.err);
  CHECK(ok.exit_code == 0);
  const tg_test::ChildResult early = run(ring_kernel<1>);
  INFO("child stderr: " << early.err);
  CHECK(early.exit_code == 3);
  CHECK(has(early.err, "write-after-read hazard"));
  const tg_test::ChildResult one_lane = run(ring_kernel<2>);
  INFO("child stderr: " << one_lane.err);
  CHECK(one_lane.exit_code == 3);
  CHECK(has(one_lane.err, "write-after-read hazard"));
}
