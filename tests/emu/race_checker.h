// tests/emu/race_checker.h: racecheck and initcheck of shared memory, on the memory hook
// (tests/emu/access_hook.h), as compute-sanitizer's racecheck and initcheck define them.
//
// Order. Within a CTA, two accesses are ordered when they are the same thread's (program order),
// when a __syncthreads lies between them, when both threads are lanes of one warp and a warp
// collective (__shfl_sync, ldmatrix, mma.sync) completed between them, or through mbarriers: an
// mbarrier arrival after the first access whose phase the second thread then saw complete
// (a test_wait or try_wait that answered true), directly or by a chain of such arrivals and
// waits (vector clocks). Lanes of a warp are not
// ordered by being in one warp: since Volta each thread has its own program counter. A warp
// collective orders its lanes among themselves only: one lane's arrival after it does not carry
// the other lanes' accesses to another warp (compute-sanitizer's racecheck does not either: on
// an H200 it named that pattern a hazard), so each thread an arrival is to order arrives itself.
//
// Hazards, each a device fault at once (the kernel, block, both threads and both source lines):
//   - read-after-write, write-after-read, write-after-write: two unordered accesses to one byte of
//     shared memory (dynamic, or a static __shared__ array) by different threads, one a write;
//   - a cp.async destination touched in flight: the 16 bytes a cp.async.cg writes land when the
//     issuing thread's cp.async.wait_group retires its group; any access to them before that,
//     by any thread (the issuer included), reads or overwrites what the copy will change;
//   - a TMA destination touched in flight: a box's bytes land when a thread waits on the
//     mbarrier its bytes complete on (the emulator lands them then); any access before that reads
//     or overwrites what the box will change. A landed box is ordered before a thread's access
//     when that thread has seen the mbarrier's phase complete (a test_wait or try_wait that
//     answered true) or a __syncthreads lies between, or when an arrival of a thread that had
//     seen it reached this thread (below);
//   - a wgmma operand written through the generic proxy (a thread's store, a cp.async landing) that
//     its writer did not follow with fence.proxy.async before the wgmma read it: the async proxy
//     need not see such a write (PTX ISA, "Memory Consistency Model: Proxies"; wgmma's operand
//     reads are async-proxy reads). A TMA box is written by the async proxy itself;
//   - a wgmma operand overwritten in flight: the async proxy reads a wgmma's shared operands
//     between its issue and the wgmma.wait_group that retires it; any write to them in between,
//     by any thread (a cp.async landing included), changes what it multiplies. Its reads at issue
//     are checked as reads of the warpgroup's first thread (initcheck, and a write that no
//     __syncthreads, or program order of that thread, orders before them). Its retirement is
//     kept as a read of that thread at its wait_group: a write after it must be ordered after that
//     wait (by the warpgroup's own threads, each past its wait_group; another thread through a
//     __syncthreads or an arrival of the first thread's after the wait), so that a stage released
//     before the product reading it retires is named whatever order the threads ran in;
//   - initcheck: a read of a shared byte that nothing wrote since the CTA began (shared memory
//     has no initial value; the emulator fills it with 0xFF, NaN in fp32 and bf16), and a
//     kernel's read of device memory that nothing wrote since the checker began (a kernel, a
//     copy, a memset, a library GEMM's output): the checker starts before the first allocation
//     when the environment asks for it, and a test creates it before its buffers.
//   - global memory: two CTAs of one launch on one byte of device memory, one of them writing
//     (read-after-write, write-after-read, write-after-write), unless a flag orders them: the
//     emulator runs the CTAs one after another, so such a race would look correct here. The
//     one order between CTAs is a flag (kernels/hopper_ptx.cuh, flag_release and flag_wait),
//     used as its comment says: a CTA's accesses that a __syncthreads orders before its release
//     on a flag are ordered before the acquiring thread's later accesses, and, after its CTA's
//     next __syncthreads, every thread's; what the releasing CTA had acquired passes on with
//     it. (A release orders nothing of its own thread's that no __syncthreads orders before it:
//     stricter than the PTX ISA, never laxer.) A
//     byte a CTA both reads and writes is the CTA's own business (its threads are ordered by the
//     shared-memory rules above only where they share memory; the kernels' global writes are
//     their outputs, each element by one thread, or the fused Hopper backward's dQ sums, which
//     its flags order).
//
// make test runs every kernel of a training step under it, both attention paths, bf16 and fp32,
// the flash kernels through several key tiles (tests/emu/test_race_checker.cpp).
// TG_EMU_RACECHECK=1 turns it on for a whole process (build/test_emu, train_gpt_emu): the
// emulated suite passes so, in about 3x its time. TG_EMU_RACECHECK_KERNELS=FILE beside it appends
// to FILE, at the process's exit, the demangled name of every kernel it checked, a line each: make
// test holds train_gpt_emu's runs (training, evaluation, sampling with the KV cache, both
// attention paths and precisions) to cover every kernel of the build
// (tests/emu/test_emu_cli.cpp).
#pragma once
#include <climits>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "access_hook.h"
#include "emu_internal.h"

