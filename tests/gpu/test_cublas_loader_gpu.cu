// tests/gpu/test_cublas_loader_gpu.cu: kernels/cublas_loader.cu, which opens cuBLAS and cuBLASLt
// when the CUDA backend first calls them. Neither is a load-time dependency of the binaries built
// with it (this one included); every function the program calls resolves in the installed
// libraries; calls go through to them with their arguments (the descriptors are host objects, so
// no device is needed: an attribute of the wrong size is refused by cuBLASLt itself, and without a
// device cublasCreate returns a status, not a crash); a library that cannot be opened is one error
// that names it and says how to fix it. The emulated build has its own cuBLAS: not compiled there.
#ifndef TG_SIMT_EMULATION
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "../../data/errors.h"
#include "../../kernels/cublas_loader.h"
#include "gpu_util.cuh"

namespace {

std::string command_output(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  pclose(p);
  return out;
}

}  // namespace

TEST_CASE("cuBLAS loader: the libraries are opened on first use, every function the program calls resolves, calls go "
          "through") {
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string deps = command_output("ldd '" + exe + "' 2>&1");
  INFO("ldd: " << deps);
  CHECK(deps.find("libc.so") != std::string::npos);  // (ldd ran)
  CHECK(deps.find("libcublas") == std::string::npos);

#define TG_LOOKUP(LIB, RET, NAME, PARAMS, ARGS) \
  CHECK_MESSAGE(gpu::cublas_symbol(gpu::CublasLib::LIB, #NAME) != nullptr, #NAME);
  TG_CUBLAS_FUNCTIONS(TG_LOOKUP)
#undef TG_LOOKUP
  void* lt = dlopen(gpu::kCublasLtSoname, RTLD_LAZY | RTLD_NOLOAD);
  CHECK(lt != nullptr);  // opened by the lookups
  if (lt) dlclose(lt);

  // through the forwarders (the program's own calls), against the library's answers
  const auto direct = reinterpret_cast<const char* (*)(cublasStatus_t)>(
      gpu::cublas_symbol(gpu::CublasLib::Blas, "cublasGetStatusString"));
  CHECK(std::string(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) == direct(CUBLAS_STATUS_INVALID_VALUE));
  cublasLtMatmulDesc_t desc = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, 1) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t layout = nullptr;
  CHECK(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 64, 32, 64) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatrixLayoutDestroy(layout) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  const size_t ws = 1 << 20;
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
  if (!tg_test::gpu_available()) {  // no device: a status, not a crash
    cublasHandle_t h = nullptr;
    CHECK(cublasCreate(&h) != CUBLAS_STATUS_SUCCESS);
  }
}

TEST_CASE("cuBLAS loader: a library that cannot be opened is one error naming it, with the fix") {
  CHECK_THROWS_WITH_AS(gpu::open_library("libtg_no_such_library.so.0"),
                       doctest::Contains("cannot load libtg_no_such_library.so.0 ("), tg::RuntimeError);
  CHECK_THROWS_WITH_AS(gpu::open_library("libtg_no_such_library.so.0"), doctest::Contains("or train with --device cpu"),
                       tg::RuntimeError);
  CHECK_THROWS_WITH_AS(gpu::cublas_symbol(gpu::CublasLib::Lt, "cublasLtNoSuchFunction"),
                       doctest::Contains("cuBLAS has no cublasLtNoSuchFunction;"), tg::RuntimeError);
}

#endif  // TG_SIMT_EMULATION
