"""deepspeed.comm over torch.distributed: the same calls a script makes through DeepSpeed's
comm (init_distributed, get_rank, all_reduce, barrier, ...), run by torch's process group.
zerod's own traffic (gradients, parameters) goes between its daemons, not through this group.

Before init_distributed(), get_rank / get_world_size / get_local_rank answer from the
launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK), where DeepSpeed asserts; collectives
need the process group.
"""
import os

import torch.distributed as _td

from ..._compat import init_distributed  # noqa: F401

ReduceOp = _td.ReduceOp if _td.is_available() else None


def is_available():
    return _td.is_available()


def is_initialized():
    return _td.is_available() and _td.is_initialized()


def _need(what):
    if not is_initialized():
        raise RuntimeError("zerod: deepspeed.comm.%s needs the process group: call "
                           "deepspeed.init_distributed() first" % what)


def _env(name, default):
    v = os.environ.get(name, "")
    return int(v) if v else default


def get_rank(group=None):
    return _td.get_rank(group) if is_initialized() else _env("RANK", 0)


def get_world_size(group=None):
    return _td.get_world_size(group) if is_initialized() else _env("WORLD_SIZE", 1)


def get_local_rank():
    return _env("LOCAL_RANK", 0)


def get_global_rank(group=None, group_rank=0):
    _need("get_global_rank")
    if group is None:
        return group_rank
    return _td.distributed_c10d._get_global_rank(group, group_rank)


def get_world_group():
    _need("get_world_group")
    return _td.group.WORLD


def get_all_ranks_from_group(group=None):
    return [get_global_rank(group, r) for r in range(get_world_size(group))]


def new_group(ranks):
    _need("new_group")
    return _td.new_group(ranks)


def destroy_process_group(group=None):
    if is_initialized():
        _td.destroy_process_group(group)


def barrier(group=None, async_op=False, device_ids=None, **kwargs):
    _need("barrier")
    return _td.barrier(group=group, async_op=async_op)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    _need("monitored_barrier")
    return _td.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)


def all_reduce(tensor, op=None, group=None, async_op=False, **kwargs):
    _need("all_reduce")
    return _td.all_reduce(tensor, op=_td.ReduceOp.SUM if op is None else op, group=group,
                          async_op=async_op)


def inference_all_reduce(tensor, op=None, group=None, **kwargs):
    return all_reduce(tensor, op, group)


def reduce(tensor, dst, op=None, group=None, async_op=False, **kwargs):
    _need("reduce")
    return _td.reduce(tensor, dst, op=_td.ReduceOp.SUM if op is None else op, group=group,
                      async_op=async_op)


def broadcast(tensor, src, group=None, async_op=False, **kwargs):
    _need("broadcast")
    return _td.broadcast(tensor, src, group=group, async_op=async_op)


def broadcast_object_list(object_list, src, group=None, device=None):
    _need("broadcast_object_list")
    return _td.broadcast_object_list(object_list, src, group=group, device=device)


def all_gather(tensor_list, tensor, group=None, async_op=False, **kwargs):
    _need("all_gather")
    return _td.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_gather_object(object_list, obj, group=None, **kwargs):
    _need("all_gather_object")
    return _td.all_gather_object(object_list, obj, group=group)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, **kwargs):
    """One tensor gathered into a flat output, by all_gather where torch lacks the call."""
    _need("all_gather_into_tensor")
    fn = getattr(_td, "all_gather_into_tensor", None) or getattr(_td, "_all_gather_base")
    return fn(output_tensor, input_tensor, group=group, async_op=async_op)


allgather_fn = all_gather_into_tensor


def reduce_scatter(output, input_list, op=None, group=None, async_op=False, **kwargs):
    _need("reduce_scatter")
    return _td.reduce_scatter(output, input_list, op=_td.ReduceOp.SUM if op is None else op,
                              group=group, async_op=async_op)


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False, **kwargs):
    _need("gather")
    return _td.gather(tensor, gather_list, dst=dst, group=group, async_op=async_op)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False, **kwargs):
    _need("scatter")
    return _td.scatter(tensor, scatter_list, src=src, group=group, async_op=async_op)


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False, **kwargs):
    _need("all_to_all_single")
    return _td.all_to_all_single(output, tensor, output_split_sizes, input_split_sizes,
                                 group=group, async_op=async_op)


def send(tensor, dst, group=None, tag=0, **kwargs):
    _need("send")
    return _td.send(tensor, dst, group=group, tag=tag)


def recv(tensor, src=None, group=None, tag=0, **kwargs):
    _need("recv")
    return _td.recv(tensor, src, group=group, tag=tag)


def isend(tensor, dst, group=None, tag=0, **kwargs):
    _need("isend")
    return _td.isend(tensor, dst, group=group, tag=tag)


def irecv(tensor, src=None, group=None, tag=0, **kwargs):
    _need("irecv")
    return _td.irecv(tensor, src, group=group, tag=tag)


def has_all_gather_into_tensor():
    return True


def has_reduce_scatter_tensor():
    return hasattr(_td, "reduce_scatter_tensor") or hasattr(_td, "_reduce_scatter_base")


def log_summary(show_straggler=False, return_dict=False):
    """DeepSpeed's comms logger is not kept here: nothing to report."""
    return {} if return_dict else None


def configure(deepspeed_config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None,
              debug=None):
    """DeepSpeed's comms-logging settings: accepted, nothing is logged."""
    return None


__all__ = [n for n in dir() if not n.startswith("_") and n != "os"]
