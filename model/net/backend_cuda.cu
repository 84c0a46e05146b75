// model/net/backend_cuda.cu: the CUDA backend: GPTCuda<float> or GPTCuda<bf16> (model/net/gpt_cuda.cuh)
// behind the Backend interface. The weights start from the same host init as the CPU backend
// (init_params, copied to the device), so both backends begin from identical weights.
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "../../data/errors.h"
#include "../../kernels/attention.cuh"
#include "../../kernels/flash_attn.cuh"
#include "../../kernels/flash_attn_hopper.cuh"
#include "../run/dist.h"
#include "backend.h"
#include "gpt_cuda.cuh"
#include "shards.h"

#ifdef TG_HAVE_NCCL
#include <nccl.h>
#endif

namespace tg {

namespace {

// Dense bf16 tensor-core peak by device name (0 = unknown or emulated, no MFU printed): H100 SXM and H200
// 989 TFLOP/s, A100 312 TFLOP/s. Other parts (an H100 PCIe or NVL, consumer cards) print none
// rather than a wrong one.
double dense_bf16_peak(const std::string& name) {
  if (name.find("EMULATED") != std::string::npos) return 0;  // train_gpt_emu: no MFU of a CPU
  if (name.find("H200") != std::string::npos) return 989e12;
  if (name.find("H100") != std::string::npos &&
      (name.find("SXM") != std::string::npos || name.find("HBM3") != std::string::npos))
    return 989e12;
  if (name.find("A100") != std::string::npos) return 312e12;
  return 0;
}

#ifdef TG_HAVE_NCCL
// The NCCL communicator of the ranks (one GPU each): rank 0's unique id, broadcast over MPI
// (model/run/dist.h), then ncclCommInitRank on every rank. None (null) in a single process.
class Nccl {
 public:
  Nccl() {
    if (!dist::active()) return;
    ncclUniqueId id{};
    if (dist::rank() == 0) ncclCheck(ncclGetUniqueId(&id));
    dist::broadcast(&id, sizeof id, 0);
    ncclComm_t c = nullptr;
    ncclCheck(ncclCommInitRank(&c, dist::world(), id, dist::rank()));
    comm_ = c;
  }
  ~Nccl() {
    if (comm_) ncclCommDestroy(comm_);
  }
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;
  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};
#endif

template <typename T>
class CudaBackend final : public Backend {
 public:
  // routed: what the start-up line adds when the flash path was asked for and the naive one runs
  CudaBackend(const ModelConfig& m, const RunShape& run, std::string routed) : gpt_(m, run), routed_(std::move(routed)) {
    if (run.shard_ranks > 1) {
      shards_ = Shards(gpt_.n_params, run.shard_ranks);
      for (int r = 0; r < run.shard_ranks; ++r) counts_.push_back(shards_.count(r));
    }
    cudaDeviceProp prop{};
    cudaCheck(cudaGetDeviceProperties(&prop, gpt_.ctx().device));
    name_ = prop.name;
    std::vector<float> p(gpt_.n_params);
    init_params(p.data(), gpt_.table, run.seed);
    gpt_.upload_state(p.data(), nullptr, nullptr);
  }
  std::string device_name() const override {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s (compute capability %d.%d, %d SMs)", name_.c_str(), gpt_.ctx().cc_major,
                  gpt_.ctx().cc_minor, gpt_.ctx().sm_count);
    return buf;
  }
  size_t memory_bytes() const override { return gpt_.memory_bytes(); }
  std::string precision() const override { return std::is_same<T, float>::value ? "fp32" : "bf16"; }
  double peak_flops() const override { return dense_bf16_peak(name_); }
  std::string attention_note() const override {
    if (!routed_.empty()) return routed_;
    const int HS = gpt_.model().n_embd / gpt_.model().n_head, tile = gpu::flash_attn_tile_head_size(HS);
    if (gpt_.run().attention != gpu::AttentionPath::Flash && !gpt_.run().both_paths) return "";
    std::string note;
    if (tile != HS && tile != 0) note = "head size " + std::to_string(HS) + " padded to " + std::to_string(tile) + " in the flash kernels";
    if (std::is_same<T, gpu::bf16>::value) {
      const bool hopper = gpu::flash_attn_hopper_chosen(gpt_.ctx(), HS);
      std::string kernels = !hopper ? "mma.sync kernels"
                            : gpu::flash_attn_hopper_ws_backward() ? "Hopper wgmma kernels, warp-specialized backward"
                            : gpu::flash_attn_hopper_fused_dq() ? "Hopper wgmma kernels, dQ inside the dK / dV kernel"
                            : gpu::flash_attn_hopper_keep_producer() && gpu::flash_attn_tile_head_size(HS) <= 128
                                ? "Hopper wgmma kernels, keep decisions by the forward's producer warpgroup"
                            : !gpu::flash_attn_hopper_pipelined() && gpu::flash_attn_tile_head_size(HS) <= 128
                                ? "Hopper wgmma kernels, backward not pipelined"
                            : !gpu::flash_attn_hopper_wide_key_tiles() && gpu::flash_attn_tile_head_size(HS) <= 128
                                ? "Hopper wgmma kernels, forward on key tiles of 64"
                            : !gpu::flash_attn_hopper_three_consumers() && gpu::flash_attn_tile_head_size(HS) == 64
                                ? "Hopper wgmma kernels, forward with two consumer warpgroups"
                            : !gpu::flash_attn_hopper_turns() && gpu::flash_attn_tile_head_size(HS) <= 128
                                ? "Hopper wgmma kernels, forward's consumer warpgroups not taking turns"
                            : gpu::flash_attn_hopper_dropout_three_consumers() && gpu::flash_attn_tile_head_size(HS) == 64
                                ? "Hopper wgmma kernels, forward with dropout on three consumer warpgroups"
                                                                : "Hopper wgmma kernels";
      // a Hopper device the Hopper kernels do not serve at this head size: say why
      if (tile != 0 && gpu::flash_attn_hopper_device(gpt_.ctx()) && !gpu::flash_attn_hopper_head_size(tile))
        kernels += ": the Hopper kernels take head sizes above 32";
      note += std::string(note.empty() ? "" : "; ") + kernels;
    }
    return note.empty() ? "" : " (" + note + ")";
  }

