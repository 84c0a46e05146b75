// tests/emu/simt_emulator.cpp: the engine of the CUDA emulator: it executes kernels on the CPU
// (the device side is declared in tests/emu/simt_emulator.h, the runtime that queues the work
// is tests/emu/cuda_runtime_emu.cpp).
//
// Execution model. A grid runs its CTAs one after another; inside a CTA every CUDA thread is a
// fiber (its own guarded stack; a few-instruction context switch on x86-64, ucontext elsewhere)
// and all fibers run on the calling OS thread, switched cooperatively at barriers and warp
// collectives, so a run is deterministic. A thread without barriers runs start to finish in one
// go (simple elementwise kernels cost two switches per thread). The schedule is warp-major: one
// warp runs (its lanes round-robin, switching at each collective) until all its lanes wait at
// __syncthreads or have exited, then the next warp: the largest skew between warps that the
// barriers allow. Warps and lanes run ascending in even CTAs and descending in odd ones (or the
// reverse, set_schedule), so code that depends on an order the hardware does not promise gives
// different results from CTA to CTA. Lane l of warp w is the thread of linear index 32w + l
// (linear = x + y X + z X Y, as on the hardware).
//
// What is faithful:
//   - launch configuration: block and grid limits of the emulated part, dynamic shared memory
//     within the per-kernel limit (48 KB unless raised with cudaFuncSetAttribute), checked at
//     the launch (tests/emu/cuda_runtime_emu.cpp);
//   - __syncthreads is a CTA-wide barrier; a thread that exits, or reaches a different barrier
//     or warp collective while the others wait, is a fault (deadlock / mismatch), never
//     silently tolerated (the CUDA programming guide makes both undefined);
//   - warp collectives (__shfl_sync, __shfl_xor_sync, ldmatrix, mma.sync) are warp-wide
//     rendezvous: all 32 lanes must arrive at the same operation (full mask only); values are
//     exchanged after the last lane arrives, so a lane only sees its partners' inputs of the
//     same call. A full-mask collective in a warp of fewer than 32 threads is a fault;
//   - shared memory: dynamic shared memory is filled with 0xFF bytes (NaN in bf16 and fp32) at
//     the start of every CTA and, under AddressSanitizer, every byte past the launch's size is
//     poisoned, so a read or write past it is reported at once; static __shared__ arrays are
//     function-local statics (AddressSanitizer guards them as globals) that keep the previous
//     CTA's values, as the hardware gives no initial values either;
//   - global memory: kernels touch only device allocations (tests/emu/cuda_runtime_emu.cpp
//     surrounds each with poisoned red zones, and the gaps mark_no_access makes): an access
//     out of bounds is reported by AddressSanitizer, byte-exact, and the death callback below
//     names the kernel, block and thread; UndefinedBehaviorSanitizer reports a misaligned
//     vector access (a float4 or __nv_bfloat162 off its alignment) as the hardware would fault;
//   - ldmatrix.sync.aligned.m8n8.x4[.trans].b16: lanes 8m .. 8m+7 give the row addresses of
//     matrix m; lane l receives M_m[l/4][2(l%4), +1] (plain) or M_m[2(l%4), +1][l/4] (.trans),
//     low column in the low half: the PTX ISA fragment layout. Every row address must be
//     16-byte aligned and its 16 bytes inside the launch's dynamic shared memory;
//   - mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: A, B and C/D fragments decoded
//     and encoded exactly as the PTX ISA figures "Matrix Fragments for mma.m16n8k16" (bf16);
//     bf16 products are exact in fp32, the 16 products are added to C in k order with fmaf;
//   - cp.async.cg 16 bytes with zero-fill (src-size 0): issued copies are queued per thread,
//     the destination is poisoned (0xFF bytes) at issue and written only when the issuing
//     thread's cp.async.wait_group retires its group: reading a tile before waiting, or
//     refilling a stage that another warp still reads, yields NaN. Source and destination must
//     be 16-byte aligned, the destination inside dynamic shared memory, and the source (even
//     when src-size is 0) inside device memory;
//   - stmatrix.sync.aligned.m8n8.x4[.trans].shared.b16, ldmatrix's inverse (same fragments,
//     row addresses, alignment and bounds), and elect.sync with a full mask (a warp rendezvous;
//     the ISA does not say which lane is elected, the emulator elects lane 0);
//   - the Hopper mbarrier, wgmma and TMA instructions: tests/emu/hopper_emu.cpp (on the
//     rendezvous, blocking and CTA-start hooks of tests/emu/emu_internal.h).
//
// What it counts and checks: every load and store of the kernel files passes the memory hook
// (tests/emu/access_hook.h) with its thread and source line; the kernel profiler
// (tests/emu/kernel_profiler.h) turns them into sectors, coalescing, bank conflicts and tensor
// work per launch, exactly, and the race checker (tests/emu/race_checker.h) finds shared-memory
// hazards that no barrier or warp collective orders, cp.async destinations touched in flight,
// two CTAs of a launch on one byte of global memory, and reads of memory nothing wrote, whatever
// order the fibers happened to run in. Registers, spills and occupancy come from the real nvcc
// build (tests/emu/occupancy.h). The hardware-rounding mode (tests/emu/hw_rounding.h) rounds the
// tensor-core products and the device math functions as far as the published measurements and
// the documented ulp bounds allow, so that the tests' bounds are checked against them.
//
// What it cannot show:
//   - timing of any kind: no cycles, latencies, caches or overlap are modeled;
//   - races between launches on different streams, and between the threads of one CTA in
//     global memory (the race checker's global check is between CTAs);
//   - the hardware's exact rounding bit for bit: the mode bounds it (the block of products a
//     tensor core fuses is a parameter; the device functions move by their maximum error);
//   - what the compiler does to the device code (register allocation, the SASS): the kernels'
//     C++ control flow and index math is what runs.
#include "access_hook.h"
#include "emu_internal.h"
#include "hw_rounding.h"
#include "race_checker.h"
#include "simt_emulator.h"

