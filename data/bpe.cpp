// data/bpe.cpp: GPT-2's byte-level BPE: the character classes, the pre-tokenizer, the merges,
// encoding on one core or all, decoding (definitions in data/bpe.h; the file readers are in
// data/bpe_files.cpp).
#include "data/bpe.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <queue>
#include <string_view>

#include "data/dataset.h"
#include "data/errors.h"
#include "data/sha256.h"

namespace data {

namespace {

struct CodeRange {
  char32_t first, last;
};
#include "data/unicode_classes.inc"

template <size_t N>
bool in_ranges(const CodeRange (&r)[N], char32_t c) {
  const CodeRange* it = std::upper_bound(r, r + N, c, [](char32_t x, const CodeRange& g) { return x < g.first; });
  return it != r && c <= (it - 1)->last;
}

CharClass class_by_search(char32_t c) {
  if (in_ranges(kLetterRanges, c)) return CharClass::Letter;
  if (in_ranges(kNumberRanges, c)) return CharClass::Number;
  if (in_ranges(kSpaceRanges, c)) return CharClass::Space;
  return CharClass::Other;
}

// The classes of the Basic Multilingual Plane, one byte each (64 KiB), built once.
const std::array<uint8_t, 0x10000>& bmp_classes() {
  static const std::array<uint8_t, 0x10000> t = [] {
    std::array<uint8_t, 0x10000> a{};
    for (char32_t c = 0; c < 0x10000; ++c) a[c] = (uint8_t)class_by_search(c);
    return a;
  }();
  return t;
}

[[noreturn]] void bad_utf8(const unsigned char* p, size_t at, size_t base, const std::string& what) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", (unsigned)p[at]);
  size_t line = 1;
  for (size_t k = 0; k < at; ++k) line += p[k] == '\n';
  throw tg::InputError(what + " is not valid UTF-8: byte " + hex + " at byte offset " + std::to_string(base + at) +
                       (base == 0 ? " (line " + std::to_string(line) + ")" : std::string()) +
                       "; expected UTF-8 text (GPT-2's tokenizer reads code points); convert it to UTF-8 "
                       "(e.g. iconv -f LATIN1 -t UTF-8)");
}

// The pre-tokenizer's cursor over [p, p + n): the class and length of the character at a byte.
struct Cursor {
  const unsigned char* p;
  size_t n, base;
  const std::string& what;
  const std::array<uint8_t, 0x10000>& bmp = bmp_classes();

