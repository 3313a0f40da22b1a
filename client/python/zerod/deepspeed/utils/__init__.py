"""deepspeed.utils: logging (logger, log_dist), zero_to_fp32 for zerod checkpoints, timers."""
from . import zero_to_fp32  # noqa: F401
from .._refuse import refusing_class, refusing_function
from ..runtime.dataloader import RepeatingLoader  # noqa: F401
from .logging import (  # noqa: F401
    log_dist,
    log_dist_once,
    logger,
    print_dist,
    set_log_level_from_string,
)

OnDevice = refusing_class("OnDevice", "deepspeed.OnDevice (building a model on the meta device "
                          "for ZeRO stage 3)", "build the model normally")
# the fp32 masters and Adam's moments live in the daemons' shards
safe_get_full_fp32_param = refusing_function(
    "safe_get_full_fp32_param", "safe_get_full_fp32_param (the daemons hold the fp32 masters)",
    "save_checkpoint and zero_to_fp32 give them")
safe_get_full_optimizer_state = refusing_function(
    "safe_get_full_optimizer_state", "safe_get_full_optimizer_state (the daemons hold the Adam "
    "state)")
