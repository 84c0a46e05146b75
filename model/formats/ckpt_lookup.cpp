// model/formats/ckpt_lookup.cpp: finding a checkpoint and what it was trained on (see
// model/formats/ckpt_lookup.h).
#include "ckpt_lookup.h"

#include <filesystem>
#include <string>
#include <vector>

#include "../../data/bpe.h"
#include "../../data/errors.h"
#include "../../data/tokens.h"

namespace tg {
namespace fs = std::filesystem;

// The text at path (data_flag when given, else the run's recorded path), and in mismatch
// what differs from the run's recorded sha256 ("" when it matches or none was recorded).
data::Dataset load_recorded(const ckpt::CheckpointInfo& info, const std::string& data_flag, std::ostream& warn,
                            std::string& mismatch, const std::string& tokenizer) {
  std::string path = data_flag;
  if (path.empty()) path = info.data_path;
  if (path.empty()) {
    path = info.config.data;
    warn << "warning: this checkpoint (format 1) records no hash of its data: " << path << " is used unchecked\n";
  }
  data::Dataset d;
  try {
    d = data::load_dataset(path, info.config.block_size, tokenizer);
  } catch (const InputError& e) {
    if (!data_flag.empty()) throw;
    throw InputError(std::string("the run's data: ") + e.what() + " (a copy with sha256 " + info.data_sha256 +
                     " will do)");
  }
  if (!info.data_sha256.empty() && d.sha256 != info.data_sha256)
    mismatch = path + " has sha256 " + d.sha256.substr(0, 16) + "..., the run's data (" + info.data_path + ") had " +
               info.data_sha256.substr(0, 16) + "...";
  return d;
}

std::string pick_checkpoint(const std::string& dir, std::ostream& warn) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "state.bin", ec)) return dir;
  std::vector<std::string> skipped;
  const std::string found = ckpt::latest_checkpoint(dir, &skipped);
  if (found.empty() && !skipped.empty()) throw InputError(skipped.front());
  for (const std::string& s : skipped) warn << "warning: skipping a damaged checkpoint: " << s << "\n";
  return found;
}

std::string run_tokenizer(const std::string& dir, const Config& c) {
  if (c.tokenizer.empty()) return "";  // a run without one (characters, or GPT-2's ids) kept none
  std::error_code ec;
  // a run directory's copy; a checkpoint's is its run's
  fs::path kept = fs::absolute(dir, ec).lexically_normal();
  if (!kept.has_filename()) kept = kept.parent_path();  // a trailing '/'
  if (fs::exists(kept / "state.bin", ec)) kept = kept.parent_path();
  if (fs::is_directory(kept / "tokenizer", ec)) return (kept / "tokenizer").string();
  if (fs::exists(c.tokenizer, ec)) return c.tokenizer;
  return "";
}

data::Dataset checkpoint_data(const ckpt::CheckpointInfo& info, const std::string& data_flag, std::ostream& warn,
                              const std::string& tokenizer) {
  std::string mismatch;
  data::Dataset d = load_recorded(info, data_flag, warn, mismatch, tokenizer);
  if (!mismatch.empty())
    throw InputError("the data differs from the run's: " + mismatch +
                     "; expected the text the run trained on; restore it, or pass --data PATH of a copy");
  return d;
}

data::CharTokenizer checkpoint_tokenizer(const std::string& dir, const ckpt::CheckpointInfo& info,
                                         const std::string& data_flag, std::ostream& warn) {
  if (info.vocab.empty()) {
    try {
      return checkpoint_data(info, data_flag, warn).tok;
    } catch (const InputError& e) {
      throw InputError("checkpoint " + dir + " holds no vocabulary (it was written by an older train_gpt), so "
                       "sampling needs the run's text: " + e.what());
    }
  }
  data::CharTokenizer tok;
  try {
    tok = data::CharTokenizer::from_chars(info.vocab);
  } catch (const InputError& e) {
    throw InputError("checkpoint " + dir + ": " + e.what());
  }
  if (!data_flag.empty() && checkpoint_data(info, data_flag, warn).tok.itos != tok.itos)
    throw InputError("--data " + data_flag + " has another vocabulary than checkpoint " + dir +
                     "; expected the text the run trained on; pass that, or drop --data (the checkpoint holds its "
                     "vocabulary)");
  return tok;
}

ModelConfig checkpoint_model(const std::string& dir, const ckpt::CheckpointInfo& info, const std::string& data_flag,
                             data::CharTokenizer& tok, std::ostream& warn,
                             std::shared_ptr<const data::BpeTokenizer>* bpe) {
  const Config& c = info.config;
  if (!data::is_token_data(c.data) && c.tokenizer.empty()) {
    tok = checkpoint_tokenizer(dir, info, data_flag, warn);
    return model_config(c, tok.vocab_size());
  }
  // a model of tokens: its tokenizer's vocabulary, GPT-2's without one
  const std::string tp = run_tokenizer(dir, c);
  if (tp.empty() && !data::is_token_data(c.data))
    throw InputError("checkpoint " + dir + " is a model of a text in BPE tokens, but its run's tokenizer (" + c.tokenizer +
                     ") is gone and the run directory keeps no copy; expected the run directory's tokenizer/; restore it "
                     "or the tokenizer the run was given");
  std::shared_ptr<const data::BpeTokenizer> t;
  if (!tp.empty()) t = std::make_shared<const data::BpeTokenizer>(data::BpeTokenizer::load(tp));
  if (bpe) *bpe = t;
  if (!data_flag.empty()) checkpoint_data(info, data_flag, warn, tp);  // the run's data (its fingerprint)
  const int V = t ? t->vocab_size() : data::kGpt2Vocab;
  return model_config(c, V, padded_vocab_for(V));
}

}  // namespace tg
