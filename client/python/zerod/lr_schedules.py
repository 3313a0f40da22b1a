"""DeepSpeed-compatible learning-rate schedules: WarmupLR, WarmupDecayLR, WarmupCosineLR,
OneCycle and LRRangeTest, and the config's "scheduler" section (build(), check()).

Why: zerod stands in for `import deepspeed`, and a DeepSpeed config may name one of DeepSpeed's
schedules ({"scheduler": {"type": "WarmupLR", "params": {...}}}). A script moved to zerod must
see the same lr at every step as under DeepSpeed (0.19.8), so these classes keep DeepSpeed's
names, constructor parameters, defaults and step semantics. They are written from the formulas
(plain math, no torch): the optimizer is any object with `param_groups` (a list of dicts with
"lr"), or an object wrapping one as `.optimizer`.

DeepSpeed behaviour kept on purpose (scripts and checkpoints depend on it):
  - Constructed with last_batch_iteration=-1 (the default), a schedule writes "iteration -1"'s
    lr into the optimizer at once: warmup_min_lr for WarmupLR/WarmupDecayLR, 0.0 for
    WarmupCosineLR, lr_range_test_min_lr for LRRangeTest, cycle_min_lr for OneCycle. With any
    other last_batch_iteration the constructor leaves the optimizer alone.
  - get_last_lr() raises AssertionError until step() has run, except after a constructor that
    wrote the lr (OneCycle's never counts: it always needs a step() first).
  - The first step() is iteration 0: a log warmup gives warmup_min_lr there (log 1 = 0), a
    linear one too (0 / warmup_num_steps); LRRangeTest already gives min_lr * (1 + rate/size).
    warmup_num_steps below 2 counts as 2; WarmupCosineLR's first step after the warmup is
    already one step down the cosine.
  - An unknown warmup_type only warns and falls back to "log"; total_num_steps below
    warmup_num_steps only warns. Neither is an error in DeepSpeed, so neither is here.
  - state_dict() holds last_batch_iteration only; load_state_dict() does not touch the
    optimizer, whose lr changes at the next step().
  - OneCycle's momentum cycling (cycle_momentum, on by default) runs only when the optimizer's
    `defaults` have "betas" (without `defaults`: when every group has "betas"); otherwise it
    warns and turns itself off (an SGD "momentum" is never cycled). It writes each group's
    "betas" as (momentum, 0.99): the second beta becomes 0.99 whatever it was.
"""
import difflib
import inspect
import math
import warnings

WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"


# ---- helpers shared by the schedules -------------------------------------------------------

def _warn(message):
    warnings.warn("zerod: " + message, stacklevel=3)


def _is_tensor(value):
    return hasattr(value, "fill_") and hasattr(value, "squeeze")


def _owner(optimizer):
    """The object whose param_groups a schedule writes: the optimizer itself, or the optimizer
    it wraps as `.optimizer`."""
    if hasattr(optimizer, "param_groups"):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and hasattr(inner, "param_groups"):
        return inner
    raise TypeError("zerod: a schedule needs an optimizer with param_groups, not %s"
                    % type(optimizer).__name__)


def _write_lrs(groups, lrs):
    """Set each group's lr (in place for a tensor lr); returns the groups' lrs."""
    for group, lr in zip(groups, lrs):
        if _is_tensor(group["lr"]):
            group["lr"].fill_(lr.squeeze() if _is_tensor(lr) else lr)
        else:
            group["lr"] = lr
    return [group["lr"] for group in groups]


