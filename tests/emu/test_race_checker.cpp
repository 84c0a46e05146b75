// tests/emu/test_race_checker.cpp: the racecheck and initcheck of tests/emu/race_checker.h fire on
// kernels that race on purpose (read-after-write and write-after-read between warps, lanes of one
// warp with no collective between them, a cp.async destination read in flight, a read of shared
// memory nothing wrote, a kernel reading device memory the previous kernel did not fill, two blocks
// of a launch on one word of global memory, blocks chained by a flag used amiss) and stay
// quiet on the orders the hardware promises (a __syncthreads, a warp collective, neighbouring
// bytes of different threads); then every kernel of a training step (both attention paths, bf16
// and fp32) runs clean under it, device memory included.
//
// This file is compiled like kernels/*.cu (the Makefile's EMU_HOOK_FLAGS), so that its kernels
// carry the memory hook. A hazard is a device fault that stays sticky: those run in a child.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "../../kernels/cuda_common.cuh"
#include "../../kernels/flash_attn_common.cuh"
#include "../../kernels/hopper_ptx.cuh"
#include "../gpu/counters_step.cuh"
#include "child_process.h"
#include "emu_internal.h"
#include "race_checker.h"

namespace {

using tg_test::has;

// MODE 0: thread 0 writes s[0], thread 40 reads it (another warp), no barrier: read after write.
// MODE 1: thread 5 reads s[1], thread 40 writes it (warp 0 runs first): write after read.
// MODE 2: lane 0 writes s[2], lane 1 reads it, no collective between: read after write.
// MODE 3: as 2 with a __shfl_sync between: ordered. MODE 4: as 0 with a __syncthreads: ordered.
// MODE 5: every thread writes its own byte of one word, then reads it back: no conflict.
template <int MODE>
__global__ void race_kernel(float* out) {
  __shared__ float s[4];
  __shared__ unsigned char bytes[64];
  const int t = threadIdx.x;
  float v = 0.f;
  if (t < 4) s[t] = 1.f;
  __syncthreads();
  if (MODE == 0 || MODE == 4) {
    if (t == 0) s[0] = 2.f;
    if (MODE == 4) __syncthreads();
    if (t == 40) v = s[0];
  } else if (MODE == 1) {
    if (t == 5) v = s[1];
    if (t == 40) s[1] = 3.f;
  } else if (MODE == 2 || MODE == 3) {
    if (t == 0) s[2] = 4.f;
    if (MODE == 3) v += __shfl_sync(0xffffffffu, 1.f, 0);
    if (t == 1) v += s[2];
  } else {
    bytes[t] = (unsigned char)t;
    v = bytes[t];
  }
  out[t] = v;
}

// reads its own cp.async destination before the wait that lands it
__global__ void cp_async_early_kernel(float* out, const float* in) {
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int l = threadIdx.x;
  gpu::flash::cp_async_16(s + 16 * l, in + 4 * l, true);
  gpu::flash::cp_async_commit();
  const float early = reinterpret_cast<const float*>(s)[4 * l];
  gpu::flash::cp_async_wait<0>();
  out[l] = early;
}

// reads a shared word that no thread wrote in this block
__global__ void uninitialised_kernel(float* out) {
  __shared__ float s[32];
  if (threadIdx.x < 16) s[threadIdx.x] = 1.f;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];  // threads 16..31 read what nothing wrote
}

// fills out[0 .. n) (n < the buffer)
__global__ void fill_kernel(float* out, int n) {
  if ((int)threadIdx.x < n) out[threadIdx.x] = 1.f;
}
// out[i] = 2 in[i] over the whole block
__global__ void double_kernel(float* out, const float* in) { out[threadIdx.x] = 2.f * in[threadIdx.x]; }

// Two blocks of 32 threads on out[0 .. 64). MODE 0: both write out[0] (write after write).
// MODE 1: block 0 writes out[1], block 1 reads it (read after write). MODE 2: block 0 reads out[2],
// block 1 writes it (write after read). MODE 3: each block reads and writes its own half, in place.
template <int MODE>
__global__ void global_race_kernel(float* out) {
  const int b = blockIdx.x, t = threadIdx.x;
  if (MODE == 3) {
    out[32 * b + t] = 2.f * out[32 * b + t] + 1.f;
  } else if (t == 0) {
    if (MODE == 0) out[0] = (float)b;
    if (MODE == 1) {
      if (b == 0) out[1] = 1.f;
      else out[40] = out[1];
    }
    if (MODE == 2) {
      if (b == 0) out[41] = out[2];
      else out[2] = 2.f;
    }
  }
}

