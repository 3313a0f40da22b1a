#!/usr/bin/env python3
"""zerod.lr_schedules against the formulas and, when DeepSpeed is at hand, against DeepSpeed's
own deepspeed/runtime/lr_schedules.py (needs no daemon).

  - every schedule type, with several parameter sets (log and linear warmup, momentum cycling
    on and off, stairs on and off, WarmupCosineLR's ratios, defaults), gives for 50 steps, for
    two param groups of different lr, the lr (and OneCycle's betas) that the formulas written
    out below give, what the constructor writes included; step(n) jumps too;
  - state_dict() after 20 steps, loaded into a fresh schedule, continues identically;
  - the constructors raise DeepSpeed's exceptions for bad arguments, and only warn where
    DeepSpeed only warns (unknown warmup_type, total_num_steps < warmup_num_steps);
  - check() names the bad key of a config's scheduler section, with "did you mean";
  - with DeepSpeed (ZEROD_DS_PYTHON=<a python with deepspeed>, or `import deepspeed` working
    here), the same cases run through DeepSpeed's schedules in that python (a subprocess
    printing JSON) and every lr, beta and get_last_lr() must agree to 1e-12 relative, every
    constructor error in kind.
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import warnings

import zd_fixture as zf

torch = zf.require_torch()
from zerod import lr_schedules as zls  # noqa: E402

STEPS = 50
CUT = 20  # state_dict() taken after this many steps
JUMPS = [100, 3]  # step(n) after the 50 steps
REL = 1e-12
LRS = [1e-3, 3e-4]  # the two param groups' lr

# (name, type, optimizer, params)
CASES = [
    ("warmup/log", "WarmupLR", "adamw", {
        "warmup_min_lr": 0.0, "warmup_max_lr": 0.001, "warmup_num_steps": 10,
        "warmup_type": "log"}),
    ("warmup/linear-lists", "WarmupLR", "adamw", {
        "warmup_min_lr": [1e-5, 2e-5], "warmup_max_lr": [1e-3, 5e-4], "warmup_num_steps": 16,
        "warmup_type": "linear"}),
    ("warmup/max-from-groups", "WarmupLR", "sgd", {"warmup_min_lr": 1e-6, "warmup_num_steps": 8}),
    ("warmup/one-step", "WarmupLR", "adamw", {
        "warmup_num_steps": 1, "warmup_type": "linear", "warmup_max_lr": 2e-3}),
    ("warmup/unknown-type", "WarmupLR", "adamw", {"warmup_num_steps": 12, "warmup_type": "cos"}),
    ("warmup/ctor-at-5", "WarmupLR", "adamw", {"warmup_num_steps": 10, "last_batch_iteration": 5}),
    ("decay/log", "WarmupDecayLR", "adamw", {
        "total_num_steps": 40, "warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3,
        "warmup_num_steps": 10}),
    ("decay/linear-lists", "WarmupDecayLR", "adamw", {
        "total_num_steps": 30, "warmup_min_lr": [0.0, 1e-6], "warmup_max_lr": [1e-3, 2e-4],
        "warmup_num_steps": 12, "warmup_type": "linear"}),
    ("decay/short-total", "WarmupDecayLR", "adamw", {"total_num_steps": 5, "warmup_num_steps": 10}),
    ("decay/max-from-groups", "WarmupDecayLR", "adamw", {
        "total_num_steps": 45, "warmup_max_lr": None, "warmup_num_steps": 5}),
    ("cosine/log", "WarmupCosineLR", "adamw", {
        "total_num_steps": 40, "warmup_num_steps": 10, "warmup_min_ratio": 0.1,
        "cos_min_ratio": 0.05}),
    ("cosine/linear", "WarmupCosineLR", "adamw", {
        "total_num_steps": 30, "warmup_num_steps": 5, "warmup_min_ratio": 0.0,
        "cos_min_ratio": 0.01, "warmup_type": "linear"}),
    ("cosine/defaults", "WarmupCosineLR", "adamw", {"total_num_steps": 50}),
    ("cosine/short-total", "WarmupCosineLR", "sgd", {
        "total_num_steps": 6, "warmup_num_steps": 8, "warmup_type": "linear",
        "cos_min_ratio": 0.2}),
    ("onecycle/momentum-decay", "OneCycle", "adamw", {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 10,
        "cycle_second_step_size": 15, "decay_step_size": 5, "decay_lr_rate": 0.5,
        "decay_mom_rate": 0.1, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}),
    ("onecycle/no-momentum-stairs", "OneCycle", "adamw", {
        "cycle_min_lr": [1e-4, 2e-4], "cycle_max_lr": [1e-3, 3e-3], "cycle_first_step_size": 8,
        "cycle_first_stair_count": 4, "cycle_momentum": False}),
    ("onecycle/asymmetric-stairs", "OneCycle", "adamw", {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 12,
        "cycle_first_stair_count": 3, "cycle_second_step_size": 6,
        "cycle_second_stair_count": 2, "decay_step_size": 4, "decay_lr_rate": 0.2,
        "cycle_min_mom": [0.8, 0.85], "cycle_max_mom": [0.9, 0.92]}),
    ("onecycle/sgd", "OneCycle", "sgd", {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 10}),
    ("onecycle/defaults", "OneCycle", "adamw", {"cycle_min_lr": 1e-5, "cycle_max_lr": 1e-2}),
    ("onecycle/no-second-half", "OneCycle", "adamw", {
        "cycle_min_lr": 2e-4, "cycle_max_lr": 2e-3, "cycle_first_step_size": 10,
        "cycle_second_step_size": 0, "decay_step_size": 3, "decay_lr_rate": 1.0,
        "decay_mom_rate": 0.01}),
    ("range/continuous", "LRRangeTest", "adamw", {
        "lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 5,
        "lr_range_test_step_rate": 2.0}),
    ("range/staircase", "LRRangeTest", "adamw", {
        "lr_range_test_min_lr": [1e-4, 5e-5], "lr_range_test_step_size": 7,
        "lr_range_test_step_rate": 0.5, "lr_range_test_staircase": True}),
    ("range/defaults", "LRRangeTest", "sgd", {}),
]

# constructor calls and the exception DeepSpeed raises ("ok": none)
ERROR_CASES = [
    ("WarmupLR", {"warmup_num_steps": 0}, "ValueError"),
    ("WarmupLR", {"warmup_num_steps": 10.0}, "ValueError"),
    ("WarmupLR", {"warmup_min_lr": [0.0, 0.0, 0.0]}, "ValueError"),
    ("WarmupLR", {"warmup_max_lr": [1e-3]}, "ValueError"),
    ("WarmupLR", {"warmup_type": "cosine"}, "ok"),
    ("WarmupLR", {"warmup_max_lrr": 1e-3}, "TypeError"),
    ("WarmupDecayLR", {"total_num_steps": 100, "warmup_num_steps": -3}, "ValueError"),
    ("WarmupDecayLR", {"total_num_steps": 5, "warmup_num_steps": 10}, "ok"),
    ("WarmupDecayLR", {}, "TypeError"),
    ("WarmupCosineLR", {"total_num_steps": 100, "warmup_num_steps": 0}, "ValueError"),
    ("WarmupCosineLR", {"total_num_steps": 100, "warmup_type": "exp"}, "ok"),
    ("LRRangeTest", {"lr_range_test_step_size": 0}, "ValueError"),
    ("LRRangeTest", {"lr_range_test_step_size": 2.5}, "ValueError"),
    ("LRRangeTest", {"lr_range_test_min_lr": (1e-3,)}, "ValueError"),
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 0},
     "ValueError"),
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_second_step_size": -1},
     "ValueError"),
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": [1e-3, 1e-3, 1e-3]}, "ValueError"),
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_min_mom": [0.8]},
     "ValueError"),
    ("OneCycle", {"cycle_min_lr": 1e-4}, "TypeError"),
]

# Run by this python on zerod.lr_schedules and by DeepSpeed's python on DeepSpeed's module: one
# code path for both, so the traces compare like for like.
DRIVER = r'''
import json, sys, warnings
import torch


def make_optimizer(kind, lrs):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=lrs[0], momentum=0.9)
    return torch.optim.AdamW(groups, lr=lrs[0], betas=(0.9, 0.999))


def snapshot(opt, sched):
    try:
        last = [float(x) for x in sched.get_last_lr()]
    except AssertionError:
        last = "assert"
    return {"it": sched.last_batch_iteration,
            "lr": [float(g["lr"]) for g in opt.param_groups],
            "betas": [list(g["betas"]) if "betas" in g else None for g in opt.param_groups],
            "last": last}


def new(mod, case, lrs):
    opt = make_optimizer(case["opt"], lrs)
    return opt, getattr(mod, case["type"])(opt, **case["params"])


def trace(mod, case, lrs, steps, cut, jumps):
    opt, sched = new(mod, case, lrs)
    out, sd = [snapshot(opt, sched)], None
    for i in range(steps):
        sched.step()
        out.append(snapshot(opt, sched))
        if i + 1 == cut:
            sd = json.loads(json.dumps(sched.state_dict()))
    jumped = []
    for it in jumps:
        sched.step(it)
        jumped.append(snapshot(opt, sched))
    opt, sched = new(mod, case, lrs)
    sched.load_state_dict(sd)
    resumed = [snapshot(opt, sched)]
    for _ in range(steps - cut):
        sched.step()
        resumed.append(snapshot(opt, sched))
    return {"trace": out, "jumps": jumped, "state_dict": sd, "resumed": resumed}


def error_kind(mod, type_name, params, lrs):
    try:
        getattr(mod, type_name)(make_optimizer("adamw", lrs), **params)
    except Exception as e:
        return type(e).__name__
    return "ok"


def run_all(mod, payload):
    lrs, a = payload["lrs"], payload["args"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {"cases": {c["name"]: trace(mod, c, lrs, *a) for c in payload["cases"]},
                "errors": [error_kind(mod, t, p, lrs) for t, p in payload["errors"]]}


def main_deepspeed():
    payload = json.load(sys.stdin)
    try:
        from deepspeed.runtime import lr_schedules
    except ImportError as e:
        print("ZD-NO-DEEPSPEED %s" % e, flush=True)
        return 0
    print("ZD-RESULT " + json.dumps(run_all(lr_schedules, payload)), flush=True)
    return 0
'''


def payload():
    return {"lrs": LRS, "args": [STEPS, CUT, JUMPS],
            "cases": [{"name": n, "type": t, "opt": o, "params": p} for n, t, o, p in CASES],
            "errors": [[t, p] for t, p, _ in ERROR_CASES]}


def driver():
    ns = {}
    exec(compile(DRIVER, "<lr-driver>", "exec"), ns)
    return ns


def close(a, b):
    return a == b or abs(a - b) <= REL * max(abs(a), abs(b))


def same(a, b, where):
    """a and b equal, numbers to REL; raises AssertionError naming the first difference."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        assert close(a, b), "%s: %r != %r" % (where, a, b)
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), "%s: %d entries != %d" % (where, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (where, i))
    elif isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), "%s: keys %s != %s" % (where, sorted(a), sorted(b))
        for k in a:
            same(a[k], b[k], "%s.%s" % (where, k))
    else:
        assert a == b, "%s: %r != %r" % (where, a, b)


