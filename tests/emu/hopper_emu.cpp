// tests/emu/hopper_emu.cpp: the Hopper (sm_90a) instructions of kernels/hopper_ptx.cuh, emulated
// (their device-side declarations are in tests/emu/simt_emulator.h; kernels/hopper_ptx.cuh's
// header says what each instruction does).
//
// What is faithful (each from the PTX ISA section named):
//   - mbarrier ("Parallel Synchronization and Communication Instructions: mbarrier"): the
//     object's expected and pending arrival counts, tx-count and phase, kept beside the 8 bytes
//     of shared memory it lives in (dynamic or a static __shared__ variable; 8-byte aligned);
//     init, arrive, expect_tx, arrive.expect_tx, complete_tx; a phase completes when its pending
//     arrivals are 0 and its tx-count is 0 (tx-count may go below 0 while complete_tx runs ahead
//     of expect_tx), then the parity flips and the pending count is reset. test_wait.parity
//     answers at once; try_wait.parity blocks the thread until the phase of that parity has
//     completed (as a try_wait whose time limit never runs out), so a kernel spinning on it
//     costs no time, and when every live thread of the CTA waits on something that can never
//     complete the launch fails as a deadlock naming the mbarrier wait. An mbarrier used before
//     its init in this CTA, an init count outside [1, 2^20 - 1], or more arrivals in one phase
//     than the count are faults. A CTA's mbarriers are forgotten when it ends;
//   - wgmma ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions"):
//     wgmma.fence, mma_async, commit_group and wait_group are warpgroup-wide rendezvous: the 128
//     threads of warps 4i .. 4i+3 must all reach the same instruction (a CTA whose last
//     warpgroup is incomplete faults there), with the same descriptors, shape and scale-d.
//     mma_async .m64nNk16.f32.bf16.bf16 (N a multiple of 8 up to 256): A from the registers'
//     fragment (captured at issue) or from a matrix descriptor, B from a descriptor, K-major or
//     MN-major (imm-trans), descriptors decoded field by field ("Matrix Descriptor Format") with
//     the canonical layouts and the 32B, 64B and 128B swizzles ("Shared Memory Matrix Layout");
//     every element's address must lie inside the launch's dynamic shared memory, checked at
//     issue. The operation is queued at issue and executes when the wait_group that retires its
//     group runs: only then are the shared operands read and the accumulators written, so a
//     kernel reading its accumulators before the wait sees the old values. The accumulator
//     array must therefore live (in the kernel's frame) until that wait, as registers would. A
//     mma_async with no wgmma.fence since the CTA began or since the warpgroup's last wait_group
//     is a fault (the ISA requires the fence before the first wgmma and after the registers are
//     touched; code that waits and then issues more wgmma touches them in practice). Products
//     of bf16 are exact in fp32; the 16 are added to the accumulator in k order with fmaf, or as
//     the tensor cores round in the hardware-rounding mode (tests/emu/hw_rounding.h).
//   - the race checker (tests/emu/race_checker.h) sees each 16-byte chunk of a shared operand as
//     an async-proxy read at issue (AccessKind::AsyncRead, as the warpgroup's first thread) and
//     again as it retires (AsyncReadDone): a write to it in between is a hazard.
//
// Not emulated yet: the matrix base offset field (a non-zero one faults), scale-a / scale-b of
// -1, other types and shapes, TMA (cp.async.bulk.tensor), and ordering by mbarrier phases in the
// race checker (accesses ordered only by an mbarrier look unordered to it).
#include <cuda_runtime.h>

#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "access_hook.h"
#include "emu_internal.h"
#include "hw_rounding.h"
#include "simt_emulator.h"

