"""Hugging Face Trainer on zerod: the one line a transformers script changes is its import,

    from transformers import Trainer, TrainingArguments   # becomes
    from zerod.hf import Trainer, TrainingArguments

and nothing else: `TrainingArguments(deepspeed=...)` (a DeepSpeed config, a dict or a JSON file
with HF's "auto" values) is zerod's config here; without one, zerod trains with HF's own
optimizer and lr schedule from the TrainingArguments. Checkpoints go through Trainer's own
save_steps / save_model / train(resume_from_checkpoint=...).

Why a Trainer subclass, and not an Accelerate plugin or a callback: HF's DeepSpeed path is
Accelerate's DeepSpeedPlugin, and both check for and import an installed `deepspeed`
distribution, so a plugin would have to impersonate that package. A callback sees the loop
only between steps: it cannot replace `accelerator.backward` (the loss scale and the gradient
stream), nor keep Accelerate from wrapping the model in DistributedDataParallel, whose
all-reduce on top of zerod's would reduce every gradient twice. A subclass overrides the few
methods where HF itself switches to DeepSpeed, and leaves the loop, data, logging, callbacks
and evaluation HF's.

What changes against HF's loop (transformers 4.44, accelerate 0.32; docs in
client/python/README.md, "Hugging Face Trainer"):
  - create_optimizer_and_scheduler: fills the config's "auto" values as HF does for DeepSpeed
    and calls zerod.torch.initialize; the optimizer is Trainer(optimizers=)'s, else the
    config's, else HF's create_optimizer() (its type and param groups: AdamW with HF's
    no-decay split); the lr schedule likewise, else HF's create_scheduler().
  - _wrap_model: the engine, so Accelerate neither prepares nor wraps the model.
  - training_step: engine.backward(loss) and engine.step(), as Accelerate drives DeepSpeed's
    engine; the engine steps the daemon at its accumulation boundary and then the lr
    schedule (not after a skipped fp16 step). HF's own optimizer.step() and
    lr_scheduler.step() calls are then no-ops, and HF's gradient clipping returns the
    daemon's gradient norm (the daemon clips with gradient_clipping = max_grad_norm).
  - _save_optimizer_and_scheduler / _load_optimizer_and_scheduler: engine.save_checkpoint /
    load_checkpoint in the checkpoint-N folder, on every rank (the Adam state, the fp32
    masters, the lr schedule). HF still writes the model's weights, the trainer state and
    the RNG states itself.
  - train: closes the engine at the end, so that the model's parameters are its own again
    (evaluation, save_model and a further train() work on a plain model).
"""
import dataclasses

import transformers

from . import _config
from . import torch as _zt

__all__ = ["Trainer", "TrainingArguments", "SUPPORTED_TRANSFORMERS"]

# The transformers versions whose Trainer internals this module overrides; tested with
# 4.44.2 (accelerate 0.32.1). Another version's loop may call these methods differently.
SUPPORTED_TRANSFORMERS = ((4, 44),)


def _check_version(version):
    try:
        major_minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        major_minor = None
    if major_minor not in SUPPORTED_TRANSFORMERS:
        raise ImportError(
            "zerod.hf: transformers %s is not supported; zerod.hf overrides Trainer internals "
            "of transformers %s only (pip install 'transformers==4.44.2' 'accelerate==0.32.1')"
            % (version, ", ".join("%d.%d.x" % v for v in SUPPORTED_TRANSFORMERS)))


_check_version(transformers.__version__)


# ---- "auto" values ------------------------------------------------------------------------

def _node(cfg, path):
    """(the dict holding the last key of a dotted path, that key); (None, key) when a section
    on the way is absent."""
    *sections, key = path.split(".")
    node = cfg
    for s in sections:
        node = node.get(s)
        if not isinstance(node, dict):
            return None, key
    return node, key


def _fill(cfg, rows, mismatches):
    """rows: (config path, HF's value, the TrainingArguments it comes from, or None for a value
    that only fills "auto"). "auto" takes HF's value; a set value that differs from HF's is a
    mismatch, as HF's DeepSpeed integration reports them."""
    for path, value, hf_name in rows:
        node, key = _node(cfg, path)
        if node is None or key not in node:
            continue
        if node[key] == "auto":
            node[key] = value
        elif hf_name is not None and node[key] != value:
            mismatches.append("config %s=%r, TrainingArguments %s=%r"
                              % (path, node[key], hf_name, value))


def _raise_mismatches(mismatches):
    if mismatches:
        raise ValueError("zerod.hf: the config disagrees with the TrainingArguments (set these "
                         "keys to \"auto\" to take the TrainingArguments' values):\n  "
                         + "\n  ".join(mismatches))


