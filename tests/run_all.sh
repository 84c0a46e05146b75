#!/usr/bin/env bash
# tests/run_all.sh RUN...: run each doctest run, then print one closing line
#   N passed, M failed, K skipped
# summed over the test cases of every run. A run is a binary, or "VAR=value ... binary args"
# in one word (split at spaces; no shell quoting). Runs go side by side, TG_TEST_JOBS at a time
# (default: the number of cores); each one's output is printed whole when it ends. Exits non-zero
# when anything failed, or when a run crashed or printed no doctest summary (that counts as one
# failure).
#
# A run given --no-skipped-summary (part of a binary's cases, chosen by a filter) prints no skipped
# count, since doctest would count the cases its filter leaves out; its skipped cases are counted
# here instead: those its filter matches that are marked skip (the same command with --count
# --no-skip, less with --count).
set -u
jobs=${TG_TEST_JOBS:-$(nproc)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
n=0
for run in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  read -ra cmd <<<"$run"
  ( start=$SECONDS
    env "${cmd[@]}" >"$dir/$n.log" 2>&1
    echo "$?" >"$dir/$n.rc"
    echo "$((SECONDS - start))" >"$dir/$n.s" ) &
  n=$((n + 1))
done
wait
passed=0; failed=0; skipped=0
i=0
for run in "$@"; do
  echo "== $run ($(cat "$dir/$i.s") s)"
  cat "$dir/$i.log"
  rc=$(cat "$dir/$i.rc")
  line=$(grep -E '^\[doctest\] test cases:' "$dir/$i.log" | tail -n1)
  i=$((i + 1))
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
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