  float forward_backward(const int32_t* x, const int32_t* y, uint32_t step, int micro = 0, int accum = 1,
                         int first_micro = 0) override {
    gpt_.forward(x, y, gpt_.run().B, gpt_.run().T, true, step, micro, accum);
    gpt_.backward(micro > first_micro);
    const StepStats s = gpt_.read_stats();  // the one synchronisation of the step
    norm_ = std::sqrt((double)s.norm_squared);
    return s.loss;
  }
  // Data parallelism: one ncclAllReduce (sum) of the fp32 gradient buffer on the step's stream,
  // then their norm again, of the sum: every rank then clips and updates alike.
  // ZeRO-1: one ncclReduceScatter instead (in place: rank r's shard of the padded buffer gets
  // its sum), the squared norm of each shard summed over the ranks by a one-float
  // ncclAllReduce: the same norm on every rank, to float rounding of the unsharded one (the
  // shards' sums are added as floats, the unsharded norm adds its blocks' partials in double).
  void reduce_grads() override {
    if (!dist::active()) return;
#ifdef TG_HAVE_NCCL
    const cudaStream_t stream = gpt_.ctx().stream;
    float* g = gpt_.device_grads();
    if (sharded()) {
      ncclCheck(ncclReduceScatter(g, g + (size_t)dist::rank() * shards_.size, shards_.size, ncclFloat, ncclSum,
                                  comm_.get(), stream));
      float* n2 = gpt_.shard_norm_squared();
      ncclCheck(ncclAllReduce(n2, n2, 1, ncclFloat, ncclSum, comm_.get(), stream));
    } else {
      ncclCheck(ncclAllReduce(g, g, gpt_.n_params, ncclFloat, ncclSum, comm_.get(), stream));
      gpt_.grads_changed();
    }
    norm_ = std::sqrt((double)gpt_.read_stats().norm_squared);
#endif
  }
  double grad_norm() override { return norm_; }
  // Clips by the norm on the device and applies AdamW; ZeRO-1: to this rank's shard, then one
  // ncclAllGather (in place) of the weights and their T copy refreshed. The device's norm is
  // grad_norm()'s: a caller passing another would have it silently ignored, so that is refused.
  void update(float lr, int t, double norm) override {
    if (!(norm == norm_ || (std::isnan(norm) && std::isnan(norm_))))
      throw std::logic_error("BackendCuda::update: the norm given (" + std::to_string(norm) +
                             ") is not grad_norm()'s (" + std::to_string(norm_) + "), which the device clips by");
    gpt_.update(lr, t);
    if (!sharded()) return;
#ifdef TG_HAVE_NCCL
    float* p = gpt_.device_params();
    ncclCheck(ncclAllGather(p + (size_t)dist::rank() * shards_.size, p, shards_.size, ncclFloat, comm_.get(),
                            gpt_.ctx().stream));
    gpt_.params_changed();
#endif
    gathered_.drop();
  }
  bool sharded() const override { return shards_.n != 0; }
  // ZeRO-1: each rank's shard of m and v to the host, gathered on rank 0 by MPI (model/run/dist.h).
  void gather_state() override {
    if (!sharded()) return;
    std::vector<float> m, v;
    gpt_.download_adam(m, v);
    gathered_.gather(m.data(), v.data(), shards_, counts_);
  }
  float eval_loss(const int32_t* x, const int32_t* y) override {
    gpt_.forward(x, y, gpt_.run().B, gpt_.run().T, false, 0);
    return gpt_.read_stats().loss;
  }
  // Generation with the KV cache of GPTCuda::decode_step (cropping past block_size as nanoGPT).
  void generate_reset() override { gpt_.decode_reset(); }
  void generate_step(int32_t token, float* out) override {
    gpt_.decode_step(token);
    gpt_.download_decode_logits(out);
  }
  std::vector<float> params() const override { return gpt_.download_params(); }
  std::vector<float> grads() const override { return gpt_.download_grads(); }
  void adam_state(std::vector<float>& m, std::vector<float>& v) const override {
    if (!sharded()) return gpt_.download_adam(m, v);
    gathered_.copy_to(m, v);
  }
  void set_state(const float* params, const float* m, const float* v) override { gpt_.upload_state(params, m, v); }

