// tests/cpu/test_cli.cpp: the command line. parse_args against presets, overrides and a table
// of bad inputs; then the train_gpt binary itself (path in TG_TRAIN_GPT, default ./train_gpt):
// exit codes, one line on stderr, nothing written on bad input, and a short real run.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../model/formats/checkpoint.h"
#include "../../model/run/config.h"
#include "../../model/run/train.h"
#include "../../model/net/gpt.h"
#include "../../data/errors.h"
#include "../common/cli_util.h"

using namespace tg;
using namespace cli;
namespace fs = std::filesystem;

namespace {

Config parse(std::vector<const char*> args, const std::string& def = "baby") {
  args.insert(args.begin(), "train_gpt");
  return parse_args((int)args.size(), args.data(), def).config;
}

// The message parse_args throws for args ("" when it accepts them).
std::string parse_error(std::vector<const char*> args) {
  try {
    parse(args);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("cli: presets are nanoGPT's configs") {
  Config s = parse({"--preset", "shakespeare-char"});
  CHECK(s.n_layer == 6); CHECK(s.n_head == 6); CHECK(s.n_embd == 384); CHECK(s.block_size == 256);
  CHECK(s.batch_size == 64); CHECK(s.dropout == 0.2); CHECK(s.lr == 1e-3); CHECK(s.min_lr == 1e-4);
  CHECK(s.max_iters == 5000); CHECK(s.lr_decay_iters == 5000); CHECK(s.warmup_iters == 100);
  CHECK(s.beta2 == 0.99); CHECK(s.weight_decay == 0.1); CHECK(s.grad_clip == 1.0); CHECK(!s.bias);
  CHECK(s.eval_interval == 250); CHECK(s.eval_iters == 200); CHECK(s.out_dir == "out/shakespeare-char");
  Config b = parse({"--preset", "baby"});
  CHECK(b.n_layer == 4); CHECK(b.n_head == 4); CHECK(b.n_embd == 128); CHECK(b.block_size == 64);
  CHECK(b.batch_size == 12); CHECK(b.dropout == 0.0); CHECK(b.max_iters == 2000); CHECK(b.lr_decay_iters == 2000);
  CHECK(b.eval_iters == 20); CHECK(b.lr == 1e-3); CHECK(b.eval_interval == 250);
  CHECK(parse({}, "baby").preset == "baby");
  CHECK(parse({}, "shakespeare-char").preset == "shakespeare-char");
}

TEST_CASE("cli: explicit flags override the preset, in any order, both spellings") {
  Config c = parse({"--n-layer", "2", "--preset", "shakespeare-char", "--dropout=0.1", "--bias", "--seed", "18446744073709551615"});
  CHECK(c.n_layer == 2);
  CHECK(c.n_head == 6);
  CHECK(c.dropout == 0.1);
  CHECK(c.bias);
  CHECK(c.seed == 18446744073709551615ull);
  CHECK(!parse({"--bias=false"}).bias);
  CHECK(!parse({"--no-bias"}).bias);
  CHECK(parse({"--attention", "naive"}).attention == Attention::Naive);
  CHECK(parse({"--prompt", "ROMEO:"}).prompt == "ROMEO:");
  // with --init-from the shape is the file's: --n-head (for a file without config.json) is not held
  // to the preset's n-embd (baby's 128; GPT-2 small's 12 heads of 64)
  CHECK(parse_error({"--init-from", "gpt2/model.safetensors", "--n-head", "12"}) == "");
  CHECK(parse_error({"--n-head", "12"}).find("--n-embd 128 is not divisible by --n-head 12") != std::string::npos);
}

TEST_CASE("cli: the enum flags are parsed once; the mode and the run shape follow from the config") {
  const Config c = parse({"--device", "cpu", "--attention", "check", "--precision", "fp32", "--gelu", "erf",
                          "--batch-size", "3", "--block-size", "16", "--grad-accum", "2", "--dropout", "0.25",
                          "--grad-clip", "0.5", "--beta2", "0.95", "--weight-decay", "0.2", "--seed", "5"});
  CHECK(c.device == Device::Cpu);
  CHECK(c.attention == Attention::Check);
  CHECK(c.precision == Precision::FP32);
  CHECK(c.gelu == GeluForm::Erf);
  // each spelled as its flag, in the saved config and by flag_value
  CHECK(flag_value(c, "attention") == "check");
  CHECK(flag_value(c, "gelu") == "erf");
  CHECK(config_to_text(c).find("\ndevice=cpu\nattention=check\nprecision=fp32\n") != std::string::npos);
  Config d = parse({});
  copy_flag(d, c, "precision");
  CHECK(d.precision == Precision::FP32);
  CHECK(d.attention == Attention::Flash);

  CHECK(mode(c) == Mode::AttentionCheck);
  CHECK(std::string(mode_flag(mode(c))) == "--attention check");
  CHECK(mode(parse({})) == Mode::Train);
  CHECK(mode(parse({"--sample", "--ckpt", "x"})) == Mode::Sample);
  CHECK(mode(parse({"--export-hf", "x", "--ckpt", "y"})) == Mode::ExportHf);
  CHECK(std::string(mode_flag(Mode::Train)).empty());

  // the check runs the flash path's forward, with room for both paths' saved buffers
  const RunShape r = run_shape(c);
  CHECK((r.B == 3 && r.T == 16 && r.accum == 2 && r.dropout == 0.25 && r.seed == 5));
  CHECK(r.attention == AttentionPath::Flash);
  CHECK(r.both_paths);
  CHECK(std::string(attention_name(r)) == "check");
  CHECK((r.gelu == GeluForm::Erf && r.precision == Precision::FP32));
  CHECK((r.grad_clip == 0.5 && r.beta1 == c.beta1 && r.beta2 == 0.95 && r.weight_decay == 0.2));
  CHECK(r.shard_ranks == 1);  // one process: nothing sharded, --zero 1 or not
  const RunShape n = run_shape(parse({"--attention", "naive", "--zero", "1"}));
  CHECK((n.attention == AttentionPath::Naive && !n.both_paths && n.shard_ranks == 1));
  CHECK(std::string(attention_name(n)) == "naive");
}

TEST_CASE("cli: decimal numbers in every spelling people use are accepted") {
  CHECK(parse({"--lr", "1e-3"}).lr == 1e-3);
  CHECK(parse({"--lr", "+.5e-2"}).lr == 0.005);
  CHECK(parse({"--lr", "2.", "--min-lr", "0"}).lr == 2.0);
  CHECK(parse({"--lr", "3E-4"}).lr == 3e-4);
  CHECK(parse({"--beta2", "0.9999999"}).beta2 == 0.9999999);  // 0.99999988f: below 1 in float
  CHECK(parse({"--dropout", "0.999"}).dropout == 0.999);
  CHECK(parse({"--out-dir", "x"}).out_dir == "x");
  CHECK(parse({}).out_dir == "out/baby");
}

// The integer flags' ranges come from their entries (TG_CONFIG_FIELDS, model/run/config.h):
// both ends accepted, one past either refused with the entry's range in the message.
TEST_CASE("cli: an integer flag's range is its entry's: both ends accepted, one past refused") {
  struct Row {
    const char* flag;
    long long lo, hi;  // hi -1: no upper end
    const char* expected;
  };
  const std::vector<Row> rows = {
      {"n-layer", 1, 127, "expected 1 to 127"},
      {"n-head", 1, -1, "expected at least 1"},
      {"block-size", 1, 1 << 20, "expected 1 to 1048576"},
      {"batch-size", 1, 1 << 20, "expected 1 to 1048576"},
      {"grad-accum", 1, 65536, "expected 1 to 65536"},
      {"max-iters", 0, (1 << 22) - 1, "expected 0 to 4194303"},
      {"warmup-iters", 0, -1, "expected at least 0"},
      {"eval-interval", 0, -1, "expected at least 0 (0 = only at the end)"},
      {"eval-iters", 1, -1, "expected at least 1"},
      {"log-interval", 1, -1, "expected at least 1"},
      {"ckpt-interval", 0, -1, "expected at least 0 (0 = only at the end)"},
      {"sample-tokens", 0, -1, "expected at least 0"},
      {"top-k", 0, -1, "expected at least 0 (0 = no top-k cut)"},
  };
  for (const Row& r : rows) {
    const std::string flag = std::string("--") + r.flag;
    CAPTURE(flag);
    auto error = [&](long long v) {
      const std::string value = std::to_string(v);
      return parse_error({flag.c_str(), value.c_str()});
    };
    CHECK(error(r.lo) == "");
    CHECK(error(r.lo - 1).find(flag + " is " + std::to_string(r.lo - 1) + "; " + r.expected) != std::string::npos);
    if (r.hi >= 0) {
      CHECK(error(r.hi) == "");
      CHECK(error(r.hi + 1).find(flag + " is " + std::to_string(r.hi + 1) + "; " + r.expected) != std::string::npos);
    }
  }
}

// The double flags' bounds come from their entries too (Reals, model/run/config.h): each end
// accepted or refused as the entry writes it ("[)": lo in, hi out), and .in_float() checked
// again on the value rounded to float.
TEST_CASE("cli: a double flag's bounds are its entry's: closed ends accepted, open ends and beyond refused") {
  struct Row {
    const char* flag;
    const char* in;   // accepted (an end when the entry's is closed)
    const char* out;  // refused: past an end, or at an open one
    const char* expected;
  };
  const std::vector<Row> rows = {
      {"dropout", "0", "1", "expected a probability in [0, 1)"},
      {"dropout", "0", "-1e-300", "expected a probability in [0, 1)"},
      {"top-p", "1", "0", "expected a probability in (0, 1]"},
      {"top-p", "1", "1.0000000001", "expected a probability in (0, 1]"},
      {"grad-clip", "0", "-1e-300", "expected at least 0 (0 turns clipping off)"},
      {"temperature", "1e-6", "9.99999e-7", "expected a temperature from 1e-6 up"},
      {"weight-decay", "0", "-1e-300", "expected at least 0, a finite float"},
      {"weight-decay", "3.4e38", "3.5e38", "expected at least 0, a finite float"},  // inf in float
      {"beta1", "0", "-1e-300", "stays below 1 in float"},
      {"beta1", "0.99999994", "0.99999998", "stays below 1 in float"},  // rounds to 1.0f
      {"lr", "1.1754944e-38", "1.1e-38", "a normal float"},            // FLT_MIN; a denormal
      {"lr", "3.4e38", "3.5e38", "a normal float"},
  };
  for (const Row& r : rows) {
    const std::string flag = std::string("--") + r.flag;
    CAPTURE(flag);
    CAPTURE(r.out);
    std::vector<const char*> in = {flag.c_str(), r.in}, out = {flag.c_str(), r.out};
    if (std::string(r.flag) == "lr") in.insert(in.end(), {"--min-lr", "0"}), out.insert(out.end(), {"--min-lr", "0"});
    CHECK(parse_error(in) == "");
    const std::string e = parse_error(out);
    CHECK(e.find(flag + " is ") != std::string::npos);
    CHECK(e.find(r.expected) != std::string::npos);
  }
}

// Which modes read a flag is its entry's (TG_CONFIG_FIELDS' modes): --sample takes those of
// its own over the checkpoint's config, and a flag given to a mode that does not read it is named.
TEST_CASE("cli: the modes that read a flag; the flags given that a mode ignores") {
  auto has = [](const std::vector<std::string>& v, const char* s) { return std::find(v.begin(), v.end(), s) != v.end(); };
  const std::vector<std::string> sample = mode_flags(Mode::Sample);
  for (const char* f : {"sample", "ckpt", "data", "tokenizer", "prompt", "sample-tokens", "temperature", "top-k",
                        "top-p", "seed", "device", "precision"})
    CHECK(has(sample, f));
  CHECK(sample.size() == 12);
  CHECK(mode_flags(Mode::ExportHf) == std::vector<std::string>{"data", "ckpt", "export-hf"});
  CHECK(mode_flags(Mode::AttentionCheck) == mode_flags(Mode::Train));  // a training command line
  for (const char* f : {"sample", "ckpt", "export-hf", "logits"}) CHECK(!has(mode_flags(Mode::Train), f));
  for (const char* f : {"logits", "init-from", "n-head", "gelu", "device"}) CHECK(has(mode_flags(Mode::Logits), f));
  CHECK(modes_reading("ckpt") == std::vector<Mode>{Mode::Sample, Mode::ExportHf});
  CHECK(modes_reading("max-iters") == std::vector<Mode>{Mode::Train});
  // every flag is read by some mode
  for (const std::string& f : flag_names()) CHECK(!modes_reading(f).empty());

  auto ignored = [](std::vector<const char*> args) {
    args.insert(args.begin(), "train_gpt");
    return ignored_flags(parse_args((int)args.size(), args.data(), "baby"));
  };
  CHECK(ignored({"--sample", "--ckpt", "x", "--max-iters", "5", "--top-k", "1", "--n-layer", "2"}) ==
        std::vector<std::string>{"n-layer", "max-iters"});
  CHECK(ignored({"--ckpt", "x", "--max-iters", "5"}) == std::vector<std::string>{"ckpt"});
  CHECK(ignored({"--attention", "check", "--max-iters", "5", "--lr", "1e-3"}).empty());
  CHECK(ignored({"--export-hf", "x", "--ckpt", "y", "--device", "cpu"}) == std::vector<std::string>{"device"});
  CHECK(ignored({"--max-iters", "5", "--prompt", "x"}).empty());
}

TEST_CASE("cli: bad values are rejected with what, expected and how to fix") {
  struct Row {
    std::vector<const char*> args;
    const char* says;  // a piece of the message
  };
  const std::vector<Row> rows = {
      {{"--batch-size", "0"}, "--batch-size is 0"},
      {{"--batch-size", "-3"}, "--batch-size is -3"},
      {{"--batch-size", "abc"}, "--batch-size 'abc' is not valid"},
      {{"--batch-size", "12x"}, "--batch-size '12x' is not valid"},
      {{"--batch-size", "99999999999"}, "is not valid"},
      {{"--block-size", "0"}, "--block-size is 0"},
      {{"--max-iters", "1e3"}, "--max-iters '1e3' is not valid"},
      {{"--max-iters", "-1"}, "--max-iters is -1"},
      {{"--dropout", "1"}, "--dropout is 1"},
      {{"--dropout", "-0.1"}, "--dropout is -0.1"},
      {{"--dropout", "nan"}, "a finite decimal number"},
      {{"--n-embd", "130", "--n-head", "4"}, "not divisible by --n-head"},
      {{"--n-head", "0"}, "--n-head is 0"},
      {{"--n-layer", "0"}, "--n-layer is 0"},
      {{"--n-layer", "500"}, "--n-layer is 500"},
      {{"--lr", "0"}, "--lr is 0"},
      {{"--lr", "-0"}, "--lr is"},
      {{"--min-lr", "0.1"}, "min-lr <= lr"},
      {{"--warmup-iters", "3000", "--lr-decay-iters", "2000"}, "lr-decay-iters > warmup-iters"},
      {{"--beta1", "1"}, "--beta1 is 1"},
      {{"--beta2", "-0.5"}, "--beta2 is -0.5"},
      {{"--weight-decay", "-1"}, "--weight-decay is -1"},
      {{"--grad-clip", "-1"}, "--grad-clip is -1"},
      {{"--eval-iters", "0"}, "--eval-iters is 0"},
      {{"--eval-interval", "-5"}, "--eval-interval is -5"},
      {{"--temperature", "0"}, "--temperature is 0"},
      {{"--top-k", "-1"}, "--top-k is -1"},
      {{"--sample-tokens", "-1"}, "--sample-tokens is -1"},
      {{"--seed", "-1"}, "--seed '-1' is not valid"},
      {{"--bias=maybe"}, "--bias 'maybe' is not valid"},
      {{"--device", "gpu"}, "--device is 'gpu'"},
      {{"--attention", "fast"}, "--attention is 'fast'"},
      {{"--precision", "half"}, "--precision is 'half'"},
      {{"--preset", "large"}, "unknown preset 'large'"},
      {{"--data", ""}, "--data is empty"},
      {{"--lerning-rate", "1"}, "unknown option --lerning-rate"},
      {{"--gelu", "relu"}, "--gelu is 'relu'"},
      // a near miss gets a suggestion: nanoGPT's underscores, a letter off, a swap
      {{"--max_iters", "5"}, "unknown option --max_iters; expected one of the options listed by train_gpt --help; did you mean --max-iters?"},
      {{"--max-iter", "5"}, "did you mean --max-iters?"},
      {{"--smaple"}, "did you mean --sample?"},
      {{"--learning_rate", "1e-3"}, "did you mean --lr?"},
      {{"--xyz", "1"}, "unknown option --xyz; expected one of the options listed by train_gpt --help; check the spelling"},
      {{"--seed", "1", "--plot", "x.svg"}, "--plot is a mode of its own and comes first"},
      {{"--lr", "1e-3", "--lr", "2e-3"}, "--lr given twice"},
      {{"--lr"}, "--lr needs a value"},
      {{"--lr", "--seed", "3"}, "--lr needs a value but is followed by --seed"},
      // the flags that take no value, given one: named as such, not as unknown ("did you mean --no-bias?")
      {{"--no-bias=true"}, "option --no-bias takes no value but is given 'true'; expected --no-bias alone (or --bias=false)"},
      {{"--help=1"}, "option --help takes no value but is given '1'"},
      {{"input.txt"}, "unexpected argument 'input.txt'"},
      // values valid on paper that degenerate as the kernels see them (in float)
      {{"--beta2", "0.99999999"}, "--beta2 is 0.99999999"},  // 1.0f: AdamW's bias correction divides by 0
      {{"--beta1", "0.999999999"}, "--beta1 is"},
      {{"--lr", "1e-50"}, "--lr is 1e-50"},                    // 0 in float
      {{"--lr", "1e39"}, "--lr is 1e+39"},                     // inf in float
      {{"--lr", "1e-40"}, "--lr is 1e-40"},                    // a float denormal
      {{"--weight-decay", "1e39"}, "--weight-decay is"},
      {{"--dropout", "0.99999999999"}, "--dropout is"},        // its 32-bit threshold saturates
      {{"--temperature", "1e-9"}, "--temperature is 1e-09"},   // logits / T overflow
      // numbers are decimal: no hex, no inf
      {{"--lr", "0x10"}, "--lr '0x10' is not valid"},
      {{"--lr", "0x1p-3"}, "--lr '0x1p-3' is not valid"},
      {{"--lr", "inf"}, "--lr 'inf' is not valid"},
      {{"--lr", "1e"}, "--lr '1e' is not valid"},
      {{"--lr", "."}, "--lr '.' is not valid"},
      {{"--out-dir", ""}, "--out-dir is empty"},
      // an empty path or mode is refused, not read as the flag left out (which trains)
      {{"--init-from", ""}, "--init-from is empty"},
      {{"--export-hf", "", "--ckpt", "out/run"}, "--export-hf is empty"},
      {{"--logits=", "--init-from", "gpt2"}, "--logits is empty"},
      {{"--tokenizer", ""}, "--tokenizer is empty"},
      {{"--sample", "--ckpt", ""}, "--ckpt is empty"},
      {{"--resume", "--attention", "check"}, "--attention check with --resume"},
  };
  for (const Row& r : rows) {
    std::string joined;
    for (const char* a : r.args) joined += std::string(a) + " ";
    CAPTURE(joined);
    std::string msg = parse_error(r.args);
    CAPTURE(msg);
    CHECK(msg.find(r.says) != std::string::npos);
    CHECK(msg.find("expected") != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
}

TEST_CASE("cli: the binary exits 2 with one line on stderr and writes nothing") {
  const fs::path out = fresh_dir("tg_cli_out");
  const std::string o = " --out-dir " + out.string() + " --data " + data_path();
  const std::vector<std::string> bad = {
      "--batch-size 0", "--dropout 1.5", "--n-embd 100 --n-head 3", "--frobnicate", "--lr",
      "--data /nonexistent/input.txt", "--prompt '~~~@@@'",
      "--n-embd 65536 --n-head 1",  // terabytes: refused before allocating, on any machine
  };
  for (const std::string& args : bad) {
    CAPTURE(args);
    Run r = run_train_gpt(args + o);
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.rfind("error: ", 0) == 0);
    CHECK(!fs::exists(out));
  }
  // a directory that holds a run is refused, and its metrics are left as they were
  fs::create_directories(out);
  { std::ofstream(out / "metrics.jsonl") << "{\"step\": 0}\n"; }
  Run r = run_train_gpt("--max-iters 1" + o);
  CHECK(r.code == 2);
  CHECK(r.err.find("already holds a run") != std::string::npos);
  CHECK(slurp((out / "metrics.jsonl").string()) == "{\"step\": 0}\n");
  fs::remove_all(out);
}

TEST_CASE("cli: --help exits 0; --device cuda without a usable GPU exits 1") {
  Run h = run_train_gpt("--help");
  CHECK(h.code == 0);
  CHECK(h.out.find("--attention") != std::string::npos);
  CHECK(h.err.empty());
  // every mode: the usage lines and the option list
  CHECK(h.out.rfind("usage: train_gpt [--option value ...]", 0) == 0);
  CHECK(h.out.find("\n       train_gpt --sample --ckpt DIR") != std::string::npos);
  CHECK(h.out.find("\n       train_gpt --plot OUT.svg RUN/metrics.jsonl") != std::string::npos);
  for (const char* mode : {"\n  --sample ", "\n  --ckpt ", "\n  --resume ", "\n  --plot "}) {
    CAPTURE(mode);
    CHECK(h.out.find(mode) != std::string::npos);
  }
  Run c = run_train_gpt("--device cuda --max-iters 1 --data " + data_path());
  CHECK(c.code == 1);
  CHECK(count_lines(c.err) == 1);
  CHECK(c.err.find("--device cuda") != std::string::npos);
}

TEST_CASE("cli: a short real run writes metrics.jsonl and a sample") {
  const fs::path out = fresh_dir("tg_cli_run");
  Run r = run_train_gpt("--device cpu --max-iters 4 --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 --batch-size 2 "
                        "--eval-interval 2 --eval-iters 2 --sample-tokens 20 --prompt ROMEO: --dropout 0.1 --out-dir " +
                        out.string() + " --data " + data_path());
  CAPTURE(r.out);
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("parameters: ") != std::string::npos);
  CHECK(r.out.find("attention: flash") != std::string::npos);
  CHECK(r.out.find("ROMEO:") != std::string::npos);
  std::string m = slurp((out / "metrics.jsonl").string());
  CHECK(count_lines(m) == 5);  // steps 0..3 and the final evaluation at step 4
  std::istringstream lines(m);
  std::string line;
  for (int n = 0; std::getline(lines, line); ++n) {
    CAPTURE(line);
    CHECK(line.rfind("{\"step\": " + std::to_string(n) + ",", 0) == 0);
    for (const char* key : {"\"train_loss\": ", "\"lr\": ", "\"ms\": ", "\"tokens_per_s\": "})
      CHECK(line.find(key) != std::string::npos);
    const bool evaluated = n == 0 || n == 2 || n == 4;  // --eval-interval 2, and the end
    CHECK((line.find("\"val_loss\": ") != std::string::npos) == evaluated);
    CHECK(line.find("nan") == std::string::npos);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);  // JSON, every line
    REQUIRE(j.is_object());
    CHECK(j["step"] == n);
    CHECK(j["lr"].is_number());
  }
  fs::remove_all(out);
}

TEST_CASE("cli: --resume continues bitwise from the newest checkpoint, dropout included") {
  const fs::path out = fresh_dir("tg_cli_resume");
  const std::string args = "--device cpu --max-iters 6 --ckpt-interval 3 --n-layer 1 --n-head 2 --n-embd 16 "
                           "--block-size 8 --batch-size 2 --eval-interval 2 --eval-iters 2 --sample-tokens 0 "
                           "--dropout 0.2 --data " + data_path() + " --out-dir " + out.string();
  Run first = run_train_gpt(args);
  CAPTURE(first.err);
  REQUIRE(first.code == 0);
  const fs::path c3 = out / "ckpt-00000003", c6 = out / "ckpt-00000006";
  REQUIRE(fs::exists(c3 / "state.bin"));
  REQUIRE(fs::exists(c6 / "model.safetensors"));
  const std::string weights = slurp((c6 / "model.safetensors").string()), state = slurp((c6 / "state.bin").string());
  const std::string metrics = slurp((out / "metrics.jsonl").string());
  // as if the run had been killed after its step-3 checkpoint
  fs::remove_all(c6);
  Run again = run_train_gpt("--resume --out-dir " + out.string());
  CAPTURE(again.err);
  REQUIRE(again.code == 0);
  CHECK(again.out.find("resuming from") != std::string::npos);
  CHECK(slurp((c6 / "model.safetensors").string()) == weights);
  CHECK(slurp((c6 / "state.bin").string()) == state);
  // the same losses step by step (the "ms" fields differ)
  auto losses = [](const std::string& m) {
    std::string out;
    std::istringstream in(m);
    for (std::string line; std::getline(in, line);) {
      size_t a = line.find("\"train_loss\": "), b = line.find(", \"lr\"");
      out += line.substr(0, a) + line.substr(a, b - a) + "\n";
    }
    return out;
  };
  CHECK(losses(slurp((out / "metrics.jsonl").string())) == losses(metrics));
  // nothing to resume
  fs::path empty = out / "empty";
  fs::create_directories(empty);
  Run none = run_train_gpt("--resume --out-dir " + empty.string());
  CHECK(none.code == 2);
  CHECK(none.err.find("holds no complete checkpoint") != std::string::npos);
  fs::remove_all(out);
}

TEST_CASE("cli: --gelu erf trains the exact GELU and the checkpoint says so; the default is GPT-2's tanh form") {
  const fs::path base = fresh_dir("tg_cli_gelu");
  const std::string args = "--device cpu --max-iters 3 --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 --batch-size 2 "
                           "--eval-interval 0 --eval-iters 1 --sample-tokens 0 --data " + data_path();
  Run erf = run_train_gpt(args + " --gelu erf --out-dir " + (base / "erf").string());
  Run tanh = run_train_gpt(args + " --out-dir " + (base / "tanh").string());
  CAPTURE(erf.err);
  REQUIRE(erf.code == 0);
  REQUIRE(tanh.code == 0);
  // the activation is in the config the weights file carries in its metadata
  CHECK(slurp((base / "erf" / "ckpt-00000003" / "model.safetensors").string()).find("gelu=erf") != std::string::npos);
  CHECK(slurp((base / "tanh" / "ckpt-00000003" / "model.safetensors").string()).find("gelu=tanh") != std::string::npos);
  // another function: other weights after the same steps from the same init and batches
  const auto weights = [&](const char* run) {
    const std::string w = slurp((base / run / "ckpt-00000003" / "model.safetensors").string());
    return w.substr(w.size() - 4096);  // tensors at the end of the file
  };
  CHECK(weights("erf") != weights("tanh"));
  auto losses = [](const fs::path& run) {
    std::vector<double> l;
    std::istringstream lines(slurp((run / "metrics.jsonl").string()));
    for (std::string line; std::getline(lines, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("train_loss") && j["train_loss"].is_number()) l.push_back(j["train_loss"].get<double>());
    }
    return l;
  };
  const std::vector<double> le = losses(base / "erf"), lt = losses(base / "tanh");
  REQUIRE(le.size() == 3);
  REQUIRE(lt.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(std::fabs(le[i] - lt[i]) < 1e-2 * lt[i]);  // close functions: close losses
  fs::remove_all(base);
}

TEST_CASE("cli: --plot of two runs with identical curves shows both, and a long run name whole in its tooltip") {
  const fs::path base = fresh_dir("tg_cli_plot");
  const std::string metrics = "{\"step\": 0, \"train_loss\": 4.2, \"val_loss\": 4.19, \"eval_train_loss\": 4.2}\n"
                              "{\"step\": 1, \"train_loss\": 3.9}\n"
                              "{\"step\": 2, \"train_loss\": null, \"val_loss\": 3.6, \"eval_train_loss\": 3.5, \"final\": true}\n";
  const std::string long_name = "shakespeare-char-naive-attention-fp32-dropout-0.2-seed-1337";
  for (const std::string& run : {std::string("flash"), long_name}) {
    fs::create_directories(base / run);
    std::ofstream((base / run / "metrics.jsonl").string()) << metrics;
  }
  const fs::path svg = base / "loss.svg";
  Run r = run_train_gpt("--plot " + svg.string() + " " + (base / "flash" / "metrics.jsonl").string() + " " +
                        (base / long_name / "metrics.jsonl").string());
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  const std::string s = slurp(svg.string());
  CHECK(s.find("stroke-dasharray") != std::string::npos);  // the second run is dashed over the first
  CHECK(s.find("<title>" + long_name + "</title>") != std::string::npos);
  CHECK(s.find("\u2026") != std::string::npos);  // shortened in the legend
  fs::remove_all(base);
}

TEST_CASE("cli: --plot without its .svg output first refuses, and the metrics file named there is kept") {
  const fs::path base = fresh_dir("tg_cli_plot_out");
  const std::string metrics = "{\"step\": 0, \"train_loss\": 4.2, \"val_loss\": 4.19}\n";
  for (const char* run : {"a", "b"}) {
    fs::create_directories(base / run);
    std::ofstream((base / run / "metrics.jsonl").string()) << metrics;
  }
  // the output forgotten: the first run's metrics would be the output
  Run r = run_train_gpt("--plot " + (base / "a" / "metrics.jsonl").string() + " " + (base / "b" / "metrics.jsonl").string());
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("is not an .svg file; expected train_gpt --plot OUT.svg") != std::string::npos);
  CHECK(slurp((base / "a" / "metrics.jsonl").string()) == metrics);
  fs::remove_all(base);
}

TEST_CASE("cli: SIGTERM stops the run, writes a checkpoint, and says how to resume") {
  const fs::path out = fresh_dir("tg_cli_sigterm");
  // a run far longer than the 3 s after which timeout sends SIGTERM
  Run r = run_train_gpt_prefixed("timeout --preserve-status -s TERM 3 ",
                                 "--device cpu --max-iters 1000000 --ckpt-interval 0 --n-layer 1 --n-head 2 --n-embd 16 "
                                 "--block-size 8 --batch-size 2 --eval-interval 0 --eval-iters 1 --sample-tokens 0 --data " +
                                     data_path() + " --out-dir " + out.string());
  CAPTURE(r.err);
  CHECK(r.code == 130);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("train_gpt --resume --out-dir " + out.string()) != std::string::npos);
  bool found = false;
  for (const auto& e : fs::directory_iterator(out)) found |= e.path().filename().string().rfind("ckpt-", 0) == 0;
  CHECK(found);
  fs::remove_all(out);
}

TEST_CASE("cli: SIGTERM while sampling says the run is complete (its checkpoint kept), and in --sample that it stopped") {
  const fs::path out = fresh_dir("tg_cli_sigterm_sample");
  // two steps, then a sample far longer than the seconds after which timeout sends SIGTERM
  const std::string tiny = "--device cpu --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 --batch-size 2 --eval-iters 1 ";
  Run r = run_train_gpt_prefixed("timeout --preserve-status -s TERM 5 ", tiny + "--max-iters 2 --sample-tokens 100000000 --data " +
                                                                             data_path() + " --out-dir " + out.string());
  CAPTURE(r.err);
  CHECK(r.code == 130);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("interrupted while sampling: the run itself is complete") != std::string::npos);
  CHECK(fs::exists(out / "ckpt-00000002"));
  Run smp = run_train_gpt_prefixed("timeout --preserve-status -s TERM 3 ",
                                   "--sample --ckpt " + out.string() + " --sample-tokens 100000000");
  CAPTURE(smp.err);
  CHECK(smp.code == 130);
  CHECK(smp.err.find("interrupted while sampling") != std::string::npos);
  CHECK(count_lines(smp.err) == 2);  // "sampling from ...", then the stop
  fs::remove_all(out);
}

