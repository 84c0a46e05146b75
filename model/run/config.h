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

// Every field of a run's config, one entry each: the struct Config, the flags (their parsing,
// --help, what --resume may change, which modes read them), the saved config (config_to_text,
// config_from_text) and the bounds validate() checks follow from it. Adding a flag is one entry
// here plus the code that uses it (and, when it reaches the network, RunShape and run_shape()).
// validate() itself checks only what relates two fields (n-embd and n-head, min-lr and lr, ...).
//
//   X(type, field, default, flag, usage, modes, resume, saved, bounds, help)
//     type, field, default  the field of Config; its saved name is the field's. An enum's values
//                           are spelled by its name() overload, in the flags as in the saved config
//     flag                  its command-line name, or "" for a field that is not a flag
//     usage                 its place in --help (ascending)
//     modes                 the modes that read it: InTrain (training, and --attention check, which
//                           takes a training command line), InSample, InExport, InLogits; a flag
//                           given to a mode that does not read it is named in a warning
//                           (ignored_flags), and --sample takes its own flags over the checkpoint's
//     resume                Fixed: it fixes the model or the data the run sees and cannot change on
//                           --resume; Free: it can
//     saved                 Always; or Added: a saved config written before it existed lacks it and
//                           reads as the default
//     bounds                the values validate() accepts: an integer's Range(lo, hi, note) or
//                           AtLeast(lo, note); a double's Reals(lo, hi, "[)", expected), its ends
//                           open or closed as written, .in_float() when the kernels take it as a
//                           float (checked again after rounding); .says(expected) replaces the
//                           message's "expected ..."; None: any value of the type
//     help                  its line in --help
// The entries are in the saved config's order.
#define TG_CONFIG_FIELDS(X)                                                                                          \
  X(std::string, preset, "", "preset", 20, InTrain, Fixed, Always, None,                                                \
    "shakespeare-char | baby | gpt2-124m (default: shakespeare-char when training on a GPU, else baby)")                \
  X(std::string, data, "data/tinyshakespeare/input.txt", "data", 10, InTrain | InSample | InExport, Fixed,              \
    Always, None,                                                                                                       \
    "text file, or token data: llm.c .bin shards (a directory or a glob) or nanoGPT's directory of train.bin / "        \
    "val.bin (default data/tinyshakespeare/input.txt)")                                                                 \
  X(Device, device, Device::Auto, "device", 30, InTrain | InSample | InLogits, Free, Always, None,                      \
    "auto | cpu | cuda (default auto)")                                                                                 \
  X(Attention, attention, Attention::Flash, "attention", 40, InTrain | InLogits, Free, Always, None,                    \
    "flash | naive | check (default flash; check compares both on one batch and exits)")                                \
  X(Precision, precision, Precision::Auto, "precision", 50, InTrain | InSample | InLogits, Free, Always, None,          \
    "auto | bf16 | fp32 on a GPU (default auto: bf16 on compute capability 8.0+); the CPU runs fp32")                   \
  X(std::string, out_dir, "", "out-dir", 310, InTrain, Free, Always, None,                                              \
    "where metrics.jsonl goes (default out/<preset>)")                                                                  \
  /* model (nanoGPT's GPTConfig) */                                                                                     \
  X(int, n_layer, 0, "n-layer", 60, InTrain | InLogits, Fixed, Always, Range(1, philox::kMaxLayer - 1),                 \
    "transformer blocks")                                                                                               \
  X(int, n_head, 0, "n-head", 70, InTrain | InLogits, Fixed, Always, AtLeast(1), "attention heads")                     \
  X(int, n_embd, 0, "n-embd", 80, InTrain | InLogits, Fixed, Always, Range(1, 65536),                                   \
    "embedding width C (divisible by n-head)")                                                                          \
  X(int, block_size, 0, "block-size", 90, InTrain | InLogits, Fixed, Always, Range(1, 1 << 20), "context length T")     \
  X(bool, bias, false, "bias", 140, InTrain | InLogits, Fixed, Always, None,                                            \
    "biases in linear and layernorm layers (--bias, --bias=false)")                                                     \
  /* dropout: validate() also checks the kernels' 32-bit threshold (philox::dropout_threshold) */                       \
  X(double, dropout, 0.0, "dropout", 130, InTrain, Free, Always, Reals(0, 1, "[)", "a probability in [0, 1)"),          \
    "dropout probability in [0, 1)")                                                                                    \
  X(GeluForm, gelu, GeluForm::Tanh, "gelu", 150, InTrain | InLogits, Fixed, Added, None,                                \
    "tanh | erf: the MLP's GELU, tanh approximation (GPT-2, llm.c; default) or exact (nanoGPT)")                        \
  /* training (nanoGPT's train.py) */                                                                                   \
  X(int, batch_size, 0, "batch-size", 100, InTrain, Fixed, Always, Range(1, 1 << 20),                                   \
    "sequences per micro-batch B (of each rank under mpirun -np N)")                                                    \
  X(int, grad_accum, 1, "grad-accum", 110, InTrain, Fixed, Added, Range(1, 65536),                                      \
    "micro-batches accumulated per optimizer step (tokens per step = B x T x this x ranks; default 1)")                 \
  /* data-parallel ranks (mpirun -np N, model/run/dist.h): a step is world x grad_accum micro-batches */                \
  X(int, world, 1, "", 0, InTrain, Free, Added, None, "")                                                               \
  X(int, zero, 0, "zero", 120, InTrain, Free, Added,                                                                    \
    Range(0, 1).says("0 (every rank holds the whole AdamW state) or 1 (sharded over the ranks)"),                       \
    "0 | 1: under mpirun, 1 shards the AdamW state over the ranks (ZeRO-1: each rank keeps 1/N of m and v; the "        \
    "same results); a no-op on one rank (default 0)")                                                                   \
  X(int, max_iters, 0, "max-iters", 160, InTrain, Free, Always, Range(0, philox::kMaxStep - 1), "optimizer steps")      \
  /* AdamW takes lr, the betas and the weight decay as floats: a beta that rounds to 1 divides its bias */              \
  /* correction by 0, an lr that rounds to 0 or a denormal stops training */                                            \
  X(double, lr, 0, "lr", 170, InTrain, Free, Always, Reals(FLT_MIN, INFINITY, "[)",                                     \
    "a learning rate > 0 that is a normal float (1.17549435082e-38 to 3.40282346639e+38)").in_float(),                  \
    "peak learning rate")                                                                                               \
  X(double, min_lr, 0, "min-lr", 180, InTrain, Free, Always, None, "learning rate at the end of the cosine decay")      \
  X(int, warmup_iters, 0, "warmup-iters", 190, InTrain, Free, Always, AtLeast(0), "linear warmup steps")                \
  X(int, lr_decay_iters, 0, "lr-decay-iters", 200, InTrain, Free, Always, None,                                         \
    "step where the cosine decay reaches min-lr")                                                                       \
  X(double, weight_decay, 0.1, "weight-decay", 210, InTrain, Free, Always, Reals(0, INFINITY, "[)",                     \
    "at least 0, a finite float").in_float(), "AdamW decoupled weight decay (2-D weights only)")                        \
  X(double, beta1, 0.9, "beta1", 220, InTrain, Free, Always, Reals(0, 1, "[)",                                          \
    "a value in [0, 1) that stays below 1 in float (at most 0.99999994)").in_float(), "AdamW beta1")                    \
  X(double, beta2, 0.99, "beta2", 230, InTrain, Free, Always, Reals(0, 1, "[)",                                         \
    "a value in [0, 1) that stays below 1 in float (at most 0.99999994)").in_float(), "AdamW beta2")                    \
  X(double, grad_clip, 1.0, "grad-clip", 240, InTrain, Free, Always, Reals(0, INFINITY, "[)",                           \
    "at least 0 (0 turns clipping off)"), "clip the global gradient norm to this (0 = off)")                            \
  X(int, eval_interval, 0, "eval-interval", 250, InTrain, Free, Always, AtLeast(0, "(0 = only at the end)"),            \
    "evaluate every this many steps (0 = only at the end)")                                                             \
  X(int, eval_iters, 0, "eval-iters", 260, InTrain, Free, Always, AtLeast(1), "batches per evaluation")                 \
  X(int, log_interval, 1, "log-interval", 270, InTrain, Free, Always, AtLeast(1), "log every this many steps")          \
  X(int, ckpt_interval, 250, "ckpt-interval", 280, InTrain, Free, Always, AtLeast(0, "(0 = only at the end)"),          \
    "checkpoint every this many steps (0 = only at the end)")                                                           \
  X(bool, resume, false, "resume", 290, InTrain, Free, Always, None,                                                    \
    "continue the run in --out-dir from its newest complete checkpoint")                                                \
  X(uint64_t, seed, 1337, "seed", 300, InTrain | InSample, Fixed, Always, None, "seed of init, batches and dropout")    \
  /* sampling at the end (nanoGPT's sample.py) */                                                                       \
  X(int, sample_tokens, 500, "sample-tokens", 320, InTrain | InSample, Free, Always, AtLeast(0),                        \
    "characters to generate at the end (0 = none)")                                                                     \
  X(std::string, prompt, "\n", "prompt", 330, InTrain | InSample, Free, Always, None,                                   \
    "text the sample starts from (default a newline; the first character of the vocabulary when the text has none)")    \
  /* logits / temperature in double: below 1e-6 the largest logits overflow */                                          \
  X(double, temperature, 0.8, "temperature", 340, InTrain | InSample, Free, Always, Reals(1e-6, INFINITY, "[)",         \
    "a temperature from 1e-6 up"), "sampling temperature (> 0)")                                                        \
  X(int, top_k, 200, "top-k", 350, InTrain | InSample, Free, Always, AtLeast(0, "(0 = no top-k cut)"),                  \
    "sample from the k most likely characters (0 = all)")                                                               \
  X(double, top_p, 1.0, "top-p", 400, InTrain | InSample, Free, Always, Reals(0, 1, "(]", "a probability in (0, 1]"),   \
    "sample from the most likely characters holding this probability (1 = all)")                                        \
  X(bool, sample, false, "sample", 360, InSample, Free, Always, None,                                                   \
    "only generate text from the checkpoint --ckpt (no training)")                                                      \
  X(std::string, ckpt, "", "ckpt", 370, InSample | InExport, Free, Always, None,                                        \
    "with --sample or --export-hf: a ckpt-<step> directory, or a run's --out-dir (its newest)")                         \
  X(std::string, export_hf, "", "export-hf", 380, InExport, Free, Added, None,                                          \
    "with --ckpt: write that checkpoint into this new directory as Hugging Face's GPT-2 (config.json, "                 \
    "model.safetensors)")                                                                                               \
  X(std::string, tokenizer, "", "tokenizer", 390, InTrain | InSample, Free, Added, None,                                \
    "a byte-level BPE: a Hugging Face GPT-2 directory (vocab.json + merges.txt, or tokenizer.json), tiktoken's "        \
    "gpt2.tiktoken, or llm.c's gpt2_tokenizer.bin (decoding only); a --data text is trained in its tokens, a "          \
    "--prompt encoded, samples printed as text (default: --init-from's, else none)")                                    \
  X(std::string, init_from, "", "init-from", 410, InTrain | InLogits, Fixed, Added, None,                               \
    "a new run starts from these weights: a Hugging Face GPT-2 model.safetensors (or its directory; a model name "      \
    "such as gpt2 is found in the Hugging Face cache), llm.c's gpt2_124M.bin, or a train_gpt checkpoint or run; "       \
    "the model's shape comes from the file, its tokenizer from the directory")                                          \
  X(std::string, logits, "", "logits", 420, InLogits, Free, Added, None,                                                \
    "with --init-from: only print the model's logits for these comma-separated token ids (one line of V numbers "       \
    "per position) and exit")

