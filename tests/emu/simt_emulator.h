// tests/emu/simt_emulator.h: the device side of train_gpt's CUDA emulator. It lets g++ compile
// the UNMODIFIED CUDA sources (kernels/*.cu, model/*.cu, train_gpt.cu, tests/gpu/*.cu) as C++
// and execute their kernels on the CPU, so that the whole CUDA backend runs, and is tested,
// on a machine without a GPU (make train_gpt_emu, make test).
//
// The emulator build compiles every CUDA translation unit with
//   g++ -x c++ -DTG_SIMT_EMULATION -include tests/emu/simt_emulator.h -Itests/emu/include
//       -I$(CUDA_HOME)/include -fsanitize=address,undefined
// so this header comes first. It provides:
//   - the CUDA built-ins the kernels use: threadIdx / blockIdx / blockDim / gridDim,
//     __syncthreads, __syncwarp, __shfl_sync, __shfl_xor_sync, __ballot_sync, __any_sync,
//     __all_sync; `__shared__` arrays become function-local statics (one copy per kernel, shared
//     by the threads of the running CTA: CTAs run one at a time); gpu::dynamic_smem<T>() is the
//     launch's dynamic shared memory;
//   - emu::launch_kernel, what gpu::launch (kernels/cuda_common.cuh) calls in place of
//     kernel<<<grid, block, smem, stream>>>(args);
//   - in gpu::flash, the PTX wrappers of kernels/flash_attn_common.cuh (cp.async, ldmatrix,
//     mma.sync m16n8k16 bf16), emulated warp-wide as the PTX ISA specifies them; in gpu::hopper,
//     those of kernels/hopper_ptx.cuh (mbarrier, wgmma), emulated by tests/emu/hopper_emu.cpp.
// The CUDA runtime API (tests/emu/cuda_runtime_emu.cpp), cuBLAS / cuBLASLt
// (tests/emu/cublas_emu.cpp) and NCCL (tests/emu/nccl_emu.cpp, tests/emu/include/nccl.h) are
// replaced at link time and include time. The engine is tests/emu/simt_emulator.cpp; its header comment
// says what is faithful and what the emulator cannot show.
#pragma once
#ifndef TG_SIMT_EMULATION
#error "tests/emu/simt_emulator.h is the emulator build's forced include (-DTG_SIMT_EMULATION)"
#endif

// A static __shared__ array is one object per kernel that all threads of a CTA share: a
// function-local static (the memory hook, tests/emu/access_hook.h, knows them from the
// executable's symbol table). Defined before the CUDA headers, which then leave it alone.
#define __shared__ static

#include <cuda.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hw_rounding.h"

#undef __launch_bounds__
#define __launch_bounds__(...)

namespace emu {

// A CUDA thread of the running CTA (the engine's fiber extends it).
struct Thread {
  uint3 tid;   // threadIdx
  int linear;  // x + y * blockDim.x + z * blockDim.x * blockDim.y
  int lane;    // linear % 32
  int warp;    // linear / 32
};

// The running thread (null on the host), block and launch shape, dynamic shared memory.
extern Thread* g_thread;
extern uint3 g_block_idx;
extern dim3 g_grid_dim, g_block_dim;
extern unsigned char* g_smem;
extern size_t g_smem_bytes;

// A fault of the running kernel (an access outside shared memory, a misaligned address, a
// barrier or warp collective used wrongly): the CTA is abandoned and the error becomes the
// device's sticky error, with `what` printed once. Never returns.
[[noreturn]] void device_fault(cudaError_t code, const std::string& what);

// __syncthreads, and one warp collective: every lane of the warp arrives with `bits`, and
// gets back the bits of lane src_lane(lane) (a full mask only).
void syncthreads();
uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane, const char* op);
// vote.sync.ballot: bit l of the result is lane l's predicate, in every lane (full warps only)
uint32_t warp_ballot(unsigned mask, bool pred, const char* op);

// Kernel launches (gpu::launch): the configuration is checked as the runtime checks it (the
// error is returned by the next cudaGetLastError), pointer arguments must be device or pinned
// memory, and the grid is queued on the stream; it runs when the host synchronises with it.
void launch(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, std::function<void()> body);
void check_kernel_pointer(const void* kernel, int index, const void* p);

template <typename Tuple, size_t... I>
void check_pointers(const void* kernel, const Tuple& t, std::index_sequence<I...>) {
  auto one = [kernel](int index, const auto& v) {
    if constexpr (std::is_pointer_v<std::decay_t<decltype(v)>>) check_kernel_pointer(kernel, index, (const void*)v);
  };
  (one((int)I, std::get<I>(t)), ...);
}

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  // the arguments are copied at the launch, converted to the parameter types as by a call
  using Packed = std::tuple<std::decay_t<Params>...>;
  auto packed = std::make_shared<Packed>(std::forward<Args>(args)...);
  check_pointers((const void*)kernel, *packed, std::index_sequence_for<Params...>{});
  launch((const void*)kernel, grid, block, smem, stream, [kernel, packed] { std::apply(kernel, *packed); });
}

