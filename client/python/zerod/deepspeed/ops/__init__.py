"""deepspeed.ops: Adam only (ops.adam); zerod's daemons run the optimizer."""
from . import adam  # noqa: F401
