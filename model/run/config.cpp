// model/run/config.cpp: presets and the command line (see model/run/config.h).
#include "config.h"

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "../../data/errors.h"
#include "../../kernels/philox.h"

namespace tg {

ModelConfig model_config(const Config& c, int vocab_size, int padded_vocab) {
  return ModelConfig{vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd, c.bias, padded_vocab};
}

void apply_preset(Config& c, const std::string& name) {
  if (name == "shakespeare-char") {
    // nanoGPT config/train_shakespeare_char.py
    c.n_layer = 6; c.n_head = 6; c.n_embd = 384; c.block_size = 256; c.batch_size = 64; c.grad_accum = 1;
    c.dropout = 0.2; c.bias = false;
    c.lr = 1e-3; c.min_lr = 1e-4; c.max_iters = 5000; c.lr_decay_iters = 5000;
    c.warmup_iters = 100; c.beta1 = 0.9; c.beta2 = 0.99; c.weight_decay = 0.1; c.grad_clip = 1.0;
    c.eval_interval = 250; c.eval_iters = 200; c.log_interval = 10;
  } else if (name == "baby") {
    // the same config with nanoGPT's CPU overrides: --block_size=64 --batch_size=12
    // --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
    // --dropout=0.0 --eval_iters=20 --log_interval=1
    apply_preset(c, "shakespeare-char");
    c.n_layer = 4; c.n_head = 4; c.n_embd = 128; c.block_size = 64; c.batch_size = 12;
    c.dropout = 0.0; c.max_iters = 2000; c.lr_decay_iters = 2000;
    c.eval_iters = 20; c.log_interval = 1;
  } else if (name == "gpt2-124m") {
    // llm.c's GPT-2 (124M) reproduction on one GPU (its README: -e d12 -b 64 -t 1024
    // -d 524288 -c 0.1 -l 0.0006 -q 0.0 -u 700 -v 250, 10B FineWeb tokens = 18865 steps):
    // 524288 tokens per step = B 64 x T 1024 x 8 micro-batches; AdamW betas (0.9, 0.95),
    // clip 1.0, no dropout, biases; cosine from 6e-4 to 0 over the whole run.
    c.n_layer = 12; c.n_head = 12; c.n_embd = 768; c.block_size = 1024; c.batch_size = 64; c.grad_accum = 8;
    c.dropout = 0.0; c.bias = true;
    c.lr = 6e-4; c.min_lr = 0.0; c.max_iters = 18865; c.lr_decay_iters = 18865;
    c.warmup_iters = 700; c.beta1 = 0.9; c.beta2 = 0.95; c.weight_decay = 0.1; c.grad_clip = 1.0;
    c.eval_interval = 250; c.eval_iters = 20; c.log_interval = 10; c.ckpt_interval = 5000;
  } else {
    throw InputError("unknown preset '" + name +
                     "'; expected shakespeare-char, baby or gpt2-124m; pass --preset shakespeare-char, --preset baby or --preset gpt2-124m");
  }
  c.preset = name;
}

namespace {

enum class Kind { Int, Real, Str, Bool, Seed, Choice };
template <typename T>
constexpr Kind kind_of() {
  if constexpr (std::is_same_v<T, int>) return Kind::Int;
  else if constexpr (std::is_same_v<T, double>) return Kind::Real;
  else if constexpr (std::is_same_v<T, std::string>) return Kind::Str;
  else if constexpr (std::is_same_v<T, bool>) return Kind::Bool;
  else if constexpr (std::is_same_v<T, uint64_t>) return Kind::Seed;
  else {
    static_assert(std::is_enum_v<T>, "a config field is an int, double, string, bool, uint64_t or enum");
    return Kind::Choice;
  }
}

// The values validate() accepts for a flag (TG_CONFIG_FIELDS' bounds column): lo to hi, each end
// open or closed; an integer's ends are closed, hi = +inf: none. A double must be finite, and
// with as_float stay in range once rounded to float, as the kernels take it.
struct Bounds {
  bool on = false;
  double lo = 0, hi = INFINITY;
  bool lo_open = false, hi_open = false;
  bool as_float = false;
  const char* note = "";           // added to the generated "lo to hi" / "at least lo"
  const char* expected = nullptr;  // the message's "expected ..." instead
  constexpr Bounds says(const char* e) const {
    Bounds b = *this;
    b.expected = e;
    return b;
  }
  constexpr Bounds in_float() const {
    Bounds b = *this;
    b.as_float = true;
    return b;
  }
  bool holds(double v) const {
    auto in = [&](double x) {
      return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
    };
    return in(v) && (!as_float || in((double)(float)v));
  }
  std::string expected_text() const {
    if (expected) return expected;
    std::string e = hi == INFINITY ? "at least " + std::to_string((long long)lo)
                                   : std::to_string((long long)lo) + " to " + std::to_string((long long)hi);
    return *note ? e + " " + note : e;
  }
};
constexpr Bounds None{};
constexpr Bounds Range(long long lo, long long hi, const char* note = "") {
  return Bounds{true, (double)lo, (double)hi, false, false, false, note};
}
constexpr Bounds AtLeast(long long lo, const char* note = "") {
  return Bounds{true, (double)lo, INFINITY, false, false, false, note};
}
// ends: "[)", "(]", "[]" or "()"
constexpr Bounds Reals(double lo, double hi, const char* ends, const char* expected) {
  return Bounds{true, lo, hi, ends[0] == '(', ends[1] == ')', false, "", expected};
}
constexpr bool Fixed = true, Free = false;    // cannot / can change on --resume
constexpr bool Always = false, Added = true;  // an older saved config may lack it
// the modes that read a flag
constexpr unsigned InTrain = 1, InSample = 2, InExport = 4, InLogits = 8;

unsigned mode_bit(Mode m) {
  switch (m) {
    case Mode::Sample: return InSample;
    case Mode::ExportHf: return InExport;
    case Mode::Logits: return InLogits;
    case Mode::Train:
    case Mode::AttentionCheck: break;
  }
  return InTrain;
}

// The values of an enum flag (0 .. n - 1, each spelled by name(): the first whose name repeats
// an earlier one's is past the end, since name() spells an unknown value as the default's), and
// what its error says: "--gelu is 'relu'; expected tanh or erf; pass one of them".
struct Choices {
  std::vector<std::string> names;
  std::string expected;
  int index(const std::string& v) const {
    for (size_t i = 0; i < names.size(); ++i)
      if (v == names[i]) return (int)i;
    return -1;
  }
};
template <typename E>
const Choices& choices_of() {
  static_assert(sizeof(E) == sizeof(int), "an enum field is stored as an int");
  static const Choices c = [] {
    Choices ch;
    for (int i = 0;; ++i) {
      const std::string n = name((E)i);
      if (ch.index(n) >= 0) break;
      ch.names.push_back(n);
    }
    for (size_t i = 0; i < ch.names.size(); ++i)
      ch.expected += (i == 0 ? "" : i + 1 == ch.names.size() ? " or " : ", ") + ch.names[i];
    return ch;
  }();
  return c;
}
template <typename T>
const Choices* choices_for() {
  if constexpr (std::is_enum_v<T>) return &choices_of<T>();
  else return nullptr;
}

struct Flag {
  const char* name;
  Kind kind;
  size_t offset;  // of the field inside Config
  const char* help;
  unsigned modes;  // the modes that read it (InTrain | ...)
  bool fixed;      // cannot change on --resume (the model or the data)
  int usage;       // its place in --help
  Bounds bounds;
  const Choices* choices;  // an enum's values, else null
};

// The flags of TG_CONFIG_FIELDS (model/run/config.h), in --help order.
const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = [] {
    std::vector<Flag> t;
#define TG_CONFIG_FLAG(type, field, def, flag, usage, modes, resume, saved, bounds, help)                   \
    if (*flag)                                                                                             \
      t.push_back(Flag{flag, kind_of<type>(), offsetof(Config, field), help, modes, resume, usage, bounds, \
                       choices_for<type>()});
    TG_CONFIG_FIELDS(TG_CONFIG_FLAG)
#undef TG_CONFIG_FLAG
    std::stable_sort(t.begin(), t.end(), [](const Flag& a, const Flag& b) { return a.usage < b.usage; });
    return t;
  }();
  return table;
}

const Flag* find_flag(const std::string& name) {
  for (const Flag& f : flags())
    if (name == f.name) return &f;
  return nullptr;
}

// Edits (insertions, deletions, substitutions, swaps of neighbours) that turn a into b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The option a mistyped name most likely meant ("" when none is close): underscores read as
// hyphens (nanoGPT's spelling), nanoGPT's learning_rate as --lr, then the nearest name within
// a third of its length.
std::string nearest_option(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  if (name == "learning-rate") return "lr";
  std::vector<std::string> names = {"help", "plot", "no-bias"};
  for (const Flag& f : flags()) names.push_back(f.name);
  std::string best;
  size_t best_d = std::max<size_t>(1, name.size() / 3) + 1;
  for (const std::string& n : names) {
    const size_t d = edit_distance(name, n);
    if (d < best_d) { best_d = d; best = n; }
  }
  return best;
}

[[noreturn]] void bad_value(const std::string& flag, const std::string& value, const std::string& expected) {
  throw InputError("--" + flag + " '" + value + "' is not valid; expected " + expected +
                   "; see train_gpt --help");
}

// Whether v is a decimal number as people write them: [+-]digits[.digits][e[+-]digits] (no
// hex, inf or nan, which strtod would also take).
bool is_decimal(const std::string& v) {
  size_t i = 0, digits = 0;
  auto run = [&] {
    size_t n = 0;
    while (i < v.size() && v[i] >= '0' && v[i] <= '9') ++i, ++n;
    return n;
  };
  if (i < v.size() && (v[i] == '+' || v[i] == '-')) ++i;
  digits += run();
  if (i < v.size() && v[i] == '.') {
    ++i;
    digits += run();
  }
  if (digits == 0) return false;
  if (i < v.size() && (v[i] == 'e' || v[i] == 'E')) {
    ++i;
    if (i < v.size() && (v[i] == '+' || v[i] == '-')) ++i;
    if (run() == 0) return false;
  }
  return i == v.size();
}

long long parse_int(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || x < -2147483647LL || x > 2147483647LL)
    bad_value(flag, v, "an integer");
  return x;
}

