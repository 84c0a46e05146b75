// kernels/hopper_ptx.cuh: thin wrappers of the Hopper (sm_90a) PTX that the Hopper attention
// kernels are built on. Device helpers only, no launcher. Under the emulator build
// (TG_SIMT_EMULATION) tests/emu/simt_emulator.h supplies the hardware section, and
// tests/emu/hopper_emu.cpp executes the instructions as the PTX ISA defines them.
//
//   - mbarrier (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier"):
//     a 64-bit object in shared memory with an expected arrival count, a pending arrival count,
//     a transaction count (tx-count, in bytes) and a phase. init sets pending = expected = count,
//     tx-count 0, phase 0. arrive takes one pending arrival; expect_tx adds to tx-count;
//     complete_tx (what a bulk copy does as its bytes land) takes from it. The current phase
//     completes when pending arrivals reach 0 and tx-count is 0: the phase parity flips and
//     pending arrivals are reset to the expected count. test_wait.parity(P) and try_wait.parity(P)
//     are true once the phase of parity P has completed, i.e. while the current phase's parity
//     is not P (so P = 1 passes on a fresh mbarrier: the phase before phase 0 counts as done);
//     try_wait may first wait a while, test_wait answers at once.
//   - wgmma (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions"):
//     a warpgroup (4 consecutive warps, the first a multiple of 4) computes
//     D (64 x N, fp32) = A (64 x 16, bf16) B (16 x N, bf16) + (accumulate ? D : 0), A from
//     registers or shared memory, B from shared memory, each shared operand named by a 64-bit
//     matrix descriptor (make_smem_desc). The instruction is asynchronous: wgmma.fence before
//     the first wgmma that touches registers other code accessed, commit_group closes a group
//     of issued wgmmas, wait_group N waits until at most N groups are pending; only then may the
//     accumulators be read and the shared operands be overwritten.
//   - TMA (PTX ISA, "Data Movement and Conversion Instructions: cp.async.bulk.tensor"): one
//     thread copies a box of a 2-D tensor, described by a CUtensorMap (cuTensorMapEncodeTiled:
//     element type, global address, dimensions, row stride in bytes, box size, swizzle), from
//     global to shared memory at the box's coordinates (innermost first, in elements). The box
//     lands as boxDim[1] rows of boxDim[0] elements, row after row, the swizzle applied to the
//     shared addresses; elements outside the tensor read as zero. Its bytes complete_tx on the
//     mbarrier given: the box is there once a phase that expected those bytes has completed.
//   - fence.proxy.async: makes this thread's earlier shared-memory writes of the generic proxy
//     (ordinary stores) visible to the async proxy (wgmma's operand reads, bulk copies).
//
// Register fragments (PTX ISA, "Register Fragments and Shared Memory Matrix Layouts", wgmma
// .m64nNk16), with w = warp % 4 in the warpgroup, g = lane / 4, t = lane % 4:
//   D (64 x N, fp32), N / 2 registers: d[4j + 2h + c] = D[16w + 8h + g][8j + 2t + c]
//                                       (j = 0 .. N/8 - 1, h, c in {0, 1});
//   A (64 x 16, bf16), 4 registers of two bf16 (lower k in the low half), as mma.m16n8k16's A
//   for the warp's 16 rows: a0 = A[16w+g][2t, 2t+1], a1 = A[16w+g+8][2t, 2t+1],
//                           a2 = A[16w+g][2t+8, 2t+9], a3 = A[16w+g+8][2t+8, 2t+9].
//
// Shared operands (PTX ISA, "Matrix Descriptor Format" and "Shared Memory Matrix Layout"): a
// core matrix is 8 rows of 16 bytes (8 bf16). For an operand of MN x K (A: M = 64 by K = 16,
// B: N by K = 16), the byte offset of element (mn, k) before the swizzle is, with W the swizzle
// width (32, 64 or 128 bytes) and E = W / 2 the bf16 per swizzle row:
//   K-major  (transpose 0), no swizzle:  (mn/8) SBO + (k/8) LBO + (mn%8) 16 + (k%8) 2
//   K-major, swizzled:                   (mn/8) SBO + (mn%8) W + k 2           (LBO unused)
//   MN-major (transpose 1), no swizzle:  (mn/8) SBO + (k/8) LBO + (k%8) 16 + (mn%8) 2
//   MN-major, swizzled:                  (mn/E) LBO + (k/8) SBO + (k%8) W + (mn%E) 2
// plus the descriptor's start address; then the swizzle of width W permutes the 16-byte chunks
// of the shared address: bits [4, 4 + log2(W/16)) are XORed with the bits above bit 7 of the
// same count (the pattern repeats every 8 W bytes: a swizzled tile starts on such a boundary).
#pragma once
#include <cuda.h>  // CUtensorMap (made on the host by the driver's cuTensorMapEncodeTiled)
#include <cuda_runtime.h>

