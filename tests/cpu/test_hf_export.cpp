// tests/cpu/test_hf_export.cpp: --export-hf writes what transformers' GPT2LMHeadModel loads:
// GPT-2's names, Conv1D weights transposed from nanoGPT's Linear layout, zero biases for a
// bias-free model, no lm_head, config.json naming the GELU; never over an existing directory.
// (tests/interop/hf_export_check.py, make interop, loads the export into transformers.)
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../../data/errors.h"
#include "../../model/net/gpt.h"
#include "../../model/formats/hf_export.h"
#include "../../model/formats/safetensors.h"
#include "../common/cli_util.h"

using namespace tg;
using namespace cli;

namespace {

// The F32 tensor name of a parsed file, as floats.
std::vector<float> tensor(const ckpt::StFile& f, const std::string& bytes, const std::string& name,
                          std::vector<uint64_t>* shape = nullptr) {
  for (const ckpt::StTensor& t : f.tensors)
    if (t.name == name) {
      if (shape) *shape = t.shape;
      std::vector<float> v(t.numel);
      std::memcpy(v.data(), bytes.data() + f.data_start + t.begin, t.numel * 4);
      return v;
    }
  FAIL("no tensor " << name);
  return {};
}

}  // namespace

TEST_CASE("hf export: GPT-2's names and layouts; biases of a bias-free model are zeros; config.json") {
  ModelConfig m{11, 8, 2, 2, 6, false};
  const auto table = param_table(m);
  std::vector<float> params(param_count(table));
  for (size_t i = 0; i < params.size(); ++i) params[i] = (float)i;  // every element its own value
  const fs::path dir = fresh_dir("tg_hf_export");
  export_hf(dir.string(), m, GeluForm::Erf, params.data(), "abcdefghij\xce\xb1");
  const std::string bytes = slurp((dir / "model.safetensors").string());
  const ckpt::StFile f = ckpt::parse_safetensors(bytes, "export");
  // every GPT-2 tensor is there, lm_head is not
  const int C = 6;
  size_t n = 0;
  for (const ckpt::StTensor& t : f.tensors) {
    CHECK(t.name != "lm_head.weight");
    CHECK(t.dtype == "F32");
    ++n;
  }
  CHECK(n == 2 + 2 * 12 + 2);  // wte, wpe; 12 per block with biases; ln_f weight and bias
  // a Conv1D weight: GPT-2's (in, out) is nanoGPT's (out, in) transposed
  for (const ParamSpec& p : table) {
    if (p.name != "transformer.h.1.attn.c_attn.weight") continue;
    std::vector<uint64_t> shape;
    const std::vector<float> w = tensor(f, bytes, p.name, &shape);
    REQUIRE(shape == std::vector<uint64_t>{(uint64_t)C, (uint64_t)3 * C});
    for (int out = 0; out < 3 * C; ++out)
      for (int in = 0; in < C; ++in) CHECK(w[(size_t)in * 3 * C + out] == params[p.offset + (size_t)out * C + in]);
  }
  // embeddings and layernorm weights as they are; biases of the bias-free model are zeros
  CHECK(tensor(f, bytes, "transformer.wte.weight") == std::vector<float>(params.begin(), params.begin() + 11 * C));
  for (const char* b : {"transformer.h.0.attn.c_attn.bias", "transformer.h.1.mlp.c_fc.bias", "transformer.ln_f.bias"})
    for (float x : tensor(f, bytes, b)) CHECK(x == 0.0f);
  std::vector<uint64_t> shape;
  tensor(f, bytes, "transformer.h.0.mlp.c_fc.bias", &shape);
  CHECK(shape == std::vector<uint64_t>{(uint64_t)4 * C});
  const nlohmann::json config = nlohmann::json::parse(slurp((dir / "config.json").string()));
  CHECK(config["model_type"] == "gpt2");
  CHECK(config["vocab_size"] == 11);
  CHECK(config["n_positions"] == 8);
  CHECK(config["n_embd"] == C);
  CHECK(config["n_layer"] == 2);
  CHECK(config["n_head"] == 2);
  CHECK(config["activation_function"] == "gelu");  // erf; the tanh form is gelu_new
  CHECK(config["layer_norm_epsilon"] == 1e-5);
  const nlohmann::json vocab = nlohmann::json::parse(slurp((dir / "train_gpt_vocab.json").string()));
  REQUIRE(vocab.size() == 11);
  CHECK(vocab[10] == "\xce\xb1");
  // never over an existing directory
  CHECK_THROWS_AS(export_hf(dir.string(), m, GeluForm::Tanh, params.data(), ""), InputError);
  CHECK(slurp((dir / "config.json").string()).find("\"gelu\"") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("hf export: a padded vocabulary exports its V rows, not the padding") {
  ModelConfig m{11, 8, 1, 2, 6, true, 64};  // V 11 padded to 64 rows
  const auto table = param_table(m);
  std::vector<float> params(param_count(table), 1.0f);
  const fs::path dir = fresh_dir("tg_hf_padded");
  export_hf(dir.string(), m, GeluForm::Tanh, params.data(), "");
  const std::string bytes = slurp((dir / "model.safetensors").string());
  const ckpt::StFile f = ckpt::parse_safetensors(bytes, "export");
  std::vector<uint64_t> shape;
  tensor(f, bytes, "transformer.wte.weight", &shape);
  CHECK(shape == std::vector<uint64_t>{11, 6});
  CHECK(nlohmann::json::parse(slurp((dir / "config.json").string()))["vocab_size"] == 11);
  CHECK(!fs::exists(dir / "train_gpt_vocab.json"));  // no character vocabulary
  fs::remove_all(dir);
}

TEST_CASE("hf export: through the binary from a run, and refusals") {
  const fs::path base = fresh_dir("tg_hf_cli"), run = base / "run", hf = base / "hf";
  REQUIRE(run_train_gpt("--device cpu --max-iters 2 --n-layer 1 --n-head 2 --n-embd 8 --block-size 8 --batch-size 2 "
                        "--eval-interval 0 --eval-iters 1 --sample-tokens 0 --data " + data_path() + " --out-dir " +
                        run.string())
              .code == 0);
  Run r = run_train_gpt("--export-hf " + hf.string() + " --ckpt " + run.string());
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("GPT2LMHeadModel.from_pretrained(\"" + hf.string() + "\")") != std::string::npos);
  const nlohmann::json config = nlohmann::json::parse(slurp((hf / "config.json").string()));
  CHECK(config["vocab_size"] == 65);
  CHECK(config["activation_function"] == "gelu_new");
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--export-hf " + hf.string() + " --ckpt " + run.string(), "already exists"},
           {"--export-hf " + (base / "x").string(), "--export-hf without --ckpt"},
           {"--export-hf " + (base / "x").string() + " --ckpt " + (base / "none").string(), "neither a checkpoint"},
           {"--export-hf " + (base / "x").string() + " --sample --ckpt " + run.string(), "--export-hf with --sample"}}) {
    CAPTURE(args);
    Run bad = run_train_gpt(args);
    CHECK(bad.code == 2);
    CHECK(count_lines(bad.err) == 1);
    CHECK(bad.err.find(says) != std::string::npos);
  }
  CHECK(!fs::exists(base / "x"));
  fs::remove_all(base);
}
