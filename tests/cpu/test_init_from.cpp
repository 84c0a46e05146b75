// tests/cpu/test_init_from.cpp: --init-from (model/formats/init_from.h) on files the tests write: a
// Hugging Face GPT-2 model.safetensors (Conv1D weights transposed, with and without the
// "transformer." prefix, old attn.bias / attn.masked_bias buffers, a tied lm_head), llm.c's
// model .bin in version 3 (fp32) and 5 (bf16) with padding rows, a train_gpt checkpoint. The
// loaded weights equal the source tensors by name; an --export-hf then --init-from round trip
// is bitwise; through the binary: the run records where it came from, resumes bitwise, --logits,
// and every refusal is one line, exit 2, nothing written.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "../../model/formats/checkpoint.h"
#include "../../data/errors.h"
#include "../../model/net/gpt.h"
#include "../../model/formats/hf_export.h"
#include "../../model/formats/init_from.h"
#include "../../model/formats/safetensors.h"
#include "../common/cli_util.h"
#include "test_util.h"

using namespace tg;
using namespace cli;
using testutil::random_vec;

namespace {

// Random weights for m, every element exactly a bf16 value (so a bf16 file holds them exactly).
std::vector<float> bf16_exact_params(const ModelConfig& m) {
  std::vector<float> p = random_vec<float>(param_count(param_table(m)));
  for (float& x : p) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    b &= 0xffff0000u;
    std::memcpy(&x, &b, 4);
  }
  return p;
}

// The bf16 / IEEE half bits of x, which must be exactly representable (no rounding here).
uint16_t bf16_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return (uint16_t)(b >> 16);
}
uint16_t f16_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
  const int e = (int)((b >> 23) & 0xff) - 127 + 15;
  const uint32_t mant = b & 0x7fffff;
  if ((b & 0x7fffffff) == 0) return sign;
  if (e >= 1) return (uint16_t)(sign | (e << 10) | (mant >> 13));
  return (uint16_t)(sign | ((0x800000u | mant) >> (14 - e)));  // a subnormal half
}

bool conv1d(const ParamSpec& p) {
  return p.shape.size() == 2 && p.name.find(".h.") != std::string::npos && p.name.find(".weight") != std::string::npos;
}

// A Hugging Face GPT-2 directory of params (laid out by param_table(m), m with biases): Conv1D
// weights stored (in, out); names with or without "transformer."; the attn.bias (1, 1, T, T)
// and attn.masked_bias () buffers of older files; lm_head.weight a copy of wte when tied, else
// wte + 1.
void write_hf(const fs::path& dir, const ModelConfig& m, const std::vector<float>& params, bool prefix, bool buffers,
              const std::string& head, const std::string& activation = "gelu_new", const std::string& dtype = "F32") {
  fs::create_directories(dir);
  std::vector<std::vector<float>> keep;
  keep.reserve(64);
  std::vector<ckpt::StPiece> pieces;
  const std::string pre = prefix ? "transformer." : "";
  const std::vector<float> mask((size_t)m.block_size * m.block_size, 1.0f), minus = {-1e4f};
  for (const ParamSpec& p : param_table(m)) {
    const std::string name = pre + p.name.substr(12);
    if (!conv1d(p)) {
      pieces.push_back({name, p.shape, params.data() + p.offset, p.numel});
    } else {
      const int out = p.shape[0], in = p.shape[1];
      keep.emplace_back(p.numel);
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) keep.back()[(size_t)i * out + o] = params[p.offset + (size_t)o * in + i];
      pieces.push_back({name, {in, out}, keep.back().data(), p.numel});
    }
    if (buffers && p.name.find("attn.c_proj.bias") != std::string::npos) {
      const std::string h = name.substr(0, name.find("attn."));
      pieces.push_back({h + "attn.bias", {1, 1, m.block_size, m.block_size}, mask.data(), mask.size()});
      pieces.push_back({h + "attn.masked_bias", {}, minus.data(), 1});
    }
  }
  const size_t wte_n = (size_t)m.vocab_size * m.n_embd;
  if (head == "tied") pieces.push_back({"lm_head.weight", {m.vocab_size, m.n_embd}, params.data(), wte_n});
  if (head == "untied") {
    keep.emplace_back(params.begin(), params.begin() + wte_n);
    for (float& x : keep.back()) x += 1.0f;
    pieces.push_back({"lm_head.weight", {m.vocab_size, m.n_embd}, keep.back().data(), wte_n});
  }
  std::ofstream f(dir / "model.safetensors", std::ios::binary);
  if (dtype == "F32") {
    ckpt::write_safetensors_pieces([&](const void* d, size_t n) { f.write((const char*)d, (std::streamsize)n); }, pieces,
                                   {{"format", "pt"}});
  } else {  // 16-bit: the header and the data written here (train_gpt writes F32 only)
    nlohmann::ordered_json h;
    std::string data;
    for (const ckpt::StPiece& p : pieces) {
      h[p.name] = {{"dtype", dtype}, {"shape", p.shape}, {"data_offsets", {data.size(), data.size() + 2 * p.numel}}};
      for (size_t i = 0; i < p.numel; ++i) {
        const uint16_t v = dtype == "BF16" ? bf16_bits(p.data[i]) : f16_bits(p.data[i]);
        data.append((const char*)&v, 2);
      }
    }
    const std::string text = h.dump();
    const uint64_t n = text.size();
    f.write((const char*)&n, 8);
    f << text << data;
  }
  nlohmann::json config = {{"model_type", "gpt2"},       {"vocab_size", m.vocab_size}, {"n_positions", m.block_size},
                           {"n_embd", m.n_embd},         {"n_layer", m.n_layer},       {"n_head", m.n_head},
                           {"activation_function", activation}, {"layer_norm_epsilon", 1e-5}, {"n_inner", nullptr}};
  std::ofstream(dir / "config.json") << config.dump(2);
}

