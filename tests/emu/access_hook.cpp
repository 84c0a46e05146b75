// tests/emu/access_hook.cpp: the memory hook of the emulator build (tests/emu/access_hook.h
// says how the kernels' accesses get here): GCC's ThreadSanitizer entry points, defined here in
// place of libtsan, check each access against AddressSanitizer's shadow memory, then hand the
// accesses that kernel threads make to device or shared memory to the observers.
#include "access_hook.h"

#include <sanitizer/common_interface_defs.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "emu_internal.h"
#include "simt_emulator.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define TG_EMU_ASAN 1
// AddressSanitizer's reports of a bad access of n bytes (libasan's exported entry points; they
// print the report, call the death callback and end the process)
extern "C" void __asan_report_load_n(uintptr_t addr, size_t size);
extern "C" void __asan_report_store_n(uintptr_t addr, size_t size);
#else
#define TG_EMU_ASAN 0
#endif

namespace emu {

bool g_observed = false;

namespace {

std::vector<Observer*>& observers() {
  static std::vector<Observer*> v;
  return v;
}
// observers() as deliver reads it, set again at each change (deliver runs unchecked, and GCC
// inlines none of std::vector's checked functions there)
Observer* const* g_observer_at = nullptr;
size_t g_observer_count = 0;

#if TG_EMU_ASAN
// AddressSanitizer's shadow: one byte for 8 of memory, at (addr >> 3) + offset (0x7fff8000 on
// x86-64 Linux); 0 = all 8 addressable, k in 1..7 = the first k, negative = none. The inline
// test answers the common case (all addressable); anything else asks the runtime, which is
// exact. `fast` is off unless a start-up probe finds the layout as described.
constexpr uintptr_t kShadowOffset = 0x7fff8000;
__attribute__((no_sanitize_address)) bool shadow_ok(uintptr_t a, uint32_t n) {
  const int8_t* s = reinterpret_cast<const int8_t*>((a >> 3) + kShadowOffset);
  const uintptr_t in = a & 7;
  if (in + n <= 8) return s[0] == 0 || (s[0] > 0 && (int)(in + n) <= s[0]);
  return in == 0 && n == 16 && s[0] == 0 && s[1] == 0;
}
bool probe_shadow() {
#if defined(__x86_64__)
  alignas(16) static unsigned char buf[64];
  __asan_poison_memory_region(buf + 32, 32);
  const bool ok = shadow_ok((uintptr_t)buf, 16) && shadow_ok((uintptr_t)buf + 16, 16) &&
                  !shadow_ok((uintptr_t)buf + 32, 4) && !shadow_ok((uintptr_t)buf + 28, 8);
  __asan_unpoison_memory_region(buf + 32, 32);
  return ok;
#else
  return false;
#endif
}
const bool fast_shadow = probe_shadow();

// (the runtime asked out of line: the fast path keeps no frame, so no red zones to poison)
__attribute__((noinline)) void asan_check_slow(uintptr_t a, uint32_t n, bool write) {
  if (__asan_region_is_poisoned(reinterpret_cast<void*>(a), n) == nullptr) return;
  if (write) __asan_report_store_n(a, n);
  else __asan_report_load_n(a, n);
}
__attribute__((no_sanitize("address"))) inline void asan_check(uintptr_t a, uint32_t n, bool write) {
  if (fast_shadow && shadow_ok(a, n)) return;
  asan_check_slow(a, n, write);
}
#endif

// Device or shared memory: the accesses observers see.
TG_EMU_UNCHECKED inline bool classify(uintptr_t a, Space* s) {
  if (a - reinterpret_cast<uintptr_t>(g_smem) < g_smem_bytes) {
    *s = Space::Shared;
    return true;
  }
  if (on_own_stack(a)) return false;
  if (device_memory(a)) {
    *s = Space::Global;
    return true;
  }
  if (static_shared(a)) {
    *s = Space::Shared;
    return true;
  }
  return false;
}

// (out of line, and out of the sanitizers' reach (TG_EMU_UNCHECKED): with them, the Access it
// builds on its stack, passed by reference, took a frame with red zones, and each observer's
// virtual call UndefinedBehaviorSanitizer's check of its object's dynamic type)
TG_EMU_UNCHECKED __attribute__((noinline)) void deliver(const void* pc, uintptr_t a, uint32_t n, bool write, AccessKind kind) {
  Space s;
  if (!classify(a, &s)) return;
  const Access acc{pc, a, n, write, s, kind, g_thread};
  for (size_t i = 0; i < g_observer_count; ++i) g_observer_at[i]->access(acc);
}

// One access of kernel-file code (g_thread is null on the host, e.g. a launcher). Without
// AddressSanitizer's checks of its own reads (g_observed, g_thread): every access of the kernels
// comes here, and AddressSanitizer's check of the access itself is asan_check.
__attribute__((no_sanitize("address"))) inline void hook(const void* pc, const void* p, uint32_t n, bool write) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
#if TG_EMU_ASAN
  asan_check(a, n, write);
#endif
  if (g_observed && g_thread) deliver(pc, a, n, write, AccessKind::Plain);
}

}  // namespace