void set_value(Config& c, const Flag& f, const std::string& v) {
  char* field = reinterpret_cast<char*>(&c) + f.offset;
  switch (f.kind) {
    case Kind::Int: *reinterpret_cast<int*>(field) = (int)parse_int(f.name, v); break;
    case Kind::Real: {
      errno = 0;
      char* end = nullptr;
      double x = std::strtod(v.c_str(), &end);
      if (!is_decimal(v) || *end != '\0' || errno == ERANGE || !std::isfinite(x))
        bad_value(f.name, v, "a finite decimal number");
      *reinterpret_cast<double*>(field) = x;
      break;
    }
    case Kind::Seed: {
      errno = 0;
      char* end = nullptr;
      unsigned long long x = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || v[0] == '-' || *end != '\0' || errno == ERANGE)
        bad_value(f.name, v, "a non-negative integer below 2^64");
      *reinterpret_cast<uint64_t*>(field) = x;
      break;
    }
    case Kind::Bool:
      if (v == "1" || v == "true" || v == "yes") *reinterpret_cast<bool*>(field) = true;
      else if (v == "0" || v == "false" || v == "no") *reinterpret_cast<bool*>(field) = false;
      else bad_value(f.name, v, "true or false");
      break;
    case Kind::Str: *reinterpret_cast<std::string*>(field) = v; break;
    case Kind::Choice: {
      const int i = f.choices->index(v);
      if (i < 0)
        throw InputError("--" + std::string(f.name) + " is '" + printable(v) + "'; expected " + f.choices->expected +
                         "; pass one of them");
      std::memcpy(field, &i, sizeof i);
      break;
    }
  }
}