// llm.c's model file of params (m with biases, no padding) with Vp rows of wte (the padding rows
// hold 7s, which must not be read): the 256-int32 header, then the 16 tensors stacked over layers.
std::string llmc_bytes(const ModelConfig& m, int Vp, const std::vector<float>& params, int version) {
  const std::vector<ParamSpec> t = param_table(m);
  const int L = m.n_layer, C = m.n_embd;
  std::vector<float> all(t[0].offset + t[0].numel);
  std::copy(params.begin(), params.begin() + t[0].numel, all.begin());
  all.resize((size_t)Vp * C, 7.0f);
  all.insert(all.end(), params.begin() + t[1].offset, params.begin() + t[1].offset + t[1].numel);
  for (int k = 0; k < 12; ++k)  // ln1w, ln1b, qkvw, ... fcprojb: layer l's is param_table entry 2 + 12 l + k
    for (int l = 0; l < L; ++l) {
      const ParamSpec& p = t[2 + 12 * l + k];
      all.insert(all.end(), params.begin() + p.offset, params.begin() + p.offset + p.numel);
    }
  for (size_t k = t.size() - 2; k < t.size(); ++k)
    all.insert(all.end(), params.begin() + t[k].offset, params.begin() + t[k].offset + t[k].numel);
  std::string b(1024, '\0');
  const int32_t h[8] = {20240326, version, m.block_size, m.vocab_size, L, m.n_head, C, Vp};
  std::memcpy(&b[0], h, sizeof h);
  for (float x : all) {
    if (version == 3) {
      b.append((const char*)&x, 4);
    } else {
      const uint16_t v = bf16_bits(x);
      b.append((const char*)&v, 2);
    }
  }
  return b;
}

void write_bytes(const fs::path& p, const std::string& b) { std::ofstream(p, std::ios::binary) << b; }

// The loss of step 0 in a run directory's metrics.jsonl, as written.
std::string first_loss(const fs::path& run) {
  std::istringstream lines(slurp((run / "metrics.jsonl").string()));
  for (std::string l; std::getline(lines, l);) {
    const nlohmann::json j = nlohmann::json::parse(l, nullptr, false);
    if (j.is_object() && j.value("step", -1) == 0 && j.contains("train_loss")) return j["train_loss"].dump();
  }
  return "none";
}

const std::string kRun = " --device cpu --batch-size 2 --eval-interval 0 --eval-iters 1 --sample-tokens 0 --log-interval 1 ";

}  // namespace

