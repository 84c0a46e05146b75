// model/run/run_dir.cpp: the run directory (see model/run/run_dir.h).
#include "run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../data/bpe.h"
#include "../../data/errors.h"
#include "../../data/tokens.h"
#include "../formats/ckpt_io.h"
#include "../formats/ckpt_lookup.h"
#include "../formats/json_io.h"

namespace tg {
namespace fs = std::filesystem;

namespace {

const char* const kLockFile = "train_gpt.lock";
const char* const kRunFile = "run.cfg";
const char* const kMetricsFile = "metrics.jsonl";
const char* const kTokenizerDir = "tokenizer";

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// What a directory holds, read without writing.
struct Contents {
  bool metrics = false, run_file = false, tokenizer = false;  // tokenizer: a run's tokenizer/ or a stray one
  std::vector<std::pair<uint32_t, std::string>> checkpoints;  // ckpt-<step> directories, newest first
  std::vector<std::string> partial;                           // other ckpt-* entries (ckpt-<step>.tmp, ...)

  bool holds_run() const { return metrics || run_file || !checkpoints.empty() || !partial.empty(); }

  // "ckpt-00000006, ckpt-00000003, metrics.jsonl": what shows that it holds a run.
  std::string listing() const {
    std::vector<std::string> names;
    for (const auto& c : checkpoints) names.push_back(fs::path(c.second).filename().string());
    for (const std::string& p : partial) names.push_back(fs::path(p).filename().string());
    if (metrics) names.push_back(kMetricsFile);
    if (run_file) names.push_back(kRunFile);
    std::string s;
    for (size_t i = 0; i < names.size() && i < 4; ++i) s += (i ? ", " : "") + printable(names[i]);
    if (names.size() > 4) s += " and " + std::to_string(names.size() - 4) + " more";
    return s;
  }
};

Contents inspect(const std::string& dir) {
  Contents k;
  std::error_code ec;
  k.metrics = fs::exists(join(dir, kMetricsFile), ec);
  k.run_file = fs::exists(join(dir, kRunFile), ec);
  k.tokenizer = fs::exists(join(dir, kTokenizerDir), ec);
  k.checkpoints = ckpt::list_checkpoints(dir);
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("ckpt-", 0) != 0) continue;
    if (std::none_of(k.checkpoints.begin(), k.checkpoints.end(), [&](const auto& c) { return c.second == it->path().string(); }))
      k.partial.push_back(it->path().string());
  }
  return k;
}

// ---- the lock

// The pid written in the lock file held by another process ("" when it has not written it
// yet: it writes it right after taking the lock, so wait a little for it).
std::string holder_pid(int fd) {
  for (int tries = 0; tries < 100; ++tries) {
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0 && buf[n - 1] == '\n') {
      buf[n - 1] = '\0';
      return buf;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

[[noreturn]] void in_use(const std::string& dir, int fd) {
  const std::string pid = holder_pid(fd);
  ::close(fd);
  throw InputError("--out-dir " + dir + " is in use by another train_gpt process" +
                   (pid.empty() ? std::string() : " (pid " + pid + ")") + ", which holds " + join(dir, kLockFile) +
                   "; expected one process per run directory; wait for it to finish or stop it, or pass another --out-dir");
}

// Refuses a directory whose lock another process holds, without writing anything.
void check_not_in_use(const std::string& dir) {
  const int fd = ::open(join(dir, kLockFile).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) in_use(dir, fd);
  ::close(fd);
}

// A new run's --out-dir: its nearest existing ancestor must be a directory this process can
// write in. Checked before anything is loaded or written.
void check_creatable(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  while (p.has_parent_path() && p != p.parent_path() && !fs::exists(p, ec)) p = p.parent_path();
  if (!fs::is_directory(p, ec))
    throw InputError("--out-dir " + dir + ": " + p.string() + " is not a directory; expected a directory path; pass another --out-dir");
  if (::access(p.c_str(), W_OK) != 0)
    throw InputError("--out-dir " + dir + ": cannot write in " + p.string() + "; expected a writable place; pass another --out-dir");
}

// Refuses a checkpoint directory (ckpt-<step>, holding state.bin) as --out-dir: a run there
// would write its own checkpoints and metrics inside another run's checkpoint, which that run
// deletes with it once newer ones are written.
void check_not_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / "state.bin", ec)) return;
  fs::path ckpt = fs::absolute(dir, ec).lexically_normal();
  if (!ckpt.has_filename()) ckpt = ckpt.parent_path();  // a trailing '/'
  throw InputError("--out-dir " + dir + " is a checkpoint directory (it holds state.bin); expected a run directory; pass " +
                   "the run's directory (" + ckpt.parent_path().string() +
                   ": --resume goes on from its newest checkpoint), or another --out-dir");
}

