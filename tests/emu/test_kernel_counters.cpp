// tests/emu/test_kernel_counters.cpp: the step's kernels held to their counters (the kernel
// profiler, tests/emu/kernel_profiler.h): one training step (forward, backward, AdamW) of the
// shakespeare-char width (C = 384, NH = 6, HS = 64, dropout 0.2, bf16) at a short T, on both
// attention paths, emulated; every kernel's global sector efficiency, bytes moved against its
// compulsory bytes, and shared-memory bank conflicts against the values the kernels reach today
// (a kernel made worse fails here: an uncoalesced index, a padding column removed). Counts, not
// times: the same on every run. The registers and spills of the same kernels are held in
// tests/emu/test_occupancy.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../gpu/counters_step.cuh"
#include "../../kernels/flash_attn.cuh"
#include "../../kernels/philox.h"
#include "../gpu/gpu_util.cuh"
#include "emu_internal.h"
#include "kernel_profiler.h"

namespace {

// What a kernel must reach: its global sector efficiency at least `efficiency`, its bytes moved
// at most `moved_over_compulsory` times its compulsory bytes, at most `conflicts` shared bank
// conflicts per shared request.
struct Target {
  const char* kernel;  // a part of the demangled name
  double efficiency;
  double moved_over_compulsory;
  double conflicts;
};

// One step's kernels (tests/gpu/counters_step.cuh), profiled; the GEMMs do their arithmetic.
std::vector<emu::KernelCounters> profile_step(gpu::AttentionPath path, std::string* report) {
  tg_test::CountersStep<> step(path);
  emu::KernelProfiler prof;
  CHECK(std::isfinite(step.run()));
  *report = prof.report();
  return prof.per_kernel();
}

void check_targets(const std::vector<emu::KernelCounters>& kernels, const std::string& report,
                   const std::vector<Target>& targets) {
  INFO("the step's counters:\n" << report);
  for (const Target& t : targets) {
    bool seen = false;
    for (const emu::KernelCounters& k : kernels) {
      if (k.kernel.find(t.kernel) == std::string::npos) continue;
      seen = true;
      CAPTURE(k.kernel);
      emu::GlobalCounters all = k.load;
      all.add(k.store);
      // the counts Nsight Compute names l1tex__t_requests / _sectors_pipe_lsu_mem_global_op_ld|st and
      // l1tex__data_pipe_lsu_wavefronts / _bank_conflicts_pipe_lsu_mem_shared_op_ld|st (.ci/gpu_check.sh
      // counters prints them beside its measurement of the same step on a GPU)
      if (std::getenv("TG_PRINT_COUNTERS"))
        std::printf("emulated %s | launches %llu | global ld %llu req %llu sectors | global st %llu req %llu sectors | "
                    "shared ld %llu wavefronts %llu conflicts | shared st %llu wavefronts %llu conflicts | "
                    "efficiency %.4f | moved/compulsory %.4f\n",
                    t.kernel, (unsigned long long)k.launches, (unsigned long long)k.load.requests,
                    (unsigned long long)k.load.sectors, (unsigned long long)k.store.requests,
                    (unsigned long long)k.store.sectors, (unsigned long long)k.shared_load.wavefronts,
                    (unsigned long long)k.shared_load.conflicts(), (unsigned long long)k.shared_store.wavefronts,
                    (unsigned long long)k.shared_store.conflicts(), all.efficiency(),
                    (double)k.moved_bytes() / (double)k.compulsory_bytes());
      CHECK(all.efficiency() >= t.efficiency);
      CHECK((double)k.moved_bytes() <= t.moved_over_compulsory * (double)k.compulsory_bytes());
      const uint64_t shared = k.shared_load.requests + k.shared_store.requests;
      const uint64_t conflicts = k.shared_load.conflicts() + k.shared_store.conflicts();
      CHECK((double)conflicts <= t.conflicts * (double)shared);
    }
    CHECK_MESSAGE(seen, "no launch of " << t.kernel);
  }
}

}  // namespace

