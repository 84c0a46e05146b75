// tests/cpu/test_run_dir.cpp: the run directory (model/run/run_dir.h), mostly through the train_gpt
// binary: every case of the second round of trust, each of which lost data, crashed or went
// silently wrong before:
//   1. a metrics write that fails (a file size limit; a full tmpfs) stops the run, exit 1,
//      after a checkpoint, and a resume loses no line;
//   2. two processes on one --out-dir: one runs, the other is refused naming the holder;
//   3. checkpoints without metrics.jsonl still hold a run;
//   4. a checkpoint costs at most 1.2x the training peak of memory;
//   6. SIGTERM while the data loads is honoured;
//   7. a run killed before its first checkpoint starts again or resumes from step 0;
//   8. --resume applies the flags that can change and refuses the others; the data is found
//      by its recorded absolute path and checked by its sha256;
//  10. a damaged newest checkpoint that is skipped is named;
//  11. a crafted checkpoint or run file (checksums right, contents the format forbids) is
//      refused at load with one line naming the file and the field, the run left as it was.
// (5 and 9, values that degenerate in float and crafted checkpoint configs, are rows of the
// bad-input tables of test_cli.cpp; the training loop's part of 1 and 6 is in test_train.cpp.)
#include <doctest/doctest.h>
#include <sys/mount.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../data/dataset.h"
#include "../../model/formats/checkpoint.h"
#include "../../model/formats/safetensors.h"
#include "../../model/net/backend.h"
#include "../../model/run/run_dir.h"
#include "../common/cli_util.h"

using namespace tg;
using namespace cli;
namespace fs = std::filesystem;