struct Config {
#define TG_CONFIG_FIELD(type, field, def, ...) type field = def;
  TG_CONFIG_FIELDS(TG_CONFIG_FIELD)
#undef TG_CONFIG_FIELD
};

// What a command line asks for: training (the default), or one of the modes that train nothing.
enum class Mode { Train, Sample, ExportHf, Logits, AttentionCheck };
// --sample, --export-hf, --logits, --attention check (in that order when several are given:
// validate() refuses the pairs that cannot go together), else Train.
Mode mode(const Config& c);
// The flag that asks for a mode ("--sample", ..., "--attention check"; "" for training).
const char* mode_flag(Mode m);
// The flags mode m reads (TG_CONFIG_FIELDS' modes), in usage() order; the modes that read a
// flag (Train standing for --attention check too), in Mode's order.
std::vector<std::string> mode_flags(Mode m);
std::vector<Mode> modes_reading(const std::string& flag);

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

// The flags given explicitly that the mode of the command line does not read ("max-iters" with
// --sample, ...), in usage() order: they change nothing, and the program says so.
std::vector<std::string> ignored_flags(const ParsedArgs& a);

// Checks ranges and consistency of a filled Config (parse_args calls it; so does every reader
// of a saved config), with the values as the kernels see them: the AdamW betas, the learning
// rates and the weight decay rounded to float, the dropout as its 32-bit threshold and float
// scale. So no config that passes degenerates (beta2 rounding to 1, lr to 0 or inf). Throws
// InputError naming the flag. shape_to_come: the model's shape is still to be read from
// --init-from's file (parse_args), which apply_init_model validates again: n-embd, the preset's
// until then, is not held to a --n-head given for a file without config.json.
void validate(const Config& c, bool shape_to_come = false);

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

// Every field of c as "name=value\n" lines, in Config's declaration order (TG_CONFIG_FIELDS; names
// as in Config: n_layer, prompt, ...). Ints and the seed in decimal, bools true/false, doubles
// with %.17g (round-trip exact); string bytes outside printable ASCII, and '%', as %XX.
std::string config_to_text(const Config& c);
// The inverse. Throws InputError for a malformed line or value, a value longer than
// kMaxConfigValue, an unknown, repeated or missing field. It does not validate().
Config config_from_text(const std::string& text);

}  // namespace tg