TEST_CASE("kernel counters: a flash step's kernels coalesce and keep their shared tiles free of conflicts") {
  const tg_test::FlashKernels mma(false);  // the mma.sync kernels (the Hopper ones: below)
  std::string report;
  const std::vector<emu::KernelCounters> k = profile_step(gpu::AttentionPath::Flash, &report);
  // the bar for a kernel with a real share of the step's bytes: 90% sector efficiency,
  // moved <= 1.2x compulsory; the flash kernels are held to no bank conflicts (their global
  // traffic: the mma fragments' row pieces, kernels/flash_attn_fwd.cu's header) and to what they
  // reach; the small kernels below 1% of the step's bytes to what they reach (comments)
  check_targets(k, report,
                {{"encoder_forward_kernel", 0.95, 1.31, 0},  // a token id per row, wte/wpe rows of 768 bytes
                 {"dropout_kernel<__nv_bfloat16, true", 0.99, 1.01, 0},
                 {"dropout_kernel<__nv_bfloat16, false", 0.99, 1.01, 0},
                 {"layernorm_forward_kernel", 0.96, 1.10, 0},
                 {"flash_fwd_bf16_kernel", 0.80, 1.25, 0},
                 {"residual_forward_kernel", 0.99, 1.01, 0},
                 {"gelu_forward_kernel", 0.99, 1.01, 0},
                 {"gelu_backward_kernel", 0.99, 1.01, 0},
                 {"cross_entropy_kernel", 0.52, 2.83, 0},  // rows of V = 65 bf16: a row starts mid-sector
                 {"loss_mean_kernel", 0.94, 1.01, 0},
                 {"layernorm_backward_kernel", 0.98, 1.05, 0},
                 {"layernorm_column_sum_kernel", 0.99, 1.01, 0},
                 {"flash_bwd_dot_do_o_kernel", 0.90, 1.11, 0},
                 {"flash_bwd_dkdv_bf16_kernel", 0.69, 1.63, 0},
                 {"flash_bwd_dq_bf16_kernel", 0.77, 1.50, 0},
                 {"encoder_backward_wpe_kernel", 0.99, 1.01, 0},
                 {"encoder_backward_chunks_kernel", 0.99, 1.06, 0},
                 {"encoder_backward_spans_kernel", 0.67, 1.56, 0},  // a span's bounds per lane
                 {"norm_partial_kernel", 0.99, 1.01, 0},
                 {"adamw_kernel", 0.98, 1.02, 0}});
}

TEST_CASE("kernel counters: a naive step's kernels") {
  std::string report;
  const std::vector<emu::KernelCounters> k = profile_step(gpu::AttentionPath::Naive, &report);
  // the softmax kernels keep a row in registers and read and write it a pass of 32 consecutive
  // columns at a time; what they miss of 100% efficiency is the causal row's last sector
  check_targets(k, report,
                {{"split_heads_kernel", 0.99, 1.01, 0},
                 {"softmax_dropout_forward_kernel", 0.98, 1.01, 0},
                 {"merge_heads_kernel", 0.99, 1.01, 0},
                 {"softmax_dropout_backward_kernel", 0.96, 1.01, 0},
                 {"scatter_add_heads_kernel", 0.99, 1.01, 0}});
}

