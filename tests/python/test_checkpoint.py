#!/usr/bin/env python3
"""Checkpoints through engine.save_checkpoint / load_checkpoint (docs/checkpoints.md), on real
daemons.

    test_checkpoint.py resume --world N --stage S
        train 10 steps, save, train 10 more; a fresh job that loads the checkpoint and trains
        10 steps ends with bit-identical parameters; client_state, the lr scheduler and the
        step counters come back too.
    test_checkpoint.py reshard
        save at world 2, load at worlds 3, 1 and 4: the master, exp_avg and exp_avg_sq of
        every parameter (exported with `zeroctl export`) equal the saved ones exactly, and the
        next 5 steps match a continuous world-2 run within 1e-6 relative.
    test_checkpoint.py bad
        a flipped byte, a missing rank file, a manifest of a newer format, a directory without
        permission, and a full disk (RLIMIT_FSIZE) each give an error naming the file and the
        fault; training goes on and the previous checkpoint still loads.
    test_checkpoint.py latest_bad
        world 2, checkpoint_dir with checkpoints at steps 5, 10, 15, then damaged (latest's
        manifest not JSON or deleted, latest naming a missing tag or a broken directory, a
        corrupt rank file, latest deleted) and every daemon restarted: the job resumes from the
        newest checkpoint that verifies, the trainer and the daemon's log warn naming the file;
        with no checkpoint that verifies the attach fails on both ranks naming it. No resume
        starts over and the daemons' saves never move latest back.
    test_checkpoint.py dirs
        world 2, each rank saving into its own directory (tempfile.mkdtemp()), or into one
        holding a leftover temporary directory of rank 0's name: every rank fails within
        seconds, naming the rank and the directories; a save into one directory then works.
    test_checkpoint.py tags
        world 2, a tag per rank (the tutorial's loss): every rank fails at once naming both
        tags, under checkpoint.tag_validation Warn, Fail and Ignore.
    test_checkpoint.py sync
        world 2: save_checkpoint returns with DIR/latest naming the committed checkpoint
        (export reads it at once); checkpoint.writer.decoupled returns before, and
        wait_checkpoint() returns the committed path.
    test_checkpoint.py consolidate
        a model with tied weights, buffers and a frozen parameter: a strict load_state_dict()
        of get_fp32_state_dict_from_zero_checkpoint(), of
        convert_zero_checkpoint_to_fp32_state_dict()'s file and of `zeroctl export`'s gives
        the trained module's state.

The data of a step is one global batch of 12 rows, a function of the step; rank r of W takes
rows [12r/W, 12(r+1)/W), so every world size trains on the same data.
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time

import zd_fixture as zf

torch = zf.require_torch()
import zd_ref as zr  # noqa: E402

GLOBAL = 12


def global_batch(step, world, rank):
    g = torch.Generator().manual_seed(1000003 * step + 17)
    x = torch.randn(GLOBAL, zr.IN, generator=g)
    t = torch.sin(x[:, :zr.OUT] * 1.5) + 0.1 * x[:, zr.OUT:2 * zr.OUT]
    n = GLOBAL // world
    return x[rank * n:(rank + 1) * n], t[rank * n:(rank + 1) * n]


def engine_for(stage):
    import zerod.torch
    model = zr.MLP(1)
    engine, opt, _, _ = zerod.torch.initialize(
        model=model, model_parameters=zr.param_groups(model),
        config=zr.config(stage=stage, bucket=700),
        lr_scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + 0.05 * s)))
    return model, engine


def train(engine, steps):
    for _ in range(steps):
        x, t = global_batch(engine.global_steps, engine.world_size, engine.rank)
        engine.backward(zr.loss_fn(engine(x), t))
        engine.step()  # steps engine.lr_scheduler too, as DeepSpeed's does


def rank_save_and_continue(stage, ckpt, save_at, more):
    model, engine = engine_for(stage)
    train(engine, save_at)
    engine.save_checkpoint(ckpt, client_state={"epoch": 3, "rank": engine.rank})
    train(engine, more)
    out = zr.params_of(model)
    engine.close()
    return out


def rank_load_and_train(stage, ckpt, steps, tag=None):
    model, engine = engine_for(stage)
    path, client = engine.load_checkpoint(ckpt, tag)
    info = (path, client, engine.global_steps, engine.lr_scheduler.last_epoch,
            engine.optimizer.param_groups[0]["lr"])
    after_load = zr.params_of(model)
    if steps == 0:
        engine.save_checkpoint(ckpt, tag="resaved_w%d" % engine.world_size)
    train(engine, steps)
    out = zr.params_of(model)
    engine.close()
    return info, after_load, out


def zeroctl():
    return os.path.join(os.path.dirname(zf.zerod_bin()), "..", "client", "zeroctl")


def export(ckpt, state, out, tag=None):
    cmd = [zeroctl(), "checkpoint", "export", ckpt, "--state", state, "-o", out]
    if tag:
        cmd += ["--tag", tag]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return read_safetensors(out)


def read_safetensors(path):
    """A minimal reader (no safetensors package needed): {name: fp32 tensor} (bf16 widened)."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        assert t["dtype"] in ("F32", "BF16"), t
        raw = bytearray(data[8 + n + a:8 + n + b])
        dt = torch.float32 if t["dtype"] == "F32" else torch.bfloat16
        out[name] = torch.frombuffer(raw, dtype=dt).reshape(t["shape"]).float().clone()
    return out


