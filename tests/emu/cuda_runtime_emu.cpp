// tests/emu/cuda_runtime_emu.cpp: the CUDA runtime API of the emulator build, for exactly the
// calls train_gpt and its tests make (a call outside that set fails to link). It is linked in
// place of libcudart; the kernels it launches run in the engine of tests/emu/simt_emulator.cpp.
//
// The device. One device, an H100 SXM 80 GB by default (compute capability 9.0, 132 SMs, 48 KB
// of shared memory per block by default and 227 KB by opt-in) or, with TG_EMU_DEVICE=a100, an
// A100 SXM 80 GB (8.0, 108 SMs, 163 KB by opt-in), or with TG_EMU_DEVICE=rtx4090 a GeForce RTX
// 4090 (8.9, 128 SMs, 24 GB, 99 KB by opt-in: the consumer parts' limit). Its name starts with
// "EMULATED" so that no log mistakes it for a GPU. cudaMemGetInfo reports the part's memory less what is allocated,
// capped by the host's available memory (so the backend's memory check refuses a model this
// machine cannot hold).
//
// Memory. cudaMalloc returns host memory filled with 0xFF bytes (NaN as bf16 and fp32, -1 as
// int32: a kernel that reads what nothing wrote computes NaN), 256-byte aligned, between two
// 4 KB red zones. Under AddressSanitizer the red zones, and every range that mark_no_access
// excludes, are poisoned for good, and the whole allocation is poisoned whenever the host runs:
// it is unpoisoned only while queued device work executes. So a kernel that reads or writes one
// byte past its buffer, and host code that dereferences a device pointer, are both reported at
// once by AddressSanitizer (the engine's death callback names the kernel, block and thread).
// Copies, memsets and cuBLAS operands are checked against the allocation table
// before they are queued: a range outside device memory is cudaErrorInvalidValue for a copy or
// memset (as the runtime returns), and a device fault (sticky cudaErrorIllegalAddress, as a
// kernel reading it would cause) for a library call. cudaMallocHost memory is host memory
// the device may also read.
//
// Streams and order. Nothing runs when it is issued: kernels, copies, memsets and library calls
// are queued on their stream and run when the host synchronises with them (cudaStreamSynchronize,
// cudaEventSynchronize, cudaDeviceSynchronize, a synchronous copy to the host, cudaFree), as
// late as the CUDA semantics allow. The legacy default stream (0) orders itself with blocking
// streams, not with streams created cudaStreamNonBlocking; cudaDeviceSynchronize runs the
// non-blocking streams before the legacy one. A copy from pinned memory reads its source when it
// runs, a copy from pageable memory when it is issued; a synchronous cudaMemcpy from pageable
// memory returns before its copy reaches the device (the runtime's documented staging). So a
// missing synchronisation (host data changed before a queued copy ran, a kernel on a
// non-blocking stream reading what a legacy-stream copy has not yet written, a host read of a
// pinned buffer before the copy into it ran) gives wrong data, which the tests see.
//
// Errors. A bad launch configuration or argument is returned by the call (or, for a launch, by
// the next cudaGetLastError) and then cleared. A fault while queued work runs (the engine's
// checks, an out-of-range library operand) is sticky: the synchronising call and every call
// after it return it, and it is printed once on stderr, prefixed "SIMT emulator:". An
// AddressSanitizer or UndefinedBehaviorSanitizer report ends the process.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "access_hook.h"
#include "emu_internal.h"
#include "race_checker.h"
#include "simt_emulator.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define TG_EMU_POISON(p, n) __asan_poison_memory_region((p), (n))
#define TG_EMU_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define TG_EMU_POISON(p, n) ((void)(p), (void)(n))
#define TG_EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace emu {

const char* g_device_op = nullptr;

