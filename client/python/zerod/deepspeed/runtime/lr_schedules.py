"""deepspeed.runtime.lr_schedules: DeepSpeed's schedules, as zerod.lr_schedules builds them."""
from ...lr_schedules import (  # noqa: F401
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
)
