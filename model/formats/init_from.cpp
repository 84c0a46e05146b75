// model/formats/init_from.cpp: --init-from (see model/formats/init_from.h).
#include "init_from.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "../../data/dataset.h"
#include "../../data/errors.h"
#include "checkpoint.h"
#include "ckpt_io.h"
#include "ckpt_lookup.h"
#include "hf_export.h"
#include "json_io.h"
#include "safetensors.h"

namespace tg {

namespace {

namespace fs = std::filesystem;

constexpr int32_t kLlmcMagic = 20240326;
// GPT-2's config.json is under a kilobyte: one above this is not one
constexpr uint64_t kMaxConfigJson = 1 << 20;
const char* const kKinds =
    "pass a Hugging Face GPT-2 model.safetensors (with its config.json), llm.c's gpt2_124M.bin or a train_gpt "
    "checkpoint";

[[noreturn]] void bad_file(const std::string& path, const std::string& what, const std::string& expected) {
  throw InputError("--init-from " + printable(path, 200) + " " + what + "; expected " + expected + "; " + kKinds);
}

// What an InputError of the checkpoint readers says was wrong (its text before "; expected"),
// without their "checkpoint file" prefix: the file here is not necessarily a checkpoint.
std::string what_of(const InputError& e) {
  std::string s = e.what();
  s = s.substr(0, s.find("; expected"));
  const std::string prefix = "checkpoint file ";
  return s.compare(0, prefix.size(), prefix) == 0 ? s.substr(prefix.size()) : s;
}

std::string shape_text(const std::vector<uint64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

std::vector<uint64_t> to_u64(const std::vector<int>& s) { return std::vector<uint64_t>(s.begin(), s.end()); }

std::string model_text(const ModelConfig& m) {
  return "n_layer " + std::to_string(m.n_layer) + ", n_head " + std::to_string(m.n_head) + ", n_embd " +
         std::to_string(m.n_embd) + ", block_size " + std::to_string(m.block_size) + ", vocab " +
         std::to_string(m.vocab_size);
}

// A model the file describes must be one train_gpt runs (validate()'s ranges), checked before
// anything is sized from it.
void check_model(const std::string& path, const ModelConfig& m) {
  Config c;
  apply_preset(c, "baby");
  c.out_dir = "out/baby";
  c.n_layer = m.n_layer;
  c.n_head = m.n_head;
  c.n_embd = m.n_embd;
  c.block_size = m.block_size;
  try {
    validate(c);
  } catch (const InputError& e) {
    bad_file(path, "describes a model train_gpt cannot build (" + what_of(e) + ")", "a GPT-2 model's shape");
  }
  if (m.vocab_size < 1 || m.vocab_size > (1 << 24) || m.vp() > (1 << 24))
    bad_file(path, "has a vocabulary of " + std::to_string(m.vocab_size) + " (padded " + std::to_string(m.vp()) + ")",
             "1 to 16777216 tokens");
}

float bf16_to_float(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp((float)man, -24);  // zero and subnormals
  uint32_t bits = sign | (exp == 31 ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// n values of dtype (F32, BF16, F16) at bytes[at] as floats into out.
void decode(const char* at, uint64_t n, const std::string& dtype, float* out) {
  if (dtype == "F32") {
    std::memcpy(out, at, n * 4);
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, at + 2 * i, 2);
    out[i] = dtype == "BF16" ? bf16_to_float(h) : f16_to_float(h);
  }
}

// The n weights at out, read from the file at path as tensor name: each must be finite (a NaN
// or an infinity would show only later, as logits that are not finite).
void check_finite(const std::string& path, const std::string& name, const float* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i)
    if (!std::isfinite(out[i])) {
      char b[32];
      std::snprintf(b, sizeof b, "%g", out[i]);
      bad_file(path, "holds a weight that is not finite: " + name + "[" + std::to_string(i) + "] = " + b,
               "finite weights");
    }
}

bool has_suffix(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// "h.3.attn.bias" / "h.3.attn.masked_bias": the causal-mask buffers of older GPT-2 files.
bool is_mask_buffer(const std::string& name) {
  return name.compare(0, 2, "h.") == 0 && (has_suffix(name, ".attn.bias") || has_suffix(name, ".attn.masked_bias"));
}

// ---- Hugging Face GPT-2

int json_int(const jsonio::Value& j, const char* key, const std::string& path, bool required, int fallback = 0) {
  const jsonio::Value v = j[key];
  if (!j.contains(key) || v.is_null()) {
    if (required) bad_file(path, std::string("has no ") + key, "Hugging Face's GPT-2 config.json");
    return fallback;
  }
  if (!v.is_number_integer() || v.get_int64() < 1 || v.get_int64() > (1 << 24))
    bad_file(path, std::string("has ") + key + " " + printable(v.dump()), std::string(key) + " a positive integer");
  return (int)v.get_int64();
}

// A Hugging Face GPT-2 weights file, read whole: its tensors by GPT-2's name without
// "transformer.", the tied head and the attention mask buffers set aside.
struct HfWeights {
  std::string path, bytes;
  ckpt::StFile f;
  std::map<std::string, const ckpt::StTensor*> by_name;  // into f.tensors
  const ckpt::StTensor* head = nullptr;                  // lm_head.weight, when present

  explicit HfWeights(const std::string& st_path) : path(st_path) {
    try {
      bytes = ckpt::read_file(st_path);
      f = ckpt::parse_safetensors(bytes, st_path);
    } catch (const InputError& e) {
      bad_file(st_path, "is not a readable safetensors file: " + what_of(e), "a complete safetensors file");
    }
    if (f.metadata.count("train_gpt_config"))
      bad_file(st_path, "is the weights file of a train_gpt checkpoint (nanoGPT's layout, not GPT-2's)",
               "its checkpoint directory");
    for (const ckpt::StTensor& t : f.tensors) {
      if (t.name == "lm_head.weight") {
        head = &t;
        continue;
      }
      std::string name = t.name;
      if (name.compare(0, 12, "transformer.") == 0) name = name.substr(12);
      if (is_mask_buffer(name)) continue;
      if (!by_name.emplace(name, &t).second)
        bad_file(st_path, "has tensor " + printable(name) + " twice (with and without \"transformer.\")",
                 "each tensor once");
    }
  }
  HfWeights(const HfWeights&) = delete;
  HfWeights& operator=(const HfWeights&) = delete;

  const ckpt::StTensor* find(const std::string& name) const {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  }
  const char* data(const ckpt::StTensor& t) const { return bytes.data() + f.data_start + t.begin; }
};

// The model's shape from GPT-2's config.json (and the GELU form its activation_function names),
// refusing what GPT-2's architecture is not.
void hf_shape_from_config(const std::string& config_path, InitSource& s) {
  ModelConfig& m = s.model;
  uint64_t size = 0;
  const std::string text = ckpt::read_file(config_path, kMaxConfigJson + 1, &size);
  if (size > kMaxConfigJson)
    bad_file(config_path, "is " + std::to_string(size) + " bytes", "Hugging Face's GPT-2 config.json, at most " +
                                                                      std::to_string(kMaxConfigJson) + " bytes");
  const jsonio::Value j = jsonio::parse(text);
  if (j.is_discarded() || !j.is_object()) bad_file(config_path, "is not a JSON object", "Hugging Face's GPT-2 config.json");
  if (j.contains("model_type") && !(j["model_type"].is_string() && j["model_type"].get_string() == "gpt2"))
    bad_file(config_path, "has model_type " + printable(j["model_type"].dump()), "model_type \"gpt2\"");
  m.n_layer = json_int(j, "n_layer", config_path, true);
  m.n_head = json_int(j, "n_head", config_path, true);
  m.n_embd = json_int(j, "n_embd", config_path, true);
  m.vocab_size = json_int(j, "vocab_size", config_path, true);
  m.block_size = json_int(j, "n_positions", config_path, !j.contains("n_ctx"), json_int(j, "n_ctx", config_path, false));
  if (json_int(j, "n_inner", config_path, false, 4 * m.n_embd) != 4 * m.n_embd)
    bad_file(config_path, "has n_inner " + j["n_inner"].dump(), "null or 4 n_embd (GPT-2's MLP)");
  // a key of another type than GPT2Config's is refused, never read as something else
  auto typed = [&](const char* key, bool ok, const char* expected) {
    if (j.contains(key) && !j[key].is_null() && !ok)
      bad_file(config_path, std::string("has ") + key + " " + printable(j[key].dump()), expected);
  };
  typed("activation_function", j.contains("activation_function") && j["activation_function"].is_string(), "a string");
  typed("scale_attn_weights", j.contains("scale_attn_weights") && j["scale_attn_weights"].is_boolean(), "true or false");
  typed("scale_attn_by_inverse_layer_idx",
        j.contains("scale_attn_by_inverse_layer_idx") && j["scale_attn_by_inverse_layer_idx"].is_boolean(), "true or false");
  auto flag = [&](const char* key, bool fallback) { return j.contains(key) && j[key].is_boolean() ? j[key].get_bool() : fallback; };
  const std::string act = j.contains("activation_function") && j["activation_function"].is_string()
                              ? j["activation_function"].get_string()
                              : "gelu_new";
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") s.gelu = GeluForm::Tanh;
  else if (act == "gelu") s.gelu = GeluForm::Erf;
  else bad_file(config_path, "has activation_function " + printable(act), "gelu_new (tanh form) or gelu (erf)");
  if (j.contains("layer_norm_epsilon") &&
      (!j["layer_norm_epsilon"].is_number() || std::fabs(j["layer_norm_epsilon"].get_double() - 1e-5) > 1e-12))
    bad_file(config_path, "has layer_norm_epsilon " + printable(j["layer_norm_epsilon"].dump()),
             "1e-5 (GPT-2's, the one train_gpt uses)");
  if (flag("scale_attn_by_inverse_layer_idx", false) || !flag("scale_attn_weights", true))
    bad_file(config_path, "scales attention otherwise than GPT-2", "scale_attn_weights true, scale_attn_by_inverse_layer_idx false");
}

// Without config.json: the shape from the tensors, n_head from --n-head.
void hf_shape_from_tensors(const HfWeights& w, int n_head_flag, ModelConfig& m) {
  const ckpt::StTensor* wte = w.find("wte.weight");
  const ckpt::StTensor* wpe = w.find("wpe.weight");
  if (!wte || !wpe || wte->shape.size() != 2 || wpe->shape.size() != 2 || wte->shape[1] != wpe->shape[1])
    bad_file(w.path, "has no config.json beside it and no 2-D wte.weight and wpe.weight of one width",
             "GPT-2's tensors, or its config.json");
  if (n_head_flag <= 0)
    bad_file(w.path, "has no config.json beside it, which would give n_head", "config.json, or --n-head N");
  int layers = 0;
  while (w.find("h." + std::to_string(layers) + ".ln_1.weight") && layers < (1 << 20)) ++layers;
  const uint64_t big = 1 << 24;
  m.vocab_size = (int)std::min<uint64_t>(wte->shape[0], big + 1);
  m.n_embd = (int)std::min<uint64_t>(wte->shape[1], big + 1);
  m.block_size = (int)std::min<uint64_t>(wpe->shape[0], big + 1);
  m.n_layer = layers;
  m.n_head = n_head_flag;
}

// Every tensor of the model m, by name and shape, decoded into params (Conv1D weights
// transposed to Linear's layout); a tensor missing, misshapen, of another dtype or left over
// is refused. described: the shape's origin, for the messages.
void hf_copy_params(const HfWeights& w, const ModelConfig& m, const std::string& described, std::vector<float>& params) {
  const std::vector<ParamSpec> table = param_table(m);
  params.assign(param_count(table), 0.0f);
  std::map<std::string, bool> used;
  std::vector<float> tmp;
  for (const ParamSpec& p : table) {
    const std::string name = p.name.substr(12);  // without "transformer."
    const bool conv = is_conv1d_weight(p);
    const std::vector<uint64_t> want = conv ? std::vector<uint64_t>{(uint64_t)p.shape[1], (uint64_t)p.shape[0]} : to_u64(p.shape);
    const ckpt::StTensor* t = w.find(name);
    if (!t) bad_file(w.path, "has no tensor " + name, name + " of shape " + shape_text(want) + described);
    if (t->shape != want)
      bad_file(w.path, "has tensor " + name + " of shape " + shape_text(t->shape), "shape " + shape_text(want) + described);
    if (t->dtype != "F32" && t->dtype != "BF16" && t->dtype != "F16")
      bad_file(w.path, "has tensor " + name + " of dtype " + printable(t->dtype), "F32, BF16 or F16");
    if (t->end - t->begin != t->numel * (t->dtype == "F32" ? 4 : 2))
      bad_file(w.path, "has tensor " + name + " whose data_offsets do not hold its shape in " + t->dtype,
               "data_offsets of numel x the dtype's size");
    used[name] = true;
    float* out = params.data() + p.offset;
    if (!conv) {
      decode(w.data(*t), p.numel, t->dtype, out);
      check_finite(w.path, t->name, out, p.numel);
      continue;
    }
    tmp.resize(p.numel);
    decode(w.data(*t), p.numel, t->dtype, tmp.data());
    check_finite(w.path, t->name, tmp.data(), p.numel);  // its elements in the file's order
    const int rows = p.shape[0], cols = p.shape[1];  // Linear (out, in) from Conv1D (in, out)
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) out[(size_t)r * cols + c] = tmp[(size_t)c * rows + r];
  }
  for (const auto& [name, t] : w.by_name)
    if (!used.count(name))
      bad_file(w.path, "has tensor " + printable(name) + " " + shape_text(t->shape) + ", which this GPT-2" + described +
                           " has not", "only GPT-2's tensors");
}

// lm_head.weight, where the file has one, must be wte.weight byte for byte (GPT-2 ties them).
void hf_check_tied_head(const HfWeights& w) {
  if (!w.head) return;
  const ckpt::StTensor* head = w.head;
  const ckpt::StTensor* wte = w.find("wte.weight");
  if (head->shape != wte->shape || head->dtype != wte->dtype || head->end - head->begin != wte->end - wte->begin)
    bad_file(w.path, "has lm_head.weight " + shape_text(head->shape) + " " + printable(head->dtype) + " unlike wte.weight",
             "a head tied to wte (GPT-2's), or none");
  if (std::memcmp(w.data(*head), w.data(*wte), head->end - head->begin) != 0)
    bad_file(w.path, "has an lm_head.weight that differs from wte.weight (an untied head)",
             "a head tied to wte, as GPT-2's and train_gpt's are");
}

// The characters of a train_gpt export's vocabulary (train_gpt_vocab.json), "" when absent.
std::string hf_export_vocab(const std::string& vocab_path, int vocab_size) {
  std::error_code ec;
  if (!fs::exists(vocab_path, ec)) return "";
  const jsonio::Value v = jsonio::parse(ckpt::read_file(vocab_path));
  if (v.is_discarded() || !v.is_array() || (int)v.size() != vocab_size)
    bad_file(vocab_path, "is not a JSON array of " + std::to_string(vocab_size) + " strings",
             "the vocabulary --export-hf writes");
  std::string vocab;
  for (const jsonio::Value& ch : v.elements()) {
    if (!ch.is_string()) bad_file(vocab_path, "holds something other than strings", "the vocabulary --export-hf writes");
    vocab += ch.get_string();
  }
  return vocab;
}

// A Hugging Face GPT-2: the weights file, its shape (config.json beside it, else the tensors and
// --n-head), every tensor into train_gpt's layout, the tied head checked, and the characters of a
// train_gpt export's vocabulary when they are beside it.
InitSource read_hf(const std::string& st_path, const std::string& config_path, int n_head_flag) {
  InitSource s;
  s.kind = "Hugging Face GPT-2";
  s.path = st_path;
  const HfWeights w(st_path);
  s.model.bias = true;  // GPT-2 has every bias
  std::error_code ec;
  const bool has_config = fs::exists(config_path, ec);
  if (has_config) hf_shape_from_config(config_path, s);
  else hf_shape_from_tensors(w, n_head_flag, s.model);
  check_model(has_config ? config_path : st_path, s.model);
  const std::string described = has_config ? " (" + model_text(s.model) + " from config.json)" : "";
  hf_copy_params(w, s.model, described, s.params);
  hf_check_tied_head(w);
  s.vocab = hf_export_vocab((fs::path(config_path).parent_path() / "train_gpt_vocab.json").string(), s.model.vocab_size);
  return s;
}

// ---- llm.c

InitSource read_llmc(const std::string& path) {
  InitSource s;
  s.kind = "llm.c";
  s.path = path;
  s.gelu = GeluForm::Tanh;
  uint64_t size = 0;
  std::string bytes;
  try {
    bytes = ckpt::read_file(path, 1024, &size);
  } catch (const InputError& e) {
    bad_file(path, "cannot be read: " + what_of(e), "a readable file");
  }
  if (bytes.size() < 1024)
    bad_file(path, "is truncated: " + std::to_string(size) + " bytes, shorter than llm.c's header of 256 int32",
             "llm.c's gpt2_124M.bin as train_gpt2.py writes it");
  int32_t h[256];
  std::memcpy(h, bytes.data(), sizeof h);
  if (h[0] != kLlmcMagic)
    bad_file(path, "starts with " + std::to_string(h[0]) + ", not llm.c's model magic 20240326", "llm.c's gpt2_124M.bin");
  if (h[1] != 3 && h[1] != 5)
    bad_file(path, "is llm.c model version " + std::to_string(h[1]), "version 3 (fp32) or 5 (bf16), as llm.c writes now");
  ModelConfig& m = s.model;
  m.block_size = h[2];
  m.vocab_size = h[3];
  m.n_layer = h[4];
  m.n_head = h[5];
  m.n_embd = h[6];
  m.bias = true;
  const int Vp = h[7];
  if (Vp < m.vocab_size) bad_file(path, "has padded vocabulary " + std::to_string(Vp) + " below V " + std::to_string(h[3]), "Vp >= V");
  check_model(path, ModelConfig{m.vocab_size, m.block_size, m.n_layer, m.n_head, m.n_embd, true, Vp});
  // the 16 tensors, each stacked over the layers (fill_in_parameter_sizes)
  const uint64_t C = m.n_embd, L = m.n_layer;
  const uint64_t sizes[16] = {Vp * C, m.block_size * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                              L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
  uint64_t n = 0;
  for (uint64_t x : sizes) n += x;
  const uint64_t each = h[1] == 3 ? 4 : 2;
  if (size != 1024 + n * each)
    bad_file(path, "is " + std::to_string(size) + " bytes, but its header (" + model_text(m) + ", Vp " +
                       std::to_string(Vp) + ", " + (each == 4 ? "fp32" : "bf16") + ") makes it " +
                       std::to_string(1024 + n * each),
             "a complete file (truncated or another model's header?)");
  try {
    bytes = ckpt::read_file(path);
  } catch (const InputError& e) {
    bad_file(path, "cannot be read: " + what_of(e), "a readable file");
  }
  if (bytes.size() != size) bad_file(path, "changed while it was read", "a file nothing writes to");
  std::vector<float> all(n);
  decode(bytes.data() + 1024, n, each == 4 ? "F32" : "BF16", all.data());
  std::vector<const float*> at(16);
  const float* p = all.data();
  for (int i = 0; i < 16; ++i) at[i] = p, p += sizes[i];
  const std::vector<ParamSpec> table = param_table(m);
  s.params.assign(param_count(table), 0.0f);
  // param_table's order: wte (V rows of the Vp), wpe, per layer its 12 tensors, ln_f
  auto put = [&](size_t k, const float* src) { std::copy(src, src + table[k].numel, s.params.begin() + table[k].offset); };
  put(0, at[0]);
  put(1, at[1]);
  size_t k = 2;
  for (uint64_t l = 0; l < L; ++l) {
    const int order[12] = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};  // ln1w ... fcprojb
    for (int i : order) {
      put(k, at[i] + l * (sizes[i] / L));
      ++k;
    }
  }
  put(k, at[14]);
  put(k + 1, at[15]);
  for (const ParamSpec& p : table) check_finite(path, p.name, s.params.data() + p.offset, p.numel);
  return s;
}

// ---- a train_gpt checkpoint

InitSource read_checkpoint(const std::string& path, std::ostream& warn) {
  InitSource s;
  s.kind = "train_gpt checkpoint";
  const std::string dir = pick_checkpoint(path, warn);
  if (dir.empty()) bad_file(path, "is a run directory holding no checkpoint", "a run directory with a ckpt-<step> in it");
  s.path = dir;
  const ckpt::CheckpointInfo info = ckpt::checkpoint_info(dir);
  data::CharTokenizer tok;
  s.model = checkpoint_model(dir, info, "", tok, warn);
  s.gelu = info.config.gelu;
  s.vocab = tok.chars();
  s.params = ckpt::load_checkpoint(dir, param_table(s.model)).params;
  return s;
}

}  // namespace

std::string resolve_init_path(const std::string& path) {
  std::error_code ec;
  if (path.empty() || fs::exists(path, ec)) return path;
  const bool name = path.find_first_of("\\") == std::string::npos && path.find('/') == path.rfind('/') &&
                    path[0] != '.' && path.back() != '/' && fs::path(path).extension().empty();
  if (!name) return path;  // a path that does not exist: read_init_source says so
  std::string hub;
  if (const char* e = std::getenv("HF_HUB_CACHE"); e && *e) hub = e;
  else if (const char* h = std::getenv("HF_HOME"); h && *h) hub = std::string(h) + "/hub";
  else if (const char* home = std::getenv("HOME"); home && *home) hub = std::string(home) + "/.cache/huggingface/hub";
  // the cache's folder: models--<org>--<name>; GPT-2 also lives as openai-community/gpt2
  std::vector<std::string> repos = {path};
  if (path.find('/') == std::string::npos) repos.push_back("openai-community/" + path);
  for (const std::string& repo : repos) {
    std::string folder = "models--" + repo;
    for (size_t at; (at = folder.find('/')) != std::string::npos;) folder.replace(at, 1, "--");
    const fs::path snaps = fs::path(hub) / folder / "snapshots";
    // the snapshot refs/main names, else the newest one holding model.safetensors
    std::string main_ref;
    try {
      main_ref = ckpt::read_file((fs::path(hub) / folder / "refs" / "main").string(), 256);
    } catch (const InputError&) {
    }
    while (!main_ref.empty() && std::isspace((unsigned char)main_ref.back())) main_ref.pop_back();
    if (!main_ref.empty() && fs::exists(snaps / main_ref / "model.safetensors", ec)) return (snaps / main_ref).string();
    fs::path best;
    fs::file_time_type newest{};
    for (const auto& e : fs::directory_iterator(snaps, ec)) {
      if (!fs::exists(e.path() / "model.safetensors", ec)) continue;
      const auto t = fs::last_write_time(e.path(), ec);
      if (best.empty() || t > newest) best = e.path(), newest = t;
    }
    if (!best.empty()) return best.string();
  }
  throw InputError("--init-from " + printable(path, 200) + " is neither a path nor a model in the Hugging Face cache (" +
                   hub + "/models--" + printable(path, 100) + "/snapshots/*/model.safetensors); expected a downloaded model; "
                   "get it with: huggingface-cli download " + printable(path, 100) +
                   " model.safetensors config.json vocab.json merges.txt tokenizer.json (or pass the directory holding them)");
}

std::string init_tokenizer(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  const fs::path dir = fs::is_directory(p, ec) ? p : (p.parent_path().empty() ? fs::path(".") : p.parent_path());
  if (fs::exists(dir / "tokenizer.json", ec) || (fs::exists(dir / "vocab.json", ec) && fs::exists(dir / "merges.txt", ec)))
    return dir.string();
  if (fs::is_directory(dir / "tokenizer", ec) && fs::exists(dir / "run.cfg", ec)) return (dir / "tokenizer").string();
  if (fs::exists(dir / "state.bin", ec) && fs::is_directory(dir.parent_path() / "tokenizer", ec))
    return (dir.parent_path() / "tokenizer").string();
  return "";
}

InitSource read_init_source(const std::string& given_path, int n_head, std::ostream& warn) {
  std::error_code ec;
  const std::string path = resolve_init_path(given_path);
  if (path.empty()) bad_file(path, "is empty", "a path");
  if (!fs::exists(path, ec)) bad_file(path, "does not exist", "a file or directory");
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "state.bin", ec) || !ckpt::list_checkpoints(path).empty() ||
        fs::exists(fs::path(path) / "run.cfg", ec))
      return read_checkpoint(path, warn);
    if (fs::exists(fs::path(path) / "model.safetensors", ec))
      return read_hf((fs::path(path) / "model.safetensors").string(), (fs::path(path) / "config.json").string(), n_head);
    bad_file(path, "is a directory holding neither model.safetensors nor a train_gpt checkpoint",
             "a Hugging Face model directory or a train_gpt run");
  }
  std::string head;
  try {
    head = ckpt::read_file(path, 4);
  } catch (const InputError& e) {
    bad_file(path, "cannot be read: " + what_of(e), "a readable file");
  }
  int32_t magic = 0;
  if (head.size() == 4) std::memcpy(&magic, head.data(), 4);
  if (magic == kLlmcMagic) return read_llmc(path);
  const fs::path parent = fs::path(path).parent_path();
  return read_hf(path, ((parent.empty() ? fs::path(".") : parent) / "config.json").string(), n_head);
}