namespace {

constexpr size_t kRedZone = 4096;  // a multiple of 256: the payload stays 256-byte aligned
constexpr size_t kDefaultSmemPerBlock = 48 * 1024;

// ---- the device profile -------------------------------------------------------------------------
cudaDeviceProp make_prop() {
  cudaDeviceProp p;
  std::memset(&p, 0, sizeof p);
  const char* env = std::getenv("TG_EMU_DEVICE");
  const std::string part = env ? env : "";
  const bool a100 = part == "a100", ada = part == "rtx4090";  // anything else: the H100
  std::snprintf(p.name, sizeof p.name, "%s",
                a100  ? "EMULATED A100-SXM4-80GB (SIMT emulator on the CPU, not a GPU)"
                : ada ? "EMULATED GeForce RTX 4090 (SIMT emulator on the CPU, not a GPU)"
                      : "EMULATED H100 80GB HBM3 (SIMT emulator on the CPU, not a GPU)");
  p.totalGlobalMem = (a100 ? 81920ull : ada ? 24564ull : 81559ull) << 20;
  p.sharedMemPerBlock = kDefaultSmemPerBlock;
  p.regsPerBlock = 65536;
  p.warpSize = 32;
  p.memPitch = 2147483647;
  p.maxThreadsPerBlock = 1024;
  p.maxThreadsDim[0] = 1024, p.maxThreadsDim[1] = 1024, p.maxThreadsDim[2] = 64;
  p.maxGridSize[0] = 2147483647, p.maxGridSize[1] = 65535, p.maxGridSize[2] = 65535;
  p.totalConstMem = 65536;
  p.major = a100 || ada ? 8 : 9;
  p.minor = ada ? 9 : 0;
  p.textureAlignment = 512;
  p.multiProcessorCount = a100 ? 108 : ada ? 128 : 132;
  p.concurrentKernels = 1;
  p.asyncEngineCount = a100 ? 3 : ada ? 2 : 5;
  p.unifiedAddressing = 1;
  p.memoryBusWidth = ada ? 384 : 5120;
  p.l2CacheSize = a100 ? 40 << 20 : ada ? 72 << 20 : 50 << 20;
  p.maxThreadsPerMultiProcessor = ada ? 1536 : 2048;
  p.sharedMemPerMultiprocessor = a100 ? 167936 : ada ? 102400 : 233472;
  p.regsPerMultiprocessor = 65536;
  p.sharedMemPerBlockOptin = a100 ? 166912 : ada ? 101376 : 232448;
  p.maxBlocksPerMultiProcessor = ada ? 24 : 32;
  p.reservedSharedMemPerBlock = 1024;
  return p;
}

// ---- errors -------------------------------------------------------------------------------------
struct Errors {
  cudaError_t sticky = cudaSuccess;
  cudaError_t last = cudaSuccess;
};
Errors& errors() {
  static Errors e;
  return e;
}

// Returns e after recording it as the last error (what cudaGetLastError returns next).
cudaError_t fail(cudaError_t e, const std::string& why = "") {
  if (!why.empty()) std::fprintf(stderr, "SIMT emulator: %s\n", why.c_str());
  set_last_error(e);
  return e;
}

// ---- allocations --------------------------------------------------------------------------------
struct Allocation {
  unsigned char* base = nullptr;  // what the caller got
  size_t size = 0;
  void* raw = nullptr;            // what was allocated (red zone | payload | red zone)
  bool pinned = false;            // cudaMallocHost: host memory the device may read
  std::vector<std::pair<size_t, size_t>> holes;  // [offset, offset + n) never to be accessed
};

struct Memory {
  std::map<uintptr_t, Allocation> by_base;
  size_t device_bytes = 0;
  int depth = 0;  // > 0 while queued device work runs: device memory accessible
  uint64_t generation = 0;  // moves with every allocation and free
};
Memory& mem() {
  static Memory m;
  return m;
}

// The allocation holding p (p may be one past its end), or null.
Allocation* find_allocation(const void* p) {
  auto& m = mem().by_base;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  Allocation& al = it->second;
  return a <= it->first + al.size ? &al : nullptr;
}

void set_access(Allocation& a, bool device_running) {
  if (a.pinned) return;
  if (device_running) {
    TG_EMU_UNPOISON(a.base, a.size);
    for (const auto& h : a.holes) TG_EMU_POISON(a.base + h.first, h.second);
  } else {
    TG_EMU_POISON(a.base, a.size);
  }
}

// While one exists, device memory is accessible: queued device work runs inside one.
struct DeviceScope {
  DeviceScope() {
    if (mem().depth++ == 0)
      for (auto& kv : mem().by_base) set_access(kv.second, true);
  }
  ~DeviceScope() {
    if (--mem().depth == 0)
      for (auto& kv : mem().by_base) set_access(kv.second, false);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
};

size_t host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  while (f >> key >> kb) {
    if (key == "MemAvailable:") return kb * 1024;
    f.ignore(256, '\n');
  }
  return (size_t)1 << 40;
}

std::string range_str(const void* p, size_t n) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "[%p, +%zu bytes)", p, n);
  return buf;
}