TEST_CASE("cli: SIGINT during a long evaluation stops the run within a second, not after the evaluation") {
  const fs::path out = fresh_dir("tg_cli_sigint_eval");
  // step 0's evaluation of 2 x 3000 batches takes about a minute on two cores
  Background b("--device cpu --preset baby --eval-interval 5 --eval-iters 3000 --sample-tokens 0 --data " + data_path() +
                   " --out-dir " + out.string(),
               7);
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  // the line that ends the start-up: the evaluation begins right after it
  while (b.running() && slurp(io_file("stdout", 7)).find("device:") == std::string::npos && since(t0) < 60)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(b.running());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  REQUIRE(b.running());
  const auto sent = std::chrono::steady_clock::now();
  kill(b.pid, SIGINT);
  const Run r = b.wait();
  const double exit_s = since(sent);
  MESSAGE("exited " << exit_s << " s after SIGINT");
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.code == 130);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("interrupted before step 0") != std::string::npos);
  CHECK(r.out.find("step 0: train loss") == std::string::npos);  // the evaluation did not finish
  CHECK(exit_s < 5);  // within one second on an idle machine; slack for a loaded one
  fs::remove_all(out);
}

TEST_CASE("cli: on a terminal each logged step is one line with the time left, not a second line repeating it") {
  const fs::path out = fresh_dir("tg_cli_tty");
  const std::string tty = io_file("tty");
  // script(1) gives train_gpt a terminal; its output keeps the carriage returns
  const int status = std::system(("script -qfec '" + train_gpt_exe() +
                                  " --device cpu --max-iters 6 --log-interval 2 --n-layer 1 --n-head 2 --n-embd 16 "
                                  "--block-size 8 --batch-size 2 --eval-interval 0 --eval-iters 1 --sample-tokens 0 --data " +
                                  fs::absolute(data_path()).string() + " --out-dir " + out.string() + "' /dev/null >" + tty)
                                     .c_str());
  REQUIRE(shell_code(status) == 0);
  std::string text = slurp(tty);
  CAPTURE(text);
  // what a terminal shows: the last state of each line
  std::vector<std::string> shown;
  std::istringstream lines(text);
  for (std::string l; std::getline(lines, l);) {
    const size_t cr = l.find_last_of('\r', l.size() >= 2 ? l.size() - 2 : 0);
    shown.push_back(l.substr(cr == std::string::npos ? 0 : cr + 1));
  }
  auto count = [](const std::string& hay, const std::string& needle) {
    int n = 0;
    for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
    return n;
  };
  for (int step = 0; step < 6; ++step) {
    CAPTURE(step);
    const std::string head = "step " + std::to_string(step) + "/6 ";
    CHECK(count(text, head) == 1);  // written once: a log line, or (steps not logged) a live line
    int kept = 0;                   // lines that stay on the screen
    for (const std::string& l : shown)
      if (l.find(head) != std::string::npos) {
        ++kept;
        CHECK(l.find("| ETA ") != std::string::npos);
      }
    CHECK(kept == (step % 2 == 0 ? 1 : 0));
  }
  fs::remove_all(out);
}

