#!/usr/bin/env python3
"""Real DeepSpeed (ZeRO-1, ZeRO-2, ZeRO-2 + offload_optimizer, CPU accelerator, gloo) against
zerod on the same model, data, seed, world and thread count, on the CPU.

    make bench-deepspeed                       # creates the venv once, then runs this
    PY=$(bench/ds_venv.sh) && $PY bench/ds_vs_zerod.py [--model 32m|350m] [--world 2] ...

Sides (each `world` processes, torch.multiprocessing spawn, RANK/WORLD_SIZE/MASTER_* set):
  bare        forward + backward only: no optimizer, no communication, and no page faults: the
              C library keeps the memory torch frees (mallopt: no mmap, no trim), so each
              step's gradients reuse the last step's pages; zero_grad(set_to_none=True),
              untimed. The floor's first part.
  bare-kept   forward + backward, gradients kept (zero_grad(set_to_none=False), untimed): each
              backward adds its new gradients into them, a pass more than bare, and its
              temporaries still fault some steps. Not run by default (--sides)
  bare-fresh  a plain torch loop: zero_grad(set_to_none=True), and each backward's gradients
              are faulted in afresh. Not run by default
  ds-zero1    deepspeed.initialize, zero_optimization.stage 1
  ds-zero2    stage 2
  ds-zero2-offload  stage 2, offload_optimizer {device: cpu} (DeepSpeedCPUAdam)
  zerod       `world` zerod daemons (--device cpu) and zerod.torch, stage 2
Every side: AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01), fp32, no clipping,
reduce_bucket_size --bucket, batch --batch per rank, each rank its own data.

Each side runs --runs times (default 3), run-major (run 1 of every side, then run 2, ...: the
sides sample the same stretches of a noisy machine); per run, the median over --steps timed
steps (after --warmup; for zerod also after its daemon has logged its kernels' store plan,
which a daemon measures once in its life, 3.7-4.1 s of one core on the Xeon VM at the first
large attach: timed steps are steady-state steps) of rank 0's step, forward + backward, and
optimizer step, and per rank the PSS of the trainer plus (zerod) its daemon, split by mapping
kind (anonymous, shared memory, files).
Printed per metric: min and median over the runs, and the ratios zerod / each DeepSpeed side.

The floor of a zerod step: bare forward + backward (same run; no page faults, which zerod's
backward, writing into slots it keeps, does not take either) plus the
shard's Adam at the streaming limit: the bytes fp32 Adam moves (28 per element) over the
limit zk_bench --limit-only measures for adam_step, fp32 params, on this machine, at
min(shard, 64 Mi) elements (the limit does not depend on the size once out of cache: see
LIMIT_N). The target is zerod step <= 1.1 x floor, printed from the medians and per run (each
zerod run against the bare run next to it) with PASS or ABOVE. At world > 1 a line
for information follows: the ranks' daemons update their shards at the same time on one host, so
it also gives every shard's Adam at the limit that min(world, cores) threads reach together
(zk_bench --threads), the floor with that term, and the step against it. Memory target: zerod <=
0.9 x DeepSpeed ZeRO-2. Final parameters of every side are compared with ds-zero2's (relative
L2 difference; target 1e-5), and (--reference, default up to 100 M params) with AdamW in
fp64 over the same data, next to how far the same fp32 AdamW moves when the ranks' gradients
are summed in reverse order. This model amplifies rounding (a ReLU that flips on one side
sends two runs apart): fp32 AdamW in torch's form ends 1.2e-4 from fp64 on the 32m model at
world 2, and an unfused Adam with the same math ends 1.2e-4 from DeepSpeed. zerod computes
DeepSpeed's CPU Adam operation for operation (docs/semantics.md), so it ends 0 from ds-zero2
at world 2 and 2.5e-8 at world 4, where the ranks' sum is taken in another order; the fp32
AdamW in zerod's form is printed as a reference too.
What could not run is said, with why, and the rest goes on.
Last line: one JSON object.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "client", "python"))

import torch_vs_zerod as tvz  # noqa: E402  (pss_kib, free_port, start_daemons, run_spawned)

LR, BETAS, EPS, WD = 1e-4, (0.9, 0.999), 1e-8, 0.01
SIDES = ("bare", "ds-zero1", "ds-zero2", "ds-zero2-offload", "zerod")
ALL_SIDES = SIDES + ("bare-kept", "bare-fresh")
FLOOR_TARGET = 1.1
# The most elements zk_bench measures the streaming limit at: fp32 Adam at 64 Mi elements
# works on 1 GiB (master, m, v, gradient read; the first three written back), over 10x the
# largest last-level cache one core reaches on today's servers (96 MiB per AMD 3D V-cache
# CCD), so its limit is DRAM's, as at any larger shard. It takes seconds; at the 176 M-element
# shard of the 350m model at world 2 (and the host's 352 M), with the kernel timed beside it,
# about 14 minutes. A smaller shard is measured at its own size: one that fits in cache
# streams at the cache's rate.
LIMIT_N = 64 << 20


def make_model(torch, name):
    """32m: 4 x Linear(2816, 2816) with ReLU (31.7 M); 350m: a GPT-2-medium-shaped stack, 24
    blocks of Linear(1024, 3072), Linear(3072, 1024), Linear(1024, 4096), Linear(4096, 1024)
    with ReLU (352 M)."""
    torch.manual_seed(0)
    layers = []
    if name == "32m":
        dims = [2816] * 5
    else:
        dims = [1024]
        for _ in range(24):
            dims += [3072, 1024, 4096, 1024]
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers), dims[0]


def batch(torch, step, rank, n, width):
    g = torch.Generator().manual_seed(step * 1009 + rank)
    return torch.randn(n, width, generator=g), torch.randn(n, width, generator=g)


def mem_kinds(pid="self"):
    """PSS in KiB by mapping kind: anon (heap, stacks, anonymous), shmem (memfd, /dev/shm,
    SysV), file (libraries and other files)."""
    kinds = {"anon": 0, "shmem": 0, "file": 0}
    kind = "anon"
    with open("/proc/%s/smaps" % pid) as f:
        for line in f:
            head = line.split()
            if not head:
                continue
            if "-" in head[0] and len(head) >= 5:
                name = head[5] if len(head) > 5 else ""
                if name.startswith("/memfd:") or name.startswith("/dev/shm") or \
                        name.startswith("/SYSV") or "(deleted)" in line and "memfd" in line:
                    kind = "shmem"
                elif name.startswith("/"):
                    kind = "file"
                else:
                    kind = "anon"
            elif head[0] == "Pss:":
                kinds[kind] += int(head[1])
    return kinds


def ds_config(a, stage, offload):
    zero = {"stage": stage, "reduce_bucket_size": a.bucket, "allgather_bucket_size": a.bucket,
            "overlap_comm": False, "contiguous_gradients": True}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    return {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1,
            "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                       "weight_decay": WD}},
            "zero_optimization": zero}


def cpu_s(pid="self"):
    """CPU seconds (user + system) a process has used, all its threads."""
    with open("/proc/%s/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def keep_freed_memory():
    """Make glibc serve every allocation from the heap and never give it back to the kernel,
    so that memory torch frees is reused without page faults. One process, the 32m model,
    torch 2.15, AMD EPYC 2-core VM shared with other work: forward + backward took 15.5 k
    minor faults and 0.093 s (median of 10 steps); so 0 and 0.073 s; with gradients kept
    instead (set_to_none=False) 7.7 k faults and 0.090-0.093 s, since backward still makes
    each gradient anew and then adds it into the kept one."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    # M_MMAP_MAX = -4: no allocation is mmapped; M_TRIM_THRESHOLD = -1: never trim
    if libc.mallopt(-4, 0) != 1 or libc.mallopt(-1, 2 ** 31 - 1) != 1:
        raise RuntimeError("mallopt refused M_MMAP_MAX or M_TRIM_THRESHOLD")


