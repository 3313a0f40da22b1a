#!/usr/bin/env python3
"""Checkpoint save and load of an fp32 job at world 2 against the disk, measured in one run
(docs/checkpoints.md).

    ckpt_bench.py [--params 512Mi] [--runs 3] [--dir DIR]

Two daemons and two trainers (libzc through the zerod package: no torch needed) attach a job
of PARAMS fp32 parameters; each trainer writes its initial values and every rank saves, then
loads. Printed, as the median of RUNS:
  - save: bytes of both rank files / wall time of the save (slowest rank: from the call to
    every file written and committed), against the same bytes written by two concurrent writer
    processes with write + fsync (the disk's sequential write bandwidth for these file sizes);
    write: the same after the stall (the files' write and commit, while training could go on)
    -- target >= 0.8;
  - load: the same against two concurrent sequential readers, caches dropped for both sides
    (posix_fadvise DONTNEED after fsync) -- target >= 0.8;
  - stall: how long a trainer waits in save_checkpoint (the daemons' staging copy; the files
    are written after it returns) against a memcpy of its shard into memory already mapped --
    target <= 1.5.
The save's time runs until wait_checkpoint returns (every file written and committed).
The state of 1 B parameters (~20 GiB of daemon memory at world 2) fits a machine with 32 GiB;
the default 512 Mi fits this project's 24 GiB machines.
"""
import argparse
import ctypes
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))
import zd_fixture as zf  # noqa: E402

CHUNK = 64 << 20


def parse_count(s):
    mult = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10**3, "M": 10**6, "G": 10**9}
    for k in sorted(mult, key=len, reverse=True):
        if s.endswith(k):
            return int(float(s[:-len(k)]) * mult[k])
    return int(s)


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_write(path, nbytes, q):
    buf = bytearray(os.urandom(1 << 20)) * (CHUNK >> 20)
    t = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    left = nbytes
    while left > 0:
        left -= os.write(fd, memoryview(buf)[:min(left, CHUNK)])
    os.fsync(fd)
    os.close(fd)
    q.put(time.monotonic() - t)


def disk_read(path, q):
    t = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    while os.read(fd, CHUNK):
        pass
    os.close(fd)
    q.put(time.monotonic() - t)


def concurrent(target, argss):
    q = mp.Queue()
    ps = [mp.Process(target=target, args=a + (q,)) for a in argss]
    t = time.monotonic()
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    wall = time.monotonic() - t
    return max([q.get() for _ in ps] + [0.0]) or wall


