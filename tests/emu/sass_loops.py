#!/usr/bin/env python3
# tests/emu/sass_loops.py: the static size of each kernel's main loop in an object's SASS, for the
# instruction counts of docs/BENCHMARKS.md.
#
#   python3 tests/emu/sass_loops.py build/kernels/flash_attn_hopper.o [substring ...]
#
# Runs `cuobjdump -sass` on the object (cuobjdump and nvdisasm on PATH: the CUDA toolkit's, or
# PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm) and reads ptxas's report beside it
# (X.ptxas, which the Makefile writes). One line a kernel whose name holds every substring:
#   the kernel, its registers at entry (ptxas), the highest register its SASS names (above the entry
#   count where setmaxnreg raises it), and its loops: each innermost loop (a backward branch's span
#   holding no other such span) with tensor-core products (HGMMA for wgmma, HMMA for mma.sync), in
#   address order, with its instructions (NOPs left out), products and MUFU instructions. A step's
#   loop is the one with a step's products (the Hopper forward's HS / 16 + Bc / 16, say); ptxas may
#   leave a second, a peeled or rotated copy of part of it.
# A static count: the loop's every block once, a masking block that runs on the diagonal alone
# included; what a step executes off the diagonal is fewer.
import os
import re
import subprocess
import sys


def demangle(names):
    out = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True, check=True).stdout
    return [re.sub(r'\(anonymous namespace\)::|gpu::flash::|gpu::', '', d).split('(')[0].removeprefix('void ')
            for d in out.splitlines()]


def main():
    if len(sys.argv) < 2:
        sys.exit('usage: sass_loops.py OBJECT [substring ...]')
    obj, subs = sys.argv[1], sys.argv[2:]
    try:
        sass = subprocess.run(['cuobjdump', '-sass', obj], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f'sass_loops.py: cuobjdump -sass {obj} failed ({e}); put cuobjdump and nvdisasm on PATH')
    report = os.path.splitext(obj)[0] + '.ptxas'
    entry = {}
    if os.path.exists(report):
        text = open(report).read()
        for m in re.finditer(r"Compiling entry function '(\S+)' for '(sm_\w+)'.*?Used (\d+) registers", text, re.S):
            entry[(m.group(1), m.group(2))] = int(m.group(3))
    ins_re = re.compile(r'/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;')
    rows = []
    for arch, body in re.findall(r'arch = (sm_\w+).*?\n(.*?)(?=\n\s*arch = |\Z)', sass, re.S):
        for func in re.split(r'\n\s*Function : ', body)[1:]:
            name = func.split('\n', 1)[0].strip()
            ins = [(int(a, 16), t) for a, t in ins_re.findall(func) if t != 'NOP']
            regs = [int(r) for _, t in ins for r in re.findall(r'\bR(\d+)\b', t)]
            loops = []
            for a, t in ins:
                m = re.search(r'\bBRA\b.*?(0x[0-9a-f]+)', t)
                if not m or int(m.group(1), 16) >= a:
                    continue
                lo = int(m.group(1), 16)
                span = [x for b, x in ins if lo <= b <= a]
                mma = sum(1 for x in span if re.match(r'(@\S+\s+)?H(G)?MMA', x))
                if mma:
                    loops.append((lo, a, len(span), mma, sum(1 for x in span if 'MUFU' in x)))
            inner = sorted(l for l in loops if not any(o is not l and l[0] <= o[0] and o[1] <= l[1] for o in loops))
            rows.append((name, arch, entry.get((name, arch), '?'), max(regs, default=-1), inner))
    for (name, arch, at_entry, top, inner), short in zip(rows, demangle([r[0] for r in rows])):
        if not all(s in short for s in subs):
            continue
        where = '; '.join(f'{n} instructions, {h} products, {m} MUFU' for _, _, n, h, m in inner) or 'none with products'
        print(f'{short}  {arch}  R{at_entry} at entry, highest R{top}  loops: {where}')


if __name__ == '__main__':
    main()
