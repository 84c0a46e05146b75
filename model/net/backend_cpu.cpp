// model/net/backend_cpu.cpp: the CPU backend: GPTCpu<float> plus AdamW and clipping from
// kernels/cpu/adamw.h.
#include <omp.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <string>

#include "../../data/errors.h"
#include "../../kernels/cpu/adamw.h"
#include "../../kernels/cpu/attention_naive.h"
#include "../../kernels/cpu/attention_tiled.h"
#include "../run/dist.h"
#include "attention_check.h"
#include "backend.h"
#include "gpt_cpu.h"
#include "shards.h"

namespace tg {

namespace {

static_assert(kShardAlign % cpu::kNormChunk == 0, "a shard must be whole chunks of the norm's partial sums");

// ZeRO-1 on the CPU's ranks (model/net/shards.h): --zero 1 and more than one rank.
bool zero1(const Config& c) { return c.zero == 1 && dist::world() > 1; }

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Config& c, const ModelConfig& m, const RunShape& run) : c_(c), gpt_(m, run) {
    init_params(gpt_.params.data(), gpt_.table, c.seed);
    if (zero1(c)) {
      shards_ = Shards(gpt_.params.size(), dist::world());
      for (int r = 0; r < dist::world(); ++r) counts_.push_back(shards_.count(r));
      b_ = shards_.begin(dist::rank());
      n_ = shards_.count(dist::rank());
      part_.assign(shards_.padded() / cpu::kNormChunk, 0.0);
    } else {
      n_ = gpt_.params.size();
    }
  }
  std::string device_name() const override {
    return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)";
  }
  size_t memory_bytes() const override { return gpt_.memory_bytes() + part_.size() * sizeof(double); }
  float forward_backward(const int32_t* x, const int32_t* y, uint32_t step, int micro = 0, int accum = 1,
                         int first_micro = 0) override {
    double loss = gpt_.forward(x, y, gpt_.run().B, gpt_.run().T, true, step, micro, accum);
    gpt_.backward(micro > first_micro);
    return (float)loss;
  }
  // Unsharded: one MPI_Allreduce of the gradients. ZeRO-1: one MPI_Reduce_scatter in place:
  // the rank's shard of grads becomes the sum (the rest of grads is then undefined). With two
  // ranks each element is a + b either way: the same bits.
  void reduce_grads() override {
    if (shards_.n == 0) return dist::all_reduce_sum(gpt_.grads.data(), gpt_.grads.size());
    dist::reduce_scatter_sum(gpt_.grads.data(), counts_);
  }
  // ZeRO-1: the norm's chunk sums of each shard (whole chunks: kShardAlign), all-gathered and
  // added in order on every rank: bit for bit cpu::global_norm of the whole summed vector.
  double grad_norm() override {
    if (shards_.n == 0) return cpu::global_norm(gpt_.grads.data(), gpt_.grads.size());
    const size_t per = shards_.size / cpu::kNormChunk;
    std::fill(part_.begin(), part_.end(), 0.0);
    cpu::norm_partials(gpt_.grads.data() + b_, n_, part_.data() + (size_t)dist::rank() * per);
    dist::all_gather(part_.data(), std::vector<size_t>((size_t)dist::world(), per));
    double s = 0.0;
    for (double p : part_) s += p;  // in order; the chunks past the end are 0 and change nothing
    return std::sqrt(s);
  }
  // Clipping and AdamW are elementwise: one parallel region, each thread taking its share of
  // every tensor (the same result for any split). ZeRO-1: of every tensor's part inside this
  // rank's shard [b_, b_ + n_) (m and v hold the shard alone), each part with its tensor's
  // decay; then the weights are all-gathered.
  void update(float lr, int t, double norm) override {
    const size_t e = b_ + n_;
#pragma omp parallel
    {
      const size_t th = (size_t)omp_get_thread_num(), nth = (size_t)omp_get_num_threads();
      for (const ParamSpec& p : gpt_.table) {
        const size_t lo = std::max(p.offset, b_), hi = std::min(p.offset + p.numel, e);
        if (lo >= hi) continue;
        const size_t i0 = lo + (hi - lo) * th / nth, n = lo + (hi - lo) * (th + 1) / nth - i0;
        if (c_.grad_clip > 0) cpu::clip_grad_norm(gpt_.grads.data() + i0, n, norm, c_.grad_clip);
        cpu::adamw_update(gpt_.params.data() + i0, gpt_.grads.data() + i0, gpt_.m.data() + (i0 - b_),
                          gpt_.v.data() + (i0 - b_), n, lr, (float)c_.beta1, (float)c_.beta2, 1e-8f,
                          p.decay ? (float)c_.weight_decay : 0.0f, t);
      }
    }
    if (shards_.n == 0) return;
    dist::all_gather(gpt_.params.data(), counts_);
    gathered_.drop();
  }
  bool sharded() const override { return shards_.n != 0; }
  void gather_state() override {
    if (shards_.n == 0) return;
    gathered_.gather(gpt_.m.data(), gpt_.v.data(), shards_, counts_);
  }
  float eval_loss(const int32_t* x, const int32_t* y) override {
    return (float)gpt_.forward(x, y, gpt_.run().B, gpt_.run().T, false, 0);
  }
  void generate_reset() override { gpt_.decode_reset(); }
  void generate_step(int32_t token, float* out) override {
    const float* logits = gpt_.decode_step(token);
    std::copy(logits, logits + gpt_.model().vocab_size, out);
  }
  std::vector<AttentionDiff> attention_check(const int32_t* x, const int32_t* y, uint32_t step) override {
    const RunShape& r = gpt_.run();
    const ModelConfig& m = gpt_.model();
    const int B = r.B, T = r.T, C = m.n_embd, NH = m.n_head;
    const size_t BTC = (size_t)B * T * C;
    gpt_.forward(x, y, B, T, true, step);
    std::vector<float> out_n(BTC), out_f(BTC), att((size_t)B * NH * T * T), lse((size_t)B * NH * T);
    const std::vector<float> dout = attention_check_dout(BTC, c_.seed);
    std::vector<AttentionDiff> diffs;
    for (int li = 0; li < m.n_layer; ++li) {
      const float* qkv = gpt_.layer_qkv(li);
      const philox::DropoutKey key = philox::make_dropout_key(r.seed, step, li, philox::kSiteAttnProbs, r.dropout);
      std::vector<float> dqkv_n(3 * BTC, 0.0f), dqkv_f(3 * BTC, 0.0f);
      cpu::attention_naive_forward(out_n.data(), att.data(), qkv, key, B, T, C, NH, true, nullptr);
      cpu::attention_naive_backward(dqkv_n.data(), dout.data(), qkv, att.data(), key, B, T, C, NH, true);
      cpu::attention_tiled_forward(out_f.data(), lse.data(), qkv, key, B, T, C, NH, true, r.Br, r.Bc, nullptr);
      cpu::attention_tiled_backward(dqkv_f.data(), dout.data(), qkv, out_f.data(), lse.data(), key, B, T, C, NH, true,
                                    r.Br, r.Bc);
      diffs.push_back(attention_diff(out_n, out_f, dqkv_n, dqkv_f, C));
    }
    return diffs;
  }
  std::vector<float> params() const override { return {gpt_.params.begin(), gpt_.params.end()}; }
  std::vector<float> grads() const override { return {gpt_.grads.begin(), gpt_.grads.end()}; }
  void adam_state(std::vector<float>& m, std::vector<float>& v) const override {
    if (shards_.n == 0) {
      m.assign(gpt_.m.begin(), gpt_.m.end());
      v.assign(gpt_.v.begin(), gpt_.v.end());
      return;
    }
    gathered_.copy_to(m, v);
  }
  HostState host_state() const override {
    if (shards_.n == 0) return {gpt_.params.data(), gpt_.m.data(), gpt_.v.data()};
    if (!gathered_.valid()) return {};
    return {gpt_.params.data(), gathered_.m.data(), gathered_.v.data()};
  }
  // Every rank is given the whole state (a checkpoint is world-size independent): ZeRO-1 keeps
  // its shard of m and v.
  void set_state(const float* params, const float* m, const float* v) override {
    const size_t n = gpt_.params.size();
    std::copy(params, params + n, gpt_.params.begin());
    std::copy(m + b_, m + b_ + n_, gpt_.m.begin());
    std::copy(v + b_, v + b_ + n_, gpt_.v.begin());
  }

 private:
  Config c_;
  GPTCpu<float> gpt_;
  // ZeRO-1 (shards_.n == 0 without it): this rank's shard [b_, b_ + n_) (unsharded: all, b_ = 0),
  // every rank's count, the norm's chunk sums (padded shards, in order), and m and v gathered on
  // rank 0 for a checkpoint
  Shards shards_;
  std::vector<size_t> counts_;
  size_t b_ = 0, n_ = 0;
  GatheredAdam gathered_;
  std::vector<double> part_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Config& c, const ModelConfig& m, double host_bytes_held) {
  RunShape run;
  run.B = c.batch_size;
  run.T = c.block_size;
  run.dropout = c.dropout;
  run.flash = c.attention != "naive";
  run.seed = c.seed;
  run.gelu = gelu_form(c);
  if (zero1(c)) run.opt_elems = Shards(param_count(param_table(m)), dist::world()).size;
  // refuse, before allocating, a model that cannot fit in this machine's memory
  const double need = GPTCpu<float>::bytes_needed(m, run) + host_bytes_held;
  const double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
  if (have > 0 && need > 0.9 * have) {
    char msg[768];
    std::snprintf(msg, sizeof msg,
                  "the model needs %.1f GiB of memory for its weights, optimizer state and activations "
                  "(and its data and a checkpoint being loaded; micro-batch B=%d, T=%d, x%d accumulated = %lld tokens per step, "
                  "%d layers, %d wide, %s attention) but this machine has %.1f GiB; expected at most 90%% "
                  "of it; reduce --batch-size (raising --grad-accum keeps the tokens per step), --block-size, --n-layer or --n-embd%s",
                  need / (1 << 30), c.batch_size, c.block_size, c.grad_accum,
                  (long long)c.batch_size * c.block_size * c.grad_accum, c.n_layer, c.n_embd, c.attention.c_str(),
                  have / (1 << 30), run.flash ? "" : " (or use --attention flash, which stores no T x T probabilities)");
    throw InputError(msg);
  }
  return std::make_unique<CpuBackend>(c, m, run);
}

}  // namespace tg