# ---- the formulas, written out --------------------------------------------------------------

def pick(value, g):
    return value[g] if isinstance(value, (list, tuple)) else value


def warmup_fraction(p, it):
    w = max(2, p.get("warmup_num_steps", 1000))
    if p.get("warmup_type", "log") == "linear":
        return it / w
    return math.log(it + 1) / math.log(w)  # unknown types warm up as "log"


def warmup_lr(t, p, it, g):
    """WarmupLR / WarmupDecayLR: min + (max - min) * gamma."""
    lo = pick(p.get("warmup_min_lr", 0.0), g)
    hi = p.get("warmup_max_lr", None if t == "WarmupLR" else 0.001)
    hi = LRS[g] if hi is None else pick(hi, g)
    w = max(2, p.get("warmup_num_steps", 1000))
    if it < 0:
        return lo
    if it < w:
        gamma = warmup_fraction(p, it)
    elif t == "WarmupDecayLR":
        total = p["total_num_steps"]
        gamma = max(0.0, (total - it) / max(1, total - w))
    else:
        gamma = 1.0
    return lo + (hi - lo) * gamma


def cosine_lr(p, it, g):
    """WarmupCosineLR: the group's lr times a ratio; 0 before the first step."""
    if it < 0:
        return 0.0
    w = max(2, p.get("warmup_num_steps", 1000))
    if it < w:
        lo = p.get("warmup_min_ratio", 0.0)
        return LRS[g] * (lo + (1 - lo) * warmup_fraction(p, it))
    floor_ = p.get("cos_min_ratio", 0.0001)
    progress = min(1.0, (it - w + 1) / max(1, p["total_num_steps"] - w))
    return LRS[g] * (floor_ + (1 - floor_) * 0.5 * (1 + math.cos(math.pi * progress)))