namespace emu {

class RaceChecker : public Observer {
 public:
  RaceChecker();
  ~RaceChecker() override;
  RaceChecker(const RaceChecker&) = delete;
  RaceChecker& operator=(const RaceChecker&) = delete;

  void launch_begin(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem) override;
  void cta_begin() override;
  void access(const Access& a) override;
  void barrier() override;
  void warp_collective(int warp, const char* op) override;
  void device_written(const void* p, size_t n) override;
  void device_freed(const void* p, size_t n) override;
  void mbarrier_observed(const void* bar, uint64_t phases) override;
  void bulk_landing(const void* bar, uint64_t phases) override;
  void mbarrier_arrived(const void* bar, uint64_t phase) override;
  void proxy_fence() override;
  void flag(const void* flag, bool release) override;

  // the demangled names of the kernels launched under the checker so far, each once
  const std::vector<std::string>& kernel_names() const { return kernel_names_; }

  // One access as the checker keeps it (24 bytes: a shared byte's cell holds four).
  struct Stamp {
    int32_t thread = -1;  // linear index in the CTA; -1: none; kLanded: a TMA box (collective: its landing)
    uint32_t barrier = 0;  // barrier epoch of the CTA when it happened
    uint32_t collective = 0;  // the warp's collective epoch then
    int32_t pc = kNoPc;     // the access's code address, as pc_code gives it (pc_of reads it back)
    uint32_t arrivals = 0;  // the thread's events before it (its own clock entry; see clock_)
    uint32_t fences = 0;    // the thread's fence.proxy.async before it
  };
  struct Cell {  // one byte of shared memory; what every access reads first, first
    uint32_t cta = 0;  // the CTA the rest belongs to (older: as if empty)
    bool written = false;         // written since the CTA began
    bool in_flight_bulk = false;  // in_flight is a TMA box's, not a cp.async's
    bool retired1 = false, retired2 = false;  // read1 / read2 is a wgmma's retirement (its warpgroup's)
    Stamp write, read1, read2;  // the last write; two reads since it, by different threads
    Stamp in_flight;            // a cp.async issued to this byte and not landed
  };
  // A 16-byte chunk of the dynamic shared memory as wgmma operands read it: the async proxy reads
  // whole chunks (hopper_emu.cpp's AsyncRead and AsyncReadDone), so a chunk's count stands for
  // each of its bytes, and a retirement is one update, not sixteen.
  struct AsyncChunk {
    uint32_t cta = 0;    // as Cell's
    uint32_t reads = 0;  // wgmma operations reading it, issued and not retired
    Stamp reader;        // the last wgmma issued that reads it
  };
  // A code address as its offset from racecheck_from_env's (the kernels and the emulator are
  // linked into one executable, so it fits in 32 bits); kNoPc where it does not (named "?").
  static constexpr int32_t kNoPc = INT32_MIN;
  static int32_t pc_code(const void* pc);
  static const void* pc_of(int32_t code);

