// model/net/run_shape.h: what a run fixes besides the architecture (ModelConfig, gpt.h): the one
// description both backends are made from (model/net/backend.h) and the GPT call sequences take
// (GPTCpu, GPTCuda). model/run/ fills it from the command line (run_shape, model/run/train.h);
// nothing below model/run/ sees the command line's Config.
#pragma once
#include <cstdint>

#include "../../kernels/attention_path.h"
#include "../../kernels/gelu_form.h"

namespace tg {

// --device: auto (a GPU when one is visible and the build has the CUDA backend) | cpu | cuda
enum class Device { Auto, Cpu, Cuda };
// --precision: auto (bf16 on a GPU of compute capability 8.0 or newer, else fp32) | bf16 | fp32.
// The CPU backend runs fp32.
enum class Precision { Auto, BF16, FP32 };

// Each value as the flags and the saved config spell it.
inline const char* name(Device d) { return d == Device::Cpu ? "cpu" : d == Device::Cuda ? "cuda" : "auto"; }
inline const char* name(Precision p) { return p == Precision::BF16 ? "bf16" : p == Precision::FP32 ? "fp32" : "auto"; }
inline const char* name(AttentionPath a) { return a == AttentionPath::Naive ? "naive" : "flash"; }
inline const char* name(GeluForm g) { return g == GeluForm::Erf ? "erf" : "tanh"; }

struct RunShape {
  int B = 1, T = 1;    // micro-batch size, sequence length (<= block_size)
  int accum = 1;       // micro-batches per optimizer step and rank (said in messages: tokens per step)
  double dropout = 0.0;  // p at every site while training
  AttentionPath attention = AttentionPath::Flash;
  bool both_paths = false;  // --attention check: room for what both paths save (model/net/attention_check.h)
  GeluForm gelu = GeluForm::Tanh;  // the MLP's activation (kernels/gelu_form.h)
  Precision precision = Precision::Auto;
  uint64_t seed = 1337;  // the weights' init and the dropout masks
  // AdamW (decoupled weight decay on 2-D weights) after clipping the global norm to grad_clip (0: off)
  double grad_clip = 1.0, beta1 = 0.9, beta2 = 0.99, weight_decay = 0.1;
  // ZeRO-1 (--zero 1 on several ranks, model/net/shards.h): the AdamW state is sharded over
  // shard_ranks ranks, of which this is shard_rank (1: every rank holds all of it)
  int shard_ranks = 1, shard_rank = 0;
  // the CPU reference's own: tile sizes of attention_tiled, and batch slices run in parallel (see
  // GPTCpu; 0: one per OpenMP thread). The CUDA kernels fix their tiles themselves.
  int Br = 64, Bc = 64, slices = 0;
};

// The run's attention as --attention names it: check for the check's run (both paths), else its path.
inline const char* attention_name(const RunShape& r) { return r.both_paths ? "check" : name(r.attention); }

}  // namespace tg