def resume(world, stage):
    zf.require_world(world)
    with zf.Cluster(world) as c:
        ckpt = os.path.join(c.tmp, "ckpt")
        straight = c.run(rank_save_and_continue, (stage, ckpt, 10, 10), job="straight")
        loaded = c.run(rank_load_and_train, (stage, ckpt, 10), job="loaded")
        assert os.path.exists(os.path.join(ckpt, "latest"))
        with open(os.path.join(ckpt, "latest")) as f:
            assert f.read().strip() == "global_step10"
        for r in range(world):
            (path, client, gsteps, last_epoch, lr), _, final = loaded[r]
            assert path.endswith("/global_step10"), path
            assert client == {"epoch": 3, "rank": 0}, client  # rank 0's client_state
            assert gsteps == 10 and last_epoch == 10, (gsteps, last_epoch)
            assert abs(lr - zr.GROUPS[0]["lr"] / 1.5) < 1e-12, lr
            for i, (a, b) in enumerate(zip(straight[r], final)):
                assert torch.equal(a, b), ("rank %d param %d: loaded run differs from the "
                                           "continuous one (max %g)"
                                           % (r, i, (a - b).abs().max().item()))
        rc = subprocess.run([zeroctl(), "checkpoint", "verify", ckpt], capture_output=True,
                            text=True)
        assert rc.returncode == 0, rc.stderr
        print(rc.stdout.strip())
    print("resume world %d stage %d: save at 10, load, 10 more steps: bit-identical to the "
          "continuous run" % (world, stage))


def reshard():
    zf.require_world(4)
    tmp = None
    with zf.Cluster(2) as c:
        tmp = c.tmp
        ckpt = os.path.join(c.tmp, "ckpt")
        straight = c.run(rank_save_and_continue, (2, ckpt, 10, 5), job="w2")
        saved = {s: export(ckpt, s, os.path.join(c.tmp, "saved_%s.st" % s))
                 for s in ("master", "exp_avg", "exp_avg_sq")}
        keep = os.path.join(os.path.dirname(c.tmp), os.path.basename(c.tmp) + "-ckpt")
        shutil.copytree(ckpt, keep)
    try:
        for world in (3, 1, 4):
            with zf.Cluster(world) as c:
                res = c.run(rank_load_and_train, (2, keep, 0, "global_step10"), job="w%d" % world)
                tag = "resaved_w%d" % world
                for s in ("master", "exp_avg", "exp_avg_sq"):
                    got = export(keep, s, os.path.join(c.tmp, "%s.st" % s), tag=tag)
                    assert got.keys() == saved[s].keys()
                    for name, v in saved[s].items():
                        assert torch.equal(v, got[name]), (
                            "world %d: %s of %s differs after the reshard" % (world, s, name))
                cont = c.run(rank_load_and_train, (2, keep, 5, "global_step10"),
                             job="c%d" % world)
                diff = zr.max_rel_diff(straight[0], cont[0][2])
                assert diff < 1e-6, "world %d: 5 steps after the load differ by %g" % (world, diff)
                print("reshard 2 -> %d: master, exp_avg, exp_avg_sq exact; 5 more steps within "
                      "%.2g of the continuous world-2 run" % (world, diff))
    finally:
        shutil.rmtree(keep, ignore_errors=True)
        del tmp


def expect_fail(engine, fn, *words):
    try:
        fn()
    except zf_error() as e:
        msg = str(e)
        for w in words:
            assert w in msg, "error %r does not name %r" % (msg, w)
        return msg
    raise AssertionError("no error; expected one naming %s" % (words,))


def zf_error():
    from zerod.torch import ZerodError
    return ZerodError


def bad_media(ckpt):
    model, engine = engine_for(2)
    train(engine, 3)
    engine.save_checkpoint(ckpt)  # global_step3: the good one
    good = os.path.join(ckpt, "global_step3")
    train(engine, 1)
    engine.save_checkpoint(ckpt, tag="victim")
    assert engine.wait_checkpoint() == os.path.join(ckpt, "victim")
    victim = os.path.join(ckpt, "victim")
    msgs = []
    rank_file = os.path.join(victim, "rank_00000.safetensors")
    with open(rank_file, "r+b") as f:  # a flipped byte
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0x10]))
    msgs.append(expect_fail(engine, lambda: engine.load_checkpoint(ckpt, "victim"),
                            "rank_00000.safetensors", "corrupt"))
    os.unlink(rank_file)  # a missing rank file
    msgs.append(expect_fail(engine, lambda: engine.load_checkpoint(ckpt, "victim"),
                            "rank_00000.safetensors"))
    man = os.path.join(victim, "manifest.json")
    with open(man) as f:
        m = json.load(f)
    m["format_version"] = 99
    with open(man, "w") as f:
        json.dump(m, f)
    msgs.append(expect_fail(engine, lambda: engine.load_checkpoint(ckpt, "victim"),
                            "format_version 99", "newer"))
    if os.geteuid() != 0:
        locked = os.path.join(os.path.dirname(ckpt), "locked")
        os.mkdir(locked, 0o500)
        msgs.append(expect_fail(engine, lambda: engine.save_checkpoint(
            os.path.join(locked, "sub")), "locked", "Permission denied"))
    else:  # root passes permission bits: a directory no one may create stands in for it
        print("as root, a directory without permission does not stop the daemon: a directory "
              "under /proc (which no one may create) stands in for it")
        msgs.append(expect_fail(engine, lambda: engine.save_checkpoint("/proc/zerod-ckpt"),
                                "/proc/zerod-ckpt"))
    train(engine, 1)  # training goes on
    path, _ = engine.load_checkpoint(ckpt, "global_step3")  # the good one still loads
    assert path == good, path
    assert engine.global_steps == 3
    engine.close()
    return msgs


