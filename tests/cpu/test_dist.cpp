// tests/cpu/test_dist.cpp: data-parallel training (mpirun -np 2 ./train_gpt, model/run/dist.h)
// through the binary, two CPU ranks of one thread each:
//   1. two ranks with micro-batch B train as one process with --grad-accum 2 (losses, the
//      final checkpoint's weights), print their ranks, and write one run directory;
//   2. a resume with another number of ranks keeps the global batch (2 x 1 -> 1 x 2 -> 2 x 1)
//      and trains as the run that was never interrupted; one that cannot keep it is refused;
//   3. a rank killed with SIGKILL ends the job within seconds, and its last checkpoint resumes;
//      SIGTERM to one rank stops every rank before the same step, with a checkpoint;
//   4. a rank that throws (bad input on every rank; a failure on rank 1 alone, TG_INJECT_FAIL)
//      ends the job with a line naming the rank, and the last checkpoint resumes; a token id
//      past the vocabulary in rank 1's rows alone (a training batch, an evaluation batch) ends
//      every rank with that line, rank 0 having taken back the run it began;
//   5. ZeRO-1 (--zero 1, model/net/shards.h): two sharded ranks train bit for bit as two unsharded
//      ones, with an odd parameter count and a shard boundary inside a decayed tensor; the
//      evaluations spread over the ranks give one process's bits; sharded and unsharded
//      checkpoints resume either way and on another number of ranks; bad --zero values.
// Skipped (and counted as skipped) when this build has no MPI or mpirun is not on PATH.
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../data/dataset.h"
#include "../../model/formats/checkpoint.h"
#include "../../model/net/gpt.h"
#include "../../model/net/shards.h"
#include "../common/cli_util.h"

using namespace cli;

namespace {

const std::string& mpirun2() {
  static const std::string prefix = mpirun(2);
  return prefix;
}
const std::string kOne = "env OMP_NUM_THREADS=1 ";
bool no_mpi() { return mpirun2().empty(); }

constexpr int kT = 16;
// A tiny model with dropout on (so the ranks' dropout row keys are checked too), B = 3.
std::string tiny(int iters, const std::string& more, int B = 3) {
  return "--device cpu --max-iters " + std::to_string(iters) +
         " --n-layer 2 --n-head 2 --n-embd 16 --block-size " + std::to_string(kT) +
         " --batch-size " + std::to_string(B) + " --dropout 0.1 --eval-interval 0 --eval-iters 1 --sample-tokens 0 --lr 1e-2 --data " +
         data_path() + " " + more;
}

// Each trained step of a metrics.jsonl: its step, train_loss and learning rate.
struct Step {
  int step;
  double loss, lr;
};
std::vector<Step> losses(const fs::path& dir) {
  std::vector<Step> out;
  std::istringstream in(slurp((dir / "metrics.jsonl").string()));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("train_loss") && j["train_loss"].is_number())
      out.push_back(Step{j["step"].get<int>(), j["train_loss"].get<double>(), j["lr"].get<double>()});
  }
  return out;
}

std::vector<float> final_weights(const fs::path& dir, int step) {
  const data::Dataset ds = data::load_dataset(data_path(), kT);
  const tg::ModelConfig m{ds.vocab_size(), kT, 2, 2, 16, false};
  return tg::ckpt::load_checkpoint((dir / tg::ckpt::ckpt_name((uint32_t)step)).string(), tg::param_table(m)).params;
}