namespace {

// A tiny model on tiny Shakespeare (or on data; "": no --data): runs of a few hundred steps
// take a fraction of a second.
std::string tiny(int max_iters, const std::string& more = "", const std::string& data = data_path()) {
  return "--device cpu --max-iters " + std::to_string(max_iters) +
         " --n-layer 1 --n-head 2 --n-embd 8 --block-size 4 --batch-size 2 --eval-interval 50 --eval-iters 1 "
         "--sample-tokens 0 --dropout 0.1 " + more + (data.empty() ? "" : " --data " + data);
}

// args with the flag value from replaced by to.
std::string replaced(std::string args, const std::string& from, const std::string& to) {
  const size_t at = args.find(from);
  REQUIRE(at != std::string::npos);
  return args.replace(at, from.size(), to);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// metrics.jsonl with the timing fields cut out: what two runs of the same steps share bitwise.
// Every line must be whole, and the steps must run 0, 1, 2, ... once each.
std::string metrics_without_timing(const fs::path& run) {
  std::string out;
  int n = 0;
  for (const std::string& line : lines_of(slurp((run / "metrics.jsonl").string()))) {
    CAPTURE(line);
    CHECK(line.rfind("{\"step\": " + std::to_string(n++) + ",", 0) == 0);
    CHECK(line.back() == '}');
    const size_t ms = line.find(", \"ms\": ");
    out += line.substr(0, ms == std::string::npos ? line.size() : ms) + "\n";
  }
  return out;
}

// Two checkpoints hold bitwise the same weights, AdamW moments and step count.
void check_same_state(const fs::path& a, const fs::path& b) {
  CAPTURE(a);
  CAPTURE(b);
  REQUIRE(fs::exists(a / "model.safetensors"));
  REQUIRE(fs::exists(b / "model.safetensors"));
  CHECK(slurp((a / "model.safetensors").string()) == slurp((b / "model.safetensors").string()));
  const ckpt::Checkpoint ca = ckpt::parse_state_bytes(slurp((a / "state.bin").string()), "a");
  const ckpt::Checkpoint cb = ckpt::parse_state_bytes(slurp((b / "state.bin").string()), "b");
  CHECK(ca.m == cb.m);
  CHECK(ca.v == cb.v);
  CHECK(ca.step == cb.step);
  CHECK(ca.steps_done == cb.steps_done);
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Waits (up to a minute) until done() holds.
bool eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 60000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// The soft limit on the size of the files this process and its children write (RLIMIT_FSIZE),
// for the life of the object.
struct FileSizeLimit {
  rlimit old{};
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old);
    rlimit lim = old;
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() { setrlimit(RLIMIT_FSIZE, &old); }
};

// A tmpfs can be mounted here (root, with the capability): the full-disk test needs one.
bool can_mount_tmpfs() {
  if (geteuid() != 0) return false;
  const fs::path p = fs::temp_directory_path() / ("tg_tmpfs_probe_" + std::to_string(getpid()));
  fs::create_directories(p);
  const bool ok = mount("tmpfs", p.c_str(), "tmpfs", 0, "size=64k") == 0;
  if (ok) umount(p.c_str());
  fs::remove_all(p);
  return ok;
}

}  // namespace

TEST_CASE("run dir: a metrics line past the file size limit stops the run with exit 1 after a checkpoint; --resume loses no line") {
  const fs::path base = fresh_dir("tg_rd_fsize"), ref = base / "ref", run = base / "run";
  // the run's checkpoint files (about 9 and 12 KB) fit under the limit, its 301 metrics lines do not
  const std::string args = tiny(300, "--ckpt-interval 0");
  REQUIRE(run_train_gpt(args + " --out-dir " + ref.string()).code == 0);
  int code;
  {
    FileSizeLimit limit(16 << 10);
    code = shell_code(std::system((train_gpt_exe() + " " + args + " --out-dir " + run.string() + " >/dev/null 2>" +
                                   io_file("stderr")).c_str()));
  }
  const std::string err = slurp(io_file("stderr"));
  CAPTURE(err);
  CHECK(code == 1);
  CHECK(count_lines(err) == 1);
  CHECK(err.find("cannot write " + (run / "metrics.jsonl").string() + ": File too large") != std::string::npos);
  CHECK(err.find("saved its state and the 1 unwritten line(s) in") != std::string::npos);
  CHECK(err.find("train_gpt --resume --out-dir " + run.string()) != std::string::npos);
  // no partial line, a checkpoint just after the last line written
  const std::vector<std::string> written = lines_of(slurp((run / "metrics.jsonl").string()));
  REQUIRE(written.size() > 10);
  REQUIRE(written.size() < 300);
  CHECK(written.back().back() == '}');
  CHECK(fs::exists(run / ckpt::ckpt_name((uint32_t)written.size() + 1)));
  Run again = run_train_gpt("--resume --out-dir " + run.string());
  CAPTURE(again.err);
  REQUIRE(again.code == 0);
  CHECK(metrics_without_timing(run) == metrics_without_timing(ref));
  check_same_state(ref / "ckpt-00000300", run / "ckpt-00000300");
  fs::remove_all(base);
}

TEST_CASE("run dir: a full disk (tmpfs) stops the run with exit 1 naming metrics.jsonl; with space freed --resume completes it" *
          doctest::skip(!can_mount_tmpfs())) {
  const fs::path base = fresh_dir("tg_rd_tmpfs"), ref = base / "ref", mnt = base / "mnt", run = mnt / "run";
  const std::string args = tiny(300, "--ckpt-interval 0");
  REQUIRE(run_train_gpt(args + " --out-dir " + ref.string()).code == 0);
  fs::create_directories(mnt);
  REQUIRE(mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") == 0);
  struct Unmount {
    const fs::path& at;
    ~Unmount() { umount(at.c_str()); }
  } unmount{mnt};
  {  // 40 KB left: room for the lock, run.cfg and about 200 metrics lines
    std::ofstream filler((mnt / "filler").string(), std::ios::binary);
    filler << std::string(216 << 10, 'x');
  }
  Run full = run_train_gpt(args + " --out-dir " + run.string());
  CAPTURE(full.err);
  CHECK(full.code == 1);
  CHECK(count_lines(full.err) == 1);
  CHECK(full.err.find("cannot write " + (run / "metrics.jsonl").string() + ": No space left on device") != std::string::npos);
  for (const std::string& line : lines_of(slurp((run / "metrics.jsonl").string()))) CHECK(line.back() == '}');
  fs::remove(mnt / "filler");
  Run again = run_train_gpt("--resume --out-dir " + run.string());
  CAPTURE(again.err);
  CHECK(again.code == 0);
  CHECK(metrics_without_timing(run) == metrics_without_timing(ref));
  check_same_state(ref / "ckpt-00000300", run / "ckpt-00000300");
  umount(mnt.c_str());  // before the guard, for remove_all
  fs::remove_all(base);
}

TEST_CASE("run dir: two processes started together on one --out-dir: one runs, the other is refused with exit 2") {
  const fs::path base = fresh_dir("tg_rd_race");
  for (int trial = 0; trial < 6; ++trial) {
    CAPTURE(trial);
    const fs::path run = base / std::to_string(trial);
    const std::string args = tiny(200, "--ckpt-interval 50") + " --out-dir " + run.string();
    Background a(args, 1), b(args, 2);
    Run ra = a.wait(), rb = b.wait();
    CAPTURE(ra.err);
    CAPTURE(rb.err);
    CHECK(std::min(ra.code, rb.code) == 0);
    CHECK(std::max(ra.code, rb.code) == 2);
    const Run& loser = ra.code == 2 ? ra : rb;
    const pid_t winner = ra.code == 2 ? b.pid : a.pid;
    CHECK(count_lines(loser.err) == 1);
    // refused by the lock while the winner runs, or by what it left once it has finished: seen
    // before the lock ("already holds a run") or, when the winner ran its whole run between the
    // loser's look at the directory and its lock (a loaded machine), after it ("begun meanwhile")
    CHECK((loser.err.find("in use by another train_gpt process (pid " + std::to_string(winner) + ")") != std::string::npos ||
           loser.err.find("already holds a run") != std::string::npos ||
           loser.err.find("holds a run begun meanwhile by another process") != std::string::npos));
    metrics_without_timing(run);  // whole lines, steps 0..200 once each
    CHECK(lines_of(slurp((run / "metrics.jsonl").string())).size() == 201);
  }
  fs::remove_all(base);
}

TEST_CASE("run dir: --resume or a new run on a directory in use is refused naming the holder's pid; --sample still reads it") {
  const fs::path run = fresh_dir("tg_rd_lock");
  Background holder(tiny(4000000, "--ckpt-interval 200 --log-interval 1000") + " --out-dir " + run.string(), 1);
  REQUIRE(eventually([&] { return fs::exists(run / "ckpt-00000200" / "state.bin"); }));
  const std::string pid = "(pid " + std::to_string(holder.pid) + ")";
  // "timeout": without the lock (before) these ran on and on
  Run resume = run_train_gpt_prefixed("timeout 60 ", "--resume --out-dir " + run.string());
  CAPTURE(resume.err);
  CHECK(resume.code == 2);
  CHECK(count_lines(resume.err) == 1);
  CHECK(resume.err.find(pid) != std::string::npos);
  Run fresh = run_train_gpt_prefixed("timeout 60 ", tiny(4000000) + " --out-dir " + run.string());
  CAPTURE(fresh.err);
  CHECK(fresh.code == 2);
  CHECK(fresh.err.find(pid) != std::string::npos);
  // as the holder writes a checkpoint every 200 steps and deletes all but the newest two
  for (int i = 0; i < 5; ++i) {
    Run sample = run_train_gpt("--sample --ckpt " + run.string() + " --sample-tokens 5");
    CAPTURE(sample.err);
    CHECK(sample.code == 0);
  }
  CHECK(holder.running());
  // a signal often comes more than once (timeout and Ctrl-C also signal the process group):
  // the repeats must not kill the run as it checkpoints
  for (int i = 0; i < 3; ++i) ::kill(holder.pid, SIGTERM);
  Run stopped = holder.wait();
  CAPTURE(stopped.err);
  CHECK(stopped.code == 130);  // the holder never noticed the others
  CHECK(stopped.err.find("checkpoint written in") != std::string::npos);
  fs::remove_all(run);
}

TEST_CASE("run dir: a directory with checkpoints but no metrics.jsonl holds a run: refused, the checkpoints kept") {
  const fs::path run = fresh_dir("tg_rd_ckonly");
  REQUIRE(run_train_gpt(tiny(6, "--ckpt-interval 3") + " --out-dir " + run.string()).code == 0);
  fs::remove(run / "metrics.jsonl");
  fs::remove(run / "run.cfg");
  const std::string weights = slurp((run / "ckpt-00000006" / "model.safetensors").string());
  Run r = run_train_gpt(tiny(6, "--seed 7") + " --out-dir " + run.string());
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("already holds a run (ckpt-00000006, ckpt-00000003)") != std::string::npos);
  CHECK(r.err.find("--resume") != std::string::npos);
  CHECK(slurp((run / "ckpt-00000006" / "model.safetensors").string()) == weights);
  CHECK(entries(run) == std::vector<std::string>({"ckpt-00000003", "ckpt-00000006", "train_gpt.lock"}));
  fs::remove_all(run);
}

TEST_CASE("run dir: a checkpoint directory as --out-dir is refused, new or --resume: nothing written inside it") {
  const fs::path run = fresh_dir("tg_rd_ckdir");
  REQUIRE(run_train_gpt(tiny(6, "--ckpt-interval 3") + " --out-dir " + run.string()).code == 0);
  const fs::path ck = run / "ckpt-00000003";
  for (const std::string& args : {"--resume --device cpu --max-iters 9 --out-dir " + ck.string(),
                                  "--resume --device cpu --out-dir " + ck.string() + "/",
                                  tiny(6) + " --out-dir " + ck.string()}) {
    CAPTURE(args);
    Run r = run_train_gpt(args);
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find("is a checkpoint directory (it holds state.bin); expected a run directory; pass the run's directory (" +
                     run.string() + ": --resume") != std::string::npos);
    CHECK(entries(ck) == std::vector<std::string>({"model.safetensors", "state.bin"}));
  }
  fs::remove_all(run);
}