 private:
  // Every shared and global access of a checked kernel runs access() over each of its bytes: the
  // functions on that path run out of the sanitizers' reach (TG_EMU_UNCHECKED,
  // tests/emu/emu_internal.h), and, since GCC inlines no checked function into them (std::vector's
  // operator[] included), read the vectors below through the raw views that follow them; what is
  // rare (static __shared__ bytes, mbarrier clocks, TMA landings, a page not yet seen, another
  // CTA's accesses, the reports) goes to checked functions out of line.
  Cell& cell(uintptr_t a);
  Cell& static_cell(uintptr_t a);
  bool ordered(const Stamp& earlier, int thread) const;
  bool landed_ordered(const Stamp& earlier, int thread) const;
  bool clock_knows(int thread, size_t slot, uint32_t above) const;
  uint32_t clock_arrivals(int thread) const;
  // ordering_helps: the earlier access is a thread's, which a __syncthreads would order (not an
  // operation still in flight)
  [[noreturn]] void hazard(const char* what, uintptr_t a, const Stamp& earlier, const Access& now,
                           bool ordering_helps = true);

  // Global memory within one launch: per byte, the epoch (below) of the last write and of the
  // first read since, kSeveral set on the read when other CTAs read it too that it was not
  // ordered before; 0: none. An epoch is a stretch of one CTA between two of its __syncthreads:
  // epochs_[e] is that CTA's ordinal in the launch (from 1) and its __syncthreads count then.
  // 8 bytes a byte of memory, where a CTA and a count for each access took 16: the cells are most
  // of the checker's memory traffic.
  struct GlobalCell {
    uint32_t writer = 0, reader = 0;
  };
  struct Epoch {
    uint32_t cta = 0, barriers = 0;
  };
  std::vector<Epoch> epochs_;  // [0]: none
  // What a CTA knows of earlier CTAs: per CTA ordinal, its accesses before how many of its
  // __syncthreads are ordered before (a release carries the releasing CTA's count then).
  using Known = std::unordered_map<uint32_t, uint32_t>;
  static void learn(Known& into, const Known& from);
  // Whether an access of CTA `cta` after `barriers` of its __syncthreads is ordered before the
  // running thread's access: the same CTA, or one whose release after a later __syncthreads it
  // has acquired (its CTA, before one of its own __syncthreads; or the thread itself).
  bool global_ordered(uint32_t cta, uint32_t barriers, int thread) const;
  bool global_ordered(uint32_t epoch, int thread) const;
  // the running CTA's knowledge after its __syncthreads, and per thread what it acquired since
  // the last one; per flag, what its last release carries
  Known after_;
  std::unordered_map<int, Known> acquired_;
  std::unordered_map<uintptr_t, Known> flag_released_;
  static constexpr uint32_t kSeveral = 1u << 31;
  void global_access(const Access& a);
  [[noreturn]] void global_hazard(const char* what, uintptr_t a, uint32_t other, const Access& now);
  [[noreturn]] void global_uninitialised(const Access& a);  // initcheck's report
  // The cells of a 4 KB page of device memory: the launch's pages by page number, taken from a
  // pool kept across launches (pages_, the first pages_used_ of them this launch's), so that a
  // launch reuses the memory of the last one's instead of allocating it anew; a direct-mapped
  // cache of the last pages looked up in front of the map.
  static constexpr size_t kPageCells = 4096;
  GlobalCell* global_page(uintptr_t page);
  GlobalCell* global_page_miss(uintptr_t page);
  std::unordered_map<uintptr_t, GlobalCell*> global_;
  std::vector<std::vector<GlobalCell>> pages_;
  size_t pages_used_ = 0;
  PageCache<GlobalCell> page_cache_;
  std::vector<uint3> ctas_;  // the block index of each CTA of the launch, by ordinal - 1

