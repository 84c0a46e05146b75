// model/run/config.h: everything a run is configured by, the three presets (nanoGPT's
// shakespeare_char config, its "baby" CPU variant, llm.c's GPT-2 124M recipe), the command line that fills it, the
// validation every config passes (from flags, a preset, a checkpoint or a run file), and the
// config as text (what checkpoints store).
// The contract of the run with the parts below it: the formats (model/formats/checkpoint.h,
// init_from.h) store and fill a Config. They include this header, and of model/run/ only it,
// dist.h and stop.h. The network below (model/net/) never sees a Config: it is made from a
// RunShape (model/net/run_shape.h, filled by run_shape() in model/run/train.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../kernels/gelu_form.h"
#include "../net/gpt.h"
#include "../net/run_shape.h"

namespace tg {

// --attention: the path training runs, or check: the two paths compared on one batch, a mode of
// its own (Mode::AttentionCheck, model/net/attention_check.h), which then runs the flash path's
// forward.
enum class Attention { Flash, Naive, Check };
inline const char* name(Attention a) { return a == Attention::Naive ? "naive" : a == Attention::Check ? "check" : "flash"; }
inline AttentionPath attention_path(Attention a) { return a == Attention::Naive ? AttentionPath::Naive : AttentionPath::Flash; }

// The flags' enums (--device, --attention, --precision, --gelu) are parsed once, by parse_args
// and config_from_text; the saved config spells them as the flags do (name()).
struct Config {
  // where and how
  std::string preset;             // "shakespeare-char", "baby" or "gpt2-124m"
  std::string data = "data/tinyshakespeare/input.txt";
  Device device = Device::Auto;           // auto | cpu | cuda
  Attention attention = Attention::Flash;  // flash | naive | check (both paths on one batch, compared)
  Precision precision = Precision::Auto;   // auto (bf16 on a GPU of compute capability 8.0 or newer, else fp32) | bf16 | fp32
  std::string out_dir;            // default out/<preset>
  // model (nanoGPT's GPTConfig)
  int n_layer = 0, n_head = 0, n_embd = 0, block_size = 0;
  bool bias = false;
  double dropout = 0.0;
  GeluForm gelu = GeluForm::Tanh;  // the MLP's GELU: tanh (GPT-2, llm.c) | erf (exact: nanoGPT's nn.GELU())
  // training (nanoGPT's train.py)
  int batch_size = 0, max_iters = 0;
  int grad_accum = 1;  // micro-batches of batch_size per optimizer step and rank (--grad-accum)
  int world = 1;       // data-parallel ranks (mpirun -np N, model/run/dist.h; not a flag): a step is world x grad_accum micro-batches
  int zero = 0;        // --zero 1: ZeRO-1, each rank keeps and updates one shard of the AdamW state (model/net/shards.h); 0: every rank all of it
  double lr = 0, min_lr = 0;
  int warmup_iters = 0, lr_decay_iters = 0;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.99, grad_clip = 1.0;
  int eval_interval = 0, eval_iters = 0, log_interval = 1;
  int ckpt_interval = 250;  // checkpoint every this many steps (0 = only at the end)
  bool resume = false;     // continue from the newest complete checkpoint in out_dir
  uint64_t seed = 1337;
  // sampling at the end (nanoGPT's sample.py)
  int sample_tokens = 500;
  std::string prompt = "\n";
  double temperature = 0.8;
  int top_k = 200;
  double top_p = 1.0;
  bool sample = false;  // --sample: only generate text, from the checkpoint --ckpt
  std::string ckpt;     // a ckpt-<step> directory, or a run's --out-dir (its newest checkpoint)
  std::string export_hf;  // --export-hf DIR: only write the checkpoint --ckpt for Hugging Face (model/formats/hf_export.h)
  std::string tokenizer;  // --tokenizer: a byte-level BPE (data/bpe.h): a text in its tokens, --prompt, samples as text
  std::string init_from;  // --init-from PATH: a new run's weights (and model shape) from a file (model/formats/init_from.h)
  std::string logits;     // --logits IDS: with --init-from, only print the model's logits for these token ids
};

// What a command line asks for: training (the default), or one of the modes that train nothing.
enum class Mode { Train, Sample, ExportHf, Logits, AttentionCheck };
// --sample, --export-hf, --logits, --attention check (in that order when several are given:
// validate() refuses the pairs that cannot go together), else Train.
Mode mode(const Config& c);
// The flag that asks for a mode ("--sample", ..., "--attention check"; "" for training).
const char* mode_flag(Mode m);

// The model c describes over a vocabulary of vocab_size tokens (V), its rows padded to
// padded_vocab (Vp; 0: none, as data::Dataset::padded_vocab gives it).
ModelConfig model_config(const Config& c, int vocab_size, int padded_vocab = 0);

// Fills c with a preset's values. Throws InputError for an unknown name.
void apply_preset(Config& c, const std::string& name);

// The result of reading the command line.
struct ParsedArgs {
  Config config;
  bool help = false;               // --help was given: print usage() and exit 0
  std::vector<std::string> given;  // the flags given explicitly ("max-iters", ...), in usage() order
};

// Reads GNU-style long options (--name value or --name=value). The preset (given, or
// default_preset) is applied first; flags given explicitly override it, in any order.
// Numbers are decimal (no hex, inf or nan). Throws InputError, with one line saying what,
// expected and how to fix, for an unknown, duplicated or value-less flag, a value that is not
// a number, out of range, or contradicting another. Reads nothing but argv.
ParsedArgs parse_args(int argc, const char* const* argv, const std::string& default_preset);

// Checks ranges and consistency of a filled Config (parse_args calls it; so does every reader
// of a saved config), with the values as the kernels see them: the AdamW betas, the learning
// rates and the weight decay rounded to float, the dropout as its 32-bit threshold and float
// scale. So no config that passes degenerates (beta2 rounding to 1, lr to 0 or inf). Throws
// InputError naming the flag.
void validate(const Config& c);

// Whether a flag cannot change when a run is resumed: it fixes the model (its shape) or the
// data the run sees (the text, the batch size, the seed). The other flags (the step count and
// schedule, the optimizer, the intervals, sampling, device, precision) can.
bool fixed_on_resume(const std::string& flag);
// Every flag's name ("n-layer", ...), in usage() order.
std::vector<std::string> flag_names();
// A flag's value in c, as config_to_text writes it; and copying it from one config to another.
std::string flag_value(const Config& c, const std::string& flag);
void copy_flag(Config& to, const Config& from, const std::string& flag);

std::string usage();
// The config as printed at the start of a run (one "name = value" line per field).
std::string describe(const Config& c);

// Bounds on a config's strings, so that a saved config reads back in time linear in its size
// and every message about one stays short: validate() refuses a string field (a flag's value)
// of more than kMaxConfigString bytes (Linux passes at most 128 KiB an argument);
// config_from_text refuses a value of more than kMaxConfigValue bytes as written (each byte
// at most 3: %XX), so every config that validates reads back.
constexpr size_t kMaxConfigString = 256 << 10;
constexpr size_t kMaxConfigValue = 3 * kMaxConfigString;

// Every field of c as "name=value\n" lines, in Config's declaration order (names as in
// Config: n_layer, prompt, ...). Ints and the seed in decimal, bools true/false, doubles
// with %.17g (round-trip exact); string bytes outside printable ASCII, and '%', as %XX.
// A field added to Config must be added to each_field (model/run/config.cpp).
std::string config_to_text(const Config& c);
// The inverse. Throws InputError for a malformed line or value, a value longer than
// kMaxConfigValue, an unknown, repeated or missing field. It does not validate().
Config config_from_text(const std::string& text);

}  // namespace tg
