// model/formats/safetensors.h: the weights file of a checkpoint in the safetensors format
// (https://github.com/huggingface/safetensors), loadable by nanoGPT / PyTorch as is; its JSON
// header is written and read with nlohmann-json.
//
//   u64 N (little endian) | N bytes of JSON header, padded with spaces to a multiple of 8 |
//   raw little-endian F32 data.
//   header: {"__metadata__":{"format":"pt","train_gpt_config":"n_layer=4 n_head=4 ...",
//                            "train_gpt_vocab":"\n !$&',-.3:;?ABC...xyz"},
//            "transformer.wte.weight":{"dtype":"F32","shape":[65,128],"data_offsets":[0,33280]},
//            ... one entry per param_table tensor, in param_table order, nanoGPT's names ...,
//            "lm_head.weight":{...}}   a copy of transformer.wte.weight (nanoGPT's state_dict
//   holds the tied head under both names and load_state_dict(strict=True) wants both).
//   data_offsets are [begin, end) in bytes from the start of the data; tensors are contiguous.
//   The header is compact JSON in ASCII: other characters are written as \u escapes.
//
// The vocabulary (train_gpt_vocab): the characters of the character-level vocabulary
// (data/dataset.h) in id order, i.e. ascending code points, as one JSON string: character i
// of the string (a Unicode code point, as Python's str indexes it) is token id i, so
// list(metadata["train_gpt_vocab"]) is nanoGPT's itos. Each code point appears once and the
// string's length is the vocabulary size (the rows of transformer.wte.weight). Sampling builds
// its tokenizer from it, so a checkpoint needs no data file. Files written before it existed
// have no such key (their vocabulary is that of the run's data file).
//
// The reader takes any JSON style (spacing, key order, escapes) and any tensor order, and
// throws InputError, one line saying what and what was expected, for a truncated file, bad
// header JSON, a dtype that is none of the format's (even on a tensor it skips), data outside
// the file, or another model's tensors. Untrusted headers are
// bounded: at most 100 MB, nesting at most 16 levels deep, at most 65,536 entries, no key
// twice in an object.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../net/gpt.h"

namespace tg {
namespace ckpt {

// The metadata key of the vocabulary.
constexpr const char* kVocabKey = "train_gpt_vocab";

// Writes the safetensors file of params (param_count(table) floats laid out by table) as
// consecutive pieces through out, the tensors straight from params (no copy);
// config_text goes to __metadata__.train_gpt_config (a short description), vocab (UTF-8, the
// characters in id order) to __metadata__.train_gpt_vocab unless it is empty.
void write_safetensors(const std::function<void(const void* data, size_t n)>& out, const std::vector<ParamSpec>& table,
                       const float* params, const std::string& config_text, const std::string& vocab = "");
// One tensor to write: F32, its numel = product of shape floats at data.
struct StPiece {
  std::string name;
  std::vector<int> shape;
  const float* data = nullptr;
  size_t numel = 0;
};
// Writes a safetensors file of the pieces, in order, with the metadata (key, value) pairs
// (written in order under __metadata__): the writer under write_safetensors, and under the
// Hugging Face export (model/formats/hf_export.h).
void write_safetensors_pieces(const std::function<void(const void* data, size_t n)>& out,
                              const std::vector<StPiece>& pieces,
                              const std::vector<std::pair<std::string, std::string>>& metadata);

// The same file as bytes.
std::string safetensors_bytes(const std::vector<ParamSpec>& table, const float* params,
                              const std::string& config_text, const std::string& vocab = "");

// One tensor of a parsed header.
struct StTensor {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  uint64_t numel = 1;
  uint64_t begin = 0, end = 0;  // bytes, relative to the data start
};

// A parsed header: every tensor's data lies inside the file (F32 tensors: exactly numel * 4
// bytes).
struct StFile {
  std::vector<StTensor> tensors;
  std::map<std::string, std::string> metadata;
  size_t data_start = 0;  // of the data, in bytes from the start of the file
};

// Parses the header of the safetensors file held in bytes (path names it in messages).
StFile parse_safetensors(const std::string& bytes, const std::string& path);
// Parses the header of the safetensors file at path, reading only the header's bytes.
StFile read_safetensors_header(const std::string& path);

// The expected tensors of a parsed file, laid out by expected (a buffer of
// max(offset + numel) floats). Every expected name must be there with dtype F32 and the
// expected shape; tensors other than those and lm_head.weight are another model's.
std::vector<float> safetensors_tensors(const StFile& f, const std::string& bytes, const std::string& path,
                                       const std::vector<ParamSpec>& expected);

// Every element of every F32 tensor of a parsed file (bytes: all of it) is finite, else
// InputError naming the tensor and the element (train_gpt never writes NaN or infinity: it
// skips the steps that would make them).
void check_finite(const StFile& f, const std::string& bytes, const std::string& path);

// Elements of the model's tensors in a parsed file (lm_head.weight, a copy, not counted).
uint64_t model_numel(const StFile& f);

// Reads a safetensors file: parse_safetensors, check_finite, then safetensors_tensors.
std::vector<float> read_safetensors(const std::string& path, const std::vector<ParamSpec>& expected);

}  // namespace ckpt
}  // namespace tg