// Creates dir and its missing parents and returns those it made, outermost first; on failure
// removes them (nothing is left behind) and throws InputError.
std::vector<std::string> create_out_dir(const std::string& dir) {
  std::vector<fs::path> made;
  std::error_code ec;
  fs::path p;
  for (const fs::path& part : fs::absolute(dir, ec)) {
    p /= part;
    if (fs::is_directory(p, ec)) continue;
    if (!fs::create_directory(p, ec) && !ec) continue;  // made meanwhile
    if (ec) {
      const std::string why = printable(p.filename().string()) + ": " + ec.message();
      for (auto it = made.rbegin(); it != made.rend(); ++it) fs::remove(*it, ec);
      throw InputError("cannot create --out-dir " + printable(dir, 200) + ": " + why +
                       "; expected a directory path this process can create; pass another --out-dir");
    }
    made.push_back(p);
  }
  return std::vector<std::string>(made.begin(), made.end());
}

// ---- run.cfg: the config text with the absolute data path, then the data's sha256

struct RunFile {
  Config config;  // data: the absolute path
  std::string sha256;
};

std::string run_file_text(const Config& c, const std::string& data_path, const std::string& sha256) {
  Config saved = c;
  saved.data = data_path;
  saved.resume = false;
  return config_to_text(saved) + "data_sha256=" + sha256 + "\n";
}

RunFile read_run_file(const std::string& dir) {
  const std::string path = join(dir, kRunFile);
  std::string text = ckpt::read_file(path);
  RunFile rf;
  const std::string key = "data_sha256=";
  const size_t at = text.rfind("\n" + key);
  if (at == std::string::npos || text.back() != '\n')
    throw InputError("run file " + path + " has no data_sha256 line; expected the file train_gpt writes when a run "
                     "begins; it is damaged: delete it (the run then has no checkpoint to go on from)");
  rf.sha256 = text.substr(at + 1 + key.size(), text.size() - at - 2 - key.size());
  text.erase(at + 1);
  const std::string fix = "it is damaged: delete it (the run then has no checkpoint to go on from)";
  try {
    rf.config = config_from_text(text);
  } catch (const InputError& e) {
    throw InputError("run file " + path + ": " + e.what());
  }
  try {
    validate(rf.config);
  } catch (const InputError& e) {
    ckpt::refused_config("run file " + path, e.what(), fix);
  }
  return rf;
}

// The fields where two configs of one run differ, as "--flag a (b)" pieces; the data is
// compared by contents elsewhere, the place of the run is not compared.
std::vector<std::string> differences(const Config& a, const Config& b, const std::string& b_is) {
  static const char* const kNotCompared[] = {"data", "out-dir", "resume", "sample", "ckpt"};
  std::vector<std::string> out;
  for (const std::string& flag : flag_names()) {
    if (std::find(std::begin(kNotCompared), std::end(kNotCompared), flag) != std::end(kNotCompared)) continue;
    const std::string va = flag_value(a, flag), vb = flag_value(b, flag);
    if (va != vb) out.push_back("--" + flag + " " + va + " (" + b_is + " " + vb + ")");
  }
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

// ---- metrics.jsonl

// The step of a metrics line ({"step": N, ...}, read with nlohmann-json), or -1 for a line
// that is not a whole one.
long line_step(const std::string& line) {
  const jsonio::Value j = jsonio::parse(line);
  if (j.is_discarded() || !j.is_object()) return -1;
  const jsonio::Value step = j["step"];
  if (!j.contains("step") || !step.is_number_unsigned() || step.get_uint64() > (uint64_t)INT32_MAX) return -1;
  return (long)step.get_uint64();
}

// The lines of metrics.jsonl a run resumed at step keeps (whole lines of the steps before
// it, and before those it holds unwritten), then those unwritten lines.
std::string metrics_resumed_at(const std::string& path, int step, const std::vector<std::string>& unlogged) {
  long limit = step;
  for (const std::string& u : unlogged)
    if (line_step(u) >= 0) limit = std::min(limit, line_step(u));
  std::ifstream in(path);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const long s = line.empty() ? -1 : line_step(line);
    if (s >= 0 && s < limit) kept += line + "\n";
  }
  for (const std::string& u : unlogged) kept += u + "\n";
  return kept;
}

}  // namespace

RunDir::RunDir(const std::string& dir, bool writer) : dir_(dir), writer_(writer) {}

