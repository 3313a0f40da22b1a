#!/usr/bin/env python3
"""DeepSpeed's config keys and initialize() arguments through zerod.torch
(docs/training-config.md), against real daemons:

  batch        the batch triple resolved by the daemon, and a disagreeing one refused with
               all three values
  scheduler    "scheduler": WarmupLR / WarmupDecayLR stepped by the engine after each applied
               step: the lr the daemon used equals a torch AdamW stepped with the same lrs
  refused      a refused config (Bogus scheduler, amp, auto, untested optimizer) changes
               nothing: the model keeps its dtype, no job is left
  client_opt   optimizer=torch.optim.AdamW(...) and a StepLR on it == the same in the config
  progress     steps_per_print: rank 0's progress line
  ignored      a key ignored with a warning names itself
  as_deepspeed a config file read as DeepSpeed reads it: the bf16 section of DeepSpeedExamples'
               cifar config (fp16's loss-scale keys) attaches with one warning naming them,
               "steps_per_print": Infinity (Accelerate's) never prints, "stage": "1" is 1,
               "bfloat16" is bf16; a config with three problems names all three at once
  accum        stage 1 with data_types.grad_accum_dtype fp32 == stage 2, bit for bit (bf16,
               gas 4); the default (the param dtype, DeepSpeed's) sums in bf16 and differs

    test_ds_config.py [CASE ...] [--world N]     (default: every case, world 1)
"""
import io
import json
import logging
import os
import sys
import warnings

import zd_fixture as zf

torch = zf.require_torch()
import zd_ref as zr  # noqa: E402
import zerod  # noqa: E402
import zerod.torch as zt  # noqa: E402
from zerod import lr_schedules  # noqa: E402

STEPS = 12


def _expect_error(fn, kind, *needles):
    try:
        fn()
    except kind as e:
        for n in needles:
            assert n in str(e), "'%s' not in: %s" % (n, e)
        return str(e)
    raise AssertionError("accepted; wanted %s with %s" % (kind.__name__, needles))


def case_batch(sock, tmp):
    cfg = zr.config(gas=1)
    del cfg["gradient_accumulation_steps"]
    cfg["train_micro_batch_size_per_gpu"] = 2
    cfg["train_batch_size"] = 8
    engine, _, _, _ = zt.initialize(model=zr.MLP(1), config=cfg, job="cfg-batch",
                                    socket_path=sock)
    got = (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
           engine.gradient_accumulation_steps())
    engine.close()
    assert got == (8, 2, 4), got
    cfg["gradient_accumulation_steps"] = 3
    msg = _expect_error(lambda: zt.initialize(model=zr.MLP(1), config=cfg, job="cfg-batch",
                                              socket_path=sock),
                        zerod.ZerodError, "'train_batch_size' 8", "micro", "3 disagree")
    print("batch: 8 = 2 x 4 x 1 resolved; refused: %s" % msg)


def _train_with(engine, steps, rank=0):
    lrs = []
    for s in range(steps):
        for k in range(engine.gradient_accumulation_steps()):
            x, t = zr.batch(s, k, rank)
            engine.backward(zr.loss_fn(engine(x), t))
            lrs.append(list(engine.get_lr()))
            engine.step()
    return lrs[::engine.gradient_accumulation_steps()]


def _reference(lrs_per_step):
    """torch AdamW on the same groups, each step's lrs set by hand."""
    model = zr.MLP(1)
    groups = zr.param_groups(model)
    for g in groups:
        g["betas"], g["eps"] = zr.BETAS, zr.EPS
    opt = torch.optim.AdamW(groups)
    for s, lrs in enumerate(lrs_per_step):
        for g, lr in zip(opt.param_groups, lrs):
            g["lr"] = lr
        opt.zero_grad()
        x, t = zr.batch(s, 0, 0)
        zr.loss_fn(model(x), t).backward()
        opt.step()
    return zr.params_of(model)


