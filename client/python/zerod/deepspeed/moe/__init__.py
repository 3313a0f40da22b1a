"""deepspeed.moe: importable (scripts import its helpers at the top), refused at use: zerod
serves dense data-parallel ZeRO 1/2 training, without expert parallelism."""
from . import layer, utils  # noqa: F401
