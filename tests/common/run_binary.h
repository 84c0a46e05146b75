// tests/common/run_binary.h: running train_gpt (or train_gpt_emu) from a test: the binary's
// path from an environment variable (the Makefile sets TG_TRAIN_GPT, TG_TRAIN_GPT_EMU), its exit
// status, stdout and stderr; the data file (TG_DATA); fresh per-process temporary directories.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tg_test {

struct Run {
  int code;  // exit status, -1 when killed by a signal
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs the binary named by $env (else `fallback`) with a shell-quoted argument string, after a
// command prefix (e.g. "timeout 5 ").
inline Run run_binary(const char* env, const char* fallback, const std::string& args,
                      const std::string& prefix = "") {
  const char* bin = std::getenv(env);
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tg_run_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
  const int status = std::system((prefix + (bin ? bin : fallback) + " " + args + " >" + out + " 2>" + err).c_str());
  return Run{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

inline std::string data_path() {
  const char* d = std::getenv("TG_DATA");
  return d ? d : "data/tinyshakespeare/input.txt";
}

// An empty path under the temp directory, unique to this process (removed if left over).
inline std::filesystem::path fresh_dir(const std::string& name) {
  std::filesystem::path p = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(p);
  return p;
}

}  // namespace tg_test
