"""zerod's answer to `import deepspeed`: DeepSpeed's module layout for ZeRO stages 1 and 2.

    import zerod.deepspeed as deepspeed      # or: import zerod.torch as deepspeed

Either line also makes a later `import deepspeed` (`deepspeed.comm`, `deepspeed.accelerator`,
...) anywhere in the process resolve to these modules, unless the real DeepSpeed was imported
first (zerod._ds_alias). What zerod does not serve (ZeRO-3's zero.Init, pipelines, MoE,
inference) imports and refuses at use, naming the feature.
"""
from ..torch import (  # noqa: F401
    ZerodError,
    add_config_arguments,
    init_distributed,
    initialize,
)
from ._namespace import *  # noqa: F401,F403
from ._namespace import __all__ as _names

__all__ = ["initialize", "init_distributed", "add_config_arguments", "ZerodError"] + _names