namespace emu {

namespace {

constexpr int kWarpgroup = 128;

struct Mbarrier {
  Barrier phase;  // gen: phases completed (its parity is the current phase's); op names a wait
  uint32_t expected = 0, pending = 0;
  int64_t tx = 0;
};

// One mma_async as issued by a warpgroup.
struct WgmmaOp {
  int n = 0;
  bool a_in_regs = false, trans_a = false, trans_b = false, accumulate = false;
  uint64_t desc_a = 0, desc_b = 0;
  uint32_t a[kWarpgroup][4];
  float* d[kWarpgroup];
  const void* pc = nullptr;
  std::vector<uint32_t> chunks;  // shared offsets of the 16-byte chunks it reads
};

struct Warpgroup {
  Barrier bar;
  // one rendezvous's inputs, by thread of the warpgroup
  uint64_t desc_a[kWarpgroup], desc_b[kWarpgroup];
  uint32_t a[kWarpgroup][4];
  float* d[kWarpgroup];
  int shape[kWarpgroup];  // N, with the a-in-registers, transpose and scale-d flags above bit 9
  std::vector<WgmmaOp> open;                 // issued, not yet committed
  std::deque<std::vector<WgmmaOp>> groups;   // committed, oldest first
  bool fenced = false;
};

struct Hopper {
  std::unordered_map<uintptr_t, Mbarrier> mbarriers;  // by address (nodes: stable references)
  std::vector<Warpgroup> warpgroups;
  int nthreads = 0;
};

Hopper& hop() {
  static Hopper h;
  return h;
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", (unsigned long long)v);
  return buf;
}

// ---- mbarrier ----------------------------------------------------------------------------------
Mbarrier& mbarrier_at(const void* p, const char* op, bool init) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const bool shared = (a - reinterpret_cast<uintptr_t>(g_smem) + 8 <= g_smem_bytes) || static_shared(a);
  if (!shared) device_fault(cudaErrorIllegalAddress, std::string(op) + " on an address outside shared memory");
  if (a % 8 != 0) device_fault(cudaErrorMisalignedAddress, std::string(op) + " on an address not 8-byte aligned");
  Hopper& h = hop();
  auto it = h.mbarriers.find(a);
  if (it == h.mbarriers.end()) {
    if (!init) device_fault(cudaErrorLaunchFailure, std::string(op) + " on an mbarrier not initialised in this block");
    it = h.mbarriers.emplace(a, Mbarrier{}).first;
  }
  return it->second;
}

// The current phase completes when nothing is pending: the parity flips, the count is reset.
void mbarrier_maybe_complete(Mbarrier& m) {
  if (m.pending == 0 && m.tx == 0) {
    m.pending = m.expected;
    ++m.phase.gen;
  }
}

uint64_t mbarrier_arrive_once(Mbarrier& m, const char* op) {
  if (m.pending == 0)
    device_fault(cudaErrorLaunchFailure, std::string(op) + ": more arrivals in one phase than the mbarrier's count (" +
                                             std::to_string(m.expected) + ")");
  const uint64_t state = m.phase.gen;
  --m.pending;
  mbarrier_maybe_complete(m);
  return state;
}

// ---- wgmma -------------------------------------------------------------------------------------
Warpgroup& my_warpgroup(const char* op) {
  Hopper& h = hop();
  const int wg = g_thread->linear / kWarpgroup;
  if (kWarpgroup * (wg + 1) > h.nthreads)
    device_fault(cudaErrorLaunchFailure, std::string(op) + " in warpgroup " + std::to_string(wg) +
                                             ", which the block's " + std::to_string(h.nthreads) +
                                             " threads do not fill (a warpgroup is 4 whole warps)");
  return h.warpgroups[(size_t)wg];
}

float bf16_at(uint32_t off) {
  uint16_t v;
  std::memcpy(&v, g_smem + off, 2);
  const uint32_t u = (uint32_t)v << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The shared offset of element (mn, k) of a 16-deep bf16 operand that descriptor `desc`
// describes ("Matrix Descriptor Format", "Shared Memory Matrix Layout"); mn_major: the operand is
// transposed (imm-trans 1).
uint32_t operand_offset(uint64_t desc, bool mn_major, int mn, int k) {
  const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4;
  const uint32_t lbo = (uint32_t)(desc >> 16 & 0x3FFF) << 4;
  const uint32_t sbo = (uint32_t)(desc >> 32 & 0x3FFF) << 4;
  const uint32_t mode = (uint32_t)(desc >> 62);
  const uint32_t width = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0;  // swizzle row bytes
  uint32_t off;
  if (width == 0) {  // core matrices of 8 rows x 16 bytes, LBO apart along K, SBO along MN
    off = mn_major ? (mn / 8) * sbo + (k / 8) * lbo + (k % 8) * 16 + (mn % 8) * 2
                   : (mn / 8) * sbo + (k / 8) * lbo + (mn % 8) * 16 + (k % 8) * 2;
  } else if (!mn_major) {  // rows of `width` bytes along K, 8-row atoms SBO apart along MN
    off = (mn / 8) * sbo + (mn % 8) * width + k * 2;
  } else {  // rows of `width` bytes along MN, 8 k-rows an atom; atoms LBO apart along MN, SBO along K
    const uint32_t per_row = width / 2;
    off = (mn / per_row) * lbo + (k / 8) * sbo + (k % 8) * width + (mn % per_row) * 2;
  }
  off += start;
  if (width) off ^= ((off >> 7) & (width / 16 - 1)) << 4;  // the 16-byte chunk XOR the row in the pattern
  return off;
}

// Checks one shared operand (mn_extent x 16) at issue and lists the 16-byte chunks it reads.
void check_operand(uint64_t desc, bool mn_major, int mn_extent, const char* which, std::vector<uint32_t>& chunks) {
  if ((desc >> 49 & 7) != 0)
    device_fault(cudaErrorLaunchFailure, std::string("wgmma: the ") + which + " descriptor " + hex(desc) +
                                             " has a matrix base offset, which the emulator does not model");
  for (int mn = 0; mn < mn_extent; ++mn)
    for (int k = 0; k < 16; ++k) {
      const uint32_t off = operand_offset(desc, mn_major, mn, k);
      if ((size_t)off + 2 > g_smem_bytes)
        device_fault(cudaErrorIllegalAddress, std::string("wgmma: the ") + which + " descriptor " + hex(desc) +
                                                  " reaches shared byte " + std::to_string(off) + " (element " +
                                                  std::to_string(mn) + ", k " + std::to_string(k) + "), past the " +
                                                  std::to_string(g_smem_bytes) + " bytes of dynamic shared memory");
      // each chunk is 8 elements along the contiguous dimension: count it at its first element
      if ((mn_major ? mn : k) % 8 == 0) chunks.push_back(off);
    }
}

// Runs one mma_async: reads the shared operands now, writes every thread's accumulators.
void execute(const WgmmaOp& op) {
  const int n = op.n;
  static float A[64][16], B[16][256];
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < 16; ++k) A[m][k] = op.a_in_regs ? 0.f : bf16_at(operand_offset(op.desc_a, op.trans_a, m, k));
  if (op.a_in_regs)
    for (int i = 0; i < kWarpgroup; ++i) {
      const int row = 16 * (i / 32) + (i % 32) / 4, col = 2 * (i % 4);
      for (int r = 0; r < 4; ++r) {
        const int m = row + 8 * (r % 2), k = col + 8 * (r / 2);
        const uint32_t v = op.a[i][r];
        uint32_t lo = v << 16, hi = v & 0xffff0000u;
        std::memcpy(&A[m][k], &lo, 4);
        std::memcpy(&A[m][k + 1], &hi, 4);
      }
    }
  for (int k = 0; k < 16; ++k)
    for (int j = 0; j < n; ++j) B[k][j] = bf16_at(operand_offset(op.desc_b, op.trans_b, j, k));
  const int block = hw_rounding_block();
  for (int i = 0; i < kWarpgroup; ++i) {
    float* d = op.d[i];
    const int w = i / 32, g = (i % 32) / 4, t = i % 4;
    for (int r = 0; r < n / 2; ++r) {
      const int row = 16 * w + g + 8 * ((r / 2) % 2), col = 8 * (r / 4) + 2 * t + r % 2;
      float c = op.accumulate ? d[r] : 0.f;
      if (block) {
        c = tensor_core_dot(c, &A[row][0], 1, &B[0][col], 256, 16, block);
      } else {
        for (int k = 0; k < 16; ++k) c = std::fmaf(A[row][k], B[k][col], c);
      }
      d[r] = c;
    }
  }
}

// Delivers the chunks of an operation to the observers as the warpgroup's first thread.
void report_chunks(const WgmmaOp& op, AccessKind kind, int warpgroup) {
  if (!g_observed) return;
  Thread* self = g_thread;
  g_thread = &cta_thread(kWarpgroup * warpgroup);
  for (uint32_t off : op.chunks) engine_access(op.pc, g_smem + off, 16, false, kind);
  g_thread = self;
}

}  // namespace

