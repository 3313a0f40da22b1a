"""The parts of DeepSpeed's engine and module surface that ZerodEngine adds to its own
(zerod.torch): properties and calls a DeepSpeed ZeRO-1/2 script uses, with DeepSpeed's
meaning, or a refusal that says why.
"""
import argparse
import contextlib
import os

import torch


class DeepSpeedSurface:
    """Mixed into ZerodEngine: expects rank, world_size, stage, micro_steps, global_steps,
    config, module, _gas, _train_batch, _micro_batch, _step_applied and _dev."""

    @property
    def device(self):
        """Where the parameters live, as the daemon's regions: the CPU (host memory), or the
        daemon's GPU, cuda:N, for a daemon on the CUDA backend."""
        dev = getattr(self, "_dev", None)
        if dev is None:  # ZeRO-Offload: the parameters' own GPU
            dev = getattr(self, "_offload", None)
        return dev if dev is not None else torch.device("cpu")

    @property
    def global_rank(self):
        return self.rank

    @property
    def dp_world_size(self):
        return self.world_size

    def train_micro_batch_size_per_gpu(self):
        """DeepSpeed's batch triple as the daemon resolved it from the config and the world
        (any two of train_batch_size, train_micro_batch_size_per_gpu and
        gradient_accumulation_steps determine the third); None when the config gives neither
        batch size (DeepSpeed refuses such a config; zerod needs none)."""
        return self._micro_batch or None

    def train_batch_size(self):
        """micro x gradient_accumulation_steps x world, as DeepSpeed defines it."""
        return self._train_batch or None

    @property
    def global_samples(self):
        """Samples seen by every rank together (micro-batches x micro x world)."""
        micro = self.train_micro_batch_size_per_gpu() or 0
        return self.micro_steps * micro * self.world_size

    def was_step_applied(self):
        """False when the last optimizer step was skipped (fp16 overflow); None before one."""
        return self._step_applied

    def set_gradient_accumulation_boundary(self, is_boundary):
        """Force the next engine.step() to step (True) or not (False); None: count again."""
        self._boundary_override = None if is_boundary is None else bool(is_boundary)

    @contextlib.contextmanager
    def no_sync(self):
        """Stage 1: gradients accumulate in the grads region until the boundary anyway, so this
        changes nothing. Stage 2 refuses it, as DeepSpeed does: gradients are partitioned as
        they are produced."""
        if self.stage >= 2:
            raise RuntimeError("zerod: no_sync is incompatible with gradient partitioning "
                               "(ZeRO stage 2), as in DeepSpeed; accumulate with "
                               "gradient_accumulation_steps instead")
        yield

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin",
                         exclude_frozen_parameters=False):
        """Rank 0 saves the module's state_dict in the parameter dtype (every rank holds all
        parameters). Returns True."""
        del exclude_frozen_parameters
        if self.rank == 0:
            os.makedirs(save_dir, exist_ok=True)
            sd = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
            torch.save(sd, os.path.join(save_dir, save_filename))
        return True


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=None,
                     verbose=True, timeout=None, init_method=None, dist_init_required=None,
                     config=None, rank=-1, world_size=-1):
    """deepspeed.init_distributed: torch.distributed with the launcher's environment (gloo on
    the CPU). zerod's daemons meet on MASTER_PORT + 1, so torch keeps MASTER_PORT."""
    del auto_mpi_discovery, verbose, config
    if dist_init_required is False or not torch.distributed.is_available():
        return
    if torch.distributed.is_initialized():
        return
    if distributed_port is not None:
        os.environ["MASTER_PORT"] = str(distributed_port)
    kwargs = {"backend": dist_backend or "gloo"}
    if init_method is not None:
        kwargs["init_method"] = init_method
    if timeout is not None:
        kwargs["timeout"] = timeout
    if rank >= 0:
        kwargs["rank"] = rank
    if world_size >= 0:
        kwargs["world_size"] = world_size
    torch.distributed.init_process_group(**kwargs)


def add_config_arguments(parser):
    """deepspeed.add_config_arguments: --deepspeed and --deepspeed_config (and the deprecated
    --deepscale ones) on an argparse parser."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (here: zerod)")
    group.add_argument("--deepspeed_config", default=None, type=str,
                       help="DeepSpeed json configuration file")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser


class _ZeroNamespace:
    """deepspeed.zero: only what ZeRO-1/2 scripts touch."""

    class Init:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("zerod serves ZeRO stages 1 and 2: deepspeed.zero.Init (stage 3 "
                               "parameter partitioning at construction) is not supported; build "
                               "the model normally")


zero = _ZeroNamespace()