TEST_CASE("run dir: a checkpoint is streamed from the backend: its peak RSS is at most 1.2x the training peak") {
  // a model whose state (params, grads, m, v: 4 x 4 bytes x 3.2M) dominates the process;
  // copies of the state while writing (as before: 8 floats per parameter more) would show
  Config c;
  apply_preset(c, "baby");
  c.n_layer = 4; c.n_head = 4; c.n_embd = 256; c.block_size = 8; c.batch_size = 1; c.device = Device::Cpu;
  c.out_dir = fresh_dir("tg_rd_rss").string();
  const ModelConfig m{65, c.block_size, c.n_layer, c.n_head, c.n_embd, c.bias};
  const auto table = param_table(m);
  REQUIRE(param_count(table) > 3000000);
  auto be = make_cpu_backend(m, run_shape(c));
  std::vector<int32_t> x(8, 1), y(8, 2);
  // VmHWM, the peak RSS, since the last reset (writing 5 to clear_refs resets it to the RSS)
  auto reset_peak = [] { std::ofstream("/proc/self/clear_refs") << "5"; };
  auto peak_kb = [] {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
    return 0L;
  };
  auto step = [&] {
    be->forward_backward(x.data(), y.data(), 0);
    be->update(1e-3f, 1, be->grad_norm());
  };
  step();
  reset_peak();
  step();
  const long train_kb = peak_kb();
  RunDir dir(c.out_dir);
  RunStart start;
  start.config = c;
  start.data = data::load_dataset(data_path(), c.block_size);
  dir.begin(start);
  reset_peak();
  const std::string saved = dir.save(*be, c, table, Progress{1, 1, 0}, {});
  const long ckpt_kb = peak_kb();
  MESSAGE("peak RSS: training step " << train_kb / 1024 << " MiB, writing a checkpoint " << ckpt_kb / 1024 << " MiB");
  REQUIRE(train_kb > 0);
  CHECK(ckpt_kb <= 1.2 * train_kb);
  // and what it wrote is the backend's state
  const ckpt::Checkpoint back = ckpt::load_checkpoint(saved, table);
  std::vector<float> mom, vel;
  be->adam_state(mom, vel);
  CHECK(back.params == be->params());
  CHECK(back.m == mom);
  CHECK(back.v == vel);
  fs::remove_all(c.out_dir);
}

