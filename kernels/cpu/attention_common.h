// kernels/cpu/attention_common.h: what the two CPU attention paths share.
#pragma once

namespace cpu {

// OpenMP over (b, h) only when there is enough work: a parallel region costs microseconds
// (much more on a loaded machine), which would dominate the tiny shapes of the tests.
inline bool attention_parallel_worth_it(int B, int NH, int Tn, int HS) {
  return (long)B * NH * Tn * Tn * HS >= (1L << 16);
}

}  // namespace cpu
