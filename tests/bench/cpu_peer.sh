#!/usr/bin/env bash
# tests/bench/cpu_peer.sh (make bench-cpu-peer): train_gpt's CPU backend beside nanoGPT on
# PyTorch (eager, CPU), the peer a user would pick, on the baby configuration (4 layers, 4
# heads, 128 wide, T = 64, B = 12, dropout 0), in one run: ROUNDS rounds, each running nanoGPT's
# own train.py and then train_gpt for STEPS steps; per run the median ms per step over the steps
# after the first WARM (nanoGPT's iteration 0 also evaluates), then the median of the runs, the
# ratio of the two medians and the median of the rounds' ratios. BUSY=1 keeps one core busy with
# a spinning process for the whole comparison.
#   NANOGPT=/path/to/nanoGPT   a checkout of karpathy/nanoGPT (never committed; required)
#   PYTHON=python3             a Python with torch (from PyPI)
#   STEPS=60 ROUNDS=3 WARM=5 BUSY=0 TG_DATA=data/tinyshakespeare/input.txt
# Skips with a message (exit 0) when NANOGPT is not set or torch is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-60}
ROUNDS=${ROUNDS:-3}
WARM=${WARM:-5}
BUSY=${BUSY:-0}
DATA=${TG_DATA:-data/tinyshakespeare/input.txt}
if [ -z "${NANOGPT:-}" ] || [ ! -f "$NANOGPT/train.py" ]; then
  echo "[bench-cpu-peer] skipped: set NANOGPT=/path/to/a/nanoGPT/checkout (git clone https://github.com/karpathy/nanoGPT)"
  exit 0
fi
if ! torch_version=$("$PYTHON" -c "import torch; print(torch.__version__)" 2>/dev/null); then
  echo "[bench-cpu-peer] skipped: $PYTHON has no torch (pip install torch numpy, or PYTHON=/path/to/python)"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"; [ -n "${busy_pid:-}" ] && kill "$busy_pid" 2>/dev/null' EXIT

# nanoGPT's shakespeare_char data from the same text (its prepare.py downloads only when
# input.txt is missing; a stub stands in for `requests` when it is not installed)
ng_data="$NANOGPT/data/shakespeare_char"
if [ ! -f "$ng_data/train.bin" ]; then
  cp "$DATA" "$ng_data/input.txt"
  stub=""
  "$PYTHON" -c "import requests" 2>/dev/null || { mkdir -p "$work/stub" && : >"$work/stub/requests.py" && stub="$work/stub"; }
  (cd "$ng_data" && PYTHONPATH="$stub" "$PYTHON" prepare.py >/dev/null)
fi

# the median of the per-step times in a list of numbers (one per line), after the first WARM
median() { tail -n +"$((WARM + 1))" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

nanogpt_run() {
  (cd "$NANOGPT" && "$PYTHON" train.py config/train_shakespeare_char.py --device=cpu --compile=False \
    --eval_iters=1 --eval_interval=1000000 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 \
    --n_head=4 --n_embd=128 --max_iters="$STEPS" --lr_decay_iters=2000 --dropout=0.0 \
    --out_dir="$work/nanogpt_out" --always_save_checkpoint=False) 2>&1 |
    sed -nE 's/^iter ([0-9]+): .* time ([0-9.]+)ms.*/\1 \2/p' | awk '$1 >= 1 {print $2}' | median
}
train_gpt_run() {
  rm -rf "$work/tg_out"
  ./train_gpt --device cpu --preset baby --max-iters "$STEPS" --eval-interval 1000000 --eval-iters 1 \
    --log-interval 1 --sample-tokens 0 --data "$DATA" --out-dir "$work/tg_out" |
    sed -nE 's/^step [0-9]+\/[0-9]+ \|.*\| ([0-9.]+) ms \|.*/\1/p' | median
}

if [ "$BUSY" = 1 ]; then
  "$PYTHON" -c "while True: pass" &
  busy_pid=$!
fi
cpu=$(lscpu | sed -nE 's/^Model name: *//p' | head -n1)
echo "[bench-cpu-peer] $cpu, $(nproc) cores; torch $torch_version; $STEPS steps a run, median after $WARM; busy core: $BUSY"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
ng=() tg=() rt=()
for r in $(seq 1 "$ROUNDS"); do
  a=$(nanogpt_run)
  b=$(train_gpt_run)
  ng+=("$a")
  tg+=("$b")
  rt+=("$(ratio "$a" "$b")")
  echo "round $r: nanoGPT $a ms/step, train_gpt $b ms/step, ratio ${rt[-1]}x"
done
WARM=0
m_ng=$(printf '%s\n' "${ng[@]}" | median)
m_tg=$(printf '%s\n' "${tg[@]}" | median)
# the ratio of the medians, and the median of the rounds' own ratios (a round's two runs are
# seconds apart, so a change of the host's speed between rounds moves both sides of its ratio)
m_rt=$(printf '%s\n' "${rt[@]}" | median)
echo "median: nanoGPT (PyTorch $torch_version, eager) $m_ng ms/step, train_gpt $m_tg ms/step, ratio $(ratio "$m_ng" "$m_tg")x; median of the rounds' ratios ${m_rt}x"
