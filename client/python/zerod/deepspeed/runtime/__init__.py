"""deepspeed.runtime: the engine, ZeRO 1/2's zero namespace, lr schedules, data loading."""
from . import zero  # noqa: F401