TEST_CASE("run dir: SIGTERM while the data loads is honoured: exit 130, one line, nothing written") {
  const fs::path base = fresh_dir("tg_rd_early"), big = base / "big.txt", run = base / "run";
  fs::create_directories(base);
  {  // 30 copies of tiny Shakespeare: its reading alone keeps the file open for tens of ms
    const std::string text = slurp(data_path());
    std::ofstream f(big.string(), std::ios::binary);
    for (int i = 0; i < 30; ++i) f << text;
  }
  Background b(tiny(10, "", big.string()) + " --out-dir " + run.string(), 1);
  // the moment the data file is open, train_gpt is reading it (before: no handler yet)
  auto reading = [&] {
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(b.pid) + "/fd", ec)) {
      std::error_code e2;
      if (fs::read_symlink(fd.path(), e2) == big) return true;
    }
    return !b.running();
  };
  REQUIRE(eventually(reading));
  ::kill(b.pid, SIGTERM);
  Run r = b.wait();
  CAPTURE(r.err);
  CHECK(r.code == 130);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("interrupted before the run began: nothing written") != std::string::npos);
  CHECK(!fs::exists(run));
  fs::remove_all(base);
}

TEST_CASE("run dir: a run killed before its first checkpoint starts again with the same command, or resumes from step 0") {
  const fs::path base = fresh_dir("tg_rd_first");
  const std::string args = tiny(40, "--ckpt-interval 0");
  REQUIRE(run_train_gpt(args + " --out-dir " + (base / "ref").string()).code == 0);
  // what a kill before the first checkpoint leaves: run.cfg, some metrics lines, a half save
  auto killed = [&](const std::string& name) {
    const fs::path run = base / name;
    REQUIRE(run_train_gpt(args + " --out-dir " + run.string()).code == 0);
    fs::remove_all(run / "ckpt-00000040");
    fs::create_directories(run / "ckpt-00000040.tmp");
    const std::vector<std::string> lines = lines_of(slurp((run / "metrics.jsonl").string()));
    std::ofstream m((run / "metrics.jsonl").string(), std::ios::trunc);
    for (int i = 0; i < 7; ++i) m << lines[i] << "\n";
    return run;
  };
  const fs::path same = killed("same"), resumed = killed("resumed"), other = killed("other");
  Run again = run_train_gpt(args + " --out-dir " + same.string());
  CAPTURE(again.err);
  CHECK(again.code == 0);
  CHECK(again.err.find("killed before its first checkpoint, begun with the same flags: starting it again, discarding "
                       "ckpt-00000040.tmp, metrics.jsonl") != std::string::npos);
  CHECK(metrics_without_timing(same) == metrics_without_timing(base / "ref"));
  check_same_state(base / "ref" / "ckpt-00000040", same / "ckpt-00000040");
  Run resume = run_train_gpt("--resume --out-dir " + resumed.string());
  CAPTURE(resume.err);
  CHECK(resume.code == 0);
  CHECK(resume.err.find("holds no checkpoint yet: resuming from step 0") != std::string::npos);
  CHECK(metrics_without_timing(resumed) == metrics_without_timing(base / "ref"));
  check_same_state(base / "ref" / "ckpt-00000040", resumed / "ckpt-00000040");
  const std::string kept = slurp((other / "metrics.jsonl").string());
  Run changed = run_train_gpt(replaced(args, "--n-embd 8", "--n-embd 16") + " --seed 3 --out-dir " + other.string());
  CAPTURE(changed.err);
  CHECK(changed.code == 2);
  CHECK(count_lines(changed.err) == 1);
  CHECK(changed.err.find("begun with other flags: --n-embd 16 (there 8), --seed 3 (there 1337)") != std::string::npos);
  CHECK(slurp((other / "metrics.jsonl").string()) == kept);
  fs::remove_all(base);
}