void require(bool ok, const std::string& what, const std::string& expected, const std::string& fix) {
  if (!ok) throw InputError(what + "; expected " + expected + "; " + fix);
}

// Refuses a string field longer than kMaxConfigString (defined below each_field).
void check_string_sizes(const Config& c);

std::string num_text(double x) {
  std::ostringstream s;
  s.precision(12);  // integers up to 10^12 without an exponent, 0.1 as 0.1
  s << x;
  return s.str();
}


}  // namespace

ParsedArgs parse_args(int argc, const char* const* argv, const std::string& default_preset) {
  ParsedArgs out;
  std::map<std::string, std::string> given;  // flag name -> value, in the order of flags()
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") { out.help = true; return out; }
    if (a.size() < 3 || a.compare(0, 2, "--") != 0)
      throw InputError("unexpected argument '" + a + "'; expected options of the form --name value; see train_gpt --help");
    std::string name = a.substr(2), value;
    bool has_value = false;
    size_t eq = name.find('=');
    if (eq != std::string::npos) { value = name.substr(eq + 1); name = name.substr(0, eq); has_value = true; }
    if ((name == "no-bias" || name == "help") && has_value)
      throw InputError("option --" + name + " takes no value but is given '" + printable(value) + "'; expected --" +
                       name + " alone" + (name == "no-bias" ? " (or --bias=false)" : "") + "; drop the '=" +
                       printable(value) + "'");
    if (name == "no-bias") { name = "bias"; value = "false"; has_value = true; }
    if (name == "plot")
      throw InputError("--plot is a mode of its own and comes first; expected train_gpt --plot OUT.svg "
                       "RUN/metrics.jsonl ...; move it to the front");
    const Flag* f = find_flag(name);
    if (!f) {
      const std::string near = nearest_option(name);
      throw InputError("unknown option --" + name + "; expected one of the options listed by train_gpt --help; " +
                       (near.empty() ? "check the spelling" : "did you mean --" + near + "?"));
    }
    if (given.count(name)) throw InputError("option --" + name + " given twice; expected it at most once; remove one of them");
    if (!has_value) {
      if (f->kind == Kind::Bool) { value = "true"; }
      else if (i + 1 >= argc) throw InputError("option --" + name + " needs a value; expected --" + name + " VALUE; see train_gpt --help");
      else {
        value = argv[++i];
        // "--lr --seed 3": a value that is itself an option is a missing value (negative numbers pass)
        if (value.size() > 2 && value.compare(0, 2, "--") == 0)
          throw InputError("option --" + name + " needs a value but is followed by " + value + "; expected --" + name + " VALUE; see train_gpt --help");
      }
    }
    given[name] = value;
  }
  Config& c = out.config;
  std::string preset = given.count("preset") ? given["preset"] : default_preset;
  apply_preset(c, preset);
  for (const Flag& f : flags()) {
    auto it = given.find(f.name);
    if (it == given.end()) continue;
    set_value(c, f, it->second);
    out.given.push_back(f.name);
  }
  if (given.count("out-dir") && c.out_dir.empty())
    throw InputError("--out-dir is empty; expected a directory path; pass --out-dir PATH, or leave the flag out for out/" +
                     c.preset);
  // an empty path or mode flag would read as one not given (--init-from '' trains from scratch,
  // --export-hf '' trains): refused, as an empty --out-dir is (--prompt '' is a prompt)
  for (const Flag& f : flags()) {
    auto it = given.find(f.name);
    if (f.kind == Kind::Str && it != given.end() && it->second.empty() && std::string(f.name) != "prompt")
      throw InputError("--" + it->first + " is empty; expected a value; pass --" + it->first +
                       " VALUE (see train_gpt --help), or leave the flag out");
  }
  if (c.out_dir.empty()) c.out_dir = "out/" + c.preset;
  validate(c, !c.init_from.empty());
  return out;
}

