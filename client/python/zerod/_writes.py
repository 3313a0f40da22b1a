"""Weights written into the parameters after initialize() (a state dict loaded into the wrapped
model, `torch.nn.init` on a layer, `p.data = t`): they must reach the daemon's fp32 master, or
the next step would undo them (16-bit parameters) or train a tensor the daemon never sees
(a rebound parameter).

torch counts every in-place write to a tensor in its version counter (`load_state_dict`,
`copy_` under `no_grad`, `torch.nn.init`): the engine compares each parameter's counter and
storage with what it saw at its last step, before each backward and step and before a save.
A write through `p.data` (`p.data.copy_(t)`) bypasses the counter; `engine.reload_params()`
covers it.
"""
import torch

from ._codes import STATUS, ZC_ERR_LAYOUT_MISMATCH
from ._libzc import ZerodError


class ParamWrites:
    """The parameters' version counters and storage as the engine last saw them. views[i] is
    parameter i's place in the params region (the host region under ZeRO-Offload, where the
    parameters keep their own GPU storage: offload is then True)."""

    def __init__(self, params, views, names, offload):
        self._params = params
        self._views = views
        self._names = names
        self._offload = offload
        self._seen = None
        self.mark()

    def mark(self):
        self._seen = [(p._version, p.data_ptr()) for p in self._params]

    def take(self):
        """Puts what was written since mark() into the params region; True when anything was
        (the daemon must then reload its master from the region)."""
        written = False
        with torch.no_grad():
            for i, (p, view) in enumerate(zip(self._params, self._views)):
                if not self._offload and p.data_ptr() != view.data_ptr():
                    self._rebind(i, p, view)
                elif (p._version, p.data_ptr()) == self._seen[i]:
                    continue
                elif self._offload:  # the GPU parameter's values into the host region
                    view.copy_(p.data)
                written = True
        self.mark()
        return written

    def take_all(self):
        """Every parameter counts as written (engine.reload_params())."""
        with torch.no_grad():
            for i, (p, view) in enumerate(zip(self._params, self._views)):
                if self._offload:
                    view.copy_(p.data)
                elif p.data_ptr() != view.data_ptr():
                    self._rebind(i, p, view)
        self.mark()

    def _rebind(self, i, p, view):
        """`p.data = t` replaced parameter i's storage: t's values go into the region, and the
        parameter becomes the region's view again."""
        if p.data.shape != view.shape:
            raise ZerodError(ZC_ERR_LAYOUT_MISMATCH, STATUS[ZC_ERR_LAYOUT_MISMATCH][0],
                             "parameter %d (%s) was given shape %s after initialize(); the job's "
                             "layout has %s" % (i, self._names[i] or "unnamed",
                                                tuple(p.data.shape), tuple(view.shape)))
        view.copy_(p.data)
        p.data = view
