// kernels/cpu/gemm.h: a single-precision matrix product for the CPU fast path, packed and
// register-blocked for AVX-512F or AVX2 (with FMA), whichever the build targets
// (kernels/cpu/gemm.cpp). The float linear layer (kernels/cpu/matmul.cpp) calls it; its spec
// is the plain sum
//   C[i, j] = (accumulate ? C[i, j] : 0) + sum_k A[i, k] B[k, j]
// checked against a double loop in tests/cpu/test_gemm.cpp.
//
// Operands are strided views of row-major buffers: element (i, k) of A at a[i * a_rs + k * a_cs],
// element (k, j) of B at b[k * b_rs + j * b_cs], so a transpose is a swap of the two strides.
// C is row-major with rows ldc apart and must not overlap A or B. Single-threaded: the CPU
// step runs one call sequence per thread on its slice of the batch (model/net/gpt_cpu.h). The
// packing buffers are per thread and kept between calls (no allocation once they have grown
// to the largest shape).
#pragma once

namespace cpu {

// True when this build has a vector kernel (compiled with -mavx2 -mfma or -mavx512f, e.g.
// -march=native on such a machine); without one gemm_f32 is portable C++ and matmul.cpp
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

// The kernels behind gemm_f32, for the tests and build/bench_gemm. Portable8 and Portable16 are
// the AVX2 and the AVX-512 kernels' tilings and summation orders in portable C++ (one std::fma
// per lane): on any machine they compute, bit for bit, what Avx2 and Avx512 compute where they
// run. gemm_f32 uses gemm_kernel_native(): Avx512 in a build for AVX-512F + FMA, else Avx2 in
// a build for AVX2 + FMA, else Portable8.
enum class GemmKernel { Avx2, Avx512, Portable8, Portable16 };
GemmKernel gemm_kernel_native();
bool gemm_kernel_built(GemmKernel k);
const char* gemm_kernel_name(GemmKernel k);
// gemm_f32 with the given kernel; throws std::invalid_argument when it is not built
void gemm_f32_using(GemmKernel k, int M, int N, int K, const float* a, long a_rs, long a_cs, const float* b,
                    long b_rs, long b_cs, float* c, long ldc, bool accumulate);

}  // namespace cpu
