// model/checkpoint.h: saving and resuming a run. A checkpoint is a directory with the model
// weights in safetensors (model/safetensors.h: loadable by nanoGPT / PyTorch as is) and the
// rest of the training state in a small checksummed binary file.
//
// Directory layout, inside out_dir:
//   ckpt-00001000/model.safetensors   weights after 1000 steps (step numbers: 8 digits)
//   ckpt-00001000/state.bin           config, step, AdamW moments, seed, losses
// save_checkpoint writes both files (each atomically, weights first) into ckpt-<step>.tmp/,
// then renames that directory to ckpt-<step>/ and fsyncs out_dir: a ckpt-* directory without
// ".tmp" is complete by construction; a crash leaves at most a stale *.tmp directory, which
// the next save deletes.
//
// state.bin (all integers little endian):
//   "TGSTATE\0" | u32 format version (kFormatVersion) | sections, each:
//   4-byte tag | u64 payload length | payload | u32 CRC-32 (IEEE) of the payload.
//   "CONF"  config_to_text(config)
//   "STEP"  u32 next step to run, u32 optimizer steps done
//   "ADAM"  m then v: param_count floats each
//   "WSUM"  u32 CRC-32 of the whole model.safetensors beside it (pairs the two files)
//   "RNG "  u64 seed: the data loader and dropout are pure functions of (seed, step), so this
//           and STEP are the whole RNG and loader state
//   "LOSS"  u32 count, then count doubles: the losses logged so far
// Readers skip sections with unknown tags (their CRC still checked); all six above are
// required.
//
// Every problem with a file read back (missing, truncated at any length, bad magic, newer
// format, CRC mismatch, missing section, bad JSON, another model's tensors, weights not the
// ones the state was written with) throws InputError with one line saying what, expected
// and how to fix. Failing to write throws RuntimeError.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt_io.h"
#include "config.h"
#include "gpt.h"
#include "safetensors.h"

namespace tg {
namespace ckpt {

constexpr uint32_t kFormatVersion = 1;  // of state.bin; readers reject newer ones

// Everything a run resumes from.
struct Checkpoint {
  uint32_t step = 0;        // the next step to run
  uint32_t steps_done = 0;  // optimizer steps taken so far
  Config config;
  std::vector<float> params, m, v;  // param_count(table) each: weights, AdamW moments
  uint64_t seed = 0;
  std::vector<double> losses;  // logged so far
};

// Writes out_dir/ckpt-<step>/ (creating out_dir if needed; replacing an existing
// ckpt-<step>/ atomically), then deletes the complete checkpoints beyond the newest keep
// (by step; never the one just written; keep <= 0 keeps all) and stale ckpt-*.tmp
// directories. Throws RuntimeError if the checkpoint cannot be written (deleting old ones
// is best effort).
void save_checkpoint(const std::string& out_dir, const Checkpoint& c, const std::vector<ParamSpec>& table,
                     int keep = 2);

// The path of the newest complete ckpt-<step> directory in out_dir whose two files read
// back intact (magic, version, CRCs, sections, safetensors header, WSUM): a damaged newest
// one falls back to the one before. "" if there is none (or no out_dir).
std::string latest_checkpoint(const std::string& out_dir);

// The config a checkpoint was written with (from its state.bin): what a resumed run uses to
// build its model before load_checkpoint. Throws InputError as load_checkpoint.
Config checkpoint_config(const std::string& ckpt_dir);

// Reads a checkpoint directory and cross-checks it: WSUM equals the CRC-32 of
// model.safetensors, the tensors and AdamW moments match table, the config describes table.
// Throws InputError otherwise.
Checkpoint load_checkpoint(const std::string& ckpt_dir, const std::vector<ParamSpec>& table);

}  // namespace ckpt
}  // namespace tg
