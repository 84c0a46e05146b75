#!/usr/bin/env bash
# .ci/gpu_check.sh: the GPU window. One command, on a lent GPU machine, that runs what has never
# run on a GPU, most important first, each step only when the time left fits it:
#
#   bash .ci/gpu_check.sh window [--deadline S] [--rehearse]
#   bash .ci/gpu_check.sh summarize LOGDIR        the summary table of a window's logs
#
# The binaries are built beforehand on a CPU machine by `make gpu-bundle` into .gpu/ (ignored by
# git; it travels with the command as a carried path): nothing that can be built before is
# built in the window. The steps, in order, with the seconds each is expected to take on one H100
# (the derivations: docs/BENCHMARKS.md, "The GPU window"):
#
#   facts        the device (nvidia-smi: name, driver, compute capability, SMs, memory, clocks)
#                and the tools (nvcc, compute-sanitizer, ncu, python3, torch)
#   libs         every binary of the bundle loads (ldd, then a start); where one does not, it is
#                built here for the visible GPU only, and the line says how long that took
#   hopper       the Hopper instructions' tests (tests/gpu/test_hopper_ptx.cu), then the Hopper
#                kernels' (kernels/flash_attn_hopper.cuh, on compute capability 9.0), each under a
#                time limit of its own (a hang costs that, not the window); memcheck on the
#                kernels' cases where they fail; where they do not finish, short training runs
#                find a kernel setting that does, for every later step (step_hopper)
#   suite        the rest of the GPU suite (test_gpu); the failing cases again alone, with their
#                full output, and under compute-sanitizer memcheck
#   sanitize     compute-sanitizer racecheck on the reduced flash matrix (the Hopper kernels'
#                cases among them), initcheck and synccheck on the Hopper kernels' cases, memcheck
#                on the reduced suite (each tool only if it fits)
#   attention    the attention benchmark (bench_gpu) beside PyTorch SDPA: forward, backward and
#                both, p = 0 and 0.2, HS 64 and 128, TFLOP/s and ratios, on the default kernels
#                (the Hopper ones on compute capability 9.0; at p = 0.2 also with the backward
#                making the keep decisions again, --paths recompute); then each twin that
#                TG_FLASH_HOPPER=N selects, on some of those shapes, without SDPA, its time over the
#                default's in the summary: 0 the mma.sync kernels (recompute rows too) at T 1k, 4k
#                and 16k; 2 the warp-specialized TMA backward, 3 dQ inside the dK / dV kernel and
#                5 the backward not pipelined, at T 4k; 4 the forward's keep decisions by its
#                producer warpgroup at p = 0.2 and 6 the forward on key tiles of 64, at T 4k and
#                16k; 7 the forward's two consumer warpgroups where it takes three (HS 64, p = 0),
#                8 its consumers not taking turns (p = 0) and 9 its dropout on three consumer
#                warpgroups (HS 64, p = 0.2), at T 4k and 16k; then not causal at T 4k
#   train_flash  shakespeare-char, flash, bf16, the full 5000 iterations: ms/iteration, tokens/s,
#                MFU, peak device memory (nvidia-smi sampled), best val loss, the kernels it ran
#   counters     Nsight Compute's counters of one step beside the emulator's (carried in the bundle);
#                then where the backward's warps wait (ncu's stall reasons at HS 128, T 4k, and the
#                dK / dV kernel's stall samples per SASS instruction), the two kernels and the fused one,
#                and the forward's at HS 64, T 4k, p 0 and 0.2, with how busy each pipe is
#   train_naive  the naive path: 1000 iterations (its ms/iteration; the flash run has the loss)
#   nanogpt      nanoGPT's own train.py, config/train_shakespeare_char.py, torch.compile, on the
#                same GPU (the bundle's copy; our code never imports it): ms/iteration after
#                compilation, val loss where the whole run fits (it runs until the time is up)
#
# What survives: $OUT (default out/gpu_window) gets two files, rewritten after every step, so that
# a command killed at its limit still brings everything back: summary.txt (the table below) and
# logs.tar.gz (every log, the benchmark's CSV, both runs' metrics). The table is printed last.
# Scratch (run directories, nanoGPT's checkpoint) stays outside $OUT.
#
# --rehearse runs the same window on a machine without a GPU: the emulator takes the GPU's place
# (train_gpt_emu, build/test_emu, build/bench_gpu_emu on tiny shapes and tiny iteration counts),
# nanoGPT runs on the CPU where python3 has torch (else the step says so), and the emulator's own
# checks stand in for compute-sanitizer; the bundle's binaries are still checked to load. Every
# path, parser, time check and archive runs, so that a lent GPU's minutes go to running.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export PATH="$PATH:/usr/local/cuda/bin"

BUNDLE=${TG_GPU_BUNDLE:-.gpu}

die() { echo "gpu_check: $*" >&2; exit 2; }

# ---- the summary: parsers of the steps' logs -------------------------------------------------
# Each parser reads LOGDIR's files and prints one line (or several, the first the step's own);
# summarize prints the table: step, status, seconds taken and expected, result.

# median of the numbers on stdin ("" when none)
median() { sort -g | awk '{a[NR] = $1} END { if (NR) print a[int((NR + 1) / 2)] }'; }
# value of KEY from a "key: value" file
kv() { sed -n "s/^$2: //p" "$1" 2>/dev/null | head -n1; }

parse_facts() {
  local f=$1/facts.log
  [ -f "$f" ] || return 0
  local gpu
  gpu=$(kv "$f" gpu)
  printf '%s; nvcc %s; compute-sanitizer %s; ncu %s; torch %s\n' "${gpu:-no GPU}" "$(kv "$f" nvcc)" \
    "$(kv "$f" compute-sanitizer)" "$(kv "$f" ncu)" "$(kv "$f" torch)"
}

parse_libs() {
  local f=$1/libs.log
  [ -f "$f" ] || return 0
  grep -E '^(libs|rebuilt|not loading):' "$f" | sed 's/^libs: //' | paste -sd ';' - | sed 's/;/; /g'
}

# the doctest closing line of a log: "N passed, M failed, K skipped of T"
doctest_counts() {
  sed -nE 's/^\[doctest\] test cases: *([0-9]+) \| *([0-9]+) passed \| *([0-9]+) failed \| *([0-9]+) skipped.*/\2 passed, \3 failed, \4 skipped of \1/p' "$1" 2>/dev/null | tail -n1
}
# compute-sanitizer's closing line ("ERROR SUMMARY: N errors"; racecheck's is "RACECHECK
# SUMMARY: N hazards displayed (E errors, W warnings)"), or how the run ended without one
sanitizer_result() {
  local r
  r=$(grep -Eo 'ERROR SUMMARY: [0-9]+ errors?' "$1" 2>/dev/null | tail -n1 | sed 's/ERROR SUMMARY: //')
  [ -n "$r" ] || r=$(sed -nE 's/.*RACECHECK SUMMARY: ([0-9]+) hazards? displayed \(([0-9]+ errors?), ([0-9]+ warnings?)\).*/\2, \3 (\1 hazards)/p' \
    "$1" 2>/dev/null | tail -n1)
  if [ -n "$r" ]; then echo "$r"; elif grep -q '^\[doctest\] test cases' "$1" 2>/dev/null; then echo "no sanitizer summary"
  else echo "no summary (stopped?)"; fi
}