void validate(const Config& c, bool shape_to_come) {
  check_string_sizes(c);
  auto flag_is = [](const char* flag, double v) { return std::string("--") + flag + " is " + num_text(v); };
  const std::string help = "see train_gpt --help";
  // each flag's bounds (TG_CONFIG_FIELDS)
  for (const Flag& f : flags()) {
    if (!f.bounds.on) continue;
    const char* field = reinterpret_cast<const char*>(&c) + f.offset;
    const double v = f.kind == Kind::Int ? *reinterpret_cast<const int*>(field) : *reinterpret_cast<const double*>(field);
    require(f.bounds.holds(v), flag_is(f.name, v), f.bounds.expected_text(), help);
  }
  require(shape_to_come || c.n_embd % c.n_head == 0,
          "--n-embd " + std::to_string(c.n_embd) + " is not divisible by --n-head " + std::to_string(c.n_head),
          "n-embd a multiple of n-head (the head dim is n-embd / n-head)", "change one of them");
  require(c.world >= 1 && c.world <= 65536, "the number of ranks is " + std::to_string(c.world), "1 to 65536",
          "run fewer ranks (mpirun -np N)");
  require((double)c.batch_size * c.grad_accum * c.world <= 4294967296.0 / std::max(1, c.n_head),
          "--batch-size " + std::to_string(c.batch_size) + " with --grad-accum " + std::to_string(c.grad_accum) +
              (c.world > 1 ? " on " + std::to_string(c.world) + " ranks" : ""),
          "batch-size x grad-accum x ranks x n-head below 2^32 (the dropout masks' row index)", "lower one of them");
  // the kernels keep an element when a 32-bit word >= round(p 2^32) and scale by (float)(1 / (1 - p))
  require(philox::dropout_threshold(c.dropout) < UINT32_MAX && std::isfinite((float)(1.0 / (1.0 - c.dropout))),
          flag_is("dropout", c.dropout), "a probability below 1 - 2^-32 (the kernels' 32-bit threshold)", help);
  require(c.min_lr >= 0 && c.min_lr <= c.lr, "--min-lr " + num_text(c.min_lr) + " with --lr " + num_text(c.lr),
          "0 <= min-lr <= lr", "lower --min-lr");
  require(c.lr_decay_iters > c.warmup_iters,
          "--lr-decay-iters " + std::to_string(c.lr_decay_iters) + " with --warmup-iters " + std::to_string(c.warmup_iters),
          "lr-decay-iters > warmup-iters (the cosine runs between them)", "raise --lr-decay-iters or lower --warmup-iters");
  require(c.sample_tokens == 0 || !c.prompt.empty(), "--prompt is empty", "at least one character to start the sample from",
          "pass --prompt TEXT (the default is a newline) or --sample-tokens 0");
  require(!c.data.empty(), "--data is empty", "the path of a text file", "pass --data PATH");
  require(!c.sample || !c.ckpt.empty(), "--sample without --ckpt", "the checkpoint to sample from",
          "pass --ckpt out/<run> (its newest checkpoint) or --ckpt out/<run>/ckpt-<step>");
  require(!c.out_dir.empty(), "--out-dir is empty", "a directory path", "pass --out-dir PATH");
  require(c.export_hf.empty() || !c.ckpt.empty(), "--export-hf without --ckpt", "the checkpoint to export",
          "pass --ckpt out/<run> (its newest checkpoint) or --ckpt out/<run>/ckpt-<step>");
  require(c.export_hf.empty() || !c.sample, "--export-hf with --sample", "one of the two modes", "drop one of them");
  require(c.logits.empty() || !c.init_from.empty(), "--logits without --init-from", "the weights to compute them with",
          "pass --init-from PATH (a Hugging Face GPT-2 directory, llm.c's .bin or a train_gpt run)");
  require(c.init_from.empty() || (!c.sample && c.export_hf.empty() && c.attention != Attention::Check),
          std::string("--init-from with ") + (c.sample ? "--sample" : !c.export_hf.empty() ? "--export-hf" : "--attention check"),
          "--init-from for training or --logits (--sample and --export-hf read --ckpt, --attention check a fresh model)",
          "drop one of them");
  require(c.logits.empty() || !c.resume, "--logits with --resume", "one of them (--logits trains nothing)", "drop one of them");
  require(!(c.resume && c.attention == Attention::Check), "--attention check with --resume",
          "one of them (the check runs on a fresh model and writes nothing)", "drop one of them");
}

