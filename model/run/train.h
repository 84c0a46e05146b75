// model/run/train.h: the training loop (nanoGPT's train.py, one process) and sampling, over any
// Backend.
#pragma once
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "../../data/dataset.h"
#include "../../data/bpe.h"
#include "../../data/tokens.h"
#include "../net/backend.h"
#include "config.h"
#include "stop.h"

namespace tg {

constexpr int kMaxBadSteps = 5;

// The run shape c gives the backend (model/net/run_shape.h): its micro-batch, dropout, attention
// path (check: the flash path's, with room for both), GELU, precision, seed, AdamW and this
// rank's place in ZeRO-1's shards (--zero 1 on several ranks, model/run/dist.h).
RunShape run_shape(const Config& c);

// Where a run stands between two steps: what a checkpoint saves besides the arrays.
struct Progress {
  int step = 0;       // the next step to run
  int updates = 0;    // AdamW updates applied before it
  int bad_steps = 0;  // non-finite steps in a row just before it (the NaN guard's count)
};

// What train() does with its results besides the log.
struct TrainHooks {
  // Appends one line (a JSON object, no newline) to metrics.jsonl. Throws RuntimeError when
  // it cannot: the run then stops after its step (see train()). May be empty.
  std::function<void(const std::string& line)> metrics;
  // Saves a checkpoint of the state the backend holds as of p, with the metrics lines that
  // could not be written (to be written on resume); returns its path. May be empty.
  std::function<std::string(const Progress& p, const std::vector<std::string>& unlogged)> checkpoint;
};

struct TrainSummary {
  int steps = 0;                 // training steps run (updates applied + skipped)
  int skipped = 0;               // updates skipped by the NaN guard
  bool stopped = false;          // request_stop() ended the run early
  std::string checkpoint;        // then: the checkpoint written ("" when stopped before any step)
  double best_val_loss = 0;      // over every evaluation
  double final_train_loss = 0;   // evaluation at the end
  double final_val_loss = 0;
  double wall_s = 0;             // whole loop, evaluations included
  double median_step_ms = 0;     // one training step (forward, backward, update)
};

// Mean loss over c.eval_iters fixed batches of a split (0 train, 1 val). Throws Interrupted
// between two batches once a stop is requested; calls on_batch(k) (when given) after batch k.
// Data parallel: a collective; rank r evaluates batches r, r + W, ..., and every rank returns
// the mean of all of them, added in batch order (the same bits as one process).
double estimate_loss(Backend& be, const Config& c, const data::Dataset& ds, int split,
                     const std::function<void(int k)>& on_batch = {});

// Trains from step start.step to c.max_iters: a batch per step (data::train_batch), forward +
// backward, clip, AdamW with lr_at(step); evaluates at every eval_interval and at the end;
// logs every log_interval steps to log and, as one JSON object per logged step (written with
// nlohmann-json), to hooks.metrics. Checkpoints (hooks.checkpoint) before every
// c.ckpt_interval-th step and at the end. A step whose loss or gradient norm is not finite applies no update (logged, and
// written to metrics as {"step": N, "train_loss": null, "skipped": true}); tests inject NaN
// losses with TG_INJECT_NAN="step,step,...", and one rank's failure with TG_INJECT_FAIL="rank:step".
// Data parallel (model/run/dist.h, W ranks): rank r runs micro-batches r N .. r N + N - 1 of the
// step's W N (N = --grad-accum), so that W ranks train as one process with --grad-accum W N;
// be.reduce_grads() sums the gradients, one more all-reduce the losses (and a stop pending on
// any rank: then every rank stops before that step). Evaluations are spread over the ranks
// (estimate_loss); hooks are rank 0's. Before a checkpoint every rank calls be.gather_state()
// (ZeRO-1: the AdamW shards gathered on rank 0).
// On a terminal each logged step is one line ending with the time left; between logged steps
// a live line says where the run is, and an evaluation that lasts more than two seconds shows
// its own progress. A CPU run whose first steps predict more than ten minutes says so once.
// Every way a run stops early, between two steps:
//   - request_stop(): a checkpoint (unless no step ran), summary.stopped. A stop requested
//     during a step or an evaluation cuts it short (Interrupted, model/run/stop.h): the run stops
//     as if it had come before that step, within a fraction of a second;
//   - kMaxBadSteps non-finite steps in a row: a checkpoint of the weights as they are (the
//     last good ones: skipped steps change nothing) with the NaN count reset, then
//     RuntimeError naming the steps and the hyperparameters to change;
//   - a metrics line that cannot be written: the step ends, a checkpoint holding the unwritten
//     lines, then RuntimeError with the write's error and what became of the checkpoint.
TrainSummary train(Backend& be, const Config& c, const data::Dataset& ds, std::ostream& log,
                   const TrainHooks& hooks = {}, const Progress& start = {});

// Generates c.sample_tokens characters after c.prompt (temperature, then top-k, then top-p
// with c.top_p, 1 = off), writing each to out as it comes; returns the whole text (prompt
// included). The prompt must encode. The prompt and each new token go through the backend's
// KV cache (generate_reset / generate_step), one step per token. Token n of the text is drawn
// with one uniform from philox::stream_words(seed, kStreamSample, n, 0, 0). request_stop()
// ends it early.
std::string sample(Backend& be, const Config& c, const data::CharTokenizer& tok, std::ostream& out);

// The same for a model of tokens (token data, data/tokens.h, or a text in BPE tokens) of V
// tokens: starts from the ids of c.prompt when it is not empty (tok must encode it: a byte-level
// BPE, data/bpe.h), else from the end-of-text token (the tokenizer's, or 50256), and draws
// from the first V logits (never a padded id). With tok prints the tokens' text, without it
// their ids. Throws InputError for a prompt without a tokenizer that encodes, one that is not
// UTF-8, or one whose ids reach V.
std::string sample_tokens(Backend& be, const Config& c, int V, const data::BpeTokenizer* tok, std::ostream& out);
// The ids sample_tokens starts from, and its refusals, without sampling.
std::vector<int32_t> token_prompt(const Config& c, int V, const data::BpeTokenizer* tok);

}  // namespace tg