  // the class of the character at i (i < n), its length in len
  CharClass at(size_t i, int& len) const {
    const unsigned c = p[i];
    if (c < 0x80) {
      len = 1;
      return (CharClass)bmp[c];
    }
    char32_t cp;
    len = utf8_char(p, n, i, cp);
    if (len <= 0) bad_utf8(p, i, base, what);
    return cp < 0x10000 ? (CharClass)bmp[cp] : class_by_search(cp);
  }
  // the end of the run of characters of class k starting at i
  size_t run(size_t i, CharClass k) const {
    int len;
    while (i < n && at(i, len) == k) i += (size_t)len;
    return i;
  }
  // The end of the piece starting at i (< n): the pattern's alternatives in order.
  size_t piece(size_t i) const {
    if (p[i] == '\'' && i + 1 < n) {  // 's 't 're 've 'm 'll 'd
      const unsigned char a = p[i + 1], b = i + 2 < n ? p[i + 2] : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    int len;
    const CharClass k = at(i, len);
    if (p[i] == ' ' && i + 1 < n) {  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+' after a space
      int len1;
      const CharClass k1 = at(i + 1, len1);
      if (k1 != CharClass::Space) return run(i + 1, k1);
    }
    if (k != CharClass::Space) return run(i, k);
    // \s+(?!\S) | \s+: the run of spaces, less its last character when a non-space follows
    // (unless that leaves nothing)
    size_t j = i + (size_t)len, last = i;
    while (j < n) {
      int l;
      if (at(j, l) != CharClass::Space) break;
      last = j;
      j += (size_t)l;
    }
    if (j == n || last == i) return j;
    return last;
  }
};

}  // namespace

CharClass char_class(char32_t c) {
  if (c < 0x10000) return (CharClass)bmp_classes()[c];
  return c < 0x110000 ? class_by_search(c) : CharClass::Other;
}

void check_utf8(const char* p, size_t n, const std::string& what) {
  const unsigned char* u = reinterpret_cast<const unsigned char*>(p);
  char32_t cp;
  for (size_t i = 0; i < n;) {
    if (u[i] < 0x80) {
      ++i;
      continue;
    }
    const int len = utf8_char(u, n, i, cp);
    if (len <= 0) bad_utf8(u, i, 0, what);
    i += (size_t)len;
  }
}

std::vector<size_t> pretokenize(const char* p, size_t n, const std::string& what, size_t base) {
  const Cursor cur{reinterpret_cast<const unsigned char*>(p), n, base, what};
  std::vector<size_t> ends;
  for (size_t i = 0; i < n;) {
    i = cur.piece(i);
    ends.push_back(i);
  }
  return ends;
}

// One thread's state: the ids of pieces seen before, and the merge scratch.
struct BpeTokenizer::Encoder {
  // the cache: an open-addressing table of pieces (up to kMaxCachedPiece bytes) -> their ids,
  // keys and ids kept in two arenas; emptied when the ids pass kMaxCachedIds
  struct Slot {
    uint64_t hash = 0;
    uint32_t key = 0, ids = 0;  // offsets into keys, ids
    uint16_t key_len = 0, n_ids = 0;  // key_len 0: an empty slot
  };
  std::vector<Slot> slots = std::vector<Slot>(1 << 12);
  size_t used = 0;
  std::string keys;
  std::vector<int32_t> ids;
  struct Part {
    int32_t id;
    uint32_t len;       // bytes (0: merged away)
    int32_t prev, next;  // parts (-1: none)
  };
  std::vector<Part> parts;
  static constexpr size_t kMaxCachedPiece = 64;
  static constexpr size_t kMaxCachedIds = 1 << 22;

  static uint64_t hash_of(const unsigned char* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 0xFF51AFD7ED558CCDull;
      h ^= h >> 32;
    }
    uint64_t w = 0;
    for (size_t k = 0; i < n; ++i, ++k) w |= (uint64_t)p[i] << (8 * k);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 29);
  }
  // the slot of the piece, or of where it would go
  Slot& find(const unsigned char* p, size_t n, uint64_t h) {
    const size_t mask = slots.size() - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
      Slot& s = slots[i];
      if (s.key_len == 0) return s;
      if (s.hash == h && s.key_len == n && std::memcmp(keys.data() + s.key, p, n) == 0) return s;
    }
  }
  void insert(const unsigned char* p, size_t n, uint64_t h, const int32_t* v, size_t k) {
    if (ids.size() + k > kMaxCachedIds || k > 0xffff) {
      if (k > 0xffff) return;
      std::fill(slots.begin(), slots.end(), Slot{});
      used = 0;
      keys.clear();
      ids.clear();
    }
    if (2 * (used + 1) > slots.size()) {  // grow: load at most one half
      std::vector<Slot> old(slots.size() * 2);
      old.swap(slots);
      for (const Slot& s : old)
        if (s.key_len) find(reinterpret_cast<const unsigned char*>(keys.data()) + s.key, s.key_len, s.hash) = s;
    }
    Slot& s = find(p, n, h);
    s = Slot{h, (uint32_t)keys.size(), (uint32_t)ids.size(), (uint16_t)n, (uint16_t)k};
    keys.append(reinterpret_cast<const char*>(p), n);
    ids.insert(ids.end(), v, v + k);
    ++used;
  }
};

namespace {
constexpr size_t kSmallPiece = 24;  // bytes: below this a scan beats the heap
}  // namespace