  void check_forward(const int32_t* x, const int32_t* y, uint32_t step) override {
    gpt_.forward(x, y, gpt_.run().B, gpt_.run().T, true, step);
  }
  // dO and dqkv go to the backward's own scratch for them; the layer's own output buffer is
  // rewritten (the check ends the run)
  AttentionOutputs check_layer(int layer, uint32_t step, const std::vector<float>& dout_f) override {
    const RunShape& r = gpt_.run();
    const ModelConfig& m = gpt_.model();
    const gpu::Context& ctx = gpt_.ctx();
    const int B = r.B, Tn = r.T, C = m.n_embd, NH = m.n_head;
    const size_t BTC = (size_t)B * Tn * C;
    std::vector<T> dout_t(BTC);
    for (size_t i = 0; i < BTC; ++i) dout_t[i] = gpu::from_float<T>(dout_f[i]);
    T* dout = gpt_.datty_scratch();
    T* dqkv = gpt_.dqkv_scratch();
    cudaCheck(cudaMemcpyAsync(dout, dout_t.data(), BTC * sizeof(T), cudaMemcpyHostToDevice, ctx.stream));
    std::vector<T> out_buf(BTC), dqkv_buf(3 * BTC);
    auto fetch = [&](const T* d, std::vector<T>& h) {
      cudaCheck(cudaMemcpyAsync(h.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost, ctx.stream));
      cudaCheck(cudaStreamSynchronize(ctx.stream));
      std::vector<float> f(h.size());
      for (size_t i = 0; i < h.size(); ++i) f[i] = gpu::to_float(h[i]);
      return f;
    };
    const auto L = gpt_.layer(layer);
    const philox::DropoutKey key = philox::make_dropout_key(r.seed, step, layer, philox::kSiteAttnProbs, r.dropout);
    AttentionOutputs o;
    int k = 0;
    for (gpu::AttentionPath path : {gpu::AttentionPath::Naive, gpu::AttentionPath::Flash}) {
      gpu::attention_forward(ctx, path, L.atty, L.saved, L.qkv, key, B, Tn, C, NH, true);
      cudaCheck(cudaMemsetAsync(dqkv, 0, 3 * BTC * sizeof(T), ctx.stream));
      gpu::attention_backward(ctx, path, dqkv, dout, L.qkv, L.atty, L.saved, key, B, Tn, C, NH, true);
      o.out[k] = fetch(L.atty, out_buf);
      o.dqkv[k] = fetch(dqkv, dqkv_buf);
      ++k;
    }
    return o;
  }

 private:
  GPTCuda<T> gpt_;
  std::string name_;
  double norm_ = 0;
  // ZeRO-1 (shards_.n == 0 without it): every rank's count, m and v gathered on rank 0
  Shards shards_;
  std::vector<size_t> counts_;
  GatheredAdam gathered_;
#ifdef TG_HAVE_NCCL
  Nccl comm_;
#endif
  std::string routed_;
};

template <typename T>
std::unique_ptr<Backend> make(const ModelConfig& m, const RunShape& run, const std::string& routed) {
  // refuse, before allocating, a model that cannot fit in the device's free memory
  size_t free_b = 0, total_b = 0;
  cudaCheck(cudaMemGetInfo(&free_b, &total_b));
  const size_t need = GPTCuda<T>::bytes_needed(m, run);
  if (need > free_b) {
    char msg[768];
    std::snprintf(msg, sizeof msg,
                  "the model needs %.2f GiB of GPU memory (micro-batch B=%d, T=%d, x%d accumulated = %lld tokens per step, "
                  "%d layers, %d wide, %s attention, %s) but the GPU has %.2f GiB free of %.2f GiB; expected it to fit; "
                  "reduce --batch-size (raising --grad-accum keeps the tokens per step) or --block-size%s",
                  need / 1073741824.0, run.B, run.T, run.accum, (long long)run.B * run.T * run.accum, m.n_layer, m.n_embd,
                  attention_name(run), std::is_same<T, float>::value ? "fp32" : "bf16", free_b / 1073741824.0,
                  total_b / 1073741824.0,
                  run.attention == gpu::AttentionPath::Naive ? ", or use --attention flash (no T x T probabilities)"
                                                             : ", or use --precision bf16");
    throw InputError(msg);
  }
  return std::make_unique<CudaBackend<T>>(m, run, routed);
}

}  // namespace