def fill_from_args(cfg, args):
    """The "auto" values TrainingArguments decide: batch sizes, clipping, Adam's
    hyper-parameters, the warmup lr and the dtype (HF's trainer_config_process keys)."""
    world = args.world_size
    micro, gas = args.per_device_train_batch_size, args.gradient_accumulation_steps
    mismatches = []
    _fill(cfg, [
        ("train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size"),
        ("gradient_accumulation_steps", gas, "gradient_accumulation_steps"),
        ("train_batch_size", world * micro * gas,
         "world_size x per_device_train_batch_size x gradient_accumulation_steps"),
        ("gradient_clipping", args.max_grad_norm, "max_grad_norm"),
        ("optimizer.params.lr", args.learning_rate, "learning_rate"),
        ("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1, adam_beta2"),
        ("optimizer.params.eps", args.adam_epsilon, "adam_epsilon"),
        ("optimizer.params.weight_decay", args.weight_decay, "weight_decay"),
        ("scheduler.params.warmup_min_lr", 0, None),
        ("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate"),
        ("fp16.enabled", bool(args.fp16 or args.fp16_full_eval), "fp16"),
        ("bf16.enabled", bool(args.bf16 or args.bf16_full_eval), "bf16"),
    ], mismatches)
    _raise_mismatches(mismatches)


def fill_from_model(cfg, args, model, num_training_steps):
    """The "auto" values known once training starts: reduce_bucket_size from the model's hidden
    size (hidden_size², as HF), the schedule's total and warmup steps. Then no "auto" may be
    left."""
    node, key = _node(cfg, "zero_optimization.reduce_bucket_size")
    if node is not None and node.get(key) == "auto":
        mc = getattr(model, "config", None)
        hidden = getattr(mc, "hidden_size", None) or max(getattr(mc, "hidden_sizes", None) or [0])
        if not hidden:
            raise ValueError("zerod.hf: config zero_optimization.reduce_bucket_size is \"auto\" "
                             "but the model's config has no hidden_size or hidden_sizes: give "
                             "it a number")
        node[key] = hidden * hidden
    mismatches = []
    _fill(cfg, [
        ("scheduler.params.total_num_steps", num_training_steps, "max_steps (as computed)"),
        ("scheduler.params.warmup_num_steps", args.get_warmup_steps(num_training_steps),
         "warmup_steps"),
    ], mismatches)
    _raise_mismatches(mismatches)
    left = _auto_paths(cfg)
    if left:
        raise ValueError("zerod.hf: config %s \"auto\": zerod.hf fills \"auto\" only where HF "
                         "does for DeepSpeed (client/python/README.md); give a value"
                         % ", ".join("%s is" % p for p in left))


def _auto_paths(node, prefix=""):
    found = []
    for k, v in node.items():
        if isinstance(v, dict):
            found += _auto_paths(v, prefix + k + ".")
        elif v == "auto":
            found.append(prefix + k)
    return found


# Without deepspeed=: ZeRO-2 with everything from the TrainingArguments (HF's optimizer and
# schedule, as a plain HF script trains).
_DEFAULT_CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": 2},
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
}


# ---- TrainingArguments --------------------------------------------------------------------

@dataclasses.dataclass
class TrainingArguments(transformers.TrainingArguments):
    """HF's TrainingArguments; `deepspeed` (a DeepSpeed config: dict or JSON file) becomes
    `zerod_config`, its "auto" values filled from these arguments, and `deepspeed` is None:
    HF's own DeepSpeed path, which requires the deepspeed package, stays off."""

    def __post_init__(self):
        source, self.deepspeed = self.deepspeed, None
        super().__post_init__()
        if self.auto_find_batch_size:
            raise ValueError("zerod.hf: auto_find_batch_size is not supported (the batch size "
                             "is fixed when the job attaches), as with DeepSpeed")
        # a private deep copy: "auto" is filled in place
        cfg = _config.load_config(source if source is not None else _DEFAULT_CONFIG)
        fill_from_args(cfg, self)
        self.zerod_config = cfg


# ---- what HF's loop holds as its optimizer and lr scheduler ---------------------------------

class _SteppedByEngine:
    """The engine's optimizer or lr scheduler as HF's loop sees it: the engine stepped it in
    training_step already (at its accumulation boundary; the schedule only after an applied
    step), so HF's step() is a no-op here -- as Accelerate's wrappers do for DeepSpeed's engine.
    Everything else (param_groups, get_last_lr, state_dict, ...) is the wrapped object's."""

    def __init__(self, inner, engine):
        self._inner = inner
        self._engine = engine

    def step(self, *args, **kwargs):
        gas = self._engine.gradient_accumulation_steps()
        if self._engine.micro_steps % gas:
            raise RuntimeError(
                "zerod.hf: the Trainer ended an accumulation window after %d of %d micro-batches "
                "(an epoch shorter than gradient_accumulation_steps?); zerod steps at every "
                "%d-th micro-batch" % (self._engine.micro_steps % gas, gas, gas))

    def __getattr__(self, name):
        return getattr(self._inner, name)


# ---- Trainer ------------------------------------------------------------------------------

