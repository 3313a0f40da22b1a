#!/usr/bin/env python3
"""Parity of zerod.torch with a single-process torch optimizer (docs/semantics.md §4).

    test_parity.py CASE [--world N]

Cases (20 optimizer steps of the two-group MLP, fp32, gradient_clipping 0 since torch's
optimizers do not clip, except in "clip"):
  adamw          AdamW, stage 2           == torch.optim.AdamW on the averaged gradients
  accum4         + gradient_accumulation_steps 4
  lr_schedule    + a LambdaLR on the returned optimizer (lr reaches the daemon with each step)
  adam_l2        optimizer "Adam", adam_w_mode false == torch.optim.Adam(weight_decay=...)
  clip           gradient_clipping 0.05 == clip_grad_norm_(0.05) before torch's AdamW
  stage1         stage 1 == stage 2 (gradient_accumulation_steps 1 and 2; see run_stage1)

Tolerance: max over tensors of max|zerod - torch| / max|torch| <= 1e-5. Both sides apply the
same fp32 Adam to the same data; they differ only in rounding (the daemon's fused kernel
orders the operations differently; torch's gradient is the mean computed inside backward,
the daemon's the sum of raw gradients times 1/(N G)). A few ulps (1e-7 relative) per step,
carried through 20 steps, stays well under 1e-5; a wrong lr, weight decay, bias correction,
accumulation factor or group mapping is off by far more (>= 1e-3).

With --world N > 1 each rank draws different data; the reference averages over ranks. Skips
(exit 77) while zerod refuses N.
"""
import sys

import zd_fixture as zf

torch = zf.require_torch()
import zd_ref as zr  # noqa: E402

STEPS = 20
TOL = 1e-5


def lr_lambda(s):
    return 1.0 / (1.0 + 0.1 * s)


CASES = {
    "adamw": dict(cfg=dict(), ref=dict()),
    "accum4": dict(cfg=dict(gas=4), ref=dict(gas=4)),
    "lr_schedule": dict(cfg=dict(), ref=dict(lr_lambda=lr_lambda), train=dict(lr_lambda=lr_lambda)),
    "adam_l2": dict(cfg=dict(optimizer="Adam", adam_w_mode=False), ref=dict(l2=True)),
    "clip": dict(cfg=dict(clipping=0.05), ref=dict(clip=0.05)),
}


def run_case(name, world):
    spec = CASES[name]
    cfg = zr.config(**spec["cfg"])
    with zf.Cluster(world) as c:
        results = c.run(_train, (cfg, STEPS, spec.get("train", {})))
    ref = zr.reference_train(STEPS, world=world, **spec["ref"])
    for r, res in enumerate(results):
        assert len(res["steps"]) == STEPS, res["steps"]
        assert [s["step"] for s in res["steps"]] == list(range(1, STEPS + 1))
        d = zr.max_rel_diff(res["params"], ref)
        print("%s world %d rank %d: max relative difference to torch %.3g (tolerance %g)"
              % (name, world, r, d, TOL))
        assert d <= TOL, "%s: rank %d differs from torch by %.3g" % (name, r, d)
    # every rank holds the same parameters, bit for bit
    for r in range(1, world):
        for a, b in zip(results[0]["params"], results[r]["params"]):
            assert torch.equal(a, b), "rank %d's parameters differ from rank 0's" % r


def _train(cfg, steps, kwargs):
    return zr.zerod_train(cfg, steps, **kwargs)


def run_stage1(world):
    """Stage 1 == stage 2. Bit for bit when the reduction adds the same numbers in the same
    order: world 1 (any accumulation) or gradient_accumulation_steps 1 (any world). With N > 1
    ranks and G > 1 micro-steps stage 2 sums (g_0,r0 + g_0,r1) + (g_1,r0 + g_1,r1) while stage 1
    sums (g_0,r0 + g_1,r0) + (g_0,r1 + g_1,r1): fp32 addition is not associative, so there the
    bound is 1e-6 relative (a few ulps per step over 20 steps)."""
    for gas in (1, 2):
        out = {}
        for stage in (1, 2):
            cfg = zr.config(stage=stage, gas=gas)
            with zf.Cluster(world) as c:
                out[stage] = c.run(_train, (cfg, STEPS, {}))
        exact = world == 1 or gas == 1
        for r in range(world):
            if exact:
                for i, (a, b) in enumerate(zip(out[1][r]["params"], out[2][r]["params"])):
                    assert torch.equal(a, b), (
                        "gas %d rank %d tensor %d: stage 1 and stage 2 differ (max %g)"
                        % (gas, r, i, (a - b).abs().max().item()))
            else:
                d = zr.max_rel_diff(out[1][r]["params"], out[2][r]["params"])
                assert d <= 1e-6, "gas %d rank %d: stage 1 vs 2 differ by %.3g" % (gas, r, d)
        ref = zr.reference_train(STEPS, world=world, gas=gas)
        d = zr.max_rel_diff(out[1][0]["params"], ref)
        print("stage1 world %d gas %d: stage 1 == stage 2 %s; %.3g from torch"
              % (world, gas, "bit for bit" if exact else "within 1e-6", d))
        assert d <= TOL


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--world")]
    world = zf.parse_world()
    args = [a for a in args if not a.isdigit()]
    if len(args) != 1 or args[0] not in list(CASES) + ["stage1"]:
        print("usage: test_parity.py {%s} [--world N]" % "|".join(list(CASES) + ["stage1"]))
        return 2
    zf.require_world(world)
    if args[0] == "stage1":
        run_stage1(world)
    else:
        run_case(args[0], world)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