TEST_CASE("run dir: --resume --max-iters extends a run, bitwise equal to one run to the end") {
  const fs::path base = fresh_dir("tg_rd_extend");
  REQUIRE(run_train_gpt(tiny(12, "--ckpt-interval 3") + " --out-dir " + (base / "ref").string()).code == 0);
  const fs::path run = base / "run";
  REQUIRE(run_train_gpt(tiny(6, "--ckpt-interval 3") + " --out-dir " + run.string()).code == 0);
  Run more = run_train_gpt("--resume --out-dir " + run.string() + " --max-iters 12");
  CAPTURE(more.err);
  REQUIRE(more.code == 0);
  CHECK(more.out.find("resume: applying --max-iters 12 (was 6)") != std::string::npos);
  check_same_state(base / "ref" / "ckpt-00000012", run / "ckpt-00000012");
  CHECK(metrics_without_timing(run) == metrics_without_timing(base / "ref"));
  // shortened below its checkpoint: refused
  Run less = run_train_gpt("--resume --out-dir " + run.string() + " --max-iters 5");
  CHECK(less.code == 2);
  CHECK(less.err.find("--max-iters 5 ends the run before its checkpoint") != std::string::npos);
  fs::remove_all(base);
}

TEST_CASE("run dir: --resume refuses flags that change the model or the data, all in one line, and applies the others") {
  const fs::path base = fresh_dir("tg_rd_flags"), run = base / "run";
  fs::create_directories(base);
  REQUIRE(run_train_gpt(tiny(6, "--ckpt-interval 3") + " --out-dir " + run.string()).code == 0);
  const std::string metrics = slurp((run / "metrics.jsonl").string());
  // the same characters in another order: the same vocabulary, other data
  std::string text = slurp(data_path());
  std::reverse(text.begin(), text.end());
  std::ofstream((base / "reversed.txt").string(), std::ios::binary) << text;
  Run bad = run_train_gpt("--resume --out-dir " + run.string() + " --n-embd 16 --batch-size 4 --seed 9 --gelu erf --max-iters 8 --data " +
                          (base / "reversed.txt").string());
  CAPTURE(bad.err);
  CHECK(bad.code == 2);
  CHECK(count_lines(bad.err) == 1);
  for (const char* conflict : {"--n-embd 16 (the run has 8)", "--batch-size 4 (the run has 2)", "--seed 9 (the run has 1337)",
                               "--gelu erf (the run has tanh)",
                               "--data " /* other contents */})
    CHECK(bad.err.find(conflict) != std::string::npos);
  CHECK(bad.err.find("--max-iters 8") == std::string::npos);  // that one may change
  CHECK(slurp((run / "metrics.jsonl").string()) == metrics);
  Run good = run_train_gpt("--resume --out-dir " + run.string() + " --n-embd 8 --eval-interval 5 --lr 0.002");
  CAPTURE(good.err);
  CHECK(good.code == 0);
  CHECK(good.out.find("resume: applying --lr 0.002 (was 0.001), --eval-interval 5 (was 50)") != std::string::npos);
  fs::remove_all(base);
}

