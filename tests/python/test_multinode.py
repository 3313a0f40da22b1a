#!/usr/bin/env python3
"""Multi-node is the launchers' job: `torchrun --nnodes 2` on two hosts forms one zerod job with
no zerod-specific flag. The two hosts are two network namespaces on one bridge (10.77.0.1/24
and 10.77.0.2/24; tests/python/zd_netns.py); each runs one zerod and `python3 -m
torch.distributed.run --nnodes 2 --nproc_per_node 1 --node_rank K --master_addr 10.77.0.1
--master_port P train.py`. The agents' static rendezvous keeps its store on 10.77.0.1:P, the
trainer's init_process_group("gloo") (what deepspeed.init_distributed() calls) joins it, and
rank 0's daemon meets rank 1's on 10.77.0.1:P+1 (zc_coordinator_from_env, from the MASTER_ADDR
and MASTER_PORT torchrun set). The trainer does `import zerod.torch as
deepspeed` and trains STEPS steps; it gets only what a one-node torchrun run needs:
ZEROD_SOCKET (its host's daemon), plus GLOO_SOCKET_IFNAME for torch's gloo (this machine's
hostname resolves to 127.0.0.1, useless between namespaces; torch's setting, not zerod's).

Passes when both ranks end with bit-identical parameters (and print the same checksum) that
match a single-process torch AdamW on the two ranks' averaged gradients (zd_ref, tolerance of
test_parity.py), and both daemons agreed on the ring over UCX (rank on another host).

Skips (exit 77, "SKIP: ...") without torch, without root or `ip`, or when `ip netns add`, the
bridge or a veth pair fails. Every wait has a deadline; the namespaces, daemons and torchrun
process groups are removed on every exit, also on failure or SIGTERM.

    test_multinode.py
"""
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import zd_fixture as zf
import zd_netns

torch = zf.require_torch()
import zd_ref as zr  # noqa: E402

STEPS = 5
TOL = 1e-5              # test_parity.py's: same Adam, same data, only rounding differs
MASTER_PORT = 29500     # a fresh namespace: nothing else binds there
RUN_TIMEOUT = 150       # both torchruns, from start to exit (CTest gives the test 300 s)
HERE = os.path.dirname(os.path.abspath(__file__))
# torch 1.13's torchrun on Python 3.11 (Debian 12) fails with its default "--redirects 0 --tee 0"
# ("'NoneType' object has no attribute 'get'"): Std.from_str looks "0" up by iterating the
# IntFlag, which no longer yields the zero member. "2" names Std.ERR: stdout stays the agent's,
# stderr goes to --log_dir and is copied to the agent's stderr ("[default0]:" prefixed).
REDIRECTS = ["--redirects", "2", "--tee", "2"]

TRAINER = r'''
import hashlib
import os
import sys

sys.path.insert(0, %(here)r)
import torch
import torch.distributed as dist
import zerod.torch as deepspeed
import zd_ref as zr

dist.init_process_group("gloo")  # env://, as deepspeed.init_distributed() does
rank = dist.get_rank()
seen = " ".join("%%s=%%s" %% (k, os.environ.get(k)) for k in (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"))
print("rank %%d env: %%s" %% (rank, seen), flush=True)
model = zr.MLP(1)
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=zr.param_groups(model),
                                       config=zr.config(stage=2, bucket=700))
for step in range(%(steps)d):
    x, t = zr.batch(step, 0, engine.rank)
    engine.backward(zr.loss_fn(engine(x), t))
    engine.step()
params = zr.params_of(model)
torch.save(params, os.path.join(sys.argv[1], "rank%%d.pt" %% rank))
digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()
flag = torch.tensor([1.0])
dist.all_reduce(flag)  # torch's gloo still works beside zerod
print("RESULT rank %%d world %%d steps %%d gloo %%g sha256 %%s"
      %% (rank, engine.world_size, engine.global_steps, flag.item(), digest), flush=True)
engine.close()
dist.destroy_process_group()
'''


def torchrun_env(hosts, k, daemon):
    """The caller's environment without any launcher or zerod job variable, plus the local
    daemon's socket and gloo's interface: everything else comes from torchrun."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
            "MASTER_PORT", "ZEROD_JOB", "ZEROD_COORDINATOR", "ZEROD_SOCKET", "ZEROD_SOCKET_DIR")
    env = {n: v for n, v in os.environ.items() if n not in drop}
    env.update({"ZEROD_SOCKET": daemon.socket, "GLOO_SOCKET_IFNAME": hosts.ifname[k],
                "PYTHONUNBUFFERED": "1"})
    return env


def kill_group(proc):
    """SIGKILL the process group of a torchrun started in a session of its own (its agent and
    workers share it), then reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def worker_failed(log):
    """torchrun's agent logs a failed worker ("failed (exitcode: 1) local_rank: 0")."""
    try:
        with open(log, errors="replace") as f:
            return "failed (exitcode: " in f.read()
    except FileNotFoundError:
        return False


