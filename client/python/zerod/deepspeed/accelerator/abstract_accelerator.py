"""deepspeed.accelerator.abstract_accelerator: the accelerators' common base."""
from .real_accelerator import DeepSpeedAccelerator  # noqa: F401
