// tests/emu/simt_emulator.h: a host emulator of the CUDA execution model, just large enough to
// run the REAL flash-attention kernels (kernels/flash_attn_fwd.cu, kernels/flash_attn_bwd.cu)
// on a CPU, compiled by g++ as C++. It is what lets CI (no GPU) execute those kernels.
//
// How it is used. A kernel translation unit (tests/emu/flash_*_emu.cpp) is compiled with
// -DTG_SIMT_EMULATION -I$(CUDA_HOME)/include, includes this header first and then the kernel
// source unmodified. The CUDA host headers provide dim3, __nv_bfloat16 and its conversions;
// __device__, __global__, __shared__ expand to nothing on a host compiler. With
// TG_SIMT_EMULATION defined, kernels/flash_attn_common.cuh leaves out its hardware section
// (the inline-PTX wrappers and launch()), and this header provides, in namespace gpu::flash,
// functions of the same names and signatures:
//   smem_u32, cp_async_16, cp_async_commit, cp_async_wait<N>, ldmatrix_x4, ldmatrix_x4_trans,
//   mma_bf16_16816, launch(ctx, kernel, grid, threads, smem_bytes, params);
// and, globally, threadIdx / blockIdx / blockDim / gridDim, __syncthreads, __shfl_sync,
// __shfl_xor_sync. The kernels' `extern __shared__ unsigned char smem[]` binds to the array
// gpu::flash::(anonymous)::smem defined below (a block-scope extern declaration names the
// entity of its innermost enclosing namespace, which for these kernels is that unnamed one).
//
// Execution model. launch() runs the CTAs of the grid one after another; inside a CTA every
// CUDA thread is a fiber (ucontext, its own guarded stack) and all fibers run on the calling
// OS thread, switched cooperatively at barriers: so a run is deterministic. The schedule is
// warp-major (one warp runs until all its lanes wait at __syncthreads, then the next), the
// largest skew between warps that the barriers allow, and its order can be changed on purpose
// (set_schedule: warps and lanes ascending or descending, alternating from one CTA to the
// next). Lane l of warp w is thread 32w + l.
//
// What is faithful:
//   - __syncthreads is a CTA-wide barrier; a thread that exits, or reaches a different
//     barrier or warp collective while the others wait, is reported (deadlock / mismatch),
//     never silently tolerated.
//   - warp collectives (__shfl_sync, __shfl_xor_sync, ldmatrix, mma.sync) are warp-wide
//     rendezvous: all 32 lanes must arrive at the same operation (full mask only); the values
//     are exchanged after the last lane arrives, so a lane can only see its partners' inputs
//     of the same call.
//   - ldmatrix.sync.aligned.m8n8.x4[.trans].b16: lanes 8m .. 8m+7 give the row addresses of
//     matrix m; lane l receives M_m[l/4][2(l%4), +1] (plain) or M_m[2(l%4), +1][l/4] (.trans),
//     low column in the low half: the PTX ISA fragment layout. Every row address must be
//     16-byte aligned and its 16 bytes inside the launch's dynamic shared memory.
//   - mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: A, B and C/D fragments decoded
//     and encoded exactly as the PTX ISA figures "Matrix Fragments for mma.m16n8k16" (bf16);
//     bf16 products are exact in fp32, the 16 products are added to C in k order with fmaf.
//   - cp.async.cg 16 bytes with zero-fill (src-size 0): issued copies are queued per thread,
//     the destination is poisoned (0xFF bytes: NaN in bf16 and fp32) at issue and written only
//     when the issuing thread's cp.async.wait_group retires its group -- a legal and
//     adversarial schedule: reading a tile before waiting, or refilling a stage that another
//     warp still reads, yields NaN. Source and destination must be 16-byte aligned, the
//     destination inside dynamic shared memory, and the source (even when src-size is 0)
//     inside a global buffer registered with GlobalBuffer, whenever any is registered.
//   - dynamic shared memory: filled with 0xFF at the start of every CTA; the launch checks
//     the size against the sm_80 limit (163 KB), and a canary past the requested bytes is
//     checked after every CTA (stores past the end are reported).
//   - launch configuration: whole warps, at most 1024 threads, grid.y and grid.z <= 65535.
//
// What it cannot show:
//   - timing and performance of any kind (occupancy, bank conflicts, coalescing, spills);
//   - data races other than barrier misuse: fibers switch only at barriers and collectives,
//     so two threads racing on shared or global memory between barriers are not detected
//     (only the warp-major order and the cp.async landing schedule above are adversarial);
//   - exact hardware rounding: the tensor-core accumulation order and internal precision, and
//     the device exp2f / expf / logf (ulp-level differences: the host libm is used); results
//     are therefore compared against the CPU spec within derived tolerances, not bit for bit;
//   - anything the PTX wrappers hide when compiled by nvcc (register allocation, the
//     generated SASS): the kernels' C++ control flow and index math is what is tested.
#pragma once
#ifndef TG_SIMT_EMULATION
#error "tests/emu/simt_emulator.h needs -DTG_SIMT_EMULATION (it replaces the PTX section of kernels/flash_attn_common.cuh)"
#endif
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#undef __launch_bounds__
#define __launch_bounds__(...)

