// kernels/cpu/gemm.h: a single-precision matrix product for the CPU fast path, packed and
// register-blocked for AVX2 + FMA (kernels/cpu/gemm.cpp). The float linear layer
// (kernels/cpu/matmul.cpp) calls it; its spec is the plain sum
//   C[i, j] = (accumulate ? C[i, j] : 0) + sum_k A[i, k] B[k, j]
// checked against a double loop in tests/cpu/test_gemm.cpp.
//
// Operands are strided views of row-major buffers: element (i, k) of A at a[i * a_rs + k * a_cs],
// element (k, j) of B at b[k * b_rs + j * b_cs], so a transpose is a swap of the two strides.
// C is row-major with rows ldc apart and must not overlap A or B. Single-threaded: the CPU
// step runs one call sequence per thread on its slice of the batch (model/gpt_cpu.h). The
// packing buffers are per thread and kept between calls (no allocation once they have grown
// to the largest shape).
#pragma once

namespace cpu {

// True when this build has the AVX2 + FMA kernel (compiled with -mavx2 -mfma, e.g.
// -march=native on such a machine); without it gemm_f32 is a plain loop and matmul.cpp
// keeps Eigen's product.
#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kGemmF32Fast = true;
#else
constexpr bool kGemmF32Fast = false;
#endif

void gemm_f32(int M, int N, int K,
              const float* a, long a_rs, long a_cs,  // A (M, K)
              const float* b, long b_rs, long b_cs,  // B (K, N)
              float* c, long ldc,                    // C (M, N) = or +=
              bool accumulate);

}  // namespace cpu
