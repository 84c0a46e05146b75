// model/formats/hf_export.cpp: the Hugging Face GPT-2 export (see model/formats/hf_export.h).
#include "hf_export.h"

#include <filesystem>
#include <functional>
#include <memory>
#include <system_error>
#include <vector>

#include "../../data/errors.h"
#include "ckpt_io.h"
#include "json_io.h"
#include "safetensors.h"

namespace tg {

namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The characters of UTF-8 text, one string each.
std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (i + n < s.size() && ((unsigned char)s[i + n] & 0xC0) == 0x80) ++n;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace

bool is_conv1d_weight(const ParamSpec& p) {
  return p.shape.size() == 2 && p.name.find(".h.") != std::string::npos && ends_with(p.name, ".weight");
}

void export_hf(const std::string& dir, const ModelConfig& m, GeluForm gelu, const float* params,
               const std::string& vocab) {
  std::error_code ec;
  if (fs::exists(dir, ec))
    throw InputError("--export-hf " + dir + " already exists; expected a new directory (an export never overwrites); "
                     "pass another path or move that one away");
  const std::vector<ParamSpec> table = param_table(m);
  std::vector<std::unique_ptr<std::vector<float>>> owned;  // transposed weights and zero biases
  std::vector<ckpt::StPiece> pieces;
  auto add_owned = [&](const std::string& name, std::vector<int> shape, std::vector<float> data) {
    owned.push_back(std::make_unique<std::vector<float>>(std::move(data)));
    pieces.push_back({name, std::move(shape), owned.back()->data(), owned.back()->size()});
  };
  for (const ParamSpec& p : table) {
    if (p.name == "transformer.wte.weight") {  // the first V rows: a padded vocabulary's others are not tokens
      pieces.push_back({p.name, {m.vocab_size, p.shape[1]}, params + p.offset, (size_t)m.vocab_size * p.shape[1]});
      continue;
    }
    if (!is_conv1d_weight(p)) {
      pieces.push_back({p.name, p.shape, params + p.offset, p.numel});
      continue;
    }
    const int rows = p.shape[0], cols = p.shape[1];  // Linear: (out, in)
    std::vector<float> t(p.numel);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) t[(size_t)c * rows + r] = params[p.offset + (size_t)r * cols + c];
    add_owned(p.name, {cols, rows}, std::move(t));
  }
  if (!m.bias) {  // GPT-2 has every bias: zeros give the bias-free model's function
    const int C = m.n_embd;
    for (int l = 0; l < m.n_layer; ++l) {
      const std::string h = "transformer.h." + std::to_string(l) + ".";
      for (const auto& [name, n] : std::vector<std::pair<std::string, int>>{{"ln_1.bias", C},
                                                                            {"attn.c_attn.bias", 3 * C},
                                                                            {"attn.c_proj.bias", C},
                                                                            {"ln_2.bias", C},
                                                                            {"mlp.c_fc.bias", 4 * C},
                                                                            {"mlp.c_proj.bias", C}})
        add_owned(h + name, {n}, std::vector<float>((size_t)n, 0.0f));
    }
    add_owned("transformer.ln_f.bias", {C}, std::vector<float>((size_t)C, 0.0f));
  }

  jsonio::Out config = jsonio::Out::object();
  config["architectures"] = jsonio::Out::array({"GPT2LMHeadModel"});
  config["model_type"] = "gpt2";
  config["vocab_size"] = m.vocab_size;
  config["n_positions"] = m.block_size;
  config["n_ctx"] = m.block_size;
  config["n_embd"] = m.n_embd;
  config["n_layer"] = m.n_layer;
  config["n_head"] = m.n_head;
  config["n_inner"] = nullptr;
  config["activation_function"] = gelu == GeluForm::Erf ? "gelu" : "gelu_new";
  config["layer_norm_epsilon"] = 1e-5;
  config["resid_pdrop"] = 0.0;
  config["embd_pdrop"] = 0.0;
  config["attn_pdrop"] = 0.0;
  config["initializer_range"] = 0.02;
  config["scale_attn_weights"] = true;
  config["tie_word_embeddings"] = true;
  config["torch_dtype"] = "float32";
  // GPT-2's <|endoftext|> where the vocabulary is GPT-2's; none for a character vocabulary
  config["bos_token_id"] = m.vocab_size >= 50257 ? jsonio::Out(50256) : jsonio::Out(nullptr);
  config["eos_token_id"] = m.vocab_size >= 50257 ? jsonio::Out(50256) : jsonio::Out(nullptr);

  const std::string tmp = dir + ".tmp";
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec)
    throw InputError("cannot create --export-hf " + dir + " (" + (ec ? ec.message() : std::string("exists")) +
                     "); expected a writable path; pass another");
  struct Cleanup {
    const std::string& path;
    bool done = false;
    ~Cleanup() {
      std::error_code e;
      if (!done) fs::remove_all(path, e);
    }
  } cleanup{tmp};
  {
    ckpt::AtomicFile f(tmp + "/model.safetensors");
    ckpt::write_safetensors_pieces([&](const void* d, size_t n) { f.write(d, n); }, pieces, {{"format", "pt"}});
    f.commit();
  }
  ckpt::write_file_atomic(tmp + "/config.json", jsonio::dump(config, 2) + "\n");
  if (!vocab.empty())
    ckpt::write_file_atomic(tmp + "/train_gpt_vocab.json",
                            jsonio::dump(utf8_chars(vocab), -1, /*ascii=*/true) + "\n");
  fs::rename(tmp, dir, ec);
  if (ec) throw RuntimeError("cannot rename " + tmp + " to " + dir + ": " + ec.message() + "; check the path");
  cleanup.done = true;
  ckpt::fsync_dir(fs::path(dir).parent_path().empty() ? "." : fs::path(dir).parent_path().string());
}

}  // namespace tg