def case_scheduler(sock, tmp):
    for sched in ({"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.02,
                                                  "warmup_num_steps": 5,
                                                  "warmup_type": "linear"}},
                  {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-4,
                                                       "warmup_max_lr": 0.01,
                                                       "warmup_num_steps": 4,
                                                       "total_num_steps": STEPS}}):
        cfg = zr.config(extra={"scheduler": sched})
        model = zr.MLP(1)
        engine, opt, _, sch = zt.initialize(model=model, model_parameters=zr.param_groups(model),
                                            config=cfg, job="cfg-sched", socket_path=sock)
        assert type(sch).__name__ == sched["type"] and engine.lr_scheduler is sch, sch
        lrs = _train_with(engine, STEPS)
        # the schedule's own sequence, on a stand-in optimizer with the same groups
        stand_in = type("Opt", (), {})()
        stand_in.param_groups = [{"lr": g["lr"]} for g in zr.GROUPS]
        ref_sched = lr_schedules.build(sched, stand_in)
        want = []
        for _ in range(STEPS):
            want.append([g["lr"] for g in stand_in.param_groups])
            ref_sched.step()
        assert lrs == want, (lrs, want)
        params = zr.params_of(model)
        engine.close()
        d = zr.max_rel_diff(params, _reference(lrs))
        print("scheduler %s: lrs %s ... %s; %.3g from torch AdamW with those lrs"
              % (sched["type"], lrs[0], lrs[-1], d))
        assert d <= 1e-5, d


def case_refused(sock, tmp):
    bad = [
        ({"scheduler": {"type": "WarmupLr"}}, ValueError, "scheduler.type", "WarmupLR"),
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 3}}}, ValueError,
         "scheduler.params.warmup_num_step", "warmup_num_steps"),
        ({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4,
                                                      "cycle_max_lr": 1e-3}}},
         ValueError, "cycle_momentum", None),
        ({"amp": {"enabled": True}}, zerod.ZerodError, "'amp.enabled': true is not supported",
         "Apex"),
        ({"train_micro_batch_size_per_gpu": "auto"}, zerod.ZerodError, "\"auto\"", "Hugging Face"),
        ({"sparse_gradients": True}, zerod.ZerodError, "sparse_gradients", "dense"),
        ({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 10}}, zerod.ZerodError,
         "did you mean 'zero_optimization.reduce_bucket_size'", None),
    ]
    for extra, kind, n1, n2 in bad:
        model = zr.MLP(1)
        cfg = zr.config(dtype="bf16", extra=extra)
        needles = [n for n in (n1, n2) if n]
        msg = _expect_error(lambda: zt.initialize(model=model, config=cfg, job="cfg-bad",
                                                  socket_path=sock), kind, *needles)
        assert all(p.dtype == torch.float32 for p in model.parameters()), "model converted"
        print("refused, model unchanged: %s" % msg)
    model = zr.MLP(1)
    _expect_error(lambda: zt.initialize(model=model, config=zr.config(),
                                        optimizer=torch.optim.SGD(model.parameters(), 0.1),
                                        job="cfg-bad", socket_path=sock),
                  ValueError, "zero_allow_untested_optimizer")
    _expect_error(lambda: zt.initialize(model=model,
                                        config=zr.config(extra={
                                            "zero_allow_untested_optimizer": True}),
                                        optimizer=torch.optim.SGD(model.parameters(), 0.1),
                                        job="cfg-bad", socket_path=sock),
                  ValueError, "SGD is not supported", "Adam and AdamW only")
    # nothing was left attached: a good config attaches at once
    engine, _, _, _ = zt.initialize(model=zr.MLP(1), config=zr.config(), job="cfg-bad",
                                    socket_path=sock, attach_wait_s=0)
    engine.close()