RunDir::~RunDir() {
  if (metrics_fd_ >= 0) ::close(metrics_fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

void RunDir::lock() {
  if (lock_fd_ >= 0) return;
  const std::string path = join(dir_, kLockFile);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw InputError("cannot create the lock file " + path + ": " + std::strerror(errno) +
                     "; expected a writable --out-dir; fix its permissions or pass another --out-dir");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) in_use(dir_, fd);
    const int e = errno;
    ::close(fd);
    throw InputError("cannot lock " + path + ": " + std::strerror(e) +
                     "; expected a filesystem with flock; pass an --out-dir on a local disk");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != (ssize_t)pid.size()) {
    const int e = errno;
    ::close(fd);
    throw RuntimeError("cannot write " + path + ": " + std::strerror(e) +
                       "; expected a writable --out-dir with free space; free some or pass another --out-dir");
  }
  lock_fd_ = fd;
}

RunStart RunDir::plan(const ParsedArgs& args, std::ostream& out, std::ostream& warn) {
  return args.config.resume ? plan_resume(args, out, warn) : plan_new(args.config, warn);
}

RunStart RunDir::plan_new(const Config& flags, std::ostream& warn) {
  check_creatable(dir_);
  check_not_checkpoint(dir_);
  check_not_in_use(dir_);
  const Contents k = inspect(dir_);
  if (k.holds_run() && !(k.checkpoints.empty() && k.run_file))
    throw InputError("--out-dir " + dir_ + " already holds a run (" + k.listing() + "); expected a new or empty directory; " +
                     (k.checkpoints.empty() && !k.run_file
                          ? "it has no checkpoint or run.cfg to continue from: pass another --out-dir, or delete those "
                            "to start over there"
                          : "continue it with train_gpt --resume --out-dir " + dir_ + ", or pass another --out-dir"));
  // a run keeps its tokenizer there, and a run of a text in BPE tokens would replace it
  if (k.tokenizer && !k.run_file)
    throw InputError("--out-dir " + dir_ + " holds a " + kTokenizerDir + " entry but no run (no " + kRunFile +
                     "); expected a new or empty directory (a run keeps its tokenizer in " + kTokenizerDir +
                     "/); move it elsewhere, or pass another --out-dir");
  RunStart st;
  st.config = flags;
  st.data = data::load_dataset(flags.data, flags.block_size, flags.tokenizer);
  if (!k.holds_run()) return st;
  // a run killed before its first checkpoint: the same flags and data start it again
  const RunFile rf = read_run_file(dir_);
  std::vector<std::string> diff = differences(flags, rf.config, "there");
  if (rf.sha256 != st.data.sha256) diff.push_back("--data " + flags.data + " (other contents than " + rf.config.data + " there)");
  if (!diff.empty())
    throw InputError("--out-dir " + dir_ + " holds a run killed before its first checkpoint, begun with other flags: " +
                     joined(diff) + "; expected the same flags to start it again; pass them, or --resume to go on "
                     "with its own from step 0, or another --out-dir");
  warn << "warning: --out-dir " << dir_ << " holds a run killed before its first checkpoint, begun with the same "
       << "flags: starting it again, discarding " << k.listing() << "\n";
  st.again = true;
  return st;
}