parse_suite() {
  local d=$1 f=$1/suite.log
  [ -f "$f" ] || return 0
  local counts seed
  counts=$(doctest_counts "$f")
  seed=$(sed -nE 's/.*TG_TEST_SEED=([0-9]+).*/\1/p' "$f" | head -n1)
  local nfail
  nfail=$(failing_cases "$f" | grep -c .)
  echo "${counts:-no doctest summary}${seed:+ (TG_TEST_SEED=$seed)}; $nfail failing case(s) named in the log"
  # the cases the step ran again (suite_failed.txt: the failing ones; in a rehearsal, one that passed)
  [ -s "$d/suite_failed.txt" ] || return 0
  local i=0 name
  while IFS= read -r name; do
    i=$((i + 1))
    printf 'failed: %s | alone: %s | memcheck: %s\n' "$name" "$(doctest_counts "$d/suite_rerun$i.log")" \
      "$(sanitizer_result "$d/suite_memcheck$i.log")"
  done <"$d/suite_failed.txt"
}
# the names of the test cases a doctest log reports failing, once each, in order
failing_cases() { sed -nE 's/^TEST CASE: +//p' "$1" 2>/dev/null | awk '!seen[$0]++'; }

# bench_attention.csv (or the CSV named second): one line per head size and dropout: flash
# forward + backward TFLOP/s at each T, the median over T of flash's time over SDPA's (< 1:
# ours faster), and where the CSV has recompute rows the median over T of the backward's time
# with the stored keep bytes over its time making them again. With a third, a twin's CSV beside
# the default's (bench_attention.csv): the median over T of the twin's time over the default's at
# the shapes both ran (< 1: the twin faster), and nothing of SDPA where the twin's run had none.
parse_attention() {
  local f=$1/${2:-bench_attention.csv} base=${3:+$1/$3}
  [ -f "$f" ] || { [ -f "$1/attention.log" ] && echo "no CSV written"; return 0; }
  [ -n "$base" ] && [ ! -f "$base" ] && base=""
  awk -v base="$base" 'function csv(line, f,   n, q, c, i, cur) {  # split a CSV line into f[1..n], quotes honoured
      n = 0; q = 0; cur = ""
      for (i = 1; i <= length(line); i++) {
        c = substr(line, i, 1)
        if (c == "\"") q = !q
        else if (c == "," && !q) { f[++n] = cur; cur = "" }
        else cur = cur c
      }
      f[++n] = cur
      return n
    }
    # the flash times of the default run by shape (read first, where a twin is parsed)
    base != "" && FILENAME == base {
      if (FNR > 1 && csv($0, f) && f[8] == "flash" && f[9] == "ok") def[f[2], f[6], f[7], f[3]] = f[10] " " f[11] " " f[12]
      next
    }
    FNR > 1 {
      # columns: device,HS,T,B,NH,causal,p,path,status,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tf,bwd_tf,fwdbwd_tf,t_fwd,t_bwd,t_fb
      csv($0, f)
      key = "HS " f[2] (f[6] == "0" ? " full" : "") " p " f[7]
      if (f[8] == "flash" && f[9] == "ok" && (f[2], f[6], f[7], f[3]) in def) {
        split(def[f[2], f[6], f[7], f[3]], d0, " ")
        if (d0[1] > 0 && d0[2] > 0 && d0[3] > 0) { nd[key]++; df[key, nd[key]] = f[10] / d0[1]; db[key, nd[key]] = f[11] / d0[2]; dfb[key, nd[key]] = f[12] / d0[3] }
      }
      if (!(key in seen)) { seen[key] = 1; order[++n] = key }
      if (f[8] == "flash" && f[9] == "ok") {
        tf[key] = tf[key] sprintf(" %s:%.0f/%.0f/%.0f", (f[3] + 0 >= 1024 ? f[3] / 1024 "k" : f[3]), f[13], f[14], f[15])
        if (f[18] + 0 > 0) { r[key, ++nr[key]] = f[12] / f[18]; rf[key, nr[key]] = f[10] / f[16]; rb[key, nr[key]] = f[11] / f[17] }
      }
      if (f[8] == "flash" && f[9] != "ok") bad[key]++
      # the backward reading the stored keep bytes (flash) against the one making them again
      if (f[9] == "ok" && (f[8] == "flash" || f[8] == "recompute")) bw[key, f[3], f[8]] = f[11]
      if (f[9] == "ok" && f[8] == "recompute") { ts[key, ++nt[key]] = f[3] }
    }
    function med(a, key, m,   i, j, t, v) {
      for (i = 1; i <= m; i++) v[i] = a[key, i]
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      return v[int((m + 1) / 2)]
    }
    END {
      for (i = 1; i <= n; i++) {
        k = order[i]
        line = sprintf("%s: flash TFLOP/s fwd/bwd/both at T%s", k, tf[k] == "" ? " -" : tf[k])
        if (nr[k] > 0) line = line sprintf(" | time / SDPA (median over T): fwd %.2f bwd %.2f both %.2f", med(rf, k, nr[k]), med(rb, k, nr[k]), med(r, k, nr[k]))
        else if (base == "") line = line " | SDPA: not measured"
        if (nd[k] > 0) line = line sprintf(" | time / the default'"'"'s (median over T): fwd %.2f bwd %.2f both %.2f", med(df, k, nd[k]), med(db, k, nd[k]), med(dfb, k, nd[k]))
        m = 0
        for (j = 1; j <= nt[k]; j++)
          if ((k, ts[k, j], "flash") in bw && bw[k, ts[k, j], "recompute"] + 0 > 0) kr[k, ++m] = bw[k, ts[k, j], "flash"] / bw[k, ts[k, j], "recompute"]
        if (m > 0) line = line sprintf(" | bwd with the stored keep bytes / making them again (median over T): %.2f", med(kr, k, m))
        if (bad[k]) line = line sprintf(" | %d shape(s) not ok", bad[k])
        print line
      }
    }' ${base:+"$base"} "$f"
}

# the Hopper instructions' and kernels' test cases (their doctest lines, the failing instructions
# named)
parse_hopper() {
  [ -f "$1/hopper_ptx.log" ] || return 0
  local failed
  failed=$(failing_cases "$1/hopper_ptx.log" | sed 's/ (PTX ISA.*//' | paste -sd';' -)
  echo "instructions: $(doctest_counts "$1/hopper_ptx.log" || true)${failed:+ (failed: $failed)}"
  [ -f "$1/hopper_tests.log" ] || return 0
  echo "kernels: $(doctest_counts "$1/hopper_tests.log" || true)"
}

