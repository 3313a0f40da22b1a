"""deepspeed.utils.timer: the engine's throughput timer."""
from ..._compat import ThroughputTimer  # noqa: F401
