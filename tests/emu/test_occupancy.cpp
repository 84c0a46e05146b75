// tests/emu/test_occupancy.cpp: the kernel resource table and the occupancy calculator of
// tests/emu/occupancy.h.
//   1. occupancy() against cases worked by hand from the calculator's rules (cuda_occupancy.h:
//      64 warps and 32 blocks per SM, 65536 registers per SM in 4 sub-partitions of 16384,
//      registers allocated per warp in units of 256, shared memory per block = static + dynamic
//      + 1 KB reserved, rounded up to 128 bytes, 164 KB per SM on the A100 and 228 KB on the
//      H100): a register-limited, a shared-memory-limited, a warp-limited and a block-limited
//      case on both parts, and launches that cannot run.
//   2. the reader on a literal table in the real format (tests/emu/kernel_resources.sh), and
//      malformed tables refused with the file and line.
//   3. the real table of this build ($TG_KERNEL_RESOURCES, else build/kernel_resources.txt;
//      missing or unreadable: a failure, not a skip): the build's architectures listed
//      ($TG_KERNEL_ARCHS, which make test sets to ARCH: "80 90" without a GPU), the three flash
//      kernels present, no kernel spills; the bf16 flash kernels at their launch (block size and
//      dynamic shared memory of kernels/flash_attn_fwd.cu and kernels/flash_attn_bwd.cu) keep at
//      least 8 warps per SM resident on an H100 at HS = 64. Their registers and occupancy on both
//      parts are printed (MESSAGE).
#include <doctest/doctest.h>

#include <cuda_occupancy.h>

#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "../../kernels/flash_attn_common.cuh"
#include "occupancy.h"