def _per_group(groups, value, name):
    """One value per param group: a list/tuple of exactly that many, or one for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(groups):
            raise ValueError("zerod: %s has %d values for %d param groups"
                             % (name, len(value), len(groups)))
        return list(value)
    return [value] * len(groups)


def _require_positive_int(value, name):
    if not isinstance(value, int) or value <= 0:
        raise ValueError("zerod: %s must be a positive integer, not %r" % (name, value))


def _warmup_type(value):
    if value in (WARMUP_LOG_RATE, WARMUP_LINEAR_RATE):
        return value
    _warn("warmup_type %r is neither 'log' nor 'linear'; warming up with 'log' (as DeepSpeed "
          "does)" % (value,))
    return WARMUP_LOG_RATE


def _warn_short_total(total, warmup):
    if total < warmup:
        _warn("total_num_steps %s is below warmup_num_steps %s" % (total, warmup))


class _Schedule:
    """What every schedule shares: the iteration counter, get_last_lr and the state dict."""

    def get_last_lr(self):
        if getattr(self, "_last_lr", None) is None:
            raise AssertionError("zerod: call step() before get_last_lr()")
        return self._last_lr

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd):
        self.last_batch_iteration = sd["last_batch_iteration"]

    def _advance(self, iteration):
        if iteration is None:
            iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = iteration
        self._last_lr = _write_lrs(self.optimizer.param_groups, self.get_lr())


class _Warmup(_Schedule):
    """The warmup fraction (0 at iteration 0, rising to 1) that WarmupLR, WarmupDecayLR and
    WarmupCosineLR share."""

    def _init_warmup(self, warmup_num_steps, warmup_type):
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = _warmup_type(warmup_type)
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)

    def _warmup_fraction(self):
        if self.warmup_type == WARMUP_LOG_RATE:
            return self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
        return self.last_batch_iteration / self.warmup_num_steps


# ---- the schedules --------------------------------------------------------------------------

class WarmupLR(_Warmup):
    """lr from warmup_min_lr to warmup_max_lr (default: each group's lr at construction) over
    warmup_num_steps steps, log or linear, then warmup_max_lr for good."""

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=None, warmup_num_steps=1000,
                 warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        _require_positive_int(warmup_num_steps, "warmup_num_steps")
        self.optimizer = _owner(optimizer)
        groups = self.optimizer.param_groups
        if warmup_max_lr is None:
            warmup_max_lr = [group["lr"] for group in groups]
        self.min_lrs = _per_group(groups, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(groups, warmup_max_lr, "warmup_max_lr")
        self.delta_lrs = [hi - lo for hi, lo in zip(self.max_lrs, self.min_lrs)]
        self._init_warmup(warmup_num_steps, warmup_type)
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._last_lr = _write_lrs(groups, self.get_lr())

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._get_gamma()
        return [lo + delta * gamma for lo, delta in zip(self.min_lrs, self.delta_lrs)]

    def _get_gamma(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            return self._warmup_fraction()
        return 1.0

    def step(self, last_batch_iteration=None):
        self._advance(last_batch_iteration)


class WarmupDecayLR(WarmupLR):
    """WarmupLR's warmup, then a linear decay to 0 at total_num_steps (and 0 after it)."""

    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps=1000, warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)
        _warn_short_total(self.total_num_steps, self.warmup_num_steps)

    def _get_gamma(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            return self._warmup_fraction()
        left = float(self.total_num_steps - self.last_batch_iteration)
        return max(0.0, left / float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR(_Warmup):
    """Each group's own lr (read at construction) times a ratio: from warmup_min_ratio to 1
    over warmup_num_steps steps, then a half cosine down to cos_min_ratio at total_num_steps,
    where it stays."""

    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000,
                 cos_min_ratio=0.0001, warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        _require_positive_int(warmup_num_steps, "warmup_num_steps")
        self.optimizer = _owner(optimizer)
        self.total_num_steps = total_num_steps
        self.last_batch_iteration = last_batch_iteration
        self.cos_min_ratio = cos_min_ratio
        self.warmup_min_ratio = warmup_min_ratio
        self._init_warmup(warmup_num_steps, warmup_type)
        _warn_short_total(self.total_num_steps, self.warmup_num_steps)
        groups = self.optimizer.param_groups
        self.org_lrs = [g["lr"].clone() if _is_tensor(g["lr"]) else g["lr"] for g in groups]
        if last_batch_iteration == -1:
            self._last_lr = _write_lrs(groups, self.get_lr())

    def get_lr_ratio(self):
        if self.last_batch_iteration < 0:
            return 0.0
        if self.last_batch_iteration < self.warmup_num_steps:
            return self.warmup_min_ratio + self._warmup_fraction() * (1.0 - self.warmup_min_ratio)
        return self._cosine_ratio()

    def _cosine_ratio(self):
        done = self.last_batch_iteration - self.warmup_num_steps + 1
        span = max(1, self.total_num_steps - self.warmup_num_steps)
        half_cos = (1 + math.cos(math.pi * min(1.0, done / span))) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * half_cos)

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return [0.0] * len(self.org_lrs)
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]

    def step(self, last_batch_iteration=None):
        self._advance(last_batch_iteration)


