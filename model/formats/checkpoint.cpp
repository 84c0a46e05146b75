// model/formats/checkpoint.cpp: state.bin and checkpoint directories (see model/formats/checkpoint.h).
#include "checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "../../data/errors.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files are little endian and floats are copied as they lie in memory");

namespace tg {
namespace ckpt {
namespace fs = std::filesystem;

namespace {

const char kMagic[8] = {'T', 'G', 'S', 'T', 'A', 'T', 'E', '\0'};
const char* const kWeightsFile = "model.safetensors";
const char* const kStateFile = "state.bin";
const std::vector<std::string> kRequired1 = {"CONF", "STEP", "ADAM", "WSUM", "RNG ", "LOSS"};
const std::vector<std::string> kRequired2 = {"CONF", "STEP", "ADAM", "WSUM", "RNG ", "LOSS", "DATA", "MTRC"};

using Sink = std::function<void(const void* data, size_t n)>;

// ---- little-endian scalars and arrays

void put_u32(std::string& s, uint32_t x) { s.append(reinterpret_cast<const char*>(&x), 4); }
void put_u64(std::string& s, uint64_t x) { s.append(reinterpret_cast<const char*>(&x), 8); }
uint32_t get_u32(const char* p) { uint32_t x; std::memcpy(&x, p, 4); return x; }
uint64_t get_u64(const char* p) { uint64_t x; std::memcpy(&x, p, 8); return x; }

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

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// ---- state.bin

// A section whose payload is the concatenation of parts (pointer, bytes), streamed.
void put_section(const Sink& out, const char* tag, const std::vector<std::pair<const void*, size_t>>& parts) {
  uint64_t len = 0;
  uint32_t crc = 0;
  for (const auto& p : parts) {
    len += p.second;
    crc = crc32(p.first, p.second, crc);
  }
  out(tag, 4);
  out(&len, 8);
  for (const auto& p : parts) out(p.first, p.second);
  out(&crc, 4);
}

void put_section(const Sink& out, const char* tag, const std::string& payload) {
  put_section(out, tag, {{payload.data(), payload.size()}});
}

void write_state(const Sink& out, const CheckpointInfo& c, const float* m, const float* v, size_t n,
                 uint32_t weights_crc) {
  std::string head(kMagic, 8), p;
  put_u32(head, kFormatVersion);
  out(head.data(), head.size());
  put_section(out, "CONF", config_to_text(c.config));
  put_u32(p, c.step);
  put_u32(p, c.steps_done);
  put_u32(p, c.bad_steps);
  put_section(out, "STEP", p);
  put_section(out, "ADAM", {{m, n * sizeof(float)}, {v, n * sizeof(float)}});
  p.clear();
  put_u32(p, weights_crc);
  put_section(out, "WSUM", p);
  p.clear();
  put_u64(p, c.seed);
  put_section(out, "RNG ", p);
  p.clear();
  put_u32(p, (uint32_t)c.losses.size());
  p.append(reinterpret_cast<const char*>(c.losses.data()), c.losses.size() * sizeof(double));
  put_section(out, "LOSS", p);
  put_section(out, "DATA", c.data_sha256 + "\n" + c.data_path);
  p.clear();
  for (const std::string& line : c.unlogged) p += line + "\n";
  put_section(out, "MTRC", p);
}

// A parsed state.bin: the info, where its AdamW arrays lie in the bytes, and WSUM.
struct State {
  CheckpointInfo info;
  size_t adam_offset = 0, adam_floats = 0;  // m at adam_offset, v after it: adam_floats each
  uint32_t weights_crc = 0;
};

// A float of a message: "nan", "-inf", "-1", "3.5e+38".
std::string float_text(float x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}

// The AdamW moments at p (m then v, n floats each) as AdamW keeps them: m finite (a running
// mean of gradients), v finite and >= 0 (a running mean of their squares). Anything else makes
// the first update NaN; the training stops there without naming the file.
void check_moments(const std::string& path, const char* p, size_t n) {
  for (size_t i = 0; i < 2 * n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + 4 * i, 4);
    const bool is_v = i >= n, finite = (bits & 0x7f800000u) != 0x7f800000u;
    const bool negative = (bits >> 31) && (bits & 0x7fffffffu);  // -0 is 0
    if (finite && !(is_v && negative)) continue;
    float x;
    std::memcpy(&x, &bits, 4);
    damaged(path,
            std::string("holds AdamW ") + (is_v ? "second moment v[" + std::to_string(i - n) : "first moment m[" + std::to_string(i)) +
                "] = " + float_text(x) + " in its 'ADAM' section",
            "finite moments and v >= 0, as AdamW keeps them (m a running mean of gradients, v of their squares)");
  }
}

bool is_hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'); });
}

State parse_state(const std::string& b, const std::string& path) {
  const std::string layout =
      "a complete state.bin (magic TGSTATE, format version, sections CONF STEP ADAM WSUM RNG LOSS DATA MTRC)";
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
  for (const std::string& tag : version == 1 ? kRequired1 : kRequired2)
    if (!sec.count(tag))
      damaged(path, "has no '" + tag + "' section (truncated, or not written by train_gpt)", layout);

  auto payload = [&](const char* tag) { return b.data() + sec[tag].first; };
  auto text = [&](const char* tag) { return std::string(payload(tag), sec[tag].second); };
  auto size_is = [&](const char* tag, bool ok, const std::string& expected) {
    if (!ok)
      damaged(path, std::string("has a '") + tag + "' section of " + std::to_string(sec[tag].second) + " bytes",
              expected);
  };
  State s;
  CheckpointInfo& c = s.info;
  try {
    c.config = config_from_text(text("CONF"));
  } catch (const InputError& e) {
    throw InputError("checkpoint file " + path + ": " + e.what());
  }
  try {
    validate(c.config);
  } catch (const InputError& e) {
    refused_config("checkpoint file " + path, e.what(),
                   "the file is damaged or crafted: delete its checkpoint directory to resume from an older one");
  }
  const size_t step_bytes = version == 1 ? 8 : 12;
  size_is("STEP", sec["STEP"].second == step_bytes, std::to_string(step_bytes) + " bytes (next step, steps done" +
                                                        (version == 1 ? ")" : ", non-finite steps in a row)"));
  c.step = get_u32(payload("STEP"));
  c.steps_done = get_u32(payload("STEP") + 4);
  if (version > 1) c.bad_steps = get_u32(payload("STEP") + 8);
  size_t adam = sec["ADAM"].second;
  size_is("ADAM", adam % 8 == 0, "two float arrays of equal length (m, v)");
  s.adam_offset = sec["ADAM"].first;
  s.adam_floats = adam / 8;
  check_moments(path, b.data() + s.adam_offset, s.adam_floats);
  size_is("WSUM", sec["WSUM"].second == 4, "4 bytes (a CRC-32)");
  s.weights_crc = get_u32(payload("WSUM"));
  size_is("RNG ", sec["RNG "].second == 8, "8 bytes (the seed)");
  c.seed = get_u64(payload("RNG "));
  size_t loss = sec["LOSS"].second;
  size_is("LOSS", loss >= 4 && (loss - 4) % 8 == 0 && (loss - 4) / 8 == get_u32(payload("LOSS")),
          "a u32 count and that many doubles");
  c.losses = get_array<double>(payload("LOSS") + 4, (loss - 4) / 8);
  if (version == 1) return s;
  // the path is one the OS can open: at most PATH_MAX bytes (so is every message naming it)
  size_is("DATA", sec["DATA"].second <= 65 + PATH_MAX,
          "the data file's sha256 (64 hex digits), a newline and its absolute path of at most " +
              std::to_string(PATH_MAX) + " bytes");
  const std::string data = text("DATA");
  const size_t nl = data.find('\n');
  c.data_sha256 = data.substr(0, nl);
  if (nl == std::string::npos || !is_hex64(c.data_sha256) || nl + 1 == data.size() || data[nl + 1] != '/')
    damaged(path, "has a bad 'DATA' section '" + printable(data) + "'",
            "the data file's sha256 (64 hex digits), a newline and its absolute path");
  c.data_path = data.substr(nl + 1);
  const std::string lines = text("MTRC");
  for (size_t at = 0; at < lines.size();) {
    const size_t end = lines.find('\n', at);
    if (end == std::string::npos)
      damaged(path, "has an unterminated line in its 'MTRC' section", "metrics lines, each ending in a newline");
    c.unlogged.push_back(lines.substr(at, end - at));
    at = end + 1;
  }
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
  std::snprintf(b, sizeof b,
                "n_layer=%d n_head=%d n_embd=%d block_size=%d vocab_size=%d bias=%s dropout=%.17g gelu=%s",
                c.n_layer, c.n_head, c.n_embd, c.block_size, vocab, c.bias ? "true" : "false", c.dropout,
                name(c.gelu));
  return b;
}

// The vocabulary a weights file's metadata holds ("" when it holds none).
std::string vocab_of(const StFile& f) {
  auto it = f.metadata.find(kVocabKey);
  return it == f.metadata.end() ? "" : it->second;
}

// The state and the weights' bytes of a checkpoint directory, both parsed, paired by WSUM.
struct Files {
  State state;
  std::string weights;
  StFile header;
};

Files read_files(const std::string& dir) {
  const std::string state_path = join(dir, kStateFile), weights_path = join(dir, kWeightsFile);
  Files f;
  f.state = parse_state(read_file(state_path), state_path);
  f.weights = read_file(weights_path);
  f.header = parse_safetensors(f.weights, weights_path);
  check_finite(f.header, f.weights, weights_path);
  const uint32_t crc = crc32(f.weights.data(), f.weights.size());
  if (crc != f.state.weights_crc) not_paired(dir, crc, f.state.weights_crc);
  return f;
}

}  // namespace

