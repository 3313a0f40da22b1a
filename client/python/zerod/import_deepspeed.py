"""Turn a DeepSpeed ZeRO-1/2 checkpoint into a zerod checkpoint (docs/checkpoints.md), so that a
DeepSpeed job can move over: the zerod job then loads it at any world size.

    python -m zerod.import_deepspeed DS_CHECKPOINT_DIR OUT_DIR [--tag TAG]

DS_CHECKPOINT_DIR is the directory DeepSpeed's save_checkpoint wrote (holding `latest` and
TAG/mp_rank_00_model_states.pt + TAG/*_optim_states.pt), or TAG's directory itself. OUT_DIR
gets OUT_DIR/TAG (manifest.json, rank_00000.safetensors, trainer_state.pt) and OUT_DIR/latest,
committed by rename. Needs torch (to read the .pt files), not DeepSpeed: the few DeepSpeed
classes pickled in them are read as plain records. The checksums of the manifest are
computed by `zeroctl checkpoint seal` (found on PATH, next to libzc, or via $ZEROD_ZEROCTL).

What is kept: every parameter's fp32 master, exp_avg and exp_avg_sq (DeepSpeed's flat
partitions of each param group, reassembled by parameter through param_shapes), the Adam step,
the loss scaler, the skipped steps; in trainer_state.pt the lr scheduler's state, the
optimizer's per-group hyper-parameters, the counters and the client state (the extra keys of
the model states file). The parameters are listed in zerod's registration order (each group
in reverse model order: that of zerod.torch.initialize for a group listed in model order).
Model parallelism (mp_world_size > 1), ZeRO-3 and frozen parameters are refused.
"""
import argparse
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import types

FORMAT_VERSION = 2  # `zeroctl checkpoint seal` writes manifest.xxh3 beside it
_MODEL_FILE = "mp_rank_00_model_states.pt"
_KNOWN_MODEL_KEYS = {
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
    "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
    "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples",
    "dp_world_size", "mp_world_size", "ds_config", "ds_version", "checkpoint_parallel_dimensions",
}


class ImportError_(RuntimeError):
    """A checkpoint this importer cannot turn into a zerod one (the message says why)."""


class _RecordMeta(type):
    """Class attributes of a stand-in (enum members such as ZeroStageEnum.gradients) are
    records holding their name."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls(name)


class _Record(metaclass=_RecordMeta):
    """Stands for a DeepSpeed class in the pickles: keeps its arguments and state."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state):
        self.state = state

    def get(self, key, default=None):
        st = getattr(self, "state", None)
        return st.get(key, default) if isinstance(st, dict) else default