#include <cstdint>

namespace gpu {
namespace hopper {

// The swizzle mode of a matrix descriptor (bits 62-63), as the PTX ISA numbers it.
enum class Swizzle : uint32_t { None = 0, B128 = 1, B64 = 2, B32 = 3 };

// The wgmma matrix descriptor of a shared operand: start address (bits 0-13), leading
// dimension byte offset (16-29) and stride dimension byte offset (32-45), each stored >> 4; the
// matrix base offset (49-51) is 0 (tiles start on their swizzle pattern's boundary); the swizzle
// mode (62-63). smem_addr is the shared address (smem_u32).
__host__ __device__ constexpr uint64_t make_smem_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                                      Swizzle swizzle) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | (uint64_t)((lbo_bytes & 0x3FFFF) >> 4) << 16 |
         (uint64_t)((sbo_bytes & 0x3FFFF) >> 4) << 32 | (uint64_t)swizzle << 62;
}

// The descriptor d with its start address moved on by `bytes` (a multiple of 16): make_smem_desc
// of the moved address, in one 32-bit add. Shared addresses stay below 2^18 (228 KB at most), so
// the start address field (bits 0-13) never carries into the bits above it. The k-steps of a
// product over a K-major tile take their descriptors this way from one made per tile, where each
// made its own (masks and shifts in the uniform datapath, about 13 instructions a wgmma in the
// dK / dV kernel's SASS).
__host__ __device__ constexpr uint64_t desc_advance(uint64_t d, uint32_t bytes) {
  return (d & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)d + (bytes >> 4));
}

#ifndef TG_SIMT_EMULATION  // the emulator build (tests/emu/simt_emulator.h) provides this section
// The instructions exist on sm_90a only; any other device pass gets a trap, so a fat binary
// builds and a Hopper kernel launched on another part stops at once.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TG_HOPPER_PTX 1
#else
#define TG_HOPPER_PTX 0
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ----------------------------------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
#if TG_HOPPER_PTX
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#else
  (void)bar, (void)count;
  __trap();
#endif
}
// Makes the initialisation visible to the other threads (and the async proxy) of the cluster.
__device__ __forceinline__ void fence_mbarrier_init() {
#if TG_HOPPER_PTX
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}
// One arrival; returns the state token of the phase arrived on.
__device__ __forceinline__ uint64_t mbarrier_arrive(uint64_t* bar) {
#if TG_HOPPER_PTX
  uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];\n" : "=l"(state) : "r"(smem_u32(bar)) : "memory");
  return state;
#else
  (void)bar;
  __trap();
  return 0;
#endif
}
// tx-count += bytes, then one arrival.
__device__ __forceinline__ uint64_t mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if TG_HOPPER_PTX
  uint64_t state;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;\n"
               : "=l"(state)
               : "r"(smem_u32(bar)), "r"(bytes)
               : "memory");
  return state;
#else
  (void)bar, (void)bytes;
  __trap();
  return 0;
#endif
}
// tx-count += bytes, no arrival.
__device__ __forceinline__ void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) {
#if TG_HOPPER_PTX
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#else
  (void)bar, (void)bytes;
  __trap();
#endif
}
// tx-count -= bytes, as a bulk copy's landing bytes do.
__device__ __forceinline__ void mbarrier_complete_tx(uint64_t* bar, uint32_t bytes) {
#if TG_HOPPER_PTX
  asm volatile("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
#else
  (void)bar, (void)bytes;
  __trap();
#endif
}
// Whether the phase of parity `parity` has completed (may wait a while before answering false).
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
#if TG_HOPPER_PTX
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
#else
  (void)bar, (void)parity;
  __trap();
  return false;
#endif
}

