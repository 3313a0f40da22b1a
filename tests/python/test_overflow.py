#!/usr/bin/env python3
"""fp16 overflow: an injected inf gradient skips the step; skipped_steps and get_loss_scale()
follow the dynamic loss scaler of docs/semantics.md §4 step 3; the floor is an error.

    test_overflow.py [--world N]

The two-group MLP in fp16 (math in fp32 inside forward: torch 1.13 has no fp16 matmul on the
CPU; the parameter gradients still come back fp16), 20 boundaries, initial_scale_power 4,
loss_scale_window 3, hysteresis 2. Rank 0 multiplies its loss by inf at the boundaries in
INJECT (the overflow flag is a MAX over ranks, so every rank skips). At every boundary:
  - was_step_applied is False exactly at the injected boundaries, global_steps counts the
    applied ones, skipped_steps the others;
  - get_loss_scale() equals the scaler of §3.2 replayed here;
  - a skipped step leaves every parameter bit-identical;
  - on an applied step get_global_grad_norm() (the daemon's unscaled norm) equals the fp32
    norm of the averaged gradient within 1e-2 (fp16 rounds each scaled element to 2^-11
    relative; 1e-2 leaves room for elements that fall into fp16 subnormals) -- so the loss
    really was multiplied by the scale and divided back.
Then, world 1: with the scale at min_loss_scale and hysteresis 1, an overflow makes
engine.step() raise zerod.ZerodError named ERR_LOSS_SCALE.
"""
import math
import sys

import zd_fixture as zf

torch = zf.require_torch()
import zd_ref as zr  # noqa: E402

BOUNDARIES = 20
INJECT = {2, 3, 4, 9, 13, 14}
SCALER = {"initial_scale_power": 4, "loss_scale_window": 3, "hysteresis": 2,
          "min_loss_scale": 1}


class Scaler:
    """docs/semantics.md §4 step 3, line by line."""

    def __init__(self, power, window, hysteresis, min_scale, consecutive=False):
        self.cur_scale = 2.0 ** power
        self.window, self.hyst_cfg, self.min_scale = window, hysteresis, min_scale
        self.consecutive = consecutive
        self.cur_hyst = hysteresis
        self.cur_iter, self.last_overflow_iter = 0, -1

    def update(self, overflow):
        if overflow:
            if self.hyst_cfg == 1 or self.cur_hyst == 1:
                if self.cur_scale == self.min_scale:
                    raise RuntimeError("loss scale already at minimum")
                self.cur_scale = max(self.cur_scale / 2, self.min_scale)
            else:
                self.cur_hyst -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive:
                self.cur_hyst = self.hyst_cfg
            stable = self.cur_iter - self.last_overflow_iter - 1
            if stable > 0 and stable % self.window == 0:
                if not self.consecutive:
                    self.cur_hyst = self.hyst_cfg
                self.cur_scale *= 2
        self.cur_iter += 1


def _train(cfg):
    import zerod.torch
    model = zr.MLP(1, compute_dtype=torch.float32)
    engine, _, _, _ = zerod.torch.initialize(model=model, model_parameters=zr.param_groups(model),
                                             config=cfg)
    assert all(p.dtype == torch.float16 for p in model.parameters())
    rank = engine.rank
    log = []
    for b in range(BOUNDARIES):
        before = zr.params_of(model)
        scale_used = engine.get_loss_scale()
        # the fp32 gradient at the current parameters, for the norm check
        shadow = zr.MLP(1)
        with torch.no_grad():
            for d, p in zip(shadow.parameters(), model.parameters()):
                d.copy_(p.float())
        x, t = zr.batch(b, 0, rank)
        g32 = torch.autograd.grad(zr.loss_fn(shadow(x), t), list(shadow.parameters()))
        loss = zr.loss_fn(engine(x), t)
        if rank == 0 and b in INJECT:
            loss = loss * float("inf")
        engine.backward(loss)
        engine.step()
        log.append({"applied": engine.was_step_applied(), "global_steps": engine.global_steps,
                    "skipped_steps": engine.skipped_steps, "scale": engine.get_loss_scale(),
                    "scale_used": scale_used, "grad_norm": engine.get_global_grad_norm(),
                    "g32": [g.clone() for g in g32], "before": before,
                    "after": zr.params_of(model)})
    engine.close()
    return log


def check_world(world):
    cfg = zr.config(dtype="fp16", extra={"fp16": SCALER})
    with zf.Cluster(world) as c:
        logs = c.run(_train, (cfg,))
    sc = Scaler(SCALER["initial_scale_power"], SCALER["loss_scale_window"],
                SCALER["hysteresis"], SCALER["min_loss_scale"])
    applied = skipped = 0
    for b in range(BOUNDARIES):
        overflow = b in INJECT
        want_used = sc.cur_scale
        sc.update(overflow)
        applied += not overflow
        skipped += overflow
        norm = math.sqrt(sum(float(sum(log[b]["g32"][i] for log in logs).double().div(world)
                                   .pow(2).sum()) for i in range(len(logs[0][b]["g32"]))))
        for r, log in enumerate(logs):
            e = log[b]
            where = "boundary %d rank %d" % (b, r)
            assert e["scale_used"] == want_used, (where, e["scale_used"], want_used)
            assert e["applied"] == (not overflow), (where, e["applied"])
            assert e["global_steps"] == applied, (where, e["global_steps"], applied)
            assert e["skipped_steps"] == skipped, (where, e["skipped_steps"], skipped)
            assert e["scale"] == sc.cur_scale, (where, e["scale"], sc.cur_scale)
            same = all(torch.equal(a, c) for a, c in zip(e["before"], e["after"]))
            if overflow:
                assert same, where + ": a skipped step changed the parameters"
                assert e["grad_norm"] == float("inf"), (where, e["grad_norm"])
            else:
                assert not same, where + ": an applied step left the parameters unchanged"
                rel = abs(e["grad_norm"] - norm) / norm
                assert rel <= 1e-2, (where, e["grad_norm"], norm)
    print("overflow world %d: %d boundaries, skipped %s, scales %s" % (
        world, BOUNDARIES, sorted(INJECT), [log["scale"] for log in logs[0]]))


def _floor(cfg):
    import zerod
    import zerod.torch
    model = zr.MLP(1, compute_dtype=torch.float32)
    engine, _, _, _ = zerod.torch.initialize(model=model, config=cfg)
    assert engine.get_loss_scale() == 1.0
    x, t = zr.batch(0, 0, 0)
    engine.backward(zr.loss_fn(engine(x), t) * float("inf"))
    try:
        engine.step()
    except zerod.ZerodError as e:
        assert e.name == "ERR_LOSS_SCALE", e
        print("overflow at the floor: %s" % e)
        engine.close()
        return True
    raise AssertionError("an overflow at min_loss_scale with hysteresis 1 did not fail")


def main():
    world = zf.parse_world()
    zf.require_world(world)
    check_world(world)
    if world == 1:
        cfg = zr.config(dtype="fp16", extra={"fp16": {"initial_scale_power": 0, "hysteresis": 1,
                                                      "min_loss_scale": 1}})
        # the daemon logs the failed step as a warning; allow no ERROR
        with zf.Cluster(1) as c:
            c.run(_floor, (cfg,))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