std::string usage() {
  std::ostringstream s;
  s << "usage: train_gpt [--option value ...]                 train (resume with --resume)\n"
       "       train_gpt --sample --ckpt DIR [--prompt TEXT ...]  generate text from a checkpoint\n"
       "       train_gpt --plot OUT.svg RUN/metrics.jsonl ...     draw the loss curves of runs\n"
       "       train_gpt --export-hf DIR --ckpt RUN               a checkpoint for Hugging Face transformers\n"
       "       train_gpt --init-from PATH [--data ...]            a new run from GPT-2's (or another run's) weights\n"
       "       train_gpt --logits 464,3290 --init-from PATH       a model's logits for token ids (one line per position)\n"
       "       train_gpt --tokenize IN.txt --tokenizer T --out DIR  a text as llm.c token shards (90/10 split)\n"
       "Trains a GPT (nanoGPT's architecture) on a text, character-level (tiny Shakespeare by default),\n"
       "or on GPT-2 token data (llm.c .bin shards, nanoGPT train.bin / val.bin), or on a text in the BPE\n"
       "tokens of --tokenizer (GPT-2's, or any byte-level BPE in its formats).\n"
       "Flags override the preset's values, in any order; --name=value works too.\n\n";
  for (const Flag& f : flags()) {
    std::string n = std::string("--") + f.name;
    s << "  " << n << std::string(n.size() < 18 ? 18 - n.size() : 1, ' ') << f.help << "\n";
  }
  s << "  --plot            OUT.svg RUN/metrics.jsonl ...: loss curves of one or more runs as SVG\n"
       "                    (first on the command line; each run labelled by its directory)\n"
       "  --help            this text\n\n"
       "presets (nanoGPT's shakespeare_char config and its CPU variant; llm.c's GPT-2 small):\n"
       "  shakespeare-char  6 layers, 6 heads, 384 wide, T=256, B=64, dropout 0.2, 5000 iters\n"
       "  baby              4 layers, 4 heads, 128 wide, T=64, B=12, dropout 0, 2000 iters\n"
       "  gpt2-124m         llm.c's GPT-2 small: 12 layers, 12 heads, 768 wide, T=1024, B=64 x grad-accum 8\n"
       "                    (524288 tokens per step), lr 6e-4 (warmup 700, cosine to 0), 18865 iters\n"
       "data parallel: mpirun -np N train_gpt ... trains on N ranks (one GPU each, or CPU processes),\n"
       "  --batch-size per rank (README: Several GPUs, several machines)\n"
       "exit status: 0 success, 2 bad usage or input, 1 runtime failure\n";
  return s.str();
}