def trainer(rank, env, params, runs, ckdir, conn):
    os.environ.update(env)
    from zerod._libzc import Session
    n_tensors = 64
    per = params // n_tensors
    s = Session(env["ZEROD_SOCKET"], timeout_ms=600000)
    s.attach(env["ZEROD_JOB"], [([per] * n_tensors, None)], '{"zero_optimization": {"stage": 2}}',
             rank=rank, world=2, coordinator="127.0.0.1:%d" % (int(env["MASTER_PORT"]) + 1))
    for pid in range(n_tensors):  # initial values: nonzero pages
        ctypes.memset(s.param_ptr(pid), 0x3c, per * 4)
    s.params_ready()
    shard_bytes = 3 * (params // 2) * 4
    src = ctypes.create_string_buffer(shard_bytes // 3)
    dst = ctypes.create_string_buffer(shard_bytes // 3)
    ctypes.memmove(dst, src, len(src))  # touch
    t = time.monotonic()
    for _ in range(3):
        ctypes.memmove(dst, src, len(src))
    memcpy_s = time.monotonic() - t  # three tensors' worth
    del src, dst
    out = {"memcpy_s": memcpy_s, "save_s": [], "stall_s": [], "load_s": []}
    for r in range(runs):
        conn.send(("ready", r))
        conn.recv()
        t = time.monotonic()
        s.checkpoint_save(ckdir, tag="bench", timeout_ms=3600000)
        out["stall_s"].append(time.monotonic() - t)  # the trainer goes on from here
        s.checkpoint_wait(timeout_ms=3600000)  # written and committed
        out["save_s"].append(time.monotonic() - t)
        conn.send(("saved", r))
        conn.recv()  # the parent evicted the files
        t = time.monotonic()
        s.checkpoint_load(ckdir, tag="bench", timeout_ms=3600000)
        out["load_s"].append(time.monotonic() - t)
    s.detach(True)
    s.close()
    conn.send(("done", out))


def run(args):
    flags = ("--job-linger", "10s", "--max-shard-bytes", "1PiB",
             "--checkpoint-staging-keep", "true" if args.keep else "false")
    with zf.Cluster(2, flags=flags) as c:
        ckdir = args.dir or os.path.join(c.tmp, "ckpt")
        os.makedirs(ckdir, exist_ok=True)
        pipes, procs = [], []
        for r in range(2):
            a, b = mp.Pipe()
            env = {k: v for k, v in c.env(r, "bench").items()}
            p = mp.Process(target=trainer, args=(r, env, args.params, args.runs, ckdir, b))
            p.start()
            pipes.append(a)
            procs.append(p)
        tag = os.path.join(ckdir, "bench")
        for r in range(args.runs):
            for a in pipes:
                assert a.recv()[0] == "ready"
            for a in pipes:
                a.send("go")
            for a in pipes:
                assert a.recv()[0] == "saved"
            for f in os.listdir(tag):
                evict(os.path.join(tag, f))
            for a in pipes:
                a.send("go")
        outs = [a.recv()[1] for a in pipes]
        for p in procs:
            p.join()
        files = [os.path.join(tag, f) for f in sorted(os.listdir(tag)) if f.startswith("rank_")]
        sizes = [os.path.getsize(f) for f in files]
        # the disk, with the same file sizes and concurrency
        raw = [os.path.join(ckdir, "raw%d" % i) for i in range(2)]
        w = [concurrent(disk_write, [(raw[i], sizes[i]) for i in range(2)])
             for _ in range(args.runs)]
        rd = []
        for _ in range(args.runs):
            for f in raw:
                evict(f)
            rd.append(concurrent(disk_read, [(f,) for f in raw]))
        for f in raw:
            os.unlink(f)
    total = sum(sizes)
    save = [max(o["save_s"][i] for o in outs) for i in range(args.runs)]
    load = [max(o["load_s"][i] for o in outs) for i in range(args.runs)]
    memcpy_s = max(o["memcpy_s"] for o in outs)
    gib = float(1 << 30)

    def line(name, secs, ref, target):
        m, rm = statistics.median(secs), statistics.median(ref)
        print("%-5s %7.3f s  %6.2f GiB/s   disk %7.3f s  %6.2f GiB/s   ratio %.2f (target >= %.1f)"
              % (name, m, total / m / gib, rm, total / rm / gib, rm / m, target))

    print("ckpt_bench: %d fp32 params at world 2, rank files %s bytes (%.2f GiB in all), "
          "median of %d, checkpoint_staging_keep %s"
          % (args.params, sizes, total / gib, args.runs, "true" if args.keep else "false"))
    stall = [max(o["stall_s"][i] for o in outs) for i in range(args.runs)]
    write = [max(o["save_s"][i] - o["stall_s"][i] for o in outs) for i in range(args.runs)]
    line("save", save, w, 0.8)
    line("write", write, w, 0.8)
    line("load", load, rd, 0.8)
    st = statistics.median([max(o["stall_s"][i] for o in outs) for i in range(args.runs)])
    print("stall %7.3f s in save_checkpoint (the trainer waits; the write goes on) vs %.3f s "
          "memcpy of the shard: ratio %.2f (target <= 1.5)" % (st, memcpy_s, st / memcpy_s))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=parse_count, default=parse_count("512Mi"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="checkpoint directory (default: a temp dir)")
    ap.add_argument("--keep", action="store_true",
                    help="daemon config checkpoint_staging_keep: the copy's memory is reused")
    args = ap.parse_args()
    args.params -= args.params % (64 * 16)
    mp.set_start_method("spawn")
    tempfile.tempdir = args.dir and os.path.dirname(os.path.abspath(args.dir)) or None
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
