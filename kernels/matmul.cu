// kernels/matmul.cu: the linear layer on the GPU (contract in kernels/matmul.cuh; CPU twin
// kernels/cpu/matmul.h / .cpp). With X = inp (N, C), W = weight (OC, C), Y = out (N, OC), all
// row-major:
//   forward   Y = X W^T + 1 b^T                         (out overwritten)
//   backward  dX += dY W,  dW += dY^T X,  db += sum_n dY[n, :]   (all three accumulated)
// dX is T, dW and db are float.
//
// cuBLAS is column-major: a row-major (R, K) buffer read column-major with ld = K is the
// (K, R) matrix, i.e. the transpose. So every product is done on transposes:
//   forward:  Y^T (OC, N) = W (OC, C) X^T (C, N).
//             A = weight read col-major is W^T (C, OC), ld C   -> op(A) = T gives W;  m = OC, k = C
//             B = inp    read col-major is X^T (C, N),  ld C   -> op(B) = N;          n = N
//             D = out    col-major (OC, N), ld OC, i.e. Y row-major.
//             The bias (length OC = the rows of D) is the cuBLASLt BIAS epilogue (added in
//             fp32 before the one rounding to T; the plans exclude split-K, see make_plan).
//   dX:       dX^T (C, N) += W^T (C, OC) dY^T (OC, N).
//             A = weight col-major is W^T (C, OC), ld C   -> op N;  m = C, k = OC
//             B = dout   col-major is dY^T (OC, N), ld OC -> op N;  n = N
//             C = dinp   col-major (C, N), ld C; beta = 1, C type T.
//   dW:       dW^T (C, OC) += X^T (C, N) dY (N, OC).
//             A = inp  col-major is X^T (C, N),   ld C  -> op N;  m = C, k = N
//             B = dout col-major is dY^T (OC, N), ld OC -> op T gives dY;  n = OC
//             C = dweight col-major (C, OC), ld C, i.e. dW row-major; beta = 1, C type float
//             (A, B in T, C in float, CUBLAS_COMPUTE_32F: a supported cublasGemmEx combination).
// Every GEMM uses CUBLAS_COMPUTE_32F with scale type float: fp32 accumulation, and for
// T = float no TF32 (that would need CUBLAS_COMPUTE_32F_FAST_TF32 or the TF32 math mode,
// which gpu::Context leaves off); for T = bf16 tensor cores with fp32 accumulation.
//
// The forward takes the cuBLASLt path only when every pointer, the bias included, is 16-byte
// aligned (a bias less aligned than the others can fault in the epilogue's vector loads:
// "misaligned address", sticky). Its descriptors and the algorithm the heuristic picks are
// made once per (T, N, C, OC, bias) shape, on the first call, and kept in the context's
// LtPlanCache: later calls (every step) only set the bias pointer and run. The plan is chosen
// for 16-byte minimum alignments, with a placeholder bias pointer aligned to exactly 16 bytes
// (the heuristic reads the bias pointer's alignment from its value), so it is valid for every
// call of its shape. Otherwise, or when the heuristic offers no algorithm, the forward
// broadcasts the bias into out and runs cublasGemmEx with beta = 1: the same math, but for
// T = bf16 cuBLAS on an H100 rounds X W^T to T before adding the bias, as it does for dX += dY W
// (two roundings where the Lt path has one; seen for every algorithm it has, and the same in
// PyTorch's bf16 autograd, which rounds dY W before adding it to the gradient it accumulates).
// CUBLAS_COMPUTE_32F_PEDANTIC rounds once there but measured 10-20 times slower for dX on the
// H100, so it is not used. The emulated cuBLAS does the same (tests/emu/cublas_emu.cpp).
//
// dbias, deterministically (no atomics): dbias_partial_kernel sums blocks of kBiasRows rows
// per column into ctx.scratch (float, (ceil(N / kBiasRows), OC)), then dbias_finish_kernel
// adds the partials in chunk order and does dbias += that. The chunking is a constant, so the
// bits do not depend on the device either.
#include "matmul.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

namespace gpu {

namespace {

constexpr int kBiasRows = 128;   // rows of dout summed into one partial
constexpr int kBiasCols = 32;    // columns per block: one per lane, so reads are coalesced
constexpr int kBiasWarps = 8;    // rows interleaved over the warps of a block

void matmul_require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("matmul: ") + what);
}

// ---- kernels ----------------------------------------------------------------------------

// out[n, o] = bias[o] for every row n (the fallback when the Lt bias epilogue is not offered).
template <typename T>
__global__ void broadcast_bias_kernel(T* __restrict__ out,          // (N, OC)
                                      const T* __restrict__ bias,   // (OC)
                                      int N, int OC) {
  const size_t total = (size_t)N * OC;
  for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x)
    out[idx] = bias[idx % OC];
}

