// tests/fuzz/fuzz_readers.cpp: the libFuzzer target over the readers of tests/fuzz/readers.h.
// Built by make with clang++ -fsanitize=fuzzer,address,undefined when that works, and run by
// make test for a bounded time from the seeds (tests/cpu/test_fuzz.cpp). Inputs that crash it
// go to tests/fuzz/regressions/, which the CPU suite replays.
#include "readers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::read_one(data, size);
  return 0;
}