TEST_CASE("cli: a CPU run whose first steps predict more than ten minutes says so, with the estimate") {
  const fs::path out = fresh_dir("tg_cli_long");
  Background b("--device cpu --max-iters 3000000 --n-layer 1 --n-head 2 --n-embd 32 --block-size 32 --batch-size 8 "
               "--eval-interval 0 --eval-iters 1 --sample-tokens 0 --data " + data_path() + " --out-dir " + out.string(),
               8);
  const auto t0 = std::chrono::steady_clock::now();
  while (b.running() && slurp(io_file("stdout", 8)).find("note: on the CPU") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(b.pid, SIGINT);
  const Run r = b.wait();
  CAPTURE(r.out);
  CHECK(r.code == 130);
  const size_t note = r.out.find("note: on the CPU this run will take about ");
  REQUIRE(note != std::string::npos);
  CHECK(r.out.find("2999997 steps at", note) != std::string::npos);
  CHECK(r.out.find("train_gpt --resume --out-dir " + out.string(), note) != std::string::npos);
  // a short run says nothing of the kind
  Run short_run = run_train_gpt("--device cpu --max-iters 3 --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 "
                                "--batch-size 2 --eval-interval 0 --eval-iters 1 --sample-tokens 0 --data " + data_path() +
                                " --out-dir " + (out / "short").string());
  CHECK(short_run.code == 0);
  CHECK(short_run.out.find("note: on the CPU") == std::string::npos);
  fs::remove_all(out);
}

TEST_CASE("cli: kill -9 at random instants, then --resume: bitwise the uninterrupted run") {
  const fs::path base = fresh_dir("tg_cli_kill");
  const fs::path ref = base / "ref", run = base / "run";
  const std::string args = "--device cpu --max-iters 30000 --ckpt-interval 100 --n-layer 1 --n-head 2 --n-embd 16 "
                           "--block-size 8 --batch-size 2 --eval-interval 10000 --eval-iters 2 --sample-tokens 0 "
                           "--dropout 0.2 --data " + data_path();
  // one thread: a model 16 wide gains nothing from more, and each of the ~30 starts' 60,000 steps
  // in all took 18 s with two threads sharing the machine's cores, 8 s with one
  const std::string one_thread = "env OMP_NUM_THREADS=1 ";
  REQUIRE(run_train_gpt_prefixed(one_thread, args + " --out-dir " + ref.string()).code == 0);
  // SIGKILL after a random delay, over and over
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> delay_ms(5, 120);
  int kills = 0, finished = 0;
  while (!finished && kills < 200) {
    const bool has_ckpt = fs::exists(run) && [&] {
      for (const auto& e : fs::directory_iterator(run))
        if (e.path().filename().string().rfind("ckpt-", 0) == 0 && e.path().extension() != ".tmp") return true;
      return false;
    }();
    // killed before its first checkpoint: the same command starts it again
    const std::string cmd = has_ckpt ? "--resume --out-dir " + run.string() : args + " --out-dir " + run.string();
    // after 20 kills let it finish. --foreground: timeout signals train_gpt alone and waits for it
    // to end; without it, it sends SIGKILL to its whole process group, itself included, and the
    // shell returned while the killed train_gpt could still hold its run directory's lock (the
    // next start then refused the directory as in use)
    const std::string prefix =
        one_thread +
        (kills < 20 ? "timeout --foreground -s KILL 0." + std::to_string(1000 + delay_ms(rng)).substr(1) + " " : "");
    Run r = run_train_gpt_prefixed(prefix, cmd);
    if (r.code == 0) finished = 1;
    else if (r.code == 137) ++kills;  // killed by SIGKILL (timeout reports 128 + 9)
    else FAIL("unexpected exit " << r.code << ": " << r.err);
  }
  MESSAGE(kills << " kills");
  CHECK(kills >= 20);
  REQUIRE(finished);
  const fs::path a = ref / "ckpt-00030000", b = run / "ckpt-00030000";
  CHECK(slurp((a / "model.safetensors").string()) == slurp((b / "model.safetensors").string()));
  ModelConfig m;
  m.vocab_size = 65; m.block_size = 8; m.n_layer = 1; m.n_head = 2; m.n_embd = 16;
  const auto table = param_table(m);
  ckpt::Checkpoint ca = ckpt::load_checkpoint(a.string(), table), cb = ckpt::load_checkpoint(b.string(), table);
  CHECK(ca.m == cb.m);
  CHECK(ca.v == cb.v);
  CHECK(ca.steps_done == cb.steps_done);
  fs::remove_all(base);
}

TEST_CASE("cli: --attention check prints both paths' differences per layer and writes nothing") {
  const fs::path out = fresh_dir("tg_cli_check");
  Run r = run_train_gpt("--device cpu --attention check --n-layer 3 --n-head 2 --n-embd 16 --block-size 33 "
                        "--batch-size 2 --dropout 0.2 --out-dir " + out.string() + " --data " + data_path() +
                        " --ckpt nowhere");
  CAPTURE(r.out);
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(!fs::exists(out));
  // a flag the mode does not read: one line says so, and the check goes on
  CHECK(r.err.find("warning: with --attention check, this flag does nothing: --ckpt (read by --sample, "
                   "--export-hf); drop it\n") != std::string::npos);
  // one row per layer: O, dQ, dK, dV relative differences, all at fp32 rounding level (the
  // two paths sum in different orders; 1e-5 is ~100 float ulps, far below a wrong mask's O(1))
  std::istringstream lines(r.out);
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) {
    int layer = -1;
    double d[4];
    if (std::sscanf(line.c_str(), "%d %lf %lf %lf %lf", &layer, d, d + 1, d + 2, d + 3) != 5) continue;
    CHECK(layer == rows);
    for (double x : d) {
      CHECK(x >= 0);
      CHECK(x < 1e-5);
    }
    ++rows;
  }
  CHECK(rows == 3);
}

