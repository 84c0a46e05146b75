# Makefile for train_gpt.
#   make / make train_gpt   build the trainer (nvcc when the CUDA toolkit is there, else g++)
#   make train              build, get the data, train (shakespeare-char on a GPU, baby on a CPU)
#   make test               build and run every test suite; last line "N passed, M failed, K skipped"
#   make train_gpt_emu      the trainer with its CUDA backend run by the SIMT emulator (tests/emu):
#                           --device cuda works on a machine without a GPU (slow by design)
#   make sanitize           the CPU suite built with AddressSanitizer + UBSan (in build-san/), run
#   make data               put tiny Shakespeare at data/tinyshakespeare/input.txt
#   make bench              benchmarks (never part of make test); make bench-cpu-peer: against nanoGPT
#   make gpu-profile        a training step's kernels counted under the emulator, against an H100 and an
#                           A100 roofline (modeled: no GPU needed)
#   make gpu-bundle         .gpu/: the GPU window's binaries (sm_90), data and peer, built here to travel
#                           to a lent GPU machine (bash .ci/gpu_check.sh window; docs/BENCHMARKS.md)
#   make clean
# Overrides: EIGEN_INC=-I/path DOCTEST_INC=-I/path JSON_INC=-I/path ARCH="80 90" NVCC=/path/nvcc TINYSHAKESPEARE=/path
#            UNITY=0 (compile the light CUDA files and the host files one by one, see CUDA_LIGHT,
#            COLD_UNITY_SRCS, LIGHT_UNITY_SRCS) COLD_OPT=-O3 (the cold host files, COLD_SRCS, at -O3 like the rest)
#            FUZZ_CXX=clang++ FUZZ_SECONDS=5 (the libFuzzer run in make test)
# (DOCTEST_INC is the folder that holds doctest/doctest.h, JSON_INC the one that holds
# nlohmann/json.hpp.)

SHELL := /bin/bash
comma := ,
.DEFAULT_GOAL := train_gpt
MAKEFLAGS += --no-print-directory

BUILD ?= build

# ---- tools and libraries, detected -------------------------------------------------------
# (each detection runs once: ":=" unless given on the command line or in the environment)
ifeq ($(origin NVCC),undefined)
  NVCC := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
endif
CUDA_HOME := $(if $(NVCC),$(patsubst %/bin/,%,$(dir $(realpath $(NVCC)))),)
GPU_CC := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '. ')
# Without a visible GPU, build device code for A100 (sm_80) and H100 (sm_90).
ARCH ?= $(if $(GPU_CC),$(GPU_CC),80 90)
GENCODE := $(foreach a,$(ARCH),-gencode arch=compute_$(a),code=sm_$(a))
ifeq ($(origin EIGEN_INC),undefined)
  EIGEN_INC := $(shell pkg-config --cflags-only-I eigen3 2>/dev/null || { test -d /usr/include/eigen3 && echo -I/usr/include/eigen3; })
endif
DOCTEST_INC ?=
JSON_INC ?=

