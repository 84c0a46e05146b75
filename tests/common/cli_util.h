// tests/common/cli_util.h: what the tests of the binaries share (tests/cpu/test_cli.cpp,
// tests/cpu/test_run_dir.cpp, tests/emu/test_emu_cli.cpp): running train_gpt (path in
// TG_TRAIN_GPT, default ./train_gpt) or train_gpt_emu (TG_TRAIN_GPT_EMU, default
// ./train_gpt_emu) in the foreground or in the background, the data file (TG_DATA), fresh
// temp directories, the launch of MPI ranks.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../../data/tokens.h"
#include "../../model/run/dist.h"

namespace cli {

namespace fs = std::filesystem;

struct Run {
  int code;  // the exit status; 128 + N when killed by signal N (as the shell says), -1 otherwise
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A binary under test, as an absolute path (tests may change the working directory): $env,
// else fallback.
inline std::string exe_path(const char* env, const char* fallback) {
  const char* bin = std::getenv(env);
  return fs::absolute(bin ? bin : fallback).string();
}
inline std::string train_gpt_exe() { return exe_path("TG_TRAIN_GPT", "./train_gpt"); }
inline std::string train_gpt_emu_exe() { return exe_path("TG_TRAIN_GPT_EMU", "./train_gpt_emu"); }

inline std::string data_path() {
  const char* d = std::getenv("TG_DATA");
  return d ? d : "data/tinyshakespeare/input.txt";
}

// An empty path under the temp directory, unique to this process (removed if left over).
inline fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  return p;
}

// The stdout and stderr files of the n-th background or foreground run of this process, in a
// folder of its own that goes when the process exits (by the process that made it, not by a
// forked child that exits through exit()).
inline std::string io_file(const std::string& which, int n = 0) {
  static const struct IoDir {
    fs::path path = fs::temp_directory_path() / ("tg_cli_" + std::to_string(getpid()));
    pid_t owner = getpid();
    ~IoDir() {
      std::error_code ec;
      if (getpid() == owner) fs::remove_all(path, ec);
    }
  } dir;
  fs::create_directories(dir.path);
  return (dir.path / (which + std::to_string(n))).string();
}

inline int shell_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Runs the binary exe with a shell-quoted argument string, after a command prefix (e.g.
// "timeout ...", "cd DIR && ", "ulimit -f 16; ").
inline Run run_exe(const std::string& exe, const std::string& args, const std::string& prefix = "") {
  const std::string out = io_file("stdout"), err = io_file("stderr");
  int status = std::system((prefix + exe + " " + args + " >" + out + " 2>" + err).c_str());
  return Run{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

inline Run run_train_gpt_prefixed(const std::string& prefix, const std::string& args) {
  return run_exe(train_gpt_exe(), args, prefix);
}

inline Run run_train_gpt(const std::string& args) { return run_train_gpt_prefixed("", args); }

// train_gpt started in the background (exec'd by a shell, so pid is train_gpt's own, or that
// of the launcher a prefix names: "env VAR=1 mpirun -np 2 "); wait() gives its exit status and
// output.
struct Background {
  pid_t pid = -1;
  int n = 0;
  Background(const std::string& args, int slot, const std::string& prefix = "") : n(slot) {
    const std::string cmd =
        "exec " + prefix + train_gpt_exe() + " " + args + " >" + io_file("stdout", n) + " 2>" + io_file("stderr", n);
    pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
      _exit(127);
    }
  }
  bool running() const {
    siginfo_t info = {};
    return waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
  }
  Run wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    return Run{shell_code(status), slurp(io_file("stdout", n)), slurp(io_file("stderr", n))};
  }
};

// The launch of `ranks` MPI ranks of one OpenMP thread each ("env OMP_NUM_THREADS=1 mpirun
// -np N ... "; the single-process runs compared with them take one thread too), or "" when
// they cannot run here: this build has no MPI (model/run/dist.h) or mpirun is not on PATH.
// The ranks' leak check is off (make sanitize's AddressSanitizer build; ignored otherwise): Open
// MPI keeps allocations of its components past MPI_Finalize, which unloads them, so
// LeakSanitizer reports them from frames it cannot name or suppress, and fails every rank.
inline std::string mpirun(int ranks) {
  if (!tg::dist::built_with_mpi() || std::system("command -v mpirun >/dev/null 2>&1") != 0) return "";
  return "env OMP_NUM_THREADS=1 LSAN_OPTIONS=detect_leaks=0 mpirun -np " + std::to_string(ranks) + " --oversubscribe" +
         (geteuid() == 0 ? " --allow-run-as-root" : "") + " -x OMP_NUM_THREADS -x LSAN_OPTIONS ";
}

// An llm.c shard (data/tokens.h) of tokens written at path (its folders made): the header of 256
// int32 (magic, version 1, the count), then the uint16 tokens.
inline void write_shard(const fs::path& path, const std::vector<uint16_t>& tokens) {
  std::string b(1024 + 2 * tokens.size(), '\0');
  const int32_t head[3] = {data::kShardMagic, 1, (int32_t)tokens.size()};
  std::memcpy(&b[0], head, sizeof head);
  if (!tokens.empty()) std::memcpy(&b[1024], tokens.data(), 2 * tokens.size());
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << b;
}

inline int count_lines(const std::string& s) {
  int n = 0;
  for (char ch : s) n += ch == '\n';
  return n;
}

}  // namespace cli
