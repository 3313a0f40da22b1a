#!/usr/bin/env python3
"""A training script that initialises torch.distributed itself (deepspeed.init_distributed(),
here zerod.torch's, calls init_process_group; any script under torchrun may) runs beside zerod: torch's store takes
MASTER_PORT, rank 0's daemon listens on MASTER_PORT + 1 (zc_coordinator_from_env), and both
work. World 2, gloo: an all-reduce through torch, then zerod steps, then another all-reduce.

    test_launch.py
"""
import sys

import zd_fixture as zf

torch = zf.require_torch()
import zd_ref as zr  # noqa: E402


def rank_main():
    import torch.distributed as dist
    import zerod.torch
    zerod.torch.init_distributed(dist_backend="gloo")  # init_process_group, env://
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    model = zr.MLP(1)
    engine, _, _, _ = zerod.torch.initialize(model=model,
                                             model_parameters=zr.param_groups(model),
                                             config=zr.config(stage=2, bucket=700))
    for step in range(3):
        x, y = zr.batch(step, 0, engine.rank)
        engine.backward(zr.loss_fn(engine(x), y))
        engine.step()
    u = torch.tensor([float(engine.global_steps)])
    dist.all_reduce(u)
    engine.close()
    dist.destroy_process_group()
    return float(t.item()), float(u.item())


SCRIPT = """
import sys
sys.path.insert(0, %r)
import test_launch
a, b = test_launch.rank_main()
print("RESULT", a, b, flush=True)
"""


def under_zerorun():
    """The same script under `zerorun --nproc 2 --spawn-daemons`, which runs it as torchrun
    would."""
    import os
    import subprocess
    import tempfile
    zerorun = os.path.join(os.path.dirname(zf.zerod_bin()), "..", "client", "zerorun")
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "train.py")
        with open(script, "w") as f:
            f.write(SCRIPT % here)
        rc = subprocess.run([zerorun, "--nproc", "2", "--spawn-daemons", "--daemon",
                             zf.zerod_bin(), "--", sys.executable, script],
                            capture_output=True, text=True, timeout=240)
    assert rc.returncode == 0, rc.stdout[-3000:] + rc.stderr[-3000:]
    lines = [ln for ln in rc.stdout.splitlines() if "RESULT" in ln]
    assert len(lines) == 2 and all(ln.endswith("RESULT 3.0 6.0") for ln in lines), lines
    print("zerorun: %s" % lines)


def main():
    zf.require_world(2)
    under_zerorun()
    with zf.Cluster(2) as c:
        res = c.run(rank_main, job="launch")
    assert res == [(3.0, 6.0), (3.0, 6.0)], res
    print("init_process_group (torch's store on MASTER_PORT) and zerod (MASTER_PORT + 1) side by "
          "side: torch all-reduces %s, zerod steps 3 on each rank" % [r[0] for r in res])
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
