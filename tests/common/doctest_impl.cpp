// tests/common/doctest_impl.cpp: doctest's implementation, compiled once (build/tests/common/) and
// linked into every test binary: test_cpu, test_gpu, test_emu and test_gemm_avx512. Each suite's
// runner (tests/cpu/main.cpp, tests/gpu/main.cu) holds only its main(). Compiled in each runner it
// cost 15 s of CPU a fresh build (the emulated suite's with its sanitizers 9 s, nvcc's 7 s, the CPU
// suite's 3 s), once 2.5 s; it is the test framework, not code under test, so it needs neither
// the emulator's flags nor nvcc.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
