// tests/emu/access_hook.h: every memory access that emulated kernel code makes, and the events
// that order them, delivered to observers (the kernel profiler of tests/emu/kernel_profiler.h,
// the race checker of tests/emu/race_checker.h: anything that needs each load and store with
// its thread and source line).
//
// How the accesses are seen. The emulator build compiles kernels/*.cu with GCC's
// -fsanitize=thread instrumentation (the Makefile's EMU_HOOK_FLAGS) but links no ThreadSanitizer
// runtime: the __tsan_read4(addr), __tsan_write16(addr), ... calls that GCC puts around every
// load and store of those files land in tests/emu/access_hook.cpp. ThreadSanitizer's pass,
// unlike AddressSanitizer's, instruments every access to a static variable (so the static
// __shared__ arrays, function-local statics here, are seen even at a constant index) and it
// sees the widths the compiler chose, so the kernel files are compiled with vectorisation and
// store merging off (-fno-tree-vectorize -fno-tree-slp-vectorize -fno-store-merging): each
// access has the width the source asks for. GCC refuses AddressSanitizer beside ThreadSanitizer
// in one file, so the hook does AddressSanitizer's check itself (the shadow memory the rest of
// the build maintains) before anything else: a kernel reading past its buffer is still
// reported at once. What those files lose is AddressSanitizer's red zones around their own
// statics and stack arrays; UndefinedBehaviorSanitizer's bounds check still covers every
// indexed array of known size there (a __shared__ tile, a register array). Why this way: the
// emulator stays one g++ build with AddressSanitizer on everything else (Clang's load / store
// tracing beside its AddressSanitizer would need the whole emulator build in clang and its
// runtime; a second g++ build with ThreadSanitizer alone would double the emulated build and
// suite), and AddressSanitizer's own out-of-line checks skip what they can prove in bounds,
// a constant index into a static array among them.
//
// The PTX wrappers the engine emulates (ldmatrix, cp.async, mma.sync) report their accesses
// from the engine: an ldmatrix.x4 is one 16-byte shared read per lane (the row that lane
// addresses), a cp.async.cg 16 is a 16-byte global read and a 16-byte shared write at issue,
// and the shared write again (CpAsyncLand) when the issuing thread's wait_group lands it. A
// wgmma's shared operands are 16-byte reads as it is issued (AsyncRead) and again as its
// wgmma.wait_group retires it (AsyncReadDone), given as the warpgroup's first thread. A TMA load
// is its global reads (one a box row) and its shared 16-byte writes as issued (BulkCopy), and
// the writes again as the box lands (BulkCopyLand).
//
// Only accesses made while a CUDA thread runs, to device memory (cudaMalloc, cudaMallocHost) or
// shared memory (the launch's dynamic shared memory, the static __shared__ arrays), reach the
// observers: the kernels' stack, the emulator's own structures and host code are left out.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace emu {

struct Thread;

enum class Space : uint8_t { Global, Shared };
enum class AccessKind : uint8_t {
  Plain,     // a load or store of C++ code
  LdMatrix,  // one row (16 bytes) of ldmatrix.x4, read for the lane that gave its address
  CpAsync,   // cp.async.cg 16: the global read, and the shared write, as issued
  CpAsyncLand,  // the same shared write as it lands (cp.async.wait_group retires its group)
  AsyncRead,    // a 16-byte chunk of a wgmma shared operand, read by the async proxy from issue ...
  AsyncReadDone,  // ... until the wgmma.wait_group that retires the operation (the same chunk)
  StMatrix,       // one row (16 bytes) of stmatrix.x4, written for the lane that gave its address
  BulkCopy,       // a TMA box: its global reads, and its shared writes (16-byte chunks), as issued
  BulkCopyLand,   // the same shared writes as the box lands (a wait on its mbarrier)
};

struct Access {
  const void* pc;        // the instruction in the kernel code (source_line(pc) names it)
  uintptr_t addr;
  uint32_t size;         // bytes
  bool write;
  Space space;
  AccessKind kind;
  const Thread* thread;  // the CUDA thread (its linear index, warp and lane)
};

// A GEMM of the cuBLAS / cuBLASLt stand-ins, as it runs.
struct GemmEvent {
  const char* who;  // the entry point
  int m, n, k, batch;
  size_t a_bytes, b_bytes, c_read_bytes, d_bytes;  // operand extents in memory (C only when beta != 0)
};