TEST_CASE("cli: --sample --ckpt generates from a checkpoint, reproducibly") {
  const fs::path out = fresh_dir("tg_cli_sample");
  REQUIRE(run_train_gpt("--device cpu --max-iters 20 --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 --batch-size 2 "
                        "--eval-iters 1 --sample-tokens 0 --data " + data_path() + " --out-dir " + out.string())
              .code == 0);
  const std::string args = " --prompt ROMEO: --sample-tokens 30 --temperature 0.9 --top-k 20 --top-p 0.95 --seed 5";
  Run a = run_train_gpt("--sample --ckpt " + out.string() + args);
  Run b = run_train_gpt("--sample --ckpt " + (out / "ckpt-00000020").string() + args);
  Run other = run_train_gpt("--sample --ckpt " + out.string() + " --prompt ROMEO: --sample-tokens 30 --seed 6");
  CAPTURE(a.err);
  REQUIRE(a.code == 0);
  CHECK(a.out.rfind("ROMEO:", 0) == 0);
  CHECK(a.out.size() == 6 + 30 + 1);  // prompt, 30 characters, a newline
  CHECK(a.out == b.out);              // the run's newest checkpoint is ckpt-00000020
  CHECK(other.out != a.out);
  Run bad = run_train_gpt("--sample --ckpt " + (out / "nothing").string());
  CHECK(bad.code == 2);
  CHECK(count_lines(bad.err) == 1);
  Run none = run_train_gpt("--sample");
  CHECK(none.code == 2);
  CHECK(none.err.find("--sample without --ckpt") != std::string::npos);
  fs::remove_all(out);
}

