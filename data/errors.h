// data/errors.h: the two kinds of failure train_gpt reports. main() catches them, prints
// "error: <message>" as one line on stderr and exits 2 (InputError: bad usage or input,
// found before anything is written) or 1 (RuntimeError: a failure while running).
// Messages say what was wrong, what was expected and how to fix it.
// It lives in data/, the lowest part that throws them: data/ and every part of model/ include it.
#pragma once
#include <cstdio>
#include <stdexcept>
#include <string>

namespace tg {

struct InputError : std::runtime_error {
  explicit InputError(const std::string& m, bool every_rank = false) : std::runtime_error(m), every_rank(every_rank) {}
  // Thrown by every rank of a data-parallel job together, their collectives having agreed on it
  // (model/run/dist.h: first_error): the ranks then end side by side, rank 0 after taking back
  // what it began, and none ends the job before that (train_gpt.cu's main).
  bool every_rank;
};

struct RuntimeError : std::runtime_error {
  explicit RuntimeError(const std::string& m) : std::runtime_error(m) {}
};

// Throws InputError(m): for the readers that refuse bad bytes in many places.
[[noreturn]] inline void bad_input(const std::string& m) { throw InputError(m); }

// s with every byte that keep(byte) refuses written as \xNN, cut to at most max characters
// (then "...").
template <class Keep>
inline std::string escaped(const std::string& s, Keep keep, size_t max) {
  std::string out;
  for (unsigned char ch : s) {
    if (out.size() >= max) { out += "..."; break; }
    if (keep(ch)) {
      out += (char)ch;
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", ch);
      out += b;
    }
  }
  return out;
}

// Bytes read from a file or the command line, made safe for a one-line message: at most max
// characters, backslashes and bytes outside printable ASCII as \xNN.
inline std::string printable(const std::string& s, size_t max = 60) {
  return escaped(s, [](unsigned char ch) { return ch >= 0x20 && ch < 0x7f && ch != '\\'; }, max);
}

// A message as one line: its control characters (a newline in a path given, say) as \xNN,
// every other byte as it is (UTF-8 file names stay readable). main() prints errors through it.
inline std::string one_line(const std::string& s) {
  return escaped(s, [](unsigned char ch) { return ch >= 0x20 && ch != 0x7f; }, std::string::npos);
}

}  // namespace tg