class _StubModule(types.ModuleType):
    """A `deepspeed...` module while reading: any class it is asked for is a _Record."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (_Record,), {"__module__": self.__name__})
        setattr(self, name, cls)
        return cls


class _StubFinder:
    """Supplies stub `deepspeed` modules to the unpickler (torch.load ignores a custom
    pickle_module in some versions, so the import itself is answered)."""

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery
        if fullname == "deepspeed" or fullname.startswith("deepspeed."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


def _load(path):
    # zerod's own `deepspeed` (zerod._ds_alias) is not the one the pickles name
    from ._ds_alias import suspended
    with suspended():
        return _load_pickles(path)


def _load_pickles(path):
    import importlib.util
    import torch
    stub = importlib.util.find_spec("deepspeed") is None
    finder = _StubFinder()
    if stub:
        sys.meta_path.insert(0, finder)
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except TypeError:  # torch without weights_only
            return torch.load(path, map_location="cpu")
    finally:
        if stub:
            sys.meta_path.remove(finder)
            for name in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")]:
                del sys.modules[name]


def _resolve(ds_dir, tag):
    if os.path.exists(os.path.join(ds_dir, _MODEL_FILE)):
        return ds_dir, os.path.basename(os.path.normpath(ds_dir))
    if tag is None:
        latest = os.path.join(ds_dir, "latest")
        if not os.path.exists(latest):
            raise ImportError_("%s: no %s and no `latest` file; pass --tag" % (ds_dir, _MODEL_FILE))
        with open(latest) as f:
            tag = f.read().strip()
    path = os.path.join(ds_dir, tag)
    if not os.path.exists(os.path.join(path, _MODEL_FILE)):
        raise ImportError_("%s: no %s" % (path, _MODEL_FILE))
    return path, tag


def _optim_files(path, world):
    files = []
    for r in range(world):
        hits = glob.glob(os.path.join(path, "*zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r))
        if len(hits) != 1:
            raise ImportError_("%s: expected one *zero_pp_rank_%d_mp_rank_00_optim_states.pt, "
                               "found %d" % (path, r, len(hits)))
        files.append(hits[0])
    return files


def _check_model(ms, path):
    if ms.get("mp_world_size", 1) != 1:
        raise ImportError_("%s: mp_world_size %s: model parallelism is not supported"
                           % (path, ms.get("mp_world_size")))
    if ms.get("frozen_param_shapes"):
        raise ImportError_("%s: frozen parameters (%d) are not supported"
                           % (path, len(ms["frozen_param_shapes"])))
    if not ms.get("param_shapes"):
        raise ImportError_("%s: no param_shapes: not a ZeRO-1/2 checkpoint" % path)


def _groups(ms, optims, path):
    """Per group: [(name, shape, numel)] in DeepSpeed's order, and the full flat fp32, exp_avg
    and exp_avg_sq (the ranks' partitions joined)."""
    import torch
    groups = []
    for g, shapes in enumerate(ms["param_shapes"]):
        parts = {"fp32": [], "exp_avg": [], "exp_avg_sq": []}
        step = None
        for o in optims:
            osd = o["optimizer_state_dict"]
            stage = osd.get("zero_stage")
            if isinstance(stage, _Record) and stage.args and stage.args[0] in (3, "weights"):
                raise ImportError_("%s: zero_stage %s: only ZeRO-1 and 2 are supported"
                                   % (path, stage.args[0]))
            parts["fp32"].append(osd["single_partition_of_fp32_groups"][g].float())
            st = osd["base_optimizer_state"]["state"].get(g, {})
            n = parts["fp32"][-1].numel()
            parts["exp_avg"].append(st.get("exp_avg", torch.zeros(n)).float().reshape(-1))
            parts["exp_avg_sq"].append(st.get("exp_avg_sq", torch.zeros(n)).float().reshape(-1))
            s = st.get("step", 0)
            step = int(s.item() if torch.is_tensor(s) else s)
        full = {k: torch.cat(v) for k, v in parts.items()}
        params = []
        for name, shape in shapes.items():
            shape = tuple(int(d) for d in shape)
            numel = 1
            for d in shape:
                numel *= d
            params.append((name, shape, numel))
        total = sum(p[2] for p in params)
        if total > full["fp32"].numel():
            raise ImportError_("%s: group %d's parameters hold %d elements, its partitions %d"
                               % (path, g, total, full["fp32"].numel()))
        groups.append({"params": params, "full": full, "step": step})
    return groups


def _st_write(path, tensors):
    """A safetensors file of named 1-D fp32 tensors (no safetensors package needed)."""
    header, off = {}, 0
    for name, t in tensors:
        n = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": [t.numel()], "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "zerod-checkpoint", "rank": "0", "world": "1"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for _, t in tensors:
            f.write(t.detach().contiguous().numpy().astype("<f4").tobytes())
        f.flush()
        os.fsync(f.fileno())


def _zeroctl():
    cands = [os.environ.get("ZEROD_ZEROCTL"), shutil.which("zeroctl")]
    try:
        from ._libzc import libzc_path
        cands.append(os.path.join(os.path.dirname(libzc_path()), "zeroctl"))
    except Exception:  # noqa: BLE001 (no libzc: other candidates)
        pass
    for c in cands:
        if c and os.access(c, os.X_OK):
            return c
    raise ImportError_("zeroctl not found (PATH, next to libzc, or $ZEROD_ZEROCTL): it computes "
                       "the manifest's checksums")


def _trainer_state(ms, optims, groups):
    import torch
    pgs = []
    for g, pg in enumerate(optims[0]["optimizer_state_dict"]["base_optimizer_state"]
                           ["param_groups"]):
        d = {k: v for k, v in pg.items() if k not in ("params", "step")}
        d["params"] = list(range(len(groups[g]["params"])))
        pgs.append(d)
    state = {
        "format": 1,
        "client_state": {k: v for k, v in ms.items() if k not in _KNOWN_MODEL_KEYS},
        "lr_scheduler": ms.get("lr_scheduler"),
        "optimizer": {"state": {}, "param_groups": pgs},
        "global_steps": ms.get("global_steps", 0),
        "micro_steps": ms.get("global_steps", 0) * (ms.get("ds_config") or {}).get(
            "gradient_accumulation_steps", 1),
        "skipped_steps": ms.get("skipped_steps", 0),
        "world_size": ms.get("dp_world_size"),
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _manifest(ms, optims, groups, tag, job):
    import torch
    cfg = ms.get("ds_config") or {}
    dtype = "fp16" if (cfg.get("fp16") or {}).get("enabled") else (
        "bf16" if (cfg.get("bf16") or {}).get("enabled") else "fp32")
    scaler = optims[0]["optimizer_state_dict"].get("loss_scaler")
    cur = scaler.get("cur_scale", 1.0) if isinstance(scaler, _Record) else 1.0
    params, n_shard = [], 0
    for g, grp in enumerate(groups):
        for name, shape, numel in reversed(grp["params"]):  # zerod's registration order
            params.append({"name": name, "group": g, "numel": numel, "shape": list(shape)})
            n_shard += numel
    big = max(sum(p[2] for p in grp["params"]) for grp in groups)
    return {
        "format": "zerod-checkpoint", "format_version": FORMAT_VERSION, "job_id": job,
        "tag": tag, "step": groups[0]["step"] or 0, "skipped_steps": ms.get("skipped_steps", 0),
        "world": 1, "stage": int((cfg.get("zero_optimization") or {}).get("stage", 2)),
        "dtype": dtype, "bucket_size": max(big, 1), "elem_align": 1, "round_robin": False,
        "shard_numel": n_shard, "layout_hash": "0", "config_hash": "0", "optimizer_states": True,
        "loss_scaler": {"cur_scale": float(cur.item() if torch.is_tensor(cur) else cur),
                        "cur_hysteresis": int(scaler.get("cur_hysteresis", 0) or 0)
                        if isinstance(scaler, _Record) else 0,
                        "cur_iter": int(scaler.get("cur_iter", 0) or 0)
                        if isinstance(scaler, _Record) else 0,
                        "last_overflow_iter": int(scaler.get("last_overflow_iter", -1) or -1)
                        if isinstance(scaler, _Record) else -1},
        "groups": [{"n_params": len(grp["params"]), "options": {}} for grp in groups],
        "params": params,
        "files": [{"name": "rank_00000.safetensors", "rank": 0, "bytes": 0, "xxh3": "0"},
                  {"name": "trainer_state.pt", "rank": -1, "bytes": 0, "xxh3": "0"}],
    }


def convert(ds_dir, out_dir, tag=None, job="imported"):
    """Returns the path of the zerod checkpoint written."""
    import torch
    path, tag = _resolve(ds_dir, tag)
    ms = _load(os.path.join(path, _MODEL_FILE))
    _check_model(ms, path)
    optims = [_load(f) for f in _optim_files(path, int(ms.get("dp_world_size", 1)))]
    groups = _groups(ms, optims, path)
    tensors = {}
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        pieces = []
        for grp in groups:  # registration order: each group's parameters in reverse
            offs, o = [], 0
            for _, _, numel in grp["params"]:
                offs.append(o)
                o += numel
            for (_, _, numel), off in reversed(list(zip(grp["params"], offs))):
                pieces.append(grp["full"][key][off:off + numel])
        tensors[key] = torch.cat(pieces)
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, ".zerod-tmp-" + tag)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    _st_write(os.path.join(tmp, "rank_00000.safetensors"),
              [("master", tensors["fp32"]), ("exp_avg", tensors["exp_avg"]),
               ("exp_avg_sq", tensors["exp_avg_sq"])])
    with open(os.path.join(tmp, "trainer_state.pt"), "wb") as f:
        f.write(_trainer_state(ms, optims, groups))
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        json.dump(_manifest(ms, optims, groups, tag, job), f, indent=1)
    subprocess.run([_zeroctl(), "checkpoint", "seal", tmp], check=True, stdout=subprocess.DEVNULL)
    final = os.path.join(out_dir, tag)
    if os.path.exists(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    with open(os.path.join(out_dir, ".zerod-tmp-latest"), "w") as f:
        f.write(tag + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(os.path.join(out_dir, ".zerod-tmp-latest"), os.path.join(out_dir, "latest"))
    return final


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m zerod.import_deepspeed",
                                 description="DeepSpeed ZeRO-1/2 checkpoint -> zerod checkpoint")
    ap.add_argument("ds_checkpoint_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--tag", default=None, help="DeepSpeed tag (default: its `latest`)")
    ap.add_argument("--job", default="imported", help="job id recorded in the manifest")
    a = ap.parse_args(argv)
    try:
        out = convert(a.ds_checkpoint_dir, a.out_dir, a.tag, a.job)
    except (ImportError_, OSError, KeyError, subprocess.CalledProcessError) as e:
        print("zerod.import_deepspeed: %s" % e, file=sys.stderr)
        return 1
    print("zerod.import_deepspeed: wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
