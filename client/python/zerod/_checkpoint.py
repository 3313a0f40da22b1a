"""engine.save_checkpoint / engine.load_checkpoint of zerod.torch (docs/checkpoints.md).

The daemons save and load the optimizer state (fp32 master, exp_avg, exp_avg_sq, step, loss
scaler) themselves, each its own shard, into DIR/TAG; this module adds the trainer's side:
rank 0's model-side state (client_state, the lr scheduler, the optimizer's hyper-parameters,
the engine's counters and the RNG states) travels with the save request and is stored as
DIR/TAG/trainer_state.pt inside the same atomic commit; so does DIR/TAG/module.safetensors, what
the module's state_dict() holds beyond the parameters the daemons keep: its buffers, its frozen
parameters, and the tied names of its parameters.
"""
import ctypes
import io
import json
import os
import random
import sys
import warnings

import torch

from ._libzc import ZerodError

_STATE_FORMAT = 1
_STATE_MAX = 12 << 20  # ZC_CHECKPOINT_STATE_MAX
_BUNDLE_MAGIC = b"ZDBUNDL1"  # then trainer_state.pt's size, its bytes, module.safetensors
MODULE_FILE = "module.safetensors"
# safetensors dtype names (the header's "dtype")
_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
              "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
              "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
_TAG_VALIDATION = ("WARN", "IGNORE", "FAIL")


def options(config):
    """DeepSpeed's "checkpoint" config section as zerod reads it: (decoupled, node_local).
    tag_validation is checked for its value only: the daemons always refuse tags that differ
    per rank (a checkpoint is committed under one name)."""
    sec = (config or {}).get("checkpoint") or {}
    if not isinstance(sec, dict):
        raise ValueError("zerod: config \"checkpoint\" must be an object, got %r" % (sec,))
    tv = sec.get("tag_validation", "Warn")
    if not isinstance(tv, str) or tv.upper() not in _TAG_VALIDATION:
        raise ValueError("zerod: config checkpoint.tag_validation=%r: expected one of Warn, "
                         "Ignore, Fail" % (tv,))
    writer = sec.get("writer") or {}
    decoupled = writer.get("decoupled", False) if isinstance(writer, dict) else False
    node_local = sec.get("use_node_local_storage", False)
    for key, v in (("writer.decoupled", decoupled), ("use_node_local_storage", node_local)):
        if not isinstance(v, bool):
            raise ValueError("zerod: config checkpoint.%s=%r: expected true or false" % (key, v))
    return decoupled, node_local


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


def module_state(engine, with_extra=True):
    """What the module's state_dict() holds beyond the daemons' parameters: "aliases" (a tied
    parameter's other state_dict names: name -> the name the daemons keep it under) and
    "extra" (buffers and parameters the daemons do not hold, on the CPU; "frozen" names the
    latter)."""
    named = {id(p): n for n, p in engine.module.named_parameters()}
    attached = {id(p) for p in engine._params}
    aliases, extra, frozen = {}, {}, []
    for key, t in engine.module.state_dict(keep_vars=True).items():
        if id(t) not in attached or id(t) not in named:
            if with_extra:
                extra[key] = t.detach().to("cpu", copy=True)
            if id(t) in named:
                frozen.append(key)
        elif named[id(t)] != key:
            aliases[key] = named[id(t)]
    return {"aliases": aliases, "extra": extra, "frozen": frozen}


