// kernels/cublas_loader.cu: cuBLAS and cuBLASLt are opened (dlopen) when the CUDA backend first
// calls them, not when the program starts. Linked in, the two libraries (about 700 MB) were
// relocated at every start of train_gpt: 25,000 page faults, 70 ms of CPU for a `--help` or a
// `--device cpu` run, and a machine without them could not run the CPU backend at all. Each
// function the program calls is defined here with cuBLAS's own declaration (cublas_api.h,
// cublasLt.h: the compiler checks the parameters against it, and a name that is not the
// library's fails the link) and forwards to the library's symbol, looked up once.
//
// The emulated build has its own cuBLAS (tests/emu/cublas_emu.cpp) and compiles nothing here.
#ifndef TG_SIMT_EMULATION
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

#include "../data/errors.h"
#include "cublas_loader.h"

#define TG_CUBLAS_STR2(x) #x
#define TG_CUBLAS_STR(x) TG_CUBLAS_STR2(x)

namespace gpu {

const char* const kCublasSoname = "libcublas.so." TG_CUBLAS_STR(CUBLAS_VER_MAJOR);
const char* const kCublasLtSoname = "libcublasLt.so." TG_CUBLAS_STR(CUBLAS_VER_MAJOR);

void* open_library(const char* soname) {
  void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* why = dlerror();
    throw tg::RuntimeError(std::string("cannot load ") + soname + " (" + (why ? why : "no reason given") +
                           "); the CUDA backend needs cuBLAS " TG_CUBLAS_STR(CUBLAS_VER_MAJOR) ".x: install it (the "
                           "CUDA toolkit's lib64, or pip's nvidia-cublas) and put its folder on LD_LIBRARY_PATH, "
                           "or train with --device cpu");
  }
  return h;
}

void* cublas_symbol(CublasLib lib, const char* name) {
  static void* const cublas = open_library(kCublasSoname);  // (it loads cuBLASLt too: its dependency)
  static void* const lt = open_library(kCublasLtSoname);
  void* f = dlsym(lib == CublasLib::Blas ? cublas : lt, name);
  if (!f)
    throw tg::RuntimeError(std::string("cuBLAS has no ") + name + "; expected cuBLAS " TG_CUBLAS_STR(CUBLAS_VER_MAJOR)
                           ".x, the version train_gpt was built with; install it or rebuild train_gpt against yours");
  return f;
}

}  // namespace gpu

// RET NAME PARAMS, forwarding ARGS to the symbol NAME of LIB (for each of the list in
// kernels/cublas_loader.h)
#define TG_CUBLAS_FORWARD(LIB, RET, NAME, PARAMS, ARGS)                                          \
  RET NAME PARAMS {                                                                               \
    using Fn = RET(*) PARAMS;                                                                     \
    static const Fn fn = reinterpret_cast<Fn>(gpu::cublas_symbol(gpu::CublasLib::LIB, #NAME));   \
    return fn ARGS;                                                                               \
  }

TG_CUBLAS_FUNCTIONS(TG_CUBLAS_FORWARD)

#endif  // TG_SIMT_EMULATION