#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TG_EMU_ASAN 1
#else
#define TG_EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace emu {

Thread* g_thread = nullptr;
uint3 g_block_idx{0, 0, 0};
dim3 g_grid_dim, g_block_dim;
unsigned char* g_smem = nullptr;
size_t g_smem_bytes = 0;

namespace {

constexpr size_t kFiberStack = 512 * 1024;  // AddressSanitizer's red zones make frames larger
constexpr size_t kSmemRedZone = 4096;
constexpr size_t kLargestSmemOptin = 232448;  // the H100's 227 KB, the largest profile's opt-in
constexpr uint8_t kPoison = 0xFF, kCanaryByte = 0xA5;
constexpr size_t kSmemCanary = 256;

// ---- context switch ---------------------------------------------------------------------------
#if defined(__x86_64__)
// tg_emu_switch(save, load): pushes the callee-saved registers, stores the stack pointer in
// *save, loads `load` and pops the registers saved there: a switch between two stacks.
extern "C" void tg_emu_switch(void** save, void* load);
asm(R"(
  .text
  .globl tg_emu_switch
  .type tg_emu_switch, @function
tg_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tg_emu_switch, .-tg_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

struct Context {
  void* sp = nullptr;
};
// A fresh context that starts entry() on [stack, stack + size): six zeroed registers, then
// entry as the return address, then a zero word, so entry starts with the stack aligned as
// after a call.
inline void context_init(Context& c, unsigned char* stack, size_t size, void (*entry)()) {
  void** top = reinterpret_cast<void**>(stack + size);  // 16-byte aligned
  top[-1] = nullptr;
  top[-2] = reinterpret_cast<void*>(entry);
  for (int i = 3; i <= 8; ++i) top[-i] = nullptr;
  c.sp = top - 8;
}
inline void context_switch(Context& from, Context& to) { tg_emu_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};
inline void context_init(Context& c, unsigned char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
inline void context_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ---- the state of a CTA -----------------------------------------------------------------------
struct Copy {
  unsigned char* dst;
  const unsigned char* src;
  bool valid;
  const void* pc;  // the issuing instruction (for observers)
};

struct Fiber : Thread {
  Context ctx;
  unsigned char* stack = nullptr;  // kFiberStack usable bytes above one guard page
  bool done = false;
  bool abandoned = false;          // left mid-function by a fault: its stack needs a clean slate
  const Barrier* waiting = nullptr;
  uint64_t wait_gen = 0;
  void* asan_fake = nullptr;
  GroupQueue<Copy> copies;  // cp.async: issued, then committed groups
};

// Per warp: the rendezvous barrier and the exchange slots of one collective (inputs written by
// each lane before it arrives, outputs written by the last lane through the out pointers).
struct Warp {
  Barrier bar;
  uint64_t in[32][6];
  void* out[32];
};

// Where the scheduling loop of a CTA stands (see next_runnable): warp index wi (in the CTA's
// order), lane index li within it, and whether the current sweep of the warp's lanes ran one
// (again), the current pass over the warps found a live thread (alive) and ran one (ran).
struct SchedState {
  int nwarps = 0, wi = 0, li = 0;
  bool descending = false, again = false, alive = false, ran = false;
};

struct Engine {
  Context sched;
  void* sched_fake = nullptr;
  const void* stack_bottom = nullptr;  // the scheduler's (host thread's) stack, for ASan
  size_t stack_size = 0;
  bool from_sched = false;  // the switch under way left the scheduler (not a fiber)
  const void* left_bottom = nullptr;  // the stack a fresh fiber was entered from
  size_t left_size = 0;
  SchedState st;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Barrier cta_bar;
  const std::function<void()>* body = nullptr;
  const void* kernel = nullptr;
  unsigned char* smem_raw = nullptr;  // red zone | max dynamic shared memory | canary | red zone
  size_t smem_max = 0;
  std::string error;
  cudaError_t error_code = cudaSuccess;
  int schedule = 0;
  long long launches = 0, ctas = 0;
};

Engine& eng() {
  static Engine e;
  return e;
}

Fiber& cur() { return *static_cast<Fiber*>(g_thread); }

std::string dim_str(uint3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

// ---- switching, with AddressSanitizer told about every stack change ---------------------------
void start_switch(void** fake, const void* bottom, size_t size) {
#if TG_EMU_ASAN
  __sanitizer_start_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}
void finish_switch(void* fake, const void** bottom_old, size_t* size_old) {
#if TG_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, bottom_old, size_old);
#else
  (void)fake, (void)bottom_old, (void)size_old;
#endif
}

// The CTA's scheduling loop, one step at a time: the next thread to run, or nullptr where the
// loop ends (a fault, every thread exited, or a pass over the warps that ran none: a deadlock;
// run_cta tells which from e.st). The order: warp by warp (descending or ascending), each warp's
// lanes swept in order, again while a sweep ran one, then the next pass. Fibers hand over to
// the next one directly (yield), so a warp collective costs one switch a lane, not two.
Fiber* next_runnable() {
  Engine& e = eng();
  if (!e.error.empty()) return nullptr;
  SchedState& s = e.st;
  for (;;) {
    const int w = s.descending ? s.nwarps - 1 - s.wi : s.wi;
    const int lanes = e.warps[w].bar.expected;
    while (s.li < lanes) {
      const int li = s.li++;
      Fiber& f = e.fibers[32 * w + (s.descending ? lanes - 1 - li : li)];
      if (f.done) continue;
      s.alive = true;
      if (f.waiting && f.waiting->gen == f.wait_gen) continue;  // still blocked
      f.waiting = nullptr;
      s.ran = s.again = true;
      return &f;
    }
    s.li = 0;
    if (s.again) {  // the sweep ran a lane: sweep the warp again
      s.again = false;
      continue;
    }
    if (++s.wi < s.nwarps) continue;
    if (!s.alive || !s.ran) return nullptr;
    s.wi = 0;
    s.alive = s.ran = false;
  }
}

// Scheduler -> fiber f; back when a fiber finds no next thread to run.
void resume(Fiber& f) {
  Engine& e = eng();
  g_thread = &f;
  e.from_sched = true;
  start_switch(&e.sched_fake, f.stack, kFiberStack);
  context_switch(e.sched, f.ctx);
  finish_switch(e.sched_fake, nullptr, nullptr);
  g_thread = nullptr;
}

// Fiber -> the next runnable one, or the scheduler where there is none. A finished fiber is
// never resumed.
void yield(bool finished) {
  Engine& e = eng();
  Fiber& f = cur();
  Fiber* n = next_runnable();
  if (n == &f) return;  // the only runnable thread: it goes on
  e.from_sched = false;
  void** fake = finished ? nullptr : &f.asan_fake;
  if (n) {
    g_thread = n;
    start_switch(fake, n->stack, kFiberStack);
    context_switch(f.ctx, n->ctx);
  } else {
    start_switch(fake, e.stack_bottom, e.stack_size);
    context_switch(f.ctx, e.sched);
  }
  finish_switch(f.asan_fake, nullptr, nullptr);
}

void fiber_main() {
  Engine& e = eng();
  // (the stack left, into members: a local whose address is taken would leave its red zones
  // poisoned at the top of the stack, since this frame never returns)
  finish_switch(nullptr, &e.left_bottom, &e.left_size);
  if (e.from_sched) {  // the stack left is the scheduler's, the one fibers return to
    e.stack_bottom = e.left_bottom;
    e.stack_size = e.left_size;
  }
  (*e.body)();
  cur().done = true;
  yield(true);
  std::abort();  // never resumed
}

unsigned char* new_stack() {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void* m = mmap(nullptr, kFiberStack + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    std::fprintf(stderr, "SIMT emulator: mmap of a fiber stack failed\n");
    std::abort();
  }
  mprotect(m, page, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
  return static_cast<unsigned char*>(m) + page;
}

// The first arrival names the operation; the last runs on_last() (the data exchange of a warp
// collective) before anyone is released; the others yield until the barrier's generation moves.
template <typename F>
void arrive(Barrier& b, const char* op, F&& on_last) {
  if (b.arrived == 0) b.op = op;
  else if (b.op != op && std::strcmp(b.op, op) != 0)  // (one literal: one pointer, mostly)
    device_fault(cudaErrorLaunchFailure,
                 std::string("threads of one barrier group reached different operations: ") + b.op + " and " + op);
  if (++b.arrived == b.expected) {
    on_last();
    b.arrived = 0;
    ++b.gen;
    return;
  }
  Fiber& f = cur();
  f.waiting = &b;
  f.wait_gen = b.gen;
  yield(false);
}

Warp& my_warp(const char* op) {
  Engine& e = eng();
  Warp& w = e.warps[cur().warp];
  if (w.bar.expected != 32)
    device_fault(cudaErrorLaunchFailure, std::string(op) + " with a full mask in a warp of " +
                                             std::to_string(w.bar.expected) + " threads (undefined on the hardware)");
  return w;
}

// ---- CTAs and grids ---------------------------------------------------------------------------
// Runs one CTA to completion (or to the first fault).
void run_cta(bool descending) {
  Engine& e = eng();
  const int bx = (int)g_block_dim.x;
  const int nthreads = (int)(g_block_dim.x * g_block_dim.y * g_block_dim.z);
  const int nwarps = (nthreads + 31) / 32;
  while ((int)e.fibers.size() < nthreads) {
    e.fibers.emplace_back();
    e.fibers.back().stack = new_stack();
  }
  e.warps.resize(nwarps);
  for (int w = 0; w < nwarps; ++w) {
    e.warps[w].bar = Barrier{};
    e.warps[w].bar.expected = std::min(32, nthreads - 32 * w);
  }
  e.cta_bar = Barrier{};
  e.cta_bar.expected = nthreads;
  hopper_cta_begin(nthreads);
  for (int t = 0; t < nthreads; ++t) {
    Fiber& f = e.fibers[t];
    f.linear = t;
    f.tid = uint3{(unsigned)(t % bx), (unsigned)(t / bx % (int)g_block_dim.y),
                  (unsigned)(t / (bx * (int)g_block_dim.y))};
    f.lane = t % 32;
    f.warp = t / 32;
    f.done = false;
    f.waiting = nullptr;
    f.copies.reset();
#if TG_EMU_ASAN
    if (f.abandoned) __asan_unpoison_memory_region(f.stack, kFiberStack);
#endif
    f.abandoned = false;
    f.asan_fake = nullptr;
    context_init(f.ctx, f.stack, kFiberStack, fiber_main);
  }
  if (g_observed) notify_cta_begin();
  e.st = SchedState{};
  e.st.nwarps = nwarps;
  e.st.descending = descending;
  if (Fiber* f = next_runnable()) resume(*f);
  if (!e.error.empty()) return;
  if (!e.st.alive) {
    if (g_observed) notify_cta_end();
    return;
  }
  // a pass that ran none: every live thread waits on a barrier that can never complete
  int exited = 0;
  std::string ops;
  for (int t = 0; t < nthreads; ++t) {
    const Fiber& f = e.fibers[t];
    if (f.done) ++exited;
    else if (ops.find(f.waiting->op) == std::string::npos) ops += std::string(ops.empty() ? "" : ", ") + f.waiting->op;
  }
  e.error = "deadlock in block " + dim_str(g_block_idx) + ": " + std::to_string(nthreads - exited) +
            " threads wait (at " + ops + "), " + std::to_string(exited) + " have exited";
  e.error_code = cudaErrorLaunchFailure;
}

void smem_poison_tail(size_t used) {
  Engine& e = eng();
#if TG_EMU_ASAN
  __asan_unpoison_memory_region(g_smem, e.smem_max + kSmemCanary);
  __asan_poison_memory_region(g_smem + used, e.smem_max + kSmemCanary - used);
#else
  std::memset(g_smem + used, kCanaryByte, kSmemCanary);
#endif
}

bool smem_canary_intact(size_t used) {
#if TG_EMU_ASAN
  (void)used;
  return true;  // AddressSanitizer reports a store past `used` at once
#else
  for (size_t i = 0; i < kSmemCanary; ++i)
    if (g_smem[used + i] != kCanaryByte) return false;
  return true;
#endif
}

// ---- the executable's symbol table, for kernel names --------------------------------------------
struct Symbols {
  std::map<uintptr_t, std::string> by_addr;  // run-time address -> mangled name
  // [begin, end) of every function-local static object ("_ZZ..." names), ascending: in device
  // code the only function-local statics are the __shared__ arrays
  std::vector<std::pair<uintptr_t, uintptr_t>> local_statics;
  Symbols() {
    uintptr_t bias = 0;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* data) {
          *static_cast<uintptr_t*>(data) = info->dlpi_addr;
          return 1;  // the first object is the executable
        },
        &bias);
    const int fd = open("/proc/self/exe", O_RDONLY);
    if (fd < 0) return;
    struct stat st {};
    fstat(fd, &st);
    void* m = mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return;
    const auto* base = static_cast<const unsigned char*>(m);
    const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
    if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64) {
      const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
      for (int i = 0; i < eh->e_shnum; ++i) {
        if (sh[i].sh_type != SHT_SYMTAB) continue;
        const auto* sym = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
        const char* names = reinterpret_cast<const char*>(base + sh[sh[i].sh_link].sh_offset);
        for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k)
          if (ELF64_ST_TYPE(sym[k].st_info) == STT_FUNC && sym[k].st_value)
            by_addr.emplace(sym[k].st_value + bias, names + sym[k].st_name);
          else if (ELF64_ST_TYPE(sym[k].st_info) == STT_OBJECT && sym[k].st_value && sym[k].st_size &&
                   std::strncmp(names + sym[k].st_name, "_ZZ", 3) == 0)
            local_statics.emplace_back(sym[k].st_value + bias, sym[k].st_value + bias + sym[k].st_size);
      }
    }
    munmap(m, (size_t)st.st_size);
    std::sort(local_statics.begin(), local_statics.end());
  }
};

const Symbols& symbols() {
  static const Symbols syms;
  return syms;
}

// Says which emulated kernel (block, thread) or which device work a sanitizer report comes
// from: `where` is "above" (AddressSanitizer's death callback, after its report) or "below"
// (UndefinedBehaviorSanitizer's report hook, before its report).
void describe_report(const char* where) {
  const Engine& e = eng();
  if (g_thread)
    std::fprintf(stderr, "SIMT emulator: the report %s comes from kernel %s, block %s, thread %s\n", where,
                 kernel_name(e.kernel).c_str(), dim_str(g_block_idx).c_str(), dim_str(g_thread->tid).c_str());
  else if (g_device_op)
    std::fprintf(stderr, "SIMT emulator: the report %s comes from device work: %s\n", where, g_device_op);
  else
    std::fprintf(stderr,
                 "SIMT emulator: the report %s comes from host code (device memory from cudaMalloc is not "
                 "accessible from the host: copy it with cudaMemcpy)\n",
                 where);
}

[[maybe_unused]] void on_sanitizer_death() { describe_report("above"); }

struct InstallDeathCallback {
  InstallDeathCallback() {
#if TG_EMU_ASAN
    __sanitizer_set_death_callback(on_sanitizer_death);
#endif
  }
} install_death_callback;

}  // namespace