namespace {

using namespace emu::occ;

const GpuProfile* const kParts[] = {&a100_sxm(), &h100_sxm()};

// the message of the std::runtime_error that parse_resources throws, or "" when it does not
std::string parse_error(const std::string& text) {
  try {
    parse_resources(text, "t.txt");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

const char* const kMangledFwd64 =
    "_ZN3gpu5flash50_GLOBAL__N__ce04b504_17_flash_attn_fwd_cu_9a0deaad21flash_fwd_bf16_kernelILi64ELb0EEEvNS0_"
    "9FwdParamsI13__nv_bfloat16EE";

const char* const kHeader =
    "# a comment\n"
    "# archs: 80 90\n";

}  // namespace

// ---- 1. the calculator ---------------------------------------------------------------------------
TEST_CASE("occupancy: the parts' rules are the calculator's (64 warps, 32 blocks, 256-register and 128-byte units)") {
  for (const GpuProfile* part : kParts) {
    CAPTURE(part->name);
    cudaOccDeviceProp prop;
    prop.computeMajor = part->sm / 10;
    prop.computeMinor = part->sm % 10;
    int blocks = 0, reg_unit = 0, smem_unit = 0, sub = 0;
    REQUIRE(cudaOccMaxBlocksPerMultiprocessor(&blocks, &prop) == CUDA_OCC_SUCCESS);
    REQUIRE(cudaOccRegAllocationGranularity(&reg_unit, &prop) == CUDA_OCC_SUCCESS);
    REQUIRE(cudaOccSMemAllocationGranularity(&smem_unit, &prop) == CUDA_OCC_SUCCESS);
    REQUIRE(cudaOccSubPartitionsPerMultiprocessor(&sub, &prop) == CUDA_OCC_SUCCESS);
    CHECK(blocks == 32);
    CHECK(reg_unit == 256);
    CHECK(smem_unit == 128);
    CHECK(sub == 4);
    CHECK(part->max_threads_per_sm / 32 == 64);
    CHECK(part->regs_per_sm == 65536);
    CHECK(part->reserved_smem_per_block == 1024);
  }
  CHECK(a100_sxm().sm == 80);
  CHECK(a100_sxm().sms == 108);
  CHECK(a100_sxm().smem_per_sm == 164 * 1024);
  CHECK(a100_sxm().smem_per_block_optin == 163 * 1024);
  CHECK(h100_sxm().sm == 90);
  CHECK(h100_sxm().sms == 132);
  CHECK(h100_sxm().smem_per_sm == 228 * 1024);
  CHECK(h100_sxm().smem_per_block_optin == 227 * 1024);
  CHECK(profile_for_sm(80) == &a100_sxm());
  CHECK(profile_for_sm(90) == &h100_sxm());
  CHECK(profile_for_sm(86) == nullptr);
}

TEST_CASE("occupancy: hand-worked cases on the A100 and the H100") {
  for (const GpuProfile* part : kParts) {
    CAPTURE(part->name);
    const GpuProfile& p = *part;

    SUBCASE("registers: 128 threads x 64 registers") {
      // 64 x 32 = 2048 registers a warp; 16384 / 2048 = 8 warps per sub-partition, 32 per SM:
      // 8 blocks of 4 warps (warps alone: 64 / 4 = 16 blocks; blocks alone: 32)
      const Occupancy o = occupancy(p, 64, 128, 0, 0);
      CHECK(o.blocks_per_sm == 8);
      CHECK(o.warps_per_sm == 32);
      CHECK(o.fraction == doctest::Approx(0.5));
      CHECK(o.limits == kLimitRegisters);
      CHECK(o.blocks_by_warps == 16);
      CHECK(o.blocks_by_blocks == 32);
      CHECK(o.regs_per_block == 4 * 2048);
    }
    SUBCASE("registers, rounded to the unit: 128 threads x 33 registers") {
      // 33 x 32 = 1056 -> 1280 a warp; 16384 / 1280 = 12 warps per sub-partition, 48 per SM:
      // 12 blocks (without the rounding: 65536 / (33 x 128) = 15)
      const Occupancy o = occupancy(p, 33, 128, 0, 0);
      CHECK(o.blocks_per_sm == 12);
      CHECK(o.warps_per_sm == 48);
      CHECK(o.limits == kLimitRegisters);
    }
    SUBCASE("registers: 256 threads x 255 registers") {
      // 255 x 32 = 8160 -> 8192 a warp: 2 warps per sub-partition, 8 per SM: 1 block of 8 warps
      const Occupancy o = occupancy(p, 255, 256, 0, 0);
      CHECK(o.blocks_per_sm == 1);
      CHECK(o.warps_per_sm == 8);
      CHECK(o.fraction == doctest::Approx(0.125));
      CHECK(o.limits == kLimitRegisters);
    }
    SUBCASE("warps: 1024 threads x 16 registers") {
      // 32 warps a block: 64 / 32 = 2 blocks; registers: 512 a warp, 32 per sub-partition, 128
      // warps, 4 blocks
      const Occupancy o = occupancy(p, 16, 1024, 0, 0);
      CHECK(o.blocks_per_sm == 2);
      CHECK(o.warps_per_sm == 64);
      CHECK(o.fraction == doctest::Approx(1.0));
      CHECK(o.limits == kLimitWarps);
      CHECK(o.blocks_by_regs == 4);
    }
    SUBCASE("blocks: 32 threads x 32 registers") {
      // one warp a block: warps alone 64 blocks, registers (1024 a warp, 16 per sub-partition) 64
      // blocks; 32 blocks at most: 32 warps
      const Occupancy o = occupancy(p, 32, 32, 0, 0);
      CHECK(o.blocks_per_sm == 32);
      CHECK(o.warps_per_sm == 32);
      CHECK(o.limits == kLimitBlocks);
      CHECK(o.blocks_by_warps == 64);
      CHECK(o.blocks_by_regs == 64);
    }
    SUBCASE("shared memory: 128 threads x 32 registers, 40 KB dynamic") {
      // 40960 + 1024 reserved = 41984 bytes a block (a multiple of 128); A100: 167936 / 41984 = 4
      // exactly (16 warps); H100: 233472 / 41984 = 5 (20 warps); registers alone: 16 blocks
      const Occupancy o = occupancy(p, 32, 128, 40 * 1024, 0);
      const int blocks = p.sm == 80 ? 4 : 5;
      CHECK(o.smem_per_block == 41984);
      CHECK(o.blocks_per_sm == blocks);
      CHECK(o.warps_per_sm == 4 * blocks);
      CHECK(o.limits == kLimitSharedMemory);
      CHECK(o.blocks_by_regs == 16);
      // static shared memory counts the same: 1 KB static + 39 KB dynamic
      const Occupancy s = occupancy(p, 32, 128, 39 * 1024, 1024);
      CHECK(s.smem_per_block == 41984);
      CHECK(s.blocks_per_sm == blocks);
      // 100 bytes more: 42084 -> 42112 (rounded to 128); A100: 3 blocks, H100: 5
      const Occupancy r = occupancy(p, 32, 128, 40 * 1024 + 100, 0);
      CHECK(r.smem_per_block == 42112);
      CHECK(r.blocks_per_sm == (p.sm == 80 ? 3 : 5));
    }
    SUBCASE("shared memory: the opt-in maximum fits once, a byte more does not") {
      const size_t optin = p.smem_per_block_optin;  // 163 KB (A100), 227 KB (H100)
      const Occupancy fits = occupancy(p, 32, 128, optin, 0);
      CHECK(fits.blocks_per_sm == 1);
      CHECK(fits.limits == kLimitSharedMemory);
      CHECK(occupancy(p, 32, 128, optin - 1024, 1024).blocks_per_sm == 1);
      CHECK(occupancy(p, 32, 128, optin + 1, 0).blocks_per_sm == 0);
      CHECK(occupancy(p, 32, 128, optin, 128).blocks_per_sm == 0);
    }
    SUBCASE("shared memory: 48 KB dynamic without opting in leaves no room for static shared memory") {
      // gpu::launch opts in only above 48 KB of dynamic shared memory; without it a block may use
      // 48 KB in all
      CHECK(occupancy(p, 32, 128, 48 * 1024, 0).blocks_per_sm > 0);
      CHECK(occupancy(p, 32, 128, 48 * 1024, 128).blocks_per_sm == 0);
    }
    SUBCASE("registers: 1024 threads x 65 registers cannot launch") {
      // 65 x 32 = 2080 -> 2304 a warp, x 32 warps = 73728 > 65536 registers a block
      CHECK(occupancy(p, 65, 1024, 0, 0).blocks_per_sm == 0);
      CHECK(occupancy(p, 64, 1024, 0, 0).blocks_per_sm == 1);
    }
    SUBCASE("more than 1024 threads cannot launch") { CHECK(occupancy(p, 16, 1056, 0, 0).blocks_per_sm == 0); }
  }
  CHECK_THROWS_AS(occupancy(h100_sxm(), 32, 0, 0, 0), std::invalid_argument);
  CHECK(limits_text(kLimitRegisters | kLimitSharedMemory) == "registers + shared memory");
}

// ---- 2. the reader ---------------------------------------------------------------------------------
TEST_CASE("kernel resources: the reader takes the table's format, demangled as g++ demangles") {
  const std::string text = std::string(kHeader) +
                           "sm_80 regs=144 spill_stores=0 spill_loads=0 stack=0 smem=0 lmem=0 "
                           "object=build/kernels/flash_attn_fwd.o kernel=" +
                           kMangledFwd64 +
                           "\n"
                           "sm_90 regs=40 spill_stores=8 spill_loads=12 stack=16 smem=1056 lmem=4 object=build/cuda_ops.o "
                           "kernel=_ZN3gpu12_GLOBAL__N_116layernorm_kernelEPfPKfi\n";
  const ResourceTable t = parse_resources(text, "t.txt");
  CHECK(t.archs == std::vector<int>{80, 90});
  REQUIRE(t.kernels.size() == 2);
  const KernelResources& a = t.kernels[0];
  CHECK(a.sm == 80);
  CHECK(a.regs == 144);
  CHECK(a.object == "build/kernels/flash_attn_fwd.o");
  CHECK(a.mangled == kMangledFwd64);
  // the name g++ gives the same kernel in the emulator build (nm build/emu/kernels/flash_attn_fwd.o)
  CHECK(a.name ==
        "void gpu::flash::(anonymous namespace)::flash_fwd_bf16_kernel<64, false>(gpu::flash::FwdParams<__nv_bfloat16>)");
  CHECK(short_name(a.name) == "flash_fwd_bf16_kernel<64, false>");
  const KernelResources& b = t.kernels[1];
  CHECK(b.sm == 90);
  CHECK(b.regs == 40);
  CHECK(b.spill_store_bytes == 8);
  CHECK(b.spill_load_bytes == 12);
  CHECK(b.stack_bytes == 16);
  CHECK(b.static_smem_bytes == 1056);
  CHECK(b.local_bytes == 4);
  CHECK(b.name == "gpu::(anonymous namespace)::layernorm_kernel(float*, float const*, int)");
  CHECK(short_name(b.name) == "layernorm_kernel");
  CHECK(demangle("not_mangled") == "not_mangled");
  CHECK(short_name("void f<a::b<1>, (anonymous namespace)::X>(int (*)(int))") == "f<a::b<1>, (anonymous namespace)::X>");
  // the Hopper kernels' table: the architecture-specific target (sm_90a) is compute capability 9.0
  const ResourceTable h = parse_resources("# archs: 90a\nsm_90a regs=168 spill_stores=0 spill_loads=0 stack=0 smem=64 "
                                          "lmem=0 object=build/kernels/flash_attn_hopper.o kernel=k\n",
                                          "h.txt");
  CHECK(h.archs == std::vector<int>{90});
  REQUIRE(h.kernels.size() == 1);
  CHECK(h.kernels[0].sm == 90);
  CHECK(h.kernels[0].regs == 168);
}

TEST_CASE("kernel resources: a malformed table is refused, naming the file and line") {
  const std::string good =
      "sm_80 regs=1 spill_stores=0 spill_loads=0 stack=0 smem=0 lmem=0 object=a.o kernel=_Z1fv\n";
  CHECK(parse_error(kHeader + good) == "");
  CHECK(parse_error(good).find("t.txt:1: a kernel before the \"# archs:\" line") != std::string::npos);
  CHECK(parse_error("# nothing\n").find("t.txt:1: no \"# archs:\" line") != std::string::npos);
  CHECK(parse_error(kHeader).find("no kernel in the table") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) + "# archs: 80\n" + good).find("t.txt:3: a second") != std::string::npos);
  CHECK(parse_error("# archs: 80 x\n" + good).find("t.txt:1: not a compute capability") != std::string::npos);
  CHECK(parse_error("# archs: 90b\n" + good).find("t.txt:1: not a compute capability") != std::string::npos);
  CHECK(parse_error("# archs: a\n" + good).find("t.txt:1: not a compute capability") != std::string::npos);
  // a field missing, one too many, out of order, not a count, an unknown or unlisted architecture
  const std::string e1 = parse_error(std::string(kHeader) + good +
                                     "sm_80 regs=1 spill_stores=0 spill_loads=0 stack=0 smem=0 object=a.o kernel=_Z1fv\n");
  CHECK(e1.find("t.txt:4: expected 9 fields") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) +
                    "sm_80 regs=1 spill_stores=0 spill_loads=0 stack=0 smem=0 lmem=0 object=a.o kernel=_Z1fv x=1\n")
            .find("t.txt:3: expected 9 fields") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) +
                    "sm_80 regs=1 spill_loads=0 spill_stores=0 stack=0 smem=0 lmem=0 object=a.o kernel=_Z1fv\n")
            .find("t.txt:3: expected spill_stores=N, found \"spill_loads=0\"") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) +
                    "sm_80 regs=1 spill_stores=-4 spill_loads=0 stack=0 smem=0 lmem=0 object=a.o kernel=_Z1fv\n")
            .find("t.txt:3: spill_stores is not a count") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) +
                    "sm_86 regs=1 spill_stores=0 spill_loads=0 stack=0 smem=0 lmem=0 object=a.o kernel=_Z1fv\n")
            .find("t.txt:3: sm_86 is not among") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) +
                    "compute_80 regs=1 spill_stores=0 spill_loads=0 stack=0 smem=0 lmem=0 object=a.o kernel=_Z1fv\n")
            .find("t.txt:3: expected an architecture") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) +
                    "sm_80 regs=300 spill_stores=0 spill_loads=0 stack=0 smem=0 lmem=0 object=a.o kernel=_Z1fv\n")
            .find("more than 255 registers") != std::string::npos);
  CHECK(parse_error(std::string(kHeader) + "\n").find("t.txt:3: expected 9 fields") != std::string::npos);
  CHECK_THROWS_WITH_AS(read_resources("/nonexistent/kernel_resources.txt"),
                       "cannot read the kernel resource table /nonexistent/kernel_resources.txt", std::runtime_error);
}

