"""The names of DeepSpeed's top-level module that zerod answers, shared by zerod.deepspeed and
zerod.torch (a script that did `import zerod.torch as deepspeed` reaches deepspeed.comm too).
Importing it installs zerod._ds_alias: a later `import deepspeed` finds these modules."""
from .. import _ds_alias
from . import accelerator, comm, compression, moe, ops, pipe, runtime, utils  # noqa: F401
from ._refuse import refusing_class, refusing_function
from .accelerator import get_accelerator  # noqa: F401
from .pipe import PipelineModule  # noqa: F401
from .runtime import zero  # noqa: F401
from .runtime.engine import DeepSpeedEngine, DeepSpeedOptimizer  # noqa: F401
from .utils import OnDevice, log_dist, logger  # noqa: F401

# the DeepSpeed release whose API this follows (zerod.__version__ is zerod's own)
__version__ = "0.19.8"
__version_major__, __version_minor__, __version_patch__ = 0, 19, 8

_INFERENCE = "DeepSpeed-Inference (deepspeed.init_inference)"
init_inference = refusing_function("init_inference", _INFERENCE)
InferenceEngine = refusing_class("InferenceEngine", _INFERENCE)
PipelineEngine = refusing_class("PipelineEngine", "pipeline parallelism (PipelineEngine)")

__all__ = ["accelerator", "comm", "compression", "moe", "ops", "pipe", "runtime", "utils",
           "get_accelerator", "PipelineModule", "zero", "DeepSpeedEngine", "DeepSpeedOptimizer",
           "OnDevice", "log_dist", "logger", "__version__", "__version_major__",
           "__version_minor__", "__version_patch__", "init_inference", "InferenceEngine",
           "PipelineEngine"]

_ds_alias.install()