// ---- streams and queued work --------------------------------------------------------------------
struct StreamState;
struct Op {
  std::function<void()> fn;
  std::string what;
  std::vector<std::pair<StreamState*, uint64_t>> deps;  // run (stream, count) first
};
struct StreamState {
  bool legacy = false, blocking = true;
  std::deque<Op> pending;
  uint64_t enqueued = 0, done = 0;
};
struct EventState {
  StreamState* stream = nullptr;  // null until recorded
  uint64_t count = 0;             // the stream's work to run before the event completes
  bool timing = true;             // created without cudaEventDisableTiming
  // when the stream reached the event (the host's clock: emulated time, nothing about a GPU's);
  // shared with the stamping work, which may run after the event is destroyed
  std::shared_ptr<std::chrono::steady_clock::time_point> reached =
      std::make_shared<std::chrono::steady_clock::time_point>();
};

struct Streams {
  StreamState legacy;
  std::vector<StreamState*> created;  // in creation order (destroyed ones removed)
  std::set<EventState*> events;
  Streams() { legacy.legacy = true; }
};
Streams& streams() {
  static Streams s;
  return s;
}

StreamState* lookup(cudaStream_t s) {
  Streams& ss = streams();
  if (s == nullptr || s == cudaStreamLegacy) return &ss.legacy;
  StreamState* st = reinterpret_cast<StreamState*>(s);
  return std::find(ss.created.begin(), ss.created.end(), st) != ss.created.end() ? st : nullptr;
}

// Runs s's queued work until `count` items are done (each after what it depends on). One
// DeviceScope covers the whole run: no host code runs between the items, and opening device memory
// (AddressSanitizer's shadow of every allocation rewritten, both ways) once a run instead of once
// an item took the two 20-step model cases from 34.7 to 31.7 s (the best of three each).
void run_until(StreamState* s, uint64_t count) {
  if (s->done >= count) return;
  DeviceScope scope;
  while (s->done < count) {
    Op op = std::move(s->pending.front());
    s->pending.pop_front();
    for (const auto& d : op.deps) run_until(d.first, d.second);
    if (sticky_error() == cudaSuccess) {  // after a fault the device runs nothing more
      g_device_op = op.what.c_str();
      op.fn();
      g_device_op = nullptr;
    }
    ++s->done;
  }
}

void run_all() {
  Streams& ss = streams();
  for (auto it = ss.created.rbegin(); it != ss.created.rend(); ++it) run_until(*it, (*it)->enqueued);
  run_until(&ss.legacy, ss.legacy.enqueued);
}

bool is_device(const void* p) {
  const Allocation* a = find_allocation(p);
  return a && !a->pinned;
}
bool is_pinned(const void* p) {
  const Allocation* a = find_allocation(p);
  return a && a->pinned;
}

// Copies or sets [p, p + n) of device memory, skipping the holes of its allocation (what
// cudaMemset over a whole allocation does to ranges that mark_no_access excluded).
template <typename F>
void for_accessible(void* p, size_t n, F&& f) {
  Allocation* a = find_allocation(p);
  const size_t off0 = a ? (size_t)(static_cast<unsigned char*>(p) - a->base) : 0;
  size_t pos = 0;
  if (a && !a->pinned)
    for (auto h : a->holes) {
      const size_t hb = std::max(h.first, off0), he = std::min(h.first + h.second, off0 + n);
      if (hb >= he) continue;
      if (hb - off0 > pos) f(pos, hb - off0 - pos);
      pos = he - off0;
    }
  if (n > pos) f(pos, n - pos);
}

