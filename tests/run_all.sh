#!/usr/bin/env bash
# tests/run_all.sh: runs doctest binaries and prints one closing line
#   N passed, M failed, K skipped
# summed over the test cases of every run.
#
#   tests/run_all.sh RUN...                     run each, side by side (TG_TEST_JOBS at a time,
#                                               default: the number of cores), then the summary
#   tests/run_all.sh --one DIR NAME RUN         run one into DIR/NAME.log, .rc (exit status) and .s
#                                               (seconds); it exits 0 whatever the run does
#   tests/run_all.sh --summary DIR NAME RUN ... each run's log (from --one), then the closing line
#
# make test runs each RUN as a make target with --one, so that a run starts as soon as its binaries
# are built, beside the compiles still going, then prints --summary.
#
# A run is a binary, or "VAR=value ... binary args" in one word (split at spaces; no shell
# quoting). The summary exits non-zero when anything failed, or when a run crashed or printed no
# doctest summary (that counts as one failure).
#
# A run given --no-skipped-summary (part of a binary's cases, chosen by a filter) prints no skipped
# count, since doctest would count the cases its filter leaves out; its skipped cases are counted
# here instead: those its filter matches that are marked skip (the same command with --count
# --no-skip, less with --count).
set -u

run_one() {  # DIR NAME RUN
  local dir=$1 name=$2 cmd start=$SECONDS
  read -ra cmd <<<"$3"
  env "${cmd[@]}" >"$dir/$name.log" 2>&1
  echo "$?" >"$dir/$name.rc"
  echo "$((SECONDS - start))" >"$dir/$name.s"
}

summary() {  # DIR NAME RUN NAME RUN ...
  local dir=$1 passed=0 failed=0 skipped=0 name run line p f s rc all unskipped cmd
  shift
  local pairs_all=("$@")
  while [ $# -ge 2 ]; do
    name=$1 run=$2
    shift 2
    echo "== $run ($(cat "$dir/$name.s" 2>/dev/null || echo '?') s)"
    cat "$dir/$name.log" 2>/dev/null
    rc=$(cat "$dir/$name.rc" 2>/dev/null || echo 1)
    line=$(grep -E '^\[doctest\] test cases:' "$dir/$name.log" 2>/dev/null | tail -n1)
    if [ -z "$line" ]; then
      echo "!! $run exited with $rc and printed no doctest summary: counted as 1 failure"
      failed=$((failed + 1)); continue
    fi
    p=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<<"$line")
    f=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<<"$line")
    s=$(sed -nE 's/.*\| *([0-9]+) skipped.*/\1/p' <<<"$line")
    if [[ " $run " == *" --no-skipped-summary "* ]]; then
      read -ra cmd <<<"$run"
      count() { env "${cmd[@]}" --count "$@" 2>/dev/null | sed -nE 's/.*passing the current filters: *([0-9]+).*/\1/p' | tail -n1; }
      all=$(count --no-skip); unskipped=$(count)
      s=$(( ${all:-0} - ${unskipped:-0} ))
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + ${s:-0}))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
      echo "!! $run exited with $rc although no test case failed: counted as 1 failure"
      failed=$((failed + 1))
    fi
  done
  [ "$failed" -eq 0 ] || failures "$dir" "${pairs_all[@]}"
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ]
}

# What failed, once more just above the closing line (a log's tail is often all that is kept): for
# each run that failed or crashed, its command, the seed of its random inputs (to replay them with
# TG_TEST_SEED) and doctest's blocks that hold an error, at most 60 lines a run.
failures() {  # DIR NAME RUN NAME RUN ...
  local dir=$1 name run rc
  shift
  echo "== what failed"
  while [ $# -ge 2 ]; do
    name=$1 run=$2
    shift 2
    rc=$(cat "$dir/$name.rc" 2>/dev/null || echo 1)
    grep -qE '^\[doctest\] test cases:.*\| *0 failed' "$dir/$name.log" 2>/dev/null && [ "$rc" -eq 0 ] && continue
    echo "-- $run (exit status $rc)"
    grep -m1 -E 'TG_TEST_SEED=[0-9]' "$dir/$name.log" 2>/dev/null
    awk 'substr($0, 1, 40) == "========================================" { if (keep) printf "%s", block; block = ""; keep = 0; next }
         { block = block $0 "\n"; if ($0 ~ /(ERROR|FATAL)/) keep = 1 }' "$dir/$name.log" 2>/dev/null | head -n 60
    # a run that failed with no failing case (a crash, a sanitizer's report): its last lines
    if ! grep -qE '^\[doctest\] test cases:' "$dir/$name.log" 2>/dev/null ||
       grep -qE '^\[doctest\] test cases:.*\| *0 failed' "$dir/$name.log" 2>/dev/null; then
      tail -n 20 "$dir/$name.log" 2>/dev/null
    fi
  done
}

case "${1:-}" in
  --one)
    [ $# -eq 4 ] || { echo "usage: tests/run_all.sh --one DIR NAME RUN" >&2; exit 2; }
    mkdir -p "$2"
    run_one "$2" "$3" "$4"
    exit 0 ;;
  --summary)
    [ $# -ge 2 ] || { echo "usage: tests/run_all.sh --summary DIR NAME RUN ..." >&2; exit 2; }
    shift
    summary "$@"
    exit ;;
esac

jobs=${TG_TEST_JOBS:-$(nproc)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
n=0
pairs=()
for run in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  run_one "$dir" "$n" "$run" &
  pairs+=("$n" "$run")
  n=$((n + 1))
done
wait
summary "$dir" "${pairs[@]}"