// Two runs of the same steps. The bound: step 0 is bitwise (the same weights, rows and dropout
// keys; its two micro-batch losses summed in double either way, and a + b = b + a). The
// gradients differ by rounding only: one process adds micro-batch 1's products into micro-batch
// 0's gradients inside its kernels, two ranks compute each alone and MPI_Allreduce adds the
// two sums (one rounding, the same bits on both ranks): a relative delta <= K eps = 4e-6 (K <= 64
// terms in a sum here, eps = 2^-24). AdamW then amplifies that across steps as --grad-accum 2
// against --batch-size 2B does (tests/cpu/test_accum.cpp): losses within a relative 1e-5.
// Weights, with lr_s the learning rate of step s (from metrics.jsonl): an update moves a weight
// by about lr_s m/sqrt(v), at most lr_s a step in size, so a weight whose gradient is at
// rounding level may end at most 2 sum(lr_s) apart; a typical one moves lr_s delta apart (and
// is rounded, eps |w| with |w| < 0.5): the mean stays within sum(2 lr_s delta + eps / 2). A wrong
// micro-batch (other rows) or dropout key moves step 0's loss by 1e-3 or more, and every later
// one (as rank 0's rows alone do below).
void check_same_training(const fs::path& a, const fs::path& b, int steps) {
  const auto la = losses(a), lb = losses(b);
  REQUIRE(la.size() == (size_t)steps);
  REQUIRE(lb.size() == la.size());
  CHECK(la[0].loss == lb[0].loss);
  double lr_sum = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    CAPTURE(i);
    CHECK(la[i].step == lb[i].step);
    CHECK(la[i].lr == lb[i].lr);
    CHECK(la[i].loss == doctest::Approx(lb[i].loss).epsilon(1e-5));
    lr_sum += la[i].lr;
  }
  const std::vector<float> wa = final_weights(a, steps), wb = final_weights(b, steps);
  REQUIRE(wa.size() == wb.size());
  double sum = 0, worst = 0;
  for (size_t i = 0; i < wa.size(); ++i) {
    sum += std::fabs((double)wa[i] - wb[i]);
    worst = std::max(worst, std::fabs((double)wa[i] - wb[i]));
  }
  MESSAGE("final weights: mean |difference| " << sum / wa.size() << ", largest " << worst << " (sum of lr "
                                              << lr_sum << ")");
  const double delta = 64 * 0x1p-24, eps = 0x1p-24;
  CHECK(sum / wa.size() <= 2 * lr_sum * delta + steps * eps / 2);
  CHECK(worst <= 2 * lr_sum);
}

}  // namespace

TEST_CASE("dist: mpirun -np 2 with micro-batch B trains as one process with --grad-accum 2" * doctest::skip(no_mpi())) {
  const fs::path base = fresh_dir("tg_dist_equal");
  const Run dp = run_train_gpt_prefixed(mpirun2(), tiny(6, "--ckpt-interval 3 --out-dir " + (base / "dp").string()));
  CAPTURE(dp.out);
  CAPTURE(dp.err);
  REQUIRE(dp.code == 0);
  // the start-up lines (rank 0's alone: each appears once)
  CHECK(dp.out.find("batch_size 3 x grad_accum 1 x 2 ranks = 96 tokens per step") != std::string::npos);
  CHECK(dp.out.find("rank 0 of 2: ") != std::string::npos);
  CHECK(dp.out.find("rank 1 of 2: ") != std::string::npos);
  CHECK(dp.out.find("local rank 1, device cpu (1 threads)") != std::string::npos);
  CHECK(dp.out.find("data parallel: 2 ranks, gradients summed once per step by MPI_Allreduce") != std::string::npos);
  CHECK(dp.out.find("done: 6 steps") == dp.out.rfind("done: 6 steps"));
  // one writer: rank 0's lock, run.cfg (with the ranks), metrics and checkpoints
  CHECK(slurp((base / "dp" / "run.cfg").string()).find("\nworld=2\n") != std::string::npos);
  CHECK(fs::exists(base / "dp" / "ckpt-00000006"));

  const Run acc = run_train_gpt_prefixed(kOne, tiny(6, "--ckpt-interval 3 --grad-accum 2 --out-dir " + (base / "acc").string()));
  CAPTURE(acc.err);
  REQUIRE(acc.code == 0);
  CHECK(acc.out.find("batch_size 3 x grad_accum 2 = 96 tokens per step") != std::string::npos);
  check_same_training(base / "dp", base / "acc", 6);

  // step 0 is rows 0 .. 5 of the step's batch (one batch of 6: the same loss to rounding), and
  // the check can fail: rank 0's rows alone (what two ranks drawing the same rows would see)
  // give another loss
  const Run b6 = run_train_gpt_prefixed(kOne, tiny(1, "--out-dir " + (base / "b6").string(), 6));
  const Run b3 = run_train_gpt_prefixed(kOne, tiny(1, "--out-dir " + (base / "b3").string()));
  REQUIRE(b6.code == 0);
  REQUIRE(b3.code == 0);
  const double l0 = losses(base / "dp")[0].loss;
  CHECK(losses(base / "b6")[0].loss == doctest::Approx(l0).epsilon(1e-5));
  CHECK(std::fabs(losses(base / "b3")[0].loss - l0) > 1e-4 * l0);
  fs::remove_all(base);
}