def onecycle_shape(p):
    first = p.get("cycle_first_step_size", 2000)
    second = p.get("cycle_second_step_size")
    second = first if second is None else second
    k1 = p.get("cycle_first_stair_count", 0)
    k2 = p.get("cycle_second_stair_count")
    return first, second, k1, k1 if k2 is None else k2


def onecycle_height(p, it):
    """0 at the cycle's ends, 1 at its peak; b batches into the cycle (b = it + 1, modulo the
    cycle's length: b = length is the next cycle's start)."""
    first, second, k1, k2 = onecycle_shape(p)
    b = (it + 1) % (first + second)
    if b <= first:
        return math.floor(b * k1 / first) / k1 if k1 > 0 else b / first
    down = first + second - b
    return math.floor(down * k2 / second) / k2 if k2 > 0 else 1 - (b - first) / second


def onecycle_decay(p, it, rate_key):
    """(decay on, k / decay_step_size) k steps past the cycle."""
    first, second, _, _ = onecycle_shape(p)
    size, rate = p.get("decay_step_size", 0), p.get(rate_key, 0.0)
    on = size != 0 and rate != 0
    return on, rate * (it - first - second + 1) / size if on else 0.0


def onecycle_lr(p, it, g):
    first, second, _, _ = onecycle_shape(p)
    lo, hi = pick(p["cycle_min_lr"], g), pick(p["cycle_max_lr"], g)
    if it < first + second:
        return lo + (hi - lo) * onecycle_height(p, it)
    _, x = onecycle_decay(p, it, "decay_lr_rate")
    return lo / (1 + x)


