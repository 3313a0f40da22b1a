#!/usr/bin/env python3
"""What buddy replicas cost and what they save (daemon key replication; docs/design-notes.md
"Buddy replicas"): step time, daemon memory and bytes sent per step with replication off and
buddy, and the time from a daemon's death to the next applied step against a restart from the
last disk checkpoint, on the same model, data and daemons' settings.

    PY=$(bench/ds_venv.sh) && $PY bench/replica_bench.py [--world 2] [--width 2048]
        [--layers 8] [--batch 16] [--steps 8] [--warmup 2] [--runs 2] [--ckpt-every 8]
        [--recovery-runs 2]

The defaults (Psi = 33.6 M, fp32) take about 5 minutes on 2 cores. Run it with a torch whose
BLAS is fast (the DeepSpeed venv's torch 2.x, as above): Debian's torch 1.13 is built with the
generic BLAS, whose forward and backward of this model take ~1 s where the venv's take ~0.05
s, which would hide the replica's cost in a slow step.

Three modes: off (no replication), buddy (replication = buddy, the trainers keep no gradient:
ZEROD_REATTACH=0) and inplace (buddy, the trainers keeping each bucket of the window to re-attach
in place after a lost daemon: zerod/_reattach.py). Each run starts `world` daemons (the test fixture's, tests/python/zd_fixture.py: ZEROD_TEST_DAEMON
and ZEROD_LIBZC pick the binaries) and `world` trainers (zerod.torch, stage 2, fp32, AdamW) on an
MLP of `layers` Linear(width, width) layers; the runs alternate off and buddy, so both sample the
same stretches of a noisy machine. Per run: rank 0's median wall time of a step (forward,
backward and engine.step) over the timed steps; each daemon's private anonymous memory (its
shard and the replica; smaps_rollup) with the job still held after its trainer detached keeping
it; and /metrics' zerod_replication_bytes_total and the mean of the daemon's norm phase (which
holds the exchange with the buddy) and adam phase (which holds the replica's Adam) over the
timed steps. Printed: per mode the median over the runs, the memory against 12 x Psi / world
bytes per rank without replication (m, v and the gradient's shard: an fp32 master is the
params region) and its difference against 16 x Psi / world more with it (the replica's
master, m and v and the owner's gradient), and the bytes per step against 4 x Psi / world.

Recovery (--recovery-runs runs of each mode of --recovery-modes, alternated): the trainers are
subprocesses that print each applied step with its wall time. After step 1.5 x --ckpt-every and
both daemons' store plans (a daemon that dies has been running a while: its restart takes the
plan it kept, not measuring again), in the middle of the next step, daemon 1 is killed
(SIGKILL); it is started again, fresh. In mode
inplace the trainers go on: each re-attaches in place and submits its kept buckets again (the
next applied step is rank 0's first after its re-attach). In modes buddy and off every trainer
is killed and started again as a launcher's restart does (TORCHELASTIC_RESTART_COUNT=1). With
buddy the job
goes on at its step, its lost shard sent from the buddy's replica; with replication off and
checkpoint_dir + checkpoint_every_steps --ckpt-every, the job is ended on the survivors (zeroctl
job end: their step can no longer be reached) and every daemon resumes it from its last
checkpoint, its files first dropped from the page cache (fsync, then POSIX_FADV_DONTNEED), as a
replacement node reads them from shared storage. Printed per mode, medians: from the kill to
the daemon's READY, to the trainers' initialize() returning, to the first applied step after it
(the recovery), how long initialize() itself took (the mesh, and the shard from the buddy or
the checkpoint read: zerod's part), the state's restore as the daemons log it (the shard from
the buddy, the checkpoint's read), the steps lost (re-done), and the time until the job is past
the step it had reached; then the ratios against the targets: step time buddy / off <= 1.10,
recovery off / buddy >= 5 (end to end for inplace and for buddy, and the restore alone), 0 steps
lost. Each target line ends PASS, or BELOW / ABOVE /
LOST STEPS; nothing here asserts a wall time.
"""
import argparse
import os
import re
import socket
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
import zd_fixture as zf  # noqa: E402
import torch_vs_zerod as tvz  # noqa: E402  (wait_store_plan)