TEST_CASE("dist: a resume with another number of ranks keeps the global batch (2 x 1 -> 1 x 2 -> 2 x 1)" *
          doctest::skip(no_mpi())) {
  const fs::path base = fresh_dir("tg_dist_resume"), run = base / "run", ref = base / "ref";
  const std::string dir = " --ckpt-interval 2 --out-dir " + run.string();
  Run a = run_train_gpt_prefixed(mpirun2(), tiny(2, dir));
  CAPTURE(a.err);
  REQUIRE(a.code == 0);
  // one process: --grad-accum 2 chosen and said; 3 cannot keep the 2 micro-batches: refused
  const Run refused = run_train_gpt_prefixed(kOne, "--resume --grad-accum 3 --max-iters 4 --out-dir " + run.string());
  CHECK(refused.code == 2);
  CHECK(refused.err.find("--grad-accum 3 on 1 rank(s) (the run's step is 2 ranks x 1 = 2 micro-batches") != std::string::npos);
  const Run b = run_train_gpt_prefixed(kOne, "--resume --max-iters 4 --out-dir " + run.string());
  CAPTURE(b.err);
  REQUIRE(b.code == 0);
  CHECK(b.out.find("--grad-accum 2 on 1 rank(s) (was 2 ranks x 1: the same 2 micro-batches per step)") != std::string::npos);
  CHECK(b.out.find("batch_size 3 x grad_accum 2 = 96 tokens per step") != std::string::npos);
  const Run c = run_train_gpt_prefixed(mpirun2(), "--resume --max-iters 6 --out-dir " + run.string());
  CAPTURE(c.err);
  REQUIRE(c.code == 0);
  CHECK(c.out.find("--grad-accum 1 on 2 rank(s) (was 2: the same 2 micro-batches per step)") != std::string::npos);
  // the same training as one process with --grad-accum 2 that was never stopped
  const Run r = run_train_gpt_prefixed(kOne, tiny(6, "--grad-accum 2 --ckpt-interval 2 --out-dir " + ref.string()));
  REQUIRE(r.code == 0);
  check_same_training(run, ref, 6);
  fs::remove_all(base);
}

namespace {
// The pids of the processes whose parent is ppid.
std::vector<pid_t> children_of(pid_t ppid) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream stat(slurp((e.path() / "stat").string()));
    std::string pid, comm, state;
    long parent = -1;
    // pid (comm) state ppid: train_gpt's comm has no spaces
    if (stat >> pid >> comm >> state >> parent && parent == ppid) out.push_back((pid_t)std::stol(pid));
  }
  return out;
}

