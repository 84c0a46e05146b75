// kernels/cuda_common.cu: the error path of the check macros and gpu::Context (see
// kernels/cuda_common.cuh).
#include "cuda_common.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdio>

namespace gpu {

void throw_cuda_error(const char* what, const char* call, const char* file, int line) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "CUDA call failed: %s (%s at %s:%d)", what, call, file, line);
  throw CudaError(buf);
}

void Context::create(size_t scratch) {
  cudaCheck(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  cudaCheck(cudaGetDeviceProperties(&prop, device));
  sm_count = prop.multiProcessorCount;
  cc_major = prop.major;
  cc_minor = prop.minor;
  cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasCheck(cublasCreate(&cublas));
  cublasCheck(cublasSetStream(cublas, stream));
  cublasCheck(cublasLtCreate(&lt));
  lt_plans = new_lt_plan_cache();
  cublas_workspace_bytes = kCublasWorkspaceBytes;
  cudaCheck(cudaMalloc(&cublas_workspace, cublas_workspace_bytes));
  cublasCheck(cublasSetWorkspace(cublas, cublas_workspace, cublas_workspace_bytes));
  // TF32 stays off: fp32 runs are compared tightly with the CPU reference.
  cublasCheck(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));
  scratch_bytes = scratch;
  if (scratch_bytes) cudaCheck(cudaMalloc(&this->scratch, scratch_bytes));
}

void Context::destroy() {
  // errors are ignored here: this runs from destructors, possibly while unwinding
  if (scratch) cudaFree(scratch);
  if (cublas_workspace) cudaFree(cublas_workspace);
  if (lt_plans) delete_lt_plan_cache(lt_plans);  // its descriptors go before the handle
  if (lt) cublasLtDestroy(lt);
  if (cublas) cublasDestroy(cublas);
  if (stream) cudaStreamDestroy(stream);
  *this = Context{};
}

}  // namespace gpu