void hopper_cta_begin(int nthreads) {
  Hopper& h = hop();
  h.mbarriers.clear();
  h.nthreads = nthreads;
  h.warpgroups.resize((size_t)(nthreads + kWarpgroup - 1) / kWarpgroup);
  for (Warpgroup& w : h.warpgroups) {
    w.bar = Barrier{};
    w.bar.expected = kWarpgroup;
    w.open.clear();
    w.groups.clear();
    w.fenced = false;
  }
}

void mbarrier_init(void* bar, uint32_t count) {
  if (count < 1 || count > (1u << 20) - 1)
    device_fault(cudaErrorLaunchFailure, "mbarrier.init with count " + std::to_string(count) + " (the PTX ISA allows 1 .. 2^20 - 1)");
  Mbarrier& m = mbarrier_at(bar, "mbarrier.init", true);
  m = Mbarrier{};
  m.phase.op = "mbarrier.try_wait.parity";
  m.expected = m.pending = count;
}

uint64_t mbarrier_arrive(void* bar) { return mbarrier_arrive_once(mbarrier_at(bar, "mbarrier.arrive", false), "mbarrier.arrive"); }

uint64_t mbarrier_arrive_expect_tx(void* bar, uint32_t bytes) {
  Mbarrier& m = mbarrier_at(bar, "mbarrier.arrive.expect_tx", false);
  m.tx += bytes;
  return mbarrier_arrive_once(m, "mbarrier.arrive.expect_tx");
}