class LRRangeTest(_Schedule):
    """lr = lr_range_test_min_lr * (1 + step_rate * (iteration + 1) / step_size), the quotient
    floored when lr_range_test_staircase is on."""

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000,
                 lr_range_test_step_rate=1.0, lr_range_test_staircase=False,
                 last_batch_iteration=-1):
        self.optimizer = _owner(optimizer)
        groups = self.optimizer.param_groups
        self.min_lr = _per_group(groups, lr_range_test_min_lr, "lr_range_test_min_lr")
        _require_positive_int(lr_range_test_step_size, "lr_range_test_step_size")
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._last_lr = _write_lrs(groups, self.min_lr)

    def _interval(self):
        steps = float(self.last_batch_iteration + 1) / self.step_size
        return math.floor(steps) if self.staircase else steps

    def get_lr(self):
        factor = 1 + self.step_rate * self._interval()
        return [lr * factor for lr in self.min_lr]

    def step(self, batch_iteration=None):
        self._advance(batch_iteration)


class OneCycle(_Schedule):
    """One cycle: lr up from cycle_min_lr to cycle_max_lr over cycle_first_step_size steps and
    back down over cycle_second_step_size (default: the first), optionally in stairs; momentum
    (the first beta) the other way between cycle_max_mom and cycle_min_mom. After the cycle,
    lr = cycle_min_lr / (1 + decay_lr_rate * k / decay_step_size) and first beta
    = cycle_max_mom * (1 + decay_mom_rate * k / decay_step_size), k steps past it; a zero
    decay_step_size or rate holds the value instead."""

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.,
                 cycle_first_step_size=2000, cycle_second_step_size=None,
                 cycle_first_stair_count=0, cycle_second_stair_count=None, decay_step_size=0,
                 cycle_momentum=True, cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.,
                 last_batch_iteration=-1):
        self.optimizer = _owner(optimizer)
        self._init_cycle(cycle_first_step_size, cycle_second_step_size,
                         cycle_first_stair_count, cycle_second_stair_count, decay_step_size)
        self._init_lr(cycle_min_lr, cycle_max_lr, decay_lr_rate, last_batch_iteration)
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self._init_momentum(cycle_min_mom, cycle_max_mom, decay_mom_rate,
                                last_batch_iteration)
        self.last_batch_iteration = last_batch_iteration

    def _init_cycle(self, first_size, second_size, first_stairs, second_stairs, decay_size):
        first_size = float(first_size)
        second_size = first_size if second_size is None else float(second_size)
        if first_size <= 0:
            raise ValueError("zerod: cycle_first_step_size must be positive, not %r"
                             % first_size)
        if second_size < 0:
            raise ValueError("zerod: cycle_second_step_size must not be negative, not %r"
                             % second_size)
        self.first_step_size = first_size
        self.second_step_size = second_size
        self.total_size = first_size + second_size
        self.step_ratio = first_size / self.total_size
        self.first_stair_count = first_stairs
        self.second_stair_count = first_stairs if second_stairs is None else second_stairs
        self.decay_step_size = decay_size
        no_decay = math.isclose(decay_size, 0)
        self.skip_lr_decay = no_decay
        self.skip_mom_decay = no_decay

    def _init_lr(self, min_lr, max_lr, decay_rate, last_batch_iteration):
        groups = self.optimizer.param_groups
        self.min_lrs = _per_group(groups, min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(groups, max_lr, "cycle_max_lr")
        if last_batch_iteration == -1:
            _write_lrs(groups, self.min_lrs)
        self.decay_lr_rate = decay_rate
        if math.isclose(decay_rate, 0):
            self.skip_lr_decay = True

    def _has_betas(self):
        defaults = getattr(self.optimizer, "defaults", None)
        if defaults is not None:
            return "betas" in defaults
        return all("betas" in group for group in self.optimizer.param_groups)

    def _init_momentum(self, min_mom, max_mom, decay_rate, last_batch_iteration):
        if not self._has_betas():
            _warn("cycle_momentum is off: optimizer %s has no betas"
                  % type(self.optimizer).__name__)
            self.cycle_momentum = False
            return
        groups = self.optimizer.param_groups
        self.decay_mom_rate = decay_rate
        self.min_moms = [(m, 0.99) for m in _per_group(groups, min_mom, "cycle_min_mom")]
        self.max_moms = [(m, 0.99) for m in _per_group(groups, max_mom, "cycle_max_mom")]
        if last_batch_iteration == -1:
            self._write_betas(self.min_moms)
        if math.isclose(decay_rate, 0):
            self.skip_mom_decay = True

    def _write_betas(self, betas):
        for group, pair in zip(self.optimizer.param_groups, betas):
            group["betas"] = pair

    def _scale(self):
        """Where the cycle stands: 0 at its ends, 1 at the peak."""
        pos = (self.last_batch_iteration + 1) % self.total_size
        if pos <= self.first_step_size:
            stairs, span, dist = self.first_stair_count, self.first_step_size, pos
        else:
            stairs, span, dist = (self.second_stair_count, self.second_step_size,
                                  self.total_size - pos)
        if stairs > 0:
            return math.floor(dist * stairs / span) / stairs
        return dist / span

    def _decay_steps(self):
        return self.last_batch_iteration - self.total_size + 1

    def get_lr(self):
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [lo + (hi - lo) * scale for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        factor = 1 + self.decay_lr_rate * (self._decay_steps() / self.decay_step_size)
        return [lo / factor for lo in self.min_lrs]

    def get_mom(self):
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [(hi - (hi - lo) * scale, lo_b2)
                    for (lo, lo_b2), (hi, _) in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        factor = 1 + self.decay_mom_rate * (self._decay_steps() / self.decay_step_size)
        return [(hi * factor, b2) for hi, b2 in self.max_moms]

    def step(self, batch_iteration=None):
        self._advance(batch_iteration)
        if self.cycle_momentum:
            self._write_betas(self.get_mom())


# ---- the config's "scheduler" section -------------------------------------------------------

SCHEDULER_TYPES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")
_CLASSES = {cls.__name__: cls for cls in (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle,
                                          LRRangeTest)}

_NUM, _INT, _BOOL, _STR = "number", "integer", "boolean", "string"
_LRS = "number or list of numbers"
# parameter -> (kind, None allowed, bound); a JSON true/false is not a number here
_PARAM_KINDS = {
    "warmup_min_lr": (_LRS, False, None),
    "warmup_max_lr": (_LRS, True, None),
    "warmup_num_steps": (_INT, False, "positive"),
    "warmup_type": (_STR, False, None),
    "total_num_steps": (_NUM, False, None),
    "warmup_min_ratio": (_NUM, False, None),
    "cos_min_ratio": (_NUM, False, None),
    "last_batch_iteration": (_INT, False, None),
    "cycle_min_lr": (_LRS, False, None),
    "cycle_max_lr": (_LRS, False, None),
    "decay_lr_rate": (_NUM, False, None),
    "cycle_first_step_size": (_NUM, False, "positive"),
    "cycle_second_step_size": (_NUM, True, "non-negative"),
    "cycle_first_stair_count": (_INT, False, None),
    "cycle_second_stair_count": (_INT, True, None),
    "decay_step_size": (_NUM, False, None),
    "cycle_momentum": (_BOOL, False, None),
    "cycle_min_mom": (_LRS, False, None),
    "cycle_max_mom": (_LRS, False, None),
    "decay_mom_rate": (_NUM, False, None),
    "lr_range_test_min_lr": (_LRS, False, None),
    "lr_range_test_step_size": (_INT, False, "positive"),
    "lr_range_test_step_rate": (_NUM, False, None),
    "lr_range_test_staircase": (_BOOL, False, None),
}


def _did_you_mean(word, choices):
    if not isinstance(word, str):
        return ""
    by_lower = {c.lower(): c for c in choices}
    hit = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return "; did you mean %r?" % by_lower[hit[0]] if hit else ""


def _parameters(type_name):
    """{name: required} of the type's constructor, optimizer left out."""
    sig = inspect.signature(_CLASSES[type_name].__init__)
    return {name: p.default is inspect.Parameter.empty
            for name, p in list(sig.parameters.items())[2:]}


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _has_kind(value, kind):
    if kind == _NUM:
        return _is_number(value)
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _STR:
        return isinstance(value, str)
    if isinstance(value, (list, tuple)):
        return len(value) > 0 and all(_is_number(v) for v in value)
    return _is_number(value)


def _in_bound(value, bound):
    if bound == "positive":
        return value > 0
    return bound is None or value >= 0


def _check_value(type_name, name, value):
    kind, nullable, bound = _PARAM_KINDS[name]
    if value is None and nullable:
        return
    where = "scheduler.params.%s of %s" % (name, type_name)
    if not _has_kind(value, kind):
        raise ValueError("zerod: %s must be a %s%s, not %r" % (
            where, kind, " or null" if nullable else "", value))
    if not _in_bound(value, bound):
        raise ValueError("zerod: %s must be %s, not %r" % (where, bound, value))


def _check_type(type_name):
    accepted = ", ".join(SCHEDULER_TYPES)
    if type_name not in SCHEDULER_TYPES:  # exact names: DeepSpeed looks the class up by name
        raise ValueError("zerod: scheduler.type %r is not a DeepSpeed schedule; accepted: %s%s"
                         % (type_name, accepted, _did_you_mean(type_name, SCHEDULER_TYPES)))


def _check_params(type_name, params):
    known = _parameters(type_name)
    for key in params:
        if key not in known:
            raise ValueError("zerod: scheduler.params.%s is not a parameter of %s; accepted: "
                             "%s%s" % (key, type_name, ", ".join(known),
                                       _did_you_mean(key, known)))
        _check_value(type_name, key, params[key])
    for key, required in known.items():
        if required and key not in params:
            raise ValueError("zerod: scheduler.params.%s is required by %s" % (key, type_name))


def check(config_scheduler):
    """Validate a DeepSpeed config's "scheduler" section ({"type": ..., "params": {...}})
    without an optimizer, before anything changes; raises ValueError naming the bad key. None
    (no section) passes. What needs the optimizer (list lengths per param group) is left to
    build()."""
    if config_scheduler is None:
        return
    if not isinstance(config_scheduler, dict):
        raise ValueError("zerod: scheduler must be a JSON object with type and params, not %s"
                         % type(config_scheduler).__name__)
    if "type" not in config_scheduler:
        raise ValueError("zerod: scheduler.type is missing; accepted: %s"
                         % ", ".join(SCHEDULER_TYPES))
    _check_type(config_scheduler["type"])
    params = config_scheduler.get("params")
    if not isinstance(params, dict):
        raise ValueError("zerod: scheduler.params must be a JSON object (DeepSpeed passes it as "
                         "keyword arguments; {} for the defaults), not %r" % (params,))
    _check_params(config_scheduler["type"], params)


def build(config_scheduler, optimizer):
    """The schedule a DeepSpeed config's "scheduler" section names, on `optimizer` (which it
    sets to iteration -1's lr, as DeepSpeed's constructors do); None without a section."""
    if config_scheduler is None:
        return None
    check(config_scheduler)
    cls = _CLASSES[config_scheduler["type"]]
    return cls(optimizer, **config_scheduler["params"])
