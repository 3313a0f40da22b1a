"""deepspeed.compression: the attribute helpers LoRA code imports (compression.helper);
DeepSpeed's compression training itself is not served."""
from . import helper  # noqa: F401
from .._refuse import refusing_function

init_compression = refusing_function("init_compression", "DeepSpeed Compression "
                                     "(deepspeed.compression.init_compression)")
redundancy_clean = refusing_function("redundancy_clean", "DeepSpeed Compression "
                                     "(deepspeed.compression.redundancy_clean)")
