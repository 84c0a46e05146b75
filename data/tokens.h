// data/tokens.h: token data (GPT-2 BPE ids, already tokenized), memory-mapped, and llm.c's
// GPT-2 tokenizer file, for sampling.
//
// Formats (--data):
//   llm.c shards   files written by llm.c's dev/data scripts (data_common.py write_datafile):
//                  a header of 256 little-endian int32 (header[0] = 20240520, header[1] = 1 (the
//                  version: GPT-2 uint16 tokens), header[2] = the token count n), then n uint16
//                  little-endian tokens; the file is exactly 1024 + 2n bytes. --data names a
//                  directory (its *.bin files) or a glob ("dev/data/fineweb10B/fineweb_*.bin")
//                  or one .bin file whose first int32 is the magic. A shard whose file name
//                  holds "val" (fineweb_val_000000.bin, tinyshakespeare_val.bin) is validation;
//                  every other one is training. Both splits must have at least one shard.
//   nanoGPT        a directory holding train.bin and val.bin: raw uint16 little-endian tokens,
//                  no header (nanoGPT's data/*/prepare.py).
// Shards of a split are taken in name order and read as one sequence of tokens; a window may
// run across the boundary of two shards (shards end and begin at document boundaries, like the
// end-of-text token within a shard). Files are memory-mapped, never read whole.
//
// Vocabulary: GPT-2's 50257 ids; the model pads it to 50304 (model/net/gpt.h padded_vocab_for).
// Every token is checked as a batch reads it: an id >= 50257 (or the --tokenizer's vocabulary
// size) is refused (InputError) naming the file and the token's position, never read past. With
// a --tokenizer the first and last MiB of every file are checked at start too.
//
// Fingerprint (what a run records as its data's "sha256", checked on --resume): the sha256 of,
// for each file of each split in order, its split, base name, byte size, and the sha256 of its
// first and last MiB (the whole file when smaller than 2 MiB). Cheap (at most 2 MiB read per
// shard), and it tells a different, regenerated, truncated, extended or reordered set of shards
// apart; it does not read the middle of large shards (a byte changed there in place goes
// unnoticed).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace data {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kTokenizerMagic = 20240328;
constexpr int kGpt2Vocab = 50257;

// One mapped file of uint16 tokens.
struct TokenFile {
  std::string path;
  const uint16_t* tokens = nullptr;  // into the mapping
  size_t count = 0;
  void* map = nullptr;
  size_t map_bytes = 0;
  TokenFile() = default;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();
};

// The tokens of one split: its files, read as one sequence.
class TokenSplit {
 public:
  size_t size() const { return total_; }
  // Copies tokens [start, start + n) as int32 to out. Throws tg::InputError naming the file and
  // position of a token >= vocab.
  void read(size_t start, size_t n, int32_t* out) const;
  void add(std::unique_ptr<TokenFile> f);
  // Checks the first and last MiB of each file (every token of a file under 2 MiB): an id >=
  // vocab throws as read() does. Cheap (memory-mapped), so a tokenizer that is not the data's
  // is refused before anything is written; the middle of larger files is checked as read.
  void check_ends() const;
  const std::vector<std::unique_ptr<TokenFile>>& files() const { return files_; }
  int vocab = kGpt2Vocab;

 private:
  [[noreturn]] void bad_id(const TokenFile& f, size_t i) const;
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<size_t> starts_;  // first token of each file in the sequence
  size_t total_ = 0;
};

struct TokenData {
  std::string format;       // "llm.c shards" or "nanoGPT"
  TokenSplit train, val;
  std::string fingerprint;  // 64 hex digits (see above)
};

// Whether --data names token data: a directory, a glob (*, ?, [), or a file ending in .bin.
bool is_token_data(const std::string& spec);

// Opens and checks the token data at spec (see above). Throws tg::InputError, one line (what,
// expected, how to fix), for: nothing matching, a directory with neither shards nor train.bin
// and val.bin, a missing split, a bad magic or version, a header count that disagrees with the
// file size (truncated or extended), an odd-sized nanoGPT file, a split too short for one
// window of block_size + 1 tokens.
// vocab: the ids' bound (the tokenizer's vocabulary, GPT-2's by default); what, when given,
// names the data in messages in place of "--data <spec>" (a cache of a text's tokens); ends:
// check the ends of every file now (TokenSplit::check_ends: load_dataset does, for every --data).
std::shared_ptr<TokenData> load_token_data(const std::string& spec, int block_size, int vocab = kGpt2Vocab,
                                           const std::string& what = "", bool ends = false);

// Batches from token data, as train_batch / eval_batch (data/dataset.h) do from a vector:
// the same Philox window starts, so a batch is a pure function of (seed, step, row).
void token_train_batch(const TokenSplit& s, uint64_t seed, uint32_t step, int B, int T, int32_t* x, int32_t* y,
                       uint32_t row0 = 0);
void token_eval_batch(const TokenSplit& s, uint64_t seed, uint32_t split, uint32_t k, int B, int T, int32_t* x,
                      int32_t* y);

// llm.c's gpt2_tokenizer.bin: a header of 256 little-endian uint32 (header[0] = 20240328,
// header[1] = version 1 or 2, header[2] = the vocabulary size, header[3] = the end-of-text id
// in version 2), then for each token a uint8 length (>= 1) and that many bytes.
struct Gpt2Tokenizer {
  std::vector<std::string> tokens;  // id -> bytes
  int eot = -1;                     // version 2 only
  // Throws tg::InputError for a missing file, a bad magic or version, a vocabulary size of 0 or
  // above 1 << 20, a zero length, a truncated table or bytes after it.
  static Gpt2Tokenizer load(const std::string& path);
  // The same from the file's bytes; path names it in messages.
  static Gpt2Tokenizer parse(const std::string& bytes, const std::string& path);
  // The bytes of ids (UTF-8 as GPT-2 decodes them; a token may end inside a character).
  // Throws tg::InputError for an id outside the table.
  std::string decode(const int32_t* ids, size_t n) const;
};

}  // namespace data
