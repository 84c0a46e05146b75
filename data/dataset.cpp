// data/dataset.cpp: UTF-8, the code-point tokenizer, loading and splitting, and the stateless batch sampler
// (see dataset.h for the definitions they follow).
#include "data/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "data/bpe.h"
#include "data/sha256.h"
#include "data/tokenize.h"
#include "data/tokens.h"
#include "kernels/philox.h"
#include "data/errors.h"

namespace data {

namespace {

// A character as a one-line message shows it: '@' (U+0040), or U+00E9 when it is not
// printable ASCII.
std::string describe_char(char32_t c) {
  char hex[16];
  std::snprintf(hex, sizeof hex, "U+%04X", (unsigned)c);
  if (c >= 0x20 && c < 0x7f) return std::string("'") + (char)c + "' (" + hex + ")";
  return hex;
}

std::string quoted(const std::string& path) { return "'" + path + "'"; }

// x, y (B, T): window b of tokens starts at
// uniform_below(stream_words(seed, stream, b, c1, c2).v[0], n - T). The one loop behind
// train_batch (kStreamBatch, c1 = step, c2 = 0) and eval_batch (kStreamEval, c1 = k, c2 = split).
void fill_windows(const std::vector<int32_t>& tokens, uint64_t seed, uint32_t stream, uint32_t c1,
                  uint32_t c2, int B, int T, int32_t* x, int32_t* y, uint32_t row0 = 0) {
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
    uint32_t r = philox::stream_words(seed, stream, row0 + (uint32_t)b, c1, c2).v[0];
    const int32_t* w = tokens.data() + philox::uniform_below(r, range);
    std::copy(w, w + T, x + (size_t)b * T);
    std::copy(w + 1, w + T + 1, y + (size_t)b * T);
  }
}

}  // namespace

std::vector<char32_t> utf8_decode(const std::string& s, const std::string& what, const std::string& fix) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  auto bad = [&](size_t at, const char* why) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", (unsigned)p[at]);
    const size_t line = 1 + (size_t)std::count(s.begin(), s.begin() + (std::ptrdiff_t)at, '\n');
    throw tg::InputError(what + " is not valid UTF-8: byte " + hex + " at byte offset " + std::to_string(at) +
                         " (line " + std::to_string(line) + ") " + why +
                         "; expected UTF-8 text (a character is a Unicode code point); " + fix);
  };
  std::vector<char32_t> out;
  out.reserve(n);
  for (size_t i = 0; i < n;) {
    char32_t cp = 0;
    const int len = utf8_char(p, n, i, cp);
    if (len == 0 && (p[i] < 0xC2 || p[i] > 0xF4))
      bad(i, p[i] < 0xC0 ? "(a continuation byte where a character begins)" : "(a byte that never occurs in UTF-8)");
    if (len == 0) bad(i, "(an invalid or overlong sequence, a surrogate or a code point past U+10FFFF)");
    if (len < 0) bad(i, "(a character cut short by the end of the text)");
    out.push_back(cp);
    i += (size_t)len;
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += (char)c;
  } else if (c < 0x800) {
    out += (char)(0xC0 | (c >> 6));
    out += (char)(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += (char)(0xE0 | (c >> 12));
    out += (char)(0x80 | ((c >> 6) & 0x3F));
    out += (char)(0x80 | (c & 0x3F));
  } else {
    out += (char)(0xF0 | (c >> 18));
    out += (char)(0x80 | ((c >> 12) & 0x3F));
    out += (char)(0x80 | ((c >> 6) & 0x3F));
    out += (char)(0x80 | (c & 0x3F));
  }
}

namespace {

// The sorted distinct code points of cps.
std::vector<char32_t> distinct(std::vector<char32_t> cps) {
  std::sort(cps.begin(), cps.end());
  cps.erase(std::unique(cps.begin(), cps.end()), cps.end());
  return cps;
}

}  // namespace

CharTokenizer CharTokenizer::from_text(const std::string& text) {
  CharTokenizer t;
  t.itos = distinct(utf8_decode(text));
  return t;
}

CharTokenizer CharTokenizer::from_chars(const std::string& chars) {
  const std::string fix = "the checkpoint is damaged or not written by train_gpt";
  CharTokenizer t;
  t.itos = utf8_decode(chars, "the vocabulary", fix);
  if (t.itos.empty())
    throw tg::InputError("the vocabulary is empty; expected at least one character; " + fix);
  for (size_t i = 1; i < t.itos.size(); ++i)
    if (t.itos[i] <= t.itos[i - 1])
      throw tg::InputError("the vocabulary's characters are not strictly ascending (character " + std::to_string(i) +
                           " is " + describe_char(t.itos[i]) + " after " + describe_char(t.itos[i - 1]) +
                           "); expected each character once, in code point order; " + fix);
  return t;
}

int CharTokenizer::vocab_size() const { return (int)itos.size(); }

