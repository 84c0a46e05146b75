// data/tokens.cpp: token data (llm.c shards, nanoGPT .bin), memory-mapped, its batches, and
// llm.c's GPT-2 tokenizer file (formats and rules in data/tokens.h).
#include "data/tokens.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/sha256.h"
#include "kernels/philox.h"
#include "data/errors.h"

namespace data {

namespace fs = std::filesystem;

namespace {

using tg::bad_input;

int32_t le32(const unsigned char* p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

// Maps path read-only; the tokens start at byte offset `header`.
std::unique_ptr<TokenFile> map_file(const std::string& path, size_t header, size_t count) {
  auto f = std::make_unique<TokenFile>();
  f->path = path;
  f->count = count;
  const size_t bytes = header + 2 * count;
  if (bytes == 0) return f;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) bad_input("cannot open token file " + path + ": " + std::strerror(errno) + "; expected a readable file; check its permissions");
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED)
    bad_input("cannot map token file " + path + ": " + std::strerror(errno) + "; expected a regular file; check the path");
  f->map = m;
  f->map_bytes = bytes;
  f->tokens = reinterpret_cast<const uint16_t*>(static_cast<const char*>(m) + header);
  return f;
}

uint64_t file_size(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    bad_input("cannot read token file " + path + ": " + std::strerror(errno) + "; expected an existing file; check --data");
  if (!S_ISREG(st.st_mode)) bad_input("token file " + path + " is not a regular file; expected a .bin file; check --data");
  return (uint64_t)st.st_size;
}

// The first n bytes of path (fewer when it is shorter).
std::string read_prefix(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad_input("cannot open token file " + path + "; expected a readable file; check its permissions");
  std::string s(n, '\0');
  in.read(&s[0], (std::streamsize)n);
  s.resize((size_t)in.gcount());
  return s;
}

// An llm.c shard: header checked against the file size, then mapped.
std::unique_ptr<TokenFile> open_shard(const std::string& path) {
  const uint64_t size = file_size(path);
  const std::string h = read_prefix(path, 1024);
  const std::string fix = "; regenerate it with llm.c's dev/data scripts (or re-download it)";
  if (h.size() < 1024)
    bad_input("llm.c shard " + path + " is " + std::to_string(size) + " bytes, shorter than its 1024-byte header; expected a header of 256 int32 then uint16 tokens" + fix);
  const unsigned char* p = reinterpret_cast<const unsigned char*>(h.data());
  const int32_t magic = le32(p), version = le32(p + 4), n = le32(p + 8);
  if (magic != kShardMagic)
    bad_input("llm.c shard " + path + " has magic " + std::to_string(magic) + "; expected " + std::to_string(kShardMagic) +
        " (the file is not an llm.c token shard)" + fix);
  if (version != 1)
    bad_input("llm.c shard " + path + " has version " + std::to_string(version) +
        "; expected 1 (GPT-2 uint16 tokens; version 2 is llm.c's LLaMA-3 format, not supported)" + fix);
  if (n < 0) bad_input("llm.c shard " + path + " declares " + std::to_string(n) + " tokens; expected a count >= 0" + fix);
  const uint64_t want = 1024 + 2 * (uint64_t)n;
  if (size != want)
    bad_input("llm.c shard " + path + " is " + std::to_string(size) + " bytes but its header declares " + std::to_string(n) +
        " tokens (" + std::to_string(want) + " bytes): it is " + (size < want ? "truncated" : "longer than declared") + fix);
  return map_file(path, 1024, (size_t)n);
}

// A nanoGPT .bin: raw uint16 tokens.
std::unique_ptr<TokenFile> open_raw(const std::string& path) {
  const uint64_t size = file_size(path);
  if (size % 2 != 0)
    bad_input("nanoGPT token file " + path + " is " + std::to_string(size) +
        " bytes, an odd number; expected raw uint16 tokens (2 bytes each); it is truncated: regenerate it with nanoGPT's prepare.py");
  return map_file(path, 0, (size_t)(size / 2));
}

bool is_val_name(const std::string& path) { return fs::path(path).filename().string().find("val") != std::string::npos; }

bool has_shard_magic(const std::string& path) {
  const std::string h = read_prefix(path, 4);
  return h.size() == 4 && le32(reinterpret_cast<const unsigned char*>(h.data())) == kShardMagic;
}

std::string file_fingerprint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const uint64_t size = file_size(path);
  const uint64_t mib = 1 << 20;
  std::string bytes;
  auto take = [&](uint64_t at, uint64_t n) {
    std::string s(n, '\0');
    in.seekg((std::streamoff)at);
    in.read(&s[0], (std::streamsize)n);
    if ((uint64_t)in.gcount() != n) bad_input("cannot read token file " + path + "; expected " + std::to_string(n) + " bytes at " + std::to_string(at) + "; check the disk");
    bytes += s;
  };
  if (size < 2 * mib) take(0, size);
  else { take(0, mib); take(size - mib, mib); }
  return sha256_hex(bytes.data(), bytes.size());
}