// A long two-rank run in run, once its first checkpoint is written: the job (mpirun) and the
// pids of rank 0 (the lock's holder) and rank 1 (mpirun's other train_gpt child).
struct TwoRanks {
  Background job;
  pid_t rank0 = -1, rank1 = -1;
  explicit TwoRanks(const fs::path& run) : job(tiny(1000000, "--ckpt-interval 5 --out-dir " + run.string()), 0, mpirun2()) {
    for (int i = 0; i < 600 && job.running() && rank0 <= 0; ++i) {  // a minute at most
      const std::string lock = slurp((run / "train_gpt.lock").string());
      if (!tg::ckpt::list_checkpoints(run.string()).empty() && !lock.empty()) rank0 = (pid_t)std::stol(lock);
      else std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (pid_t p : children_of(job.pid))
      if (p != rank0 && slurp("/proc/" + std::to_string(p) + "/comm").rfind("train_gpt", 0) == 0) rank1 = p;
  }
  // Sends sig to rank 1, waits (30 s at most) for the job to end, which must take less than
  // 20 s: its status and output, and the seconds it took (the job is killed when it did not end).
  Run signal_rank1(int sig, double& seconds) {
    REQUIRE(rank0 > 0);
    REQUIRE(rank1 > 0);
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(kill(rank1, sig) == 0);
    bool ended = false;
    for (int i = 0; i < 300 && !ended; ++i) {
      ended = !job.running();
      if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ended) kill(job.pid, SIGKILL);
    CHECK(seconds < 20);
    return job.wait();
  }
};

// The newest complete checkpoint of run resumes on one process (the same 2 micro-batches per
// step) and trains 2 more steps; its step.
uint32_t check_resumes(const fs::path& run) {
  const auto ckpts = tg::ckpt::list_checkpoints(run.string());
  REQUIRE(!ckpts.empty());
  const uint32_t step = ckpts.front().first;
  const Run resumed = run_train_gpt_prefixed(kOne, "--resume --max-iters " + std::to_string(step + 2) + " --out-dir " + run.string());
  CAPTURE(resumed.err);
  CHECK(resumed.code == 0);
  CHECK(resumed.out.find("at step " + std::to_string(step)) != std::string::npos);
  CHECK(resumed.out.find("done: " + std::to_string(step + 2) + " steps") != std::string::npos);
  return step;
}
}  // namespace

TEST_CASE("dist: a rank killed with SIGKILL ends the job within seconds; the last checkpoint resumes" *
          doctest::skip(no_mpi())) {
  const fs::path base = fresh_dir("tg_dist_kill"), run = base / "run";
  TwoRanks two(run);
  double seconds = 0;
  const Run r = two.signal_rank1(SIGKILL, seconds);
  CAPTURE(r.err);
  MESSAGE("the job ended " << seconds << " s after rank 1's SIGKILL");
  CHECK(r.code != 0);
  CHECK(r.err.find("rank 1") != std::string::npos);  // mpirun names the rank that died
  check_resumes(run);
  fs::remove_all(base);
}

TEST_CASE("dist: SIGTERM to one rank stops every rank before the same step, with rank 0's checkpoint" *
          doctest::skip(no_mpi())) {
  // the signal only marks a stop pending on rank 1; the step's all-reduce tells rank 0, both
  // stop before that step, rank 0 writes its checkpoint, and neither exits before it is written
  const fs::path base = fresh_dir("tg_dist_term"), run = base / "run";
  TwoRanks two(run);
  double seconds = 0;
  const Run r = two.signal_rank1(SIGTERM, seconds);
  CAPTURE(r.err);
  CHECK(r.code == 130);
  const size_t at = r.err.find("interrupted after step ");
  REQUIRE(at != std::string::npos);
  const int last = std::atoi(r.err.c_str() + at + std::string("interrupted after step ").size());
  CHECK(check_resumes(run) == (uint32_t)last + 1);  // the stop's own checkpoint, the newest
  fs::remove_all(base);
}

TEST_CASE("dist: a rank that throws ends the job with one line naming it" * doctest::skip(no_mpi())) {
  const fs::path base = fresh_dir("tg_dist_throw");
  // bad input: every rank refuses it, exit status 2, nothing written
  const Run bad = run_train_gpt_prefixed(mpirun2(), tiny(2, "--warmup-iters -1 --out-dir " + (base / "bad").string()));
  CAPTURE(bad.err);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("error: rank ") != std::string::npos);
  CHECK(bad.err.find(" of 2: --warmup-iters is -1") != std::string::npos);
  CHECK(!fs::exists(base / "bad"));
  // a failure on rank 1 alone (TG_INJECT_FAIL) at step 3, while rank 0 waits for it in that
  // step's all-reduce: the job ends at once, status 1, the line names the rank; the checkpoint
  // of step 2 resumes
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path dir = base / "fail";
  const Run fail = run_train_gpt_prefixed("TG_INJECT_FAIL=1:3 " + mpirun2() + "-x TG_INJECT_FAIL ",
                                          tiny(10, "--ckpt-interval 2 --out-dir " + dir.string()));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(fail.err);
  MESSAGE("the job with rank 1 failing at step 3 took " << seconds << " s");
  CHECK(fail.code == 1);
  CHECK(fail.err.find("error: rank 1 of 2: failure injected by TG_INJECT_FAIL at step 3") != std::string::npos);
  CHECK(seconds < 20);
  const Run resumed = run_train_gpt_prefixed(kOne, "--resume --max-iters 4 --out-dir " + dir.string());
  CAPTURE(resumed.err);
  CHECK(resumed.code == 0);
  CHECK(resumed.out.find("at step 2") != std::string::npos);
  fs::remove_all(base);
}

