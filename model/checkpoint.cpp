// model/checkpoint.cpp: checkpoint files and directories (see model/checkpoint.h).
#include "checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "errors.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files are little endian and floats are copied as they lie in memory");

namespace tg {
namespace ckpt {
namespace fs = std::filesystem;

namespace {

const char kMagic[8] = {'T', 'G', 'S', 'T', 'A', 'T', 'E', '\0'};
const char* const kWeightsFile = "model.safetensors";
const char* const kStateFile = "state.bin";
const char* const kRequired[] = {"CONF", "STEP", "ADAM", "WSUM", "RNG ", "LOSS"};

// ---- little-endian scalars and float arrays

void put_u32(std::string& s, uint32_t x) { s.append(reinterpret_cast<const char*>(&x), 4); }
void put_u64(std::string& s, uint64_t x) { s.append(reinterpret_cast<const char*>(&x), 8); }
uint32_t get_u32(const char* p) { uint32_t x; std::memcpy(&x, p, 4); return x; }
uint64_t get_u64(const char* p) { uint64_t x; std::memcpy(&x, p, 8); return x; }

template <typename T>
void put_array(std::string& s, const std::vector<T>& v) {
  s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
std::vector<T> get_array(const char* p, size_t n) {
  std::vector<T> v(n);
  if (n) std::memcpy(v.data(), p, n * sizeof(T));
  return v;
}

std::string hex32(uint32_t x) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08" PRIx32, x);
  return b;
}

// Bytes read from a file, made safe for a one-line message (at most max characters).
std::string printable(const std::string& s, size_t max = 60) {
  std::string out;
  for (unsigned char ch : s) {
    if (out.size() >= max) { out += "..."; break; }
    if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
      out += (char)ch;
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", ch);
      out += b;
    }
  }
  return out;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<uint64_t> to_u64(const std::vector<int>& shape) {
  return std::vector<uint64_t>(shape.begin(), shape.end());
}

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string dir_of(const std::string& path) {
  std::string d = fs::path(path).parent_path().string();
  return d.empty() ? "." : d;
}

std::string ckpt_name(uint32_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "ckpt-%08" PRIu32, step);
  return b;
}

// A file read back is damaged: what, what was expected, and the way out.
[[noreturn]] void damaged(const std::string& path, const std::string& what, const std::string& expected) {
  throw InputError("checkpoint file " + path + " " + what + "; expected " + expected +
                   "; the file is damaged: delete its checkpoint directory to resume from an older one");
}

// The files belong to a model of another shape than the one being trained.
[[noreturn]] void another_model(const std::string& path, const std::string& what, const std::string& expected) {
  throw InputError("checkpoint " + path + " was written for another model: " + what + ", expected " + expected +
                   "; pass the same --n-layer/--n-head/--n-embd/--block-size/--bias (and --data) as the run "
                   "that wrote it");
}

std::string read_whole(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT)
      throw InputError("checkpoint file " + path + " does not exist; expected " + kWeightsFile + " and " +
                       kStateFile + " in a checkpoint directory; pass a ckpt-<step> directory written by train_gpt");
    throw InputError("cannot open checkpoint file " + path + ": " + std::strerror(e) +
                     "; expected a readable file; check its permissions");
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      ::close(fd);
      throw InputError("cannot read checkpoint file " + path + ": " + std::strerror(e) +
                       "; expected a readable regular file; pass a ckpt-<step> directory written by train_gpt");
    }
    if (r == 0) break;
    out.append(buf, (size_t)r);
  }
  ::close(fd);
  return out;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int e = fd < 0 ? errno : 0;
  if (fd >= 0) {
    if (::fsync(fd) != 0 && errno != EINVAL) e = errno;  // EINVAL: the filesystem cannot sync directories
    ::close(fd);
  }
  if (e)
    throw RuntimeError("cannot fsync directory " + dir + ": " + std::strerror(e) +
                       "; expected a writable directory on a working disk; check the disk and --out-dir");
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

// ---- safetensors

struct StTensor {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  uint64_t numel = 1;
  uint64_t begin = 0, end = 0;  // bytes, relative to the data start
};

struct StFile {
  std::vector<StTensor> tensors;
  std::map<std::string, std::string> metadata;
  size_t data_start = 0;
};

const std::string kBadHeader = "a safetensors header as train_gpt writes it ({\"name\": {\"dtype\", \"shape\", \"data_offsets\"}, ...})";