// Blocks in a chain through a flag (kernels/hopper_ptx.cuh: flag_wait, flag_release), as the fused
// Hopper backward passes its dQ sums: block b waits until *flag = b, adds 1 to each out[t] that
// block b - 1 left, and stores b + 1. MODE 0: as flag_release's comment says (clean). MODE 1: no
// wait. MODE 2: no __syncthreads after the wait (only thread 0 acquired). MODE 3: no __syncthreads
// before the release (the other threads' writes not released). MODE 4: a wait for a value no
// earlier block stores.
template <int MODE>
__global__ void flag_chain_kernel(float* out) {
  const int b = blockIdx.x, t = threadIdx.x;
  int* flag = reinterpret_cast<int*>(out + 63);
  if (MODE != 1 && b > 0 && t == 0) gpu::hopper::flag_wait(flag, MODE == 4 ? b + 1 : b);
  if (MODE != 2) __syncthreads();
  out[t] = (b == 0 ? 0.f : out[t]) + 1.f;
  if (MODE != 3) __syncthreads();
  if (t == 0) gpu::hopper::flag_release(flag, b + 1);
}

// The fused backward's form of the chain (FusedDq): each block does two tiles, out[0..31] under
// flag a and out[32..47] under flag b; thread 0 waits on a, reads b ahead (flag_peek), and after
// the first tile releases a and acquires b in one fence (flag_handover). MODE 0: so (clean).
// MODE 1: the handover acquires nothing (the second tile's reads unordered).
template <int MODE>
__global__ void flag_handover_kernel(float* out) {
  const int b = blockIdx.x, t = threadIdx.x;
  int* const fa = reinterpret_cast<int*>(out + 63);
  int* const fb = reinterpret_cast<int*>(out + 62);
  int seen = 0;
  if (b > 0 && t == 0) {
    gpu::hopper::flag_wait(fa, b);
    seen = gpu::hopper::flag_peek(fb);
  }
  __syncthreads();
  out[t] = (b == 0 ? 0.f : out[t]) + 1.f;
  __syncthreads();
  if (t == 0) {
    gpu::hopper::flag_handover(fa, b + 1, b > 0 && MODE == 0 ? fb : nullptr);
    if (b > 0 && seen != b) gpu::hopper::flag_wait(fb, b);
  }
  __syncthreads();
  if (t < 16) out[32 + t] = (b == 0 ? 0.f : out[32 + t]) + 1.f;
  __syncthreads();
  if (t == 0) gpu::hopper::flag_release(fb, b + 1);
}

// schedule: the emulator's order of warps and lanes (emu::set_schedule): a hazard is found in
// both, whichever of its two accesses runs first
template <typename K>
tg_test::ChildResult run_in_child(K kernel, int threads, size_t smem, int schedule = 0) {
  return tg_test::in_child([kernel, threads, smem, schedule] {
    emu::set_schedule(schedule);
    emu::RaceChecker checker;
    float* out = nullptr;
    float* in = nullptr;
    cudaMalloc(&out, 64 * sizeof(float));
    cudaMalloc(&in, 128 * sizeof(float));
    cudaMemset(in, 0, 128 * sizeof(float));
    if constexpr (std::is_invocable_v<K, float*>) gpu::launch(kernel, 1, threads, smem, nullptr, out);
    else gpu::launch(kernel, 1, threads, smem, nullptr, out, (const float*)in);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
  });
}

}  // namespace

TEST_CASE("racecheck: unordered shared accesses of two warps are hazards in either order, named with both threads") {
  std::string kinds;
  for (int schedule : {0, 1}) {
    CAPTURE(schedule);
    const tg_test::ChildResult w = run_in_child(race_kernel<0>, 64, 0, schedule);
    INFO("child stderr: " << w.err);
    CHECK(w.exit_code == 3);
    CHECK(has(w.err, "race_kernel<0>"));
    CHECK(has(w.err, "(40,0,0) [warp 1 lane 8]"));
    CHECK(has(w.err, "(0,0,0) [warp 0 lane 0]"));
    CHECK(has(w.err, "test_race_checker.cpp:"));
    kinds += w.err;
    const tg_test::ChildResult r = run_in_child(race_kernel<1>, 64, 0, schedule);
    INFO("child stderr: " << r.err);
    CHECK(r.exit_code == 3);
    CHECK(has(r.err, "(5,0,0) [warp 0 lane 5]"));
    CHECK(has(r.err, "(40,0,0) [warp 1 lane 8]"));
    kinds += r.err;
  }
  // one order of each pair is a read after the write, the other a write after the read
  CHECK(has(kinds, "racecheck: read-after-write hazard"));
  CHECK(has(kinds, "racecheck: write-after-read hazard"));
}

