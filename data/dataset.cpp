// data/dataset.cpp: tokenizer, loading and splitting, and the stateless batch sampler
// (see dataset.h for the definitions they follow).
#include "data/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "data/sha256.h"
#include "kernels/philox.h"
#include "model/errors.h"

namespace data {

namespace {

// A byte as a message shows it: '@' (byte 0x40), or byte 0x0d when it does not print.
std::string describe_byte(unsigned char c) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", (unsigned)c);
  if (c >= 0x20 && c < 0x7f) return std::string("'") + (char)c + "' (byte " + hex + ")";
  return std::string("byte ") + hex;
}

std::string quoted(const std::string& path) { return "'" + path + "'"; }

// x, y (B, T): window b of tokens starts at
// uniform_below(stream_words(seed, stream, b, c1, c2).v[0], n - T). The one loop behind
// train_batch (kStreamBatch, c1 = step, c2 = 0) and eval_batch (kStreamEval, c1 = k, c2 = split).
void fill_windows(const std::vector<int32_t>& tokens, uint64_t seed, uint32_t stream, uint32_t c1,
                  uint32_t c2, int B, int T, int32_t* x, int32_t* y) {
  const size_t n = tokens.size();
  if (B < 0 || T < 1)
    throw tg::InputError("batch shape B=" + std::to_string(B) + ", T=" + std::to_string(T) +
                         " is not valid; expected B >= 0 and T >= 1; check --batch-size and --block-size");
  if (n < (size_t)T + 1)
    throw tg::InputError("a split of " + std::to_string(n) + " tokens is too short for windows of T+1 = " +
                         std::to_string(T + 1) + " tokens; expected at least " + std::to_string(T + 1) +
                         "; use a longer text or a smaller --block-size");
  if (n - (size_t)T > 0xffffffffull)
    throw tg::InputError("a split of " + std::to_string(n) + " tokens is too long for 32-bit window starts; "
                         "expected at most 2^32 + T tokens; use a smaller text");
  const uint32_t range = (uint32_t)(n - (size_t)T);
  for (int b = 0; b < B; ++b) {
    uint32_t r = philox::stream_words(seed, stream, (uint32_t)b, c1, c2).v[0];
    const int32_t* w = tokens.data() + philox::uniform_below(r, range);
    std::copy(w, w + T, x + (size_t)b * T);
    std::copy(w + 1, w + T + 1, y + (size_t)b * T);
  }
}

}  // namespace

CharTokenizer CharTokenizer::from_text(const std::string& text) {
  bool seen[256] = {};
  for (unsigned char c : text) seen[c] = true;
  CharTokenizer t;
  for (int c = 0; c < 256; ++c) {
    t.stoi[c] = -1;
    if (seen[c]) {
      t.stoi[c] = (int)t.itos.size();
      t.itos.push_back((unsigned char)c);
    }
  }
  return t;
}

int CharTokenizer::vocab_size() const { return (int)itos.size(); }

std::vector<int32_t> CharTokenizer::encode(const std::string& s) const {
  std::vector<int32_t> ids(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = (unsigned char)s[i];
    int id = stoi[c];
    if (id < 0)
      throw tg::InputError("character " + describe_byte(c) + " at position " + std::to_string(i) +
                           " is not in the vocabulary; expected only the " +
                           std::to_string(vocab_size()) +
                           " characters of the training text; remove or replace it");
    ids[i] = id;
  }
  return ids;
}

std::string CharTokenizer::decode(const int32_t* ids, size_t n) const {
  std::string s(n, '\0');
  const int32_t V = (int32_t)itos.size();
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= V)
      throw tg::InputError("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                           " is not in the vocabulary; expected an id in [0, " + std::to_string(V) +
                           "); decode with the tokenizer of the text the model was trained on");
    s[i] = (char)itos[ids[i]];
  }
  return s;
}

Dataset load_dataset(const std::string& path, int block_size) {
  const std::string p = quoted(path);
  if (block_size < 1)
    throw tg::InputError("block_size " + std::to_string(block_size) + " is not valid; expected >= 1; "
                         "pass a positive --block-size");
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      throw tg::InputError("data file " + p + " does not exist; expected tiny Shakespeare's input.txt; "
                           "run `make data` or pass --data PATH");
    throw tg::InputError("data file " + p + " cannot be accessed (" + std::strerror(errno) +
                         "); expected a readable text file such as tiny Shakespeare's input.txt; "
                         "check the path's permissions or pass --data PATH");
  }
  if (S_ISDIR(st.st_mode))
    throw tg::InputError("data file " + p + " is a directory; expected a text file such as tiny "
                         "Shakespeare's input.txt; pass --data PATH of the file itself");
  if (!S_ISREG(st.st_mode))
    throw tg::InputError("data file " + p + " is not a regular file (a device, FIFO or socket); expected a "
                         "text file such as tiny Shakespeare's input.txt; pass --data PATH of a file");

  std::string text;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f)
    throw tg::InputError("data file " + p + " cannot be read (" + std::strerror(errno) +
                         "); expected a readable text file such as tiny Shakespeare's input.txt; "
                         "fix its permissions or pass --data PATH");
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, got);
  bool failed = std::ferror(f) != 0;
  int err = errno;
  std::fclose(f);
  if (failed)
    throw tg::InputError("data file " + p + " cannot be read (" + std::strerror(err) +
                         "); expected a readable text file such as tiny Shakespeare's input.txt; "
                         "check the file or pass --data PATH");
  if (text.empty())
    throw tg::InputError("data file " + p + " is empty; expected tiny Shakespeare's input.txt "
                         "(1115394 bytes); run `make data` to fetch it again or pass --data PATH");

  Dataset d;
  d.path = path;
  d.sha256 = sha256_hex(text.data(), text.size());
  d.tok = CharTokenizer::from_text(text);
  std::vector<int32_t> ids = d.tok.encode(text);
  const size_t n = ids.size();
  const size_t n_train = (size_t)((double)n * 0.9);  // Python's int(n * 0.9)
  const size_t need = (size_t)block_size + 1;
  if (n_train < need || n - n_train < need)
    throw tg::InputError("data file " + p + " is too short: its train split has " + std::to_string(n_train) +
                         " tokens and its val split " + std::to_string(n - n_train) + "; expected at least " +
                         std::to_string(need) + " (block_size + 1) in each; pass a longer text with "
                         "--data PATH or a smaller --block-size");
  d.train.assign(ids.begin(), ids.begin() + n_train);
  d.val.assign(ids.begin() + n_train, ids.end());
  return d;
}

void train_batch(const std::vector<int32_t>& tokens, uint64_t seed, uint32_t step, int B, int T,
                 int32_t* x, int32_t* y) {
  fill_windows(tokens, seed, philox::kStreamBatch, step, 0u, B, T, x, y);
}

void eval_batch(const std::vector<int32_t>& tokens, uint64_t seed, uint32_t split, uint32_t k,
                int B, int T, int32_t* x, int32_t* y) {
  fill_windows(tokens, seed, philox::kStreamEval, k, split, B, T, x, y);
}

}  // namespace data