std::string describe(const Config& c) {
  std::ostringstream s;
  s << "preset " << c.preset << " | data " << c.data << " | out-dir " << c.out_dir << "\n"
    << "model: n_layer " << c.n_layer << ", n_head " << c.n_head << ", n_embd " << c.n_embd
    << ", block_size " << c.block_size << ", bias " << (c.bias ? "true" : "false") << ", dropout " << c.dropout << "\n"
    << "train: batch_size " << c.batch_size << " x grad_accum " << c.grad_accum
    << (c.world > 1 ? " x " + std::to_string(c.world) + " ranks" : std::string()) << " = "
    << (long long)c.batch_size * c.grad_accum * c.world * c.block_size << " tokens per step"
    << (c.zero && c.world > 1 ? " (optimizer state sharded: --zero 1)" : "") << ", max_iters " << c.max_iters << ", lr " << c.lr << " -> " << c.min_lr
    << " (warmup " << c.warmup_iters << ", decay to " << c.lr_decay_iters << "), weight_decay " << c.weight_decay
    << ", betas (" << c.beta1 << ", " << c.beta2 << "), grad_clip " << c.grad_clip << "\n"
    << "eval: "
    << (c.eval_interval > 0 ? "every " + std::to_string(c.eval_interval) + " steps" : std::string("off (at the end only)"))
    << " over " << c.eval_iters << " batches; log every " << c.log_interval << "; seed " << c.seed;
  return s.str();
}

std::vector<std::string> flag_names() {
  std::vector<std::string> names;
  for (const Flag& f : flags()) names.push_back(f.name);
  return names;
}

bool fixed_on_resume(const std::string& flag) {
  const Flag* f = find_flag(flag);
  return f && f->fixed;
}

namespace {

// Calls f(name, field) for every field of Config, in declaration order (TG_CONFIG_FIELDS).
template <typename C, typename F>
void each_field(C& c, F&& f) {
#define TG_CONFIG_EACH(type, field, ...) f(#field, c.field);
  TG_CONFIG_FIELDS(TG_CONFIG_EACH)
#undef TG_CONFIG_EACH
}

void check_string_sizes(const Config& c) {
  each_field(c, [](const char* name, const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
      std::string flag = name;
      std::replace(flag.begin(), flag.end(), '_', '-');
      require(v.size() <= kMaxConfigString,
              "--" + flag + " is " + std::to_string(v.size()) + " bytes long (\"" + printable(v, 20) + "\")",
              "at most " + std::to_string(kMaxConfigString) + " bytes", "pass a shorter one");
    }
  });
}

