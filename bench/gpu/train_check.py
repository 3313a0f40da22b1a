#!/usr/bin/env python3
"""Training on the CUDA backend: a trainer on cuda:0 attached to `zerod --device cuda:0`.

    train_check.py          (bench/gpu/check.sh runs it; needs a GPU, torch with CUDA, and
                             ZEROD_TEST_DAEMON / ZEROD_LIBZC naming the CUDA build)

Cases, each 20 optimizer steps of the two-group MLP of tests/python/zd_ref.py on cuda:0:
  fp32         stage 2                  == torch.optim.AdamW on the same GPU (rel. error <= 1e-5)
  fp32-accum   stage 2, gradient_accumulation_steps 2 == AdamW on the averaged gradients
  fp32-stage1  stage 1 (gradients summed in the device grads region) == AdamW
  bf16         bf16 parameters == torch AdamW on an fp32 master of the same bf16 model, cast
               back after each step (rel. error <= 1e-2, two bf16 ulps)
  fp16         fp16 with dynamic loss scaling: the same, with the daemon's scale
  kill9        a trainer killed with SIGKILL after 10 steps; a new one re-attaches to the job
               the daemon kept, resumes at step 10 and ends at the same values as an
               uninterrupted run (rel. error <= 1e-5 to AdamW)
  offload      ZeRO-Offload: the model on cuda:0, the optimizer in zerod --device cpu
               (offload_optimizer.device "cpu"): fp32 stage 2, stage 1 with accumulation
               (1e-5 to AdamW on the GPU) and bf16 (offload-s1, offload-bf16)
  ckpt         a device job saved at step 10, loaded by a new job, 10 more steps: bit-identical
               to the continuous run; the live export equals the trainer's parameters
  step1b       one iteration of a 1 B-parameter bf16 model (60 Linear 4096x4096) with zerod
               against torch.optim.AdamW(fused=True) on fp32 parameters with bf16 autocast on
               the same GPU (a benchmark: printed, not checked), and the daemon's device memory
               per term against the formula, and against what the GPU lost (within 5%)
Prints one line per case and a summary; exit 0 when all pass, 1 otherwise, 77 without a GPU.
"""
import os
import signal
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))

import zd_fixture as zf  # noqa: E402

torch = zf.require_torch()
import zd_ref as zr  # noqa: E402

DEV = "cuda:0"
STEPS = 20
TOL = 1e-5
# bf16/fp16 against torch's AdamW on an fp32 master of the same half model: both round the same
# fp32 values to half after each step, but a few ulps of difference in the fp32 update flip
# some roundings, and the forward then sees them; two half ulps (2^-7 relative for bf16) bound
# that here (tests/python/test_bf16.py argues the exact bound on the CPU backend)
HALF_TOL = 1e-2


def _train(cfg, steps, kill_after=None):
    def record(engine):
        if kill_after is not None and engine.global_steps >= kill_after:
            torch.cuda.synchronize()
            os.kill(os.getpid(), signal.SIGKILL)  # no detach, no close: as a crash
    return zr.zerod_train(cfg, steps, device=DEV, record=record)


def _check_params(res, ref, tol, what):
    d = zr.max_rel_diff([p.float() for p in res["params"]], ref)
    ok = d <= tol and all(torch.isfinite(p.float()).all() for p in res["params"])
    return ok, "%s: max relative difference to torch AdamW on %s %.3g (tolerance %g)" % (
        what, DEV, d, tol)


# ZeRO-Offload: the model on the GPU, the optimizer in a CPU daemon (zerod --device cpu)
OFFLOAD = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}


def case_fp32(stage=2, gas=1, offload=False):
    cfg = zr.config(stage=stage, gas=gas, extra=OFFLOAD if offload else None)
    with zf.Cluster(1, device="cpu" if offload else DEV) as c:
        res = c.run(_train, (cfg, STEPS))[0]
    assert [s["step"] for s in res["steps"]] == list(range(1, STEPS + 1)), res["steps"]
    return _check_params(res, zr.reference_train(STEPS, gas=gas, device=DEV), TOL,
                         "%sstage %d, gas %d" % ("offload, " if offload else "", stage, gas))