def full_disk(ckpt, prlimit, pid):
    """The daemon's file writes stop at RLIMIT_FSIZE (prlimit on the daemon, 4 KiB: less than a
    shard file), as on a full disk: EFBIG, the daemon lives on (it ignores SIGXFSZ)."""
    model, engine = engine_for(2)
    train(engine, 2)
    engine.save_checkpoint(ckpt, tag="before")
    engine.wait_checkpoint()
    subprocess.run([prlimit, "--pid", str(pid), "--fsize=4096:"], check=True)
    try:
        def save_and_wait():
            engine.save_checkpoint(ckpt, tag="toobig")
            engine.wait_checkpoint()
        msg = expect_fail(engine, save_and_wait, "toobig", "File too large")
    finally:
        subprocess.run([prlimit, "--pid", str(pid), "--fsize=unlimited:"], check=True)
    train(engine, 1)
    engine.load_checkpoint(ckpt, "before")
    assert engine.global_steps == 2
    engine.close()
    return msg


def bad():
    with zf.Cluster(1, allowed_errors=r".") as c:
        ckpt = os.path.join(c.tmp, "ckpt")
        for m in c.run(bad_media, (ckpt,))[0]:
            print("error as expected: %s" % m)
        assert sorted(os.listdir(ckpt)) == ["global_step3", "latest", "victim"], \
            os.listdir(ckpt)
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            print("SKIP part: no prlimit (util-linux) to limit the daemon's file size")
        else:
            ckpt2 = os.path.join(c.tmp, "ckpt2")
            msg = c.run(full_disk, (ckpt2, prlimit, c.daemons[0].proc.pid))[0]
            print("full disk as expected: %s" % msg)
            assert sorted(os.listdir(ckpt2)) == ["before", "latest"], os.listdir(ckpt2)
    print("bad media: every fault named, training went on, the good checkpoint loaded")