TEST_CASE("dist: a bad token id in rank 1's rows alone ends every rank with its line; the new run is taken back" *
          doctest::skip(no_mpi())) {
  // Shards of 1.5M tokens: the start checks the first and last 2^19 of each (data/tokens.h), so
  // an id past the vocabulary in the middle is found only by the batch that reads it. Which
  // positions each rank reads: the batches of a vector whose token i is i (data/dataset.h draws
  // a split's windows from its size alone; checked below against the shard's own batches).
  // Rank 0 reads rows 0..B-1 of each step and the evaluation batches 0, 2, 4, 6; rank 1 rows
  // B..2B-1 and batches 1, 3, 5, 7. The bad id goes to a middle position of a window of rank 1
  // that no window of rank 0 reads up to then: found by rank 1 alone.
  const fs::path base = fresh_dir("tg_dist_bad_id");
  constexpr int B = 4, kIters = 3, kEvals = 8, n = 1500000, kEnd = 1 << 19;
  const uint64_t seed = 7;
  std::vector<uint16_t> ids(n);
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) {
    ids[(size_t)i] = (uint16_t)(i % 50000);
    pos[(size_t)i] = i;
  }
  const fs::path good = base / "good";
  write_shard(good / "t_train_000000.bin", ids);
  write_shard(good / "t_val_000000.bin", ids);
  std::vector<int32_t> x(B * kT), y(B * kT), xs(B * kT);
  std::vector<int> rank0;  // window starts rank 0 has read so far
  auto read_by_rank0 = [&](int at) {
    for (int s : rank0)
      if (at >= s && at <= s + kT) return true;
    return false;
  };
  auto add_windows = [&](std::vector<int>& to) {
    for (int b = 0; b < B; ++b) to.push_back(x[(size_t)b * kT]);
  };
  const data::Dataset ds = data::load_dataset(good.string(), kT);
  ds.train_batch(seed, 0, B, kT, xs.data(), y.data(), B);
  data::train_batch(pos, seed, 0, B, kT, x.data(), y.data(), B);
  for (int i = 0; i < B * kT; ++i) REQUIRE(xs[(size_t)i] == x[(size_t)i] % 50000);
  int in_train = -1, in_val = -1;
  for (int step = 0; step < kIters && in_train < 0; ++step) {
    data::train_batch(pos, seed, (uint32_t)step, B, kT, x.data(), y.data(), 0);
    add_windows(rank0);
    data::train_batch(pos, seed, (uint32_t)step, B, kT, x.data(), y.data(), B);
    for (int b = 0; b < B && in_train < 0; ++b) {
      const int at = x[(size_t)b * kT] + kT / 2;
      if (at >= kEnd && at < n - kEnd && !read_by_rank0(at)) in_train = at;
    }
  }
  rank0.clear();
  for (int k = 0; k < kEvals; k += 2) {
    data::eval_batch(pos, seed, 1, (uint32_t)k, B, kT, x.data(), y.data());
    add_windows(rank0);
  }
  for (int k = 1; k < kEvals && in_val < 0; k += 2) {
    data::eval_batch(pos, seed, 1, (uint32_t)k, B, kT, x.data(), y.data());
    for (int b = 0; b < B && in_val < 0; ++b) {
      const int at = x[(size_t)b * kT] + kT / 2;
      if (at >= kEnd && at < n - kEnd && !read_by_rank0(at)) in_val = at;
    }
  }
  REQUIRE(in_train >= 0);
  REQUIRE(in_val >= 0);
  const std::string model = "--device cpu --n-layer 1 --n-head 2 --n-embd 16 --block-size " + std::to_string(kT) +
                            " --batch-size " + std::to_string(B) + " --seed " + std::to_string(seed) +
                            " --eval-iters " + std::to_string(kEvals) + " --max-iters " + std::to_string(kIters) +
                            " --ckpt-interval 0 --sample-tokens 0 ";
  struct Case {
    const char* what;
    bool train;
    int at;
    const char* eval;
  };
  for (const Case& k : {Case{"a training batch", true, in_train, "--eval-interval 0"},
                        Case{"an evaluation batch", false, in_val, "--eval-interval 1"}}) {
    CAPTURE(k.what);
    const fs::path bad = base / (k.train ? "bad_train" : "bad_val");
    std::vector<uint16_t> damaged = ids;
    damaged[(size_t)k.at] = 60000;
    write_shard(bad / "t_train_000000.bin", k.train ? damaged : ids);
    write_shard(bad / "t_val_000000.bin", k.train ? ids : damaged);
    const fs::path out = base / "made" / "run";
    const Run r = run_train_gpt_prefixed(mpirun2(), model + k.eval + " --data " + bad.string() + " --out-dir " + out.string());
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find("error: rank 1 of 2: token file ") != std::string::npos);
    CHECK(r.err.find("holds token id 60000 at token " + std::to_string(k.at) + " ") != std::string::npos);
    CHECK(r.err.find("wrote no checkpoint and is removed") != std::string::npos);
    CHECK(r.err.find("rank 0 of 2") == std::string::npos);  // one line, rank 0's, naming rank 1
    CHECK(r.err.find("MPI_ABORT") == std::string::npos);   // the ranks ended side by side
    CHECK(!fs::exists(base / "made"));
    // the data corrected, the same command runs
    const Run again = run_train_gpt_prefixed(mpirun2(), model + k.eval + " --data " + good.string() + " --out-dir " + out.string());
    CAPTURE(again.err);
    CHECK(again.code == 0);
    fs::remove_all(base / "made");
  }
  fs::remove_all(base);
}