// Whether the phase of parity `parity` has completed, answered at once.
__device__ __forceinline__ bool mbarrier_test_wait_parity(uint64_t* bar, uint32_t parity) {
#if TG_HOPPER_PTX
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
#else
  (void)bar, (void)parity;
  __trap();
  return false;
#endif
}

// ---- TMA -------------------------------------------------------------------------------------
// The box of *map at (c0, c1) (c0 innermost) -> dst (128-byte aligned; 1024 with a swizzle),
// its bytes completing on *bar. map: a kernel parameter (const __grid_constant__ CUtensorMap) or
// global memory.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
#if TG_HOPPER_PTX
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
#else
  (void)dst, (void)map, (void)c0, (void)c1, (void)bar;
  __trap();
#endif
}

// ---- warp-level ------------------------------------------------------------------------------
// stmatrix.x4 (PTX ISA, "Data Movement and Conversion Instructions: stmatrix"), ldmatrix's
// inverse: lanes 8m .. 8m+7 give the row addresses of 8x8 matrix m; register r[m] of lane l holds
// M_m[l/4][2(l%4), +1] (plain) or M_m[2(l%4), +1][l/4] (.trans).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#if TG_HOPPER_PTX
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
#else
  (void)addr, (void)r;
  __trap();
#endif
}
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
#if TG_HOPPER_PTX
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
#else
  (void)addr, (void)r;
  __trap();
#endif
}
// elect.sync over the full warp (PTX ISA, "Parallel Synchronization and Communication
// Instructions: elect.sync"): true in exactly one lane.
__device__ __forceinline__ bool elect_one() {
#if TG_HOPPER_PTX
  uint32_t pred;
  asm volatile("{\n.reg .b32 lane;\n.reg .pred p;\nelect.sync lane|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(pred));
  return pred != 0;
#else
  __trap();
  return false;
#endif
}

// ---- proxies -----------------------------------------------------------------------------------
__device__ __forceinline__ void fence_proxy_async() {
#if TG_HOPPER_PTX
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

// ---- order between the blocks of a launch -------------------------------------------------------
// A flag: an int in global memory that one block stores and a later one waits for (PTX ISA,
// "Memory Consistency Model": a release pattern and an acquire pattern at GPU scope, morally
// strong, so the waiting block sees what the storing block wrote before it). Use as CUTLASS's
// semaphores do: flag_wait by one thread, then a __syncthreads, before the block reads what the
// flag guards; the block's writes, then a __syncthreads, then flag_release by one thread. A block
// may wait only on blocks of a lower linear index, which the hardware starts first: on one that
// has not started it would wait for ever. So that a bug ends the launch rather than hanging the
// program, the wait polls at once 1024 times, then every 256 ns or so (__nanosleep), and traps
// (an unspecified launch failure) after 2^27 such naps, half a minute at least.
__device__ __forceinline__ void flag_wait(const int* flag, int value) {
#if TG_HOPPER_PTX
  for (uint32_t polls = 0;; ++polls) {
    int now;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(now) : "l"(flag) : "memory");
    if (now == value) return;
    if (polls >= 1024) {
      if (polls - 1024 >= (1u << 27)) __trap();
      __nanosleep(256);
    }
  }
#else
  (void)flag, (void)value;
  __trap();
#endif
}
__device__ __forceinline__ void flag_release(int* flag, int value) {
#if TG_HOPPER_PTX
  asm volatile("fence.acq_rel.gpu;\nst.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
#else
  (void)flag, (void)value;
  __trap();
#endif
}

// flag_peek: the flag's value now (ld.relaxed.gpu), ordered with nothing; its latency hides until
// the value is used. flag_handover: fence.acq_rel.gpu, then st.relaxed.gpu of value to `release`
// (none if null), by one thread: what flag_release does (the block's writes, a __syncthreads, then
// this), and in the same fence the acquire of `peeked` (none if null), the flag the thread's last
// flag_peek read, if that read saw the value awaited (a strong read, then the fence: the acquire
// pattern); if it did not, flag_wait after it. As after flag_wait, a __syncthreads passes the
// acquire on to the block. So a block that hands sums from query tile to query tile pays one
// fence a tile, with no wait for a load in the way.
__device__ __forceinline__ int flag_peek(const int* flag) {
#if TG_HOPPER_PTX
  int now;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(now) : "l"(flag) : "memory");
  return now;
#else
  (void)flag;
  __trap();
  return 0;
#endif
}
__device__ __forceinline__ void flag_handover(int* release, int value, const int* peeked) {
#if TG_HOPPER_PTX
  (void)peeked;
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  if (release) asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(release), "r"(value) : "memory");
#else
  (void)release, (void)value, (void)peeked;
  __trap();
#endif
}