namespace emu {

// Emulator errors (misuse found by a check) are thrown from launch() as this type.
struct Error : std::runtime_error {
  explicit Error(const std::string& m) : std::runtime_error("SIMT emulator: " + m) {}
};

constexpr size_t kMaxDynamicSmem = 163 * 1024;  // sm_80 opt-in limit (sm_90: 227 KB)
constexpr size_t kSmemCanary = 256;             // checked bytes past the requested size
constexpr size_t kSmemArena = kMaxDynamicSmem + kSmemCanary;
constexpr size_t kFiberStack = 256 * 1024;
constexpr uint8_t kPoison = 0xFF, kCanaryByte = 0xA5;

// A barrier of `expected` arrivals; `op` names the operation the first arrival reached (all
// must reach the same one).
struct Barrier {
  int expected = 0, arrived = 0;
  uint64_t gen = 0;
  const char* op = nullptr;
};

struct Copy {
  unsigned char* dst;
  const unsigned char* src;
  bool valid;
};

struct Fiber {
  ucontext_t ctx;
  unsigned char* stack = nullptr;  // kFiberStack usable bytes above one guard page
  uint3 tid;
  int lane = 0, warp = 0;
  bool done = false;
  const Barrier* waiting = nullptr;  // blocked on this barrier until its gen moves on
  uint64_t wait_gen = 0;
  std::vector<Copy> open;                 // cp.async issued, not yet committed
  std::deque<std::vector<Copy>> groups;   // committed groups, oldest first
};

// Per warp: the rendezvous barrier and the exchange slots of one collective (inputs written by
// each lane before it arrives, outputs written by the last lane through the out pointers).
struct Warp {
  Barrier bar;
  uint64_t in[32][6];
  void* out[32];
};

struct State {
  ucontext_t sched;                   // the scheduler (the launching thread's own context)
  std::vector<Fiber> fibers;          // one per CUDA thread of the current CTA
  std::vector<Warp> warps;
  Barrier cta_bar;
  Fiber* cur = nullptr;               // the running fiber, null on the host side
  uint3 block_idx{0, 0, 0};
  dim3 grid_dim, block_dim;
  unsigned char* smem = nullptr;      // the dynamic shared memory of the current launch
  size_t smem_bytes = 0;
  const std::function<void()>* body = nullptr;
  std::string error;                  // first error of the current launch
  int schedule = 0;                   // 0 or 1: fiber order of even CTAs ascending / descending
  long long launches = 0, ctas = 0;
  std::vector<std::pair<const unsigned char*, size_t>> globals;  // registered global buffers
};

inline State& st() {
  static State s;
  return s;
}

// ---- errors ---------------------------------------------------------------------------------
// Inside a kernel: records the error (with the thread) and abandons the whole CTA; launch()
// then throws. On the host: throws at once.
[[noreturn]] inline void fail(const std::string& what) {
  State& s = st();
  if (!s.cur) throw Error(what);
  if (s.error.empty())
    s.error = what + " (block " + std::to_string(s.block_idx.x) + "," + std::to_string(s.block_idx.y) + "," +
              std::to_string(s.block_idx.z) + ", thread " + std::to_string(s.cur->tid.x) + ")";
  s.cur->done = true;
  swapcontext(&s.cur->ctx, &s.sched);
  std::abort();  // never resumed
}

// ---- barriers -----------------------------------------------------------------------------
// Arrive at b for operation op. The last arrival runs on_last() (the data exchange of a warp
// collective) before anyone is released, then goes on; the others yield to the scheduler
// until the barrier's generation moves on.
template <typename F>
inline void arrive(Barrier& b, const char* op, F&& on_last) {
  State& s = st();
  if (b.arrived == 0) b.op = op;
  else if (std::strcmp(b.op, op) != 0)
    fail(std::string("threads of one barrier group reached different operations: ") + b.op + " and " + op);
  if (++b.arrived == b.expected) {
    on_last();
    b.arrived = 0;
    ++b.gen;
    return;
  }
  Fiber* f = s.cur;
  f->waiting = &b;
  f->wait_gen = b.gen;
  swapcontext(&f->ctx, &s.sched);
}

inline Warp& my_warp() { return st().warps[st().cur->warp]; }

// ---- global buffers (the "device allocations" cp.async may read) ----------------------------
class GlobalBuffer {
 public:
  GlobalBuffer(const void* p, size_t bytes) : p_(static_cast<const unsigned char*>(p)) {
    st().globals.emplace_back(p_, bytes);
  }
  ~GlobalBuffer() {
    auto& g = st().globals;
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i].first == p_) {
        g.erase(g.begin() + (long)i);
        break;
      }
  }
  GlobalBuffer(const GlobalBuffer&) = delete;
  GlobalBuffer& operator=(const GlobalBuffer&) = delete;

 private:
  const unsigned char* p_;
};