def reference_half(dtype, steps, scale):
    """What the daemon does for half parameters, in torch on the same GPU: the model in
    `dtype` runs forward and backward (loss times the static `scale`), an fp32 master takes
    the unscaled gradients, torch.optim.AdamW steps the master, and the model gets it back in
    `dtype` (round to nearest even)."""
    model = zr.MLP(1).to(DEV)
    master = zr.param_groups(model)
    for g in master:  # fp32 copies of the half values the daemon starts from
        g["params"] = [p.detach().to(dtype).float().clone().requires_grad_(True)
                       for p in g["params"]]
        g["betas"], g["eps"] = zr.BETAS, zr.EPS
    half = [p for g in zr.param_groups(model) for p in g["params"]]
    with torch.no_grad():
        for p, m in zip(half, [m for g in master for m in g["params"]]):
            p.data = m.detach().to(dtype)
    opt = torch.optim.AdamW(master)
    flat = [m for g in master for m in g["params"]]
    for s in range(steps):
        model.zero_grad(set_to_none=True)
        x, t = zr.batch(s, 0, 0)
        (zr.loss_fn(model(x.to(DEV)), t.to(DEV)) * scale).backward()
        for p, m in zip(half, flat):
            m.grad = p.grad.float() / scale
        opt.step()
        with torch.no_grad():
            for p, m in zip(half, flat):
                p.copy_(m.to(dtype))
    return [p.detach().cpu() for p in model.parameters()]


def case_half(dtype, offload=False):
    # fp16: an initial scale of 2^8, so that no step of this small model overflows and the
    # reference (a static scale) stays comparable; the daemon's scaler is still dynamic
    extra = dict(OFFLOAD) if offload else {}
    if dtype == "fp16":
        extra["fp16"] = {"initial_scale_power": 8}
    cfg = zr.config(dtype=dtype, extra=extra)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    with zf.Cluster(1, device="cpu" if offload else DEV) as c:
        res = c.run(_train, (cfg, STEPS))[0]
    scales = sorted(set(s["loss_scale"] for s in res["steps"]))
    ref = reference_half(tdtype, STEPS, scales[0] if dtype == "fp16" else 1.0)
    ok, msg = _check_params(res, [p.float() for p in ref], HALF_TOL, dtype)
    return ok, "%s; loss scales %s" % (msg.replace("torch AdamW", "torch AdamW (fp32 master)"),
                                       scales)


def case_kill9():
    cfg = zr.config()
    with zf.Cluster(1, device=DEV) as c:
        env = dict(os.environ, **c.env(0))
        child = subprocess.run([sys.executable, __file__, "--child-kill", "10"], env=env,
                               timeout=120)
        if child.returncode != -signal.SIGKILL:
            return False, "the trainer to kill exited with %s, not SIGKILL" % child.returncode
        # a launcher's restart (zerorun, torchrun) says so; without it the new trainer would
        # start the job afresh (resume "auto", docs/design-notes.md "A job's life")
        os.environ["TORCHELASTIC_RESTART_COUNT"] = "1"
        try:
            res = c.run(_train, (cfg, STEPS))[0]
        finally:
            del os.environ["TORCHELASTIC_RESTART_COUNT"]
    if not res["resumed"]:
        return False, "the second trainer did not resume the kept job"
    if [s["step"] for s in res["steps"]] != list(range(11, STEPS + 1)):
        return False, "resumed steps %s, want 11..%d" % ([s["step"] for s in res["steps"]], STEPS)
    return _check_params(res, zr.reference_train(STEPS, device=DEV), TOL,
                         "killed at step 10, re-attached")


def _ckpt_engine():
    import zerod.torch
    model = zr.MLP(1).to(DEV)
    engine, _, _, _ = zerod.torch.initialize(model=model, model_parameters=zr.param_groups(model),
                                             config=zr.config())
    return model, engine


def _ckpt_train(engine, n):
    for _ in range(n):
        x, t = zr.batch(engine.global_steps, 0, 0)
        engine.backward(zr.loss_fn(engine(x.to(DEV)), t.to(DEV)))
        engine.step()


