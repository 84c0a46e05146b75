// model/safetensors.cpp: the safetensors format and its JSON header (see model/safetensors.h).
#include "safetensors.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "ckpt_io.h"
#include "errors.h"

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

// ---- JSON, as much as a safetensors header needs: objects, arrays, strings and
// non-negative integers.

struct JVal {
  enum Type { Obj, Arr, Str, Num } type = Num;
  std::string str;
  uint64_t num = 0;
  std::vector<JVal> arr;
  std::vector<std::pair<std::string, JVal>> obj;
};

struct JsonError {
  std::string msg;
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  JVal parse() {
    JVal v = value(0);
    ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw JsonError{what + " at byte " + std::to_string(i_) + " of the header"};
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  char peek() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("'") + c + "' wanted, found '" + printable(std::string(1, s_[i_])) + "'");
    ++i_;
  }

  JVal value(int depth) {
    if (depth > 16) fail("nesting too deep");
    char c = peek();
    JVal v;
    if (c == '{') {
      v.type = JVal::Obj;
      ++i_;
      if (peek() == '}') { ++i_; return v; }
      for (;;) {
        if (peek() != '"') fail("object key wanted");
        std::string key = string();
        for (const auto& kv : v.obj)
          if (kv.first == key) fail("duplicate key \"" + printable(key) + "\"");
        expect(':');
        v.obj.emplace_back(key, value(depth + 1));
        if (peek() == ',') { ++i_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.type = JVal::Arr;
      ++i_;
      if (peek() == ']') { ++i_; return v; }
      for (;;) {
        v.arr.push_back(value(depth + 1));
        if (peek() == ',') { ++i_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.type = JVal::Str;
      v.str = string();
      return v;
    }
    if (c >= '0' && c <= '9') {
      v.type = JVal::Num;
      v.num = number();
      return v;
    }
    fail("unexpected '" + printable(std::string(1, c)) + "' (only objects, arrays, strings and integers belong here)");
  }

  uint64_t number() {
    size_t start = i_;
    uint64_t x = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      uint64_t d = (uint64_t)(s_[i_] - '0');
      if (x > (UINT64_MAX - d) / 10) fail("integer too large");
      x = x * 10 + d;
      ++i_;
    }
    if (i_ - start > 1 && s_[start] == '0') fail("integer with a leading zero");
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) fail("non-integer number");
    return x;
  }

  unsigned hex4() {
    if (s_.size() - i_ < 4) fail("short \\u escape");
    unsigned x = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[i_++];
      x <<= 4;
      if (h >= '0' && h <= '9') x |= (unsigned)(h - '0');
      else if (h >= 'a' && h <= 'f') x |= (unsigned)(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') x |= (unsigned)(h - 'A' + 10);
      else fail("bad \\u escape");
    }
    return x;
  }

  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += (char)cp;
    } else if (cp < 0x800) {
      out += (char)(0xC0 | (cp >> 6));
      out += (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += (char)(0xE0 | (cp >> 12));
      out += (char)(0x80 | ((cp >> 6) & 0x3F));
      out += (char)(0x80 | (cp & 0x3F));
    } else {
      out += (char)(0xF0 | (cp >> 18));
      out += (char)(0x80 | ((cp >> 12) & 0x3F));
      out += (char)(0x80 | ((cp >> 6) & 0x3F));
      out += (char)(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      unsigned char c = (unsigned char)s_[i_++];
      if (c == '"') return out;
      if (c < 0x20) fail("control character in a string");
      if (c != '\\') { out += (char)c; continue; }
      if (i_ >= s_.size()) fail("unterminated string");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp < 0xE000) fail("lone low surrogate");
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (s_.size() - i_ < 2 || s_[i_] != '\\' || s_[i_ + 1] != 'u') fail("lone high surrogate");
            i_ += 2;
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  const std::string& s_;
  size_t i_ = 0;
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += (char)c;
    } else if (c < 0x20 || c >= 0x7f) {  // escaped, so the header stays ASCII (valid UTF-8)
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += (char)c;
    }
  }
  return out + "\"";
}

const std::string kBadHeader = "a safetensors header as train_gpt writes it ({\"name\": {\"dtype\", \"shape\", \"data_offsets\"}, ...})";

const ParamSpec* find_wte(const std::vector<ParamSpec>& table) {
  for (const ParamSpec& p : table)
    if (p.name == "transformer.wte.weight") return &p;
  return nullptr;
}

}  // namespace

