// model/checkpoint.cpp: state.bin and checkpoint directories (see model/checkpoint.h).
#include "checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
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

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string ckpt_name(uint32_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "ckpt-%08" PRIu32, step);
  return b;
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
    State s = parse_state(read_file(state_path), state_path);
    std::string wb = read_file(weights_path);
    StFile f = parse_safetensors(wb, weights_path);
    return crc32(wb.data(), wb.size()) == s.weights_crc && s.ck.m.size() == model_numel(f);
  } catch (const InputError&) {
    return false;
  }
}

}  // namespace

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
  return parse_state(read_file(state_path), state_path).ck.config;
}

Checkpoint load_checkpoint(const std::string& ckpt_dir, const std::vector<ParamSpec>& table) {
  const std::string state_path = join(ckpt_dir, kStateFile), weights_path = join(ckpt_dir, kWeightsFile);
  State s = parse_state(read_file(state_path), state_path);
  std::string wb = read_file(weights_path);
  StFile f = parse_safetensors(wb, weights_path);
  uint32_t crc = crc32(wb.data(), wb.size());
  if (crc != s.weights_crc) not_paired(ckpt_dir, crc, s.weights_crc);
  Checkpoint c = std::move(s.ck);
  c.params = safetensors_tensors(f, wb, weights_path, table);
  const size_t n = param_count(table);
  if (c.m.size() != n)
    another_model(ckpt_dir, "its AdamW state holds " + std::to_string(c.m.size()) + " floats per moment",
                  std::to_string(n) + " (the parameter count)");
  check_config(ckpt_dir, c.config, table);
  return c;
}

}  // namespace ckpt
}  // namespace tg
