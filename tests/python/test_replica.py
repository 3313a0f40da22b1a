#!/usr/bin/env python3
"""A daemon killed (SIGKILL) mid-run loses no step when its shard also lives in a buddy daemon's
memory (daemon key replication = buddy; docs/design-notes.md "Buddy replicas").

    test_replica.py CASE [--victim R] [--netns] [--lazy] [--delay S] [--slots N] [--again]

The trainers are subprocesses (this script with --child) training the two-group MLP through
zerod.torch at world 3, stage 2, gradient_accumulation_steps 2; every batch is a function of
(step, micro-step, rank); before step WRITE_AT every rank halves its weights in place (weights
written after initialize reach the master and the buddy's replica). Run 1 ("straight") trains
without interruption. Run 2 is interrupted
after rank 0 printed step KILL_AFTER: the daemons named by the case are killed with SIGKILL and
started again, fresh, on their sockets, and every trainer is killed and restarted as a launcher
restarting the job would (TORCHELASTIC_RESTART_COUNT=1). Either way the final parameters must
equal the straight run's, bit for bit.

Cases:
  recover   daemon 1 (or R) dies: its restarted daemon gets its shard from its buddy (the next
            rank) when the mesh forms, and the job continues at the step it had reached; no
            checkpoint is read (the daemons have none)
  fallback  daemons 1 and 2 die: rank 1's shard and its replica on rank 2 are both gone, so the
            job goes back to checkpoint_dir's latest checkpoint; rank 0's daemon log names both
            ranks
  world2    daemon 1 dies and the launcher restarts the job at world 2 on the daemons of ranks 0
            and 2: they move the shards they hold (their own and rank 1's replica) into the
            world-2 layout in memory, and the job goes on at its step; it ends bit-identical to
            a run that saved a checkpoint at that step at world 3 and loaded it at world 2
  mismatch  daemon 1 runs with replication off, the others with buddy: the attach fails on
            every rank, naming rank 1 and both values
  inplace   daemon 1 (or R) dies and is started again, fresh, but no trainer is restarted:
            each re-attaches in place (zerod.torch's engine; ZEROD_REATTACH), the fresh daemon
            gets its shard from its buddy, and the trainers send the gradients of the step the
            loss interrupted again; every rank re-attached once. The daemons give a slot to
            every bucket of the window (6 here), which keeps it until the step; with --slots N
            (fewer, the daemons' --bucket-slots) the trainers copy each bucket out instead.
            With --again two more daemons die, 3 and 5 steps after the first: the one whose
            buddy came back fresh (the replica there came as a whole shard after the first
            recovery), then the first victim again (its buddy held its shard already, so no
            whole shard was sent; the gradients kept the replica current)
  node      with --netns: every process of host 1 (or R), its daemon and its trainer, is killed
            at once, as when a node is lost; the host's daemon comes back fresh and the job goes
            on as in recover

--delay: seconds from rank 0's print of step KILL_AFTER to the kill (0.03), to try other
points of the step.

With --lazy (loopback only) the daemons do no idle work (ZEROD_TEST_PAUSE=noidle): the replica's Adam of each
step, which a daemon runs after the step's reply, is left to the next step's exchange or to the
mesh that forms after the kill, whose ranks catch it up before they say what they hold.

The other cases run their trainers with ZEROD_REATTACH=0, so the launcher's restart is what
they test.

With --netns (recover, node, world2, inplace) each rank's daemon and trainer run on a host of their own,
a network namespace (tests/python/zd_netns.py: three namespaces on one bridge; root and `ip`
needed, else the case skips with exit 77), so every buddy is on another host and the daemons'
mesh and the shards' transfers cross the hosts' network (their ring runs over UCX); world2
loses all of host 1 and goes on on hosts 0 and 2.
"""
import os
import re
import signal
import subprocess
import sys
import time

import zd_fixture as zf
import zd_netns

torch = zf.require_torch()
import zd_ref as zr  # noqa: E402

WORLD = 3
STEPS = 12
KILL_AFTER = 5
WRITE_AT = 3  # every rank halves its weights before this step: the replicas must take it too
GAS = 2


