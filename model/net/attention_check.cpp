// model/net/attention_check.cpp: see model/net/attention_check.h.
#include "attention_check.h"

#include <algorithm>
#include <cmath>

#include "../../kernels/philox.h"

namespace tg {

std::vector<float> attention_check_dout(size_t n, uint64_t seed) {
  std::vector<float> d(n);
  for (size_t i = 0; i < n; i += 4) {
    // the sampling stream at indices past any sample: never used for anything else here
    philox::U32x4 r = philox::stream_words(seed, philox::kStreamSample, (uint32_t)(i >> 2), (uint32_t)(i >> 34), 1);
    for (size_t w = 0; w < 4 && i + w < n; ++w) d[i + w] = (float)(r.v[w] * (2.0 / 4294967296.0) - 1.0);
  }
  return d;
}

namespace {
// max |a - b| / max |b| over the columns [c0, c0 + C) of rows of width `width`
double rel_diff(const std::vector<float>& b, const std::vector<float>& a, int width, int c0, int C) {
  double num = 0, den = 0;
  for (size_t r = 0; r < b.size() / width; ++r)
    for (int c = c0; c < c0 + C; ++c) {
      const size_t i = r * width + c;
      const double d = std::fabs((double)a[i] - b[i]);
      num = std::isfinite(d) ? std::max(num, d) : INFINITY;
      den = std::max(den, std::fabs((double)b[i]));
    }
  return den > 0 ? num / den : num;
}
}  // namespace

AttentionDiff attention_diff(const std::vector<float>& out_naive, const std::vector<float>& out_flash,
                             const std::vector<float>& dqkv_naive, const std::vector<float>& dqkv_flash, int C) {
  AttentionDiff d;
  d.o = rel_diff(out_naive, out_flash, C, 0, C);
  d.dq = rel_diff(dqkv_naive, dqkv_flash, 3 * C, 0, C);
  d.dk = rel_diff(dqkv_naive, dqkv_flash, 3 * C, C, C);
  d.dv = rel_diff(dqkv_naive, dqkv_flash, 3 * C, 2 * C, C);
  return d;
}

std::vector<AttentionDiff> attention_check(Backend& be, const ModelConfig& m, const RunShape& run, const int32_t* x,
                                           const int32_t* y, uint32_t step) {
  be.check_forward(x, y, step);
  const std::vector<float> dout = attention_check_dout((size_t)run.B * run.T * m.n_embd, run.seed);
  std::vector<AttentionDiff> diffs;
  for (int layer = 0; layer < m.n_layer; ++layer) {
    const Backend::AttentionOutputs o = be.check_layer(layer, step, dout);
    diffs.push_back(attention_diff(o.out[0], o.out[1], o.dqkv[0], o.dqkv[1], m.n_embd));
  }
  return diffs;
}

}  // namespace tg