CFG = {"train_micro_batch_size_per_gpu": 16,
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
       "zero_optimization": {"stage": 2, "reduce_bucket_size": 1 << 20}}


def build(width, layers):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def config(batch):
    return dict(CFG, train_micro_batch_size_per_gpu=batch)


def trainer(width, layers, steps, warmup, batch):
    import torch
    import zerod.torch
    model = build(width, layers)
    engine, _, _, _ = zerod.torch.initialize(model=model, model_parameters=model.parameters(),
                                             config=config(batch))
    g = torch.Generator().manual_seed(engine.rank)
    rundir = os.path.dirname(os.environ["ZEROD_SOCKET"])
    times = []
    before = None
    for s in range(warmup + steps):
        if s == max(0, warmup - 1):  # its daemon's store plan, measured once, takes a core
            store_plan(os.path.join(rundir, "zerod.log"))
        if s == warmup:
            before = metrics(rundir)
        x = torch.randn(batch, width, generator=g)
        t0 = time.perf_counter()
        engine.backward(engine(x).square().mean())
        engine.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    after = metrics(rundir)
    engine.close(end_job=False)  # the daemons keep the job: its memory is measured after
    return statistics.median(times), phase_means(before, after)


def store_plan(log):
    if not tvz.wait_store_plan(log, 120):
        raise RuntimeError("%s: no store plan within 120 s" % log)