void check_split(const TokenSplit& s, const std::string& name, const std::string& spec, int block_size,
                 const std::string& what) {
  if (!what.empty() && s.size() < (size_t)block_size + 1)
    bad_input(what + " is too short: its " + name + " split has " + std::to_string(s.size()) + " tokens; expected at least " +
        std::to_string(block_size + 1) + " (block_size + 1); pass a longer text with --data PATH or a smaller --block-size");
  if (s.files().empty())
    bad_input("--data " + spec + " has no " + name + " shard; expected llm.c shards with \"val\" in the validation files' names (fineweb_val_000000.bin) and training files without it; add the missing split");
  if (s.size() < (size_t)block_size + 1)
    bad_input("the " + name + " split of --data " + spec + " has " + std::to_string(s.size()) +
        " tokens, too few for one window of block_size + 1 = " + std::to_string(block_size + 1) +
        "; expected at least that many; use more data or a smaller --block-size");
}

void fill(const TokenSplit& s, uint64_t seed, uint32_t stream, uint32_t c1, uint32_t c2, int B, int T, int32_t* x,
          int32_t* y, uint32_t row0) {
  const size_t n = s.size();
  if (B < 0 || T < 1 || n < (size_t)T + 1)
    bad_input("a token split of " + std::to_string(n) + " tokens is too short for windows of T+1 = " + std::to_string(T + 1) +
        " tokens; expected at least that many; use more data or a smaller --block-size");
  const uint64_t range = (uint64_t)(n - (size_t)T);
  std::vector<int32_t> w((size_t)T + 1);
  for (int b = 0; b < B; ++b) {
    const philox::U32x4 r = philox::stream_words(seed, stream, row0 + (uint32_t)b, c1, c2);
    // as the text sampler for splits below 2^32 windows; 64-bit multiply-shift above
    uint64_t start;
    if (range <= 0xffffffffull) start = philox::uniform_below(r.v[0], (uint32_t)range);
    else start = (uint64_t)(((unsigned __int128)((uint64_t)r.v[1] << 32 | r.v[0]) * range) >> 64);
    s.read(start, (size_t)T + 1, w.data());
    std::copy(w.begin(), w.begin() + T, x + (size_t)b * T);
    std::copy(w.begin() + 1, w.end(), y + (size_t)b * T);
  }
}

}  // namespace

TokenFile::~TokenFile() {
  if (map) ::munmap(map, map_bytes);
}

void TokenSplit::add(std::unique_ptr<TokenFile> f) {
  starts_.push_back(total_);
  total_ += f->count;
  files_.push_back(std::move(f));
}

void TokenSplit::read(size_t start, size_t n, int32_t* out) const {
  // the file holding start: the last one starting at or before it
  size_t fi = (size_t)(std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin()) - 1;
  size_t i = start - starts_[fi];
  for (size_t k = 0; k < n; ++k) {
    while (i >= files_[fi]->count) {
      ++fi;
      i = 0;
    }
    const uint16_t t = files_[fi]->tokens[i];
    if (t >= vocab) bad_id(*files_[fi], i);
    out[k] = t;
    ++i;
  }
}

