// tests/emu/kernel_occupancy_main.cpp: build/kernel_occupancy [FILE] prints the kernel resource
// table (FILE, else $TG_KERNEL_RESOURCES, else build/kernel_resources.txt; made by
// `make build/kernel_resources.txt`) one row per kernel and architecture: registers per thread,
// spill stores / loads, stack frame and static shared memory in bytes, and, for the kernels whose
// launch tests/emu/occupancy.h knows (the flash attention kernels), the launch and the theoretical
// occupancy on that architecture's part (sm_80: A100 SXM, sm_90: H100 SXM) with what limits it.
// Exit status 1 when the table cannot be read.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "occupancy.h"

int main(int argc, char** argv) {
  using namespace emu::occ;
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    std::fprintf(stderr, "usage: %s [build/kernel_resources.txt]\n", argv[0]);
    return 2;
  }
  const char* env = std::getenv("TG_KERNEL_RESOURCES");
  const std::string path = argc == 2 ? argv[1] : env && *env ? env : "build/kernel_resources.txt";
  ResourceTable t;
  try {
    t = read_resources(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_occupancy: %s\n", e.what());
    return 1;
  }
  std::printf("%s: %zu kernels x architectures; occupancy by cuda_occupancy.h (theoretical), sm_80 on the %s "
              "(%d SMs), sm_90 on the %s (%d SMs)\n",
              path.c_str(), t.kernels.size(), a100_sxm().name, a100_sxm().sms, h100_sxm().name, h100_sxm().sms);
  std::printf("%-52s %-5s %4s %11s %6s %6s | %7s %8s %6s %8s %6s  %s\n", "kernel", "arch", "regs", "spill st/ld",
              "stack", "smem", "threads", "dyn smem", "blk/SM", "warps/SM", "occ", "limited by");
  for (const KernelResources& k : t.kernels) {
    const std::string name = short_name(k.name);
    char spills[32];
    std::snprintf(spills, sizeof spills, "%lld/%lld", k.spill_store_bytes, k.spill_load_bytes);
    std::printf("%-52s sm_%-2d %4d %11s %6lld %6lld |", name.c_str(), k.sm, k.regs, spills, k.stack_bytes,
                k.static_smem_bytes);
    const auto launch = flash_launch(name);
    const GpuProfile* part = profile_for_sm(k.sm);
    if (!launch || !part) {
      std::printf(" %7s\n", launch ? "(no part for this arch)" : "-");
      continue;
    }
    const Occupancy o = occupancy(*part, k.regs, launch->threads, launch->dynamic_smem_bytes, (size_t)k.static_smem_bytes);
    std::printf(" %7d %8zu %6d %8d %5.1f%%  %s\n", launch->threads, launch->dynamic_smem_bytes, o.blocks_per_sm,
                o.warps_per_sm, 100 * o.fraction, limits_text(o.limits).c_str());
  }
  return 0;
}
