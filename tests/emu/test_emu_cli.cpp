// tests/emu/test_emu_cli.cpp: train_gpt_emu, the trainer whose CUDA backend runs on the SIMT
// emulator (path in TG_TRAIN_GPT_EMU, default ./train_gpt_emu), beside train_gpt (TG_TRAIN_GPT):
// it names its device as emulated, --attention check passes, a checkpoint written by the
// emulated CUDA run samples on the CPU backend, and greedy sampling from one checkpoint gives
// the same text on the emulated device (fp32) as on the CPU backend (both with their KV cache).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "../common/run_binary.h"

namespace fs = std::filesystem;

namespace {

using tg_test::data_path;
using tg_test::fresh_dir;
using tg_test::Run;

Run run_emu(const std::string& args) { return tg_test::run_binary("TG_TRAIN_GPT_EMU", "./train_gpt_emu", args); }
Run run_cpu(const std::string& args) { return tg_test::run_binary("TG_TRAIN_GPT", "./train_gpt", args); }

const std::string kTiny = " --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --batch-size 4 --eval-iters 1 ";

// The text after the "---- sample" line, or what --sample printed.
std::string sample_text(const std::string& out) {
  const size_t p = out.find("---- sample");
  if (p == std::string::npos) return out;
  return out.substr(out.find('\n', p) + 1);
}

}  // namespace

TEST_CASE("train_gpt_emu: --device cuda trains on a device named as emulated, and says so") {
  const fs::path out = fresh_dir("tg_emu_run");
  const Run r = run_emu("--device cuda --max-iters 3 --eval-interval 2 --sample-tokens 0 --dropout 0.1" + kTiny +
                    "--data " + data_path() + " --out-dir " + out.string());
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("device: EMULATED H100") != std::string::npos);
  CHECK(r.out.find("SIMT emulator") != std::string::npos);
  CHECK(r.out.find("mfu") == std::string::npos);  // no MFU for a CPU
  CHECK(r.out.find("preset baby") != std::string::npos);  // its default preset
  CHECK(fs::exists(out / "metrics.jsonl"));
  fs::remove_all(out);
}

TEST_CASE("train_gpt_emu: --attention check finds both paths equal to the precision's rounding") {
  for (const char* precision : {"fp32", "bf16"}) {
    CAPTURE(precision);
    const Run r = run_emu(std::string("--device cuda --attention check --dropout 0.2 --precision ") + precision + kTiny +
                      "--data " + data_path());
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    // fp32: the two paths sum in different orders (~1e-6); bf16: P and the outputs are rounded
    // to bf16 at different points (tests/gpu/test_model_gpu.cu derives the same bounds)
    const double bound = std::string(precision) == "fp32" ? 1e-4 : 5e-2;
    std::istringstream lines(r.out.substr(r.out.find("layer          O")));
    std::string header;
    std::getline(lines, header);
    int rows = 0;
    for (int layer; lines >> layer;) {
      double d[4];
      for (double& x : d) lines >> x;
      for (double x : d) CHECK(x <= bound);
      ++rows;
    }
    CHECK(rows == 2);
  }
}

TEST_CASE("train_gpt_emu: a checkpoint of the emulated CUDA run samples on the CPU backend, greedy text equal") {
  const fs::path out = fresh_dir("tg_emu_ckpt");
  const Run t = run_emu("--device cuda --precision fp32 --max-iters 4 --eval-interval 100 --sample-tokens 0" + kTiny +
                    "--data " + data_path() + " --out-dir " + out.string());
  INFO(t.out << t.err);
  REQUIRE(t.code == 0);
  // greedy (top-k 1): the argmax at every step, through the CPU's KV cache and the emulated
  // device's full-window forward; 40 tokens cross the 32-token window (cropping)
  const std::string args = "--sample --ckpt " + out.string() + " --top-k 1 --sample-tokens 40 --prompt ROMEO:";
  const Run on_cpu = run_cpu(args + " --device cpu");
  const Run on_emu = run_emu(args + " --device cuda --precision fp32");
  INFO(on_cpu.err << on_emu.err);
  REQUIRE(on_cpu.code == 0);
  REQUIRE(on_emu.code == 0);
  CHECK(sample_text(on_cpu.out).size() >= 40);
  CHECK(sample_text(on_emu.out) == sample_text(on_cpu.out));
  fs::remove_all(out);
}

TEST_CASE("train_gpt_emu: bad input is one line and exit 2, as with train_gpt") {
  const Run r = run_emu("--device cuda --n-embd 96 --n-head 2 --attention flash --max-iters 1 --data " + data_path() +
                    " --out-dir " + fresh_dir("tg_emu_bad").string());
  CHECK(r.code == 2);
  CHECK(r.err.find("head size 48") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}