TEST_CASE("init-from: a Hugging Face GPT-2 safetensors, Conv1D transposed, prefixed or not, with mask buffers") {
  const ModelConfig m{13, 9, 2, 3, 6, true};  // odd sizes: V 13, T 9, C 6 in 3 heads
  const std::vector<float> src = random_vec<float>(param_count(param_table(m)));
  const fs::path base = fresh_dir("tg_init_hf");
  for (int variant = 0; variant < 4; ++variant) {
    const bool prefix = variant & 1, buffers = variant & 2;
    CAPTURE(variant);
    const fs::path dir = base / std::to_string(variant);
    write_hf(dir, m, src, prefix, buffers, variant == 3 ? "tied" : "none");
    // a directory, or the file with config.json beside it
    for (const fs::path& path : {dir, dir / "model.safetensors"}) {
      const InitSource s = read_init_source(path.string());
      CHECK(s.kind == "Hugging Face GPT-2");
      CHECK(s.gelu == GeluForm::Tanh);  // gelu_new
      CHECK((s.model.vocab_size == 13 && s.model.block_size == 9 && s.model.n_layer == 2 && s.model.n_head == 3 &&
             s.model.n_embd == 6 && s.model.bias));
      REQUIRE(s.params.size() == src.size());
      for (const ParamSpec& p : param_table(m)) {
        CAPTURE(p.name);
        CHECK(std::equal(src.begin() + p.offset, src.begin() + p.offset + p.numel, s.params.begin() + p.offset));
      }
    }
  }
  // activation gelu is the exact form; no config.json: n_head from --n-head, the GELU the flag's
  write_hf(base / "erf", m, src, true, false, "none", "gelu");
  CHECK(read_init_source((base / "erf").string()).gelu == GeluForm::Erf);
  fs::remove(base / "erf" / "config.json");
  CHECK_THROWS_WITH_AS(read_init_source((base / "erf").string()), doctest::Contains("--n-head"), InputError);
  const InitSource bare = read_init_source((base / "erf").string(), 3);
  CHECK((!bare.gelu && bare.model.n_layer == 2 && bare.model.n_embd == 6 && bare.model.vocab_size == 13));
  CHECK(bare.params == src);
  // an untied head, a tensor of another shape (named, with both shapes), an extra layer's tensor
  write_hf(base / "untied", m, src, true, false, "untied");
  CHECK_THROWS_WITH_AS(read_init_source((base / "untied").string()), doctest::Contains("untied"), InputError);
  const ModelConfig wider{13, 9, 2, 3, 9, true};
  write_hf(base / "wider", wider, random_vec<float>(param_count(param_table(wider))), true, false, "none");
  std::ofstream(base / "wider" / "config.json")
      << nlohmann::json{{"n_layer", 2}, {"n_head", 3}, {"n_embd", 6}, {"vocab_size", 13}, {"n_positions", 9}}.dump();
  CHECK_THROWS_WITH_AS(read_init_source((base / "wider").string()),
                       doctest::Contains("has tensor wte.weight of shape [13, 9]; expected shape [13, 6]"), InputError);
  std::ofstream(base / "0" / "config.json")
      << nlohmann::json{{"n_layer", 1}, {"n_head", 3}, {"n_embd", 6}, {"vocab_size", 13}, {"n_positions", 9}}.dump();
  CHECK_THROWS_WITH_AS(read_init_source((base / "0").string()), doctest::Contains("has tensor h.1."), InputError);
  // config.json keys of other values or types than GPT-2's: refused, one line each
  const nlohmann::json good = {{"n_layer", 2}, {"n_head", 3}, {"n_embd", 6}, {"vocab_size", 13}, {"n_positions", 9}};
  for (const auto& [key, value, says] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"activation_function", 7, "activation_function 7"},
           {"activation_function", "relu", "activation_function relu"},
           {"layer_norm_epsilon", 1e-6, "layer_norm_epsilon"},
           {"scale_attn_weights", "yes", "scale_attn_weights"},
           {"scale_attn_by_inverse_layer_idx", true, "scales attention"},
           {"model_type", "llama", "model_type"},
           {"n_inner", 7, "n_inner 7"},
           {"n_head", -3, "n_head -3"},
           {"n_positions", "9", "n_positions"}}) {
    CAPTURE(key);
    nlohmann::json c = good;
    c[key] = value;
    std::ofstream(base / "0" / "config.json") << c.dump();
    CHECK_THROWS_WITH_AS(read_init_source((base / "0").string()), doctest::Contains(says.c_str()), InputError);
  }
  std::ofstream(base / "0" / "config.json") << "{\"n_layer\": 2,";
  CHECK_THROWS_WITH_AS(read_init_source((base / "0").string()), doctest::Contains("not a JSON object"), InputError);
  // a config.json past 1 MiB (a long string in it): refused by its size, naming the file
  nlohmann::json padded = good;
  padded["name_or_path"] = std::string(1 << 20, 'x');
  std::ofstream(base / "0" / "config.json") << padded.dump();
  const std::string too_big = (base / "0" / "config.json").string() + " is " +
                              std::to_string(fs::file_size(base / "0" / "config.json")) +
                              " bytes; expected Hugging Face's GPT-2 config.json, at most 1048576 bytes";
  CHECK_THROWS_WITH_AS(read_init_source((base / "0").string()), doctest::Contains(too_big.c_str()), InputError);
  fs::remove_all(base);
}