inline bool in_globals(const unsigned char* p, size_t n) {
  const auto& g = st().globals;
  if (g.empty()) return true;
  for (const auto& b : g)
    if (p >= b.first && p + n <= b.first + b.second) return true;
  return false;
}

// Order of warps and lanes: 0 = ascending in even CTAs, descending in odd ones; 1 = the reverse.
inline void set_schedule(int s) { st().schedule = s & 1; }
inline long long launch_count() { return st().launches; }

// ---- the CTA scheduler ------------------------------------------------------------------------
inline void fiber_entry() {
  State& s = st();
  (*s.body)();
  s.cur->done = true;  // returning resumes uc_link = the scheduler
}

inline unsigned char* new_stack() {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void* m = mmap(nullptr, kFiberStack + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw Error("mmap of a fiber stack failed");
  mprotect(m, page, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
  return static_cast<unsigned char*>(m) + page;
}

// Runs one CTA of nthreads threads to completion (or to the first error).
inline void run_cta(int nthreads, bool descending) {
  State& s = st();
  while ((int)s.fibers.size() < nthreads) {
    s.fibers.emplace_back();
    s.fibers.back().stack = new_stack();
  }
  s.warps.assign(nthreads / 32, Warp{});
  for (auto& w : s.warps) w.bar.expected = 32;
  s.cta_bar = Barrier{};
  s.cta_bar.expected = nthreads;
  for (int t = 0; t < nthreads; ++t) {
    Fiber& f = s.fibers[t];
    f.tid = uint3{(unsigned)t, 0, 0};
    f.lane = t % 32;
    f.warp = t / 32;
    f.done = false;
    f.waiting = nullptr;
    f.open.clear();
    f.groups.clear();
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kFiberStack;
    f.ctx.uc_link = &s.sched;
    makecontext(&f.ctx, fiber_entry, 0);
  }
  // Warp-major: one warp runs (its lanes round-robin, switching at each collective) until all
  // its lanes wait at __syncthreads or have exited, then the next warp: the largest legal skew
  // between warps, so a missing __syncthreads between a stage's last read and its refill shows.
  const int nwarps = nthreads / 32;
  for (;;) {
    bool alive = false, ran = false;
    for (int wi = 0; wi < nwarps; ++wi) {
      const int w = descending ? nwarps - 1 - wi : wi;
      for (bool again = true; again;) {
        again = false;
        for (int li = 0; li < 32; ++li) {
          Fiber& f = s.fibers[32 * w + (descending ? 31 - li : li)];
          if (f.done) continue;
          alive = true;
          if (f.waiting && f.waiting->gen == f.wait_gen) continue;  // still blocked
          f.waiting = nullptr;
          s.cur = &f;
          swapcontext(&s.sched, &f.ctx);
          s.cur = nullptr;
          ran = again = true;
          if (!s.error.empty()) return;
        }
      }
    }
    if (!alive) return;
    if (!ran) {  // every live thread waits on a barrier that can never complete
      int exited = 0;
      std::string ops;
      for (int t = 0; t < nthreads; ++t) {
        const Fiber& f = s.fibers[t];
        if (f.done) ++exited;
        else if (ops.find(f.waiting->op) == std::string::npos) ops += std::string(ops.empty() ? "" : ", ") + f.waiting->op;
      }
      s.error = "deadlock in block " + std::to_string(s.block_idx.x) + "," + std::to_string(s.block_idx.y) + ": " +
                std::to_string(nthreads - exited) + " threads wait (at " + ops + "), " + std::to_string(exited) +
                " have exited";
      return;
    }
  }
}

// Runs body() as a kernel over grid x threads with smem_bytes of dynamic shared memory at smem.
inline void launch_grid(dim3 grid, int threads, size_t smem_bytes, unsigned char* smem,
                        const std::function<void()>& body) {
  State& s = st();
  if (s.cur) throw Error("launch from inside a kernel");
  if (threads < 32 || threads > 1024 || threads % 32 != 0)
    throw Error("block of " + std::to_string(threads) + " threads (need whole warps, at most 1024)");
  if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u)
    throw Error("grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) +
                ") out of range");
  if (smem_bytes > kMaxDynamicSmem)
    throw Error(std::to_string(smem_bytes) + " bytes of dynamic shared memory (sm_80 allows 163 KB)");
  ++s.launches;
  s.grid_dim = grid;
  s.block_dim = dim3((unsigned)threads, 1, 1);
  s.smem = smem;
  s.smem_bytes = smem_bytes;
  s.body = &body;
  s.error.clear();
  long long linear = 0;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x, ++linear) {
        s.block_idx = uint3{x, y, z};
        std::memset(smem, kPoison, smem_bytes);
        std::memset(smem + smem_bytes, kCanaryByte, kSmemCanary);
        ++s.ctas;
        run_cta(threads, ((linear & 1) ^ s.schedule) != 0);
        if (!s.error.empty()) throw Error(s.error);
        for (size_t i = 0; i < kSmemCanary; ++i)
          if (smem[smem_bytes + i] != kCanaryByte)
            throw Error("store past the " + std::to_string(smem_bytes) + " bytes of dynamic shared memory (block " +
                        std::to_string(x) + "," + std::to_string(y) + "," + std::to_string(z) + ")");
      }
  s.smem = nullptr;
  s.body = nullptr;
}