cudaError_t check_copy(void* dst, const void* src, size_t n, cudaMemcpyKind& kind, const char* who) {
  if (kind == cudaMemcpyDefault)
    kind = is_device(src) ? (is_device(dst) ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                          : (is_device(dst) ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  std::string why;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (src_dev && !(is_device(src) && device_range_ok(src, n, &why)))
    return fail(cudaErrorInvalidValue, std::string(who) + ": the source " + (why.empty() ? "is not device memory" : why));
  if (dst_dev && !(is_device(dst) && device_range_ok(dst, n, &why)))
    return fail(cudaErrorInvalidValue,
                std::string(who) + ": the destination " + (why.empty() ? "is not device memory" : why));
  if (!src_dev && is_device(src))
    return fail(cudaErrorInvalidValue, std::string(who) + ": the source is device memory but the kind says host");
  if (!dst_dev && is_device(dst))
    return fail(cudaErrorInvalidValue, std::string(who) + ": the destination is device memory but the kind says host");
  return cudaSuccess;
}

// Queues a copy on s. A pageable host source is read now (staged), any other when the copy runs.
cudaError_t queue_copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, StreamState* s, const char* who) {
  const bool staged = (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost) && !is_pinned(src);
  std::shared_ptr<std::vector<unsigned char>> copy;
  if (staged) copy = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                                  static_cast<const unsigned char*>(src) + n);
  const unsigned char* from = staged ? copy->data() : static_cast<const unsigned char*>(src);
  enqueue(reinterpret_cast<cudaStream_t>(s->legacy ? nullptr : s), who, [dst, from, n, copy] {
    for_accessible(dst, n, [&](size_t off, size_t len) {
      std::memcpy(static_cast<unsigned char*>(dst) + off, from + off, len);
      if (g_observed && is_device(dst)) notify_device_written(static_cast<unsigned char*>(dst) + off, len);
    });
  });
  return cudaSuccess;
}

cudaError_t check_memset(void* p, size_t n, const char* who) {
  std::string why;
  if (!is_device(p) || !device_range_ok(p, n, &why)) {
    // a memset over a whole allocation may cover its holes: only the range must be inside it
    const Allocation* a = find_allocation(p);
    if (!a || a->pinned || static_cast<unsigned char*>(p) + n > a->base + a->size)
      return fail(cudaErrorInvalidValue,
                  std::string(who) + ": " + (why.empty() ? range_str(p, n) + " is not device memory" : why));
  }
  return cudaSuccess;
}

cudaError_t queue_memset(void* p, int value, size_t n, cudaStream_t s, const char* who) {
  enqueue(s, who, [p, value, n] {
    for_accessible(p, n, [&](size_t off, size_t len) {
      std::memset(static_cast<unsigned char*>(p) + off, value, len);
      if (g_observed) notify_device_written(static_cast<unsigned char*>(p) + off, len);
    });
  });
  return cudaSuccess;
}

// The per-kernel dynamic shared memory limit (cudaFuncSetAttribute).
std::map<const void*, int>& smem_limits() {
  static std::map<const void*, int> m;
  return m;
}

}  // namespace

// ---- the emulator's own interface ---------------------------------------------------------------

const cudaDeviceProp& device_prop() {
  // read again whenever TG_EMU_DEVICE changes (a test switches the part in a child process)
  static std::string profile = "unset";
  static cudaDeviceProp p;
  const char* env = std::getenv("TG_EMU_DEVICE");
  if (profile != (env ? env : "")) {
    profile = env ? env : "";
    p = make_prop();
  }
  return p;
}

void set_sticky_error(cudaError_t e, const std::string& what) {
  if (errors().sticky != cudaSuccess) return;
  errors().sticky = e;
  std::fprintf(stderr, "SIMT emulator: %s (%s: the device's sticky error from now on)\n", what.c_str(),
               cudaGetErrorString(e));
}

cudaError_t sticky_error() { return errors().sticky; }
void set_last_error(cudaError_t e) {
  if (errors().last == cudaSuccess) errors().last = e;
}

bool enqueue(cudaStream_t s, const std::string& what, std::function<void()> fn) {
  StreamState* st = lookup(s);
  if (!st) {
    fail(cudaErrorInvalidResourceHandle, what + ": unknown stream");
    return false;
  }
  Streams& ss = streams();
  Op op;
  op.fn = std::move(fn);
  op.what = what;
  if (st->legacy) {
    for (StreamState* b : ss.created)
      if (b->blocking) op.deps.emplace_back(b, b->enqueued);
  } else if (st->blocking) {
    op.deps.emplace_back(&ss.legacy, ss.legacy.enqueued);
  }
  st->pending.push_back(std::move(op));
  ++st->enqueued;
  return true;
}

cudaError_t synchronize(cudaStream_t s) {
  StreamState* st = lookup(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle);
  run_until(st, st->enqueued);
  return sticky_error();
}

