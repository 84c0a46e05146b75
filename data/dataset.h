// data/dataset.h: the char-level tiny Shakespeare pipeline, as nanoGPT's
// data/shakespeare_char/prepare.py and the get_batch() of its train.py.
//
// Tokens. The vocabulary is the sorted set of distinct bytes of the whole text (65 for tiny
// Shakespeare: '\n', ' ', '!', ..., 'z'); a byte's id is its rank in that set.
//
// Split. The first int(n * 0.9) tokens (floor, in double, as Python's int()) are the train
// split, the rest the val split: 1,003,854 and 111,540 tokens for tiny Shakespeare.
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
#include <string>
#include <vector>

namespace data {

// Character-level tokenizer as nanoGPT's shakespeare_char/prepare.py: the vocabulary is the
// sorted set of distinct bytes of the text; stoi/itos map between bytes and ids.
// Filled by from_text(); a default-constructed tokenizer holds nothing usable.
struct CharTokenizer {
  std::vector<unsigned char> itos;   // id -> byte, sorted ascending; size vocab_size()
  int stoi[256];                     // byte -> id, -1 when not in the vocabulary

  // The tokenizer whose vocabulary is the distinct bytes of text.
  static CharTokenizer from_text(const std::string& text);
  // Number of distinct bytes (ids are 0 .. vocab_size() - 1).
  int vocab_size() const;
  // ids (size s.size()) of the bytes of s. Throws tg::InputError naming the first character
  // not in the vocabulary and its position.
  std::vector<int32_t> encode(const std::string& s) const;
  // The bytes of ids[0 .. n). Throws tg::InputError for an id outside [0, vocab_size()).
  std::string decode(const int32_t* ids, size_t n) const;
};

// A tokenized text and its two splits.
struct Dataset {
  std::string path;            // the file it was read from
  std::string sha256;          // of the file's bytes (data/sha256.h): names the text by its contents
  CharTokenizer tok;           // built from the whole text
  std::vector<int32_t> train;  // first int(n * 0.9) tokens (floor, as Python int())
  std::vector<int32_t> val;    // the rest
};

// Reads the text file at path, builds its tokenizer, encodes it and splits it. Throws
// tg::InputError when the file is missing, is a directory, is unreadable, is empty, or is too
// short: each split must hold at least block_size + 1 tokens (one window of T + 1).
Dataset load_dataset(const std::string& path, int block_size);

// Training batch for a step: x, y (B, T) from B windows of tokens, window b starting at
// uniform_below(stream_words(seed, kStreamBatch, b, step, 0).v[0], n - T).
// y[b][t] = x[b][t + 1] for t < T - 1. Needs tokens.size() >= T + 1 (throws tg::InputError).
void train_batch(const std::vector<int32_t>& tokens, uint64_t seed, uint32_t step, int B, int T,
                 int32_t* x, int32_t* y);

// Evaluation batch k (0 <= k < eval_iters) of a split (0 = train, 1 = val): x, y (B, T),
// the same construction with stream_words(seed, kStreamEval, b, k, split): a fixed set.
void eval_batch(const std::vector<int32_t>& tokens, uint64_t seed, uint32_t split, uint32_t k,
                int B, int T, int32_t* x, int32_t* y);

}  // namespace data
