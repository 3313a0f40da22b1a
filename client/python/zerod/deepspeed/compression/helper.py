"""deepspeed.compression.helper: dotted-name attribute access on modules."""
import functools


def recursive_getattr(model, module_name):
    """model's attribute at a dotted path, "encoder.layer.0"."""
    return functools.reduce(getattr, module_name.split("."), model)


def recursive_setattr(model, module_name, module):
    """Sets model's attribute at a dotted path to module."""
    *parents, last = module_name.split(".")
    setattr(recursive_getattr(model, ".".join(parents)) if parents else model, last, module)
