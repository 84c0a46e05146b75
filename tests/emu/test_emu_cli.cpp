// tests/emu/test_emu_cli.cpp: train_gpt_emu, the trainer whose CUDA backend runs on the SIMT
// emulator (path in TG_TRAIN_GPT_EMU, default ./train_gpt_emu), beside train_gpt (TG_TRAIN_GPT):
// it names its device as emulated, --attention check passes, a checkpoint written by the
// emulated CUDA run samples on the CPU backend and resumes there (and a CPU checkpoint on the
// emulated device), --grad-accum trains there as on the CPU, and greedy sampling from one
// checkpoint gives the same text on the emulated device (fp32) as on the CPU backend (both with
// their KV cache); --init-from starts both backends from the same weights (the same first loss
// and logits); two MPI ranks run the CUDA backend's data-parallel path (NCCL's stand-in); and
// every kernel of the build runs clean under the emulator's racecheck and initcheck in the
// program's own runs (training, evaluation, sampling with the KV cache, --attention check).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <iterator>
#include <set>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../../data/dataset.h"
#include "../../model/formats/checkpoint.h"
#include "../../model/net/gpt.h"
#include "../common/cli_util.h"
#include "occupancy.h"

namespace fs = std::filesystem;

namespace {

using cli::data_path;
using cli::fresh_dir;
using cli::Run;

Run run_emu(const std::string& args) { return cli::run_exe(cli::train_gpt_emu_exe(), args); }
Run run_cpu(const std::string& args) { return cli::run_exe(cli::train_gpt_exe(), args); }

const std::string kTiny = " --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --batch-size 4 --eval-iters 1 ";

// The train loss of every step in a run directory's metrics.jsonl (the final line has none).
std::map<int, double> train_losses(const fs::path& dir, const char* key = "train_loss") {
  std::map<int, double> r;
  std::istringstream lines(cli::slurp((dir / "metrics.jsonl").string()));
  for (std::string l; std::getline(lines, l);) {
    const nlohmann::json j = nlohmann::json::parse(l, nullptr, false);
    if (j.is_object() && j.contains("step") && j.contains(key) && j[key].is_number())
      r[j["step"].get<int>()] = j[key].get<double>();
  }
  return r;
}

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
  const Run r = run_emu("--device cuda --n-embd 36 --n-head 2 --attention flash --max-iters 1 --data " + data_path() +
                    " --out-dir " + fresh_dir("tg_emu_bad").string());
  CHECK(r.code == 2);
  CHECK(r.err.find("head size 18") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("train_gpt_emu: head sizes the flash tiles do not have run padded, and the start-up line says so and which kernels") {
  const std::string common = " --device cuda --n-layer 1 --block-size 16 --batch-size 2 --max-iters 1 --eval-interval 1 "
                             "--sample-tokens 0 --eval-iters 1 --data " + data_path();
  const fs::path out = fresh_dir("tg_emu_head_sizes");
  const Run padded = run_emu("--n-head 2 --n-embd 192" + common + " --out-dir " + (out / "a").string());
  INFO("stderr: " << padded.err);
  CHECK(padded.code == 0);
  CHECK(padded.out.find("attention: flash (head size 96 padded to 128 in the flash kernels; Hopper wgmma kernels)") !=
        std::string::npos);
  const Run wide = run_emu("--n-head 1 --n-embd 200" + common + " --out-dir " + (out / "b").string());
  INFO("stderr: " << wide.err);
  CHECK(wide.code == 0);
  CHECK(wide.out.find("attention: flash (head size 200 padded to 256 in the flash kernels; Hopper wgmma kernels)") !=
        std::string::npos);
  const Run narrow = run_emu("--n-head 2 --n-embd 64" + common + " --out-dir " + (out / "c").string());
  INFO("stderr: " << narrow.err);
  CHECK(narrow.code == 0);
  CHECK(narrow.out.find("attention: flash (mma.sync kernels: the Hopper kernels take head sizes above 32)") !=
        std::string::npos);
  fs::remove_all(out);
}

// On a part with 99 KB of shared memory a block (the emulated GeForce RTX 4090: the consumer
// parts of compute capability 8.6 and 8.9), head size 64 runs on the flash kernels; 128, whose
// tiles need 102 KB, runs on the naive path and the start-up line says why; --attention check,
// which needs both paths, is refused in one line.
TEST_CASE("train_gpt_emu: on a GPU with 99 KB of shared memory a block, head sizes whose flash tiles need more run naive, and say so") {
  const std::string common = " --device cuda --precision bf16 --n-layer 1 --block-size 16 --batch-size 2 --max-iters 1 "
                             "--eval-interval 1 --sample-tokens 0 --eval-iters 1 --data " + data_path();
  const std::string env = "env TG_EMU_DEVICE=rtx4090 ";
  const fs::path out = fresh_dir("tg_emu_small_smem");
  const Run fits =
      cli::run_exe(cli::train_gpt_emu_exe(), "--n-head 2 --n-embd 128" + common + " --out-dir " + (out / "a").string(), env);
  INFO("stderr: " << fits.err);
  CHECK(fits.code == 0);
  CHECK(fits.out.find("GeForce RTX 4090") != std::string::npos);
  CHECK(fits.out.find("attention: flash (mma.sync kernels) |") != std::string::npos);
  const Run wide =
      cli::run_exe(cli::train_gpt_emu_exe(), "--n-head 2 --n-embd 256" + common + " --out-dir " + (out / "b").string(), env);
  INFO("stderr: " << wide.err);
  CHECK(wide.code == 0);
  CHECK(wide.out.find("attention: flash routed to naive (head size 128: the flash kernels need 102 KB of shared memory "
                      "a block, this GPU allows 99 KB;") != std::string::npos);
  const Run check = cli::run_exe(
      cli::train_gpt_emu_exe(), "--n-head 2 --n-embd 256 --attention check" + common + " --out-dir " + (out / "c").string(),
      env);
  CHECK(check.code == 2);
  CHECK(check.err.find("--attention check on EMULATED GeForce RTX 4090") != std::string::npos);
  CHECK(std::count(check.err.begin(), check.err.end(), '\n') == 1);
  fs::remove_all(out);
}

// On compute capability 9.0, the emulator's default device, the flash forward and backward run on
// the Hopper kernels (kernels/flash_attn_hopper.cuh) unless TG_FLASH_HOPPER=0, and the start-up
// line says which. With the forward on key tiles of 64 (TG_FLASH_HOPPER=6), under the emulator (as
// on an H100) their outputs are the mma.sync kernels' bit for bit (the same products, in the same
// order per k-step of 16), so the whole run is the same bits; so is TG_FLASH_HOPPER=4 (the forward's
// keep decisions made by its producer warpgroup, on tiles of 64). The default forward's key tiles of
// 128 rescale O at other keys: its losses are within rounding of those, and TG_FLASH_HOPPER=2 (the
// warp-specialized backward) and 3 (dQ inside the dK / dV kernel) give its bits (5, the backward not
// pipelined, is held to the default's bits by the kernel tests, tests/gpu/test_flash_attn_gpu.cu).
// On an A100 they are the mma.sync kernels, and a value other than 0 to 6 is refused.
TEST_CASE("train_gpt_emu: on compute capability 9.0 the flash kernels are Hopper wgmma's unless TG_FLASH_HOPPER=0; on key tiles of 64 the same bits as mma.sync") {
  // head size 64 (one of the Hopper kernel's); two query tiles of its 128 rows at T = 160
  const std::string common = " --device cuda --precision bf16 --eval-interval 2 --log-interval 1 --sample-tokens 0 "
                             "--dropout 0.1 --n-layer 1 --n-head 1 --n-embd 64 --block-size 160 --batch-size 2 "
                             "--eval-iters 1 --data " + data_path();
  const fs::path out = fresh_dir("tg_emu_hopper");
  const Run mma = cli::run_exe(cli::train_gpt_emu_exe(), common + " --max-iters 3 --out-dir " + (out / "mma").string(),
                               "env TG_FLASH_HOPPER=0 ");
  const Run hop = run_emu(common + " --max-iters 3 --out-dir " + (out / "hopper").string());
  const Run narrow = cli::run_exe(cli::train_gpt_emu_exe(), common + " --max-iters 3 --out-dir " + (out / "narrow").string(),
                                  "env TG_FLASH_HOPPER=6 ");
  INFO("stderr: " << mma.err << hop.err << narrow.err);
  REQUIRE(mma.code == 0);
  REQUIRE(hop.code == 0);
  REQUIRE(narrow.code == 0);
  CHECK(mma.out.find("attention: flash (mma.sync kernels) |") != std::string::npos);
  CHECK(hop.out.find("attention: flash (Hopper wgmma kernels) |") != std::string::npos);
  CHECK(narrow.out.find("attention: flash (Hopper wgmma kernels, forward on key tiles of 64) |") != std::string::npos);
  const std::map<int, double> a = train_losses(out / "mma"), b = train_losses(out / "hopper");
  CHECK(a.size() == 3);
  CHECK(train_losses(out / "narrow") == a);
  REQUIRE(b.size() == a.size());
  for (const auto& [step, loss] : a) {
    CAPTURE(step);
    CHECK(b.at(step) == doctest::Approx(loss).epsilon(1e-3));
  }
  // TG_FLASH_HOPPER=setting for iters steps into out / name: it ends well and its start-up line names
  // the kernels `kernels`; its train losses
  auto variant = [&](const char* setting, const char* name, int iters, const std::string& kernels) {
    const Run r = cli::run_exe(cli::train_gpt_emu_exe(),
                               common + " --max-iters " + std::to_string(iters) + " --out-dir " + (out / name).string(),
                               std::string("env TG_FLASH_HOPPER=") + setting + " ");
    INFO("TG_FLASH_HOPPER=" << setting << " stderr: " << r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("attention: flash (Hopper wgmma kernels, " + kernels + ") |") != std::string::npos);
    return train_losses(out / name);
  };
  CHECK(variant("2", "ws", 3, "warp-specialized backward") == b);
  // dQ inside the dK / dV kernel (TG_FLASH_HOPPER=3): the same first two steps (the second after the
  // first backward)
  CHECK(variant("3", "apart", 2, "dQ inside the dK / dV kernel") == std::map<int, double>(b.begin(), std::next(b.begin(), 2)));
  CHECK(variant("4", "ring", 3, "keep decisions by the forward's producer warpgroup") == a);
  // the forward's consumer warpgroups not taking turns (TG_FLASH_HOPPER=8; the forward without
  // dropout, the evaluations' at HS 64, three consumers): the same train and validation losses
  CHECK(variant("8", "turnless", 3, "forward's consumer warpgroups not taking turns") == b);
  CHECK(!train_losses(out / "hopper", "val_loss").empty());
  CHECK(train_losses(out / "turnless", "val_loss") == train_losses(out / "hopper", "val_loss"));
  // the forward's dropout on three consumer warpgroups and key tiles of 64 (TG_FLASH_HOPPER=9): the
  // bits of tiles of 64 on two, so the mma.sync run's losses
  CHECK(variant("9", "three", 3, "forward with dropout on three consumer warpgroups") == a);
  const Run a100 = cli::run_exe(cli::train_gpt_emu_exe(), common + " --max-iters 1 --out-dir " + (out / "a100").string(),
                                "env TG_EMU_DEVICE=a100 ");
  CHECK(a100.code == 0);
  CHECK(a100.out.find("attention: flash (mma.sync kernels) |") != std::string::npos);
  const Run bad = cli::run_exe(cli::train_gpt_emu_exe(), common + " --max-iters 1 --out-dir " + (out / "bad").string(),
                               "env TG_FLASH_HOPPER=yes ");
  CHECK(bad.code != 0);
  CHECK(bad.err.find("TG_FLASH_HOPPER is 'yes'; expected 1") != std::string::npos);
  fs::remove_all(out);
}

TEST_CASE("train_gpt_emu: a checkpoint of the emulated CUDA run resumes on the CPU backend, and the other way round") {
  // fp32 on both backends: they agree to rounding (tests/gpu/test_model_gpu.cu derives 1e-5
  // of the loss), so a resumed run must track the uninterrupted one on either backend
  const std::string common = " --precision fp32 --ckpt-interval 3 --eval-interval 100 --log-interval 1 "
                             "--sample-tokens 0 --dropout 0.1" + kTiny + "--data " + data_path();
  const fs::path cpu6 = fresh_dir("tg_emu_cpu6"), emu6 = fresh_dir("tg_emu_emu6");
  const fs::path emu_then_cpu = fresh_dir("tg_emu_then_cpu"), cpu_then_emu = fresh_dir("tg_cpu_then_emu");
  auto ok = [](const Run& r) {
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
  };
  ok(run_cpu("--device cpu --max-iters 6" + common + " --out-dir " + cpu6.string()));
  ok(run_emu("--device cuda --max-iters 6" + common + " --out-dir " + emu6.string()));
  // 3 steps on one backend, a checkpoint, then --resume on the other to step 6
  ok(run_emu("--device cuda --max-iters 3" + common + " --out-dir " + emu_then_cpu.string()));
  ok(run_cpu("--resume --device cpu --max-iters 6 --out-dir " + emu_then_cpu.string()));
  ok(run_cpu("--device cpu --max-iters 3" + common + " --out-dir " + cpu_then_emu.string()));
  ok(run_emu("--resume --device cuda --max-iters 6 --out-dir " + cpu_then_emu.string()));
  const std::map<int, double> a = train_losses(cpu6), b = train_losses(emu6), c = train_losses(emu_then_cpu),
                              d = train_losses(cpu_then_emu);
  for (int s = 0; s < 6; ++s) {
    CAPTURE(s);
    REQUIRE((a.count(s) && b.count(s) && c.count(s) && d.count(s)));
    for (double x : {b.at(s), c.at(s), d.at(s)}) CHECK(std::fabs(x - a.at(s)) <= 1e-5 * a.at(s));
  }
  for (const fs::path& p : {cpu6, emu6, emu_then_cpu, cpu_then_emu}) fs::remove_all(p);
}

TEST_CASE("train_gpt_emu: --grad-accum 2 trains on the emulated CUDA device as on the CPU backend") {
  // fp32, dropout on: the micro-batches' windows and masks are keyed alike on both backends
  const std::string common = " --precision fp32 --grad-accum 2 --batch-size 2 --max-iters 4 --eval-interval 100 "
                             "--log-interval 1 --sample-tokens 0 --dropout 0.1 --n-layer 2 --n-head 2 --n-embd 64 "
                             "--block-size 32 --eval-iters 1 --data " + data_path();
  const fs::path on_cpu = fresh_dir("tg_emu_accum_cpu"), on_emu = fresh_dir("tg_emu_accum_emu");
  for (const auto& [r, dir] : {std::pair<Run, fs::path>{run_cpu("--device cpu" + common + " --out-dir " + on_cpu.string()), on_cpu},
                               {run_emu("--device cuda" + common + " --out-dir " + on_emu.string()), on_emu}}) {
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("x grad_accum 2") != std::string::npos);
  }
  const std::map<int, double> a = train_losses(on_cpu), b = train_losses(on_emu);
  for (int s = 0; s < 4; ++s) {
    CAPTURE(s);
    REQUIRE((a.count(s) && b.count(s)));
    CHECK(std::fabs(b.at(s) - a.at(s)) <= 1e-5 * a.at(s));
  }
  fs::remove_all(on_cpu);
  fs::remove_all(on_emu);
}

TEST_CASE("train_gpt_emu: --init-from a Hugging Face export starts the emulated CUDA run where the CPU backend starts") {
  // A CPU run trained 40 steps (its loss well below a fresh model's ln 65 = 4.17), exported as
  // GPT-2 with --export-hf; both backends start from it with --init-from (the weights go in
  // through Backend::set_state). fp32 on both: the losses agree to rounding (tests/gpu/
  // test_model_gpu.cu derives 1e-5 of the loss); a backend that ignored the weights would start
  // near 4.17. The logits of --logits (generate_step, each backend's KV cache): fp32 dot products
  // of length at most 4C = 256 in another order differ by at most n eps sum|a b| = 256 x 6e-8 =
  // 1.5e-5 of the largest products in the worst case, ~sqrt(n) eps = 1e-6 typically: 1e-5 of the
  // largest |logit|.
  const fs::path base = fresh_dir("tg_emu_init"), src = base / "src", hf = base / "hf";
  const std::string model = " --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --bias ";
  const std::string common = " --precision fp32 --max-iters 2 --eval-interval 100 --log-interval 1 --sample-tokens 0 "
                             "--batch-size 4 --eval-iters 1 --data " + data_path();
  auto ok = [](const Run& r) {
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
  };
  ok(run_cpu("--device cpu --max-iters 40 --eval-interval 100 --sample-tokens 0 --batch-size 8 --eval-iters 1" + model +
             "--data " + data_path() + " --out-dir " + src.string()));
  ok(run_cpu("--export-hf " + hf.string() + " --ckpt " + src.string()));
  const fs::path on_cpu = base / "cpu", on_emu = base / "emu";
  ok(run_cpu("--device cpu --init-from " + hf.string() + common + " --out-dir " + on_cpu.string()));
  ok(run_emu("--device cuda --init-from " + hf.string() + common + " --out-dir " + on_emu.string()));
  const std::map<int, double> a = train_losses(on_cpu), b = train_losses(on_emu);
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    REQUIRE((a.count(s) && b.count(s)));
    CHECK(std::fabs(b.at(s) - a.at(s)) <= 1e-5 * a.at(s));
  }
  CHECK(a.at(0) < 3.9);  // the trained weights, not a fresh model's
  const std::string ids = "--logits 0,17,64,3,3,40,1 --init-from " + hf.string();
  const Run lc = run_cpu(ids + " --device cpu"), le = run_emu(ids + " --device cuda --precision fp32");
  ok(lc);
  ok(le);
  std::istringstream x(lc.out), y(le.out);
  double worst = 0, largest = 0;
  size_t n = 0;
  for (double p, q; x >> p && y >> q; ++n) {
    worst = std::max(worst, std::fabs(p - q));
    largest = std::max(largest, std::fabs(p));
  }
  CHECK(n == 7 * 65);
  CHECK(worst <= 1e-5 * largest);
  fs::remove_all(base);
}