def onecycle_betas(case, it, g, constructed):
    p = case[3]
    if case[2] == "sgd":
        return None
    if not p.get("cycle_momentum", True):
        return [0.9, 0.999]  # untouched
    lo, hi = pick(p.get("cycle_min_mom", 0.8), g), pick(p.get("cycle_max_mom", 0.9), g)
    if constructed:
        return [lo, 0.99]  # the constructor writes cycle_min_mom
    first, second, _, _ = onecycle_shape(p)
    if it < first + second:
        return [hi - (hi - lo) * onecycle_height(p, it), 0.99]
    _, x = onecycle_decay(p, it, "decay_mom_rate")
    return [hi * (1 + x), 0.99]


def range_lr(p, it, g):
    size = p.get("lr_range_test_step_size", 2000)
    n = (it + 1) / size
    if p.get("lr_range_test_staircase", False):
        n = math.floor(n)
    return pick(p.get("lr_range_test_min_lr", 1e-3), g) * (1 + p.get(
        "lr_range_test_step_rate", 1.0) * n)


def expected_lr(case, it, g):
    t, p = case[1], case[3]
    if t in ("WarmupLR", "WarmupDecayLR"):
        return warmup_lr(t, p, it, g)
    if t == "WarmupCosineLR":
        return cosine_lr(p, it, g)
    if t == "OneCycle":
        return onecycle_lr(p, it, g)
    return range_lr(p, it, g)


def expected_betas(case, it, g, constructed=False):
    if case[1] == "OneCycle":
        return onecycle_betas(case, it, g, constructed)
    return None if case[2] == "sgd" else [0.9, 0.999]


def expected_snapshot(case, it, constructed=False):
    lrs = [expected_lr(case, it, g) for g in range(len(LRS))]
    betas = [expected_betas(case, it, g, constructed) for g in range(len(LRS))]
    return {"it": it, "lr": lrs, "betas": betas, "last": lrs}


def expected_construction(case):
    start = case[3].get("last_batch_iteration", -1)
    if start != -1:  # the constructor leaves the optimizer alone
        betas = [expected_betas(case, 0, g) for g in range(len(LRS))]
        return {"it": start, "lr": list(LRS), "betas": betas, "last": "assert"}
    snap = expected_snapshot(case, -1, constructed=True)
    if case[1] == "OneCycle":
        snap["last"] = "assert"  # OneCycle's constructor sets no last lr
    return snap