def side_rank(rank, side, a, env, daemon_pid, out_path):
    """One rank of one side; writes its figures (and rank 0 its final parameters)."""
    os.environ.update(env)
    if side == "bare":
        keep_freed_memory()
    import torch
    torch.set_num_threads(a.threads)
    model, width = make_model(torch, a.model)
    engine, fwd = None, model
    if side.startswith("ds-"):
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        stage = 1 if side == "ds-zero1" else 2
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=ds_config(a, stage, "offload" in side))
        fwd = engine
    elif side == "zerod":
        import zerod.torch as zt
        cfg = {"gradient_clipping": 0.0,
               "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS),
                                                         "eps": EPS, "weight_decay": WD}},
               "zero_optimization": {"stage": 2, "reduce_bucket_size": a.bucket}}
        engine, _, _, _ = zt.initialize(model=model, config=cfg)
        fwd = engine
    steps, fb, opt = [], [], []
    for step in range(a.warmup + a.steps):
        if step == max(0, a.warmup - 1) and side == "zerod":
            # before the last warmup step, whose all-gather lines the ranks up again: each
            # rank waits for its own daemon's plan, and the first to get it would otherwise
            # wait for the others inside its first timed step
            log = os.environ["DSBENCH_DAEMON_LOG"]
            if not tvz.wait_store_plan(log):
                print("ds_vs_zerod: %s logged no store plan in 60 s; timing anyway" % log,
                      file=sys.stderr)
        if step == a.warmup:  # CPU time of the timed steps: where a step goes on shared cores
            cpu0 = (time.perf_counter(), cpu_s(), cpu_s(daemon_pid) if daemon_pid else 0.0)
        x, y = batch(torch, step, rank, a.batch, width)
        if engine is None:  # untimed: bare-kept zeroes its gradients, the others drop them
            model.zero_grad(set_to_none=side != "bare-kept")
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(fwd(x), y)
        if engine is None:
            loss.backward()
        else:
            engine.backward(loss)
        t1 = time.perf_counter()
        if engine is not None:
            engine.step()
        t2 = time.perf_counter()
        steps.append(t2 - t0)
        fb.append(t1 - t0)
        opt.append(t2 - t1)
    cpu1 = (time.perf_counter(), cpu_s(), cpu_s(daemon_pid) if daemon_pid else 0.0)
    res = {"step": statistics.median(steps[a.warmup:]), "fwd_bwd": statistics.median(fb[a.warmup:]),
           "opt": statistics.median(opt[a.warmup:]), "mem": mem_kinds(),
           "cpu_trainer": (cpu1[1] - cpu0[1]) / a.steps,
           "cpu_daemon": (cpu1[2] - cpu0[2]) / a.steps,
           "wall": (cpu1[0] - cpu0[0]) / a.steps}
    if daemon_pid:
        res["daemon_mem"] = mem_kinds(daemon_pid)
    if rank == 0 and not side.startswith("bare"):
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
        torch.save(flat, out_path + ".params")
    if side == "zerod":
        engine.close()
    with open(out_path, "w") as f:
        json.dump(res, f)


