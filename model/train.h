// model/train.h: the training loop (nanoGPT's train.py, one process) and sampling, over any
// Backend.
#pragma once
#include <functional>
#include <ostream>
#include <string>

#include "../data/dataset.h"
#include "backend.h"
#include "config.h"

namespace tg {

constexpr int kMaxBadSteps = 5;

// Asks a running train() to stop after its current step (it writes a checkpoint first): the
// SIGINT / SIGTERM handler calls it. Async-signal-safe.
void request_stop();

struct TrainSummary {
  int steps = 0;                 // training steps run (updates applied + skipped)
  int skipped = 0;               // updates skipped by the NaN guard
  bool stopped = false;          // request_stop() ended the run early (checkpoint written)
  double best_val_loss = 0;      // over every evaluation
  double final_train_loss = 0;   // evaluation at the end
  double final_val_loss = 0;
  double wall_s = 0;             // whole loop, evaluations included
  double median_step_ms = 0;     // one training step (forward, backward, update)
};

// Mean loss over c.eval_iters fixed batches of a split (0 train, 1 val).
double estimate_loss(Backend& be, const Config& c, const data::Dataset& ds, int split);

// Trains for c.max_iters steps: a batch per step (data::train_batch), forward + backward,
// clip, AdamW with lr_at(step); evaluates at every eval_interval and at the end; logs every
// log_interval steps to log and, as one JSON object per logged step, to metrics (may be null).
// A step whose loss or gradient norm is not finite applies no update (logged, and written to
// metrics as {"step": N, "train_loss": null, "skipped": true}); kMaxBadSteps such steps in a
// row throw RuntimeError. Tests inject NaN losses with TG_INJECT_NAN="step,step,...".
// Resuming: start_step is the first step to run and updates the AdamW updates applied before
// it; checkpoint (may be empty) is called with (next step, updates applied) after every
// c.ckpt_interval-th step and once at the end, when the backend holds that state.
TrainSummary train(Backend& be, const Config& c, const data::Dataset& ds, std::ostream& log, std::ostream* metrics,
                   int start_step = 0, int updates = 0,
                   const std::function<void(int next_step, int updates)>& checkpoint = nullptr);

// Generates c.sample_tokens characters after c.prompt (temperature, then top-k, then top-p
// with c.top_p, 1 = off), writing each to out as it comes; returns the whole text (prompt
// included). The prompt must encode. The prompt and each new token go through the backend's
// KV cache (generate_reset / generate_step), one step per token. Token n of the text is drawn
// with one uniform from philox::stream_words(seed, kStreamSample, n, 0, 0).
std::string sample(Backend& be, const Config& c, const data::CharTokenizer& tok, std::ostream& out);

}  // namespace tg
