// tests/cpu/main.cpp: the doctest runner of the CPU suite (build/test_cpu); doctest itself is
// tests/common/doctest_impl.cpp.
#include <doctest/doctest.h>

int main(int argc, char** argv) { return doctest::Context(argc, argv).run(); }