def child(out):
    import zerod.torch
    model = zr.MLP(1)
    cfg = zr.config(gas=GAS)
    engine, _, _, _ = zerod.torch.initialize(model=model, model_parameters=zr.param_groups(model),
                                             config=cfg)
    print("ATTACHED resumed=%d step=%d" % (engine.resumed, engine.global_steps), flush=True)
    if os.environ.get("ZD_LOAD"):  # the world-2 side of the world2 case's reference run
        engine.load_checkpoint(os.environ["ZD_LOAD"])
    stop = int(os.environ.get("ZD_STOP_AT", STEPS))
    while engine.global_steps < stop:
        s = engine.global_steps
        if s == WRITE_AT:  # weights written after initialize (found by the engine, reloaded)
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.5)
        for k in range(GAS):
            x, t = zr.batch(s, k, engine.rank)
            engine.backward(zr.loss_fn(engine(x), t))
            time.sleep(0.02)
            engine.step()
        print("STEP %d" % engine.global_steps, flush=True)
    if stop < STEPS:
        engine.save_checkpoint(os.environ["ZD_SAVE"])
    torch.save(zr.params_of(model), out)
    print("REATTACHES %d" % engine.reattaches, flush=True)
    engine.close()
    print("DONE", flush=True)


def start(cluster, job, rank, out, restart=False, daemons=None, extra=None, inplace=False):
    """Rank `rank`'s trainer, on its daemon's host; daemons: the daemon of each rank of a
    smaller world."""
    host = rank if daemons is None else daemons[rank]
    prefix = cluster.prefix(host) if isinstance(cluster, zd_netns.NsCluster) else []
    env = dict(os.environ)
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    env.update(cluster.env(rank, job))
    if daemons is not None:
        env.update({"WORLD_SIZE": str(len(daemons)),
                    "ZEROD_SOCKET": cluster.daemons[host].socket})
    env["ZEROD_REATTACH"] = "1" if inplace else "0"
    env.update(extra or {})
    if restart:  # the launcher's word that this is a restart of the job
        env["TORCHELASTIC_RESTART_COUNT"] = "1"
    return subprocess.Popen(prefix + [sys.executable, os.path.abspath(__file__), "--child", out],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def finish(procs, timeout=50):
    lines = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            stdout, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            stdout, _ = p.communicate()
            raise AssertionError("a trainer did not finish within %d s:\n%s" % (timeout, stdout))
        lines.append(stdout)
        assert p.returncode == 0, "trainer exited with %d:\n%s" % (p.returncode, stdout)
    return lines


def restarted_log(d, after):
    """The log of daemon d started again after the kill in the step after `after`."""
    return os.path.join(d.rundir, "zerod-restarted%s.log" % ("" if after == KILL_AFTER
                                                               else after))


def interrupt(c, procs, victims, restart=True, node=False, trainers=True, after=KILL_AFTER):
    """Kill the victims' daemons (node: every process of the victims' hosts) inside the step
    after `after`, then every trainer (unless not `trainers`), as the launcher's restart
    does; start the victims' daemons again (fresh, each with a log of its own)."""
    deadline = time.monotonic() + 40
    for line in procs[0].stdout:
        if line.strip() == "STEP %d" % after:
            break
        assert time.monotonic() < deadline, "no step %d within 40 s" % after
    else:
        raise AssertionError("the trainer ended before step %d" % after)
    time.sleep(float(sys.argv[sys.argv.index("--delay") + 1]) if "--delay" in sys.argv else 0.03)
    for r in victims:
        if node:
            killed = c.hosts.kill_all(r)
            assert c.daemons[r].proc.pid in killed and procs[r].pid in killed, killed
        else:
            c.daemons[r].proc.kill()
    for r in victims:
        c.daemons[r].proc.wait(timeout=10)
        c.daemons[r].proc = None
    for p in procs if trainers else ():
        p.kill()
    for p in procs if trainers else ():
        p.wait(timeout=10)
        p.stdout.close()
    for r in victims if restart else ():
        d = c.daemons[r]
        d.log_path = restarted_log(d, after)
        d.start()


def mismatch():
    import threading
    import zerod
    with zf.Cluster(WORLD, flags=["--replication", "buddy"], allowed_errors=r".") as c:
        c.daemons[1].flags[c.daemons[1].flags.index("buddy")] = "off"
        c.daemons[1].stop(check=False)
        c.daemons[1].start()
        errors = [None] * WORLD

        def attach(r):
            s = zerod.Session(c.daemons[r].socket, timeout_ms=30000)
            try:
                s.attach("mismatch", [([16], None)], "{}", zerod.DTYPE_F32, r, WORLD,
                         "127.0.0.1:%d" % c.port())
            except zerod.ZerodError as e:
                errors[r] = e
            finally:
                s.close()

        threads = [threading.Thread(target=attach, args=(r,)) for r in range(WORLD)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for r, e in enumerate(errors):
            assert e is not None, "rank %d attached with replication differing" % r
            print("rank %d: %s" % (r, e))
        # every rank hears why, rank 2 too (rank 0 tells the ranks still connecting: it
        # used to leave rank 2 waiting out its deadline)
        for e in errors:
            assert "rank 1 has replication = off, rank 0 has replication = buddy" in str(e), e
    print("PASS")
    return 0


def world2(c, outs, node):
    """Daemon 1 (node: host 1) dies; the job goes on at world 2 on daemons 0 and 2. The
    reference: world 3 up to the step it went on from, a checkpoint, world 2 from it."""
    daemons = [0, 2]
    procs = [start(c, "killed", r, outs["killed"][r]) for r in range(WORLD)]
    interrupt(c, procs, [1], node=node)  # daemon 1 comes back idle: the reference run needs it
    procs = [start(c, "killed", r, outs["killed"][r], True, daemons) for r in range(2)]
    logs = finish(procs)
    firsts = [log.splitlines()[0] for log in logs]
    assert all(f.startswith("ATTACHED resumed=1") for f in firsts), firsts
    step = int(firsts[0].split("step=")[1])
    assert KILL_AFTER <= step < STEPS and all(f.endswith("step=%d" % step) for f in firsts), firsts
    assert "goes on as rank 1 of 2 at step %d" % step in c.daemons[2].log()
    ckpt = os.path.join(c.tmp, "ckpt")
    finish([start(c, "ref3", r, outs["straight"][r], extra={"ZD_STOP_AT": str(step),
                                                             "ZD_SAVE": ckpt})
            for r in range(WORLD)])
    finish([start(c, "ref2", r, outs["straight"][r], False, daemons, {"ZD_LOAD": ckpt})
            for r in range(2)])
    return step


def main():
    if "--child" in sys.argv:
        child(sys.argv[sys.argv.index("--child") + 1])
        return 0
    case = sys.argv[1] if len(sys.argv) > 1 else "recover"
    netns = "--netns" in sys.argv
    if case not in (("recover", "node", "world2", "inplace") if netns
                    else ("recover", "fallback", "world2", "mismatch", "inplace")):
        print("usage: test_replica.py recover|fallback|world2|mismatch|inplace [--victim R]\n"
              "       test_replica.py recover|node|world2|inplace --netns [--victim R]",
              file=sys.stderr)
        return 2
    if case == "mismatch":
        return mismatch()
    victim = int(sys.argv[sys.argv.index("--victim") + 1]) if "--victim" in sys.argv else 1
    victims = [victim] if case in ("recover", "node", "inplace") else [1, 2]
    zf.require_world(WORLD)
    if not netns:
        return run(case, victims, None)

    def on_term(signum, frame):  # CTest's timeout: remove the namespaces on the way out
        raise SystemExit("killed by signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)
    hosts = zd_netns.Hosts(WORLD)
    try:
        why = hosts.create()
        if why is not None:
            zf.skip(why)
        return run(case, victims, hosts)
    finally:
        hosts.close()


def run(case, victims, hosts):
    """The case on loopback daemons, or with one host of `hosts` per rank."""
    victim = victims[0]
    flags = ["--job-linger", "60s", "--replication", "buddy", "--heartbeat-timeout", "2s"]
    if "--slots" in sys.argv:
        flags += ["--bucket-slots", sys.argv[sys.argv.index("--slots") + 1]]
    ckpt = None
    if case == "fallback":
        ckpt = os.path.join(os.environ.get("TMPDIR", "/tmp"), "zd-replica-ckpt-%d" % os.getpid())
        flags += ["--checkpoint-dir", ckpt, "--checkpoint-every-steps", "2"]
    # the lost daemon aborts the step in flight on the others (logged as ERROR)
    allowed = r"job 'killed' aborted|rank \d+ lost"
    t0 = time.monotonic()
    env = {"ZEROD_TEST_PAUSE": "noidle:1"} if "--lazy" in sys.argv else None
    if hosts is None:
        cluster = zf.Cluster(WORLD, flags=flags, allowed_errors=allowed, env=env)
    else:
        cluster = zd_netns.NsCluster(hosts, WORLD, flags=flags, allowed_errors=allowed)
    try:
        with cluster as c:
            outs = {kind: [os.path.join(c.tmp, "%s%d.pt" % (kind, r)) for r in range(WORLD)]
                    for kind in ("straight", "killed")}
            if case == "world2":
                step = world2(c, outs, hosts is not None)
                compare(outs, 2)
                check_hosts(c, hosts, [0, 2])
                return report(case, [1], step, t0, hosts)
            finish([start(c, "straight", r, outs["straight"][r]) for r in range(WORLD)])
            if case == "inplace":
                step = inplace(c, outs, victim)
                compare(outs, WORLD)
                check_hosts(c, hosts, range(WORLD))
                return report(case, victims, step, t0, hosts)
            procs = [start(c, "killed", r, outs["killed"][r]) for r in range(WORLD)]
            interrupt(c, procs, victims, node=case == "node")
            procs = [start(c, "killed", r, outs["killed"][r], restart=True)
                     for r in range(WORLD)]
            logs = finish(procs)
            steps = set()
            for r, log in enumerate(logs):
                first = log.splitlines()[0]
                assert first.startswith("ATTACHED resumed=1"), "rank %d: %s" % (r, first)
                steps.add(int(first.split("step=")[1]))
                print("rank %d restarted: %s" % (r, first))
            assert len(steps) == 1, steps
            step = steps.pop()
            survivor = c.daemons[(victims[-1] + 1) % WORLD].log()
            if case in ("recover", "node"):
                assert KILL_AFTER <= step < STEPS, step
                assert re.search(r"recovered 1 fresh rank", survivor), survivor[-3000:]
                assert "shard came from its buddy" in c.daemons[victim].log()
            else:
                assert step <= KILL_AFTER + 1 and step % 2 == 0, step
                assert re.search(r"rank 1's shard and its replica on rank 2 are both lost",
                                 survivor), survivor[-3000:]
            compare(outs, WORLD)
            check_hosts(c, hosts, range(WORLD))
    finally:
        if ckpt is not None:
            import shutil
            shutil.rmtree(ckpt, ignore_errors=True)
    return report(case, victims, step, t0, hosts)


def inplace(c, outs, victim):
    """The victim's daemon killed and started again with the trainers left running: each
    re-attaches in place and the job goes on. Returns the step the job went on at."""
    procs = [start(c, "killed", r, outs["killed"][r], inplace=True) for r in range(WORLD)]
    kills = [(KILL_AFTER, victim)]
    if "--again" in sys.argv:
        # the daemon whose buddy came back fresh (its replica there came as a whole shard),
        # then the first victim again (its buddy kept its replica current: no whole shard)
        kills += [(KILL_AFTER + 3, (victim + WORLD - 1) % WORLD), (KILL_AFTER + 5, victim)]
    for after, r in kills:
        interrupt(c, procs, [r], trainers=False, after=after)
    logs = finish(procs)
    times = len(kills)
    for r, log in enumerate(logs):  # (rank 0's lines up to the kill were read by interrupt)
        assert "ATTACHED resumed=1" not in log, "rank %d restarted:\n%s" % (r, log[-2000:])
        found = re.findall(r"^REATTACHES (\d+)$", log, re.M)
        assert found == [str(times)], "rank %d re-attached %s times:\n%s" % (r, found,
                                                                              log[-2000:])
    survivor = c.daemons[(victim + 1) % WORLD].log()
    assert re.search(r"recovered 1 fresh rank", survivor), survivor[-3000:]
    for after, r in kills:
        with open(restarted_log(c.daemons[r], after)) as f:
            log = f.read()
        assert "shard came from its buddy" in log, "daemon %d after step %d:\n%s" % (
            r, after, log[-3000:])
    m = re.search(r"job '\S+' re-attached at step (\d+)", survivor)
    assert m, survivor[-3000:]
    step = int(m.group(1))
    assert KILL_AFTER <= step < STEPS, step
    return step


def compare(outs, world):
    for r in range(world):
        a, b = torch.load(outs["straight"][r]), torch.load(outs["killed"][r])
        assert len(a) == len(b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert torch.equal(x, y), (
                "rank %d tensor %d: the run with lost daemons differs from the reference run "
                "(max %g)" % (r, i, (x - y).abs().max().item()))


def check_hosts(c, hosts, ranks):
    """On hosts, the daemons' last mesh went between them over the network."""
    if hosts is None:
        return
    for r in ranks:
        found = re.findall(r"collectives: (.*)$", c.daemons[r].log(), re.M)
        assert found and found[-1].startswith("ring over UCX"), \
            "daemon %d did not use the ring between hosts: %s" % (r, found[-1:])


def report(case, victims, step, t0, hosts):
    print("replica %s%s: %s %s killed after step %d, job resumed at step %d, final "
          "parameters bit-identical to the reference run (%.1f s)"
          % (case, "" if hosts is None else " (a host per rank)",
             "host(s)" if case == "node" or case == "world2" and hosts else "daemon(s)", victims,
             KILL_AFTER, step,
             time.monotonic() - t0))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
