"""The parts of DeepSpeed's engine and module surface that ZerodEngine adds to its own
(zerod.torch): properties and calls a DeepSpeed ZeRO-1/2 script uses, with DeepSpeed's
meaning, or a refusal that says why.
"""
import argparse
import atexit
import contextlib
import os
import sys
import time
import weakref

import torch

# DeepSpeed's data loader routes (deepspeed_io): the training route shuffles
ROUTE_TRAIN, ROUTE_EVAL, ROUTE_PREDICT = "train", "eval", "predict"


class DeepSpeedSurface:
    """Mixed into ZerodEngine: expects rank, world_size, stage, dtype, micro_steps,
    global_steps, config, module, optimizer, _gas, _train_batch, _micro_batch, _step_applied
    and _dev."""

    training_dataloader = None  # initialize(training_data=...)'s loader
    collate_fn = None  # initialize(collate_fn=...): deepspeed_io's default

    def __getattr__(self, name):
        """As DeepSpeed's engine: a public name the engine lacks is the module's (a Hugging Face
        model's gradient_checkpointing_enable(), engine.model, ...)."""
        try:
            return super().__getattr__(name)  # nn.Module's: submodules, parameters, buffers
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if name.startswith("_") or module is None or not hasattr(module, name):
                raise AttributeError("'%s' object and its module have no attribute %r"
                                     % (type(self).__name__, name)) from None
            return getattr(module, name)

    @property
    def tput_timer(self):
        """DeepSpeed's throughput timer: started by each forward, stopped by each step."""
        timer = self.__dict__.get("_tput_timer")
        if timer is None:
            timer = self.__dict__["_tput_timer"] = ThroughputTimer(self.train_batch_size())
        return timer

    def fp16_enabled(self):
        return self.dtype == torch.float16

    def bfloat16_enabled(self):
        return self.dtype == torch.bfloat16

    def zero_optimization(self):
        return self.stage > 0

    def zero_optimization_stage(self):
        return self.stage

    def zero_cpu_offload(self):
        """zero_optimization.offload_optimizer.device is "cpu" (ZeRO-Offload)."""
        return getattr(self, "_offload", None) is not None

    def gradient_clipping(self):
        """The config's gradient_clipping (0.0, DeepSpeed's default: no clipping)."""
        return self.config.get("gradient_clipping", 0.0)

    def steps_per_print(self):
        return self.config.get("steps_per_print", 10)

    def wall_clock_breakdown(self):
        return bool(self.config.get("wall_clock_breakdown", False))

    def dataloader_drop_last(self):
        return bool(self.config.get("dataloader_drop_last", False))

    def get_mom(self):
        """Adam's betas per group, as DeepSpeed's get_mom() for Adam-type optimizers."""
        return [g["betas"] for g in self.optimizer.param_groups]

    def empty_partition_cache(self):
        """ZeRO-3 releases its gathered parameters here; ZeRO-1/2 holds none (a no-op in
        DeepSpeed too)."""
        return None

    def set_train_batch_size(self, train_batch_size):
        """DeepSpeed changes gradient_accumulation_steps to reach train_batch_size at the same
        micro batch. The daemons divide the accumulated gradient by the attach's
        gradient_accumulation_steps, fixed for the job: only the batch size it already has is
        accepted."""
        micro = self.train_micro_batch_size_per_gpu()
        if micro is None or train_batch_size % (micro * self.world_size) != 0:
            raise ValueError("Train batch size must be divisible by micro-batch data "
                             "parallelism")
        gas = train_batch_size // (micro * self.world_size)
        if gas != self._gas:
            raise ValueError("zerod: set_train_batch_size(%d) needs gradient_accumulation_steps "
                             "%d; the daemons divide by the job's %d, fixed at attach (start a "
                             "new job with the new batch size)" % (train_batch_size, gas,
                                                                   self._gas))

    def deepspeed_io(self, dataset, batch_size=None, route=ROUTE_TRAIN, pin_memory=True,
                     data_sampler=None, collate_fn=None, num_local_io_workers=None):
        """DeepSpeed's data loader over dataset: each rank reads its DistributedSampler share
        (shuffled on the training route, seed 0, the same order every epoch as DeepSpeed's
        loader never sets the epoch), micro batches of train_micro_batch_size_per_gpu(), two
        worker processes, the config's dataloader_drop_last."""
        check_dataset(dataset)
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        if batch_size is None:
            batch_size = self.train_micro_batch_size_per_gpu()
            if batch_size is None:
                raise ValueError("zerod: a data loader needs the micro batch size: the config "
                                 "gives neither train_batch_size nor "
                                 "train_micro_batch_size_per_gpu")
        if data_sampler is None and not iterable:
            data_sampler = torch.utils.data.DistributedSampler(
                dataset, num_replicas=self.world_size, rank=self.rank,
                shuffle=route == ROUTE_TRAIN)
        return torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=data_sampler,
            collate_fn=collate_fn if collate_fn is not None else self.collate_fn,
            num_workers=2 if num_local_io_workers is None else num_local_io_workers,
            pin_memory=pin_memory and self.device.type == "cuda",
            drop_last=self.dataloader_drop_last())

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
        parameters), without the frozen ones (requires_grad False) if asked. Returns True."""
        if self.rank == 0:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            os.makedirs(save_dir, exist_ok=True)
            sd = {k: v.detach().clone() for k, v in self.module.state_dict().items()
                  if not (exclude_frozen_parameters and k in frozen)}
            torch.save(sd, os.path.join(save_dir, save_filename))
        return True

    save_fp16_model = save_16bit_model


class ThroughputTimer:
    """DeepSpeed's engine.tput_timer: samples per second over the optimizer steps after the
    first start_step (their start-up is not counted)."""

    def __init__(self, batch_size, start_step=2):
        self.batch_size = batch_size or 1
        self.start_step = start_step
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0
        self.step_elapsed_time = 0.0
        self.started = False
        self.start_time = 0.0

    def update_epoch_count(self):
        self.epoch_count += 1
        self.micro_step_count = 0

    def start(self):
        self.started = True
        if self.global_step_count >= self.start_step:
            self.start_time = time.time()

    def stop(self, global_step=False, report_speed=True):
        if not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if self.start_time > 0:
            elapsed = time.time() - self.start_time
            self.total_elapsed_time += elapsed
            self.step_elapsed_time += elapsed
            self.start_time = 0.0

    def avg_samples_per_sec(self):
        steps = self.global_step_count - self.start_step
        if steps > 0 and self.total_elapsed_time > 0:
            return self.batch_size / (self.total_elapsed_time / steps)
        return float("-inf")


class DeepSpeedOptimizerSurface:
    """Mixed into ZerodOptimizer: DeepSpeed's ZeRO optimizer attributes scripts read."""

    @property
    def overflow(self):
        """The last step was skipped (an fp16 overflow)."""
        return self._engine._step_applied is False

    @property
    def cur_scale(self):
        """The current loss scale (1 unless fp16)."""
        return self._engine._loss_scale

    loss_scale = cur_scale


def check_dataset(data):
    """initialize(training_data=...): a torch Dataset (map-style or iterable), or None."""
    if data is not None and not (isinstance(data, torch.utils.data.IterableDataset)
                                 or hasattr(data, "__getitem__")):
        raise ValueError("zerod: training_data must be a torch Dataset, not %s"
                         % type(data).__name__)


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


# ---- interpreter exit ---------------------------------------------------------------------

_open_engines = weakref.WeakSet()


def close_at_exit(engine):
    """DeepSpeed scripts end without engine.destroy(): at interpreter exit an engine still open
    closes, ending its job, as at the end of a run. After an uncaught exception it is left as
    a killed trainer's is (its job kept for job_linger, for the launcher's restart)."""
    _open_engines.add(engine)


@atexit.register
def _close_open_engines():
    # the interpreter sets sys.last_value when an uncaught exception ended the script, before
    # the atexit handlers run; the host's sys.excepthook stays its own
    if getattr(sys, "last_value", None) is not None:
        return
    for engine in list(_open_engines):
        try:
            engine.close()
        except Exception as e:  # the interpreter is going: say it, end the others
            print("zerod: closing the engine at exit failed: %s" % e, file=sys.stderr)