// ---- 3. this build's kernels -------------------------------------------------------------------
namespace {

// The table of this build: $TG_KERNEL_RESOURCES (make test sets it), else the default build's;
// with hopper, the Hopper kernels' (sm_90a) table written beside it.
ResourceTable this_build(bool hopper = false) {
  const char* env = std::getenv("TG_KERNEL_RESOURCES");
  std::string path = env && *env ? env : "build/kernel_resources.txt";
  if (hopper) path = path.substr(0, path.find_last_of('/') + 1) + "kernel_resources_hopper.txt";
  try {
    return read_resources(path);
  } catch (const std::exception& e) {
    const std::string why = std::string(e.what()) +
                            (env && *env ? " (from $TG_KERNEL_RESOURCES)" : " ($TG_KERNEL_RESOURCES unset)") +
                            ": make build/kernel_resources.txt writes it";
    FAIL(why);
  }
  return {};
}

// No spills, and no stack frame or local memory either: a register array indexed at run time
// lives in local memory (as slow as a spill; ptxas reports it as stack, not as a spill).
void check_no_spills(const ResourceTable& t) {
  std::ostringstream spills;
  int n_spilling = 0;
  for (const KernelResources& k : t.kernels)
    if (k.spill_store_bytes != 0 || k.spill_load_bytes != 0 || k.stack_bytes != 0 || k.local_bytes != 0) {
      ++n_spilling;
      spills << "\n  sm_" << k.sm << " " << k.name << ": " << k.spill_store_bytes << " bytes spill stores, "
             << k.spill_load_bytes << " bytes spill loads, " << k.stack_bytes << " bytes of stack, " << k.local_bytes
             << " of local memory, " << k.regs << " registers";
    }
  CHECK_MESSAGE(n_spilling == 0, n_spilling << " kernels spill registers or use local memory:" << spills.str());
}

const KernelResources* find(const ResourceTable& t, int sm, const std::string& short_nm) {
  for (const KernelResources& k : t.kernels)
    if (k.sm == sm && short_name(k.name) == short_nm) return &k;
  return nullptr;
}

}  // namespace