def check_case(case, got):
    name, start = case[0], case[3].get("last_batch_iteration", -1)
    same(got["trace"][0], expected_construction(case), name + " construction")
    for k in range(1, STEPS + 1):
        same(got["trace"][k], expected_snapshot(case, start + k), "%s step %d" % (name, k))
    for snap, it in zip(got["jumps"], JUMPS):
        same(snap, expected_snapshot(case, it), "%s step(%d)" % (name, it))
    same(got["state_dict"], {"last_batch_iteration": start + CUT}, name + " state_dict")
    loaded = dict(expected_construction(case), it=start + CUT)  # load touches no lr
    same(got["resumed"][0], loaded, name + " after load_state_dict")
    same(got["resumed"][1:], got["trace"][CUT + 1:], name + " resumed")


# hand-computed values: lr at iteration it of group g
SPOT = [
    ("warmup/log", 4, 0, 1e-3 * math.log10(5)),   # log(5) / log(10) of the way
    ("warmup/log", 9, 0, 1e-3),                   # log(10) / log(10): the top a step early
    ("warmup/linear-lists", 8, 1, 2e-5 + (5e-4 - 2e-5) / 2),
    ("warmup/one-step", 1, 0, 1e-3),              # warmup_num_steps 1 counts as 2
    ("decay/log", 25, 0, 1e-5 + (1e-3 - 1e-5) * 0.5),  # (40 - 25) / (40 - 10)
    ("decay/linear-lists", 45, 1, 1e-6),          # past total_num_steps: warmup_min_lr
    ("cosine/log", 24, 1, 3e-4 * 0.525),          # half way down: 0.05 + 0.95 / 2
    ("cosine/log", 49, 0, 1e-3 * 0.05),           # past the end: cos_min_ratio
    ("cosine/linear", 2, 0, 1e-3 * 0.4),          # 2 / 5
    ("onecycle/momentum-decay", 9, 0, 1e-3),      # the peak after cycle_first_step_size
    ("onecycle/momentum-decay", 24, 0, 1e-4),     # the end of the cycle (10 + 15)
    ("onecycle/momentum-decay", 34, 0, 1e-4 / 2),  # 10 steps past it: 1 + 0.5 * 10 / 5
    ("onecycle/no-momentum-stairs", 4, 1, 2e-4 + 2.8e-3 * 0.5),  # stair 2 of 4
    ("range/continuous", 9, 0, 1e-4 * 5),         # 1 + 2 * 10 / 5
    ("range/staircase", 12, 1, 5e-5 * 1.5),       # floor(13 / 7) = 1
]


def check_formulas(results):
    by_name = {c[0]: c for c in CASES}
    for name, it, g, value in SPOT:
        assert close(expected_lr(by_name[name], it, g), value), (name, it, g, value)
        got = results["cases"][name]["trace"][it + 1]["lr"][g]
        assert close(got, value), "%s it %d group %d: %r, not %r" % (name, it, g, got, value)
    for case in CASES:
        check_case(case, results["cases"][case[0]])
    same(results["errors"], [e for _, _, e in ERROR_CASES], "constructor errors")


# ---- no torch: any object with param_groups, warnings ---------------------------------------

class Groups:
    def __init__(self, groups):
        self.param_groups = groups


class Wrapper:
    def __init__(self, inner):
        self.optimizer = inner


def catch(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in got]


def check_plain_optimizers():
    opt = Groups([{"lr": 0.1}, {"lr": 0.2}])
    s = zls.WarmupLR(Wrapper(opt), warmup_num_steps=4, warmup_type="linear")
    assert opt.param_groups[1]["lr"] == 0.0 and s.get_last_lr() == [0.0, 0.0]
    s.step()
    s.step()
    assert [g["lr"] for g in opt.param_groups] == [0.025, 0.05], opt.param_groups
    opt = Groups([{"lr": 0.1, "betas": (0.9, 0.999)}, {"lr": 0.2, "betas": (0.9, 0.95)}])
    s, warned = catch(lambda: zls.OneCycle(opt, 0.01, 0.1, cycle_first_step_size=2))
    assert not warned and opt.param_groups[1]["betas"] == (0.8, 0.99), opt.param_groups
    s.step()
    beta1, beta2 = opt.param_groups[0]["betas"]
    assert close(beta1, 0.85) and beta2 == 0.99, opt.param_groups
    opt = Groups([{"lr": 0.1, "betas": (0.9, 0.999)}, {"lr": 0.2}])
    s, warned = catch(lambda: zls.OneCycle(opt, 0.01, 0.1))
    assert not s.cycle_momentum and "cycle_momentum is off" in warned[0], warned
    try:
        zls.LRRangeTest(object())
        raise AssertionError("an object without param_groups was accepted")
    except TypeError as e:
        assert "param_groups" in str(e), e


