#!/usr/bin/env python3
"""What buddy replicas cost (daemon key replication; docs/design-notes.md "Buddy replicas"):
step time, daemon memory and bytes sent per step, with replication off and buddy on the same
model, data and daemons' settings.

    /usr/bin/python3 bench/replica_bench.py [--world 2] [--width 1024] [--layers 4]
                                            [--steps 30] [--warmup 5] [--runs 3]

Each run starts `world` daemons (the test fixture's, tests/python/zd_fixture.py: ZEROD_TEST_DAEMON
and ZEROD_LIBZC pick the binaries) and `world` trainers (zerod.torch, stage 2, fp32, AdamW) on an
MLP of `layers` Linear(width, width) layers; the runs alternate off and buddy, so both sample the
same stretches of a noisy machine. Per run: rank 0's median wall time of a step (forward,
backward and engine.step) over the timed steps; each daemon's private anonymous memory (its
shard and the replica; smaps_rollup) with the job still held after its trainer detached keeping
it; and /metrics' zerod_replication_bytes_total and the mean of the daemon's norm phase (which
holds the exchange with the buddy) and adam phase (which holds the replica's Adam). Printed: per
mode the median over the runs, the memory difference against the formula 16 x Psi / world bytes
per rank (the replica's master, m and v and the owner's gradient), and the bytes per step
against 4 x Psi / world.
"""
import argparse
import os
import re
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import zd_fixture as zf  # noqa: E402


def trainer(width, layers, steps, warmup):
    import torch
    import zerod.torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    cfg = {"train_micro_batch_size_per_gpu": 16,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 2, "reduce_bucket_size": 1 << 20}}
    engine, _, _, _ = zerod.torch.initialize(model=model, model_parameters=model.parameters(),
                                             config=cfg)
    g = torch.Generator().manual_seed(engine.rank)
    times = []
    for s in range(warmup + steps):
        x = torch.randn(16, width, generator=g)
        t0 = time.perf_counter()
        engine.backward(engine(x).square().mean())
        engine.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    engine.close(end_job=False)  # the daemons keep the job: its memory is measured after
    return statistics.median(times)


def anon_bytes(pid):
    """The daemon's private anonymous memory: its shard arrays and the replica, without the
    shared regions (memfds, its own and the peers' it maps), which RSS would count."""
    with open("/proc/%d/smaps_rollup" % pid) as f:
        m = re.search(r"^Anonymous:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1)) * 1024


def metrics(daemon):
    path = os.path.join(daemon.rundir, "zerod.metrics.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: zerod\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    text = data.decode(errors="replace")
    sent = re.search(r'^zerod_replication_bytes_total\{[^}]*direction="sent"[^}]*\} (\d+)',
                     text, re.M)
    phase = {}
    for p in ("norm", "adam"):
        tot = re.search(r'^zerod_step_phase_duration_seconds_sum\{[^}]*phase="%s"[^}]*\} (\S+)'
                        % p, text, re.M)
        cnt = re.search(r'^zerod_step_phase_duration_seconds_count\{[^}]*phase="%s"[^}]*\} (\S+)'
                        % p, text, re.M)
        phase[p] = float(tot.group(1)) / float(cnt.group(1)) if tot and cnt else float("nan")
    return (int(sent.group(1)) if sent else 0), phase


def one_run(mode, a):
    flags = ["--job-linger", "60s", "--replication", mode]
    with zf.Cluster(a.world, flags=flags, job="bench-%s" % mode) as c:
        step = c.run(trainer, (a.width, a.layers, a.steps, a.warmup), timeout=600)[0]
        rss = [anon_bytes(d.proc.pid) for d in c.daemons]
        sent, phase = metrics(c.daemons[0])
    return step, statistics.median(rss), sent, phase["norm"], phase["adam"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    zf.require_torch()
    psi = a.layers * (a.width * a.width + a.width)
    res = {"off": [], "buddy": []}
    for _ in range(a.runs):
        for mode in ("off", "buddy"):
            res[mode].append(one_run(mode, a))
            r = res[mode][-1]
            print("%-5s step %.4f s  daemon anonymous %.1f MiB  replication bytes sent %d  "
                  "daemon norm phase %.2f ms, adam phase %.2f ms"
                  % (mode, r[0], r[1] / 2**20, r[2], r[3] * 1e3, r[4] * 1e3), flush=True)
    med = {m: [statistics.median(r[i] for r in res[m]) for i in range(5)] for m in res}
    print("world %d, Psi %d (%.1f MiB fp32), %d timed steps, %d runs (medians):"
          % (a.world, psi, psi * 4 / 2**20, a.steps, a.runs))
    print("  step time: off %.4f s, buddy %.4f s (x%.3f)"
          % (med["off"][0], med["buddy"][0], med["buddy"][0] / med["off"][0]))
    print("  daemon phases (rank 0, mean per step): norm (with the exchange) off %.2f ms, buddy "
          "%.2f ms; adam (with the replica's) off %.2f ms, buddy %.2f ms"
          % (med["off"][3] * 1e3, med["buddy"][3] * 1e3, med["off"][4] * 1e3,
             med["buddy"][4] * 1e3))
    extra = med["buddy"][1] - med["off"][1]
    print("  daemon anonymous memory: off %.1f MiB, buddy %.1f MiB: +%.1f MiB; formula 16 Psi/N "
          "= %.1f MiB"
          % (med["off"][1] / 2**20, med["buddy"][1] / 2**20, extra / 2**20,
             16 * psi / a.world / 2**20))
    n_steps = a.steps + a.warmup
    per_step = (med["buddy"][2] - 12 * psi / a.world) / n_steps  # less the one whole shard
    print("  sent per step (rank 0): %.0f bytes; formula 4 Psi/N = %.0f"
          % (per_step, 4 * psi / a.world))
    return 0


if __name__ == "__main__":
    sys.exit(main())