def _ckpt_save_and_continue(ckpt, exported):
    import test_checkpoint as tc
    model, engine = _ckpt_engine()
    _ckpt_train(engine, 10)
    engine.save_checkpoint(ckpt)
    _ckpt_train(engine, 10)
    # the live job's export: the device params region through the daemon
    subprocess.run([tc.zeroctl(), "-s", os.environ["ZEROD_SOCKET"], "export", "--dtype", "fp32",
                    exported], check=True, stdout=subprocess.DEVNULL)
    out = [p.detach().cpu() for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    engine.close()
    return out, names


def _ckpt_load_and_train(ckpt):
    model, engine = _ckpt_engine()
    path, _ = engine.load_checkpoint(ckpt)
    at = engine.global_steps
    _ckpt_train(engine, 10)
    out = [p.detach().cpu() for p in model.parameters()]
    engine.close()
    return path, at, out


def case_ckpt():
    """A device job saved at step 10 (its shard copied off the GPU), loaded by a new job (copied
    back), trained 10 more steps: bit-identical to the run that went on; the live export of the
    device params region equals the trainer's parameters."""
    import test_checkpoint as tc
    with zf.Cluster(1, device=DEV) as c:
        ckpt, exported = os.path.join(c.tmp, "ckpt"), os.path.join(c.tmp, "live.safetensors")
        straight, names = c.run(_ckpt_save_and_continue, (ckpt, exported), job="straight")[0]
        path, at, loaded = c.run(_ckpt_load_and_train, (ckpt,), job="loaded")[0]
        live = tc.read_safetensors(exported)
    if at != 10 or not path.endswith("global_step10"):
        return False, "loaded %s at step %d, want global_step10 at 10" % (path, at)
    same = all(torch.equal(a, b) for a, b in zip(straight, loaded))
    exp_ok = all(torch.equal(live[n], p.float()) for n, p in zip(names, straight))
    ok, msg = _check_params({"params": loaded}, zr.reference_train(STEPS, device=DEV), TOL,
                            "saved at 10, loaded, 10 more")
    return ok and same and exp_ok, "%s; loaded run %s the continuous one; live export %s" % (
        msg, "bit-identical to" if same else "DIFFERS from",
        "equals the parameters" if exp_ok else "DIFFERS from the parameters")


# bench: a 1 B-parameter stack of bf16 Linear layers (60 x 4096 x 4096, no bias)
BENCH_LAYERS, BENCH_WIDTH, BENCH_BATCH = 60, 4096, 16


def _bench_model(dtype):
    layers = [torch.nn.Linear(BENCH_WIDTH, BENCH_WIDTH, bias=False, device=DEV, dtype=dtype)
              for _ in range(BENCH_LAYERS)]
    return torch.nn.Sequential(*layers)


def _timed(fwd_bwd, step, reps=5, warm=2):
    """Median wall times in ms of fwd_bwd() and of the step() after it (the GPU idle before
    each part starts and waited for when it ends)."""
    fb, st = [], []
    for i in range(warm + reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fwd_bwd()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= warm:
            fb.append((t1 - t0) * 1e3)
            st.append((time.perf_counter() - t1) * 1e3)
    return sorted(fb)[len(fb) // 2], sorted(st)[len(st) // 2]


def _daemon_status():
    import json
    import test_checkpoint as tc
    out = subprocess.run([tc.zeroctl(), "-s", os.environ["ZEROD_SOCKET"], "--json", "status"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _attach_measured(model, cfg):
    """initialize() with what the daemon took from the GPU at its attach: the drop in free
    device memory, plus the model's own storage the trainer gave back (its parameters are
    views of the daemon's region now). Returns (engine, bytes, free memory before)."""
    import zerod.torch
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info(DEV)[0]
    engine, _, _, _ = zerod.torch.initialize(model=model, model_parameters=model.parameters(),
                                             config=cfg)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return engine, free0 - torch.cuda.mem_get_info(DEV)[0] + model_bytes, free0 + model_bytes


def _terms_formula(st):
    return sum(t["formula_bytes"] for t in st.get("memory", []))


def _bench_overhead():
    """The daemon's fixed device memory, measured on a tiny job: what it takes beyond the
    formula of its terms (its CUDA context, NCCL's communicator, the regions' granularity)."""
    engine, taken, _ = _attach_measured(zr.MLP(1).to(DEV), zr.config())
    st = _daemon_status()
    engine.close()
    return taken - _terms_formula(st)


def _bench_zerod():
    model = _bench_model(torch.bfloat16)
    cfg = {"train_micro_batch_size_per_gpu": BENCH_BATCH,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
           "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    engine, taken, free0 = _attach_measured(model, cfg)
    x = torch.randn(BENCH_BATCH, BENCH_WIDTH, device=DEV, dtype=torch.bfloat16)

    def fwd_bwd():
        engine.backward(engine(x).float().pow(2).mean())
    fb, st = _timed(fwd_bwd, engine.step)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    later = free0 - torch.cuda.mem_get_info(DEV)[0]  # after the steps too
    out = {"fwd_bwd_ms": fb, "step_ms": st, "taken": taken, "later": later,
           "status": _daemon_status(),
           "numel": sum(p.numel() for p in model.parameters())}
    engine.close()
    return out


def _memory_check(z, overhead):
    """The daemon's device memory against the formula of its terms (docs/semantics.md), within
    5%: the terms it reports, and what the GPU lost when it attached, less the daemon's fixed
    overhead measured on a tiny job in the same run (its CUDA context, NCCL's communicator)."""
    st = z["status"]
    terms = st.get("memory", [])
    formula = _terms_formula(st)
    alloc = sum(t["bytes"] for t in terms)
    rows = ", ".join("%s %.2f GiB (%s)" % (t["name"], t["bytes"] / 2**30, t["formula"])
                     for t in terms if t["bytes"] or t["formula_bytes"])
    ok = formula > 0 and abs(alloc - formula) <= 0.05 * formula and \
        abs(z["taken"] - overhead - formula) <= 0.05 * formula and \
        abs(z["later"] - z["taken"]) <= 0.05 * formula
    return ok, ("memory: terms %.2f GiB, formula %.2f GiB; the GPU lost %.2f GiB at attach, "
                "%.2f of them the daemon's fixed overhead (a tiny job's loss beyond its formula)"
                ", and %.2f GiB after the steps (tolerance 5%% of the formula); %s; device %.1f "
                "of %.1f GiB free, MPS %s" % (
                    alloc / 2**30, formula / 2**30, z["taken"] / 2**30, overhead / 2**30,
                    z["later"] / 2**30, rows,
                    st.get("device_free_bytes", 0) / 2**30,
                    st.get("device_total_bytes", 0) / 2**30,
                    "running" if st.get("mps") else "not running"))


def case_step1b():
    """One training iteration of the 1 B-parameter bf16 model with zerod (stage 2: the
    gradients to the daemon, the fused update, bf16 parameters back) against the same model
    with fp32 parameters, bf16 autocast and torch.optim.AdamW(fused=True) on the same GPU."""
    with zf.Cluster(1, device=DEV) as c:
        overhead = c.run(_bench_overhead, (), job="tiny")[0]
    with zf.Cluster(1, device=DEV) as c:
        z = c.run(_bench_zerod, ())[0]
    model = _bench_model(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    x = torch.randn(BENCH_BATCH, BENCH_WIDTH, device=DEV)

    def fwd_bwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = model(x)
        y.float().pow(2).mean().backward()

    def step():
        opt.step()
        opt.zero_grad(set_to_none=False)
    t_fb, t_st = _timed(fwd_bwd, step)
    del model, opt
    torch.cuda.empty_cache()
    z_it, t_it = z["fwd_bwd_ms"] + z["step_ms"], t_fb + t_st
    msg = ("%.2f B params: zerod fwd+bwd with the bucket hand-off %.1f ms + step %.1f ms = %.1f "
           "ms; torch AdamW(fused) fwd+bwd %.1f ms + step %.1f ms = %.1f ms; iteration zerod / "
           "torch %.2f" % (z["numel"] / 1e9, z["fwd_bwd_ms"], z["step_ms"], z_it, t_fb, t_st,
                           t_it, z_it / t_it))
    ok, mem = _memory_check(z, overhead)
    return ok, msg + "; " + mem


CASES = [
    ("fp32", lambda: case_fp32()),
    ("fp32-accum", lambda: case_fp32(gas=2)),
    ("fp32-stage1", lambda: case_fp32(stage=1)),
    ("bf16", lambda: case_half("bf16")),
    ("fp16", lambda: case_half("fp16")),
    ("kill9", case_kill9),
    ("ckpt", case_ckpt),
    ("offload", lambda: case_fp32(offload=True)),
    ("offload-s1", lambda: case_fp32(stage=1, gas=2, offload=True)),
    ("offload-bf16", lambda: case_half("bf16", offload=True)),
    ("step1b", case_step1b),
]


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child-kill":
        _train(zr.config(), STEPS, kill_after=int(sys.argv[2]))
        return 1  # not reached: the trainer kills itself
    if not torch.cuda.is_available():
        print("train_check: no CUDA device for torch; nothing to check")
        return 77
    want = sys.argv[1:] or [n for n, _ in CASES]
    failed = 0
    rows = []
    for name, fn in CASES:
        if name not in want:
            continue
        t0 = time.monotonic()
        try:
            ok, msg = fn()
        except Exception:
            ok, msg = False, traceback.format_exc().strip().splitlines()[-1]
            traceback.print_exc()
        failed += not ok
        rows.append("%-12s %-5s %5.1f s  %s" % (name, "pass" if ok else "FAIL",
                                              time.monotonic() - t0, msg))
        print("train_check: " + rows[-1], flush=True)
    print("\ntrain_check summary\n" + "\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
