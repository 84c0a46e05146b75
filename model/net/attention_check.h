// model/net/attention_check.h: what --attention check shares between the backends: the dO it
// back-propagates and the per-layer comparison of the two attention paths (see
// Backend::attention_check in model/net/backend.h).
#pragma once
#include <cstdint>
#include <vector>

#include "backend.h"

namespace tg {

// n values uniform in [-1, 1), a pure function of seed (the dO of the check).
std::vector<float> attention_check_dout(size_t n, uint64_t seed);

// The largest |flash - naive| of O (B, T, C) and of the q, k, v thirds of dqkv (B, T, 3C),
// each divided by the largest |naive| of that tensor (0 when both are all zero).
Backend::AttentionDiff attention_diff(const std::vector<float>& out_naive, const std::vector<float>& out_flash,
                                      const std::vector<float>& dqkv_naive, const std::vector<float>& dqkv_flash,
                                      int C);

}  // namespace tg
