#!/usr/bin/env python3
"""tests/interop/hf_export_check.py (make interop): a train_gpt model exported with --export-hf
loads into Hugging Face transformers' GPT2LMHeadModel and computes the same function.

For each GELU form (tanh: GPT-2's, erf: nanoGPT's) it trains a small model with train_gpt on
the CPU, exports its checkpoint and loads the export with GPT2LMHeadModel.from_pretrained (no
download: everything is local). Then:
  1. the export's tensors against an independent mapping, written here, of the checkpoint's own
     model.safetensors (nanoGPT's names: Linear weights transposed into GPT-2's Conv1D, zero
     biases): the logits of one window within 1e-6 of their largest magnitude;
  2. greedy continuations of the same prompt, token for token, within one context window:
     train_gpt --sample --top-k 1 against transformers' argmax decoding (its own KV cache);
  3. how far the other activation would be: the same weights with the other GELU in
     config.json move the logits by more than the tolerance of 1 (so 1 and 2 see the form).
Skips (exit 0, one line) when torch or
transformers is missing: pip install torch transformers.

  python3 tests/interop/hf_export_check.py --train-gpt ./train_gpt --data data/tinyshakespeare/input.txt
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-gpt", default="./train_gpt")
    ap.add_argument("--data", default="data/tinyshakespeare/input.txt")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--tokens", type=int, default=60)
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"[interop] skipped: {e.name} is not installed (pip install torch transformers)")
        return 0
    print(f"[interop] torch {torch.__version__}, transformers {transformers.__version__}")
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        for gelu in ("tanh", "erf"):
            run, hf = os.path.join(work, f"run-{gelu}"), os.path.join(work, f"hf-{gelu}")
            common = ["--device", "cpu", "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "64"]
            subprocess.run([args.train_gpt, *common, "--batch-size", "8", "--max-iters", str(args.steps),
                            "--eval-interval", "0", "--eval-iters", "1", "--sample-tokens", "0", "--gelu", gelu,
                            "--data", args.data, "--out-dir", run], check=True, stdout=subprocess.DEVNULL)
            subprocess.run([args.train_gpt, "--export-hf", hf, "--ckpt", run], check=True, stdout=subprocess.DEVNULL)
            ours = subprocess.run([args.train_gpt, "--sample", "--ckpt", run, "--prompt", "\n", "--top-k", "1",
                                   "--sample-tokens", str(args.tokens)], check=True, capture_output=True,
                                  text=True).stdout
            with open(os.path.join(hf, "train_gpt_vocab.json"), encoding="utf-8") as f:
                itos = json.load(f)
            stoi = {ch: i for i, ch in enumerate(itos)}
            model = transformers.GPT2LMHeadModel.from_pretrained(hf).eval()
            # 1. the export against an independent mapping of the checkpoint's own weights
            from safetensors.torch import load_file
            ckpt = sorted(d for d in os.listdir(run) if d.startswith("ckpt-") and not d.endswith(".tmp"))[-1]
            ng = load_file(os.path.join(run, ckpt, "model.safetensors"))
            mapped = {}
            for name, t in ng.items():
                if name == "lm_head.weight":
                    continue
                conv = ".h." in name and name.endswith(".weight") and t.dim() == 2
                mapped[name] = t.t().contiguous() if conv else t
            ref = transformers.GPT2LMHeadModel(model.config).eval()
            missing = ref.load_state_dict(mapped, strict=False).missing_keys
            with torch.no_grad():
                for k in missing:  # the biases a bias-free model does not have
                    if k.endswith(".bias"):
                        ref.get_parameter(k).zero_()
                window = torch.tensor([[stoi[ch] for ch in open(args.data, encoding="utf-8").read(64)]])
                a, b = model(window).logits, ref(window).logits
                err = ((a - b).abs().max() / b.abs().max()).item()
                other = transformers.GPT2LMHeadModel.from_pretrained(
                    hf, activation_function="gelu" if gelu == "tanh" else "gelu_new").eval()
                moved = ((other(window).logits - b).abs().max() / b.abs().max()).item()
            ok1 = err <= 1e-6 and moved > 1e-6
            failures += not ok1
            print(f"[interop] gelu {gelu}: export vs independent mapping: max |logit diff| {err:.2e} of the largest "
                  f"(the other GELU would move them {moved:.2e}) {'ok' if ok1 else 'FAILED'}")
            # 2. greedy decoding against train_gpt's
            ids = torch.tensor([[stoi["\n"]]])
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=args.tokens, do_sample=False, pad_token_id=0)
            theirs = "".join(itos[i] for i in out[0].tolist())
            ours = ours[: len(theirs)]
            same = ours == theirs
            failures += not same
            print(f"[interop] gelu {gelu}: activation_function {model.config.activation_function}, "
                  f"greedy {args.tokens} tokens {'equal' if same else 'DIFFER'}")
            if not same:
                print(f"  train_gpt:    {ours!r}\n  transformers: {theirs!r}")
    print(f"[interop] {'passed' if failures == 0 else f'{failures} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