def check_warnings():
    opt = Groups([{"lr": 0.1}])
    s, warned = catch(lambda: zls.WarmupLR(opt, warmup_type="exp"))
    assert s.warmup_type == "log" and "'exp'" in warned[0], warned
    s, warned = catch(lambda: zls.WarmupDecayLR(opt, 5, warmup_num_steps=10))
    assert "total_num_steps 5 is below warmup_num_steps 10" in warned[0], warned
    s, warned = catch(lambda: zls.WarmupCosineLR(opt, 5, warmup_num_steps=10))
    assert "total_num_steps 5 is below warmup_num_steps 10" in warned[0], warned
    _, warned = catch(lambda: zls.WarmupCosineLR(opt, 50, warmup_num_steps=10))
    assert not warned, warned


# ---- check() and build() --------------------------------------------------------------------

def check_raises(config, *parts, absent=()):
    try:
        zls.check(config)
    except ValueError as e:
        text = str(e)
        for part in parts:
            assert part in text, "%r lacks %r" % (text, part)
        for part in absent:
            assert part not in text, "%r has %r" % (text, part)
        return text
    raise AssertionError("check(%r) passed" % (config,))


def check_config_errors():
    names = list(zls.SCHEDULER_TYPES)
    check_raises({"type": "WarmupLr", "params": {}}, "scheduler.type", "'WarmupLr'", *names,
                 "did you mean 'WarmupLR'")
    check_raises({"type": "one_cycle", "params": {}}, "did you mean 'OneCycle'")
    check_raises({"type": "Bogus", "params": {}}, "'Bogus'", *names, absent=["did you mean"])
    check_raises({"type": "StepLR", "params": {}}, "'StepLR'", absent=["did you mean"])
    check_raises({"params": {}}, "scheduler.type")
    check_raises(["WarmupLR"], "scheduler")
    check_raises({"type": "WarmupLR"}, "scheduler.params")
    check_raises({"type": "WarmupLR", "params": [1]}, "scheduler.params")
    check_raises({"type": "WarmupLR", "params": {"warmup_max_lrr": 1e-3}},
                 "scheduler.params.warmup_max_lrr", "WarmupLR", "did you mean 'warmup_max_lr'")
    check_raises({"type": "WarmupLR", "params": {"zzz": 1}}, "scheduler.params.zzz",
                 "WarmupLR", absent=["did you mean"])
    check_raises({"type": "WarmupLR", "params": {"total_num_steps": 10}},
                 "scheduler.params.total_num_steps", "WarmupLR")
    check_raises({"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_max_lr": 1}},
                 "scheduler.params.warmup_max_lr", "WarmupCosineLR")
    check_raises({"type": "OneCycle", "params": {"cycle_min_lr": 1e-4}},
                 "scheduler.params.cycle_max_lr", "required", "OneCycle")
    check_raises({"type": "WarmupDecayLR", "params": {}}, "scheduler.params.total_num_steps")
    check_raises({"type": "WarmupLR", "params": {"optimizer": None}}, "scheduler.params.optimizer")