// Reads the header of a safetensors file in bytes and checks that every tensor's data lies
// inside the file (F32 tensors: exactly numel * 4 bytes).
StFile parse_safetensors(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 8)
    damaged(path, "is truncated to " + std::to_string(bytes.size()) + " bytes",
            "a safetensors file (an 8-byte header length, the header, the data)");
  uint64_t n = get_u64(bytes.data());
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
std::vector<float> extract(const StFile& f, const std::string& bytes, const std::string& path,
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

// ---- state.bin

void put_section(std::string& out, const char* tag, const std::string& payload) {
  out.append(tag, 4);
  put_u64(out, payload.size());
  out += payload;
  put_u32(out, crc32(payload.data(), payload.size()));
}

std::string state_bytes(const Checkpoint& c, uint32_t weights_crc) {
  std::string out(kMagic, 8), p;
  put_u32(out, kFormatVersion);
  put_section(out, "CONF", config_to_text(c.config));
  put_u32(p, c.step);
  put_u32(p, c.steps_done);
  put_section(out, "STEP", p);
  p.clear();
  put_array(p, c.m);
  put_array(p, c.v);
  put_section(out, "ADAM", p);
  p.clear();
  put_u32(p, weights_crc);
  put_section(out, "WSUM", p);
  p.clear();
  put_u64(p, c.seed);
  put_section(out, "RNG ", p);
  p.clear();
  put_u32(p, (uint32_t)c.losses.size());
  put_array(p, c.losses);
  put_section(out, "LOSS", p);
  return out;
}

struct State {
  Checkpoint ck;  // everything but params
  uint32_t weights_crc = 0;
};

State parse_state(const std::string& b, const std::string& path) {
  const std::string layout = "a complete state.bin (magic TGSTATE, format version, sections CONF STEP ADAM WSUM RNG LOSS)";
  if (b.size() < 8) damaged(path, "is truncated to " + std::to_string(b.size()) + " bytes", layout);
  if (std::memcmp(b.data(), kMagic, 8) != 0)
    throw InputError("checkpoint file " + path + " is not a train_gpt state file (it starts with \"" +
                     printable(b.substr(0, 8)) + "\"); expected the magic TGSTATE\\0; pass a checkpoint "
                     "directory written by train_gpt");
  if (b.size() < 12) damaged(path, "is truncated to " + std::to_string(b.size()) + " bytes", layout);
  uint32_t version = get_u32(b.data() + 8);
  if (version > kFormatVersion)
    throw InputError("checkpoint file " + path + " was written by a newer train_gpt (format " +
                     std::to_string(version) + ", this build reads up to " + std::to_string(kFormatVersion) +
                     "): expected format " + std::to_string(kFormatVersion) + " or older; use a newer train_gpt");
  if (version == 0) damaged(path, "has format version 0", "format 1 to " + std::to_string(kFormatVersion));

  std::map<std::string, std::pair<size_t, size_t>> sec;  // tag -> (payload offset, length)
  size_t pos = 12;
  while (pos < b.size()) {
    if (b.size() - pos < 12)
      damaged(path, "is truncated inside a section header at byte " + std::to_string(pos), layout);
    std::string tag = b.substr(pos, 4);
    uint64_t len = get_u64(b.data() + pos + 4);
    pos += 12;
    if (len > b.size() - pos || b.size() - pos - len < 4)
      damaged(path, "is truncated: section '" + printable(tag) + "' needs " + std::to_string(len) +
                        " + 4 bytes but " + std::to_string(b.size() - pos) + " are left",
              layout);
    uint32_t stored = get_u32(b.data() + pos + len), actual = crc32(b.data() + pos, (size_t)len);
    if (stored != actual)
      throw InputError("checkpoint file " + path + " is corrupted: section '" + printable(tag) +
                       "' has CRC-32 " + hex32(actual) + ", expected " + hex32(stored) +
                       " as stored; delete its checkpoint directory to resume from an older one");
    if (sec.count(tag)) damaged(path, "has section '" + printable(tag) + "' twice", "each section once");
    sec[tag] = {pos, (size_t)len};
    pos += (size_t)len + 4;
  }
  for (const char* tag : kRequired)
    if (!sec.count(tag))
      damaged(path, std::string("has no '") + tag + "' section (truncated, or not written by train_gpt)", layout);

  auto payload = [&](const char* tag) { return b.data() + sec[tag].first; };
  auto size_is = [&](const char* tag, bool ok, const std::string& expected) {
    if (!ok)
      damaged(path, std::string("has a '") + tag + "' section of " + std::to_string(sec[tag].second) + " bytes",
              expected);
  };
  State s;
  Checkpoint& c = s.ck;
  try {
    c.config = config_from_text(std::string(payload("CONF"), sec["CONF"].second));
  } catch (const InputError& e) {
    throw InputError("checkpoint file " + path + ": " + e.what());
  }
  size_is("STEP", sec["STEP"].second == 8, "8 bytes (next step, steps done)");
  c.step = get_u32(payload("STEP"));
  c.steps_done = get_u32(payload("STEP") + 4);
  size_t adam = sec["ADAM"].second;
  size_is("ADAM", adam % 8 == 0, "two float arrays of equal length (m, v)");
  c.m = get_array<float>(payload("ADAM"), adam / 8);
  c.v = get_array<float>(payload("ADAM") + adam / 2, adam / 8);
  size_is("WSUM", sec["WSUM"].second == 4, "4 bytes (a CRC-32)");
  s.weights_crc = get_u32(payload("WSUM"));
  size_is("RNG ", sec["RNG "].second == 8, "8 bytes (the seed)");
  c.seed = get_u64(payload("RNG "));
  size_t loss = sec["LOSS"].second;
  size_is("LOSS", loss >= 4 && (loss - 4) % 8 == 0 && (loss - 4) / 8 == get_u32(payload("LOSS")),
          "a u32 count and that many doubles");
  c.losses = get_array<double>(payload("LOSS") + 4, (loss - 4) / 8);
  return s;
}

[[noreturn]] void not_paired(const std::string& dir, uint32_t actual, uint32_t wanted) {
  throw InputError("checkpoint " + dir + ": " + kWeightsFile + " (CRC-32 " + hex32(actual) +
                   ") is not the weights file written with " + kStateFile + ", expected CRC-32 " + hex32(wanted) +
                   "; it was replaced or damaged: restore it, or delete the directory to resume from an older one");
}

// The model's dimensions read off the table, against those of config.
void check_config(const std::string& dir, const Config& c, const std::vector<ParamSpec>& table) {
  int n_layer = 0, n_embd = -1, block_size = -1;
  bool bias = false;
  for (const ParamSpec& p : table) {
    const std::string& n = p.name;
    if (n.size() > 12 && n.compare(n.size() - 12, 12, ".ln_1.weight") == 0) ++n_layer;
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0) bias = true;
    if (n == "transformer.wte.weight" && p.shape.size() == 2) n_embd = p.shape[1];
    if (n == "transformer.wpe.weight" && p.shape.size() == 2) block_size = p.shape[0];
  }
  auto dims = [](int l, int e, int t, bool b) {
    return "n_layer " + std::to_string(l) + ", n_embd " + std::to_string(e) + ", block_size " + std::to_string(t) +
           ", bias " + (b ? "true" : "false");
  };
  if (c.n_layer != n_layer || c.n_embd != n_embd || c.block_size != block_size || c.bias != bias)
    another_model(dir, "its config has " + dims(c.n_layer, c.n_embd, c.block_size, c.bias),
                  dims(n_layer, n_embd, block_size, bias));
}

