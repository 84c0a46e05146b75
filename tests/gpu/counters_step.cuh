// tests/gpu/counters_step.cuh: the training step whose kernels tests/emu/test_kernel_counters.cpp
// counts under the emulator (the kernel profiler) and whose kernels .ci/gpu_check.sh's counters
// stage measures with Nsight Compute on a GPU (build/test_gpu, "gpu model: one step at the
// kernel counters' shape"): one forward, backward and AdamW update of the shakespeare-char width
// (C = 384, NH = 6, HS = 64, one layer, dropout 0.2, bf16) at B = 1, T = 128.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "../../model/gpt.h"
#include "../../model/gpt_cuda.cuh"

namespace tg_test {

class CountersStep {
 public:
  static constexpr int kT = 128, kV = 65;
  // Builds the model with its initial weights and synchronises: run() is the step alone.
  explicit CountersStep(gpu::AttentionPath path) : gpt_(model(), shape(path)), x_(kT), y_(kT) {
    const std::vector<tg::ParamSpec> table = tg::param_table(model());
    std::vector<float> w(table.back().offset + table.back().numel);
    tg::init_params(w.data(), table, 3);
    gpt_.upload_state(w.data(), nullptr, nullptr);
    std::mt19937 g(5);
    for (int i = 0; i < kT; ++i) x_[i] = (int32_t)(g() % kV), y_[i] = (int32_t)(g() % kV);
    cudaDeviceSynchronize();
  }
  // One step; returns its loss (synchronising).
  float run() {
    gpt_.forward(x_.data(), y_.data(), 1, kT, true, 1);
    gpt_.backward();
    gpt_.update(1e-3f, 1);
    const float loss = gpt_.read_stats().loss;
    cudaDeviceSynchronize();
    return loss;
  }

 private:
  static tg::ModelConfig model() { return tg::ModelConfig{kV, kT, 1, 6, 384, false, kV}; }
  static tg::CudaRunShape shape(gpu::AttentionPath path) {
    tg::CudaRunShape rs;
    rs.B = 1;
    rs.T = kT;
    rs.dropout = 0.2;
    rs.path = path;
    return rs;
  }
  tg::GPTCuda<gpu::bf16> gpt_;
  std::vector<int32_t> x_, y_;
};

}  // namespace tg_test
