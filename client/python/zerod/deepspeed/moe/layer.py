"""deepspeed.moe.layer: MoE is refused at construction."""
from .._refuse import refusing_class

MoE = refusing_class("MoE", "Mixture of Experts (deepspeed.moe.layer.MoE, expert parallelism)")