int CharTokenizer::id(char32_t c) const {
  auto it = std::lower_bound(itos.begin(), itos.end(), c);
  return it != itos.end() && *it == c ? (int)(it - itos.begin()) : -1;
}

std::string CharTokenizer::chars() const {
  std::string s;
  for (char32_t c : itos) utf8_append(s, c);
  return s;
}

std::string CharTokenizer::default_prompt() const {
  if (id(U'\n') >= 0 || itos.empty()) return "\n";
  std::string s;
  utf8_append(s, itos[0]);
  return s;
}

std::vector<int32_t> CharTokenizer::encode(const std::string& s) const {
  const std::vector<char32_t> cps = utf8_decode(s);
  std::vector<int32_t> ids(cps.size());
  size_t byte = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const int id = this->id(cps[i]);
    if (id < 0)
      throw tg::InputError("character " + describe_char(cps[i]) + " at position " + std::to_string(i) +
                           " (byte offset " + std::to_string(byte) + ") is not in the vocabulary; expected only the " +
                           std::to_string(vocab_size()) + " characters of the training text; remove or replace it");
    ids[i] = id;
    byte += cps[i] < 0x80 ? 1 : cps[i] < 0x800 ? 2 : cps[i] < 0x10000 ? 3 : 4;
  }
  return ids;
}

std::string CharTokenizer::decode(const int32_t* ids, size_t n) const {
  std::string s;
  s.reserve(n);
  const int32_t V = (int32_t)itos.size();
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= V)
      throw tg::InputError("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                           " is not in the vocabulary; expected an id in [0, " + std::to_string(V) +
                           "); decode with the tokenizer of the text the model was trained on");
    utf8_append(s, itos[ids[i]]);
  }
  return s;
}

Dataset load_dataset(const std::string& path, int block_size, const std::string& tokenizer) {
  const std::string p = quoted(path);
  if (block_size < 1)
    throw tg::InputError("block_size " + std::to_string(block_size) + " is not valid; expected >= 1; "
                         "pass a positive --block-size");
  std::shared_ptr<const BpeTokenizer> bpe;
  if (!tokenizer.empty()) bpe = std::make_shared<const BpeTokenizer>(BpeTokenizer::load(tokenizer));
  if (is_token_data(path)) {
    Dataset d;
    d.path = path;
    // (the ends of every file checked now: a damaged shard is refused before a run writes anything)
    d.tokens = load_token_data(path, block_size, bpe ? bpe->vocab_size() : kGpt2Vocab, "", true);
    d.sha256 = d.tokens->fingerprint;
    d.bpe = bpe;
    return d;
  }
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
  if (bpe) {  // the text in the tokenizer's ids, split as prepare.py, cached
    const std::string dir = cached_tokens(text, d.sha256, *bpe, "data file " + p, d.note);
    std::string().swap(text);
    d.tokens = load_token_data(dir, block_size, bpe->vocab_size(), "data file " + p + " in " + bpe->origin() + "'s tokens");
    const std::string key = d.sha256 + " " + bpe->sha256();
    d.sha256 = sha256_hex(key.data(), key.size());  // the text and the tokenizer
    d.bpe = bpe;
    return d;
  }
  // one decoding pass: the code points give the vocabulary and, by rank, the ids
  const std::vector<char32_t> cps =
      utf8_decode(text, "data file " + p, "convert it to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8) or pass another --data PATH");
  d.tok.itos = distinct(cps);
  std::vector<int32_t> ids(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) ids[i] = d.tok.id(cps[i]);
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
                 int32_t* x, int32_t* y, uint32_t row0) {
  fill_windows(tokens, seed, philox::kStreamBatch, step, 0u, B, T, x, y, row0);
}

void eval_batch(const std::vector<int32_t>& tokens, uint64_t seed, uint32_t split, uint32_t k,
                int B, int T, int32_t* x, int32_t* y) {
  fill_windows(tokens, seed, philox::kStreamEval, k, split, B, T, x, y);
}

int Dataset::vocab_size() const { return tokens ? tokens->train.vocab : tok.vocab_size(); }
int Dataset::padded_vocab() const { return tokens ? (vocab_size() + 127) / 128 * 128 : vocab_size(); }
size_t Dataset::train_size() const { return tokens ? tokens->train.size() : train.size(); }
size_t Dataset::val_size() const { return tokens ? tokens->val.size() : val.size(); }

void Dataset::train_batch(uint64_t seed, uint32_t step, int B, int T, int32_t* x, int32_t* y, uint32_t row0) const {
  if (tokens) token_train_batch(tokens->train, seed, step, B, T, x, y, row0);
  else data::train_batch(train, seed, step, B, T, x, y, row0);
}

void Dataset::eval_batch(uint64_t seed, uint32_t split, uint32_t k, int B, int T, int32_t* x, int32_t* y) const {
  if (tokens) token_eval_batch(split == 0 ? tokens->train : tokens->val, seed, split, k, B, T, x, y);
  else data::eval_batch(split == 0 ? train : val, seed, split, k, B, T, x, y);
}

}  // namespace data
