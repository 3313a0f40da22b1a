"""Models, data and references shared by the Python tests.

Data is a pure function of (step, micro-step, rank), so a zerod run, a restarted zerod run and
the single-process reference see the same batches. The reference of an N-rank, G-micro-step
zerod run is one torch optimizer on the gradient averaged over ranks and micro-steps
(docs/semantics.md §4: the daemon sums raw micro-step gradients and divides by N × G).
"""
import json
import math

import torch

IN, HID, OUT = 16, 32, 4
BATCH = 8

# Two param groups: weights and biases, different lr and weight decay.
GROUPS = [
    {"lr": 2e-2, "weight_decay": 0.05},
    {"lr": 5e-3, "weight_decay": 0.01},
]
BETAS = (0.9, 0.98)
EPS = 1e-8


class MLP(torch.nn.Module):
    """16-32-32-4 tanh MLP. compute_dtype: run the math in that dtype (fp16 params on CPU,
    whose torch 1.13 has no fp16 matmul, compute in fp32; gradients still come back fp16)."""

    def __init__(self, seed=1, compute_dtype=None):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.l1 = torch.nn.Linear(IN, HID)
        self.l2 = torch.nn.Linear(HID, HID)
        self.l3 = torch.nn.Linear(HID, OUT)
        with torch.no_grad():
            for p in self.parameters():
                bound = 1.0 / math.sqrt(p.shape[-1] if p.dim() > 1 else HID)
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
        self.compute_dtype = compute_dtype

    def forward(self, x):
        cd = self.compute_dtype
        h = x
        for i, layer in enumerate((self.l1, self.l2, self.l3)):
            w, b = layer.weight, layer.bias
            if cd is not None:
                w, b = w.to(cd), b.to(cd)
            h = torch.nn.functional.linear(h.to(w.dtype), w, b)
            if i < 2:
                h = torch.tanh(h)
        return h


def param_groups(model, groups=GROUPS):
    """[weights group, biases group] with the per-group options."""
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [dict(groups[0], params=weights), dict(groups[1], params=biases)]


def batch(step, micro, rank, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000003 * step + 7919 * micro + 104729 * rank + 17)
    x = torch.randn(BATCH, IN, generator=g)
    t = torch.sin(x[:, :OUT] * 1.5) + 0.1 * x[:, OUT:2 * OUT]
    return x.to(dtype), t


def loss_fn(y, t):
    return ((y.float() - t) ** 2).mean()


def config(stage=2, gas=1, dtype="fp32", optimizer="AdamW", adam_w_mode=None, lr=1e-3,
           bucket=1200, clipping=0.0, extra=None):
    """A DeepSpeed config. bucket=1200 elements splits the MLP into several buckets per group
    (l2.weight, 1024 elements, is a bucket of its own)."""
    params = {"lr": lr, "betas": list(BETAS), "eps": EPS, "weight_decay": 0.0}
    if adam_w_mode is not None:
        params["adam_w_mode"] = adam_w_mode
    cfg = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": clipping,
        "optimizer": {"type": optimizer, "params": params},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": bucket},
        "fp16": {"enabled": dtype == "fp16"},
        "bf16": {"enabled": dtype == "bf16"},
    }
    for k, v in (extra or {}).items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k].update(v)
        else:
            cfg[k] = v
    return json.loads(json.dumps(cfg))


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def zerod_train(cfg, steps, seed=1, lr_lambda=None, compute_dtype=None, record=None,
                device=None):
    """Train MLP(seed) through zerod.torch until the daemon has done `steps` optimizer steps
    (a resumed job continues where it was). Runs on the rank given by the environment; device:
    where the model and its batches are (None: the CPU). Returns {"params": [...] (on the CPU),
    "steps": [per-boundary dict]}."""
    import zerod.torch
    model = MLP(seed, compute_dtype)
    if device is not None:
        model.to(device)
    engine, opt, _, _ = zerod.torch.initialize(model=model, model_parameters=param_groups(model),
                                               config=cfg)
    sched = None
    if lr_lambda is not None:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
        for _ in range(engine.global_steps):
            sched.step()
    gas = engine.gradient_accumulation_steps()
    rank = engine.rank
    log = []
    while engine.global_steps < steps:
        s = engine.global_steps
        for k in range(gas):
            x, t = batch(s, k, rank)
            if device is not None:
                x, t = x.to(device), t.to(device)
            loss = loss_fn(engine(x), t)
            engine.backward(loss)
            engine.step()
        if sched is not None:
            sched.step()
        log.append({"step": engine.global_steps, "loss_scale": engine.get_loss_scale(),
                    "grad_norm": engine.get_global_grad_norm()})
        if record is not None:
            record(engine)
    out = {"params": [p.cpu() for p in params_of(model)], "steps": log,
           "resumed": engine.resumed}
    engine.close()
    return out


def reference_train(steps, world=1, gas=1, seed=1, l2=False, lr_lambda=None, clip=0.0,
                    device=None):
    """Single-process torch AdamW (Adam with weight_decay when l2) over the same groups, on the
    gradient averaged over `world` ranks and `gas` micro-steps; clip > 0: clip_grad_norm_ to
    it first (the rule of docs/semantics.md §4 step 5: g × max_norm / (norm + 1e-6) when that is < 1)."""
    model = MLP(seed)
    if device is not None:
        model.to(device)
    groups = param_groups(model)
    for g in groups:
        g["betas"], g["eps"] = BETAS, EPS
    opt = (torch.optim.Adam if l2 else torch.optim.AdamW)(groups)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda) if lr_lambda else None
    for s in range(steps):
        opt.zero_grad()
        for r in range(world):
            for k in range(gas):
                x, t = batch(s, k, r)
                if device is not None:
                    x, t = x.to(device), t.to(device)
                (loss_fn(model(x), t) / (world * gas)).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
    return [p.cpu() for p in params_of(model)]


def max_rel_diff(a_list, b_list):
    """max over tensors of max|a - b| / max|b| (a norm-wise relative error per tensor)."""
    worst = 0.0
    for a, b in zip(a_list, b_list):
        a, b = a.double(), b.double()
        d = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
        worst = max(worst, d)
    return worst