def case_client_opt(sock, tmp):
    """DeepSpeed's optimizer= and lr_scheduler= (built on the client optimizer)."""
    results = []
    for client in (False, True):
        model = zr.MLP(1)
        groups = zr.param_groups(model)
        for g in groups:
            g["betas"], g["eps"] = zr.BETAS, zr.EPS
        cfg = zr.config(lr=0.5)  # the client optimizer's hyper-parameters win over these
        if client:
            opt = torch.optim.AdamW(groups)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
            engine, zopt, _, zsched = zt.initialize(model=model, optimizer=opt,
                                                    lr_scheduler=sched, config=cfg,
                                                    job="cfg-client", socket_path=sock)
            assert zsched is sched and sched.optimizer is zopt
        else:
            cfg["optimizer"]["params"]["lr"] = 1e-3
            cfg["scheduler"] = {"type": "StepLR", "params": {"step_size": 3, "gamma": 0.5}}
            engine, zopt, _, zsched = zt.initialize(model=model, model_parameters=groups,
                                                    config=cfg, job="cfg-client",
                                                    socket_path=sock)
        lrs = _train_with(engine, STEPS)
        results.append((lrs, zr.params_of(model)))
        engine.close()
    (lrs_a, pa), (lrs_b, pb) = results
    assert lrs_a == lrs_b, (lrs_a, lrs_b)
    assert all(torch.equal(a, b) for a, b in zip(pa, pb)), "client optimizer differs from config"
    d = zr.max_rel_diff(pb, _reference(lrs_b))
    print("client optimizer + StepLR == config optimizer + scheduler, bit for bit; %.3g from "
          "torch" % d)
    assert d <= 1e-5


def case_progress(sock, tmp):
    log = logging.getLogger("zerod")
    buf = io.StringIO()
    h = logging.StreamHandler(buf)
    log.addHandler(h)
    log.setLevel(logging.INFO)
    try:
        cfg = zr.config(extra={"steps_per_print": 4, "train_micro_batch_size_per_gpu": zr.BATCH})
        engine, _, _, _ = zt.initialize(model=zr.MLP(1), config=cfg, job="cfg-progress",
                                        socket_path=sock)
        _train_with(engine, 8)
        engine.close()
    finally:
        log.removeHandler(h)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("step=")]
    assert [ln.split(",")[0] for ln in lines] == ["step=4", "step=8"], buf.getvalue()
    for key in ("skipped=0", "lr=[", "loss_scale=1", "grad_norm=", "samples/s="):
        assert key in lines[0], (key, lines[0])
    print("progress: %s" % lines[-1])


def case_ignored(sock, tmp):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        engine, _, _, _ = zt.initialize(model=zr.MLP(1),
                                        config=zr.config(extra={"wall_clock_breakdown": True,
                                                                "flops_profiler": {}}),
                                        job="cfg-ignored", socket_path=sock)
        engine.close()
    text = " ".join(str(x.message) for x in w)
    assert "wall_clock_breakdown" in text and "flops_profiler" in text, text
    print("ignored: %s" % text)


def _attach_file(sock, tmp, name, cfg):
    """initialize() with cfg written to a file (json.dump writes Infinity as Python's json does);
    returns the engine and the warnings it gave."""
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(cfg, f)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        engine, _, _, _ = zt.initialize(model=zr.MLP(1), config=path, job="cfg-ds",
                                        socket_path=sock)
    return engine, [str(x.message) for x in w if "zerod" in str(x.message)]