void add_observer(Observer* o) {
  observers().push_back(o);
  g_observer_at = observers().data();
  g_observer_count = observers().size();
  g_observed = true;
}

void remove_observer(Observer* o) {
  auto& v = observers();
  v.erase(std::remove(v.begin(), v.end(), o), v.end());
  g_observer_at = v.data();
  g_observer_count = v.size();
  g_observed = !v.empty();
}

namespace {

// The symbolizer's answer for pc in format `f` (sanitizer_common's %s file, %l line, %c column):
// one NUL-terminated string a frame, innermost first, an empty one after the last.
void symbolize(const void* pc, const char* f, char (&buf)[2048]) {
  std::memset(buf, 0, sizeof buf);
  // the call's return address is one past the access's instruction: step back into it
  __sanitizer_symbolize_pc(const_cast<void*>(static_cast<const void*>(static_cast<const char*>(pc) - 1)), f, buf,
                           sizeof buf - 1);
}

}  // namespace

namespace {
// source_site's answers last given, direct-mapped, in front of its map (the kernel profiler asks
// for every access it logged); the look-up here runs unchecked, the map's out of line
struct RecentSite {
  const void* pc;
  const void* site;
};
RecentSite g_recent_sites[4096];
TG_EMU_UNCHECKED inline RecentSite& recent_site(const void* pc) {
  return g_recent_sites[(reinterpret_cast<uintptr_t>(pc) * 0x9E3779B97F4A7C15ull) >> 52];
}

__attribute__((noinline)) const void* source_site_slow(const void* pc) {
  static std::unordered_map<const void*, const void*> site_of;      // pc -> the site's first pc
  static std::unordered_map<std::string, const void*> first_pc_of;  // file:line chain -> pc
  auto [it, fresh] = site_of.try_emplace(pc, pc);
  if (fresh) {
    char buf[2048];
    symbolize(pc, "%s:%l", buf);
    std::string chain;
    for (const char* f = buf; *f && f < buf + sizeof buf; f += std::strlen(f) + 1) chain += std::string(f) + '|';
    const bool located = !chain.empty() && chain.find(":0|") == std::string::npos;
    if (located) it->second = first_pc_of.try_emplace(chain, pc).first->second;
  }
  recent_site(pc) = RecentSite{pc, it->second};
  return it->second;
}
}  // namespace

TG_EMU_UNCHECKED const void* source_site(const void* pc) {
  const RecentSite& r = recent_site(pc);
  return r.pc == pc && pc ? r.site : source_site_slow(pc);
}

std::vector<std::string> source_frames(const void* pc) {
  char buf[2048];
  symbolize(pc, "%s:%l", buf);
  std::vector<std::string> frames;
  for (const char* f = buf; *f && f < buf + sizeof buf; f += std::strlen(f) + 1) {
    std::string s = f;
    for (const char* root : {"kernels/", "tests/", "model/"}) {
      const size_t cut = s.rfind(root);
      if (cut != std::string::npos) {
        s = s.substr(cut);
        break;
      }
    }
    frames.push_back(s);
  }
  return frames;
}

std::string source_line(const void* pc) {
  const std::vector<std::string> frames = source_frames(pc);
  if (frames.empty()) return "?";
  for (const std::string& f : frames)
    if (f.rfind("kernels/", 0) == 0 || (f.rfind("tests/", 0) == 0 && f.rfind("tests/emu/simt_emulator.h", 0) != 0))
      return f == frames.front() ? f : f + " (" + frames.front().substr(frames.front().rfind('/') + 1) + ")";
  return frames.front();
}

void engine_access(const void* pc, const void* p, uint32_t size, bool write, AccessKind kind) {
  if (g_observed && g_thread) deliver(pc, reinterpret_cast<uintptr_t>(p), size, write, kind);
}