def _safetensors_bytes(tensors, metadata):
    """tensors ({name: CPU tensor}) and metadata ({str: str}) as a safetensors file."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + n]}
        blobs.append(ctypes.string_at(t.data_ptr(), n) if n else b"")
        off += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data 8-byte aligned, as safetensors writes it
    return len(head).to_bytes(8, "little") + head + b"".join(blobs)


def read_safetensors(path):
    """({name: tensor}, metadata) of a safetensors file, without the safetensors package."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = bytearray(f.read())
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        dtype = _ST_DTYPES[t["dtype"]]
        size = torch.empty(0, dtype=dtype).element_size()
        flat = torch.frombuffer(data, dtype=dtype, count=(b - a) // size, offset=a) \
            if b > a else torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(t["shape"]).clone()
    return out, header.get("__metadata__") or {}


def module_file(engine, with_extra=True):
    """module.safetensors: the buffers and frozen parameters as tensors, the tied names
    (metadata zerod_aliases, JSON) and which tensors are frozen parameters (zerod_frozen)."""
    mod = module_state(engine, with_extra)
    extra = {k: t for k, t in mod["extra"].items() if t.dtype in _ST_NAMES}
    for k in mod["extra"]:
        if k not in extra:
            warnings.warn("zerod: %s (%s) is not saved in the checkpoint: safetensors has no "
                          "such dtype; save it in client_state" % (k, mod["extra"][k].dtype))
    return _safetensors_bytes(extra, {"format": "pt",
                                      "zerod_aliases": json.dumps(mod["aliases"]),
                                      "zerod_frozen": json.dumps(mod["frozen"])})


def read_module_file(path):
    """module.safetensors of checkpoint path: (tensors, aliases, frozen); empty without it."""
    f = os.path.join(path, MODULE_FILE)
    if not os.path.exists(f):
        return {}, {}, []
    tensors, meta = read_safetensors(f)
    return (tensors, json.loads(meta.get("zerod_aliases", "{}")),
            json.loads(meta.get("zerod_frozen", "[]")))


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
    pt = buf.getvalue()
    mod = module_file(engine)
    head = len(_BUNDLE_MAGIC) + 8
    if head + len(pt) + len(mod) > _STATE_MAX:
        warnings.warn("zerod: the module's buffers and frozen parameters (%d bytes with the "
                      "rest of rank 0's state) exceed the checkpoint's %d bytes for them: not "
                      "saved; save them in client_state" % (len(pt) + len(mod), _STATE_MAX))
        mod = module_file(engine, with_extra=False)
    return _BUNDLE_MAGIC + len(pt).to_bytes(8, "little") + pt + mod


def save(engine, save_dir, tag=None, client_state=None, save_latest=True, timeout_ms=0):
    """DeepSpeed's engine.save_checkpoint: every rank calls it at the same step. Returns True
    once DIR/TAG is committed and DIR/latest names it; with the config's
    checkpoint.writer.decoupled, once every daemon holds a copy (wait_checkpoint() waits)."""
    if not save_latest:
        raise ValueError("zerod: save_latest=False is not supported: DIR/latest always names "
                         "the last committed checkpoint")
    decoupled, node_local = options(engine.config)
    if node_local and not getattr(engine, "_warned_node_local", False):
        engine._warned_node_local = True
        warnings.warn("zerod: checkpoint.use_node_local_storage is not supported: every rank "
                      "must save into one directory that every host shares; a save into "
                      "another fails on every rank, naming the rank and its directory")
    if tag is not None:
        tag = str(tag)
    engine._check_open("save_checkpoint")
    state = _trainer_state(engine, client_state) if engine.rank == 0 else b""
    with engine._lock:
        engine._ckpt_last = None
        saved = engine._sess.checkpoint_save(save_dir, tag, state, timeout_ms=timeout_ms)
        engine._ckpt_pending = True  # written in the background: close() waits for it
        if not decoupled:  # committed on return, as DeepSpeed's default engine
            engine._ckpt_pending = False
            engine._sess.checkpoint_wait(timeout_ms)
            engine._ckpt_last = saved["path"] or None
    return True


def wait(engine, timeout_ms=0):
    """engine.wait_checkpoint(): the last save's path once it is committed (None: no save)."""
    engine._check_open("wait_checkpoint")
    with engine._lock:
        engine._ckpt_pending = False
        info = engine._sess.checkpoint_wait(timeout_ms)
    if info["path"]:
        engine._ckpt_last = info["path"]
    return getattr(engine, "_ckpt_last", None)


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
    extra = read_module_file(info["path"])[0]
    if extra:  # buffers and frozen parameters: the daemons hold only the trained ones
        with torch.no_grad():
            engine.module.load_state_dict(extra, strict=False)
    return info["path"], client_state


__all__ = ["save", "load", "wait", "options", "module_state", "ZerodError"]
