"""deepspeed.comm: DeepSpeed's communication calls over torch.distributed (comm.py)."""
from .comm import *  # noqa: F401,F403
from .comm import init_distributed  # noqa: F401
