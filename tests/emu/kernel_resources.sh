#!/usr/bin/env bash
# tests/emu/kernel_resources.sh: the registers, spill stores and loads, stack frame, static shared
# memory and local memory of every CUDA kernel of the real nvcc build, per architecture, as ptxas
# reports them while it compiles the kernels (nvcc --resource-usage, i.e. ptxas -v). The Makefile
# runs both commands; tests/emu/occupancy.h reads what the second writes.
#
#   kernel_resources.sh nvcc NVCC ARG... -o OBJ
#       runs NVCC ARG... -o OBJ --resource-usage: ptxas's report goes to OBJ less .o plus .ptxas
#       (written only when nvcc succeeds), every other line nvcc prints (errors, warnings) to
#       stderr as before; exits with nvcc's status. The object is the same as without the flag.
#   kernel_resources.sh table ARCHS OBJ...
#       the reports of the objects OBJ as one table on stdout, one line per kernel (entry function)
#       and architecture:
#         sm_90 regs=168 spill_stores=0 spill_loads=0 stack=0 smem=0 lmem=0 object=build/x.o kernel=_Z...
#       (bytes but regs, which is per thread; smem is the kernel's static shared memory, lmem the
#       local memory outside the stack frame, 0 where ptxas prints none; kernel is the mangled
#       name). ARCHS is the build's list of compute capabilities ("80 90"); every report must hold
#       the same number of kernels for each. Fails, naming the file and line, on anything in a
#       report it does not recognise, and on a non-inlined device function with a stack frame or
#       spills of its own (ptxas reports those apart from the kernels that call it; the project
#       has none: every __device__ function is inlined).
#
# Why ptxas's report and not cuobjdump --dump-resource-usage on the objects: cuobjdump does not
# print spill stores or loads, and it is a separate component of the toolkit that an install may
# lack (this machine's has nvcc, ptxas, fatbinary and nvlink only), while ptxas compiles every
# kernel wherever nvcc does. The flag costs nothing: ptxas runs anyway, only its report is kept.
# Checked once against cuobjdump 13.2 on this build's objects: registers, stack and local memory
# equal for all 286 kernels x architectures; shared memory equal on sm_80, and on sm_90
# cuobjdump's SHARED is ptxas's smem + 1024, the 1 KB per block that the driver reserves on
# sm_80 and later (cudaDeviceProp::reservedSharedMemPerBlock), which the sm_90 cubin carries in
# its shared size and the occupancy calculator adds by itself: smem here is without it.
set -euo pipefail

cmd=${1:-}
shift || true
case "$cmd" in
nvcc)
  obj=
  prev=
  for a in "$@"; do
    if [ "$prev" = -o ]; then obj=$a; fi
    prev=$a
  done
  [ -n "$obj" ] || { echo "kernel_resources.sh nvcc: no -o OBJ among the arguments" >&2; exit 2; }
  report=${obj%.o}.ptxas
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  rm -f "$report"
  rc=0
  "$@" --resource-usage 2>"$log" || rc=$?
  # ptxas's lines: "ptxas info    : ..." and the indented line after each "Function properties for"
  awk -v report="$report.tmp" '
    props { print > report; props = 0; next }
    /^ptxas info    : / { print > report; props = /: Function properties for /; next }
    { print > "/dev/stderr" }' "$log"
  if [ "$rc" -eq 0 ]; then mv "$report.tmp" "$report"; else rm -f "$report.tmp"; fi
  exit "$rc"
  ;;