def check_config_values():
    bad = [
        ("WarmupLR", "warmup_num_steps", 10.5, "integer"),
        ("WarmupLR", "warmup_num_steps", 0, "positive"),
        ("WarmupLR", "warmup_num_steps", True, "integer"),
        ("WarmupLR", "warmup_min_lr", "0", "number"),
        ("WarmupLR", "warmup_max_lr", [], "number"),
        ("WarmupLR", "warmup_type", 1, "string"),
        ("WarmupDecayLR", "total_num_steps", "100", "number"),
        ("WarmupCosineLR", "cos_min_ratio", [0.1], "number"),
        ("OneCycle", "cycle_min_lr", [1e-4, "x"], "number"),
        ("OneCycle", "cycle_first_step_size", 0, "positive"),
        ("OneCycle", "cycle_second_step_size", -1, "non-negative"),
        ("OneCycle", "cycle_momentum", "yes", "boolean"),
        ("OneCycle", "cycle_first_stair_count", 1.5, "integer"),
        ("LRRangeTest", "lr_range_test_staircase", 1, "boolean"),
        ("LRRangeTest", "lr_range_test_step_size", -5, "positive"),
    ]
    required = {"WarmupDecayLR": {"total_num_steps": 100}, "WarmupCosineLR":
                {"total_num_steps": 100}, "OneCycle": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}}
    for t, key, value, word in bad:
        params = dict(required.get(t, {}), **{key: value})
        check_raises({"type": t, "params": params}, "scheduler.params." + key, t, word)
    for t in zls.SCHEDULER_TYPES:
        zls.check({"type": t, "params": dict(required.get(t, {}))})
    zls.check({"type": "OneCycle", "params": dict(
        required["OneCycle"], cycle_second_step_size=None, cycle_second_stair_count=None)})
    zls.check({"type": "WarmupLR", "params": {"warmup_type": "cosine"}})  # DeepSpeed warns only
    zls.check(None)


def check_build():
    for _, t, _, params in CASES:
        zls.check({"type": t, "params": params})
    opt = Groups([{"lr": 0.1}, {"lr": 0.2}])
    assert zls.build(None, opt) is None
    s = zls.build({"type": "LRRangeTest", "params": {"lr_range_test_min_lr": [1e-3, 2e-3]}}, opt)
    assert isinstance(s, zls.LRRangeTest) and opt.param_groups[1]["lr"] == 2e-3
    try:
        zls.build({"type": "WarmupLR", "params": {"warmup_max_lr": [1, 2, 3]}}, opt)
        raise AssertionError("3 lrs for 2 groups were accepted")
    except ValueError as e:
        assert "warmup_max_lr" in str(e), e
    try:
        zls.build({"type": "WarmupLr", "params": {}}, opt)
        raise AssertionError("build() skipped check()")
    except ValueError as e:
        assert "scheduler.type" in str(e), e
    assert opt.param_groups[0]["lr"] == 1e-3, "a failed build changed the optimizer"


# ---- DeepSpeed side by side -----------------------------------------------------------------

def deepspeed_python():
    """(python, explicit): ZEROD_DS_PYTHON, or this python when it has deepspeed; or None."""
    env = os.environ.get("ZEROD_DS_PYTHON", "")
    if env:
        return os.path.expanduser(env), True
    if importlib.util.find_spec("deepspeed") is not None:
        return sys.executable, False
    return None, False


def run_deepspeed(python):
    cmd = [python, "-c", DRIVER + "\nsys.exit(main_deepspeed())\n"]
    proc = subprocess.run(cmd, input=json.dumps(payload()), capture_output=True, text=True,
                          timeout=240)
    lines = proc.stdout.splitlines()
    for line in lines:
        if line.startswith("ZD-RESULT "):
            return json.loads(line[len("ZD-RESULT "):])
        if line.startswith("ZD-NO-DEEPSPEED"):
            return line
    raise AssertionError("%s exited %d without a result:\n%s\n%s"
                         % (python, proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))


def check_deepspeed(ours):
    python, explicit = deepspeed_python()
    if python is None:
        print("note: no DeepSpeed to compare with (set ZEROD_DS_PYTHON to a python that has it)")
        return
    theirs = run_deepspeed(python)
    if isinstance(theirs, str):
        assert not explicit, "ZEROD_DS_PYTHON=%s: %s" % (python, theirs)
        print("note: %s cannot import deepspeed; not compared" % python)
        return
    same(ours["errors"], theirs["errors"], "constructor errors vs DeepSpeed")
    for name, _, _, _ in CASES:
        same(ours["cases"][name], theirs["cases"][name], name + " vs DeepSpeed")
    print("ok: %d cases x %d steps, %d param groups, and %d constructor errors agree with "
          "DeepSpeed (%s) to %g" % (len(CASES), STEPS, len(LRS), len(ERROR_CASES), python, REL))


def main():
    ours = driver()["run_all"](zls, payload())
    check_formulas(ours)
    print("ok: %d cases x %d steps match the formulas, state_dict resumes identically"
          % (len(CASES), STEPS))
    check_plain_optimizers()
    check_warnings()
    check_config_errors()
    check_config_values()
    check_build()
    print("ok: plain optimizers, warnings, check() and build()")
    check_deepspeed(ours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