RunStart RunDir::plan_resume(const ParsedArgs& args, std::ostream& out, std::ostream& warn) {
  const std::string nothing = "; expected the --out-dir of a run that wrote checkpoints; pass that directory, or drop "
                              "--resume to start a new run";
  std::error_code ec;
  if (!fs::exists(dir_, ec))
    throw InputError("--resume: --out-dir " + dir_ + " does not exist: it holds no complete checkpoint" + nothing);
  if (!fs::is_directory(dir_, ec)) throw InputError("--resume: --out-dir " + dir_ + " is not a directory" + nothing);
  check_not_checkpoint(dir_);
  if (writer_) lock();
  // where it goes on from: the newest intact checkpoint, or step 0 of the run begun
  RunStart st;
  const Contents k = inspect(dir_);
  if (k.metrics && !fs::is_regular_file(join(dir_, kMetricsFile), ec))  // a FIFO would block its reading
    throw InputError("--resume: " + join(dir_, kMetricsFile) + " is not a regular file (a directory, device or FIFO); "
                     "expected the run's metrics.jsonl; move it away (the run goes on without its earlier lines)");
  ckpt::CheckpointInfo info;
  st.checkpoint = pick_checkpoint(dir_, warn);
  if (!st.checkpoint.empty()) {
    info = ckpt::checkpoint_info(st.checkpoint);
  } else if (k.run_file) {
    const RunFile rf = read_run_file(dir_);
    info.config = rf.config;
    info.data_path = rf.config.data;
    info.data_sha256 = rf.sha256;
    warn << "warning: --out-dir " << dir_ << " holds no checkpoint yet: resuming from step 0, discarding "
         << k.listing() << "\n";
  } else {
    throw InputError("--resume: --out-dir " + dir_ + " holds no complete checkpoint" +
                     (k.holds_run() ? " (only " + k.listing() + ")" : "") + nothing +
                     (k.metrics ? " (delete that metrics.jsonl first)" : ""));
  }

  // the flags given: those that change the model or the data are refused, the others applied
  const Config& flags = args.config;
  const bool data_given = std::find(args.given.begin(), args.given.end(), "data") != args.given.end();
  Config c = info.config;
  std::vector<std::string> conflicts, applied;
  for (const std::string& flag : args.given) {
    if (flag == "data" || flag == "resume" || flag == "out-dir" || flag == "sample" || flag == "ckpt") continue;
    if (flag == "grad-accum") continue;  // below, with the number of ranks
    const std::string now = flag_value(flags, flag), was = flag_value(info.config, flag);
    if (now == was) continue;
    if (flag == "tokenizer" && was.empty() && !data::is_token_data(info.config.data)) {
      conflicts.push_back("--tokenizer " + now + " (the run has none: it trains on characters)");
    } else if (fixed_on_resume(flag)) {
      conflicts.push_back("--" + flag + " " + now + " (the run has " + was + ")");
    } else {
      copy_flag(c, flags, flag);
      applied.push_back("--" + flag + " " + now + " (was " + was + ")");
    }
  }
  // the step's global batch (ranks x --grad-accum micro-batches) is the run's; with another
  // number of ranks, the --grad-accum that keeps it (given, or chosen and said)
  const int global = info.config.world * info.config.grad_accum;
  const bool accum_given = std::find(args.given.begin(), args.given.end(), "grad-accum") != args.given.end();
  const int accum = accum_given ? flags.grad_accum : global % flags.world == 0 ? global / flags.world : 0;
  auto batch = [](int world, int accum) {
    return world == 1 ? std::to_string(accum) : std::to_string(world) + " ranks x " + std::to_string(accum);
  };
  if (accum * flags.world != global) {
    conflicts.push_back((accum_given ? "--grad-accum " + std::to_string(accum) + " on " : std::string()) +
                        std::to_string(flags.world) + " rank(s) (the run's step is " +
                        batch(info.config.world, info.config.grad_accum) + " = " + std::to_string(global) +
                        " micro-batches; pass --grad-accum G with ranks x G = " + std::to_string(global) + ")");
  } else if (accum != info.config.grad_accum || flags.world != info.config.world) {
    c.grad_accum = accum;
    applied.push_back("--grad-accum " + std::to_string(accum) + " on " + std::to_string(flags.world) + " rank(s) (was " +
                      batch(info.config.world, info.config.grad_accum) + ": the same " + std::to_string(global) +
                      " micro-batches per step)");
  }
  c.world = flags.world;
  std::string mismatch;
  st.data = load_recorded(info, data_given ? flags.data : "", warn, mismatch, run_tokenizer(dir_, c));
  if (!mismatch.empty() && data_given) conflicts.push_back("--data " + mismatch);
  if (!conflicts.empty())
    throw InputError("--resume: flags that would change the model or the data of the run in " + dir_ + ": " +
                     joined(conflicts) + "; expected only flags that can change on resume (--max-iters, the schedule, "
                     "the optimizer, the intervals, sampling, --device, --precision); drop them, or start a new run in "
                     "another --out-dir");
  if (!mismatch.empty())
    throw InputError("--resume: the run's data changed since it began: " + mismatch +
                     "; expected the text the run trained on; restore it, or pass --data PATH of a copy");
  if (data_given) c.data = flags.data;  // else the run's as it was given (its absolute path is recorded)
  c.out_dir = flags.out_dir;
  c.resume = true;
  validate(c);
  if (c.max_iters < (int)info.step)
    throw InputError("--resume: --max-iters " + std::to_string(c.max_iters) + " ends the run before its checkpoint " +
                     st.checkpoint + " (step " + std::to_string(info.step) + "); expected at least " +
                     std::to_string(info.step) + "; pass a larger --max-iters, or sample from that checkpoint with --sample");
  if (!applied.empty()) out << "resume: applying " << joined(applied) << "\n";
  st.config = c;
  st.progress = Progress{(int)info.step, (int)info.steps_done, (int)info.bad_steps};
  st.unlogged = info.unlogged;
  st.resumed = true;
  return st;
}

