#!/usr/bin/env bash
# .ci/gpu_check.sh STAGE...: the GPU bring-up in stages, each well inside one 10-minute command
# on one H100 with 16 cores (the plan of a 30-minute window, with the minutes each stage is
# expected to take: docs/BENCHMARKS.md, "GPU checks not yet run"). Nothing here downloads anything:
# what a bare machine lacks (Eigen, doctest, tiny Shakespeare, a copy of nanoGPT) travels in
# .deps/, made by `make gpu-deps` on a machine with network.
#
#   emu          on the CPU machine, before a GPU window: the emulated whole-model tests
#                (build/test_emu), so the window starts from code that has trained
#   build        train_gpt, the GPU suite and the benchmarks, for the visible GPU only
#   test         the GPU suite (build/test_gpu)
#   sanitize     compute-sanitizer: memcheck over the suite's reduced matrix, racecheck over a
#                reduced flash matrix (TG_REDUCED_MATRIX=1: the lists the emulator runs)
#   bench        attention benchmarks (flash, naive, PyTorch SDPA as the peer) and the step
#   train-flash  shakespeare-char, the full 5000 iterations, flash attention
#   train-naive  the same, naive attention
#   peer         nanoGPT's own train.py with config/train_shakespeare_char.py and torch.compile,
#                the same 5000 iterations on the same GPU (from .deps/nanoGPT; never imported
#                by our code)
#   cpu          the CPU speed issue's figures on this machine's host processor, which may have
#                AVX-512 (the machines we build on do not): the float GEMM's kernels, one thread
#                (build/bench_gemm: the native kernel, and AVX2 beside it where the native one is
#                AVX-512), then make bench-cpu-peer on two cores (taskset -c 0,1), quiet and with
#                one of the two kept busy
#   counters     the kernel profiler's counts of one step (build/test_emu, emulated) beside Nsight
#                Compute's of the same step on this GPU (build/test_gpu under ncu): $OUT/counters_*
#   window1      build test sanitize bench (the first command of a window)
#
# Each stage writes $OUT/<stage>.log (and the runs' outputs under $OUT) and one summary line;
# the table of the stages of this command is printed last. On a user's own GPU machine the
# same stages run from a normal checkout after `make deps data` (the data is fetched).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu_check}"
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
DEPS=.deps
# headers and data from .deps when they are there, else from the system
[ -d "$DEPS/eigen3" ] && export EIGEN_INC="-I$DEPS/eigen3"
[ -d "$DEPS/doctest" ] && export DOCTEST_INC="-I$DEPS"
[ -d "$DEPS/nlohmann" ] && export JSON_INC="-I$DEPS"
[ -f "$DEPS/tinyshakespeare/input.txt" ] && export TINYSHAKESPEARE="$DEPS/tinyshakespeare/input.txt"
MK=(make -j"$(nproc)")
DATA=data/tinyshakespeare/input.txt
summary=()

# run NAME LIMIT_S CMD...: runs CMD under a time limit, keeps its log, records one line
run() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E "passed,|test cases:|done:|best val|ERROR|error|^one step's products" "$OUT/$name.log" | tail -n1 | cut -c1-100)
  summary+=("$(printf '%-16s rc=%-4s %5ss  %s' "$name" "$rc" "$((SECONDS - t0))" "${last:-$(tail -n1 "$OUT/$name.log" | cut -c1-100)}")")
  return $rc
}