TEST_CASE("run dir: --resume finds the data by its recorded absolute path and its sha256; a copy elsewhere will do") {
  const fs::path base = fresh_dir("tg_rd_data"), run = base / "run";
  fs::create_directories(base / "data");
  fs::copy_file(data_path(), base / "data" / "input.txt");
  // started with a relative --data from base; resumed from the test's own directory
  REQUIRE(run_train_gpt_prefixed("cd " + base.string() + " && ", tiny(6, "--ckpt-interval 3", "data/input.txt") +
                                                                    " --out-dir run").code == 0);
  fs::remove_all(run / "ckpt-00000006");
  Run elsewhere = run_train_gpt("--resume --out-dir " + run.string());
  CAPTURE(elsewhere.err);
  CHECK(elsewhere.code == 0);
  // the same characters, another text: refused; a copy of the original elsewhere: accepted
  fs::remove_all(run / "ckpt-00000006");
  fs::rename(base / "data" / "input.txt", base / "original.txt");
  std::string text = slurp((base / "original.txt").string());
  std::swap(text[10], text[20]);
  std::ofstream((base / "data" / "input.txt").string(), std::ios::binary) << text;
  Run changed = run_train_gpt("--resume --out-dir " + run.string());
  CAPTURE(changed.err);
  CHECK(changed.code == 2);
  CHECK(count_lines(changed.err) == 1);
  CHECK(changed.err.find("the run's data changed since it began") != std::string::npos);
  Run copy = run_train_gpt("--resume --out-dir " + run.string() + " --data " + (base / "original.txt").string());
  CAPTURE(copy.err);
  CHECK(copy.code == 0);
  fs::remove_all(base);
}

