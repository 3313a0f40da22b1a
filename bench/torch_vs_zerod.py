#!/usr/bin/env python3
"""PyTorch DDP + ZeroRedundancyOptimizer(AdamW) against zerod, same model, same data.

    /usr/bin/python3 bench/torch_vs_zerod.py [--world 2] [--steps 8] [--hidden 2816]

Model: 4 Linear(H, H) layers with ReLU (H = 2816: 31.7 M fp32 parameters), MSE to a fixed
target, batch --batch per rank, each rank its own data. Both sides run fp32 AdamW (lr 1e-4,
weight decay 0.01, no clipping) on the CPU.

  peer:  `world` processes (torch.multiprocessing, spawn) in a gloo process group; the model in
         DistributedDataParallel, the optimizer torch.distributed.optim.ZeroRedundancyOptimizer
         (AdamW): the optimizer state is sharded, like ZeRO stage 1.
  zerod: `world` zerod daemons (--device cpu, --threads --threads) and `world` trainers using
         zerod.torch (stage 2, reduce_bucket_size --bucket elements): gradients stream to the
         daemon bucket by bucket during backward; Adam runs in the daemon.

Reported per side: median step time over --steps timed steps after --warmup (forward +
backward + optimizer step, as the trainer sees it; rank 0's times) and per-rank memory: PSS
from /proc/PID/smaps_rollup after the timed steps -- the trainer, plus for zerod the rank's
daemon. PSS charges each shared page to the processes mapping it in equal parts, so the params
region (shared by trainer and daemon) is counted once in the sum. Then the ratios
zerod / peer. Prints a table and, last, one JSON line.

Works at any world size the daemons accept (world 1 today; world 2 with the daemon mesh).
Environment: ZEROD_TEST_DAEMON or --zerod (the zerod binary; default build/daemon/zerod),
ZEROD_LIBZC (default: found by the zerod package).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(REPO, "client", "python"))


def pss_kib(pid="self"):
    with open("/proc/%s/smaps_rollup" % pid) as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError("no Pss in /proc/%s/smaps_rollup" % pid)


def wait_store_plan(log, timeout=60.0):
    """Until the daemon whose log is `log` has logged its kernels' store plan (it measures one
    on a thread of its own at the first attach of a large shard, once in its life, on scratch
    it holds meanwhile; its steps meanwhile use regular stores and share a core with it).
    True once it has, False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log, errors="replace") as f:
            if "kernel stores:" in f.read():
                return True
        time.sleep(0.05)
    return False


def free_port():
    """MASTER_PORT whose successor binds too (rank 0's daemon listens on MASTER_PORT + 1):
    the test fixture's rule."""
    sys.path.insert(0, os.path.join(REPO, "tests", "python"))
    import zd_fixture
    return zd_fixture.free_port()


def make_model(torch, hidden):
    torch.manual_seed(0)
    layers = []
    for i in range(4):
        layers.append(torch.nn.Linear(hidden, hidden))
        if i < 3:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def make_batch(torch, step, rank, batch, hidden):
    g = torch.Generator().manual_seed(step * 1009 + rank)
    return torch.randn(batch, hidden, generator=g), torch.randn(batch, hidden, generator=g)


# ---- the peer: DDP + ZeroRedundancyOptimizer ---------------------------------------------

def peer_rank(rank, a, port, out_dir):
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(a.threads)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    model = DDP(make_model(torch, a.hidden))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                  lr=1e-4, weight_decay=0.01)
    times, opt_times = [], []
    for step in range(a.warmup + a.steps):
        x, y = make_batch(torch, step, rank, a.batch, a.hidden)
        dist.barrier()
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
        opt_times.append(time.perf_counter() - t1)
    dist.barrier()
    res = {"times": times[a.warmup:], "opt_times": opt_times[a.warmup:], "pss_kib": pss_kib()}
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, "peer%d.json" % rank), "w") as f:
        json.dump(res, f)


# ---- zerod ---------------------------------------------------------------------------------

def zerod_rank(rank, a, env, daemon_pid, out_dir):
    os.environ.update(env)
    import torch
    import zerod.torch as zt
    torch.set_num_threads(a.threads)
    model = make_model(torch, a.hidden)
    cfg = {"gradient_clipping": 0.0,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
           "zero_optimization": {"stage": 2, "reduce_bucket_size": a.bucket}}
    engine, _, _, _ = zt.initialize(model=model, config=cfg)
    times, opt_times = [], []
    for step in range(a.warmup + a.steps):
        x, y = make_batch(torch, step, rank, a.batch, a.hidden)
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        t1 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
        opt_times.append(time.perf_counter() - t1)
    res = {"times": times[a.warmup:], "opt_times": opt_times[a.warmup:], "pss_kib": pss_kib(),
           "daemon_pss_kib": pss_kib(daemon_pid),
           "buckets": len(engine._sess.buckets)}
    engine.close()
    with open(os.path.join(out_dir, "zerod%d.json" % rank), "w") as f:
        json.dump(res, f)


