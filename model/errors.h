// model/errors.h: the two kinds of failure train_gpt reports. main() catches them, prints
// "error: <message>" as one line on stderr and exits 2 (InputError: bad usage or input,
// found before anything is written) or 1 (RuntimeError: a failure while running).
// Messages say what was wrong, what was expected and how to fix it.
#pragma once
#include <stdexcept>
#include <string>

namespace tg {

struct InputError : std::runtime_error {
  explicit InputError(const std::string& m) : std::runtime_error(m) {}
};

struct RuntimeError : std::runtime_error {
  explicit RuntimeError(const std::string& m) : std::runtime_error(m) {}
};

}  // namespace tg