TEST_CASE("racecheck: lanes of one warp are ordered by a collective only; a barrier orders warps") {
  for (int schedule : {0, 1}) {
    const tg_test::ChildResult lanes = run_in_child(race_kernel<2>, 64, 0, schedule);
    INFO("child stderr: " << lanes.err);
    CHECK(lanes.exit_code == 3);
    CHECK(has(lanes.err, "hazard"));
    CHECK(has(lanes.err, "(1,0,0) [warp 0 lane 1]"));
    CHECK(has(lanes.err, "(0,0,0) [warp 0 lane 0]"));
  }
  for (const tg_test::ChildResult& ok :
       {run_in_child(race_kernel<3>, 64, 0), run_in_child(race_kernel<4>, 64, 0), run_in_child(race_kernel<5>, 64, 0)}) {
    INFO("child stderr: " << ok.err);
    CHECK(ok.exit_code == 0);
  }
}

TEST_CASE("racecheck: two blocks of a launch on one byte of global memory, one writing, are a hazard") {
  auto run = [](auto kernel) {
    return tg_test::in_child([kernel] {
      emu::RaceChecker checker;
      float* out = nullptr;
      cudaMalloc(&out, 64 * sizeof(float));
      cudaMemset(out, 0, 64 * sizeof(float));
      gpu::launch(kernel, 2, 32, 0, nullptr, out);
      return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
    });
  };
  const struct {
    tg_test::ChildResult r;
    const char* what;
    const char* where;
  } cases[] = {{run(global_race_kernel<0>), "write-after-write hazard", "byte 0 of the 256-byte allocation"},
               {run(global_race_kernel<1>), "read-after-write hazard", "byte 4 of the 256-byte allocation"},
               {run(global_race_kernel<2>), "write-after-read hazard", "byte 8 of the 256-byte allocation"}};
  for (const auto& c : cases) {
    INFO("child stderr: " << c.r.err);
    CHECK(c.r.exit_code == 3);
    CHECK(has(c.r.err, std::string("racecheck: ") + c.what + " in global memory (" + c.where));
    CHECK(has(c.r.err, "block (1,0,0) thread (0,0,0) at tests/emu/test_race_checker.cpp:"));
    CHECK(has(c.r.err, "after block (0,0,0) of the same launch"));
  }
  const tg_test::ChildResult ok = run(global_race_kernel<3>);
  INFO("child stderr: " << ok.err);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("racecheck: a flag orders blocks as a release and an acquire (also in one fence); without it, or a __syncthreads beside it, a hazard") {
  auto run = [](auto kernel, float* result) {
    return tg_test::in_child([kernel, result] {
      emu::RaceChecker checker;
      float* out = nullptr;
      cudaMalloc(&out, 64 * sizeof(float));
      cudaMemset(out, 0, 64 * sizeof(float));
      gpu::launch(kernel, 4, 32, 0, nullptr, out);
      if (cudaDeviceSynchronize() != cudaSuccess) return 3;
      cudaMemcpy(result, out, sizeof(float), cudaMemcpyDeviceToHost);
      return *result == 4.f ? 0 : 4;  // each of the four blocks added its 1
    });
  };
  float v = 0.f;
  const tg_test::ChildResult ok = run(flag_chain_kernel<0>, &v);
  INFO("child stderr: " << ok.err);
  CHECK(ok.exit_code == 0);
  const struct {
    tg_test::ChildResult r;
    bool thread0;  // whether thread 0's read may be the one named (it acquired, in MODE 2)
  } races[] = {{run(flag_chain_kernel<1>, &v), true}, {run(flag_chain_kernel<2>, &v), false},
               {run(flag_chain_kernel<3>, &v), true}};
  for (const auto& c : races) {
    INFO("child stderr: " << c.r.err);
    CHECK(c.r.exit_code == 3);
    CHECK(has(c.r.err, "racecheck: read-after-write hazard in global memory"));
    CHECK(has(c.r.err, "block (1,0,0) thread ("));
    CHECK(has(c.r.err, "after block (0,0,0) of the same launch (no flag orders the two blocks' accesses)"));
    if (!c.thread0) CHECK(!has(c.r.err, "block (1,0,0) thread (0,0,0)"));
  }
  // a wait no earlier block can end: on a GPU a hang, here a fault naming both values
  const tg_test::ChildResult never = run(flag_chain_kernel<4>, &v);
  INFO("child stderr: " << never.err);
  CHECK(never.exit_code == 3);
  CHECK(has(never.err, "block (1,0,0) waits for the flag at byte 252 of the 256-byte allocation"));
  CHECK(has(never.err, "to hold 2; it holds 1"));
  // a release and an acquire in one fence, the acquire of a flag read before it
  const tg_test::ChildResult handover = run(flag_handover_kernel<0>, &v);
  INFO("child stderr: " << handover.err);
  CHECK(handover.exit_code == 0);
  const tg_test::ChildResult unacquired = run(flag_handover_kernel<1>, &v);
  INFO("child stderr: " << unacquired.err);
  CHECK(unacquired.exit_code == 3);
  CHECK(has(unacquired.err, "racecheck: read-after-write hazard in global memory"));
  CHECK(has(unacquired.err, "after block (0,0,0) of the same launch (no flag orders the two blocks' accesses)"));
}

TEST_CASE("racecheck: a cp.async destination read before its wait_group is a hazard") {
  const tg_test::ChildResult r = run_in_child(cp_async_early_kernel, 32, 512);
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code == 3);
  CHECK(has(r.err, "access to a cp.async destination before its wait_group"));
}

