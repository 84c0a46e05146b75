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
//             fp32 before the one rounding to T).
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
// If cuBLASLt offers no algorithm for the bias epilogue with these pointers (its heuristic
// looks at the actual alignment of every pointer, the bias included), the forward instead
// broadcasts the bias into out and runs cublasGemmEx with beta = 1: the same math, one
// rounding to T as well.
//
// dbias, deterministically (no atomics): dbias_partial_kernel sums blocks of kBiasRows rows
// per column into ctx.scratch (float, (ceil(N / kBiasRows), OC)), then dbias_finish_kernel
// adds the partials in chunk order and does dbias += that. The chunking is a constant, so the
// bits do not depend on the device either.
#include "matmul.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace gpu {

namespace {

constexpr int kBiasRows = 128;   // rows of dout summed into one partial
constexpr int kBiasCols = 32;    // columns per block: one per lane, so reads are coalesced
constexpr int kBiasWarps = 8;    // rows interleaved over the warps of a block

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("matmul: ") + what);
}

// The largest power of two (at most 256) dividing the address: what cuBLASLt may assume.
uint32_t pointer_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
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

// Destroys the Lt descriptors on every path out (including a throw).
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// out = X W^T (+ bias through the BIAS epilogue) with cuBLASLt (derivation at the top).
// Returns false, having launched nothing, when the heuristic offers no algorithm.
template <typename T>
bool lt_forward(const Context& ctx, T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  LtDescs l;
  cublasCheck(cublasLtMatmulDescCreate(&l.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  cublasCheck(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  cublasCheck(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  cublasCheck(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias) {
    // bias elements of type T (the default: the type of D)
    cublasCheck(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const cudaDataType_t t = cuda_type<T>();
  cublasCheck(cublasLtMatrixLayoutCreate(&l.a, t, C, OC, C));   // weight: W^T (C, OC)
  cublasCheck(cublasLtMatrixLayoutCreate(&l.b, t, C, N, C));    // inp:    X^T (C, N)
  cublasCheck(cublasLtMatrixLayoutCreate(&l.d, t, OC, N, OC));  // out:    Y^T (OC, N)
  cublasCheck(cublasLtMatmulPreferenceCreate(&l.pref));
  const size_t ws = ctx.cublas_workspace_bytes;
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(l.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al_a = pointer_alignment(weight), al_b = pointer_alignment(inp), al_d = pointer_alignment(out);
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(l.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(l.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(l.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(l.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, l.op, l.a, l.b, l.d, l.d, l.pref, 1, &heur, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  const float alpha = 1.f, beta = 0.f;
  cublasCheck(cublasLtMatmul(ctx.lt, l.op, &alpha, weight, l.a, inp, l.b, &beta, out, l.d, out, l.d, &heur.algo,
                             ctx.cublas_workspace, ctx.cublas_workspace_bytes, ctx.stream));
  return true;
}

}  // namespace

size_t matmul_scratch_bytes(int N, int OC) {
  return (size_t)ceil_div(N > 0 ? N : 0, kBiasRows) * (size_t)(OC > 0 ? OC : 0) * sizeof(float);
}

template <typename T>
void matmul_forward(const Context& ctx, T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  require(N > 0 && C > 0 && OC > 0, "forward needs N, C, OC > 0");
  require(out && inp && weight, "forward: out, inp and weight must not be null");
  if (lt_forward(ctx, out, inp, weight, bias, N, C, OC)) return;
  // No Lt algorithm for these pointers / this epilogue: out = bias (or 0), then out += X W^T.
  float beta = 0.f;
  if (bias) {
    broadcast_bias_kernel<T><<<grid_1d((size_t)N * OC, 256), 256, 0, ctx.stream>>>(out, bias, N, OC);
    cudaCheckLaunch();
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
  require(N > 0 && C > 0 && OC > 0, "backward needs N, C, OC > 0");
  require(dweight && dout && inp && weight, "backward: dweight, dout, inp and weight must not be null");
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
    require(ctx.scratch != nullptr && ctx.scratch_bytes >= need,
            "backward: ctx.scratch is smaller than matmul_scratch_bytes(N, OC)");
    const long long chunks = ceil_div(N, kBiasRows);
    const long long col_blocks = ceil_div(OC, kBiasCols);
    require(col_blocks <= 65535, "backward: OC too large for the dbias grid (OC <= 2097120)");
    float* partial = static_cast<float*>(ctx.scratch);
    const dim3 grid((unsigned)chunks, (unsigned)col_blocks), block(kBiasCols, kBiasWarps);
    dbias_partial_kernel<T><<<grid, block, 0, ctx.stream>>>(partial, dout, N, OC);
    cudaCheckLaunch();
    dbias_finish_kernel<<<(unsigned)ceil_div(OC, 256), 256, 0, ctx.stream>>>(dbias, partial, (int)chunks, OC);
    cudaCheckLaunch();
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