// A field's value as config_to_text writes it. Strings: bytes outside printable ASCII, and
// '%', as %XX (one pass, no formatting call a byte: values can be long).
std::string value_text(const std::string& v) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string e;
  e.reserve(v.size());
  for (unsigned char ch : v) {
    if (ch < 0x20 || ch >= 0x7f || ch == '%') {
      const char esc[3] = {'%', kHex[ch >> 4], kHex[ch & 15]};
      e.append(esc, 3);
    } else {
      e += (char)ch;
    }
  }
  return e;
}
std::string value_text(int v) { return std::to_string(v); }
template <typename E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
std::string value_text(E v) {
  return name(v);
}
std::string value_text(bool v) { return v ? "true" : "false"; }
std::string value_text(uint64_t v) { return std::to_string(v); }
std::string value_text(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

struct FieldWriter {
  std::string& out;
  template <typename T>
  void operator()(const char* name, const T& v) {
    out += name;
    out += '=';
    out += value_text(v);
    out += '\n';
  }
};

[[noreturn]] void bad_config(const std::string& what, const std::string& expected) {
  throw InputError("the saved config " + what + "; expected " + expected +
                   "; the state file is damaged or not from train_gpt: delete its checkpoint directory to "
                   "resume from an older one");
}

struct FieldReader {
  std::map<std::string, std::string>& values;

  const std::string& take(const char* name) {
    auto it = values.find(name);
    if (it == values.end()) bad_config(std::string("has no field ") + name, "a line for every field of the config");
    return it->second;
  }
  [[noreturn]] void bad(const char* name, const std::string& v, const std::string& expected) {
    bad_config(std::string("has ") + name + "=" + printable(v), expected);
  }
  void done(const char* name) { values.erase(name); }

  void operator()(const char* name, std::string& out) {
    const std::string& v = take(name);
    std::string s;
    s.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] != '%') { s += v[i]; continue; }
      auto hex = [&](char h) -> int {
        if (h >= '0' && h <= '9') return h - '0';
        if (h >= 'A' && h <= 'F') return h - 'A' + 10;
        if (h >= 'a' && h <= 'f') return h - 'a' + 10;
        return -1;
      };
      int hi = i + 2 < v.size() ? hex(v[i + 1]) : -1, lo = i + 2 < v.size() ? hex(v[i + 2]) : -1;
      if (hi < 0 || lo < 0) bad(name, v, "%XX escapes of two hex digits");
      s += (char)(hi * 16 + lo);
      i += 2;
    }
    out = s;
    done(name);
  }
  void operator()(const char* name, int& out) {
    const std::string& v = take(name);
    errno = 0;
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) || *end != '\0' || errno == ERANGE || x < INT_MIN ||
        x > INT_MAX)
      bad(name, v, "an integer");
    out = (int)x;
    done(name);
  }
  void operator()(const char* name, bool& out) {
    const std::string& v = take(name);
    if (v == "true") out = true;
    else if (v == "false") out = false;
    else bad(name, v, "true or false");
    done(name);
  }
  void operator()(const char* name, uint64_t& out) {
    const std::string& v = take(name);
    errno = 0;
    char* end = nullptr;
    unsigned long long x = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || v[0] < '0' || v[0] > '9' || *end != '\0' || errno == ERANGE)
      bad(name, v, "an integer from 0 to 2^64-1");
    out = x;
    done(name);
  }
  template <typename E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  void operator()(const char* name, E& out) {
    const std::string& v = take(name);
    const Choices& ch = choices_of<E>();
    const int i = ch.index(v);
    if (i < 0) bad(name, v, ch.expected);
    out = (E)i;
    done(name);
  }
  void operator()(const char* name, double& out) {
    const std::string& v = take(name);
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (!is_decimal(v) || *end != '\0') bad(name, v, "a decimal number");
    out = x;
    done(name);
  }
};

}  // namespace

std::string config_to_text(const Config& c) {
  std::string out;
  each_field(c, FieldWriter{out});
  return out;
}

