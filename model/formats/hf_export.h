// model/formats/hf_export.h: a model written as Hugging Face transformers' GPT-2 loads it, so that
// transformers.GPT2LMHeadModel.from_pretrained(DIR) computes the same function:
//   DIR/config.json        model_type gpt2: vocab_size V, n_positions = n_ctx = block_size,
//                          n_embd, n_layer, n_head, activation_function "gelu_new" (the tanh
//                          form, kernels/gelu_form.h) or "gelu" (erf), layer_norm_epsilon 1e-5,
//                          dropouts 0, tie_word_embeddings true
//   DIR/model.safetensors  F32, GPT-2's names (transformer.wte.weight: its first V rows, the
//                          padding of a padded vocabulary left out; transformer.h.N.ln_1.weight,
//                          ..., transformer.ln_f.bias). GPT-2's attn.c_attn, attn.c_proj, mlp.c_fc
//                          and mlp.c_proj are Conv1D layers, which store their weight as (in, out):
//                          nanoGPT's Linear (out, in) transposed. GPT-2 always has biases: a model
//                          trained with --no-bias gets zero biases (the same function). No
//                          lm_head.weight: transformers ties it to wte.
//   DIR/train_gpt_vocab.json  the character-level vocabulary as a JSON array of strings, entry i
//                          the character of token id i (when the model has one)
// The directory is written as DIR.tmp and renamed into place when complete; an existing DIR is
// never touched.
#pragma once
#include <string>

#include "../../kernels/gelu_form.h"
#include "../net/gpt.h"

namespace tg {

// Whether GPT-2 stores p as a Conv1D layer's weight, (in, out), the transpose of train_gpt's
// Linear (out, in): the 2-D weights inside the blocks (attn.c_attn, attn.c_proj, mlp.c_fc,
// mlp.c_proj). The export writes them transposed, --init-from (model/formats/init_from.h) reads them so.
bool is_conv1d_weight(const ParamSpec& p);

// Writes the export of params (param_count(param_table(m)) floats) to dir. vocab: the
// characters of the vocabulary in id order (UTF-8), or "" for none. Throws InputError when dir
// exists, RuntimeError when it cannot be written.
void export_hf(const std::string& dir, const ModelConfig& m, GeluForm gelu, const float* params,
               const std::string& vocab);

}  // namespace tg
