// tests/emu/cublas_emu.cpp: cuBLAS and cuBLASLt of the emulator build, for exactly the entry
// points train_gpt calls (and the Lt layout attributes its tests use); linked in place of
// libcublas / libcublasLt.
//
// The arithmetic is not ours: every GEMM is handed to the reference BLAS (Debian's libblas,
// column-major sgemm_) with the same meaning. Operands stored as bf16 are widened to fp32
// (exact), the fp32 result is rounded once to the output type (round to nearest even), as
// CUBLAS_COMPUTE_32F specifies (fp32 accumulation), except where C is bf16 and beta != 0: then
// alpha op(A) op(B) is rounded to bf16 first, beta C added in fp32 and the sum rounded again, as
// cuBLAS 13.1 does on an H100 (every cublasGemmEx and cublasLtMatmul algorithm measured there,
// at the shapes of tests/gpu/test_matmul_gpu.cu and train_gpt's: up to a quarter of the elements
// agree only with the two roundings; CUBLAS_COMPUTE_32F_PEDANTIC rounds once but is 10-20 times
// slower, so train_gpt does not ask for it); with CUBLAS_COMPUTE_32F_FAST_TF32, or the
// handle's math mode CUBLAS_TF32_TENSOR_OP_MATH, fp32 inputs are first rounded to TF32 (10
// mantissa bits), as the tensor cores would. A strided-batched call is a loop over the batch
// at the documented strides. cuBLASLt's D = epilogue(alpha op(A) op(B) + beta C): BIAS adds
// bias[row] (a vector of D's rows, of D's type unless BIAS_DATA_TYPE says otherwise) before the
// one rounding, GELU applies the tanh-approximated GELU after it is added; layouts may be
// column- or row-ordered, batched with a stride. Other epilogues are CUBLAS_STATUS_NOT_SUPPORTED.
//
// Checks, as the library documents them: a null handle is CUBLAS_STATUS_NOT_INITIALIZED;
// negative sizes, leading dimensions below their minimum, inconsistent Lt layouts or an unknown
// attribute are CUBLAS_STATUS_INVALID_VALUE; a type combination outside the table of
// cublasGemmEx for CUBLAS_COMPUTE_32F (A, B fp32 or bf16 alike; C fp32, or bf16 with bf16
// inputs) is CUBLAS_STATUS_NOT_SUPPORTED. Beyond the library: every operand's extent (rows,
// columns, leading dimension, batch stride and count) is checked against its device allocation
// before the call is queued; one out of range (or a host pointer) is a device fault, reported at
// once (sticky cudaErrorIllegalAddress) and the call returns CUBLAS_STATUS_EXECUTION_FAILED.
// The algorithm that cublasLtMatmulAlgoGetHeuristic returns remembers the alignments it was
// chosen for (the MIN_ALIGNMENT preferences, 256 bytes by default, and the bias pointer's own
// alignment at the query, which the documentation says the heuristic looks at); cublasLtMatmul
// with a pointer less aligned than that is a misaligned-address fault, as such an algorithm's
// vector loads would be on the device. TG_EMU_CUBLASLT_NO_ALGORITHM=1 makes the heuristic find
// no algorithm for any problem (count 0, CUBLAS_STATUS_NOT_SUPPORTED, as cuBLASLt answers a
// problem it has none for), so that a program's own fallback runs (make test runs train_gpt_emu
// so under racecheck: tests/emu/test_emu_cli.cpp).
//
// The work is queued on the handle's stream (cublasSetStream) or the Lt call's stream, and runs
// when the host synchronises with it (tests/emu/cuda_runtime_emu.cpp).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "access_hook.h"
#include "emu_internal.h"
#include "hw_rounding.h"

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc, size_t, size_t);

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};
struct cublasLtContext {
  int unused = 0;
};

namespace emu {
namespace {

constexpr uint64_t kAlgoMagic = 0x7467656d75616c67ull;  // identifies an algo from this heuristic

size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 0; }

float load(const void* base, cudaDataType t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(base)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}
void store(void* base, cudaDataType t, size_t i, float v) {
  if (t == CUDA_R_32F) static_cast<float*>(base)[i] = v;
  else static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
}

// fp32 rounded to TF32 (19 bits: 10 of mantissa), round to nearest even; inf / NaN kept.
float tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  std::memcpy(&x, &u, 4);
  return x;
}

