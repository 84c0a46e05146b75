// tests/gpu/test_hopper_ptx.cu: the Hopper instructions of kernels/hopper_ptx.cuh against the PTX
// ISA, on the device the suite runs on: an H100 (compute capability 9.0), or the emulator, whose
// execution of them (tests/emu/hopper_emu.cpp) these cases hold. mbarrier phases, arrivals and
// transaction counts; wgmma m64nNk16 bf16 with A from shared memory or registers, K-major and
// MN-major operands in every swizzle mode, compared lane by lane with the ISA's accumulator
// fragment; the asynchronous completion at wgmma.wait_group; TMA 2-D loads (the box's layout,
// swizzle and zero fill; boxes feeding wgmma); stmatrix and elect.sync. Skipped on any other
// device (the instructions exist on sm_90a alone; this file is built for it alone).
//
// The expected results come from this file's own reading of the ISA: the operands are laid out
// in shared memory by the canonical layouts written as the ISA's shape : stride table
// ("Shared Memory Matrix Layout"), and the swizzle as its description of the 16-byte chunks
// permuted within each 128-byte line; neither the emulator nor the kernels share this code. The
// faults and races the emulator reports about these instructions: tests/emu/test_hopper.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../../kernels/cuda_common.cuh"
#include "../../kernels/hopper_ptx.cuh"
#include "gpu_util.cuh"
#include "hopper_test_util.cuh"

namespace {

using gpu::hopper::Swizzle;
using tg_test::device_alloc;
using tg_test::download;
using tg_test::bf16_bits;
using tg_test::Tensor2d;

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

}  // namespace

TG_HOPPER_TEST("hopper: mbarrier phases complete on arrivals and transaction bytes; parity waits (PTX ISA: mbarrier)") {
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

namespace {

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
  float* early;  // (128, N / 2): the accumulators read between issue and wait (emulated only)
};

// C[row][col] = row - col: the accumulators' value before the wgmma
__device__ __forceinline__ float c_init(int row, int col) { return (float)(row - col); }

template <int N, int TransA, int TransB, bool RegA>
__global__ void wgmma_kernel(WgmmaArgs p) {
  unsigned char* s = gpu::hopper::align_1024(gpu::dynamic_smem<unsigned char>());
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
#ifdef TG_SIMT_EMULATION  // (on a GPU, reading them here would make ptxas serialize the wgmma)
  for (int r = 0; r < N / 2; ++r) p.early[t * (N / 2) + r] = d[r];
#endif
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
  const int smem = bytes + 1024;  // and the slack that aligns the image to 1024 bytes
  if (smem > 48 * 1024) REQUIRE(cudaFuncSetAttribute((const void*)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess);
  gpu::launch(kernel, 1, 128, (size_t)smem, nullptr, args);
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
      stale_bad += tg_test::kEmulated && early[(size_t)(t * (N / 2) + r)] != (float)(row - col);
    }
  const std::string what = "N " + std::to_string(N) + ", trans-a " + std::to_string(TransA) + ", trans-b " +
                           std::to_string(TransB) + (RegA ? ", A in registers" : "") + ", swizzle modes " +
                           std::to_string((int)sa) + " / " + std::to_string((int)sb) + ": " + first;
  INFO(what);
  CHECK(bad == 0);
  CHECK(stale_bad == 0);  // emulated: before the wait_group the accumulators still hold C
  cudaFree(d_image);
  cudaFree(d_frag);
  cudaFree(d_out);
  cudaFree(d_early);
}

}  // namespace

TG_HOPPER_TEST("hopper: wgmma m64nNk16 bf16, K-major operands in every swizzle mode (PTX ISA: wgmma, Matrix Descriptor Format, Shared Memory Matrix Layout)") {
  check_wgmma(shape<8, 0, 0, false>(), Swizzle::None, Swizzle::None, 0, 0, false, 1);
  check_wgmma(shape<16, 0, 0, false>(), Swizzle::B32, Swizzle::B32, 0, 0, true, 2);
  check_wgmma(shape<64, 0, 0, false>(), Swizzle::B64, Swizzle::B64, 16, 0, true, 3);       // A's k 16..31 of a 64 B row
  check_wgmma(shape<128, 0, 0, false>(), Swizzle::B128, Swizzle::B128, 16, 32, false, 4);  // k steps inside 128 B rows
  check_wgmma(shape<256, 0, 0, false>(), Swizzle::B128, Swizzle::B128, 48, 48, true, 5);
}