stage() {
  case "$1" in
    emu)
      run emu-build 900 "${MK[@]}" train_gpt_emu build/test_emu &&
        run emu-model 900 build/test_emu -tc="gpu model*,train_gpt_emu*"
      ;;
    build)
      nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
      git rev-parse --short HEAD >"$OUT/commit.txt" 2>/dev/null
      run build 480 "${MK[@]}" train_gpt build/test_gpu build/bench_gpu build/bench_step && run data 60 make data
      ;;
    test)
      run test 480 build/test_gpu
      ;;
    sanitize)
      TG_REDUCED_MATRIX=1 run memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 9 build/test_gpu \
        -tce="*20 steps*,*same seed twice*"
      TG_REDUCED_MATRIX=1 run racecheck 300 compute-sanitizer --tool racecheck --error-exitcode 9 build/test_gpu \
        -tc="flash attention bf16: O*,flash attention float*,flash attention backward*"
      ;;
    bench)
      run bench-attention 300 build/bench_gpu --csv "$OUT/bench_attention.csv"
      run bench-step 180 build/bench_step --csv "$OUT/bench_step.csv"
      ;;
    train-flash | train-naive)
      local path=${1#train-}
      run "$1" 540 ./train_gpt --preset shakespeare-char --attention "$path" --data "$DATA" \
        --out-dir "$OUT/run_$path" --sample-tokens 200
      ;;
    peer)
      local ng=$DEPS/nanoGPT
      [ -d "$ng" ] || { echo "no $ng: run make gpu-deps on a machine with network" >"$OUT/peer.log"; return 1; }
      mkdir -p "$ng/data/shakespeare_char"
      cp "$DATA" "$ng/data/shakespeare_char/input.txt"
      # nanoGPT's prepare.py imports requests but needs it only to download: a stub when absent
      local stub=""
      python3 -c "import requests" 2>/dev/null || { mkdir -p "$OUT/pystub" && : >"$OUT/pystub/requests.py" && stub=$PWD/$OUT/pystub; }
      (cd "$ng" && PYTHONPATH="$stub" python3 data/shakespeare_char/prepare.py) >"$OUT/peer-prepare.log" 2>&1
      run peer 540 bash -c "cd '$ng' && python3 train.py config/train_shakespeare_char.py --compile=True \
        --out_dir='$PWD/$OUT/run_nanogpt' 2>&1 | tee '$PWD/$OUT/peer-train.log' | grep -E '^step|^iter .*0:'"
      ;;
    cpu)
      lscpu >"$OUT/lscpu.txt" 2>&1
      run cpu-build 300 "${MK[@]}" train_gpt build/bench_gemm || return 1
      # exits 1 when the kernel differs from its portable twin; AVX2 timed beside an AVX-512 native
      run cpu-gemm 120 bash -c 'build/bench_gemm || exit 1
        if build/bench_gemm --reps 1 --kernel avx512 >/dev/null 2>&1; then build/bench_gemm --kernel avx2; fi'
      [ -d "$DEPS/nanoGPT" ] || { summary+=("cpu-peer         no $DEPS/nanoGPT: run make gpu-deps"); return 1; }
      local b
      for b in 0 1; do
        run "cpu-peer-busy$b" 240 taskset -c 0,1 env OMP_NUM_THREADS=2 "${MK[@]}" bench-cpu-peer \
          NANOGPT="$DEPS/nanoGPT" ROUNDS=3 BUSY=$b
      done
      ;;
    counters)
      # the emulator's kernel counters (tests/emu/kernel_profiler.h) beside Nsight Compute's on the
      # same step (tests/gpu/counters_step.cuh): per kernel, global load / store requests and
      # sectors, shared wavefronts and bank conflicts, registers and theoretical occupancy. Equal
      # counts per kernel are what the profiler claims; a difference names a kernel to look at.
      run counters-build 600 "${MK[@]}" build/test_emu build/test_gpu || return 1
      run counters-emu 300 env TG_PRINT_COUNTERS=1 build/test_emu -tc="kernel counters*"
      local m=l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
      m+=,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
      m+=,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
      m+=,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
      m+=,smsp__inst_executed_pipe_tensor_op_hmma.sum,launch__registers_per_thread,sm__maximum_warps_per_active_cycle_pct
      run counters-ncu 480 ncu --metrics "$m" --csv --log-file "$OUT/counters_ncu.csv" build/test_gpu \
        -tc="gpu model: one step at the kernel counters' shape*"
      grep '^emulated' "$OUT/counters-emu.log" >"$OUT/counters_emulated.txt"
      ;;
    window1)
      stage build && stage test
      stage sanitize
      stage bench
      ;;
    *)
      echo "unknown stage '$1'; expected emu, build, test, sanitize, bench, counters, train-flash, train-naive, peer, cpu or window1" >&2
      return 2
      ;;
  esac
}

[ $# -gt 0 ] || set -- window1
for s in "$@"; do stage "$s"; done
echo "==== summary ($(cat "$OUT/commit.txt" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null))"
printf '%s\n' "${summary[@]}"