// A matrix as stored: rows x cols, leading dimension ld, column-major (or row-major), batched.
struct Mat {
  const void* ptr = nullptr;
  cudaDataType type = CUDA_R_32F;
  int64_t rows = 0, cols = 0, ld = 0;
  bool row_major = false;
  int batch = 1;
  int64_t stride = 0;  // elements between batch entries
  // elements from ptr to one past the last element any batch entry touches
  int64_t extent() const {
    if (rows == 0 || cols == 0 || batch == 0) return 0;
    const int64_t one = row_major ? (rows - 1) * ld + cols : (cols - 1) * ld + rows;
    return (int64_t)(batch - 1) * stride + one;
  }
  size_t index(int b, int64_t r, int64_t c) const {
    return (size_t)(b * stride + (row_major ? r * ld + c : c * ld + r));
  }
};

// Checks a matrix operand against device memory; a fault otherwise.
bool check_extent(const Mat& m, const char* who, const char* name) {
  const int64_t n = m.extent();
  if (n == 0) return true;
  std::string why;
  if (device_range_ok(m.ptr, (size_t)n * type_size(m.type), &why)) return true;
  set_sticky_error(cudaErrorIllegalAddress, std::string(who) + ": operand " + name + " (" + std::to_string(m.rows) +
                                                " x " + std::to_string(m.cols) + ", ld " + std::to_string(m.ld) +
                                                ", batch " + std::to_string(m.batch) + ") " + why);
  return false;
}

// The column-major fp32 copy of matrix b of m, as sgemm reads it (row-major copies are
// transposed, so the copy is always column-major with ld = rows), into f.
void widen(const Mat& m, int b, bool to_tf32, std::vector<float>& f) {
  f.resize((size_t)(m.rows * m.cols));
  for (int64_t c = 0; c < m.cols; ++c)
    for (int64_t r = 0; r < m.rows; ++r) {
      const float v = load(m.ptr, m.type, m.index(b, r, c));
      f[(size_t)(c * m.rows + r)] = to_tf32 ? tf32(v) : v;
    }
}

// A GEMM's fp32 copies, kept from one GEMM to the next: a fresh vector each time was, above
// AddressSanitizer's largest size class, a fresh mapping whose pages the kernel zeroed and
// unmapped again (page faults and memset were about 8% of the 20-step model test in the
// hardware-rounding mode).
struct Scratch {
  std::vector<float> a, b, start, c, rows, cols, dots;
};
Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

// One GEMM of the batch: D = alpha op(A) op(B) + beta C, then the bias and GELU epilogues, then
// the rounding to D's type. A, B, C, D as stored; C may be D.
struct Gemm {
  bool ta = false, tb = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  Mat A, B, C, D;
  bool tf32 = false;
  const void* bias = nullptr;
  cudaDataType bias_type = CUDA_R_32F;
  bool gelu = false;