// ---- public to the emulator -------------------------------------------------------------------

std::string kernel_name(const void* kernel) {
  const Symbols& syms = symbols();
  const auto it = syms.by_addr.find(reinterpret_cast<uintptr_t>(kernel));
  if (it == syms.by_addr.end()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "kernel at %p", kernel);
    return buf;
  }
  int status = 0;
  char* d = abi::__cxa_demangle(it->second.c_str(), nullptr, nullptr, &status);
  std::string name = status == 0 && d ? d : it->second;
  std::free(d);
  return name;
}

namespace {
// The local statics' span, read once; out of line, so that the symbol table's reading (and
// AddressSanitizer's frame for it) stays off the path of every observed access.
__attribute__((noinline)) std::pair<uintptr_t, uintptr_t> local_statics_span() {
  const auto& v = symbols().local_statics;
  return v.empty() ? std::pair<uintptr_t, uintptr_t>{0, 0} : std::pair<uintptr_t, uintptr_t>{v.front().first, v.back().second};
}
// The local static that holds a, searched in the symbol table's list (sorted, disjoint): true
// and its span in *o, or false and in *o the gap between the statics that a falls in. Out of line,
// so that its frame (AddressSanitizer poisons a frame's red zones at every call) stays off the
// path of every observed access.
__attribute__((noinline)) bool local_static_search(uintptr_t a, std::pair<uintptr_t, uintptr_t>* o) {
  const auto& v = symbols().local_statics;
  auto it = std::upper_bound(v.begin(), v.end(), std::make_pair(a, UINTPTR_MAX));
  const uintptr_t gap_hi = it == v.end() ? UINTPTR_MAX : it->first;
  if (it == v.begin()) {
    *o = {0, gap_hi};
    return false;
  }
  --it;
  if (a >= it->second) {
    *o = {it->second, gap_hi};
    return false;
  }
  *o = *it;
  return true;
}
}  // namespace

