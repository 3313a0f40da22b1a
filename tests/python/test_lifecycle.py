#!/usr/bin/env python3
"""A job's life after its trainer dies (docs/design-notes.md "A job's life"): the daemon keeps
the job for a re-attach, but a plain re-run of the script never silently continues it.

    test_lifecycle.py CASE [--world N]

The trainers are subprocesses (this script with --child) training the two-group MLP through
zerod.torch, stage 2, gradient_accumulation_steps 2; every batch is a function of (step,
micro-step, rank), so a run that starts afresh, or that continues a kept job, ends with the
parameters of an uninterrupted run ("straight") of the same number of steps, bit for bit. A
"killed" run stops after step KILL_AT and waits to be killed (SIGKILL, every rank): its daemons
keep the job, orphaned.

Cases:
  replace  a plain re-run (resume="auto", no TORCHELASTIC_RESTART_COUNT) replaces the orphan:
           a fresh job at step 0 with the model's own values, ending equal to the straight run;
           the trainer is told (warning) and every daemon's log names the replaced job and its
           step
  restart  the same re-run with TORCHELASTIC_RESTART_COUNT=1 resumes: step KILL_AT, the job's
           values, ending equal to the straight run
  must     resume="must" with nothing kept fails with ERR_NOT_FOUND; after a kill it resumes
  never    resume="never" with TORCHELASTIC_RESTART_COUNT=1 still starts afresh
  busy     (world 1) another job while a live trainer holds the daemon: ERR_BUSY naming the
           job, its age, the trainer's pid and `zeroctl job end`; once that trainer is killed,
           ERR_BUSY naming the orphan and how long it is kept; `zeroctl job end` frees the
           daemon; a live trainer whose job is ended gets ERR_JOB_ENDED at its next step
"""
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import zd_fixture as zf

torch = zf.require_torch()
import zd_ref as zr  # noqa: E402

STEPS = 8
KILL_AT = 3
GAS = 2


