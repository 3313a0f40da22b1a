#!/usr/bin/env python3
"""Peer for zk_bench: time a CPU AdamW over the same element count as zk_bench (one fp32
parameter of n elements, gradient set, state initialised by a warm-up step):
  --impl torch      torch.optim.AdamW(foreach=True)
  --impl deepspeed  DeepSpeed's DeepSpeedCPUAdam (adamw_mode, its AVX kernel, JIT-built on
                    first use), run with the python of bench/ds_venv.sh
Prints one JSON line:
  {"peer": "torch_adamw"|"ds_cpu_adam", "n": ..., "threads": ..., "seconds": ...,
   "elements_per_s": ...}
Run with a python that has torch (Debian: /usr/bin/python3 with python3-torch)."""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=64 << 20, help="elements (default 64 Mi)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--reps", type=int, default=3, help="timed steps, best kept")
    ap.add_argument("--impl", choices=("torch", "deepspeed"), default="torch")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    try:
        import torch
    except ImportError:
        print("torch_adamw.py: this python has no torch (try /usr/bin/python3)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(args.n) * 0.1)
    p.grad = torch.randn(args.n) * 1e-2
    hp = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if args.impl == "deepspeed":
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam
        except ImportError as e:
            print(f"torch_adamw.py: no DeepSpeed in this python ({e}); bench/ds_venv.sh makes "
                  "one", file=sys.stderr)
            return 2
        opt = DeepSpeedCPUAdam([p], adamw_mode=True, **hp)
        name = "ds_cpu_adam"
    else:
        opt = torch.optim.AdamW([p], foreach=True, **hp)
        name = "torch_adamw"
    opt.step()  # allocates exp_avg / exp_avg_sq
    best = float("inf")
    for _ in range(args.reps):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"peer": name, "n": args.n, "threads": args.threads,
                      "torch": torch.__version__, "seconds": round(best, 6),
                      "elements_per_s": round(args.n / best)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