// Every observed access that is neither in the dynamic shared memory, on the thread's stack nor in
// device memory asks this: a kernel's static __shared__ arrays (true), and its parameters and the
// emulator's own variables that the kernel code reads (threadIdx is g_thread's, blockIdx
// g_block_idx: false, millions of times a run). Its test runs without AddressSanitizer's checks of
// its own fixed fields, as device_memory's.
__attribute__((no_sanitize("address"))) bool static_shared(uintptr_t a) {
  static const std::pair<uintptr_t, uintptr_t> span = local_statics_span();
  // the objects of the last hits, the newest replacing the oldest (a kernel's static __shared__
  // arrays are a few, used by turns: one remembered object missed at every turn), and the gaps
  // between them of the last misses (the emulator's variables lie in two)
  static std::pair<uintptr_t, uintptr_t> last[4] = {}, gaps[2] = {};
  static unsigned next = 0, next_gap = 0;
  for (const auto& o : last)
    if (a - o.first < o.second - o.first) return true;
  if (a - span.first >= span.second - span.first) return false;
  for (const auto& g : gaps)
    if (a - g.first < g.second - g.first) return false;
  std::pair<uintptr_t, uintptr_t> o;
  if (!local_static_search(a, &o)) {
    gaps[next_gap++ % 2] = o;
    return false;
  }
  last[next++ % 4] = o;
  return true;
}