// Marks [p, p + bytes) of a device allocation as never to be accessed (model/net/gpt_cuda.cu's gaps
// between the regions it carves out of one allocation): a kernel touching it is reported.
void mark_no_access(const void* p, size_t bytes);

// The flash kernels' PTX, emulated (see tests/emu/simt_emulator.cpp).
uint32_t smem_offset(const void* p, const char* op);
void cp_async_16(void* dst, const void* src, bool valid);
void cp_async_commit();
void cp_async_wait(int n);
void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans);
void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

// The Hopper PTX of kernels/hopper_ptx.cuh, emulated (see tests/emu/hopper_emu.cpp). a: the
// thread's A fragment (4 registers) or null for A from desc_a; d: its N / 2 accumulators, written
// when the wgmma.wait_group that retires the operation runs.
void mbarrier_init(void* bar, uint32_t count);
uint64_t mbarrier_arrive(void* bar);
uint64_t mbarrier_arrive_expect_tx(void* bar, uint32_t bytes);
void mbarrier_expect_tx(void* bar, uint32_t bytes);
void mbarrier_complete_tx(void* bar, uint32_t bytes);
bool mbarrier_test_wait_parity(void* bar, uint32_t parity);
bool mbarrier_try_wait_parity(void* bar, uint32_t parity);
void wgmma_fence();
void wgmma_mma_async(float* d, int n, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, bool trans_a, bool trans_b,
                     bool accumulate);
void wgmma_commit_group();
void wgmma_wait_group(int n);
void tma_load_2d(void* dst, const void* map, int c0, int c1, void* bar);
void stmatrix_x4(const uint32_t (&r)[4], uint32_t addr, bool trans);
bool elect_sync();
void fence_proxy_async();
void flag_wait(const int* flag, int value);
void flag_release(int* flag, int value);
int flag_peek(const int* flag);
void flag_handover(int* release, int value, const int* peeked);
// setmaxnreg.{inc,dec}.sync.aligned.u32 (tests/emu/hopper_emu.cpp), and the registers a thread
// that a block of nthreads starts with there
void setmaxnreg(bool inc, uint32_t count);
int setmaxnreg_entry_count(int nthreads);

template <typename V>
inline V shfl(unsigned mask, V v, int src_lane, const char* op) {
  static_assert(sizeof(V) <= sizeof(uint64_t) && std::is_trivially_copyable_v<V>,
                "shuffled values are at most 64 bits");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  bits = warp_exchange(mask, bits, src_lane, op);
  V r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

}  // namespace emu

// ---- the CUDA built-ins ------------------------------------------------------------------------
#define threadIdx (emu::g_thread->tid)
#define blockIdx (emu::g_block_idx)
#define blockDim (emu::g_block_dim)
#define gridDim (emu::g_grid_dim)

inline void __syncthreads() { emu::syncthreads(); }
// a warp collective with nothing exchanged: every lane of the warp arrives before any leaves, and
// the race checker orders the lanes' accesses across it
inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)emu::warp_exchange(mask, 0, emu::g_thread->lane, "__syncwarp"); }
template <typename V>
inline V __shfl_sync(unsigned mask, V v, int src_lane, int width = 32) {
  if (width != 32) emu::device_fault(cudaErrorLaunchFailure, "__shfl_sync with width != 32 is not emulated");
  return emu::shfl(mask, v, src_lane & 31, "__shfl_sync");
}
template <typename V>
inline V __shfl_xor_sync(unsigned mask, V v, int lane_mask, int width = 32) {
  if (width != 32) emu::device_fault(cudaErrorLaunchFailure, "__shfl_xor_sync with width != 32 is not emulated");
  return emu::shfl(mask, v, (emu::g_thread->lane ^ lane_mask) & 31, "__shfl_xor_sync");
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return emu::warp_ballot(mask, pred != 0, "__ballot_sync"); }
inline int __any_sync(unsigned mask, int pred) { return emu::warp_ballot(mask, pred != 0, "__any_sync") != 0u; }
inline int __all_sync(unsigned mask, int pred) { return emu::warp_ballot(mask, pred != 0, "__all_sync") == 0xffffffffu; }
using std::max;  // the device code's global min / max
using std::min;

// __umulhi (kernels/philox.h's mulhilo): the high word of the 32 x 32-bit product
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }

