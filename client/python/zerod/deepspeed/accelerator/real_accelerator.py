"""deepspeed.accelerator.real_accelerator: get_accelerator() answers for where zerod keeps the
parameters, the CPU or CUDA, with DeepSpeed's accelerator calls over torch.

Which one, in this order: DeepSpeed's own DS_ACCELERATOR variable ("cpu" or "cuda"); a CUDA
daemon for this local rank (ZEROD_SOCKET named zerod-cuda*.sock, or zerod-cuda<LOCAL_RANK>.sock
in ZEROD_SOCKET_DIR or /run/zerod); a CPU daemon's socket found there (a CPU daemon keeps the
parameters in host memory); else CUDA when torch sees a GPU, as DeepSpeed detects it. ZeRO-Offload
(a GPU model over a CPU daemon) sets DS_ACCELERATOR=cuda. The choice is made at the first call
and kept, as DeepSpeed keeps its accelerator.
"""
import contextlib
import os
import re

import torch

_SOCKET_DIR = "/run/zerod"


def _rss():
    """This process's resident memory in bytes (what DeepSpeed's CPU accelerator reports as
    memory_allocated), from /proc without psutil."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class DeepSpeedAccelerator:
    """What both kinds answer alike."""

    _name = None
    _communication_backend_name = None

    def is_synchronized_device(self):
        return self._name == "cpu"

    def use_host_timers(self):
        return self.is_synchronized_device()

    def resolves_data_dependency(self):
        return self.is_synchronized_device()

    def handles_memory_backpressure(self):
        return self.is_synchronized_device()

    def communication_backend_name(self):
        return self._communication_backend_name

    def random(self):
        return torch.random

    def manual_seed(self, seed):
        return torch.manual_seed(seed)

    def initial_seed(self):
        return torch.initial_seed()

    def is_bf16_supported(self):
        return True

    def supported_dtypes(self):
        dtypes = [torch.float, torch.bfloat16]
        if self.is_fp16_supported():
            dtypes.append(torch.float16)
        return dtypes

    def is_triton_supported(self):
        return False

    def lazy_call(self, callback):
        return callback()

    def range_push(self, msg, domain=None, category=None):
        return None

    def range_pop(self, domain=None):
        return None

    def on_accelerator(self, tensor):
        return tensor.device.type == self._name

    def pin_memory(self, tensor, align_bytes=1, **kwargs):
        return tensor.pin_memory() if self._name == "cuda" else tensor

    def is_pinned(self, tensor):
        return tensor.is_pinned() if self._name == "cuda" else False

    def create_op_builder(self, op_name):
        return None  # zerod builds no DeepSpeed kernels: the optimizer runs in the daemons

    def get_op_builder(self, class_name):
        return None

    def __repr__(self):
        return "<zerod DeepSpeed accelerator %s>" % self._name

    # DeepSpeed's tensor type properties
    BFloat16Tensor = property(lambda self: self._tensor_type("BFloat16Tensor"))
    ByteTensor = property(lambda self: self._tensor_type("ByteTensor"))
    DoubleTensor = property(lambda self: self._tensor_type("DoubleTensor"))
    FloatTensor = property(lambda self: self._tensor_type("FloatTensor"))
    HalfTensor = property(lambda self: self._tensor_type("HalfTensor"))
    IntTensor = property(lambda self: self._tensor_type("IntTensor"))
    LongTensor = property(lambda self: self._tensor_type("LongTensor"))

    def _tensor_type(self, name):
        return getattr(torch.cuda if self._name == "cuda" else torch, name)


class CPU_Accelerator(DeepSpeedAccelerator):
    """DeepSpeed's CPU accelerator: one 'device', the host; memory figures are the process's
    resident set."""

    def __init__(self):
        self._name = "cpu"
        self._communication_backend_name = "gloo"
        self.max_mem = _rss()

    def device_name(self, device_index=None):
        return "cpu"

    def device(self, device_index=None):
        return None

    def set_device(self, device_index):
        return None

    def current_device(self):
        return int(os.environ.get("LOCAL_RANK", 0))

    def current_device_name(self):
        return "cpu"

    def device_count(self):
        """Ranks on this host, as the launcher says (DeepSpeed counts NUMA nodes otherwise)."""
        for var in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
            n = int(os.environ.get(var, 0) or 0)
            if n > 0:
                return n
        return 1

    def synchronize(self, device_index=None):
        return None

    def set_rng_state(self, new_state, device_index=None):
        return torch.set_rng_state(new_state)

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def manual_seed_all(self, seed):
        return torch.manual_seed(seed)

    def default_generator(self, device_index):
        return torch.default_generator

    Stream = property(lambda self: None)
    Event = property(lambda self: None)

    def stream(self, stream):
        return contextlib.nullcontext()

    def current_stream(self, device_index=None):
        return None

    def default_stream(self, device_index=None):
        return None

    def empty_cache(self):
        return None

    def _peak(self):
        mem = _rss()
        self.max_mem = max(self.max_mem, mem)
        return mem

    def memory_allocated(self, device_index=None):
        return self._peak()

    memory_cached = memory_reserved = memory_allocated

    def max_memory_allocated(self, device_index=None):
        self._peak()
        return self.max_mem

    max_memory_cached = max_memory_reserved = max_memory_allocated

    def reset_max_memory_allocated(self, device_index=None):
        self.max_mem = _rss()

    reset_max_memory_cached = reset_peak_memory_stats = reset_max_memory_allocated

    def memory_stats(self, device_index=None):
        mem = self._peak()
        return {"allocated_bytes.all.current": mem, "allocated_bytes.all.peak": self.max_mem}

    def total_memory(self, device_index=None):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def available_memory(self, device_index=None):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")

    def is_available(self):
        return True

    def is_fp16_supported(self):
        return False  # as DeepSpeed's CPU accelerator without mkldnn fp16

    def create_graph(self):
        return None

    def capture_to_graph(self, graph, pool=None, stream=None):
        return contextlib.nullcontext()

    def replay_graph(self, graph):
        return None


class CUDA_Accelerator(DeepSpeedAccelerator):
    """DeepSpeed's CUDA accelerator, over torch.cuda."""

    def __init__(self):
        self._name = "cuda"
        self._communication_backend_name = "nccl"

    def device_name(self, device_index=None):
        return "cuda" if device_index is None else "cuda:%d" % device_index

    def device(self, device_index=None):
        return torch.cuda.device(device_index)

    def set_device(self, device_index):
        torch.cuda.set_device(device_index)

    def current_device(self):
        return torch.cuda.current_device()

    def current_device_name(self):
        return "cuda:%d" % torch.cuda.current_device()

    def device_count(self):
        return torch.cuda.device_count()

    def synchronize(self, device_index=None):
        return torch.cuda.synchronize(device_index)

    def set_rng_state(self, new_state, device_index=None):
        if device_index is None:
            return torch.cuda.set_rng_state(new_state)
        return torch.cuda.set_rng_state(new_state, device_index)

    def get_rng_state(self, device_index=None):
        if device_index is None:
            return torch.cuda.get_rng_state()
        return torch.cuda.get_rng_state(device_index)

    def manual_seed(self, seed):
        return torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.cuda.manual_seed_all(seed)

    def initial_seed(self):
        return torch.cuda.initial_seed()

    def default_generator(self, device_index):
        return torch.cuda.default_generators[device_index]

    Stream = property(lambda self: torch.cuda.Stream)
    Event = property(lambda self: torch.cuda.Event)

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index)

    def empty_cache(self):
        return torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    reset_peak_memory_stats = reset_max_memory_cached = reset_max_memory_allocated

    def memory_reserved(self, device_index=None):
        return torch.cuda.memory_reserved(device_index)

    memory_cached = memory_reserved

    def max_memory_reserved(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index)

    max_memory_cached = max_memory_reserved

    def memory_stats(self, device_index=None):
        return torch.cuda.memory_stats(device_index)

    def total_memory(self, device_index=None):
        return torch.cuda.get_device_properties(device_index or 0).total_memory

    def available_memory(self, device_index=None):
        return torch.cuda.mem_get_info(device_index)[0]

    def is_available(self):
        return torch.cuda.is_available()

    def is_bf16_supported(self):
        return torch.cuda.is_bf16_supported()

    def is_fp16_supported(self):
        return True

    def create_graph(self):
        return torch.cuda.CUDAGraph()

    def capture_to_graph(self, graph, pool=None, stream=None):
        return torch.cuda.graph(graph, pool, stream)

    def replay_graph(self, graph):
        graph.replay()


