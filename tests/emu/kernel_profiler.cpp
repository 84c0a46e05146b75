// tests/emu/kernel_profiler.cpp: the counters of tests/emu/kernel_profiler.h.
#include "kernel_profiler.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "emu_internal.h"
#include "simt_emulator.h"

namespace emu {

void GlobalCounters::add(const GlobalCounters& o) {
  requests += o.requests;
  sectors += o.sectors;
  ideal_sectors += o.ideal_sectors;
  bytes += o.bytes;
}

void SharedCounters::add(const SharedCounters& o) {
  requests += o.requests;
  wavefronts += o.wavefronts;
  ideal_wavefronts += o.ideal_wavefronts;
  bytes += o.bytes;
}

void KernelCounters::add(const KernelCounters& o) {
  launches += o.launches;
  grid = o.grid, block = o.block, dynamic_smem = o.dynamic_smem;
  load.add(o.load), store.add(o.store);
  shared_load.add(o.shared_load), shared_store.add(o.shared_store);
  unique_read_bytes += o.unique_read_bytes, unique_write_bytes += o.unique_write_bytes;
  mma += o.mma, mma_flops += o.mma_flops, cp_async_bytes += o.cp_async_bytes, tma_bytes += o.tma_bytes;
  for (const SiteCounters& s : o.sites) {
    auto it = std::find_if(sites.begin(), sites.end(),
                           [&s](const SiteCounters& t) { return t.pc == s.pc && t.write == s.write && t.space == s.space; });
    if (it == sites.end()) {
      sites.push_back(s);
      continue;
    }
    it->width = std::max(it->width, s.width);
    it->global.add(s.global);
    it->shared.add(s.shared);
  }
}

namespace {

constexpr uint8_t kWrite = 1, kShared = 2;
TG_EMU_UNCHECKED inline uint8_t flags_of(const Access& a) {
  return (uint8_t)((a.write ? kWrite : 0) | (a.space == Space::Shared ? kShared : 0) | ((uint8_t)a.kind << 2));
}

// One warp-level instruction: the active lanes' addresses and sizes.
struct Group {
  const void* pc;
  uint8_t flags;
  int n = 0;
  int lane[32];
  uintptr_t addr[32];
  uint32_t size[32];
};

// The grouping and counting below run out of the sanitizers' reach (TG_EMU_UNCHECKED), as
// KernelProfiler::access does: on the profiler's own fixed arrays and buffers sized beforehand, with
// no std:: algorithm (GCC would not inline it there).

// v[0 .. n) in ascending order of key(): insertion sort (a warp's lanes mostly come in address
// order, which it passes through in one sweep)
struct Range {
  uintptr_t lo, hi;
};
TG_EMU_UNCHECKED inline uintptr_t key(uintptr_t v) { return v; }
TG_EMU_UNCHECKED inline uintptr_t key(const Range& r) { return r.lo; }
template <class T>
TG_EMU_UNCHECKED inline void sort_small(T* v, size_t n) {
  for (size_t i = 1; i < n; ++i) {
    const T x = v[i];
    size_t j = i;
    for (; j > 0 && key(x) < key(v[j - 1]); --j) v[j] = v[j - 1];
    v[j] = x;
  }
}

// Distinct bytes of the lanes' ranges.
TG_EMU_UNCHECKED uint64_t distinct_bytes(const Group& g) {
  Range r[32];
  for (int i = 0; i < g.n; ++i) r[i] = Range{g.addr[i], g.addr[i] + g.size[i]};
  sort_small(r, (size_t)g.n);
  uint64_t bytes = 0;
  uintptr_t end = 0;
  for (int i = 0; i < g.n; ++i) {
    const uintptr_t b = r[i].lo > end ? r[i].lo : end;
    if (r[i].hi > b) bytes += r[i].hi - b;
    if (r[i].hi > end) end = r[i].hi;
  }
  return bytes;
}

// v's first n elements, v grown where it is shorter (its storage kept from one call to the next)
template <class T>
__attribute__((noinline)) T* room(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// The distinct units (of 2^shift bytes) that the lanes of phase p (lane / per_phase == p) of g
// touch: their count, sorted into `units`, which holds every lane's units with repeats.
TG_EMU_UNCHECKED size_t distinct_units(const Group& g, int shift, int p, int per_phase, uintptr_t* units) {
  size_t n = 0;
  for (int i = 0; i < g.n; ++i)
    if (g.lane[i] / per_phase == p)
      for (uintptr_t u = g.addr[i] >> shift; u <= (g.addr[i] + g.size[i] - 1) >> shift; ++u) units[n++] = u;
  sort_small(units, n);
  size_t out = 0;
  for (size_t i = 0; i < n; ++i)
    if (out == 0 || units[i] != units[out - 1]) units[out++] = units[i];
  return out;
}

// room for every lane's units of 2^shift bytes, with repeats
TG_EMU_UNCHECKED uintptr_t* units_of(const Group& g, int shift) {
  size_t n = 0;
  for (int i = 0; i < g.n; ++i) n += ((g.addr[i] + g.size[i] - 1) >> shift) - (g.addr[i] >> shift) + 1;
  static thread_local std::vector<uintptr_t> units;
  return room(units, n);
}

TG_EMU_UNCHECKED GlobalCounters count_global(const Group& g, uint32_t width) {
  GlobalCounters c;
  c.requests = 1;
  c.sectors = distinct_units(g, 5, 0, 32, units_of(g, 5));
  c.ideal_sectors = ((uint64_t)g.n * width + 31) / 32;
  c.bytes = distinct_bytes(g);
  return c;
}

TG_EMU_UNCHECKED SharedCounters count_shared(const Group& g, uint32_t width) {
  SharedCounters c;
  c.requests = 1;
  c.bytes = distinct_bytes(g);
  const int phases = width <= 4 ? 1 : width <= 8 ? 2 : 4;
  const int per_phase = 32 / phases;
  uintptr_t* words = units_of(g, 2);
  for (int p = 0; p < phases; ++p) {
    const size_t n = distinct_units(g, 2, p, per_phase, words);
    if (n == 0) continue;
    int per_bank[32] = {};
    int most = 0;
    for (size_t i = 0; i < n; ++i)
      if (++per_bank[words[i] % 32] > most) most = per_bank[words[i] % 32];
    c.wavefronts += (uint64_t)most;
    c.ideal_wavefronts += 1;
  }
  return c;
}

// Whether pc lies in the CUDA headers' two-element vector types (cuda_bf16.hpp, cuda_fp16.hpp):
// compiled for the host, as here, a __nv_bfloat162 or __half2 is copied member by member (x,
// then y: two 2-byte accesses), where the device branch of the same header copies it as one
// 32-bit word. The profiler counts such a pair as the device's one access.
bool vector_type_pc(const void* pc) {
  static std::unordered_map<const void*, bool> known;
  auto [it, fresh] = known.try_emplace(pc, false);
  if (fresh) {
    const std::vector<std::string> frames = source_frames(pc);
    const std::string where = frames.empty() ? "" : frames.front();
    it->second = where.find("cuda_bf16.hpp") != std::string::npos || where.find("cuda_fp16.hpp") != std::string::npos;
  }
  return it->second;
}

// A map from a pair of keys (64 and 32 bits) to a 32-bit value, by open addressing, emptied in
// one step by moving its generation: flush's look-ups, which as std::unordered_map allocated a
// node for each key of every warp at every __syncthreads.
class FlatIndex {
 public:
  // the value of (a, b); inserted as v where absent (*fresh says so)
  TG_EMU_UNCHECKED uint32_t& find_or_insert(uint64_t a, uint32_t b, uint32_t v, bool* fresh) {
    if (2 * (count_ + 1) > size_) grow();
    for (size_t i = hash(a, b) & (size_ - 1);; i = (i + 1) & (size_ - 1)) {
      Slot& s = at_[i];
      if (s.gen != gen_) {
        s = Slot{a, b, v, gen_};
        ++count_;
        *fresh = true;
        return s.v;
      }
      if (s.a == a && s.b == b) {
        *fresh = false;
        return s.v;
      }
    }
  }
  TG_EMU_UNCHECKED void clear() {
    count_ = 0;
    if (++gen_ == 0) restart();  // (after 2^32 clears: every slot's generation is stale again)
  }

 private:
  struct Slot {
    uint64_t a;
    uint32_t b, v, gen;
  };
  TG_EMU_UNCHECKED static size_t hash(uint64_t a, uint32_t b) {
    return (size_t)((a ^ (uint64_t)b * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull >> 20);
  }
  __attribute__((noinline)) void restart() {
    for (Slot& s : slots_) s.gen = 0;
    gen_ = 1;
  }
  __attribute__((noinline)) void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.empty() ? 256 : 2 * old.size(), Slot{0, 0, 0, 0});
    at_ = slots_.data();
    size_ = slots_.size();
    const uint32_t g = gen_;
    gen_ = 1;
    count_ = 0;
    for (const Slot& s : old) {
      bool fresh;
      if (s.gen == g) find_or_insert(s.a, s.b, s.v, &fresh);
    }
  }
  std::vector<Slot> slots_;
  Slot* at_ = nullptr;  // slots_ as the unchecked functions read it
  size_t size_ = 0;
  uint32_t gen_ = 1;
  size_t count_ = 0;
};

// flush's tables and its groups, kept from one flush to the next
struct Scratch {
  FlatIndex occurrence;  // per lane: (pc, flags) -> times seen
  FlatIndex index;       // per warp: (site, occurrence) -> group
  std::vector<Group> groups;
};
__attribute__((noinline)) Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

}  // namespace

KernelProfiler::KernelProfiler() { add_observer(this); }
KernelProfiler::~KernelProfiler() { remove_observer(this); }

void KernelProfiler::clear() {
  launches_.clear();
  gemms_.clear();
}

void KernelProfiler::launch_begin(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem) {
  kernel_ = kernel;
  launches_.emplace_back();
  KernelCounters& k = launches_.back();
  current_ = &k;
  k.kernel = kernel_name(kernel);
  k.launches = 1;
  k.grid = grid, k.block = block, k.dynamic_smem = dynamic_smem;
  threads_ = (int)(block.x * block.y * block.z);
  site_index_.clear();
  read_sectors_.clear();
  written_sectors_.clear();
}

TG_EMU_UNCHECKED void KernelProfiler::SectorSet::insert(uintptr_t addr, uint32_t size) {
  for (uintptr_t s = addr >> 5; s <= (addr + size - 1) >> 5; ++s) {
    const uintptr_t page = s >> 7;
    uint64_t* b = cache_.find(page);
    if (!b) b = bits(page);
    b[(s >> 6) & 1] |= 1ull << (s & 63);
  }
}

uint64_t* KernelProfiler::SectorSet::bits(uintptr_t page) {
  uint64_t* b = pages_[page].data();
  cache_.put(page, b);
  return b;
}

uint64_t KernelProfiler::SectorSet::count() const {
  uint64_t n = 0;
  for (const auto& [page, bits] : pages_) n += (uint64_t)__builtin_popcountll(bits[0]) + (uint64_t)__builtin_popcountll(bits[1]);
  return n;
}

void KernelProfiler::SectorSet::clear() {
  pages_.clear();
  cache_.clear();
}

void KernelProfiler::cta_begin() {
  if ((int)log_.size() < threads_) log_.resize((size_t)threads_);
  log_at_ = log_.data();
  for (int t = 0; t < threads_; ++t) log_at_[t].n = 0;
}

void KernelProfiler::grow(Log& log) {
  log.storage.resize(log.capacity ? 2 * log.capacity : 64);
  log.at = log.storage.data();
  log.capacity = log.storage.size();
}

TG_EMU_UNCHECKED void KernelProfiler::access(const Access& a) {
  if (!kernel_ || !a.thread || a.kind == AccessKind::CpAsyncLand) return;  // counted at issue
  if (a.kind == AccessKind::AsyncRead || a.kind == AccessKind::AsyncReadDone) return;  // wgmma: not counted yet
  if (a.kind == AccessKind::BulkCopy || a.kind == AccessKind::BulkCopyLand) {  // TMA: its bytes, no requests
    if (a.kind == AccessKind::BulkCopy && a.space == Space::Global) {
      current_->tma_bytes += a.size;
      read_sectors_.insert(a.addr, a.size);
    }
    return;
  }
  Log& log = log_at_[a.thread->linear];
  if (log.n == log.capacity) grow(log);
  log.at[log.n++] = Entry{a.pc, a.addr, a.size, flags_of(a)};
  if (a.space == Space::Global) {
    (a.write ? written_sectors_ : read_sectors_).insert(a.addr, a.size);
    if (a.kind == AccessKind::CpAsync) current_->cp_async_bytes += a.size;
  }
}

void KernelProfiler::barrier() { flush(); }
void KernelProfiler::cta_end() { flush(); }

void KernelProfiler::mma(int, uint64_t flops) {
  if (!kernel_) return;
  launches_.back().mma += 1;
  launches_.back().mma_flops += flops;
}

void KernelProfiler::launch_end() {
  if (!kernel_) return;
  KernelCounters& k = launches_.back();
  k.unique_read_bytes = 32 * read_sectors_.count();
  k.unique_write_bytes = 32 * written_sectors_.count();
  kernel_ = nullptr;
  current_ = nullptr;
}

void KernelProfiler::gemm(const GemmEvent& g) { gemms_.push_back(g); }

// x then y of one two-element vector (vector_type_pc), 4-byte aligned: one 4-byte access. A
// copy from one vector to another interleaves them (load x, store x, load y, store y), so y is
// looked for among the next three accesses.
TG_EMU_UNCHECKED size_t KernelProfiler::merge_vector_halves(Entry* entries, size_t n) {
  constexpr uint8_t kTaken = 0x80;  // a y half merged into its x
  for (size_t i = 0; i < n; ++i) {
    Entry& a = entries[i];
    if (a.size != 2 || a.addr % 4 != 0 || (a.flags & kTaken) || !vector_type_pc(a.pc)) continue;
    for (size_t j = i + 1; j < n && j <= i + 3; ++j) {
      Entry& b = entries[j];
      if (b.size == 2 && b.flags == a.flags && b.addr == a.addr + 2 && vector_type_pc(b.pc)) {
        a.size = 4;
        b.flags |= kTaken;
        break;
      }
    }
  }
  size_t out = 0;
  for (size_t i = 0; i < n; ++i)
    if (!(entries[i].flags & kTaken)) entries[out++] = entries[i];
  return out;
}

SiteCounters& KernelProfiler::site(uint64_t key, const void* pc, uint8_t flags) {
  KernelCounters& k = *current_;
  auto [it, fresh] = site_index_.try_emplace(key, k.sites.size());
  if (fresh) {
    k.sites.emplace_back();
    SiteCounters& s = k.sites.back();
    s.pc = pc;
    s.write = flags & kWrite;
    s.space = flags & kShared ? Space::Shared : Space::Global;
    s.kind = (AccessKind)(flags >> 2);
  }
  return k.sites[it->second];
}

TG_EMU_UNCHECKED void KernelProfiler::flush() {
  if (!kernel_) return;
  KernelCounters& k = *current_;
  Scratch& sc = scratch();
  for (int w = 0; w * 32 < threads_; ++w) {
    const int lanes = threads_ - 32 * w < 32 ? threads_ - 32 * w : 32;
    Log* logs = log_at_ + 32 * w;
    size_t total = 0;  // (at most a group an access)
    for (int lane = 0; lane < lanes; ++lane) total += logs[lane].n;
    Group* groups = room(sc.groups, total);
    size_t ngroups = 0;
    sc.index.clear();
    for (int lane = 0; lane < lanes; ++lane) {
      sc.occurrence.clear();
      Log& log = logs[lane];
      const size_t n = merge_vector_halves(log.at, log.n);
      for (size_t i = 0; i < n; ++i) {
        Entry e = log.at[i];
        e.pc = source_site(e.pc);
        const uint64_t site = (uint64_t)(uintptr_t)e.pc << 4 | e.flags;
        bool fresh;
        const uint32_t occ = sc.occurrence.find_or_insert(site, 0, 0, &fresh)++;
        const uint32_t at = sc.index.find_or_insert(site, occ, (uint32_t)ngroups, &fresh);
        if (fresh) {
          Group& g = groups[ngroups++];
          g.pc = e.pc;
          g.flags = e.flags;
          g.n = 0;
        }
        Group& g = groups[at];
        g.lane[g.n] = lane, g.addr[g.n] = e.addr, g.size[g.n] = e.size;
        ++g.n;
      }
      log.n = 0;
    }
    for (size_t i = 0; i < ngroups; ++i) {
      const Group& g = groups[i];
      uint32_t width = 0;
      for (int l = 0; l < g.n; ++l)
        if (g.size[l] > width) width = g.size[l];
      SiteCounters& s = site((uint64_t)(uintptr_t)g.pc << 4 | g.flags, g.pc, g.flags);
      if (width > s.width) s.width = width;
      if (s.space == Space::Global) {
        const GlobalCounters c = count_global(g, width);
        s.global.add(c);
        (s.write ? k.store : k.load).add(c);
      } else {
        const SharedCounters c = count_shared(g, width);
        s.shared.add(c);
        (s.write ? k.shared_store : k.shared_load).add(c);
      }
    }
  }
}

KernelCounters KernelProfiler::total(const std::string& part) const {
  KernelCounters t;
  for (const KernelCounters& k : launches_)
    if (k.kernel.find(part) != std::string::npos) {
      if (t.launches == 0) t.kernel = k.kernel;
      t.add(k);
    }
  return t;
}

std::vector<KernelCounters> KernelProfiler::per_kernel() const {
  std::vector<KernelCounters> out;
  std::map<std::string, size_t> at;
  for (const KernelCounters& k : launches_) {
    auto [it, fresh] = at.try_emplace(k.kernel, out.size());
    if (fresh) {
      out.emplace_back();
      out.back().kernel = k.kernel;
    }
    out[it->second].add(k);
  }
  return out;
}

std::string KernelProfiler::report(bool sites, double min_efficiency) const {
  std::string r =
      "kernel | launches | global ld req, sectors/req (ideal), efficiency | global st req, sectors/req (ideal), "
      "efficiency | moved MB / compulsory MB | shared ld req, wavefronts, conflicts | shared st req, wavefronts, "
      "conflicts | mma | cp.async MB\n";
  for (const KernelCounters& k : per_kernel()) {
    auto g = [](const GlobalCounters& c) {
      return std::to_string(c.requests) + ", " + fmt("%.2f", c.sectors_per_request()) + " (" +
             fmt("%.2f", c.requests ? (double)c.ideal_sectors / (double)c.requests : 0.0) + "), " +
             fmt("%.1f%%", 100 * c.efficiency());
    };
    auto s = [](const SharedCounters& c) {
      return std::to_string(c.requests) + ", " + std::to_string(c.wavefronts) + ", " + std::to_string(c.conflicts());
    };
    r += k.kernel + " | " + std::to_string(k.launches) + " | " + g(k.load) + " | " + g(k.store) + " | " +
         fmt("%.3f", (double)k.moved_bytes() / 1e6) + " / " + fmt("%.3f", (double)k.compulsory_bytes() / 1e6) +
         " | " + s(k.shared_load) + " | " + s(k.shared_store) + " | " + std::to_string(k.mma) + " | " +
         fmt("%.3f", (double)k.cp_async_bytes / 1e6) + "\n";
    if (!sites) continue;
    for (const SiteCounters& site : k.sites) {
      const char* what = site.kind == AccessKind::LdMatrix   ? "ldmatrix"
                         : site.kind == AccessKind::StMatrix ? "stmatrix"
                         : site.kind == AccessKind::CpAsync  ? "cp.async"
                         : site.write                        ? "store"
                                                             : "load";
      if (site.space == Space::Shared && site.shared.conflicts() > 0)
        r += "    shared " + std::string(what) + " " + std::to_string(site.width) + " B at " + source_line(site.pc) +
             ": " + std::to_string(site.shared.requests) + " requests, " + std::to_string(site.shared.wavefronts) +
             " wavefronts, " + std::to_string(site.shared.conflicts()) + " conflicts\n";
      if (site.space == Space::Global && site.global.efficiency() < min_efficiency)
        r += "    global " + std::string(what) + " " + std::to_string(site.width) + " B at " + source_line(site.pc) +
             ": " + std::to_string(site.global.requests) + " requests, " +
             fmt("%.2f", site.global.sectors_per_request()) + " sectors/request, " +
             fmt("%.1f%%", 100 * site.global.efficiency()) + " efficiency\n";
    }
  }
  if (!gemms_.empty()) {
    double flops = 0, bytes = 0;
    for (const GemmEvent& gm : gemms_) {
      flops += 2.0 * gm.m * gm.n * gm.k * gm.batch;
      bytes += (double)(gm.a_bytes + gm.b_bytes + gm.c_read_bytes + gm.d_bytes);
    }
    r += "library GEMMs | " + std::to_string(gemms_.size()) + " | " + fmt("%.3f", flops / 1e9) + " GFLOP, " +
         fmt("%.3f", bytes / 1e6) + " MB of A, B, C, D\n";
  }
  return r;
}

}  // namespace emu