void TokenSplit::bad_id(const TokenFile& f, size_t i) const {
  const bool shard = f.map_bytes != 2 * f.count;
  bad_input("token file " + f.path + " holds token id " + std::to_string(f.tokens[i]) + " at token " + std::to_string(i) +
      " (byte offset " + std::to_string((shard ? 1024 : 0) + 2 * i) + "); expected ids below the vocabulary size " +
      std::to_string(vocab) + (vocab == kGpt2Vocab ? " (GPT-2)" : " (the tokenizer's)") +
      "; the file is damaged or not tokens of this tokenizer: regenerate it, or pass the tokenizer it was made with");
}

void TokenSplit::check_ends() const {
  const size_t k = 1 << 19;  // tokens: 1 MiB
  for (const auto& f : files_)
    for (size_t i = 0; i < f->count; i = (i + 1 == k && f->count > 2 * k) ? f->count - k : i + 1)
      if (f->tokens[i] >= vocab) bad_id(*f, i);
}

bool is_token_data(const std::string& spec) {
  if (spec.find_first_of("*?[") != std::string::npos) return true;
  std::error_code ec;
  if (fs::is_directory(spec, ec)) return true;
  return spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".bin") == 0;
}

std::shared_ptr<TokenData> load_token_data(const std::string& spec, int block_size, int vocab, const std::string& what,
                                           bool ends) {
  auto d = std::make_shared<TokenData>();
  d->train.vocab = d->val.vocab = vocab;
  std::vector<std::string> paths;
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    const fs::path dir(spec);
    if (fs::is_regular_file(dir / "train.bin", ec) && fs::is_regular_file(dir / "val.bin", ec) &&
        !has_shard_magic((dir / "train.bin").string())) {
      d->format = "nanoGPT";
      d->train.add(open_raw((dir / "train.bin").string()));
      d->val.add(open_raw((dir / "val.bin").string()));
    } else {
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".bin") paths.push_back(e.path().string());
      if (paths.empty())
        bad_input("--data " + spec + " is a directory with no .bin files; expected llm.c shards (*_train_*.bin, *_val_*.bin) or nanoGPT's train.bin and val.bin; point --data at the data directory");
    }
  } else if (spec.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    if (::glob(spec.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) paths.push_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (paths.empty()) bad_input("--data " + spec + " matches no file; expected llm.c shards; check the pattern (quote it so the shell leaves it to train_gpt)");
  } else {
    file_size(spec);  // exists, a regular file
    if (!has_shard_magic(spec))
      bad_input("--data " + spec + " is a .bin file without llm.c's shard magic " + std::to_string(kShardMagic) +
          "; expected an llm.c shard, a directory of them, or nanoGPT's directory with train.bin and val.bin; for a nanoGPT .bin pass its directory");
    // one shard: both of its kind (train and val) must be found next to it
    const fs::path p(spec);
    std::string name = p.filename().string();
    const bool val = is_val_name(name);
    const size_t at = name.find(val ? "val" : "train");
    paths.push_back(spec);
    if (at != std::string::npos) {
      std::string other = name;
      other.replace(at, val ? 3 : 5, val ? "train" : "val");
      if (fs::exists(p.parent_path() / other, ec)) paths.push_back((p.parent_path() / other).string());
    }
  }
  if (d->format.empty()) {
    d->format = "llm.c shards";
    std::sort(paths.begin(), paths.end());
    for (const std::string& p : paths) (is_val_name(p) ? d->val : d->train).add(open_shard(p));
  }
  check_split(d->train, "training", spec, block_size, what);
  check_split(d->val, "validation", spec, block_size, what);
  if (!what.empty()) d->format = "its BPE tokens, cached";
  if (ends) {  // a tokenizer's data: ids made with another one are refused now, before a run begins
    d->train.check_ends();
    d->val.check_ends();
  }
  std::string fp;
  for (const TokenSplit* s : {&d->train, &d->val})
    for (const auto& f : s->files())
      fp += std::string(s == &d->train ? "train " : "val ") + fs::path(f->path).filename().string() + " " +
            std::to_string(file_size(f->path)) + " " + file_fingerprint(f->path) + "\n";
  d->fingerprint = sha256_hex(fp.data(), fp.size());
  return d;
}