void notify_launch_begin(const void* kernel, dim3 grid, dim3 block, size_t smem) {
  for (Observer* o : observers()) o->launch_begin(kernel, grid, block, smem);
}
void notify_cta_begin() {
  for (Observer* o : observers()) o->cta_begin();
}
void notify_barrier() {
  for (Observer* o : observers()) o->barrier();
}
void notify_warp_collective(int warp, const char* op) {
  for (Observer* o : observers()) o->warp_collective(warp, op);
}
void notify_mbarrier_observed(const void* bar, uint64_t phases) {
  for (Observer* o : observers()) o->mbarrier_observed(bar, phases);
}
void notify_bulk_landing(const void* bar, uint64_t phases) {
  for (Observer* o : observers()) o->bulk_landing(bar, phases);
}
void notify_mbarrier_arrived(const void* bar, uint64_t phase) {
  for (Observer* o : observers()) o->mbarrier_arrived(bar, phase);
}
void notify_proxy_fence() {
  for (Observer* o : observers()) o->proxy_fence();
}
void notify_flag(const void* flag, bool release) {
  for (Observer* o : observers()) o->flag(flag, release);
}
void notify_mma(int warp, uint64_t flops) {
  for (Observer* o : observers()) o->mma(warp, flops);
}
void notify_cta_end() {
  for (Observer* o : observers()) o->cta_end();
}
void notify_launch_end() {
  for (Observer* o : observers()) o->launch_end();
}
void notify_gemm(const GemmEvent& g) {
  for (Observer* o : observers()) o->gemm(g);
}
void notify_device_written(const void* p, size_t n) {
  for (Observer* o : observers()) o->device_written(p, n);
}
void notify_device_freed(const void* p, size_t n) {
  for (Observer* o : observers()) o->device_freed(p, n);
}

}  // namespace emu

// ---- GCC's ThreadSanitizer entry points (the kernel files' instrumentation) ---------------------
// Each plain access of N bytes; "unaligned" ones are the same to the hook; ranges (a struct
// copied whole) are one access of their size. Function entry and exit are not instrumented
// (--param tsan-instrument-func-entry-exit=0); __tsan_init has nothing to set up.
#define TG_EMU_UNPOISONED extern "C" __attribute__((no_sanitize("address")))
#define TG_EMU_TSAN_ACCESS(N)                                                                                  \
  TG_EMU_UNPOISONED void __tsan_read##N(void* p) { emu::hook(__builtin_return_address(0), p, N, false); }           \
  TG_EMU_UNPOISONED void __tsan_write##N(void* p) { emu::hook(__builtin_return_address(0), p, N, true); }           \
  TG_EMU_UNPOISONED void __tsan_unaligned_read##N(void* p) { emu::hook(__builtin_return_address(0), p, N, false); } \
  TG_EMU_UNPOISONED void __tsan_unaligned_write##N(void* p) { emu::hook(__builtin_return_address(0), p, N, true); }
TG_EMU_TSAN_ACCESS(1)
TG_EMU_TSAN_ACCESS(2)
TG_EMU_TSAN_ACCESS(4)
TG_EMU_TSAN_ACCESS(8)
TG_EMU_TSAN_ACCESS(16)
#undef TG_EMU_TSAN_ACCESS
#undef TG_EMU_UNPOISONED

extern "C" void __tsan_read_range(void* p, unsigned long n) {
  emu::hook(__builtin_return_address(0), p, (uint32_t)n, false);
}
extern "C" void __tsan_write_range(void* p, unsigned long n) {
  emu::hook(__builtin_return_address(0), p, (uint32_t)n, true);
}
// a C++ object's vtable pointer read or set (host objects only: kernels have no virtual calls)
extern "C" void __tsan_vptr_read(void** p) { emu::hook(__builtin_return_address(0), p, sizeof(void*), false); }
extern "C" void __tsan_vptr_update(void** p, void*) { emu::hook(__builtin_return_address(0), p, sizeof(void*), true); }
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}

// Atomic operations in the instrumented files (std::shared_ptr's counts in the launch code, the
// guards of function-local statics): done as asked, sequentially consistent, after the check.
extern "C" int __tsan_atomic32_fetch_add(volatile int* a, int v, int) {
  emu::hook(__builtin_return_address(0), (const void*)a, 4, true);
  return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
extern "C" long __tsan_atomic64_fetch_add(volatile long* a, long v, int) {
  emu::hook(__builtin_return_address(0), (const void*)a, 8, true);
  return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
extern "C" int __tsan_atomic32_load(const volatile int* a, int) {
  emu::hook(__builtin_return_address(0), (const void*)a, 4, false);
  return __atomic_load_n(a, __ATOMIC_SEQ_CST);
}
extern "C" unsigned char __tsan_atomic8_load(const volatile unsigned char* a, int) {
  emu::hook(__builtin_return_address(0), (const void*)a, 1, false);
  return __atomic_load_n(a, __ATOMIC_SEQ_CST);
}
extern "C" long __tsan_atomic64_load(const volatile long* a, int) {
  emu::hook(__builtin_return_address(0), (const void*)a, 8, false);
  return __atomic_load_n(a, __ATOMIC_SEQ_CST);
}