void RunDir::begin(const RunStart& start) {
  if (!writer_) return;
  if (!start.resumed) {
    std::error_code ec;
    made_ = create_out_dir(dir_);
    lock();
    const Contents k = inspect(dir_);
    if (k.holds_run() && !(start.again && k.checkpoints.empty() && k.run_file))
      throw InputError("--out-dir " + dir_ + " now holds a run begun meanwhile by another process (" + k.listing() +
                       "); expected a new or empty directory; pass another --out-dir");
    if (start.again) {
      fs::remove(join(dir_, kMetricsFile), ec);
      for (const std::string& p : k.partial) fs::remove_all(p, ec);
    }
    began_new_ = true;
  }
  data_sha256_ = start.data.sha256;
  data_path_ = fs::absolute(start.data.path).lexically_normal().string();
  vocab_ = start.data.tok.chars();
  // the tokenizer's files, as read: --sample --ckpt needs nothing else (ckpt_lookup.h run_tokenizer)
  if (start.data.bpe && !start.resumed) {
    const std::string tdir = join(dir_, kTokenizerDir);
    std::error_code ec;
    fs::remove_all(tdir, ec);
    fs::create_directories(tdir, ec);
    for (const auto& [name, bytes] : start.data.bpe->files()) ckpt::write_file_atomic(join(tdir, name), bytes);
    kept_tokenizer_ = true;
  }
  ckpt::write_file_atomic(join(dir_, kRunFile), run_file_text(start.config, data_path_, data_sha256_));
  const std::string path = join(dir_, kMetricsFile);
  if (start.resumed) ckpt::write_file_atomic(path, metrics_resumed_at(path, start.progress.step, start.unlogged));
  metrics_fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | (start.resumed ? 0 : O_TRUNC), 0644);
  if (metrics_fd_ < 0)
    throw RuntimeError("cannot open " + path + ": " + std::strerror(errno) +
                       "; expected a writable --out-dir; check its permissions and free space");
}

void RunDir::write_metrics(const std::string& line) {
  const std::string path = join(dir_, kMetricsFile), bytes = line + "\n";
  struct stat st = {};
  const off_t before = ::fstat(metrics_fd_, &st) == 0 ? st.st_size : -1;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(metrics_fd_, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : ENOSPC;
      if (before >= 0 && ::ftruncate(metrics_fd_, before) != 0) {
        // the partial line stays; a resumed run drops it (metrics_resumed_at keeps whole lines)
      }
      throw RuntimeError("cannot write " + path + ": " + std::strerror(e));
    }
    done += (size_t)w;
  }
}

TrainHooks RunDir::hooks(const Backend& be, const Config& c, const std::vector<ParamSpec>& table) {
  TrainHooks h;
  if (!writer_) return h;
  h.metrics = [this](const std::string& line) { write_metrics(line); };
  h.checkpoint = [this, &be, c, table](const Progress& p, const std::vector<std::string>& unlogged) {
    return save(be, c, table, p, unlogged);
  };
  return h;
}

std::string RunDir::abandon() {
  if (!writer_ || !began_new_ || !ckpt::list_checkpoints(dir_).empty()) return "";
  if (metrics_fd_ >= 0) ::close(metrics_fd_);
  metrics_fd_ = -1;
  std::error_code ec;
  for (const char* name : {kMetricsFile, kRunFile, kLockFile}) fs::remove(join(dir_, name), ec);
  if (kept_tokenizer_) fs::remove_all(join(dir_, kTokenizerDir), ec);
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) fs::remove(*it, ec);  // each only when empty
  began_new_ = false;
  return "; the run begun in " + dir_ + " wrote no checkpoint and is removed: once the input is corrected, the same command starts it afresh";
}

std::string RunDir::save(const Backend& be, const Config& c, const std::vector<ParamSpec>& table, const Progress& p,
                         const std::vector<std::string>& unlogged) {
  ckpt::CheckpointInfo info;
  info.step = (uint32_t)p.step;
  info.steps_done = (uint32_t)p.updates;
  info.bad_steps = (uint32_t)p.bad_steps;
  info.config = c;
  info.config.resume = false;
  info.seed = c.seed;
  info.data_sha256 = data_sha256_;
  info.data_path = data_path_;
  info.vocab = vocab_;
  info.unlogged = unlogged;
  const Backend::HostState h = be.host_state();
  if (h.params) return ckpt::save_checkpoint(dir_, info, ckpt::StateView{h.params, h.m, h.v}, table);
  std::vector<float> params = be.params(), m, v;
  be.adam_state(m, v);
  return ckpt::save_checkpoint(dir_, info, ckpt::StateView{params.data(), m.data(), v.data()}, table);
}

}  // namespace tg
