// tests/bench/bench_cpu.cpp: the CPU backend's training step on the baby preset (B=12, T=64,
// 4 layers, 128 wide): median, 10th and 90th percentile ms per step (forward, backward,
// clip, AdamW) over timed steps after a warm-up, for the flash and the naive attention path.
//   build/bench_cpu [--data PATH] [--steps N] [--preset baby|shakespeare-char] [--attention flash|naive|both]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../../data/dataset.h"
#include "../../model/net/backend.h"
#include "../../model/run/config.h"
#include "../../model/run/train.h"

int main(int argc, char** argv) {
  std::string path = "data/tinyshakespeare/input.txt", preset = "baby", which = "both";
  int steps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--data")) path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--preset")) preset = argv[i + 1];
    else if (!std::strcmp(argv[i], "--attention")) which = argv[i + 1];
  }
  try {
    tg::Config c;
    tg::apply_preset(c, preset);
    data::Dataset ds = data::load_dataset(path, c.block_size);
    tg::ModelConfig m;
    m.vocab_size = ds.tok.vocab_size(); m.block_size = c.block_size; m.n_layer = c.n_layer;
    m.n_head = c.n_head; m.n_embd = c.n_embd; m.bias = c.bias;
    std::printf("preset %s: B=%d T=%d L=%d C=%d dropout %.2f, %d timed steps after 5 warm-up\n", preset.c_str(),
                c.batch_size, c.block_size, c.n_layer, c.n_embd, c.dropout, steps);
    std::printf("%-10s %10s %10s %10s %12s\n", "attention", "median ms", "p10 ms", "p90 ms", "tokens/s");
    std::vector<int32_t> x((size_t)c.batch_size * c.block_size), y(x.size());
    for (const char* att : {"flash", "naive"}) {
      if (which != "both" && which != att) continue;
      c.attention = std::string(att) == "naive" ? tg::Attention::Naive : tg::Attention::Flash;
      auto be = tg::make_cpu_backend(m, tg::run_shape(c));
      std::vector<double> ms;
      for (int s = 0; s < steps + 5; ++s) {
        data::train_batch(ds.train, c.seed, s, c.batch_size, c.block_size, x.data(), y.data());
        auto t0 = std::chrono::steady_clock::now();
        be->forward_backward(x.data(), y.data(), s);
        be->update(1e-3f, s + 1, be->grad_norm());
        double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (s >= 5) ms.push_back(dt);
      }
      std::sort(ms.begin(), ms.end());
      double med = ms[ms.size() / 2];
      std::printf("%-10s %10.2f %10.2f %10.2f %12.0f\n", att, med, ms[ms.size() / 10], ms[ms.size() * 9 / 10],
                  x.size() / (med / 1e3));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