// ---- registers ---------------------------------------------------------------------------------
// setmaxnreg.{inc,dec}.sync.aligned.u32 Count: the executing warpgroup's registers a thread
// raised (.inc, taken from the CTA's pool, waiting until it holds enough) or lowered (.dec, given
// back) to Count, 24 .. 256 and a multiple of 8; all 128 threads of the warpgroup execute it. ptxas
// honours it only in a kernel whose register count at entry it knows: __launch_bounds__(threads, 1).
template <int Count>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(Count >= 24 && Count <= 256 && Count % 8 == 0, "setmaxnreg: 24 .. 256, a multiple of 8");
#if TG_HOPPER_PTX
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Count));
#else
  __trap();
#endif
}
template <int Count>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(Count >= 24 && Count <= 256 && Count % 8 == 0, "setmaxnreg: 24 .. 256, a multiple of 8");
#if TG_HOPPER_PTX
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Count));
#else
  __trap();
#endif
}

// ---- wgmma -------------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() {
#if TG_HOPPER_PTX
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void wgmma_commit_group() {
#if TG_HOPPER_PTX
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
#if TG_HOPPER_PTX
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  __trap();
#endif
}

// d (64 x N, fp32) = A (64 x 16) B (16 x N) + (accumulate ? d : 0), A and B from shared memory;
// TransA / TransB: 0 K-major, 1 MN-major. N one of 8, 16, 32, 64, 128, 256.
template <int N, int TransA = 0, int TransB = 0>
__device__ __forceinline__ void wgmma_bf16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128 || N == 256, "wgmma m64nNk16: N not wrapped");
#if TG_HOPPER_PTX
  const uint32_t scale_d = accumulate ? 1 : 0;
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, %7, %8;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
        : "memory");
  } else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, %12;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
        : "memory");
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, %20;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
        : "memory");
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
        : "memory");
  } else if constexpr (N == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
        : "memory");
  } else if constexpr (N == 256) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, %131, %132;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransA), "n"(TransB)
        : "memory");
  }
#else
  (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
  __trap();
#endif
}

// As wgmma_bf16_ss with A from registers (the fragment above: a[0..3]); TransB as there.
template <int N, int TransB = 0>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128 || N == 256, "wgmma m64nNk16: N not wrapped");
#if TG_HOPPER_PTX
  const uint32_t scale_d = accumulate ? 1 : 0;
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, %10;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
        : "memory");
  } else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
        : "memory");
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
        : "memory");
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
        : "memory");
  } else if constexpr (N == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
        : "memory");
  } else if constexpr (N == 256) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB)
        : "memory");
  }
#else
  (void)d, (void)a, (void)desc_b, (void)accumulate;
  __trap();
#endif
}
#undef TG_HOPPER_PTX
#endif  // TG_SIMT_EMULATION

// Waits until the phase of parity `parity` of *bar has completed.
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

// The first 1024-byte boundary (of the shared address space) at or after p: where a tile with
// the 128-byte swizzle may start (its pattern repeats every 1024 bytes of the address).
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  return p + ((1024u - (smem_u32(p) & 1023u)) & 1023u);
}

// The driver's cuTensorMapEncodeTiled, found at run time through the runtime's entry point
// query (no link to libcuda; the emulator build returns its stand-in). Throws
// std::runtime_error where the driver has none (before CUDA 12.0). Defined in
// kernels/flash_attn_hopper.cu.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled();

}  // namespace hopper
}  // namespace gpu
