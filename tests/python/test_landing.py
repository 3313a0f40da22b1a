#!/usr/bin/env python3
"""nn.Linear weight gradients computed straight into their buckets' slots (zerod.torch's
LandingLinear, docs/design-notes.md "Trainer memory") give the same bits as the plain path
(torch's own backward, then a copy into the slot), and the odd uses of a weight still work, as
does a deep copy of the model (an ordinary model, whose gradients stay in .grad).

    test_landing.py

A model of 3-D inputs (batch 3 x 5 positions) with: a Linear with bias; a Linear without; one
Linear applied twice (its second use takes the plain path, the two gradients add up); a Linear
whose weight another module also uses through F.linear (tied: the other use's gradient reaches
AccumulateGrad and is added to the landed pieces); a frozen Linear. reduce_bucket_size 1000
elements, so every weight spans several buckets and is cut mid-row. With the daemon's
`--bucket-slots 2` only the pieces whose bucket can hold a slot land there (the rest through
buffers of their own size): both kinds must occur; with bucket_slots' default (0: one more
than the most buckets one parameter spans, 2 to 4) the daemon gives the job enough slots for
every piece to land. Stage 2, 6 optimizer steps, and the same with
gradient_accumulation_steps 2. Each run is a fresh trainer process (this script with --child),
ZEROD_DIRECT_GRADS=1 against =0 on the same daemons; the final parameters must be equal bit
for bit.
"""
import copy
import json
import os
import subprocess
import sys

import zd_fixture as zf

torch = zf.require_torch()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(24, 50)
        self.b = torch.nn.Linear(50, 40, bias=False)
        self.twice = torch.nn.Linear(40, 40)
        self.tied = torch.nn.Linear(40, 33)
        self.frozen = torch.nn.Linear(33, 33)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.tanh(self.b(h))
        h = self.twice(torch.relu(self.twice(h)))
        t = self.tied(h) + torch.nn.functional.linear(h.flip(-1), self.tied.weight)
        return self.frozen(t)


def child(gas, out_path):
    import zerod.torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net()
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
           "gradient_accumulation_steps": gas, "train_micro_batch_size_per_gpu": 3,
           "zero_optimization": {"stage": 2, "reduce_bucket_size": 1000}}
    engine, _, _, _ = zerod.torch.initialize(model=model, config=cfg)
    g = torch.Generator().manual_seed(1)
    for _ in range(6 * gas):
        x = torch.randn(3, 5, 24, generator=g)
        y = torch.randn(3, 5, 33, generator=g)
        engine.backward((engine(x) - y).square().mean())
        engine.step()
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out_path)
    # a deep copy of the model is an ordinary model: its Linear layers compute their own
    # gradients into .grad (the routing follows the engine's modules only)
    twin = copy.deepcopy(model)
    twin(torch.randn(3, 5, 24, generator=g)).sum().backward()
    assert twin.a.weight.grad is not None and twin.b.weight.grad is not None
    assert model.a.weight.grad is None
    res = {"pieces": list(engine.landed_pieces), "slots": engine._sess.info["n_slots"],
           "span": max(len(bs) for bs in engine._grads._buckets_of)}
    engine.close()
    print(json.dumps(res), flush=True)


def run(cluster, tmp, gas, direct):
    env = dict(os.environ)
    env.update(cluster.env(0, "landing-%d-%s" % (gas, direct)))
    env["ZEROD_DIRECT_GRADS"] = direct
    out = os.path.join(tmp, "params-%d-%s.pt" % (gas, direct))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(gas), out],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out), json.loads(r.stdout.strip().splitlines()[-1])


def main():
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]), sys.argv[3])
        return 0
    for flags, runs in ((("--bucket-slots", "2"), (1, 2)), ((), (1,))):
        with zf.Cluster(world=1, flags=("--job-linger", "60s") + flags) as cluster:
            for gas in runs:
                landed, res = run(cluster, cluster.tmp, gas, "1")
                plain, res0 = run(cluster, cluster.tmp, gas, "0")
                pieces = res["pieces"]
                print("%s gas %d: %d slots (a parameter spans up to %d buckets); pieces landed "
                      "in a slot %d, through a buffer %d; plain run %s"
                      % (" ".join(flags) or "default", gas, res["slots"], res["span"],
                         pieces[0], pieces[1], res0["pieces"]))
                assert res0["pieces"] == [0, 0], res0
                if flags:
                    assert res["slots"] == 2 and pieces[0] > 0 and pieces[1] > 0, res
                else:
                    assert res["slots"] == min(4, res["span"] + 1) and res["span"] >= 3, res
                    assert pieces[0] > 0 and pieces[1] == 0, res
                for n in plain:
                    assert torch.equal(landed[n], plain[n]), \
                        "%s differs: max %g" % (n, (landed[n] - plain[n]).abs().max().item())
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