# the attention benchmark's rows on the default kernels (the Hopper ones on compute capability
# 9.0), then each twin's (the header's attention line) beside them
parse_attention_step() {
  parse_attention "$1"
  local twin csv label
  # each twin's CSV and its prefix (the TG_FLASH_HOPPER setting step_attention ran it with)
  for twin in "bench_mma.csv:mma.sync kernels" "bench_ws.csv:warp-specialized backward" \
    "bench_fused.csv:dQ inside the dK / dV kernel" "bench_ring.csv:keep decisions by the producer warpgroup" \
    "bench_seq.csv:backward not pipelined" "bench_narrow.csv:forward on key tiles of 64" \
    "bench_two.csv:forward with two consumer warpgroups" "bench_turns.csv:forward without turns" \
    "bench_three.csv:forward with dropout on three consumer warpgroups" "bench_full.csv:not causal"; do
    csv=${twin%%:*} label=${twin#*:}
    [ -f "$1/$csv" ] || continue
    if [ "$csv" = bench_full.csv ]; then  # other shapes than the default run's: nothing to compare
      parse_attention "$1" "$csv"
    else
      parse_attention "$1" "$csv" bench_attention.csv
    fi | sed "s|^|$label: |"
  done
  return 0
}

# a train_gpt run's log (and nvidia-smi's memory samples beside it): steps, ms/step, tokens/s,
# MFU, peak device memory, best val loss, the attention kernels its start-up line names
parse_train() {
  local d=$1 name=$2 f=$1/$2.log
  [ -f "$f" ] || return 0
  local done_line tps mfu mem own att
  att=$(grep -Eo 'attention: [^|]*' "$f" | head -n1 | sed 's/ *$//')
  done_line=$(grep -E '^done: ' "$f" | tail -n1)
  tps=$(grep -Eo '\| [0-9]+ tok/s' "$f" | grep -Eo '[0-9]+' | median)
  mfu=$(grep -Eo '\| mfu [0-9.]+%' "$f" | grep -Eo '[0-9.]+' | median)
  own=$(grep -Eo 'memory: [0-9]+ MiB' "$f" | head -n1 | grep -Eo '[0-9]+')
  mem=$(grep -Eo '^[0-9]+' "$d/$name.mem" 2>/dev/null | sort -g | tail -n1)
  local tail_info peak="n/a"
  [ -n "$mem" ] && peak="$mem MiB (nvidia-smi)"
  tail_info="tokens/s ${tps:--}, MFU ${mfu:--}%, peak device memory $peak, model buffers ${own:--} MiB"
  if [ -n "$done_line" ]; then
    # done: S steps in X s, median M ms/step, best val loss V, final train A val B
    echo "$done_line" | awk -v tail="$tail_info" -v att="${att:+; $att}" '{
      sub(/,$/, "", $13); printf "%s steps in %s s, %s ms/step (median), %s, best val loss %s%s\n", $2, $5, $8, tail, $13, att }'
  else
    local last val
    last=$(grep -Eo '^step [0-9]+/[0-9]+' "$f" | tail -n1)
    val=$(grep -Eo 'val loss [0-9.]+' "$f" | awk '{print $3}' | sort -g | head -n1)
    echo "did not finish: last logged ${last:-none}, ms/step $(grep -Eo '\| [0-9.]+ ms \|' "$f" | grep -Eo '[0-9.]+' | median), $tail_info, best val loss so far ${val:--}${att:+; $att}"
  fi
}

# nanoGPT's train.py log: iterations logged, median ms/iteration after compilation (iterations
# from 100 on), best val loss and the step it was seen at; beside it our flash run's
parse_nanogpt() {
  local d=$1 f=$1/nanogpt.log
  [ -f "$f" ] || return 0
  grep -q 'not importable\|no torch' "$f" && { grep -m1 'not importable\|no torch' "$f"; return 0; }
  local last ms val at ours
  last=$(sed -nE 's/^iter ([0-9]+): .*/\1/p' "$f" | tail -n1)
  ms=$(sed -nE 's/^iter ([0-9]+): .*time ([0-9.]+) ?ms.*/\1 \2/p' "$f" | awk -v from="${NANOGPT_FROM:-100}" '$1 >= from {print $2}' | median)
  read -r val at < <(sed -nE 's/^step ([0-9]+): train loss [0-9.]+, val loss ([0-9.]+).*/\2 \1/p' "$f" | sort -g | head -n1)
  ours=$(grep -E '^done: ' "$d/train_flash.log" 2>/dev/null | awk '{print $8}')
  local ratio=""
  [ -n "$ours" ] && [ -n "$ms" ] && ratio=$(awk -v a="$ours" -v b="$ms" 'BEGIN { if (b > 0) printf "; train_gpt flash / nanoGPT ms per iteration %.2f", a / b }')
  local mem
  mem=$(grep -Eo '^[0-9]+' "$d/nanogpt.mem" 2>/dev/null | sort -g | tail -n1)
  echo "last iteration logged ${last:--}, ${ms:--} ms/iteration (median from iteration ${NANOGPT_FROM:-100}), best val loss ${val:--}${at:+ (step $at)}, peak device memory ${mem:-n/a}${mem:+ MiB (nvidia-smi)}${ratio}"
}

parse_sanitize() {
  local d=$1 t any=""
  for t in racecheck initcheck synccheck memcheck; do
    [ -f "$d/sanitize_$t.log" ] || continue
    any+="$t: $(sanitizer_result "$d/sanitize_$t.log") ($(doctest_counts "$d/sanitize_$t.log" | sed 's/ of.*//')); "
  done
  [ -n "$any" ] && echo "${any%; }"
}

parse_counters() {
  local d=$1 n e
  [ -f "$d/counters.log" ] || return 0
  n=$(awk -F'","' '/^"[0-9]/ && $5 != "" {k[$1]} END {print length(k)}' "$d/counters_ncu.csv" 2>/dev/null)
  e=$(grep -c '^emulated' "$d/counters_emulated.txt" 2>/dev/null)
  echo "ncu: ${n:-0} kernel launches profiled (counters_ncu.csv); emulated: ${e:-0} kernel lines (counters_emulated.txt)$(counters_agree "$d")"
  [ -f "$d/stalls_1.csv" ] && stall_line "$d/stalls_1.csv" "HS 128, T 4k, p 0; the two kernels"
  [ -f "$d/stalls_3.csv" ] && stall_line "$d/stalls_3.csv" "HS 128, T 4k, p 0; dQ inside the dK / dV kernel"
  [ -f "$d/stalls_fwd0.csv" ] && stall_line "$d/stalls_fwd0.csv" "HS 64, T 4k, p 0; the forward"
  [ -f "$d/stalls_fwd2.csv" ] && stall_line "$d/stalls_fwd2.csv" "HS 64, T 4k, p 0.2; the forward"
  local f any=""
  for f in "$d"/sass_1.csv "$d"/sass_3.csv; do
    [ -s "$f" ] && any+="$(basename "$f") $(grep -c . "$f") lines, "
  done
  [ -n "$any" ] && echo "the dK / dV kernels' stall samples per SASS instruction (logs.tar.gz): ${any%, }"
  return 0
}