def anon_bytes(pid):
    """The daemon's private anonymous memory: its shard arrays and the replica, without the
    shared regions (memfds, its own and the peers' it maps), which RSS would count."""
    with open("/proc/%d/smaps_rollup" % pid) as f:
        m = re.search(r"^Anonymous:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1)) * 1024


def metrics(rundir):
    """From the /metrics of the daemon in `rundir`: bytes of replication sent, and per phase
    (norm, adam) the sum and count of its step durations."""
    path = os.path.join(rundir, "zerod.metrics.sock")
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
        phase[p] = (float(tot.group(1)), float(cnt.group(1))) if tot and cnt else (0.0, 0.0)
    return (int(sent.group(1)) if sent else 0), phase


def phase_means(before, after):
    """Each phase's mean over the steps between two metrics() readings (the timed steps: the
    warm-up's first exchange sends the whole shard, into replica pages touched for the first
    time, and a mean over the daemon's life counted it)."""
    out = {}
    for p in after[1]:
        ds = after[1][p][0] - before[1][p][0]
        dn = after[1][p][1] - before[1][p][1]
        out[p] = ds / dn if dn > 0 else float("nan")
    return out


def one_run(mode, a):
    """mode: off; buddy (the trainers keep no gradient: ZEROD_REATTACH=0); inplace (buddy, and
    the trainers keep the window's buckets to re-attach in place)."""
    flags = ["--job-linger", "60s", "--replication", "off" if mode == "off" else "buddy"]
    if mode == "inplace-copy":  # the slots of a job without replication: buckets copied out
        flags += ["--bucket-slots", "2"]
    os.environ["ZEROD_REATTACH"] = "1" if mode.startswith("inplace") else "0"  # inherited
    with zf.Cluster(a.world, flags=flags, job="bench-%s" % mode) as c:
        step, phase = c.run(trainer, (a.width, a.layers, a.steps, a.warmup, a.batch),
                            timeout=600)[0]
        for d in c.daemons:  # its kernels' store plan, measured once, holds scratch meanwhile
            store_plan(d.log_path)
        rss = [anon_bytes(d.proc.pid) for d in c.daemons]
        sent = metrics(c.daemons[0].rundir)[0]
    return step, statistics.median(rss), sent, phase["norm"], phase["adam"]


def recovery_child(width, layers, stop, batch):
    """A trainer of the recovery runs: each applied step printed with its wall time."""
    import torch
    import zerod.torch
    model = build(width, layers)
    t0 = time.time()
    engine, _, _, _ = zerod.torch.initialize(model=model, model_parameters=model.parameters(),
                                             config=config(batch))
    print("ATTACHED %d %d %.6f %.6f" % (engine.resumed, engine.global_steps, t0, time.time()),
          flush=True)
    while engine.global_steps < stop:
        g = torch.Generator().manual_seed(engine.global_steps * 1000 + engine.rank)
        engine.backward(engine(torch.randn(batch, width, generator=g)).square().mean())
        engine.step()
        if engine.reattaches:  # the step that went on after a re-attach in place
            print("REATTACHED %d" % engine.reattaches, flush=True)
        print("STEP %d %.6f" % (engine.global_steps, time.time()), flush=True)
    engine.close()


class Trainers:
    """The world's trainers (this script with --recovery-child), their lines as they come."""

    def __init__(self, c, a, stop, restart, inplace=False):
        self.procs, self.lines, self.readers = [], [], []
        for r in range(a.world):
            env = dict(os.environ)
            env.pop("TORCHELASTIC_RESTART_COUNT", None)
            env.update(c.env(r, "recover"))
            env["ZEROD_REATTACH"] = "1" if inplace else "0"
            if restart:  # the launcher's word that this is a restart of the job
                env["TORCHELASTIC_RESTART_COUNT"] = "1"
            with open(os.path.join(c.tmp, "trainer%d.err" % r), "ab") as err:
                p = subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                      "--recovery-child", str(a.width), str(a.layers), str(stop),
                                      str(a.batch)],
                                     env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            self.procs.append(p)
            self.lines.append([])
            self.readers.append(threading.Thread(target=self._read, args=(p, self.lines[-1]),
                                                 daemon=True))
            self.readers[-1].start()

    @staticmethod
    def _read(p, out):
        for line in p.stdout:
            out.append(line.split())

    def steps(self, r):
        """Rank r's applied steps so far: [(step, wall time)]."""
        return [(int(w[1]), float(w[2])) for w in list(self.lines[r]) if w[0] == "STEP"]

    def wait_step(self, r, step, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(s >= step for s, _ in self.steps(r)):
                return
            if self.procs[r].poll() is not None:
                break
            time.sleep(0.005)
        self.kill()
        raise RuntimeError("rank %d did not reach step %d within %d s" % (r, step, timeout))

    def kill(self):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(timeout=30)

    def finish(self, c, timeout):
        deadline = time.monotonic() + timeout
        for r, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise RuntimeError("the trainers did not finish within %d s" % timeout)
            if p.returncode != 0:
                with open(os.path.join(c.tmp, "trainer%d.err" % r), errors="replace") as f:
                    raise RuntimeError("trainer %d exited with %d:\n%s"
                                       % (r, p.returncode, f.read()[-3000:]))
        for th in self.readers:
            th.join(10)


def drop_cached(top):
    """The checkpoint files out of the page cache: a replacement node reads them from storage."""
    for root, _, files in os.walk(top):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def wait_latest(ckpt, job, step, timeout):
    """Until checkpoint_dir/job/latest names global_step<step> or later: a save is written in
    the background, and a daemon killed before it commits leaves nothing to go back to (the
    job would start over, which is not the restart this compares with)."""
    path = os.path.join(ckpt, job, "latest")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                m = re.match(r"global_step(\d+)$", f.read().strip())
            if m and int(m.group(1)) >= step:
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError("%s: no checkpoint of step %d within %d s" % (path, step, timeout))


def recovery_run(mode, a):
    """Daemon 1 killed in the middle of the step after step `kill_at`, restarted; the trainers
    restarted (mode inplace: they re-attach in place). Returns (kill -> READY, kill -> initialize() returned, initialize()'s own time
    (the slowest rank's), kill -> next applied step, steps lost, kill -> past the step reached,
    the state's restore in the daemons' logs) in seconds, and (resumed, the step it went on
    from)."""
    kill_at = a.ckpt_every + a.ckpt_every // 2
    flags = ["--job-linger", "60s", "--replication", "off" if mode == "off" else "buddy",
             "--heartbeat-timeout", "2s"]
    ckpt = tempfile.mkdtemp(prefix="zd-replica-bench-")
    if mode == "off":
        flags += ["--checkpoint-dir", ckpt, "--checkpoint-every-steps", str(a.ckpt_every)]
    allowed = r"job 'recover' aborted|rank \d+ lost"
    try:
        return recovery_timed(a, flags, allowed, ckpt if mode == "off" else None, kill_at,
                              mode == "inplace")
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


def recovery_timed(a, flags, allowed, ckpt, kill_at, inplace):
    with zf.Cluster(a.world, flags=flags, allowed_errors=allowed) as c:
        t = Trainers(c, a, kill_at + 100, False, inplace)  # still training when it dies
        t.wait_step(0, kill_at, 600)
        for d in c.daemons:  # a daemon that dies has been running a while: its plan is kept
            store_plan(d.log_path)
        if ckpt is not None:  # the checkpoint to go back to is on disk before the kill
            wait_latest(ckpt, "recover", a.ckpt_every, 120)
        (_, t1), (_, t2) = t.steps(0)[-2:]
        time.sleep((t2 - t1) / 2)  # the middle of the next step
        t_kill = time.time()
        reached = t.steps(0)[-1][0]
        victim = c.daemons[1]
        victim.proc.kill()
        victim.proc.wait(timeout=30)
        victim.proc = None
        if inplace:
            victim.log_path = os.path.join(victim.rundir, "zerod-restarted.log")
            victim.start()
            t_ready = time.time()
            t.wait_step(0, reached + 2, 600)
            t.kill()
            return inplace_result(c, a, t, t_kill, t_ready, reached)
        t.kill()  # the launcher's restart stops every worker
        if ckpt is not None:
            # without a replica the survivors' step cannot be reached: the job goes back to
            # its checkpoint on every rank
            zeroctl = os.path.join(os.path.dirname(zf.zerod_bin()), "..", "client", "zeroctl")
            socks = [x for d in c.daemons if d is not victim for x in ("-s", d.socket)]
            out = subprocess.run([zeroctl, "job", "end", "recover"] + socks, timeout=60,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if out.returncode != 0:
                raise RuntimeError("zeroctl job end: %s" % out.stdout)
            drop_cached(ckpt)
        victim.log_path = os.path.join(victim.rundir, "zerod-restarted.log")
        victim.start()
        t_ready = time.time()
        t = Trainers(c, a, reached + 2, True)
        t.finish(c, 600)
        # the state's restore as the daemons log it: the shard from the buddy, or the read
        pat = r"recovered \d+ fresh rank.* in (\S+) s" if ckpt is None else r"\) read in (\S+) s"
        found = [float(x) for d in c.daemons for x in re.findall(pat, d.log())]
        restore_s = max(found) if found else float("nan")
    attached = [w for w in t.lines[0] if w[0] == "ATTACHED"]
    steps = t.steps(0)
    if not attached or not steps:
        raise RuntimeError("rank 0 printed no step after the restart: %s" % t.lines[0])
    resumed, step0 = int(attached[0][1]), int(attached[0][2])
    if ckpt is not None and not resumed:
        raise RuntimeError("replication off: the restarted job did not resume from its step-%d "
                           "checkpoint (ATTACHED %s)" % (a.ckpt_every, attached[0]))
    inits = [w for lines in t.lines for w in lines if w[0] == "ATTACHED"]
    inited = max(float(w[4]) for w in inits)
    init_s = max(float(w[4]) - float(w[3]) for w in inits)
    back = next(ts for s, ts in steps if s > reached)
    return (t_ready - t_kill, inited - t_kill, init_s, steps[0][1] - t_kill,
            max(0, reached - step0), back - t_kill, restore_s), (resumed, step0)


def inplace_result(c, a, t, t_kill, t_ready, reached):
    """recovery_timed's result for trainers that re-attached in place: their re-attach (the
    wait for the daemon, the mesh, the shard from the buddy, the parameters moved to the new
    region: each trainer's own line) stands for initialize()."""
    took = []
    for r in range(a.world):
        with open(os.path.join(c.tmp, "trainer%d.err" % r), errors="replace") as f:
            found = re.findall(r"re-attached in place after .* \((\S+) s\)$", f.read(), re.M)
        if len(found) != 1:
            raise RuntimeError("trainer %d re-attached %d times in place" % (r, len(found)))
        took.append(float(found[0]))
    found = [float(x) for d in c.daemons
             for x in re.findall(r"recovered \d+ fresh rank.* in (\S+) s", d.log())]
    restore_s = max(found) if found else float("nan")
    lines = list(t.lines[0])
    first = next((i for i, w in enumerate(lines) if w[0] == "REATTACHED"), None)
    after = [(int(w[1]), float(w[2])) for w in lines[first or 0:] if w[0] == "STEP"]
    if first is None or not after:
        raise RuntimeError("rank 0 printed no step after a re-attach: %s" % lines)
    step0 = after[0][0] - 1  # the step the job went on from
    back = next(ts for s, ts in after if s > reached)
    # (no initialize(): the trainers' re-attach ends at a time of their own, not printed)
    return (t_ready - t_kill, float("nan"), max(took), after[0][1] - t_kill,
            max(0, reached - step0), back - t_kill, restore_s), (1, step0)


def recovery(a):
    res = {m: [] for m in a.recovery_modes}
    for _ in range(a.recovery_runs):
        for mode in a.recovery_modes:
            r, (resumed, step0) = recovery_run(mode, a)
            res[mode].append(r)
            print("%-5s recovery: from the kill, READY %.2f s, initialize() returned %.2f s (it "
                  "took %.2f s), next applied step %.2f s, %d steps lost, past the step reached "
                  "%.2f s; state restored in %.3f s (resumed=%d at step %d)"
                  % ((mode,) + r + (resumed, step0)), flush=True)
    return {m: [statistics.median(r[i] for r in res[m]) for i in range(7)] for m in res}


def verdict(ok, miss):
    return "PASS" if ok else miss


def steady(a, psi):
    """Step time, memory and bytes sent, off against buddy; returns the step time ratio."""
    res = {m: [] for m in a.steady_modes}
    for _ in range(a.runs):
        for mode in a.steady_modes:
            res[mode].append(one_run(mode, a))
            r = res[mode][-1]
            print("%-7s step %.4f s  daemon anonymous %.1f MiB  replication bytes sent %d  "
                  "daemon norm phase %.2f ms, adam phase %.2f ms"
                  % (mode, r[0], r[1] / 2**20, r[2], r[3] * 1e3, r[4] * 1e3), flush=True)
    med = {m: [statistics.median(r[i] for r in res[m]) for i in range(5)] for m in res}
    if any(m not in med for m in ("off", "buddy", "inplace")):
        return None
    print("world %d, Psi %d (%.1f MiB fp32), batch %d, %d timed steps, %d runs (medians):"
          % (a.world, psi, psi * 4 / 2**20, a.batch, a.steps, a.runs))
    ratio = med["buddy"][0] / med["off"][0]
    print("  step time: off %.4f s, buddy %.4f s: x%.3f (target <= 1.10): %s"
          % (med["off"][0], med["buddy"][0], ratio, verdict(ratio <= 1.10, "ABOVE")))
    print("  with the trainers keeping their buckets for a re-attach in place: %.4f s, x%.3f of "
          "off, x%.3f of buddy" % (med["inplace"][0], med["inplace"][0] / med["off"][0],
                                   med["inplace"][0] / med["buddy"][0]))
    added = med["buddy"][0] - med["off"][0]
    print("  replication adds %.1f ms a step: %.2f ms per million elements of a shard (it does "
          "not grow with the batch)" % (added * 1e3, added * 1e3 / (psi / a.world / 1e6)))
    print("  daemon phases (rank 0, mean per step): norm (with the exchange) off %.2f ms, buddy "
          "%.2f ms; adam (with the replica's) off %.2f ms, buddy %.2f ms"
          % (med["off"][3] * 1e3, med["buddy"][3] * 1e3, med["off"][4] * 1e3,
             med["buddy"][4] * 1e3))
    extra, formula = med["buddy"][1] - med["off"][1], 16 * psi / a.world
    own = 12 * psi / a.world  # m, v and the gradient's shard; the fp32 master is the params region
    # within 2 %: the allocator's own pages and the requests' buffers come and go
    print("  daemon anonymous memory per rank: off %.1f MiB (its m, v and gradient shard, 12 "
          "Psi/N = %.1f MiB), buddy %.1f MiB (with the replica's master, m, v and the owner's "
          "gradient, 16 Psi/N more = %.1f MiB): +%.1f MiB, x%.3f of the formula: %s"
          % (med["off"][1] / 2**20, own / 2**20, med["buddy"][1] / 2**20,
             (own + formula) / 2**20, extra / 2**20, extra / formula,
             verdict(abs(extra / formula - 1) <= 0.02, "OFF THE FORMULA")))
    n_steps = a.steps + a.warmup
    per_step = (med["buddy"][2] - 12 * psi / a.world) / n_steps  # less the one whole shard
    print("  sent per step (rank 0): %.0f bytes; formula 4 Psi/N = %.0f"
          % (per_step, 4 * psi / a.world))
    return ratio


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    if "--recovery-child" in sys.argv:
        recovery_child(*map(int, sys.argv[sys.argv.index("--recovery-child") + 1:][:4]))
        return 0
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2, help="runs of each mode for the step time "
                    "and the memory (0: none)")
    ap.add_argument("--ckpt-every", type=int, default=8,
                    help="checkpoint_every_steps of the recovery runs without replication")
    ap.add_argument("--recovery-runs", type=int, default=2, help="recoveries of each mode "
                    "(0: none)")
    ap.add_argument("--steady-modes", default="off,buddy,inplace",
                    help="which modes time their steps (the summary needs the three)")
    ap.add_argument("--recovery-modes", default="inplace,buddy,off",
                    help="which recoveries to run (the summary needs all three)")
    a = ap.parse_args()
    a.recovery_modes = a.recovery_modes.split(",")
    a.steady_modes = a.steady_modes.split(",")
    zf.require_torch()
    psi = a.layers * (a.width * a.width + a.width)
    ratio = steady(a, psi) if a.runs > 0 else None
    if a.recovery_runs == 0:
        return 0
    rec = recovery(a)
    if len(rec) < 3:
        return 0
    print("recovery, world %d, Psi %d, daemon 1 killed after step %d and the daemons' store "
          "plans, %d runs (medians): from "
          "the kill to the next applied step, buddy in place %.2f s, buddy with the launcher's "
          "restart %.2f s, off (checkpoint every %d steps) %.2f s; the re-attach in place "
          "itself %.2f s, initialize() itself buddy %.2f s, off %.2f s"
          % (a.world, psi, a.ckpt_every + a.ckpt_every // 2, a.recovery_runs,
             rec["inplace"][3], rec["buddy"][3], a.ckpt_every, rec["off"][3], rec["inplace"][2],
             rec["buddy"][2], rec["off"][2]))
    if ratio is not None:
        print("  step time buddy / off: x%.3f (target <= 1.10): %s"
              % (ratio, verdict(ratio <= 1.10, "ABOVE")))
    for mode, what in (("inplace", "buddy in place"), ("buddy", "buddy, trainers restarted")):
        speed = rec["off"][3] / rec[mode][3]
        print("  recovery to the next applied step, off / %s: x%.2f (target >= 5): %s"
              % (what, speed, verdict(speed >= 5, "BELOW")))
        print("  recovery past the step reached, off / %s: x%.2f (%.2f s against %.2f s)"
              % (what, rec["off"][5] / rec[mode][5], rec["off"][5], rec[mode][5]))
    print("  zerod's part (initialize(): the mesh, the shard from the buddy or the checkpoint "
          "read), off / buddy: x%.2f" % (rec["off"][2] / rec["buddy"][2]))
    restore = rec["off"][6] / rec["buddy"][6]
    print("  the state's restore (daemons' logs: the checkpoint read %.3f s, the shard from the "
          "buddy %.3f s), off / buddy: x%.1f (target >= 5): %s"
          % (rec["off"][6], rec["buddy"][6], restore, verdict(restore >= 5, "BELOW")))
    print("  steps lost: buddy in place %d, buddy restarted %d (target 0): %s; off %d"
          % (rec["inplace"][4], rec["buddy"][4],
             verdict(rec["inplace"][4] == 0 and rec["buddy"][4] == 0, "LOST STEPS"),
             rec["off"][4]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
