// kernels/cuda_common.cu: the error path of the check macros and gpu::Context (see
// kernels/cuda_common.cuh).
#include "cuda_common.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>

namespace gpu {

namespace {
// What every CUDA failure's message ends with: what was expected and the way round it.
const char* kCudaAdvice =
    "; expected the GPU to run train_gpt's CUDA code (an error of an earlier kernel shows at the next synchronising "
    "call: CUDA_LAUNCH_BLOCKING=1 names it); pass --device cpu to train on the CPU meanwhile";
}  // namespace

void throw_cuda_error(const char* what, const char* call, const char* file, int line) {
  char buf[1024];
  std::snprintf(buf, sizeof buf, "CUDA call failed: %s (%s at %s:%d)%s", what, call, file, line, kCudaAdvice);
  throw CudaError(buf);
}

void throw_launch_error(cudaError_t e, const void* kernel, dim3 grid, dim3 block, size_t smem) {
  const char* mangled = nullptr;
  std::string name = "(unnamed)";
#if CUDART_VERSION >= 12030  // cudaFuncGetName came with CUDA 12.3
  if (cudaFuncGetName(&mangled, kernel) == cudaSuccess && mangled) {
    int status = 0;
    char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    name = status == 0 && d ? d : mangled;
    std::free(d);
  }
  cudaGetLastError();  // the name query's own error, if any, is not the launch's
#else
  (void)kernel;
  (void)mangled;
#endif
  char buf[1024];
  std::snprintf(buf, sizeof buf, "CUDA kernel launch failed: %s (kernel %s, grid (%u,%u,%u), block (%u,%u,%u), %zu bytes of dynamic shared memory)%s",
                cudaGetErrorString(e), name.c_str(), grid.x, grid.y, grid.z, block.x, block.y, block.z, smem, kCudaAdvice);
  throw CudaError(buf);
}

void Context::create(size_t scratch) {
  cudaCheck(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  cudaCheck(cudaGetDeviceProperties(&prop, device));
  sm_count = prop.multiProcessorCount;
  cc_major = prop.major;
  cc_minor = prop.minor;
  smem_per_block_optin = prop.sharedMemPerBlockOptin;
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
