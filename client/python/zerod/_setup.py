"""What initialize() does with DeepSpeed's trainer-side arguments and keys, before and after
the attach: a client optimizer (torch.optim.Adam/AdamW, or a callable building one), a client
lr_scheduler, the config's "scheduler" section, and steps_per_print's progress line.

Everything that can refuse runs before the attach, so a refused call changes nothing (not the
model's dtype, not the daemon). The daemon checks the config keys themselves
(docs/training-config.md); these checks cover what only the trainer can see.
"""
import inspect
import logging
import sys
import time

import torch

from . import lr_schedules

_log = logging.getLogger("zerod")

# DeepSpeed's ZeRO-supported optimizers that are Adam: their hyper-parameters carry over.
_ADAM_CLASSES = ("Adam", "AdamW", "FusedAdam", "DeepSpeedCPUAdam")
_UNTESTED = ('You are using an untested ZeRO Optimizer. Please add '
             '<"zero_allow_untested_optimizer": true> in the configuration file to use it.')


# ---- client optimizer ---------------------------------------------------------------------

def _adam_w(opt):
    """True for decoupled weight decay (AdamW), False for L2 (Adam)."""
    name = type(opt).__name__
    if name == "AdamW":
        return True
    if name == "Adam":
        return False
    return bool(getattr(opt, "adam_w_mode", opt.defaults.get("adam_w_mode", True)))


def _group_options(group):
    opts = {"lr": float(group["lr"]), "betas": [float(b) for b in group["betas"]],
            "eps": float(group["eps"]), "weight_decay": float(group["weight_decay"])}
    if "bias_correction" in group:
        opts["bias_correction"] = bool(group["bias_correction"])
    return opts


def client_optimizer(optimizer, model, model_parameters, cfg):
    """DeepSpeed's optimizer= argument: an optimizer object, or a callable that builds one from
    the model parameters. Adam and AdamW (torch's, DeepSpeed's FusedAdam/DeepSpeedCPUAdam) carry
    their type and per-group hyper-parameters into the config and the groups, as DeepSpeed runs
    the client optimizer instead of the config's. Anything else is refused: with DeepSpeed's
    message unless zero_allow_untested_optimizer, else because zerod runs Adam only.
    Returns (optimizer object, config, groups as model_parameters)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise TypeError("zerod: optimizer= must be a torch.optim.Optimizer or a callable "
                            "building one, not %s" % type(optimizer).__name__)
        params = model_parameters if model_parameters is not None else (
            p for p in model.parameters() if p.requires_grad)
        optimizer = optimizer(params)
    name = type(optimizer).__name__
    if name not in _ADAM_CLASSES:
        if not cfg.get("zero_allow_untested_optimizer", False):
            raise ValueError("zerod: " + _UNTESTED)
        raise ValueError("zerod: optimizer %s is not supported: zerod's daemons run Adam and "
                         "AdamW only (zero_allow_untested_optimizer lets DeepSpeed run it on "
                         "the shard; zerod cannot)" % name)
    for i, g in enumerate(optimizer.param_groups):
        for key in ("amsgrad", "maximize"):
            if g.get(key):
                raise ValueError("zerod: optimizer %s param group %d: %s=True is not supported"
                                 % (name, i, key))
    cfg = dict(cfg)
    opts = _group_options(optimizer.param_groups[0])
    adam_w = _adam_w(optimizer)
    params = dict(opts, adam_w_mode=adam_w)
    cfg["optimizer"] = {"type": "AdamW" if adam_w else "Adam", "params": params}
    groups = [dict(_group_options(g), params=list(g["params"])) for g in optimizer.param_groups]
    return optimizer, cfg, groups


# ---- schedules ----------------------------------------------------------------------------

def _torch_scheduler_class(type_name):
    cls = getattr(torch.optim.lr_scheduler, type_name, None)
    ok = inspect.isclass(cls) and type_name[0].isupper() and type_name not in (
        "LambdaLR", "MultiplicativeLR", "SequentialLR", "ChainedScheduler", "ReduceLROnPlateau")
    return cls if ok else None


def check_scheduler(cfg):
    """The config's scheduler section, checked before anything changes (type, and each param
    against that type's arguments); None when there is none."""
    sc = cfg.get("scheduler")
    if not isinstance(sc, dict) or sc.get("type") is None:
        return None
    cls = _torch_scheduler_class(sc["type"]) if isinstance(sc["type"], str) else None
    if cls is None:
        lr_schedules.check(sc)  # DeepSpeed's types; else a "did you mean" error
        if sc["type"] == "OneCycle" and (sc.get("params") or {}).get("cycle_momentum", True):
            raise ValueError("zerod: config key 'scheduler.params.cycle_momentum': OneCycle's "
                             "momentum cycling (on by default) changes Adam's beta1 every step, "
                             "and zerod's daemons keep the betas of the attach; set it false")
        return sc
    params = sc.get("params") or {}
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "optimizer"}
    for key in params:
        if key not in accepted:
            raise ValueError("zerod: config key 'scheduler.params.%s' is not an argument of "
                             "torch.optim.lr_scheduler.%s (it takes: %s)"
                             % (key, sc["type"], ", ".join(sorted(accepted))))
    return sc


def build_scheduler(sc, optimizer):
    cls = _torch_scheduler_class(sc["type"])
    if cls is None:
        return lr_schedules.build(sc, optimizer)
    return cls(optimizer, **(sc.get("params") or {}))