void mbarrier_expect_tx(void* bar, uint32_t bytes) { mbarrier_at(bar, "mbarrier.expect_tx", false).tx += bytes; }

void mbarrier_complete_tx(void* bar, uint32_t bytes) {
  Mbarrier& m = mbarrier_at(bar, "mbarrier.complete_tx", false);
  m.tx -= bytes;
  if (m.pending == 0) mbarrier_maybe_complete(m);
}

bool mbarrier_test_wait_parity(void* bar, uint32_t parity) {
  const Mbarrier& m = mbarrier_at(bar, "mbarrier.test_wait.parity", false);
  return (m.phase.gen & 1) != (parity & 1);
}

bool mbarrier_try_wait_parity(void* bar, uint32_t parity) {
  Mbarrier& m = mbarrier_at(bar, "mbarrier.try_wait.parity", false);
  while ((m.phase.gen & 1) == (parity & 1)) block_until_next(m.phase);
  return true;
}

void wgmma_fence() {
  Warpgroup& w = my_warpgroup("wgmma.fence");
  rendezvous(w.bar, "wgmma.fence", [&w] { w.fenced = true; });
}

void wgmma_mma_async(float* d, int n, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, bool trans_a, bool trans_b,
                     bool accumulate) {
  static const char* const kOp = "wgmma.mma_async";
  const void* pc = __builtin_return_address(0);
  if (n < 8 || n > 256 || n % 8 != 0) device_fault(cudaErrorLaunchFailure, "wgmma.mma_async m64nNk16 with N = " + std::to_string(n));
  Warpgroup& w = my_warpgroup(kOp);
  const int i = g_thread->linear % kWarpgroup, wg = g_thread->linear / kWarpgroup;
  w.desc_a[i] = a ? 0 : desc_a;
  w.desc_b[i] = desc_b;
  w.d[i] = d;
  for (int r = 0; r < 4; ++r) w.a[i][r] = a ? a[r] : 0;
  w.shape[i] = n | (a ? 1 : 0) << 10 | (trans_a ? 1 : 0) << 11 | (trans_b ? 1 : 0) << 12 | (accumulate ? 1 : 0) << 13;
  rendezvous(w.bar, kOp, [&w, pc, wg] {
    for (int t = 1; t < kWarpgroup; ++t)
      if (w.shape[t] != w.shape[0] || w.desc_a[t] != w.desc_a[0] || w.desc_b[t] != w.desc_b[0])
        device_fault(cudaErrorLaunchFailure, "wgmma.mma_async: threads 0 and " + std::to_string(t) + " of warpgroup " +
                                                 std::to_string(wg) +
                                                 " issued it with different shapes, descriptors or scale-d");
    if (!w.fenced)
      device_fault(cudaErrorLaunchFailure, "wgmma.mma_async with no wgmma.fence since the block began or since the "
                                           "warpgroup's last wgmma.wait_group (PTX ISA: the fence orders the "
                                           "registers' earlier accesses before the wgmma)");
    w.open.emplace_back();
    WgmmaOp& op = w.open.back();
    op.n = w.shape[0] & 511;
    op.a_in_regs = (w.shape[0] >> 10) & 1;
    op.trans_a = (w.shape[0] >> 11) & 1;
    op.trans_b = (w.shape[0] >> 12) & 1;
    op.accumulate = (w.shape[0] >> 13) & 1;
    op.desc_a = w.desc_a[0];
    op.desc_b = w.desc_b[0];
    std::memcpy(op.a, w.a, sizeof op.a);
    std::memcpy(op.d, w.d, sizeof op.d);
    op.pc = pc;
    if (!op.a_in_regs) check_operand(op.desc_a, op.trans_a, 64, "A", op.chunks);
    check_operand(op.desc_b, op.trans_b, op.n, "B", op.chunks);
    report_chunks(op, AccessKind::AsyncRead, wg);
    if (g_observed) notify_mma(4 * wg, 2ull * 64 * op.n * 16);
  });
}

void wgmma_commit_group() {
  Warpgroup& w = my_warpgroup("wgmma.commit_group");
  rendezvous(w.bar, "wgmma.commit_group", [&w] {
    w.groups.push_back(std::move(w.open));
    w.open.clear();
  });
}

void wgmma_wait_group(int n) {
  Warpgroup& w = my_warpgroup("wgmma.wait_group");
  const int wg = g_thread->linear / kWarpgroup;
  rendezvous(w.bar, "wgmma.wait_group", [&w, n, wg] {
    while ((int)w.groups.size() > n) {
      for (const WgmmaOp& op : w.groups.front()) {
        execute(op);
        report_chunks(op, AccessKind::AsyncReadDone, wg);
      }
      w.groups.pop_front();
    }
    w.fenced = false;
  });
}

}  // namespace emu
