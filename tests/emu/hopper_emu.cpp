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
//   - TMA ("Data Movement and Conversion Instructions: cp.async.bulk.tensor"), the 2-D tile
//     load into shared memory with mbarrier::complete_tx::bytes: the tensor map is what this
//     file's stand-in of the driver's cuTensorMapEncodeTiled made (the same arguments and checks;
//     interleave none, element strides 1, zero fill, a swizzle as wide as the box's inner
//     dimension). At issue the box is read from global memory (elements outside the tensor are
//     zeros) and its shared bytes are poisoned (0xFF); it lands, row after row with the swizzle
//     applied to the shared addresses, and completes its bytes on the mbarrier, when a thread
//     test- or try-waits on that mbarrier (at issue when one already waits): a kernel reading
//     the box before any thread waited sees NaN;
//   - the race checker (tests/emu/race_checker.h) sees each 16-byte chunk of a wgmma's shared
//     operand as an async-proxy read at issue (AccessKind::AsyncRead, as the warpgroup's first
//     thread) and again as it retires (AsyncReadDone): a write to it in between is a hazard. It
//     sees a TMA box's shared chunks written at issue (BulkCopy: in flight) and as they land
//     (BulkCopyLand, after bulk_landing names the mbarrier and phase), and which phases each
//     thread saw complete (mbarrier_observed) and each arrival (mbarrier_arrived): a thread
//     touching a box before it landed, or with nothing ordering the landing before its access
//     (its own wait on the phase, a __syncthreads, or arrivals and waits of other threads that
//     saw it), is named.
//   - setmaxnreg ("Miscellaneous Instructions: setmaxnreg"): .inc and .dec are warpgroup-wide
//     rendezvous (the same instruction, with the same count, by the 128 threads of a warpgroup);
//     the count is 24 .. 256 and a multiple of 8, no lower than the warpgroup's current count for
//     .inc, no higher for .dec. The CTA's register pool starts empty, every warpgroup holding the
//     entry count; .dec gives the difference back to the pool, .inc takes it and blocks until the
//     pool holds enough, so a kernel whose warpgroups ask for more than the CTA has deadlocks, as
//     on the hardware (the launch fails naming setmaxnreg.inc). The entry count is the one ptxas
//     gives a kernel declared __launch_bounds__(its block size, 1), which setmaxnreg requires (else
//     ptxas ignores it, warning C7508): 65536 registers over the block's warpgroups' threads,
//     rounded down to a multiple of 8 (168 for 384 threads); tests/emu/test_occupancy.cpp checks
//     the Hopper forward's count in the real build against it.
//   - flags between the blocks of a launch ("Memory Consistency Model": release and acquire
//     patterns at GPU scope; kernels/hopper_ptx.cuh, flag_wait and flag_release): the blocks run
//     one after another, so a flag_wait whose value is not there yet would wait on a later block
//     (or for ever) on a GPU: it faults, naming the block, the flag and both values. The race
//     checker sees each release and acquire (Observer::flag) and orders the blocks' global
//     accesses by them.
//
// Not emulated yet: the matrix base offset field (a non-zero one faults), scale-a / scale-b of
// -1, other types and shapes, TMA stores and other ranks, multicast.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
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

// A TMA box issued and not landed: its bytes, taken from global memory at issue.
struct BulkCopy {
  std::vector<unsigned char> data;  // row after row, unswizzled
  uint32_t dst = 0;                 // shared offset of the box
  uint32_t row_bytes = 0, width = 0;  // bytes of a box row; the swizzle width (0: none)
  const void* pc = nullptr;
};

struct Mbarrier {
  Barrier phase;  // gen: phases completed (its parity is the current phase's); op names a wait
  uint32_t expected = 0, pending = 0;
  int64_t tx = 0;
  std::vector<BulkCopy> copies;  // TMA boxes that complete on it, not landed yet
  int waiters = 0;               // threads blocked in try_wait on it
};

// One mma_async as issued by a warpgroup.
struct WgmmaOp {
  int n = 0;
  bool a_in_regs = false, trans_a = false, trans_b = false, accumulate = false;
  uint64_t desc_a = 0, desc_b = 0;
  uint32_t a[kWarpgroup][4];
  float* d[kWarpgroup];
  const void* pc = nullptr;
  // shared offsets of the 16-byte chunks it reads: A's (none when A is in registers), then B's,
  // each operand's in the order of for_each_position
  static constexpr int kMaxChunks = 64 * 2 + 256 * 2;
  uint32_t chunks[kMaxChunks];
  int a_chunks = 0, nchunks = 0;
};