TEST_CASE("cli: every bad input, one table: exit code, one line on stderr, nothing written") {
  const fs::path base = fresh_dir("tg_cli_table");
  fs::create_directories(base);
  auto file = [&](const std::string& name, const std::string& bytes) {
    std::ofstream((base / name).string(), std::ios::binary) << bytes;
    return (base / name).string();
  };
  const std::string tiny = " --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 --batch-size 2 --eval-iters 1 --sample-tokens 0";
  // a run with checkpoints to damage: copies of its newest checkpoint, one per row
  const fs::path good = base / "good";
  REQUIRE(run_train_gpt("--max-iters 2" + tiny + " --data " + data_path() + " --out-dir " + good.string()).code == 0);
  auto damaged = [&](const std::string& name, const std::function<void(const fs::path&)>& harm) {
    fs::path run = base / name;
    fs::create_directories(run);
    fs::copy(good / "ckpt-00000002", run / "ckpt-00000002", fs::copy_options::recursive);
    harm(run / "ckpt-00000002");
    return run.string();
  };
  auto truncate_to = [](const fs::path& f, size_t n) { fs::resize_file(f, n); };
  auto flip_byte = [](const fs::path& f, size_t at) {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(at);
    char c = 0;
    s.get(c);
    s.seekp(at);
    s.put((char)(c ^ 0x5a));
  };
  // a crafted config in state.bin, its CRC recomputed: field=value in place of its line
  auto config_with = [](const std::string& field, const std::string& value) {
    return [=](const fs::path& d) {
      std::string b = slurp((d / "state.bin").string());
      uint64_t len;
      std::memcpy(&len, b.data() + 16, 8);
      REQUIRE(b.substr(12, 4) == "CONF");
      std::string conf = b.substr(24, len);
      const size_t at = conf.find("\n" + field + "=") + 1, end = conf.find('\n', at);
      conf.replace(at, end - at, field + "=" + value);
      const uint64_t n = conf.size();
      const uint32_t crc = ckpt::crc32(conf.data(), conf.size());
      std::string rest = b.substr(24 + len + 4);
      b.resize(16);
      b.append(reinterpret_cast<const char*>(&n), 8);
      b += conf;
      b.append(reinterpret_cast<const char*>(&crc), 4);
      b += rest;
      std::ofstream((d / "state.bin").string(), std::ios::binary | std::ios::trunc) << b;
    };
  };
  struct Row {
    const char* what;
    std::string args;
    int code;
    std::string says;
  };
  const std::string out = " --out-dir " + (base / "out").string();
  const std::string bpe = fs::absolute("tests/interop/bpe/shakes1k").string();
  fs::create_directories(base / "stray" / "tokenizer");  // not a run's: a new run there would replace it
  const std::vector<Row> rows = {
      {"missing data", "--data " + (base / "none.txt").string() + out, 2, "does not exist"},
      {"empty data", "--data " + file("empty.txt", "") + out, 2, "empty"},
      {"too-short data", "--data " + file("short.txt", "abcdefghij") + out, 2, "too short"},
      {"directory as data", "--data " + base.string() + out, 2, "is a directory"},
      {"data that is not UTF-8", "--data " + file("latin1.txt", std::string(500, 'a') + "caf\xe9" + std::string(500, 'b')) + out, 2,
       "not valid UTF-8: byte 0xe9 at byte offset 503"},
      {"non-numeric value", "--batch-size twelve" + out, 2, "--batch-size 'twelve' is not valid"},
      {"out-of-range value", "--dropout 1" + out, 2, "--dropout is 1"},
      {"contradictory values", "--n-embd 100 --n-head 3" + out, 2, "not divisible"},
      {"B <= 0", "--batch-size 0" + out, 2, "--batch-size is 0"},
      {"T <= 0", "--block-size 0" + out, 2, "--block-size is 0"},
      {"unknown flag", "--learning-rate 1" + out, 2, "unknown option"},
      {"nanoGPT's spelling of a flag", "--max_iters 5" + out, 2, "unknown option --max_iters; expected one of the options "
       "listed by train_gpt --help; did you mean --max-iters?"},
      {"a mistyped mode", "--smaple --ckpt " + base.string() + out, 2, "did you mean --sample?"},
      {"--plot not first", "--seed 1 --plot x.svg a/metrics.jsonl" + out, 2, "--plot is a mode of its own and comes first"},
      {"an unknown GELU", "--gelu relu" + out, 2, "--gelu is 'relu'"},
      {"duplicated flag", "--seed 1 --seed 2" + out, 2, "given twice"},
      {"value-less flag", "--seed" + out, 2, "needs a value"},
      {"model too large for memory", "--n-embd 65536 --n-head 1" + out, 2, "memory"},
      {"CUDA without a device", "--device cuda --data " + data_path() + out, 1, "--device cuda"},
      {"bf16 on the CPU backend", "--device cpu --precision bf16 --data " + data_path() + out, 2, "--precision bf16"},
      {"unknown precision", "--precision fp16" + out, 2, "--precision is 'fp16'"},
      {"--resume with nothing to resume", "--resume" + out, 2, "holds no complete checkpoint"},
      {"truncated checkpoint", "--resume --out-dir " + damaged("trunc", [&](const fs::path& d) { truncate_to(d / "state.bin", 20); }), 2,
       "truncated"},
      {"corrupted checkpoint", "--resume --out-dir " + damaged("flip", [&](const fs::path& d) { flip_byte(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 3); }), 2,
       "state.bin"},
      {"checkpoint from a newer format", "--resume --out-dir " + damaged("newer", [&](const fs::path& d) { flip_byte(d / "state.bin", 9); }), 2,
       "newer"},
      {"a FIFO for state.bin (its open blocked)", "--sample --ckpt " + damaged("fifo", [&](const fs::path& d) {
         fs::remove(d / "state.bin");
         REQUIRE(::mkfifo((d / "state.bin").c_str(), 0644) == 0);
       }), 2, "state.bin is not a regular file"},
      {"a FIFO for a run's metrics.jsonl", "--resume --max-iters 3 --out-dir " + damaged("mfifo", [&](const fs::path& d) {
         REQUIRE(::mkfifo((d.parent_path() / "metrics.jsonl").c_str(), 0644) == 0);
       }), 2, "metrics.jsonl is not a regular file"},
      // values that degenerate in float, through the binary
      {"beta2 that rounds to 1 in float", "--beta2 0.99999999 --max-iters 2" + tiny + " --data " + data_path() + out, 2,
       "--beta2 is 0.99999999"},
      {"a hex float", "--lr 0x10 --max-iters 1" + tiny + " --data " + data_path() + out, 2, "--lr '0x10' is not valid"},
      {"an empty --out-dir", "--max-iters 1" + tiny + " --data " + data_path() + " --out-dir ''", 2, "--out-dir is empty"},
      {"an --out-dir that cannot be created", "--max-iters 1" + tiny + " --data " + data_path() + " --out-dir " +
       (base / "out" / std::string(300, 'x')).string(), 2, "cannot create --out-dir"},
      // crafted checkpoints: a config no flag could give, its CRC right (each crashed or ran undefined)
      {"a checkpoint with n_head 0", "--resume --out-dir " + damaged("nhead0", config_with("n_head", "0")), 2, "--n-head is 0"},
      {"a checkpoint with log_interval 0", "--resume --out-dir " + damaged("log0", config_with("log_interval", "0")), 2,
       "--log-interval is 0"},
      {"a checkpoint with batch_size 0", "--resume --out-dir " + damaged("batch0", config_with("batch_size", "0")), 2,
       "--batch-size is 0"},
      {"a checkpoint with n_head above n_embd", "--resume --out-dir " + damaged("nhead32", config_with("n_head", "32")), 2,
       "not divisible"},
      {"a checkpoint with dropout 1", "--resume --out-dir " + damaged("drop1", config_with("dropout", "1")), 2, "--dropout is 1"},
      {"a checkpoint with a negative lr", "--resume --out-dir " + damaged("lrneg", config_with("lr", "-0.001")), 2, "--lr is -0.001"},
      {"a checkpoint with negative max_iters", "--resume --out-dir " + damaged("itneg", config_with("max_iters", "-5")), 2,
       "--max-iters is -5"},
      {"a checkpoint with beta2 1", "--resume --out-dir " + damaged("beta1", config_with("beta2", "1")), 2, "--beta2 is 1"},
      {"a checkpoint with lr nan", "--resume --out-dir " + damaged("lrnan", config_with("lr", "nan")), 2, "lr=nan"},
      {"sampling from a checkpoint with n_head 0", "--sample --ckpt " + damaged("snhead0", config_with("n_head", "0")), 2,
       "--n-head is 0"},
      // a path holding a newline: still one line, the newline written \x0a
      {"a data path with a newline", "--data \"$(printf '" + base.string() + "/a\\nb.txt')\"" + out, 2,
       "/a\\x0ab.txt' does not exist"},
      {"an --out-dir holding a tokenizer/ but no run", "--max-iters 1" + tiny + " --data " + data_path() + " --tokenizer " +
       bpe + " --out-dir " + (base / "stray").string(), 2, "holds a tokenizer entry but no run"},
      {"--tokenizer to sample a model of characters", "--sample --ckpt " + good.string() + " --tokenizer " + bpe, 2,
       "is a model of characters"},
      {"--tokenizer to resume a run of characters", "--resume --max-iters 3 --out-dir " + good.string() + " --tokenizer " + bpe,
       2, "--tokenizer " + bpe + " (the run has none: it trains on characters)"},
  };
  for (const Row& r : rows) {
    CAPTURE(std::string(r.what));
    Run run = run_train_gpt(r.args);
    CAPTURE(run.err);
    CHECK(run.code == r.code);
    CHECK(count_lines(run.err) == 1);
    CHECK(run.err.find(r.says) != std::string::npos);
    CHECK(run.err.find("expected") != std::string::npos);
    CHECK(!fs::exists(base / "out"));
  }
  CHECK(fs::is_empty(base / "stray" / "tokenizer"));
  CHECK(!fs::exists(good / "ckpt-00000003"));
  fs::remove_all(base);
}