def _daemon_socket_kind():
    """'cuda' or 'cpu' by the socket this rank's daemon listens on, None when unknown."""
    sock = os.environ.get("ZEROD_SOCKET")
    if sock:
        m = re.match(r"zerod-(cpu|cuda)", os.path.basename(sock))
        return m.group(1) if m else None
    where = os.environ.get("ZEROD_SOCKET_DIR") or _SOCKET_DIR
    local = os.environ.get("LOCAL_RANK", "0") or "0"
    for kind in ("cuda", "cpu"):
        if os.path.exists(os.path.join(where, "zerod-%s%s.sock" % (kind, local))):
            return kind
    return None


def _detect():
    kind = os.environ.get("DS_ACCELERATOR")
    if kind is not None and kind not in ("cpu", "cuda"):
        raise ValueError("zerod: DS_ACCELERATOR=%r: zerod's daemons keep the parameters on the "
                         "CPU or on CUDA GPUs ('cpu' or 'cuda')" % kind)
    if kind is None:
        kind = _daemon_socket_kind()
    if kind is None:
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("zerod: the accelerator is CUDA (DS_ACCELERATOR or the daemon's "
                           "socket), but torch sees no CUDA device")
    return CUDA_Accelerator() if kind == "cuda" else CPU_Accelerator()


_accelerator = None


def get_accelerator():
    global _accelerator
    if _accelerator is None:
        _accelerator = _detect()
    return _accelerator


def set_accelerator(accel_obj):
    global _accelerator
    _accelerator = accel_obj


def is_current_accelerator_supported():
    return get_accelerator()._name in ("cpu", "cuda")
