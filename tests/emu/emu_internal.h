// tests/emu/emu_internal.h: what the parts of the CUDA emulator share among themselves: the
// engine that executes kernels (tests/emu/simt_emulator.cpp), the runtime API
// (tests/emu/cuda_runtime_emu.cpp) and the cuBLAS / cuBLASLt stand-ins (tests/emu/cublas_emu.cpp).
// Not for the code under test: that sees only the CUDA API.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace emu {

// A function out of the sanitizers' reach: the emulator's loops over arrays of its own, bounded by
// construction, whose element-by-element checks would cost more than the arithmetic (GCC does not
// inline a checked function into one of these, nor the other way round).
#define TG_EMU_UNCHECKED __attribute__((no_sanitize("address", "undefined")))

// The pages last looked up in a map of per-page data (key: address >> 12), direct-mapped, in front
// of the map: find() runs unchecked, inside the observers' per-access paths; a miss (null) goes to
// the map, out of line, which put()s its answer. The map must keep what the cache points at.
template <class T, size_t N = 64>
class PageCache {
 public:
  PageCache() { clear(); }
  TG_EMU_UNCHECKED T* find(uintptr_t page) const { return page_[page % N] == page ? at_[page % N] : nullptr; }
  void put(uintptr_t page, T* at) {
    page_[page % N] = page;
    at_[page % N] = at;
  }
  void clear() {
    for (size_t i = 0; i < N; ++i) page_[i] = ~uintptr_t(0), at_[i] = nullptr;
  }

 private:
  uintptr_t page_[N];
  T* at_[N];
};

// ---- the device (tests/emu/cuda_runtime_emu.cpp) -------------------------------------------
// The emulated part: an H100 SXM by default, an A100 SXM with TG_EMU_DEVICE=a100, a GeForce RTX
// 4090 with TG_EMU_DEVICE=rtx4090.
const cudaDeviceProp& device_prop();

// Makes e the device's sticky error (the first one wins) and prints "SIMT emulator: what" on
// stderr; every later runtime call returns it, as after a fault on a GPU.
void set_sticky_error(cudaError_t e, const std::string& what);
cudaError_t sticky_error();
// The error the next cudaGetLastError returns (a failed launch or call); not sticky.
void set_last_error(cudaError_t e);

// Queues fn on stream s (0 = the legacy default stream) after the work already there; it runs
// when the host synchronises with that work (maximally late, so that a missing
// synchronisation shows). `what` names the work in error reports. Returns false (and sets the
// last error) for an unknown stream.
bool enqueue(cudaStream_t s, const std::string& what, std::function<void()> fn);
// Runs everything queued on s so far (and what it depends on), as cudaStreamSynchronize.
cudaError_t synchronize(cudaStream_t s);

// Whether [p, p + bytes) lies in device-accessible memory: inside one cudaMalloc allocation
// (and outside the ranges marked with mark_no_access) or one cudaMallocHost allocation. When
// not, *why (if not null) says where the range is.
bool device_range_ok(const void* p, size_t bytes, std::string* why);
// Whether address a lies inside a cudaMalloc or cudaMallocHost allocation (the kernels' global
// memory), without the checks of device_range_ok: the memory hook's fast test.
bool device_memory(uintptr_t a);
// "byte 40 of the 4096-byte allocation at 0x...": where a device address lies, for reports.
std::string describe_device_address(const void* p);
// The description of the work the device is running (for reports): a kernel, a copy, a GEMM.
extern const char* g_device_op;

// ---- the cuBLAS / cuBLASLt stand-ins (tests/emu/cublas_emu.cpp) -----------------------------
// false: GEMMs are checked, queued and reported to observers but leave their output as it was
// (build/gpu_profile: counts need no arithmetic). true by default.
void set_gemm_arithmetic(bool on);

// ---- the engine (tests/emu/simt_emulator.cpp) -------------------------------------------------
// A barrier of `expected` arrivals; `op` names the operation the first arrival reached (all
// must reach the same one). gen counts the times it completed: a thread blocked on it runs again
// once gen moves.
struct Barrier {
  int expected = 0, arrived = 0;
  uint64_t gen = 0;
  const char* op = nullptr;
};
// A callable taken by reference for the length of one call: what std::function would be there
// without its copy (a lambda of more than two words of captures, wgmma.mma_async's, was a heap
// allocation at every thread's arrival).
class FunctionRef {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // (implicit, as std::function's constructor)
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o) { (*static_cast<std::remove_reference_t<F>*>(o))(); }) {}
  void operator()() const { call_(obj_); }

 private:
  void* obj_;
  void (*call_)(void*);
};
// The asynchronous operations of one issuer (a thread's cp.async copies, a warpgroup's wgmma
// operations): those issued and not yet committed, then the committed groups, oldest first, each
// retired whole. A retired group's storage is kept for a later one, so that issuing allocates
// nothing once the queue has been as deep before (an allocation under AddressSanitizer records
// its stack: the emulated Hopper kernels' cases spent about 5% of their time there).
template <class Op>
struct GroupQueue {
  std::vector<Op> open;
  std::deque<std::vector<Op>> groups;
  std::vector<std::vector<Op>> spare;

  void commit() {
    groups.push_back(std::move(open));
    open = take_spare();
  }
  // retire(op) for each operation of the oldest groups, oldest first, until at most n are left
  template <class F>
  void retire_until(int n, F&& retire) {
    while ((int)groups.size() > n) {
      for (Op& op : groups.front()) retire(op);
      recycle_front();
    }
  }
  // drops what is queued (a CTA's start)
  void reset() {
    while (!groups.empty()) recycle_front();
    open.clear();
  }

 private:
  std::vector<Op> take_spare() {
    if (spare.empty()) return {};
    std::vector<Op> v = std::move(spare.back());
    spare.pop_back();
    return v;
  }
  void recycle_front() {
    groups.front().clear();
    spare.push_back(std::move(groups.front()));
    groups.pop_front();
  }
};
// For instructions emulated outside the engine's file (tests/emu/hopper_emu.cpp), from a running
// kernel thread: rendezvous arrives at b (all b.expected threads must reach the same op; the last
// one runs on_last before any is released); block_until_next blocks the thread until b.gen
// moves (b.op names the wait in a deadlock report: when every live thread of the CTA is blocked,
// the launch fails as deadlocked); cta_thread is the CTA's thread of that linear index.
void rendezvous(Barrier& b, const char* op, FunctionRef on_last);
void block_until_next(Barrier& b);
struct Thread;
Thread& cta_thread(int linear);
// Called by the engine as each CTA begins (tests/emu/hopper_emu.cpp: mbarriers, warpgroups).
void hopper_cta_begin(int nthreads);
// Runs a whole grid now (called by the work a launch queued). A fault sets the sticky error.
void run_grid(const void* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body);
// The kernel's name (demangled, from the executable's symbol table) or its address.
std::string kernel_name(const void* kernel);
// Whether address a lies in a function-local static object of the executable: in kernel code,
// a static __shared__ array (the memory hook's test for static shared memory).
bool static_shared(uintptr_t a);
// Whether address a lies on the running kernel thread's own stack (its locals: never shared or
// device memory; the memory hook's quick answer for them).
bool on_own_stack(uintptr_t a);
// Order of warps and lanes in a CTA: 0 = ascending in even CTAs, descending in odd ones; 1 = the
// reverse. Launches and CTAs run so far.
void set_schedule(int s);
long long launch_count();

}  // namespace emu