TEST_CASE("train_gpt_emu: mpirun -np 2 runs the CUDA backend's data-parallel path as one process with --grad-accum 2" *
          doctest::skip(cli::mpirun(2).empty())) {
  // two ranks, each a process with its own emulated device (TG_EMU_DEVICES=2: local rank 1 takes
  // device 1), the gradients summed by ncclAllReduce (tests/emu/nccl_emu.cpp over MPI); against
  // one emulated process with --grad-accum 2: the same micro-batches and dropout masks. Step 0
  // is the same bits; later steps differ by the rounding of where micro-batch 1's gradients are
  // added (in the kernels, or by the all-reduce), amplified by AdamW as in
  // tests/cpu/test_dist.cpp: a relative 1e-5. (cli::mpirun turns LeakSanitizer off for the ranks.)
  const std::string common = " --precision fp32 --batch-size 2 --max-iters 3 --eval-interval 100 --log-interval 1 "
                             "--sample-tokens 0 --dropout 0.1 --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 "
                             "--eval-iters 1 --data " + data_path();
  const fs::path dp = fresh_dir("tg_emu_dp"), acc = fresh_dir("tg_emu_dp_acc");
  const Run r = cli::run_exe(cli::train_gpt_emu_exe(), "--device cuda" + common + " --out-dir " + dp.string(),
                             "TG_EMU_DEVICES=2 " + cli::mpirun(2) + "-x TG_EMU_DEVICES ");
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("rank 1 of 2: ") != std::string::npos);
  CHECK(r.out.find("local rank 1, device EMULATED") != std::string::npos);
  CHECK(r.out.find("gradients summed once per step by ncclAllReduce") != std::string::npos);
  const Run one = run_emu("--device cuda" + common + " --grad-accum 2 --out-dir " + acc.string());
  REQUIRE(one.code == 0);
  const std::map<int, double> a = train_losses(dp), b = train_losses(acc);
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  CHECK(a.at(0) == b.at(0));
  for (int s = 1; s < 3; ++s) {
    CAPTURE(s);
    CHECK(std::fabs(a.at(s) - b.at(s)) <= 1e-5 * b.at(s));
  }
  fs::remove_all(dp);
  fs::remove_all(acc);
}