namespace {
// ZeRO-1's model: 17725 parameters (odd: --bias with C = 25), so the two shards are 16384 and
// 1341 elements, and the boundary falls inside transformer.h.1.mlp.c_proj.weight (decayed).
const std::string kZeroModel = "--n-layer 2 --n-head 5 --n-embd 25 --bias";
tg::ModelConfig zero_model() {
  const data::Dataset ds = data::load_dataset(data_path(), kT);
  return tg::ModelConfig{ds.vocab_size(), kT, 2, 5, 25, true};
}
std::string zero_run(int iters, const std::string& more) {
  return "--device cpu --max-iters " + std::to_string(iters) + " " + kZeroModel + " --block-size " + std::to_string(kT) +
         " --batch-size 3 --dropout 0.1 --eval-interval 2 --eval-iters 3 --sample-tokens 0 --lr 1e-2 --data " +
         data_path() + " " + more;
}
tg::ckpt::Checkpoint zero_ckpt(const fs::path& dir, int step) {
  return tg::ckpt::load_checkpoint((dir / tg::ckpt::ckpt_name((uint32_t)step)).string(), tg::param_table(zero_model()));
}
// metrics.jsonl without the times: every number the training computed
std::vector<std::string> computed(const fs::path& dir) {
  std::vector<std::string> out;
  std::istringstream in(slurp((dir / "metrics.jsonl").string()));
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    j.erase("ms");
    j.erase("tokens_per_s");
    out.push_back(j.dump());
  }
  return out;
}
// Two runs' metrics (losses, evaluations, gradient norms) and final state, bit for bit.
void check_same_bits(const fs::path& a, const fs::path& b, int step) {
  const auto ma = computed(a), mb = computed(b);
  REQUIRE(ma.size() == (size_t)step + 1);
  CHECK(ma == mb);
  const tg::ckpt::Checkpoint ca = zero_ckpt(a, step), cb = zero_ckpt(b, step);
  CHECK(ca.params == cb.params);
  CHECK(ca.m == cb.m);
  CHECK(ca.v == cb.v);
}
}  // namespace

