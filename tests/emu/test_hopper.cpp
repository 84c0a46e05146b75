// tests/emu/test_hopper.cpp: the emulated Hopper instructions of kernels/hopper_ptx.cuh
// (tests/emu/hopper_emu.cpp, tests/emu/simt_emulator.cpp) against the PTX ISA: mbarrier phases,
// arrivals and transaction counts; wgmma m64nNk16 bf16 with A from shared memory or registers,
// K-major and MN-major operands in every swizzle mode, compared lane by lane with the ISA's
// accumulator fragment; the asynchronous completion at wgmma.wait_group; TMA 2-D loads (the box's
// layout, swizzle and zero fill, the tensor map stand-in's refusals, boxes feeding wgmma);
// stmatrix and elect.sync; and the faults and races the emulator reports (a deadlocked mbarrier
// wait, a warpgroup the block does not fill, a missing wgmma.fence, a descriptor past shared
// memory, a wgmma operand overwritten in flight, a TMA box read by a thread that did not wait).
//
// The expected results come from this file's own reading of the ISA: the operands are laid out
// in shared memory by the canonical layouts written as the ISA's shape : stride table
// ("Shared Memory Matrix Layout"), and the swizzle as its description of the 16-byte chunks
// permuted within each 128-byte line; the emulator decodes the descriptors with its own code.
//
// This file is compiled like kernels/*.cu (the Makefile's EMU_HOOK_FLAGS), so that its kernels
// carry the memory hook for the race checker. A fault is sticky: those cases run in a child.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../../kernels/cuda_common.cuh"
#include "../../kernels/hopper_ptx.cuh"
#include "child_process.h"
#include "emu_internal.h"
#include "race_checker.h"

namespace {

using gpu::hopper::Swizzle;
using tg_test::has;
using tg_test::device_alloc;
using tg_test::download;

// ---- mbarrier ----------------------------------------------------------------------------------
// PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier" (phases,
// arrive-on with expect-tx and complete-tx, test_wait / try_wait .parity). 64 threads, two warps;
// out[0 .. 12) per block records test_wait answers, out[12] what warp 1 saw after its wait.
__global__ void mbarrier_kernel(int* out) {
  __shared__ uint64_t bar;
  int* o = out + 16 * blockIdx.x;
  const int t = threadIdx.x;
  if (t == 0) gpu::hopper::mbarrier_init(&bar, 2);
  __syncthreads();
  if (t == 0) {
    o[0] = gpu::hopper::mbarrier_test_wait_parity(&bar, 0);  // phase 0 in progress: 0
    o[1] = gpu::hopper::mbarrier_test_wait_parity(&bar, 1);  // the phase before it: done, 1
  }
  __syncthreads();
  // phase 0: two arrivals, one with 64 bytes expected, which then complete in two parts
  if (t == 0) gpu::hopper::mbarrier_arrive_expect_tx(&bar, 64);
  if (t == 32) gpu::hopper::mbarrier_arrive(&bar);
  __syncthreads();
  if (t == 0) o[2] = gpu::hopper::mbarrier_test_wait_parity(&bar, 0);  // arrivals done, 64 bytes pending: 0
  if (t == 0) gpu::hopper::mbarrier_complete_tx(&bar, 48);
  __syncthreads();
  if (t == 0) o[3] = gpu::hopper::mbarrier_test_wait_parity(&bar, 0);  // 16 bytes pending: 0
  __syncthreads();
  if (t == 32) gpu::hopper::mbarrier_complete_tx(&bar, 16);
  __syncthreads();
  if (t == 0) {
    o[4] = gpu::hopper::mbarrier_test_wait_parity(&bar, 0);  // phase 0 complete: 1
    o[5] = gpu::hopper::mbarrier_test_wait_parity(&bar, 1);  // phase 1 in progress: 0
  }
  __syncthreads();
  // phase 1: bytes complete before they are expected (tx-count below 0), then the arrivals
  if (t == 0) gpu::hopper::mbarrier_complete_tx(&bar, 32);
  if (t == 1) gpu::hopper::mbarrier_arrive(&bar);
  __syncthreads();
  if (t == 0) o[6] = gpu::hopper::mbarrier_test_wait_parity(&bar, 1);  // one arrival, tx -32: 0
  if (t == 0) gpu::hopper::mbarrier_arrive_expect_tx(&bar, 32);
  __syncthreads();
  if (t == 0) {
    o[7] = gpu::hopper::mbarrier_test_wait_parity(&bar, 1);  // both arrivals, tx 0: 1
    o[8] = gpu::hopper::mbarrier_test_wait_parity(&bar, 0);  // phase 2 in progress: 0
  }
  __syncthreads();
  // phase 2: warp 1 waits (try_wait spins until the phase completes); warp 0 arrives twice
  if (t == 0) {
    gpu::hopper::mbarrier_arrive(&bar);
    gpu::hopper::mbarrier_arrive(&bar);
  }
  if (t >= 32) {
    gpu::hopper::mbarrier_wait_parity(&bar, 0);
    if (t == 32) o[12] = 6 + gpu::hopper::mbarrier_test_wait_parity(&bar, 0);  // complete when the wait returns: 7
  }
  __syncthreads();
  if (t == 0) o[9] = gpu::hopper::mbarrier_test_wait_parity(&bar, 0);  // phase 2 complete: 1
}

TEST_CASE("hopper: mbarrier phases complete on arrivals and transaction bytes; parity waits (PTX ISA: mbarrier)") {
  int* d = device_alloc<int>(32);
  cudaMemset(d, 0, 32 * sizeof(int));
  gpu::launch(mbarrier_kernel, 2, 64, 0, nullptr, d);  // two blocks: warps run in both orders
  const std::vector<int> h = download(d, 32);
  const int want[13] = {0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 7};
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 13; ++i) {
      INFO("block " << b << " observation " << i);
      CHECK(h[(size_t)(16 * b + i)] == want[i]);
    }
  cudaFree(d);
}

