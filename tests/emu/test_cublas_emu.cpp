// tests/emu/test_cublas_emu.cpp: the emulator's library stand-ins (tests/emu/cublas_emu.cpp)
// against the formulas their documentation gives, computed here in double on the host:
// C = alpha op(A) op(B) + beta C for cublasGemmEx and cublasGemmStridedBatchedEx,
// D = epilogue(alpha op(A) op(B) + beta C) for cublasLtMatmul. The shapes are
// non-square, transposed both ways, batched with strides larger than one matrix, with leading
// dimensions larger than the rows; the bytes between rows and ld, and between batch entries,
// must come back untouched. Invalid arguments must give the status the library documents.
//
// Tolerances. Both operands are rounded to their storage type first, so only the stand-in's
// arithmetic is measured: an fp32 sum of k products is within (k + 2) u32 sum |terms| of the
// exact value, and a bf16 output adds u_bf16 |ref| (u32 = 2^-24, u_bf16 = 2^-8); the bound
// is twice that; with a bf16 C and beta != 0 the product is rounded to bf16 before beta C is
// added (as cuBLAS does on an H100: tests/emu/cublas_emu.cpp), which adds u_bf16 |alpha| sum
// |products|. A transposed or mis-strided operand moves elements by O(1) of their size.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/cuda_common.cuh"
#include "../cpu/test_util.h"
#include "child_process.h"
#include "emu_internal.h"

namespace {

constexpr double kU32 = 5.9604644775390625e-8;
constexpr double kUbf16 = 3.90625e-3;

std::mt19937_64& rng() {  // fresh inputs each run (TG_TEST_SEED replays one)
  static std::mt19937_64 g(testutil::run_seed() ^ 0xc0b1a5ull);
  return g;
}

std::vector<double> random_values(size_t n) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng());
  return v;
}

