"""Device regions of a zerod daemon on the CUDA backend, seen as torch tensors.

A daemon on a GPU shares its params region and grad slots as device memory: CUDA
virtual-memory allocations exported as file descriptors, sent over the socket like the CPU
backend's memfds. libzc maps one (zc_device_map_import); this module wraps the mapping so that
tensors on ``cuda:N`` are views of it, the way host tensors are views of a memfd on the CPU
backend. Views are made through ``__cuda_array_interface__`` with no stream (nothing is
synchronised by making one): ordering with the daemon is by its interprocess events.
"""
import ctypes

from ._codes import DTYPE_BF16, DTYPE_F16, DTYPE_F32
from ._libzc import _check, load_libzc

__all__ = ["DeviceRegion", "tensor_at"]

# zerod dtype -> (the interface's typestr, element size); bf16 has no typestr, so its views are
# made as int16 and reinterpreted
_TYPESTR = {DTYPE_F32: ("<f4", 4), DTYPE_F16: ("<f2", 2), DTYPE_BF16: ("<i2", 2)}


class _CudaArray:
    """What torch.as_tensor reads; it holds `region` (when not None) so that the mapping
    outlives the tensor."""

    def __init__(self, region, ptr, numel, typestr):
        self._region = region
        self.__cuda_array_interface__ = {
            "shape": (numel,),
            "typestr": typestr,
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


def tensor_at(ptr, numel, dtype, device, owner=None):
    """A 1-D tensor on ``device`` (cuda:N) over ``numel`` elements of zerod dtype ``dtype`` at
    device address ``ptr``, no copy; it keeps ``owner`` alive (None: the caller keeps the
    mapping alive longer than the tensor)."""
    import torch

    typestr = _TYPESTR[dtype][0]
    t = torch.as_tensor(_CudaArray(owner, ptr, numel, typestr), device=device)
    return t.view(torch.bfloat16) if dtype == DTYPE_BF16 else t


class DeviceRegion:
    """One device region of the daemon, mapped in this process on CUDA device ``device``.

    ``fd`` is the region's file descriptor as received from the daemon (closed here once the
    mapping is made), ``size`` the bytes the daemon created. Tensors from tensor() keep the
    region mapped while they live; close() unmaps at once, so call it only when none is used."""

    def __init__(self, fd, size, device):
        self._lib = load_libzc()
        handle = ctypes.c_void_p()
        _check(self._lib, self._lib.zc_device_map_import(int(device), int(fd), int(size),
                                                         ctypes.byref(handle)))
        self._handle = handle
        self.device = int(device)
        self.size = int(size)
        self.ptr = self._lib.zc_device_map_ptr(handle)

    def tensor(self, dtype, numel, offset=0):
        """A 1-D tensor of ``numel`` elements of zerod dtype ``dtype`` at byte ``offset``."""
        if self._handle is None:
            raise ValueError("device region: closed")
        if dtype not in _TYPESTR:
            raise ValueError("device region: dtype %r is not one of zerod's" % (dtype,))
        esize = _TYPESTR[dtype][1]
        if offset < 0 or numel < 0 or offset % esize != 0 or offset + numel * esize > self.size:
            raise ValueError("device region: %d elements of %d bytes at offset %d do not fit in "
                             "its %d bytes" % (numel, esize, offset, self.size))
        return tensor_at(self.ptr + offset, numel, dtype, "cuda:%d" % self.device, owner=self)

    def close(self):
        if self._handle is not None:
            self._lib.zc_device_map_close(self._handle)
            self._handle = None
            self.ptr = None