# One line from ncu's CSV of a pass over attention kernels (step_counters): per kernel (its first
# launch), its duration, the three largest stall reasons, in cycles a warp spends in each per
# instruction issued (ncu's smsp__average_warps_issue_stalled_*_per_issue_active.ratio, "selected"
# left out), and where the pass asked for them the four busiest pipes (sm__pipe_*_cycles_active, %
# of peak). LABEL: the shape and the kernels.
stall_line() {  # FILE LABEL
  awk -F'","' -v label="$2" '
    function base(s,   p, n) {
      sub(/^"/, "", s); gsub(/<unnamed>/, "anon", s); sub(/^void /, "", s); sub(/[<(].*/, "", s)
      n = split(s, p, "::"); return p[n]
    }
    /^"[0-9]/ && $5 != "" {
      k = base($5)
      if (!(k in first)) { first[k] = $1; order[++nk] = k }
      if ($1 != first[k]) next
      v = $15; gsub(/[",]/, "", v)
      if ($13 == "Duration") dur[k] = v / ($14 ~ /^n/ ? 1e6 : $14 ~ /^u/ ? 1e3 : $14 ~ /^m/ ? 1 : 1e-3)
      else if ($13 ~ /^smsp__average_warps_issue_stalled_.*_per_issue_active[.]ratio$/) {
        r = $13; sub(/^smsp__average_warps_issue_stalled_/, "", r); sub(/_per_issue_active[.]ratio$/, "", r)
        if (r != "selected") { n[k]++; name[k, n[k]] = r; val[k, n[k]] = v + 0 }
      } else if ($13 ~ /^sm__pipe_.*_cycles_active[.]avg[.]pct_of_peak_sustained_active$/) {
        r = $13; sub(/^sm__pipe_/, "", r); sub(/_cycles_active.*$/, "", r)
        np[k]++; pname[k, np[k]] = r; pval[k, np[k]] = v + 0
      }
    }
    # the m largest of the count c values of kernel k in names nm and values vl, "name value" apart
    function top(k, c, nm, vl, m, fmt,   t, j, best, s, used) {
      s = ""
      for (t = 1; t <= m && t <= c; t++) {
        best = 0
        for (j = 1; j <= c; j++) if (!(j in used) && (!best || vl[k, j] > vl[k, best])) best = j
        used[best] = 1; s = s (t == 1 ? "" : ", ") nm[k, best] sprintf(fmt, vl[k, best])
      }
      return s
    }
    END {
      if (!nk) exit
      out = "stalls (ncu; cycles a warp waits per instruction issued; " label "):"
      for (i = 1; i <= nk; i++) {
        k = order[i]; out = out " " k ((k in dur) ? sprintf(" %.2f ms", dur[k]) : "")
        if (n[k]) out = out ": " top(k, n[k], name, val, 3, " %.2f")
        if (np[k]) out = out "; pipes busy: " top(k, np[k], pname, pval, 4, " %.0f%%")
        out = out (i < nk ? ";" : "")
      }
      print out
    }' "$1" 2>/dev/null
}

# For the kernels both count (by base name, template arguments dropped): whether ncu's global load
# and store requests and sectors per launch equal the emulator's.
counters_agree() {
  [ -s "$1/counters_ncu.csv" ] && [ -s "$1/counters_emulated.txt" ] || return 0
  awk -F'","' -v emu="$1/counters_emulated.txt" '
    function base(s,   p, n) {
      sub(/^"/, "", s); gsub(/<unnamed>/, "anon", s); sub(/^void /, "", s); sub(/[<(].*/, "", s)
      n = split(s, p, "::"); return p[n]
    }
    BEGIN {
      while ((getline line < emu) > 0) {
        if (line !~ /^emulated /) continue
        split(line, f, " [|] ")
        name = f[1]; sub(/^emulated /, "", name); sub(/[< ].*/, "", name)
        split(f[2], a, " "); el[name] += a[2]
        split(f[3], a, " "); eg[name, 1] += a[3]; eg[name, 2] += a[5]
        split(f[4], a, " "); eg[name, 3] += a[3]; eg[name, 4] += a[5]
      }
    }
    /^"[0-9]/ && $5 != "" {
      k = base($5); if (!((k, $1) in id)) { id[k, $1] = 1; nl[k]++ }
      v = $15; gsub(/[",]/, "", v)
      if ($13 == "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum") ng[k, 1] += v
      if ($13 == "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum") ng[k, 2] += v
      if ($13 == "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum") ng[k, 3] += v
      if ($13 == "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum") ng[k, 4] += v
    }
    END {
      for (k in el) {
        if (!(k in nl)) continue
        total++; ok = 1
        for (i = 1; i <= 4; i++) if (eg[k, i] * nl[k] != ng[k, i] * el[k]) ok = 0
        if (ok) same++; else differ = differ (differ ? ", " : "") k
      }
      if (total) printf "; per launch, global requests and sectors equal the emulated ones for %d of %d kernels%s", \
        same, total, differ ? " (differ: " differ ")" : ""
    }' "$1/counters_ncu.csv" 2>/dev/null
}

summarize() {
  local d=$1
  [ -f "$d/steps.tsv" ] || die "no $d/steps.tsv: not a window's log folder"
  local head
  head=$(cat "$d/header.txt" 2>/dev/null)
  echo "==== GPU window: ${head:-?}"
  printf '%-12s %-10s %6s %6s  %s\n' step status took_s exp_s result
  local name status took exp why lines first rest
  while IFS=$'\t' read -r name status took exp why; do
    lines=""
    if [ "$status" != skipped ]; then
      case "$name" in
        train_*) lines=$(parse_train "$d" "$name") ;;
        attention) lines=$(parse_attention_step "$d") ;;
        *) lines=$("parse_$name" "$d" 2>/dev/null) ;;
      esac
    fi
    [ -n "$why" ] && lines="$why${lines:+; $lines}"
    first=$(head -n1 <<<"$lines")
    printf '%-12s %-10s %6s %6s  %s\n' "$name" "$status" "$took" "$exp" "$first"
    rest=$(tail -n +2 <<<"$lines")
    [ -n "$rest" ] && sed 's/^/                                        /' <<<"$rest"
  done <"$d/steps.tsv"
  return 0
}

# ---- the window --------------------------------------------------------------------------------

window() {
  local deadline=540 rehearse=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --deadline) [[ "${2:-}" =~ ^[0-9]+$ ]] || die "--deadline takes seconds (a whole number), got '${2:-}'"; deadline=$2; shift 2 ;;
      --rehearse) rehearse=1; shift ;;
      *) die "unknown option '$1'; expected --deadline S or --rehearse" ;;
    esac
  done
  REHEARSE=$rehearse
  DEADLINE=$deadline
  T0=$SECONDS
  OUT=${OUT:-out/gpu_window$([ "$rehearse" = 1 ] && echo _rehearsal)}
  mkdir -p "$OUT" || die "cannot create $OUT"
  OUT=$(cd "$OUT" && pwd)
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/tg_window.XXXXXX")
  LOGS=$WORK/logs RUNS=$WORK/runs
  mkdir -p "$LOGS" "$RUNS"
  : >"$LOGS/steps.tsv"
  [ -d "$BUNDLE/bin" ] || die "no $BUNDLE/bin: build the bundle first with 'make gpu-bundle' (on the CPU machine), and carry $BUNDLE"
  local commit
  commit=$(cat "$BUNDLE/commit.txt" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)
  echo "commit $commit (bundle), $(date -u '+%Y-%m-%d %H:%M UTC'), deadline ${DEADLINE} s, $([ "$REHEARSE" = 1 ] && echo 'REHEARSAL on the CPU: the emulator in the GPU'"'"'s place' || echo 'on the GPU')" >"$LOGS/header.txt"

  if [ "$REHEARSE" = 1 ]; then
    # the emulator's binaries, tiny shapes and iteration counts; nanoGPT on the CPU
    TRAIN=./train_gpt_emu TEST=build/test_emu BENCH=build/bench_gpu_emu
    for b in "$TRAIN" "$TEST" "$BENCH"; do [ -x "$b" ] || die "--rehearse needs $b: make train_gpt_emu build/test_emu build/bench_gpu_emu"; done
    SUITE_ARGS=(-tc="gpu philox*,gpu layernorm*,gpu gelu*,gpu attention_decode*,flash attention bf16: O*")
    BENCH_ARGS=(--hs 64 --t 64 --p 0,0.2 --tokens 128 --width 128 --reps 1 --warmup 0 --paths flash,recompute,naive)
    TINY=(--n-layer 2 --n-embd 64 --n-head 1 --block-size 32 --batch-size 2 --max-iters 4 --eval-interval 2 --eval-iters 1 --log-interval 1)
    PROBE_ARGS=(--n-layer 1 --n-embd 64 --n-head 1 --block-size 32 --batch-size 2 --max-iters 2 --eval-interval 1 --eval-iters 1)
    SAMPLE_TOKENS=8
    NANOGPT_ARGS=(--device=cpu --compile=False --dtype=float32 --max_iters=30 --eval_interval=10 --eval_iters=2
                  --log_interval=1 --batch_size=4 --block_size=32 --n_layer=2 --n_head=2 --n_embd=64)
    NANOGPT_FROM=5
    SAN_FLASH=(-tc="flash attention bf16: O*")
    SAN_QUICK=("${SAN_FLASH[@]}")
    SAN_SUITE=(-tc="gpu layernorm*,gpu gelu*")
    MMA_BENCH_ARGS=(--hs 64 --t 64 --p 0.2 --tokens 128 --width 128 --reps 1 --warmup 0 --paths flash,recompute)
    WS_BENCH_ARGS=("${MMA_BENCH_ARGS[@]}")
    RING_BENCH_ARGS=("${MMA_BENCH_ARGS[@]}")
    NARROW_BENCH_ARGS=("${MMA_BENCH_ARGS[@]}")
    TWO_BENCH_ARGS=(--hs 64 --t 64 --p 0 --tokens 128 --width 128 --reps 1 --warmup 0 --paths flash)
    TURNS_BENCH_ARGS=("${TWO_BENCH_ARGS[@]}")
    THREE_BENCH_ARGS=(--hs 64 --t 64 --p 0.2 --tokens 128 --width 128 --reps 1 --warmup 0 --paths flash)
    FULL_BENCH_ARGS=(--hs 64 --t 64 --p 0.2 --causal 0 --tokens 128 --width 128 --reps 1 --warmup 0 --paths flash)
    # expected seconds on this machine (2 cores, the emulator), and the limits
    NAIVE_ARGS=()
    EXP=([facts]=5 [libs]=5 [suite]=60 [hopper]=20 [attention]=40 [train_flash]=40 [nanogpt]=40 [sanitize]=60 [counters]=40 [train_naive]=30)
  else
    TRAIN=$BUNDLE/bin/train_gpt TEST=$BUNDLE/bin/test_gpu BENCH=$BUNDLE/bin/bench_gpu
    SUITE_ARGS=(-tce="*hopper*")  # the hopper step ran them
    BENCH_ARGS=(--hs 64,128 --t 512,1024,2048,4096,8192,16384 --p 0,0.2 --naive-max-t 2048 --reps 10
                --paths flash,recompute,naive)
    TINY=()
    PROBE_ARGS=(--max-iters 2 --eval-interval 1 --eval-iters 1)
    SAMPLE_TOKENS=200
    NANOGPT_ARGS=(--compile=True)
    NANOGPT_FROM=100
    SAN_FLASH=(-tc="flash attention bf16: O*,flash attention float*,flash attention backward*,flash attention hopper*")
    # initcheck and synccheck on the Hopper kernels' cases alone (1 and 2 s on the H200): racecheck
    # on the whole flash matrix took 141 s there, and left no time for them on the rest
    SAN_QUICK=(-tc="flash attention hopper*")
    SAN_SUITE=(-tce="*20 steps*,*same seed twice*")
    MMA_BENCH_ARGS=(--hs 64,128 --t 1024,4096,16384 --p 0,0.2 --naive-max-t 0 --reps 10 --paths flash,recompute)
    WS_BENCH_ARGS=(--hs 64,128 --t 4096 --p 0,0.2 --naive-max-t 0 --reps 10)
    RING_BENCH_ARGS=(--hs 64,128 --t 4096,16384 --p 0.2 --naive-max-t 0 --reps 10 --paths flash)
    NARROW_BENCH_ARGS=(--hs 64,128 --t 4096,16384 --p 0,0.2 --naive-max-t 0 --reps 10 --paths flash)
    TWO_BENCH_ARGS=(--hs 64 --t 4096,16384 --p 0 --naive-max-t 0 --reps 10 --paths flash)
    TURNS_BENCH_ARGS=(--hs 64,128 --t 4096,16384 --p 0 --naive-max-t 0 --reps 10 --paths flash)
    THREE_BENCH_ARGS=(--hs 64 --t 4096,16384 --p 0.2 --naive-max-t 0 --reps 10 --paths flash)
    FULL_BENCH_ARGS=(--hs 64,128 --t 4096 --p 0,0.2 --causal 0 --naive-max-t 0 --reps 10 --paths flash)
    NAIVE_ARGS=(--max-iters 1000 --eval-interval 500)
    # seconds each took in the first window on an H100 (docs/BENCHMARKS.md), rounded up
    # (hopper: not yet run on a GPU: its tests, a third of the attention step's shapes, 300
    # iterations of training)
    # (attention: 45 s on the H100, before the recompute rows at p = 0.2 were added: about a
    # quarter more; and 10 each for the TG_FLASH_HOPPER=4, =5, =6 and =7 rows, not yet timed)
    EXP=([facts]=10 [libs]=5 [suite]=120 [hopper]=20 [attention]=75 [train_flash]=75 [nanogpt]=140 [sanitize]=80 [counters]=60 [train_naive]=30)
  fi
  export NANOGPT_FROM
  export TG_DATA_FILE=$BUNDLE/data/input.txt

  step facts 60
  step libs 600
  step hopper 270
  step suite 240
  step sanitize 200
  step attention 240
  step train_flash 300
  step counters 300
  step train_naive 300
  step nanogpt 100000
  echo
  cat "$OUT/summary.txt"
  rm -rf "$WORK"
}