TEST_CASE("dist: --zero 1 shards the AdamW state over two ranks and trains bit for bit as unsharded" *
          doctest::skip(no_mpi())) {
  const auto table = tg::param_table(zero_model());
  const size_t n = tg::param_count(table);
  REQUIRE(n == 17725);
  const tg::Shards sh(n, 2);
  REQUIRE(sh.count(0) == 16384);
  REQUIRE(sh.count(1) == 1341);
  bool cut = false;  // the boundary is inside a tensor that is decayed
  for (const tg::ParamSpec& p : table) cut |= p.offset < sh.begin(1) && sh.begin(1) < p.offset + p.numel && p.decay;
  REQUIRE(cut);

  const fs::path base = fresh_dir("tg_dist_zero");
  const Run z1 = run_train_gpt_prefixed(mpirun2(), zero_run(6, "--zero 1 --ckpt-interval 3 --out-dir " + (base / "z1").string()));
  CAPTURE(z1.out);
  CAPTURE(z1.err);
  REQUIRE(z1.code == 0);
  CHECK(z1.out.find("(optimizer state sharded: --zero 1)") != std::string::npos);
  CHECK(z1.out.find("(AdamW state 0.1 MiB per rank, sharded over 2 ranks by --zero 1; 0.1 MiB unsharded)") != std::string::npos);
  CHECK(z1.out.find("ZeRO-1 (--zero 1): gradients reduce-scattered by MPI_Reduce_scatter") != std::string::npos);
  const Run z0 = run_train_gpt_prefixed(mpirun2(), zero_run(6, "--ckpt-interval 3 --out-dir " + (base / "z0").string()));
  CAPTURE(z0.err);
  REQUIRE(z0.code == 0);
  CHECK(z0.out.find("sharded") == std::string::npos);
  // the same bits: each summed gradient is a + b either way, the norm's chunk sums are added in
  // the same order, AdamW is elementwise with each tensor's decay, the weights are copies
  check_same_bits(base / "z0", base / "z1", 6);
  CHECK(zero_ckpt(base / "z1", 3).m == zero_ckpt(base / "z0", 3).m);  // the checkpoint before the last, gathered too

  // one process with --grad-accum 2: the same training to rounding (check_same_training's
  // bound), and the evaluations of step 0 (the same weights; three batches, two on rank 0 and
  // one on rank 1, added in batch order) the same bits
  const Run one = run_train_gpt_prefixed(kOne, zero_run(6, "--grad-accum 2 --ckpt-interval 3 --out-dir " + (base / "one").string()));
  CAPTURE(one.err);
  REQUIRE(one.code == 0);
  const auto m1 = computed(base / "one"), mz = computed(base / "z1");
  REQUIRE(m1.size() == mz.size());
  const nlohmann::json e1 = nlohmann::json::parse(m1[0]), ez = nlohmann::json::parse(mz[0]);
  CHECK(e1["val_loss"] == ez["val_loss"]);
  CHECK(e1["eval_train_loss"] == ez["eval_train_loss"]);
  CHECK(e1["train_loss"] == ez["train_loss"]);
  const auto l1 = losses(base / "one"), lz = losses(base / "z1");
  REQUIRE(l1.size() == lz.size());
  for (size_t i = 0; i < l1.size(); ++i) CHECK(l1[i].loss == doctest::Approx(lz[i].loss).epsilon(1e-5));
  // and the check can fail: another evaluation (one batch) gives another step-0 val loss
  const Run other = run_train_gpt_prefixed(kOne, "--device cpu --max-iters 1 " + kZeroModel + " --block-size 16 --batch-size 3 "
                                                 "--eval-iters 1 --sample-tokens 0 --data " + data_path() + " --out-dir " + (base / "other").string());
  REQUIRE(other.code == 0);
  CHECK(nlohmann::json::parse(computed(base / "other")[0])["val_loss"] != ez["val_loss"]);
  fs::remove_all(base);
}