TG_HOPPER_TEST("hopper: wgmma m64nNk16 bf16, MN-major (transposed) operands (PTX ISA: wgmma imm-trans-a / imm-trans-b, Shared Memory Matrix Layout)") {
  check_wgmma(shape<64, 0, 1, false>(), Swizzle::B128, Swizzle::B128, 0, 0, true, 6);  // P V: V stored (keys, head dims)
  check_wgmma(shape<32, 1, 1, false>(), Swizzle::None, Swizzle::B64, 0, 0, false, 7);
  check_wgmma(shape<16, 1, 0, false>(), Swizzle::B32, Swizzle::None, 0, 0, true, 8);
  check_wgmma(shape<256, 1, 1, false>(), Swizzle::B128, Swizzle::B32, 0, 0, true, 9);
}

TG_HOPPER_TEST("hopper: wgmma m64nNk16 bf16 with A from registers (PTX ISA: wgmma, Register Fragments: A of .m64nNk16)") {
  check_wgmma(shape<64, 0, 0, true>(), Swizzle::None, Swizzle::B128, 0, 16, true, 10);
  check_wgmma(shape<128, 0, 1, true>(), Swizzle::None, Swizzle::B128, 0, 0, false, 11);
  check_wgmma(shape<8, 0, 1, true>(), Swizzle::None, Swizzle::None, 0, 0, true, 12);
}

namespace {

// Two groups in flight (PTX ISA, wgmma.commit_group and wgmma.wait_group): d0 = A B + d0 in the
// first, d1 = A B (scale-d 0) in the second; wait_group 1 retires only the first. (Emulated, d1 is
// also read between the two waits, where it still holds its old value; on a GPU that read is
// undefined, and ptxas would serialize the wgmmas for it, so there it is left out.)
__global__ void wgmma_groups_kernel(const unsigned char* image, int bytes, uint64_t desc_a, uint64_t desc_b, float* out) {
  unsigned char* s = gpu::hopper::align_1024(gpu::dynamic_smem<unsigned char>());
  const int t = threadIdx.x;
  for (int i = t; i < bytes; i += blockDim.x) s[i] = image[i];
  gpu::hopper::fence_proxy_async();
  __syncthreads();
  const uint64_t base = gpu::hopper::smem_u32(s) >> 4;
  float d0[4] = {1.f, 1.f, 1.f, 1.f}, d1[4] = {-5.f, -5.f, -5.f, -5.f};
  gpu::hopper::wgmma_fence();
  gpu::hopper::wgmma_bf16_ss<8>(d0, desc_a + base, desc_b + base, true);
  gpu::hopper::wgmma_commit_group();
  gpu::hopper::wgmma_bf16_ss<8>(d1, desc_a + base, desc_b + base, false);
  gpu::hopper::wgmma_commit_group();
  gpu::hopper::wgmma_wait_group<1>();
  out[t] = d0[0];
#ifdef TG_SIMT_EMULATION
  out[128 + t] = d1[0];
#endif
  gpu::hopper::wgmma_wait_group<0>();
  out[256 + t] = d1[0];
}

}  // namespace

TG_HOPPER_TEST("hopper: wgmma results land at the wait_group that retires their group (PTX ISA: wgmma.commit_group, wgmma.wait_group)") {
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
  gpu::launch(wgmma_groups_kernel, 1, 128, image.size() + 1024, nullptr, (const unsigned char*)d_image, (int)image.size(),
              descriptor(pa), descriptor(pb), d_out);
  const std::vector<float> h = download(d_out, 384);
  int bad_first = 0, bad_pending = 0, bad_second = 0;
  for (int t = 0; t < 128; ++t) {
    bad_first += h[(size_t)t] != 33.f;  // retired by wait_group 1
    bad_pending += tg_test::kEmulated && h[(size_t)(128 + t)] != -5.f;
    bad_second += h[(size_t)(256 + t)] != 32.f;  // retired by wait_group 0
  }
  CHECK(bad_first == 0);
  CHECK(bad_pending == 0);
  CHECK(bad_second == 0);
  cudaFree(d_image);
  cudaFree(d_out);
}