std::string ckpt_name(uint32_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "ckpt-%08" PRIu32, step);
  return b;
}

std::string state_bytes(const CheckpointInfo& info, const float* m, const float* v, size_t n, uint32_t weights_crc) {
  std::string bytes;
  write_state([&](const void* p, size_t k) { bytes.append(static_cast<const char*>(p), k); }, info, m, v, n,
              weights_crc);
  return bytes;
}

Checkpoint parse_state_bytes(const std::string& bytes, const std::string& path) {
  State s = parse_state(bytes, path);
  Checkpoint c;
  static_cast<CheckpointInfo&>(c) = std::move(s.info);
  c.m = get_array<float>(bytes.data() + s.adam_offset, s.adam_floats);
  c.v = get_array<float>(bytes.data() + s.adam_offset + s.adam_floats * sizeof(float), s.adam_floats);
  return c;
}

std::string save_checkpoint(const std::string& out_dir, const CheckpointInfo& info, const StateView& state,
                            const std::vector<ParamSpec>& table, int keep) {
  const size_t n = param_count(table);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec)
    throw RuntimeError("cannot create checkpoint directory " + out_dir + ": " + ec.message() +
                       "; expected a writable path; pass another --out-dir or fix its permissions");
  const std::string final_dir = join(out_dir, ckpt_name(info.step)), tmp_dir = final_dir + ".tmp";
  fs::remove_all(tmp_dir, ec);
  if (!ec) fs::create_directory(tmp_dir, ec);
  if (ec)
    throw RuntimeError("cannot create " + tmp_dir + ": " + ec.message() +
                       "; expected a writable directory; check the permissions and free space of " + out_dir);

  // both files straight from the arrays: no copy of them in memory
  AtomicFile weights(join(tmp_dir, kWeightsFile));
  write_safetensors([&](const void* p, size_t k) { weights.write(p, k); }, table, state.params,
                    model_text(info.config, table), info.vocab);
  const uint32_t weights_crc = weights.crc();
  weights.commit();
  AtomicFile st(join(tmp_dir, kStateFile));
  write_state([&](const void* p, size_t k) { st.write(p, k); }, info, state.m, state.v, n, weights_crc);
  st.commit();

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
  if (keep <= 0) return final_dir;
  // the newest keep intact ones stay: a damaged one (skipped by every resume) neither counts
  // nor is deleted while newer than they are, so it cannot push out a checkpoint resumes need.
  // Each is read whole for its damage once a process at most: the ones this process wrote, or
  // found intact, are remembered (a GPT-2 124M checkpoint is 1.5 GB)
  static std::set<std::string> intact_known;
  intact_known.insert(final_dir);
  std::vector<std::pair<uint32_t, std::string>> all = list_checkpoints(out_dir);
  int intact = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (intact < keep) {
      if (intact_known.count(all[i].second) || checkpoint_damage(all[i].second, all[i].first).empty()) {
        intact_known.insert(all[i].second);
        ++intact;
      }
      continue;
    }
    if (all[i].first == info.step) continue;
    intact_known.erase(all[i].second);
    // renamed to *.tmp first, so a crash while deleting leaves no half checkpoint behind
    std::string doomed = all[i].second + ".tmp";
    const std::string& victim = ::rename(all[i].second.c_str(), doomed.c_str()) == 0 ? doomed : all[i].second;
    fs::remove_all(victim, ec);
  }
  return final_dir;
}