declare -A EXP
left() { echo $((DEADLINE - (SECONDS - T0))); }
step_left() { local l=$((STEP_END - SECONDS)); echo $((l > 1 ? l : 1)); }

# step NAME LIMIT: step_NAME, given at most LIMIT seconds (and never past the deadline), when the
# time left fits what it is expected to take; one line in steps.tsv either way, then the summary
# and the archive written again
step() {
  local name=$1 limit=$2 exp=${EXP[$1]} step_t0=$SECONDS l rc
  l=$(left)
  echo "[window] $(date -u +%H:%M:%S) $name: expected ${exp} s, ${l} s left" >&2
  if ((l < exp)); then
    printf '%s\tskipped\t0\t%s\tneeds about %s s, %s s left\n' "$name" "$exp" "$exp" "$l" >>"$LOGS/steps.tsv"
  else
    STEP_END=$((SECONDS + (limit < l ? limit : l)))
    STEP_NOTE=""
    "step_$name" >>"$LOGS/$name.log" 2>&1
    rc=$?
    local status=ok
    ((rc == 124 || rc == 137)) && status="timed-out"
    ((rc != 0 && rc != 124 && rc != 137)) && status="failed($rc)"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" $((SECONDS - step_t0)) "$exp" "$STEP_NOTE" >>"$LOGS/steps.tsv"
  fi
  publish
}

