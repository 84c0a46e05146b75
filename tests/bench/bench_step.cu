// tests/bench/bench_step.cu: a whole training step (forward, backward, AdamW) of the CUDA
// backend against the sequence length T, for both attention paths: device memory the step
// needs (the size table of model/net/gpt_cuda.cuh, and what the device lost when the backend was
// made), median ms per step, tokens/s. The model is the shakespeare-char preset's width and
// depth (6 layers, 6 heads, 384 wide, head size 64), in two series: B*T = 16384 tokens per
// step (the time per token against T), and B = 8 sequences per step, where the naive path's
// (B, NH, T, T) probabilities outgrow the device at long T while the flash path still fits.
//   build/bench_step [--csv PATH]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "../../model/net/backend.h"
#include "../../model/run/config.h"
#include "../../model/run/train.h"
#include "../../model/net/gpt_cuda.cuh"

namespace {

struct Row {
  int B = 0, T = 0;
  std::string path;
  double need_gib = 0, used_gib = 0, ms = 0, tok_s = 0;
  std::string status;
};

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("build/bench_step [--csv PATH]: a shakespeare-char-wide training step against T, both attention paths\n");
      return 0;
    }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("bench_step: no CUDA device visible; nothing to measure\n");
    return 0;
  }
  const char* csv = nullptr;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--csv") == 0) csv = argv[i + 1];
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("bench_step on %s: shakespeare-char width (L=6, NH=6, C=384), bf16, dropout 0.2\n", prop.name);
  std::vector<std::pair<int, int>> shapes;  // (B, T)
  for (int T : {256, 1024, 2048, 4096, 8192, 16384}) shapes.push_back({std::max(1, 16384 / T), T});
  for (int T : {1024, 2048, 4096, 8192, 16384}) shapes.push_back({8, T});
  std::vector<Row> rows;
  for (const auto& [B, T] : shapes) {
    for (const char* path : {"naive", "flash"}) {
      Row r;
      r.B = B;
      r.T = T;
      r.path = path;
      tg::Config c;
      tg::apply_preset(c, "shakespeare-char");
      c.block_size = T;
      c.batch_size = B;
      c.attention = r.path == "naive" ? tg::Attention::Naive : tg::Attention::Flash;
      c.precision = tg::Precision::BF16;
      const tg::ModelConfig m{65, T, c.n_layer, c.n_head, c.n_embd, c.bias};
      r.need_gib = tg::GPTCuda<gpu::bf16>::bytes_needed(m, tg::run_shape(c)) / 1073741824.0;
      try {
        size_t free0 = 0, free1 = 0, total = 0;
        cudaMemGetInfo(&free0, &total);
        auto be = tg::make_cuda_backend(m, tg::run_shape(c));
        cudaMemGetInfo(&free1, &total);
        r.used_gib = (double)(free0 - free1) / 1073741824.0;
        const size_t BT = (size_t)c.batch_size * T;
        std::mt19937 g(1);
        std::vector<int32_t> x(BT), y(BT);
        for (size_t i = 0; i < BT; ++i) { x[i] = g() % 65; y[i] = g() % 65; }
        std::vector<double> ms;
        for (int s = 0; s < 13; ++s) {
          const auto t0 = std::chrono::steady_clock::now();
          be->forward_backward(x.data(), y.data(), (uint32_t)s);
          be->update(1e-4f, s + 1, be->grad_norm());
          be->grad_norm();
          cudaDeviceSynchronize();
          const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          if (s >= 3) ms.push_back(dt);  // three warm-up steps
        }
        std::sort(ms.begin(), ms.end());
        r.ms = ms[ms.size() / 2];
        r.tok_s = BT / (r.ms / 1e3);
        r.status = "ok";
      } catch (const std::exception& e) {
        r.status = std::string("does not fit: ") + e.what();
        r.status = r.status.substr(0, 60);
        cudaGetLastError();  // clear a sticky allocation error
      }
      std::printf("T=%5d B=%3d %-5s need %7.2f GiB  used %7.2f GiB  %9.2f ms/step  %10.0f tok/s  %s\n", T,
                  c.batch_size, path, r.need_gib, r.used_gib, r.ms, r.tok_s, r.status.c_str());
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  if (csv) {
    FILE* f = std::fopen(csv, "w");
    if (!f) {
      std::fprintf(stderr, "error: cannot write %s; check the path\n", csv);
      return 1;
    }
    std::fprintf(f, "B,T,path,need_gib,used_gib,ms_per_step,tokens_per_s,status\n");
    for (const Row& r : rows)
      std::fprintf(f, "%d,%d,%s,%.4f,%.4f,%.3f,%.1f,%s\n", r.B, r.T, r.path.c_str(), r.need_gib, r.used_gib, r.ms,
                   r.tok_s, r.status.c_str());
    std::fclose(f);
  }
  return 0;
}