namespace {
// device_memory's memory: the last few allocations hit (a kernel's accesses mostly stay in the
// few buffers it reads and writes: q, k, v, o, lse), and the last two gaps between allocations
// that an address fell in (a kernel's parameters, in host memory, and the emulator's variables
// that kernel code reads, threadIdx's and blockIdx's, in the executable's: taken by turns); the
// map's search is the slow way.
struct DeviceMemoryCache {
  static constexpr int kRemembered = 8, kGaps = 2;
  uintptr_t lo[kRemembered] = {}, hi[kRemembered] = {}, gap_lo[kGaps] = {}, gap_hi[kGaps] = {};
  int next = 0, next_gap = 0;
  uint64_t generation = ~0ull;
};
DeviceMemoryCache g_device_cache;

__attribute__((noinline)) bool device_memory_search(uintptr_t a) {
  DeviceMemoryCache& c = g_device_cache;
  const auto& m = mem().by_base;
  auto it = m.upper_bound(a);  // the first allocation above a
  uintptr_t gap_lo = 0;
  if (it != m.begin()) {
    const auto below = std::prev(it);
    const uintptr_t base = below->first, end = base + below->second.size;
    if (a < end) {
      c.lo[c.next] = base;
      c.hi[c.next] = end;
      c.next = (c.next + 1) % DeviceMemoryCache::kRemembered;
      return true;
    }
    gap_lo = end;
  }
  c.gap_lo[c.next_gap] = gap_lo;
  c.gap_hi[c.next_gap] = it == m.end() ? UINTPTR_MAX : it->first;
  c.next_gap = (c.next_gap + 1) % DeviceMemoryCache::kGaps;
  return false;
}
}  // namespace

// Every observed access of a kernel asks this: the cache's test runs without AddressSanitizer's
// checks of its own fixed fields (they were most of its time).
__attribute__((no_sanitize("address"))) bool device_memory(uintptr_t a) {
  DeviceMemoryCache& c = g_device_cache;
  if (c.generation != mem().generation) {
    c = DeviceMemoryCache{};
    c.generation = mem().generation;
  }
  for (int i = 0; i < DeviceMemoryCache::kRemembered; ++i)
    if (a - c.lo[i] < c.hi[i] - c.lo[i]) return true;
  for (int i = 0; i < DeviceMemoryCache::kGaps; ++i)
    if (a - c.gap_lo[i] < c.gap_hi[i] - c.gap_lo[i]) return false;
  return device_memory_search(a);
}

std::string describe_device_address(const void* p) {
  const Allocation* a = find_allocation(p);
  if (!a) return range_str(p, 0) + " (not in a device allocation)";
  char at[32];
  std::snprintf(at, sizeof at, "%p", static_cast<const void*>(a->base));
  return "byte " + std::to_string((size_t)(static_cast<const unsigned char*>(p) - a->base)) + " of the " +
         std::to_string(a->size) + "-byte allocation at " + at;
}

bool device_range_ok(const void* p, size_t bytes, std::string* why) {
  const Allocation* a = find_allocation(p);
  const unsigned char* q = static_cast<const unsigned char*>(p);
  if (!a) {
    if (why) *why = range_str(p, bytes) + " is not in any device allocation (a host pointer?)";
    return false;
  }
  const size_t off = (size_t)(q - a->base);
  if (off + bytes > a->size) {
    if (why)
      *why = range_str(p, bytes) + " ends " + std::to_string(off + bytes - a->size) +
             " bytes past the end of its allocation " + range_str(a->base, a->size);
    return false;
  }
  for (const auto& h : a->holes)
    if (off < h.first + h.second && h.first < off + bytes) {
      if (why)
        *why = range_str(p, bytes) + " runs into the gap at bytes [" + std::to_string(h.first) + ", " +
               std::to_string(h.first + h.second) + ") of its allocation (a region carved from it is overrun)";
      return false;
    }
  return true;
}

void mark_no_access(const void* p, size_t bytes) {
  if (bytes == 0) return;
  Allocation* a = find_allocation(p);
  if (!a || a->pinned || static_cast<const unsigned char*>(p) + bytes > a->base + a->size) {
    std::fprintf(stderr, "SIMT emulator: mark_no_access %s outside a device allocation\n", range_str(p, bytes).c_str());
    std::abort();
  }
  a->holes.emplace_back((size_t)(static_cast<const unsigned char*>(p) - a->base), bytes);
  std::sort(a->holes.begin(), a->holes.end());
  TG_EMU_POISON(const_cast<void*>(p), bytes);
}