// The short description in __metadata__.train_gpt_config.
std::string model_text(const Config& c, const std::vector<ParamSpec>& table) {
  int vocab = 0;
  for (const ParamSpec& p : table)
    if (p.name == "transformer.wte.weight" && !p.shape.empty()) vocab = p.shape[0];
  char b[256];
  std::snprintf(b, sizeof b, "n_layer=%d n_head=%d n_embd=%d block_size=%d vocab_size=%d bias=%s dropout=%.17g",
                c.n_layer, c.n_head, c.n_embd, c.block_size, vocab, c.bias ? "true" : "false", c.dropout);
  return b;
}

// ckpt-<digits> directories of out_dir (complete ones: no .tmp suffix), newest step first.
std::vector<std::pair<uint32_t, std::string>> list_checkpoints(const std::string& out_dir) {
  std::vector<std::pair<uint32_t, std::string>> out;
  std::error_code ec;
  fs::directory_iterator it(out_dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.size() < 13 || name.compare(0, 5, "ckpt-") != 0) continue;
    std::string digits = name.substr(5);
    if (digits.size() > 10 || !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      continue;
    unsigned long long step = std::strtoull(digits.c_str(), nullptr, 10);
    std::error_code e2;
    if (step > UINT32_MAX || !fs::is_directory(it->path(), e2)) continue;
    out.emplace_back((uint32_t)step, it->path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// Both files of a checkpoint directory read back intact and belong together.
bool intact(const std::string& dir) {
  try {
    std::string state_path = join(dir, kStateFile), weights_path = join(dir, kWeightsFile);
    State s = parse_state(read_whole(state_path), state_path);
    std::string wb = read_whole(weights_path);
    StFile f = parse_safetensors(wb, weights_path);
    return crc32(wb.data(), wb.size()) == s.weights_crc && s.ck.m.size() == model_numel(f);
  } catch (const InputError&) {
    return false;
  }
}

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](const std::string& op, int e, bool created) {
    if (created) ::unlink(tmp.c_str());
    throw RuntimeError("cannot write " + path + ": " + op + " failed: " + std::strerror(e) +
                       "; expected a writable directory with free space; check the permissions and free space of " +
                       dir_of(path));
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("creating " + tmp, errno, false);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + done, std::min<size_t>(bytes.size() - done, (size_t)1 << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : ENOSPC;  // a write of 0 bytes: the disk is full
      ::close(fd);
      fail("writing " + tmp, e, true);
    }
    done += (size_t)w;
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    fail("fsync of " + tmp, e, true);
  }
  if (::close(fd) != 0) fail("closing " + tmp, errno, true);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming " + tmp, errno, true);
  fsync_dir(dir_of(path));
}

// ---- config text

namespace {

// Calls f(name, field) for every field of Config, in declaration order. The size check makes
// a field added to Config (and forgotten here) a compile error on x86-64 Linux (libstdc++).
static_assert(sizeof(void*) != 8 || sizeof(Config) == 424,
              "Config changed: add the new field to each_field (model/checkpoint.cpp), then update this size");
template <typename C, typename F>
void each_field(C& c, F&& f) {
  f("preset", c.preset); f("data", c.data); f("device", c.device); f("attention", c.attention);
  f("precision", c.precision);
  f("out_dir", c.out_dir);
  f("n_layer", c.n_layer); f("n_head", c.n_head); f("n_embd", c.n_embd); f("block_size", c.block_size);
  f("bias", c.bias); f("dropout", c.dropout);
  f("batch_size", c.batch_size); f("max_iters", c.max_iters); f("lr", c.lr); f("min_lr", c.min_lr);
  f("warmup_iters", c.warmup_iters); f("lr_decay_iters", c.lr_decay_iters);
  f("weight_decay", c.weight_decay); f("beta1", c.beta1); f("beta2", c.beta2); f("grad_clip", c.grad_clip);
  f("eval_interval", c.eval_interval); f("eval_iters", c.eval_iters); f("log_interval", c.log_interval);
  f("ckpt_interval", c.ckpt_interval); f("resume", c.resume);
  f("seed", c.seed);
  f("sample_tokens", c.sample_tokens); f("prompt", c.prompt); f("temperature", c.temperature);
  f("top_k", c.top_k); f("top_p", c.top_p);
  f("sample", c.sample); f("ckpt", c.ckpt);
}

struct FieldWriter {
  std::string& out;
  void line(const char* name, const std::string& value) { out += std::string(name) + "=" + value + "\n"; }
  void operator()(const char* name, const std::string& v) {
    std::string e;
    for (unsigned char ch : v) {
      if (ch < 0x20 || ch >= 0x7f || ch == '%') {
        char b[4];
        std::snprintf(b, sizeof b, "%%%02X", ch);
        e += b;
      } else {
        e += (char)ch;
      }
    }
    line(name, e);
  }
  void operator()(const char* name, const int& v) { line(name, std::to_string(v)); }
  void operator()(const char* name, const bool& v) { line(name, v ? "true" : "false"); }
  void operator()(const char* name, const uint64_t& v) { line(name, std::to_string(v)); }
  void operator()(const char* name, const double& v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.17g", v);
    line(name, b);
  }
};

[[noreturn]] void bad_config(const std::string& what, const std::string& expected) {
  throw InputError("the saved config " + what + "; expected " + expected +
                   "; the state file is damaged or not from train_gpt: delete its checkpoint directory to "
                   "resume from an older one");
}

struct FieldReader {
  std::map<std::string, std::string>& values;

  const std::string& take(const char* name) {
    auto it = values.find(name);
    if (it == values.end()) bad_config(std::string("has no field ") + name, "a line for every field of the config");
    return it->second;
  }
  [[noreturn]] void bad(const char* name, const std::string& v, const std::string& expected) {
    bad_config(std::string("has ") + name + "=" + printable(v), expected);
  }
  void done(const char* name) { values.erase(name); }

  void operator()(const char* name, std::string& out) {
    const std::string& v = take(name);
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] != '%') { s += v[i]; continue; }
      auto hex = [&](char h) -> int {
        if (h >= '0' && h <= '9') return h - '0';
        if (h >= 'A' && h <= 'F') return h - 'A' + 10;
        if (h >= 'a' && h <= 'f') return h - 'a' + 10;
        return -1;
      };
      int hi = i + 2 < v.size() ? hex(v[i + 1]) : -1, lo = i + 2 < v.size() ? hex(v[i + 2]) : -1;
      if (hi < 0 || lo < 0) bad(name, v, "%XX escapes of two hex digits");
      s += (char)(hi * 16 + lo);
      i += 2;
    }
    out = s;
    done(name);
  }
  void operator()(const char* name, int& out) {
    const std::string& v = take(name);
    errno = 0;
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) || *end != '\0' || errno == ERANGE || x < INT_MIN ||
        x > INT_MAX)
      bad(name, v, "an integer");
    out = (int)x;
    done(name);
  }
  void operator()(const char* name, bool& out) {
    const std::string& v = take(name);
    if (v == "true") out = true;
    else if (v == "false") out = false;
    else bad(name, v, "true or false");
    done(name);
  }
  void operator()(const char* name, uint64_t& out) {
    const std::string& v = take(name);
    errno = 0;
    char* end = nullptr;
    unsigned long long x = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || v[0] < '0' || v[0] > '9' || *end != '\0' || errno == ERANGE)
      bad(name, v, "an integer from 0 to 2^64-1");
    out = x;
    done(name);
  }
  void operator()(const char* name, double& out) {
    const std::string& v = take(name);
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || v[0] == ' ' || *end != '\0') bad(name, v, "a number");
    out = x;
    done(name);
  }
};

}  // namespace