TEST_CASE("run dir: a damaged newest checkpoint is skipped by name; with only damaged ones, their damage is the error") {
  const fs::path base = fresh_dir("tg_rd_damage"), run = base / "run", only = base / "only";
  REQUIRE(run_train_gpt(tiny(6, "--ckpt-interval 3") + " --out-dir " + run.string()).code == 0);
  {  // a byte of the AdamW moments flipped: a CRC error
    std::fstream s((run / "ckpt-00000006" / "state.bin").string(), std::ios::in | std::ios::out | std::ios::binary);
    s.seekp(2000);
    s.put('\x42');
  }
  fs::create_directories(only);
  fs::copy(run / "ckpt-00000006", only / "ckpt-00000006", fs::copy_options::recursive);
  const std::string skipped = "warning: skipping a damaged checkpoint: checkpoint file " +
                              (run / "ckpt-00000006" / "state.bin").string() + " is corrupted";
  Run sample = run_train_gpt("--sample --ckpt " + run.string() + " --sample-tokens 5");
  CAPTURE(sample.err);
  CHECK(sample.code == 0);
  CHECK(sample.err.find(skipped) != std::string::npos);
  Run none = run_train_gpt("--sample --ckpt " + only.string() + " --sample-tokens 5");
  CAPTURE(none.err);
  CHECK(none.code == 2);
  CHECK(count_lines(none.err) == 1);
  CHECK(none.err.find("is corrupted: section 'ADAM'") != std::string::npos);
  Run resume = run_train_gpt("--resume --out-dir " + run.string());
  CAPTURE(resume.err);
  CHECK(resume.code == 0);
  CHECK(resume.err.find(skipped) != std::string::npos);
  CHECK(resume.out.find("resuming from " + (run / "ckpt-00000003").string()) != std::string::npos);
  fs::remove_all(base);
}

namespace {

// Every file under dir but the lock (no part of a run), by path, with its bytes.
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "train_gpt.lock") out[e.path().string()] = slurp(e.path().string());
  return out;
}

// The state.bin of a checkpoint written again as train_gpt writes it (its CRCs and WSUM
// computed by the writer) after change.
void rewrite_state(const fs::path& dir, const std::function<void(ckpt::Checkpoint&)>& change) {
  const std::string path = (dir / "state.bin").string(), weights = slurp((dir / "model.safetensors").string());
  ckpt::Checkpoint c = ckpt::parse_state_bytes(slurp(path), path);
  change(c);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      << ckpt::state_bytes(c, c.m.data(), c.v.data(), c.m.size(), ckpt::crc32(weights.data(), weights.size()));
}

// A file with the value of its line "key=..." replaced.
void rewrite_line(const fs::path& file, const std::string& key, const std::string& value) {
  std::string text = slurp(file.string());
  const size_t at = text.find("\n" + key + "=") + key.size() + 2;
  REQUIRE(at > key.size() + 1);
  text.replace(at, text.find('\n', at) - at, value);
  std::ofstream(file.string(), std::ios::binary | std::ios::trunc) << text;
}

// The model.safetensors of a checkpoint with element i of tensor name set to x, its state.bin's
// WSUM paired with it again.
void rewrite_weight(const fs::path& dir, const std::string& name, size_t i, float x) {
  const std::string path = (dir / "model.safetensors").string();
  std::string w = slurp(path);
  const ckpt::StFile f = ckpt::parse_safetensors(w, path);
  const auto t = std::find_if(f.tensors.begin(), f.tensors.end(), [&](const ckpt::StTensor& s) { return s.name == name; });
  REQUIRE(t != f.tensors.end());
  REQUIRE(i < t->numel);
  std::memcpy(&w[f.data_start + t->begin + 4 * i], &x, 4);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << w;
  rewrite_state(dir, [](ckpt::Checkpoint&) {});
}

struct Crafted {
  const char* what;
  std::function<void(const fs::path& run)> harm;  // applied to a copy of a run with ckpt-00000002
  std::string says;                               // in the one line on stderr
};

}  // namespace