def client_scheduler(lr_scheduler, client_opt, engine_opt):
    """DeepSpeed's lr_scheduler= argument: a scheduler, or a callable building one from the
    optimizer. A scheduler built on the client optimizer is moved to the engine's, whose
    param groups are the ones zerod reads each step."""
    if lr_scheduler is None:
        return None
    if not hasattr(lr_scheduler, "step") and callable(lr_scheduler):
        return lr_scheduler(engine_opt)
    owner = getattr(lr_scheduler, "optimizer", None)
    if owner is not None and owner is not engine_opt:
        if owner is not client_opt:
            raise ValueError("zerod: lr_scheduler= steps an optimizer that is not the one passed "
                             "as optimizer=; build it on that optimizer, or pass a callable")
        if len(owner.param_groups) != len(engine_opt.param_groups):
            raise ValueError("zerod: lr_scheduler='s optimizer has %d param groups, the job %d"
                             % (len(owner.param_groups), len(engine_opt.param_groups)))
        for mine, theirs in zip(engine_opt.param_groups, owner.param_groups):
            for key, value in theirs.items():  # the lr it set, initial_lr, ...
                if key != "params":
                    mine[key] = value
        lr_scheduler.optimizer = engine_opt
    return lr_scheduler


def broadcast_from_rank0(module, params):
    """A fresh job: DeepSpeed's engine broadcasts rank 0's parameters at initialize, so every
    rank starts from rank 0's model even when the ranks built theirs differently (no seed).
    zerod's daemons take each shard's initial values from the rank that owns it, which would
    start such ranks from a mix; with torch.distributed initialized (init_distributed()), rank
    0's values go to every rank first, as in DeepSpeed."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    seen = set()
    with torch.no_grad():
        for p in list(module.parameters()) + list(params):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if p.dtype in (torch.float32, torch.float64):
                dist.broadcast(p.data, src=0)
            else:  # gloo has no bf16: widened, which is exact, and back
                wide = p.data.float()
                dist.broadcast(wide, src=0)
                p.data.copy_(wide)


def lrs_seen(engine_opt, client_opt):
    """What group_lrs compares with: each group's lr in the engine's and the client's optimizer
    (None without a client optimizer, or when their groups do not pair up)."""
    if client_opt is None or len(client_opt.param_groups) != len(engine_opt.param_groups):
        return None
    return [(float(mine["lr"]), float(theirs["lr"]))
            for mine, theirs in zip(engine_opt.param_groups, client_opt.param_groups)]


def group_lrs(engine_opt, client_opt, seen):
    """Each group's lr for the daemon, and lrs_seen for the next call. With a client optimizer
    (initialize(optimizer=)), a change made on it since the last call (a scheduler built on it
    and stepped by the caller, as Accelerate does) reaches the engine's optimizer, and one made
    on the engine's (its scheduler) reaches it: whichever changed wins."""
    groups = engine_opt.param_groups
    if seen is not None:
        for mine, theirs, (last_mine, last_theirs) in zip(groups, client_opt.param_groups, seen):
            if float(mine["lr"]) != last_mine:
                theirs["lr"] = mine["lr"]
            elif float(theirs["lr"]) != last_theirs:
                mine["lr"] = theirs["lr"]
        seen = lrs_seen(engine_opt, client_opt)
    return [float(g["lr"]) for g in groups], seen


def check_client_scheduler(lr_scheduler):
    if lr_scheduler is not None and not (hasattr(lr_scheduler, "step") or callable(lr_scheduler)):
        raise TypeError("zerod: lr_scheduler= must be a scheduler or a callable building one "
                        "from the optimizer, not %s" % type(lr_scheduler).__name__)


# ---- steps_per_print ----------------------------------------------------------------------

class Progress:
    """Rank 0's progress line every steps_per_print optimizer steps (DeepSpeed's
    _report_progress, with what a zerod user needs to see): on the "zerod" logger at INFO,
    printed to stdout when the application configured no logging (as DeepSpeed's logger)."""

    def __init__(self, every, rank):
        # Infinity (Accelerate writes it; the daemon took it): never, as in DeepSpeed
        self.every = int(every) if every and every != float("inf") else 0
        self.enabled = self.every > 0 and rank == 0
        self._t0 = time.monotonic()
        self._steps0 = None
        if self.enabled and not _log.handlers and not logging.getLogger().handlers:
            h = logging.StreamHandler(sys.stdout)
            h.setFormatter(logging.Formatter("[zerod] %(message)s"))
            _log.addHandler(h)
            _log.setLevel(logging.INFO)
            _log.propagate = False

    def after_step(self, engine):
        """Called after every optimizer step (applied or skipped)."""
        if not self.enabled:
            return
        step = engine.global_steps
        if self._steps0 is None:
            self._steps0 = step - 1
        if step % self.every != 0:
            return
        now = time.monotonic()
        done, self._steps0 = step - self._steps0, step
        tb = engine.train_batch_size()
        rate = "%.1f" % (done * tb / max(now - self._t0, 1e-9)) if tb else "n/a"
        self._t0 = now
        norm = engine.get_global_grad_norm()
        _log.info("step=%d, skipped=%d, lr=%s, loss_scale=%g, grad_norm=%s, samples/s=%s",
                  step, engine.skipped_steps, engine.get_lr(), engine.loss_scale,
                  "n/a" if norm is None else "%.6g" % norm, rate)