TEST_CASE("train_gpt_emu: mpirun -np 2 --zero 1 trains the emulated CUDA ranks as unsharded, to float rounding" *
          doctest::skip(cli::mpirun(2).empty())) {
  // 104832 parameters: two shards of 57344 and 47488 (model/net/shards.h), the boundary inside
  // layer 1's weights. Step 0's loss is the same bits; the squared gradient norm is the sum of
  // the two shards' (each rounded to float, then added) where the unsharded run rounds the
  // whole once: a relative 2^-23 or so apart. The norm is above the clip (about 2): the clip
  // factor differs as much, which AdamW's m / sqrt(v) all but cancels (a common scale of the
  // gradients; only eps sees it); the moments scale with it (m) and its square (v). So: losses
  // and norms within a relative 1e-6, m and v within 1e-5 of their largest, the weights within
  // 1e-6 (a few float roundings of |w| < 1 after 3 steps). A wrong shard (another's moments,
  // a decay lost at the cut, a missed gather) moves weights by lr = 1e-5 or more per step.
  const std::string common = " --precision fp32 --batch-size 2 --max-iters 3 --eval-interval 100 --log-interval 1 "
                             "--sample-tokens 0 --dropout 0.1 --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 "
                             "--lr 1e-3 --warmup-iters 0 --eval-iters 1 --data " + data_path();
  const std::string ranks = "TG_EMU_DEVICES=2 " + cli::mpirun(2) + "-x TG_EMU_DEVICES ";
  const fs::path z0 = fresh_dir("tg_emu_z0"), z1 = fresh_dir("tg_emu_z1");
  const Run a = cli::run_exe(cli::train_gpt_emu_exe(), "--device cuda" + common + " --out-dir " + z0.string(), ranks);
  REQUIRE(a.code == 0);
  const Run b = cli::run_exe(cli::train_gpt_emu_exe(), "--device cuda" + common + " --zero 1 --out-dir " + z1.string(), ranks);
  INFO(b.out << b.err);
  REQUIRE(b.code == 0);
  CHECK(b.out.find("ZeRO-1 (--zero 1): gradients reduce-scattered by ncclReduceScatter") != std::string::npos);
  CHECK(b.out.find("sharded over 2 ranks by --zero 1") != std::string::npos);
  const std::map<int, double> la = train_losses(z0), lb = train_losses(z1);
  REQUIRE(la.size() == 3);
  REQUIRE(lb.size() == 3);
  CHECK(la.at(0) == lb.at(0));
  for (int s = 1; s < 3; ++s) CHECK(std::fabs(la.at(s) - lb.at(s)) <= 1e-6 * la.at(s));
  const data::Dataset ds = data::load_dataset(data_path(), 32);
  const auto table = tg::param_table(tg::ModelConfig{ds.vocab_size(), 32, 2, 2, 64, false, ds.padded_vocab()});
  REQUIRE(tg::param_count(table) == 104832);
  const auto ca = tg::ckpt::load_checkpoint((z0 / "ckpt-00000003").string(), table);
  const auto cb = tg::ckpt::load_checkpoint((z1 / "ckpt-00000003").string(), table);
  auto worst = [](const std::vector<float>& x, const std::vector<float>& y, double& largest) {
    double w = 0;
    largest = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      w = std::max(w, std::fabs((double)x[i] - y[i]));
      largest = std::max(largest, std::fabs((double)x[i]));
    }
    return w;
  };
  double big = 0;
  const double dw = worst(ca.params, cb.params, big), dm = worst(ca.m, cb.m, big), mbig = big,
               dv = worst(ca.v, cb.v, big);
  MESSAGE("sharded against unsharded after 3 steps: weights " << dw << ", m " << dm << " (of " << mbig << "), v " << dv
                                                              << " (of " << big << ")");
  CHECK(dw <= 1e-6);
  CHECK(dm <= 1e-5 * mbig);
  CHECK(dv <= 1e-5 * big);
  CHECK(std::count(cb.m.begin(), cb.m.end(), 0.0f) < (long)cb.m.size() / 100);  // both shards gathered
  fs::remove_all(z0);
  fs::remove_all(z1);
}

