// kernels/cublas_loader.h: how the CUDA build reaches cuBLAS and cuBLASLt (opened on first use,
// kernels/cublas_loader.cu), for its tests. Not in the emulated build.
#pragma once

namespace gpu {

enum class CublasLib { Blas, Lt };

// "libcublas.so.13" and "libcublasLt.so.13" for the cuBLAS the build's headers are
extern const char* const kCublasSoname;
extern const char* const kCublasLtSoname;

// dlopen(soname); throws tg::RuntimeError naming it, why, and how to fix it where it cannot
void* open_library(const char* soname);

// The symbol `name` of the library (each opened the first time); throws tg::RuntimeError where
// the library or the symbol is missing.
void* cublas_symbol(CublasLib lib, const char* name);

}  // namespace gpu

// Every cuBLAS and cuBLASLt function the program calls, as X(LIB, RET, NAME, PARAMS, ARGS) with
// the declaration of cublas_api.h or cublasLt.h: kernels/cublas_loader.cu defines each, the
// tests look each up. A call to one not listed fails the link.
#define TG_CUBLAS_FUNCTIONS(X) \
  X(Blas, cublasStatus_t, cublasCreate_v2, (cublasHandle_t * handle), (handle)) \
  X(Blas, cublasStatus_t, cublasDestroy_v2, (cublasHandle_t handle), (handle)) \
  X(Blas, cublasStatus_t, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), \
      (handle, stream)) \
  X(Blas, cublasStatus_t, cublasSetWorkspace_v2, (cublasHandle_t handle, void* ws, size_t bytes), \
      (handle, ws, bytes)) \
  X(Blas, cublasStatus_t, cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode), (handle, mode)) \
  X(Blas, const char*, cublasGetStatusString, (cublasStatus_t status), (status)) \
  X(Blas, cublasStatus_t, cublasGemmEx, \
      (cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, \
      const void* alpha, const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt, int ldb, \
      const void* beta, void* C, cudaDataType ct, int ldc, cublasComputeType_t compute, \
      cublasGemmAlgo_t algo), \
      (handle, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo)) \
  X(Blas, cublasStatus_t, cublasGemmStridedBatchedEx, \
      (cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, \
      const void* alpha, const void* A, cudaDataType at, int lda, long long int sa, const void* B, \
      cudaDataType bt, int ldb, long long int sb, const void* beta, void* C, cudaDataType ct, int ldc, \
      long long int sc, int batches, cublasComputeType_t compute, cublasGemmAlgo_t algo), \
      (handle, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batches, \
      compute, algo)) \
  X(Lt, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle)) \
  X(Lt, cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t handle), (handle)) \
  X(Lt, cublasStatus_t, cublasLtMatmul, \
      (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A, \
      cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta, const void* C, \
      cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t* algo, \
      void* ws, size_t ws_bytes, cudaStream_t stream), \
      (handle, desc, alpha, A, a, B, b, beta, C, c, D, d, algo, ws, ws_bytes, stream)) \
  X(Lt, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic, \
      (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, \
      cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, \
      cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[], \
      int* returned), \
      (handle, desc, a, b, c, d, pref, requested, results, returned)) \
  X(Lt, cublasStatus_t, cublasLtMatmulDescCreate, \
      (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale), \
      (desc, compute, scale)) \
  X(Lt, cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc)) \
  X(Lt, cublasStatus_t, cublasLtMatmulDescSetAttribute, \
      (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t bytes), \
      (desc, attr, buf, bytes)) \
  X(Lt, cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref)) \
  X(Lt, cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref)) \
  X(Lt, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute, \
      (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf, \
      size_t bytes), \
      (pref, attr, buf, bytes)) \
  X(Lt, cublasStatus_t, cublasLtMatrixLayoutCreate, \
      (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld), \
      (layout, type, rows, cols, ld)) \
  X(Lt, cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
