// tests/emu/child_process.h: running a piece of a test in a forked child process, for the
// emulator's tests whose subject ends the process (an AddressSanitizer or
// UndefinedBehaviorSanitizer report) or leaves the device's error sticky for the rest of it; and
// whether what a child said holds a phrase.
#pragma once
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../gpu/gpu_util.cuh"  // device_alloc, download

namespace tg_test {

struct ChildResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string err;     // what it wrote on stderr
};

// Runs body() in a forked child with its stderr captured; the child exits with body's value.
inline ChildResult in_child(const std::function<int()>& body) {
  char path[] = "/tmp/tg_emu_child_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fd, 2);
    const int rc = body();
    std::fflush(stderr);
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ChildResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  FILE* f = std::fopen(path, "r");
  char buf[4096];
  size_t n;
  while (f && (n = std::fread(buf, 1, sizeof buf, f)) > 0) r.err.append(buf, n);
  if (f) std::fclose(f);
  close(fd);
  std::remove(path);
  return r;
}

// Whether text (a child's stderr) holds what.
inline bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace tg_test
