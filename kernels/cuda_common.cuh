// kernels/cuda_common.cuh: what every CUDA op of train_gpt shares.
//   - the check macros cudaCheck / cublasCheck / curandCheck / ncclCheck (cublasCheck where the
//     cuBLAS headers are included, ncclCheck where nccl.h is): a failing call throws
//     gpu::CudaError naming the call, the file and the line (model/ turns it into one line on
//     stderr and exit 1);
//   - gpu::Context: the one stream, the cuBLAS / cuBLASLt handles, the cuBLAS workspace and
//     the op scratch buffer, made once per backend and passed by reference to every launcher
//     (no hidden globals);
//   - the activation types (float, or __nv_bfloat16 for --precision bf16) and their
//     conversions to and from float, which is what every kernel computes in;
//   - gpu::launch, the one way a kernel is launched (the SIMT emulator of tests/emu takes it
//     over in the emulator build), and dynamic_smem<T>(), a kernel's dynamic shared memory;
//   - small launch helpers (ceil_div, grid sizes) and the warp / block reductions in a fixed
//     order (so that a reduction is bitwise the same on every run: no float atomics anywhere);
//   - the spacing of the regions carved out of one allocation (model/net/gpt_cuda.cu), which the
//     emulator build widens into poisoned gaps.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace gpu {

struct CudaError : std::runtime_error {
  explicit CudaError(const std::string& m) : std::runtime_error(m) {}
};

[[noreturn]] void throw_cuda_error(const char* what, const char* call, const char* file, int line);
// A launch that failed: names the kernel (cudaFuncGetName, demangled) and its configuration.
[[noreturn]] void throw_launch_error(cudaError_t e, const void* kernel, dim3 grid, dim3 block, size_t smem);

}  // namespace gpu

// The static switch: runs the lambda __VA_ARGS__ with `constexpr static bool NAME` equal to COND,
// so that a runtime flag becomes a template parameter in one place, the launcher (as
// FlashAttention-2's static_switch.h). The one switch of every kernel file.
#define BOOL_SWITCH(COND, NAME, ...)      \
  [&] {                                   \
    if (COND) {                           \
      constexpr static bool NAME = true;  \
      return __VA_ARGS__();               \
    } else {                              \
      constexpr static bool NAME = false; \
      return __VA_ARGS__();               \
    }                                     \
  }()

#define cudaCheck(call)                                                                           \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) ::gpu::throw_cuda_error(cudaGetErrorString(e_), #call, __FILE__, __LINE__); \
  } while (0)

