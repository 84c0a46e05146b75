// model/formats/init_from.h: --init-from PATH, the weights a new run starts from (step 0, fresh AdamW
// moments; the model's shape comes from the file, everything else from the flags). Three kinds:
//
//   Hugging Face GPT-2   a model.safetensors (or a directory holding it) with its config.json
//                        beside it (model_type gpt2; n_layer, n_head, n_embd, n_positions,
//                        vocab_size; activation_function gelu_new or gelu_pytorch_tanh = the tanh
//                        form, gelu = erf; layer_norm_epsilon 1e-5; n_inner null or 4 n_embd).
//                        GPT-2's names, with or without the "transformer." prefix. attn.c_attn,
//                        attn.c_proj, mlp.c_fc and mlp.c_proj are Conv1D layers: their weights are
//                        stored (in, out), train_gpt's Linear (out, in) transposed. The
//                        attn.bias / attn.masked_bias buffers of older files are ignored;
//                        lm_head.weight is absent or equal to wte (tied). F32, BF16 or F16.
//                        config.json is at most 1 MiB (GPT-2's is under a kilobyte).
//                        Without config.json the shape comes from the tensors and n_head from
//                        --n-head, the GELU from --gelu. A train_gpt_vocab.json beside it (what
//                        --export-hf writes for a character vocabulary) names the characters.
//   llm.c                gpt2_124M.bin (fp32) / gpt2_124M_bf16.bin, as llm.c's train_gpt2.c reads
//                        them (gpt2_build_from_checkpoint, fill_in_parameter_sizes): a header of
//                        256 int32: magic 20240326, version 3 (fp32) or 5 (bf16), maxT, V, L, NH,
//                        C, Vp; then 16 tensors in this order, each stacked over the L layers:
//                        wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C),
//                        qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w (L, C),
//                        ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C),
//                        fcprojb (L, C), lnfw (C), lnfb (C). Linear layout, biases, the tanh GELU;
//                        the file is exactly that long. wte's padded rows V .. Vp-1 are not read.
//   train_gpt checkpoint a ckpt-<step> directory, or a run directory (its newest intact
//                        checkpoint): its weights only (not its moments, step or schedule).
//
// A padded vocabulary (token data: Vp 50304) starts with zero padding rows whatever the file
// holds there (model/net/gpt.h: they never train). Every problem (missing, truncated or crafted
// file, a tensor of another shape, a model-shape flag or a vocabulary that contradicts the file)
// throws InputError with one line; a tensor mismatch names the tensor and both shapes, a weight
// that is not finite (NaN, infinity) the tensor and the element.
#pragma once
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "../net/backend.h"
#include "../net/gpt.h"
#include "../run/config.h"

namespace tg {

struct InitSource {
  std::string kind;           // "Hugging Face GPT-2", "llm.c" or "train_gpt checkpoint"
  std::string path;           // the file or checkpoint directory read
  ModelConfig model;          // the file's model: V its vocabulary (padded as the file pads it)
  std::optional<GeluForm> gelu;  // none when the file does not say (the flag decides)
  std::string vocab;          // the characters in id order when the file names them, else ""
  std::vector<float> params;  // laid out by param_table(model)
};

// --init-from NAME, a model name (no '/', nothing of that name here: "gpt2", "openai-community/
// gpt2" is a name too when no such path exists): the newest snapshot of it in the Hugging Face
// cache, <hub>/models--<org>--<name>/snapshots/<hash>/ with <hub> $HF_HUB_CACHE, else
// $HF_HOME/hub, else ~/.cache/huggingface/hub. An existing path is returned as it is. Throws
// InputError, saying in one line how to get the model, when the name is not in the cache.
std::string resolve_init_path(const std::string& path);

// The tokenizer beside the weights at path (a resolved --init-from): the Hugging Face
// directory's tokenizer.json or vocab.json + merges.txt (its directory), or a train_gpt run's
// kept tokenizer/; "" when there is none.
std::string init_tokenizer(const std::string& path);

// Reads the weights at path (any of the three kinds; a model name as resolve_init_path). n_head: --n-head when given (0 if not),
// for a model.safetensors without config.json. A damaged newer checkpoint of a run directory,
// skipped for an older one, is named on warn.
InitSource read_init_source(const std::string& path, int n_head = 0, std::ostream& warn = std::cerr);

// The model flags the source fixes (n-layer, n-head, n-embd, block-size, bias, gelu) set from
// it in c; one of them given (in given) with another value is refused, all of them in one line.
// Then validate(c).
void apply_init_model(Config& c, const std::vector<std::string>& given, const InitSource& s);

// The weights for the model m (the run's: its vocabulary from the data, data_name naming the
// data in messages, chars its characters or "" for token data), laid out by param_table(m):
// the source's tensors by name, padding rows 0. A vocabulary that differs is refused.
std::vector<float> init_params_for(const InitSource& s, const ModelConfig& m, const std::string& data_name,
                                   const std::string& chars);

// Sets be's weights to params (param_table order) with zero AdamW moments.
void start_from(Backend& be, const std::vector<float>& params);

// --logits IDS: the token ids of "3,1,4" (commas or spaces), each below V, at most T of them.
std::vector<int32_t> parse_token_ids(const std::string& text, int V, int T);

}  // namespace tg