// ---- self-contained checkpoints and UTF-8 text (issue 18)

namespace {

// Whether s is valid UTF-8 (strictly: no overlong forms, surrogates or code points past
// U+10FFFF); its code points go to n_chars.
bool valid_utf8(const std::string& s, size_t* n_chars = nullptr) {
  size_t i = 0, n = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  while (i < s.size()) {
    const unsigned c = p[i];
    size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return false;
    i += len;
    ++n;
  }
  if (n_chars) *n_chars = n;
  return true;
}

// Greek, accented Latin and Japanese, 3,000 characters, no newline (so the default prompt, a
// newline, is not in its vocabulary).
std::string utf8_text() {
  const std::string words[] = {"\xce\xb1\xce\xbb\xcf\x86\xce\xb1 ",       // αλφα
                               "\xce\xb2\xce\xae\xcf\x84\xce\xb1 ",       // βήτα
                               "caf\xc3\xa9 ",                            // café
                               "na\xc3\xafve ",                           // naïve
                               "\xc3\xa9t\xc3\xa9 ",                      // été
                               "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e ",   // 日本語
                               "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf. "};  // こんにちは.
  std::string text;
  std::mt19937 rng(7);
  while (text.size() < 6000) text += words[rng() % 7];
  return text;
}

// A checkpoint rewritten as train_gpt wrote it before checkpoints held their vocabulary: its
// model.safetensors without __metadata__.train_gpt_vocab, state.bin's WSUM paired with it.
void strip_vocabulary(const fs::path& ckpt_dir) {
  const std::string wpath = (ckpt_dir / "model.safetensors").string(), spath = (ckpt_dir / "state.bin").string();
  std::string w = slurp(wpath);
  uint64_t n;
  std::memcpy(&n, w.data(), 8);
  std::string header = w.substr(8, n);
  const std::string key = ",\"train_gpt_vocab\":\"";
  const size_t at = header.find(key);
  REQUIRE(at != std::string::npos);
  size_t end = at + key.size();
  while (header[end] != '"') end += header[end] == '\\' ? 2 : 1;
  header.erase(at, end + 1 - at);
  while (header.size() % 8) header += ' ';
  const uint64_t n2 = header.size();
  std::string w2(reinterpret_cast<const char*>(&n2), 8);
  w2 += header + w.substr(8 + n);
  std::ofstream(wpath, std::ios::binary | std::ios::trunc) << w2;
  ckpt::Checkpoint s = ckpt::parse_state_bytes(slurp(spath), spath);
  std::ofstream(spath, std::ios::binary | std::ios::trunc)
      << ckpt::state_bytes(s, s.m.data(), s.v.data(), s.m.size(), ckpt::crc32(w2.data(), w2.size()));
}

const std::string kSmall = "--device cpu --n-layer 1 --n-head 2 --n-embd 16 --block-size 8 --batch-size 2 --eval-iters 1 ";

}  // namespace

