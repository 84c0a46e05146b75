// model/backend_cpu.cpp: the CPU backend: GPTCpu<float> plus AdamW and clipping from
// kernels/cpu/adamw.h.
#include <omp.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <string>

#include "../kernels/cpu/adamw.h"
#include "backend.h"
#include "errors.h"
#include "gpt_cpu.h"

namespace tg {

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Config& c, const ModelConfig& m, const RunShape& run) : c_(c), gpt_(m, run) {
    init_params(gpt_.params.data(), gpt_.table, c.seed);
  }
  std::string device_name() const override {
    return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)";
  }
  size_t memory_bytes() const override { return gpt_.memory_bytes(); }
  float forward_backward(const int32_t* x, const int32_t* y, uint32_t step) override {
    double loss = gpt_.forward(x, y, gpt_.run().B, gpt_.run().T, true, step);
    gpt_.backward();
    return (float)loss;
  }
  double grad_norm() override { return cpu::global_norm(gpt_.grads.data(), gpt_.grads.size()); }
  void update(float lr, int t, double norm) override {
    if (c_.grad_clip > 0) cpu::clip_grad_norm(gpt_.grads.data(), gpt_.grads.size(), norm, c_.grad_clip);
    for (const ParamSpec& p : gpt_.table)
      cpu::adamw_update(gpt_.params.data() + p.offset, gpt_.grads.data() + p.offset, gpt_.m.data() + p.offset,
                        gpt_.v.data() + p.offset, p.numel, lr, (float)c_.beta1, (float)c_.beta2, 1e-8f,
                        p.decay ? (float)c_.weight_decay : 0.0f, t);
  }
  float eval_loss(const int32_t* x, const int32_t* y) override {
    return (float)gpt_.forward(x, y, gpt_.run().B, gpt_.run().T, false, 0);
  }
  void generate_reset() override { gpt_.decode_reset(); }
  void generate_step(int32_t token, float* out) override {
    const float* logits = gpt_.decode_step(token);
    std::copy(logits, logits + gpt_.model().vocab_size, out);
  }
  std::vector<float> params() const override { return {gpt_.params.begin(), gpt_.params.end()}; }
  std::vector<float> grads() const override { return {gpt_.grads.begin(), gpt_.grads.end()}; }
  void adam_state(std::vector<float>& m, std::vector<float>& v) const override {
    m.assign(gpt_.m.begin(), gpt_.m.end());
    v.assign(gpt_.v.begin(), gpt_.v.end());
  }
  void set_state(const float* params, const float* m, const float* v) override {
    const size_t n = gpt_.params.size();
    std::copy(params, params + n, gpt_.params.begin());
    std::copy(m, m + n, gpt_.m.begin());
    std::copy(v, v + n, gpt_.v.begin());
  }

 private:
  Config c_;
  GPTCpu<float> gpt_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Config& c, const ModelConfig& m) {
  RunShape run;
  run.B = c.batch_size;
  run.T = c.block_size;
  run.dropout = c.dropout;
  run.flash = c.attention == "flash";
  run.seed = c.seed;
  // refuse, before allocating, a model that cannot fit in this machine's memory
  const double need = GPTCpu<float>::bytes_needed(m, run);
  const double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
  if (have > 0 && need > 0.9 * have) {
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "the model needs %.1f GiB of memory for its weights, optimizer state and activations "
                  "(B=%d, T=%d, %d layers, %d wide, %s attention) but this machine has %.1f GiB; expected at most 90%% "
                  "of it; reduce --batch-size, --block-size, --n-layer or --n-embd%s",
                  need / (1 << 30), c.batch_size, c.block_size, c.n_layer, c.n_embd, c.attention.c_str(),
                  have / (1 << 30), run.flash ? "" : " (or use --attention flash, which stores no T x T probabilities)");
    throw InputError(msg);
  }
  return std::make_unique<CpuBackend>(c, m, run);
}

}  // namespace tg