HASH := \#
# (the header checks preprocess only: -fsyntax-only took 1.5 s for Eigen and 2.5 s for
# nlohmann-json, paid before every build starts)
EIGEN_OK := $(shell echo '$(HASH)include <Eigen/Core>' | $(CXX) $(EIGEN_INC) -x c++ -E - >/dev/null 2>&1 && echo yes)
DOCTEST_OK := $(shell echo '$(HASH)include <doctest/doctest.h>' | $(CXX) $(DOCTEST_INC) -x c++ -E - >/dev/null 2>&1 && echo yes)
# nlohmann-json (Debian's nlohmann-json3-dev, header-only): every JSON read or written
JSON_OK := $(shell echo '$(HASH)include <nlohmann/json.hpp>' | $(CXX) -std=c++17 $(JSON_INC) -x c++ -E - >/dev/null 2>&1 && echo yes)
# the reference BLAS behind the emulator's cuBLAS (Debian's libblas-dev)
BLAS_OK := $(shell echo 'extern "C" void sgemm_(); int main() { sgemm_(); }' | $(CXX) -x c++ - -lblas -o /dev/null 2>/dev/null && echo yes)
# SIMDe (Debian's libsimde-dev, header-only): AVX-512's intrinsics computed with AVX2, so that the
# float GEMM's AVX-512 kernel runs in a test on machines without AVX-512 (build/test_gemm_avx512)
SIMDE_OK := $(shell echo '$(HASH)include <simde/x86/avx512.h>' | $(CXX) -x c++ -E - >/dev/null 2>&1 && echo yes)
# libFuzzer comes with clang (Debian: apt-get install clang); without it the fuzz run is skipped
FUZZ_CXX ?= clang++
ifeq ($(origin FUZZ_OK),undefined)
  FUZZ_OK := $(shell echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' | $(FUZZ_CXX) -fsanitize=fuzzer -x c++ - -o /dev/null 2>/dev/null && echo yes)
endif
FUZZ_SECONDS ?= 5
# MPI (OpenMPI's mpicxx: Debian's libopenmpi-dev openmpi-bin): mpirun -np N ./train_gpt, data-parallel
# ranks (model/run/dist.cpp, the one file that includes mpi.h); without it train_gpt is one process
ifeq ($(origin MPI_CXXFLAGS),undefined)
  MPI_CXXFLAGS := $(shell mpicxx --showme:compile 2>/dev/null)
  MPI_LIBS := $(shell mpicxx --showme:link 2>/dev/null)
endif
MPI_OK := $(if $(MPI_LIBS),$(shell echo '$(HASH)include <mpi.h>' | $(CXX) $(MPI_CXXFLAGS) -x c++ -fsyntax-only - 2>/dev/null && echo yes),)
MPIRUN := $(if $(MPI_OK),$(shell command -v mpirun 2>/dev/null),)
# NCCL (the GPUs' all-reduce of a data-parallel CUDA run): nccl.h and libnccl in the CUDA toolkit or
# the system's folders
NCCL_INC := $(firstword $(foreach d,$(if $(CUDA_HOME),$(CUDA_HOME)/include,) /usr/include,$(if $(wildcard $(d)/nccl.h),$(d),)))
NCCL_LIBDIR := $(firstword $(foreach d,$(if $(CUDA_HOME),$(CUDA_HOME)/lib64 $(CUDA_HOME)/lib,) /usr/lib/x86_64-linux-gnu,$(if $(wildcard $(d)/libnccl.so),$(d),)))
NCCL_OK := $(if $(and $(NVCC),$(NCCL_INC),$(NCCL_LIBDIR)),yes,)

ifeq ($(MAKELEVEL),0)
$(info [make] nvcc:    $(if $(NVCC),$(NVCC) ($(shell $(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')),not found: building a CPU-only train_gpt with $(CXX)))
$(info [make] GPU:     $(if $(GPU_CC),compute capability $(GPU_CC),none visible)$(if $(NVCC),; device code for $(foreach a,$(ARCH),sm_$(a)),))
$(info [make] Eigen:   $(if $(EIGEN_OK),found ($(or $(EIGEN_INC),system path)),NOT FOUND (apt-get install libeigen3-dev, or EIGEN_INC=-I/path)))
$(info [make] doctest: $(if $(DOCTEST_OK),found ($(or $(DOCTEST_INC),system path)),NOT FOUND (apt-get install doctest-dev, or DOCTEST_INC=-I/path)))
$(info [make] JSON:    $(if $(JSON_OK),found nlohmann-json ($(or $(JSON_INC),system path)),NOT FOUND (apt-get install nlohmann-json3-dev, or JSON_INC=-I/path)))
$(info [make] BLAS:    $(if $(BLAS_OK),found (-lblas: the emulator's cuBLAS),NOT FOUND (apt-get install libblas-dev; needed by train_gpt_emu and the emulated tests)))
$(info [make] MPI:     $(if $(MPI_OK),found (mpicxx: $(MPI_LIBS)$(if $(MPIRUN),; $(MPIRUN),; no mpirun)): mpirun -np N ./train_gpt trains data-parallel,not found: train_gpt runs one process (apt-get install libopenmpi-dev openmpi-bin for mpirun -np N)))
$(info [make] NCCL:    $(if $(NCCL_OK),found ($(NCCL_INC)/nccl.h$(comma) $(NCCL_LIBDIR)/libnccl.so): the CUDA backend's data-parallel all-reduce,$(if $(NVCC),not found: data-parallel runs need --device cpu (NCCL's nccl.h and libnccl in the CUDA toolkit or /usr),no CUDA toolkit)))
$(info [make] SIMDe:   $(if $(SIMDE_OK),found (build/test_gemm_avx512 runs the AVX-512 GEMM kernel over it),NOT FOUND (apt-get install libsimde-dev; the AVX-512 GEMM kernel's emulated test is not built)))
$(info [make] fuzzer:  $(if $(FUZZ_OK),$(FUZZ_CXX) with libFuzzer (make test fuzzes the readers for $(FUZZ_SECONDS) s),no libFuzzer in $(FUZZ_CXX): the fuzz run of make test is skipped (apt-get install clang)))
endif

# ---- flags ---------------------------------------------------------------------------------
CXXFLAGS ?= -O3 -march=native
override CXXFLAGS += -std=c++17 -fopenmp -Wall -Wextra -I. $(EIGEN_INC) $(JSON_INC)
# nvcc's -O is the host compiler's level only (cicc and ptxas optimise the device code fully
# either way: their command lines are the same at -O1 and -O3, nvcc --dryrun): the host side of
# the .cu files is launch code, and -O1 compiles it in 60% of the time of -O3 (build/cuda_ops.cu:
# 6.4 -> 3.9 s)
NVCCFLAGS ?= -O1
override NVCCFLAGS += -std=c++17 $(GENCODE) -I. $(JSON_INC) -Xcompiler -fopenmp,-Wall
LDLIBS := -lgomp -lpthread $(if $(MPI_OK),$(MPI_LIBS),)
ifneq ($(NVCC),)
  # (cuBLAS and cuBLASLt are not linked: kernels/cublas_loader.cu opens them on first use; the run
  # path lets it find them where the build did)
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Xlinker -rpath=$(CUDA_HOME)/lib64 -lcurand -ldl \
    $(if $(NCCL_OK),-L$(NCCL_LIBDIR) -Xlinker -rpath=$(NCCL_LIBDIR) -lnccl,)
  CURAND_FLAGS := -DTG_HAVE_CURAND -I$(CUDA_HOME)/include
  override NVCCFLAGS += $(if $(NCCL_OK),-DTG_HAVE_NCCL -I$(NCCL_INC),)
endif
# what nvcc links with (it takes -L and -l, not the host compiler's other flags)
NVCC_LDLIBS := -lgomp -lpthread $(if $(MPI_OK),$(filter -L% -l%,$(MPI_LIBS)),)
# model/run/dist.cpp alone sees mpi.h
DIST_FLAGS := $(if $(MPI_OK),-DTG_HAVE_MPI $(MPI_CXXFLAGS),)

# ---- sources -------------------------------------------------------------------------------
# UNITY=1: the light CUDA files (CUDA_LIGHT), the cold host files (COLD_UNITY_SRCS) and the light
# host files (LIGHT_UNITY_SRCS) compile as one translation unit each; UNITY=0 compiles every file
# on its own
UNITY ?= 1
# the longest host compiles first (make -j starts prerequisites in the order listed)
HOST_FIRST := kernels/cpu/attention_tiled.cpp model/formats/json_io.cpp kernels/cpu/matmul.cpp
HOST_SRCS := $(HOST_FIRST) $(filter-out $(HOST_FIRST),$(wildcard kernels/cpu/*.cpp) $(wildcard model/*/*.cpp) $(wildcard data/*.cpp))
# Host files with no loop that a training step, the data's start-up (sha256, the tokenizer, the
# loader) or a checkpoint's bytes (CRC-32 in model/formats/ckpt_io.cpp) run: flag parsing, JSON, the run
# directory, plots, the checkpoint and safetensors bookkeeping and look-ups, the one-shot --init-from and HF
# export conversions, the MPI wrappers, the signal handler, main(). They compile at COLD_OPT in place of -O3, which
# halves their compile time (-O2 saves almost nothing); every other host file (kernels/cpu/,
# model/net/gpt*.cpp, backend_cpu.cpp, train.cpp's step and sampling loops, data/, ckpt_io.cpp)
# keeps CXXFLAGS' -O3. COLD_OPT=-O3 compiles them all alike.
COLD_OPT ?= -O1
COLD_SRCS := model/run/config.cpp model/formats/json_io.cpp model/run/run_dir.cpp model/formats/plot.cpp \
             model/formats/checkpoint.cpp model/formats/ckpt_lookup.cpp model/formats/safetensors.cpp \
             model/formats/hf_export.cpp model/formats/init_from.cpp model/run/stop.cpp model/run/dist.cpp
# Nine of them (not json_io.cpp, the one that parses nlohmann-json, nor dist.cpp, the one that
# sees mpi.h) compile as one translation unit, $(BUILD)/host_cold.cpp, a generated list of
# #includes like $(BUILD)/cuda_ops.cu: each parses the same standard and project headers (about
# 1 s of CPU a file), 16.5 s one by one, 8.6 s together. Their file-local names must then differ
# (an anonymous namespace is one per translation unit). UNITY=0 compiles them one by one.
COLD_UNITY_SRCS := model/run/config.cpp model/run/run_dir.cpp model/formats/plot.cpp model/formats/checkpoint.cpp \
                   model/formats/ckpt_lookup.cpp model/formats/safetensors.cpp model/formats/hf_export.cpp \
                   model/formats/init_from.cpp model/run/stop.cpp
# Likewise the light host files at -O3 outside the CPU reference, as $(BUILD)/host_light.cpp:
# 15.7 s one by one, 9.8 s together (the data loader, the tokenizer and sha256 as fast as before).
# kernels/cpu/ stays apart (the double build compiles it again).
LIGHT_UNITY_SRCS := model/run/train.cpp data/tokens.cpp model/net/backend_cpu.cpp data/dataset.cpp \
                    model/formats/ckpt_io.cpp model/net/gpt.cpp model/net/attention_check.cpp data/sha256.cpp \
                    model/net/backend.cpp
ifeq ($(UNITY),0)
  HOST_OBJS := $(HOST_SRCS:%.cpp=$(BUILD)/%.o)
else
  HOST_OBJS := $(BUILD)/host_cold.o $(BUILD)/host_light.o \
    $(patsubst %.cpp,$(BUILD)/%.o,$(filter-out $(COLD_UNITY_SRCS) $(LIGHT_UNITY_SRCS),$(HOST_SRCS)))
endif
CUDA_SRCS := $(wildcard kernels/*.cu) $(wildcard model/*/*.cu)
# The small CUDA files compile as one translation unit, $(BUILD)/cuda_ops.cu, a generated list
# of #includes: nvcc's fixed cost (cudafe, a device pass per architecture, the host compile of
# the CUDA headers: about 3 s of CPU a file on 2 cores) is paid once instead of 13 times, 21 s
# instead of 63 s. The two flash files, the heavy ones, stay separate so that make -j builds them
# beside it, longest first: the flash backward, cuda_ops, the flash forward (make starts
# prerequisites in the order listed). UNITY=0 compiles every file on its own.
# The Hopper kernels compile apart too, for sm_90a alone (HOPPER_GENCODE: their instructions
# exist nowhere else), whatever ARCH is.
HOPPER_SRCS := kernels/flash_attn_hopper.cu
HOPPER_OBJS := $(HOPPER_SRCS:%.cu=$(BUILD)/%.o)
HOPPER_GENCODE := -gencode arch=compute_90a,code=sm_90a
CUDA_HEAVY := kernels/flash_attn_bwd.cu kernels/flash_attn_fwd.cu $(HOPPER_SRCS)
CUDA_LIGHT := $(filter-out $(CUDA_HEAVY),$(CUDA_SRCS))
ifeq ($(UNITY),0)
  CUDA_OBJS := $(CUDA_SRCS:%.cu=$(BUILD)/%.o)
else
  CUDA_OBJS := $(BUILD)/kernels/flash_attn_bwd.o $(BUILD)/cuda_ops.o $(BUILD)/kernels/flash_attn_fwd.o $(HOPPER_OBJS)
endif
# The CPU reference in double (the tests' gradient checks and fp64 references): the sources
# below compiled a second time with TG_CPU_DOUBLE, which instantiates double in place of float,
# into $(BUILD)/double/, and linked into the test binaries only; train_gpt compiles float alone.
# (A file listed here must keep everything but its double instantiations out of that build.)
# (kernels/cpu/gemm.cpp is float alone: nothing in it to instantiate in double.)
CPU_DOUBLE_SRCS := $(filter-out kernels/cpu/gemm.cpp,$(wildcard kernels/cpu/*.cpp)) model/net/gpt_cpu.cpp
CPU_DOUBLE_OBJS := $(CPU_DOUBLE_SRCS:%.cpp=$(BUILD)/double/%.o)
TEST_CPU_SRCS := $(wildcard tests/cpu/*.cpp)
TEST_CPU_OBJS := $(TEST_CPU_SRCS:%.cpp=$(BUILD)/%.o)
# doctest's implementation, one object linked into every test binary (tests/common/doctest_impl.cpp)
DOCTEST_IMPL := $(BUILD)/tests/common/doctest_impl.o
TEST_GPU_SRCS := $(wildcard tests/gpu/*.cu)
# The GPU suite's files (but the Hopper instructions' own test, built for sm_90a) compile as one
# translation unit, $(BUILD)/test_gpu_unity.cu, as cuda_ops.cu: nvcc's fixed cost (4 s of CPU a
# file) once instead of eight times. UNITY=0 compiles them one by one.
TEST_GPU_UNITY_SRCS := $(filter-out tests/gpu/test_hopper_ptx.cu,$(TEST_GPU_SRCS))
ifeq ($(UNITY),0)
  TEST_GPU_OBJS := $(TEST_GPU_SRCS:%.cu=$(BUILD)/%.o)
else
  TEST_GPU_OBJS := $(BUILD)/test_gpu_unity.o $(BUILD)/tests/gpu/test_hopper_ptx.o
endif
BENCH_GPU_SRCS := $(wildcard tests/bench/*.cu)
BENCH_GPU_OBJS := $(BENCH_GPU_SRCS:%.cu=$(BUILD)/%.o)

# ---- the emulator build (tests/emu): the CUDA sources, unmodified, compiled by g++ as C++ with
# the SIMT emulator's header forced in first; its runtime, cuBLAS / cuBLASLt (over the reference
# BLAS) and NCCL (over MPI: tests/emu/nccl_emu.cpp) stand-ins linked in place of NVIDIA's
# libraries; AddressSanitizer and UndefinedBehaviorSanitizer on, every report fatal. Needs the
# CUDA headers only, no GPU. -g1: the line tables that the sanitizers' and the race checker's
# reports name file:line from, without the variables' debug information (-g took a third longer
# to compile). -Wno-psabi: kernels take a CUtensorMap (128-byte aligned) by value, and g++ notes
# that GCC 4.6 changed how such arguments are passed, which concerns no object here.
EMU_BUILD := $(BUILD)/emu
EMU_FLAGS := -std=c++17 -O2 -g1 -fno-omit-frame-pointer -fopenmp -Wall -Wextra -Wno-unknown-pragmas -Wno-psabi -I. $(JSON_INC) \
  -DTG_SIMT_EMULATION -DTG_HAVE_NCCL -Itests/emu/include -I$(CUDA_HOME)/include \
  -fsanitize=address,undefined -fno-sanitize-recover=all
EMU_LIB_OBJS := $(patsubst %.cpp,$(EMU_BUILD)/%.o,tests/emu/simt_emulator.cpp tests/emu/hw_rounding.cpp tests/emu/cuda_runtime_emu.cpp tests/emu/cublas_emu.cpp \
  tests/emu/nccl_emu.cpp tests/emu/access_hook.cpp tests/emu/kernel_profiler.cpp tests/emu/race_checker.cpp tests/emu/hopper_emu.cpp)
EMU_CUDA_OBJS := $(CUDA_SRCS:%.cu=$(EMU_BUILD)/%.o)
# The kernel files carry the memory hook (tests/emu/access_hook.h): GCC's ThreadSanitizer
# instrumentation in place of AddressSanitizer's (the hook does AddressSanitizer's check), with
# no runtime linked; vectorisation and store merging off, so every access keeps the width the
# source gives it.
EMU_HOOK_FLAGS := $(filter-out -fsanitize=address$(comma)undefined,$(EMU_FLAGS)) -fsanitize=thread,undefined \
  --param tsan-instrument-func-entry-exit=0 -fno-tree-vectorize -fno-tree-slp-vectorize -fno-store-merging
# Each emulator object compiles with one of five sets of flags, EMU_FLAGS_<set>, the set named by
# emu_set from the object's path:
# - lib: the emulator itself at -O3: its fibers, barriers and memory hook are most of an emulated
#   test's time (-O3 took 9% off two flash and counter cases: 19.4-20.0 s to 17.7-17.8 s); for the
#   host build's machine (CXXFLAGS' -march), so that the tensor-core products' fmaf is an
#   instruction, not a call into libm, and no contraction: every rounding stays the one the source
#   writes;
# - hook: the kernel files, and the three test files that hold kernels of their own (the
#   profiler's, the race checker's and the Hopper instructions' tests);
# - test, test0: the emulated suite's own files (tests/gpu, tests/emu/test_*) at -O1, as the CPU
#   suite's, those of TEST_O0_SRCS at -O0: the kernels, the emulator and the CPU reference they call
#   keep their -O2 / -O3;
# - base: the rest (the CUDA backend, train_gpt.cu, the tools beside the suite).
EMU_FLAGS_base := $(EMU_FLAGS)
EMU_FLAGS_lib := $(EMU_FLAGS) -O3 $(filter -march=% -mtune=%,$(CXXFLAGS)) -ffp-contract=off
EMU_FLAGS_hook := $(EMU_HOOK_FLAGS)
EMU_FLAGS_test := $(EMU_FLAGS) -O1
EMU_FLAGS_test0 := $(EMU_FLAGS) -O0
EMU_HOOKED_TESTS := $(patsubst %,$(EMU_BUILD)/tests/emu/%.o,test_kernel_profiler test_race_checker test_hopper)
emu_set = $(strip $(if $(filter $(EMU_LIB_OBJS),$1),lib,$(if $(filter $(EMU_BUILD)/kernels/% $(EMU_HOOKED_TESTS),$1),hook,$(if \
  $(filter $(TEST_O0_SRCS:%.cpp=$(EMU_BUILD)/%.o),$1),test0,$(if $(filter $(TEST_EMU_OBJS),$1),test,base)))))
# The forced include precompiled, once a set (build/emu/pch/<set>/simt_emulator.h.gch, of a
# one-line header that includes tests/emu/simt_emulator.h): it and the CUDA and standard headers it
# pulls in were 0.8-1.4 s of each object's compile. GCC takes a precompiled header only where it
# was made with the same options, and one made at another -O level is taken without a word and the
# code then differs: so the header and its objects compile with the one variable.
emu_pch = $(EMU_BUILD)/pch/$(call emu_set,$1)/simt_emulator.h
emu_compile = $(CXX) $(EMU_FLAGS_$(call emu_set,$@)) $1 -include $(call emu_pch,$@) -MMD -MP -c $< -o $@
# -static-libasan: AddressSanitizer's runtime linked in, so that its thread-local state, read at
# every fiber switch, is the executable's own (with the shared runtime each read went through
# __tls_get_addr: about 5% of an emulated model test)
EMU_LIBS := -fsanitize=address,undefined -static-libasan -lblas -ldl $(LDLIBS)
# the emulated test suite: the GPU suite (tests/gpu, with its main) and the emulator's own tests
TEST_EMU_SRCS := $(wildcard tests/emu/test_*.cpp)
TEST_EMU_OBJS := $(TEST_EMU_SRCS:%.cpp=$(EMU_BUILD)/%.o) $(TEST_GPU_SRCS:%.cu=$(EMU_BUILD)/%.o)

# build/test_gemm_avx512: the float GEMM's tests (tests/cpu/test_gemm.cpp) and the model's
# (tests/cpu/test_model.cpp) with kernels/cpu/gemm.cpp compiled over SIMDe's AVX-512
# (TG_GEMM_AVX512_SIMDE): gemm_f32 then runs the AVX-512 kernel's code, each 512-bit operation
# done as two 256-bit ones. Built where SIMDe is found and the host build has AVX2 and FMA (a
# native AVX-512 build runs the real kernel in build/test_cpu instead).
HOST_DEFS := $(shell $(CXX) $(CXXFLAGS) -dM -E -x c++ /dev/null 2>/dev/null)
GEMM_AVX512_EMU := $(if $(and $(SIMDE_OK),$(findstring __AVX2__,$(HOST_DEFS)),$(findstring __FMA__,$(HOST_DEFS)),$(if \
  $(findstring __AVX512F__,$(HOST_DEFS)),,yes)),$(BUILD)/test_gemm_avx512,)
TEST_BINS := $(BUILD)/test_cpu $(GEMM_AVX512_EMU) $(if $(NVCC),$(BUILD)/test_gpu $(BUILD)/test_emu,)

# tests/fuzz: a libFuzzer target over the readers of untrusted bytes (checkpoints, config text,
# command line), built by clang++ with ASan and UBSan from the few sources it reads with
# (-gline-tables-only: a crash's report names file:line; full debug information took 12% longer)
FUZZ_SRCS := tests/fuzz/fuzz_readers.cpp model/run/config.cpp model/formats/checkpoint.cpp model/formats/safetensors.cpp \
             model/formats/json_io.cpp model/formats/ckpt_io.cpp model/formats/ckpt_lookup.cpp model/net/gpt.cpp \
             model/formats/init_from.cpp model/formats/hf_export.cpp data/dataset.cpp data/tokens.cpp data/sha256.cpp \
             data/bpe.cpp data/bpe_files.cpp data/tokenize.cpp
FUZZ_BIN := $(if $(FUZZ_OK),$(BUILD)/fuzz_readers,)

.PHONY: FORCE all train test test-run sanitize data bench bench-cpu-peer interop tokenizer-check plot clean deps gpu-bundle gpu-profile hopper-ptx-check
BENCH_GPU_BINS := $(if $(NVCC),$(BUILD)/bench_gpu $(BUILD)/bench_step,)
all: train_gpt $(if $(NVCC),train_gpt_emu $(BUILD)/gpu_profile $(BUILD)/kernel_occupancy $(BUILD)/bench_gpu_emu,) $(TEST_BINS) $(FUZZ_BIN) $(BUILD)/bench_cpu $(BUILD)/bench_gemm $(BUILD)/bench_bpe $(BENCH_GPU_BINS)

$(BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(CURAND_FLAGS) $(if $(findstring tests/,$<),$(DOCTEST_INC),) $(if $(filter model/run/dist.cpp,$<),$(DIST_FLAGS),) -MMD -MP -c $< -o $@

$(BUILD)/double/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(CURAND_FLAGS) -DTG_CPU_DOUBLE -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(if $(findstring tests/,$<),$(DOCTEST_INC),) -MMD -MP -c $< -o $@

# (and the GPU suite's tests of the Hopper instructions themselves, tests/gpu/test_hopper_ptx.cu)
$(HOPPER_OBJS) $(BUILD)/tests/gpu/test_hopper_ptx.o: $(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(filter-out -gencode arch=%,$(NVCCFLAGS)) $(HOPPER_GENCODE) $(if $(findstring tests/,$<),$(DOCTEST_INC),) -MMD -MP -c $< -o $@

# (COLD_OPT: see COLD_SRCS above)
$(COLD_SRCS:%.cpp=$(BUILD)/%.o) $(BUILD)/host_cold.o $(BUILD)/train_gpt.o: CXXFLAGS += $(COLD_OPT)

# the CPU tests' own files: -O1 (the code they test is built at -O3 as everywhere): their compile
# took 100 s of CPU in a fresh build at -O3, mostly doctest's expansion, and -O1 compiles them in
# about 60% of that. The test files whose cases mostly start processes and wait for them, or check
# a few values (TEST_O0_SRCS), compile at -O0: 28 s of CPU less a fresh build for the first twelve,
# their runs as long (each file's cases timed at -O1 and -O0: the differences within the runs'
# spread, +-2 s).
TEST_O0_SRCS := tests/cpu/test_cli.cpp tests/cpu/test_checkpoint.cpp tests/cpu/test_run_dir.cpp tests/cpu/test_init_from.cpp \
                tests/cpu/test_dist.cpp tests/cpu/test_bpe_cli.cpp tests/cpu/test_tokens.cpp tests/emu/test_emu_cli.cpp \
                tests/emu/test_occupancy.cpp tests/emu/test_cublas_emu.cpp tests/emu/test_emulator.cpp tests/emu/test_flash_emu.cpp \
                tests/cpu/test_run_all.cpp
$(filter-out $(TEST_O0_SRCS:%.cpp=$(BUILD)/%.o),$(TEST_CPU_OBJS)) $(DOCTEST_IMPL): CXXFLAGS += -O1
$(filter $(TEST_O0_SRCS:%.cpp=$(BUILD)/%.o),$(TEST_CPU_OBJS)): CXXFLAGS += -O0

# AdamW's loop vectorises only when std::sqrt need not set errno (its argument is never
# negative there); the rest of the build keeps errno semantics (no vector libm calls)
$(BUILD)/kernels/cpu/adamw.o: CXXFLAGS += -fno-math-errno

# $(call write_unity,WHAT,FILES): the recipe that writes $@, a translation unit of one #include a
# file. The list is rewritten only when it changes (a file added or removed), so an unchanged
# tree does not recompile it.
define write_unity
	@mkdir -p $(dir $@)
	@printf '%s\n' '// generated by the Makefile: $(1) as one translation unit' \
	  $(foreach f,$(2),'$(HASH)include "$(f)"') > $@.tmp
	@if cmp -s $@.tmp $@; then rm $@.tmp; else mv $@.tmp $@; fi
endef

$(BUILD)/cuda_ops.cu: FORCE
	$(call write_unity,the light CUDA files,$(CUDA_LIGHT))

$(BUILD)/cuda_ops.o: $(BUILD)/cuda_ops.cu
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# the same for the host files that compile as one: host_cold.cpp lists COLD_UNITY_SRCS,
# host_light.cpp LIGHT_UNITY_SRCS
HOST_UNITY_cold := $(COLD_UNITY_SRCS)
HOST_UNITY_light := $(LIGHT_UNITY_SRCS)
$(BUILD)/host_cold.cpp $(BUILD)/host_light.cpp: $(BUILD)/host_%.cpp: FORCE
	$(call write_unity,the $* host files,$(HOST_UNITY_$*))

$(BUILD)/test_gpu_unity.cu: FORCE
	$(call write_unity,the GPU suite (tests/gpu),$(TEST_GPU_UNITY_SRCS))

$(BUILD)/test_gpu_unity.o: $(BUILD)/test_gpu_unity.cu
	$(NVCC) $(NVCCFLAGS) $(DOCTEST_INC) -MMD -MP -c $< -o $@

$(BUILD)/host_cold.o $(BUILD)/host_light.o: $(BUILD)/%.o: $(BUILD)/%.cpp
	$(CXX) $(CXXFLAGS) $(CURAND_FLAGS) -MMD -MP -c $< -o $@

# train_gpt.cu holds no device code (the backend factory, model/net/backend.h, asks the CUDA
# backend for devices): g++ compiles it in 3 s of CPU where nvcc took 9
$(BUILD)/train_gpt.o: train_gpt.cu
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -x c++ -MMD -MP -c $< -o $@

FORCE:

ifneq ($(NVCC),)
# (the same link into the build folder: the GPU bundle's build, make gpu-bundle)
train_gpt $(BUILD)/train_gpt_cuda: $(CUDA_OBJS) $(BUILD)/train_gpt.o $(HOST_OBJS)
	$(NVCC) $(GENCODE) -o $@ $^ $(CUDA_LIBS) $(NVCC_LDLIBS)
else
train_gpt: train_gpt.cu $(HOST_OBJS)
	@echo "[make] no CUDA toolkit: train_gpt is CPU-only"
	$(CXX) $(CXXFLAGS) -x c++ train_gpt.cu -x none $(HOST_OBJS) -o $@ $(LDLIBS)
endif

# train_gpt built by the host compiler alone, into the build folder (make sanitize)
$(BUILD)/train_gpt_host: train_gpt.cu $(HOST_OBJS)
	$(CXX) $(CXXFLAGS) -x c++ train_gpt.cu -x none $(HOST_OBJS) -o $@ $(LDLIBS)

# (its sources as one translation unit, $(BUILD)/fuzz_unity.cpp: each parsed nlohmann-json and
# instantiated its templates again; one unit took 39 s of CPU where the sixteen took 49 s)
$(BUILD)/fuzz_unity.cpp: FORCE
	$(call write_unity,the fuzz target (tests/fuzz) and the readers it calls,$(FUZZ_SRCS))

$(BUILD)/fuzz_readers: $(BUILD)/fuzz_unity.cpp $(FUZZ_SRCS) $(wildcard model/*/*.h data/*.h tests/fuzz/*.h) kernels/philox.h
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) -std=c++17 -O1 -gline-tables-only -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. $(JSON_INC) $< -o $@

$(BUILD)/test_cpu: $(TEST_CPU_OBJS) $(DOCTEST_IMPL) $(HOST_OBJS) $(CPU_DOUBLE_OBJS)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(if $(NVCC),-L$(CUDA_HOME)/lib64 -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64 -lcurand,) $(LDLIBS)

$(BUILD)/simde/kernels/cpu/gemm.o: kernels/cpu/gemm.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -Wno-psabi -DTG_GEMM_AVX512_SIMDE -MMD -MP -c $< -o $@

$(BUILD)/test_gemm_avx512: $(BUILD)/tests/cpu/main.o $(DOCTEST_IMPL) $(BUILD)/tests/cpu/test_gemm.o $(BUILD)/tests/cpu/test_model.o \
    $(BUILD)/simde/kernels/cpu/gemm.o $(filter-out $(BUILD)/kernels/cpu/gemm.o,$(HOST_OBJS)) $(CPU_DOUBLE_OBJS)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(if $(NVCC),-L$(CUDA_HOME)/lib64 -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64 -lcurand,) $(LDLIBS)

$(BUILD)/test_gpu: $(TEST_GPU_OBJS) $(DOCTEST_IMPL) $(CUDA_OBJS) $(HOST_OBJS) $(CPU_DOUBLE_OBJS)
	$(NVCC) $(GENCODE) -o $@ $^ $(CUDA_LIBS) $(NVCC_LDLIBS)

# (emu_set and the precompiled header: above; each object depends on its set's, by the second
# expansion of its prerequisites)
.SECONDEXPANSION:
$(EMU_BUILD)/%.o: %.cu $$(call emu_pch,$$@).gch
	@mkdir -p $(dir $@)
	$(call emu_compile,$(if $(findstring tests/,$<),$(DOCTEST_INC),) -x c++)

$(EMU_BUILD)/%.o: %.cpp $$(call emu_pch,$$@).gch
	@mkdir -p $(dir $@)
	$(call emu_compile,$(EIGEN_INC) $(DOCTEST_INC))

$(EMU_BUILD)/pch/%/simt_emulator.h.gch:
	@mkdir -p $(dir $@)
	@echo '#include "tests/emu/simt_emulator.h"' > $(@:.gch=)
	$(CXX) $(EMU_FLAGS_$*) -x c++-header -MMD -MP -MF $(@:.gch=.d) -MT $@ -c $(@:.gch=) -o $@
# (kept, though no rule names them: make would delete them as intermediate files)
.SECONDARY: $(foreach s,base lib hook test test0,$(EMU_BUILD)/pch/$s/simt_emulator.h.gch)
-include $(wildcard $(EMU_BUILD)/pch/*/simt_emulator.h.d)

train_gpt_emu: $(EMU_BUILD)/train_gpt.o $(EMU_CUDA_OBJS) $(EMU_LIB_OBJS) $(HOST_OBJS)
	$(CXX) -o $@ $^ $(EMU_LIBS)

# the attention benchmark under the emulator: the GPU window's rehearsal runs it on tiny shapes
$(BUILD)/bench_gpu_emu: $(EMU_BUILD)/tests/bench/bench_attention.o $(EMU_CUDA_OBJS) $(EMU_LIB_OBJS) $(HOST_OBJS)
	$(CXX) -o $@ $^ $(EMU_LIBS)

$(BUILD)/test_emu: $(TEST_EMU_OBJS) $(DOCTEST_IMPL) $(EMU_CUDA_OBJS) $(EMU_LIB_OBJS) $(HOST_OBJS) $(CPU_DOUBLE_OBJS)
	$(CXX) -o $@ $^ $(EMU_LIBS)

# ---- kernel resources: the registers, spill stores and loads, stack frame, static shared and
# local memory of every CUDA kernel, per architecture, from the real nvcc build, and their
# theoretical occupancy on an A100 and an H100, without a GPU. The objects of CUDA_OBJS compile
# with nvcc --resource-usage through tests/emu/kernel_resources.sh, which keeps ptxas's report
# beside each (build/kernels/flash_attn_fwd.ptxas, ...; why ptxas and not cuobjdump: that
# script's header). $(BUILD)/kernel_resources.txt is those reports as one table, read by
# tests/emu/occupancy.h: in build/test_emu (make test passes it as TG_KERNEL_RESOURCES) and by
# $(BUILD)/kernel_occupancy, which prints it with each flash kernel's occupancy.
ifneq ($(NVCC),)
# (override: NVCC=/path/nvcc on the command line still goes through the script)
$(CUDA_OBJS): override NVCC := bash tests/emu/kernel_resources.sh nvcc $(NVCC)
# an object built without its report (before this rule existed, or the report deleted) is built again
$(filter-out $(patsubst %.ptxas,%.o,$(wildcard $(CUDA_OBJS:.o=.ptxas))),$(CUDA_OBJS)): FORCE

$(BUILD)/kernel_resources.txt: $(CUDA_OBJS) tests/emu/kernel_resources.sh
	bash tests/emu/kernel_resources.sh table "$(ARCH)" $(filter-out $(HOPPER_OBJS),$(CUDA_OBJS)) > $@.tmp || { rm -f $@.tmp; exit 1; }
	bash tests/emu/kernel_resources.sh table 90a $(HOPPER_OBJS) > $(BUILD)/kernel_resources_hopper.txt
	mv $@.tmp $@
	@echo "[make] $@: $$(grep -vc '^#' $@) kernels x architectures ($(foreach a,$(ARCH),sm_$(a))), $$(grep -v '^#' $@ | grep -Evc 'spill_stores=0 spill_loads=0 stack=0 smem=[0-9]+ lmem=0') with spills or local memory"
	@echo "[make] $(BUILD)/kernel_resources_hopper.txt: $$(grep -vc '^#' $(BUILD)/kernel_resources_hopper.txt) kernels (sm_90a), $$(grep -v '^#' $(BUILD)/kernel_resources_hopper.txt | grep -Evc 'spill_stores=0 spill_loads=0 stack=0 smem=[0-9]+ lmem=0') with spills or local memory"

# the emulated suite reads the table (tests/emu/test_occupancy.cpp) and links the calculator
$(BUILD)/test_emu: $(EMU_BUILD)/tests/emu/occupancy.o | $(BUILD)/kernel_resources.txt

# build/gpu_profile (make gpu-profile): a training step's kernels, counted by the emulator's
# profiler, against a roofline (tests/emu/gpu_profile.cpp)
$(BUILD)/gpu_profile: $(EMU_BUILD)/tests/emu/gpu_profile.o $(EMU_BUILD)/tests/emu/occupancy.o $(EMU_CUDA_OBJS) \
    $(EMU_LIB_OBJS) $(HOST_OBJS) | $(BUILD)/kernel_resources.txt
	$(CXX) -o $@ $^ $(EMU_LIBS)

# make gpu-profile: that table for shakespeare-char (flash, with the scaling's check, and naive) and
# gpt2-124m (flash), each on an H100 SXM and an A100 SXM (modeled times: docs/BENCHMARKS.md)
gpu-profile: $(BUILD)/gpu_profile $(BUILD)/kernel_resources.txt
	$(BUILD)/gpu_profile --preset shakespeare-char --attention flash --check
	$(BUILD)/gpu_profile --preset shakespeare-char --attention naive
	$(BUILD)/gpu_profile --preset gpt2-124m --attention flash

# make hopper-ptx-check: kernels/hopper_ptx.cuh's wrappers through nvcc and ptxas for sm_90a, every
# instruction they wrap found in the PTX; and for sm_80, where they are left out (about 2 s; not
# part of make test, which emulates them: tests/emu/test_hopper.cpp)
HOPPER_PTX_OPS := mbarrier.init mbarrier.arrive.shared mbarrier.arrive.expect_tx mbarrier.expect_tx mbarrier.complete_tx \
  mbarrier.try_wait.parity mbarrier.test_wait.parity cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes stmatrix.sync.aligned.m8n8.x4.shared.b16 stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 elect.sync fence.mbarrier_init fence.proxy.async wgmma.fence wgmma.commit_group wgmma.wait_group \
  ld.acquire.gpu.global.b32 ld.relaxed.gpu.global.b32 fence.acq_rel.gpu st.relaxed.gpu.global.b32 \
  $(foreach n,8 16 32 64 128 256,wgmma.mma_async.sync.aligned.m64n$(n)k16.f32.bf16.bf16)
hopper-ptx-check: tests/emu/hopper_ptx_check.cu kernels/hopper_ptx.cuh
	@mkdir -p $(BUILD)/hopper
	$(NVCC) -std=c++17 -arch=sm_90a -ptx $< -o $(BUILD)/hopper/check_sm90a.ptx
	$(NVCC) -std=c++17 -arch=sm_90a -cubin $< -o $(BUILD)/hopper/check_sm90a.cubin
	@for op in $(HOPPER_PTX_OPS); do grep -q "$$op" $(BUILD)/hopper/check_sm90a.ptx || { echo "hopper-ptx-check: $$op missing from the sm_90a PTX"; exit 1; }; done
	$(NVCC) -std=c++17 -arch=sm_80 -ptx $< -o $(BUILD)/hopper/check_sm80.ptx
	@! grep -q "wgmma\|mbarrier" $(BUILD)/hopper/check_sm80.ptx || { echo "hopper-ptx-check: Hopper PTX in the sm_80 build"; exit 1; }
	@echo "hopper-ptx-check: $(words $(HOPPER_PTX_OPS)) instructions in the sm_90a PTX, none for sm_80"

# build/kernel_occupancy [FILE]: plain g++, no emulator, no sanitizers
$(BUILD)/tests/emu/occupancy.o: CXXFLAGS += -I$(CUDA_HOME)/include
$(BUILD)/kernel_occupancy: $(BUILD)/tests/emu/kernel_occupancy_main.o $(BUILD)/tests/emu/occupancy.o
	$(CXX) $(CXXFLAGS) -o $@ $^
-include $(BUILD)/tests/emu/occupancy.d $(BUILD)/tests/emu/kernel_occupancy_main.d $(EMU_BUILD)/tests/emu/occupancy.d
endif

$(BUILD)/bench_cpu: tests/bench/bench_cpu.cpp $(HOST_OBJS)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

# GPT-2's BPE encoder, MB/s, one thread and every core (tests/bench/bench_bpe.cpp); make bench
# runs tiktoken beside it on the same texts
$(BUILD)/bench_bpe: tests/bench/bench_bpe.cpp $(HOST_OBJS)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

# the float products of one CPU step on their exact shapes: Eigen against kernels/cpu/gemm.cpp
$(BUILD)/bench_gemm: tests/bench/bench_gemm.cpp $(HOST_OBJS)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

# GPU benchmarks, one binary each: bench_gpu (attention kernels, tests/bench/bench_attention.cu)
# and bench_step (a whole training step against T, tests/bench/bench_step.cu)
$(BUILD)/bench_gpu: $(BUILD)/tests/bench/bench_attention.o $(CUDA_OBJS) $(HOST_OBJS)
	$(NVCC) $(GENCODE) -o $@ $^ $(CUDA_LIBS) $(NVCC_LDLIBS)

$(BUILD)/bench_step: $(BUILD)/tests/bench/bench_step.o $(CUDA_OBJS) $(HOST_OBJS)
	$(NVCC) $(GENCODE) -o $@ $^ $(CUDA_LIBS) $(NVCC_LDLIBS)

# ---- dependencies: install on Debian/Ubuntu as root, else say the exact command ---------
deps:
	@if [ -z "$(EIGEN_OK)" ] || [ -z "$(DOCTEST_OK)" ] || [ -z "$(BLAS_OK)" ] || [ -z "$(JSON_OK)" ] || [ -z "$(MPIRUN)" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "[make] installing Eigen, doctest, nlohmann-json, the reference BLAS, OpenMPI and SIMDe with apt-get"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libeigen3-dev doctest-dev nlohmann-json3-dev libblas-dev libopenmpi-dev openmpi-bin libsimde-dev) >/dev/null || exit 1; \
	  else \
	    echo "error: Eigen, doctest, nlohmann-json, the reference BLAS or OpenMPI is missing; install them with: sudo apt-get install -y libeigen3-dev doctest-dev nlohmann-json3-dev libblas-dev libopenmpi-dev openmpi-bin libsimde-dev (or pass EIGEN_INC=-I/path DOCTEST_INC=-I/path JSON_INC=-I/path)" >&2; exit 1; \
	  fi; \
	elif [ -z "$(SIMDE_OK)" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "[make] installing SIMDe with apt-get (the AVX-512 GEMM kernel's test on this machine)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libsimde-dev) >/dev/null || exit 1; \
	fi

# ---- the GPU window's bundle: .gpu/ (ignored), carried to a lent GPU machine -------------------
# What `bash .ci/gpu_check.sh window` runs there, built here so that the window's minutes go to
# running: train_gpt, test_gpu, bench_gpu and bench_step for sm_90 alone, built in build-gpu/ for a
# processor we do not know (x86-64-v3: AVX2 and FMA, no -march=native), without MPI (the image has
# no Open MPI), the CUDA runtime static (nvcc's default), cuBLAS, cuBLASLt, cuRAND and NCCL loaded
# at run time (the window finds them where the image keeps them); the emulator's counters of the
# step that ncu counts there; tiny Shakespeare; a copy of nanoGPT (NANOGPT=/path to a checkout,
# else cloned; its data prepared here when numpy is there); the headers a build on the device
# would need (include.tar.gz: only when a binary does not load there). Under 48 MiB.
GPU_BUNDLE := .gpu
GPU_BUNDLE_BUILD := build-gpu
GPU_BUNDLE_MAKE = $(MAKE) $(BUILD_J) BUILD=$(GPU_BUNDLE_BUILD) ARCH=90 CXXFLAGS="-O3 -march=x86-64-v3" MPI_CXXFLAGS= MPI_LIBS= FUZZ_OK=
gpu-bundle:
	@test -n "$(NVCC)" || { echo "error: make gpu-bundle needs nvcc (the CUDA toolkit); install it or pass NVCC=/path/nvcc" >&2; exit 1; }
	@$(MAKE) deps
	@$(MAKE) data
	@$(GPU_BUNDLE_MAKE) $(GPU_BUNDLE_BUILD)/train_gpt_cuda $(GPU_BUNDLE_BUILD)/test_gpu $(GPU_BUNDLE_BUILD)/bench_gpu $(GPU_BUNDLE_BUILD)/bench_step
	@$(MAKE) $(BUILD_J) $(BUILD)/test_emu
	rm -rf $(GPU_BUNDLE).tmp && mkdir -p $(GPU_BUNDLE).tmp/bin $(GPU_BUNDLE).tmp/data
	cp $(GPU_BUNDLE_BUILD)/train_gpt_cuda $(GPU_BUNDLE).tmp/bin/train_gpt
	cp $(GPU_BUNDLE_BUILD)/test_gpu $(GPU_BUNDLE_BUILD)/bench_gpu $(GPU_BUNDLE_BUILD)/bench_step $(GPU_BUNDLE).tmp/bin/
	cp $(DATA_FILE) $(GPU_BUNDLE).tmp/data/input.txt
	TG_PRINT_COUNTERS=1 $(BUILD)/test_emu -tc="kernel counters*" | grep '^emulated' > $(GPU_BUNDLE).tmp/counters_emulated.txt
	tar -czf $(GPU_BUNDLE).tmp/include.tar.gz -C $(or $(patsubst -I%,%,$(EIGEN_INC)),/usr/include/eigen3)/.. eigen3 \
	  -C $(or $(patsubst -I%,%,$(DOCTEST_INC)),/usr/include) doctest -C $(or $(patsubst -I%,%,$(JSON_INC)),/usr/include) nlohmann
	@if [ -n "$(NANOGPT)" ]; then cp -r $(NANOGPT)/. $(GPU_BUNDLE).tmp/nanoGPT; \
	else git clone --depth 1 https://github.com/karpathy/nanoGPT $(GPU_BUNDLE).tmp/nanoGPT; fi
	rm -rf $(GPU_BUNDLE).tmp/nanoGPT/.git $(GPU_BUNDLE).tmp/nanoGPT/assets $(GPU_BUNDLE).tmp/nanoGPT/*.ipynb
	@if python3 -c 'import numpy' 2>/dev/null; then \
	  cp $(DATA_FILE) $(GPU_BUNDLE).tmp/nanoGPT/data/shakespeare_char/input.txt && mkdir -p $(GPU_BUNDLE).tmp/pystub && : > $(GPU_BUNDLE).tmp/pystub/requests.py && \
	  (cd $(GPU_BUNDLE).tmp/nanoGPT && PYTHONPATH=../pystub python3 data/shakespeare_char/prepare.py >/dev/null) && \
	  rm -rf $(GPU_BUNDLE).tmp/pystub $(GPU_BUNDLE).tmp/nanoGPT/data/shakespeare_char/input.txt; \
	else echo "[make] no numpy here: nanoGPT's data is prepared in the window"; fi
	git rev-parse --short HEAD > $(GPU_BUNDLE).tmp/commit.txt 2>/dev/null || echo unknown > $(GPU_BUNDLE).tmp/commit.txt
	rm -rf $(GPU_BUNDLE) && mv $(GPU_BUNDLE).tmp $(GPU_BUNDLE)
	@size=$$(du -sm $(GPU_BUNDLE) | cut -f1); echo "[make] $(GPU_BUNDLE): $$size MiB (under 48 MiB to travel); then, on a lent GPU: bash .ci/gpu_check.sh window, carrying $(GPU_BUNDLE)"; \
	  [ $$size -lt 48 ] || { echo "error: $(GPU_BUNDLE) is $$size MiB, over the 48 MiB it may take" >&2; exit 1; }

# ---- data ----------------------------------------------------------------------------------
DATA_FILE := data/tinyshakespeare/input.txt
data:
	@TINYSHAKESPEARE="$(TINYSHAKESPEARE)" bash data/get_tinyshakespeare.sh $(DATA_FILE)

# ---- the README's commands build on every core ---------------------------------------------
# make train, make test and make sanitize build with -j(the cores) unless make was given a -j
# (then its own count); JOBS=N sets the count (JOBS=1: one compile at a time). Serial, a fresh
# `make train` took 2 min 2 s on the 2-vCPU machine, 1 min 58 s of user time: one core.
JOBS ?=
BUILD_J = $(if $(JOBS),-j$(JOBS),$$(echo " $$MAKEFLAGS " | grep -q -e ' -j' || echo "-j$$(nproc 2>/dev/null || echo 1)"))
# make test's one make of compiles and runs takes one job more than the cores: the CPU suite's
# run waits on the processes it starts most of its time (117 s, 46 s of CPU), and with one slot a
# core it held a core idle that long
TEST_J = $(if $(JOBS),-j$(JOBS),$$(echo " $$MAKEFLAGS " | grep -q -e ' -j' || echo "-j$$(( $$(nproc 2>/dev/null || echo 1) + 1 ))"))

# ---- the main job --------------------------------------------------------------------------
# shakespeare-char when a GPU is visible and the CUDA backend (model/net/gpt_cuda.cu) is built
PRESET ?= $(if $(and $(GPU_CC),$(NVCC),$(wildcard model/net/gpt_cuda.cu)),shakespeare-char,baby)
OUT_DIR ?= out/$(PRESET)-$(shell date +%Y%m%d-%H%M%S)
train:
	@$(MAKE) deps
	@$(MAKE) $(BUILD_J) train_gpt
	@$(MAKE) data
	./train_gpt --preset $(PRESET) --data $(DATA_FILE) --out-dir $(OUT_DIR) $(ARGS)

# ---- tests: every suite, one closing line ---------------------------------------------------
# make test builds and runs in one make: each run below is a target (test-run-NAME) that depends on
# the binaries it runs, so it starts as soon as they are linked, beside the compiles still going,
# and make -j keeps both cores of a 2-core machine busy to the end; then one summary
# (tests/run_all.sh --summary). make test-run runs the same runs side by side without building.
#
# The runs: every test binary, and the emulated kernel and model tests again in the emulator's
# hardware-rounding mode (tests/emu/hw_rounding.h: tensor cores truncating in blocks of 4 products,
# the device math functions moved by their documented ulps; the run-twice determinism case is left
# out there: it checks the schedule, not the rounding). That run's device is an emulated A100
# (compute capability 8.0), so that the model tests run on the mma.sync flash kernels there and on
# the Hopper ones, the H100's default, in the others.
#
# The emulated suite runs as parts of a minute or less each (EMU_PART1 .. EMU_PART3's cases, then the
# rest: each case in exactly one, the rest excluding every pattern; tests/run_all.sh counts a part's
# skipped cases), so that the last run to start is short and no core waits long for another.
# CPU seconds on the 2-vCPU machine, each run alone: EMU_PART1 (the flash kernels' suite) 50, EMU_PART2
# (the program under the emulator) 46, EMU_PART3 (the counters and the race checker) 22, the rest 56.
EMU_PART1 := tests/gpu/test_flash_attn_gpu.cu
EMU_PART2 := tests/emu/test_emu_cli.cpp
EMU_PART3 := tests/emu/test_kernel_counters.cpp$(comma)tests/emu/test_race_checker.cpp
EMU_RUN := $(BUILD)/test_emu --no-skipped-summary
TEST_RUN_emu1 := $(EMU_RUN) --source-file=*$(EMU_PART1)
TEST_RUN_emu2 := $(EMU_RUN) --source-file=*$(EMU_PART2)
TEST_RUN_emu3 := $(EMU_RUN) --source-file=$(subst $(comma),$(comma)*,*$(EMU_PART3))
TEST_RUN_emu4 := $(EMU_RUN) --source-file-exclude=$(subst $(comma),$(comma)*,*$(EMU_PART1)$(comma)$(EMU_PART2)$(comma)$(EMU_PART3))
TEST_RUN_emuhw := TG_EMU_HW_ROUNDING=4 TG_EMU_DEVICE=a100 $(EMU_RUN) --test-case=gpu*$(comma)*--attention?check* --test-case-exclude=*same?seed?twice*
TEST_RUN_cpu := $(BUILD)/test_cpu
TEST_RUN_gpu := $(BUILD)/test_gpu
TEST_RUN_avx512 := $(BUILD)/test_gemm_avx512
# what each run needs built (the emulated suite's cases start train_gpt_emu and train_gpt, the CPU
# suite's train_gpt and the fuzz target)
EMU_RUN_BINS := $(BUILD)/test_emu train_gpt_emu train_gpt
TEST_BINS_emu1 := $(EMU_RUN_BINS)
TEST_BINS_emu2 := $(EMU_RUN_BINS)
TEST_BINS_emu3 := $(EMU_RUN_BINS)
TEST_BINS_emu4 := $(EMU_RUN_BINS)
TEST_BINS_emuhw := $(EMU_RUN_BINS)
TEST_BINS_cpu := $(BUILD)/test_cpu train_gpt $(FUZZ_BIN)
TEST_BINS_gpu := $(BUILD)/test_gpu
TEST_BINS_avx512 := $(BUILD)/test_gemm_avx512 train_gpt
TEST_RUN_NAMES := cpu $(if $(NVCC),emu3 emu1 emu2 emu4 emuhw,) $(if $(GEMM_AVX512_EMU),avx512,) $(if $(NVCC),gpu,)
TEST_RUNS := $(foreach n,$(TEST_RUN_NAMES),"$(TEST_RUN_$(n))")
TEST_LOGS := $(BUILD)/test-logs
comma := ,

# OMP_WAIT_POLICY=passive: the runs share the cores, and OpenMP's threads spinning at a barrier
# while another run holds the core made the CPU suite 2-10x slower (the KV-cache case: 29 s
# spinning, 3.4 s passive)
TEST_ENV = OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-passive} TG_DATA=$(DATA_FILE) TG_TRAIN_GPT=./train_gpt TG_TRAIN_GPT_EMU=./train_gpt_emu \
  TG_FUZZ=$(FUZZ_BIN) TG_FUZZ_SECONDS=$(FUZZ_SECONDS) TG_KERNEL_RESOURCES=$(BUILD)/kernel_resources.txt TG_KERNEL_ARCHS="$(ARCH)"

test:
	@$(MAKE) deps
	@$(MAKE) data
	@rm -rf $(TEST_LOGS)
	@$(MAKE) $(TEST_J) $(TEST_RUN_NAMES:%=test-run-%)
	@bash tests/run_all.sh --summary $(TEST_LOGS) $(foreach n,$(TEST_RUN_NAMES),$(n) "$(TEST_RUN_$(n))")

.PHONY: $(TEST_RUN_NAMES:%=test-run-%)
$(foreach n,$(TEST_RUN_NAMES),$(eval test-run-$(n): $(TEST_BINS_$(n))))
$(TEST_RUN_NAMES:%=test-run-%): test-run-%:
	@$(TEST_ENV) bash tests/run_all.sh --one $(TEST_LOGS) $* "$(TEST_RUN_$*)"

test-run:
	@$(TEST_ENV) bash tests/run_all.sh $(TEST_RUNS)

# The CPU suite and a CPU-only train_gpt built by the host compiler with AddressSanitizer and
# UBSan (any report ends the process, so it fails its test), in build-san/, then run.
SAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
sanitize:
	@$(MAKE) deps
	@$(MAKE) data
	@$(MAKE) $(BUILD_J) BUILD=build-san NVCC= FUZZ_OK= CXXFLAGS="$(SAN_FLAGS)" build-san/test_cpu build-san/train_gpt_host
	@TG_DATA=$(DATA_FILE) TG_TRAIN_GPT=build-san/train_gpt_host ASAN_OPTIONS=abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1 bash tests/run_all.sh build-san/test_cpu

# GPT-2's BPE encoder beside tiktoken; on a GPU machine: the attention kernels (flash, naive,
# PyTorch SDPA when python3 has torch) and a training step against T; on a CPU machine: the CPU
# training step
bench: train_gpt $(BUILD)/bench_cpu $(BUILD)/bench_gemm $(BUILD)/bench_bpe $(BENCH_GPU_BINS)
	@$(MAKE) data
	$(BUILD)/bench_bpe --data $(DATA_FILE)
	@$(PYTHON) tests/interop/tokenizer_check.py --data $(DATA_FILE) --bench 2>/dev/null || \
	  echo "(tiktoken's side skipped: pip install tiktoken tokenizers)"
ifneq ($(GPU_CC),)
	$(BUILD)/bench_gpu $(BENCH_ARGS)
	$(BUILD)/bench_step
else
	$(BUILD)/bench_cpu --data $(DATA_FILE)
	$(BUILD)/bench_gemm
endif

# train_gpt's CPU backend beside nanoGPT on PyTorch (eager, CPU), baby configuration, alternating
# runs (tests/bench/cpu_peer.sh): NANOGPT=/path/to/nanoGPT [PYTHON=python3 STEPS=60 ROUNDS=3 BUSY=1]
bench-cpu-peer: train_gpt
	@$(MAKE) data
	@TG_DATA=$(DATA_FILE) bash tests/bench/cpu_peer.sh

# ---- interop: a transformers GPT2LMHeadModel read by --init-from (logits compared), and a
# --export-hf export loaded into Hugging Face transformers (Python with torch and transformers
# from PyPI; skipped with a message without them) ------------------------------------------
PYTHON ?= python3
interop: train_gpt
	@$(MAKE) data
	@$(PYTHON) tests/interop/hf_export_check.py --train-gpt ./train_gpt --data $(DATA_FILE)

# ---- GPT-2's tokenizer (data/bpe.h) against Hugging Face tokenizers and tiktoken, live: the Unicode
# class table code point by code point, the ids' hashes that tests/cpu/test_bpe.cpp compares with
# (tests/interop/bpe/expected.json), both libraries' MB/s (pip install tokenizers tiktoken); GPT2=DIR:
# train_gpt's ids with GPT-2's own files in DIR against both libraries', id for id
tokenizer-check:
	@$(MAKE) data
	@$(PYTHON) tests/interop/tokenizer_check.py --data $(DATA_FILE) --check $(if $(GPT2),--gpt2 $(GPT2),)

# ---- loss curves: make plot RUNS="out/a out/b" [PLOT=out/loss.svg] --------------------------
PLOT ?= out/loss.svg
plot: train_gpt
	@mkdir -p $(dir $(PLOT))
	./train_gpt --plot $(PLOT) $(foreach r,$(RUNS),$(r)/metrics.jsonl)

clean:
	rm -rf $(BUILD) build-san $(GPU_BUNDLE_BUILD) train_gpt train_gpt_emu

-include $(HOST_OBJS:.o=.d) $(CPU_DOUBLE_OBJS:.o=.d) $(CUDA_OBJS:.o=.d) $(TEST_CPU_OBJS:.o=.d) $(DOCTEST_IMPL:.o=.d) $(TEST_GPU_OBJS:.o=.d) $(TEST_EMU_OBJS:.o=.d) $(BENCH_GPU_OBJS:.o=.d) $(BUILD)/train_gpt.d \
  $(BUILD)/simde/kernels/cpu/gemm.d
-include $(EMU_CUDA_OBJS:.o=.d) $(EMU_LIB_OBJS:.o=.d) $(EMU_BUILD)/train_gpt.d $(EMU_BUILD)/tests/emu/gpu_profile.d \
  $(EMU_BUILD)/tests/bench/bench_attention.d
