// data/tokenize.cpp: a text in BPE tokens, split as prepare.py splits it, for the cache and for
// llm.c shards (see data/tokenize.h).
#include "data/tokenize.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/bpe.h"
#include "data/errors.h"
#include "data/sha256.h"
#include "data/tokens.h"

namespace data {

namespace fs = std::filesystem;

namespace {

std::string cache_root() {
  for (const char* v : {"TG_CACHE_DIR"})
    if (const char* e = std::getenv(v); e && *e) return e;
  if (const char* e = std::getenv("XDG_CACHE_HOME"); e && *e) return std::string(e) + "/train_gpt";
  if (const char* e = std::getenv("HOME"); e && *e) return std::string(e) + "/.cache/train_gpt";
  return (fs::temp_directory_path() / "train_gpt_cache").string();
}

// Writes bytes to path through path.tmp.<pid>, renamed; throws tg::RuntimeError on failure.
void write_atomic(const std::string& path, const std::string& head, const std::vector<int32_t>& ids) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw tg::RuntimeError("cannot create " + tmp + ": " + std::strerror(errno) + "; check the directory's permissions");
  auto put = [&](const char* p, size_t n) {
    for (size_t done = 0; done < n;) {
      const ssize_t w = ::write(fd, p + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int e = w < 0 ? errno : ENOSPC;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw tg::RuntimeError("cannot write " + tmp + ": " + std::strerror(e) + "; free some space");
      }
      done += (size_t)w;
    }
  };
  put(head.data(), head.size());
  std::string buf;  // the ids as uint16 little-endian, 1 MiB at a time
  for (size_t at = 0; at < ids.size(); at += buf.size() / 2) {
    const size_t k = std::min(ids.size() - at, (size_t)1 << 19);
    buf.resize(2 * k);
    for (size_t i = 0; i < k; ++i) {
      buf[2 * i] = (char)(ids[at + i] & 0xff);
      buf[2 * i + 1] = (char)((ids[at + i] >> 8) & 0xff);
    }
    put(buf.data(), buf.size());
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw tg::RuntimeError("cannot write " + path + ": " + std::strerror(errno) + "; check the disk");
  }
}

// A file mapped read-only, unmapped when it goes.
struct Mapped {
  const char* data = nullptr;
  size_t size = 0;
  explicit Mapped(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw tg::InputError("--tokenize " + path + " cannot be opened: " + std::strerror(errno) +
                                     "; expected a readable text file; check its permissions");
    struct stat st{};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      void* m = ::mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m != MAP_FAILED) data = static_cast<const char*>(m), size = (size_t)st.st_size;
    }
    ::close(fd);
    if (st.st_size > 0 && !data)
      throw tg::InputError("--tokenize " + path + " cannot be mapped; expected a regular text file; check the path");
  }
  ~Mapped() {
    if (data) ::munmap(const_cast<char*>(data), size);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
};

}  // namespace

size_t split_offset(std::string_view text) {
  size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  const size_t k = (size_t)((double)n * 0.9);  // Python's int(n * 0.9)
  size_t seen = 0;
  for (size_t i = 0; i < text.size(); ++i)
    if (((unsigned char)text[i] & 0xC0) != 0x80 && seen++ == k) return i;
  return text.size();
}

void check_uint16(const BpeTokenizer& tok) {
  if (tok.vocab_size() > 65536)
    throw tg::InputError("tokenizer " + tok.origin() + " has " + std::to_string(tok.vocab_size()) +
                         " tokens, too many for uint16 token files (at most 65536); expected a tokenizer of at most "
                         "65536 tokens (GPT-2's has 50257); use such a tokenizer");
}

SplitIds encode_split(std::string_view text, const BpeTokenizer& tok, const std::string& what,
                      const std::function<void(size_t)>& progress) {
  check_uint16(tok);
  if (!tok.can_encode()) tok.encode("", what);  // refuses, saying why
  // the whole text checked first: a bad byte is named by its offset in the file, not in a part
  check_utf8(text.data(), text.size(), what);
  const size_t cut = split_offset(text);
  SplitIds s;
  s.train = tok.encode_parallel(text.data(), cut, what, progress);
  s.val = tok.encode_parallel(text.data() + cut, text.size() - cut, what,
                              progress ? [&](size_t done) { progress(cut + done); } : std::function<void(size_t)>());
  return s;
}