TEST_CASE("init-from: a mask buffer (never read) whose dtype is empty or none of the safetensors format's is refused") {
  const ModelConfig m{7, 5, 1, 2, 4, true};
  const fs::path base = fresh_dir("tg_init_dtype");
  write_hf(base, m, random_vec<float>(param_count(param_table(m))), false, true, "none");
  const std::string path = (base / "model.safetensors").string(), good = slurp(path);
  CHECK_NOTHROW(read_init_source(base.string()));
  for (const char* name : {"", "F33", "Q4"}) {
    const std::string dtype = name;
    CAPTURE(dtype);
    std::string b = good;
    const std::string key = "\"h.0.attn.bias\":{\"dtype\":\"F32\"";
    const size_t at = b.find(key);
    REQUIRE(at != std::string::npos);
    const std::string to = "\"h.0.attn.bias\":{\"dtype\":\"" + dtype + "\"";
    b.replace(at, key.size(), to + std::string(key.size() - std::min(key.size(), to.size()), ' '));  // the header keeps its length
    REQUIRE(b.size() == good.size());
    write_bytes(path, b);
    CHECK_THROWS_WITH_AS(read_init_source(base.string()),
                         doctest::Contains(("has a bad header entry \"h.0.attn.bias\": dtype \"" + dtype +
                                            "\" is none of the format's (BOOL, F4,").c_str()),
                         InputError);
  }
  fs::remove_all(base);
}

TEST_CASE("init-from: a Hugging Face file in BF16 or F16 reads as its floats (subnormal halves, -0, 65504)") {
  const ModelConfig m{7, 5, 1, 2, 4, true};
  std::vector<float> src = random_vec<float>(param_count(param_table(m)));
  for (float& x : src) x = std::round(x * 100) / 64;  // k / 64: exact in bf16 and in half
  const fs::path base = fresh_dir("tg_init_hf16");
  for (const std::string dtype : {"BF16", "F16"}) {
    CAPTURE(dtype);
    std::vector<float> v = src;
    v[3] = std::ldexp(1.0f, -24);  // the smallest subnormal half
    v[5] = -0.0f;
    if (dtype == "F16") {
      v[4] = -1023 * std::ldexp(1.0f, -24);  // the largest subnormal half
      v[6] = 65504.0f;                       // the largest half
    }
    write_hf(base / dtype, m, v, true, false, "tied", "gelu_new", dtype);
    const InitSource s = read_init_source((base / dtype).string());
    REQUIRE(s.params.size() == v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      CAPTURE(i);
      CHECK(std::memcmp(&s.params[i], &v[i], 4) == 0);  // bitwise: -0 stays -0
    }
  }
  fs::remove_all(base);
}