TEST_CASE("kernel resources: this build lists its architectures, the flash kernels, and no kernel spills or uses local memory") {
  const ResourceTable t = this_build();
  std::set<int> archs(t.archs.begin(), t.archs.end()), with_kernels;
  for (const KernelResources& k : t.kernels) with_kernels.insert(k.sm);
  REQUIRE(!archs.empty());
  // make test passes the build's ARCH ("80 90" when no GPU is visible, the GPU's own where one is)
  if (const char* want = std::getenv("TG_KERNEL_ARCHS")) {
    std::set<int> expected;
    std::istringstream in(want);
    for (int a; in >> a;) expected.insert(a);
    CHECK_MESSAGE(archs == expected, "the table's architectures are not the build's ARCH=\"" << want << "\"");
  }
  CHECK(with_kernels == archs);

  check_no_spills(t);

  for (int sm : t.archs)
    for (const char* base : {"flash_fwd_bf16_kernel", "flash_bwd_dkdv_bf16_kernel", "flash_bwd_dq_bf16_kernel"})
      for (int hs : {32, 64, 128, 256})
        for (const char* dropout : {"false", "true"}) {
          const std::string nm = std::string(base) + "<" + std::to_string(hs) + ", " + dropout + ">";
          CHECK_MESSAGE(find(t, sm, nm) != nullptr, "sm_" << sm << ": no " << nm);
        }
}