std::string save_checkpoint(const std::string& out_dir, const Checkpoint& c, const std::vector<ParamSpec>& table,
                            int keep) {
  const size_t n = param_count(table);
  if (c.params.size() != n || c.m.size() != n || c.v.size() != n)
    throw RuntimeError("save_checkpoint got " + std::to_string(c.params.size()) + " params, " +
                       std::to_string(c.m.size()) + " m, " + std::to_string(c.v.size()) + " v; expected " +
                       std::to_string(n) + " each (param_count of the table); this is a bug in train_gpt");
  return save_checkpoint(out_dir, c, StateView{c.params.data(), c.m.data(), c.v.data()}, table, keep);
}

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

std::string checkpoint_damage(const std::string& ckpt_dir, long long name_step) {
  try {
    Files f = read_files(ckpt_dir);
    // a copy or rename under another step's name would be taken for that step, and resumed from
    // again and again while the run deletes its newer checkpoints
    if (name_step >= 0 && f.state.info.step != name_step)
      throw InputError("checkpoint " + ckpt_dir + " holds step " + std::to_string(f.state.info.step) + "; expected step " +
                       std::to_string(name_step) + " (its name); it was renamed or copied from another step: rename it " +
                       ckpt_name(f.state.info.step) + " or delete it");
    if (f.state.adam_floats != model_numel(f.header))
      another_model(ckpt_dir, "its AdamW state holds " + std::to_string(f.state.adam_floats) + " floats per moment",
                    std::to_string(model_numel(f.header)) + " (the weights' element count)");
    return "";
  } catch (const InputError& e) {
    return e.what();
  }
}