def torn_load(ckpt, log_path):
    """A rank file that goes bad after the daemon verified it and before it read it (truncated
    while the daemon pauses there, ZEROD_TEST_PAUSE=ckptread): the load fails naming the file,
    and the job is as it was: a checkpoint saved after the failed load holds the bytes of one
    saved before it, and training goes on."""
    model, engine = engine_for(2)
    train(engine, 3)
    engine.save_checkpoint(ckpt, tag="old")
    engine.wait_checkpoint()
    train(engine, 2)
    engine.save_checkpoint(ckpt, tag="before")
    engine.wait_checkpoint()
    victim = os.path.join(ckpt, "old", "rank_00000.safetensors")

    def tear():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(log_path, errors="replace") as f:
                if "ZEROD_TEST_PAUSE: ckptread" in f.read():
                    os.truncate(victim, os.path.getsize(victim) // 2)
                    return
            time.sleep(0.02)

    t = threading.Thread(target=tear)
    t.start()
    msg = expect_fail(engine, lambda: engine.load_checkpoint(ckpt, "old"),
                      "rank_00000.safetensors")
    t.join()
    assert engine.global_steps == 5, engine.global_steps
    engine.save_checkpoint(ckpt, tag="after")
    engine.wait_checkpoint()
    for name in ("rank_00000.safetensors",):
        with open(os.path.join(ckpt, "before", name), "rb") as a, \
                open(os.path.join(ckpt, "after", name), "rb") as b:
            assert a.read() == b.read(), "the failed load changed the job's %s" % name
    train(engine, 1)
    engine.close()
    return msg


def torn():
    with zf.Cluster(1, allowed_errors=r".", env={"ZEROD_TEST_PAUSE": "ckptread:1500"}) as c:
        ckpt = os.path.join(c.tmp, "ckpt")
        msg = c.run(torn_load, (ckpt, c.daemons[0].log_path))[0]
        print("error as expected: %s" % msg)
    print("a file torn between verifying and reading: the load failed, the job kept its state")


def rank_train_to(stage, steps, end_job):
    model, engine = engine_for(stage)
    start = engine.global_steps
    for _ in range(start):  # the daemons' checkpoints hold no trainer state: fast-forward
        engine.lr_scheduler.step()
    while engine.global_steps < steps:
        train(engine, 1)
    out = zr.params_of(model)
    engine.close(end_job=end_job)
    return start, out


def restart():
    """kill -9 every daemon of a world-2 job, start them again, re-attach: the job continues
    from the daemons' last automatic checkpoint (checkpoint_every_steps 5, keep_last 2)."""
    zf.require_world(2)
    with zf.Cluster(2) as probe:
        tmp = probe.tmp + "-auto"
    os.makedirs(tmp)
    flags = ("--job-linger", "60s", "--checkpoint-dir", tmp, "--checkpoint-every-steps", "5",
             "--checkpoint-keep-last", "2")
    try:
        with zf.Cluster(2, flags=flags) as c:
            straight = c.run(rank_train_to, (2, 20, True), job="straight")
            first = c.run(rank_train_to, (2, 12, False), job="restarted")
            assert [s for s, _ in first] == [0, 0], first  # the other job's checkpoints: no
            for d in c.daemons:
                d.proc.kill()
                d.proc.wait()
                d.proc = None
                d.start()
            again = c.run(rank_train_to, (2, 20, True), job="restarted")
            for r in range(2):
                assert again[r][0] == 10, "rank %d resumed at step %d, not 10" % (r, again[r][0])
                for i, (a, b) in enumerate(zip(straight[r][1], again[r][1])):
                    assert torch.equal(a, b), "rank %d param %d differs" % (r, i)
        for job in ("straight", "restarted"):
            tags = sorted(os.listdir(os.path.join(tmp, job)))
            assert tags == ["global_step15", "global_step20", "latest"], (job, tags)
        print("checkpoint_dir/<job>: global_step15, global_step20 and latest (keep_last 2)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("restart: both daemons killed at step 12, restarted; the job resumed at step 10 and "
          "finished bit-identical to the uninterrupted run")


def rank_resume_to(steps):
    """Attach (the daemons may resume the job), train to `steps`: (start step, the zerod
    warnings initialize() gave), or (None, the error) when the attach failed."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _, engine = engine_for(2)
        except zf_error() as e:
            return None, str(e)
    notes = [str(w.message) for w in caught if str(w.message).startswith("zerod:")]
    start = engine.global_steps
    while engine.global_steps < steps:
        train(engine, 1)
    engine.close(end_job=True)
    return start, notes


def read_latest(jdir):
    with open(os.path.join(jdir, "latest")) as f:
        return f.read().strip()


def restart_daemons(c):
    for d in c.daemons:
        if d.proc is not None:
            d.proc.kill()
            d.proc.wait()
            d.proc = None
        d.start()


def latest_bad_case(c, jdir, pristine, name, damage, steps):
    """The job's checkpoints as they were, damaged; every daemon restarted; the job attached
    again and trained to `steps`. Returns every rank's (start, notes) and both daemons' logs."""
    shutil.rmtree(jdir)
    shutil.copytree(pristine, jdir)
    damage(jdir)
    restart_daemons(c)
    res = c.run(rank_resume_to, (steps,), job="lb")
    assert res[0][0] == res[1][0], (name, res)  # the ranks agree
    return res, [d.log() for d in c.daemons]


def latest_bad():
    """checkpoint_dir/<job>/latest that cannot be used: the job resumes from the newest
    checkpoint that verifies, with a warning in the daemon's log and at the trainer, or fails
    on every rank naming the file; it never starts over, and `latest` never moves back."""
    zf.require_world(2)
    with zf.Cluster(2) as probe:
        tmp = probe.tmp + "-auto"
    os.makedirs(tmp)
    flags = ("--job-linger", "60s", "--checkpoint-dir", tmp, "--checkpoint-every-steps", "5")
    jdir, pristine = os.path.join(tmp, "lb"), os.path.join(tmp, "pristine")
    g15 = os.path.join(jdir, "global_step15")

    def write(path, text):
        with open(path, "w") as f:
            f.write(text)

    def flip(path):
        with open(path, "r+b") as f:
            f.seek(-5, os.SEEK_END)
            b = f.read(1)
            f.seek(-5, os.SEEK_END)
            f.write(bytes([b[0] ^ 0xFF]))

    def gone99(j):  # latest names a checkpoint directory whose manifest is gone
        shutil.copytree(os.path.join(j, "global_step15"), os.path.join(j, "global_step99"))
        os.remove(os.path.join(j, "global_step99", "manifest.json"))
        write(os.path.join(j, "latest"), "global_step99\n")

    def no_manifests(j):
        for t in ("global_step5", "global_step10", "global_step15"):
            os.remove(os.path.join(j, t, "manifest.json"))

    # (name, damage, start step, words of the warning; None: the resume fails with them)
    cases = [
        ("manifest not JSON", lambda j: write(os.path.join(g15, "manifest.json"), "{not json"),
         10, ["latest", "global_step15/manifest.json", "global_step10 (step 10)"]),
        ("manifest deleted", lambda j: os.remove(os.path.join(g15, "manifest.json")),
         10, ["global_step15/manifest.json", "global_step10"]),
        ("latest names a missing tag", lambda j: write(os.path.join(j, "latest"), "global_step7\n"),
         15, ["names 'global_step7', which is not there", "global_step15 (step 15)"]),
        ("rank file corrupt", lambda j: flip(os.path.join(g15, "rank_00001.safetensors")),
         10, ["did not load", "rank_00001.safetensors", "global_step10"]),
        ("latest deleted", lambda j: os.remove(os.path.join(j, "latest")),
         15, ["latest does not exist", "global_step15"]),
        ("latest's directory broken", gone99, 15, ["global_step99", "global_step15 (step 15)"]),
        ("nothing verifies", no_manifests, None, ["latest", "global_step15/manifest.json"]),
    ]
    gone = r"'lb' aborted: .*trainer disconnected"  # a trainer whose attach failed leaves
    try:
        with zf.Cluster(2, flags=flags, allowed_errors=gone) as c:
            res = c.run(rank_resume_to, (17,), job="lb")
            assert [r[0] for r in res] == [0, 0], res
            shutil.copytree(jdir, pristine)
            assert read_latest(jdir) == "global_step15"
            for name, damage, start, words in cases:
                t0 = time.monotonic()
                res, logs = latest_bad_case(c, jdir, pristine, name, damage, 20)
                for r, (got, notes) in enumerate(res):
                    if start is None:
                        assert got is None, "%s: rank %d started at step %s" % (name, r, got)
                        text = notes
                    else:
                        assert got == start, "%s: rank %d resumed at step %s, not %d (%s)" % (
                            name, r, got, start, notes)
                        assert len(notes) == 1, (name, notes)
                        text = notes[0]
                    for w in words:
                        assert w in text, "%s: rank %d: %r does not say %r" % (name, r, text, w)
                    warned = [ln for ln in logs[r].splitlines() if " WARN " in ln and
                              all(w in ln for w in words)]
                    assert warned, "%s: daemon %d logged no WARN saying %s:\n%s" % (
                        name, r, words, logs[r])
                latest = read_latest(jdir)
                if name == "latest's directory broken":
                    assert latest == "global_step99", (name, latest)  # never back to 20
                elif start is None:
                    assert latest == "global_step15", (name, latest)
                else:
                    assert latest == "global_step20", (name, latest)
                print("%s: %s in %.1f s; latest = %s" % (
                    name, "failed on both ranks" if start is None else
                    "resumed at step %d on both ranks" % start, time.monotonic() - t0, latest))
                print("  trainer: %s" % (text if start is None else notes[0]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("latest_bad: every damaged latest resumed from the newest checkpoint that verifies "
          "(or failed naming the file); no resume started over, latest never moved back")


CRASH_CHILD = """
import sys, zd_ref as zr, test_checkpoint as tc
model, engine = tc.engine_for(2)
tc.train(engine, 2)
engine.save_checkpoint(sys.argv[1], tag="good" + sys.argv[2])
engine.wait_checkpoint()
tc.train(engine, 1)
print("SAVING", flush=True)
engine.save_checkpoint(sys.argv[1], tag="next" + sys.argv[2])
print("SAVED", flush=True)
engine.close()
"""


def crash_trial(c, ckpt, trial, rng):
    """Trainers save 'good<trial>', then 'next<trial>'; a daemon or a trainer is killed at a
    random moment of the second save (ZEROD_TEST_PAUSE makes each of its stages last 40 ms).
    Every daemon is then restarted. The previous checkpoint must verify, and `latest` must
    name a checkpoint that verifies."""
    import random  # noqa: F401 (rng is a random.Random)
    import time
    env = dict(os.environ)
    procs = []
    for r in range(2):
        env.update(c.env(r, "crash%d" % trial))
        procs.append(subprocess.Popen([sys.executable, "-c", CRASH_CHILD, ckpt, str(trial)],
                                      env=dict(env), stdout=subprocess.PIPE, text=True,
                                      stderr=subprocess.DEVNULL))
    for line in procs[0].stdout:
        if line.strip() == "SAVING":
            break
    time.sleep(rng.uniform(0.0, 0.35))
    victim = rng.choice(["daemon0", "daemon1", "trainer0", "trainer1"])
    if victim.startswith("daemon"):
        c.daemons[int(victim[-1])].proc.kill()
    else:
        procs[int(victim[-1])].kill()
    time.sleep(0.3)
    for p in procs:  # the job is gone: its launcher ends every rank
        p.kill()
        p.wait()
        p.stdout.close()
    for d in c.daemons:
        if d.proc is not None:
            d.proc.kill()
            d.proc.wait()
            d.proc = None
        d.start()
    good = os.path.join(ckpt, "good%d" % trial)
    rc = subprocess.run([zeroctl(), "checkpoint", "verify", good], capture_output=True, text=True)
    assert rc.returncode == 0, "trial %d (%s): %s" % (trial, victim, rc.stderr)
    rc = subprocess.run([zeroctl(), "checkpoint", "verify", ckpt], capture_output=True, text=True)
    assert rc.returncode == 0, "trial %d (%s): latest: %s" % (trial, victim, rc.stderr)
    with open(os.path.join(ckpt, "latest")) as f:
        latest = f.read().strip()
    assert latest in ("good%d" % trial, "next%d" % trial), latest
    return victim, latest


def crash(trials):
    import random
    rng = random.Random(int(os.environ.get("ZD_CRASH_SEED", "0")) or None)
    zf.require_world(2)
    allowed = r"."  # killed peers and trainers are logged as errors
    with zf.Cluster(2, flags=("--job-linger", "1s", "--heartbeat-timeout", "1s",
                              "--heartbeat-interval", "200ms"),
                    allowed_errors=allowed, env={"ZEROD_TEST_PAUSE": "ckpt:80"}) as c:
        ckpt = os.path.join(c.tmp, "ckpt")
        for t in range(trials):
            victim, latest = crash_trial(c, ckpt, t, rng)
            left = [n for n in os.listdir(ckpt) if n.startswith(".zerod-")]
            print("trial %d: killed %s during a save; latest = %s, verified; leftovers %s"
                  % (t, victim, latest, left or "none"))
        # the last latest loads into a fresh job
        res = c.run(rank_load_and_train, (2, ckpt, 1), job="after")
        print("loaded %s at step %d after the crashes" % (res[0][0][0], res[0][0][2]))
    print("crash: %d trials, the previous checkpoint always verified and latest never named a "
          "half-written one" % trials)


def rank_export(sock, tmp):
    """zeroctl export of the live job (fp32: the master exactly) and of a checkpoint (bf16)."""
    model, engine = engine_for(2)
    train(engine, 3)
    live = os.path.join(tmp, "live.safetensors")
    rc = subprocess.run([zeroctl(), "-s", sock, "export", live], capture_output=True, text=True)
    assert rc.returncode == 0, rc.stderr
    got = read_safetensors(live)
    for name, p in model.named_parameters():
        assert torch.equal(got[name], p.detach()), "live export: %s differs" % name
    rc = subprocess.run([zeroctl(), "-s", sock, "export", live], capture_output=True, text=True)
    assert rc.returncode == 1 and "already exists" in rc.stderr, rc.stderr
    ckpt = os.path.join(tmp, "ckpt")
    engine.save_checkpoint(ckpt)
    engine.wait_checkpoint()
    out = os.path.join(tmp, "bf16.safetensors")
    rc = subprocess.run([zeroctl(), "export", "--checkpoint", ckpt, "--dtype", "bf16", out],
                        capture_output=True, text=True)
    assert rc.returncode == 0, rc.stderr
    got = read_safetensors(out)
    for name, p in model.named_parameters():
        want = p.detach().to(torch.bfloat16).float()
        assert torch.equal(got[name], want), "bf16 export: %s differs" % name
    m2 = zr.MLP(7)  # load_state_dict with the exported names and shapes
    m2.load_state_dict(read_safetensors(live))
    engine.close()
    return rc.stdout.strip()


def export_mode():
    with zf.Cluster(1) as c:
        print(c.run(rank_export, (c.daemons[0].socket, c.tmp))[0])
    print("export: a live job's parameters exactly (fp32), a checkpoint's in bf16 (rounded to "
          "nearest even), state_dict names and shapes; an existing file is never replaced")


FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def rank_load_ds(out):
    import zerod.torch
    model = zr.MLP(1)
    engine, _, _, _ = zerod.torch.initialize(
        model=model, model_parameters=zr.param_groups(model),
        config=zr.config(stage=2, bucket=700))
    path, client = engine.load_checkpoint(out)
    loaded = {n: p.detach().clone() for n, p in model.named_parameters()}
    step = engine.global_steps
    while engine.global_steps < 5:
        x, t = global_batch(engine.global_steps, engine.world_size, engine.rank)
        engine.backward(zr.loss_fn(engine(x), t))
        engine.step()
    out = zr.params_of(model)
    engine.close()
    return step, loaded, out


def import_ds():
    """A real DeepSpeed 0.19.8 ZeRO-2 checkpoint (world 2, made by
    fixtures/make_ds_checkpoint.py) through python -m zerod.import_deepspeed: zerod loads it
    at world 2 and 1, holds DeepSpeed's weights exactly, and 2 more steps match DeepSpeed's 2
    more steps within 1e-6 relative."""
    src = os.path.join(FIXTURES, "ds_zero2_ckpt")
    want = torch.load(os.path.join(FIXTURES, "ds_zero2_after5.pt"))
    module = torch.load(os.path.join(src, "global_step3", "mp_rank_00_model_states.pt"))["module"]
    for world in (2, 1):
        zf.require_world(world)
        with zf.Cluster(world) as c:
            out = os.path.join(c.tmp, "imported")
            env = dict(os.environ, ZEROD_ZEROCTL=zeroctl())
            rc = subprocess.run([sys.executable, "-m", "zerod.import_deepspeed", src, out],
                                env=env, capture_output=True, text=True)
            assert rc.returncode == 0, rc.stderr
            print(rc.stdout.strip())
            res = c.run(rank_load_ds, (out,), job="ds%d" % world)
            step, loaded, final = res[0]
            assert step == 3, step
            for name, v in module.items():
                assert torch.equal(loaded[name], v.float()), "%s differs from DeepSpeed's" % name
            diff = zr.max_rel_diff(want, final)
            assert diff < 1e-6, "world %d: 2 steps after the import differ by %g" % (world, diff)
            print("import at world %d: DeepSpeed's weights exact; steps 4-5 within %.2g of "
                  "DeepSpeed's" % (world, diff))
    print("import: a real DeepSpeed ZeRO-2 checkpoint continues in zerod")


# ---- where and under which tag the ranks save ------------------------------------------------

def save_outcome(engine, save_dir, tag=None):
    """(seconds, None) when the save worked, else (seconds, its message)."""
    t0 = time.monotonic()
    try:
        engine.save_checkpoint(save_dir, tag=tag)
        return time.monotonic() - t0, None
    except zf_error() as e:
        return time.monotonic() - t0, str(e)


def rank_dirs(shared):
    import tempfile
    model, engine = engine_for(2)
    train(engine, 2)
    own = tempfile.mkdtemp(prefix="zd-ckpt-rank%d-" % engine.rank)
    outcomes = [(own,) + save_outcome(engine, own)]
    # a directory of its own that holds a temporary directory of the name rank 0 makes (a
    # node-local disk at the same path where an earlier save of rank 0's died)
    stale = os.path.join(shared, "stale%d" % engine.rank)
    os.makedirs(os.path.join(stale, ".zerod-tmp-global_step2"))
    outcomes.append((stale,) + save_outcome(engine, stale))
    train(engine, 1)
    outcomes.append((shared,) + save_outcome(engine, os.path.join(shared, "one")))
    engine.close()
    shutil.rmtree(own, ignore_errors=True)
    return outcomes


def dirs_mode():
    # rank 0's writer logs the failed commit of the save beside a leftover
    with zf.Cluster(2, allowed_errors=r"rank 1's file rank_00001.safetensors .* is not in") as c:
        t0 = time.monotonic()
        res = c.run(rank_dirs, (c.tmp,), timeout=50)
        for r in range(2):
            own0, own1 = res[0][0][0], res[1][0][0]
            secs, msg = res[r][0][1:]
            assert msg is not None, "rank %d: a save into per-rank directories worked" % r
            for w in ("rank 1", own0, own1, "one directory"):
                assert w in msg, "rank %d: %r does not name %r" % (r, msg, w)
            assert secs < 10, "rank %d failed after %.1f s" % (r, secs)
            secs, msg = res[r][1][1:]
            assert msg is not None and "rank 1's file rank_00001.safetensors" in msg, (r, msg)
            assert secs < 10, "rank %d failed after %.1f s" % (r, secs)
            assert res[r][2][2] is None, "rank %d: the shared save failed: %s" % (r, res[r][2][2])
        print("per-rank directories: both ranks fail in %.2f s: %s" % (res[1][0][1], res[0][0][2]))
        print("leftover temporary directory: %s" % res[0][1][2])
        for stale in ("stale0", "stale1"):
            assert not os.path.exists(os.path.join(c.tmp, stale, "latest")), stale
        with open(os.path.join(c.tmp, "one", "latest")) as f:
            assert f.read().strip() == "global_step3"
        print("dirs: %.1f s in all" % (time.monotonic() - t0))


def rank_tags(mode):
    import zerod.torch
    model = zr.MLP(1)
    cfg = zr.config(stage=2, bucket=700)
    if mode is not None:
        cfg["checkpoint"] = {"tag_validation": mode}
    engine, _, _, _ = zerod.torch.initialize(model=model, model_parameters=zr.param_groups(model),
                                             config=cfg)
    train(engine, 1)
    x, t = global_batch(engine.global_steps, engine.world_size, engine.rank)
    loss = zr.loss_fn(engine(x), t)  # the getting-started tutorial's ckpt_id = loss.item()
    save_dir = os.path.join(os.environ["ZD_TEST_TMP"], "tags")
    out = save_outcome(engine, save_dir, tag=loss.item())
    engine.close()
    return loss.item(), out


def tags_mode():
    with zf.Cluster(2) as c:
        os.environ["ZD_TEST_TMP"] = c.tmp
        for mode in (None, "Fail", "Ignore"):
            res = c.run(rank_tags, (mode,), job="tags%s" % mode, timeout=50)
            for r in range(2):
                secs, msg = res[r][1]
                assert msg is not None, "rank %d saved under a tag of its own" % r
                for w in ("rank 0 '%s'" % res[0][0], "rank 1 '%s'" % res[1][0], "one tag"):
                    assert w in msg, "rank %d: %r does not name %r" % (r, msg, w)
                assert secs < 5, "rank %d failed after %.1f s" % (r, secs)
            assert not os.path.exists(os.path.join(c.tmp, "tags", "latest"))
            print("tag_validation %s: both ranks fail in %.2f s: %s" % (mode, res[0][1][0],
                                                                        res[0][1][1]))


def rank_sync(save_dir):
    import zerod.torch
    out = []
    for decoupled in (False, True):
        model = zr.MLP(1)
        cfg = zr.config(stage=2, bucket=700,
                        extra={"checkpoint": {"writer": {"decoupled": decoupled}}})
        engine, _, _, _ = zerod.torch.initialize(
            model=model, model_parameters=zr.param_groups(model), config=cfg,
            job="sync%d" % decoupled)
        train(engine, 2 + decoupled)
        engine.save_checkpoint(save_dir)
        if engine.rank == 0:  # at once, as an export or an upload would
            with open(os.path.join(save_dir, "latest")) as f:
                latest = f.read().strip()
        else:
            latest = None
        waited = engine.wait_checkpoint()
        out.append((latest, waited))
        engine.close()
    return out


def sync_mode():
    with zf.Cluster(2) as c:
        ckpt = os.path.join(c.tmp, "ckpt")
        res = c.run(rank_sync, (ckpt,), timeout=50)
        (latest, waited), (latest_d, waited_d) = res[0]
        assert latest == "global_step2", "latest right after save_checkpoint: %r" % latest
        assert waited == os.path.join(ckpt, "global_step2"), waited
        sd = export(ckpt, "master", os.path.join(c.tmp, "m.safetensors"))
        assert len(sd) == len(list(zr.MLP(1).parameters())), sorted(sd)
        # decoupled: written in the background; wait_checkpoint() names it once committed
        assert latest_d in ("global_step2", "global_step3"), latest_d
        assert waited_d == os.path.join(ckpt, "global_step3"), waited_d
        for r in range(2):
            assert res[r][1][1] == waited_d, res[r]
        with open(os.path.join(ckpt, "latest")) as f:
            assert f.read().strip() == "global_step3"
        print("sync: latest names global_step2 as save_checkpoint returns; decoupled: "
              "wait_checkpoint() -> %s" % waited_d)


class TiedNet(torch.nn.Module):
    """GPT-2's shape in small: the output layer is the embedding (tied), a BatchNorm's running
    statistics and a persistent mask are buffers, a frozen parameter is not trained."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.wte = torch.nn.Embedding(16, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.mid = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.wte.weight
        self.register_buffer("mask", torch.tril(torch.ones(4, 4)))
        self.scale = torch.nn.Parameter(torch.full((8,), 0.5), requires_grad=False)

    def forward(self, ids):
        h = self.norm(self.wte(ids)) * self.scale
        return self.head(torch.tanh(self.mid(h)))


def rank_consolidate(ckpt):
    import zerod.torch
    model = TiedNet()
    cfg = zr.config(stage=2, bucket=700)
    engine, _, _, _ = zerod.torch.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=cfg)
    for step in range(4):
        ids = torch.arange(12) % 16 if step % 2 else (torch.arange(12) * 5) % 16
        logits = engine(ids)
        engine.backward(torch.nn.functional.cross_entropy(logits, (ids + 1) % 16))
        engine.step()
    engine.save_checkpoint(ckpt)
    want = {k: v.detach().clone() for k, v in model.state_dict().items()}
    engine.close()
    return want


