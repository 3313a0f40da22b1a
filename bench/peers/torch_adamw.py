#!/usr/bin/env python3
"""Peer for zk_bench: time torch.optim.AdamW(foreach=True) on the CPU over the same element
count as zk_bench (one fp32 parameter of n elements, gradient set, state initialised by a
warm-up step). Prints one JSON line:
  {"peer": "torch_adamw", "n": ..., "threads": ..., "seconds": ..., "elements_per_s": ...}
Run with a python that has torch (Debian: /usr/bin/python3 with python3-torch)."""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=64 << 20, help="elements (default 64 Mi)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--reps", type=int, default=3, help="timed steps, best kept")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_adamw.py: this python has no torch (try /usr/bin/python3)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(args.n) * 0.1)
    p.grad = torch.randn(args.n) * 1e-2
    opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            foreach=True)
    opt.step()  # allocates exp_avg / exp_avg_sq
    best = float("inf")
    for _ in range(args.reps):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"peer": "torch_adamw", "n": args.n, "threads": args.threads,
                      "torch": torch.__version__, "seconds": round(best, 6),
                      "elements_per_s": round(args.n / best)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
