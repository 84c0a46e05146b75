#!/usr/bin/env python3
"""tests/interop/hf_export_check.py (make interop): a train_gpt model exported with --export-hf
loads into Hugging Face transformers' GPT2LMHeadModel and computes the same function, and a
GPT2LMHeadModel saved by transformers starts a train_gpt model (--init-from) that computes its
function.

First, for each GELU form (gelu_new: tanh, gelu: erf): a small random GPT2LMHeadModel built from
a config (no download; odd sizes; every weight, bias and layernorm parameter random), saved with
save_pretrained; train_gpt --logits IDS --init-from DIR --device cpu prints its logits for one
sequence of random token ids, compared with the model's own (fp32 CPU, eager attention): the
largest |difference| within 1e-5 of the largest |logit|, while the same weights with the other
GELU move the logits by more than that (so the check sees the form). --gpt2-small adds a random
model of GPT-2 small's shape (V 50257, T 1024, 12 layers of 768).

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


def check_init_from(args, torch, transformers, work):
    """A random GPT2LMHeadModel saved by transformers, loaded with train_gpt --init-from: logits equal."""
    failures = 0
    torch.manual_seed(1234)
    small = dict(vocab_size=101, n_positions=48, n_embd=48, n_layer=3, n_head=4)
    shapes = [("gelu_new", small, 37, True), ("gelu", small, 37, True)]
    if args.gpt2_small:  # GPT-2 small's shape (12 x 12 x 768, T 1024, V 50257), transformers' own init
        shapes.append(("gelu_new", {}, 9, False))
    for act, sizes, n_ids, perturb in shapes:
        config = transformers.GPT2Config(**sizes, activation_function=act, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, attn_implementation="eager",
                                         **({"bos_token_id": 0, "eos_token_id": 0} if sizes else {}))
        model = transformers.GPT2LMHeadModel(config).eval()
        if perturb:
            with torch.no_grad():
                for name, p in model.named_parameters():  # random everywhere: biases and layernorms too
                    ln = "ln_" in name
                    p.copy_(torch.randn_like(p) * (0.5 if ln else 0.2) + (1.0 if ln and name.endswith("weight") else 0.0))
        hf = os.path.join(work, f"init-{act}-{config.n_layer}")
        model.save_pretrained(hf)
        ids = torch.randint(0, config.vocab_size, (1, n_ids))
        ours = subprocess.run([args.train_gpt, "--logits", ",".join(str(i) for i in ids[0].tolist()), "--init-from", hf,
                               "--device", "cpu"], check=True, capture_output=True, text=True).stdout
        a = torch.tensor([[float(x) for x in line.split()] for line in ours.strip().split("\n")])
        other = transformers.GPT2LMHeadModel.from_pretrained(
            hf, activation_function="gelu" if act == "gelu_new" else "gelu_new", attn_implementation="eager").eval()
        with torch.no_grad():
            b = model(ids).logits[0]
            moved = ((other(ids).logits[0] - b).abs().max() / b.abs().max()).item()
        ok = a.shape == b.shape
        err = ((a - b).abs().max() / b.abs().max()).item() if ok else float("inf")
        ok = ok and err <= 1e-5 and moved > 1e-5
        failures += not ok
        print(f"[interop] init-from a transformers GPT2LMHeadModel ({act}, {config.n_layer} layers, {config.n_head} heads, "
              f"{config.n_embd} wide, V {config.vocab_size}, {n_ids} tokens): max |logit diff| {err:.2e} of the largest "
              f"(the other GELU would move them {moved:.2e}) {'ok' if ok else 'FAILED'}")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-gpt", default="./train_gpt")
    ap.add_argument("--data", default="data/tinyshakespeare/input.txt")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--tokens", type=int, default=60)
    ap.add_argument("--gpt2-small", action="store_true",
                    help="also read a random model of GPT-2 small's shape (a 500 MB file; about a minute)")
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
        failures += check_init_from(args, torch, transformers, work)
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