TEST_CASE("kernel resources: the Hopper kernels (sm_90a) are listed and none spills or uses local memory") {
  const ResourceTable t = this_build(true);
  CHECK(t.archs == std::vector<int>{90});
  check_no_spills(t);
  for (const char* base : {"flash_bwd_dq_hopper_kernel", "flash_bwd_dkdv_hopper_kernel"})
    for (int hs : {64, 128, 256})
      for (const char* dropout : {"false", "true"})
        for (const char* third : {"", ", false", ", true"}) {
          // the third argument of the dK / dV kernel (dQ inside it)
          const bool dq = std::string(base) == "flash_bwd_dq_hopper_kernel";
          if (dq != (*third == 0)) continue;
          const std::string nm = std::string(base) + "<" + std::to_string(hs) + ", " + dropout + third + ">";
          CHECK_MESSAGE(find(t, 90, nm) != nullptr, "sm_90a: no " << nm);
        }
  // the forward's: <head size, key tile, consumer warpgroups, dropout, keep decisions by its
  // producer warpgroup>: key tiles of 64 at every head size, of 128 at 64 and 128; three consumers
  // at HS 64 without dropout on tiles of 128 (two with TG_FLASH_HOPPER=7); the producer's keep
  // decisions with dropout at HS 64 and 128 (on tiles of 64)
  const std::vector<std::string> forwards = {
      "64, 64, 2, false, false",   "64, 64, 2, true, false",   "64, 64, 2, true, true",   "64, 128, 3, false, false",
      "64, 128, 2, false, false",  "64, 128, 2, true, false",  "128, 64, 2, false, false", "128, 64, 2, true, false",
      "128, 64, 2, true, true",    "128, 128, 2, false, false", "128, 128, 2, true, false", "256, 64, 1, false, false",
      "256, 64, 1, true, false"};
  for (const std::string& args : forwards) {
    const std::string nm = "flash_fwd_hopper_kernel<" + args + ">";
    CHECK_MESSAGE(find(t, 90, nm) != nullptr, "sm_90a: no " << nm);
  }
  // The dK / dV kernel with dQ inside keeps the blocks an SM on an H100 that it had without (two
  // at HS 64 and 128, one at 256): 128 threads, its registers, and its shared memory
  // (kernels/flash_attn_hopper.cu, HopperDkvTile's kSmemBytesFused: 1024 of alignment; K, V and
  // two stages of Q, dO; lse and D; the keep bytes, rounded up to 1024; dS's tile [Br][64] bf16 and
  // the sums of the CTA's columns [Br][cols + 4] fp32; Br 64 at HS 64, else 32; cols 128 at most)
  for (int hs : {64, 128, 256}) {
    const int br = hs == 64 ? 64 : 32, cols = std::min(hs, 128);
    const size_t before = (2 * 64 + 4 * br) * hs * 2 + 4 * br * 4 + 8 * br;
    const size_t smem = 1024 + (before + 1023) / 1024 * 1024 + br * 64 * 2 + br * (cols + 4) * 4;
    for (const char* dropout : {"false", "true"}) {
      const std::string nm = "flash_bwd_dkdv_hopper_kernel<" + std::to_string(hs) + ", " + dropout + ", true>";
      const KernelResources* k = find(t, 90, nm);
      REQUIRE_MESSAGE(k != nullptr, "sm_90a: no " << nm);
      const Occupancy o = occupancy(h100_sxm(), k->regs, 128, smem, (size_t)k->static_smem_bytes);
      CHECK_MESSAGE(o.blocks_per_sm == (hs == 256 ? 1 : 2), nm << ": " << k->regs << " registers, " << smem
                                                              << " B of shared memory: " << o.blocks_per_sm
                                                              << " blocks an SM, limited by " << limits_text(o.limits));
    }
  }
  // The forward at HS 64 and 128 moves registers with setmaxnreg (a producer warpgroup, 384
  // threads, or 512 with three consumers): ptxas honours it only where it knows the count at
  // entry, and then gives the kernel that count, the one the emulator's setmaxnreg starts every
  // warpgroup with (168, or 128); a kernel where ptxas ignored it (warning C7508) would report what
  // its code needs instead.
  for (const std::string& args : forwards) {
    if (args.rfind("256", 0) == 0) continue;  // (one consumer warpgroup and a producer warp: 160 threads)
    const int threads = args.find(", 3, ") != std::string::npos ? 512 : 384;
    const std::string nm = "flash_fwd_hopper_kernel<" + args + ">";
    const KernelResources* k = find(t, 90, nm);
    REQUIRE_MESSAGE(k != nullptr, "sm_90a: no " << nm);
    CHECK_MESSAGE(k->regs == emu::setmaxnreg_entry_count(threads), nm << ": " << k->regs << " registers");
  }
  // So do the warp-specialized backward's kernels (two consumer warpgroups and a producer one) at
  // every head size
  for (const char* base : {"flash_bwd_dkdv_hopper_ws_kernel", "flash_bwd_dq_hopper_ws_kernel"})
    for (int hs : {64, 128, 256})
      for (const char* dropout : {"false", "true"}) {
        const std::string nm = std::string(base) + "<" + std::to_string(hs) + ", " + dropout + ">";
        const KernelResources* k = find(t, 90, nm);
        REQUIRE_MESSAGE(k != nullptr, "sm_90a: no " << nm);
        CHECK_MESSAGE(k->regs == emu::setmaxnreg_entry_count(384), nm << ": " << k->regs << " registers");
      }
}