// A device buffer of float or bf16 holding host values (rounded to the type).
struct Dev {
  cudaDataType type;
  size_t n;
  void* ptr = nullptr;
  Dev(cudaDataType t, const std::vector<double>& h) : type(t), n(h.size()) {
    REQUIRE(cudaMalloc(&ptr, n * esize()) == cudaSuccess);
    upload(h);
  }
  ~Dev() { cudaFree(ptr); }
  size_t esize() const { return type == CUDA_R_32F ? 4 : 2; }
  void upload(const std::vector<double>& h) {
    std::vector<unsigned char> b(n * esize());
    for (size_t i = 0; i < n; ++i) {
      if (type == CUDA_R_32F) {
        const float f = (float)h[i];
        std::memcpy(&b[4 * i], &f, 4);
      } else {
        const __nv_bfloat16 x = __float2bfloat16_rn((float)h[i]);
        std::memcpy(&b[2 * i], &x, 2);
      }
    }
    REQUIRE(cudaMemcpy(ptr, b.data(), b.size(), cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  std::vector<double> download() const {
    std::vector<unsigned char> b(n * esize());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(b.data(), ptr, b.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    std::vector<double> h(n);
    for (size_t i = 0; i < n; ++i) {
      if (type == CUDA_R_32F) {
        float f;
        std::memcpy(&f, &b[4 * i], 4);
        h[i] = f;
      } else {
        __nv_bfloat16 x;
        std::memcpy(&x, &b[2 * i], 2);
        h[i] = __bfloat162float(x);
      }
    }
    return h;
  }
};

std::vector<double> rounded(cudaDataType t, std::vector<double> v) {
  for (double& x : v) x = t == CUDA_R_32F ? (double)(float)x : (double)__bfloat162float(__float2bfloat16_rn((float)x));
  return v;
}

// Element (r, c) of a column-major (or row-major) matrix with leading dimension ld.
size_t at(bool row_major, long ld, long r, long c) { return (size_t)(row_major ? r * ld + c : c * ld + r); }

struct GemmCase {
  bool ta, tb;
  int m, n, k, lda, ldb, ldc, batch;
  long sa, sb, sc;
  float alpha, beta;
  cudaDataType ab, c;
};

// Runs cublasGemmStridedBatchedEx (batch > 1) or cublasGemmEx and checks every element.
void check_gemm(cublasHandle_t h, const GemmCase& g) {
  CAPTURE(g.ta);
  CAPTURE(g.tb);
  CAPTURE(g.m);
  CAPTURE(g.n);
  CAPTURE(g.k);
  CAPTURE(g.batch);
  CAPTURE((int)g.ab);
  CAPTURE((int)g.c);
  CAPTURE(g.beta);
  const long ac = g.ta ? g.m : g.k, bc = g.tb ? g.k : g.n;
  const size_t na = (size_t)(g.sa * (g.batch - 1) + ac * g.lda), nb = (size_t)(g.sb * (g.batch - 1) + bc * g.ldb),
               nc = (size_t)(g.sc * (g.batch - 1) + (long)g.n * g.ldc);
  const std::vector<double> A = rounded(g.ab, random_values(na)), B = rounded(g.ab, random_values(nb)),
                            C0 = rounded(g.c, random_values(nc));
  Dev dA(g.ab, A), dB(g.ab, B), dC(g.c, C0);
  cublasStatus_t st;
  if (g.batch == 1)
    st = cublasGemmEx(h, g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k, &g.alpha,
                      dA.ptr, g.ab, g.lda, dB.ptr, g.ab, g.ldb, &g.beta, dC.ptr, g.c, g.ldc, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
  else
    st = cublasGemmStridedBatchedEx(h, g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n,
                                    g.k, &g.alpha, dA.ptr, g.ab, g.lda, g.sa, dB.ptr, g.ab, g.ldb, g.sb, &g.beta,
                                    dC.ptr, g.c, g.ldc, g.sc, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  REQUIRE(st == CUBLAS_STATUS_SUCCESS);
  const std::vector<double> got = dC.download();
  std::vector<bool> touched(nc, false);
  size_t bad = 0;
  for (int b = 0; b < g.batch; ++b)
    for (int j = 0; j < g.n; ++j)
      for (int i = 0; i < g.m; ++i) {
        double ref = 0, mag = 0;
        for (int l = 0; l < g.k; ++l) {
          const double x = A[(size_t)(b * g.sa) + (g.ta ? at(false, g.lda, l, i) : at(false, g.lda, i, l))];
          const double y = B[(size_t)(b * g.sb) + (g.tb ? at(false, g.ldb, j, l) : at(false, g.ldb, l, j))];
          ref += x * y;
          mag += std::fabs(x * y);
        }
        const size_t ci = (size_t)(b * g.sc) + at(false, g.ldc, i, j);
        const double prod = mag;
        ref = g.alpha * ref + g.beta * C0[ci];
        mag = std::fabs(g.alpha) * mag + std::fabs(g.beta * C0[ci]);
        // with a bf16 C and beta != 0 the product is rounded to bf16 before beta C is added
        const double product_rounding = g.c == CUDA_R_16BF && g.beta != 0 ? kUbf16 * std::fabs(g.alpha) * prod : 0;
        const double bound =
            2 * ((g.c == CUDA_R_16BF ? kUbf16 : 0) * std::fabs(ref) + product_rounding + (g.k + 2) * kU32 * mag);
        touched[ci] = true;
        if (!(std::fabs(got[ci] - ref) <= bound)) {
          if (bad++ == 0) MESSAGE("C[" << ci << "] = " << got[ci] << ", expected " << ref << " +- " << bound);
        }
      }
  size_t changed = 0;
  for (size_t i = 0; i < nc; ++i) changed += !touched[i] && got[i] != C0[i];
  CHECK(bad == 0);
  CHECK(changed == 0);  // padding between rows and ld, and between batch entries
}

using tg_test::ChildResult;
using tg_test::in_child;

}  // namespace

TEST_CASE("cuBLAS stand-in: cublasGemmEx and the strided batch follow C = alpha op(A) op(B) + beta C") {
  cublasHandle_t h;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 1.3f}) {
        // m, n, k not multiples of anything, ld above the rows
        const int m = 7, n = 5, k = 9;
        const int lda = (ta ? k : m) + 3, ldb = (tb ? n : k) + 2, ldc = m + 4;
        check_gemm(h, GemmCase{ta, tb, m, n, k, lda, ldb, ldc, 1, 0, 0, 0, 0.7f, beta, CUDA_R_32F, CUDA_R_32F});
        check_gemm(h, GemmCase{ta, tb, m, n, k, lda, ldb, ldc, 1, 0, 0, 0, 0.7f, beta, CUDA_R_16BF, CUDA_R_16BF});
        check_gemm(h, GemmCase{ta, tb, m, n, k, lda, ldb, ldc, 1, 0, 0, 0, 0.7f, beta, CUDA_R_16BF, CUDA_R_32F});
        // strided batch of 3, strides one matrix plus a gap
        const long sa = (long)lda * (ta ? m : k) + 11, sb = (long)ldb * (tb ? k : n) + 5, sc = (long)ldc * n + 7;
        check_gemm(h, GemmCase{ta, tb, m, n, k, lda, ldb, ldc, 3, sa, sb, sc, 1.f, beta, CUDA_R_32F, CUDA_R_32F});
        check_gemm(h, GemmCase{ta, tb, m, n, k, lda, ldb, ldc, 3, sa, sb, sc, 1.f, beta, CUDA_R_16BF, CUDA_R_32F});
      }
  cublasDestroy(h);
}

TEST_CASE("cuBLAS stand-in: invalid arguments get the documented statuses") {
  cublasHandle_t h;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  Dev a(CUDA_R_32F, random_values(64)), b(CUDA_R_32F, random_values(64)), c(CUDA_R_32F, random_values(64));
  const float one = 1, zero = 0;
  auto gemm = [&](cublasHandle_t hh, int m, int lda, cudaDataType at, cudaDataType ct, cublasComputeType_t comp) {
    return cublasGemmEx(hh, CUBLAS_OP_N, CUBLAS_OP_N, m, 4, 4, &one, a.ptr, at, lda, b.ptr, CUDA_R_32F, 4, &zero,
                        c.ptr, ct, 4, comp, CUBLAS_GEMM_DEFAULT);
  };
  CHECK(gemm(h, 4, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_SUCCESS);
  CHECK(gemm(nullptr, 4, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(gemm(h, -1, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(gemm(h, 4, 3, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  CHECK(gemm(h, 4, 4, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_NOT_SUPPORTED);  // A, B differ
  CHECK(gemm(h, 4, 4, CUDA_R_32F, CUDA_R_16BF, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_NOT_SUPPORTED);  // fp32 -> bf16
  CHECK(gemm(h, 4, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_64F) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  cublasDestroy(h);
  // an operand that runs past its allocation is a device fault, reported at the call
  const ChildResult r = in_child([] {
    cublasHandle_t hh;
    cublasCreate(&hh);
    float* a2 = nullptr;
    cudaMalloc(&a2, 15 * sizeof(float));  // a 4 x 4 A needs 16
    const float o = 1, z = 0;
    const cublasStatus_t s = cublasGemmEx(hh, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &o, a2, CUDA_R_32F, 4, a2, CUDA_R_32F,
                                          4, &z, a2, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_EXECUTION_FAILED && cudaDeviceSynchronize() == cudaErrorIllegalAddress ? 0 : 1;
  });
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("cublasGemmEx: operand A") != std::string::npos);
  CHECK(r.err.find("ends 4 bytes past the end of its allocation") != std::string::npos);
}

TEST_CASE("cuBLAS stand-in: with a bf16 C and beta = 1 the product is rounded to bf16 before C is added") {
  // A B = 1 + 3 2^-9 rounds to 1 + 2^-7 in bf16; with C = -1 one rounding gives 3 2^-9 (exact in
  // bf16), the two that cuBLAS does on an H100 give 2^-7. Through cublasGemmEx and cublasLtMatmul.
  const std::vector<double> a = {1.0, 3.0 / 512}, b = {1.0, 1.0}, c0 = {-1.0};
  Dev dA(CUDA_R_16BF, a), dB(CUDA_R_16BF, b), dC(CUDA_R_16BF, c0);
  REQUIRE(dA.download() == a);
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  const float one = 1.f, zero = 0.f;
  REQUIRE(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, &one, dA.ptr, CUDA_R_16BF, 1, dB.ptr, CUDA_R_16BF, 2,
                       &one, dC.ptr, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  CHECK(dC.download()[0] == 1.0 / 128);
  // beta = 0: one rounding of the product (1 + 3 2^-9 rounds to 1 + 2^-7)
  REQUIRE(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, &one, dA.ptr, CUDA_R_16BF, 1, dB.ptr, CUDA_R_16BF, 2,
                       &zero, dC.ptr, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  CHECK(dC.download()[0] == 1.0 + 1.0 / 128);
  // a float C keeps the one rounding
  Dev fC(CUDA_R_32F, c0);
  REQUIRE(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, &one, dA.ptr, CUDA_R_16BF, 1, dB.ptr, CUDA_R_16BF, 2,
                       &one, fC.ptr, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  CHECK(fC.download()[0] == 3.0 / 512);
  cublasDestroy(h);
}

TEST_CASE("cuBLAS stand-in: TF32 only when asked for, with the inputs rounded to 10 mantissa bits") {
  cublasHandle_t h;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  // 1 + 2^-20 is exact in fp32 and rounds to 1 in TF32: a 1 x 1 x 1 product shows the mode
  const double x = 1.0 + std::ldexp(1.0, -20);
  Dev a(CUDA_R_32F, {x}), b(CUDA_R_32F, {x}), c(CUDA_R_32F, {0.0});
  const float one = 1, zero = 0;
  auto run = [&](cublasComputeType_t comp) {
    REQUIRE(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a.ptr, CUDA_R_32F, 1, b.ptr, CUDA_R_32F, 1, &zero,
                         c.ptr, CUDA_R_32F, 1, comp, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    return c.download()[0];
  };
  CHECK(run(CUBLAS_COMPUTE_32F) == (double)(float)(x * x));
  CHECK(run(CUBLAS_COMPUTE_32F_FAST_TF32) == 1.0);
  REQUIRE(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
  CHECK(run(CUBLAS_COMPUTE_32F) == 1.0);
  cublasDestroy(h);
}

namespace {

struct LtCase {
  bool ta, tb, rows_d;  // rows_d: D (and C) in row order
  int m, n, k, batch;
  cublasLtEpilogue_t epilogue;
  cudaDataType type;
};

// D = epilogue(op(A) op(B) + bias) through the Lt API, checked element by element.
void check_lt(const LtCase& lc) {
  CAPTURE(lc.ta);
  CAPTURE(lc.tb);
  CAPTURE(lc.rows_d);
  CAPTURE(lc.batch);
  CAPTURE((int)lc.epilogue);
  CAPTURE((int)lc.type);
  cublasLtHandle_t lt;
  REQUIRE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
  const int m = lc.m, n = lc.n, k = lc.k;
  const long ar = lc.ta ? k : m, ac = lc.ta ? m : k, br = lc.tb ? n : k, bc = lc.tb ? k : n;
  const long lda = ar + 2, ldb = br + 1, ldd = lc.rows_d ? n + 3 : m + 3;
  const long sa = lda * ac + 5, sb = ldb * bc + 3, sd = ldd * (lc.rows_d ? m : n) + 9;
  const std::vector<double> A = rounded(lc.type, random_values((size_t)(sa * lc.batch)));
  const std::vector<double> B = rounded(lc.type, random_values((size_t)(sb * lc.batch)));
  const std::vector<double> D0 = rounded(lc.type, random_values((size_t)(sd * lc.batch)));
  const std::vector<double> bias = rounded(lc.type, random_values((size_t)m));
  Dev dA(lc.type, A), dB(lc.type, B), dD(lc.type, D0), dbias(lc.type, bias);
  cublasLtMatmulDesc_t op;
  REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t ta = lc.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = lc.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &lc.epilogue, sizeof lc.epilogue) ==
          CUBLAS_STATUS_SUCCESS);
  const void* bp = dbias.ptr;
  REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp) ==
          CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t la, lb, ld;
  REQUIRE(cublasLtMatrixLayoutCreate(&la, lc.type, ar, ac, lda) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&lb, lc.type, br, bc, ldb) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatrixLayoutCreate(&ld, lc.type, m, n, ldd) == CUBLAS_STATUS_SUCCESS);
  const int32_t row = CUBLASLT_ORDER_ROW;
  if (lc.rows_d) REQUIRE(cublasLtMatrixLayoutSetAttribute(ld, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row) == 0);
  const int32_t batch = lc.batch;
  for (auto [l, s] : {std::pair{la, sa}, std::pair{lb, sb}, std::pair{ld, sd}}) {
    const int64_t stride = s;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch) == 0);
    REQUIRE(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride) == 0);
  }
  cublasLtMatmulPreference_t pref;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  REQUIRE(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heur, &found) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(found == 1);
  const float alpha = 1, beta = 0;
  REQUIRE(cublasLtMatmul(lt, op, &alpha, dA.ptr, la, dB.ptr, lb, &beta, dD.ptr, ld, dD.ptr, ld, &heur.algo, nullptr,
                         0, nullptr) == CUBLAS_STATUS_SUCCESS);
  const std::vector<double> got = dD.download();
  const bool with_bias = lc.epilogue == CUBLASLT_EPILOGUE_BIAS || lc.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  const bool gelu = lc.epilogue == CUBLASLT_EPILOGUE_GELU || lc.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  std::vector<bool> touched(got.size(), false);
  size_t bad = 0;
  for (int b = 0; b < lc.batch; ++b)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double ref = with_bias ? bias[(size_t)i] : 0, mag = std::fabs(ref);
        for (int l = 0; l < k; ++l) {
          const double x = A[(size_t)(b * sa) + (lc.ta ? at(false, lda, l, i) : at(false, lda, i, l))];
          const double y = B[(size_t)(b * sb) + (lc.tb ? at(false, ldb, j, l) : at(false, ldb, l, j))];
          ref += x * y;
          mag += std::fabs(x * y);
        }
        if (gelu) ref = 0.5 * ref * (1 + std::tanh(std::sqrt(2 / M_PI) * (ref + 0.044715 * ref * ref * ref)));
        const size_t di = (size_t)(b * sd) + at(lc.rows_d, ldd, i, j);
        touched[di] = true;
        const double bound = 2 * ((lc.type == CUDA_R_16BF ? kUbf16 : kU32) * std::fabs(ref) + (k + 2) * kU32 * mag);
        if (!(std::fabs(got[di] - ref) <= bound) && bad++ == 0)
          MESSAGE("D[" << di << "] = " << got[di] << ", expected " << ref << " +- " << bound);
      }
  size_t changed = 0;
  for (size_t i = 0; i < got.size(); ++i) changed += !touched[i] && got[i] != D0[i];
  CHECK(bad == 0);
  CHECK(changed == 0);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
}

}  // namespace

TEST_CASE("cuBLASLt stand-in: layouts, orders, batch strides and the bias / GELU epilogues") {
  for (cudaDataType t : {CUDA_R_32F, CUDA_R_16BF})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_lt(LtCase{ta, tb, false, 6, 5, 7, 1, CUBLASLT_EPILOGUE_BIAS, t});
        check_lt(LtCase{ta, tb, true, 6, 5, 7, 2, CUBLASLT_EPILOGUE_DEFAULT, t});
        check_lt(LtCase{ta, tb, false, 5, 3, 9, 2, CUBLASLT_EPILOGUE_GELU_BIAS, t});
      }
  check_lt(LtCase{true, false, false, 4, 4, 4, 1, CUBLASLT_EPILOGUE_GELU, CUDA_R_32F});
}

TEST_CASE("cuBLASLt stand-in: an algorithm used with pointers less aligned than it was chosen for faults") {
  const ChildResult r = in_child([] {
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    float* buf = nullptr;
    cudaMalloc(&buf, 4096);
    cudaMemset(buf, 0, 4096);
    cublasLtMatmulDesc_t op;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayout_t l;
    cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 4, 4);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);  // MIN_ALIGNMENT_*: 256 bytes by default
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(lt, op, l, l, l, l, pref, 1, &heur, &found);
    const float one = 1, zero = 0;
    const cublasStatus_t aligned = cublasLtMatmul(lt, op, &one, buf, l, buf, l, &zero, buf + 64, l, buf + 64, l,
                                                  &heur.algo, nullptr, 0, nullptr);
    const cublasStatus_t off = cublasLtMatmul(lt, op, &one, buf + 1, l, buf, l, &zero, buf + 64, l, buf + 64, l,
                                              &heur.algo, nullptr, 0, nullptr);
    return found == 1 && aligned == CUBLAS_STATUS_SUCCESS && off == CUBLAS_STATUS_EXECUTION_FAILED &&
                   cudaDeviceSynchronize() == cudaErrorMisalignedAddress
               ? 0
               : 1;
  });
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("chosen for A aligned to 256 bytes, but A is aligned to 4") != std::string::npos);
}

TEST_CASE("cuBLASLt stand-in: inconsistent layouts and epilogues it does not emulate are refused") {
  cublasLtHandle_t lt;
  REQUIRE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t op;
  REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t a, b, d, bad_ld;
  REQUIRE(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 4, 3, 4) == 0);
  REQUIRE(cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, 3, 5, 3) == 0);
  REQUIRE(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, 4, 5, 4) == 0);
  REQUIRE(cublasLtMatrixLayoutCreate(&bad_ld, CUDA_R_32F, 4, 5, 3) == 0);  // ld below the rows
  cublasLtMatmulPreference_t pref;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == 0);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, d, d, pref, 1, &heur, &found) == CUBLAS_STATUS_SUCCESS);
  CHECK(found == 1);
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, b, a, d, d, pref, 1, &heur, &found) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, bad_ld, bad_ld, pref, 1, &heur, &found) ==
        CUBLAS_STATUS_INVALID_VALUE);
  const cublasLtEpilogue_t relu = CUBLASLT_EPILOGUE_RELU;
  REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu, sizeof relu) == 0);
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, d, d, pref, 1, &heur, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(found == 0);
  const int64_t wrong_size = 0;
  CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &wrong_size, sizeof wrong_size) ==
        CUBLAS_STATUS_INVALID_VALUE);
  for (auto l : {a, b, d, bad_ld}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
}