void BpeTokenizer::encode_piece(const unsigned char* p, size_t n, std::vector<int32_t>& out, Encoder& e) const {
  if (n == 1) {
    out.push_back(byte_id_[p[0]]);
    return;
  }
  const bool cached = n <= Encoder::kMaxCachedPiece;
  const uint64_t h = cached ? Encoder::hash_of(p, n) : 0;
  if (cached) {
    const Encoder::Slot& s = e.find(p, n, h);
    if (s.key_len) {
      out.insert(out.end(), e.ids.begin() + s.ids, e.ids.begin() + s.ids + s.n_ids);
      return;
    }
  }
  const size_t out0 = out.size();
  auto found = ranks_ == Ranks::Tiktoken ? by_bytes_.find(std::string(reinterpret_cast<const char*>(p), n)) : by_bytes_.end();
  if (found != by_bytes_.end()) {
    out.push_back(found->second);
  } else if (n <= kSmallPiece) {
    // a short piece: the lowest-ranked pair (the leftmost of equal ranks) found by a scan and
    // merged, until none merges; the same merges as the heap below, in the same order
    int32_t id[kSmallPiece];
    uint32_t rank[kSmallPiece];  // of the pair (id[i], id[i + 1])
    size_t m = n;
    for (size_t i = 0; i < n; ++i) id[i] = byte_id_[p[i]];
    auto rank_at = [&](size_t i) {
      const PairRank* r = find_pair(id[i], id[i + 1]);
      return r ? r->rank : ~0u;
    };
    for (size_t i = 0; i + 1 < m; ++i) rank[i] = rank_at(i);
    while (m > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < m; ++i)
        if (rank[i] < rank[best]) best = i;
      if (rank[best] == ~0u) break;
      id[best] = find_pair(id[best], id[best + 1])->merged;
      for (size_t i = best + 1; i + 1 < m; ++i) id[i] = id[i + 1], rank[i] = rank[i + 1];
      --m;
      if (best + 1 < m) rank[best] = rank_at(best);
      if (best > 0) rank[best - 1] = rank_at(best - 1);
    }
    out.insert(out.end(), id, id + m);
  } else {
    // the parts: one per byte, in a linked list; the candidate merges in a heap, lowest rank
    // first, then leftmost (the part's first byte); a candidate is stale when its left part or
    // the part after it changed since it was pushed (their lengths say so: parts only grow)
    auto& parts = e.parts;
    parts.resize(n);
    for (size_t i = 0; i < n; ++i) parts[i] = {byte_id_[p[i]], 1, (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    struct Cand {
      uint32_t rank, pos, left_len, right_len;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::vector<Cand> heap;
    heap.reserve(n);
    auto push = [&](int32_t a) {
      if (a < 0) return;
      const int32_t b = parts[(size_t)a].next;
      if (b < 0) return;
      const PairRank* r = find_pair(parts[(size_t)a].id, parts[(size_t)b].id);
      if (!r) return;
      heap.push_back({r->rank, (uint32_t)a, parts[(size_t)a].len, parts[(size_t)b].len});
      std::push_heap(heap.begin(), heap.end(), std::greater<Cand>());
    };
    for (size_t i = 0; i + 1 < n; ++i) push((int32_t)i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>());
      const Cand c = heap.back();
      heap.pop_back();
      Encoder::Part& a = parts[c.pos];
      if (a.len != c.left_len || a.next < 0) continue;
      Encoder::Part& b = parts[(size_t)a.next];
      if (b.len != c.right_len) continue;
      a.id = find_pair(a.id, b.id)->merged;
      a.len += b.len;
      b.len = 0;
      a.next = b.next;
      if (a.next >= 0) parts[(size_t)a.next].prev = (int32_t)c.pos;
      push(a.prev);
      push((int32_t)c.pos);
    }
    for (int32_t i = 0; i >= 0; i = parts[(size_t)i].next) out.push_back(parts[(size_t)i].id);
  }
  if (cached) e.insert(p, n, h, out.data() + out0, out.size() - out0);
}

void BpeTokenizer::encode_range(const char* p, size_t n, size_t base, const std::string& what,
                                std::vector<int32_t>& out, Encoder& e) const {
  const Cursor cur{reinterpret_cast<const unsigned char*>(p), n, base, what};
  const unsigned char* u = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n;) {
    const size_t j = cur.piece(i);
    encode_piece(u + i, j - i, out, e);
    i = j;
  }
}