bool on_own_stack(uintptr_t a) { return g_thread && a - reinterpret_cast<uintptr_t>(cur().stack) < kFiberStack; }

void set_schedule(int s) { eng().schedule = s & 1; }
long long launch_count() { return eng().launches; }

void run_grid(const void* kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  static const bool racecheck = (racecheck_from_env(), true);
  (void)racecheck;
  Engine& e = eng();
  if (!e.smem_raw) {
    e.smem_max = kLargestSmemOptin;
    // 1024-byte aligned: a kernel that aligns its tiles' generic addresses for the 128-byte swizzle
    // (whose pattern repeats every 1024 bytes of the shared address) aligns their offsets too
    const size_t bytes = (kSmemRedZone + e.smem_max + kSmemCanary + kSmemRedZone + 1023) / 1024 * 1024;
    e.smem_raw = static_cast<unsigned char*>(std::aligned_alloc(1024, bytes));
    g_smem = e.smem_raw + kSmemRedZone;
#if TG_EMU_ASAN
    __asan_poison_memory_region(e.smem_raw, kSmemRedZone);
    __asan_poison_memory_region(g_smem + e.smem_max + kSmemCanary, kSmemRedZone);
#endif
  }
  ++e.launches;
  e.kernel = kernel;
  e.body = &body;
  e.error.clear();
  e.error_code = cudaSuccess;
  g_grid_dim = grid;
  g_block_dim = block;
  g_smem_bytes = smem;
  smem_poison_tail(smem);
  if (g_observed) notify_launch_begin(kernel, grid, block, smem);
  long long linear = 0;
  for (unsigned z = 0; z < grid.z && e.error.empty(); ++z)
    for (unsigned y = 0; y < grid.y && e.error.empty(); ++y)
      for (unsigned x = 0; x < grid.x && e.error.empty(); ++x, ++linear) {
        g_block_idx = uint3{x, y, z};
        std::memset(g_smem, kPoison, smem);
        ++e.ctas;
        run_cta(((linear & 1) ^ e.schedule) != 0);
        if (e.error.empty() && !smem_canary_intact(smem)) {
          e.error = "store past the " + std::to_string(smem) + " bytes of dynamic shared memory (block " +
                    dim_str(g_block_idx) + ")";
          e.error_code = cudaErrorIllegalAddress;
        }
      }
  e.body = nullptr;
  if (g_observed) notify_launch_end();
  if (!e.error.empty()) set_sticky_error(e.error_code, "kernel " + kernel_name(kernel) + ": " + e.error);
  e.kernel = nullptr;
}