struct Warpgroup {
  Barrier bar;
  // one rendezvous's inputs, by thread of the warpgroup
  uint64_t desc_a[kWarpgroup], desc_b[kWarpgroup];
  uint32_t a[kWarpgroup][4];
  float* d[kWarpgroup];
  int shape[kWarpgroup];  // N, with the a-in-registers, transpose and scale-d flags above bit 9
  GroupQueue<WgmmaOp> ops;  // issued, then committed groups
  bool fenced = false;
  int regs = 0;                  // registers a thread (setmaxnreg)
  uint32_t count[kWarpgroup];    // one setmaxnreg rendezvous's counts, by thread
  int granted = 0;               // setmaxnreg.inc: the count this warpgroup's request was granted
};

struct Hopper {
  std::unordered_map<uintptr_t, Mbarrier> mbarriers;  // by address (nodes: stable references)
  std::vector<Warpgroup> warpgroups;
  int nthreads = 0;
  // setmaxnreg: each warpgroup's registers a thread (Warpgroup::regs), the CTA's pool of
  // registers no warpgroup holds, and the barrier whose generation moves when the pool grows
  long long reg_pool = 0;
  Barrier pool_grew;
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

// A shared address under the swizzle of `width` bytes (32, 64, 128; 0: none): within each 128-byte
// line, the 16-byte chunk c of a width-byte segment moves to c XOR (line mod width / 16).
uint32_t swizzle(uint32_t addr, uint32_t width) {
  return width ? addr ^ ((addr >> 7) & (width / 16 - 1)) << 4 : addr;
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

// The TMA boxes of m land: their bytes are written (swizzled) and complete on m.
void land_copies(Mbarrier& m, const void* bar) {
  std::vector<BulkCopy> copies = std::move(m.copies);
  m.copies.clear();
  for (const BulkCopy& c : copies) {
    if (g_observed) notify_bulk_landing(bar, m.phase.gen + 1);  // there once the current phase completes
    for (uint32_t i = 0; i < (uint32_t)c.data.size(); i += 16) {
      const uint32_t addr = swizzle(c.dst + i, c.width);
      std::memcpy(g_smem + addr, c.data.data() + i, 16);
      if (g_observed) engine_access(c.pc, g_smem + addr, 16, true, AccessKind::BulkCopyLand);
    }
    m.tx -= (int64_t)c.data.size();
    if (m.pending == 0) mbarrier_maybe_complete(m);
  }
}

uint64_t mbarrier_arrive_once(Mbarrier& m, const void* bar, const char* op) {
  if (m.pending == 0)
    device_fault(cudaErrorLaunchFailure, std::string(op) + ": more arrivals in one phase than the mbarrier's count (" +
                                             std::to_string(m.expected) + ")");
  const uint64_t state = m.phase.gen;
  if (g_observed) notify_mbarrier_arrived(bar, state);
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
  return swizzle(off + start, width);
}

// The 16-byte chunks of a shared operand (mn_extent x 16, mn_extent a multiple of 8): the 8
// elements from (mn, k) along the contiguous dimension (K when K-major, MN when MN-major) lie in
// one chunk whatever the swizzle, which moves whole chunks; f(mn, k) for each chunk's first.
template <class F>
void for_each_position(bool mn_major, int mn_extent, F f) {
  for (int mn = 0; mn < mn_extent; mn += mn_major ? 8 : 1)
    for (int k = 0; k < 16; k += mn_major ? 1 : 8) f(mn, k);
}

// Checks one shared operand (mn_extent x 16) at issue and lists the 16-byte chunks it reads
// after op's others.
void check_operand(uint64_t desc, bool mn_major, int mn_extent, const char* which, WgmmaOp& op) {
  if ((desc >> 49 & 7) != 0)
    device_fault(cudaErrorLaunchFailure, std::string("wgmma: the ") + which + " descriptor " + hex(desc) +
                                             " has a matrix base offset, which the emulator does not model");
  for_each_position(mn_major, mn_extent, [&](int mn, int k) {
    const uint32_t off = operand_offset(desc, mn_major, mn, k);
    for (int e = 0; e < 8; ++e)
      if ((size_t)off + 2 * e + 2 > g_smem_bytes)
        device_fault(cudaErrorIllegalAddress, std::string("wgmma: the ") + which + " descriptor " + hex(desc) +
                                                  " reaches shared byte " + std::to_string(off + 2 * e) + " (element " +
                                                  std::to_string(mn + (mn_major ? e : 0)) + ", k " +
                                                  std::to_string(k + (mn_major ? 0 : e)) + "), past the " +
                                                  std::to_string(g_smem_bytes) + " bytes of dynamic shared memory");
    op.chunks[op.nchunks++] = off;
  });
}

// execute's loops over its own fixed arrays, and over the shared operands' chunks that
// check_operand bounded at issue, run unchecked (TG_EMU_UNCHECKED: the checks of each element
// were most of an emulated Hopper case's time in execute); the accumulators, the kernel's, are
// copied in and out whole, checked.

// Reads one shared operand (its chunks listed at issue by check_operand) as floats: element
// (mn, k) to out[mn * mn_step + k * k_step].
// (for_each_position's loops, written out: a lambda would not share the function's attribute)
TG_EMU_UNCHECKED void read_operand(const uint32_t* chunks, bool mn_major, int mn_extent, float* out, int mn_step,
                                   int k_step) {
  const int step = mn_major ? mn_step : k_step;
  for (int mn = 0; mn < mn_extent; mn += mn_major ? 8 : 1)
    for (int k = 0; k < 16; k += mn_major ? 1 : 8) {
      uint16_t v[8];
      std::memcpy(v, g_smem + *chunks++, sizeof v);
      float* o = out + mn * mn_step + k * k_step;
      for (int e = 0; e < 8; ++e) {
        const uint32_t u = (uint32_t)v[e] << 16;
        std::memcpy(o + e * step, &u, 4);
      }
    }
}

// A (64 x 16) from the warpgroup's registers: thread i's register r holds the pair of row
// 16 (i / 32) + (i % 32) / 4 + 8 (r % 2), columns 2 (i % 4) + 8 (r / 2) and the one after
TG_EMU_UNCHECKED void a_from_registers(const uint32_t (&a)[kWarpgroup][4], float (&A)[64][16]) {
  for (int i = 0; i < kWarpgroup; ++i) {
    const int row = 16 * (i / 32) + (i % 32) / 4, col = 2 * (i % 4);
    for (int r = 0; r < 4; ++r) {
      const int m = row + 8 * (r % 2), k = col + 8 * (r / 2);
      const uint32_t v = a[i][r];
      uint32_t lo = v << 16, hi = v & 0xffff0000u;
      std::memcpy(&A[m][k], &lo, 4);
      std::memcpy(&A[m][k + 1], &hi, 4);
    }
  }
}

// D (64 x n) as the warpgroup's threads hold it: thread i's register r is row
// 16 (i / 32) + (i % 32) / 4 + 8 ((r / 2) % 2), column 8 (r / 4) + 2 (i % 4) + r % 2: registers
// 4j, 4j + 1 and 4j + 2, 4j + 3 are two pairs of columns 8j + 2 (i % 4), 8 rows apart.
// to_d: acc (each thread's n / 2 registers) into D; else D into acc.
TG_EMU_UNCHECKED void move_d(float (&acc)[kWarpgroup][128], float (&D)[64][256], int n, bool to_d) {
  for (int i = 0; i < kWarpgroup; ++i) {
    const int row = 16 * (i / 32) + (i % 32) / 4, col = 2 * (i % 4);
    for (int j = 0; j < n / 8; ++j)
      for (int h = 0; h < 2; ++h) {
        float* d = &D[row + 8 * h][8 * j + col];
        float* r = &acc[i][4 * j + 2 * h];
        if (to_d) d[0] = r[0], d[1] = r[1];
        else r[0] = d[0], r[1] = d[1];
      }
  }
}

// Runs one mma_async: reads the shared operands now, writes every thread's accumulators.
void execute(const WgmmaOp& op) {
  const int n = op.n;
  const size_t bytes = (size_t)n / 2 * sizeof(float);  // a thread's accumulators
  static float A[64][16], B[16][256], D[64][256], acc[kWarpgroup][128];
  if (!op.a_in_regs) read_operand(op.chunks, op.trans_a, 64, &A[0][0], 16, 1);
  else a_from_registers(op.a, A);
  read_operand(op.chunks + op.a_chunks, op.trans_b, n, &B[0][0], 1, 256);
  for (int i = 0; i < kWarpgroup; ++i)
    if (op.accumulate) std::memcpy(acc[i], op.d[i], bytes);
    else std::memset(acc[i], 0, bytes);
  move_d(acc, D, n, true);
  tensor_core_mma(&D[0][0], 256, &A[0][0], &B[0][0], 256, 64, n);
  move_d(acc, D, n, false);
  for (int i = 0; i < kWarpgroup; ++i) std::memcpy(op.d[i], acc[i], bytes);
}

// Delivers the chunks of an operation to the observers as the warpgroup's first thread.
void report_chunks(const WgmmaOp& op, AccessKind kind, int warpgroup) {
  if (!g_observed) return;
  Thread* self = g_thread;
  g_thread = &cta_thread(kWarpgroup * warpgroup);
  for (int c = 0; c < op.nchunks; ++c) engine_access(op.pc, g_smem + op.chunks[c], 16, false, kind);
  g_thread = self;
}

}  // namespace

void hopper_cta_begin(int nthreads) {
  Hopper& h = hop();
  h.mbarriers.clear();
  h.nthreads = nthreads;
  h.warpgroups.resize((size_t)(nthreads + kWarpgroup - 1) / kWarpgroup);
  const int entry = setmaxnreg_entry_count(nthreads);
  for (Warpgroup& w : h.warpgroups) {
    w.bar = Barrier{};
    w.bar.expected = kWarpgroup;
    w.ops.reset();
    w.fenced = false;
    w.regs = entry;
    w.granted = 0;
  }
  h.reg_pool = 0;
  h.pool_grew = Barrier{};
  h.pool_grew.op = "setmaxnreg.inc (waiting for the CTA's register pool)";
}

int setmaxnreg_entry_count(int nthreads) {
  const int warpgroups = (nthreads + kWarpgroup - 1) / kWarpgroup;
  return std::min(256, 65536 / (warpgroups * kWarpgroup) / 8 * 8);
}

// setmaxnreg.{inc,dec}.sync.aligned.u32 count: see the file's header.
void setmaxnreg(bool inc, uint32_t count) {
  const char* const op = inc ? "setmaxnreg.inc" : "setmaxnreg.dec";
  if (count < 24 || count > 256 || count % 8 != 0)
    device_fault(cudaErrorLaunchFailure, std::string(op) + " with a count of " + std::to_string(count) +
                                             " (the PTX ISA allows 24 .. 256, a multiple of 8)");
  Hopper& h = hop();
  Warpgroup& w = my_warpgroup(op);
  const int wg = g_thread->linear / kWarpgroup;
  w.count[g_thread->linear % kWarpgroup] = count;
  rendezvous(w.bar, op, [&w, &h, inc, op, wg] {
    for (int t = 1; t < kWarpgroup; ++t)
      if (w.count[t] != w.count[0])
        device_fault(cudaErrorLaunchFailure, std::string(op) + ": threads 0 and " + std::to_string(t) + " of warpgroup " +
                                                 std::to_string(wg) + " gave different counts");
    const int c = (int)w.count[0];
    if (inc ? c < w.regs : c > w.regs)
      device_fault(cudaErrorLaunchFailure, std::string(op) + " " + std::to_string(c) + " in warpgroup " + std::to_string(wg) +
                                               ", which holds " + std::to_string(w.regs) + " registers a thread (" +
                                               (inc ? ".inc may only raise the count)" : ".dec may only lower it)"));
    if (!inc) {
      h.reg_pool += (long long)(w.regs - c) * kWarpgroup;
      w.regs = c;
      ++h.pool_grew.gen;  // the waiting .inc requests look again
    } else {
      w.granted = 0;
    }
  });
  if (!inc) return;
  // .inc: the warpgroup's request is granted once, by whichever of its threads finds the pool
  // holding enough; the others find it granted
  while (w.granted == 0) {
    const long long need = (long long)((int)w.count[0] - w.regs) * kWarpgroup;
    if (h.reg_pool >= need) {
      h.reg_pool -= need;
      w.regs = (int)w.count[0];
      w.granted = w.regs;
      break;
    }
    block_until_next(h.pool_grew);
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

uint64_t mbarrier_arrive(void* bar) {
  return mbarrier_arrive_once(mbarrier_at(bar, "mbarrier.arrive", false), bar, "mbarrier.arrive");
}

uint64_t mbarrier_arrive_expect_tx(void* bar, uint32_t bytes) {
  Mbarrier& m = mbarrier_at(bar, "mbarrier.arrive.expect_tx", false);
  m.tx += bytes;
  return mbarrier_arrive_once(m, bar, "mbarrier.arrive.expect_tx");
}

void mbarrier_expect_tx(void* bar, uint32_t bytes) { mbarrier_at(bar, "mbarrier.expect_tx", false).tx += bytes; }

void mbarrier_complete_tx(void* bar, uint32_t bytes) {
  Mbarrier& m = mbarrier_at(bar, "mbarrier.complete_tx", false);
  m.tx -= bytes;
  if (m.pending == 0) mbarrier_maybe_complete(m);
}

bool mbarrier_test_wait_parity(void* bar, uint32_t parity) {
  Mbarrier& m = mbarrier_at(bar, "mbarrier.test_wait.parity", false);
  land_copies(m, bar);
  const bool done = (m.phase.gen & 1) != (parity & 1);
  if (done && g_observed) notify_mbarrier_observed(bar, m.phase.gen);
  return done;
}

bool mbarrier_try_wait_parity(void* bar, uint32_t parity) {
  Mbarrier& m = mbarrier_at(bar, "mbarrier.try_wait.parity", false);
  land_copies(m, bar);
  while ((m.phase.gen & 1) == (parity & 1)) {
    ++m.waiters;
    block_until_next(m.phase);
    --m.waiters;
  }
  if (g_observed) notify_mbarrier_observed(bar, m.phase.gen);
  return true;
}

// ---- TMA ---------------------------------------------------------------------------------------
namespace {
// What the stand-in of cuTensorMapEncodeTiled keeps in a CUtensorMap's 128 opaque bytes.
struct MapFields {
  uint64_t magic;
  uint64_t address;
  uint64_t dim[5];
  uint64_t stride[4];  // bytes, of dimensions 1 .. rank - 1
  uint32_t box[5];
  uint32_t rank, elem_bytes, width;  // width: swizzle bytes, 0 for none
};
static_assert(sizeof(MapFields) <= sizeof(CUtensorMap), "the fields fit the opaque map");
constexpr uint64_t kMapMagic = 0x54474d4150454d55ull;

CUresult refuse(CUresult r, const std::string& why) {
  std::fprintf(stderr, "SIMT emulator: cuTensorMapEncodeTiled: %s\n", why.c_str());
  return r;
}
}  // namespace

void tma_load_2d(void* dst, const void* map, int c0, int c1, void* bar) {
  const char* op = "cp.async.bulk.tensor.2d (TMA load)";
  const void* pc = __builtin_return_address(0);
  MapFields f;
  std::memcpy(&f, map, sizeof f);
  if (f.magic != kMapMagic) device_fault(cudaErrorLaunchFailure, std::string(op) + " with a CUtensorMap that cuTensorMapEncodeTiled did not make");
  if (f.rank != 2) device_fault(cudaErrorLaunchFailure, std::string(op) + " with a tensor map of rank " + std::to_string(f.rank));
  const uint32_t row_bytes = f.box[0] * f.elem_bytes, bytes = row_bytes * f.box[1];
  // The box's innermost coordinate must start on 16 bytes (the H100 stops such a copy with an
  // illegal instruction, measured; the rows may start anywhere, before or past the tensor)
  if ((long long)c0 * f.elem_bytes % 16 != 0)
    device_fault(cudaErrorIllegalInstruction, std::string(op) + ": the box's innermost coordinate " + std::to_string(c0) +
                                                  " is not on 16 bytes (" + std::to_string(f.elem_bytes) +
                                                  "-byte elements): a GPU stops there with an illegal instruction");
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(g_smem);
  if (d % 128 != 0) device_fault(cudaErrorMisalignedAddress, std::string(op) + ": shared destination not 128-byte aligned");
  if (d + bytes > g_smem_bytes)
    device_fault(cudaErrorIllegalAddress, std::string(op) + ": the " + std::to_string(bytes) + "-byte box at shared byte " +
                                              std::to_string(d) + " runs past the dynamic shared memory");
  Mbarrier& m = mbarrier_at(bar, op, false);
  BulkCopy c;
  c.data.assign(bytes, 0);  // outside the tensor: zeros
  c.dst = (uint32_t)d;
  c.row_bytes = row_bytes;
  c.width = f.width;
  c.pc = pc;
  for (uint32_t r = 0; r < f.box[1]; ++r) {
    const long long y = (long long)c1 + r;
    if (y < 0 || y >= (long long)f.dim[1]) continue;
    const long long x0 = std::max<long long>(c0, 0), x1 = std::min<long long>((long long)c0 + f.box[0], (long long)f.dim[0]);
    if (x0 >= x1) continue;
    const unsigned char* src = reinterpret_cast<const unsigned char*>(f.address + (uint64_t)y * f.stride[0] + (uint64_t)x0 * f.elem_bytes);
    const uint32_t n = (uint32_t)(x1 - x0) * f.elem_bytes;
    std::string why;
    if (!device_range_ok(src, n, &why)) device_fault(cudaErrorIllegalAddress, std::string(op) + ": source " + why);
    std::memcpy(c.data.data() + r * row_bytes + (x0 - c0) * f.elem_bytes, src, n);
    if (g_observed) engine_access(pc, src, n, false, AccessKind::BulkCopy);
  }
  for (uint32_t i = 0; i < bytes; i += 16) {  // in flight: undefined until it lands
    const uint32_t addr = swizzle(c.dst + i, c.width);
    std::memset(g_smem + addr, 0xFF, 16);
    if (g_observed) engine_access(pc, g_smem + addr, 16, true, AccessKind::BulkCopy);
  }
  m.copies.push_back(std::move(c));
  if (m.waiters) land_copies(m, bar);  // a thread already waits on it: nothing else would land the box
}

void fence_proxy_async() {
  if (g_observed) notify_proxy_fence();
}

void flag_wait(const int* flag, int value) {
  if (reinterpret_cast<uintptr_t>(flag) % 4 != 0)
    device_fault(cudaErrorMisalignedAddress, "ld.acquire.gpu.b32 of a flag not 4-byte aligned");
  const int now = *flag;
  if (now != value) {
    const uint3 b = g_block_idx;
    device_fault(cudaErrorLaunchFailure,
                 "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) +
                     ") waits for the flag at " + describe_device_address(flag) + " to hold " + std::to_string(value) +
                     "; it holds " + std::to_string(now) +
                     ". The emulator runs a launch's blocks one after another, so no earlier block stored the value: "
                     "on a GPU this block would wait for a later one, or for ever");
  }
  if (g_observed) notify_flag(flag, false);
}

void flag_release(int* flag, int value) {
  if (reinterpret_cast<uintptr_t>(flag) % 4 != 0)
    device_fault(cudaErrorMisalignedAddress, "st.relaxed.gpu.b32 of a flag not 4-byte aligned");
  if (g_observed) notify_flag(flag, true);
  *flag = value;
}

// ld.relaxed.gpu: the value, no order (the blocks before this one have run: it is their last store)
int flag_peek(const int* flag) {
  if (reinterpret_cast<uintptr_t>(flag) % 4 != 0)
    device_fault(cudaErrorMisalignedAddress, "ld.relaxed.gpu.b32 of a flag not 4-byte aligned");
  return *flag;
}

// fence.acq_rel.gpu: the acquire of what the last release of `peeked` carries (the peek before
// it read that release's value, or the kernel waits after it), then the release of `release`
void flag_handover(int* release, int value, const int* peeked) {
  if (peeked) {
    if (reinterpret_cast<uintptr_t>(peeked) % 4 != 0)
      device_fault(cudaErrorMisalignedAddress, "a peeked flag not 4-byte aligned");
    if (g_observed) notify_flag(peeked, false);
  }
  if (release) flag_release(release, value);
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
    w.ops.open.emplace_back();
    WgmmaOp& op = w.ops.open.back();
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
    if (!op.a_in_regs) check_operand(op.desc_a, op.trans_a, 64, "A", op);
    op.a_chunks = op.nchunks;
    check_operand(op.desc_b, op.trans_b, op.n, "B", op);
    report_chunks(op, AccessKind::AsyncRead, wg);
    if (g_observed) notify_mma(4 * wg, 2ull * 64 * op.n * 16);
  });
}

void wgmma_commit_group() {
  Warpgroup& w = my_warpgroup("wgmma.commit_group");
  rendezvous(w.bar, "wgmma.commit_group", [&w] { w.ops.commit(); });
}

void wgmma_wait_group(int n) {
  Warpgroup& w = my_warpgroup("wgmma.wait_group");
  const int wg = g_thread->linear / kWarpgroup;
  rendezvous(w.bar, "wgmma.wait_group", [&w, n, wg] {
    w.ops.retire_until(n, [wg](const WgmmaOp& op) {
      execute(op);
      report_chunks(op, AccessKind::AsyncReadDone, wg);
    });
    w.fenced = false;
  });
}

}  // namespace emu

