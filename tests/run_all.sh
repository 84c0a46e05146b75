#!/usr/bin/env bash
# tests/run_all.sh BIN...: run each doctest binary, then print one closing line
#   N passed, M failed, K skipped
# summed over the test cases of every binary. Exits non-zero when anything failed, or when a
# binary crashed or printed no doctest summary (that counts as one failure).
set -u
passed=0; failed=0; skipped=0
for bin in "$@"; do
  echo "== $bin"
  log=$(mktemp)
  "$bin" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  line=$(grep -E '^\[doctest\] test cases:' "$log" | tail -n1)
  rm -f "$log"
  if [ -z "$line" ]; then
    echo "!! $bin exited with $rc and printed no doctest summary: counted as 1 failure"
    failed=$((failed + 1)); continue
  fi
  p=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<<"$line")
  f=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<<"$line")
  s=$(sed -nE 's/.*\| *([0-9]+) skipped.*/\1/p' <<<"$line")
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + ${s:-0}))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "!! $bin exited with $rc although no test case failed: counted as 1 failure"
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