def start_daemons(a, tmp):
    zerod_bin = a.zerod or os.environ.get("ZEROD_TEST_DAEMON") or os.path.join(
        REPO, "build", "daemon", "zerod")
    flags = ["--device", "cpu", "--threads", str(a.threads), "--job-linger", "10s"]
    if getattr(a, "bucket_slots", None):
        flags += ["--bucket-slots", str(a.bucket_slots)]
    if a.world > 1:
        token = os.path.join(tmp, "token")
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        flags += ["--token-file", token]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ZEROD_") or k.startswith("ZEROD_LOG_")}
    daemons = []
    for r in range(a.world):
        sock = os.path.join(tmp, "zerod%d.sock" % r)
        log = open(os.path.join(tmp, "zerod%d.log" % r), "wb")
        p = subprocess.Popen([zerod_bin, "--socket", sock] + flags, stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        log.close()
        daemons.append((p, sock, os.path.join(tmp, "zerod%d.log" % r)))
    for p, sock, logp in daemons:
        for _ in range(200):
            with open(logp) as f:
                if "READY " in f.read():
                    break
            if p.poll() is not None:
                raise RuntimeError("zerod exited: %s" % open(logp).read())
            time.sleep(0.05)
        else:
            raise RuntimeError("zerod not ready: %s" % open(logp).read())
    return daemons


def run_spawned(target, args_per_rank, timeout):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args) for args in args_per_rank]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    bad = [i for i, p in enumerate(procs) if p.is_alive() or p.exitcode != 0]
    for p in procs:
        if p.is_alive():
            p.kill()
    if bad:
        raise RuntimeError("ranks %s failed (%s)" % (bad, [procs[i].exitcode for i in bad]))


def summarize(side, results):
    t = results[0]["times"]
    mem = [(r["pss_kib"] + r.get("daemon_pss_kib", 0)) / 1024.0 for r in results]
    return {"median_step_s": statistics.median(t), "min_step_s": min(t),
            "median_optimizer_step_s": statistics.median(results[0]["opt_times"]),
            "pss_mib_per_rank": [round(m, 1) for m in mem],
            "trainer_pss_mib": [round(r["pss_kib"] / 1024.0, 1) for r in results],
            "daemon_pss_mib": [round(r.get("daemon_pss_kib", 0) / 1024.0, 1) for r in results]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=1, help="ranks (default 1)")
    ap.add_argument("--hidden", type=int, default=2816, help="layer width (default 2816: 31.7 M)")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    ap.add_argument("--steps", type=int, default=8, help="timed steps (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps (default 2)")
    ap.add_argument("--threads", type=int, default=2,
                    help="torch threads per trainer and zerod --threads (default 2)")
    ap.add_argument("--bucket", type=int, default=4 << 20,
                    help="zerod reduce_bucket_size in elements (default 4 Mi)")
    ap.add_argument("--zerod", help="zerod binary (default $ZEROD_TEST_DAEMON or build/)")
    ap.add_argument("--only", choices=("peer", "zerod"), help="run one side only")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_vs_zerod.py: %s has no torch (try /usr/bin/python3)" % sys.executable,
              file=sys.stderr)
        return 2
    n_params = 4 * (a.hidden * a.hidden + a.hidden)
    tmp = tempfile.mkdtemp(prefix="zd-bench-")
    out = {"bench": "torch_vs_zerod", "schema_version": 1, "torch": torch.__version__,
           "world": a.world, "params": n_params, "batch": a.batch, "threads": a.threads,
           "steps": a.steps}
    try:
        if a.only in (None, "peer"):
            port = free_port()
            run_spawned(peer_rank, [(r, a, port, tmp) for r in range(a.world)], 600)
            out["peer"] = summarize("peer", [json.load(open(os.path.join(tmp, "peer%d.json" % r)))
                                             for r in range(a.world)])
            out["peer"]["name"] = "DDP(gloo) + ZeroRedundancyOptimizer(AdamW)"
        if a.only in (None, "zerod"):
            daemons = start_daemons(a, tmp)
            try:
                port = free_port()
                args = []
                for r, (p, sock, _) in enumerate(daemons):
                    env = {"RANK": str(r), "WORLD_SIZE": str(a.world), "LOCAL_RANK": str(r),
                           "ZEROD_SOCKET": sock, "ZEROD_JOB": "bench"}
                    if a.world > 1:
                        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
                    args.append((r, a, env, p.pid, tmp))
                run_spawned(zerod_rank, args, 600)
            finally:
                for p, _, _ in daemons:
                    p.terminate()
                for p, _, _ in daemons:
                    p.wait(timeout=15)
            res = [json.load(open(os.path.join(tmp, "zerod%d.json" % r))) for r in range(a.world)]
            out["zerod"] = summarize("zerod", res)
            out["zerod"]["name"] = "zerod stage 2 (%d buckets)" % res[0]["buckets"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if "peer" in out and "zerod" in out:
        out["ratio_step_time"] = round(out["zerod"]["median_step_s"] / out["peer"]["median_step_s"],
                                       3)
        out["peer_over_zerod_optimizer_step"] = round(
            out["peer"]["median_optimizer_step_s"] / out["zerod"]["median_optimizer_step_s"], 1)
        out["ratio_memory"] = round(max(out["zerod"]["pss_mib_per_rank"])
                                    / max(out["peer"]["pss_mib_per_rank"]), 3)
    print("%d ranks, %.1f M fp32 params, batch %d/rank, %d threads, median of %d steps"
          % (a.world, n_params / 1e6, a.batch, a.threads, a.steps))
    print("%-46s %14s %18s %22s" % ("side", "step time (s)", "optimizer step (s)",
                                     "memory/rank (MiB PSS)"))
    for side in ("peer", "zerod"):
        if side in out:
            s = out[side]
            print("%-46s %14.4f %18.4f %22s"
                  % (s["name"], s["median_step_s"], s["median_optimizer_step_s"],
                     ", ".join("%.0f" % m for m in s["pss_mib_per_rank"])))
    if "ratio_step_time" in out:
        print("zerod / peer: step time %.3f, memory %.3f; optimizer step (opt.step() vs "
              "engine.step(), gradients already reduced during backward on both sides): "
              "peer / zerod = %.1fx"
              % (out["ratio_step_time"], out["ratio_memory"],
                 out["peer_over_zerod_optimizer_step"]))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
