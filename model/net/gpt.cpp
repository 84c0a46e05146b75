// model/net/gpt.cpp: the parameter table and the weight init (see model/net/gpt.h).
#include "gpt.h"

#include <cmath>

#include "../../kernels/philox.h"

namespace tg {

std::vector<ParamSpec> param_table(const ModelConfig& m) {
  std::vector<ParamSpec> t;
  const int C = m.n_embd;
  const double std0 = 0.02, std_proj = 0.02 / std::sqrt(2.0 * m.n_layer);
  auto add = [&](const std::string& name, std::vector<int> shape, Init init, double sd) {
    ParamSpec p;
    p.name = name;
    p.shape = shape;
    p.numel = 1;
    for (int d : shape) p.numel *= (size_t)d;
    p.offset = t.empty() ? 0 : t.back().offset + t.back().numel;
    p.decay = shape.size() >= 2;
    p.init = init;
    p.std = sd;
    p.pad_from = p.numel;
    t.push_back(p);
  };
  auto linear = [&](const std::string& name, int out, int in, double sd) {
    add(name + ".weight", {out, in}, Init::Normal, sd);
    if (m.bias) add(name + ".bias", {out}, Init::Zeros, 0);
  };
  auto layernorm = [&](const std::string& name) {
    add(name + ".weight", {C}, Init::Ones, 0);
    if (m.bias) add(name + ".bias", {C}, Init::Zeros, 0);
  };
  add("transformer.wte.weight", {m.vp(), C}, Init::Normal, std0);
  t.back().pad_from = (size_t)m.vocab_size * C;  // the padded rows start at 0
  add("transformer.wpe.weight", {m.block_size, C}, Init::Normal, std0);
  for (int l = 0; l < m.n_layer; ++l) {
    std::string h = "transformer.h." + std::to_string(l) + ".";
    layernorm(h + "ln_1");
    linear(h + "attn.c_attn", 3 * C, C, std0);
    linear(h + "attn.c_proj", C, C, std_proj);
    layernorm(h + "ln_2");
    linear(h + "mlp.c_fc", 4 * C, C, std0);
    linear(h + "mlp.c_proj", C, 4 * C, std_proj);
  }
  layernorm("transformer.ln_f");
  return t;
}

size_t param_count(const std::vector<ParamSpec>& table) {
  return table.empty() ? 0 : table.back().offset + table.back().numel;
}

void init_params(float* params, const std::vector<ParamSpec>& table, uint64_t seed) {
  for (size_t ti = 0; ti < table.size(); ++ti) {
    const ParamSpec& p = table[ti];
    float* w = params + p.offset;
    if (p.init != Init::Normal) {
      for (size_t i = 0; i < p.numel; ++i) w[i] = p.init == Init::Ones ? 1.0f : 0.0f;
      continue;
    }
    // Box-Muller in double: each Philox call (counter: element group, tensor, stream) gives
    // four 32-bit words, two pairs (u1, u2) in (0, 1), four normals.
    for (size_t g = 0; g * 4 < p.numel; ++g) {
      philox::U32x4 r = philox::stream_words(seed, philox::kStreamInit, (uint32_t)g, (uint32_t)(g >> 32),
                                             (uint32_t)ti);
      for (int pair = 0; pair < 2; ++pair) {
        double u1 = (r.v[2 * pair] + 0.5) / 4294967296.0;
        double u2 = (r.v[2 * pair + 1] + 0.5) / 4294967296.0;
        double rad = std::sqrt(-2.0 * std::log(u1)), ang = 2.0 * M_PI * u2;
        double z[2] = {rad * std::cos(ang), rad * std::sin(ang)};
        for (int q = 0; q < 2; ++q) {
          size_t i = g * 4 + pair * 2 + q;
          if (i < p.numel) w[i] = i < p.pad_from ? (float)(p.std * z[q]) : 0.0f;
        }
      }
    }
  }
}

}  // namespace tg
