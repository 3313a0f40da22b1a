"""Weight gradients of nn.Linear computed straight into their buckets' slots.

A stage-2 engine on host memory hands each gradient to the daemon by copying it into its
bucket's slot (GradientStream). For the weight of an nn.Linear that copy is most of what
zerod adds to the trainer's backward: the gradient is written once by the matrix product, read
and written again by the copy (on the 31.7 M MLP of bench/ds_vs_zerod.py, 8-12 ms a step per
trainer, as much as the daemon's reduce). So the stream runs each eligible Linear through
LandingLinear, whose backward computes the weight's gradient with the matrix product torch's
own backward uses (grad_output^T @ input, the same call, so the same bits) into the slot
pieces of that weight, and returns no gradient for it: the parameter's AccumulateGrad node
then has nothing to store, and the stream's hook on that node (GradientStream._finish_landed)
counts the pieces as in. A weight split across buckets is computed row range by row range;
a row cut by a bucket's end comes out of a product of at least _MIN_ROWS rows into a small
buffer (BLAS computes a single row by another kernel, whose sums round differently).

Falls back to the plain path, per call: a weight used twice in one backward (the second use),
tied weights (the other uses' gradients arrive through AccumulateGrad and are added to the
landed pieces), too few free slots, autocast, an input of another dtype or of one dimension,
grad mode off. ZEROD_DIRECT_GRADS=0 turns it off. (docs/design-notes.md, "Trainer memory".)
"""
import os
import types
import weakref

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

_ENABLED = os.environ.get("ZEROD_DIRECT_GRADS", "1") != "0"
# the fewest rows a product computes: with fewer BLAS may take its matrix-vector path
_MIN_ROWS = 16


def _autocast_on():
    try:
        return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled()
    except TypeError:  # torch < 2.4: no device argument
        return torch.is_autocast_cpu_enabled() or torch.is_autocast_enabled()


class LandingLinear(torch.autograd.Function):
    """F.linear whose backward puts the weight's gradient into the GradientStream's slots."""

    @staticmethod
    def forward(ctx, x, weight, bias, stream, pid):
        ctx.stream, ctx.pid = stream, pid
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = gy.matmul(weight)
        if ctx.needs_input_grad[2]:
            gb = gy.sum(tuple(range(gy.dim() - 1)))
        if ctx.needs_input_grad[1]:
            g2 = gy.reshape(-1, gy.shape[-1])
            x2 = x.reshape(-1, x.shape[-1])
            if not ctx.stream.land_weight_grad(ctx.pid, g2, x2):
                gw = g2.t().mm(x2)
        return gx, gw, gb, None, None


def mm_rows_into(dest, g2, x2, off):
    """Elements [off, off + dest.numel()) of the flattened g2^T @ x2 into dest (contiguous,
    1-D): whole rows with one product straight into dest, a row cut at either end through a
    product of at least _MIN_ROWS rows into a buffer."""
    cols, rows = x2.shape[1], g2.shape[1]
    end = off + dest.numel()
    r0, r1 = -(-off // cols), end // cols  # the whole rows inside
    parts = [(off, end)]
    if r1 - r0 >= _MIN_ROWS:
        whole = dest[r0 * cols - off:r1 * cols - off].view(r1 - r0, cols)
        torch.mm(g2[:, r0:r1].t(), x2, out=whole)
        parts = [(off, r0 * cols), (r1 * cols, end)]
    for a, e in parts:
        if a >= e:
            continue
        ra, rb = a // cols, -(-e // cols)
        lo = max(0, min(ra, rows - _MIN_ROWS))
        hi = min(rows, max(rb, lo + _MIN_ROWS))
        tmp = g2[:, lo:hi].t().mm(x2).reshape(-1)
        dest[a - off:e - off].copy_(tmp[a - lo * cols:e - lo * cols])


# module -> (GradientStream, its weight's pid): weak both ways, so that a deep copy of the model
# (whose bound forward follows the copy, which is not here) runs the plain nn.Linear.forward
_ROUTES = weakref.WeakKeyDictionary()


def forward(module, x):
    """nn.Linear.forward of a routed module: LandingLinear when the call can land."""
    route = _ROUTES.get(module)
    stream = route[0]() if route is not None else None
    w = module.weight
    if (stream is None or not torch.is_grad_enabled() or not w.requires_grad or x.dim() < 2
            or x.dtype != w.dtype or w is not stream.link.params[route[1]] or _autocast_on()):
        return torch.nn.Linear.forward(module, x)
    return LandingLinear.apply(x, w, module.bias, stream, route[1])


def install(stream):
    """Route the eligible nn.Linear modules of the stream's module (stream.link, a StreamLink)
    through LandingLinear; returns [(module, pid)] for the stream to hook and, at close, to
    restore."""
    link = stream.link
    if not _ENABLED or link.stage != 2 or link.dev is not None or link.offload \
            or link.dtype != torch.float32:
        return []
    pid_of = {id(p): pid for pid, p in enumerate(link.params)}
    out, taken = [], set()
    for m in link.module.modules():
        if not isinstance(m, torch.nn.Linear) or type(m).forward is not torch.nn.Linear.forward:
            continue  # a subclass with its own forward computes something else
        if "forward" in m.__dict__ or id(m.weight) not in pid_of or m.weight.dim() != 2:
            continue
        pid = pid_of[id(m.weight)]
        if pid in taken:
            continue  # one module per weight lands; other users take the plain path
        taken.add(pid)
        _ROUTES[m] = (weakref.ref(stream), pid)
        m.forward = types.MethodType(forward, m)
        out.append((m, pid))
    return out


def uninstall(modules):
    for m, _ in modules:
        m.__dict__.pop("forward", None)
        _ROUTES.pop(m, None)