# summary.txt and logs.tar.gz under $OUT, each written beside and then renamed into place
publish() {
  summarize "$LOGS" >"$OUT/summary.txt.tmp" 2>&1 && mv "$OUT/summary.txt.tmp" "$OUT/summary.txt"
  tar -czf "$OUT/logs.tar.gz.tmp" -C "$WORK" logs && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

# within a step: CMD under the step's time left (rc 124 when stopped)
bounded() { timeout -k 10 "$(step_left)" "$@"; }

# nvidia-smi's device memory in use, sampled every 0.5 s into FILE while a run goes (nothing
# without nvidia-smi); stop_sampler ends it
start_sampler() {
  SAMPLER=""
  command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >"$1" 2>/dev/null &
  SAMPLER=$!
}
stop_sampler() { [ -n "${SAMPLER:-}" ] && kill "$SAMPLER" 2>/dev/null; wait "${SAMPLER:-}" 2>/dev/null; SAMPLER=""; }

step_facts() {
  local v t
  if command -v nvidia-smi >/dev/null; then
    # each field on its own, so that one this driver does not know leaves a "?" and the rest
    q() { nvidia-smi --query-gpu="$1" --format=csv,noheader 2>/dev/null | head -n1 | grep -v -i 'not a valid\|error' || echo "?"; }
    echo "gpu: $(q name) (compute capability $(q compute_cap), $(q memory.total), max SM clock $(q clocks.max.sm), memory clock $(q clocks.max.memory), driver $(q driver_version))"
    nvidia-smi
    nvidia-smi -q | grep -iE 'product name|multiprocessor|bus id|clocks|power limit|persistence|mig mode' | head -n 40
  else
    echo "gpu: none (nvidia-smi not found)"
  fi
  v=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'); echo "nvcc: ${v:-not found}"
  for t in compute-sanitizer ncu; do
    v=$(command -v "$t" >/dev/null && "$t" --version 2>/dev/null | grep -Eo '[0-9]{4}\.[0-9.]+' | head -n1)
    echo "$t: ${v:-not found}"
  done
  echo "python3: $(python3 --version 2>&1 | awk '{print $2}')"
  v=$(timeout 60 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "sms", torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else "-")' 2>/dev/null)
  echo "torch: ${v:-not importable}"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, avx2 $(grep -qw avx2 /proc/cpuinfo && echo yes || echo no), avx512f $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)"
  return 0
}

# the folders holding the CUDA libraries the binaries need, where this image keeps them: the CUDA
# toolkit's, and the nvidia-* packages of python3's PyTorch
cuda_lib_dirs() {
  local d nv
  for d in "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")/../lib64" /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 \
    /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && echo "$d"
  done
  nv=$(timeout 30 python3 -c 'import nvidia, os; print(*[os.path.abspath(p) for p in nvidia.__path__])' 2>/dev/null)
  for d in $nv; do find "$d" -maxdepth 3 -name 'lib*.so*' -printf '%h\n' 2>/dev/null; done | sort -u
}

# whether one of the folders of a colon-separated list holds cuBLAS
holds_cublas() {
  local d IFS=:
  for d in $1; do compgen -G "$d/libcublas.so*" >/dev/null && return 0; done
  return 1
}