inline unsigned char* smem_at(uint32_t off, size_t n, const char* who) {
  const State& s = st();
  if ((size_t)off + n > s.smem_bytes)
    fail(std::string(who) + ": shared address " + std::to_string(off) + " + " + std::to_string(n) +
         " past the dynamic shared memory (" + std::to_string(s.smem_bytes) + " bytes)");
  return s.smem + off;
}

template <typename V>
inline V shfl(unsigned mask, V v, int src_lane, const char* op) {
  static_assert(sizeof(V) <= sizeof(uint64_t), "shuffled values are at most 64 bits");
  if (mask != 0xffffffffu) fail(std::string(op) + " with a partial mask (the emulator supports full warps only)");
  Warp& w = my_warp();
  const int lane = st().cur->lane;
  V r;
  std::memcpy(&w.in[lane][0], &v, sizeof v);
  w.in[lane][1] = (uint64_t)(src_lane & 31);
  w.out[lane] = &r;
  arrive(w.bar, op, [&w] {
    for (int l = 0; l < 32; ++l) std::memcpy(w.out[l], &w.in[w.in[l][1]][0], sizeof(V));
  });
  return r;
}

inline float bf16_lo(uint32_t reg) {
  const uint32_t u = reg << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float bf16_hi(uint32_t reg) {
  const uint32_t u = reg & 0xffff0000u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace emu

// ---- the CUDA built-ins the kernels use ---------------------------------------------------------
#define threadIdx (emu::st().cur->tid)
#define blockIdx (emu::st().block_idx)
#define blockDim (emu::st().block_dim)
#define gridDim (emu::st().grid_dim)

inline void __syncthreads() { emu::arrive(emu::st().cta_bar, "__syncthreads", [] {}); }
template <typename V>
inline V __shfl_sync(unsigned mask, V v, int src_lane) {
  return emu::shfl(mask, v, src_lane, "__shfl_sync");
}
template <typename V>
inline V __shfl_xor_sync(unsigned mask, V v, int lane_mask) {
  return emu::shfl(mask, v, emu::st().cur->lane ^ lane_mask, "__shfl_xor_sync");
}
using std::max;  // the device code's global min / max on int
using std::min;

#include "../../kernels/cuda_common.cuh"

// ---- the PTX wrappers of kernels/flash_attn_common.cuh --------------------------------------------
namespace gpu {
namespace flash {

// The shared-window address of p: its byte offset in the dynamic shared memory.
inline uint32_t smem_u32(const void* p) {
  const emu::State& s = emu::st();
  const unsigned char* q = static_cast<const unsigned char*>(p);
  if (q < s.smem || q >= s.smem + s.smem_bytes) emu::fail("smem_u32 of a pointer outside the dynamic shared memory");
  return (uint32_t)(q - s.smem);
}

// cp.async.cg.shared.global 16 bytes, src-size 16 or 0 (zero fill): queued, see the header.
inline void cp_async_16(void* smem, const void* gmem, bool valid) {
  emu::State& s = emu::st();
  unsigned char* d = static_cast<unsigned char*>(smem);
  const unsigned char* g = static_cast<const unsigned char*>(gmem);
  if ((uintptr_t)d % 16 != 0 || (uintptr_t)g % 16 != 0) emu::fail("cp.async 16 with a misaligned address");
  if (d < s.smem || d + 16 > s.smem + s.smem_bytes) emu::fail("cp.async destination outside the dynamic shared memory");
  if (!emu::in_globals(g, 16)) emu::fail("cp.async source outside every registered global buffer");
  std::memset(d, emu::kPoison, 16);  // in flight: undefined until the wait
  s.cur->open.push_back({d, g, valid});
}
inline void cp_async_commit() {
  emu::Fiber& f = *emu::st().cur;
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
// cp.async.wait_group N: the oldest groups land until at most N are pending.
template <int N>
inline void cp_async_wait() {
  auto& groups = emu::st().cur->groups;
  while ((int)groups.size() > N) {
    for (const emu::Copy& c : groups.front()) {
      if (c.valid) std::memcpy(c.dst, c.src, 16);
      else std::memset(c.dst, 0, 16);
    }
    groups.pop_front();
  }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16
inline void ldmatrix_x4_impl(uint32_t (&r)[4], uint32_t addr, bool trans, const char* op) {
  if (addr % 16 != 0) emu::fail(std::string(op) + ": row address not 16-byte aligned");
  emu::smem_at(addr, 16, op);
  emu::Warp& w = emu::my_warp();
  const int lane = emu::st().cur->lane;
  w.in[lane][0] = addr;
  w.out[lane] = r;
  emu::arrive(w.bar, op, [&w, trans] {
    auto elem = [&w](int m, int row, int col) {  // element (row, col) of 8x8 matrix m
      uint16_t v;
      std::memcpy(&v, emu::st().smem + w.in[8 * m + row][0] + 2 * col, 2);
      return (uint32_t)v;
    };
    for (int l = 0; l < 32; ++l) {
      uint32_t* out = static_cast<uint32_t*>(w.out[l]);
      const int g = l / 4, t = l % 4;
      for (int m = 0; m < 4; ++m)
        out[m] = trans ? (elem(m, 2 * t, g) | elem(m, 2 * t + 1, g) << 16) : (elem(m, g, 2 * t) | elem(m, g, 2 * t + 1) << 16);
    }
  });
}
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { ldmatrix_x4_impl(r, addr, false, "ldmatrix.x4"); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  ldmatrix_x4_impl(r, addr, true, "ldmatrix.x4.trans");
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d (16 x 8) += a (16 x 16) b (16 x 8).
inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::Warp& w = emu::my_warp();
  const int lane = emu::st().cur->lane;
  for (int k = 0; k < 4; ++k) w.in[lane][k] = a[k];
  w.in[lane][4] = b0;
  w.in[lane][5] = b1;
  w.out[lane] = d;
  emu::arrive(w.bar, "mma.m16n8k16", [&w] {
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      const uint32_t a0 = (uint32_t)w.in[l][0], a1 = (uint32_t)w.in[l][1], a2 = (uint32_t)w.in[l][2],
                     a3 = (uint32_t)w.in[l][3], r0 = (uint32_t)w.in[l][4], r1 = (uint32_t)w.in[l][5];
      A[g][2 * t] = emu::bf16_lo(a0), A[g][2 * t + 1] = emu::bf16_hi(a0);
      A[g + 8][2 * t] = emu::bf16_lo(a1), A[g + 8][2 * t + 1] = emu::bf16_hi(a1);
      A[g][2 * t + 8] = emu::bf16_lo(a2), A[g][2 * t + 9] = emu::bf16_hi(a2);
      A[g + 8][2 * t + 8] = emu::bf16_lo(a3), A[g + 8][2 * t + 9] = emu::bf16_hi(a3);
      B[2 * t][g] = emu::bf16_lo(r0), B[2 * t + 1][g] = emu::bf16_hi(r0);
      B[2 * t + 8][g] = emu::bf16_lo(r1), B[2 * t + 9][g] = emu::bf16_hi(r1);
    }
    for (int l = 0; l < 32; ++l) {
      float* acc = static_cast<float*>(w.out[l]);
      const int g = l / 4, t = l % 4;
      for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
        float c = acc[e];
        for (int k = 0; k < 16; ++k) c = std::fmaf(A[row][k], B[k][col], c);
        acc[e] = c;
      }
    }
  });
}

namespace {
// The kernels' `extern __shared__ unsigned char smem[]` (one arena per translation unit; the
// CTAs run one at a time).
[[maybe_unused]] alignas(16) unsigned char smem[emu::kSmemArena];

// kernel<<<grid, threads, smem_bytes, ctx.stream>>>(p), emulated; throws emu::Error.
template <typename P>
[[maybe_unused]] void launch(const Context& ctx, void (*kernel)(P), dim3 grid, int threads, size_t smem_bytes,
                             const P& p) {
  (void)ctx;
  const std::function<void()> body = [kernel, &p] { kernel(p); };
  emu::launch_grid(grid, threads, smem_bytes, smem, body);
}
}  // namespace

}  // namespace flash
}  // namespace gpu