// What an observer sees, in order. Launches and CTAs run one at a time; barrier() is a
// __syncthreads that every thread of the CTA passed; warp_collective() one that all 32 lanes of a
// warp completed (__shfl_sync, ldmatrix, mma.sync).
class Observer {
 public:
  virtual ~Observer() = default;
  virtual void launch_begin(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem) = 0;
  virtual void cta_begin() {}
  virtual void access(const Access& a) = 0;
  virtual void barrier() {}
  virtual void warp_collective(int warp, const char* op) { (void)warp, (void)op; }
  virtual void mma(int warp, uint64_t flops) { (void)warp, (void)flops; }
  // The running thread saw `phases` phases of the mbarrier at `bar` completed (a test_wait or
  // try_wait that answered true); a TMA box about to land (BulkCopyLand accesses follow) that is
  // there for whoever sees `phases` phases of `bar` completed.
  virtual void mbarrier_observed(const void* bar, uint64_t phases) { (void)bar, (void)phases; }
  virtual void bulk_landing(const void* bar, uint64_t phases) { (void)bar, (void)phases; }
  // The running thread arrived on the mbarrier at `bar` in its phase `phase` (0-based: it completes
  // when `phase` + 1 phases have).
  virtual void mbarrier_arrived(const void* bar, uint64_t phase) { (void)bar, (void)phase; }
  // The running thread executed fence.proxy.async: its shared-memory writes so far are visible to
  // the async proxy (wgmma's operand reads).
  virtual void proxy_fence() {}
  // The running thread read (release false: ld.acquire.gpu, hopper::flag_wait) or is about to
  // store (release true: the store after fence.acq_rel.gpu, hopper::flag_release) the flag at
  // `flag` in device memory: an acquire and a release at GPU scope, the only order between the
  // blocks of a launch.
  virtual void flag(const void* flag, bool release) { (void)flag, (void)release; }
  virtual void cta_end() {}
  virtual void launch_end() {}
  virtual void gemm(const GemmEvent& g) { (void)g; }
  // Device memory written outside kernels as it happens (a copy, a memset, a library GEMM's
  // output, NCCL's results through copies), and an allocation about to be freed.
  virtual void device_written(const void* p, size_t n) { (void)p, (void)n; }
  virtual void device_freed(const void* p, size_t n) { (void)p, (void)n; }
};

// Observers are called in the order added. Not thread-safe: the emulator runs on one thread.
void add_observer(Observer* o);
void remove_observer(Observer* o);

// "file:line" of an instruction address in the emulated code, for reports: the kernel's own line
// (kernels/... or a test's), with the header line inlined there in parentheses, e.g.
// "kernels/flash_attn_fwd.cu:126 (cuda_bf16.hpp:254)". source_frames: every inlined frame,
// innermost first.
std::string source_line(const void* pc);
std::vector<std::string> source_frames(const void* pc);
// The first instruction address seen with pc's source location (file and line of every inlined
// frame): g++ may copy one access of the source into several branches (a store after an if /
// else, tail-duplicated), where nvcc issues one predicated instruction; the profiler counts such
// copies as the one warp-level instruction they are in the source. Two accesses of one kind on
// one line fall into one site too; while the lanes of a warp run the same path their occurrences
// still pair up one by one, so the counts do not change. pc itself when the line is unknown.
const void* source_site(const void* pc);

// ---- for the engine and the library stand-ins ------------------------------------------------
extern bool g_observed;  // some observer is registered
// A kernel access the engine performs for a PTX wrapper (pc: the wrapper's caller).
void engine_access(const void* pc, const void* p, uint32_t size, bool write, AccessKind kind);
void notify_launch_begin(const void* kernel, dim3 grid, dim3 block, size_t smem);
void notify_cta_begin();
void notify_barrier();
void notify_warp_collective(int warp, const char* op);
void notify_mma(int warp, uint64_t flops);
void notify_mbarrier_observed(const void* bar, uint64_t phases);
void notify_bulk_landing(const void* bar, uint64_t phases);
void notify_mbarrier_arrived(const void* bar, uint64_t phase);
void notify_proxy_fence();
void notify_flag(const void* flag, bool release);
void notify_cta_end();
void notify_launch_end();
void notify_gemm(const GemmEvent& g);
void notify_device_written(const void* p, size_t n);
void notify_device_freed(const void* p, size_t n);

}  // namespace emu