std::string latest_checkpoint(const std::string& out_dir, std::vector<std::string>* skipped) {
  for (const auto& c : list_checkpoints(out_dir)) {
    const std::string damage = checkpoint_damage(c.second, c.first);
    if (damage.empty()) return c.second;
    std::error_code ec;
    if (skipped && fs::exists(c.second, ec)) skipped->push_back(damage);  // (else a run deleted it meanwhile)
  }
  return "";
}

CheckpointInfo checkpoint_info(const std::string& ckpt_dir) {
  const std::string state_path = join(ckpt_dir, kStateFile);
  CheckpointInfo info = parse_state(read_file(state_path), state_path).info;
  info.vocab = vocab_of(read_safetensors_header(join(ckpt_dir, kWeightsFile)));
  return info;
}

Config checkpoint_config(const std::string& ckpt_dir) { return checkpoint_info(ckpt_dir).config; }

Checkpoint load_checkpoint(const std::string& ckpt_dir, const std::vector<ParamSpec>& table) {
  Checkpoint c;
  {
    Files f = read_files(ckpt_dir);
    c.params = safetensors_tensors(f.header, f.weights, join(ckpt_dir, kWeightsFile), table);
    const size_t n = param_count(table);
    if (f.state.adam_floats != n)
      another_model(ckpt_dir, "its AdamW state holds " + std::to_string(f.state.adam_floats) + " floats per moment",
                    std::to_string(n) + " (the parameter count)");
    static_cast<CheckpointInfo&>(c) = std::move(f.state.info);
    c.vocab = vocab_of(f.header);
  }
  // state.bin again, for its arrays only, so that one file's bytes are held at a time
  const std::string state_path = join(ckpt_dir, kStateFile);
  Checkpoint s = parse_state_bytes(read_file(state_path), state_path);
  c.m = std::move(s.m);
  c.v = std::move(s.v);
  check_config(ckpt_dir, c.config, table);
  return c;
}

}  // namespace ckpt
}  // namespace tg