void check_kernel_pointer(const void* kernel, int index, const void* p) {
  if (p == nullptr || find_allocation(p)) return;
  set_sticky_error(cudaErrorIllegalAddress, "kernel " + kernel_name(kernel) + ": argument " + std::to_string(index) +
                                                " is " + range_str(p, 0) +
                                                ", not device memory (a host pointer passed to a kernel)");
}

void launch(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, std::function<void()> body) {
  if (sticky_error() != cudaSuccess) return set_last_error(sticky_error());
  const cudaDeviceProp& p = device_prop();
  const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  auto bad = [&](cudaError_t e, const std::string& why) {
    fail(e, "launch of " + kernel_name(kernel) + ": " + why);
  };
  if (block.x < 1 || block.y < 1 || block.z < 1 || block.x > (unsigned)p.maxThreadsDim[0] ||
      block.y > (unsigned)p.maxThreadsDim[1] || block.z > (unsigned)p.maxThreadsDim[2] ||
      threads > (unsigned long long)p.maxThreadsPerBlock)
    return bad(cudaErrorInvalidConfiguration, "block (" + std::to_string(block.x) + "," + std::to_string(block.y) +
                                                  "," + std::to_string(block.z) + ") outside the device's limits");
  if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > (unsigned)p.maxGridSize[0] ||
      grid.y > (unsigned)p.maxGridSize[1] || grid.z > (unsigned)p.maxGridSize[2])
    return bad(cudaErrorInvalidConfiguration, "grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," +
                                                   std::to_string(grid.z) + ") outside the device's limits");
  const auto it = smem_limits().find(kernel);
  const size_t limit = it == smem_limits().end() ? kDefaultSmemPerBlock : (size_t)it->second;
  if (smem > limit)
    return bad(cudaErrorInvalidValue, std::to_string(smem) + " bytes of dynamic shared memory, above the kernel's " +
                                          std::to_string(limit) +
                                          (it == smem_limits().end() ? " (48 KB without cudaFuncSetAttribute)" : ""));
  auto run = std::make_shared<std::function<void()>>(std::move(body));
  enqueue(stream, "kernel", [kernel, grid, block, smem, run] { run_grid(kernel, grid, block, smem, *run); });
}

}  // namespace emu

// ---- the CUDA runtime API -----------------------------------------------------------------------
using emu::device_prop;
using emu::fail;
using emu::sticky_error;

namespace {
// The devices a process sees: 1, or TG_EMU_DEVICES=N (1 to 64) for data-parallel ranks
// (mpirun -np N ./train_gpt_emu: each rank a process that takes the device of its local rank).
// Every index is the process's one emulated device; cudaGetDevice returns the index set.
int device_count() {
  const char* env = std::getenv("TG_EMU_DEVICES");
  const int n = env ? std::atoi(env) : 1;
  return n >= 1 && n <= 64 ? n : 1;
}
int g_current_device = 0;
}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = g_current_device;
  return sticky_error();
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): " +
                                            std::to_string(device_count()) + " device(s) (TG_EMU_DEVICES)");
  g_current_device = device;
  return sticky_error();
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  *prop = device_prop();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (sticky_error()) return fail(sticky_error());
  if (!free_bytes || !total_bytes) return fail(cudaErrorInvalidValue);
  *total_bytes = device_prop().totalGlobalMem;
  const size_t used = emu::mem().device_bytes;
  *free_bytes = std::min(*total_bytes - std::min(used, *total_bytes), emu::host_available_bytes());
  return cudaSuccess;
}