TEST_CASE("run dir: crafted checkpoints and run files are refused at load, naming the file and the field; the run is left as it was") {
  const fs::path base = fresh_dir("tg_rd_crafted"), good = base / "good", run = base / "run";
  REQUIRE(run_train_gpt(tiny(2) + " --out-dir " + good.string()).code == 0);
  const fs::path state = run / "ckpt-00000002" / "state.bin";
  const std::vector<Crafted> cases = {
      {"a 60 MB prompt in state.bin",
       [](const fs::path& r) { rewrite_state(r / "ckpt-00000002", [](ckpt::Checkpoint& c) { c.config.prompt = std::string(60000000, 'A'); }); },
       state.string() + ": the saved config has prompt= of 60000000 bytes; expected a value of at most 786432 bytes"},
      {"a 60 MB prompt in the run.cfg of a run without a checkpoint",
       [](const fs::path& r) {
         fs::remove_all(r / "ckpt-00000002");
         rewrite_line(r / "run.cfg", "prompt", std::string(60000000, 'A'));
       },
       "run file " + (run / "run.cfg").string() + ": the saved config has prompt= of 60000000 bytes; expected a value of at most 786432 bytes"},
      {"a NaN first moment",
       [](const fs::path& r) { rewrite_state(r / "ckpt-00000002", [](ckpt::Checkpoint& c) { c.m[10] = std::nanf(""); }); },
       state.string() + " holds AdamW first moment m[10] = nan in its 'ADAM' section; expected finite moments and v >= 0"},
      {"a negative second moment",
       [](const fs::path& r) { rewrite_state(r / "ckpt-00000002", [](ckpt::Checkpoint& c) { c.v[0] = -1; }); },
       state.string() + " holds AdamW second moment v[0] = -1 in its 'ADAM' section; expected finite moments and v >= 0"},
      {"an infinite second moment",
       [](const fs::path& r) { rewrite_state(r / "ckpt-00000002", [](ckpt::Checkpoint& c) { c.v[1] = HUGE_VALF; }); },
       state.string() + " holds AdamW second moment v[1] = inf"},
      {"an empty dtype on lm_head.weight (a copy of wte the reader skips)",
       [](const fs::path& r) {
         const fs::path w = r / "ckpt-00000002" / "model.safetensors";
         std::string b = slurp(w.string());
         const std::string key = "\"lm_head.weight\":{\"dtype\":\"F32\"";
         const size_t at = b.find(key);
         REQUIRE(at != std::string::npos);
         b.replace(at, key.size(), "\"lm_head.weight\":{\"dtype\":\"\"   ");  // as long: JSON spaces
         std::ofstream(w.string(), std::ios::binary | std::ios::trunc) << b;
         rewrite_state(r / "ckpt-00000002", [](ckpt::Checkpoint&) {});
       },
       (run / "ckpt-00000002" / "model.safetensors").string() +
           " has a bad header entry \"lm_head.weight\": dtype \"\" is none of the format's (BOOL, F4,"},
      {"a NaN weight", [](const fs::path& r) { rewrite_weight(r / "ckpt-00000002", "transformer.wpe.weight", 5, std::nanf("")); },
       (run / "ckpt-00000002" / "model.safetensors").string() +
           " holds a weight that is not finite: transformer.wpe.weight[5] = nan; expected finite weights"},
  };
  for (const Crafted& k : cases) {
    CAPTURE(std::string(k.what));
    fs::remove_all(run);
    fs::copy(good, run, fs::copy_options::recursive);
    k.harm(run);
    const std::map<std::string, std::string> before = files_of(run);
    const auto t0 = std::chrono::steady_clock::now();
    // flags that differ from the run's: each one compared with the saved config's value
    const Run r = run_train_gpt("--resume --out-dir " + run.string() + " --max-iters 4 --lr 0.002 --eval-iters 2");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CAPTURE(r.err.substr(0, 1000));
    CHECK(r.code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find(k.says) != std::string::npos);
    CHECK(r.err.size() < 1000);
    CHECK(files_of(run) == before);
    // refused as its line is read: no value is carried through the comparison of the flags
    CHECK(seconds < 10);
  }
  fs::remove_all(base);
}
