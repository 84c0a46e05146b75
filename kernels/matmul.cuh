// kernels/matmul.cuh: the linear layer y = x W^T + b on the GPU (cuBLASLt / cuBLAS), PyTorch
// Linear layout: weight is (OC, C) row-major. CPU twin: kernels/cpu/matmul.h.
// forward overwrites out; backward accumulates (+=) into dinp, dweight, dbias.
// T is the activation storage type (float or gpu::bf16); dweight and dbias are always float.
#pragma once
#include <cstddef>

#include "cuda_common.cuh"

namespace gpu {

template <typename T>
void matmul_forward(const Context& ctx,
                    T* out,           // (N, OC)
                    const T* inp,     // (N, C)
                    const T* weight,  // (OC, C)
                    const T* bias,    // (OC) or null
                    int N, int C, int OC);

template <typename T>
void matmul_backward(const Context& ctx,
                     T* dinp,          // (N, C)  += or null
                     float* dweight,   // (OC, C) +=
                     float* dbias,     // (OC)    += or null
                     const T* dout,    // (N, OC)
                     const T* inp,     // (N, C)
                     const T* weight,  // (OC, C)
                     int N, int C, int OC);

// ctx.scratch needed by matmul_backward (the per-block partial sums of dbias).
size_t matmul_scratch_bytes(int N, int OC);

// How many matmul_forward calls of a context took the cuBLASLt path and how many the
// cublasGemmEx fallback (kernels/matmul.cu says when each is taken): for the tests.
MatmulPathCounts matmul_path_counts(const Context& ctx);

}  // namespace gpu