step_libs() {
  local b missing bad=() dirs
  dirs=$(cuda_lib_dirs | paste -sd: -)
  for b in "$BUNDLE"/bin/*; do
    missing=$(LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" ldd "$b" 2>&1 | grep 'not found')
    # not on the binary's run path: found in the image's folders. cuBLAS too, which ldd does not
    # list (the program opens it on first use, kernels/cublas_loader.cu): where the image's
    # folders hold it, they go on the path
    if [ -n "$dirs" ] && { [ -n "$missing" ] || holds_cublas "$dirs"; }; then
      export LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      missing=$(ldd "$b" 2>&1 | grep 'not found')
    fi
    echo "== ldd $b"; ldd "$b"
    if [ -n "$missing" ] || ! bounded "$b" --help >/dev/null 2>&1; then
      bad+=("$(basename "$b")")
      echo "not loading: $(basename "$b") ($(echo "$missing" | awk '{print $1}' | paste -sd' ' -))"
    fi
  done
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >"$LOGS/libs.env"
  if [ ${#bad[@]} -eq 0 ]; then
    echo "libs: $(ls "$BUNDLE"/bin | wc -l) binaries load$( [ -n "${LD_LIBRARY_PATH:-}" ] && echo " (LD_LIBRARY_PATH from the image: ${LD_LIBRARY_PATH%%:*}...)")"
    return 0
  fi
  [ "$REHEARSE" = 1 ] && { echo "libs: the bundle's binaries do not load here"; return 1; }
  # build them here, for this GPU only, with the headers the bundle carries
  local t=$SECONDS cc
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '. ')
  mkdir -p "$WORK/include" && tar -xzf "$BUNDLE/include.tar.gz" -C "$WORK/include"
  bounded make -j"$(nproc)" ARCH="$cc" BUILD="$WORK/build" MPI_CXXFLAGS= MPI_LIBS= CXXFLAGS="-O3 -march=native" \
    EIGEN_INC="-I$WORK/include/eigen3" DOCTEST_INC="-I$WORK/include" JSON_INC="-I$WORK/include" \
    "$WORK/build/train_gpt_cuda" "$WORK/build/test_gpu" "$WORK/build/bench_gpu" "$WORK/build/bench_step" || {
    echo "rebuilt: FAILED after $((SECONDS - t)) s (sm_$cc)"; return 1; }
  cp "$WORK/build/train_gpt_cuda" "$BUNDLE/bin/train_gpt"
  cp "$WORK/build/test_gpu" "$WORK/build/bench_gpu" "$WORK/build/bench_step" "$BUNDLE/bin/"
  echo "rebuilt: ${bad[*]} on the device for sm_$cc in $((SECONDS - t)) s"
}

# the environment the libs step found
lib_env() { [ -f "$LOGS/libs.env" ] && export "$(cat "$LOGS/libs.env")"; }

step_suite() {
  lib_env
  # (the cases' own log beside the step's, suite.log, which gets a copy: the step writes that one;
  # at most 70 % of the step's time, so that a hang leaves time for the failing cases again)
  bounded_to $((($(step_left) * 7) / 10)) "$TEST" "${SUITE_ARGS[@]}" >"$LOGS/suite_cases.log" 2>&1
  local rc=$? failed name i=0 seed
  cat "$LOGS/suite_cases.log"
  failed=$(failing_cases "$LOGS/suite_cases.log")
  if [ -z "$failed" ] && [ "$REHEARSE" = 1 ]; then
    # the rehearsal takes the path a failure takes, with a case that passed
    failed=$("$TEST" "${SUITE_ARGS[@]}" -ltc 2>/dev/null | grep -Ev '^(\[|=+$)' | head -n1)
    STEP_NOTE="rehearsal: '$failed' re-run as if it had failed"
  fi
  seed=$(sed -nE 's/.*TG_TEST_SEED=([0-9]+).*/\1/p' "$LOGS/suite_cases.log" | head -n1)
  printf '%s\n' "$failed" | sed '/^$/d' >"$LOGS/suite_failed.txt"
  while IFS= read -r name; do
    [ -n "$name" ] || continue
    i=$((i + 1))
    local filter=${name//,/\\,}
    echo "== again alone: $name"
    TG_TEST_SEED=${seed:-1} bounded_to $(($(step_left) / 2)) "$TEST" -tc="$filter" >"$LOGS/suite_rerun$i.log" 2>&1
    if [ "$REHEARSE" = 1 ]; then
      TG_TEST_SEED=${seed:-1} TG_EMU_RACECHECK=1 bounded "$TEST" -tc="$filter" >"$LOGS/suite_memcheck$i.log" 2>&1 &&
        echo "ERROR SUMMARY: 0 errors (the emulator's AddressSanitizer, racecheck and initcheck)" >>"$LOGS/suite_memcheck$i.log"
    else
      TG_TEST_SEED=${seed:-1} bounded compute-sanitizer --tool memcheck --error-exitcode 9 "$TEST" -tc="$filter" \
        >"$LOGS/suite_memcheck$i.log" 2>&1
    fi
  done <<<"$failed"
  return $rc
}

# within a step: CMD under at most S seconds and the step's time left (a hang costs S, not the step)
bounded_to() {
  local s=$1 l
  shift
  l=$(step_left)
  timeout -k 10 $((s < l ? s : l)) "$@"
}

step_hopper() {
  lib_env
  # the instructions alone first (tests/gpu/test_hopper_ptx.cu), then the kernels on them: a
  # misread layout shows in the first, a kernel's own error in the second
  bounded_to 30 "$TEST" -tc="hopper:*" >"$LOGS/hopper_ptx.log" 2>&1
  local rc=$?
  bounded_to 60 "$TEST" -tc="flash attention hopper*" >"$LOGS/hopper_tests.log" 2>&1
  local kernels=$?
  ((kernels != 0)) && rc=$kernels
  local failed
  failed=$(sed -nE 's/^\[doctest\] test cases:.*\| *([0-9]+) failed.*/\1/p' "$LOGS/hopper_tests.log" | tail -n1)
  # memcheck where a case failed, not where the cases ran out of time (it would too)
  if [ "${failed:-1}" != 0 ] && ((kernels != 124 && kernels != 137)) && [ "$REHEARSE" = 0 ]; then
    TG_REDUCED_MATRIX=1 bounded_to 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$TEST" \
      -tc="flash attention hopper*" >"$LOGS/hopper_memcheck.log" 2>&1
  fi
  # Where the kernels' cases did not finish (a hang, a fault), every later step on the default
  # kernels would too: a short training run probes the default, then each twin without one of the
  # changes not yet run on a GPU (8: no turns, 5: no pipelined backward, 7: two consumer
  # warpgroups, 6: key tiles of 64), then the mma.sync kernels (0); the first that finishes is
  # every later step's TG_FLASH_HOPPER, and the step's note says which.
  # (TG_WINDOW_PROBE_FAIL="default 8 ...": the settings whose probe is taken as failed, to
  # rehearse the fallback)
  if ((kernels != 0)) || [ -n "${TG_WINDOW_PROBE_FAIL:-}" ]; then
    local setting
    for setting in default 8 5 7 6 0; do
      if flash_probe "$setting"; then
        if [ "$setting" != default ]; then
          export TG_FLASH_HOPPER=$setting
          STEP_NOTE="the default kernels did not finish a short training run; every later step ran with TG_FLASH_HOPPER=$setting"
        fi
        break
      fi
      [ "$setting" = 0 ] && STEP_NOTE="no kernel setting finished a short training run"
    done
  fi
  return $rc
}

# flash_probe SETTING: two training steps and an evaluation of shakespeare-char on the flash path
# with TG_FLASH_HOPPER=SETTING ("default": unset) under a limit of its own (the forward with
# dropout on two consumer warpgroups and without it, the evaluation's, on three taking turns; both
# backward kernels); its output appended to hopper_probe.log
flash_probe() {
  local setting=$1 rc
  echo "== probe: TG_FLASH_HOPPER=$setting" >>"$LOGS/hopper_probe.log"
  case " ${TG_WINDOW_PROBE_FAIL:-} " in
    *" $setting "*) echo "taken as failed (TG_WINDOW_PROBE_FAIL)" >>"$LOGS/hopper_probe.log"; return 1 ;;
  esac
  (
    [ "$setting" = default ] && unset TG_FLASH_HOPPER || export TG_FLASH_HOPPER=$setting
    bounded_to 30 "$TRAIN" --preset shakespeare-char --device cuda --precision bf16 --attention flash \
      --data "$TG_DATA_FILE" --out-dir "$RUNS/probe_$setting" --sample-tokens 0 "${PROBE_ARGS[@]}"
  ) >>"$LOGS/hopper_probe.log" 2>&1
  rc=$?
  echo "== probe: TG_FLASH_HOPPER=$setting: exit $rc" >>"$LOGS/hopper_probe.log"
  return $rc
}

# the default kernels beside SDPA, then each twin (the header's attention line)
step_attention() {
  lib_env
  bounded_to 120 "$BENCH" "${BENCH_ARGS[@]}" --csv "$LOGS/bench_attention.csv"
  local rc=$?
  # each twin (TG_FLASH_HOPPER=N) on shapes of the default run, without SDPA: the summary gives its
  # time over the default's there (SDPA's own times are the default run's)
  attention_twin() {
    local setting=$1 csv=$2
    shift 2
    TG_FLASH_HOPPER=$setting bounded "$BENCH" "$@" --peer none --csv "$LOGS/$csv" || rc=$?
  }
  attention_twin 0 bench_mma.csv "${MMA_BENCH_ARGS[@]}"
  attention_twin 2 bench_ws.csv "${WS_BENCH_ARGS[@]}"
  attention_twin 3 bench_fused.csv "${WS_BENCH_ARGS[@]}"
  attention_twin 4 bench_ring.csv "${RING_BENCH_ARGS[@]}"
  attention_twin 5 bench_seq.csv "${WS_BENCH_ARGS[@]}"
  attention_twin 6 bench_narrow.csv "${NARROW_BENCH_ARGS[@]}"
  attention_twin 7 bench_two.csv "${TWO_BENCH_ARGS[@]}"
  attention_twin 8 bench_turns.csv "${TURNS_BENCH_ARGS[@]}"
  attention_twin 9 bench_three.csv "${THREE_BENCH_ARGS[@]}"
  bounded "$BENCH" "${FULL_BENCH_ARGS[@]}" --csv "$LOGS/bench_full.csv" || rc=$?
  return $rc
}

