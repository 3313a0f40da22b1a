#!/usr/bin/env python3
"""A trainer killed (SIGKILL) mid-run and restarted re-attaches to its job and finishes with the
same parameters, bit for bit, as an uninterrupted run (docs/architecture.md, docs/design-notes.md).

    test_resume.py [--world N]

The trainers are subprocesses (this script with --child) running the two-group MLP through
zerod.torch, stage 2, gradient_accumulation_steps 2, 16 steps; every batch is a function of
(step, micro-step, rank), and a restarted trainer continues from the step the daemon holds
(engine.global_steps after a resumed attach). Each micro-step sleeps a little so the kill
lands inside a step, with buckets of the unfinished micro-step already submitted: the daemon
must drop that partial step. Run 1 ("straight") trains without interruption; run 2
("killed") is SIGKILLed on every rank after it printed step KILL_AFTER, then restarted.
With N ranks every rank's trainer is killed and restarted, as a launcher restarting the job
would: the restarted trainers say so (TORCHELASTIC_RESTART_COUNT=1, as torchrun sets it), since
initialize(resume="auto") continues a kept job only on a restart (a plain re-run replaces it:
test_lifecycle.py). Both runs happen on the same daemons, one job after the other.
"""
import os
import signal
import subprocess
import sys
import time

import zd_fixture as zf

torch = zf.require_torch()
import zd_ref as zr  # noqa: E402

STEPS = 16
KILL_AFTER = 6
GAS = 2


def child(out):
    import zerod.torch
    model = zr.MLP(1)
    cfg = zr.config(gas=GAS)
    engine, _, _, _ = zerod.torch.initialize(model=model, model_parameters=zr.param_groups(model),
                                             config=cfg)
    print("ATTACHED resumed=%d step=%d" % (engine.resumed, engine.global_steps), flush=True)
    while engine.global_steps < STEPS:
        s = engine.global_steps
        for k in range(GAS):
            x, t = zr.batch(s, k, engine.rank)
            engine.backward(zr.loss_fn(engine(x), t))
            time.sleep(0.02)
            engine.step()
        print("STEP %d" % engine.global_steps, flush=True)
    torch.save(zr.params_of(model), out)
    engine.close()
    print("DONE", flush=True)


def start(cluster, job, rank, out, restart=False):
    env = dict(os.environ)
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    env.update(cluster.env(rank, job))
    if restart:  # the launcher's word that this is a restart of the job
        env["TORCHELASTIC_RESTART_COUNT"] = "1"
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", out],
                            env=env, stdout=subprocess.PIPE, text=True)


def finish(procs, timeout=120):
    lines = []
    for p in procs:
        try:
            stdout, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, _ = p.communicate()
        lines.append(stdout)
        assert p.returncode == 0, "trainer exited with %d:\n%s" % (p.returncode, stdout)
    return lines


def main():
    if "--child" in sys.argv:
        child(sys.argv[sys.argv.index("--child") + 1])
        return 0
    world = zf.parse_world()
    zf.require_world(world)
    # a killed trainer aborts the step in flight on every daemon of the mesh (logged as ERROR)
    allowed = r"job 'killed' aborted: rank \d+: its trainer disconnected" if world > 1 else None
    with zf.Cluster(world, flags=("--job-linger", "60s"), allowed_errors=allowed) as c:
        outs = {run: [os.path.join(c.tmp, "%s%d.pt" % (run, r)) for r in range(world)]
                for run in ("straight", "killed")}
        finish([start(c, "straight", r, outs["straight"][r]) for r in range(world)])

        procs = [start(c, "killed", r, outs["killed"][r]) for r in range(world)]
        # wait until rank 0 printed KILL_AFTER, then kill every rank inside the next step
        for line in procs[0].stdout:
            if line.strip() == "STEP %d" % KILL_AFTER:
                break
        else:
            raise AssertionError("the trainer ended before step %d" % KILL_AFTER)
        time.sleep(0.03)
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()
            p.stdout.close()
            assert p.returncode == -signal.SIGKILL, p.returncode

        procs = [start(c, "killed", r, outs["killed"][r], restart=True) for r in range(world)]
        logs = finish(procs)
        for r, log in enumerate(logs):
            first = log.splitlines()[0]
            assert first.startswith("ATTACHED resumed=1"), "rank %d: %s" % (r, first)
            step = int(first.split("step=")[1])
            assert KILL_AFTER <= step < STEPS, first
            print("rank %d restarted: %s" % (r, first))
        for r in range(world):
            a, b = torch.load(outs["straight"][r]), torch.load(outs["killed"][r])
            for i, (x, y) in enumerate(zip(a, b)):
                assert torch.equal(x, y), ("rank %d tensor %d: killed+restarted run differs from "
                                           "the straight run (max %g)"
                                           % (r, i, (x - y).abs().max().item()))
    print("resume world %d: killed after step %d, restarted, final parameters bit-identical "
          "to the uninterrupted run" % (world, KILL_AFTER))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