  std::vector<Cell> dynamic_;                  // one per byte of the largest dynamic shared memory
  std::vector<AsyncChunk> async_;              // one per 16 bytes of it
  AsyncChunk* async_chunk(uintptr_t a);        // a's chunk, or null outside the dynamic shared memory
  std::unordered_map<uintptr_t, Cell> static_;  // the static __shared__ bytes touched
  std::vector<uint32_t> collective_;           // per warp of the CTA
  // TMA boxes landed in this CTA: the mbarrier and the phases completed that make each visible;
  // per thread, the phases it saw completed of each mbarrier
  static constexpr int32_t kLanded = -2;
  std::vector<std::pair<uintptr_t, uint64_t>> landings_;
  std::vector<std::unordered_map<uintptr_t, uint64_t>> seen_;
  // mbarrier ordering (once a thread of the CTA arrives on one): a vector clock per thread,
  // entry u the events of thread u it has acquired (its own: its events so far; an event is an
  // arrival or a warp collective), then one entry per landed TMA box (1: it knows the box
  // landed). An arrival releases the arriver's clock into its phase; a thread that sees phases
  // completed acquires the clocks of their arrivals; a warp collective joins its lanes' clocks.
  // So an access is ordered before another thread's when an event after it reached that thread,
  // through arrivals and waits (and warp collectives on the way).
  using Clock = std::vector<uint32_t>;
  std::vector<Clock> clock_;                                  // per thread; empty: no arrival yet
  std::unordered_map<uintptr_t, std::vector<Clock>> released_;  // per mbarrier, per phase: the
                                                               // arrivals' clocks, with the earlier phases'
  int nthreads_ = 0;
  // per thread, the fence.proxy.async it has executed in this CTA
  std::vector<uint32_t> fences_;
  static void join(Clock& into, const Clock& from);
  // device memory written since the checker began: a bit a byte, per 4 KB page
  mutable std::unordered_map<uintptr_t, std::vector<uint64_t>> written_;
  // the bits of page `page`, made (all clear) if `make`, else null where no byte of it was ever
  // written; a direct-mapped cache of the pages last found in front of the map (which never
  // drops a page, so the pointers stay valid)
  uint64_t* written_page(uintptr_t page, bool make) const;
  uint64_t* written_page_miss(uintptr_t page, bool make) const;
  mutable PageCache<uint64_t> written_cache_;
  void mark_written(uintptr_t a, size_t n, bool on);
  bool all_written(uintptr_t a, uint32_t n) const;
  std::unordered_set<const void*> kernels_;
  std::vector<std::string> kernel_names_;
  uint64_t cta_ = 0;
  uint32_t barrier_ = 0;
  int bx_ = 1, by_ = 1;

  // the raw views of the hot path (above), set again wherever their vectors change
  Cell* dynamic_at_ = nullptr;
  AsyncChunk* async_at_ = nullptr;
  uint32_t* collective_at_ = nullptr;
  uint32_t* fences_at_ = nullptr;
  const Epoch* epochs_at_ = nullptr;
  uint32_t nepochs_ = 0;    // epochs_.size()
  uint32_t nctas_ = 0;      // ctas_.size(): the running CTA's ordinal
  uint32_t nlandings_ = 0;  // landings_.size()
  bool clocked_ = false;    // !clock_.empty()
  void sync_epochs() {
    epochs_at_ = epochs_.data();
    nepochs_ = (uint32_t)epochs_.size();
  }
};

// Registers one RaceChecker for the rest of the process when the environment sets
// TG_EMU_RACECHECK (to anything but 0), and with TG_EMU_RACECHECK_KERNELS the list of the kernels
// it checked written at exit; the runtime calls it before the first launch.
void racecheck_from_env();

}  // namespace emu
