"""`import deepspeed` answered by zerod's DeepSpeed namespace (zerod.deepspeed), so that a
DeepSpeed ZeRO-1/2 script ports by changing one line, `import deepspeed` to
`import zerod.torch as deepspeed`: its later `import deepspeed.comm as dist` or
`from deepspeed.accelerator import get_accelerator`, in the script or in the modules it imports,
get zerod's modules.

install() is called when zerod.torch is imported. It does nothing in a process that imported
the real DeepSpeed first (sys.modules holds it), so the two never mix. A leaf: nothing here
imports zerod.deepspeed until an import asks for it.
"""
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

_TOP = "deepspeed"
_TARGET = "zerod.deepspeed"

# What zerod cannot serve, by module, named in the refusal of an import of it. Other missing
# modules get the general refusal.
_FEATURES = {
    "inference": "DeepSpeed-Inference (deepspeed.inference, init_inference)",
    "module_inject": "kernel injection (deepspeed.module_inject)",
    "sequence": "sequence parallelism (deepspeed.sequence)",
    "autotuning": "the autotuner (deepspeed.autotuning)",
    "profiling": "the flops profiler (deepspeed.profiling)",
    "monitor": "DeepSpeed's monitors (deepspeed.monitor); log with your own tools",
    "model_implementations": "DeepSpeed's inference model implementations",
    "linear": "DeepSpeed's quantized linear layers (deepspeed.linear)",
}


def _refusal(fullname):
    part = fullname.split(".")[1] if "." in fullname else fullname
    feature = _FEATURES.get(part, fullname)
    return ("zerod serves DeepSpeed's ZeRO stage 1 and 2 training API; %s is not part of it "
            "(No module named %r)" % (feature, fullname))


def _is_ours(module):
    return getattr(module, "__name__", "").startswith(_TARGET)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Maps deepspeed[.X] to zerod.deepspeed[.X]: the import returns zerod's module object
    itself, so both names share one module and its state."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TOP and not fullname.startswith(_TOP + "."):
            return None
        name = _TARGET + fullname[len(_TOP):]
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            raise ModuleNotFoundError(_refusal(fullname), name=fullname)
        return importlib.machinery.ModuleSpec(
            fullname, self, loader_state=name,
            is_package=spec.submodule_search_locations is not None)

    def create_module(self, spec):
        module = importlib.import_module(spec.loader_state)
        # the import machinery sets __spec__ to the alias's: keep zerod's own
        spec.loader_state = (spec.loader_state, module.__spec__)
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state[1]


_finder = _Finder()


def install():
    """Answer `import deepspeed` with zerod.deepspeed, unless DeepSpeed is imported already."""
    if _TOP in sys.modules and not _is_ours(sys.modules[_TOP]):
        return False
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    return True


def installed():
    return _finder in sys.meta_path


@contextlib.contextmanager
def suspended():
    """For code that must see the real `deepspeed` or none (zerod.import_deepspeed reading a
    DeepSpeed checkpoint's pickles): while inside, the alias and zerod's modules under the
    name `deepspeed` are gone; on exit, whatever was imported as `deepspeed` meanwhile is
    dropped and they come back."""
    was = _finder in sys.meta_path
    saved = {k: m for k, m in sys.modules.items()
             if (k == _TOP or k.startswith(_TOP + ".")) and _is_ours(m)}
    for k in saved:
        del sys.modules[k]
    if was:
        sys.meta_path.remove(_finder)
    try:
        yield
    finally:
        if saved or was:
            for k in [k for k in sys.modules if k == _TOP or k.startswith(_TOP + ".")]:
                del sys.modules[k]
            sys.modules.update(saved)
        if was and _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