void device_fault(cudaError_t code, const std::string& what) {
  Engine& e = eng();
  if (!g_thread) {
    set_sticky_error(code, what);
    std::fprintf(stderr, "SIMT emulator: device_fault outside a kernel\n");
    std::abort();
  }
  if (e.error.empty()) {
    e.error = what + " (block " + dim_str(g_block_idx) + ", thread " + dim_str(g_thread->tid) + ")";
    e.error_code = code;
  }
  Fiber& f = cur();
  f.done = f.abandoned = true;
  yield(true);
  std::abort();  // never resumed
}

void syncthreads() {
  if (!g_thread) {
    std::fprintf(stderr, "SIMT emulator: __syncthreads outside a kernel\n");
    std::abort();
  }
  arrive(eng().cta_bar, "__syncthreads", [] {
    if (g_observed) notify_barrier();
  });
}

void rendezvous(Barrier& b, const char* op, FunctionRef on_last) { arrive(b, op, on_last); }

void block_until_next(Barrier& b) {
  Fiber& f = cur();
  f.waiting = &b;
  f.wait_gen = b.gen;
  yield(false);
}

Thread& cta_thread(int linear) { return eng().fibers[(size_t)linear]; }

uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane, const char* op) {
  if (mask != 0xffffffffu)
    device_fault(cudaErrorLaunchFailure, std::string(op) + " with a partial mask (the emulator supports full warps only)");
  Warp& w = my_warp(op);
  const int lane = g_thread->lane;
  uint64_t r = 0;
  w.in[lane][0] = bits;
  w.in[lane][1] = (uint64_t)(src_lane & 31);
  w.out[lane] = &r;
  arrive(w.bar, op, [&w, op] {
    for (int l = 0; l < 32; ++l) *static_cast<uint64_t*>(w.out[l]) = w.in[w.in[l][1]][0];
    if (g_observed) notify_warp_collective(g_thread->warp, op);
  });
  return r;
}

uint32_t warp_ballot(unsigned mask, bool pred, const char* op) {
  if (mask != 0xffffffffu)
    device_fault(cudaErrorLaunchFailure, std::string(op) + " with a partial mask (the emulator supports full warps only)");
  Warp& w = my_warp(op);
  uint64_t r = 0;
  w.in[g_thread->lane][0] = pred ? 1u : 0u;
  w.out[g_thread->lane] = &r;
  arrive(w.bar, op, [&w, op] {
    uint64_t votes = 0;
    for (int l = 0; l < 32; ++l) votes |= w.in[l][0] << l;
    for (int l = 0; l < 32; ++l) *static_cast<uint64_t*>(w.out[l]) = votes;
    if (g_observed) notify_warp_collective(g_thread->warp, op);
  });
  return (uint32_t)r;
}

