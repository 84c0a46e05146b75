// model/formats/ckpt_lookup.h: finding a checkpoint and what it was trained on: the checkpoint a
// --ckpt, --init-from or --resume path names, the text and vocabulary its run recorded, and the
// model its config describes. Read by sampling, the Hugging Face export, --init-from and the run
// directory (model/run/run_dir.h).
#pragma once
#include <memory>
#include <ostream>
#include <string>

#include "../../data/dataset.h"
#include "../net/gpt.h"
#include "checkpoint.h"

namespace tg {

// The checkpoint to read in dir: dir itself when it is a checkpoint directory (holds
// state.bin), else the newest intact checkpoint of the run directory dir, each damaged newer
// one named on warn with its damage. "" when dir holds no checkpoint at all; throws the
// damage of the newest when it holds only damaged ones.
std::string pick_checkpoint(const std::string& dir, std::ostream& warn);

// The text a checkpoint was trained on: at data_flag when given, else at the absolute path
// it recorded; checked against the sha256 it recorded (a format-1 checkpoint has none: its
// config's path, unchecked, said on warn). Throws InputError when it is missing or its
// contents differ.
// tokenizer: the run's (run_tokenizer below), "" for none.
data::Dataset checkpoint_data(const ckpt::CheckpointInfo& info, const std::string& data_flag, std::ostream& warn,
                              const std::string& tokenizer = "");

// The tokenizer of the run that wrote the checkpoint or run directory dir: "" for a run given
// none (c.tokenizer empty: characters, or GPT-2's ids), whatever its directory holds; else the
// copy the run directory keeps (<run>/tokenizer/, model/run/run_dir.h), else the --tokenizer
// its config names when that still exists, else "".
std::string run_tokenizer(const std::string& dir, const Config& c);

// The tokenizer a checkpoint samples with: the vocabulary it holds (no data file needed), or,
// in a checkpoint written before train_gpt stored it, that of the run's text (checkpoint_data:
// at data_flag when given, else at the recorded path). A data_flag is never ignored: with a
// stored vocabulary the text there must still be the run's (its sha256) and have that
// vocabulary. dir names the checkpoint in messages. Throws InputError.
data::CharTokenizer checkpoint_tokenizer(const std::string& dir, const ckpt::CheckpointInfo& info,
                                         const std::string& data_flag, std::ostream& warn);

// The model a checkpoint holds (from its config), and its character vocabulary in tok (none for
// a model of tokens: the run's tokenizer's vocabulary, or GPT-2's 50257 ids without one, padded
// as llm.c pads them; that tokenizer in bpe when asked for). data_flag ("" = none): a --data
// given is checked to be the run's (checkpoint_tokenizer, checkpoint_data), never ignored.
ModelConfig checkpoint_model(const std::string& dir, const ckpt::CheckpointInfo& info, const std::string& data_flag,
                             data::CharTokenizer& tok, std::ostream& warn,
                             std::shared_ptr<const data::BpeTokenizer>* bpe = nullptr);

// The text at path (data_flag when given, else the run's recorded path), and in mismatch
// what differs from the run's recorded sha256 ("" when it matches or none was recorded): what
// checkpoint_data and --resume (model/run/run_dir.cpp) read.
data::Dataset load_recorded(const ckpt::CheckpointInfo& info, const std::string& data_flag, std::ostream& warn,
                            std::string& mismatch, const std::string& tokenizer = "");

}  // namespace tg
