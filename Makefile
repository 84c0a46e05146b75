# Makefile for train_gpt.
#   make / make train_gpt   build the trainer (nvcc when the CUDA toolkit is there, else g++)
#   make train              build, get the data, train (shakespeare-char on a GPU, baby on a CPU)
#   make test               build and run every test suite; last line "N passed, M failed, K skipped"
#   make sanitize           the CPU suite built with AddressSanitizer + UBSan (in build-san/), run
#   make data               put tiny Shakespeare at data/tinyshakespeare/input.txt
#   make bench              benchmarks (never part of make test)
#   make clean
# Overrides: EIGEN_INC=-I/path DOCTEST_INC=-I/path ARCH="80 90" NVCC=/path/nvcc TINYSHAKESPEARE=/path
#            FUZZ_CXX=clang++ FUZZ_SECONDS=5 (the libFuzzer run in make test)
# (DOCTEST_INC is the folder that holds doctest/doctest.h.)

SHELL := /bin/bash
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

HASH := \#
EIGEN_OK := $(shell echo '$(HASH)include <Eigen/Core>' | $(CXX) $(EIGEN_INC) -x c++ -fsyntax-only - 2>/dev/null && echo yes)
DOCTEST_OK := $(shell echo '$(HASH)include <doctest/doctest.h>' | $(CXX) $(DOCTEST_INC) -x c++ -fsyntax-only - 2>/dev/null && echo yes)
# libFuzzer comes with clang (Debian: apt-get install clang); without it the fuzz run is skipped
FUZZ_CXX ?= clang++
ifeq ($(origin FUZZ_OK),undefined)
  FUZZ_OK := $(shell echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' | $(FUZZ_CXX) -fsanitize=fuzzer -x c++ - -o /dev/null 2>/dev/null && echo yes)
endif
FUZZ_SECONDS ?= 5

ifeq ($(MAKELEVEL),0)
$(info [make] nvcc:    $(if $(NVCC),$(NVCC) ($(shell $(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')),not found: building a CPU-only train_gpt with $(CXX)))
$(info [make] GPU:     $(if $(GPU_CC),compute capability $(GPU_CC),none visible)$(if $(NVCC),; device code for $(foreach a,$(ARCH),sm_$(a)),))
$(info [make] Eigen:   $(if $(EIGEN_OK),found ($(or $(EIGEN_INC),system path)),NOT FOUND (apt-get install libeigen3-dev, or EIGEN_INC=-I/path)))
$(info [make] doctest: $(if $(DOCTEST_OK),found ($(or $(DOCTEST_INC),system path)),NOT FOUND (apt-get install doctest-dev, or DOCTEST_INC=-I/path)))
$(info [make] fuzzer:  $(if $(FUZZ_OK),$(FUZZ_CXX) with libFuzzer (make test fuzzes the readers for $(FUZZ_SECONDS) s),no libFuzzer in $(FUZZ_CXX): the fuzz run of make test is skipped (apt-get install clang)))
endif

# ---- flags ---------------------------------------------------------------------------------
CXXFLAGS ?= -O3 -march=native
override CXXFLAGS += -std=c++17 -fopenmp -Wall -Wextra -I. $(EIGEN_INC)
NVCCFLAGS ?= -O3
override NVCCFLAGS += -std=c++17 $(GENCODE) -I. -Xcompiler -fopenmp,-Wall
LDLIBS := -lgomp -lpthread
comma := ,
ifneq ($(NVCC),)
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Xlinker -rpath=$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcurand
  CURAND_FLAGS := -DTG_HAVE_CURAND -I$(CUDA_HOME)/include
endif

# ---- sources -------------------------------------------------------------------------------
HOST_SRCS := $(wildcard kernels/cpu/*.cpp) $(wildcard model/*.cpp) $(wildcard data/*.cpp)
HOST_OBJS := $(HOST_SRCS:%.cpp=$(BUILD)/%.o)
CUDA_SRCS := $(wildcard kernels/*.cu) $(wildcard model/*.cu)
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(BUILD)/%.o)
TEST_CPU_SRCS := $(wildcard tests/cpu/*.cpp)
TEST_CPU_OBJS := $(TEST_CPU_SRCS:%.cpp=$(BUILD)/%.o)
TEST_GPU_SRCS := $(wildcard tests/gpu/*.cu)
TEST_GPU_OBJS := $(TEST_GPU_SRCS:%.cu=$(BUILD)/%.o)
BENCH_SRCS := $(wildcard tests/bench/*.cpp)
BENCH_GPU_SRCS := $(wildcard tests/bench/*.cu)
BENCH_GPU_OBJS := $(BENCH_GPU_SRCS:%.cu=$(BUILD)/%.o)

# tests/emu: the flash kernels executed on the CPU by a SIMT emulator (needs the CUDA headers only)
TEST_EMU_SRCS := $(wildcard tests/emu/*.cpp)
TEST_EMU_OBJS := $(TEST_EMU_SRCS:%.cpp=$(BUILD)/%.o)

TEST_BINS := $(BUILD)/test_cpu $(if $(NVCC),$(BUILD)/test_gpu $(BUILD)/test_emu,)

# tests/fuzz: a libFuzzer target over the readers of untrusted bytes (checkpoints, config text,
# command line), built by clang++ with ASan and UBSan from the few sources it reads with
FUZZ_SRCS := tests/fuzz/fuzz_readers.cpp model/config.cpp model/checkpoint.cpp model/safetensors.cpp \
             model/ckpt_io.cpp model/gpt.cpp
FUZZ_BIN := $(if $(FUZZ_OK),$(BUILD)/fuzz_readers,)

.PHONY: all train test test-run sanitize data bench plot clean deps
BENCH_GPU_BINS := $(if $(NVCC),$(BUILD)/bench_gpu $(BUILD)/bench_step,)
all: train_gpt $(TEST_BINS) $(FUZZ_BIN) $(BUILD)/bench_cpu $(BENCH_GPU_BINS)

$(BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(CURAND_FLAGS) $(if $(findstring tests/,$<),$(DOCTEST_INC),) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(if $(findstring tests/,$<),$(DOCTEST_INC),) -MMD -MP -c $< -o $@

ifneq ($(NVCC),)
train_gpt: $(BUILD)/train_gpt.o $(CUDA_OBJS) $(HOST_OBJS)
	$(NVCC) $(GENCODE) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)
else
train_gpt: train_gpt.cu $(HOST_OBJS)
	@echo "[make] no CUDA toolkit: train_gpt is CPU-only"
	$(CXX) $(CXXFLAGS) -DTG_NO_CUDA -x c++ train_gpt.cu -x none $(HOST_OBJS) -o $@ $(LDLIBS)
endif

# train_gpt built by the host compiler alone, into the build folder (make sanitize)
$(BUILD)/train_gpt_host: train_gpt.cu $(HOST_OBJS)
	$(CXX) $(CXXFLAGS) -DTG_NO_CUDA -x c++ train_gpt.cu -x none $(HOST_OBJS) -o $@ $(LDLIBS)

$(BUILD)/fuzz_readers: $(FUZZ_SRCS) $(wildcard model/*.h tests/fuzz/*.h) kernels/philox.h
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. $(FUZZ_SRCS) -o $@

$(BUILD)/test_cpu: $(TEST_CPU_OBJS) $(HOST_OBJS)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(if $(NVCC),-L$(CUDA_HOME)/lib64 -Wl$(comma)-rpath$(comma)$(CUDA_HOME)/lib64 -lcurand,) $(LDLIBS)

$(BUILD)/test_gpu: $(TEST_GPU_OBJS) $(CUDA_OBJS) $(HOST_OBJS)
	$(NVCC) $(GENCODE) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

# g++ compiles the unmodified kernels/flash_attn_{fwd,bwd}.cu with tests/emu/simt_emulator.h in
# place of their PTX (TG_SIMT_EMULATION); linked with the CPU spec they are checked against.
$(BUILD)/tests/emu/%.o: tests/emu/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -DTG_SIMT_EMULATION -I$(CUDA_HOME)/include -Wno-unknown-pragmas -pthread $(DOCTEST_INC) -MMD -MP -c $< -o $@

$(BUILD)/test_emu: $(TEST_EMU_OBJS) $(BUILD)/kernels/cpu/attention_tiled.o
	$(CXX) $(CXXFLAGS) -pthread -o $@ $^ $(LDLIBS)

$(BUILD)/bench_cpu: $(BENCH_SRCS) $(HOST_OBJS)
	$(CXX) $(CXXFLAGS) -o $@ $^ $(LDLIBS)

# GPU benchmarks, one binary each: bench_gpu (attention kernels, tests/bench/bench_attention.cu)
# and bench_step (a whole training step against T, tests/bench/bench_step.cu)
$(BUILD)/bench_gpu: $(BUILD)/tests/bench/bench_attention.o $(CUDA_OBJS) $(HOST_OBJS)
	$(NVCC) $(GENCODE) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/bench_step: $(BUILD)/tests/bench/bench_step.o $(CUDA_OBJS) $(HOST_OBJS)
	$(NVCC) $(GENCODE) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

# ---- dependencies: install on Debian/Ubuntu as root, else say the exact command ---------
deps:
	@if [ -z "$(EIGEN_OK)" ] || [ -z "$(DOCTEST_OK)" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "[make] installing Eigen and doctest with apt-get"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libeigen3-dev doctest-dev) >/dev/null || exit 1; \
	  else \
	    echo "error: Eigen or doctest is missing; install them with: sudo apt-get install -y libeigen3-dev doctest-dev (or pass EIGEN_INC=-I/path DOCTEST_INC=-I/path)" >&2; exit 1; \
	  fi; \
	fi

# ---- data ----------------------------------------------------------------------------------
DATA_FILE := data/tinyshakespeare/input.txt
data:
	@TINYSHAKESPEARE="$(TINYSHAKESPEARE)" bash data/get_tinyshakespeare.sh $(DATA_FILE)

# ---- the main job --------------------------------------------------------------------------
# shakespeare-char when a GPU is visible and the CUDA backend (model/gpt_cuda.cu) is built
PRESET ?= $(if $(and $(GPU_CC),$(NVCC),$(wildcard model/gpt_cuda.cu)),shakespeare-char,baby)
OUT_DIR ?= out/$(PRESET)-$(shell date +%Y%m%d-%H%M%S)
train:
	@$(MAKE) deps
	@$(MAKE) train_gpt
	@$(MAKE) data
	./train_gpt --preset $(PRESET) --data $(DATA_FILE) --out-dir $(OUT_DIR) $(ARGS)

# ---- tests: every suite, one closing line ---------------------------------------------------
test:
	@$(MAKE) deps
	@$(MAKE) data
	@$(MAKE) train_gpt $(TEST_BINS) $(FUZZ_BIN)
	@$(MAKE) test-run

test-run:
	@TG_DATA=$(DATA_FILE) TG_TRAIN_GPT=./train_gpt TG_FUZZ=$(FUZZ_BIN) TG_FUZZ_SECONDS=$(FUZZ_SECONDS) \
	  bash tests/run_all.sh $(TEST_BINS)

# The CPU suite and a CPU-only train_gpt built by the host compiler with AddressSanitizer and
# UBSan (any report ends the process, so it fails its test), in build-san/, then run.
SAN_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
sanitize:
	@$(MAKE) deps
	@$(MAKE) data
	@$(MAKE) BUILD=build-san NVCC= FUZZ_OK= CXXFLAGS="$(SAN_FLAGS)" build-san/test_cpu build-san/train_gpt_host
	@TG_DATA=$(DATA_FILE) TG_TRAIN_GPT=build-san/train_gpt_host ASAN_OPTIONS=abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1 bash tests/run_all.sh build-san/test_cpu

# on a GPU machine: the attention kernels (flash, naive, PyTorch SDPA when python3 has torch)
# and a training step against T; on a CPU machine: the CPU training step
bench: train_gpt $(BUILD)/bench_cpu $(BENCH_GPU_BINS)
	@$(MAKE) data
ifneq ($(GPU_CC),)
	$(BUILD)/bench_gpu $(BENCH_ARGS)
	$(BUILD)/bench_step
else
	$(BUILD)/bench_cpu --data $(DATA_FILE)
endif

# ---- loss curves: make plot RUNS="out/a out/b" [PLOT=docs/loss.svg] -------------------------
PLOT ?= docs/loss.svg
plot: train_gpt
	./train_gpt --plot $(PLOT) $(foreach r,$(RUNS),$(r)/metrics.jsonl)

clean:
	rm -rf $(BUILD) build-san train_gpt

-include $(HOST_OBJS:.o=.d) $(CUDA_OBJS:.o=.d) $(TEST_CPU_OBJS:.o=.d) $(TEST_GPU_OBJS:.o=.d) $(TEST_EMU_OBJS:.o=.d) $(BENCH_GPU_OBJS:.o=.d) $(BUILD)/train_gpt.d
