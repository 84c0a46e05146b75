// model/net/attention_check.h: --attention check, a mode of its own: on one training batch, the
// two attention paths (naive and flash) compared layer by layer on either backend, forward and
// backward, with the same dropout masks. The backends give each layer's outputs of both paths
// (Backend::check_forward, check_layer); the comparison is here, once.
#pragma once
#include <cstdint>
#include <vector>

#include "backend.h"

namespace tg {

// Per layer, the largest |flash - naive| of O, dQ, dK and dV, each divided by the largest
// |naive| of that tensor (0 when both are all zero).
struct AttentionDiff {
  double o = 0, dq = 0, dk = 0, dv = 0;
};

// One training forward of x, y (run.B, run.T) with dropout keyed by step, then for every layer
// both attention paths on that layer's qkv, the backward of a fixed pseudo-random dO (a pure
// function of run.seed).
std::vector<AttentionDiff> attention_check(Backend& be, const ModelConfig& m, const RunShape& run, const int32_t* x,
                                           const int32_t* y, uint32_t step);

// n values uniform in [-1, 1), a pure function of seed (the dO of the check).
std::vector<float> attention_check_dout(size_t n, uint64_t seed);

// The largest |flash - naive| of O (B, T, C) and of the q, k, v thirds of dqkv (B, T, 3C),
// each divided by the largest |naive| of that tensor (0 when both are all zero).
AttentionDiff attention_diff(const std::vector<float>& out_naive, const std::vector<float>& out_flash,
                             const std::vector<float>& dqkv_naive, const std::vector<float>& dqkv_flash, int C);

}  // namespace tg
