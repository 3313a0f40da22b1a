"""deepspeed.pipe: pipeline parallelism is refused at construction."""
from .._refuse import refusing_class

_FEATURE = "pipeline parallelism (deepspeed.pipe, PipelineEngine)"
PipelineModule = refusing_class("PipelineModule", _FEATURE)
LayerSpec = refusing_class("LayerSpec", _FEATURE)
TiedLayerSpec = refusing_class("TiedLayerSpec", _FEATURE)