// partial[chunk, o] = sum over rows n in [chunk*kBiasRows, min(N, (chunk+1)*kBiasRows)) of
// dout[n, o]. Block (32, 8): lane x owns column o, warp y sums rows y, y+8, ... of the chunk
// in order; the 8 warp sums are then added in warp order. grid = (chunks, ceil(OC / 32)).
template <typename T>
__global__ void __launch_bounds__(kBiasCols * kBiasWarps)
    dbias_partial_kernel(float* __restrict__ partial,   // (chunks, OC)
                         const T* __restrict__ dout,    // (N, OC)
                         int N, int OC) {
  __shared__ float sums[kBiasWarps][kBiasCols + 1];
  const int o = blockIdx.y * kBiasCols + threadIdx.x;
  const int chunk = blockIdx.x;
  const int r0 = chunk * kBiasRows;
  const int r1 = min(N, r0 + kBiasRows);
  float acc = 0.f;
  if (o < OC)
    for (int r = r0 + threadIdx.y; r < r1; r += kBiasWarps) acc += to_float(dout[(size_t)r * OC + o]);
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < OC) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kBiasWarps; ++w) s += sums[w][threadIdx.x];
    partial[(size_t)chunk * OC + o] = s;
  }
}

// dbias[o] += sum over chunks c (in order) of partial[c, o].
__global__ void dbias_finish_kernel(float* __restrict__ dbias,          // (OC) +=
                                    const float* __restrict__ partial,  // (chunks, OC)
                                    int chunks, int OC) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float s = 0.f;
  for (int c = 0; c < chunks; ++c) s += partial[(size_t)c * OC + o];
  dbias[o] += s;
}

// ---- cuBLASLt forward -------------------------------------------------------------------

constexpr uint32_t kLtAlignment = 16;  // every pointer of the Lt path is aligned to this

// The Lt descriptors and algorithm of one forward shape (see the top of the file).
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false: the heuristic offered nothing, use the fallback
};

}  // namespace

struct LtPlanCache {
  std::map<std::tuple<int, int, int, int, bool>, LtPlan> plans;  // (type, N, C, OC, bias)
  MatmulPathCounts counts;
  ~LtPlanCache() {
    for (auto& kv : plans) {
      LtPlan& p = kv.second;
      if (p.d) cublasLtMatrixLayoutDestroy(p.d);
      if (p.b) cublasLtMatrixLayoutDestroy(p.b);
      if (p.a) cublasLtMatrixLayoutDestroy(p.a);
      if (p.op) cublasLtMatmulDescDestroy(p.op);
    }
  }
};

LtPlanCache* new_lt_plan_cache() { return new LtPlanCache; }
void delete_lt_plan_cache(LtPlanCache* c) { delete c; }

MatmulPathCounts matmul_path_counts(const Context& ctx) {
  return ctx.lt_plans ? ctx.lt_plans->counts : MatmulPathCounts{};
}