CudaDevices cuda_backend_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
#ifdef TG_SIMT_EMULATION
  return {true, n, true};  // train_gpt_emu: the device is the SIMT emulator of tests/emu
#else
  return {true, n, false};
#endif
}

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& m, const RunShape& run) {
#ifndef TG_HAVE_NCCL
  if (dist::active())
    throw InputError("--device cuda with " + std::to_string(dist::world()) + " ranks: this train_gpt was built without "
                     "NCCL, which the GPUs' all-reduce needs; expected nccl.h and libnccl in the CUDA toolkit or /usr; "
                     "install NCCL and rebuild, or pass --device cpu");
#endif
  if (dist::active()) {  // one GPU per rank: the local rank's
    const int gpus = cuda_backend_devices().count;
    if (dist::local_rank() >= gpus)
      throw RuntimeError("rank " + std::to_string(dist::rank()) + " is local rank " + std::to_string(dist::local_rank()) +
                         " on its machine, which has " + std::to_string(gpus) + " visible GPU(s); expected one GPU per rank; "
                         "start at most that many ranks per machine (mpirun -np, or a hostfile's slots)");
    if (cudaSetDevice(dist::local_rank()) != cudaSuccess)
      throw RuntimeError("cudaSetDevice(" + std::to_string(dist::local_rank()) + ") failed on rank " +
                         std::to_string(dist::rank()) + "; expected a usable GPU per rank; check CUDA_VISIBLE_DEVICES");
  }
  int dev = 0;
  cudaDeviceProp prop{};
  cudaCheck(cudaGetDevice(&dev));
  cudaCheck(cudaGetDeviceProperties(&prop, dev));
  const int HS = m.n_embd / m.n_head;
  std::string why;
  if (run.attention == gpu::AttentionPath::Flash && !gpu::attention_supported(run.attention, HS, &why))
    throw InputError(std::string("--attention ") + attention_name(run) + " with head size " + std::to_string(HS) +
                     " (n-embd " + std::to_string(m.n_embd) + " / n-head " + std::to_string(m.n_head) + "): " + why +
                     "; change --n-embd or --n-head, or pass --attention naive");
  const bool bf16_ok = prop.major >= 8;
  if (run.precision == Precision::BF16 && !bf16_ok)
    throw InputError(std::string("--precision bf16 on ") + prop.name + " (compute capability " +
                     std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                     "); expected compute capability 8.0 or newer; pass --precision fp32");
  const bool bf16 = run.precision == Precision::BF16 || (run.precision == Precision::Auto && bf16_ok);
  // a part whose shared memory a block is less than the flash kernels' tiles need at this head
  // size (the consumer parts' 99 KB from head size 128 on): the naive path runs the model and the
  // start-up line says so; --attention check, which needs both paths, is refused
  RunShape shape = run;
  std::string routed;
  const size_t need = run.attention == gpu::AttentionPath::Flash ? gpu::flash_attn_smem_bytes(HS, bf16) : 0;
  if (need > prop.sharedMemPerBlockOptin) {
    const std::string what = "head size " + std::to_string(HS) + ": the flash kernels need " +
                             std::to_string((need + 1023) / 1024) + " KB of shared memory a block, this GPU allows " +
                             std::to_string(prop.sharedMemPerBlockOptin / 1024) + " KB";
    if (run.both_paths)
      throw InputError("--attention check on " + std::string(prop.name) + " with " + what +
                       "; expected a GPU with more (an A100 or H100) for this head size; pass --attention naive, or a "
                       "smaller head size (--n-embd / --n-head)");
    shape.attention = gpu::AttentionPath::Naive;
    routed = " routed to naive (" + what + "; the naive path stores T x T probabilities)";
  }
  return bf16 ? make<gpu::bf16>(m, shape, routed) : make<float>(m, shape, routed);
}

}  // namespace tg