std::string config_to_text(const Config& c) {
  std::string out;
  each_field(c, FieldWriter{out});
  return out;
}

Config config_from_text(const std::string& text) {
  std::map<std::string, std::string> values;
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    ++line_no;
    size_t eq = line.find('=');
    if (eq == std::string::npos)
      bad_config("line " + std::to_string(line_no) + " '" + printable(line) + "' has no '='", "name=value lines");
    std::string name = line.substr(0, eq);
    if (!values.emplace(name, line.substr(eq + 1)).second)
      bad_config("names " + printable(name) + " twice", "each field once");
  }
  Config c;
  each_field(c, FieldReader{values});
  if (!values.empty())
    bad_config("has an unknown field " + printable(values.begin()->first),
               "only the fields of this train_gpt's config (a newer train_gpt wrote it?)");
  return c;
}

// ---- safetensors

std::string safetensors_bytes(const std::vector<ParamSpec>& table, const float* params, const std::string& config_text) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\",\"train_gpt_config\":" + json_string(config_text) + "}";
  uint64_t off = 0;
  auto entry = [&](const std::string& name, const std::vector<int>& shape, size_t numel) {
    h += "," + json_string(name) + ":{\"dtype\":\"F32\",\"shape\":" + shape_text(to_u64(shape)) +
         ",\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + numel * 4) + "]}";
    off += numel * 4;
  };
  const ParamSpec* wte = nullptr;
  for (const ParamSpec& p : table) {
    entry(p.name, p.shape, p.numel);
    if (p.name == "transformer.wte.weight") wte = &p;
  }
  if (wte) entry("lm_head.weight", wte->shape, wte->numel);
  h += "}";
  while (h.size() % 8) h += ' ';
  std::string out;
  out.reserve(8 + h.size() + off);
  put_u64(out, h.size());
  out += h;
  for (const ParamSpec& p : table) out.append(reinterpret_cast<const char*>(params + p.offset), p.numel * 4);
  if (wte) out.append(reinterpret_cast<const char*>(params + wte->offset), wte->numel * 4);
  return out;
}