def run_torchruns(hosts, daemons, script, tmp):
    """Both nodes' torchrun at once; returns their outputs. A failure of one gives the other
    15 s to report its side, then kills it."""
    procs, logs = [], []
    try:
        for k in (0, 1):
            logs.append(os.path.join(tmp, "torchrun%d.out" % k))
            cmd = hosts.exec_prefix(k) + [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc_per_node", "1", "--node_rank", str(k), "--master_addr", hosts.addr[0],
                "--master_port", str(MASTER_PORT)] + REDIRECTS + [
                "--log_dir", os.path.join(tmp, "torchrun-logs%d" % k), script, tmp]
            with open(logs[k], "wb") as out:
                procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT, cwd=tmp,
                                              env=torchrun_env(hosts, k, daemons[k]),
                                              start_new_session=True))
        deadline = time.monotonic() + RUN_TIMEOUT
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            # an agent that lost its worker waits for the other node (a rank hung in a connect
            # waits 30 min): 15 s more for the other side's message, then both are killed
            if any(p.poll() not in (None, 0) for p in procs) or any(map(worker_failed, logs)):
                deadline = min(deadline, time.monotonic() + 15)
            time.sleep(0.2)
    finally:
        timed_out = [k for k, p in enumerate(procs) if p.poll() is None]
        for p in procs:
            kill_group(p)
    outs = []
    for k in (0, 1):
        with open(logs[k], errors="replace") as f:
            outs.append(f.read())
    bad = [k for k in (0, 1) if k in timed_out or procs[k].returncode != 0]
    if bad:
        raise AssertionError("\n".join(
            "node %d's torchrun %s; its output:\n%s" % (
                k, "did not finish within its deadline" if k in timed_out
                else "exited with %d" % procs[k].returncode, outs[k][-6000:]) for k in bad))
    return outs


def check(outs, tmp, daemons):
    results = {}
    for k, out in enumerate(outs):
        for m in re.finditer(r"^RESULT rank (\d+) world (\d+) steps (\d+) gloo (\S+) sha256 (\w+)$",
                             out, re.M):
            results[int(m.group(1))] = m.groups()[1:]
            print("node %d: %s" % (k, m.group(0)))
        for m in re.finditer(r"^rank \d+ env: .*$", out, re.M):
            print("node %d: %s" % (k, m.group(0)))
    assert sorted(results) == [0, 1], "not every rank reported:\n%s\n%s" % tuple(outs)
    for r, (world, steps, gloo, _) in results.items():
        assert (world, steps, gloo) == ("2", str(STEPS), "2"), (r, results[r])
    assert results[0][3] == results[1][3], "the ranks' parameter checksums differ"
    params = [torch.load(os.path.join(tmp, "rank%d.pt" % r)) for r in (0, 1)]
    digests = [hashlib.sha256(b"".join(p.numpy().tobytes() for p in ps)).hexdigest()
               for ps in params]
    assert digests == [results[0][3]] * 2, (digests, results)
    for a, b in zip(params[0], params[1]):
        assert torch.equal(a, b), "rank 1's parameters differ from rank 0's"
    ref = zr.reference_train(STEPS, world=2)
    d = zr.max_rel_diff(params[0], ref)
    print("both ranks: %d steps, identical parameters (sha256 %s), max relative difference "
          "to the single-process reference %.3g (tolerance %g)"
          % (STEPS, results[0][3][:16], d, TOL))
    assert d <= TOL, "the parameters differ from the reference by %.3g" % d
    for k, dm in enumerate(daemons):
        m = re.search(r"collectives: (.*)$", dm.log(), re.M)
        assert m and m.group(1).startswith("ring over UCX"), \
            "daemon %d did not use the ring between hosts: %s" % (k, m and m.group(1))
        print("daemon %d: collectives: %s" % (k, m.group(1)))


def main():
    if not torch.distributed.is_available():
        zf.skip("this torch has no torch.distributed")

    def on_term(signum, frame):  # CTest's timeout: clean up through the finally blocks
        raise SystemExit("killed by signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)
    hosts = zd_netns.Hosts(2)
    tmp = tempfile.mkdtemp(prefix="zd-multinode-")
    daemons = []
    ok = False
    try:
        why = hosts.create()
        if why is not None:
            zf.skip(why)
        token = os.path.join(tmp, "token")
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        for k in (0, 1):
            daemons.append(zd_netns.NsDaemon(hosts, k, os.path.join(tmp, "host%d" % k),
                                             ["--token-file", token, "--mesh-timeout", "60s"],
                                             device="cpu:%d" % k).start())
        script = os.path.join(tmp, "train.py")
        with open(script, "w") as f:
            f.write(TRAINER % {"here": HERE, "steps": STEPS})
        t0 = time.monotonic()
        outs = run_torchruns(hosts, daemons, script, tmp)
        print("two torchruns (--nnodes 2) finished in %.1f s" % (time.monotonic() - t0))
        for d in daemons:
            d.stop(check=True)
        check(outs, tmp, daemons)
        ok = True
    finally:
        for d in daemons:
            try:
                d.stop(check=False)
            except AssertionError:
                pass
        if not ok:
            for d in daemons:
                sys.stderr.write("---- %s ----\n%s" % (d.log_path, d.log()[-4000:]))
        hosts.close()
        if not os.environ.get("ZD_KEEP_TMP"):
            shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