// The race checker's own tests (tests/emu/test_race_checker.cpp) run a training step's kernels;
// this holds the program's whole runs to it: training with evaluation and checkpoints, sampling
// with the KV cache (at the end of a run and from a checkpoint, past block_size so that the
// window is primed again), both attention paths, both precisions, biases, --attention check, a
// head size the flash tiles do not have (run padded), and a run whose GEMMs find no cuBLASLt
// algorithm (the plain cuBLAS fallback with its bias kernel).
// Each run has TG_EMU_RACECHECK=1 (a hazard or a read of memory nothing wrote ends it with a
// device fault) and lists the kernels it launched (TG_EMU_RACECHECK_KERNELS); together they must
// cover every kernel of the build's table ($TG_KERNEL_RESOURCES, as tests/emu/test_occupancy.cpp
// reads it), by name, but those train_gpt never launches (kNotLaunched, each checked to stay
// unreached): a kernel added without a run that reaches it fails here, naming it.
TEST_CASE("train_gpt_emu: every kernel of the build runs clean under racecheck and initcheck in the program's runs") {
  const fs::path dir = fresh_dir("tg_emu_racecheck_all");
  fs::create_directories(dir);
  const std::string list = (dir / "kernels.txt").string();
  const std::string env = "env TG_EMU_RACECHECK=1 TG_EMU_RACECHECK_KERNELS=" + list + " ";
  const std::string data = " --data " + data_path();
  // (block_size 32: 36 tokens sampled slide the KV cache's window, which primes it again)
  const std::string train = " --max-iters 2 --eval-interval 1 --dropout 0.1 --sample-tokens 36" + kTiny + data;
  // one step and one evaluation of one bf16 head of size embd on the flash path at T block, into dir / name
  auto one_head = [&](const char* dropout, int embd, int block, int sample, const char* name) {
    return std::string("--device cuda --precision bf16 --attention flash --dropout ") + dropout +
           " --n-layer 1 --n-head 1 --n-embd " + std::to_string(embd) + " --block-size " + std::to_string(block) +
           " --batch-size 1 --max-iters 1 --eval-interval 1 --eval-iters 1 --sample-tokens " + std::to_string(sample) +
           data + " --out-dir " + (dir / name).string();
  };
  const std::vector<std::pair<std::string, std::string>> runs = {  // (environment, arguments)
      {"", "--device cuda --precision bf16 --attention flash --bias" + train + " --out-dir " + (dir / "flash").string()},
      {"", "--device cuda --precision fp32 --attention naive" + train + " --out-dir " + (dir / "naive").string()},
      {"", "--sample --ckpt " + (dir / "flash").string() + " --device cuda --sample-tokens 4 --prompt QUEEN"},
      {"", "--device cuda --precision fp32 --attention check --dropout 0.1" + kTiny + data},
      // head size 40: the flash kernels run it padded to 64 (their heads widened and narrowed back),
      // the Hopper backward with dQ inside its dK / dV kernel
      {"TG_FLASH_HOPPER=3 ", "--device cuda --precision bf16 --attention flash --n-layer 1 --n-head 2 --n-embd 80 --block-size 32 "
           "--batch-size 2 --max-iters 1 --eval-interval 1 --eval-iters 1 --sample-tokens 4" + data + " --out-dir " +
           (dir / "padded").string()},
      // (the bf16 runs take the Hopper kernels, the emulated device's default; this one the mma.sync ones)
      {"TG_FLASH_HOPPER=0 ", "--device cuda --precision bf16 --attention check --dropout 0.1 --bias" + kTiny + data},
      // the warp-specialized Hopper backward (opt-in; head size 128, the Hopper kernels take it), with
      // dropout: T 256 is eight query tiles of 32 for the dK / dV kernel and four key tiles of 64 for
      // the dQ kernel's second query tile, so a stage of each ring (three) is refilled after both
      // warpgroups' reads (with one lane's arrival for its warp this run names the race an H200
      // found), and each kernel's first or second warpgroup skips the tiles outside its rows
      {"TG_FLASH_HOPPER=2 ", one_head("0.1", 128, 256, 4, "ws")},
      // the forward's keep decisions made by its producer warpgroup (opt-in; head size 64), with
      // dropout: at T 320 the last query tile's CTA has 5 key tiles, so both its rings are refilled
      // (the keep ring's 4 stages after the consumers' reads of their words); its backward is the
      // default's, whose pipelined dK / dV kernel has 5 query tiles for key tile 0, so each of its
      // three stages and two keep tiles is refilled after its reads
      {"TG_FLASH_HOPPER=4 ", one_head("0.1", 64, 320, 0, "ring")},
      // the default forward on key tiles of 128, at head size 64 with dropout (its evaluation,
      // without, on three consumer warpgroups) and at 128 without: at T 512 the last query tile's
      // CTA has 4 key tiles, so the first of its ring's 3 stages is refilled after every consumer
      // warpgroup's reads; without dropout the consumers take turns at their products, and at
      // HS 64 the last query tile's third warpgroup (rows 512 ..) has none, only turns and releases
      {"", one_head("0.1", 64, 512, 0, "wide")},
      {"", one_head("0", 128, 512, 0, "wide0")},
      // the forward's dropout on three consumer warpgroups and key tiles of 64 (TG_FLASH_HOPPER=9):
      // at T 512 the last query tile's third warpgroup has no rows, and its ring is refilled
      {"TG_FLASH_HOPPER=9 ", one_head("0.1", 64, 512, 0, "three")},
      // the default kernels at head size 128, where both backward kernels are pipelined, with
      // dropout: at T 192 key tile 0's dK / dV CTA has six query tiles of 32 and the last query
      // tile's dQ CTA three key tiles of 64, so each refills its stages after the products that
      // read them (the other runs' default kernels are at head size 64 or the mma.sync ones)
      {"", one_head("0.1", 128, 192, 0, "hs128")},
      // the backward's kernels not pipelined over their tiles (kept to time the pipelining beside
      // them; head size 128, where both kernels have a twin that waits, T 192: six query tiles of
      // 32 for key tile 0's dK / dV CTA, three key tiles of 64 for the last query tile's dQ CTA)
      {"TG_FLASH_HOPPER=5 ", one_head("0.1", 128, 192, 0, "seq")},
      {"TG_EMU_CUBLASLT_NO_ALGORITHM=1 ", "--device cuda --precision bf16 --bias --max-iters 1 --eval-interval 1 "
                                          "--sample-tokens 4" + kTiny + data + " --out-dir " + (dir / "fallback").string()},
  };
  for (const auto& [more_env, args] : runs) {
    CAPTURE(more_env);
    CAPTURE(args);
    const Run r = cli::run_exe(cli::train_gpt_emu_exe(), args, env + more_env);
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    if (more_env == "TG_FLASH_HOPPER=2 ")  // the start-up line names the backward it runs
      CHECK(r.out.find("(Hopper wgmma kernels, warp-specialized backward)") != std::string::npos);
    if (more_env == "TG_FLASH_HOPPER=5 ")
      CHECK(r.out.find("(Hopper wgmma kernels, backward not pipelined)") != std::string::npos);
    if (args.find("--n-embd 80") != std::string::npos)  // the start-up line says the size is padded
      CHECK(r.out.find("attention: flash (head size 40 padded to 64 in the flash kernels; Hopper wgmma kernels, dQ inside the "
                             "dK / dV kernel)") !=
            std::string::npos);
  }
  std::set<std::string> launched, launched_short;
  std::istringstream names(cli::slurp(list));
  for (std::string n; std::getline(names, n);) {
    launched_short.insert(emu::occ::short_name(n));
    launched.insert(emu::occ::short_name(n).substr(0, emu::occ::short_name(n).find('<')));
  }
  const char* env_table = std::getenv("TG_KERNEL_RESOURCES");
  const std::string table = env_table && *env_table ? env_table : "build/kernel_resources.txt";
  emu::occ::ResourceTable t;
  try {
    t = emu::occ::read_resources(table);
  } catch (const std::exception& e) {
    FAIL(e.what() << ": make build/kernel_resources.txt writes it");
  }
  // and the Hopper kernels' table beside it (sm_90a), which the Makefile writes with it
  const std::string hopper_table = table.substr(0, table.rfind(".txt")) + "_hopper.txt";
  try {
    for (emu::occ::KernelResources& k : emu::occ::read_resources(hopper_table).kernels) t.kernels.push_back(std::move(k));
  } catch (const std::exception& e) {
    FAIL(e.what() << ": make build/kernel_resources.txt writes " << hopper_table << " too");
  }
  // kernels of the build that train_gpt does not launch, and why (their tests run them)
  const std::set<std::string> kNotLaunched = {
      "residual_backward_kernel",  // the residual's gradient flows on in place, nothing to launch
                                   // (tests/gpu/test_ops_gpu.cu runs it)
  };
  for (const std::string& k : kNotLaunched) CHECK_MESSAGE(!launched.count(k), k << " is launched now: drop it from kNotLaunched");
  std::set<std::string> all, all_short, missing;
  for (const emu::occ::KernelResources& k : t.kernels) {
    const std::string s = emu::occ::short_name(k.name);
    all_short.insert(s);
    all.insert(s.substr(0, s.find('<')));
  }
  REQUIRE(all.size() > 20);
  for (const std::string& k : all)
    if (!launched.count(k) && !kNotLaunched.count(k)) missing.insert(k);
  std::string text;
  for (const std::string& k : missing) text += " " + k;
  size_t instances = 0, kernels = 0;
  for (const std::string& k : all_short) instances += launched_short.count(k);
  for (const std::string& k : all) kernels += launched.count(k);
  MESSAGE(kernels << " of the build's " << all.size() << " kernels (" << instances << " of its "
                          << all_short.size() << " instantiations) ran under racecheck and initcheck");
  CHECK_MESSAGE(missing.empty(), "kernels of the build no run reached under racecheck:" << text);
  fs::remove_all(dir);
}
