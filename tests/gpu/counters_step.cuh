// tests/gpu/counters_step.cuh: the training step whose kernels tests/emu/test_kernel_counters.cpp
// counts under the emulator (the kernel profiler) and whose kernels .ci/gpu_check.sh's counters
// stage measures with Nsight Compute on a GPU (build/test_gpu, "gpu model: one step at the
// kernel counters' shape"): one forward, backward and AdamW update of the shakespeare-char width
// (C = 384, NH = 6, HS = 64, one layer, dropout 0.2, bf16 unless the type says fp32) at B = 1, T = 128.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "../../model/net/gpt.h"
#include "../../model/net/gpt_cuda.cuh"

namespace tg_test {

template <typename S = gpu::bf16>
class CountersStep {
 public:
  static constexpr int kV = 65;
  // Builds the model with its initial weights and synchronises: run() is the step alone. T: the
  // sequence length (128 for the counters; longer makes the flash kernels refill their stages).
  explicit CountersStep(gpu::AttentionPath path, int T = 128)
      : T_(T), gpt_(model(T), shape(path, T)), x_((size_t)T), y_((size_t)T) {
    const std::vector<tg::ParamSpec> table = tg::param_table(model(T));
    std::vector<float> w(table.back().offset + table.back().numel);
    tg::init_params(w.data(), table, 3);
    gpt_.upload_state(w.data(), nullptr, nullptr);
    std::mt19937 g(5);
    for (int i = 0; i < T; ++i) x_[i] = (int32_t)(g() % kV), y_[i] = (int32_t)(g() % kV);
    cudaDeviceSynchronize();
  }
  // One step; returns its loss (synchronising).
  float run() {
    gpt_.forward(x_.data(), y_.data(), 1, T_, true, 1);
    gpt_.backward();
    gpt_.update(1e-3f, 1);
    const float loss = gpt_.read_stats().loss;
    cudaDeviceSynchronize();
    return loss;
  }

 private:
  static tg::ModelConfig model(int T) { return tg::ModelConfig{kV, T, 1, 6, 384, false, kV}; }
  static tg::RunShape shape(gpu::AttentionPath path, int T) {
    tg::RunShape rs;
    rs.B = 1;
    rs.T = T;
    rs.dropout = 0.2;
    rs.attention = path;
    return rs;
  }
  int T_;
  tg::GPTCuda<S> gpt_;
  std::vector<int32_t> x_, y_;
};

}  // namespace tg_test