TEST_CASE("cli: a checkpoint holds its vocabulary: --sample --ckpt works from another directory with no data file") {
  const fs::path base = fresh_dir("tg_cli_selfcontained");
  fs::create_directories(base / "x");
  fs::create_directories(base / "work");
  fs::create_directories(base / "elsewhere");
  fs::copy_file(data_path(), base / "x" / "input.txt");
  // trained with a relative --data from one directory
  Run train = run_train_gpt_prefixed("cd " + (base / "work").string() + " && ",
                                     kSmall + "--max-iters 5 --sample-tokens 0 --data ../x/input.txt --out-dir ../run");
  CAPTURE(train.err);
  REQUIRE(train.code == 0);
  const std::string weights = slurp((base / "run" / "ckpt-00000005" / "model.safetensors").string());
  CHECK(weights.find("\"train_gpt_vocab\":\"\\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\"") !=
        std::string::npos);
  // the data gone: sampled from another directory all the same, with the default prompt
  fs::rename(base / "x" / "input.txt", base / "moved.txt");
  const std::string sample = "--sample --ckpt " + (base / "run").string() + " --sample-tokens 40 --seed 3";
  Run a = run_train_gpt_prefixed("cd " + (base / "elsewhere").string() + " && ", sample);
  CAPTURE(a.err);
  CHECK(a.code == 0);
  CHECK(a.out.size() == 1 + 40 + 1);  // the default prompt (a newline), 40 characters, a newline
  CHECK(a.out[0] == '\n');
  // --data is used, never ignored: a missing file, or another text, is refused; the run's text
  // (wherever it is now) gives the same sample
  Run missing = run_train_gpt(sample + " --data " + (base / "x" / "input.txt").string());
  CHECK(missing.code == 2);
  CHECK(count_lines(missing.err) == 1);
  CHECK(missing.err.find((base / "x" / "input.txt").string()) != std::string::npos);
  std::string other = slurp((base / "moved.txt").string());
  other[100] = other[100] == 'a' ? 'b' : 'a';  // the same characters, another text
  std::ofstream((base / "other.txt").string(), std::ios::binary) << other;
  Run differs = run_train_gpt(sample + " --data " + (base / "other.txt").string());
  CAPTURE(differs.err);
  CHECK(differs.code == 2);
  CHECK(count_lines(differs.err) == 1);
  CHECK(differs.err.find("differs from the run's") != std::string::npos);
  Run moved = run_train_gpt(sample + " --data " + (base / "moved.txt").string());
  CAPTURE(moved.err);
  CHECK(moved.code == 0);
  CHECK(moved.out == a.out);
  fs::remove_all(base);
}