// A phase that never completes: one of two arrivals.
__global__ void mbarrier_deadlock_kernel(int* out) {
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) gpu::hopper::mbarrier_init(&bar, 2);
  __syncthreads();
  if (threadIdx.x == 0) gpu::hopper::mbarrier_arrive(&bar);
  gpu::hopper::mbarrier_wait_parity(&bar, 0);
  out[threadIdx.x] = 1;
}
// Two arrivals in a phase of count 1 that the first cannot complete (16 bytes are expected).
__global__ void mbarrier_overflow_kernel(int* out) {
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    gpu::hopper::mbarrier_init(&bar, 1);
    gpu::hopper::mbarrier_expect_tx(&bar, 16);
    gpu::hopper::mbarrier_arrive(&bar);  // pending 0, 16 bytes outstanding: the phase stays open
    gpu::hopper::mbarrier_arrive(&bar);  // a second arrival in a phase of count 1
  }
  out[threadIdx.x] = 1;
}
__global__ void mbarrier_uninitialised_kernel(int* out) {
  __shared__ uint64_t bar;
  gpu::hopper::mbarrier_arrive(&bar);
  out[threadIdx.x] = 1;
}

template <typename K>
tg_test::ChildResult run_child(K kernel, int threads, size_t smem) {
  return tg_test::in_child([kernel, threads, smem] {
    int* out = nullptr;
    cudaMalloc(&out, 256 * sizeof(int));
    if (smem > 48 * 1024) cudaFuncSetAttribute((const void*)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    gpu::launch(kernel, 1, threads, smem, nullptr, out);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
  });
}

TEST_CASE("hopper: an mbarrier wait that cannot complete is a deadlock; misuse of an mbarrier is a fault (PTX ISA: mbarrier.init, mbarrier.arrive, mbarrier.test_wait/mbarrier.try_wait)") {
  const tg_test::ChildResult dead = run_child(mbarrier_deadlock_kernel, 64, 0);
  INFO("child stderr: " << dead.err);
  CHECK(dead.exit_code == 3);
  CHECK(has(dead.err, "deadlock"));
  CHECK(has(dead.err, "64 threads wait (at mbarrier.try_wait.parity)"));
  const tg_test::ChildResult over = run_child(mbarrier_overflow_kernel, 32, 0);
  INFO("child stderr: " << over.err);
  CHECK(over.exit_code == 3);
  CHECK(has(over.err, "more arrivals in one phase than the mbarrier's count (1)"));
  const tg_test::ChildResult uninit = run_child(mbarrier_uninitialised_kernel, 32, 0);
  INFO("child stderr: " << uninit.err);
  CHECK(uninit.exit_code == 3);
  CHECK(has(uninit.err, "mbarrier.arrive on an mbarrier not initialised in this block"));
}

// ---- wgmma: the test's own layouts -------------------------------------------------------------
// Widths in bytes of a swizzle row: 0 for none.
int width_of(Swizzle s) { return s == Swizzle::B128 ? 128 : s == Swizzle::B64 ? 64 : s == Swizzle::B32 ? 32 : 0; }

// One operand's placement: its layout (PTX ISA, "Shared Memory Matrix Layout", the canonical
// layouts in units of bf16 elements, T = 8), the descriptor's offsets, the tile origin in the
// shared image (a multiple of 1024) and, for a K-major swizzled tile W / 2 elements deep, the
// column kofs where the 16 multiplied columns start (the descriptor's start moves by 2 kofs).
struct Placement {
  bool mn_major;
  Swizzle swizzle;
  int mn;  // the operand's MN extent: 64 for A, N for B
  uint32_t origin, lbo, sbo;
  int kofs;
};

// A hierarchical mode: coordinate x split column-major over shapes, each part times its stride.
uint32_t mode_offset(int x, std::initializer_list<std::pair<int, uint32_t>> shape_stride) {
  uint32_t off = 0;
  for (const auto& [shape, stride] : shape_stride) {
    off += (uint32_t)(x % shape) * stride;
    x /= shape;
  }
  return off;
}

// The byte offset of element (mn, k) of the tile before the swizzle, from the ISA's table:
//   K-major,  none:   ((8, m), (T, 2)) : ((1T, SBO), (1, LBO))
//   K-major,  W:      ((8, m), (T, 2)) : ((W/16 T, SBO), (1, T))
//   MN-major, none:   ((T, 1, m), (8, k)) : ((1, T, SBO), (1T, LBO))
//   MN-major, W:      ((T, W/16, m), (8, k)) : ((1, T, LBO), (W/16 T, SBO))
// (strides in elements there, in bytes here: an element is 2 bytes, T elements 16).
uint32_t layout_offset(const Placement& p, int mn, int k) {
  const int w = width_of(p.swizzle);
  constexpr int big = 1 << 20;  // the outermost mode's extent (unbounded)
  if (!p.mn_major) {
    if (w == 0) return mode_offset(mn, {{8, 16}, {big, p.sbo}}) + mode_offset(k, {{8, 2}, {big, p.lbo}});
    return mode_offset(mn, {{8, (uint32_t)w}, {big, p.sbo}}) + mode_offset(k, {{8, 2}, {big, 16}});
  }
  if (w == 0) return mode_offset(mn, {{8, 2}, {1, 16}, {big, p.sbo}}) + mode_offset(k, {{8, 16}, {big, p.lbo}});
  return mode_offset(mn, {{8, 2}, {w / 16, 16}, {big, p.lbo}}) + mode_offset(k, {{8, (uint32_t)w}, {big, p.sbo}});
}

// The swizzle (PTX ISA, "Shared Memory Matrix Layout", the swizzling modes): within each
// 128-byte line of the shared address space, the 16-byte chunk c of every W-byte segment moves
// to c XOR (line mod W/16), the pattern repeating every 8 W bytes.
uint32_t swizzled(uint32_t addr, Swizzle s) {
  const int chunks = width_of(s) / 16;
  if (chunks == 0) return addr;
  const uint32_t c = addr / 16 % chunks, line = addr / 128 % chunks;
  return addr - 16 * c + 16 * (c ^ line);
}

uint32_t element_addr(const Placement& p, int mn, int k) {
  return swizzled(p.origin + layout_offset(p, mn, k + p.kofs), p.swizzle);
}

uint64_t descriptor(const Placement& p) {
  return gpu::hopper::make_smem_desc(p.origin + 2 * p.kofs, p.lbo, p.sbo, p.swizzle);
}

uint16_t bf16_bits(float f) {  // exact for the small integers used here
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

// A placement that fills its operand compactly: no-swizzle layouts put the K core matrices of
// one MN group LBO apart and MN groups SBO apart with LBO != SBO, so that swapping them shows.
Placement place(bool mn_major, Swizzle s, int mn, uint32_t origin, int kofs) {
  const int w = width_of(s);
  Placement p{mn_major, s, mn, origin, 0, 0, kofs};
  if (!mn_major && w == 0) p.lbo = 16 * 8 * (uint32_t)(mn / 8), p.sbo = 128;  // all MN groups of k 0..7 first
  if (!mn_major && w != 0) p.lbo = 0, p.sbo = 8 * (uint32_t)w;                 // 8-row atoms stacked along MN
  if (mn_major && w == 0) p.sbo = 128, p.lbo = 16 * 8 * (uint32_t)(mn / 8);    // MN groups 128 B apart, k halves after
  if (mn_major && w != 0) p.sbo = 8 * (uint32_t)w, p.lbo = 2 * 8 * (uint32_t)w;  // both k halves of an MN atom, then the next
  return p;
}

// The extent in bytes of a placement's tile (beyond its origin).
uint32_t extent(const Placement& p) {
  uint32_t hi = 0;
  const int kdepth = (!p.mn_major && width_of(p.swizzle)) ? width_of(p.swizzle) / 2 : 16;
  for (int mn = 0; mn < p.mn; ++mn)
    for (int k = 0; k < kdepth; ++k) hi = std::max(hi, layout_offset(p, mn, k) + 2);
  return (hi + 1023) / 1024 * 1024;
}

struct WgmmaArgs {
  const unsigned char* image;  // the shared memory image, copied in before the wgmma
  int image_bytes;
  const uint32_t* a_frag;  // (128, 4): each thread's A fragment, for A from registers
  uint64_t desc_a, desc_b;  // start addresses relative to the dynamic shared memory
  int accumulate;
  float* out;    // (128, N / 2): the accumulators after the wait
  float* early;  // (128, N / 2): the accumulators read between issue and wait
};

// C[row][col] = row - col: the accumulators' value before the wgmma
__device__ __forceinline__ float c_init(int row, int col) { return (float)(row - col); }

template <int N, int TransA, int TransB, bool RegA>
__global__ void wgmma_kernel(WgmmaArgs p) {
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int t = threadIdx.x;
  for (int i = t; i < p.image_bytes / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(s)[i] = reinterpret_cast<const uint32_t*>(p.image)[i];
  gpu::hopper::fence_proxy_async();
  __syncthreads();
  const uint64_t base = gpu::hopper::smem_u32(s) >> 4;  // added to the start address fields
  float d[N / 2];
  const int w = t / 32, g = t % 32 / 4, q = t % 4;
  for (int r = 0; r < N / 2; ++r) d[r] = c_init(16 * w + g + 8 * (r / 2 % 2), 8 * (r / 4) + 2 * q + r % 2);
  uint32_t a[4];
  for (int r = 0; r < 4; ++r) a[r] = p.a_frag[4 * t + r];
  gpu::hopper::wgmma_fence();
  if constexpr (RegA) gpu::hopper::wgmma_bf16_rs<N, TransB>(d, a, p.desc_b + base, p.accumulate != 0);
  else gpu::hopper::wgmma_bf16_ss<N, TransA, TransB>(d, p.desc_a + base, p.desc_b + base, p.accumulate != 0);
  gpu::hopper::wgmma_commit_group();
  for (int r = 0; r < N / 2; ++r) p.early[t * (N / 2) + r] = d[r];
  gpu::hopper::wgmma_wait_group<0>();
  for (int r = 0; r < N / 2; ++r) p.out[t * (N / 2) + r] = d[r];
}

// Runs one m64nNk16 wgmma on operands laid out as given and checks every thread's accumulators
// against the ISA's D fragment (PTX ISA, "Register Fragments and Shared Memory Matrix Layouts",
// wgmma .m64nNk16 D: thread 32w + 4g + q holds d[4j + 2h + c] = D[16w + 8h + g][8j + 2q + c]).
struct WgmmaShape {
  int N, TransA, TransB;
  bool RegA;
  void (*kernel)(WgmmaArgs);
};
template <int N, int TransA, int TransB, bool RegA>
WgmmaShape shape() {
  return {N, TransA, TransB, RegA, wgmma_kernel<N, TransA, TransB, RegA>};
}

void check_wgmma(const WgmmaShape& shape, Swizzle sa, Swizzle sb, int kofs_a, int kofs_b, bool accumulate,
                 unsigned seed) {
  const int N = shape.N, TransA = shape.TransA, TransB = shape.TransB;
  const bool RegA = shape.RegA;
  const Placement pa = place(TransA != 0, sa, 64, 0, kofs_a);
  const Placement pb = place(TransB != 0, sb, N, extent(pa), kofs_b);
  const int bytes = (int)(pb.origin + extent(pb));
  // operands: distinct small integers (exact in bf16, and every sum exact in fp32)
  std::vector<float> A(64 * 16), B(16 * N);
  unsigned x = seed;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return (float)((int)(x >> 27) - 16) / 2;  // -8 .. 7.5 in steps of 0.5
  };
  for (float& v : A) v = next();
  for (float& v : B) v = next();
  std::vector<unsigned char> image((size_t)bytes);
  for (size_t i = 0; i < image.size(); i += 2) image[i] = 0xFF, image[i + 1] = 0x7F;  // bf16 NaN where nothing goes
  auto put = [&image](uint32_t addr, float v) {
    const uint16_t b = bf16_bits(v);
    std::memcpy(&image[addr], &b, 2);
  };
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < 16; ++k)
      if (!RegA) put(element_addr(pa, m, k), A[(size_t)(16 * m + k)]);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < 16; ++k) put(element_addr(pb, n, k), B[(size_t)(N * k + n)]);
  // A's register fragment (as mma.m16n8k16's A for the warp's 16 rows)
  std::vector<uint32_t> frag(128 * 4);
  for (int t = 0; t < 128; ++t)
    for (int r = 0; r < 4; ++r) {
      const int m = 16 * (t / 32) + t % 32 / 4 + 8 * (r % 2), k = 2 * (t % 4) + 8 * (r / 2);
      frag[(size_t)(4 * t + r)] = bf16_bits(A[(size_t)(16 * m + k)]) | (uint32_t)bf16_bits(A[(size_t)(16 * m + k + 1)]) << 16;
    }
  unsigned char* d_image = device_alloc<unsigned char>(image.size());
  uint32_t* d_frag = device_alloc<uint32_t>(frag.size());
  float* d_out = device_alloc<float>(64 * N);
  float* d_early = device_alloc<float>(64 * N);
  REQUIRE(cudaMemcpy(d_image, image.data(), image.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_frag, frag.data(), frag.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  const WgmmaArgs args{d_image, bytes, d_frag, descriptor(pa), descriptor(pb), accumulate ? 1 : 0, d_out, d_early};
  auto kernel = shape.kernel;
  if (bytes > 48 * 1024) REQUIRE(cudaFuncSetAttribute((const void*)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess);
  gpu::launch(kernel, 1, 128, (size_t)bytes, nullptr, args);
  const std::vector<float> out = download(d_out, (size_t)(64 * N)), early = download(d_early, (size_t)(64 * N));
  int bad = 0, stale_bad = 0;
  std::string first;
  for (int t = 0; t < 128; ++t)
    for (int r = 0; r < N / 2; ++r) {
      const int row = 16 * (t / 32) + 8 * (r / 2 % 2) + t % 32 / 4, col = 8 * (r / 4) + 2 * (t % 4) + r % 2;
      float want = accumulate ? (float)(row - col) : 0.f;
      for (int k = 0; k < 16; ++k) want += A[(size_t)(16 * row + k)] * B[(size_t)(N * k + col)];
      const float got = out[(size_t)(t * (N / 2) + r)];
      if (got != want && bad++ == 0)
        first = "thread " + std::to_string(t) + " d[" + std::to_string(r) + "] = D[" + std::to_string(row) + "][" +
                std::to_string(col) + "]: " + std::to_string(got) + ", want " + std::to_string(want);
      stale_bad += early[(size_t)(t * (N / 2) + r)] != (float)(row - col);
    }
  const std::string what = "N " + std::to_string(N) + ", trans-a " + std::to_string(TransA) + ", trans-b " +
                           std::to_string(TransB) + (RegA ? ", A in registers" : "") + ", swizzle modes " +
                           std::to_string((int)sa) + " / " + std::to_string((int)sb) + ": " + first;
  INFO(what);
  CHECK(bad == 0);
  CHECK(stale_bad == 0);  // before the wait_group the accumulators still hold C
  cudaFree(d_image);
  cudaFree(d_frag);
  cudaFree(d_out);
  cudaFree(d_early);
}

}  // namespace

TEST_CASE("hopper: wgmma m64nNk16 bf16, K-major operands in every swizzle mode (PTX ISA: wgmma, Matrix Descriptor Format, Shared Memory Matrix Layout)") {
  check_wgmma(shape<8, 0, 0, false>(), Swizzle::None, Swizzle::None, 0, 0, false, 1);
  check_wgmma(shape<16, 0, 0, false>(), Swizzle::B32, Swizzle::B32, 0, 0, true, 2);
  check_wgmma(shape<64, 0, 0, false>(), Swizzle::B64, Swizzle::B64, 16, 0, true, 3);       // A's k 16..31 of a 64 B row
  check_wgmma(shape<128, 0, 0, false>(), Swizzle::B128, Swizzle::B128, 16, 32, false, 4);  // k steps inside 128 B rows
  check_wgmma(shape<256, 0, 0, false>(), Swizzle::B128, Swizzle::B128, 48, 48, true, 5);
}

TEST_CASE("hopper: wgmma m64nNk16 bf16, MN-major (transposed) operands (PTX ISA: wgmma imm-trans-a / imm-trans-b, Shared Memory Matrix Layout)") {
  check_wgmma(shape<64, 0, 1, false>(), Swizzle::B128, Swizzle::B128, 0, 0, true, 6);  // P V: V stored (keys, head dims)
  check_wgmma(shape<32, 1, 1, false>(), Swizzle::None, Swizzle::B64, 0, 0, false, 7);
  check_wgmma(shape<16, 1, 0, false>(), Swizzle::B32, Swizzle::None, 0, 0, true, 8);
  check_wgmma(shape<256, 1, 1, false>(), Swizzle::B128, Swizzle::B32, 0, 0, true, 9);
}

TEST_CASE("hopper: wgmma m64nNk16 bf16 with A from registers (PTX ISA: wgmma, Register Fragments: A of .m64nNk16)") {
  check_wgmma(shape<64, 0, 0, true>(), Swizzle::None, Swizzle::B128, 0, 16, true, 10);
  check_wgmma(shape<128, 0, 1, true>(), Swizzle::None, Swizzle::B128, 0, 0, false, 11);
  check_wgmma(shape<8, 0, 1, true>(), Swizzle::None, Swizzle::None, 0, 0, true, 12);
}

namespace {

// Two groups in flight (PTX ISA, wgmma.commit_group and wgmma.wait_group): d0 = A B + d0 in the
// first, d1 = A B (scale-d 0) in the second; wait_group 1 retires only the first.
__global__ void wgmma_groups_kernel(const unsigned char* image, int bytes, uint64_t desc_a, uint64_t desc_b, float* out) {
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int t = threadIdx.x;
  for (int i = t; i < bytes; i += blockDim.x) s[i] = image[i];
  __syncthreads();
  float d0[4] = {1.f, 1.f, 1.f, 1.f}, d1[4] = {-5.f, -5.f, -5.f, -5.f};
  gpu::hopper::wgmma_fence();
  gpu::hopper::wgmma_bf16_ss<8>(d0, desc_a, desc_b, true);
  gpu::hopper::wgmma_commit_group();
  gpu::hopper::wgmma_bf16_ss<8>(d1, desc_a, desc_b, false);
  gpu::hopper::wgmma_commit_group();
  gpu::hopper::wgmma_wait_group<1>();
  out[t] = d0[0];
  out[128 + t] = d1[0];
  gpu::hopper::wgmma_wait_group<0>();
  out[256 + t] = d1[0];
}

}  // namespace

TEST_CASE("hopper: wgmma results land at the wait_group that retires their group (PTX ISA: wgmma.commit_group, wgmma.wait_group)") {
  // A = all 1, B = all 2 (K-major, no swizzle): every element of A B is 32
  const Placement pa = place(false, Swizzle::None, 64, 0, 0), pb = place(false, Swizzle::None, 8, 2048, 0);
  std::vector<unsigned char> image(4096);
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < 16; ++k) {
      const uint16_t one = bf16_bits(1.f);
      std::memcpy(&image[element_addr(pa, m, k)], &one, 2);
      if (m < 8) {
        const uint16_t two = bf16_bits(2.f);
        std::memcpy(&image[element_addr(pb, m, k)], &two, 2);
      }
    }
  unsigned char* d_image = device_alloc<unsigned char>(image.size());
  float* d_out = device_alloc<float>(384);
  REQUIRE(cudaMemcpy(d_image, image.data(), image.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  gpu::launch(wgmma_groups_kernel, 1, 128, image.size(), nullptr, (const unsigned char*)d_image, (int)image.size(),
              descriptor(pa), descriptor(pb), d_out);
  const std::vector<float> h = download(d_out, 384);
  int bad = 0;
  for (int t = 0; t < 128; ++t) bad += h[(size_t)t] != 33.f || h[(size_t)(128 + t)] != -5.f || h[(size_t)(256 + t)] != 32.f;
  CHECK(bad == 0);
  cudaFree(d_image);
  cudaFree(d_out);
}

namespace {

// MODE 0: a block of 96 threads (its warpgroup incomplete). MODE 1: no wgmma.fence. MODE 2: B's
// descriptor reaches past the 4 KB of dynamic shared memory. MODE 3: a correct wgmma, then thread
// 5 writes into B's tile before the wait_group (a race). MODE 4: that write after the wait_group.
// MODE 5: thread 40 writes B's tile after the __syncthreads, unordered before the wgmma's read.
template <int MODE>
__global__ void wgmma_misuse_kernel(int* out) {
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int t = threadIdx.x;
  for (int i = t; i < 1024; i += blockDim.x) reinterpret_cast<uint32_t*>(s)[i] = 0x3F803F80u;  // bf16 1.0
  __syncthreads();
  if (MODE == 5 && t == 40) s[2048] = 0;
  const uint64_t desc_a = gpu::hopper::make_smem_desc(0, 1024, 128, Swizzle::None);
  const uint64_t desc_b = gpu::hopper::make_smem_desc(MODE == 2 ? 3968 : 2048, 128, 256, Swizzle::None);
  float d[4] = {};
  if (MODE != 1) gpu::hopper::wgmma_fence();
  gpu::hopper::wgmma_bf16_ss<8>(d, desc_a, desc_b, false);
  gpu::hopper::wgmma_commit_group();
  if (MODE == 3 && t == 5) s[2048 + 16] = 0;
  gpu::hopper::wgmma_wait_group<0>();
  if (MODE == 4 && t == 5) s[2048 + 16] = 0;
  out[t] = (int)d[0];
}

tg_test::ChildResult run_checked(void (*kernel)(int*), int threads) {
  return tg_test::in_child([kernel, threads] {
    emu::RaceChecker checker;
    int* out = nullptr;
    cudaMalloc(&out, 256 * sizeof(int));
    gpu::launch(kernel, 1, threads, 4096, nullptr, out);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
  });
}

}  // namespace

TEST_CASE("hopper: wgmma misuse is a fault: an incomplete warpgroup, no wgmma.fence, a descriptor past shared memory (PTX ISA: wgmma, wgmma.fence, Matrix Descriptor Format)") {
  const tg_test::ChildResult partial = run_child(wgmma_misuse_kernel<0>, 96, 4096);
  INFO("child stderr: " << partial.err);
  CHECK(partial.exit_code == 3);
  CHECK(has(partial.err, "wgmma.fence in warpgroup 0, which the block's 96 threads do not fill"));
  const tg_test::ChildResult unfenced = run_child(wgmma_misuse_kernel<1>, 128, 4096);
  INFO("child stderr: " << unfenced.err);
  CHECK(unfenced.exit_code == 3);
  CHECK(has(unfenced.err, "wgmma.mma_async with no wgmma.fence"));
  const tg_test::ChildResult past = run_child(wgmma_misuse_kernel<2>, 128, 4096);
  INFO("child stderr: " << past.err);
  CHECK(past.exit_code == 3);
  CHECK(has(past.err, "past the 4096 bytes of dynamic shared memory"));
}

TEST_CASE("racecheck: a wgmma operand overwritten before its wait_group, or written unordered before its issue, is a hazard (PTX ISA: wgmma.mma_async, wgmma.wait_group)") {
  const tg_test::ChildResult early = run_checked(wgmma_misuse_kernel<3>, 128);
  INFO("child stderr: " << early.err);
  CHECK(early.exit_code == 3);
  CHECK(has(early.err, "write to a wgmma operand before the wgmma.wait_group that retires it"));
  CHECK(has(early.err, "tests/emu/test_hopper.cpp"));
  const tg_test::ChildResult unordered = run_checked(wgmma_misuse_kernel<5>, 128);
  INFO("child stderr: " << unordered.err);
  CHECK(unordered.exit_code == 3);
  CHECK(has(unordered.err, "read-after-write hazard"));
  const tg_test::ChildResult after = run_checked(wgmma_misuse_kernel<4>, 128);
  INFO("child stderr: " << after.err);
  CHECK(after.exit_code == 0);
}

// ---- TMA ---------------------------------------------------------------------------------------
namespace {

// A bf16 tensor of dim1 rows of dim0 elements, rows `pitch` bytes apart, element (x, y) = 1 + x +
// 100 y (never 0, the fill, nor 0xFFFF, the emulator's in-flight poison).
struct Tensor2d {
  int dim0, dim1, pitch;
  uint16_t* dev = nullptr;
  uint16_t at(int x, int y) const { return x < 0 || y < 0 || x >= dim0 || y >= dim1 ? 0 : (uint16_t)(1 + x + 100 * y); }
  void upload() {
    std::vector<uint16_t> h((size_t)(pitch / 2 * dim1), 0);
    for (int y = 0; y < dim1; ++y)
      for (int x = 0; x < dim0; ++x) h[(size_t)(y * (pitch / 2) + x)] = at(x, y);
    dev = device_alloc<uint16_t>(h.size());
    REQUIRE(cudaMemcpy(dev, h.data(), h.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  CUtensorMap map(int box0, int box1, CUtensorMapSwizzle swizzle) const {
    CUtensorMap m;
    const cuuint64_t dims[2] = {(cuuint64_t)dim0, (cuuint64_t)dim1}, strides[1] = {(cuuint64_t)pitch};
    const cuuint32_t box[2] = {(cuuint32_t)box0, (cuuint32_t)box1}, ones[2] = {1, 1};
    REQUIRE(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, dev, dims, strides, box, ones,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
    return m;
  }
};

// Two boxes on one mbarrier: a 64 x 16 box with the 128B swizzle at (60, 30) to shared byte 0 and
// an 8 x 5 box without swizzle at (-3, -2) to byte 2048; then the raw shared bytes to out.
// MODE 1: thread 5 reads the first box before waiting (a race).
template <int MODE>
__global__ void tma_kernel(const CUtensorMap wide, const CUtensorMap narrow, uint16_t* out) {
  __shared__ uint64_t bar;
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int t = threadIdx.x;
  if (t == 0) {
    gpu::hopper::mbarrier_init(&bar, 1);
    gpu::hopper::fence_mbarrier_init();
  }
  __syncthreads();
  if (t == 0) {
    gpu::hopper::mbarrier_arrive_expect_tx(&bar, 64 * 16 * 2 + 8 * 5 * 2);
    gpu::hopper::tma_load_2d(s, &wide, 60, 30, &bar);
    gpu::hopper::tma_load_2d(s + 2048, &narrow, -3, -2, &bar);
  }
  __syncthreads();
  uint16_t early = 0;
  if (MODE == 1 && t == 5) std::memcpy(&early, s + 16, 2);
  gpu::hopper::mbarrier_wait_parity(&bar, 0);
  for (int i = t; i < (2048 + 80) / 2; i += blockDim.x) {
    uint16_t v;
    std::memcpy(&v, s + 2 * i, 2);
    out[i] = (uint16_t)(v + early);
  }
}

}  // namespace

TEST_CASE("hopper: a TMA 2-D load lands its box row after row, swizzled, zeros outside the tensor (PTX ISA: cp.async.bulk.tensor; Tensors: Tiled Mode, its bounding box and out-of-bound access)") {
  Tensor2d a{100, 37, 208};
  a.upload();
  const CUtensorMap wide = a.map(64, 16, CU_TENSOR_MAP_SWIZZLE_128B), narrow = a.map(8, 5, CU_TENSOR_MAP_SWIZZLE_NONE);
  uint16_t* d_out = device_alloc<uint16_t>((2048 + 80) / 2);
  gpu::launch(tma_kernel<0>, 1, 128, 4096, nullptr, wide, narrow, d_out);
  const std::vector<uint16_t> h = download(d_out, (2048 + 80) / 2);
  int bad = 0;
  std::string first;
  auto expect = [&](uint32_t addr, uint16_t want) {
    if (h[addr / 2] != want && bad++ == 0)
      first = "shared byte " + std::to_string(addr) + ": " + std::to_string(h[addr / 2]) + ", want " + std::to_string(want);
  };
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 64; ++c) expect(swizzled((uint32_t)(128 * r + 2 * c), Swizzle::B128), a.at(60 + c, 30 + r));
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 8; ++c) expect((uint32_t)(2048 + 16 * r + 2 * c), a.at(-3 + c, -2 + r));
  INFO(first);
  CHECK(bad == 0);
  cudaFree(d_out);
  cudaFree(a.dev);
}

TEST_CASE("hopper: cuTensorMapEncodeTiled's stand-in refuses what the driver refuses (CUDA Driver API: cuTensorMapEncodeTiled)") {
  Tensor2d a{100, 37, 200};  // a row pitch that is not a multiple of 16
  a.upload();
  CUtensorMap m;
  const cuuint64_t dims[2] = {100, 37}, strides[1] = {200};
  const cuuint32_t box[2] = {64, 16}, ones[2] = {1, 1};
  CHECK(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.dev, dims, strides, box, ones,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);
  const cuuint64_t strides_ok[1] = {208};
  const cuuint32_t wide_box[2] = {128, 16};  // 256 bytes: wider than the 128B swizzle
  CHECK(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.dev, dims, strides_ok, wide_box, ones,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_ERROR_INVALID_VALUE);
  cudaFree(a.dev);
}

TEST_CASE("racecheck: a TMA destination read before a wait on its mbarrier is a hazard (PTX ISA: cp.async.bulk.tensor, mbarrier.try_wait)") {
  const tg_test::ChildResult early = tg_test::in_child([] {
    emu::RaceChecker checker;
    Tensor2d a{100, 37, 208};
    a.upload();
    const CUtensorMap wide = a.map(64, 16, CU_TENSOR_MAP_SWIZZLE_128B), narrow = a.map(8, 5, CU_TENSOR_MAP_SWIZZLE_NONE);
    uint16_t* d_out = nullptr;
    cudaMalloc(&d_out, 2048 + 80);
    gpu::launch(tma_kernel<1>, 1, 128, 4096, nullptr, wide, narrow, d_out);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 3;
  });
  INFO("child stderr: " << early.err);
  CHECK(early.exit_code == 3);
  CHECK(has(early.err, "access to a TMA destination by a thread that has not seen its mbarrier phase complete"));
}

namespace {

// A producer / consumer ring (the Hopper attention forward's pattern): thread 0 of warp 1 streams
// 6 boxes of 8 x 8 through 2 stages with TMA, each stage a "full" mbarrier (its bytes) and an
// "empty" one (one arrival by warp 0's first lane once the stage is read); warp 0 waits on full,
// sums the stage and releases it. Only mbarriers (and a warp collective) order the refills after
// the reads. MODE 1 releases a stage before reading it (a race: the producer may overwrite what
// is read).
template <int MODE>
__global__ void ring_kernel(const CUtensorMap map, float* out) {
  __shared__ uint64_t full[2], empty[2];
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int t = threadIdx.x;
  if (t == 0)
    for (int st = 0; st < 2; ++st) gpu::hopper::mbarrier_init(&full[st], 1), gpu::hopper::mbarrier_init(&empty[st], 1);
  __syncthreads();
  if (t == 32) {  // the producer
    for (int i = 0; i < 6; ++i) {
      const int st = i % 2, use = i / 2;
      if (use > 0) gpu::hopper::mbarrier_wait_parity(&empty[st], (use - 1) & 1);
      gpu::hopper::mbarrier_arrive_expect_tx(&full[st], 8 * 8 * 2);
      gpu::hopper::tma_load_2d(s + 1024 * st, &map, 0, 8 * i, &full[st]);
    }
  } else if (t < 32) {  // the consumer warp
    float sum = 0;
    for (int i = 0; i < 6; ++i) {
      const int st = i % 2;
      gpu::hopper::mbarrier_wait_parity(&full[st], (i / 2) & 1);
      if (MODE == 1 && t == 0) gpu::hopper::mbarrier_arrive(&empty[st]);
      uint16_t v;
      std::memcpy(&v, s + 1024 * st + 2 * t, 2);
      sum += (float)v;
      // the lanes' reads before lane 0's arrival: a warp collective orders them (as __syncwarp would)
      sum += __shfl_sync(0xffffffffu, 0.f, 0);
      if (MODE == 0 && t == 0) gpu::hopper::mbarrier_arrive(&empty[st]);
    }
    out[t] = sum;
  }
}

}  // namespace

TEST_CASE("racecheck: mbarriers order a ring's refills after its reads, and a stage released before it is read is a hazard (PTX ISA: mbarrier.arrive, mbarrier.try_wait)") {
  auto run = [](auto kernel) {
    return tg_test::in_child([kernel] {
      emu::RaceChecker checker;
      Tensor2d a{8, 48, 16};
      a.upload();
      const CUtensorMap map = a.map(8, 8, CU_TENSOR_MAP_SWIZZLE_NONE);
      float* d_out = nullptr;
      cudaMalloc(&d_out, 32 * sizeof(float));
      gpu::launch(kernel, 1, 64, 2048, nullptr, map, d_out);
      if (cudaDeviceSynchronize() != cudaSuccess) return 3;
      float h[32];
      cudaMemcpy(h, d_out, sizeof h, cudaMemcpyDeviceToHost);
      // lane l sums row 0, column l of the 6 boxes when l < 8 (row 0 of box i is tensor row 8 i)
      for (int l = 0; l < 8; ++l) {
        float want = 0;
        for (int i = 0; i < 6; ++i) want += (float)a.at(l, 8 * i);
        if (h[l] != want) return 4;
      }
      return 0;
    });
  };
  const tg_test::ChildResult ok = run(ring_kernel<0>);
  INFO("child stderr: " << ok.err);
  CHECK(ok.exit_code == 0);
  const tg_test::ChildResult early = run(ring_kernel<1>);
  INFO("child stderr: " << early.err);
  CHECK(early.exit_code == 3);
  CHECK(has(early.err, "write-after-read hazard"));
}

namespace {

// Q (64 x 64) and K (64 x 64) by TMA with the 128B swizzle, then S = Q K^T by four wgmma k-steps on
// K-major 128B descriptors, each step's start 32 bytes further along the swizzled rows: the
// layout a TMA box lands in is the one the descriptor reads (as a Hopper attention kernel uses
// them).
__global__ void tma_wgmma_kernel(const CUtensorMap q, const CUtensorMap k, float* out) {
  __shared__ uint64_t bar;
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int t = threadIdx.x;
  if (t == 0) gpu::hopper::mbarrier_init(&bar, 1);
  __syncthreads();
  if (t == 0) {
    gpu::hopper::mbarrier_arrive_expect_tx(&bar, 2 * 64 * 64 * 2);
    gpu::hopper::tma_load_2d(s, &q, 0, 0, &bar);
    gpu::hopper::tma_load_2d(s + 8192, &k, 0, 0, &bar);
  }
  gpu::hopper::mbarrier_wait_parity(&bar, 0);
  const uint32_t base = gpu::hopper::smem_u32(s);
  float d[32];
  gpu::hopper::wgmma_fence();
  for (int step = 0; step < 4; ++step)
    gpu::hopper::wgmma_bf16_ss<64>(d, gpu::hopper::make_smem_desc(base + 32 * step, 0, 1024, Swizzle::B128),
                                   gpu::hopper::make_smem_desc(base + 8192 + 32 * step, 0, 1024, Swizzle::B128), step > 0);
  gpu::hopper::wgmma_commit_group();
  gpu::hopper::wgmma_wait_group<0>();
  for (int r = 0; r < 32; ++r) out[32 * t + r] = d[r];
}

}  // namespace

TEST_CASE("hopper: TMA boxes with the 128B swizzle feed wgmma K-major 128B descriptors, k-steps 32 bytes apart (PTX ISA: cp.async.bulk.tensor, Matrix Descriptor Format)") {
  // Q[i][c] = (i + 2c) % 7 - 3, K[j][c] = (3i + c) % 5 - 2 as bf16: exact products and sums
  std::vector<uint16_t> hq(64 * 64), hk(64 * 64);
  auto qv = [](int i, int c) { return (float)((i + 2 * c) % 7 - 3); };
  auto kv = [](int j, int c) { return (float)((3 * j + c) % 5 - 2); };
  for (int i = 0; i < 64; ++i)
    for (int c = 0; c < 64; ++c) hq[(size_t)(64 * i + c)] = bf16_bits(qv(i, c)), hk[(size_t)(64 * i + c)] = bf16_bits(kv(i, c));
  uint16_t* dq = device_alloc<uint16_t>(hq.size());
  uint16_t* dk = device_alloc<uint16_t>(hk.size());
  REQUIRE(cudaMemcpy(dq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  const Tensor2d tq{64, 64, 128, dq}, tk{64, 64, 128, dk};
  const CUtensorMap mq = tq.map(64, 64, CU_TENSOR_MAP_SWIZZLE_128B), mk = tk.map(64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  float* d_out = device_alloc<float>(128 * 32);
  gpu::launch(tma_wgmma_kernel, 1, 128, 16384, nullptr, mq, mk, d_out);
  const std::vector<float> h = download(d_out, 128 * 32);
  int bad = 0;
  for (int t = 0; t < 128; ++t)
    for (int r = 0; r < 32; ++r) {
      const int row = 16 * (t / 32) + 8 * (r / 2 % 2) + t % 32 / 4, col = 8 * (r / 4) + 2 * (t % 4) + r % 2;
      float want = 0.f;
      for (int c = 0; c < 64; ++c) want += qv(row, c) * kv(col, c);
      bad += h[(size_t)(32 * t + r)] != want;
    }
  CHECK(bad == 0);
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(d_out);
}

namespace {

// Element (row, col) of 8x8 matrix m of warp w: distinct, never 0.
__host__ __device__ inline uint16_t st_value(int w, int m, int row, int col) { return (uint16_t)(1 + col + 8 * row + 64 * m + 256 * w); }

// Each warp stores four 8x8 matrices with stmatrix.x4 (matrix m's rows 16 bytes apart at byte
// 512 w + 128 m, or .trans: the same places) from the fragments the ISA gives each lane; lanes
// elected by elect.sync count themselves in out[64 + w].
template <bool Trans>
__global__ void stmatrix_kernel(uint16_t* out, int* elected) {
  unsigned char* s = gpu::dynamic_smem<unsigned char>();
  const int t = threadIdx.x, w = t / 32, l = t % 32, g = l / 4, q = l % 4;
  uint32_t r[4];
  for (int m = 0; m < 4; ++m)
    r[m] = Trans ? st_value(w, m, 2 * q, g) | (uint32_t)st_value(w, m, 2 * q + 1, g) << 16
                 : st_value(w, m, g, 2 * q) | (uint32_t)st_value(w, m, g, 2 * q + 1) << 16;
  const uint32_t row = gpu::hopper::smem_u32(s) + 512 * w + 128 * (l / 8) + 16 * (l % 8);  // matrix l / 8, row l % 8
  if (Trans) gpu::hopper::stmatrix_x4_trans(row, r);
  else gpu::hopper::stmatrix_x4(row, r);
  if (gpu::hopper::elect_one()) elected[w] += 1 + l;
  __syncthreads();
  for (int i = t; i < 512; i += blockDim.x) std::memcpy(&out[i], s + 2 * i, 2);
}

}  // namespace

TEST_CASE("hopper: stmatrix.x4 stores the fragments ldmatrix loads, plain and .trans; elect.sync elects one lane (PTX ISA: stmatrix, elect.sync)") {
  for (const bool trans : {false, true}) {
    uint16_t* d_out = device_alloc<uint16_t>(512);
    int* d_elected = device_alloc<int>(2);
    cudaMemset(d_elected, 0, 2 * sizeof(int));
    gpu::launch(trans ? stmatrix_kernel<true> : stmatrix_kernel<false>, 1, 64, 1024, nullptr, d_out, d_elected);
    const std::vector<uint16_t> h = download(d_out, 512);
    const std::vector<int> e = download(d_elected, 2);
    int bad = 0;
    for (int w = 0; w < 2; ++w)
      for (int m = 0; m < 4; ++m)
        for (int row = 0; row < 8; ++row)
          for (int col = 0; col < 8; ++col) bad += h[(size_t)(256 * w + 64 * m + 8 * row + col)] != st_value(w, m, row, col);
    INFO(".trans " << trans);
    CHECK(bad == 0);
    CHECK(e[0] == 1);  // one lane of each warp, lane 0 (the emulator's choice)
    CHECK(e[1] == 1);
    cudaFree(d_out);
    cudaFree(d_elected);
  }
}