std::vector<float> read_safetensors(const std::string& path, const std::vector<ParamSpec>& expected) {
  std::string bytes = read_whole(path);
  return extract(parse_safetensors(bytes, path), bytes, path, expected);
}

// ---- checkpoint directories

void save_checkpoint(const std::string& out_dir, const Checkpoint& c, const std::vector<ParamSpec>& table, int keep) {
  const size_t n = param_count(table);
  if (c.params.size() != n || c.m.size() != n || c.v.size() != n)
    throw RuntimeError("save_checkpoint got " + std::to_string(c.params.size()) + " params, " +
                       std::to_string(c.m.size()) + " m, " + std::to_string(c.v.size()) + " v; expected " +
                       std::to_string(n) + " each (param_count of the table); this is a bug in train_gpt");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec)
    throw RuntimeError("cannot create checkpoint directory " + out_dir + ": " + ec.message() +
                       "; expected a writable path; pass another --out-dir or fix its permissions");
  const std::string name = ckpt_name(c.step), final_dir = join(out_dir, name), tmp_dir = final_dir + ".tmp";
  fs::remove_all(tmp_dir, ec);
  if (!ec) fs::create_directory(tmp_dir, ec);
  if (ec)
    throw RuntimeError("cannot create " + tmp_dir + ": " + ec.message() +
                       "; expected a writable directory; check the permissions and free space of " + out_dir);

  const std::string weights = safetensors_bytes(table, c.params.data(), model_text(c.config, table));
  write_file_atomic(join(tmp_dir, kWeightsFile), weights);
  write_file_atomic(join(tmp_dir, kStateFile), state_bytes(c, crc32(weights.data(), weights.size())));

  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
    int e = errno;
    if (e == ENOTEMPTY || e == EEXIST) {  // the step was saved before: swap the two directories atomically
      if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
        e = 0;
        fs::remove_all(tmp_dir, ec);  // now the old one
      } else {
        e = errno;
      }
    }
    if (e)
      throw RuntimeError("cannot rename " + tmp_dir + " to " + final_dir + ": " + std::strerror(e) +
                         "; expected a writable --out-dir; check its permissions");
  }
  fsync_dir(out_dir);

  // best effort from here: the checkpoint is complete
  fs::directory_iterator it(out_dir, ec), end;
  std::vector<fs::path> stale;
  for (; !ec && it != end; it.increment(ec)) {
    std::string f = it->path().filename().string();
    if (f.size() > 9 && f.compare(0, 5, "ckpt-") == 0 && f.compare(f.size() - 4, 4, ".tmp") == 0)
      stale.push_back(it->path());
  }
  for (const fs::path& p : stale) fs::remove_all(p, ec);
  if (keep <= 0) return;
  std::vector<std::pair<uint32_t, std::string>> all = list_checkpoints(out_dir);
  for (size_t i = (size_t)keep; i < all.size(); ++i) {
    if (all[i].first == c.step) continue;
    // renamed to *.tmp first, so a crash while deleting leaves no half checkpoint behind
    std::string doomed = all[i].second + ".tmp";
    const std::string& victim = ::rename(all[i].second.c_str(), doomed.c_str()) == 0 ? doomed : all[i].second;
    fs::remove_all(victim, ec);
  }
}

