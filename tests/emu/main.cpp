// tests/emu/main.cpp: the doctest runner of the emulated-kernel suite (build/test_emu).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
