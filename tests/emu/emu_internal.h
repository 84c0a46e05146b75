// tests/emu/emu_internal.h: what the parts of the CUDA emulator share among themselves: the
// engine that executes kernels (tests/emu/simt_emulator.cpp), the runtime API
// (tests/emu/cuda_runtime_emu.cpp) and the cuBLAS / cuBLASLt stand-ins (tests/emu/cublas_emu.cpp).
// Not for the code under test: that sees only the CUDA API.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace emu {

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
// For instructions emulated outside the engine's file (tests/emu/hopper_emu.cpp), from a running
// kernel thread: rendezvous arrives at b (all b.expected threads must reach the same op; the last
// one runs on_last before any is released); block_until_next blocks the thread until b.gen
// moves (b.op names the wait in a deadlock report: when every live thread of the CTA is blocked,
// the launch fails as deadlocked); cta_thread is the CTA's thread of that linear index.
void rendezvous(Barrier& b, const char* op, const std::function<void()>& on_last);
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