void token_train_batch(const TokenSplit& s, uint64_t seed, uint32_t step, int B, int T, int32_t* x, int32_t* y,
                       uint32_t row0) {
  fill(s, seed, philox::kStreamBatch, step, 0u, B, T, x, y, row0);
}

void token_eval_batch(const TokenSplit& s, uint64_t seed, uint32_t split, uint32_t k, int B, int T, int32_t* x,
                      int32_t* y) {
  fill(s, seed, philox::kStreamEval, k, split, B, T, x, y, 0);
}

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad_input("cannot open --tokenizer " + path + "; expected llm.c's gpt2_tokenizer.bin; check the path");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse(bytes, path);
}

Gpt2Tokenizer Gpt2Tokenizer::parse(const std::string& bytes, const std::string& path) {
  const std::string fix = "; pass llm.c's gpt2_tokenizer.bin (written by its train_gpt2.py)";
  if (bytes.size() < 1024)
    bad_input("--tokenizer " + path + " is " + std::to_string(bytes.size()) + " bytes, shorter than its 1024-byte header; expected a header of 256 uint32 then the token table" + fix);
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const uint32_t magic = (uint32_t)le32(p), version = (uint32_t)le32(p + 4), n = (uint32_t)le32(p + 8);
  if (magic != (uint32_t)kTokenizerMagic)
    bad_input("--tokenizer " + path + " has magic " + std::to_string(magic) + "; expected " + std::to_string(kTokenizerMagic) + fix);
  if (version != 1 && version != 2)
    bad_input("--tokenizer " + path + " has version " + std::to_string(version) + "; expected 1 or 2" + fix);
  if (n == 0 || n > (1u << 20))
    bad_input("--tokenizer " + path + " declares " + std::to_string(n) + " tokens; expected 1 to 1048576" + fix);
  Gpt2Tokenizer t;
  if (version == 2) t.eot = (int)(uint32_t)le32(p + 12);
  size_t at = 1024;
  t.tokens.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (at >= bytes.size())
      bad_input("--tokenizer " + path + " ends after " + std::to_string(i) + " of its " + std::to_string(n) + " tokens; expected the whole table (it is truncated)" + fix);
    const size_t len = p[at++];
    if (len == 0)
      bad_input("--tokenizer " + path + " has a token of length 0 (id " + std::to_string(i) + ", byte offset " + std::to_string(at - 1) + "); expected lengths of 1 to 255" + fix);
    if (at + len > bytes.size())
      bad_input("--tokenizer " + path + " ends inside token " + std::to_string(i) + "; expected " + std::to_string(len) + " more bytes (it is truncated)" + fix);
    t.tokens.emplace_back(bytes, at, len);
    at += len;
  }
  if (at != bytes.size())
    bad_input("--tokenizer " + path + " has " + std::to_string(bytes.size() - at) + " bytes after its " + std::to_string(n) + " tokens; expected none" + fix);
  if (version == 2 && (t.eot < 0 || t.eot >= (int)n))
    bad_input("--tokenizer " + path + " has end-of-text id " + std::to_string(t.eot) + "; expected an id below " + std::to_string(n) + fix);
  return t;
}

std::string Gpt2Tokenizer::decode(const int32_t* ids, size_t n) const {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || (size_t)ids[i] >= tokens.size())
      bad_input("token id " + std::to_string(ids[i]) + " is outside the tokenizer's " + std::to_string(tokens.size()) +
          " tokens; expected the tokenizer the model was trained with; pass the matching --tokenizer");
    s += tokens[(size_t)ids[i]];
  }
  return s;
}

}  // namespace data
