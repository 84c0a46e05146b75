// model/net/gpt.h: the GPT-2 architecture as nanoGPT builds it, described once for every backend:
// the parameter table (order, nanoGPT names, shapes, weight decay, init) and the weight init.
//
//   x = drop(wte[idx] + wpe[pos])                                 (B, T, C)
//   for each block:  x = x + drop(c_proj(attn(ln_1(x))))         attn with dropout on P
//                    x = x + drop(mlp.c_proj(gelu(c_fc(ln_2(x)))))
//   logits = ln_f(x) wte^T                                       (B, T, V), lm_head tied to wte
//
// Init (nanoGPT GPT._init_weights): every Linear and Embedding weight N(0, 0.02), the two
// residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0,
// layernorm weights 1 and biases 0. The normals come from kernels/philox.h keyed by
// (seed, tensor index, element index), so every backend starts from the same weights.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tg {

// Padded vocabulary (llm.c's Vp): the rows of wte and the columns of the logits are
// padded_vocab >= vocab_size, so that the head's matmul runs on a round size (token data:
// 50257 -> 50304, padded_vocab_for). Only the first V ids are the vocabulary: the softmax and
// the loss run over them alone (the padded logits' gradient is 0), the padded rows of wte start
// at 0 and, never receiving a gradient, stay 0 (AdamW's decay of 0 is 0), and sampling draws
// from the first V logits. padded_vocab = 0 means V: no padding, the character-level runs as
// they always were (bitwise).
struct ModelConfig {
  int vocab_size = 0;  // V
  int block_size = 0;  // maxT
  int n_layer = 0;     // L
  int n_head = 0;      // NH
  int n_embd = 0;      // C
  bool bias = false;
  int padded_vocab = 0;  // Vp (0 = V)
  int vp() const { return padded_vocab > vocab_size ? padded_vocab : vocab_size; }
};

// llm.c's padding of a vocabulary of V tokens: V rounded up to a multiple of 128 (50257 -> 50304).
inline int padded_vocab_for(int V) { return (V + 127) / 128 * 128; }

enum class Init { Normal, Zeros, Ones };

struct ParamSpec {
  std::string name;          // nanoGPT's state_dict name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int> shape;    // as in PyTorch, e.g. {3C, C}
  size_t offset = 0;         // in the flat parameter buffer
  size_t numel = 0;
  bool decay = false;        // AdamW weight decay applies (tensors with 2 or more dimensions)
  Init init = Init::Zeros;
  double std = 0.0;          // for Init::Normal
  size_t pad_from = 0;       // elements from here on start at 0 whatever init says (wte's padded rows); numel when none
};

// All parameters in one fixed order: wte, wpe, then per block ln_1, attn.c_attn,
// attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj (weight then bias, biases only with bias=true),
// then ln_f. Offsets are packed in that order.
std::vector<ParamSpec> param_table(const ModelConfig& m);
size_t param_count(const std::vector<ParamSpec>& table);

// Fills params (param_count floats, host memory) with the init above.
void init_params(float* params, const std::vector<ParamSpec>& table, uint64_t seed);

// Pointers into a flat buffer laid out by param_table (biases null when bias = false).
template <typename T>
struct LayerParams {
  T *ln1w, *ln1b;          // (C)
  T *qkvw, *qkvb;          // (3C, C), (3C)
  T *attprojw, *attprojb;  // (C, C), (C)
  T *ln2w, *ln2b;          // (C)
  T *fcw, *fcb;            // (4C, C), (4C)
  T *fcprojw, *fcprojb;    // (C, 4C), (C)
};

template <typename T>
struct GPTParams {
  T* wte;  // (Vp, C)
  T* wpe;  // (maxT, C)
  std::vector<LayerParams<T>> h;
  T *lnfw, *lnfb;  // (C)
};

template <typename T>
GPTParams<T> bind_params(T* base, const ModelConfig& m) {
  std::vector<ParamSpec> t = param_table(m);
  size_t k = 0;
  auto next = [&](bool present) -> T* { return present ? base + t[k++].offset : nullptr; };
  GPTParams<T> p;
  p.wte = next(true);
  p.wpe = next(true);
  p.h.resize(m.n_layer);
  for (auto& l : p.h) {
    l.ln1w = next(true); l.ln1b = next(m.bias);
    l.qkvw = next(true); l.qkvb = next(m.bias);
    l.attprojw = next(true); l.attprojb = next(m.bias);
    l.ln2w = next(true); l.ln2b = next(m.bias);
    l.fcw = next(true); l.fcb = next(m.bias);
    l.fcprojw = next(true); l.fcprojb = next(m.bias);
  }
  p.lnfw = next(true);
  p.lnfb = next(m.bias);
  return p;
}

}  // namespace tg
