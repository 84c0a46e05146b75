// tests/emu/kernel_profiler.h: exact memory and tensor counters of every emulated kernel launch,
// from the memory hook (tests/emu/access_hook.h), defined as Nsight Compute defines them. No
// cycles and no timing: these are properties of the code at a shape, the same on every run.
//
// A warp-level instruction is the lanes' accesses of one warp that share a source location and
// an occurrence (the k-th time each lane executed that access since the last __syncthreads):
// lanes that skip it (a divergent branch) are inactive in it. Per instruction:
//   - global memory (one request): the 32-byte sectors its lanes' bytes fall in, against the
//     ideal for its width (ceil(active lanes x width / 32)), and the distinct bytes the lanes
//     ask for; sector efficiency = bytes asked / (32 x sectors). A launch's compulsory traffic is
//     its distinct sectors read plus its distinct sectors written, x 32 bytes: what DRAM must
//     move at least, however well the caches do;
//   - shared memory (one request): 32 banks of 4 bytes; accesses of up to 4 bytes are served in
//     one phase of 32 lanes, 8-byte ones in two phases of 16 lanes, 16-byte ones (ldmatrix rows
//     and cp.async included) in four of 8; a phase takes as many wavefronts as the most distinct
//     4-byte words any bank holds in it (the same word is a broadcast); bank conflicts =
//     wavefronts - phases. An ldmatrix.x4 is four phases of eight 16-byte rows;
//   - tensor work: mma.sync m16n8k16 instructions (warp-level: 4096 FLOPs each) and wgmma
//     m64nNk16 (warpgroup-level: 2048 N FLOPs each; its shared operands are not counted as
//     traffic), cp.async bytes, TMA load bytes;
//     the cuBLAS / cuBLASLt stand-ins' GEMMs (2 m n k FLOPs per batch entry, bytes of A, B, C, D).
// Accesses keep the widths of the source (the kernel files are compiled without
// vectorisation); the hardware's compiler may merge neighbouring accesses that g++ keeps apart,
// or keep in registers a value that g++ loads twice: the counts are those of the source's
// accesses, as a kernel written with explicit vector types would get on the GPU. One exception
// is made, for what the CUDA headers themselves compile differently on the host: a
// __nv_bfloat162 (or __half2) copied member by member on the host, one 32-bit word on the device
// (cuda_bf16.hpp's NV_IS_DEVICE branch), counts as the device's one 4-byte access.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "access_hook.h"
#include "emu_internal.h"

namespace emu {

struct GlobalCounters {
  uint64_t requests = 0;       // warp-level instructions
  uint64_t sectors = 0;        // 32-byte sectors they touch (distinct within each request)
  uint64_t ideal_sectors = 0;  // ceil(active lanes x width / 32) per request
  uint64_t bytes = 0;          // distinct bytes the lanes ask for, per request
  double efficiency() const { return sectors ? (double)bytes / (32.0 * (double)sectors) : 1.0; }
  double sectors_per_request() const { return requests ? (double)sectors / (double)requests : 0.0; }
  void add(const GlobalCounters& o);
};

struct SharedCounters {
  uint64_t requests = 0;
  uint64_t wavefronts = 0;
  uint64_t ideal_wavefronts = 0;  // one per phase with an active lane
  uint64_t bytes = 0;
  uint64_t conflicts() const { return wavefronts - ideal_wavefronts; }
  void add(const SharedCounters& o);
};

// One access site: the instruction at one source location.
struct SiteCounters {
  const void* pc = nullptr;
  Space space = Space::Global;
  bool write = false;
  AccessKind kind = AccessKind::Plain;
  uint32_t width = 0;  // bytes per lane (the widest seen)
  GlobalCounters global;
  SharedCounters shared;
};

struct KernelCounters {
  std::string kernel;  // demangled name
  uint64_t launches = 0;
  dim3 grid{}, block{};  // of the last launch
  size_t dynamic_smem = 0;
  GlobalCounters load, store;            // global memory
  SharedCounters shared_load, shared_store;
  uint64_t unique_read_bytes = 0, unique_write_bytes = 0;  // compulsory traffic (distinct sectors x 32)
  uint64_t mma = 0, mma_flops = 0, cp_async_bytes = 0;
  uint64_t tma_bytes = 0;  // bytes TMA loads read from global memory (their sectors count as compulsory)
  std::vector<SiteCounters> sites;       // in order of first execution
  // every sector the kernel's loads and stores touch, and its TMA boxes' bytes (moved once each)
  uint64_t moved_bytes() const { return 32 * (load.sectors + store.sectors) + tma_bytes; }
  uint64_t compulsory_bytes() const { return unique_read_bytes + unique_write_bytes; }
  void add(const KernelCounters& o);     // same kernel, another launch
};

// The profiler: counts while it exists (it registers itself as an observer).
class KernelProfiler : public Observer {
 public:
  KernelProfiler();
  ~KernelProfiler() override;
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;