static cudaError_t allocate(void** ptr, size_t size, bool pinned, const char* who) {
  emu::racecheck_from_env();  // before the first allocation: the checker sees every write
  if (sticky_error()) return fail(sticky_error());
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  if (size > free_b || size > emu::host_available_bytes()) return fail(cudaErrorMemoryAllocation);
  const size_t raw_size = (size + 2 * emu::kRedZone + 255) / 256 * 256;
  void* raw = std::aligned_alloc(256, raw_size);
  if (!raw) return fail(cudaErrorMemoryAllocation);
  emu::Allocation a;
  a.raw = raw;
  a.base = static_cast<unsigned char*>(raw) + emu::kRedZone;
  a.size = size;
  a.pinned = pinned;
  std::memset(a.base, 0xFF, size);  // what nothing wrote reads as NaN
  TG_EMU_POISON(raw, emu::kRedZone);
  TG_EMU_POISON(a.base + size, raw_size - emu::kRedZone - size);
  if (!pinned) {
    emu::mem().device_bytes += size;
    if (emu::mem().depth == 0) TG_EMU_POISON(a.base, size);
  }
  (void)who;
  *ptr = a.base;
  emu::mem().by_base[reinterpret_cast<uintptr_t>(a.base)] = std::move(a);
  ++emu::mem().generation;
  return cudaSuccess;
}

static cudaError_t release(void* ptr, bool pinned, const char* who) {
  if (!ptr) return cudaSuccess;
  emu::run_all();  // freeing synchronises the device
  auto& m = emu::mem().by_base;
  const auto it = m.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.end() || it->second.pinned != pinned)
    return fail(cudaErrorInvalidValue, std::string(who) + "(" + emu::range_str(ptr, 0) + "): not a pointer from " +
                                           (pinned ? "cudaMallocHost" : "cudaMalloc"));
  emu::Allocation& a = it->second;
  if (emu::g_observed) emu::notify_device_freed(a.base, a.size);
  if (!pinned) emu::mem().device_bytes -= a.size;
  TG_EMU_UNPOISON(a.raw, a.size + 2 * emu::kRedZone);
  std::free(a.raw);
  m.erase(it);
  ++emu::mem().generation;
  return sticky_error();
}