  void run() const {
    for (int b = 0; b < D.batch; ++b) {
      Scratch& s = scratch();
      const std::vector<float>& a = s.a;
      const std::vector<float>& bm = s.b;
      const std::vector<float>& start = s.start;
      std::vector<float>& c = s.c;
      widen(A, b, tf32, s.a);
      widen(B, b, tf32, s.b);
      // a start value in bf16: the product is rounded to bf16 before beta C is added (below)
      const bool round_product = beta != 0 && D.type == CUDA_R_16BF;
      if (round_product) widen(C, b, false, s.start);
      const float beta_gemm = round_product ? 0.f : beta;
      if (beta_gemm != 0) widen(C, b, false, c);
      else c.assign((size_t)m * n, 0.f);
      const char opa = ta ? 'T' : 'N', opb = tb ? 'T' : 'N';
      const int lda = (int)std::max<int64_t>(1, A.rows), ldb = (int)std::max<int64_t>(1, B.rows),
                ldc = std::max(1, m);
      const int block = A.type == CUDA_R_16BF ? hw_rounding_block() : 0;
      if (block) {  // bf16 on the tensor cores, as they round (tests/emu/hw_rounding.h): k in order
        // op(A)'s rows and op(B)'s columns, each gathered once, k contiguous
        std::vector<float>& rows = s.rows;
        std::vector<float>& cols = s.cols;
        std::vector<float>& dots = s.dots;
        rows.resize((size_t)m * k);
        cols.resize((size_t)n * k);
        for (int i = 0; i < m; ++i)
          for (int kk = 0; kk < k; ++kk)
            rows[(size_t)i * k + kk] = ta ? a[(size_t)i * lda + kk] : a[(size_t)kk * lda + i];
        for (int j = 0; j < n; ++j)
          for (int kk = 0; kk < k; ++kk)
            cols[(size_t)j * k + kk] = tb ? bm[(size_t)kk * ldb + j] : bm[(size_t)j * ldb + kk];
        dots.resize((size_t)n);
        for (int i = 0; i < m; ++i) {
          std::fill(dots.begin(), dots.end(), 0.f);
          tensor_core_dots(dots.data(), n, rows.data() + (size_t)i * k, 1, cols.data(), k, 1, k, block);
          for (int j = 0; j < n; ++j) {
            float& cij = c[(size_t)j * m + i];
            cij = alpha * dots[(size_t)j] + (beta_gemm != 0 ? beta_gemm * cij : 0.f);
          }
        }
      } else if (m > 0 && n > 0) {
        sgemm_(&opa, &opb, &m, &n, &k, &alpha, a.data(), &lda, bm.data(), &ldb, &beta_gemm, c.data(), &ldc, 1, 1);
      }
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
          float v = c[(size_t)j * m + i];
          if (round_product) v = __bfloat162float(__float2bfloat16(v)) + beta * start[(size_t)j * m + i];
          if (bias) v += load(bias, bias_type, (size_t)i);
          if (gelu) v = 0.5f * v * (1.f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
          store(const_cast<void*>(D.ptr), D.type, D.index(b, i, j), v);
        }
      if (g_observed) {  // D's elements, a contiguous run per column (per row when row-major)
        const int64_t runs = D.row_major ? m : n, len = D.row_major ? n : m;
        for (int64_t r = 0; r < runs; ++r)
          notify_device_written(static_cast<const unsigned char*>(D.ptr) +
                                    D.index(b, D.row_major ? r : 0, D.row_major ? 0 : r) * type_size(D.type),
                                (size_t)len * type_size(D.type));
      }
    }
  }
};

// The cublasGemmEx type table for CUBLAS_COMPUTE_32F that train_gpt can use.
bool types_supported(cudaDataType a, cudaDataType b, cudaDataType c) {
  if (a != b) return false;
  if (a == CUDA_R_32F) return c == CUDA_R_32F;
  if (a == CUDA_R_16BF) return c == CUDA_R_16BF || c == CUDA_R_32F;
  return false;
}

bool compute_supported(cublasComputeType_t ct, cudaDataType a, bool* tf32) {
  *tf32 = false;
  if (ct == CUBLAS_COMPUTE_32F || ct == CUBLAS_COMPUTE_32F_PEDANTIC) return true;
  if (ct == CUBLAS_COMPUTE_32F_FAST_TF32) {
    *tf32 = a == CUDA_R_32F;
    return true;
  }
  return false;
}

// Queues g on the stream, after checking every operand.
bool g_gemm_arithmetic = true;

