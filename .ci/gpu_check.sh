#!/usr/bin/env bash
# .ci/gpu_check.sh: everything to run when a GPU machine is lent, in one call (see README,
# "On a GPU"). Builds for the visible GPU, runs the GPU suite, the suite under
# compute-sanitizer (memcheck; racecheck on the flash tests of a reduced matrix), the
# benchmarks, and 500 iterations of shakespeare-char on each attention path. Logs and CSVs go
# to $OUT (default out/gpu_check); the last lines are a short table.
#   EIGEN_INC=-I.deps/eigen3 DOCTEST_INC=-I.deps bash .ci/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu_check}"
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
MK=(make -j16 EIGEN_INC="${EIGEN_INC:--I/usr/include/eigen3}" DOCTEST_INC="${DOCTEST_INC:-}")
summary=()
step() {  # step NAME LOGFILE CMD...: runs CMD, keeps its log, notes its exit status
  local name=$1 log=$2; shift 2
  local t0=$SECONDS
  "$@" >"$OUT/$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-28s rc=%-3s %5ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(tail -n1 "$OUT/$log" | cut -c1-90)")")
  return $rc
}
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
git rev-parse --short HEAD >"$OUT/commit.txt" 2>/dev/null || true
step build build.log "${MK[@]}" all || { printf '%s\n' "${summary[@]}"; exit 1; }
step test_gpu test_gpu.log build/test_gpu
step test_cpu test_cpu.log build/test_cpu -tc="*attention*,*model*,*ops*"
step memcheck memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 build/test_gpu -tce="*250 repeated*,*10 steps*"
step racecheck racecheck.log compute-sanitizer --tool racecheck --error-exitcode 9 build/test_gpu -tc="*flash*" -tce="*250 repeated*"
step bench_attention bench_attention.log build/bench_gpu --csv "$OUT/bench_attention.csv"
step bench_step bench_step.log build/bench_step --csv "$OUT/bench_step.csv"
for path in naive flash; do
  step "train $path 500" "train_$path.log" ./train_gpt --preset shakespeare-char --attention "$path" --max-iters 500 \
    --eval-interval 250 --out-dir "$OUT/run_$path" --data data/tinyshakespeare/input.txt --sample-tokens 200
done
step "attention check" check.log ./train_gpt --preset shakespeare-char --attention check --out-dir "$OUT/check" \
  --data data/tinyshakespeare/input.txt
echo "==== summary ($(cat "$OUT/commit.txt" 2>/dev/null))"
printf '%s\n' "${summary[@]}"