// The same step on the Hopper kernels (TG_FLASH_HOPPER=1, the emulator's H100's default)
// (kernels/flash_attn_hopper.cuh) in place of the mma.sync flash kernels, held to no shared bank
// conflicts and to the sector efficiency and bytes they reach (TMA boxes and wgmma operands are
// not memory instructions of a warp: the counts are the kernels' own loads and stores, the
// forward's output and lse, the backward's tiles and dqkv).
TEST_CASE("kernel counters: the Hopper flash kernels keep their shared memory free of conflicts") {
  const tg_test::FlashKernels hopper(true);
  std::string report;
  const std::vector<emu::KernelCounters> k = profile_step(gpu::AttentionPath::Flash, &report);
  // the forward's global traffic besides TMA is its output: O from the fragments (50% of the
  // sectors a warp's bf16x2 stores touch, as the mma.sync forward's) and lse; the backward's
  // kernels load with cp.async and reach what the mma.sync ones do
  check_targets(k, report,
                {{"flash_fwd_hopper_kernel", 0.50, 1.25, 0},
                 {"flash_bwd_dkdv_hopper_kernel", 0.69, 1.63, 0},
                 {"flash_bwd_dq_hopper_kernel", 0.77, 1.50, 0}});
  // With dQ inside the dK / dV kernel (TG_FLASH_HOPPER=3): it stores dQ's fp32 sums a sector of 8
  // columns at a time (4 sectors a request) and reads them back by cp.async, and adds the last key
  // tile's to dqkv's Q columns with bf16x2 read-add-writes (50% of their sectors, as dK's and
  // dV's): 68.7% in all; no dQ kernel runs
  const tg_test::FlashKernels fused("3");
  std::string fused_report;
  const std::vector<emu::KernelCounters> f = profile_step(gpu::AttentionPath::Flash, &fused_report);
  check_targets(f, fused_report, {{"flash_bwd_dkdv_hopper_kernel", 0.68, 1.60, 0}});
  for (const emu::KernelCounters& kc : f)
    CHECK_MESSAGE(kc.kernel.find("flash_bwd_dq_") == std::string::npos, "a dQ kernel ran beside the dK / dV one: " << kc.kernel);
  // its TMA bytes: per (bh, query tile of 128 rows) Q_i once, then K_j and V_j for each key tile
  // of 64 up to the tile's last row (the step: T = 128, one sequence, 6 heads of 64)
  uint64_t tma = 0;
  for (const emu::KernelCounters& kc : k)
    if (kc.kernel.find("flash_fwd_hopper_kernel") != std::string::npos) tma += kc.tma_bytes;
  const uint64_t heads = 6, hs = 64, per_tile = 128 * hs * 2 + 2 * (2 * 64 * hs * 2);
  CHECK(tma == heads * per_tile);
}

// The same step with the warp-specialized Hopper backward (TG_FLASH_HOPPER=2): its tiles come by
// TMA, so its own memory instructions are lse and D (the dK / dV kernel's producer lanes; the dQ
// kernel's consumer rows) and dqkv; held to no shared bank conflicts (the producer lanes' lse and
// D, the per-warp keep bits), and its TMA bytes counted: per head (T = 128, 64 queries a tile)
// the dK / dV kernel loads K_j, V_j once for its key tile of 128 (two pairs of 64 x 64 bf16 tiles)
// and Q_i, dO_i for each query tile from the key tile's first query on, once for both its
// warpgroups (2): four pairs, where one warpgroup a key tile of 64 loaded five; likewise the dQ
// kernel Q_i, dO_i once for its query tile of 128 (2) and K_j, V_j up to the tile's last row, once
// for both its warpgroups (2): four pairs, where one warpgroup a query tile of 64 loaded five.
TEST_CASE("warp-specialized Hopper backward: its kernel counters, no shared bank conflicts, its TMA bytes") {
  const tg_test::FlashKernels ws("2");
  std::string report;
  const std::vector<emu::KernelCounters> k = profile_step(gpu::AttentionPath::Flash, &report);
  // (the efficiency: dqkv's bf16x2 read-add-writes, 50% of the sectors they touch, with the lse and
  // D loads; the cp.async kernels' 0.69 and 0.77 counted their tile loads too)
  check_targets(k, report,
                {{"flash_bwd_dkdv_hopper_ws_kernel", 0.50, 1.63, 0}, {"flash_bwd_dq_hopper_ws_kernel", 0.50, 1.50, 0}});
  uint64_t dkdv = 0, dq = 0;
  for (const emu::KernelCounters& kc : k) {
    if (kc.kernel.find("flash_bwd_dkdv_hopper_ws_kernel") != std::string::npos) dkdv += kc.tma_bytes;
    if (kc.kernel.find("flash_bwd_dq_hopper_ws_kernel") != std::string::npos) dq += kc.tma_bytes;
  }
  const uint64_t heads = 6, pair = 2 * 64 * 64 * 2;
  CHECK(dkdv == heads * 4 * pair);
  CHECK(dq == heads * 4 * pair);
}