namespace gpu {

// The device math functions the kernels call (found before ::expf and the others by unqualified
// lookup from namespace gpu): the host's libm, moved by up to the CUDA C++ Programming Guide's
// maximum ulp error in the hardware-rounding mode (tests/emu/hw_rounding.h).
inline float expf(float x) { return emu::hw_rounding_block() ? emu::device_math(::expf(x), x, 2, 1) : ::expf(x); }
inline float exp2f(float x) { return emu::hw_rounding_block() ? emu::device_math(::exp2f(x), x, 2, 2) : ::exp2f(x); }
inline float logf(float x) { return emu::hw_rounding_block() ? emu::device_math(::logf(x), x, 1, 3) : ::logf(x); }
inline float erfcf(float x) { return emu::hw_rounding_block() ? emu::device_math(::erfcf(x), x, 4, 4) : ::erfcf(x); }
// ex2.approx.ftz.f32 (kernels/flash_attn_common.cuh's exp2_ftz): exp2f's value, with an input below
// 2^-126 in magnitude read as zero and a result below 2^-126 flushed to zero
inline float exp2_ftz(float x) {
  const float y = exp2f(std::fabs(x) < FLT_MIN ? 0.f : x);
  return y < FLT_MIN ? 0.f : y;
}

// The launch's dynamic shared memory (kernels/cuda_common.cuh declares it under nvcc).
template <typename T>
inline T* dynamic_smem() {
  return reinterpret_cast<T*>(emu::g_smem);
}

namespace flash {
// The PTX wrappers of kernels/flash_attn_common.cuh (its hardware section is left out).
inline uint32_t smem_u32(const void* p) { return emu::smem_offset(p, "smem_u32"); }
__attribute__((always_inline)) inline void cp_async_16(void* smem, const void* gmem, bool valid) { emu::cp_async_16(smem, gmem, valid); }
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  emu::cp_async_wait(N);
}
__attribute__((always_inline)) inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix_x4(r, addr, false); }
__attribute__((always_inline)) inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { emu::ldmatrix_x4(r, addr, true); }
inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma_bf16_16816(d, a, b0, b1);
}
}  // namespace flash

namespace hopper {
// The PTX wrappers of kernels/hopper_ptx.cuh (its hardware section is left out).
inline uint32_t smem_u32(const void* p) { return emu::smem_offset(p, "smem_u32"); }
inline void mbarrier_init(uint64_t* bar, uint32_t count) { emu::mbarrier_init(bar, count); }
inline void fence_mbarrier_init() {}  // the emulated mbarrier is visible at once
inline uint64_t mbarrier_arrive(uint64_t* bar) { return emu::mbarrier_arrive(bar); }
inline uint64_t mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) { return emu::mbarrier_arrive_expect_tx(bar, bytes); }
inline void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) { emu::mbarrier_expect_tx(bar, bytes); }
inline void mbarrier_complete_tx(uint64_t* bar, uint32_t bytes) { emu::mbarrier_complete_tx(bar, bytes); }
inline bool mbarrier_test_wait_parity(uint64_t* bar, uint32_t parity) { return emu::mbarrier_test_wait_parity(bar, parity); }
inline bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) { return emu::mbarrier_try_wait_parity(bar, parity); }
__attribute__((always_inline)) inline void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  emu::tma_load_2d(dst, map, c0, c1, bar);
}
__attribute__((always_inline)) inline void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) { emu::stmatrix_x4(r, addr, false); }
__attribute__((always_inline)) inline void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) { emu::stmatrix_x4(r, addr, true); }
inline bool elect_one() { return emu::elect_sync(); }
inline void fence_proxy_async() { emu::fence_proxy_async(); }
inline void flag_wait(const int* flag, int value) { emu::flag_wait(flag, value); }
inline void flag_release(int* flag, int value) { emu::flag_release(flag, value); }
inline int flag_peek(const int* flag) { return emu::flag_peek(flag); }
inline void flag_handover(int* release, int value, const int* peeked) { emu::flag_handover(release, value, peeked); }
inline void wgmma_fence() { emu::wgmma_fence(); }
template <int Count>
inline void setmaxnreg_inc() {
  emu::setmaxnreg(true, Count);
}
template <int Count>
inline void setmaxnreg_dec() {
  emu::setmaxnreg(false, Count);
}
inline void wgmma_commit_group() { emu::wgmma_commit_group(); }
template <int N>
inline void wgmma_wait_group() {
  emu::wgmma_wait_group(N);
}
template <int N, int TransA = 0, int TransB = 0>
__attribute__((always_inline)) inline void wgmma_bf16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128 || N == 256, "wgmma m64nNk16: N not wrapped");
  emu::wgmma_mma_async(d, N, nullptr, desc_a, desc_b, TransA != 0, TransB != 0, accumulate);
}
template <int N, int TransB = 0>
__attribute__((always_inline)) inline void wgmma_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128 || N == 256, "wgmma m64nNk16: N not wrapped");
  emu::wgmma_mma_async(d, N, a, 0, desc_b, false, TransB != 0, accumulate);
}
}  // namespace hopper

}  // namespace gpu
