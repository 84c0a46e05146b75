// model/net/backend_cpu.cpp: the CPU backend: GPTCpu<float> (model/net/gpt_cpu.h) behind the
// Backend interface, with MPI's collectives for data parallelism.
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
#include "backend.h"
#include "gpt_cpu.h"
#include "shards.h"

namespace tg {

namespace {

static_assert(kShardAlign % cpu::kNormChunk == 0, "a shard must be whole chunks of the norm's partial sums");

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelConfig& m, const RunShape& run) : gpt_(m, run) {
    init_params(gpt_.params.data(), gpt_.table, run.seed);
    const RankShard mine(gpt_.params.size(), run);
    b_ = mine.begin;
    n_ = mine.count;
    if (run.shard_ranks > 1) {
      shards_ = Shards(gpt_.params.size(), run.shard_ranks);
      for (int r = 0; r < run.shard_ranks; ++r) counts_.push_back(shards_.count(r));
      part_.assign(shards_.padded() / cpu::kNormChunk, 0.0);
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
  // Clipping and AdamW: GPTCpu::update (ZeRO-1: of this rank's shard), then the weights all-gathered.
  void update(float lr, int t, double norm) override {
    gpt_.update(lr, t, norm);
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
  void check_forward(const int32_t* x, const int32_t* y, uint32_t step) override {
    gpt_.forward(x, y, gpt_.run().B, gpt_.run().T, true, step);
  }
  AttentionOutputs check_layer(int layer, uint32_t step, const std::vector<float>& dout) override {
    const RunShape& r = gpt_.run();
    const ModelConfig& m = gpt_.model();
    const int B = r.B, T = r.T, C = m.n_embd, NH = m.n_head;
    const size_t BTC = (size_t)B * T * C;
    const float* qkv = gpt_.layer_qkv(layer);
    const philox::DropoutKey key = philox::make_dropout_key(r.seed, step, layer, philox::kSiteAttnProbs, r.dropout);
    std::vector<float> att((size_t)B * NH * T * T), lse((size_t)B * NH * T);
    AttentionOutputs o;
    for (int k = 0; k < 2; ++k) {
      o.out[k].assign(BTC, 0.0f);
      o.dqkv[k].assign(3 * BTC, 0.0f);
    }
    cpu::attention_naive_forward(o.out[0].data(), att.data(), qkv, key, B, T, C, NH, true, nullptr);
    cpu::attention_naive_backward(o.dqkv[0].data(), dout.data(), qkv, att.data(), key, B, T, C, NH, true);
    cpu::attention_tiled_forward(o.out[1].data(), lse.data(), qkv, key, B, T, C, NH, true, r.Br, r.Bc, nullptr);
    cpu::attention_tiled_backward(o.dqkv[1].data(), dout.data(), qkv, o.out[1].data(), lse.data(), key, B, T, C, NH,
                                  true, r.Br, r.Bc);
    return o;
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

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& m, const RunShape& run, double host_bytes_held) {
  // refuse, before allocating, a model that cannot fit in this machine's memory
  const double need = GPTCpu<float>::bytes_needed(m, run) + host_bytes_held;
  const double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
  if (have > 0 && need > 0.9 * have) {
    const bool flash = run.attention == AttentionPath::Flash;
    char msg[768];
    std::snprintf(msg, sizeof msg,
                  "the model needs %.1f GiB of memory for its weights, optimizer state and activations "
                  "(and its data and a checkpoint being loaded; micro-batch B=%d, T=%d, x%d accumulated = %lld tokens per step, "
                  "%d layers, %d wide, %s attention) but this machine has %.1f GiB; expected at most 90%% "
                  "of it; reduce --batch-size (raising --grad-accum keeps the tokens per step), --block-size, --n-layer or --n-embd%s",
                  need / (1 << 30), run.B, run.T, run.accum, (long long)run.B * run.T * run.accum, m.n_layer, m.n_embd,
                  attention_name(run), have / (1 << 30), flash ? "" : " (or use --attention flash, which stores no T x T probabilities)");
    throw InputError(msg);
  }
  return std::make_unique<CpuBackend>(m, run);
}

}  // namespace tg