cublasStatus_t queue(const Gemm& g, cudaStream_t stream, const char* who) {
  bool ok = check_extent(g.A, who, "A") && check_extent(g.B, who, "B") && check_extent(g.D, who, "C/D");
  if (ok && g.beta != 0 && g.C.ptr != g.D.ptr) ok = check_extent(g.C, who, "C");
  if (ok && g.bias) {
    std::string why;
    if (!device_range_ok(g.bias, (size_t)g.m * type_size(g.bias_type), &why)) {
      set_sticky_error(cudaErrorIllegalAddress, std::string(who) + ": the bias vector " + why);
      ok = false;
    }
  }
  if (!ok) return CUBLAS_STATUS_EXECUTION_FAILED;
  auto work = std::make_shared<Gemm>(g);
  auto run = [work, who] {
    if (g_observed) {
      const Gemm& w = *work;
      auto bytes = [](const Mat& m) { return (size_t)m.extent() * type_size(m.type); };
      notify_gemm(GemmEvent{who, w.m, w.n, w.k, w.D.batch, bytes(w.A), bytes(w.B),
                            (w.beta != 0 ? bytes(w.C) : 0) + (w.bias ? (size_t)w.m * type_size(w.bias_type) : 0),
                            bytes(w.D)});
    }
    if (g_gemm_arithmetic) work->run();
  };
  if (!enqueue(stream, who, run)) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

bool op_ok(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T; }

// cublasGemm[StridedBatched]Ex, after the argument checks the documentation lists.
cublasStatus_t gemm_ex(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                       const void* alpha, const void* A, cudaDataType at, int lda, long long sa, const void* B,
                       cudaDataType bt, int ldb, long long sb, const void* beta, void* C, cudaDataType ct, int ldc,
                       long long sc, int batch, cublasComputeType_t compute, const char* who) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (sticky_error() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (!op_ok(transa) || !op_ok(transb) || m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  bool tf = false;
  if (!types_supported(at, bt, ct) || !compute_supported(compute, at, &tf)) return CUBLAS_STATUS_NOT_SUPPORTED;
  Gemm g;
  g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k;
  g.alpha = *static_cast<const float*>(alpha);  // scale type fp32 for CUBLAS_COMPUTE_32F; host pointer mode
  g.beta = *static_cast<const float*>(beta);
  g.tf32 = tf || (h->math == CUBLAS_TF32_TENSOR_OP_MATH && at == CUDA_R_32F);
  g.A = Mat{A, at, ta ? k : m, ta ? m : k, lda, false, batch, sa};
  g.B = Mat{B, bt, tb ? n : k, tb ? k : n, ldb, false, batch, sb};
  g.C = Mat{C, ct, m, n, ldc, false, batch, sc};
  g.D = g.C;
  if (batch == 0 || m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  return queue(g, h->stream, who);
}

// ---- cuBLASLt descriptors (our own structs behind the opaque handles) ---------------------------
struct LtMatmulDesc {
  cublasComputeType_t compute;
  cudaDataType scale;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: D's type
};
struct LtLayout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t order = CUBLASLT_ORDER_COL;
  int32_t batch = 1;
  int64_t stride = 0;
};
struct LtPreference {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
  uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;  // accepted; the stand-in never splits K
};
// What the heuristic's algo remembers (in cublasLtMatmulAlgo_t::data).
struct AlgoData {
  uint64_t magic;
  uint32_t align[5];  // A, B, C, D, bias
};
static_assert(sizeof(AlgoData) <= sizeof(cublasLtMatmulAlgo_t), "algo data fits the opaque struct");

LtMatmulDesc* desc(cublasLtMatmulDesc_t d) { return reinterpret_cast<LtMatmulDesc*>(d); }
LtLayout* layout(cublasLtMatrixLayout_t l) { return reinterpret_cast<LtLayout*>(l); }
LtPreference* pref(cublasLtMatmulPreference_t p) { return reinterpret_cast<LtPreference*>(p); }

template <typename V>
bool read_attr(V& out, const void* buf, size_t size) {
  if (!buf || size != sizeof(V)) return false;
  std::memcpy(&out, buf, sizeof(V));
  return true;
}

uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

Mat to_mat(const void* p, const LtLayout& l) {
  return Mat{p, l.type, (int64_t)l.rows, (int64_t)l.cols, l.ld, l.order == CUBLASLT_ORDER_ROW, l.batch, l.stride};
}

// Builds the GEMM of an Lt call, or returns the status the library would.
cublasStatus_t lt_gemm(const LtMatmulDesc& d, const LtLayout& a, const LtLayout& b, const LtLayout& c,
                       const LtLayout& dl, Gemm& g) {
  for (const LtLayout* l : {&a, &b, &c, &dl}) {
    if (l->order != CUBLASLT_ORDER_COL && l->order != CUBLASLT_ORDER_ROW) return CUBLAS_STATUS_NOT_SUPPORTED;
    const int64_t need = l->order == CUBLASLT_ORDER_COL ? (int64_t)l->rows : (int64_t)l->cols;
    if (l->ld < std::max<int64_t>(1, need) || l->batch < 1 || l->stride < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (l->rows > INT_MAX || l->cols > INT_MAX) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!op_ok(d.transa) || !op_ok(d.transb)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = d.transa == CUBLAS_OP_T, tb = d.transb == CUBLAS_OP_T;
  const int64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols;
  const int64_t kb = tb ? b.cols : b.rows, n = tb ? b.rows : b.cols;
  if (k != kb || (int64_t)dl.rows != m || (int64_t)dl.cols != n || c.rows != dl.rows || c.cols != dl.cols)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (a.batch != dl.batch || b.batch != dl.batch || c.batch != dl.batch) return CUBLAS_STATUS_INVALID_VALUE;
  if (c.type != dl.type || d.scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  bool tf = false;
  if (!types_supported(a.type, b.type, dl.type) || !compute_supported(d.compute, a.type, &tf))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint32_t ep = d.epilogue;
  if (ep != CUBLASLT_EPILOGUE_DEFAULT && ep != CUBLASLT_EPILOGUE_BIAS && ep != CUBLASLT_EPILOGUE_GELU &&
      ep != CUBLASLT_EPILOGUE_GELU_BIAS)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool with_bias = ep == CUBLASLT_EPILOGUE_BIAS || ep == CUBLASLT_EPILOGUE_GELU_BIAS;
  if (with_bias && !d.bias) return CUBLAS_STATUS_INVALID_VALUE;
  const cudaDataType bias_type = d.bias_type < 0 ? dl.type : (cudaDataType)d.bias_type;
  if (with_bias && type_size(bias_type) == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  g.ta = ta, g.tb = tb, g.m = (int)m, g.n = (int)n, g.k = (int)k;
  g.tf32 = tf;
  g.bias = with_bias ? d.bias : nullptr;
  g.bias_type = bias_type;
  g.gelu = ep == CUBLASLT_EPILOGUE_GELU || ep == CUBLASLT_EPILOGUE_GELU_BIAS;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

void set_gemm_arithmetic(bool on) { g_gemm_arithmetic = on; }

}  // namespace emu

using emu::Gemm;

extern "C" {

// ---- cuBLAS ----------------------------------------------------------------------------------------
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes && (!workspace || !emu::device_range_ok(workspace, bytes, nullptr))) return CUBLAS_STATUS_INVALID_VALUE;
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int base = (int)mode & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_PEDANTIC_MATH && base != CUBLAS_TF32_TENSOR_OP_MATH)
    return CUBLAS_STATUS_INVALID_VALUE;
  handle->math = (cublasMath_t)base;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t) {
  return emu::gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C, Ctype,
                      ldc, 0, 1, computeType, "cublasGemmEx");
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t) {
  return emu::gemm_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C,
                      Ctype, ldc, strideC, batchCount, computeType, "cublasGemmStridedBatchedEx");
}

// ---- cuBLASLt --------------------------------------------------------------------------------------
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  auto* x = new emu::LtMatmulDesc;
  x->compute = compute;
  x->scale = scale;
  *d = reinterpret_cast<cublasLtMatmulDesc_t>(x);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete emu::desc(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  emu::LtMatmulDesc& x = *emu::desc(d);
  int32_t i32 = 0;
  uint32_t u32 = 0;
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = emu::read_attr(i32, buf, size); x.transa = (cublasOperation_t)i32; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = emu::read_attr(i32, buf, size); x.transb = (cublasOperation_t)i32; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = emu::read_attr(u32, buf, size); x.epilogue = (cublasLtEpilogue_t)u32; break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = emu::read_attr(x.bias, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ok = emu::read_attr(x.bias_type, buf, size); break;
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: ok = emu::read_attr(i32, buf, size); x.compute = (cublasComputeType_t)i32; break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: ok = emu::read_attr(i32, buf, size); x.scale = (cudaDataType)i32; break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      ok = emu::read_attr(i32, buf, size);
      if (ok && i32 != CUBLASLT_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
      break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;  // not used by train_gpt, not emulated
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  auto* x = new emu::LtLayout{type, rows, cols, ld};
  *l = reinterpret_cast<cublasLtMatrixLayout_t>(x);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete emu::layout(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  emu::LtLayout& x = *emu::layout(l);
  uint32_t u32 = 0;
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: ok = emu::read_attr(u32, buf, size); x.type = (cudaDataType)u32; break;
    case CUBLASLT_MATRIX_LAYOUT_ORDER: ok = emu::read_attr(x.order, buf, size); break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS: ok = emu::read_attr(x.rows, buf, size); break;
    case CUBLASLT_MATRIX_LAYOUT_COLS: ok = emu::read_attr(x.cols, buf, size); break;
    case CUBLASLT_MATRIX_LAYOUT_LD: ok = emu::read_attr(x.ld, buf, size); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: ok = emu::read_attr(x.batch, buf, size); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: ok = emu::read_attr(x.stride, buf, size); break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  *p = reinterpret_cast<cublasLtMatmulPreference_t>(new emu::LtPreference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete emu::pref(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  emu::LtPreference& x = *emu::pref(p);
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: ok = emu::read_attr(x.workspace, buf, size); break;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: ok = emu::read_attr(x.reduction_mask, buf, size); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: ok = emu::read_attr(x.align[0], buf, size); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: ok = emu::read_attr(x.align[1], buf, size); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: ok = emu::read_attr(x.align[2], buf, size); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: ok = emu::read_attr(x.align[3], buf, size); break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* count) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!d || !a || !b || !c || !dl || !p || requested < 1 || !results || !count) return CUBLAS_STATUS_INVALID_VALUE;
  *count = 0;
  if (const char* none = std::getenv("TG_EMU_CUBLASLT_NO_ALGORITHM"); none && *none && std::strcmp(none, "0") != 0)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  Gemm g;
  const cublasStatus_t s = emu::lt_gemm(*emu::desc(d), *emu::layout(a), *emu::layout(b), *emu::layout(c),
                                        *emu::layout(dl), g);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  std::memset(&results[0], 0, sizeof results[0]);
  emu::AlgoData ad{emu::kAlgoMagic, {}};
  for (int i = 0; i < 4; ++i) ad.align[i] = emu::pref(p)->align[i];
  ad.align[4] = g.bias ? emu::alignment(g.bias) : 1;
  std::memcpy(&results[0].algo, &ad, sizeof ad);
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (emu::sticky_error() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (!d || !a || !b || !c || !dl || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  Gemm g;
  const cublasStatus_t s = emu::lt_gemm(*emu::desc(d), *emu::layout(a), *emu::layout(b), *emu::layout(c),
                                        *emu::layout(dl), g);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  g.A = emu::to_mat(A, *emu::layout(a));
  g.B = emu::to_mat(B, *emu::layout(b));
  g.C = emu::to_mat(C, *emu::layout(c));
  g.D = emu::to_mat(D, *emu::layout(dl));
  if (workspace_bytes && !emu::device_range_ok(workspace, workspace_bytes, nullptr)) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo) {
    emu::AlgoData ad;
    std::memcpy(&ad, algo, sizeof ad);
    if (ad.magic != emu::kAlgoMagic) return CUBLAS_STATUS_INVALID_VALUE;
    const void* ptrs[5] = {A, B, C, D, g.bias};
    const char* names[5] = {"A", "B", "C", "D", "the bias"};
    for (int i = 0; i < 5; ++i) {
      if (!ptrs[i] || emu::alignment(ptrs[i]) >= ad.align[i]) continue;
      emu::set_sticky_error(cudaErrorMisalignedAddress,
                            std::string("cublasLtMatmul: the algorithm was chosen for ") + names[i] + " aligned to " +
                                std::to_string(ad.align[i]) + " bytes, but " + names[i] + " is aligned to " +
                                std::to_string(emu::alignment(ptrs[i])));
      return CUBLAS_STATUS_EXECUTION_FAILED;
    }
  }
  if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
  return emu::queue(g, stream, "cublasLtMatmul");
}

}  // extern "C"