Config config_from_text(const std::string& text) {
  static const std::set<std::string> known = [] {
    std::set<std::string> names;
    const Config any;
    each_field(any, [&](const char* name, const auto&) { names.insert(name); });
    return names;
  }();
  std::map<std::string, std::string> values;
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    const size_t nl = std::min(text.find('\n', pos), text.size());
    ++line_no;
    const size_t eq = text.find('=', pos);
    if (eq >= nl)
      bad_config("line " + std::to_string(line_no) + " '" + printable(text.substr(pos, std::min<size_t>(nl - pos, 64))) +
                     "' has no '='",
                 "name=value lines");
    std::string name = text.substr(pos, eq - pos);
    // each line checked as it is read: at most one line a field, each of a bounded size
    if (!known.count(name))
      bad_config("has an unknown field " + printable(name),
                 "only the fields of this train_gpt's config (a newer train_gpt wrote it?)");
    if (nl - eq - 1 > kMaxConfigValue)
      bad_config("has " + name + "= of " + std::to_string(nl - eq - 1) + " bytes",
                 "a value of at most " + std::to_string(kMaxConfigValue) + " bytes");
    if (!values.emplace(name, text.substr(eq + 1, nl - eq - 1)).second)
      bad_config("names " + printable(name) + " twice", "each field once");
    pos = nl + 1;
  }
  // fields added after checkpoints were first written (Added): an older config has no line for
  // them and reads as the run it was, with their defaults (GELU: the tanh form, the only one then;
  // no accumulation; one rank; no --tokenizer, no --export-hf, no --init-from, no --logits)
  {
    const Config defaults;
#define TG_CONFIG_ADDED(type, field, def, flag, usage, modes, resume, saved, ...) \
    if (saved) values.emplace(#field, value_text(defaults.field));
    TG_CONFIG_FIELDS(TG_CONFIG_ADDED)
#undef TG_CONFIG_ADDED
  }
  Config c;
  each_field(c, FieldReader{values});
  if (!values.empty())
    bad_config("has an unknown field " + printable(values.begin()->first),
               "only the fields of this train_gpt's config (a newer train_gpt wrote it?)");
  return c;
}

std::string flag_value(const Config& c, const std::string& flag) {
  std::string field = flag;
  for (char& ch : field)
    if (ch == '-') ch = '_';
  // that field alone: writing the whole config for each flag asked about costs its size each time
  std::string value;
  each_field(c, [&](const char* name, const auto& v) {
    if (field == name) value = value_text(v);
  });
  return value;
}

void copy_flag(Config& to, const Config& from, const std::string& flag) {
  const Flag* f = find_flag(flag);
  if (!f) return;
  char* dst = reinterpret_cast<char*>(&to) + f->offset;
  const char* src = reinterpret_cast<const char*>(&from) + f->offset;
  switch (f->kind) {
    case Kind::Int: *reinterpret_cast<int*>(dst) = *reinterpret_cast<const int*>(src); break;
    case Kind::Real: *reinterpret_cast<double*>(dst) = *reinterpret_cast<const double*>(src); break;
    case Kind::Seed: *reinterpret_cast<uint64_t*>(dst) = *reinterpret_cast<const uint64_t*>(src); break;
    case Kind::Bool: *reinterpret_cast<bool*>(dst) = *reinterpret_cast<const bool*>(src); break;
    case Kind::Str: *reinterpret_cast<std::string*>(dst) = *reinterpret_cast<const std::string*>(src); break;
    case Kind::Choice: std::memcpy(dst, src, sizeof(int)); break;
  }
}

Mode mode(const Config& c) {
  if (c.sample) return Mode::Sample;
  if (!c.export_hf.empty()) return Mode::ExportHf;
  if (!c.logits.empty()) return Mode::Logits;
  if (c.attention == Attention::Check) return Mode::AttentionCheck;
  return Mode::Train;
}

std::vector<std::string> mode_flags(Mode m) {
  std::vector<std::string> names;
  for (const Flag& f : flags())
    if (f.modes & mode_bit(m)) names.push_back(f.name);
  return names;
}

std::vector<Mode> modes_reading(const std::string& flag) {
  std::vector<Mode> modes;
  const Flag* f = find_flag(flag);
  for (Mode m : {Mode::Train, Mode::Sample, Mode::ExportHf, Mode::Logits})
    if (f && (f->modes & mode_bit(m))) modes.push_back(m);
  return modes;
}

std::vector<std::string> ignored_flags(const ParsedArgs& a) {
  const unsigned bit = mode_bit(mode(a.config));
  std::vector<std::string> names;
  for (const std::string& g : a.given)
    if (!(find_flag(g)->modes & bit)) names.push_back(g);
  return names;
}

const char* mode_flag(Mode m) {
  switch (m) {
    case Mode::Sample: return "--sample";
    case Mode::ExportHf: return "--export-hf";
    case Mode::Logits: return "--logits";
    case Mode::AttentionCheck: return "--attention check";
    case Mode::Train: break;
  }
  return "";
}

}  // namespace tg
