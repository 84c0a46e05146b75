// model/formats/checkpoint.h: saving and resuming a run. A checkpoint is a directory with the model
// weights in safetensors (model/formats/safetensors.h: loadable by nanoGPT / PyTorch as is) and the
// rest of the training state in a small checksummed binary file.
//
// Directory layout, inside out_dir:
//   ckpt-00001000/model.safetensors   weights after 1000 steps (step numbers: 8 digits), and
//                                     the vocabulary in its metadata (model/formats/safetensors.h)
//   ckpt-00001000/state.bin           config, step, AdamW moments, seed, data, losses
// save_checkpoint writes both files (each atomically, weights first) into ckpt-<step>.tmp/,
// then renames that directory to ckpt-<step>/ and fsyncs out_dir: a ckpt-* directory without
// ".tmp" is complete by construction; a crash leaves at most a stale *.tmp directory, which
// the next save deletes. Both files are streamed from the caller's arrays (StateView): a
// checkpoint costs no copy of the weights or the AdamW moments in memory.
//
// state.bin (all integers little endian):
//   "TGSTATE\0" | u32 format version (kFormatVersion) | sections, each:
//   4-byte tag | u64 payload length | payload | u32 CRC-32 (IEEE) of the payload.
//   "CONF"  config_to_text(config)
//   "STEP"  u32 next step to run, u32 optimizer steps done, u32 non-finite steps in a row
//           before the next step (format 1: the first two only)
//   "ADAM"  m then v: param_count floats each (finite; v >= 0)
//   "WSUM"  u32 CRC-32 of the whole model.safetensors beside it (pairs the two files)
//   "RNG "  u64 seed: the data loader and dropout are pure functions of (seed, step), so this
//           and STEP are the whole RNG and loader state
//   "LOSS"  u32 count, then count doubles: losses logged so far
//   "DATA"  the sha256 of the data file (64 hex digits), '\n', its absolute path (at most
//           PATH_MAX bytes)
//   "MTRC"  metrics.jsonl lines the run could not write, '\n' after each (written on resume)
// Readers skip sections with unknown tags (their CRC still checked); all eight above are
// required (format 1: the first six).
//
// Every problem with a file read back (missing, truncated at any length, bad magic, newer
// format, CRC mismatch, missing section, bad JSON, a config validate() refuses, another
// model's tensors, weights not the ones the state was written with, weights or AdamW moments
// that are not finite, a negative second moment v) throws InputError with one line saying
// what, expected and how to fix. Failing to write throws RuntimeError.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../net/gpt.h"
#include "../run/config.h"
#include "ckpt_io.h"
#include "safetensors.h"

namespace tg {
namespace ckpt {

constexpr uint32_t kFormatVersion = 2;  // of state.bin; readers take 1 and 2 and reject newer ones

// Everything a run resumes from but the three arrays.
struct CheckpointInfo {
  uint32_t step = 0;        // the next step to run
  uint32_t steps_done = 0;  // optimizer steps taken so far
  uint32_t bad_steps = 0;   // non-finite steps in a row just before step (the NaN guard's count)
  Config config;
  uint64_t seed = 0;
  std::vector<double> losses;          // logged so far
  std::string data_sha256, data_path;  // the data file's contents and absolute path ("" in format 1)
  std::vector<std::string> unlogged;   // metrics lines not yet in metrics.jsonl
  // The vocabulary's characters in id order, UTF-8 (data::CharTokenizer::chars()): kept in
  // model.safetensors' metadata (train_gpt_vocab), not in state.bin. "" in a checkpoint
  // written before train_gpt stored it: its vocabulary is that of the run's data file.
  std::string vocab;
};

// A whole checkpoint, read back.
struct Checkpoint : CheckpointInfo {
  std::vector<float> params, m, v;  // param_count(table) each: weights, AdamW moments
};

// The three arrays a checkpoint writes, param_count(table) floats each, wherever they live.
struct StateView {
  const float* params = nullptr;
  const float* m = nullptr;
  const float* v = nullptr;
};

// The name of a checkpoint directory: ckpt-00001000.
std::string ckpt_name(uint32_t step);

// Writes out_dir/ckpt-<step>/ (creating out_dir if needed; replacing an existing
// ckpt-<step>/ atomically), then deletes the checkpoints older than the newest keep intact
// ones (by step, checkpoint_damage; the one just written counts; a damaged one newer than
// those stays; keep <= 0 keeps all) and stale ckpt-*.tmp directories. Returns the
// checkpoint's path. Throws RuntimeError if it cannot be written (deleting old ones is best
// effort).
std::string save_checkpoint(const std::string& out_dir, const CheckpointInfo& info, const StateView& state,
                            const std::vector<ParamSpec>& table, int keep = 2);
// The same from a Checkpoint's own arrays (each must hold param_count(table) floats).
std::string save_checkpoint(const std::string& out_dir, const Checkpoint& c, const std::vector<ParamSpec>& table,
                            int keep = 2);

// The ckpt-<digits> directories of out_dir (by name: complete ones, no .tmp suffix), newest
// step first.
std::vector<std::pair<uint32_t, std::string>> list_checkpoints(const std::string& out_dir);

// What is wrong with a checkpoint directory: "" when its two files read back intact (magic,
// version, CRCs, sections, a valid config, the safetensors header, WSUM), else the one-line
// message load_checkpoint would throw. name_step (>= 0): the step its name says (ckpt-<step>),
// which its state must hold.
std::string checkpoint_damage(const std::string& ckpt_dir, long long name_step = -1);

// The path of the newest checkpoint in out_dir that checkpoint_damage finds intact: a damaged
// newer one falls back to the one before, and its damage (which names the file) goes to
// skipped when given (unless it is gone: a run deleted it as it was read). "" if there is
// none (or no out_dir).
std::string latest_checkpoint(const std::string& out_dir, std::vector<std::string>* skipped = nullptr);

// The state.bin of a checkpoint without the AdamW arrays, and the vocabulary from the header of
// its model.safetensors: what a resumed run or a sample builds its model from before
// load_checkpoint. Throws InputError as load_checkpoint.
CheckpointInfo checkpoint_info(const std::string& ckpt_dir);
// Its config.
Config checkpoint_config(const std::string& ckpt_dir);

// Reads a checkpoint directory and cross-checks it: WSUM equals the CRC-32 of
// model.safetensors, the tensors and AdamW moments match table, the config describes table.
// Throws InputError otherwise.
Checkpoint load_checkpoint(const std::string& ckpt_dir, const std::vector<ParamSpec>& table);

// The bytes of a state.bin for info and the moments m, v (n floats each): what
// save_checkpoint streams, for tests and the fuzz target.
std::string state_bytes(const CheckpointInfo& info, const float* m, const float* v, size_t n, uint32_t weights_crc);
// Parses the bytes of a state.bin (path names it in messages): the info, and m, v.
Checkpoint parse_state_bytes(const std::string& bytes, const std::string& path);

}  // namespace ckpt
}  // namespace tg
