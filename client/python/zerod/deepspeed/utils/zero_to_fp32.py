"""deepspeed.utils.zero_to_fp32 for zerod checkpoints: the fp32 master weights of a checkpoint
that engine.save_checkpoint wrote, as one state_dict. The reading is zerod._consolidate's
(imported when first called)."""
import os

import torch


def _consolidate():
    try:
        from zerod import _consolidate
    except ImportError as e:
        raise NotImplementedError("zerod: zero_to_fp32 needs zerod._consolidate, which this "
                                  "zerod does not have (%s); `zeroctl export --checkpoint DIR "
                                  "OUT.safetensors` writes the same weights" % e) from None
    return _consolidate


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None,
                                             exclude_frozen_parameters=False, lazy_mode=False):
    """{name: fp32 tensor} of checkpoint_dir/tag (tag: checkpoint_dir/latest when None)."""
    return _consolidate().get_fp32_state_dict_from_zero_checkpoint(
        checkpoint_dir, tag=tag, exclude_frozen_parameters=exclude_frozen_parameters,
        lazy_mode=lazy_mode)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization=False, tag=None,
                                               exclude_frozen_parameters=False):
    """Writes output_dir/pytorch_model.bin (or model.safetensors), unsharded: max_shard_size
    is not applied."""
    del max_shard_size
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag,
                                                  exclude_frozen_parameters)
    os.makedirs(output_dir, exist_ok=True)
    if safe_serialization:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in sd.items()},
                  os.path.join(output_dir, "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(sd, os.path.join(output_dir, "pytorch_model.bin"))


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """The model, on the CPU, with the checkpoint's fp32 weights (strict=False, as DeepSpeed)."""
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(sd, strict=False)
    return model
