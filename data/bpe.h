// data/bpe.h: GPT-2's tokenizer, both ways: byte-level BPE exactly as GPT-2 defines it, for
// GPT-2's own vocabulary and for any byte-level BPE in its formats.
//
// Encoding a text (valid UTF-8; anything else is refused with the byte offset of the first bad
// byte):
//   1. Pre-tokenization: the text is cut into pieces by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      matched leftmost-first, over code points, with \p{L}, \p{N} and \s as the regex engines of
//      tiktoken and Hugging Face tokenizers define them (Unicode 16.0; the table is generated:
//      data/gen_unicode_classes.py -> data/unicode_classes.inc). The contractions are
//      lower-case only, as in GPT-2.
//   2. Each piece is its UTF-8 bytes, one token per byte, then merged pairwise: the adjacent
//      pair of lowest rank is merged (the leftmost of equal ranks), until no pair has a rank.
//      The rank of a pair (a, b) is
//        - Hugging Face files (vocab.json + merges.txt, tokenizer.json): the line of "a b" in
//          the merges, the result the token a+b; a pair not in the merges never merges;
//        - tiktoken files: the rank of the token whose bytes are a's then b's, as tiktoken's
//          byte_pair_merge; and a piece that is itself a token is that token (tiktoken's
//          shortcut).
//      For GPT-2's files the two agree. A piece of more than 24 bytes merges on a heap over a
//      linked list of parts, O(n log n) for n bytes (a megabyte of one letter is one piece); a
//      shorter one by a scan for the lowest rank (the same merges in the same order). Each
//      thread keeps a cache of the pieces of up to 64 bytes it has encoded.
//   3. <|endoftext|> in the text is text, as GPT-2's encoder.py and tiktoken's encode_ordinary
//      read it (prepare.py scripts append the end-of-text id themselves).
// Decoding concatenates the tokens' bytes (a token may end inside a character).
//
// Files (Tokenizer::load):
//   DIR               a Hugging Face GPT-2 directory: tokenizer.json, else vocab.json + merges.txt;
//                     else the one *.tiktoken or *.bin file it holds (a run directory's tokenizer/)
//   vocab.json        {"token": id}: tokens in GPT-2's byte-to-unicode alphabet (bytes
//                     0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF stand for themselves, the other 68 for
//                     U+0100 upwards in byte order); merges.txt beside it: "#version" lines,
//                     then one merge "a b" per line, rank = line number among the merges
//   tokenizer.json    Hugging Face's: model.type "BPE", its vocab and merges (either "a b"
//                     strings or ["a", "b"] pairs), a ByteLevel pre-tokenizer with GPT-2's
//                     settings (no prefix space), no normalizer; added tokens by their content
//   gpt2_tokenizer.bin  llm.c's file (data/tokens.h): decoding only, encode() refuses
//   *.tiktoken        tiktoken's rank file (gpt2.tiktoken, r50k_base.tiktoken): per line the
//                     token's bytes in base64, a space, its rank; ranks 0 .. n-1, id = rank;
//                     <|endoftext|> is id n, as tiktoken's gpt2 and r50k_base encodings add it
// Every byte must be a token and every id below the vocabulary size must be used once; a file
// that breaks a rule is refused (tg::InputError: what, where, expected, how to fix).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace data {

// The classes of GPT-2's pattern: \p{L}, \p{N}, \s, and the rest.
enum class CharClass : uint8_t { Other = 0, Letter = 1, Number = 2, Space = 3 };
CharClass char_class(char32_t c);

// The pieces of the UTF-8 text [p, p + n) under GPT-2's pattern, as end offsets (each piece
// ends where the next begins; the last ends at n). Throws tg::InputError for invalid UTF-8,
// naming the byte offset (base + the offset in p) and line; what says what the text is.
std::vector<size_t> pretokenize(const char* p, size_t n, const std::string& what = "the text", size_t base = 0);

// Throws tg::InputError naming the byte offset and line of the first invalid UTF-8 sequence of
// [p, p + n).
void check_utf8(const char* p, size_t n, const std::string& what = "the text");

class BpeTokenizer {
 public:
  enum class Ranks { Merges, Tiktoken };  // how a pair's rank is defined (above)

