"""deepspeed.zero (deepspeed.runtime.zero): ZeRO stage 3's entry points as ZeRO-1/2 code meets
them; zerod serves stages 1 and 2."""
from ..._refuse import refusing_class
from .partition_parameters import (  # noqa: F401
    GatheredParameters,
    Init,
    ZeroParamStatus,
    register_external_parameter,
    unregister_external_parameter,
)

MiCS_Init = refusing_class("MiCS_Init", "deepspeed.zero.MiCS_Init (ZeRO stage 3 with MiCS)")
TiledLinear = refusing_class("TiledLinear", "deepspeed.zero.TiledLinear (ZeRO stage 3)")