def case_as_deepspeed(sock, tmp):
    cifar_bf16 = {"enabled": True, "bf16_master_weights_and_grads": False, "loss_scale": 0,
                  "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1,
                  "initial_scale_power": 15}
    cfg = zr.config(dtype="bf16", extra={"bf16": cifar_bf16, "steps_per_print": float("inf"),
                                         "zero_optimization": {"stage": "1"}})
    log = logging.getLogger("zerod")
    buf = io.StringIO()
    h = logging.StreamHandler(buf)
    log.addHandler(h)
    log.setLevel(logging.INFO)
    try:
        engine, warned = _attach_file(sock, tmp, "cifar.json", cfg)
        assert engine.stage == 1 and engine.dtype == torch.bfloat16, (engine.stage, engine.dtype)
        _train_with(engine, 3)
        engine.close()
    finally:
        log.removeHandler(h)
    assert len(warned) == 1, warned
    for k in ("loss_scale", "loss_scale_window", "hysteresis", "min_loss_scale",
              "initial_scale_power"):
        assert "bf16.%s" % k in warned[0], (k, warned[0])
    assert "step=" not in buf.getvalue(), "steps_per_print Infinity printed: " + buf.getvalue()
    print("as_deepspeed: cifar's bf16 section, Infinity, \"1\": one warning: %s" % warned[0])
    # the old section name
    cfg = zr.config(extra={"bfloat16": {"enabled": True}})
    del cfg["bf16"]
    engine, warned = _attach_file(sock, tmp, "bfloat16.json", cfg)
    assert engine.dtype == torch.bfloat16 and not warned, (engine.dtype, warned)
    engine.close()
    # every problem at once
    cfg = zr.config(extra={"gradient_clipping": -1, "zero_optimization": {"stage": "two"},
                           "optimizer": {"params": {"lr": float("nan")}}})
    model = zr.MLP(1)
    msg = _expect_error(lambda: zt.initialize(model=model, config=cfg, job="cfg-ds",
                                              socket_path=sock),
                        zerod.ZerodError, "3 problems in the config",
                        "'zero_optimization.stage': expected 1 or 2, got a string \"two\"",
                        "'gradient_clipping'", "'optimizer.params.lr'", "got nan")
    print("as_deepspeed: refused at once: %s" % msg)


def _accum_run(world, stage, accum):
    extra = {"data_types": {"grad_accum_dtype": accum}} if accum else None
    cfg = zr.config(stage=stage, gas=4, dtype="bf16", extra=extra)
    with zf.Cluster(world) as c:
        return c.run(_accum_train, (cfg,))


def _accum_train(cfg):
    return zr.zerod_train(cfg, STEPS)


def case_accum(world):
    s2 = _accum_run(world, 2, None)
    s1_fp32 = _accum_run(world, 1, "fp32")
    s1_default = _accum_run(world, 1, None)
    for r in range(world):
        same = all(torch.equal(a, b) for a, b in zip(s1_fp32[r]["params"], s2[r]["params"]))
        d32 = zr.max_rel_diff(s1_fp32[r]["params"], s2[r]["params"])
        d16 = zr.max_rel_diff(s1_default[r]["params"], s2[r]["params"])
        print("accum world %d rank %d: stage 1 fp32 sum vs stage 2 %s (%.3g); bf16 sum %.3g"
              % (world, r, "bit for bit" if same else "differ", d32, d16))
        # bit for bit at world 1; at world N > 1 the sums are ordered differently (fp32 ulps)
        assert same if world == 1 else d32 <= 1e-6, d32
        assert d16 > d32, "the bf16 sum should differ from the fp32 one"


CASES = {"batch": case_batch, "scheduler": case_scheduler, "refused": case_refused,
         "client_opt": case_client_opt, "progress": case_progress, "ignored": case_ignored,
         "as_deepspeed": case_as_deepspeed}


def main():
    world = zf.parse_world()
    names = [a for a in sys.argv[1:] if not a.startswith("--") and not a.isdigit()]
    names = names or list(CASES) + ["accum"]
    for n in names:
        if n != "accum" and n not in CASES:
            print("usage: test_ds_config.py [%s|accum ...] [--world N]" % "|".join(CASES))
            return 2
    zf.require_world(world)
    single = [n for n in names if n != "accum"]
    if single:
        with zf.Cluster(1) as c:
            for n in single:
                CASES[n](c.daemons[0].socket, c.tmp)
    if "accum" in names:
        case_accum(world)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