TEST_CASE("init-from: llm.c's model file, version 3 (fp32) and 5 (bf16), padded rows not read") {
  const ModelConfig m{37, 8, 3, 2, 4, true};  // V 37 padded to 128 in the file
  const std::vector<float> src = bf16_exact_params(m);
  const fs::path base = fresh_dir("tg_init_llmc");
  fs::create_directories(base);
  for (int version : {3, 5}) {
    CAPTURE(version);
    const fs::path file = base / ("gpt2_v" + std::to_string(version) + ".bin");
    write_bytes(file, llmc_bytes(m, 128, src, version));
    const InitSource s = read_init_source(file.string());
    CHECK(s.kind == "llm.c");
    CHECK(s.gelu == GeluForm::Tanh);
    CHECK((s.model.vocab_size == 37 && s.model.block_size == 8 && s.model.n_layer == 3 && s.model.n_head == 2 &&
           s.model.n_embd == 4 && s.model.bias));
    for (const ParamSpec& p : param_table(m)) {
      CAPTURE(p.name);
      CHECK(std::equal(src.begin() + p.offset, src.begin() + p.offset + p.numel, s.params.begin() + p.offset));
    }
    // into a padded model (token data pads V as llm.c does): the padding rows start at 0, not 7
    const ModelConfig padded{37, 8, 3, 2, 4, true, 128};
    const std::vector<float> w = init_params_for(s, padded, "data", "");
    const auto pt = param_table(padded);
    for (size_t i = 0; i < pt[0].numel; ++i) CHECK(w[i] == (i < 37 * 4 ? src[i] : 0.0f));
    CHECK(std::equal(src.begin() + param_table(m)[1].offset, src.end(), w.begin() + pt[1].offset));
  }
  // truncated, crafted headers: one InputError each, never a crash
  const std::string good = llmc_bytes(m, 128, src, 3);
  auto refuses = [&](const std::string& bytes, const char* says) {
    CAPTURE(says);
    write_bytes(base / "bad.bin", bytes);
    CHECK_THROWS_WITH_AS(read_init_source((base / "bad.bin").string()), doctest::Contains(says), InputError);
  };
  refuses(good.substr(0, 1000), "header");
  refuses(good.substr(0, good.size() - 1), "bytes, but its header");
  refuses(good + "x", "bytes, but its header");
  for (const auto& [field, value, says] : std::vector<std::tuple<int, int32_t, const char*>>{
           {1, 4, "version 4"}, {5, 0, "n-head"}, {6, 5, "divisible"}, {4, 0, "n-layer"}, {4, 1 << 30, "n-layer"},
           {7, 36, "below V"}, {3, -1, "vocabulary"}, {2, -5, "block-size"}, {6, 1 << 30, "n-embd"}}) {
    std::string b = good;
    std::memcpy(&b[4 * field], &value, 4);
    refuses(b, says);
  }
  fs::remove_all(base);
}

TEST_CASE("init-from: a weight that is not finite is refused naming the tensor and the element (F32, BF16, llm.c)") {
  const ModelConfig m{7, 5, 1, 2, 4, true};
  const std::vector<ParamSpec> t = param_table(m);
  std::vector<float> src = random_vec<float>(param_count(t));
  for (float& x : src) x = std::round(x * 100) / 64;  // exact in bf16
  const fs::path base = fresh_dir("tg_init_finite");
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  REQUIRE(t[1].name == "transformer.wpe.weight");
  REQUIRE(t[2].name == "transformer.h.0.ln_1.weight");
  int k = 0;
  for (const auto& [dtype, at, value, says] : std::vector<std::tuple<std::string, size_t, float, std::string>>{
           {"F32", t[1].offset + 3, nan, "holds a weight that is not finite: transformer.wpe.weight[3] = nan"},
           {"BF16", t[2].offset, inf, "holds a weight that is not finite: transformer.h.0.ln_1.weight[0] = inf"},
           {"BF16", t.back().offset + 1, -inf, "holds a weight that is not finite: " + t.back().name + "[1] = -inf"}}) {
    CAPTURE(dtype);
    std::vector<float> v = src;
    v[at] = value;
    const fs::path dir = base / std::to_string(k++);
    write_hf(dir, m, v, true, false, "tied", "gelu_new", dtype);
    CHECK_THROWS_WITH_AS(read_init_source(dir.string()),
                         doctest::Contains(((dir / "model.safetensors").string() + " " + says + "; expected finite weights").c_str()),
                         InputError);
  }
  // a Conv1D weight: the element as the file lays it out, (in, out)
  std::vector<float> v = src;
  const ParamSpec& qkv = t[4];
  REQUIRE(qkv.name == "transformer.h.0.attn.c_attn.weight");
  v[qkv.offset + 1 * qkv.shape[1] + 2] = nan;  // Linear (out 1, in 2): the file's (in 2, out 1)
  write_hf(base / "conv", m, v, false, false, "none");
  CHECK_THROWS_WITH_AS(read_init_source((base / "conv").string()),
                       doctest::Contains(("h.0.attn.c_attn.weight[" + std::to_string(2 * qkv.shape[0] + 1) + "] = nan").c_str()),
                       InputError);
  // llm.c's file (fp32): train_gpt's names, each layer's slice; the padding rows are never read
  const std::string good = llmc_bytes(m, 16, src, 3);
  write_bytes(base / "good.bin", good);
  CHECK_NOTHROW(read_init_source((base / "good.bin").string()));
  v = src;
  v[t[2].offset + 2] = nan;
  write_bytes(base / "nan.bin", llmc_bytes(m, 16, v, 3));
  CHECK_THROWS_WITH_AS(read_init_source((base / "nan.bin").string()),
                       doctest::Contains("holds a weight that is not finite: transformer.h.0.ln_1.weight[2] = nan"), InputError);
  std::string padded_nan = good;
  std::memcpy(&padded_nan[1024 + 4 * (7 * 4 + 1)], &nan, 4);  // wte's row 7 of the 16: padding
  write_bytes(base / "padnan.bin", padded_nan);
  CHECK_NOTHROW(read_init_source((base / "padnan.bin").string()));
  fs::remove_all(base);
}

