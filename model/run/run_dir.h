// model/run/run_dir.h: the run directory (--out-dir): what it holds, who may write in it, how a
// run begins there (new, started again, or resumed) and what it writes while it runs.
//
// What a run directory holds:
//   train_gpt.lock      locked (flock, exclusive) by the process running there, for its whole
//                       life; holds that process's pid. Never deleted: it is no part of a run.
//   run.cfg             the config the run began with and its data (sha256, absolute path):
//                       written before the first step, so a run killed before its first
//                       checkpoint can be started again or resumed from step 0
//   metrics.jsonl       one JSON object per logged step
//   tokenizer/          a run of BPE tokens: its tokenizer's files as --tokenizer gave them
//                       (vocab.json + merges.txt, tokenizer.json, x.tiktoken or
//                       gpt2_tokenizer.bin), written with run.cfg; sampling and --resume read it
//   ckpt-<step>/        checkpoints (model/formats/checkpoint.h); ckpt-<step>.tmp/ while one is written
// A directory "holds a run" when it has any of run.cfg, metrics.jsonl or a ckpt-* entry.
//
// How a run begins (RunDir::plan):
//   new run       the directory must hold no run, or one killed before its first checkpoint
//                 that was begun with the same flags and data: that one starts again (what is
//                 discarded is said on stderr). Anything else is refused: ckpt-* directories
//                 or a metrics.jsonl are never overwritten.
//   --resume      from the newest intact checkpoint (a damaged newer one is named on stderr
//                 with its damage and skipped), or from step 0 when the run has none yet. The
//                 run keeps its config: flags that change the model or the data
//                 (fixed_on_resume, and --data with other contents) are refused, all of them in
//                 one line; the others (--max-iters to extend the run, the schedule, the
//                 optimizer, the intervals, sampling, --device, --precision) are applied and
//                 printed. The step's global batch (ranks x --grad-accum) is kept: with
//                 another number of ranks (mpirun -np N) --grad-accum becomes the one that
//                 keeps it (said), and one that cannot is refused. The data is found by the absolute path the run recorded, or at
//                 --data, and must have the sha256 the run recorded.
// A second process on a directory in use, new or --resume, is refused naming the holder's
// pid. Sampling (--sample) only reads and takes no lock; it needs no data file, as a checkpoint
// holds its vocabulary (checkpoint_tokenizer, model/formats/ckpt_lookup.h).
//
// While a run runs, every write is checked: a metrics line that cannot be written stops the
// run (model/run/train.h) and never passes silently; a checkpoint is streamed from the backend's
// own buffers.
#pragma once
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "../../data/dataset.h"
#include "../formats/checkpoint.h"
#include "../net/backend.h"
#include "config.h"
#include "train.h"

namespace tg {

// How a run begins: RunDir::plan's decision.
struct RunStart {
  Config config;                 // the run's (on --resume: the saved one with the flags applied)
  data::Dataset data;            // its text, loaded (and on --resume checked against the run's sha256)
  std::string checkpoint;        // the checkpoint it resumes from ("" from step 0)
  Progress progress;             // where it continues: the checkpoint's step, or step 0
  std::vector<std::string> unlogged;  // metrics lines the checkpoint holds, not yet in metrics.jsonl
  bool resumed = false;          // --resume (from a checkpoint or from step 0)
  bool again = false;            // a run killed before its first checkpoint, started over
};

class RunDir {
 public:
  // writer false: a data-parallel rank other than 0 (model/run/dist.h), which only reads. Its
  // plan() takes no lock and its begin() and hooks() do nothing: rank 0 alone holds the lock
  // and writes run.cfg, metrics and checkpoints.
  explicit RunDir(const std::string& dir, bool writer = true);
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

  // Decides how the run begins from the flags and what the directory holds, loads the data,
  // and prints what it applied (out) and what it skips or discards (warn). Writes nothing, but
  // --resume takes the lock first, so that no other process changes the directory as it is
  // read. Throws InputError for every reason a run cannot begin there.
  RunStart plan(const ParsedArgs& args, std::ostream& out, std::ostream& warn);

  // Prepares the directory for the run planned: takes the lock (a new run: creating the
  // directory), checks again what it holds, discards what a run started again leaves, writes
  // run.cfg and opens metrics.jsonl (new: empty; resumed: the lines of the steps before the
  // checkpoint, then the lines it holds unwritten). Throws InputError (the directory is in use,
  // or cannot be created) or RuntimeError (a write failed).
  void begin(const RunStart& start);

  // What train() calls: metrics lines appended to metrics.jsonl (each write checked, a failed
  // one leaves no partial line and throws RuntimeError), and checkpoints of be's state.
  TrainHooks hooks(const Backend& be, const Config& c, const std::vector<ParamSpec>& table);

  // Writes a checkpoint of be's state as of p, straight from its buffers when they are in host
  // memory. Returns its path.
  std::string save(const Backend& be, const Config& c, const std::vector<ParamSpec>& table, const Progress& p,
                   const std::vector<std::string>& unlogged);

  // Takes back a new run that wrote no checkpoint (its run.cfg, metrics.jsonl, tokenizer/, lock
  // file, and the directories begin() created), for bad input found only while training: the
  // command corrected then starts afresh there. Returns what to add to the error ("; ..."), or ""
  // when there was nothing to take back (a resumed run, a checkpoint written, not rank 0).
  std::string abandon();

  const std::string& path() const { return dir_; }

 private:
  RunStart plan_new(const Config& flags, std::ostream& warn);
  RunStart plan_resume(const ParsedArgs& args, std::ostream& out, std::ostream& warn);
  void lock();
  void write_metrics(const std::string& line);

  std::string dir_;
  bool writer_ = true;
  int lock_fd_ = -1, metrics_fd_ = -1;
  std::string data_sha256_, data_path_;  // of the run begun
  std::string vocab_;                    // its vocabulary (CharTokenizer::chars()), kept in checkpoints
  bool began_new_ = false, kept_tokenizer_ = false;  // begin() of a new run; it wrote tokenizer/
  std::vector<std::string> made_;                     // the directories begin() created, outermost first
};

}  // namespace tg