namespace {

// Makes the plan of a shape: descriptors for out = X W^T (+ bias) (derivation at the top), and
// the heuristic's algorithm for 16-byte aligned pointers.
template <typename T>
void make_plan(const Context& ctx, LtPlan& p, bool bias, int N, int C, int OC) {
  cublasCheck(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  cublasCheck(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  cublasCheck(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  cublasCheck(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias) {
    // bias elements of type T (the default: the type of D); a placeholder address aligned to
    // exactly kLtAlignment for the heuristic, the real pointer is set at each call
    const void* placeholder = reinterpret_cast<const void*>((uintptr_t)kLtAlignment);
    cublasCheck(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &placeholder, sizeof(placeholder)));
  }
  const cudaDataType_t t = cuda_type<T>();
  cublasCheck(cublasLtMatrixLayoutCreate(&p.a, t, C, OC, C));   // weight: W^T (C, OC)
  cublasCheck(cublasLtMatrixLayoutCreate(&p.b, t, C, N, C));    // inp:    X^T (C, N)
  cublasCheck(cublasLtMatrixLayoutCreate(&p.d, t, OC, N, OC));  // out:    Y^T (OC, N)
  cublasLtMatmulPreference_t pref = nullptr;
  cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = ctx.cublas_workspace_bytes;
  const uint32_t al = kLtAlignment;
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (cublasLtMatmulPreferenceAttributes_t a :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, a, &al, sizeof(al));
  // no split-K: on an H100 (cuBLASLt 13.1) the split-K algorithms the heuristic picks for small
  // N (N = 7 to 300 with C, OC of 65 to 200) round X W^T to bf16 before the bias epilogue adds
  // the bias (errors up to 250 ulp of the result where they cancel); without them the result is
  // rounded once (0.5 ulp), and for train_gpt's shapes the heuristic picked no split-K anyway
  const uint32_t no_split = CUBLASLT_REDUCTION_SCHEME_NONE;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split,
                                              sizeof(no_split));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, p.op, p.a, p.b, p.d, p.d, pref, 1, &heur, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.found = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.found) p.algo = heur.algo;
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kLtAlignment == 0; }

// out = X W^T (+ bias through the BIAS epilogue) with cuBLASLt. Returns false, having launched
// nothing, when the pointers are not all 16-byte aligned or the shape has no algorithm.
template <typename T>
bool lt_forward(const Context& ctx, T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  if (!ctx.lt_plans || !aligned(out) || !aligned(inp) || !aligned(weight) || (bias && !aligned(bias))) return false;
  LtPlan& p = ctx.lt_plans->plans[std::make_tuple((int)cuda_type<T>(), N, C, OC, bias != nullptr)];
  if (!p.op) make_plan<T>(ctx, p, bias != nullptr, N, C, OC);
  if (!p.found) return false;
  if (bias) cublasCheck(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.f, beta = 0.f;
  cublasCheck(cublasLtMatmul(ctx.lt, p.op, &alpha, weight, p.a, inp, p.b, &beta, out, p.d, out, p.d, &p.algo,
                             ctx.cublas_workspace, ctx.cublas_workspace_bytes, ctx.stream));
  return true;
}

}  // namespace

size_t matmul_scratch_bytes(int N, int OC) {
  return (size_t)ceil_div(N > 0 ? N : 0, kBiasRows) * (size_t)(OC > 0 ? OC : 0) * sizeof(float);
}

template <typename T>
void matmul_forward(const Context& ctx, T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  matmul_require(N > 0 && C > 0 && OC > 0, "forward needs N, C, OC > 0");
  matmul_require(out && inp && weight, "forward: out, inp and weight must not be null");
  if (lt_forward(ctx, out, inp, weight, bias, N, C, OC)) {
    ++ctx.lt_plans->counts.lt;
    return;
  }
  if (ctx.lt_plans) ++ctx.lt_plans->counts.fallback;
  // Not the Lt path (a pointer less than 16-byte aligned, or no algorithm): out = bias (or 0),
  // then out += X W^T.
  float beta = 0.f;
  if (bias) {
    launch(broadcast_bias_kernel<T>, grid_1d((size_t)N * OC, 256), 256, 0, ctx.stream, out, bias, N, OC);
    beta = 1.f;
  }
  const float alpha = 1.f;
  const cudaDataType_t t = cuda_type<T>();
  cublasCheck(cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &alpha, weight, t, C, inp, t, C, &beta, out,
                           t, OC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <typename T>
void matmul_backward(const Context& ctx, T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                     const T* weight, int N, int C, int OC) {
  matmul_require(N > 0 && C > 0 && OC > 0, "backward needs N, C, OC > 0");
  matmul_require(dweight && dout && inp && weight, "backward: dweight, dout, inp and weight must not be null");
  const cudaDataType_t t = cuda_type<T>();
  const float one = 1.f;
  // dX^T (C, N) += W^T (C, OC) dY^T (OC, N)
  if (dinp)
    cublasCheck(cublasGemmEx(ctx.cublas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, t, C, dout, t, OC, &one,
                             dinp, t, C, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  // dW^T (C, OC) += X^T (C, N) dY (N, OC), accumulated in float
  cublasCheck(cublasGemmEx(ctx.cublas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, t, C, dout, t, OC, &one, dweight,
                           CUDA_R_32F, C, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (dbias) {
    const size_t need = matmul_scratch_bytes(N, OC);
    matmul_require(ctx.scratch != nullptr && ctx.scratch_bytes >= need,
            "backward: ctx.scratch is smaller than matmul_scratch_bytes(N, OC)");
    const long long chunks = ceil_div(N, kBiasRows);
    const long long col_blocks = ceil_div(OC, kBiasCols);
    matmul_require(col_blocks <= 65535, "backward: OC too large for the dbias grid (OC <= 2097120)");
    float* partial = static_cast<float*>(ctx.scratch);
    const dim3 grid((unsigned)chunks, (unsigned)col_blocks), block(kBiasCols, kBiasWarps);
    launch(dbias_partial_kernel<T>, grid, block, 0, ctx.stream, partial, dout, N, OC);
    launch(dbias_finish_kernel, (unsigned)ceil_div(OC, 256), 256, 0, ctx.stream, dbias, partial, (int)chunks, OC);
  }
}

#define TG_INSTANTIATE(T)                                                                                     \
  template void matmul_forward<T>(const Context&, T*, const T*, const T*, const T*, int, int, int);          \
  template void matmul_backward<T>(const Context&, T*, float*, float*, const T*, const T*, const T*, int, int, \
                                   int);
TG_INSTANTIATE(float)
TG_INSTANTIATE(bf16)
#undef TG_INSTANTIATE

}  // namespace gpu
