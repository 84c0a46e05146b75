// model/formats/safetensors.cpp: the safetensors format and its JSON header, written and read with
// nlohmann-json behind model/formats/json_io.h (see model/formats/safetensors.h).
#include "safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "../../data/errors.h"
#include "ckpt_io.h"
#include "json_io.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors files are little endian and floats are copied as they lie in memory");

namespace tg {
namespace ckpt {

namespace {

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<uint64_t> to_u64(const std::vector<int>& shape) {
  return std::vector<uint64_t>(shape.begin(), shape.end());
}

// Limits on untrusted headers: bytes, nesting (the format needs 3 levels), top-level entries
// (a model of kMaxLayer layers has under 2,000 tensors).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
constexpr int kMaxDepth = 16;
constexpr size_t kMaxEntries = 1u << 16;

// The dtypes of the safetensors format (its Dtype enum): a tensor of any other, or none, is
// refused even where the reader skips the tensor (lm_head.weight, GPT-2's mask buffers).
const char* const kDtypes[] = {"BOOL", "F4",  "F6_E2M3", "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",
                               "U16",  "F16", "BF16",    "I32",     "U32", "F32", "C64",     "F64",     "I64",     "U64"};

bool known_dtype(const std::string& d) {
  return std::any_of(std::begin(kDtypes), std::end(kDtypes), [&](const char* k) { return d == k; });
}

std::string dtype_list() {
  std::string s;
  for (const char* k : kDtypes) s += (s.empty() ? "" : ", ") + std::string(k);
  return s;
}

const std::string kBadHeader = "a safetensors header as train_gpt writes it ({\"name\": {\"dtype\", \"shape\", \"data_offsets\"}, ...})";

const ParamSpec* find_wte(const std::vector<ParamSpec>& table) {
  for (const ParamSpec& p : table)
    if (p.name == "transformer.wte.weight") return &p;
  return nullptr;
}

// Parses the header held in bytes (the first 8 + N bytes of a file of file_size bytes, or
// all of it) and checks that every tensor's data lies inside the file (F32 tensors: exactly
// numel * 4 bytes).
StFile parse_header(const std::string& bytes, uint64_t file_size, const std::string& path) {
  if (file_size < 8 || bytes.size() < 8)
    damaged(path, "is truncated to " + std::to_string(file_size) + " bytes",
            "a safetensors file (an 8-byte header length, the header, the data)");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > file_size - 8) {
    if (n > kMaxHeaderBytes)
      damaged(path, "starts with an implausible header length " + std::to_string(n),
              "a safetensors file with a header below 100 MB");
    damaged(path, "is truncated: its header is " + std::to_string(n) + " bytes but only " +
                      std::to_string(file_size - 8) + " follow",
            "a complete safetensors file");
  }
  if (n > kMaxHeaderBytes)
    damaged(path, "has a header of " + std::to_string(n) + " bytes", "a safetensors file with a header below 100 MB");
  if (n > bytes.size() - 8)
    damaged(path, "is truncated: its header is " + std::to_string(n) + " bytes but only " +
                      std::to_string(bytes.size() - 8) + " could be read",
            "a complete safetensors file");
  StFile f;
  f.data_start = 8 + (size_t)n;
  const uint64_t data_size = file_size - f.data_start;
  jsonio::Value root;
  try {
    root = jsonio::parse_untrusted(bytes.substr(8, (size_t)n), kMaxDepth, kMaxEntries);
  } catch (const jsonio::Error& e) {
    damaged(path, "has a bad header: " + e.msg, kBadHeader);
  }
  if (!root.is_object()) damaged(path, "has a header that is not a JSON object", kBadHeader);
  for (const auto& kv : root.items()) {
    const std::string& name = kv.first;
    const jsonio::Value& v = kv.second;
    auto bad = [&](const std::string& what) { damaged(path, "has a bad header entry \"" + printable(name) + "\": " + what, kBadHeader); };
    if (!v.is_object()) bad("not an object");
    if (name == "__metadata__") {
      for (const auto& m : v.items()) {
        if (!m.second.is_string()) bad("metadata value \"" + printable(m.first) + "\" is not a string");
        f.metadata[m.first] = m.second.get_string();
      }
      continue;
    }
    StTensor t;
    t.name = name;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    for (const auto& field : v.items()) {
      const jsonio::Value& x = field.second;
      if (field.first == "dtype") {
        if (!x.is_string()) bad("dtype is not a string");
        t.dtype = x.get_string();
        has_dtype = true;
      } else if (field.first == "shape") {
        if (!x.is_array()) bad("shape is not an array");
        for (const jsonio::Value& d : x.elements()) {
          if (!d.is_number_unsigned()) bad("shape holds something other than a non-negative integer");
          const uint64_t dim = d.get_uint64();
          if (dim != 0 && t.numel > UINT64_MAX / dim) bad("shape too large");
          t.shape.push_back(dim);
          t.numel *= dim;
        }
        has_shape = true;
      } else if (field.first == "data_offsets") {
        if (!x.is_array() || x.size() != 2 || !x[0].is_number_unsigned() || !x[1].is_number_unsigned())
          bad("data_offsets is not [begin, end]");
        t.begin = x[0].get_uint64();
        t.end = x[1].get_uint64();
        has_offsets = true;
      } else {
        bad("unknown field \"" + printable(field.first) + "\"");
      }
    }
    if (!has_dtype || !has_shape || !has_offsets) bad("dtype, shape or data_offsets missing");
    if (!known_dtype(t.dtype)) bad("dtype \"" + printable(t.dtype) + "\" is none of the format's (" + dtype_list() + ")");
    if (t.begin > t.end) bad("data_offsets end before they begin");
    if (t.dtype == "F32" && (t.numel > UINT64_MAX / 4 || t.end - t.begin != t.numel * 4))
      bad("data_offsets [" + std::to_string(t.begin) + "," + std::to_string(t.end) + "] do not hold shape " +
          shape_text(t.shape) + " in F32");
    if (t.end > data_size)
      damaged(path, "is truncated: tensor " + printable(name) + " ends at data byte " + std::to_string(t.end) +
                        " but the file holds " + std::to_string(data_size) + " data bytes",
              "a complete safetensors file");
    f.tensors.push_back(std::move(t));
  }
  return f;
}

}  // namespace

StFile parse_safetensors(const std::string& bytes, const std::string& path) {
  return parse_header(bytes, bytes.size(), path);
}

StFile read_safetensors_header(const std::string& path) {
  uint64_t size = 0;
  const std::string head = read_file(path, 8, &size);
  if (head.size() < 8) return parse_header(head, head.size(), path);  // truncated
  uint64_t n;
  std::memcpy(&n, head.data(), 8);
  const std::string bytes = read_file(path, 8 + (size_t)std::min(n, kMaxHeaderBytes), &size);
  return parse_header(bytes, size, path);
}

// The expected tensors of a parsed file, laid out by expected; another model's file throws.
std::vector<float> safetensors_tensors(const StFile& f, const std::string& bytes, const std::string& path,
                           const std::vector<ParamSpec>& expected) {
  std::map<std::string, const StTensor*> by_name;
  for (const StTensor& t : f.tensors) by_name[t.name] = &t;
  std::map<std::string, const ParamSpec*> wanted;
  size_t total = 0;
  for (const ParamSpec& p : expected) {
    wanted[p.name] = &p;
    total = std::max(total, p.offset + p.numel);
  }
  for (const StTensor& t : f.tensors)
    if (!wanted.count(t.name) && t.name != "lm_head.weight")
      another_model(path, "it has tensor " + printable(t.name) + " " + shape_text(t.shape),
                    "no such tensor in this model");
  std::vector<float> out(total);
  for (const ParamSpec& p : expected) {
    auto it = by_name.find(p.name);
    if (it == by_name.end())
      another_model(path, "it has no tensor " + p.name, p.name + " with shape " + shape_text(to_u64(p.shape)));
    const StTensor& t = *it->second;
    if (t.shape != to_u64(p.shape))
      another_model(path, p.name + " has shape " + shape_text(t.shape), shape_text(to_u64(p.shape)));
    if (t.dtype != "F32")
      another_model(path, p.name + " has dtype " + printable(t.dtype), "F32");
    if (p.numel) std::memcpy(out.data() + p.offset, bytes.data() + f.data_start + t.begin, p.numel * sizeof(float));
  }
  return out;
}

void check_finite(const StFile& f, const std::string& bytes, const std::string& path) {
  for (const StTensor& t : f.tensors) {
    if (t.dtype != "F32") continue;
    const char* at = bytes.data() + f.data_start + t.begin;
    for (uint64_t i = 0; i < t.numel; ++i) {
      uint32_t bits;
      std::memcpy(&bits, at + 4 * i, 4);
      if ((bits & 0x7f800000u) != 0x7f800000u) continue;
      float x;
      std::memcpy(&x, &bits, 4);
      char b[32];
      std::snprintf(b, sizeof b, "%g", x);
      damaged(path, "holds a weight that is not finite: " + printable(t.name) + "[" + std::to_string(i) + "] = " + b,
              "finite weights, as train_gpt writes them");
    }
  }
}

// Elements of the model's tensors in a parsed file (lm_head.weight, a copy, not counted).
uint64_t model_numel(const StFile& f) {
  uint64_t n = 0;
  for (const StTensor& t : f.tensors)
    if (t.name != "lm_head.weight") n += t.numel;
  return n;
}

void write_safetensors_pieces(const std::function<void(const void*, size_t)>& out, const std::vector<StPiece>& pieces,
                              const std::vector<std::pair<std::string, std::string>>& metadata) {
  jsonio::Out h = jsonio::Out::object();
  for (const auto& [key, value] : metadata) h["__metadata__"][key] = value;
  uint64_t off = 0;
  for (const StPiece& p : pieces) {
    jsonio::Out& e = h[p.name];
    e["dtype"] = "F32";
    e["shape"] = to_u64(p.shape);
    e["data_offsets"] = std::vector<uint64_t>{off, off + p.numel * 4};
    off += p.numel * 4;
  }
  // compact, ASCII only (other characters as \u escapes), bytes that are not UTF-8 as U+FFFD
  std::string text = jsonio::dump(h, -1, /*ascii=*/true);
  while (text.size() % 8) text += ' ';
  const uint64_t n = text.size();
  out(&n, 8);
  out(text.data(), text.size());
  for (const StPiece& p : pieces) out(p.data, p.numel * 4);
}

void write_safetensors(const std::function<void(const void*, size_t)>& out, const std::vector<ParamSpec>& table,
                       const float* params, const std::string& config_text, const std::string& vocab) {
  std::vector<std::pair<std::string, std::string>> metadata = {{"format", "pt"}, {"train_gpt_config", config_text}};
  if (!vocab.empty()) metadata.push_back({kVocabKey, vocab});
  std::vector<StPiece> pieces;
  for (const ParamSpec& p : table) pieces.push_back({p.name, p.shape, params + p.offset, p.numel});
  if (const ParamSpec* wte = find_wte(table)) pieces.push_back({"lm_head.weight", wte->shape, params + wte->offset, wte->numel});
  write_safetensors_pieces(out, pieces, metadata);
}

std::string safetensors_bytes(const std::vector<ParamSpec>& table, const float* params, const std::string& config_text,
                              const std::string& vocab) {
  std::string bytes;
  write_safetensors([&](const void* p, size_t n) { bytes.append(static_cast<const char*>(p), n); }, table, params,
                    config_text, vocab);
  return bytes;
}

std::vector<float> read_safetensors(const std::string& path, const std::vector<ParamSpec>& expected) {
  std::string bytes = read_file(path);
  const StFile f = parse_safetensors(bytes, path);
  check_finite(f, bytes, path);
  return safetensors_tensors(f, bytes, path, expected);
}

}  // namespace ckpt
}  // namespace tg
