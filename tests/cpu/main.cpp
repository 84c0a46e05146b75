// tests/cpu/main.cpp: the doctest runner of the CPU suite (build/test_cpu).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