TG_HOPPER_TEST("hopper: a TMA 2-D load lands its box row after row, swizzled, zeros outside the tensor (PTX ISA: cp.async.bulk.tensor; Tensors: Tiled Mode, its bounding box and out-of-bound access)") {
  Tensor2d a{100, 37, 208};
  a.upload();
  const CUtensorMap wide = a.map(64, 16, CU_TENSOR_MAP_SWIZZLE_128B), narrow = a.map(16, 5, CU_TENSOR_MAP_SWIZZLE_NONE);
  uint16_t* d_out = device_alloc<uint16_t>(kTmaBytes / 2);
  gpu::launch(tma_kernel<0>, 1, 128, kTmaSmem, nullptr, wide, narrow, d_out);
  const std::vector<uint16_t> h = download(d_out, kTmaBytes / 2);
  int bad = 0;
  std::string first;
  auto expect = [&](uint32_t addr, uint16_t want) {
    if (h[addr / 2] != want && bad++ == 0)
      first = "shared byte " + std::to_string(addr) + ": " + std::to_string(h[addr / 2]) + ", want " + std::to_string(want);
  };
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 64; ++c) expect(swizzled((uint32_t)(128 * r + 2 * c), Swizzle::B128), a.at(56 + c, 30 + r));
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 16; ++c) expect((uint32_t)(2048 + 32 * r + 2 * c), a.at(-8 + c, -2 + r));
  INFO(first);
  CHECK(bad == 0);
  cudaFree(d_out);
  cudaFree(a.dev);
}

namespace {

// Q (64 x 64) and K (64 x 64) by TMA with the 128B swizzle, then S = Q K^T by four wgmma k-steps on
// K-major 128B descriptors, each step's start 32 bytes further along the swizzled rows: the
// layout a TMA box lands in is the one the descriptor reads (as a Hopper attention kernel uses
// them).
__global__ void tma_wgmma_kernel(const __grid_constant__ CUtensorMap q, const __grid_constant__ CUtensorMap k, float* out) {
  __shared__ uint64_t bar;
  unsigned char* s = gpu::hopper::align_1024(gpu::dynamic_smem<unsigned char>());
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

TG_HOPPER_TEST("hopper: TMA boxes with the 128B swizzle feed wgmma K-major 128B descriptors, k-steps 32 bytes apart (PTX ISA: cp.async.bulk.tensor, Matrix Descriptor Format)") {
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
  gpu::launch(tma_wgmma_kernel, 1, 128, 16384 + 1024, nullptr, mq, mk, d_out);
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
// elect.sync's answer goes to elected[t].
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
  elected[t] = gpu::hopper::elect_one() ? 1 : 0;
  __syncthreads();
  for (int i = t; i < 512; i += blockDim.x) std::memcpy(&out[i], s + 2 * i, 2);
}

}  // namespace

TG_HOPPER_TEST("hopper: stmatrix.x4 stores the fragments ldmatrix loads, plain and .trans; elect.sync elects one lane (PTX ISA: stmatrix, elect.sync)") {
  for (const bool trans : {false, true}) {
    uint16_t* d_out = device_alloc<uint16_t>(512);
    int* d_elected = device_alloc<int>(64);
    gpu::launch(trans ? stmatrix_kernel<true> : stmatrix_kernel<false>, 1, 64, 1024, nullptr, d_out, d_elected);
    const std::vector<uint16_t> h = download(d_out, 512);
    const std::vector<int> e = download(d_elected, 64);
    int bad = 0;
    for (int w = 0; w < 2; ++w)
      for (int m = 0; m < 4; ++m)
        for (int row = 0; row < 8; ++row)
          for (int col = 0; col < 8; ++col) bad += h[(size_t)(256 * w + 64 * m + 8 * row + col)] != st_value(w, m, row, col);
    INFO(".trans " << trans);
    CHECK(bad == 0);
    // one lane of each warp (the ISA does not say which; the emulator elects lane 0)
    for (int w = 0; w < 2; ++w) {
      int count = 0, first = -1;
      for (int l = 0; l < 32; ++l)
        if (e[(size_t)(32 * w + l)] == 1 && count++ == 0) first = l;
      INFO("warp " << w << ": " << count << " lanes elected, the first " << first);
      CHECK(count == 1);
      if (tg_test::kEmulated) CHECK(first == 0);
    }
    cudaFree(d_out);
    cudaFree(d_elected);
  }
}