TEST_CASE("dist: sharded and unsharded checkpoints resume either way, on two ranks or one" * doctest::skip(no_mpi())) {
  const fs::path base = fresh_dir("tg_dist_zero_resume");
  // 2 ranks: sharded [0, 2), unsharded [2, 4), sharded [4, 6): bit for bit one unsharded run
  const fs::path a = base / "a", ref = base / "ref";
  const Run ref_run = run_train_gpt_prefixed(mpirun2(), zero_run(6, "--ckpt-interval 2 --out-dir " + ref.string()));
  REQUIRE(ref_run.code == 0);
  Run r = run_train_gpt_prefixed(mpirun2(), zero_run(2, "--zero 1 --ckpt-interval 2 --out-dir " + a.string()));
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  r = run_train_gpt_prefixed(mpirun2(), "--resume --zero 0 --max-iters 4 --out-dir " + a.string());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("--zero 0 (was 1)") != std::string::npos);
  r = run_train_gpt_prefixed(mpirun2(), "--resume --zero 1 --max-iters 6 --out-dir " + a.string());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("sharded over 2 ranks") != std::string::npos);
  check_same_bits(ref, a, 6);

  // sharded 2 ranks [0, 2) -> one process [2, 4) (--zero 1 kept: a no-op on one rank) ->
  // sharded 2 ranks [4, 6): one process with --grad-accum 2 to rounding
  const fs::path b = base / "b", one = base / "one";
  r = run_train_gpt_prefixed(mpirun2(), zero_run(2, "--zero 1 --ckpt-interval 2 --out-dir " + b.string()));
  REQUIRE(r.code == 0);
  r = run_train_gpt_prefixed(kOne, "--resume --max-iters 4 --out-dir " + b.string());
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("sharded") == std::string::npos);
  r = run_train_gpt_prefixed(mpirun2(), "--resume --max-iters 6 --out-dir " + b.string());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("sharded over 2 ranks") != std::string::npos);
  r = run_train_gpt_prefixed(kOne, zero_run(6, "--grad-accum 2 --ckpt-interval 2 --out-dir " + one.string()));
  REQUIRE(r.code == 0);
  const auto lb = losses(b), l1 = losses(one);
  REQUIRE(lb.size() == 6);
  REQUIRE(l1.size() == 6);
  for (size_t i = 0; i < lb.size(); ++i) CHECK(lb[i].loss == doctest::Approx(l1[i].loss).epsilon(1e-5));
  const tg::ckpt::Checkpoint cb = zero_ckpt(b, 6), c1 = zero_ckpt(one, 6);
  double worst = 0;
  for (size_t i = 0; i < cb.params.size(); ++i) worst = std::max(worst, std::fabs((double)cb.params[i] - c1.params[i]));
  CHECK(worst <= 2 * 6 * 1e-2);  // check_same_training's bound on one weight: 2 x the sum of the learning rates
  fs::remove_all(base);
}

TEST_CASE("dist: --zero takes 0 or 1; on one process 1 is a no-op") {
  const fs::path base = fresh_dir("tg_dist_zero_flag");
  for (const char* bad : {"2", "-1", "x"}) {
    CAPTURE(bad);
    const Run r = run_train_gpt_prefixed(kOne, zero_run(1, std::string("--zero ") + bad + " --out-dir " + (base / "bad").string()));
    CHECK(r.code == 2);
    CHECK(r.err.find("--zero") != std::string::npos);
    CHECK(count_lines(r.err) == 1);
    CHECK(!fs::exists(base / "bad"));
  }
  const Run r = run_train_gpt_prefixed(kOne, zero_run(1, "--zero 1 --out-dir " + (base / "one").string()));
  CAPTURE(r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("sharded") == std::string::npos);
  fs::remove_all(base);
}