def consolidate_mode():
    from zerod._consolidate import (convert_zero_checkpoint_to_fp32_state_dict,
                                    get_fp32_state_dict_from_zero_checkpoint,
                                    load_state_dict_from_zero_checkpoint)
    with zf.Cluster(1) as c:
        ckpt = os.path.join(c.tmp, "ckpt")
        want = c.run(rank_consolidate, (ckpt,))[0]
        assert "head.weight" in want and "norm.running_mean" in want and "mask" in want, want
        sd = get_fp32_state_dict_from_zero_checkpoint(ckpt)
        assert sd["head.weight"] is sd["wte.weight"], "the tied names are not one tensor"
        fresh = TiedNet()
        fresh.load_state_dict(sd)  # strict
        for k, v in fresh.state_dict().items():
            assert torch.equal(v, want[k]), "%s differs from the trained module's" % k
        out = os.path.join(c.tmp, "fp32.bin")
        assert convert_zero_checkpoint_to_fp32_state_dict(ckpt, out) == out
        fresh = TiedNet()
        fresh.load_state_dict(torch.load(out))
        assert all(torch.equal(v, want[k]) for k, v in fresh.state_dict().items())
        fresh = load_state_dict_from_zero_checkpoint(TiedNet(), ckpt, tag="global_step4")
        assert all(torch.equal(v, want[k]) for k, v in fresh.state_dict().items())
        # zeroctl export: the tied name as a copy, buffers and the frozen parameter as fp32
        exported = export(ckpt, "master", os.path.join(c.tmp, "model.safetensors"))
        assert sorted(exported) == sorted(want), sorted(exported)
        fresh = TiedNet()
        fresh.load_state_dict(exported)  # strict
        for k, v in fresh.state_dict().items():
            assert torch.equal(v, want[k]), "zeroctl export: %s differs" % k
        # a moment is the trained parameters' only
        assert sorted(export(ckpt, "exp_avg", os.path.join(c.tmp, "m.safetensors"))) == \
            sorted(n for n, p in TiedNet().named_parameters() if p.requires_grad)
        print("consolidate: %d keys (tied head.weight, BatchNorm statistics, mask, frozen "
              "scale) load strictly, equal to the trained module's" % len(sd))


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "resume"
    if mode == "resume":
        stage = int(sys.argv[sys.argv.index("--stage") + 1]) if "--stage" in sys.argv else 2
        resume(zf.parse_world(sys.argv[2:]), stage)
    elif mode == "reshard":
        reshard()
    elif mode == "bad":
        bad()
    elif mode == "torn":
        torn()
    elif mode == "restart":
        restart()
    elif mode == "latest_bad":
        latest_bad()
    elif mode == "import":
        import_ds()
    elif mode == "export":
        export_mode()
    elif mode == "dirs":
        dirs_mode()
    elif mode == "tags":
        tags_mode()
    elif mode == "sync":
        sync_mode()
    elif mode == "consolidate":
        consolidate_mode()
    elif mode == "crash":
        if "--long" in sys.argv and os.environ.get("ZEROD_LONG_TESTS") != "1":
            zf.skip("the long crash test (20 trials, ~1 min) runs with ZEROD_LONG_TESTS=1")
        crash(int(sys.argv[sys.argv.index("--trials") + 1]) if "--trials" in sys.argv else 3)
    else:
        raise SystemExit("unknown mode %s" % mode)
    print("PASS")
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
