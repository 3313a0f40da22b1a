"""PyTorch binding of zerod: a DeepSpeed-like engine over libzc.

    import zerod.torch
    engine, optimizer, _, _ = zerod.torch.initialize(model=model, config=ds_config)
    for batch in data:
        loss = loss_fn(engine(batch.x), batch.y)
        engine.backward(loss)   # gradients stream to the daemon bucket by bucket
        engine.step()           # optimizer step at the accumulation boundary
    engine.close()

The daemon owns the fp32 master weights and the Adam state; the model's parameters become
views of the shared params region, so after a step the model already holds the new values.
Works with torch 1.13 and newer. The parameters live where the daemon's regions do: on the
CPU for a CPU-backend daemon (host memory), on cuda:N for `zerod --device cuda:N` (device
memory; docs/design-notes.md, "Device regions (trainer side)").
"""
import json
import threading
import time
import warnings

import torch

from ._codes import STATUS, ZC_ERR_BUSY, ZC_ERR_JOB_ENDED, ZC_ERR_LAYOUT_MISMATCH
from . import _checkpoint, _compat, _config, _reattach, _setup
from ._compat import (  # noqa: F401
    DeepSpeedOptimizerSurface, DeepSpeedSurface, add_config_arguments, init_distributed)
from ._grads import _TORCH_DTYPE, GradientStream, StreamLink, _tensor_at, sync_device
from ._libzc import MEMORY_DEVICE, Session, ZerodError
from ._writes import ParamWrites

__all__ = ["initialize", "ZerodEngine", "ZerodOptimizer", "ZerodError", "init_distributed",
           "add_config_arguments", "zero"]

# Options the daemon fixes at attach time (only lr may change afterwards, with each Step).
_FIXED_KEYS = ("betas", "eps", "weight_decay", "bias_correction", "adam_w_mode")


# ---- optimizer facade ---------------------------------------------------------------------

