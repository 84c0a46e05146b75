// data/dataset.h: the char-level tiny Shakespeare pipeline, as nanoGPT's
// data/shakespeare_char/prepare.py and the get_batch() of its train.py.
//
// Text. The file must be UTF-8 (strictly, as Python's decoder: no overlong forms, surrogates,
// code points past U+10FFFF, stray or missing continuation bytes); anything else is refused
// with the byte offset of the first bad byte. No newline translation, no BOM stripping.
//
// Tokens. A token is a character, a Unicode code point, as a Python str has them. The
// vocabulary is the sorted set of distinct code points of the whole text, as prepare.py's
// sorted(list(set(data))) (65 for tiny Shakespeare: '\n', ' ', '!', ..., 'z'); a character's
// id is its rank in that set. For an ASCII text a character is a byte, as before.
//
// Split. The first int(n * 0.9) tokens (floor, in double, as Python's int()) are the train
// split, the rest the val split: 1,003,854 and 111,540 tokens for tiny Shakespeare. Splitting
// the string by characters, as prepare.py does, then encoding gives the same tokens.
//
// Batches. A batch is B windows of T + 1 consecutive tokens of one split; window b gives row b
// of the inputs x = tokens[s : s+T] and of the targets y = tokens[s+1 : s+T+1]. Its start s is
//     r = philox4x32_10(counter, key).v[0],   key = { seed & 0xffffffff, seed >> 32 }
//       (philox::stream_words(seed, stream, c0, c1, c2) in kernels/philox.h)
//     s = uniform_below(r, n - T)              (n = tokens.size(), so s + T <= n - 1)
// with counter = { b, step, 0, kStreamBatch } for training and { b, k, split, kStreamEval }
// for evaluation batch k. A batch is thus a pure function of (seed, step) (or of (seed, split,
// k)): the loader keeps no state, a resumed run sees exactly the batches it would have seen,
// and a val loss over eval_iters batches is over the same fixed set every time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace data {

struct TokenData;     // data/tokens.h
class BpeTokenizer;   // data/bpe.h

// The code points of the UTF-8 text s. Throws tg::InputError naming the byte offset (and
// line) of the first invalid sequence and its byte; what says what s is ("--prompt"), fix how
// to mend it.
std::vector<char32_t> utf8_decode(const std::string& s, const std::string& what = "the text",
                                  const std::string& fix = "convert it to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)");
// The UTF-8 bytes of code point c (a scalar value: below 0x110000, not a surrogate).
void utf8_append(std::string& out, char32_t c);

// The code point at p[i] of the n bytes at p, and its length in bytes; 0 for an invalid
// sequence: the Unicode standard's table 3-7 (the lead byte gives the length and the range of
// the second byte: no overlong forms, no surrogates D800..DFFF, nothing past U+10FFFF); -1 for
// a sequence right so far that the end of the n bytes cuts short.
inline int utf8_char(const unsigned char* p, size_t n, size_t i, char32_t& cp) {
  const unsigned c = p[i];
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  int len;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + (size_t)k >= n) return -1;
    const unsigned b = p[i + (size_t)k];
    if (b < (k == 1 ? lo : 0x80u) || b > (k == 1 ? hi : 0xBFu)) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  return len;
}

// Character-level tokenizer as nanoGPT's shakespeare_char/prepare.py: the vocabulary is the
// sorted set of distinct code points of the text; id() and itos map between them and ids.
// Filled by from_text() or from_chars(); a default-constructed tokenizer has no vocabulary.
struct CharTokenizer {
  std::vector<char32_t> itos;  // id -> code point, strictly ascending; size vocab_size()