  // The tokenizer in path: a directory, tokenizer.json, vocab.json (merges.txt beside it) or a
  // .tiktoken rank file. Throws tg::InputError for a missing or malformed file (see above).
  static BpeTokenizer load(const std::string& path);
  // From the files' contents; origin names them in messages.
  static BpeTokenizer from_vocab_merges(const std::string& vocab_json, const std::string& merges_txt,
                                        const std::string& origin);
  static BpeTokenizer from_tokenizer_json(const std::string& json, const std::string& origin);
  static BpeTokenizer from_tiktoken(const std::string& text, const std::string& origin);
  // llm.c's gpt2_tokenizer.bin (bytes of the file): decoding only.
  static BpeTokenizer from_llmc(const std::string& bytes, const std::string& origin);


  // Whether it encodes (false for llm.c's file, which holds no merges).
  bool can_encode() const { return !decode_only_; }
  // The ids of the UTF-8 text. Throws tg::InputError for invalid UTF-8 (byte offset), or when
  // the tokenizer cannot encode.
  std::vector<int32_t> encode(const std::string& text, const std::string& what = "the text") const;
  // The same on every core: the text is cut at line starts (a piece never spans "\n" and the
  // character after it when that is not a space), each part encoded on its own.
  // progress, when given, is called (from one thread at a time) with the bytes done so far.
  std::vector<int32_t> encode_parallel(const char* p, size_t n, const std::string& what = "the text",
                                       const std::function<void(size_t)>& progress = nullptr) const;
  // The bytes of ids. Throws tg::InputError for an id outside the vocabulary.
  std::string decode(const int32_t* ids, size_t n) const;

  int vocab_size() const { return (int)tokens_.size(); }
  int eot() const { return eot_; }  // the id of <|endoftext|>, -1 when the vocabulary has none
  const std::string& token(int id) const { return tokens_[(size_t)id]; }
  Ranks ranks() const { return ranks_; }
  const std::string& origin() const { return origin_; }
  // The files it was read from, by name (vocab.json, merges.txt; tokenizer.json; x.tiktoken)
  // and contents: what a run directory keeps so that the tokenizer is read again as it was.
  const std::vector<std::pair<std::string, std::string>>& files() const { return files_; }
  // The sha256 of those files (names and contents): names the tokenizer by what it is.
  std::string sha256() const;

  struct Encoder;  // one thread's cache of pieces and scratch (bpe.cpp)

 private:
  void finish();  // checks the vocabulary, builds the byte and piece tables
  void encode_piece(const unsigned char* p, size_t n, std::vector<int32_t>& out, Encoder& e) const;
  void encode_range(const char* p, size_t n, size_t base, const std::string& what, std::vector<int32_t>& out,
                    Encoder& e) const;
  struct PairRank {
    uint32_t rank;
    int32_t merged;
  };

  std::vector<std::string> tokens_;  // id -> bytes
  std::vector<int> specials_;        // ids whose bytes are not merged text (<|endoftext|>, added tokens)
  int eot_ = -1;
  Ranks ranks_ = Ranks::Merges;
  bool decode_only_ = false;
  std::string origin_;
  std::vector<std::pair<std::string, std::string>> files_;
  int32_t byte_id_[256] = {};
  std::unordered_map<uint64_t, PairRank> pairs_;     // (a << 32 | b) -> rank, merged id: as read
  // the same as an open-addressing table (finish()): what encoding looks pairs up in
  struct PairSlot {
    uint64_t key = ~0ull;  // ~0: empty
    PairRank value{};
  };
  std::vector<PairSlot> pair_table_;
  const PairRank* find_pair(int32_t a, int32_t b) const {
    const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    if (pair_table_.empty()) return nullptr;
    const size_t mask = pair_table_.size() - 1;
    for (size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;; i = (i + 1) & mask) {
      const PairSlot& s = pair_table_[i];
      if (s.key == key) return &s.value;
      if (s.key == ~0ull) return nullptr;
    }
  }
  std::unordered_map<std::string, int32_t> by_bytes_;  // Tiktoken: bytes -> id (the shortcut)
  friend struct BpeFiles;
};

}  // namespace data