TEST_CASE("cli: a checkpoint without the vocabulary (an older train_gpt's) still loads; sampling then uses --data") {
  const fs::path base = fresh_dir("tg_cli_oldckpt");
  fs::create_directories(base);
  fs::copy_file(data_path(), base / "input.txt");
  REQUIRE(run_train_gpt(kSmall + "--max-iters 4 --sample-tokens 0 --data " + (base / "input.txt").string() +
                        " --out-dir " + (base / "run").string()).code == 0);
  const fs::path ck = base / "run" / "ckpt-00000004";
  const std::string sample = "--sample --ckpt " + ck.string() + " --prompt ROMEO: --sample-tokens 30 --seed 9";
  Run with_vocab = run_train_gpt(sample);
  REQUIRE(with_vocab.code == 0);
  strip_vocabulary(ck);
  CHECK(slurp((ck / "model.safetensors").string()).find("train_gpt_vocab") == std::string::npos);
  CHECK(ckpt::checkpoint_damage(ck.string()).empty());
  // the run's text at its recorded path gives the vocabulary
  Run recorded = run_train_gpt(sample);
  CAPTURE(recorded.err);
  CHECK(recorded.code == 0);
  CHECK(recorded.out == with_vocab.out);
  // moved: the one line says so and what to pass; --data is then used
  fs::rename(base / "input.txt", base / "moved.txt");
  Run none = run_train_gpt(sample);
  CAPTURE(none.err);
  CHECK(none.code == 2);
  CHECK(count_lines(none.err) == 1);
  CHECK(none.err.find("holds no vocabulary") != std::string::npos);
  CHECK(none.err.find("--data") != std::string::npos);
  Run given = run_train_gpt(sample + " --data " + (base / "moved.txt").string());
  CAPTURE(given.err);
  CHECK(given.code == 0);
  CHECK(given.out == with_vocab.out);
  // and a run resumes from it, its next checkpoints holding the vocabulary again
  Run resumed = run_train_gpt("--resume --max-iters 6 --ckpt-interval 0 --out-dir " + (base / "run").string() +
                              " --data " + (base / "moved.txt").string());
  CAPTURE(resumed.err);
  CHECK(resumed.code == 0);
  CHECK(slurp((base / "run" / "ckpt-00000006" / "model.safetensors").string()).find("train_gpt_vocab") !=
        std::string::npos);
  fs::remove_all(base);
}

TEST_CASE("cli: UTF-8 text: characters are code points, the default prompt is in the vocabulary, samples are UTF-8") {
  const fs::path base = fresh_dir("tg_cli_utf8");
  fs::create_directories(base);
  const std::string text = utf8_text();
  std::ofstream((base / "utf8.txt").string(), std::ios::binary) << text;
  size_t n_chars = 0;
  REQUIRE(valid_utf8(text, &n_chars));
  // the default prompt on a text with no newline; the sample of the run itself
  Run train = run_train_gpt(kSmall + "--max-iters 30 --sample-tokens 200 --data " + (base / "utf8.txt").string() +
                            " --out-dir " + (base / "run").string());
  CAPTURE(train.err);
  REQUIRE(train.code == 0);
  CHECK(train.out.find("vocab 25, train " + std::to_string((size_t)(n_chars * 0.9)) + " tokens") != std::string::npos);
  const size_t at = train.out.find("---- sample");
  REQUIRE(at != std::string::npos);
  CHECK(valid_utf8(train.out));
  // from the checkpoint, with a prompt of multibyte characters: whole characters, valid UTF-8
  const std::string prompt = "\xce\xb1\xce\xbb\xe6\x97\xa5";  // αλ日
  Run s = run_train_gpt("--sample --ckpt " + (base / "run").string() + " --sample-tokens 300 --prompt " + prompt);
  CAPTURE(s.err);
  REQUIRE(s.code == 0);
  size_t sampled = 0;
  CHECK(valid_utf8(s.out, &sampled));
  CHECK(sampled == 3 + 300 + 1);  // the prompt, 300 characters, a newline
  CHECK(s.out.rfind(prompt, 0) == 0);
  // a prompt that is not UTF-8 is refused before anything runs
  Run bad_prompt = run_train_gpt("--sample --ckpt " + (base / "run").string() + " --prompt \"$(printf '\\316')\"");
  CHECK(bad_prompt.code == 2);
  CHECK(count_lines(bad_prompt.err) == 1);
  CHECK(bad_prompt.err.find("not valid UTF-8") != std::string::npos);
  // text that is not UTF-8 (a Latin-1 é after the UTF-8) is refused naming its byte offset, nothing written
  std::string latin1 = text;
  latin1 += "\ncaf\xe9\n";
  latin1 += text;
  std::ofstream((base / "latin1.txt").string(), std::ios::binary) << latin1;
  Run refused = run_train_gpt(kSmall + "--max-iters 2 --data " + (base / "latin1.txt").string() + " --out-dir " +
                              (base / "run2").string());
  CAPTURE(refused.err);
  CHECK(refused.code == 2);
  CHECK(count_lines(refused.err) == 1);
  CHECK(refused.err.find("byte offset " + std::to_string(text.size() + 4)) != std::string::npos);
  CHECK(!fs::exists(base / "run2"));
  fs::remove_all(base);
}
