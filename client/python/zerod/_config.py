"""What zerod.torch.initialize() reads before it attaches: the DeepSpeed config, the launcher's
environment (torchrun, zerorun) and the parameter groups, in the order the daemon registers
them.
"""
import json
import os
import re
import sys

import torch

from ._codes import DTYPE_BF16, DTYPE_F16, DTYPE_F32
from ._libzc import coordinator_from_env

# Per-group optimizer options the daemon accepts in a group's options_json (optimizer.params).
_GROUP_OPTION_KEYS = ("lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode")
_OPT_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}


# ---- configuration and environment --------------------------------------------------------

def config_source(config, config_params, args):
    """initialize()'s config: config=, else config_params=, else args.deepspeed_config."""
    if config is None:
        config = config_params
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None)
    return config


def load_config(config):
    if config is None:
        return {}
    if isinstance(config, dict):
        return json.loads(json.dumps(config))  # a private deep copy, and JSON-able
    if isinstance(config, (str, bytes, os.PathLike)):
        with open(config, "r") as f:
            cfg = json.load(f)
        if not isinstance(cfg, dict):
            raise ValueError("zerod: config file %s does not hold a JSON object" % config)
        return cfg
    raise TypeError("zerod: config must be a dict or the path of a JSON file, not %s"
                    % type(config).__name__)


def _lax_true(v):
    """A bool of fp16 / bf16 as DeepSpeed's pydantic models (and the daemon) read it: "true",
    "yes", "on", "1", "t", "y" (any case) and 1 are true; a value neither true nor false is the
    daemon's to refuse."""
    if isinstance(v, str):
        return v.lower() in ("1", "on", "t", "true", "y", "yes")
    return v is True or (not isinstance(v, bool) and v == 1)


def _section_enabled(cfg, name):
    sec = cfg.get(name)
    if name == "bf16" and sec is None:
        sec = cfg.get("bfloat16")  # DeepSpeed's old name, read only without "bf16"
    return isinstance(sec, dict) and _lax_true(sec.get("enabled", False))


def config_dtype(cfg):
    fp16, bf16 = _section_enabled(cfg, "fp16"), _section_enabled(cfg, "bf16")
    if fp16 and bf16:
        raise ValueError("zerod: config enables both fp16 and bf16")
    return DTYPE_F16 if fp16 else (DTYPE_BF16 if bf16 else DTYPE_F32)


def config_defaults(cfg):
    d = dict(_OPT_DEFAULTS)
    opt = cfg.get("optimizer")
    if isinstance(opt, dict) and isinstance(opt.get("params"), dict):
        for k in ("lr", "betas", "eps", "weight_decay"):
            if k in opt["params"]:
                d[k] = opt["params"][k]
    d["betas"] = tuple(d["betas"])
    return d


def _env_int(name, default):
    v = os.environ.get(name, "")
    if v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError("zerod: %s=%r is not an integer" % (name, v)) from None


def offload_cpu(cfg):
    """zero_optimization.offload_optimizer.device is "cpu" in the DeepSpeed config."""
    try:
        return cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    except (KeyError, TypeError):
        return False


def _default_job():
    stem = os.path.splitext(os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else ""))[0]
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "python"
    return "torch-" + stem


def read_env(job=None, socket_path=None, device_kind="cpu"):
    """The torchrun / zerorun environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT, ZEROD_SOCKET, ZEROD_JOB, and TORCHELASTIC_RESTART_COUNT (> 0: the launcher
    restarted this process, so resume="auto" continues the job the daemon kept). Without
    ZEROD_SOCKET the socket is zerod-<device_kind><LOCAL_RANK>.sock in ZEROD_SOCKET_DIR or
    /run/zerod, the name zerod gives itself for --device cpu:N or cuda:N."""
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank if world > 1 else 0)
    if world < 1 or not 0 <= rank < world:
        raise ValueError("zerod: RANK %d is not below WORLD_SIZE %d" % (rank, world))
    # rank 0's daemon listens on MASTER_PORT + 1 (or ZEROD_COORDINATOR): torch's store, under
    # torchrun or after init_process_group, holds MASTER_PORT itself
    coordinator = coordinator_from_env() if world > 1 else None
    if world > 1 and coordinator is None:
        raise ValueError("zerod: WORLD_SIZE %d needs MASTER_ADDR and MASTER_PORT (rank 0's "
                         "daemon listens on MASTER_PORT + 1) or ZEROD_COORDINATOR=host:port"
                         % world)
    # torchrun gives every local rank the same environment: ZEROD_SOCKET_DIR (as zerorun
    # sets it) finds each rank's own daemon there
    sock = socket_path or os.environ.get("ZEROD_SOCKET") or os.path.join(
        os.environ.get("ZEROD_SOCKET_DIR") or "/run/zerod",
        "zerod-%s%d.sock" % (device_kind, local_rank))
    job = job or os.environ.get("ZEROD_JOB") or _default_job()
    return {"rank": rank, "world": world, "local_rank": local_rank,
            "coordinator": coordinator if world > 1 else None, "socket": sock, "job": job,
            "restart": _env_int("TORCHELASTIC_RESTART_COUNT", 0) > 0}


# ---- parameter groups ---------------------------------------------------------------------

def collect_groups(model, model_parameters):
    """[{"params": [tensors in the caller's order], other keys...}], deduplicated. Frozen
    parameters (requires_grad False) are left out, as DeepSpeed's ZeRO 1/2 leaves them out of
    its partitions: they stay the module's own tensors, never attached."""
    if model_parameters is None:
        groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    else:
        if isinstance(model_parameters, torch.Tensor):
            model_parameters = [model_parameters]
        mp = list(model_parameters)
        if mp and all(isinstance(g, dict) for g in mp):
            groups = []
            for g in mp:
                g = dict(g)
                if "params" not in g:
                    raise ValueError("zerod: a parameter group dict needs a 'params' entry")
                ps = g["params"]
                g["params"] = [ps] if isinstance(ps, torch.Tensor) else list(ps)
                groups.append(g)
        elif any(isinstance(g, dict) for g in mp):
            raise TypeError("zerod: model_parameters mixes tensors and group dicts")
        else:
            groups = [{"params": mp}]
    seen = set()
    for gi, g in enumerate(groups):
        if not g["params"]:
            raise ValueError("zerod: parameter group %d is empty" % gi)
        for p in g["params"]:
            if not isinstance(p, torch.Tensor):
                raise TypeError("zerod: group %d holds a %s, not a tensor" % (gi, type(p).__name__))
        g["params"] = [p for p in g["params"] if p.requires_grad]
        if not g["params"]:
            raise ValueError("zerod: parameter group %d holds only frozen parameters "
                             "(requires_grad False)" % gi)
        for p in g["params"]:
            if id(p) in seen:
                raise ValueError("zerod: a parameter appears twice in model_parameters")
            seen.add(id(p))
    return groups


def registration_order(model, params):
    """Reverse parameters() order (the order backward produces gradients; docs/semantics.md).
    Tensors that are not the model's own keep their reverse list order, after the model's."""
    pos = {id(p): i for i, p in enumerate(model.parameters())}
    n = len(pos)
    keyed = [(pos.get(id(p), n + k), p) for k, p in enumerate(params)]
    keyed.sort(key=lambda kp: kp[0], reverse=True)
    return [p for _, p in keyed]


def options_json(group):
    opts = {}
    for k in _GROUP_OPTION_KEYS:
        if k in group:
            v = group[k]
            opts[k] = [float(x) for x in v] if k == "betas" else v
    return json.dumps(opts) if opts else None