TEST_CASE("kernel resources: the flash launches' shared memory is the launchers' tiles") {
  // flash_launch states the launchers' configurations (tests/emu/occupancy.cpp); the query-tile
  // kernels' against the tile struct of kernels/flash_attn_common.cuh they launch with, the
  // dK/dV kernel's against the sizes its comment in kernels/flash_attn_bwd.cu gives (DkvTile is
  // local to that file): HS = 32: 32 KB, 64: 56 KB, 128: 69 KB, 256: 133 KB
  using gpu::flash::QueryTile;
  auto check_hs = [](auto hs_c) {
    constexpr int HS = decltype(hs_c)::value;
    CAPTURE(HS);
    const std::string args = "<" + std::to_string(HS) + ", false>";
    const auto fwd = flash_launch("flash_fwd_bf16_kernel" + args);
    const auto dq = flash_launch("flash_bwd_dq_bf16_kernel" + args);
    const auto dkdv = flash_launch("flash_bwd_dkdv_bf16_kernel" + args);
    REQUIRE(fwd);
    REQUIRE(dq);
    REQUIRE(dkdv);
    CHECK(fwd->threads == QueryTile<HS, 8, 1>::kThreads);  // FwdTile<HS>
    CHECK(fwd->dynamic_smem_bytes == QueryTile<HS, 8, 1>::kSmemBytes);
    CHECK(dq->threads == QueryTile<HS, 4, 2>::kThreads);  // DqTile<HS>
    CHECK(dq->dynamic_smem_bytes == QueryTile<HS, 4, 2>::kSmemBytes);
    CHECK(dkdv->threads == 128);
    CHECK(dkdv->dynamic_smem_bytes == (HS == 32 ? 32256u : HS == 64 ? 56832u : HS == 128 ? 70400u : 135936u));
  };
  check_hs(std::integral_constant<int, 32>{});
  check_hs(std::integral_constant<int, 64>{});
  check_hs(std::integral_constant<int, 128>{});
  check_hs(std::integral_constant<int, 256>{});
  CHECK(flash_launch("flash_bwd_dot_do_o_kernel<__nv_bfloat16>")->threads == 256);
  CHECK(!flash_launch("layernorm_kernel"));
  CHECK(!flash_launch("flash_fwd_bf16_kernel<96, false>"));
}

