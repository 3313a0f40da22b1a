"""deepspeed.runtime.engine: zerod's engine under DeepSpeed's name, for isinstance checks."""
from ...torch import ZerodEngine as DeepSpeedEngine  # noqa: F401
from ...torch import ZerodOptimizer as DeepSpeedOptimizer  # noqa: F401

ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