// The Hopper forward at head size 64 without dropout (three consumer warpgroups, 192 query rows a
// CTA, key tiles of 128) where T is not a multiple of 192: a warpgroup whose rows all lie past T
// has no products. At T 200 the second query tile (rows 192 .. 383) has rows before T in its first
// warpgroup only; the wgmmas' FLOPs are those of the six (warpgroup, key tile) pairs with rows
// before T (query tile 0: one, one and two key tiles; tile 1: two), each S (4 wgmma m64n128k16)
// and P V (8 m64n64k16), 2 x 64 x 128 x 64 FLOPs apiece; with the last two warpgroups of tile 1
// computing theirs (two key tiles each), ten. The same with the consumers not taking turns
// (TG_FLASH_HOPPER=8) and with two consumers (TG_FLASH_HOPPER=7: 128 rows a CTA, six pairs too),
// and the output the same bits.
TEST_CASE("kernel counters: the Hopper forward has no products for a warpgroup whose rows are past T") {
  const int B = 1, Tn = 200, NH = 1, HS = 64, C = NH * HS;
  std::vector<gpu::bf16> qkv((size_t)B * Tn * 3 * C);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = __float2bfloat16((float)((i * 37) % 101) / 50.f - 1.f);
  gpu::bf16 *d_qkv = nullptr, *d_out = nullptr;
  float* d_lse = nullptr;
  REQUIRE(cudaMalloc(&d_qkv, qkv.size() * sizeof(gpu::bf16)) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_out, (size_t)B * Tn * C * sizeof(gpu::bf16)) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_lse, (size_t)B * NH * Tn * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_qkv, qkv.data(), qkv.size() * sizeof(gpu::bf16), cudaMemcpyHostToDevice) == cudaSuccess);
  gpu::Context ctx;
  ctx.create(gpu::flash_attn_scratch_bytes(B, Tn, C, NH));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the upload ran on the legacy stream
  const philox::DropoutKey key = philox::make_dropout_key(1, 0, 0, 0, 0.0);
  // the forward on TG_FLASH_HOPPER=family: the FLOPs of the kernel named `kernel`, and the output
  auto forward = [&](const char* family, const char* kernel) {
    const tg_test::FlashKernels k(family);
    emu::KernelProfiler prof;
    gpu::flash_attn_forward<gpu::bf16>(ctx, d_out, d_lse, d_qkv, key, B, Tn, C, NH, true, nullptr);
    REQUIRE(cudaStreamSynchronize(ctx.stream) == cudaSuccess);
    uint64_t flops = 0;
    bool seen = false;
    for (const emu::KernelCounters& kc : prof.per_kernel())
      if (kc.kernel.find(kernel) != std::string::npos) flops += kc.mma_flops, seen = true;
    CHECK_MESSAGE(seen, kernel << " did not run");
    std::vector<gpu::bf16> out((size_t)B * Tn * C);
    REQUIRE(cudaMemcpy(out.data(), d_out, out.size() * sizeof(gpu::bf16), cudaMemcpyDeviceToHost) == cudaSuccess);
    return std::make_pair(flops, out);
  };
  const auto turns = forward("1", "flash_fwd_hopper_kernel<64, 128, 3, false");
  const auto apart = forward("8", "flash_fwd_hopper_kernel<64, 128, 3, false");
  const auto two = forward("7", "flash_fwd_hopper_kernel<64, 128, 2, false");
  const uint64_t pair = 2ull * (2ull * 64 * 128 * 64);
  CHECK(turns.first == 6 * pair);
  CHECK(apart.first == 6 * pair);
  CHECK(two.first == 6 * pair);
  const size_t bytes = turns.second.size() * sizeof(gpu::bf16);
  CHECK(std::memcmp(turns.second.data(), apart.second.data(), bytes) == 0);
  CHECK(std::memcmp(turns.second.data(), two.second.data(), bytes) == 0);
  ctx.destroy();
  cudaFree(d_qkv);
  cudaFree(d_out);
  cudaFree(d_lse);
}
