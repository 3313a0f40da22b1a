#!/usr/bin/env python3
"""train_torch: a small PyTorch model trained through zerod (zerod.torch, DeepSpeed-style).

Model: a 16-128-128-4 GELU MLP regressing a fixed random "teacher" network; each rank draws
different inputs (seeded with RANK and the step, so a restarted trainer sees the same data).
Two param groups: weights with weight decay, biases and the LayerNorm without. A warm-up +
cosine LambdaLR on the returned optimizer sets the lr, which zerod applies with each step.

Run against a daemon you started (world 1):
    build/daemon/zerod --socket /tmp/zd.sock --device cpu &
    ZEROD_SOCKET=/tmp/zd.sock PYTHONPATH=client/python /usr/bin/python3 examples/train_torch.py
or with a launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and
ZEROD_SOCKET for every rank (zerorun --nproc 2 --spawn-daemons /usr/bin/python3
examples/train_torch.py). ZEROD_JOB names the job (default "train_torch"); a trainer that
dies and is started again with the same job continues from the daemon's last step.

Prints `step N loss X grad_norm Y loss_scale Z lr L` per optimizer step (rank 0), then
`final eval_loss X`.
"""
import argparse
import json
import math
import os
import sys

import torch

try:
    import zerod.torch as zt
except ImportError:  # run from the source tree without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                    "python"))
    import zerod.torch as zt

IN, HID, OUT = 16, 128, 4


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HID), torch.nn.GELU(),
        torch.nn.Linear(HID, HID), torch.nn.LayerNorm(HID), torch.nn.GELU(),
        torch.nn.Linear(HID, OUT))


def batch(teacher, step, micro, rank, n, dtype):
    g = torch.Generator().manual_seed(((step * 64 + micro) * 1024 + rank) * 2654435761 % 2**62)
    x = torch.randn(n, IN, generator=g)
    with torch.no_grad():
        y = teacher(x)
    return x.to(dtype), y


def build_config(a):
    if a.config:
        with open(a.config) as f:
            return json.load(f)
    return {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": a.accum,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": a.lr, "betas": [0.9, 0.999], "weight_decay": 0.01}},
        "zero_optimization": {"stage": a.stage, "reduce_bucket_size": 20000},
        "fp16": {"enabled": a.dtype == "fp16"},
        "bf16": {"enabled": a.dtype == "bf16"},
    }


def main():
    ap = argparse.ArgumentParser(description="Train a small MLP through zerod.")
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    ap.add_argument("--stage", type=int, choices=(1, 2), default=2, help="ZeRO stage")
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                    help="parameter dtype (fp16 needs a torch with fp16 CPU matmul)")
    ap.add_argument("--batch", type=int, default=64, help="samples per micro-batch")
    ap.add_argument("--accum", type=int, default=1, help="gradient accumulation steps")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    ap.add_argument("--config", help="a DeepSpeed JSON config (replaces the options above)")
    ap.add_argument("--seed", type=int, default=1, help="initial weights seed")
    a = ap.parse_args()
    os.environ.setdefault("ZEROD_JOB", "train_torch")

    teacher = make_model(12345)
    model = make_model(a.seed)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if not (n.endswith("weight")
                                                                and p.dim() > 1)]
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    engine, optimizer, _, _ = zt.initialize(model=model, model_parameters=groups,
                                            config=build_config(a))
    rank, world = engine.rank, engine.world_size
    gas = engine.gradient_accumulation_steps()
    warmup = max(1, a.steps // 10)

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, a.steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at, last_epoch=-1)
    for _ in range(engine.global_steps):  # a resumed job: catch the schedule up
        sched.step()
    if rank == 0:
        print("attached job %s rank %d/%d stage %d %s, %d params, step %d%s" % (
            engine.job, rank, world, engine.stage, str(engine.dtype).replace("torch.", ""),
            sum(p.numel() for p in model.parameters()), engine.global_steps,
            " (resumed)" if engine.resumed else ""), flush=True)

    engine.train()
    while engine.global_steps < a.steps:
        step = engine.global_steps
        total = 0.0
        for micro in range(gas):
            x, y = batch(teacher, step, micro, rank, a.batch, engine.dtype)
            loss = torch.nn.functional.mse_loss(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        if engine.was_step_applied():
            sched.step()
        if rank == 0:
            print("step %d loss %.6f grad_norm %.6f loss_scale %g lr %.3g%s" % (
                engine.global_steps, total / gas, engine.get_global_grad_norm(),
                engine.get_loss_scale(), optimizer.param_groups[0]["lr"],
                "" if engine.was_step_applied() else " skipped"), flush=True)

    engine.eval()
    with torch.no_grad():
        x, y = batch(teacher, 10 ** 6, 0, 0, 1024, engine.dtype)
        eval_loss = torch.nn.functional.mse_loss(engine(x).float(), y).item()
    engine.close()
    if rank == 0:
        print("final eval_loss %.6f" % eval_loss, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