class Trainer(transformers.Trainer):
    """HF's Trainer, training on the local zerod (one daemon per rank: ZEROD_SOCKET, or the
    torchrun / zerorun environment, as zerod.torch.initialize). `engine` is the ZerodEngine
    while train() runs, None otherwise."""

    def __init__(self, model=None, args=None, *rest, **kwargs):
        if args is None:  # HF would make its own TrainingArguments, with no zerod_config
            args = TrainingArguments(output_dir="tmp_trainer")
        super().__init__(model, args, *rest, **kwargs)
        if not isinstance(self.args, TrainingArguments):
            raise TypeError("zerod.hf.Trainer needs zerod.hf.TrainingArguments, not %s.%s "
                            "(import both from zerod.hf)"
                            % (type(self.args).__module__, type(self.args).__name__))
        if self.args.n_gpu > 1:
            raise ValueError("zerod.hf: one process drives %d GPUs (torch.nn.DataParallel); "
                             "zerod needs one process per GPU (torchrun or zerorun)"
                             % self.args.n_gpu)
        # the engine holds the model in the config's dtype (as DeepSpeed's does; HF switches
        # these off for DeepSpeed too)
        self.use_cpu_amp = False
        self.use_apex = False
        self._client_optimizers = (self.optimizer, self.lr_scheduler)  # Trainer(optimizers=)
        self.engine = None

    def create_accelerator_and_postprocess(self):
        # Accelerate's accumulate() would call engine.no_sync() between boundaries, which
        # ZeRO-2 refuses: sync_each_batch makes it a no-op (the engine keeps the gradients in
        # the daemon's slots until its boundary anyway)
        acc = self.args.accelerator_config
        given = acc.gradient_accumulation_kwargs
        acc.gradient_accumulation_kwargs = dict(given or {}, sync_each_batch=True)
        try:
            super().create_accelerator_and_postprocess()
        finally:
            acc.gradient_accumulation_kwargs = given
        # HF clips before its optimizer.step(); the daemon clipped already, in the step that
        # training_step's engine.step() ran: HF logs that step's norm
        self.accelerator.clip_grad_norm_ = self._daemon_grad_norm

    def _daemon_grad_norm(self, parameters, max_norm, norm_type=2):
        return self.engine.get_global_grad_norm() if self.engine is not None else None

    def create_optimizer_and_scheduler(self, num_training_steps):
        cfg = _config.load_config(self.args.zerod_config)
        fill_from_model(cfg, self.args, self.model, num_training_steps)
        client_opt, client_sched = self._client_optimizers
        optimizer = client_opt
        if optimizer is None and "optimizer" not in cfg:
            self.optimizer = None
            optimizer = self.create_optimizer()  # HF's, from args.optim and its param groups
        lr_scheduler = client_sched
        if lr_scheduler is None and not (cfg.get("scheduler") or {}).get("type"):
            def hf_schedule(opt):  # HF's, from args.lr_scheduler_type, on the engine's optimizer
                self.lr_scheduler = None
                return self.create_scheduler(num_training_steps, optimizer=opt)
            lr_scheduler = hf_schedule
        self.engine, _, _, _ = _zt.initialize(model=self.model, optimizer=optimizer,
                                              lr_scheduler=lr_scheduler, config=cfg)
        self.optimizer = _SteppedByEngine(self.engine.optimizer, self.engine)
        self.lr_scheduler = _SteppedByEngine(self.engine.lr_scheduler, self.engine)

    def _wrap_model(self, model, training=True, dataloader=None):
        if training and self.engine is not None:
            return self.engine  # not model: Accelerate must not prepare it (no DDP)
        return model

    def training_step(self, model, inputs):
        if self.engine is None:
            return super().training_step(model, inputs)
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        del inputs
        # each micro-batch's own loss: the daemon divides by gradient_accumulation_steps
        self.engine.backward(loss)
        self.engine.step()
        return loss.detach() / self.args.gradient_accumulation_steps

    def _save_optimizer_and_scheduler(self, output_dir):
        if self.engine is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        # every rank; waited for, as HF's checkpoint-N counts as complete once this returns
        self.engine.save_checkpoint(output_dir)
        self.engine.wait_checkpoint()

    def _load_optimizer_and_scheduler(self, checkpoint):
        if self.engine is None or checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        path, _ = self.engine.load_checkpoint(checkpoint)
        if path is None:
            raise ValueError("zerod.hf: %s holds no zerod checkpoint (no 'latest'): resume "
                             "from a checkpoint-N folder that zerod.hf.Trainer saved"
                             % checkpoint)

    def _load_best_model(self):
        self._close_engine()  # the best weights go into the model's own parameters
        super()._load_best_model()

    def train(self, *args, **kwargs):
        ok = False
        try:
            out = super().train(*args, **kwargs)
            ok = True
            return out
        finally:
            self._close_engine(end_job=ok)

    def _close_engine(self, end_job=True):
        """The parameters become the model's own again (their last values); end_job=False
        keeps the job on the daemon for job_linger after a failure."""
        engine, self.engine = self.engine, None
        if engine is None:
            return
        try:
            engine.close(end_job=end_job)
        except _zt.ZerodError:
            if end_job:
                raise  # after a failure, the failure is what the caller needs to see