void apply_init_model(Config& c, const std::vector<std::string>& given, const InitSource& s) {
  const Config flags = c;
  c.n_layer = s.model.n_layer;
  c.n_head = s.model.n_head;
  c.n_embd = s.model.n_embd;
  c.block_size = s.model.block_size;
  c.bias = s.model.bias;
  if (s.gelu) c.gelu = *s.gelu;
  std::string conflicts;
  for (const char* flag : {"n-layer", "n-head", "n-embd", "block-size", "bias", "gelu"}) {
    if (std::find(given.begin(), given.end(), flag) == given.end()) continue;
    const std::string now = flag_value(flags, flag), file = flag_value(c, flag);
    if (now != file) conflicts += (conflicts.empty() ? "" : ", ") + std::string("--") + flag + " " + now + " (the file has " + file + ")";
  }
  if (!conflicts.empty())
    throw InputError("--init-from " + printable(s.path, 200) + " fixes the model's shape, and flags contradict it: " +
                     conflicts + "; expected model flags that agree with the file, or none; drop them");
  validate(c);
}

std::vector<float> init_params_for(const InitSource& s, const ModelConfig& m, const std::string& data_name,
                                   const std::string& chars) {
  const std::string what = chars.empty() ? " GPT-2 tokens" : " characters";
  if (s.model.vocab_size != m.vocab_size)
    throw InputError("--init-from " + printable(s.path, 200) + " is a model of a vocabulary of " +
                     std::to_string(s.model.vocab_size) + " tokens, but --data " + printable(data_name, 200) + " has " +
                     std::to_string(m.vocab_size) + what + "; expected data of the model's vocabulary; pass " +
                     (s.model.vocab_size == 50257 ? "GPT-2 token data (llm.c .bin shards or nanoGPT's train.bin / val.bin)"
                                                  : "the data the model was trained on"));
  if (!s.vocab.empty() && !chars.empty() && s.vocab != chars)
    throw InputError("--init-from " + printable(s.path, 200) + " has other characters than --data " +
                     printable(data_name, 200) + " (the same count, another text); expected the text the model was "
                     "trained on, or one with its characters; pass that");
  const std::vector<ParamSpec> from = param_table(s.model), to = param_table(m);
  std::vector<float> out(param_count(to), 0.0f);
  if (from.size() != to.size()) throw InputError("--init-from: the model changed shape; expected " + model_text(s.model));
  for (size_t i = 0; i < to.size(); ++i) {
    const ParamSpec &a = from[i], &b = to[i];
    const bool wte = i == 0;  // the first V rows; padding rows stay 0
    const size_t n = wte ? (size_t)m.vocab_size * m.n_embd : b.numel;
    if (a.name != b.name || (!wte && a.shape != b.shape))
      throw InputError("--init-from " + printable(s.path, 200) + ": tensor " + a.name + " has shape " +
                       shape_text(to_u64(a.shape)) + ", the run's " + b.name + " " + shape_text(to_u64(b.shape)) +
                       "; expected the file's model; drop the model flags");
    std::copy(s.params.begin() + a.offset, s.params.begin() + a.offset + n, out.begin() + b.offset);
  }
  return out;
}

