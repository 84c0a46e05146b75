#!/usr/bin/env python3
"""tests/bench/sdpa_peer.py: the PyTorch peer of tests/bench/bench_attention.cu.

Times torch.nn.functional.scaled_dot_product_attention (default backend selection) in bf16 on
CUDA: forward, backward, forward+backward, each the median of --reps runs after 3 warm-up runs,
measured with CUDA events. One parsable line per shape:

  SDPA B=<B> T=<T> NH=<NH> HS=<HS> causal=<0|1> p=<p> fwd_ms=<x> bwd_ms=<y> fwdbwd_ms=<z>

  python3 tests/bench/sdpa_peer.py --shapes "B,T,NH,HS,causal,p;..." [--reps N]

Lines not starting with "SDPA" are messages (the caller prints them).
"""
import argparse
import statistics
import sys


def time_ms(torch, fn, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True, help='"B,T,NH,HS,causal,p;..."')
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"sdpa_peer: PyTorch not importable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("sdpa_peer: torch.cuda is not available")
        return 0
    print(f"sdpa_peer: torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
    for spec in filter(None, args.shapes.split(";")):
        B, T, NH, HS, causal, p = spec.split(",")
        B, T, NH, HS, causal, p = int(B), int(T), int(NH), int(HS), bool(int(causal)), float(p)
        try:
            q, k, v = (torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)

            def fwd():
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)

            out = fwd()

            def bwd():
                q.grad = k.grad = v.grad = None
                out.backward(dout, retain_graph=True)

            def fwdbwd():
                q.grad = k.grad = v.grad = None
                fwd().backward(dout)

            tf = time_ms(torch, fwd, 3, args.reps)
            tb = time_ms(torch, bwd, 3, args.reps)
            tfb = time_ms(torch, fwdbwd, 3, args.reps)
            print(f"SDPA B={B} T={T} NH={NH} HS={HS} causal={int(causal)} p={p:g} "
                  f"fwd_ms={tf:.4f} bwd_ms={tb:.4f} fwdbwd_ms={tfb:.4f}", flush=True)
            del q, k, v, dout, out
            torch.cuda.empty_cache()
        except RuntimeError as e:  # e.g. out of memory on the largest shapes
            print(f"sdpa_peer: B={B} T={T} HS={HS} p={p:g} failed: {str(e).splitlines()[0]}", flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