TEST_CASE("kernel resources: the bf16 flash kernels keep 8 warps per SM resident on an H100 at HS = 64") {
  const ResourceTable t = this_build();
  for (int hs : {64, 128, 256})
    for (const char* base : {"flash_fwd_bf16_kernel", "flash_bwd_dkdv_bf16_kernel", "flash_bwd_dq_bf16_kernel"})
      for (const char* dropout : {"false", "true"}) {
        const std::string nm = std::string(base) + "<" + std::to_string(hs) + ", true, " + dropout + ">";
        const auto launch = flash_launch(nm);
        REQUIRE(launch);
        std::ostringstream line;
        line << nm << ": " << launch->threads << " threads, " << launch->dynamic_smem_bytes << " B dynamic smem";
        for (const GpuProfile* part : kParts) {
          const KernelResources* k = find(t, part->sm, nm);
          if (!k) {
            line << "; " << part->name << ": not built";
            continue;
          }
          const Occupancy o =
              occupancy(*part, k->regs, launch->threads, launch->dynamic_smem_bytes, (size_t)k->static_smem_bytes);
          line << "; " << part->name << ": " << k->regs << " regs, " << o.blocks_per_sm << " blocks = " << o.warps_per_sm
               << " warps/SM (" << std::fixed << std::setprecision(1) << 100 * o.fraction << "%, " << limits_text(o.limits) << ")";
          CHECK_MESSAGE(o.blocks_per_sm >= 1, nm << " cannot launch on the " << part->name);
          if (part->sm == 90 && hs == 64)
            CHECK_MESSAGE(o.warps_per_sm >= 8, nm << " on the H100: " << o.warps_per_sm << " warps per SM, limited by "
                                                  << limits_text(o.limits) << " (" << k->regs << " registers)");
        }
        MESSAGE(line.str());
      }
}