def run_side(side, a, tmp, run):
    """One run of one side: the per-rank results."""
    port = tvz.free_port()
    daemons = []
    base = {"WORLD_SIZE": str(a.world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": str(a.threads)}
    args = []
    try:
        if side == "zerod":
            ddir = os.path.join(tmp, "daemons-%d" % run)
            os.makedirs(ddir)
            daemons = tvz.start_daemons(a, ddir)
        for r in range(a.world):
            env = dict(base, RANK=str(r), LOCAL_RANK=str(r))
            pid = 0
            if daemons:
                env.update({"ZEROD_SOCKET": daemons[r][1], "ZEROD_JOB": "dsbench%d" % run,
                            "DSBENCH_DAEMON_LOG": daemons[r][2]})
                pid = daemons[r][0].pid
            args.append((r, side, a, env, pid, os.path.join(tmp, "%s-%d-%d.json" % (side, run, r))))
        tvz.run_spawned(side_rank, args, a.timeout)
        if daemons and a.trace:
            zeroctl = os.path.join(REPO, "build", "client", "zeroctl")
            out = "%s.run%d.json" % (a.trace, run) if a.runs > 1 else a.trace
            subprocess.run([zeroctl, "trace", "--dir", ddir, "--steps", "3", "-o", out],
                           timeout=60, check=False)
    finally:
        for p, _, _ in daemons:
            p.terminate()
        for p, _, _ in daemons:
            p.wait(timeout=15)
    return [json.load(open(x[-1])) for x in args]


def adam_floor_s(a, shard, threads=None):
    """Seconds for the shard's fp32 Adam at the streaming limit of `threads` threads (default
    --threads), measured by zk_bench --limit-only at min(shard, LIMIT_N) elements, and that
    limit in GB/s."""
    zk = a.zk_bench or os.path.join(REPO, "build", "bench", "zk_bench")
    threads = threads or a.threads
    n = min(shard, LIMIT_N)
    out = subprocess.run([zk, "--kernels", "adam_step", "--limit-only", "--reps", "2", "--n",
                          str(n), "--dtype", "fp32", "--threads", str(threads), "--json"],
                         capture_output=True, text=True, timeout=120)
    for line in out.stdout.splitlines():
        if line.startswith("{") and '"limit_gbps"' in line:
            lim = json.loads(line)["limit_gbps"]
            # fp32 Adam as the daemon runs it: master, m, v, gradient in; master, m, v out
            return shard * 28.0 / (lim * 1e9), lim
    raise RuntimeError("zk_bench gave no limit: %s" % (out.stderr or out.stdout)[-400:])


def mm(xs):
    return {"min": min(xs), "median": statistics.median(xs)}


def summarize(runs):
    """runs: per run, per rank results -> min/median over runs of rank 0's times and of the
    largest rank's memory (MiB)."""
    def rank_mem(r, kind=None):
        m = dict(r["mem"])
        for k, v in r.get("daemon_mem", {}).items():
            m[k] += v
        return (sum(m.values()) if kind is None else m[kind]) / 1024.0
    out = {k: mm([rs[0][k] for rs in runs]) for k in ("step", "fwd_bwd", "opt")}
    out["per_run"] = {k: [rs[0][k] for rs in runs] for k in ("step", "fwd_bwd")}
    # CPU seconds per step, all ranks together, against the cores' wall seconds
    for k in ("cpu_trainer", "cpu_daemon", "wall"):
        out[k] = mm([sum(r[k] for r in rs) / (len(rs) if k == "wall" else 1) for rs in runs])
    out["mem_mib"] = mm([max(rank_mem(r) for r in rs) for rs in runs])
    for kind in ("anon", "shmem", "file"):
        out["mem_%s_mib" % kind] = mm([max(rank_mem(r, kind) for r in rs) for rs in runs])
    return out


def zerod_form_factors(torch, a, t):
    """Step t's factors in the form docs/semantics.md writes for zerod (DeepSpeed's CPU Adam):
    hyper-parameters rounded to fp32, beta^t a running fp32 product, every factor computed in
    fp32 operation by operation."""
    f32 = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    lr, b1, b2, eps, wd = (f32(x) for x in (LR, BETAS[0], BETAS[1], EPS, WD))
    b1t, b2t = f32(1.0), f32(1.0)
    for _ in range(t):
        b1t, b2t = b1t * b1, b2t * b2
    one = f32(1.0)
    return {"gs": f32(1.0 / a.world), "zero": f32(0.0), "b1": b1, "omb1": one - b1, "b2": b2,
            "omb2": one - b2, "eps": eps, "neg_step": -lr / (one - b1t),
            "isbc2": one / torch.sqrt(one - b2t), "neg_lr_wd": -lr * wd}


def fma32(x, y, z):
    """x * y + z for fp32 tensors, rounded once to fp32 as far as double allows: the product of
    two fp32 values is exact in double; the sum rounds in double and again to fp32, which can
    differ from one rounding in rare double-rounding cases."""
    import torch
    return (x.double() * y.double() + z.double()).to(torch.float32)


def zerod_form_update(k, r, m, v, acc):
    """One AdamW update in fp32 with the factors k of zerod_form_factors, in the order of
    docs/semantics.md (zk/elem.h): fused multiply-adds where it writes FMA."""
    g = fma32(r, k["zero"], acc.mul(k["gs"]))
    m.copy_(fma32(g, k["omb1"], m.mul(k["b1"])))
    v.copy_(fma32(g.mul(g), k["omb2"], v.mul(k["b2"])))
    p = fma32(r, k["neg_lr_wd"], r)
    r.copy_(fma32(m.div(fma32(v.sqrt(), k["isbc2"], k["eps"])), k["neg_step"], p))


def reference_params(a, dtype, reverse, form="torch"):
    """The final parameters of plain AdamW (torch's formula, or with form "zerod" the one
    docs/semantics.md gives, in fp32) over the same model, data, world and steps, in one
    process: each step, every rank's gradient in `dtype`, summed in rank order (reversed with
    `reverse`) and divided by the world, then the update in `dtype`. With fp64 this is the
    exact trajectory the sides approximate; two fp32 runs that differ only in the order of the
    sum, or only in the form of the update, show how much this problem amplifies rounding."""
    import torch
    torch.set_num_threads(a.threads)
    model, width = make_model(torch, a.model)
    params = list(model.parameters())
    ref = [p.detach().to(dtype).clone() for p in params]
    m = [torch.zeros_like(r) for r in ref]
    v = [torch.zeros_like(r) for r in ref]
    ranks = list(range(a.world))[::-1] if reverse else list(range(a.world))
    for step in range(a.warmup + a.steps):
        with torch.no_grad():
            for p, r in zip(params, ref):
                p.copy_(r)
        acc = [torch.zeros_like(r) for r in ref]
        for rank in ranks:
            model.zero_grad(set_to_none=True)
            x, y = batch(torch, step, rank, a.batch, width)
            torch.nn.functional.mse_loss(model(x), y).backward()
            for g, p in zip(acc, params):
                g += p.grad.to(dtype)
        t = step + 1
        k = zerod_form_factors(torch, a, t) if form == "zerod" else None
        for i, r in enumerate(ref):
            if k is not None:
                zerod_form_update(k, r, m[i], v[i], acc[i])
                continue
            g = acc[i] / a.world
            r.mul_(1 - LR * WD)
            m[i].mul_(BETAS[0]).add_(g, alpha=1 - BETAS[0])
            v[i].mul_(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1])
            denom = (v[i] / (1 - BETAS[1] ** t)).sqrt_().add_(EPS)
            r.addcdiv_(m[i], denom, value=-LR / (1 - BETAS[0] ** t))
        del acc
    return torch.cat([r.reshape(-1).double() for r in ref])


def compare_reference(tmp, a, names):
    """Each side's final parameters against exact AdamW (fp64), and the order sensitivity: the
    same fp32 AdamW with the ranks' gradients summed forward and in reverse."""
    import torch
    exact = reference_params(a, torch.float64, False)
    fwd = reference_params(a, torch.float32, False)
    rev = reference_params(a, torch.float32, True)
    form = reference_params(a, torch.float32, False, "zerod")
    out = {"order_sensitivity": float((fwd - rev).norm() / exact.norm()),
           "form_sensitivity": float((fwd - form).norm() / exact.norm()),
           "fp32_fwd": float((fwd - exact).norm() / exact.norm()), "sides": {},
           "sides_vs_fp32_fwd": {}, "sides_vs_zerod_form": {}}
    for s in names:
        p = os.path.join(tmp, "%s-0-0.json.params" % s)
        if not s.startswith("bare") and os.path.exists(p):
            x = torch.load(p).double()
            out["sides"][s] = float((x - exact).norm() / exact.norm())
            out["sides_vs_fp32_fwd"][s] = float((x - fwd).norm() / exact.norm())
            out["sides_vs_zerod_form"][s] = float((x - form).norm() / exact.norm())
    return out


def compare_params(tmp, sides, ref):
    import torch
    base = torch.load(os.path.join(tmp, "%s-0-0.json.params" % ref))
    diffs = {}
    for s in sides:
        if s.startswith("bare") or s == ref:
            continue
        p = os.path.join(tmp, "%s-0-0.json.params" % s)
        if os.path.exists(p):
            x = torch.load(p)
            diffs[s] = float((x - base).norm() / base.norm())
    return diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("32m", "350m"), default="32m")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per run (default 6)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="runs per side (default 3)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per trainer and zerod --threads (default 1)")
    ap.add_argument("--bucket", type=int, default=4 << 20, help="reduce_bucket_size, elements")
    ap.add_argument("--bucket-slots", type=int,
                    help="the daemons' bucket_slots (default: zerod's own default)")
    ap.add_argument("--sides", default=",".join(SIDES),
                    help="comma list of " + ",".join(ALL_SIDES) + " (default: " +
                    ",".join(SIDES) + ")")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--reference", choices=("auto", "on", "off"), default="auto",
                    help="compare every side with AdamW in fp64 over the same data, and measure "
                         "how much the order of the ranks' sum moves the result (auto: up to "
                         "100 M params)")
    ap.add_argument("--zerod", help="zerod binary (default $ZEROD_TEST_DAEMON or build/)")
    ap.add_argument("--trace", help="write zerod's trace of its last 3 steps (zeroctl trace) "
                    "here, per run")
    ap.add_argument("--zk-bench", help="zk_bench binary (default build/bench/zk_bench)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every side ran and every final parameter vector is within "
                         "1e-5 of ds-zero2's (make test-deepspeed)")
    a = ap.parse_args()
    import torch
    sides = [s for s in a.sides.split(",") if s]
    bad = [s for s in sides if s not in ALL_SIDES]
    if bad:
        ap.error("unknown sides %s" % bad)
    model, _ = make_model(torch, a.model)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    out = {"bench": "ds_vs_zerod", "schema_version": 2, "model": a.model, "params": n_params,
           "world": a.world, "threads": a.threads, "batch": a.batch, "runs": a.runs,
           "torch": torch.__version__, "cpu": cpu_model(), "sides": {}, "not_run": {}}
    try:
        import deepspeed
        out["deepspeed"] = deepspeed.__version__
    except Exception as e:  # noqa: BLE001  (any import failure: say it, run zerod alone)
        for s in sides:
            if s.startswith("ds-"):
                out["not_run"][s] = "deepspeed does not import: %s" % e
        sides = [s for s in sides if not s.startswith("ds-")]
    tmp = tempfile.mkdtemp(prefix="zd-dsbench-")
    # run-major: run i of every side, then run i + 1, so that each side samples the same
    # stretches of a noisy machine (bare's own step moves by 30 % within minutes on the VMs)
    runs = {s: [] for s in sides}
    for run in range(a.runs):
        for s in sides:
            if s in out["not_run"]:
                continue
            try:
                runs[s].append(run_side(s, a, tmp, run))
            except Exception as e:  # noqa: BLE001
                out["not_run"][s] = "run %d failed: %s" % (run, str(e)[-300:])
                traceback.print_exc()
        print("run %d: done" % run, file=sys.stderr)
    for s in sides:
        if len(runs[s]) == a.runs:
            out["sides"][s] = summarize(runs[s])
    if "ds-zero2" in out["sides"]:
        out["param_rel_diff_vs_ds_zero2"] = compare_params(tmp, out["sides"], "ds-zero2")
    if a.reference == "on" or (a.reference == "auto" and n_params <= 100e6):
        try:
            out["reference"] = compare_reference(tmp, a, list(out["sides"]))
        except Exception as e:  # noqa: BLE001
            out["not_run"]["reference"] = str(e)[-300:]
    elif a.reference == "auto":  # a choice, not a failure: --check does not count it
        out["reference_skipped"] = ("the fp64 AdamW reference is not run for %.0f M params by "
                                    "default (--reference on runs it)" % (n_params / 1e6))
    shard = (n_params + a.world - 1) // a.world
    try:
        t0 = time.monotonic()
        floor_opt, lim = adam_floor_s(a, shard)
        out["adam_floor_s"], out["adam_limit_gbps"] = floor_opt, lim
        out["adam_limit_n"], out["adam_limit_s"] = min(shard, LIMIT_N), time.monotonic() - t0
    except Exception as e:  # noqa: BLE001
        if not a.check:
            out["not_run"]["floor"] = str(e)
    if a.world > 1 and "adam_floor_s" in out:
        # every rank's shard at once, as the daemons update them on one host (for information)
        th = min(a.world, os.cpu_count() or 1) * a.threads
        try:
            host_opt, host_lim = adam_floor_s(a, shard * a.world, th)
            out["host_adam_s"], out["host_limit_gbps"], out["host_threads"] = \
                host_opt, host_lim, th
        except Exception as e:  # noqa: BLE001
            out["host_floor_not_run"] = str(e)
    report(out)
    if a.check:
        diffs = out.get("param_rel_diff_vs_ds_zero2", {})
        if out["not_run"] or "ds-zero2" not in out["sides"] or \
                any(d > 1e-5 for d in diffs.values()):
            print("ds_vs_zerod: check FAILED", file=sys.stderr)
            return 1
        print("ds_vs_zerod: check passed: %s" % ", ".join(
            "%s %.1e" % (s, d) for s, d in diffs.items()))
    return 0