TEST_CASE("init-from: a train_gpt checkpoint, and an --export-hf round trip, bitwise") {
  const fs::path base = fresh_dir("tg_init_ckpt"), run = base / "run", hf = base / "hf";
  const std::string model = " --n-layer 2 --n-head 2 --n-embd 8 --block-size 16 --bias --gelu erf ";
  Run r = run_train_gpt("--max-iters 3" + kRun + model + "--data " + data_path() + " --out-dir " + run.string());
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const std::string ckpt = ckpt::latest_checkpoint(run.string());
  const std::vector<float> saved = ckpt::load_checkpoint(ckpt, param_table(ModelConfig{65, 16, 2, 2, 8, true})).params;
  const InitSource a = read_init_source(run.string()), b = read_init_source(ckpt);
  CHECK(a.kind == "train_gpt checkpoint");
  CHECK(a.path == ckpt);
  CHECK((a.gelu == GeluForm::Erf && a.model.vocab_size == 65 && a.model.n_embd == 8 && a.model.bias));
  CHECK(a.vocab.size() == 65);
  CHECK(a.params == saved);
  CHECK(b.params == saved);
  // --export-hf, then --init-from the export: the same weights, bit for bit, and the same GELU
  REQUIRE(run_train_gpt("--export-hf " + hf.string() + " --ckpt " + run.string()).code == 0);
  const InitSource h = read_init_source(hf.string());
  CHECK(h.params == saved);
  CHECK(h.gelu == GeluForm::Erf);
  CHECK(h.vocab == a.vocab);
  // two runs from them: the same first loss, as printed
  const fs::path from_ckpt = base / "from_ckpt", from_hf = base / "from_hf";
  for (const auto& [from, out] : {std::pair<fs::path, fs::path>{run, from_ckpt}, {hf, from_hf}}) {
    Run t = run_train_gpt("--max-iters 1" + kRun + "--init-from " + from.string() + " --data " + data_path() +
                          " --out-dir " + out.string());
    INFO(t.out << t.err);
    REQUIRE(t.code == 0);
    CHECK(t.out.find("init: weights from") != std::string::npos);
    CHECK(slurp((out / "run.cfg").string()).find("init_from=" + from.string() + "\n") != std::string::npos);
    CHECK(slurp((out / "run.cfg").string()).find("gelu=erf\n") != std::string::npos);
  }
  CHECK(first_loss(from_ckpt) == first_loss(from_hf));
  CHECK(first_loss(from_hf) != "none");
  fs::remove_all(base);
}