table)
  archs=${1:?kernel_resources.sh table: ARCHS OBJ...}
  shift
  [ $# -gt 0 ] || { echo "kernel_resources.sh table: no objects" >&2; exit 2; }
  echo "# registers (per thread), spill stores and loads, stack frame, static shared memory (smem) and"
  echo "# local memory (lmem) in bytes of every kernel, per architecture, as ptxas reported them while"
  echo "# it compiled the objects below (nvcc --resource-usage): written by tests/emu/kernel_resources.sh"
  echo "# archs: $archs"
  for obj in "$@"; do
    report=${obj%.o}.ptxas
    [ -r "$report" ] || { echo "kernel_resources.sh: no ptxas report $report for $obj (built without tests/emu/kernel_resources.sh nvcc?)" >&2; exit 1; }
    awk -v obj="$obj" -v archs="$archs" '
      function fail(why) { printf "kernel_resources.sh: %s:%d: %s: %s\n", FILENAME, FNR, why, $0 > "/dev/stderr"; bad = 1; exit 1 }
      function num(s) { if (s !~ /^[0-9]+$/) fail("not a byte count"); return s + 0 }
      # emits the kernel whose report is complete
      function flush() {
        if (cur == "") return
        if (!have_props || !have_used) { $0 = cur; fail("no " (have_props ? "\"Used N registers\"" : "\"Function properties\"") " line for this kernel") }
        printf "%s regs=%d spill_stores=%d spill_loads=%d stack=%d smem=%d lmem=%d object=%s kernel=%s\n",
               arch, regs, st, ld, stack, smem, lmem, obj, cur
        seen[arch] = 1; count[arch]++
        cur = ""
      }
      props != "" {
        # "    N bytes stack frame, N bytes spill stores, N bytes spill loads"
        if (!match($0, /^    [0-9]+ bytes stack frame, [0-9]+ bytes spill stores, [0-9]+ bytes spill loads$/)) fail("expected the stack frame and spill line")
        split($0, w, " ")
        if (props == cur) { stack = num(w[1]); st = num(w[5]); ld = num(w[9]); have_props = 1 }
        else if (num(w[1]) != 0 || num(w[5]) != 0 || num(w[9]) != 0) fail("a non-inlined device function (" props ") with its own stack frame or spills, which this table cannot attribute to a kernel: inline it, or give the table a line for it")
        props = ""; next
      }
      /^ptxas info    : [0-9]+ bytes gmem$/ { next }
      /^ptxas info    : Compile time = / { next }
      /^ptxas info    : Compiling entry function / {
        flush()
        if (!match($0, /^ptxas info    : Compiling entry function .[^ ]+. for .sm_[0-9]+[a-z]?.$/)) fail("unrecognised entry line")
        n = split($0, w, /'\''/)
        cur = w[2]; arch = w[4]; have_props = 0; have_used = 0
        regs = st = ld = stack = smem = lmem = 0
        next
      }
      /^ptxas info    : Function properties for / {
        props = substr($0, length("ptxas info    : Function properties for ") + 1)
        if (props != cur) flush()  # a non-inlined device function after the kernels of an arch
        next
      }
      /^ptxas info    : Used [0-9]+ registers/ {
        if (cur == "") fail("a register count outside an entry function")
        line = substr($0, length("ptxas info    : ") + 1)
        n = split(line, parts, ", ")
        for (i = 1; i <= n; i++) {
          p = parts[i]
          if (p ~ /^Used [0-9]+ registers$/) { split(p, w, " "); regs = num(w[2]) }
          else if (p ~ /^used [0-9]+ barriers$/) { }
          else if (p ~ /^[0-9]+ bytes smem$/) { split(p, w, " "); smem = num(w[1]) }
          else if (p ~ /^[0-9]+ bytes lmem$/) { split(p, w, " "); lmem = num(w[1]) }
          else if (p ~ /^[0-9]+ bytes cumulative stack size$/) { }
          else if (p ~ /^[0-9]+ bytes cmem\[[0-9]+\]$/) { }
          else if (p ~ /^[0-9]+ textures$/ || p ~ /^[0-9]+ samplers$/ || p ~ /^[0-9]+ surfaces$/) { }
          else fail("unrecognised field \"" p "\" in")
        }
        have_used = 1
        next
      }
      { fail("unrecognised line") }
      END {
        if (bad) exit 1
        flush()
        if (bad) exit 1
        na = split(archs, want, " ")
        for (i = 1; i <= na; i++) {
          a = "sm_" want[i]
          if (!(a in seen)) { printf "kernel_resources.sh: %s: no kernel compiled for %s\n", FILENAME, a > "/dev/stderr"; exit 1 }
          if (count[a] != count["sm_" want[1]]) { printf "kernel_resources.sh: %s: %d kernels for sm_%s, %d for %s\n", FILENAME, count["sm_" want[1]], want[1], count[a], a > "/dev/stderr"; exit 1 }
        }
      }' "$report"
  done
  ;;
*)
  echo "usage: kernel_resources.sh nvcc NVCC ARG... -o OBJ | kernel_resources.sh table ARCHS OBJ..." >&2
  exit 2
  ;;
esac
