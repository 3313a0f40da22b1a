"""zerod: Python client of the zerod ZeRO optimizer daemon (pure Python over libzc via ctypes).

    import zerod.torch
    engine, optimizer, _, _ = zerod.torch.initialize(model=model, config="ds_config.json")

`zerod.torch` needs PyTorch; this top-level module does not. libzc is found through
$ZEROD_LIBZC, next to this package, in the build tree (build/client/libzc.so of the repository
this package sits in) or on the system loader's path.
"""
from ._libzc import (  # noqa: F401
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_F32,
    MEMORY_DEVICE,
    MEMORY_HOST,
    Session,
    ZerodError,
    libzc_path,
    load_libzc,
    version,
)

__version__ = "0.1.0"

__all__ = ["ZerodError", "Session", "libzc_path", "load_libzc", "version", "__version__",
           "DTYPE_F32", "DTYPE_F16", "DTYPE_BF16", "MEMORY_HOST", "MEMORY_DEVICE"]
