// data/tokenize.h: a text in BPE tokens (data/bpe.h), as nanoGPT's prepare.py makes one: the
// text split 90/10 by characters (the first int(n * 0.9) code points train, the rest
// validate), each part encoded on its own (no end-of-text token added). Two uses:
//   - training on a text with --tokenizer (or --init-from a Hugging Face directory): the ids
//     go once into a cache, <cache>/tokens/<key>/{train.bin,val.bin} (nanoGPT's raw uint16),
//     key = sha256 of the text's sha256 and the tokenizer's; a second run maps them again.
//     <cache> is $TG_CACHE_DIR, else $XDG_CACHE_HOME/train_gpt, else ~/.cache/train_gpt.
//   - train_gpt --tokenize IN.txt --tokenizer T --out DIR: llm.c shards for other tools,
//     DIR/<stem>_train.bin and DIR/<stem>_val.bin (the format in data/tokens.h).
// Ids are stored as uint16: a tokenizer of more than 65536 tokens is refused.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace data {

class BpeTokenizer;

// The byte offset of character int(n * 0.9) of the UTF-8 text (n its code points; Python's
// int() of the double product, as prepare.py). The text must be valid UTF-8.
size_t split_offset(std::string_view text);

struct SplitIds {
  std::vector<int32_t> train, val;
};

// The two parts of the text, encoded on every core. progress (optional) gets the bytes done.
// Throws tg::InputError for invalid UTF-8 (byte offset in the whole text), a tokenizer that
// cannot encode, or one too large for uint16 ids.
SplitIds encode_split(std::string_view text, const BpeTokenizer& tok, const std::string& what,
                      const std::function<void(size_t)>& progress = nullptr);

// Throws tg::InputError when tok's ids do not fit uint16 (more than 65536 tokens).
void check_uint16(const BpeTokenizer& tok);

// An llm.c shard of the ids (header 20240520, version 1, count; uint16 tokens), written
// atomically (a temporary file renamed).
void write_llmc_shard(const std::string& path, const std::vector<int32_t>& ids);

// The cache directory holding the text's ids under tok (made when missing: encoded, then
// written atomically), and in note what was done ("tokenized ... into DIR" or "reusing DIR").
std::string cached_tokens(const std::string& text, const std::string& text_sha256, const BpeTokenizer& tok,
                          const std::string& what, std::string& note);

// train_gpt --tokenize IN --tokenizer T --out DIR: IN's two parts as llm.c shards
// DIR/<stem>_train.bin and DIR/<stem>_val.bin (stem: IN's name without its extension). Every
// check (IN readable, UTF-8, T a tokenizer that encodes, of at most 65536 tokens) comes before
// anything is written. IN is memory-mapped, not read into memory; the shards are written 1 MiB
// at a time. On log: a progress line (rewritten in place) for texts of 16 MiB and up, then what
// was written.
void tokenize_file(const std::string& in, const std::string& tokenizer, const std::string& out_dir, std::ostream& log);

}  // namespace data
