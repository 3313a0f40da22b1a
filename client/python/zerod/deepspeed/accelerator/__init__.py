"""deepspeed.accelerator: get_accelerator() for the CPU or CUDA (real_accelerator.py)."""
from .real_accelerator import (  # noqa: F401
    DeepSpeedAccelerator,
    get_accelerator,
    is_current_accelerator_supported,
    set_accelerator,
)