namespace {

[[noreturn]] void cannot_encode(const BpeTokenizer& t, const std::string& what) {
  throw tg::InputError(what + " cannot be encoded with " + t.origin() + ": llm.c's tokenizer file holds no merges, it "
                       "only decodes; expected a tokenizer that encodes; pass --tokenizer DIR of a Hugging Face GPT-2 "
                       "directory (vocab.json + merges.txt, or tokenizer.json) or tiktoken's gpt2.tiktoken");
}

}  // namespace

std::vector<int32_t> BpeTokenizer::encode(const std::string& text, const std::string& what) const {
  if (decode_only_) cannot_encode(*this, what);
  Encoder e;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  encode_range(text.data(), text.size(), 0, what, out, e);
  return out;
}

std::vector<int32_t> BpeTokenizer::encode_parallel(const char* p, size_t n, const std::string& what,
                                                   const std::function<void(size_t)>& progress) const {
  if (decode_only_) cannot_encode(*this, what);
  // parts of about 1 MiB, each ending at "X\nY", X and Y ASCII characters that are not spaces:
  // the whole text's pieces end there ("\n" is a space, and only ' ' joins a piece that
  // follows it), and a part ending in that lone "\n" cuts it as the whole text does (a longer
  // run of spaces at the end of a part would stay whole, where the text splits off its last
  // character before Y), so the parts' pieces are the whole text's
  constexpr size_t kPart = 1 << 20;
  std::vector<size_t> cuts = {0};
  const auto& bmp = bmp_classes();
  auto solid = [&](size_t i) {  // an ASCII character that is not a space
    return (unsigned char)p[i] < 0x80 && bmp[(unsigned char)p[i]] != (uint8_t)CharClass::Space;
  };
  for (size_t at = kPart; at < n;) {
    size_t k = at;
    while (k < n && !(p[k - 1] == '\n' && solid(k) && solid(k - 2))) ++k;
    if (k >= n) break;
    cuts.push_back(k);
    at = k + kPart;
  }
  cuts.push_back(n);
  const size_t parts = cuts.size() - 1;
  std::vector<std::vector<int32_t>> ids(parts);
  std::vector<std::exception_ptr> errors(parts);
  size_t done = 0;
#pragma omp parallel
  {
    Encoder e;
#pragma omp for schedule(dynamic, 1)
    for (size_t k = 0; k < parts; ++k) {
      try {
        // invalid UTF-8 is named by its offset in the whole text (base), its line only in the
        // first part
        encode_range(p + cuts[k], cuts[k + 1] - cuts[k], cuts[k], what, ids[k], e);
      } catch (...) {
        errors[k] = std::current_exception();
      }
      if (progress) {
#pragma omp critical(bpe_progress)
        {
          done += cuts[k + 1] - cuts[k];
          progress(done);
        }
      }
    }
  }
  for (const auto& err : errors)
    if (err) std::rethrow_exception(err);  // the first part's error: the first bad byte
  size_t total = 0;
  for (const auto& v : ids) total += v.size();
  std::vector<int32_t> out;
  out.reserve(total);
  for (auto& v : ids) {
    out.insert(out.end(), v.begin(), v.end());
    std::vector<int32_t>().swap(v);
  }
  return out;
}

std::string BpeTokenizer::sha256() const {
  std::string all;
  for (const auto& [name, bytes] : files_) all += name + "\n" + std::to_string(bytes.size()) + "\n" + bytes;
  return sha256_hex(all.data(), all.size());
}

std::string BpeTokenizer::decode(const int32_t* ids, size_t n) const {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size())
      throw tg::InputError("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                           " is outside the tokenizer's " + std::to_string(vocab_size()) +
                           " tokens; expected the tokenizer the model was trained with; pass the matching --tokenizer");
    s += tokens_[(size_t)ids[i]];
  }
  return s;
}

}  // namespace data