  // One entry per launch, in launch order; GEMMs of the library stand-ins in call order.
  const std::vector<KernelCounters>& launches() const { return launches_; }
  const std::vector<GemmEvent>& gemms() const { return gemms_; }
  // The launches of kernels whose name contains `part`, added together (launches = 0: none).
  KernelCounters total(const std::string& part) const;
  // All launches summed per kernel name, in order of first launch.
  std::vector<KernelCounters> per_kernel() const;
  void clear();

  // A table of per_kernel(), and with sites, every shared-memory site that has bank conflicts
  // and every global site below `min_efficiency` (as "file:line").
  std::string report(bool sites = true, double min_efficiency = 0.9) const;

  void launch_begin(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem) override;
  void cta_begin() override;
  void access(const Access& a) override;
  void barrier() override;
  void mma(int warp, uint64_t flops) override;
  void cta_end() override;
  void launch_end() override;
  void gemm(const GemmEvent& g) override;

 private:
  struct Entry {
    const void* pc;
    uintptr_t addr;
    uint32_t size;
    uint8_t flags;  // bit 0: write, bit 1: shared, bits 2..3: kind
  };
  // One thread's accesses since the last barrier. access() runs for every access of a counted
  // kernel out of the sanitizers' reach (TG_EMU_UNCHECKED, tests/emu/emu_internal.h), where GCC
  // inlines none of std::vector's checked functions: it appends through `at`, and grow() (checked,
  // out of line) makes room.
  struct Log {
    std::vector<Entry> storage;
    Entry* at = nullptr;
    size_t n = 0, capacity = 0;
  };
  static void grow(Log& log);
  void flush();  // groups the logged accesses into warp-level instructions and counts them
  static size_t merge_vector_halves(Entry* entries, size_t n);  // the entries left, in place
  // the counters of the launch's site of key (pc, flags), made where new (checked, out of line)
  SiteCounters& site(uint64_t key, const void* pc, uint8_t flags);

  std::vector<KernelCounters> launches_;
  KernelCounters* current_ = nullptr;  // launches_.back() while a launch runs
  std::vector<GemmEvent> gemms_;
  std::vector<Log> log_;  // per thread of the running CTA
  Log* log_at_ = nullptr;  // log_.data()
  std::unordered_map<uint64_t, size_t> site_index_;  // (pc, flags) -> index in the launch's sites
  // The distinct 32-byte sectors of device memory a launch touched: a bit a sector, per 4 KB
  // page, the pages last looked up kept in front of the map (a hash set of sectors allocated a
  // node for each, most of the counters cases' time under AddressSanitizer's allocator).
  class SectorSet {
   public:
    void insert(uintptr_t addr, uint32_t size);  // the sectors of [addr, addr + size)
    uint64_t count() const;
    void clear();

   private:
    using Bits = std::array<uint64_t, 2>;  // the page's 128 sectors
    uint64_t* bits(uintptr_t page);  // (zeroed where new; checked, out of line)
    std::unordered_map<uintptr_t, Bits> pages_;
    PageCache<uint64_t> cache_;  // insert() runs unchecked, as access() does
  };
  SectorSet read_sectors_, written_sectors_;
  const void* kernel_ = nullptr;
  int threads_ = 0;
};

}  // namespace emu