def cpu_model():
    flags, name = set(), "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and name == "?":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    isa = [x for x in ("avx2", "avx512f", "avx512_bf16") if x in flags]
    return "%s (%s)" % (name, ", ".join(isa))


def report(out):
    S = out["sides"]
    print("%s, %.1f M fp32 params, world %d, %d thread(s) per rank, batch %d/rank, %d runs; "
          "min / median over runs" % (out["cpu"], out["params"] / 1e6, out["world"],
                                      out["threads"], out["batch"], out["runs"]))
    print("%-18s %17s %17s %17s %17s %22s" % ("side", "step (s)", "fwd+bwd (s)", "optimizer (s)",
                                              "memory/rank (MiB)", "anon/shmem/file (MiB)"))
    for s, r in S.items():
        print("%-18s %8.3f/%8.3f %8.3f/%8.3f %8.3f/%8.3f %8.0f/%8.0f %22s"
              % (s, r["step"]["min"], r["step"]["median"], r["fwd_bwd"]["min"],
                 r["fwd_bwd"]["median"], r["opt"]["min"], r["opt"]["median"],
                 r["mem_mib"]["min"], r["mem_mib"]["median"],
                 "%.0f/%.0f/%.0f" % (r["mem_anon_mib"]["median"], r["mem_shmem_mib"]["median"],
                                     r["mem_file_mib"]["median"])))
    z = S.get("zerod")
    if z:
        ratios = {}
        for s in ("ds-zero1", "ds-zero2", "ds-zero2-offload"):
            if s in S:
                ratios[s] = {k: round(z[k]["median"] / S[s][k]["median"], 3)
                             for k in ("step", "fwd_bwd", "opt", "mem_mib")}
                print("zerod / %-16s step %.3f, fwd+bwd %.3f, optimizer %.3f, memory %.3f"
                      % (s, ratios[s]["step"], ratios[s]["fwd_bwd"], ratios[s]["opt"],
                         ratios[s]["mem_mib"]))
        out["ratios"] = ratios
        if "ds-zero2" in ratios:
            print("memory target zerod <= 0.9 x ds-zero2: %.3f %s"
                  % (ratios["ds-zero2"]["mem_mib"],
                     "ok" if ratios["ds-zero2"]["mem_mib"] <= 0.9 else "MISSED"))
        if "bare" in S and "adam_floor_s" in out:
            verdict = lambda x: "PASS" if x <= FLOOR_TARGET else "ABOVE"  # noqa: E731
            fb = S["bare"]["fwd_bwd"]["median"]
            floor = fb + out["adam_floor_s"]
            out["floor_s"] = floor
            out["step_over_floor"] = round(z["step"]["median"] / floor, 3)
            print("floor = bare fwd+bwd (no page faults) %.3f s + shard Adam at the %.1f GB/s "
                  "limit (zk_bench at %d Mi elements, %.1f s) %.3f s = %.3f s"
                  % (fb, out["adam_limit_gbps"], out["adam_limit_n"] >> 20, out["adam_limit_s"],
                     out["adam_floor_s"], floor))
            # each zerod run against the bare run next to it (the same stretch of the machine)
            paired = [zs / (b + out["adam_floor_s"]) for zs, b in
                      zip(z["per_run"]["step"], S["bare"]["per_run"]["fwd_bwd"])]
            out["step_over_floor_paired"] = [round(x, 3) for x in paired]
            for run, x in enumerate(paired):
                print("run %d: zerod step / (that run's bare fwd+bwd + shard Adam) = %.3f "
                      "(target %.1f): %s" % (run, x, FLOOR_TARGET, verdict(x)))
            print("medians: zerod step / floor = %.3f (target %.1f): %s"
                  % (out["step_over_floor"], FLOOR_TARGET, verdict(out["step_over_floor"])))
            if "host_floor_not_run" in out:
                print("(for information) the host's floor was not measured: %s"
                      % out["host_floor_not_run"][-200:])
            if "host_adam_s" in out:
                # For information: the floor counts one shard's update at one thread's limit,
                # but the ranks' daemons update their shards at the same time on this host.
                hfloor = S["bare"]["fwd_bwd"]["median"] + out["host_adam_s"]
                out["host_floor_s"] = hfloor
                out["step_over_host_floor"] = round(z["step"]["median"] / hfloor, 3)
                print("(for information) the %d shards update at once on this host: at the "
                      "%.1f GB/s %d threads stream together, %.3f s; bare fwd+bwd + that = %.3f s; "
                      "zerod step / it = %.3f"
                      % (out["world"], out["host_limit_gbps"], out["host_threads"],
                         out["host_adam_s"], hfloor, out["step_over_host_floor"]))
    ncpu = os.cpu_count()
    for s, r in S.items():
        busy = r["cpu_trainer"]["median"] + r["cpu_daemon"]["median"]
        print("%-18s CPU per step, all ranks: trainers %.3f s, daemons %.3f s = %.2f of %d cores "
              "over the %.3f s of a step"
              % (s, r["cpu_trainer"]["median"], r["cpu_daemon"]["median"],
                 busy / r["wall"]["median"], ncpu, r["wall"]["median"]))
    for s, d in out.get("param_rel_diff_vs_ds_zero2", {}).items():
        print("final params %s vs ds-zero2: relative L2 difference %.2e (target 1e-5): %s"
              % (s, d, "ok" if d <= 1e-5 else "MISSED"))
    ref = out.get("reference")
    if ref:
        print("final params vs AdamW in fp64 over the same data (relative L2): %s; fp32 with the "
              "ranks summed in order %.2e"
              % (", ".join("%s %.2e" % (s, d) for s, d in ref["sides"].items()), ref["fp32_fwd"]))
        print("final params vs the same AdamW in fp32, ranks summed in order: %s"
              % ", ".join("%s %.2e" % (s, d) for s, d in ref["sides_vs_fp32_fwd"].items()))
        print("order sensitivity: fp32 AdamW with the ranks' gradients summed in reverse order "
              "ends %.2e from the same in order; sides that differ by about that much differ by "
              "rounding, which this model amplifies over the steps, not by their math"
              % ref["order_sensitivity"])
        print("final params vs the same fp32 AdamW in zerod's form (docs/semantics.md: "
              "DeepSpeed's CPU Adam, fused multiply-adds, fp32 factors): %s; that form alone "
              "moves fp32 AdamW by %.2e"
              % (", ".join("%s %.2e" % (s, d) for s, d in ref["sides_vs_zerod_form"].items()),
                 ref["form_sensitivity"]))
    if "reference_skipped" in out:
        print("not run: %s" % out["reference_skipped"])
    for s, why in out["not_run"].items():
        print("not run: %s: %s" % (s, why))
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