// Reads the header of a safetensors file in bytes and checks that every tensor's data lies
// inside the file (F32 tensors: exactly numel * 4 bytes).
StFile parse_safetensors(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 8)
    damaged(path, "is truncated to " + std::to_string(bytes.size()) + " bytes",
            "a safetensors file (an 8-byte header length, the header, the data)");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8) {
    if (n > (100u << 20))
      damaged(path, "starts with an implausible header length " + std::to_string(n),
              "a safetensors file with a header below 100 MB");
    damaged(path, "is truncated: its header is " + std::to_string(n) + " bytes but only " +
                      std::to_string(bytes.size() - 8) + " follow",
            "a complete safetensors file");
  }
  StFile f;
  f.data_start = 8 + (size_t)n;
  const uint64_t data_size = bytes.size() - f.data_start;
  JVal root;
  try {
    root = JsonParser(bytes.substr(8, (size_t)n)).parse();
  } catch (const JsonError& e) {
    damaged(path, "has a bad header: " + e.msg, kBadHeader);
  }
  if (root.type != JVal::Obj) damaged(path, "has a header that is not a JSON object", kBadHeader);
  for (const auto& kv : root.obj) {
    const std::string& name = kv.first;
    const JVal& v = kv.second;
    auto bad = [&](const std::string& what) { damaged(path, "has a bad header entry \"" + printable(name) + "\": " + what, kBadHeader); };
    if (v.type != JVal::Obj) bad("not an object");
    if (name == "__metadata__") {
      for (const auto& m : v.obj) {
        if (m.second.type != JVal::Str) bad("metadata value \"" + printable(m.first) + "\" is not a string");
        f.metadata[m.first] = m.second.str;
      }
      continue;
    }
    StTensor t;
    t.name = name;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    for (const auto& field : v.obj) {
      const JVal& x = field.second;
      if (field.first == "dtype") {
        if (x.type != JVal::Str) bad("dtype is not a string");
        t.dtype = x.str;
        has_dtype = true;
      } else if (field.first == "shape") {
        if (x.type != JVal::Arr) bad("shape is not an array");
        for (const JVal& d : x.arr) {
          if (d.type != JVal::Num) bad("shape holds a non-integer");
          if (d.num != 0 && t.numel > UINT64_MAX / d.num) bad("shape too large");
          t.shape.push_back(d.num);
          t.numel *= d.num;
        }
        has_shape = true;
      } else if (field.first == "data_offsets") {
        if (x.type != JVal::Arr || x.arr.size() != 2 || x.arr[0].type != JVal::Num || x.arr[1].type != JVal::Num)
          bad("data_offsets is not [begin, end]");
        t.begin = x.arr[0].num;
        t.end = x.arr[1].num;
        has_offsets = true;
      } else {
        bad("unknown field \"" + printable(field.first) + "\"");
      }
    }
    if (!has_dtype || !has_shape || !has_offsets) bad("dtype, shape or data_offsets missing");
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

// Elements of the model's tensors in a parsed file (lm_head.weight, a copy, not counted).
uint64_t model_numel(const StFile& f) {
  uint64_t n = 0;
  for (const StTensor& t : f.tensors)
    if (t.name != "lm_head.weight") n += t.numel;
  return n;
}

void write_safetensors(const std::function<void(const void*, size_t)>& out, const std::vector<ParamSpec>& table,
                       const float* params, const std::string& config_text) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\",\"train_gpt_config\":" + json_string(config_text) + "}";
  uint64_t off = 0;
  auto entry = [&](const std::string& name, const std::vector<int>& shape, size_t numel) {
    h += "," + json_string(name) + ":{\"dtype\":\"F32\",\"shape\":" + shape_text(to_u64(shape)) +
         ",\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + numel * 4) + "]}";
    off += numel * 4;
  };
  const ParamSpec* wte = find_wte(table);
  for (const ParamSpec& p : table) entry(p.name, p.shape, p.numel);
  if (wte) entry("lm_head.weight", wte->shape, wte->numel);
  h += "}";
  while (h.size() % 8) h += ' ';
  const uint64_t n = h.size();
  out(&n, 8);
  out(h.data(), h.size());
  for (const ParamSpec& p : table) out(params + p.offset, p.numel * 4);
  if (wte) out(params + wte->offset, wte->numel * 4);
}

std::string safetensors_bytes(const std::vector<ParamSpec>& table, const float* params, const std::string& config_text) {
  std::string bytes;
  write_safetensors([&](const void* p, size_t n) { bytes.append(static_cast<const char*>(p), n); }, table, params,
                    config_text);
  return bytes;
}

std::vector<float> read_safetensors(const std::string& path, const std::vector<ParamSpec>& expected) {
  std::string bytes = read_file(path);
  return safetensors_tensors(parse_safetensors(bytes, path), bytes, path, expected);
}

}  // namespace ckpt
}  // namespace tg