def child(out, resume, hang_at, slow):
    import warnings
    import zerod
    import zerod.torch
    model = zr.MLP(1)
    cfg = zr.config(gas=GAS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            engine, _, _, _ = zerod.torch.initialize(
                model=model, model_parameters=zr.param_groups(model), config=cfg, resume=resume)
        except zerod.ZerodError as e:
            print("ERROR %s %s" % (e.name, e), flush=True)
            sys.exit(3)
    for w in caught:
        if "replaced" in str(w.message):
            print("REPLACED %s" % w.message, flush=True)
    print("ATTACHED resumed=%d step=%d" % (engine.resumed, engine.global_steps), flush=True)
    steps = STEPS if hang_at < 0 else hang_at
    try:
        while slow or engine.global_steps < steps:
            s = engine.global_steps
            for k in range(GAS):
                x, t = zr.batch(s, k, engine.rank)
                engine.backward(zr.loss_fn(engine(x), t))
                engine.step()
            print("STEP %d" % engine.global_steps, flush=True)
            if slow:
                time.sleep(0.05)
    except zerod.ZerodError as e:
        print("ENDED %s %s" % (e.name, e), flush=True)
        engine.close()
        return
    if hang_at >= 0:
        print("HANGING", flush=True)
        time.sleep(3600)  # until killed
    torch.save(zr.params_of(model), out)
    engine.close()
    print("DONE", flush=True)


class Trainer:
    """A trainer subprocess whose stdout a thread reads, so that every wait has a deadline."""

    def __init__(self, cmd, env):
        self.p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        self.pid = self.p.pid
        self.lines = []
        self._q = queue.Queue()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        for line in self.p.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_line(self, prefix, timeout=120):
        """Wait for a stdout line starting with prefix; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError("no %r line from the trainer (exit %s); it printed:\n%s"
                                     % (prefix, self.p.poll(), "\n".join(self.lines)))
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(timeout=30)
        assert self.p.returncode == -signal.SIGKILL, self.p.returncode
        self._t.join(timeout=10)

    def finish(self, code=0, timeout=120):
        """Wait for the exit (code expected); returns everything it printed."""
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self._t.join(timeout=10)
        while True:
            try:
                line = self._q.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        out = "\n".join(self.lines)
        assert self.p.returncode == code, "trainer exited with %s, expected %d:\n%s" % (
            self.p.returncode, code, out)
        return out


def start(c, job, rank, out, resume="auto", restart=False, hang_at=-1, slow=False):
    env = dict(os.environ)
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    env.update(c.env(rank, job))
    if restart:
        env["TORCHELASTIC_RESTART_COUNT"] = "1"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", out, resume, str(hang_at)]
    if slow:
        cmd.append("--slow")
    return Trainer(cmd, env)


def finish(procs, code=0, timeout=120):
    return [p.finish(code, timeout) for p in procs]


def outs(c, run):
    return [os.path.join(c.tmp, "%s%d.pt" % (run, r)) for r in range(c.world)]


def straight(c):
    o = outs(c, "straight")
    finish([start(c, "straight", r, o[r]) for r in range(c.world)])
    return [torch.load(x) for x in o]


def kill_at(c, job):
    """Every rank trains to KILL_AT and is killed there: the daemons keep the job, orphaned."""
    procs = [start(c, job, r, os.devnull, hang_at=KILL_AT) for r in range(c.world)]
    for p in procs:
        p.wait_line("HANGING")
    for p in procs:
        p.kill()
    for d in c.daemons:  # the daemon saw the trainer go
        zf_wait(lambda: "trainer of job '%s' disconnected" % job in d.log(), "the disconnect")


def zf_wait(cond, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("%s did not happen within %d s" % (what, timeout))
        time.sleep(0.05)


def same(a, b, what):
    for r, (x, y) in enumerate(zip(a, b)):
        for i, (u, v) in enumerate(zip(x, y)):
            assert torch.equal(u, v), "%s: rank %d tensor %d differs (max %g)" % (
                what, r, i, (u - v).abs().max().item())


def rerun(c, job, expect_step, **kw):
    """Run the job again on every rank; check where it started; its final parameters."""
    o = outs(c, job + "-again")
    logs = finish([start(c, job, r, o[r], **kw) for r in range(c.world)])
    for r, log in enumerate(logs):
        att = [ln for ln in log.splitlines() if ln.startswith("ATTACHED")]
        assert att == ["ATTACHED resumed=%d step=%d" % (expect_step > 0, expect_step)], (r, log)
    return logs, [torch.load(x) for x in o]


def case_replace(c, ref):
    kill_at(c, "replaced")
    logs, got = rerun(c, "replaced", 0)
    same(ref, got, "a fresh job replacing the orphan")
    for r, (log, d) in enumerate(zip(logs, c.daemons)):
        assert re.search(r"^REPLACED .*job 'replaced' at step %d" % KILL_AT, log, re.M), log
        line = [ln for ln in d.log().splitlines() if "job 'replaced' ends (replaced" in ln]
        assert line and ("at step %d" % KILL_AT) in line[0] and "resume 'auto'" in line[0], \
            d.log()[-3000:]
        print("rank %d daemon: %s" % (r, line[0].split(" INFO ", 1)[-1]))


def case_restart(c, ref):
    kill_at(c, "restarted")
    logs, got = rerun(c, "restarted", KILL_AT, restart=True)
    same(ref, got, "a restart continuing the kept job")
    assert not any("REPLACED" in log for log in logs), logs


def case_must(c, ref):
    logs = finish([start(c, "must", r, os.devnull, resume="must") for r in range(c.world)], code=3)
    for log in logs:
        assert log.startswith("ERROR ERR_NOT_FOUND") and "resume 'must'" in log, log
    kill_at(c, "must")
    _, got = rerun(c, "must", KILL_AT, resume="must")
    same(ref, got, "resume='must' continuing the kept job")


def case_never(c, ref):
    kill_at(c, "never")
    logs, got = rerun(c, "never", 0, resume="never", restart=True)
    same(ref, got, "resume='never' starting afresh")
    assert all("REPLACED" in log and "resume 'never'" in log for log in logs), logs


def zeroctl(*args):
    exe = os.path.join(os.path.dirname(zf.zerod_bin()), "..", "client", "zeroctl")
    return subprocess.run([exe] + list(args), capture_output=True, text=True, timeout=60)


def busy_error(sock, job):
    import zerod
    import zerod.torch as zt
    model = zr.MLP(2)
    try:
        zt.initialize(model=model, config=zr.config(gas=GAS), job=job, socket_path=sock,
                      attach_wait_s=0)
    except zerod.ZerodError as e:
        assert e.name == "ERR_BUSY", e
        return str(e)
    raise AssertionError("job %s attached to a daemon that holds another" % job)


def case_busy(c, ref):
    sock = c.daemons[0].socket
    live = start(c, "holder", 0, os.devnull, hang_at=KILL_AT)
    live.wait_line("HANGING")
    msg = busy_error(sock, "other")
    for want in ("job 'holder'", "step %d" % KILL_AT, "s ago", "live trainer (pid %d)" % live.pid,
                 "zeroctl job end holder"):
        assert want in msg, (want, msg)
    print("live holder: %s" % msg)
    live.kill()
    zf_wait(lambda: "trainer of job 'holder' disconnected" in c.daemons[0].log(), "the disconnect")
    msg = busy_error(sock, "other")
    for want in ("job 'holder'", "orphaned", "kept", "job_linger", "zeroctl job end holder"):
        assert want in msg, (want, msg)
    print("orphaned holder: %s" % msg)
    rc = zeroctl("-s", sock, "job", "end", "holder")
    assert rc.returncode == 0, rc.stderr
    # the daemon is free: the other job attaches, and is ended while its trainer steps
    slow = start(c, "other", 0, os.devnull, slow=True)
    slow.wait_line("STEP 2")
    rc = zeroctl("-s", sock, "job", "end", "other")
    assert rc.returncode == 0 and "job 'other'" in rc.stdout, (rc.stdout, rc.stderr)
    ended = slow.wait_line("ENDED")
    assert ended.startswith("ENDED ERR_JOB_ENDED") and "zeroctl job end" in ended, ended
    finish([slow])
    print("live trainer of an ended job: %s" % ended)


CASES = {"replace": case_replace, "restart": case_restart, "must": case_must,
         "never": case_never, "busy": case_busy}


def main():
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        child(sys.argv[i + 1], sys.argv[i + 2], int(sys.argv[i + 3]), "--slow" in sys.argv)
        return 0
    case = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in CASES else None
    if case is None:
        print("usage: test_lifecycle.py %s [--world N]" % "|".join(CASES), file=sys.stderr)
        return 2
    world = zf.parse_world()
    zf.require_world(world)
    # a killed trainer aborts the mesh on every daemon of its job (logged as ERROR)
    allowed = r"aborted: rank \d+: its trainer disconnected" if world > 1 else None
    with zf.Cluster(world, flags=("--job-linger", "60s"), allowed_errors=allowed) as c:
        ref = straight(c) if case != "busy" else None
        CASES[case](c, ref)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