cudaError_t cudaMalloc(void** ptr, size_t size) { return allocate(ptr, size, false, "cudaMalloc"); }
cudaError_t cudaFree(void* ptr) { return release(ptr, false, "cudaFree"); }
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) { return allocate(ptr, size, true, "cudaHostAlloc"); }
cudaError_t cudaMallocHost(void** ptr, size_t size) { return allocate(ptr, size, true, "cudaMallocHost"); }
cudaError_t cudaFreeHost(void* ptr) { return release(ptr, true, "cudaFreeHost"); }

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (sticky_error()) return fail(sticky_error());
  emu::StreamState* s = emu::lookup(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: unknown stream");
  if (count == 0) return cudaSuccess;
  if (cudaError_t e = emu::check_copy(dst, src, count, kind, "cudaMemcpyAsync")) return e;
  emu::queue_copy(dst, src, count, kind, s, "cudaMemcpyAsync");
  // to pageable host memory the call returns only once the copy is done
  if ((kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost) && !emu::is_pinned(dst))
    return emu::synchronize(stream);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (sticky_error()) return fail(sticky_error());
  if (count == 0) return cudaSuccess;
  if (cudaError_t e = emu::check_copy(dst, src, count, kind, "cudaMemcpy")) return e;
  emu::StreamState* legacy = &emu::streams().legacy;
  emu::queue_copy(dst, src, count, kind, legacy, "cudaMemcpy");
  // host to device from pageable memory: returns once staged (the copy may not have landed);
  // device to device: no host synchronisation; otherwise synchronous
  if ((kind == cudaMemcpyHostToDevice && !emu::is_pinned(src)) || kind == cudaMemcpyDeviceToDevice)
    return cudaSuccess;
  return emu::synchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (sticky_error()) return fail(sticky_error());
  if (!emu::lookup(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: unknown stream");
  if (count == 0) return cudaSuccess;
  if (cudaError_t e = emu::check_memset(ptr, count, "cudaMemsetAsync")) return e;
  return emu::queue_memset(ptr, value, count, stream, "cudaMemsetAsync");
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (sticky_error()) return fail(sticky_error());
  if (count == 0) return cudaSuccess;
  if (cudaError_t e = emu::check_memset(ptr, count, "cudaMemset")) return e;
  return emu::queue_memset(ptr, value, count, nullptr, "cudaMemset");
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (sticky_error()) return fail(sticky_error());
  if (!stream || (flags != cudaStreamDefault && flags != cudaStreamNonBlocking)) return fail(cudaErrorInvalidValue);
  auto* s = new emu::StreamState;
  s->blocking = flags == cudaStreamDefault;
  emu::streams().created.push_back(s);
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  emu::StreamState* s = emu::lookup(stream);
  if (!s || s->legacy) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: unknown stream");
  emu::run_until(s, s->enqueued);  // its work completes before the stream goes
  auto& c = emu::streams().created;
  c.erase(std::find(c.begin(), c.end(), s));
  for (emu::EventState* e : emu::streams().events)
    if (e->stream == s) e->stream = nullptr, e->count = 0;  // already complete
  delete s;
  return sticky_error();
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!emu::lookup(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: unknown stream");
  return emu::synchronize(stream);
}

cudaError_t cudaDeviceSynchronize(void) {
  emu::run_all();
  return sticky_error();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (sticky_error()) return fail(sticky_error());
  if (!event || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming))) return fail(cudaErrorInvalidValue);
  auto* e = new emu::EventState;
  e->timing = !(flags & cudaEventDisableTiming);
  emu::streams().events.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

static emu::EventState* lookup_event(cudaEvent_t event) {
  auto* e = reinterpret_cast<emu::EventState*>(event);
  return emu::streams().events.count(e) ? e : nullptr;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (sticky_error()) return fail(sticky_error());
  emu::EventState* e = lookup_event(event);
  emu::StreamState* s = emu::lookup(stream);
  if (!e || !s) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: unknown event or stream");
  e->stream = s;
  if (e->timing) {  // a timed event stamps the time when the stream's work before it has run
    s->pending.push_back(emu::Op{[t = e->reached] { *t = std::chrono::steady_clock::now(); }, "cudaEventRecord", {}});
    ++s->enqueued;
  }
  e->count = s->enqueued;
  return cudaSuccess;
}

// The host time between the two events' stamps, once both have run (cudaErrorNotReady before,
// as CUDA answers; an event created with cudaEventDisableTiming is refused, as CUDA refuses it).
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  emu::EventState* a = lookup_event(start);
  emu::EventState* b = lookup_event(end);
  if (!ms || !a || !b) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: unknown event");
  if (!a->timing || !b->timing || !a->stream || !b->stream) return fail(cudaErrorInvalidResourceHandle);
  if (a->stream->done < a->count || b->stream->done < b->count) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(*b->reached - *a->reached).count();
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  emu::EventState* e = lookup_event(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: unknown event");
  if (e->stream) emu::run_until(e->stream, e->count);  // never recorded: complete at once
  return sticky_error();
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  emu::EventState* e = lookup_event(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: unknown event");
  emu::streams().events.erase(e);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaFuncGetName(const char** name, const void* func) {
  if (!name || !func) return fail(cudaErrorInvalidValue);
  static std::map<const void*, std::string> names;  // the strings live as long as the process
  auto it = names.find(func);
  if (it == names.end()) it = names.emplace(func, emu::kernel_name(func)).first;
  *name = it->second.c_str();
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (sticky_error()) return fail(sticky_error());
  if (!func) return fail(cudaErrorInvalidDeviceFunction);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: only cudaFuncAttributeMaxDynamicSharedMemorySize is emulated");
  if (value < 0 || (size_t)value > device_prop().sharedMemPerBlockOptin)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute(" + emu::kernel_name(func) +
                                           ", MaxDynamicSharedMemorySize, " + std::to_string(value) +
                                           "): above the device's opt-in limit of " +
                                           std::to_string(device_prop().sharedMemPerBlockOptin) + " bytes");
  emu::smem_limits()[func] = value;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  if (sticky_error()) return sticky_error();
  const cudaError_t e = emu::errors().last;
  emu::errors().last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return sticky_error() ? sticky_error() : emu::errors().last; }

cudaError_t cudaDeviceReset(void) {
  emu::Streams& ss = emu::streams();
  for (emu::StreamState* s : ss.created) delete s;
  ss.created.clear();
  ss.legacy.pending.clear();
  ss.legacy.done = ss.legacy.enqueued;
  for (emu::EventState* e : ss.events) delete e;
  ss.events.clear();
  for (auto& kv : emu::mem().by_base) {
    TG_EMU_UNPOISON(kv.second.raw, kv.second.size + 2 * emu::kRedZone);
    std::free(kv.second.raw);
  }
  emu::mem().by_base.clear();
  emu::mem().device_bytes = 0;
  emu::smem_limits().clear();
  emu::errors() = emu::Errors{};
  return cudaSuccess;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "unknown error";
  }
}

}  // extern "C"
