"""engine.save_checkpoint / engine.load_checkpoint of zerod.torch (docs/checkpoints.md).

The daemons save and load the optimizer state (fp32 master, exp_avg, exp_avg_sq, step, loss
scaler) themselves, each its own shard, into DIR/TAG; this module adds the trainer's side:
rank 0's model-side state (client_state, the lr scheduler, the optimizer's hyper-parameters,
the engine's counters and the RNG states) travels with the save request and is stored as
DIR/TAG/trainer_state.pt inside the same atomic commit.
"""
import io
import os
import random
import sys
import warnings

import torch

from ._libzc import ZerodError

_STATE_FORMAT = 1


def _rng_state():
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    return state


def _set_rng_state(state):
    if "python" in state:
        random.setstate(state["python"])
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])


def _trainer_state(engine, client_state):
    sched = getattr(engine, "lr_scheduler", None)
    state = {
        "format": _STATE_FORMAT,
        "client_state": dict(client_state or {}),
        "lr_scheduler": sched.state_dict() if sched is not None else None,
        "optimizer": engine.optimizer.state_dict() if engine.optimizer is not None else None,
        "global_steps": engine.global_steps,
        "micro_steps": engine.micro_steps,
        "skipped_steps": engine.skipped_steps,
        "world_size": engine.world_size,
        "rng": _rng_state(),
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def save(engine, save_dir, tag=None, client_state=None, save_latest=True, timeout_ms=0):
    """DeepSpeed's engine.save_checkpoint: every rank calls it at the same step. Returns True."""
    if not save_latest:
        raise ValueError("zerod: save_latest=False is not supported: DIR/latest always names "
                         "the last committed checkpoint")
    if tag is not None:
        tag = str(tag)
    engine._check_open("save_checkpoint")
    state = _trainer_state(engine, client_state) if engine.rank == 0 else b""
    with engine._lock:
        engine._sess.checkpoint_save(save_dir, tag, state, timeout_ms=timeout_ms)
        engine._ckpt_pending = True  # written in the background: close() waits for it
    return True


def load(engine, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
         load_lr_scheduler_states=True, load_module_only=False, timeout_ms=0):
    """DeepSpeed's engine.load_checkpoint: every rank calls it. Returns (path, client_state),
    or (None, None) with a warning when load_dir has no `latest` and no tag was given."""
    del load_module_strict  # the daemon checks every parameter's name and size
    engine._check_open("load_checkpoint")
    if tag is None and not os.path.exists(os.path.join(load_dir, "latest")):
        warnings.warn("zerod: unable to find latest file at %s; if trying to load latest "
                      "checkpoint please pass an explicit tag" % os.path.join(load_dir, "latest"))
        return None, None
    if load_module_only:
        load_optimizer_states = False
        load_lr_scheduler_states = False
    with engine._lock:
        engine._ckpt_pending = False  # the load waits for a pending save first
        engine._sync_device()  # a device session: nothing queued still reads the parameters
        info = engine._sess.checkpoint_load(load_dir, None if tag is None else str(tag),
                                            load_optimizer_states, timeout_ms=timeout_ms)
    engine.global_steps = info["step"]
    if info["loss_scale"] > 0:
        engine._loss_scale = info["loss_scale"]
    engine._offload_fetch()  # ZeRO-Offload: the loaded values onto the GPU
    client_state = {}
    path = os.path.join(info["path"], "trainer_state.pt")
    if info["has_trainer_state"] and os.path.exists(path):
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except TypeError:  # torch < 1.13 has no weights_only
            state = torch.load(path, map_location="cpu")
        client_state = state.get("client_state") or {}
        if load_optimizer_states:
            engine.micro_steps = state.get("micro_steps", engine.micro_steps)
            engine.skipped_steps = state.get("skipped_steps", engine.skipped_steps)
            if state.get("optimizer") is not None and engine.optimizer is not None:
                engine.optimizer.load_state_dict(state["optimizer"])
        sched = getattr(engine, "lr_scheduler", None)
        if load_lr_scheduler_states and sched is not None and state.get("lr_scheduler"):
            sched.load_state_dict(state["lr_scheduler"])
        if not load_module_only and state.get("rng"):
            _set_rng_state(state["rng"])
    return info["path"], client_state


__all__ = ["save", "load", "ZerodError"]