void start_from(Backend& be, const std::vector<float>& params) {
  const std::vector<float> zeros(params.size(), 0.0f);
  be.set_state(params.data(), zeros.data(), zeros.data());
}

std::vector<int32_t> parse_token_ids(const std::string& text, int V, int T) {
  const std::string expected = "; expected integers 0 to " + std::to_string(V - 1) +
                               " (the model's vocabulary), separated by commas; fix the list";
  std::vector<std::string> items(1);  // split at commas, each trimmed of spaces
  for (char ch : text) {
    if (ch == ',') items.emplace_back();
    else items.back() += ch;
  }
  for (std::string& w : items) {
    w.erase(0, w.find_first_not_of(' '));
    w.erase(w.find_last_not_of(' ') + 1);
  }
  const bool none = std::all_of(items.begin(), items.end(), [](const std::string& w) { return w.empty(); });
  std::vector<int32_t> ids;
  for (size_t k = 0; k < items.size() && !none; ++k) {
    const std::string& w = items[k];
    if (w.empty())  // "1,,2" or "1,2,": an id left out, not skipped
      throw InputError("--logits '" + printable(text) + "' has an empty item (number " + std::to_string(k + 1) + ")" + expected);
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(w.c_str(), &end, 10);
    if (*end != '\0' || w[0] == '-' || w[0] == '+' || errno == ERANGE || x >= V)
      throw InputError("--logits: '" + printable(w) + "' is not a token id" + expected);
    ids.push_back((int32_t)x);
  }
  if (ids.empty() || (int)ids.size() > T)
    throw InputError("--logits holds " + std::to_string(ids.size()) + " token ids; expected 1 to " + std::to_string(T) +
                     " (the model's block size); pass such a list, e.g. --logits 464,3290,318");
  return ids;
}

}  // namespace tg