  // The tokenizer whose vocabulary is the distinct characters of the UTF-8 text. Throws
  // tg::InputError for invalid UTF-8 (with its byte offset).
  static CharTokenizer from_text(const std::string& text);
  // The tokenizer whose vocabulary is chars(): the characters in id order, UTF-8 (as a
  // checkpoint stores it). Throws tg::InputError unless they are valid UTF-8, at least one,
  // and strictly ascending.
  static CharTokenizer from_chars(const std::string& chars);
  // Number of distinct characters (ids are 0 .. vocab_size() - 1).
  int vocab_size() const;
  // The id of code point c, -1 when it is not in the vocabulary.
  int id(char32_t c) const;
  // The vocabulary's characters in id order, as UTF-8: from_chars(chars()) is this tokenizer.
  std::string chars() const;
  // The prompt a sample starts from by default: a newline (nanoGPT's sample.py start), or the
  // vocabulary's first character when the text has no newline.
  std::string default_prompt() const;
  // ids (one per character) of the UTF-8 text s. Throws tg::InputError for invalid UTF-8
  // (byte offset) or naming the first character not in the vocabulary and its position.
  std::vector<int32_t> encode(const std::string& s) const;
  // The UTF-8 text of ids[0 .. n) (always valid UTF-8). Throws tg::InputError for an id
  // outside [0, vocab_size()).
  std::string decode(const int32_t* ids, size_t n) const;
};

// A tokenized text and its two splits, or token data (data/tokens.h).
struct Dataset {
  std::string path;            // the file it was read from (token data: the --data given)
  std::string sha256;          // of the file's bytes (data/sha256.h): names the text by its contents;
                               // token data: its fingerprint (data/tokens.h)
  CharTokenizer tok;           // built from the whole text (empty for token data)
  std::vector<int32_t> train;  // first int(n * 0.9) tokens (floor, as Python int()); empty for token data
  std::vector<int32_t> val;    // the rest
  std::shared_ptr<const TokenData> tokens;  // token data, memory-mapped; null for a text
  // --tokenizer: the tokens' tokenizer (token data, or a text in its tokens); null without
  std::shared_ptr<const BpeTokenizer> bpe;
  std::string note;  // what loading did, for the log ("tokenized ... once", "reusing ...")

  // V: the text's characters; for token data the tokenizer's vocabulary, or GPT-2's 50257
  // without one.
  int vocab_size() const;
  // The model's Vp: V for a text (no padding: the character-level model as it always was),
  // V rounded up to a multiple of 128 for token data (llm.c's padding: 50304).
  int padded_vocab() const;
  size_t train_size() const;
  size_t val_size() const;
  // Training batch of step (micro-batch rows row0 ..) and evaluation batch k of a split, from
  // whichever this holds (train_batch / eval_batch below, or their token-data twins).
  void train_batch(uint64_t seed, uint32_t step, int B, int T, int32_t* x, int32_t* y, uint32_t row0 = 0) const;
  void eval_batch(uint64_t seed, uint32_t split, uint32_t k, int B, int T, int32_t* x, int32_t* y) const;
};

// Reads the data at path: token data (data/tokens.h: a directory, a glob or an llm.c .bin
// shard) is mapped and checked; anything else is a text file, which is read, tokenized and
// split as below. With tokenizer (a path, data/bpe.h), token data's ids must be below its
// vocabulary size, and a text becomes token data: its BPE ids, split and cached as
// data/tokenize.h says. Throws
// tg::InputError when the file is missing, is a directory, is unreadable, is empty, is not
// valid UTF-8 (naming the byte offset), or is too short: each split must hold at least
// block_size + 1 tokens (one window of T + 1).
Dataset load_dataset(const std::string& path, int block_size, const std::string& tokenizer = "");

// Training batch for a step: x, y (B, T) from B windows of tokens, window b starting at
// uniform_below(stream_words(seed, kStreamBatch, b, step, 0).v[0], n - T).
// y[b][t] = x[b][t + 1] for t < T - 1. Needs tokens.size() >= T + 1 (throws tg::InputError).
// row0: the windows are rows row0 .. row0 + B - 1 of the step's batch (counter word row0 + b):
// with --grad-accum N, micro-batch k of step s is train_batch(..., row0 = k B), i.e. rows
// k B .. k B + B - 1 of the batch of N B that step s would draw with --batch-size N B, a pure
// function of (seed, s, k). row0 = 0 is the plain batch.
void train_batch(const std::vector<int32_t>& tokens, uint64_t seed, uint32_t step, int B, int T,
                 int32_t* x, int32_t* y, uint32_t row0 = 0);

// Evaluation batch k (0 <= k < eval_iters) of a split (0 = train, 1 = val): x, y (B, T),
// the same construction with stream_words(seed, kStreamEval, b, k, split): a fixed set.
void eval_batch(const std::vector<int32_t>& tokens, uint64_t seed, uint32_t split, uint32_t k,
                int B, int T, int32_t* x, int32_t* y);

}  // namespace data