# train_flash, train_naive: shakespeare-char with the bundle's data
train_run() {
  local path=$1 name=train_$1 dir=$RUNS/$1
  local -a extra=()
  [ "$path" = naive ] && extra=("${NAIVE_ARGS[@]}")
  lib_env
  start_sampler "$LOGS/$name.mem"
  bounded "$TRAIN" --preset shakespeare-char --device cuda --precision bf16 --attention "$path" --data "$TG_DATA_FILE" \
    --out-dir "$dir" --sample-tokens "$SAMPLE_TOKENS" "${TINY[@]}" "${extra[@]}"
  local rc=$?
  stop_sampler
  cp "$dir/metrics.jsonl" "$LOGS/$name.metrics.jsonl" 2>/dev/null
  return $rc
}
step_train_flash() { train_run flash; }
step_train_naive() { train_run naive; }

step_nanogpt() {
  if ! python3 -c 'import torch' 2>/dev/null; then
    echo "nanoGPT: torch not importable by python3; skipped"
    STEP_NOTE="no torch"
    return 0
  fi
  local ng=$RUNS/nanoGPT
  cp -r "$BUNDLE/nanoGPT" "$ng" || return 1
  if [ ! -f "$ng/data/shakespeare_char/train.bin" ]; then
    # prepare.py imports requests only to download: a stub where it is missing
    mkdir -p "$RUNS/pystub" && : >"$RUNS/pystub/requests.py"
    cp "$TG_DATA_FILE" "$ng/data/shakespeare_char/input.txt"
    (cd "$ng" && PYTHONPATH="$RUNS/pystub" bounded python3 data/shakespeare_char/prepare.py) || return 1
  fi
  start_sampler "$LOGS/nanogpt.mem"
  (cd "$ng" && PYTHONUNBUFFERED=1 bounded python3 train.py config/train_shakespeare_char.py --out_dir="$RUNS/nanogpt_out" \
    "${NANOGPT_ARGS[@]}") >"$LOGS/nanogpt.log" 2>&1
  local rc=$?
  stop_sampler
  # stopped at the deadline: its iterations so far are the figure
  ((rc == 124 || rc == 137)) && STEP_NOTE="stopped at the time limit" && rc=0
  return $rc
}

# each tool in turn while the time left fits it (in the rehearsal, the emulator's racecheck and
# initcheck over the same cases: it has no synccheck, and AddressSanitizer is always on):
# racecheck on the flash matrix, initcheck and synccheck on SAN_QUICK (20 s each expected), memcheck
# on the reduced suite
step_sanitize() {
  lib_env
  local tool need
  export TG_REDUCED_MATRIX=1
  for tool in racecheck initcheck synccheck memcheck; do
    local cases=("${SAN_FLASH[@]}")
    need=${EXP[sanitize]}
    case $tool in
      initcheck | synccheck) cases=("${SAN_QUICK[@]}") need=20 ;;
      memcheck) cases=("${SAN_SUITE[@]}") ;;
    esac
    if (($(step_left) < need)); then
      echo "$tool: skipped, $(step_left) s left"
      STEP_NOTE+="${STEP_NOTE:+, }$tool skipped"
      continue
    fi
    if [ "$REHEARSE" = 1 ]; then
      [ "$tool" = synccheck ] && continue
      TG_EMU_RACECHECK=1 timeout -k 10 "${EXP[sanitize]}" "$TEST" "${cases[@]}" >"$LOGS/sanitize_$tool.log" 2>&1 &&
        echo "ERROR SUMMARY: 0 errors (the emulator's $tool)" >>"$LOGS/sanitize_$tool.log"
    else
      bounded compute-sanitizer --tool "$tool" --error-exitcode 9 "$TEST" "${cases[@]}" >"$LOGS/sanitize_$tool.log" 2>&1
    fi
    echo "$tool: rc $?"
  done
  unset TG_REDUCED_MATRIX
  return 0
}

step_counters() {
  lib_env
  cp "$BUNDLE/counters_emulated.txt" "$LOGS/counters_emulated.txt" 2>/dev/null
  if [ "$REHEARSE" = 1 ] || ! command -v ncu >/dev/null; then
    STEP_NOTE="no ncu here: the emulated counts only"
    [ -f "$LOGS/counters_emulated.txt" ] || TG_PRINT_COUNTERS=1 bounded "$TEST" -tc="kernel counters*" |
      grep '^emulated' >"$LOGS/counters_emulated.txt"
    return 0
  fi
  local m=l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
  m+=,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
  m+=,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
  m+=,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
  m+=,smsp__inst_executed_pipe_tensor_op_hmma.sum,launch__registers_per_thread,sm__maximum_warps_per_active_cycle_pct,gpu__time_duration.sum
  bounded ncu --metrics "$m" --csv --log-file "$LOGS/counters_ncu.csv" "$TEST" -tc="gpu model: one step at the kernel counters' shape*"
  local rc=$? v
  # where the backward's warps wait: its kernels at the attention benchmark's HS 128, T 4k, p 0,
  # the two kernels (TG_FLASH_HOPPER=1) and dQ inside the dK / dV kernel (=3); stall reasons and
  # the speed-of-light section (duration, DRAM and L2), one pass each
  for v in 1 3; do
    TG_FLASH_HOPPER=$v bounded_to 60 ncu --kernel-name regex:'dkdv|bwd_dq' --launch-count 2 --section SpeedOfLight \
      --metrics 'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' --csv --log-file "$LOGS/stalls_$v.csv" \
      "$BENCH" --hs 128 --t 4096 --p 0 --reps 1 --warmup 0 --naive-max-t 0 --paths flash --peer none >>"$LOGS/stalls.log" 2>&1
  done
  # the forward's at HS 64, T 4k, without and with dropout: stall reasons and how busy each pipe
  # is (whether the keep decisions' integer work or the tensor cores bound it)
  local p
  for p in 0 0.2; do
    bounded_to 40 ncu --kernel-name regex:'fwd_hopper' --launch-count 1 --section SpeedOfLight --metrics \
      'regex:^(smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active)$' \
      --csv --log-file "$LOGS/stalls_fwd${p/0./}.csv" "$BENCH" --hs 64 --t 4096 --p "$p" --reps 1 --warmup 0 \
      --naive-max-t 0 --paths flash --peer none >>"$LOGS/stalls.log" 2>&1
  done
  # and the dK / dV kernel's stall samples per SASS instruction (ncu's source page), for the next
  # change to read where in a step the warps wait
  for v in 1 3; do
    TG_FLASH_HOPPER=$v bounded_to 40 ncu --kernel-name regex:'dkdv' --launch-count 1 --section SourceCounters \
      --page source --print-source sass --csv --log-file "$LOGS/sass_$v.csv" "$BENCH" --hs 128 --t 4096 --p 0 --reps 1 \
      --warmup 0 --naive-max-t 0 --paths flash --peer none >>"$LOGS/stalls.log" 2>&1
  done
  return $rc
}

case "${1:-}" in
  window) shift; window "$@" ;;
  summarize) [ $# -eq 2 ] || die "usage: bash .ci/gpu_check.sh summarize LOGDIR"; summarize "$2" ;;
  *) die "expected 'window [--deadline S] [--rehearse]' or 'summarize LOGDIR'; got '${1:-}'" ;;
esac
