#!/usr/bin/env python3
"""zerod.torch copies gradients into slots the way the daemon measured copies stream best on
this machine: the daemon sends its kernels' plan for same-type copies with each step reply,
and the trainer's large copies then take its stores (docs/design-notes.md).

    test_fill.py

The daemon's plan is fixed by ZEROD_KERNEL_STORES (nt, then regular) so that the answer is
known; Linear(1024, 1024) (1.05 M fp32 parameters) is large enough that the daemon sets its
plan up at attach. Each trainer is a fresh process (this script with --child N): it steps until
a reply brought the plan (N steps or 30 s at most) and prints what a copy of 1 Mi and of 1 Ki elements
would use. A trainer whose kernel variant is not the daemon's (ZEROD_KERNELS=scalar on a CPU
with AVX2) keeps regular stores: the plan is not its own.
"""
import json
import os
import subprocess
import sys
import time

import zd_fixture as zf

torch = zf.require_torch()


def child():
    import zerod.torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024))
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 2, "reduce_bucket_size": 1 << 19}}
    engine, _, _, _ = zerod.torch.initialize(model=model, config=cfg)
    x = torch.randn(8, 1024)
    deadline = time.monotonic() + 30
    max_steps = int(sys.argv[2])
    steps = 0
    while True:
        engine.backward(engine(x).square().mean())
        engine.step()
        steps += 1
        if (engine._sess.fill_stores(1 << 20)[2] or steps >= max_steps
                or time.monotonic() > deadline):
            break
    out = {"steps": steps, "big": engine._sess.fill_stores(1 << 20),
           "small": engine._sess.fill_stores(1 << 10),
           "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters())}
    engine.close()
    print(json.dumps(out), flush=True)


def run(stores, trainer_env=None, max_steps=1000):
    with zf.Cluster(world=1, env={"ZEROD_KERNEL_STORES": stores}) as cluster:
        env = dict(os.environ)
        env.update(cluster.env(0, "fill-%s" % stores))
        env.update(trainer_env or {})
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                              str(max_steps)], env=env,
                             capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print("daemon stores %s, trainer %s: %s" % (stores, trainer_env or "as the daemon", res))
    assert res["finite"], res
    return [tuple(res["big"]), tuple(res["small"])]


def cpu_has_avx2():
    try:
        with open("/proc/cpuinfo") as f:
            return " avx2" in f.read()
    except OSError:
        return False


def main():
    if sys.argv[1:2] == ["--child"]:
        child()
        return 0
    # 1 Mi fp32 elements: an 8 MiB footprint, streamed; 1 Ki: in cache, regular stores
    assert run("nt") == [(True, 0, True), (False, 0, True)]
    assert run("regular") == [(False, 0, True), (False, 0, True)]
    if cpu_has_avx2():
        # the daemon's fixed plan comes with the first reply (above): 5 steps say enough
        assert run("nt", {"ZEROD_KERNELS": "scalar"}, 5) == [(False, 0, False), (False, 0, False)]
    else:
        print("no AVX2 here: the daemon's variant is the trainer's, the mismatch is not tried")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