TEST_CASE("init-from: through the binary: resume is bitwise and reads no file again; --logits; refusals") {
  const fs::path base = fresh_dir("tg_init_cli"), hf = base / "hf";
  const ModelConfig m{65, 16, 2, 2, 8, true};
  write_hf(hf, m, random_vec<float>(param_count(param_table(m)), -0.3, 0.3), true, true, "tied");
  const std::string common = kRun + "--data " + data_path() + " --ckpt-interval 2 --dropout 0.1 ";
  // 4 steps at once, and 2 then --resume to 4 with the init file gone: the same weights
  const fs::path whole = base / "whole", parts = base / "parts";
  Run r = run_train_gpt("--max-iters 4 --init-from " + hf.string() + common + "--out-dir " + whole.string());
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("n_layer 2, n_head 2, n_embd 8, block_size 16, bias true") != std::string::npos);
  REQUIRE(run_train_gpt("--max-iters 2 --init-from " + hf.string() + common + "--out-dir " + parts.string()).code == 0);
  fs::rename(hf, base / "hf_moved");
  Run res = run_train_gpt("--resume --max-iters 4 --out-dir " + parts.string());
  INFO(res.out << res.err);
  REQUIRE(res.code == 0);
  CHECK(slurp((whole / "ckpt-00000004" / "model.safetensors").string()) ==
        slurp((parts / "ckpt-00000004" / "model.safetensors").string()));
  CHECK(ckpt::checkpoint_config((parts / "ckpt-00000004").string()).init_from == hf.string());  // where it came from
  fs::rename(base / "hf_moved", hf);
  // --logits: one line of V numbers per token, the same from the export of a run as from the run
  Run lg = run_train_gpt("--logits 0,64,3 --device cpu --init-from " + hf.string());
  INFO(lg.err);
  REQUIRE(lg.code == 0);
  CHECK(count_lines(lg.out) == 3);
  std::istringstream first(lg.out.substr(0, lg.out.find('\n')));
  int n = 0;
  for (double x; first >> x;) ++n;
  CHECK(n == 65);
  const fs::path hf2 = base / "hf2";
  REQUIRE(run_train_gpt("--export-hf " + hf2.string() + " --ckpt " + whole.string()).code == 0);
  CHECK(run_train_gpt("--logits 5,6 --device cpu --init-from " + hf2.string()).out ==
        run_train_gpt("--logits 5,6 --device cpu --init-from " + whole.string()).out);
  // refusals: one line, exit 2, nothing written
  const fs::path bin = base / "gpt2.bin", trunc = base / "trunc.bin", gpt2v = base / "gpt2v.bin";
  const ModelConfig big{50257, 8, 1, 1, 4, true};
  write_bytes(gpt2v, llmc_bytes(big, 50304, std::vector<float>(param_count(param_table(big)), 0.5f), 3));
  const std::string good = llmc_bytes(ModelConfig{65, 8, 1, 2, 4, true}, 128,
                                      std::vector<float>(param_count(param_table(ModelConfig{65, 8, 1, 2, 4, true})), 0.5f), 5);
  write_bytes(bin, good);
  write_bytes(trunc, good.substr(0, good.size() - 2));
  const fs::path out = base / "never";
  const std::string d = " --data " + data_path() + " --out-dir " + out.string();
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--init-from " + hf.string() + " --n-layer 3" + d, "--n-layer 3 (the file has 2)"},
           {"--init-from " + hf.string() + " --gelu erf --no-bias" + d, "--bias false (the file has true), --gelu erf (the file has tanh)"},
           {"--init-from " + gpt2v.string() + d, "vocabulary of 50257 tokens"},
           {"--init-from " + trunc.string() + d, "but its header"},
           {"--init-from " + (base / "none").string() + d, "does not exist"},
           {"--init-from " + base.string() + d, "neither model.safetensors"},
           {"--init-from " + (whole / "ckpt-00000004" / "model.safetensors").string() + d, "train_gpt checkpoint"},
           {"--init-from " + bin.string() + " --sample --ckpt " + whole.string(), "--init-from with --sample"},
           {"--logits 1,2", "--logits without --init-from"},
           {"--logits 1,65 --init-from " + hf.string(), "'65' is not a token id"},
           {"--logits 1,x --init-from " + hf.string(), "'x' is not a token id"},
           {"--logits , --init-from " + hf.string(), "holds 0 token ids"},
           {"--logits 1,,2 --init-from " + hf.string(), "has an empty item (number 2)"},
           {"--logits '1, 2,' --init-from " + hf.string(), "has an empty item (number 3)"},
           {"--init-from /dev/zero" + d, "/dev/zero is not a regular file"},  // read for ever before
           {"--resume --init-from " + bin.string() + " --out-dir " + whole.string(), "--init-from " + bin.string() + " (the run has"}}) {
    CAPTURE(args);
    Run bad = run_train_gpt(args);
    CHECK(bad.code == 2);
    CHECK(count_lines(bad.err) == 1);
    CHECK(bad.err.find(says) != std::string::npos);
    CHECK(bad.out.empty());
  }
  CHECK(!fs::exists(out));
  // a bf16 llm.c file trains (the shape from its header; tanh)
  Run ok = run_train_gpt("--max-iters 1 --init-from " + bin.string() + kRun + "--data " + data_path() + " --out-dir " +
                         (base / "from_bin").string());
  INFO(ok.out << ok.err);
  CHECK(ok.code == 0);
  CHECK(ok.out.find("(llm.c)") != std::string::npos);
  fs::remove_all(base);
}