TEST_CASE("initcheck: a read of shared memory nothing wrote is reported") {
  const tg_test::ChildResult r = run_in_child(uninitialised_kernel, 32, 0);
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code == 3);
  CHECK(has(r.err, "initcheck: read of shared memory nothing wrote"));
  CHECK(has(r.err, "uninitialised_kernel"));
  CHECK(has(r.err, "test_race_checker.cpp:"));
}

TEST_CASE("initcheck: a kernel reading device memory that nothing wrote is reported, naming the allocation") {
  auto run = [](int filled) {
    return tg_test::in_child([filled] {
      emu::set_schedule(0);  // lanes ascending: thread 48 is the first to read what was not filled
      emu::RaceChecker checker;
      float* a = nullptr;
      float* b = nullptr;
      cudaMalloc(&a, 64 * sizeof(float));
      cudaMalloc(&b, 64 * sizeof(float));
      gpu::launch(fill_kernel, 1, 64, 0, nullptr, a, filled);  // the previous kernel fills `filled` of 64
      gpu::launch(double_kernel, 1, 64, 0, nullptr, b, (const float*)a);
      return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
    });
  };
  const tg_test::ChildResult r = run(48);
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code == 3);
  CHECK(has(r.err, "initcheck: read of device memory nothing wrote (byte 192 of the 256-byte allocation"));
  CHECK(has(r.err, "double_kernel"));
  const tg_test::ChildResult ok = run(64);
  INFO("child stderr: " << ok.err);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("racecheck: every kernel of a training step runs clean (flash and naive, bf16 and fp32)") {
  emu::RaceChecker checker;
  // the naive path at T = 128 (its softmax rows span several of a warp's 32 lanes); the program's
  // own runs under racecheck (tests/emu/test_emu_cli.cpp) run both paths at T = 32
  tg_test::CountersStep<gpu::bf16> bf16_step(gpu::AttentionPath::Naive);
  CHECK(std::isfinite(bf16_step.run()));
  tg_test::CountersStep<float> fp32_step(gpu::AttentionPath::Naive);
  CHECK(std::isfinite(fp32_step.run()));
  REQUIRE(cudaGetLastError() == cudaSuccess);
  // the flash path on sequences longer than a key tile: 3 (bf16, T = 192) and 4 (fp32, T = 100,
  // the last one partial) key tiles, so they refill a stage that other warps read the tile before
  // (at T = 32 the program's runs cover a partial bf16 tile)
  tg_test::CountersStep<gpu::bf16> bf16_long(gpu::AttentionPath::Flash, 192);
  CHECK(std::isfinite(bf16_long.run()));
  tg_test::CountersStep<float> fp32_long(gpu::AttentionPath::Flash, 100);
  CHECK(std::isfinite(fp32_long.run()));
  REQUIRE(cudaGetLastError() == cudaSuccess);
}
