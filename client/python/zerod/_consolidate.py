"""DeepSpeed's deepspeed.utils.zero_to_fp32 for zerod checkpoints (docs/checkpoints.md): one
fp32 state dict of the whole model, keyed by the module's state_dict() names.

The trained parameters come from the daemons' shards (`zeroctl checkpoint export`, which
reassembles them from the rank files at any saving world size, after `zeroctl checkpoint
verify` checked every file against the manifest); the rest of the module's state_dict() comes
from the checkpoint's module.safetensors, written from rank 0's module at the save: the tied
names of parameters (GPT-2's lm_head.weight is transformer.wte.weight: both keys, one tensor,
as the module's own state_dict() has them), the buffers (BatchNorm's running statistics) and
the frozen parameters. So a strict model.load_state_dict() of the result works.
"""
import os
import subprocess
import tempfile

import torch

from ._checkpoint import read_module_file, read_safetensors
from .import_deepspeed import _zeroctl


def _checkpoint_path(checkpoint_dir, tag):
    """DIR/TAG: tag, else the tag DIR/latest names (as DeepSpeed); DIR itself when it is one
    checkpoint (it has a manifest.json)."""
    if tag is None:
        if os.path.exists(os.path.join(checkpoint_dir, "manifest.json")):
            return os.path.abspath(checkpoint_dir)
        latest = os.path.join(checkpoint_dir, "latest")
        if not os.path.isfile(latest):
            raise ValueError("unable to find 'latest' file at %s: pass tag=" % latest)
        with open(latest) as f:
            tag = f.read().strip()
    path = os.path.join(checkpoint_dir, str(tag))
    if not os.path.isdir(path):
        raise FileNotFoundError("directory '%s' doesn't exist" % path)
    return os.path.abspath(path)


def _zeroctl_run(args):
    rc = subprocess.run([_zeroctl()] + args, capture_output=True, text=True)
    if rc.returncode != 0:
        raise ValueError("zeroctl %s: %s" % (" ".join(args[:2]),
                                             (rc.stderr or rc.stdout).strip()))


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None,
                                             exclude_frozen_parameters=False, lazy_mode=False):
    """The consolidated fp32 state dict of checkpoint_dir/tag (tag None: the one `latest`
    names), on the CPU: every trained parameter's fp32 master under each of its state_dict()
    names (tied names share one tensor), with the module's buffers and frozen parameters as
    saved. lazy_mode is accepted for DeepSpeed's signature; the tensors are always loaded."""
    del lazy_mode
    path = _checkpoint_path(checkpoint_dir, tag)
    _zeroctl_run(["checkpoint", "verify", path])
    with tempfile.TemporaryDirectory(prefix="zerod-fp32-") as tmp:
        out = os.path.join(tmp, "master.safetensors")
        _zeroctl_run(["checkpoint", "export", path, "--state", "master", "-o", out])
        sd = read_safetensors(out)[0]
    extra, aliases, frozen = read_module_file(path)
    for key, t in extra.items():
        if not (exclude_frozen_parameters and key in frozen):
            sd[key] = t
    for alias, name in aliases.items():
        if name in sd:
            sd[alias] = sd[name]
    return sd


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_file, tag=None,
                                               exclude_frozen_parameters=False,
                                               safe_serialization=False, max_shard_size=None):
    """Write get_fp32_state_dict_from_zero_checkpoint()'s dict: with torch.save (tied names
    share their storage), or with safe_serialization as safetensors (the safetensors package;
    a tied name is a copy there, as safetensors has no aliases). output_file may be an existing
    directory (DeepSpeed 0.19's output_dir): pytorch_model.bin or model.safetensors in it.
    max_shard_size is accepted for DeepSpeed's signature: one file is written. Returns its
    path."""
    del max_shard_size
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    if os.path.isdir(output_file):
        output_file = os.path.join(output_file, "model.safetensors" if safe_serialization
                                   else "pytorch_model.bin")
    if safe_serialization:
        from safetensors.torch import save_file
        save_file({k: v.contiguous().clone() for k, v in sd.items()}, output_file,
                  metadata={"format": "pt"})
    else:
        torch.save(sd, output_file)
    return output_file


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Load the consolidated fp32 state dict into model (on its device, in its dtypes) and
    return model; not strict, as DeepSpeed's (a strict load_state_dict() of
    get_fp32_state_dict_from_zero_checkpoint() works too)."""
    model.load_state_dict(get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag),
                          strict=False)
    return model


__all__ = ["get_fp32_state_dict_from_zero_checkpoint",
           "convert_zero_checkpoint_to_fp32_state_dict", "load_state_dict_from_zero_checkpoint"]