// The driver's cuTensorMapEncodeTiled, with its argument meaning and its checks (cuda.h's
// account of them), for what the emulator's TMA copies: interleave none, element strides 1, the
// zero fill, and a swizzle whose width is the box's inner dimension in bytes. What it cannot
// emulate is refused with CUDA_ERROR_NOT_SUPPORTED, a broken rule with CUDA_ERROR_INVALID_VALUE,
// each said on stderr.
extern "C" CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                           const cuuint64_t* dim, const cuuint64_t* strides, const cuuint32_t* box,
                                           const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                           CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill oob) {
  using emu::refuse;
  static const uint32_t kBytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};  // UINT8 .. TFLOAT32_FTZ
  if (!map || !dim || !box || !element_strides || (rank > 1 && !strides)) return refuse(CUDA_ERROR_INVALID_VALUE, "a null argument");
  if ((unsigned)type >= sizeof kBytes / sizeof kBytes[0]) return refuse(CUDA_ERROR_NOT_SUPPORTED, "packed data types are not emulated");
  if (rank < 1 || rank > 5) return refuse(CUDA_ERROR_INVALID_VALUE, "rank " + std::to_string(rank) + " (1 .. 5)");
  if (reinterpret_cast<uintptr_t>(address) % 16 != 0) return refuse(CUDA_ERROR_INVALID_VALUE, "global address not 16-byte aligned");
  if (!emu::device_range_ok(address, 1, nullptr)) return refuse(CUDA_ERROR_INVALID_VALUE, "global address outside device memory");
  if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) return refuse(CUDA_ERROR_NOT_SUPPORTED, "interleaved layouts are not emulated");
  if (oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) return refuse(CUDA_ERROR_NOT_SUPPORTED, "only the zero fill is emulated");
  emu::MapFields f{};
  f.magic = emu::kMapMagic;
  f.address = reinterpret_cast<uint64_t>(address);
  f.rank = rank;
  f.elem_bytes = kBytes[type];
  for (cuuint32_t i = 0; i < rank; ++i) {
    if (dim[i] == 0 || dim[i] > (1ull << 32)) return refuse(CUDA_ERROR_INVALID_VALUE, "globalDim[" + std::to_string(i) + "] not in 1 .. 2^32");
    if (box[i] == 0 || box[i] > 256) return refuse(CUDA_ERROR_INVALID_VALUE, "boxDim[" + std::to_string(i) + "] not in 1 .. 256");
    if (element_strides[i] == 0 || element_strides[i] > 8) return refuse(CUDA_ERROR_INVALID_VALUE, "elementStrides not in 1 .. 8");
    if (i > 0 && element_strides[i] != 1) return refuse(CUDA_ERROR_NOT_SUPPORTED, "element strides other than 1 are not emulated");
    f.dim[i] = dim[i];
    f.box[i] = box[i];
    if (i + 1 < rank) {
      if (strides[i] % 16 != 0 || strides[i] >= (1ull << 40))
        return refuse(CUDA_ERROR_INVALID_VALUE, "globalStrides[" + std::to_string(i) + "] not a multiple of 16 below 2^40");
      f.stride[i] = strides[i];
    }
  }
  const uint32_t inner = box[0] * f.elem_bytes;
  if (inner % 16 != 0) return refuse(CUDA_ERROR_INVALID_VALUE, "boxDim[0] times the element size not a multiple of 16 bytes");
  f.width = swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 32 : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64 : swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 128 : 0;
  if (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE && f.width == 0) return refuse(CUDA_ERROR_NOT_SUPPORTED, "this swizzle mode is not emulated");
  if (f.width && inner > f.width) return refuse(CUDA_ERROR_INVALID_VALUE, "the box's inner dimension exceeds the swizzle width");
  if (f.width && inner != f.width)
    return refuse(CUDA_ERROR_NOT_SUPPORTED, "a swizzled box narrower than its swizzle width is not emulated");
  std::memset(map, 0, sizeof *map);
  std::memcpy(map, &f, sizeof f);
  return CUDA_SUCCESS;
}