void write_llmc_shard(const std::string& path, const std::vector<int32_t>& ids) {
  if (ids.size() > 0x7fffffffu)
    throw tg::InputError("a shard of " + std::to_string(ids.size()) + " tokens; expected at most 2^31 - 1 (llm.c's int32 count); "
                         "split the text into several files");
  std::string head(1024, '\0');
  const int32_t h[3] = {kShardMagic, 1, (int32_t)ids.size()};
  for (int k = 0; k < 3; ++k)
    for (int b = 0; b < 4; ++b) head[(size_t)(4 * k + b)] = (char)(((uint32_t)h[k] >> (8 * b)) & 0xff);
  write_atomic(path, head, ids);
}

std::string cached_tokens(const std::string& text, const std::string& text_sha256, const BpeTokenizer& tok,
                          const std::string& what, std::string& note) {
  check_uint16(tok);
  const std::string key_text = text_sha256 + " " + tok.sha256();
  const std::string key = sha256_hex(key_text.data(), key_text.size());
  const fs::path dir = fs::path(cache_root()) / "tokens" / key;
  std::error_code ec;
  if (fs::is_regular_file(dir / "train.bin", ec) && fs::is_regular_file(dir / "val.bin", ec)) {
    note = "reusing the tokens in " + dir.string();
    return dir.string();
  }
  const SplitIds s = encode_split(text, tok, what);
  fs::create_directories(dir, ec);
  if (ec)
    throw tg::RuntimeError("cannot create the token cache " + dir.string() + ": " + ec.message() +
                           "; expected a writable cache; set TG_CACHE_DIR to a writable directory");
  write_atomic((dir / "val.bin").string(), "", s.val);
  write_atomic((dir / "train.bin").string(), "", s.train);  // last: its presence marks the cache complete
  note = "tokenized " + what + " once: " + std::to_string(s.train.size()) + " train and " + std::to_string(s.val.size()) +
         " val tokens, kept in " + dir.string();
  return dir.string();
}

void tokenize_file(const std::string& in, const std::string& tokenizer, const std::string& out_dir, std::ostream& log) {
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!fs::is_regular_file(in, ec))
    throw tg::InputError("--tokenize " + in + (fs::exists(in, ec) ? " is not a regular file" : " does not exist") +
                         "; expected a UTF-8 text file; check the path");
  const BpeTokenizer tok = BpeTokenizer::load(tokenizer);
  check_uint16(tok);
  if (!tok.can_encode()) tok.encode("", "--tokenize " + in);  // refuses, saying why
  const Mapped file(in);  // never read whole into memory
  const std::string_view text(file.data ? file.data : "", file.size);
  if (text.empty()) throw tg::InputError("--tokenize " + in + " is empty; expected a text to tokenize; check the path");
  const std::string what = "--tokenize " + in;
  const double mb = (double)text.size() / 1e6;
  auto last = t0;
  const auto progress = [&](size_t done) {
    const auto now = std::chrono::steady_clock::now();
    if (text.size() < (16u << 20) || (now - last < std::chrono::milliseconds(500) && done < text.size())) return;
    last = now;
    const double s = std::chrono::duration<double>(now - t0).count();
    char line[160];
    std::snprintf(line, sizeof line, "\rtokenizing %s: %3.0f%% (%.0f of %.0f MB, %.1f MB/s)", in.c_str(),
                  100.0 * (double)done / (double)text.size(), (double)done / 1e6, mb, (double)done / 1e6 / std::max(s, 1e-9));
    log << line << std::flush;
  };
  const SplitIds ids = encode_split(text, tok, what, progress);
  if (text.size() >= (16u << 20)) log << "\n";
  fs::create_directories(out_dir, ec);
  if (!fs::is_directory(out_dir, ec))
    throw tg::InputError("--out " + out_dir + " cannot be made a directory; expected a writable directory path; pass another --out");
  const std::string stem = fs::path(in).stem().string();
  const std::string train = (fs::path(out_dir) / (stem + "_train.bin")).string(),
                    val = (fs::path(out_dir) / (stem + "_val.bin")).string();
  write_llmc_shard(val, ids.val);
  write_llmc_shard(train, ids.train);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
#else
  const int threads = 1;
#endif
  char summary[96];
  std::snprintf(summary, sizeof summary, " in %.2f s (%.1f MB/s, %d threads)", s, mb / std::max(s, 1e-9), threads);
  log << "wrote " << train << " (" << ids.train.size() << " tokens) and " << val << " (" << ids.val.size()
      << " tokens): " << in << " (" << text.size() << " bytes) split 90/10 by characters, in " << tok.origin() << "'s "
      << tok.vocab_size() << " tokens" << summary << std::endl;
}

}  // namespace data