#define cublasCheck(call)                                                                         \
  do {                                                                                            \
    cublasStatus_t s_ = (call);                                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                              \
      ::gpu::throw_cuda_error(cublasGetStatusString(s_), #call, __FILE__, __LINE__);              \
  } while (0)

#define curandCheck(call)                                                                         \
  do {                                                                                            \
    int s_ = (int)(call);                                                                         \
    if (s_ != 0) ::gpu::throw_cuda_error(("curandStatus " + std::to_string(s_)).c_str(), #call,  \
                                         __FILE__, __LINE__);                                     \
  } while (0)

#define ncclCheck(call)                                                                           \
  do {                                                                                            \
    ncclResult_t r_ = (call);                                                                     \
    if (r_ != ncclSuccess) ::gpu::throw_cuda_error(ncclGetErrorString(r_), #call, __FILE__, __LINE__); \
  } while (0)

// The cuBLAS / cuBLASLt handle types, declared as their headers declare them: only the files
// that call the libraries (kernels/matmul.cu, kernels/attention_naive.cu, kernels/cuda_common.cu)
// include those headers, which cost every other translation unit a second of compile time.
struct cublasContext;
typedef struct cublasContext* cublasHandle_t;
struct cublasLtContext;
typedef struct cublasLtContext* cublasLtHandle_t;

namespace gpu {

using bf16 = __nv_bfloat16;

enum class Precision { FP32, BF16 };

// kernels/matmul.cu's cache of cuBLASLt plans (descriptors and algorithm per GEMM shape), made
// and freed with the context; and its count of which path each forward took.
struct LtPlanCache;
LtPlanCache* new_lt_plan_cache();
void delete_lt_plan_cache(LtPlanCache* c);
struct MatmulPathCounts {
  size_t lt = 0, fallback = 0;
};

// One per backend: made once, before any allocation of the step, destroyed last.
struct Context {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* cublas_workspace = nullptr;  // for cuBLAS / cuBLASLt (kCublasWorkspaceBytes)
  size_t cublas_workspace_bytes = 0;
  LtPlanCache* lt_plans = nullptr;  // the matmul forward's Lt plans, made on first use of a shape
  void* scratch = nullptr;  // op scratch (partial sums, sort buffers, attention tiles)
  size_t scratch_bytes = 0;  // the maximum of every op's <op>_scratch_bytes() for the run
  int device = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  size_t smem_per_block_optin = 0;  // the most dynamic shared memory a block may opt in to
  Precision precision = Precision::BF16;

  // Sets up the stream, the handles and the cuBLAS workspace on the current device, and
  // allocates scratch_bytes of op scratch. Throws CudaError.
  void create(size_t scratch_bytes);
  void destroy();
};

constexpr size_t kCublasWorkspaceBytes = 32u << 20;

// ---- the activation types ------------------------------------------------------------------
// Kernels are templated on the storage type T of activations (float or bf16) and compute in
// float. Parameter gradients, master weights, AdamW moments, layernorm statistics and losses
// are always float.
__host__ __device__ __forceinline__ float to_float(float x) { return x; }
__host__ __device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
template <typename T>
__host__ __device__ __forceinline__ T from_float(float x);
template <>
__host__ __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__host__ __device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }

// cuBLAS data type of a storage type.
template <typename T>
constexpr cudaDataType_t cuda_type();
template <>
constexpr cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <>
constexpr cudaDataType_t cuda_type<bf16>() { return CUDA_R_16BF; }

// Unit roundoff of a storage type: 2^-24 for float, 2^-8 for bf16 (tolerances derive from it).
template <typename T>
constexpr double unit_roundoff();
template <>
constexpr double unit_roundoff<float>() { return 5.9604644775390625e-8; }
template <>
constexpr double unit_roundoff<bf16>() { return 3.90625e-3; }

// ---- launching -----------------------------------------------------------------------------
// Dynamic shared memory a kernel may use without opting in (cudaFuncSetAttribute).
constexpr size_t kDefaultSmemBytes = 48 * 1024;

// The one launch path of train_gpt: kernel<<<grid, block, smem, stream>>>(args...), the
// arguments converted to the kernel's parameter types as by a call. Opts the kernel in to more
// than 48 KB of dynamic shared memory when smem needs it, and checks the launch at once (a bad
// configuration throws here, not at the next synchronisation). In the emulator build
// (TG_SIMT_EMULATION, tests/emu/simt_emulator.h) the same call hands the kernel to the
// emulator; under nvcc it is the plain launch (the device code does not change).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "gpu::launch: wrong number of kernel arguments");
  if (smem > kDefaultSmemBytes)
    cudaCheck(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem));
#ifndef TG_SIMT_EMULATION
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
#else
  emu::launch_kernel(kernel, grid, block, smem, stream, std::forward<Args>(args)...);
#endif
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_launch_error(e, reinterpret_cast<const void*>(kernel), grid, block, smem);
}

#ifndef TG_SIMT_EMULATION
// The launch's dynamic shared memory, 16-byte aligned (the emulator provides its own).
template <typename T>
__device__ __forceinline__ T* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char tg_dynamic_smem[];
  return reinterpret_cast<T*>(tg_dynamic_smem);
}
#endif

// Regions carved out of one device allocation (model/net/gpt_cuda.cu) are kRegionGapBytes apart,
// and mark_no_access(gap) makes each gap untouchable. On a GPU the gap is 0 and the call does
// nothing; in the emulator build every gap (and the alignment padding) is poisoned, so a buffer
// that overruns its region is reported at its first byte past the end instead of silently
// writing into its neighbour.
#ifdef TG_SIMT_EMULATION
constexpr size_t kRegionGapBytes = 4096;
inline void mark_no_access(const void* p, size_t bytes) { emu::mark_no_access(p, bytes); }
#else
constexpr size_t kRegionGapBytes = 0;
inline void mark_no_access(const void*, size_t) {}
#endif

__host__ __device__ constexpr inline long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// A 1-D grid of `threads`-wide blocks covering n elements, capped (kernels loop with a
// grid-stride) so that n may exceed 2^31.
inline unsigned grid_1d(size_t n, int threads) {
  long long blocks = ceil_div((long long)n, threads);
  return (unsigned)(blocks < 65535LL * 32 ? (blocks > 0 ? blocks : 1) : 65535LL * 32);
}

// P values of T moved as one aligned vector (16 bytes: 8 bf16 or 4 float), and whether a
// pointer allows it.
template <typename T, int P>
struct alignas(sizeof(T) * P) Pack {
  T v[P];
};
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Sum over a warp, in a fixed butterfly order: every lane gets the same bits on every run.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024), fixed order;
// every thread gets the result. shared must hold 32 values; the function syncs.
template <typename F>
__device__ __forceinline__ F block_sum(F v, F* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : F(0);
  return warp_sum(v);
}

// Max over a block, as block_sum (every thread gets it; -inf for an empty block).
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace gpu