uint32_t smem_offset(const void* p, const char* op) {
  const unsigned char* q = static_cast<const unsigned char*>(p);
  if (q < g_smem || q >= g_smem + g_smem_bytes)
    device_fault(cudaErrorIllegalAddress, std::string(op) + " of a pointer outside the dynamic shared memory");
  return (uint32_t)(q - g_smem);
}

// cp.async.cg.shared.global 16 bytes, src-size 16 or 0 (zero fill): queued, see the header.
void cp_async_16(void* smem, const void* gmem, bool valid) {
  unsigned char* d = static_cast<unsigned char*>(smem);
  const unsigned char* g = static_cast<const unsigned char*>(gmem);
  if ((uintptr_t)d % 16 != 0 || (uintptr_t)g % 16 != 0) device_fault(cudaErrorMisalignedAddress, "cp.async 16 with a misaligned address");
  if (d < g_smem || d + 16 > g_smem + g_smem_bytes)
    device_fault(cudaErrorIllegalAddress, "cp.async destination outside the dynamic shared memory");
  std::string why;
  if (!device_range_ok(g, 16, &why)) device_fault(cudaErrorIllegalAddress, "cp.async source " + why);
  std::memset(d, kPoison, 16);  // in flight: undefined until the wait
  const void* pc = __builtin_return_address(0);
  cur().copies.open.push_back({d, g, valid, pc});
  if (g_observed) {
    if (valid) engine_access(pc, g, 16, false, AccessKind::CpAsync);  // src-size 0 reads nothing
    engine_access(pc, d, 16, true, AccessKind::CpAsync);
  }
}

void cp_async_commit() {
  cur().copies.commit();
}

// cp.async.wait_group N: the oldest groups land until at most N are pending.
void cp_async_wait(int n) {
  cur().copies.retire_until(n, [](const Copy& c) {
    if (c.valid) std::memcpy(c.dst, c.src, 16);
    else std::memset(c.dst, 0, 16);
    if (g_observed) engine_access(c.pc, c.dst, 16, true, AccessKind::CpAsyncLand);
  });
}

namespace {
TG_EMU_UNCHECKED float bf16_lo(uint32_t reg) {
  const uint32_t u = reg << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
TG_EMU_UNCHECKED float bf16_hi(uint32_t reg) {
  const uint32_t u = reg & 0xffff0000u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A row address of ldmatrix / stmatrix: 16-byte aligned, its 16 bytes inside the dynamic shared memory.
void check_matrix_row(const char* op, uint32_t addr) {
  if (addr % 16 != 0) device_fault(cudaErrorMisalignedAddress, std::string(op) + ": row address not 16-byte aligned");
  if ((size_t)addr + 16 > g_smem_bytes)
    device_fault(cudaErrorIllegalAddress, std::string(op) + ": shared address " + std::to_string(addr) +
                                              " + 16 past the dynamic shared memory (" + std::to_string(g_smem_bytes) +
                                              " bytes)");
}

// ldmatrix.x4's and stmatrix.x4's moves between the warp's registers (lane l's in ldmatrix's
// out[l], in stmatrix's in[l][1 .. 4]) and the rows of shared memory whose addresses lanes
// 8m .. 8m + 7 gave for matrix m (in[.][0]), unchecked: each row was checked inside the dynamic
// shared memory as its lane arrived (check_matrix_row).
// (the address of element (row, col) of 8x8 matrix m; a lambda would not share the attribute)
TG_EMU_UNCHECKED inline unsigned char* matrix_elem(const uint64_t (&in)[32][6], int m, int row, int col) {
  return g_smem + in[8 * m + row][0] + 2 * col;
}
TG_EMU_UNCHECKED void ldmatrix_gather(const uint64_t (&in)[32][6], bool trans, uint32_t (&out)[32][4]) {
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int m = 0; m < 4; ++m) {
      uint16_t lo, hi;
      std::memcpy(&lo, trans ? matrix_elem(in, m, 2 * t, g) : matrix_elem(in, m, g, 2 * t), 2);
      std::memcpy(&hi, trans ? matrix_elem(in, m, 2 * t + 1, g) : matrix_elem(in, m, g, 2 * t + 1), 2);
      out[l][m] = (uint32_t)lo | (uint32_t)hi << 16;
    }
  }
}
TG_EMU_UNCHECKED void stmatrix_scatter(const uint64_t (&in)[32][6], bool trans) {
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int m = 0; m < 4; ++m) {
      const uint32_t v = (uint32_t)in[l][1 + m];
      const uint16_t lo = (uint16_t)v, hi = (uint16_t)(v >> 16);
      std::memcpy(trans ? matrix_elem(in, m, 2 * t, g) : matrix_elem(in, m, g, 2 * t), &lo, 2);
      std::memcpy(trans ? matrix_elem(in, m, 2 * t + 1, g) : matrix_elem(in, m, g, 2 * t + 1), &hi, 2);
    }
  }
}
}  // namespace

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16
void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans) {
  const char* op = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
  check_matrix_row(op, addr);
  Warp& w = my_warp(op);
  const int lane = g_thread->lane;
  w.in[lane][0] = addr;
  w.out[lane] = r;
  if (g_observed) engine_access(__builtin_return_address(0), g_smem + addr, 16, false, AccessKind::LdMatrix);
  arrive(w.bar, op, [&w, trans, op] {
    uint32_t out[32][4];
    ldmatrix_gather(w.in, trans, out);
    for (int l = 0; l < 32; ++l) std::memcpy(w.out[l], out[l], sizeof out[l]);  // (uint32_t (&)[4], checked)
    if (g_observed) notify_warp_collective(g_thread->warp, op);
  });
}

// stmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: ldmatrix's inverse (PTX ISA, "Data Movement
// and Conversion Instructions: stmatrix"): lanes 8m .. 8m+7 give the row addresses of matrix m,
// lane l's register m holds M_m[l/4][2(l%4), +1] (plain) or M_m[2(l%4), +1][l/4] (.trans). Each
// lane's row is its 16-byte shared write (AccessKind::StMatrix), made when the last lane arrives.
void stmatrix_x4(const uint32_t (&r)[4], uint32_t addr, bool trans) {
  const char* op = trans ? "stmatrix.x4.trans" : "stmatrix.x4";
  check_matrix_row(op, addr);
  Warp& w = my_warp(op);
  const int lane = g_thread->lane;
  w.in[lane][0] = addr;
  for (int m = 0; m < 4; ++m) w.in[lane][1 + m] = r[m];
  if (g_observed) engine_access(__builtin_return_address(0), g_smem + addr, 16, true, AccessKind::StMatrix);
  arrive(w.bar, op, [&w, trans, op] {
    stmatrix_scatter(w.in, trans);
    if (g_observed) notify_warp_collective(g_thread->warp, op);
  });
}

// elect.sync with a full mask (PTX ISA, "Parallel Synchronization and Communication
// Instructions: elect.sync"): a rendezvous of the warp that elects one lane; the ISA does not say
// which, the emulator elects the lowest (lane 0).
bool elect_sync() { return warp_exchange(0xffffffffu, 0, 0, "elect.sync") == 0 && g_thread->lane == 0; }

namespace {
// The arithmetic of mma.m16n8k16 over the warp's exchange slots (lane l's a0 .. a3, b0, b1 in
// in[l][0 .. 5]) and accumulators, unchecked: the arrays' bounds hold by construction.
TG_EMU_UNCHECKED void mma_16816(const uint64_t (&in)[32][6], float (&acc)[32][4]) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const uint32_t a0 = (uint32_t)in[l][0], a1 = (uint32_t)in[l][1], a2 = (uint32_t)in[l][2], a3 = (uint32_t)in[l][3],
                   r0 = (uint32_t)in[l][4], r1 = (uint32_t)in[l][5];
    A[g][2 * t] = bf16_lo(a0), A[g][2 * t + 1] = bf16_hi(a0);
    A[g + 8][2 * t] = bf16_lo(a1), A[g + 8][2 * t + 1] = bf16_hi(a1);
    A[g][2 * t + 8] = bf16_lo(a2), A[g][2 * t + 9] = bf16_hi(a2);
    A[g + 8][2 * t + 8] = bf16_lo(a3), A[g + 8][2 * t + 9] = bf16_hi(a3);
    B[2 * t][g] = bf16_lo(r0), B[2 * t + 1][g] = bf16_hi(r0);
    B[2 * t + 8][g] = bf16_lo(r1), B[2 * t + 9][g] = bf16_hi(r1);
    for (int e = 0; e < 4; ++e) C[g + 8 * (e / 2)][2 * t + e % 2] = acc[l][e];
  }
  tensor_core_mma(&C[0][0], 8, &A[0][0], &B[0][0], 8, 16, 8);
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 4; ++e) acc[l][e] = C[g + 8 * (e / 2)][2 * t + e % 2];
  }
}
}  // namespace

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d (16 x 8) += a (16 x 16) b (16 x 8).
void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Warp& w = my_warp("mma.m16n8k16");
  const int lane = g_thread->lane;
  for (int k = 0; k < 4; ++k) w.in[lane][k] = a[k];
  w.in[lane][4] = b0;
  w.in[lane][5] = b1;
  w.out[lane] = d;
  arrive(w.bar, "mma.m16n8k16", [&w] {
    float acc[32][4];  // each lane's d (float (&)[4]: copied whole, checked)
    for (int l = 0; l < 32; ++l) std::memcpy(acc[l], w.out[l], sizeof acc[l]);
    mma_16816(w.in, acc);
    for (int l = 0; l < 32; ++l) std::memcpy(w.out[l], acc[l], sizeof acc[l]);
    if (g_observed) {
      notify_mma(g_thread->warp, 2 * 16 * 8 * 16);
      notify_warp_collective(g_thread->warp, "mma.m16n8k16");
    }
  });
}

}  // namespace emu

// UndefinedBehaviorSanitizer: a stack trace with every report, and the emulator's context line
// (the hook runs as a report starts; UBSan does not call the death callback).
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1"; }
extern "C" void __ubsan_on_report() { emu::describe_report("below"); }
