// tests/emu/race_checker.cpp: the racecheck and initcheck of tests/emu/race_checker.h.
#include "race_checker.h"

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <iterator>

#include "emu_internal.h"
#include "simt_emulator.h"

namespace emu {

RaceChecker::RaceChecker() { add_observer(this); }
RaceChecker::~RaceChecker() { remove_observer(this); }

void RaceChecker::launch_begin(const void* kernel, dim3, dim3 block, size_t dynamic_smem) {
  if (kernels_.insert(kernel).second) kernel_names_.push_back(kernel_name(kernel));
  if (dynamic_.size() < dynamic_smem) dynamic_.resize(dynamic_smem);
  if (async_.size() < (dynamic_smem + 15) / 16) async_.resize((dynamic_smem + 15) / 16);
  collective_.assign((block.x * block.y * block.z + 31) / 32, 0);
  dynamic_at_ = dynamic_.data();
  async_at_ = async_.data();
  collective_at_ = collective_.data();
  bx_ = (int)block.x, by_ = (int)block.y;
  global_.clear();
  pages_used_ = 0;
  page_cache_.clear();
  epochs_.assign(1, Epoch{});
  sync_epochs();
  ctas_.clear();
  nctas_ = 0;
  flag_released_.clear();
}

void RaceChecker::cta_begin() {
  ctas_.push_back(g_block_idx);
  nctas_ = (uint32_t)ctas_.size();
  ++cta_;  // every cell of an earlier CTA reads as empty
  barrier_ = 0;
  epochs_.push_back(Epoch{nctas_, 0});
  sync_epochs();
  std::fill(collective_.begin(), collective_.end(), 0u);
  landings_.clear();
  nlandings_ = 0;
  nthreads_ = bx_ * by_ * (int)g_block_dim.z;
  seen_.assign((size_t)nthreads_, {});
  fences_.assign((size_t)nthreads_, 0);
  fences_at_ = fences_.data();
  clock_.clear();
  clocked_ = false;
  released_.clear();
  after_.clear();
  acquired_.clear();
}

void RaceChecker::join(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

void RaceChecker::mbarrier_arrived(const void* bar, uint64_t phase) {
  if (!g_thread) return;
  if (clock_.empty()) clock_.assign((size_t)nthreads_, Clock((size_t)nthreads_, 0));
  clocked_ = true;
  Clock& mine = clock_[(size_t)g_thread->linear];
  ++mine[(size_t)g_thread->linear];
  std::vector<Clock>& phases = released_[reinterpret_cast<uintptr_t>(bar)];
  while (phases.size() <= phase) phases.push_back(phases.empty() ? Clock() : phases.back());
  for (size_t p = (size_t)phase; p < phases.size(); ++p) join(phases[p], mine);
}

void RaceChecker::barrier() {
  ++barrier_;
  epochs_.push_back(Epoch{nctas_, barrier_});
  sync_epochs();
  for (const auto& [thread, known] : acquired_) learn(after_, known);  // now the whole CTA's
  acquired_.clear();
}

void RaceChecker::proxy_fence() {
  if (g_thread) ++fences_[(size_t)g_thread->linear];
}

void RaceChecker::mbarrier_observed(const void* bar, uint64_t phases) {
  if (!g_thread) return;
  const uintptr_t b = reinterpret_cast<uintptr_t>(bar);
  uint64_t& seen = seen_[(size_t)g_thread->linear][b];
  seen = std::max(seen, phases);
  if (clock_.empty()) return;
  Clock& mine = clock_[(size_t)g_thread->linear];
  // the arrivals of the phases completed, and the boxes that landed on them
  const auto it = released_.find(b);
  if (it != released_.end() && phases > 0 && !it->second.empty())
    join(mine, it->second[(size_t)std::min<uint64_t>(phases, it->second.size()) - 1]);
  for (size_t i = 0; i < landings_.size(); ++i)
    if (landings_[i].first == b && landings_[i].second <= phases) {
      const size_t slot = (size_t)nthreads_ + i;
      if (mine.size() <= slot) mine.resize(slot + 1, 0);
      mine[slot] = 1;
    }
}

void RaceChecker::bulk_landing(const void* bar, uint64_t phases) {
  landings_.emplace_back(reinterpret_cast<uintptr_t>(bar), phases);
  nlandings_ = (uint32_t)landings_.size();
}
// The lanes' accesses before the collective are ordered before every lane's after it (the
// warp's collective epoch), but not before another warp's accesses through one lane's later
// arrival on an mbarrier: compute-sanitizer's racecheck on an H200 named such a pattern (the
// consumer lanes' reads, a __syncwarp, lane 0's arrival on "empty", the producer's writes) as a
// hazard, so each thread whose accesses an arrival is to order must arrive itself.
void RaceChecker::warp_collective(int warp, const char*) { ++collective_[(size_t)warp]; }

TG_EMU_UNCHECKED int32_t RaceChecker::pc_code(const void* pc) {
  const intptr_t d = reinterpret_cast<intptr_t>(pc) - reinterpret_cast<intptr_t>(&racecheck_from_env);
  return d > INT32_MIN && d <= INT32_MAX ? (int32_t)d : kNoPc;
}

const void* RaceChecker::pc_of(int32_t code) {
  return code == kNoPc ? nullptr : reinterpret_cast<const void*>(reinterpret_cast<intptr_t>(&racecheck_from_env) + code);
}

// (g_smem_bytes is at most the largest dynamic shared memory of a launch so far, the size of
// dynamic_, and of async_ in chunks)
TG_EMU_UNCHECKED RaceChecker::Cell& RaceChecker::cell(uintptr_t a) {
  const uintptr_t off = a - reinterpret_cast<uintptr_t>(g_smem);
  Cell& c = off < g_smem_bytes ? dynamic_at_[off] : static_cell(a);
  if (c.cta != (uint32_t)cta_) {
    c = Cell{};
    c.cta = (uint32_t)cta_;
  }
  return c;
}

__attribute__((noinline)) RaceChecker::Cell& RaceChecker::static_cell(uintptr_t a) { return static_[a]; }

TG_EMU_UNCHECKED RaceChecker::AsyncChunk* RaceChecker::async_chunk(uintptr_t a) {
  const uintptr_t off = a - reinterpret_cast<uintptr_t>(g_smem);
  if (off >= g_smem_bytes) return nullptr;
  AsyncChunk& k = async_at_[off / 16];
  if (k.cta != (uint32_t)cta_) {
    k = AsyncChunk{};
    k.cta = (uint32_t)cta_;
  }
  return &k;
}

TG_EMU_UNCHECKED bool RaceChecker::ordered(const Stamp& e, int thread) const {
  if (e.thread == kLanded) return e.barrier != barrier_ || landed_ordered(e, thread);
  if (e.thread < 0 || e.thread == thread || e.barrier != barrier_) return true;
  // an arrival of e's thread after e reached this thread
  if (clocked_ && clock_knows(thread, (size_t)e.thread, e.arrivals)) return true;
  return e.thread / 32 == thread / 32 && e.collective != collective_at_[thread / 32];
}

// a TMA box landed since the last __syncthreads: seen through its mbarrier
__attribute__((noinline)) bool RaceChecker::landed_ordered(const Stamp& e, int thread) const {
  const auto& [bar, phases] = landings_[e.collective];
  const auto& seen = seen_[(size_t)thread];
  const auto it = seen.find(bar);
  if (it != seen.end() && it->second >= phases) return true;
  // or known through the arrivals of threads that saw it
  return clocked_ && clock_knows(thread, (size_t)nthreads_ + e.collective, 0);
}

// whether entry `slot` of the thread's clock is above `above`
__attribute__((noinline)) bool RaceChecker::clock_knows(int thread, size_t slot, uint32_t above) const {
  const Clock& c = clock_[(size_t)thread];
  return c.size() > slot && c[slot] > above;
}

__attribute__((noinline)) uint32_t RaceChecker::clock_arrivals(int thread) const {
  return clock_[(size_t)thread][(size_t)thread];
}

void RaceChecker::hazard(const char* what, uintptr_t a, const Stamp& e, const Access& now, bool ordering_helps) {
  auto tid = [this](int t) {
    return "(" + std::to_string(t % bx_) + "," + std::to_string(t / bx_ % by_) + "," + std::to_string(t / (bx_ * by_)) +
           ") [warp " + std::to_string(t / 32) + " lane " + std::to_string(t % 32) + "]";
  };
  const uintptr_t off = a - reinterpret_cast<uintptr_t>(g_smem);
  const std::string where = off < g_smem_bytes ? "byte " + std::to_string(off) + " of the dynamic shared memory"
                                               : "a static __shared__ array";
  std::string msg = std::string("racecheck: ") + what + " on " + where + ": thread " + tid(now.thread->linear) + " at " +
                    source_line(now.pc);
  if (e.thread >= 0)
    msg += (e.thread == now.thread->linear ? std::string(", after its own ") : ", after thread " + tid(e.thread) + " at ") +
           (e.pc == kNoPc ? std::string("?") : source_line(pc_of(e.pc))) +
           (e.barrier == barrier_ && ordering_helps ? " with no __syncthreads between" : "");
  std::fprintf(stderr, "SIMT emulator: %s\n", msg.c_str());
  device_fault(cudaErrorLaunchFailure, msg);
}

// The bits of the bytes [b, end) that lie in b's 64-byte word of the initcheck map, and the end
// of that run: the map is set and tested a word at a time.
TG_EMU_UNCHECKED static inline uint64_t word_mask(uintptr_t b, uintptr_t end, uintptr_t* run_end) {
  *run_end = end < (b | 63) + 1 ? end : (b | 63) + 1;
  const unsigned len = (unsigned)(*run_end - b);
  return (len == 64 ? ~0ull : (1ull << len) - 1) << (b & 63);
}

TG_EMU_UNCHECKED uint64_t* RaceChecker::written_page(uintptr_t page, bool make) const {
  uint64_t* bits = written_cache_.find(page);
  return bits ? bits : written_page_miss(page, make);
}

__attribute__((noinline)) uint64_t* RaceChecker::written_page_miss(uintptr_t page, bool make) const {
  auto it = written_.find(page);
  if (it == written_.end()) {
    if (!make) return nullptr;
    it = written_.emplace(page, std::vector<uint64_t>(64, 0)).first;
  }
  written_cache_.put(page, it->second.data());
  return it->second.data();
}

TG_EMU_UNCHECKED void RaceChecker::mark_written(uintptr_t a, size_t n, bool on) {
  for (uintptr_t b = a; b < a + n;) {
    uint64_t* page = written_page(b >> 12, true);
    const uintptr_t page_end = ((b >> 12) + 1) << 12, end = a + n < page_end ? a + n : page_end;
    while (b < end) {
      uintptr_t next;
      const uint64_t bits = word_mask(b, end, &next);
      uint64_t& w = page[(b >> 6) & 63];
      w = on ? (w | bits) : (w & ~bits);
      b = next;
    }
  }
}

TG_EMU_UNCHECKED bool RaceChecker::all_written(uintptr_t a, uint32_t n) const {
  for (uintptr_t b = a; b < a + n;) {
    const uint64_t* page = written_page(b >> 12, false);
    if (!page) return false;
    const uintptr_t page_end = ((b >> 12) + 1) << 12, end = a + n < page_end ? a + n : page_end;
    while (b < end) {
      uintptr_t next;
      const uint64_t bits = word_mask(b, end, &next);
      if ((page[(b >> 6) & 63] & bits) != bits) return false;
      b = next;
    }
  }
  return true;
}

void RaceChecker::device_written(const void* p, size_t n) { mark_written(reinterpret_cast<uintptr_t>(p), n, true); }
void RaceChecker::device_freed(const void* p, size_t n) { mark_written(reinterpret_cast<uintptr_t>(p), n, false); }

void RaceChecker::global_hazard(const char* what, uintptr_t a, uint32_t other, const Access& now) {
  auto block = [](uint3 b) {
    return "(" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) + ")";
  };
  const int t = now.thread->linear;
  const std::string msg = std::string("racecheck: ") + what + " in global memory (" +
                          describe_device_address(reinterpret_cast<const void*>(a)) + "): block " + block(g_block_idx) +
                          " thread (" + std::to_string(t % bx_) + "," + std::to_string(t / bx_ % by_) + "," +
                          std::to_string(t / (bx_ * by_)) + ") at " + source_line(now.pc) + ", after " +
                          (other ? "block " + block(ctas_[other - 1]) : std::string("other blocks")) +
                          " of the same launch (no flag orders the two blocks' accesses)";
  std::fprintf(stderr, "SIMT emulator: %s\n", msg.c_str());
  device_fault(cudaErrorLaunchFailure, msg);
}

void RaceChecker::learn(Known& into, const Known& from) {
  for (const auto& [cta, barriers] : from) {
    uint32_t& known = into[cta];
    known = std::max(known, barriers);
  }
}

TG_EMU_UNCHECKED bool RaceChecker::global_ordered(uint32_t epoch, int thread) const {
  const Epoch& e = epochs_at_[epoch];
  return e.cta == nctas_ || global_ordered(e.cta, e.barriers, thread);
}

__attribute__((noinline)) bool RaceChecker::global_ordered(uint32_t cta, uint32_t barriers, int thread) const {
  if (cta == nctas_) return true;
  const auto it = after_.find(cta);
  if (it != after_.end() && it->second > barriers) return true;
  const auto mine = acquired_.find(thread);
  if (mine == acquired_.end()) return false;
  const auto jt = mine->second.find(cta);
  return jt != mine->second.end() && jt->second > barriers;
}

TG_EMU_UNCHECKED RaceChecker::GlobalCell* RaceChecker::global_page(uintptr_t page) {
  GlobalCell* cells = page_cache_.find(page);
  return cells ? cells : global_page_miss(page);
}

__attribute__((noinline)) RaceChecker::GlobalCell* RaceChecker::global_page_miss(uintptr_t page) {
  GlobalCell*& cells = global_[page];
  if (!cells) {
    if (pages_used_ == pages_.size()) pages_.emplace_back(kPageCells);
    std::vector<GlobalCell>& v = pages_[pages_used_++];
    std::fill(v.begin(), v.end(), GlobalCell{});
    cells = v.data();
  }
  page_cache_.put(page, cells);
  return cells;
}

TG_EMU_UNCHECKED void RaceChecker::global_access(const Access& a) {
  const uint32_t me = nctas_, now = nepochs_ - 1;
  const int t = a.thread->linear;
  GlobalCell* cells = global_page(a.addr >> 12);
  for (uintptr_t b = a.addr; b < a.addr + a.size; ++b) {
    if (b % kPageCells == 0 && b != a.addr) cells = global_page(b >> 12);
    GlobalCell& c = cells[b % kPageCells];
    if (c.writer && !global_ordered(c.writer, t))
      global_hazard(a.write ? "write-after-write hazard" : "read-after-write hazard", b, epochs_at_[c.writer].cta, a);
    const uint32_t first_reader = c.reader & ~kSeveral;
    if (a.write) {
      if (first_reader && !global_ordered(first_reader, t))
        global_hazard("write-after-read hazard", b, epochs_at_[first_reader].cta, a);
      if (c.reader & kSeveral) global_hazard("write-after-read hazard", b, 0, a);
      // the earlier accesses are ordered before this write, so after it only it matters
      c = GlobalCell{now, 0};
    } else if (!first_reader || (!(c.reader & kSeveral) && global_ordered(first_reader, t))) {
      c.reader = now;  // the first read, or one after every earlier read (its latest, if its CTA's)
    } else if (epochs_at_[first_reader].cta != me) {
      c.reader |= kSeveral;
    }
  }
}

void RaceChecker::flag(const void* flag, bool release) {
  if (!g_thread) return;
  const uintptr_t f = reinterpret_cast<uintptr_t>(flag);
  const int t = g_thread->linear;
  if (release) {
    Known carried = after_;
    if (const auto mine = acquired_.find(t); mine != acquired_.end()) learn(carried, mine->second);
    carried[(uint32_t)ctas_.size()] = barrier_;  // the accesses before the last __syncthreads
    flag_released_[f] = std::move(carried);
    return;
  }
  const auto it = flag_released_.find(f);
  if (it != flag_released_.end()) learn(acquired_[t], it->second);
}

void RaceChecker::global_uninitialised(const Access& a) {
  uintptr_t b = a.addr;
  while (all_written(b, 1)) ++b;
  const int t = a.thread->linear;
  const std::string msg = "initcheck: read of device memory nothing wrote (" +
                          describe_device_address(reinterpret_cast<const void*>(b)) + "): thread (" +
                          std::to_string(t % bx_) + "," + std::to_string(t / bx_ % by_) + "," +
                          std::to_string(t / (bx_ * by_)) + ") at " + source_line(a.pc);
  std::fprintf(stderr, "SIMT emulator: %s\n", msg.c_str());
  device_fault(cudaErrorLaunchFailure, msg);
}

namespace {
// A read of a byte in its cell: the first slot if free or the same thread's, else the second;
// retired: a wgmma's retirement (a read of its warpgroup's first thread at its wait_group)
TG_EMU_UNCHECKED inline __attribute__((always_inline)) void note_read(RaceChecker::Cell& c, const RaceChecker::Stamp& s,
                                                                      bool retired) {
  if (c.read1.thread < 0 || c.read1.thread == s.thread) {
    c.read1 = s;
    c.retired1 = retired;
  } else {
    c.read2 = s;
    c.retired2 = retired;
  }
}
}  // namespace

TG_EMU_UNCHECKED void RaceChecker::access(const Access& a) {
  if (!a.thread) return;
  if (a.space == Space::Global) {
    global_access(a);
    if (a.write) mark_written(a.addr, a.size, true);
    else if (!all_written(a.addr, a.size)) global_uninitialised(a);
    return;
  }
  const int t = a.thread->linear;
  const Stamp now{t, barrier_, collective_at_[t / 32], pc_code(a.pc), clocked_ ? clock_arrivals(t) : 0, fences_at_[t]};
  if (a.kind == AccessKind::AsyncReadDone) {  // a wgmma retired: it reads these chunks no more
    for (uintptr_t k = a.addr / 16; k <= (a.addr + a.size - 1) / 16; ++k)
      if (AsyncChunk* ck = async_chunk(16 * k); ck && ck->reads) --ck->reads;
    // its reads last until now: a read of the warpgroup's first thread at its wait_group
    for (uint32_t i = 0; i < a.size; ++i) note_read(cell(a.addr + i), now, true);
    return;
  }
  const AsyncChunk* ck = nullptr;  // the byte's chunk, looked up for a write as each chunk starts
  for (uint32_t i = 0; i < a.size; ++i) {
    const uintptr_t b = a.addr + i;
    Cell& c = cell(b);
    if (a.write && (i == 0 || b % 16 == 0)) ck = async_chunk(b);
    if (ck && ck->reads)
      hazard("write to a wgmma operand before the wgmma.wait_group that retires it", b, ck->reader, a, false);
    if (a.kind == AccessKind::BulkCopyLand) {  // a TMA box lands: written, for whoever sees its phase
      c.in_flight = Stamp{};
      c.in_flight_bulk = false;
      c.write = Stamp{kLanded, barrier_, nlandings_ - 1, now.pc};
      c.read1 = c.read2 = Stamp{};
      c.retired1 = c.retired2 = false;
      c.written = true;
      continue;
    }
    if (a.kind == AccessKind::CpAsyncLand) {  // the copy's bytes arrive: a write now, by the issuer
      c.in_flight = Stamp{};
      c.write = now;
      c.read1 = c.read2 = Stamp{};
      c.retired1 = c.retired2 = false;
      c.written = true;
      continue;
    }
    if (c.in_flight.thread >= 0) {
      if (c.in_flight_bulk)
        hazard("access to a TMA destination before its box landed (no wait on its mbarrier's phase yet)", b, c.in_flight,
               a, false);
      hazard("access to a cp.async destination before its wait_group", b, c.in_flight, a);
    }
    if (c.write.thread == kLanded && !ordered(c.write, t))
      hazard("access to a TMA destination by a thread that has not seen its mbarrier phase complete", b,
             c.write, a, false);
    if (a.write) {
      if (!ordered(c.write, t)) hazard("write-after-write hazard", b, c.write, a);
      // (a wgmma's retirement: its warpgroup's threads are each past their wait_group)
      const Stamp* reads[2] = {&c.read1, &c.read2};
      const bool retired[2] = {c.retired1, c.retired2};
      for (int r = 0; r < 2; ++r)
        if (!ordered(*reads[r], t) && !(retired[r] && reads[r]->thread / 128 == t / 128))
          hazard(retired[r] ? "write to a wgmma operand not ordered after the wgmma.wait_group that retired it"
                            : "write-after-read hazard",
                 b, *reads[r], a);
      if (a.kind == AccessKind::CpAsync || a.kind == AccessKind::BulkCopy) {
        c.in_flight = now;
        c.in_flight_bulk = a.kind == AccessKind::BulkCopy;
      } else {
        c.write = now;
        c.written = true;
      }
      c.read1 = c.read2 = Stamp{};
      c.retired1 = c.retired2 = false;
    } else {
      if (!c.written) hazard("initcheck: read of shared memory nothing wrote since the block began", b, Stamp{}, a);
      if (!ordered(c.write, t)) hazard("read-after-write hazard", b, c.write, a);
      if (a.kind == AccessKind::AsyncRead) {  // in flight until its retire; not a thread's read
        if (c.write.thread >= 0 && fences_at_[c.write.thread] <= c.write.fences)
          hazard("wgmma read of an operand its writer stored through the generic proxy and did not follow with "
                 "fence.proxy.async",
                 b, c.write, a, false);
        continue;  // (counted a chunk at a time, below)
      }
      note_read(c, now, false);
    }
  }
  if (a.kind == AccessKind::AsyncRead)  // in flight until its retire
    for (uintptr_t k = a.addr / 16; k <= (a.addr + a.size - 1) / 16; ++k)
      if (AsyncChunk* ck = async_chunk(16 * k)) {
        ++ck->reads;
        ck->reader = now;
      }
}

namespace {
// never destroyed: observers may still be called while static objects are torn down
RaceChecker* g_env_checker = nullptr;

// at exit: the names of the kernels the process's checker saw, appended to
// $TG_EMU_RACECHECK_KERNELS (a process that a hazard ended never gets here)
void write_checked_kernels() {
  const char* path = std::getenv("TG_EMU_RACECHECK_KERNELS");
  if (!g_env_checker || !path || !*path) return;
  std::FILE* f = std::fopen(path, "a");
  if (!f) {
    std::fprintf(stderr, "racecheck: cannot append to %s (TG_EMU_RACECHECK_KERNELS)\n", path);
    return;
  }
  for (const std::string& k : g_env_checker->kernel_names()) std::fprintf(f, "%s\n", k.c_str());
  std::fclose(f);
}
}  // namespace

void racecheck_from_env() {
  const char* v = std::getenv("TG_EMU_RACECHECK");
  if (!g_env_checker && v && *v && std::strcmp(v, "0") != 0) {
    g_env_checker = new RaceChecker();
    std::atexit(write_checked_kernels);
  }
}

}  // namespace emu
