"""deepspeed.runtime.zero.partition_parameters: what ZeRO-1/2 code touches of ZeRO stage 3's
parameter partitioning. zerod never partitions parameters (every rank holds all of them), so
GatheredParameters has nothing to gather, as DeepSpeed's has nothing for parameters that are
not ZeRO-3's; building a model partitioned (Init) is refused."""
import enum

from ..._refuse import refuse


class ZeroParamStatus(enum.Enum):
    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


class Init:
    """deepspeed.zero.Init: refused (stage 3)."""

    def __init__(self, *args, **kwargs):
        refuse("deepspeed.zero.Init (ZeRO stage 3: parameters partitioned at construction)",
               "build the model normally")


class GatheredParameters:
    """A no-op context: every parameter is whole on every rank. DeepSpeed's skips parameters
    without ZeRO-3's ds_id the same way; modifier_rank's broadcast concerns only those."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        self.params = params

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def register_external_parameter(module, parameter):
    """Stage 3 bookkeeping: nothing to register when parameters are never partitioned."""
    return None


def unregister_external_parameter(module, parameter):
    return None
