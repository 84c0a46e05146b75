// kernels/cpu/real.h: the one floating type a build of the CPU reference instantiates. Each
// kernels/cpu/*.cpp ends with its explicit instantiations, written once for Real: float in
// train_gpt and the tests' own objects, double in the objects the Makefile compiles again from
// the same files with TG_CPU_DOUBLE (CPU_DOUBLE_OBJS: the tests' gradient checks and fp64
// references).
#pragma once

namespace cpu {

#ifdef TG_CPU_DOUBLE
using Real = double;
#else
using Real = float;
#endif

}  // namespace cpu