std::string latest_checkpoint(const std::string& out_dir) {
  for (const auto& c : list_checkpoints(out_dir))
    if (intact(c.second)) return c.second;
  return "";
}

Config checkpoint_config(const std::string& ckpt_dir) {
  const std::string state_path = join(ckpt_dir, kStateFile);
  return parse_state(read_whole(state_path), state_path).ck.config;
}

Checkpoint load_checkpoint(const std::string& ckpt_dir, const std::vector<ParamSpec>& table) {
  const std::string state_path = join(ckpt_dir, kStateFile), weights_path = join(ckpt_dir, kWeightsFile);
  State s = parse_state(read_whole(state_path), state_path);
  std::string wb = read_whole(weights_path);
  StFile f = parse_safetensors(wb, weights_path);
  uint32_t crc = crc32(wb.data(), wb.size());
  if (crc != s.weights_crc) not_paired(ckpt_dir, crc, s.weights_crc);
  Checkpoint c = std::move(s.ck);
  c.params = extract(f, wb, weights_path, table);
  const size_t n = param_count(table);
  if (c.m.size() != n)
    another_model(ckpt_dir, "its AdamW state holds " + std::to_string(c.m.size()) + " floats per moment",
                  std::to_string(n) + " (the parameter count)");
  check_config(ckpt_dir, c.config, table);
  return c;
}

}  // namespace ckpt
}  // namespace tg
