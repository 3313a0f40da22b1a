"""deepspeed.moe.utils: no parameter is an expert's here; splitting groups for experts is
refused."""
from .._refuse import refusing_function


def is_moe_param(param):
    """DeepSpeed's test: an expert's parameter is marked allreduce=False (none is, here)."""
    return hasattr(param, "allreduce") and not param.allreduce


split_params_into_different_moe_groups_for_optimizer = refusing_function(
    "split_params_into_different_moe_groups_for_optimizer",
    "Mixture of Experts parameter groups (deepspeed.moe)")