class ZerodOptimizer(DeepSpeedOptimizerSurface, torch.optim.Optimizer):
    """The optimizer half of initialize()'s result. The Adam math runs in the daemon; this
    object holds the param groups (lr changes reach the daemon with the next step, so
    torch.optim.lr_scheduler works) and saves/loads the hyper-parameters."""

    def __init__(self, engine, groups, defaults):
        self._engine = engine
        self._frozen = False
        super().__init__(groups, defaults)
        self._frozen = True

    def add_param_group(self, param_group):
        """Only at construction: torch.optim.Optimizer.__init__ adds each group through here.
        torch's own add_param_group is not called: in torch 2.x its first call imports
        torch._dynamo (and sympy), about 80 MiB of anonymous memory and 70 MiB of mapped files
        in every trainer, for an optimizer whose math runs in the daemon. The groups were
        checked at attach; this fills in the defaults as torch does."""
        if self._frozen:
            raise RuntimeError("zerod: the parameter layout is fixed at attach; "
                               "add_param_group is not supported")
        group = dict(param_group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        self.param_groups.append(group)

    def step(self, closure=None):
        """Run the optimizer step now on the gradients submitted so far. Training loops call
        engine.step() instead, which steps at the accumulation boundary only."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._engine._optimizer_step()
        return loss

    def zero_grad(self, set_to_none=True):
        self._engine.zero_grad()

    def state_dict(self):
        groups = []
        start = 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(start, start + len(g["params"])))
            start += len(g["params"])
            groups.append(d)
        return {"state": {}, "param_groups": groups}

    def load_state_dict(self, state_dict):
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError("zerod: the state dict has %d param groups, the optimizer %d"
                             % (len(saved), len(self.param_groups)))
        for i, (mine, theirs) in enumerate(zip(self.param_groups, saved)):
            if len(theirs.get("params", mine["params"])) != len(mine["params"]):
                raise ValueError("zerod: param group %d sizes differ in the state dict" % i)
            for k in _FIXED_KEYS:
                if k in theirs and k in mine and _norm_opt(theirs[k]) != _norm_opt(mine[k]):
                    raise ValueError(
                        "zerod: param group %d: %s=%r differs from the attached job's %r; only "
                        "lr can change after initialize()" % (i, k, theirs[k], mine[k]))
        for mine, theirs in zip(self.param_groups, saved):
            for k, v in theirs.items():
                if k != "params" and k not in _FIXED_KEYS:
                    mine[k] = v


def _norm_opt(v):
    if isinstance(v, (list, tuple)):
        return tuple(float(x) for x in v)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


# ---- engine -------------------------------------------------------------------------------

class ZerodEngine(DeepSpeedSurface, torch.nn.Module):
    """Runs the module and streams its gradients to the local zerod.

    Attributes: module, global_steps (optimizer steps the daemon has completed; a step skipped
    on fp16 overflow does not count), skipped_steps, micro_steps (engine.step() calls), rank,
    world_size, stage, dtype, resumed (the attach found the job's state on the daemon),
    reattaches (re-attaches in place after a lost daemon, zerod._reattach)."""

    def __init__(self, model, groups, cfg, env, timeout_ms=None, attach_wait_s=2.0,
                 resume="auto"):
        super().__init__()
        self.module = model
        self.config = cfg
        self.rank = env["rank"]
        self.world_size = env["world"]
        self.local_rank = env["local_rank"]
        self.job = env["job"]
        self.socket_path = env["socket"]
        self._closed = True
        self._lock = threading.RLock()
        self._grads = None  # the GradientStream: buckets, slots and the backward hooks
        self._dev = None  # the CUDA device of a device session's regions; None: host memory
        # ZeRO-Offload: the parameters stay the trainer's own tensors on this GPU, the daemon
        # (CPU backend) keeps the optimizer in host memory; None otherwise
        self._offload = None
        self._host_views = None  # offload: each parameter's place in the host params region

        zdtype = _config.config_dtype(cfg)
        self.dtype = _TORCH_DTYPE[zdtype]
        where = self._params_device(groups)
        zc_groups = self._register(groups)
        self._attach_args = (env, zdtype, zc_groups, json.dumps(cfg), timeout_ms)
        self.reattaches = 0
        self._sess = self._attach(*self._attach_args, attach_wait_s, resume)
        self._closed = False
        self._warn_attach_info()
        try:
            self._dev = self._check_daemon_device(where)
        except BaseException:
            self._leave_refused_job()
            raise
        try:
            # the daemon accepted the config: only now does the model change dtype (a refused
            # one leaves the caller's model as it was)
            self._convert(groups)
            self._take_attach_info(self._sess.info)
            if not self.resumed:
                _setup.broadcast_from_rank0(self.module, self._params)
            self._bind_params()
            self._grads = GradientStream(self._stream_link())
        except BaseException:
            self._sess.close()
            self._closed = True
            raise
        self.optimizer = None  # set by initialize()
        self._client_opt = None  # initialize(optimizer=): its groups' lr changes reach ours
        self._lr_seen = None
        self.lr_scheduler = None  # initialize()'s: stepped after each applied step, saved
        self._progress = _setup.Progress(cfg.get("steps_per_print", 10), self.rank)

    # ---- attach -------------------------------------------------------------------------

    def _register(self, groups):
        """Registration: per group, reverse parameters() order; ids are group-major. Sets
        self._params; returns the groups as Session.attach takes them."""
        reg_groups = [_config.registration_order(self.module, g["params"]) for g in groups]
        self._params = [p for g in reg_groups for p in g]
        names = {id(p): n for n, p in self.module.named_parameters()}
        return [([p.numel() for p in ps], _config.options_json(g),
                 [names.get(id(p), "") for p in ps], [tuple(p.shape) for p in ps])
                for ps, g in zip(reg_groups, groups)]

    def _warn_attach_info(self):
        """What the attach reports that the caller should know, as warnings at the line that
        called initialize()."""
        info = self._sess.info
        if info.get("replaced"):
            warnings.warn("zerod: a new job replaced the one the daemon kept (%s)"
                          % info["replaced"], stacklevel=4)
        if info.get("ignored_keys"):
            warnings.warn("zerod: config keys accepted but not used (they change nothing here): "
                          "%s" % info["ignored_keys"], stacklevel=4)

    def _take_attach_info(self, info):
        """The job as the daemons attached it: stage, batch sizes, step and loss scale."""
        self.resumed = info["resumed"]
        self.stage = info["stage"]
        self._gas = max(1, info["gradient_accumulation_steps"])
        self._train_batch = info["train_batch_size"]
        self._micro_batch = info["train_micro_batch_size_per_gpu"]
        self.global_steps = info["step"]
        self.skipped_steps = 0  # the daemon reports its count with every step
        self.micro_steps = 0
        self._loss_scale = info["loss_scale"] if info["loss_scale"] > 0 else 1.0
        self._grad_norm = None
        self._step_applied = None
        self._boundary_override = None

    def _stream_link(self):
        """What the GradientStream takes from this engine, once the parameters are bound."""
        return StreamLink(sess=self._sess, params=self._params, lock=self._lock,
                          dtype=self.dtype, stage=self.stage, dev=self._dev, module=self.module,
                          offload=self._offload is not None, keep=_reattach.enabled(self))

    @staticmethod
    def _params_device(groups):
        """Where the parameters are: one device, the CPU or one GPU, for all of them (the
        daemon's regions are in one place). Checked again against the daemon's at attach."""
        where = None
        for g in groups:
            for p in g["params"]:
                if p.device.type not in ("cpu", "cuda"):
                    raise ValueError("zerod: a parameter is on %s; zerod's regions are host "
                                     "memory or CUDA device memory" % p.device)
                if where is None:
                    where = p.device
                elif p.device != where:
                    raise ValueError("zerod: parameters on %s and on %s; they must all be where "
                                     "the daemon's regions are, on one device" % (where, p.device))
        return where

    def _check_daemon_device(self, where):
        """The parameters must be where the daemon keeps its regions: on the CPU for a
        CPU-backend daemon, on its GPU for one on the CUDA backend. Returns that torch.device
        for a device session, None for host memory. One exception, ZeRO-Offload: parameters
        on a GPU with a CPU-backend daemon when the config says
        zero_optimization.offload_optimizer.device "cpu" (self._offload is then their GPU)."""
        s = self._sess
        if s.memory != MEMORY_DEVICE and where.type == "cuda" and _config.offload_cpu(
                getattr(self, "config", None)):
            self._offload = where
            return None
        if s.memory == MEMORY_DEVICE:
            want = torch.device("cuda", s.device)
            if where != want:
                raise ValueError("zerod: the parameters are on %s, but the daemon (%s) keeps its "
                                 "regions on %s: move the model there first (model.to(%r))"
                                 % (where, self.socket_path, want, str(want)))
            return want
        if where.type != "cpu":
            raise ValueError("zerod: the parameters are on %s, but the daemon (%s) runs on the "
                             "CPU and its regions are host memory: the parameters must be on "
                             "cpu (or start zerod --device %s, or set zero_optimization."
                             "offload_optimizer.device \"cpu\" to keep them on the GPU with "
                             "the optimizer in this daemon)" % (where, self.socket_path, where))
        return None

    def _leave_refused_job(self):
        """initialize() refuses what it attached before touching the model (the parameters
        are not where the daemon's regions are): a job this attach created ends, a job it
        re-attached stays kept for job_linger, as it was."""
        self._closed = True
        try:
            self._sess.detach(end_job=not self._sess.info["resumed"])
        except ZerodError:
            pass  # the refusal is what the caller needs to see
        finally:
            self._sess.close()

    def _convert(self, groups):
        """The model in the config's dtype (after the daemon accepted the config)."""
        params = [p for g in groups for p in g["params"]]
        if any(p.dtype != self.dtype for p in params) or any(
                t.is_floating_point() and t.dtype != self.dtype
                for t in self.module.parameters()):
            self.module.to(self.dtype)
        with torch.no_grad():
            for p in params:  # tensors that are not the module's own
                if p.dtype != self.dtype:
                    p.data = p.data.to(self.dtype)

    def _attach(self, env, zdtype, zc_groups, config_json, timeout_ms, attach_wait_s, resume):
        deadline = time.monotonic() + max(0.0, attach_wait_s)
        while True:
            sess = Session(env["socket"], timeout_ms)
            try:
                sess.attach(env["job"], zc_groups, config_json, zdtype, env["rank"], env["world"],
                            env["coordinator"], resume=resume,
                            restart=env.get("restart", False), own_slices_only=True)
                return sess
            except ZerodError as e:
                sess.close()
                # A trainer that just died may still hold the job for a moment.
                if e.status != ZC_ERR_BUSY or time.monotonic() >= deadline:
                    raise
            except BaseException:
                sess.close()
                raise
            time.sleep(0.1)

    def _bind_params(self, fresh=None):
        """Every parameter becomes a view of its place in the params region (host memory, or
        device memory on the parameters' GPU for a device session). ZeRO-Offload: the
        parameters stay on their GPU, and the host region is copied from them (a fresh job)
        or into them (a resumed one)."""
        s = self._sess
        fresh = not self.resumed if fresh is None else fresh
        offload = self._offload is not None
        # one params region for the host's ranks: each writes only its own slices
        own_only = fresh and s.info.get("params_shared", False)
        self._host_views = [] if offload else None
        views = []
        with torch.no_grad():
            for pid, p in enumerate(self._params):
                n = s.param_numel(pid)
                if n != p.numel():
                    raise ZerodError(ZC_ERR_LAYOUT_MISMATCH, STATUS[ZC_ERR_LAYOUT_MISMATCH][0],
                                     "parameter %d has %d elements, the layout %d"
                                     % (pid, p.numel(), n))
                view = _tensor_at(s.param_ptr(pid), n, self.dtype, self._dev).view(p.shape)
                if own_only:
                    # libzc copies from src (with CUDA on a device session, from the GPU's
                    # memory): torch's stream must have made it first
                    src = p.data.detach().to(device=self._dev if self._dev is not None
                                             else "cpu", dtype=self.dtype).contiguous()
                    self._sync_device()
                    s.init_param(pid, src.data_ptr())
                elif fresh:
                    view.copy_(p.data)  # offload: from the GPU, complete on return
                views.append(view)
                if offload:
                    self._host_views.append(view)
                else:
                    p.data = view
        if fresh:
            self._sync_device()  # the initial values are in the region before the daemon reads
            restored = s.params_ready()
            if restored is not None:  # the daemons resumed the job from their checkpoint_dir
                self.resumed = True
                self.global_steps = restored[0]
                if restored[1] > 0:
                    self._loss_scale = restored[1]
                if restored[2]:  # not from the checkpoint `latest` names: the daemons say why
                    warnings.warn("zerod: %s" % restored[2], stacklevel=4)
        if self.resumed or not fresh:
            self._offload_fetch()
        names = {id(p): n for n, p in self.module.named_parameters()}
        self._writes = ParamWrites(self._params, views, [names.get(id(p), "") for p in
                                                         self._params], offload)

    def _offload_fetch(self):
        """ZeRO-Offload: the parameters on the GPU take the host params region's values (after
        a step, a checkpoint load, a resume)."""
        if self._offload is None:
            return
        with torch.no_grad():
            for p, view in zip(self._params, self._host_views):
                p.data.copy_(view)

    def _check_open(self, what):
        if self._closed:
            raise RuntimeError("zerod: %s on a closed engine" % what)

    def _sync_device(self):
        """A device session: wait until the work queued on this thread's current stream of
        the device is done (_grads.sync_device); host sessions: nothing."""
        sync_device(self._dev)

    # ---- public API ---------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        self.tput_timer.start()
        return self.module(*args, **kwargs)

    def backward(self, loss, retain_graph=False):
        """Backward of loss × loss scale; buckets go to the daemon as they complete (stage 2)
        or are added into the full-gradient region (stage 1). The gradient is not divided by
        gradient_accumulation_steps here: the daemon does it. Returns loss."""
        self._check_open("backward")
        if loss.numel() != 1:
            raise ValueError("zerod: backward needs a scalar loss, got shape %s"
                             % tuple(loss.shape))
        self._take_param_writes()
        scaled = loss.float() * self._loss_scale if self._loss_scale != 1.0 else loss
        micro = self.micro_steps % self._gas
        self._grads.backward(scaled, retain_graph, micro)
        if self._grads.lost is not None:  # a daemon was lost: its buckets went to the kept copy
            _reattach.survive_loss(self, self._grads.lost, micro + 1)
        return loss

    def is_gradient_accumulation_boundary(self):
        """True when the next engine.step() steps the optimizer."""
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self._gas == 0

    def step(self, lr_kwargs=None):
        """Counts one micro-batch; at every gradient_accumulation_steps-th call, runs the
        optimizer step on the daemon (no-op otherwise), then, as DeepSpeed does, steps
        lr_scheduler (with lr_kwargs) when the step was applied (not skipped for an fp16
        overflow), and logs a progress line every steps_per_print steps on rank 0."""
        self._check_open("step")
        boundary = self.is_gradient_accumulation_boundary()
        self.micro_steps += 1
        self.tput_timer.stop(global_step=boundary)
        if not boundary:
            return
        self.optimizer.step()
        if self._step_applied and self.lr_scheduler is not None:
            with warnings.catch_warnings():
                # a torch scheduler built on the client optimizer now steps this one, whose
                # step() its constructor did not wrap: the order is right (optimizer first)
                warnings.filterwarnings("ignore", message=r"Seems like `optimizer\.step\(\)`")
                self.lr_scheduler.step(**(lr_kwargs or {}))
        self._progress.after_step(self)

    def _optimizer_step(self):
        self._check_open("step")
        self._take_param_writes()
        lrs = self._group_lrs()
        with self._lock:
            # a device session: stage 1's gradients added into the grads region are there,
            # and nothing queued still reads the parameters the daemon is about to overwrite
            self._sync_device()
            try:
                res = self._sess.step(group_lr=lrs)
            except ZerodError as e:
                if not self._grads.survives(e):
                    raise
                res = _reattach.survive_loss(self, e, self._gas, lrs)
        self.global_steps = res["step"]
        self.skipped_steps = res["skipped_steps"]
        self._step_applied = not res["skipped"]
        if self._step_applied:
            self._offload_fetch()
        if res["loss_scale"] > 0:
            self._loss_scale = res["loss_scale"]
        self._grad_norm = res["grad_norm"]
        return res

    def _take_param_writes(self):
        """Weights written into the parameters since the last look (zerod._writes) go to the
        daemon's master before anything reads it."""
        if self._writes.take():
            self._reload()

    def reload_params(self):
        """Every rank, after writing the parameters in a way torch does not count (through
        `p.data`, `p.data.copy_(t)`): the daemon's fp32 master takes their values, keeping
        Adam's moments and the step. In-place writes torch counts (load_state_dict, copy_ under
        no_grad, torch.nn.init) and `p.data = t` are found before the next backward, step or
        save without this call."""
        self._check_open("reload_params")
        self._writes.take_all()
        self._reload()

    def _reload(self):
        with self._lock:
            self._sync_device()  # the written values are in the region before the daemon reads
            self._sess.params_reload()

    def _group_lrs(self):
        lrs, self._lr_seen = _setup.group_lrs(self.optimizer, self._client_opt, self._lr_seen)
        return lrs

    # ---- checkpoints (docs/checkpoints.md) --------------------------------------------------

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True,
                        exclude_frozen_parameters=False, timeout_ms=0):
        """Like DeepSpeed's: every rank at the same step; the daemons write their shards and
        commit save_dir/tag (default global_step<N>) and save_dir/latest atomically. Rank 0's
        client_state, lr_scheduler, optimizer hyper-parameters and RNG go into the same
        checkpoint, with the module's buffers and tied names. Returns True once save_dir/tag
        is committed and save_dir/latest names it; with the config's checkpoint.writer.decoupled
        (DeepSpeed's asynchronous saves), once every daemon holds a copy of its shard, the
        files written meanwhile (wait_checkpoint() waits for them)."""
        del exclude_frozen_parameters  # frozen parameters are never attached
        self._take_param_writes()
        return _checkpoint.save(self, save_dir, tag, client_state, save_latest, timeout_ms)

    def wait_checkpoint(self, timeout_ms=0):
        """Every rank: return once the last save_checkpoint is on disk and committed (with
        checkpoint.writer.decoupled saves are written in the background; a later save or load,
        and close(), wait as well). Raises ZerodError when that save failed. Returns its path,
        or None when there was none."""
        return _checkpoint.wait(self, timeout_ms)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False, timeout_ms=0):
        """Like DeepSpeed's: every rank; a checkpoint saved at any world size. Returns
        (path, client_state), or (None, None) when load_dir has no `latest` and tag is None."""
        return _checkpoint.load(self, load_dir, tag, load_module_strict, load_optimizer_states,
                                load_lr_scheduler_states, load_module_only, timeout_ms)

    def get_loss_scale(self):
        """The scale the next backward multiplies the loss by (1 unless fp16)."""
        return self._loss_scale

    @property
    def loss_scale(self):
        return self._loss_scale

    @property
    def landed_pieces(self):
        """Weight gradient pieces LandingLinear computed [into their slot, into a buffer]."""
        return self._grads.landed_pieces

    def get_global_grad_norm(self):
        """The last step's global gradient norm (unscaled, averaged, before clipping); inf when
        it was not finite; None before the first step."""
        if self._grad_norm is None:
            return None
        return float("inf") if self._grad_norm < 0 else self._grad_norm

    def gradient_accumulation_steps(self):
        return self._gas

    def get_lr(self):
        self._group_lrs()
        return [g["lr"] for g in self.optimizer.param_groups]

    def zero_grad(self, set_to_none=True):
        """Harmless: gradients live in the daemon's slots, never in p.grad across calls."""
        for p in self._params:
            p.grad = None

    def train(self, mode=True):
        self.module.train(mode)
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    def close(self, end_job=True):
        """Give the parameters private storage again (their last values), then detach:
        end_job=True ends the job on the daemon, False keeps it for job_linger (a later
        initialize() with the same job resumes it)."""
        with self._lock:
            if self._closed:
                return
            if getattr(self, "_ckpt_pending", False):
                # the last save is still being written: wait with the save's own deadline
                # rather than the detach's (the daemons finish it either way)
                try:
                    self._sess.checkpoint_wait()
                except ZerodError as e:
                    warnings.warn("zerod: the last checkpoint was not written: %s" % e)
                self._ckpt_pending = False
            self._closed = True
            with torch.no_grad():
                for p in self._params:
                    if self._offload is None:  # offload: they are the trainer's own already
                        p.data = p.data.clone()
            self._host_views = None
            self._sync_device()  # the clones have read the device region before it is unmapped
            self._grads.close()
            try:
                self._sess.detach(end_job)
            except ZerodError as e:
                if e.status != ZC_ERR_JOB_ENDED:  # an operator ended it: nothing to detach
                    raise
            finally:
                self._sess.close()

    destroy = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # The parameters are the module's; nn.Module bookkeeping must not duplicate them.
    def __repr__(self):
        return "ZerodEngine(job=%r, rank=%d/%d, stage=%d, dtype=%s, step=%d)\n  module: %r" % (
            self.job, self.rank, self.world_size, getattr(self, "stage", 0), self.dtype,
            getattr(self, "global_steps", 0), self.module)


# ---- entry point --------------------------------------------------------------------------

def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, config=None, config_params=None, job=None, socket_path=None,
               timeout_ms=None, attach_wait_s=2.0, mpu=None, dist_init_required=None,
               collate_fn=None, resume="auto", distributed_port=None, mesh_param=None):
    """Attach `model` to the local zerod, like deepspeed.initialize.

    config: a DeepSpeed config dict or the path of a JSON file (docs/training-config.md); fp16/bf16
    convert the model to that dtype. model_parameters: None (every parameter that requires
    grad), an iterable of tensors, or of group dicts {"params": [...], "lr", "weight_decay",
    "betas", "eps"}. The daemon and job come from the environment (ZEROD_SOCKET, ZEROD_JOB,
    RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT + 1 for rank 0's daemon, or
    ZEROD_COORDINATOR) unless job/socket_path are given.
    timeout_ms: libzc's deadline of every call (default 60 s); attach_wait_s: how long a
    busy daemon is retried (a restarted trainer may find its dead predecessor still attached
    for a moment).
    resume: what to do with a job of the same id that the daemon keeps after its trainer went
    (docs/design-notes.md "A job's life"). "auto" (default): continue it only when the launcher
    says this process is a restart (torchrun's TORCHELASTIC_RESTART_COUNT > 0) or its trainer
    closed it with end_job=False, and the model and config still fit it; otherwise a new job
    replaces it (the daemon logs the old job's id and step; a warning says so here). "never":
    always start afresh. "must": continue it, or fail (ERR_NOT_FOUND) when there is none. The
    daemons decide, so every rank decides alike; a daemon holding another job, or one with a
    live trainer, answers ERR_BUSY naming it, its age and `zeroctl job end`.
    optimizer: DeepSpeed's client optimizer, torch.optim.Adam/AdamW (or DeepSpeed's Adam) or a
    callable building one from the parameters: its type and per-group hyper-parameters replace
    the config's optimizer section (the daemon runs it). lr_scheduler: a scheduler built on
    that optimizer, or a callable(optimizer); else the config's "scheduler" section. Either is
    stepped after every applied step. Everything is checked before anything changes.
    training_data: a torch Dataset; the third element returned is then DeepSpeed's loader over
    it, engine.deepspeed_io(training_data) (collate_fn its collate function).
    distributed_port is accepted (torch.distributed is init_distributed()'s).
    Returns (engine, optimizer, training_dataloader or None, lr_scheduler)."""
    _refuse_unsupported(model, resume, mpu, training_data, lr_scheduler, mesh_param)
    cfg = _config.load_config(_config.config_source(config, config_params, args))
    client_opt = None
    if optimizer is not None:  # DeepSpeed runs a client optimizer instead of the config's
        client_opt, cfg, model_parameters = _setup.client_optimizer(optimizer, model,
                                                                    model_parameters, cfg)
    sched_cfg = _setup.check_scheduler(cfg) if lr_scheduler is None else None
    groups = _config.collect_groups(model, model_parameters)
    # a model on a GPU looks for its local rank's CUDA daemon, as zerorun names its socket
    # (with offload_optimizer, for its CPU daemon)
    on_gpu = any(p.device.type == "cuda" for g in groups for p in g["params"])
    env = _config.read_env(job, socket_path,
                           "cuda" if on_gpu and not _config.offload_cpu(cfg) else "cpu")
    engine = ZerodEngine(model, groups, cfg, env, timeout_ms, attach_wait_s, resume)
    _compat.close_at_exit(engine)
    _attach_optimizer(engine, _config.config_defaults(cfg), _optimizer_groups(groups),
                      lr_scheduler, client_opt, sched_cfg)
    if training_data is not None:
        engine.collate_fn = collate_fn
        try:
            engine.training_dataloader = engine.deepspeed_io(training_data)
        except BaseException:
            engine.close(end_job=False)
            raise
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _refuse_unsupported(model, resume, mpu, training_data, lr_scheduler, mesh_param):
    """initialize()'s arguments that zerod refuses, before anything is read or attached."""
    if model is None:
        raise ValueError("zerod: initialize needs model=")
    if resume not in ("auto", "never", "must"):
        raise ValueError("zerod: resume=%r is not 'auto', 'never' or 'must'" % (resume,))
    _setup.check_client_scheduler(lr_scheduler)
    if mpu is not None:
        raise ValueError("zerod: model parallelism (mpu=) is not supported")
    if mesh_param is not None:
        raise ValueError("zerod: mesh_param (tensor or sequence parallel meshes) is not "
                         "supported")
    _compat.check_dataset(training_data)


def _optimizer_groups(groups):
    """The attached groups as ZerodOptimizer's param groups (betas as tuples)."""
    opt_groups = []
    for g in groups:
        d = dict(g)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        opt_groups.append(d)
    return opt_groups


def _attach_optimizer(engine, defaults, opt_groups, lr_scheduler, client_opt, sched_cfg):
    """engine.optimizer over opt_groups, and engine.lr_scheduler: the caller's, or the
    config's "scheduler" section's. On failure the engine closes, keeping its job for
    job_linger."""
    try:
        engine.optimizer = ZerodOptimizer(engine, opt_groups, defaults)
        engine._client_opt = client_opt
        if lr_scheduler is not None:
            engine.lr_scheduler = _setup.client_scheduler(lr_scheduler, client_opt,
                                                          engine.optimizer)
        elif sched_cfg is not None:
            engine.lr_scheduler = _setup.build_scheduler(sched_cfg, engine.optimizer)
        engine._lr_seen = _setup.lrs_seen(engine.optimizer, client_opt)
    except BaseException:
        engine.close(end_job=False)
        raise


# DeepSpeed's namespace here too (deepspeed.comm, .accelerator, ...), and a later `import
# deepspeed` answered by zerod.deepspeed: a DeepSpeed script ports by changing one line
from .deepspeed._namespace import *  # noqa: E402,F401,F403
