"""How zerod.torch hands gradients to the daemon: buckets, slots and the backward hooks.

A stage-2 engine copies each parameter's gradient, as its hook sees it, into the slot of each
bucket holding a piece of it, and submits a bucket's slot once every piece is in; stage 1 adds
gradients into the full-gradient region. GradientStream is the engine's part that does it: the
engine makes one once its parameters are bound and hands it a StreamLink, all it takes from the
engine (the session, the parameters, the lock, dtype, stage and the CUDA device of a device
session's regions, None for host memory: the slots and the grads region are then device memory,
written by torch on the GPU).
"""
import ctypes
import dataclasses
import functools
import os

import torch

from ._codes import (DTYPE_BF16, DTYPE_F16, DTYPE_F32, ZC_ERR_ABORTED, ZC_ERR_CLOSED, ZC_ERR_IO,
                     ZC_ERR_PEER_LOST)
from ._libzc import ZerodError
from . import _linear
from ._cuda import tensor_at as _device_tensor_at

_TORCH_DTYPE = {DTYPE_F32: torch.float32, DTYPE_F16: torch.float16, DTYPE_BF16: torch.bfloat16}
_ZEROD_DTYPE = {t: z for z, t in _TORCH_DTYPE.items()}


def _libc_malloc_trim():
    if os.environ.get("ZEROD_TRIM_HEAP", "0") != "1":
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc: nothing to ask
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_MALLOC_TRIM = _libc_malloc_trim()

# device sessions: hand each slot over with an interprocess CUDA event (the default), or with
# a CPU wait for the copies (0)
_SLOT_EVENTS = os.environ.get("ZEROD_SLOT_EVENTS", "1") != "0"


def _trim_heap():
    """With ZEROD_TRIM_HEAP=1, hand the heap's free pages back to the system after a stage-2
    backward. Each gradient is freed once copied into its slot, but glibc keeps the freed
    blocks in its heap (binding the parameters to the params region, which frees their big
    mmapped storage, raises its mmap threshold), and fragmentation lets a few gradients' worth
    stay there. Trimming returns them at the price of page faults when the next backward
    touches that memory again (docs/design-notes.md, "Trainer memory"); off by default."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _tensor_at(addr, numel, dtype, device=None):
    """A tensor over `numel` elements of `dtype` at address `addr` (no copy): host memory, or,
    with `device` (torch.device("cuda", N)), a device address on that GPU, as libzc gives them
    for a device session. Neither the ctypes array nor the __cuda_array_interface__ holder the
    tensor keeps alive owns the memory: libzc's mapping must outlive the tensor."""
    if numel == 0:
        return torch.empty(0, dtype=dtype, device=device)
    if device is not None:
        # "stream": None: making the view synchronises nothing (the engine syncs where the
        # daemon is about to read: sync_device)
        return _device_tensor_at(addr, numel, _ZEROD_DTYPE[dtype], device)
    esize = torch.empty((), dtype=dtype).element_size()
    buf = (ctypes.c_uint8 * (numel * esize)).from_address(addr)
    return torch.frombuffer(buf, dtype=dtype)


def sync_device(dev):
    """A device session (dev, the regions' torch.device): wait, on the CPU, until the work
    queued so far on this thread's current stream of the device is done -- the copies into a
    slot before it is submitted without an event (ZEROD_SLOT_EVENTS=0), stage 1's additions
    into the grads region before the step, the initial values before ParamsReady -- since the
    daemon reads the region from another process, which orders nothing with our streams.

    The current stream is the one the copies went to: a hook runs on the stream of its
    parameter's AccumulateGrad node, which is the one it then syncs when it completes a
    bucket, and after backward() the caller's current stream has waited for those streams
    (torch's stream semantics of backward). A forward on several streams could leave a
    piece copied early on another stream than the one synced; torch.cuda.synchronize
    would cover that too, at the cost of waiting for every stream. Host sessions (dev None):
    nothing."""
    if dev is not None:
        torch.cuda.current_stream(dev).synchronize()


@dataclasses.dataclass(frozen=True, eq=False)
class StreamLink:
    """What a GradientStream takes from its engine (ZerodEngine._stream_link)."""
    sess: object           # the attached libzc Session: layout, slots, grads region
    params: list           # the parameters in registration order: params[pid]
    lock: object           # the engine's lock, held around every call into the session
    dtype: torch.dtype     # the parameters' and the slots' dtype
    stage: int             # 1: add into the grads region; 2: buckets through slots
    dev: object            # the regions' CUDA torch.device; None: host memory
    module: torch.nn.Module  # the engine's module (LandingLinear routes its nn.Linear)
    offload: bool          # ZeRO-Offload: the parameters are not views of the region
    keep: bool = False     # keep the window's buckets for a re-attach in place (below)


# What a lost daemon looks like to a trainer: its own daemon's connection gone (closed, I/O), or
# its daemon saying a peer was lost and the step aborted.
LOSS_ERRORS = (ZC_ERR_PEER_LOST, ZC_ERR_ABORTED, ZC_ERR_CLOSED, ZC_ERR_IO)


def is_loss(e):
    """Is `e` a daemon of the job lost (a re-attach in place can go on)?"""
    return isinstance(e, ZerodError) and e.status in LOSS_ERRORS


def _slot_per_bucket(link):
    """Does the session give a slot to every bucket of the accumulation window, so that the
    slots keep the window's buckets (link.keep)?"""
    info = link.sess.info
    return link.keep and info["n_slots"] >= len(link.sess.buckets) * max(
        1, info["gradient_accumulation_steps"])


class _KeptSlot:
    """A slot stand-in once the daemon is lost: the pieces go into the kept copy of the bucket
    (a plain host tensor), which the re-attach sends again."""
    __slots__ = ("index", "data")

    def __init__(self, index, data):
        self.index = index
        self.data = data


class GradientStream:
    """Buckets, slots and hooks of a ZerodEngine (see the module's text). The engine calls
    backward() and close(); the hooks call in on their own."""

    def __init__(self, link):
        self.link = link
        self._in_backward = False
        self._hook_error = None
        self._handles = []
        self._grad_accs = []
        self._micro = 0  # the micro-step's index in the accumulation window, for BucketReady
        # link.keep (a job with buddy replicas, host memory, stage 2): every bucket of the
        # window's micro-steps, as submitted, so that a trainer whose daemon or a peer's is
        # lost re-attaches and sends them again (zerod._reattach). Where the daemon gave a
        # slot per bucket of the window (_window), the slots keep them (libzc takes slots
        # round the ring): _kept_at[(micro, bucket)] is the slot's address, copied out only
        # when a loss comes (materialize); otherwise each is copied out as it goes. _kept:
        # [micro][bucket] -> a tensor of its padded numel. `lost`: the loss error seen in
        # this backward.
        self._kept = {}
        self._kept_at = {}
        self._esize = torch.empty((), dtype=link.dtype).element_size()
        self.lost = None
        self._build_buckets()
        self._install_hooks()

    def _build_buckets(self):
        s, params = self.link.sess, self.link.params
        # a parameter that crosses a bucket's end is split: each bucket holds pieces
        self._buckets_of = [[] for _ in params]  # [pid] -> buckets holding a piece
        self._bucket_pieces = []  # [bucket] -> [(pid, param offset, slot offset, numel)]
        self._bucket_padded = []
        self._piece_at = []       # [bucket] -> {pid: index of its piece in the bucket}
        for b, bk in enumerate(s.buckets):
            self._bucket_pieces.append(bk["pieces"])
            self._bucket_padded.append(bk["padded"])
            self._piece_at.append({pid: i for i, (pid, _, _, _) in enumerate(bk["pieces"])})
            for pid, _, _, _ in bk["pieces"]:
                self._buckets_of[pid].append(b)
        self._slot_views = {}     # (slot index, bucket) -> [views, in bucket order]
        self._slot_events = {}    # device sessions: slot index -> [its event, its handle]
        # bucket -> slot acquired before the bucket is complete, so that each gradient is
        # copied when it arrives and freed at once: the trainer's heap then holds one
        # gradient at a time, not the few that would wait for their buckets. At most all
        # slots but one are held so: a complete bucket can always get one. A slot still held
        # after a failed backward serves its bucket in the next.
        self._open = {}
        self._max_open = max(0, s.info["n_slots"] - 1)
        self._window = _slot_per_bucket(self.link)
        self._grad_views = None
        if self.link.stage == 1:  # in data_types.grad_accum_dtype: micro-steps add up there
            gdtype = _TORCH_DTYPE[s.info["grads_dtype"]]
            self._grad_views = [
                _tensor_at(s.param_grad_ptr(pid), p.numel(), gdtype, self.link.dev)
                .view(p.shape) for pid, p in enumerate(params)]
        self._reset_micro()

    def _reset_micro(self):
        self._pending = {}  # pid -> gradient, until each of its pieces is in a slot
        self._left = {}     # pid -> its pieces not in a slot yet
        self._arrived = set()  # pids whose gradient came in this micro-step
        self._done = [0] * len(self._bucket_pieces)  # [bucket] -> pieces whose gradient came
        self._filled = [set() for _ in self._bucket_pieces]  # piece indices in the open slot
        self._sent = [False] * len(self._bucket_pieces)
        self._landed = set()  # pids whose weight gradient LandingLinear put in their slots
        self._piece_grads = {}  # (bucket, piece) -> a landed gradient's piece with no slot yet

    def _install_hooks(self):
        post = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")  # torch >= 2.1
        for pid, p in enumerate(self.link.params):
            if post:
                h = p.register_post_accumulate_grad_hook(
                    functools.partial(_post_accumulate_hook, self, pid))
            else:
                # torch < 2.1: a hook on the parameter's AccumulateGrad node runs after p.grad
                # holds the gradient of this backward (as DDP and DeepSpeed do there).
                with torch.enable_grad():
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                h = acc.register_hook(functools.partial(_accumulate_node_hook, self, pid))
                self._grad_accs.append(acc)
            self._handles.append(h)
        self._landing = _linear.install(self)
        # weight gradient pieces LandingLinear computed [into their slot, into a buffer]
        self.landed_pieces = [0, 0]
        for _, pid in self._landing:
            if not post:
                continue  # the node hook above finishes landed gradients too
            # a weight whose gradient landed gets none through AccumulateGrad (unless it has
            # other users), so its tensor hook does not run: the node's hook does, always
            p = self.link.params[pid]
            with torch.enable_grad():
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._handles.append(acc.register_hook(
                functools.partial(_accumulate_node_hook, self, pid)))
            self._grad_accs.append(acc)

    def materialize(self):
        """The buckets the lost session's slots keep, copied out into tensors of their own
        (before that session is closed)."""
        for (m, b), addr in self._kept_at.items():
            bufs = self._kept.setdefault(m, [None] * len(self._bucket_padded))
            if bufs[b] is None:
                bufs[b] = torch.empty(self._bucket_padded[b], dtype=self.link.dtype)
                ctypes.memmove(bufs[b].data_ptr(), addr, self._bucket_padded[b] * self._esize)
        self._kept_at = {}

    def rebind(self, link):
        """After a re-attach in place: the same parameters and layout on a new session; the
        slots of the old one are forgotten (what they kept was materialized)."""
        self.materialize()
        self.link = link
        self._slot_views = {}
        self._open = {}
        self.lost = None
        self._window = _slot_per_bucket(link)

    def replay(self, micros):
        """After a re-attach in place: every kept bucket of the micro-steps `micros` of the
        window, in their order, submitted again to the new session (the daemons dropped the
        step in flight, so they get the same inputs as the lost step's)."""
        s = self.link.sess
        with self.link.lock:
            for m in micros:
                for b, buf in enumerate(self._kept[m]):
                    slot = s.slot_acquire(b)
                    ctypes.memmove(slot.data, buf.data_ptr(), self._bucket_padded[b] * self._esize)
                    s.slot_submit(slot, m)

    def _kept_buf(self, b):
        bufs = self._kept.setdefault(self._micro, [None] * len(self._bucket_padded))
        if bufs[b] is None:
            bufs[b] = torch.empty(self._bucket_padded[b], dtype=self.link.dtype)
        return bufs[b]

    def survives(self, e):
        """Can the engine go on in place after error `e`: a lost daemon, with the window's
        buckets kept?"""
        return self.link.keep and is_loss(e)

    def _loss(self, e):
        """A session call failed: with kept buckets a lost daemon is noted (the backward goes
        on into the kept copies); anything else is raised."""
        if not self.survives(e):
            raise e
        if self.lost is None:
            self.lost = e

    def _acquire(self, b):
        if self.lost is None:
            try:
                return self.link.sess.slot_acquire(b)
            except ZerodError as e:
                self._loss(e)
        return _KeptSlot(-1 - self._micro * len(self._bucket_padded) - b,
                         self._kept_buf(b).data_ptr())

    def _fill(self, slot, offset, addr, n):
        if not isinstance(slot, _KeptSlot):
            try:
                self.link.sess.slot_fill(slot, offset, addr, n)
                return
            except ZerodError as e:
                self._loss(e)  # the slot is still mapped: the copy goes on below
        ctypes.memmove(slot.data + offset * self._esize, addr, n * self._esize)

    def _submit(self, slot, b):
        if isinstance(slot, _KeptSlot):
            return
        if self._window:  # the slot keeps it: round the ring, none is taken twice a window
            self._kept_at[(self._micro, b)] = slot.data
        elif self.link.keep:  # streamed past the caches where the daemon's plan says so
            self.link.sess.slot_copy_out(slot, self._kept_buf(b).data_ptr())
        if self.lost is not None:
            return
        try:
            self.link.sess.slot_submit(slot, self._micro, self._slot_event(slot))
        except ZerodError as e:
            self._loss(e)

    def close(self):
        """The engine closes: the hooks go, LandingLinear's routes are undone, and no view of
        a slot or of the grads region is kept."""
        for h in self._handles:
            h.remove()
        self._handles = []
        _linear.uninstall(self._landing)
        self._landing = []
        self._grad_accs = []
        self._slot_views = {}
        self._grad_views = None

    def backward(self, scaled, retain_graph, micro):
        """scaled.backward() with the hooks handing each gradient over; then, stage 2, the
        buckets not sent yet go. micro: the micro-step's index in the accumulation window.
        A hook's error is raised here, once autograd has returned."""
        self._reset_micro()
        self._micro = micro
        self._hook_error = None
        self.lost = None
        if micro == 0:  # a new window: what the last one kept goes
            self._kept_at = {}
            if self._window:
                self._kept = {}
        for p in self.link.params:
            p.grad = None
        self._in_backward = True
        try:
            try:
                scaled.backward(retain_graph=retain_graph)
            except BaseException as e:
                if self._hook_error is not None and e is not self._hook_error:
                    raise self._hook_error from e
                raise
            if self._hook_error is not None:
                raise self._hook_error
            if self.link.stage == 2:
                self._send_the_rest()
        finally:
            self._in_backward = False
            self._pending = {}
            self._piece_grads = {}
            self._hook_error = None  # (its traceback holds the backward's frames)
        if self.link.stage == 2:
            _trim_heap()

    def _send_the_rest(self):
        """After a stage-2 backward: finish the landed gradients (their AccumulateGrad hooks
        always run) and submit every bucket not sent yet."""
        for pid in sorted(self._landed):
            self._finish_landed(pid, None)
        if self._hook_error is not None:
            raise self._hook_error
        with self.link.lock, torch.no_grad():
            for b in range(len(self._bucket_pieces)):
                if not self._sent[b]:
                    self._send_bucket(b)

    # ---- gradients ----------------------------------------------------------------------

    def _grad_ready(self, pid):
        if not self._in_backward or self._hook_error is not None:
            return  # a backward outside engine.backward(): p.grad stays for the caller
        p = self.link.params[pid]
        g = p.grad
        p.grad = None  # the gradient now lives in a slot / the grads region
        if pid in self._landed:
            self._finish_landed(pid, g)
            return
        if g is None:
            return
        try:
            with self.link.lock, torch.no_grad():
                if g.is_sparse:
                    g = g.to_dense()
                if self.link.stage == 1:
                    self._grad_views[pid].add_(g.to(self._grad_views[pid].device))
                    return
                sent = [b for b in self._buckets_of[pid] if self._sent[b]]
                if sent:
                    raise RuntimeError("zerod: parameter %d got a gradient after its bucket %d "
                                       "was sent" % (pid, sent[0]))
                if pid in self._arrived:
                    self._add_again(pid, g)
                    return
                self._arrived.add(pid)
                self._pending[pid] = g
                self._left[pid] = len(self._buckets_of[pid])
                for b in self._buckets_of[pid]:
                    self._done[b] += 1
                    if self._done[b] == len(self._bucket_pieces[b]):
                        self._send_bucket(b)
                    else:
                        self._fill_early(b, pid)
        except Exception as e:
            self._hook_failed(e)

    def _hook_failed(self, e):
        """A hook's error: kept for backward() to raise once autograd returns, and every
        later hook of this backward does nothing. Raised inside the hook, it would stop autograd
        with the graph's pending nodes left in torch's thread-local ready queue, which frees
        them only when the thread ends: at exit, after Python is gone, where freeing a node's
        saved tensors waits for the GIL for good (torch 1.13 and 2.x)."""
        if self._hook_error is None:
            self._hook_error = e

    def land_weight_grad(self, pid, g2, x2):
        """LandingLinear's backward: pid's gradient, g2^T @ x2, straight into the slot piece
        of each bucket of it that holds a slot or can get one (as _fill_early does: at most
        _max_open held); a piece in a bucket that cannot yet is computed into a buffer of its
        own size that the slot takes when the bucket gets one. False: no piece could land,
        or pid has a gradient already this micro-step, or a bucket of it was sent; the caller
        computes the gradient itself."""
        with self.link.lock:
            if (not self._in_backward or self._hook_error is not None or self.link.stage != 2
                    or pid in self._arrived or pid in self._landed):
                return False
            bs = self._buckets_of[pid]
            if any(self._sent[b] for b in bs):
                return False
            if all(b not in self._open for b in bs) and len(self._open) >= self._max_open:
                return False
            try:
                with torch.no_grad():
                    for b in bs:
                        i = self._piece_at[b][pid]
                        _, poff, _, n = self._bucket_pieces[b][i]
                        slot = self._open.get(b)
                        if slot is None and len(self._open) < self._max_open:
                            slot = self._acquire(b)
                            self._open[b] = slot
                        self.landed_pieces[slot is None] += 1
                        if slot is not None:
                            dest = self._views(slot, b)[i]
                        else:
                            dest = torch.empty(n, dtype=g2.dtype)
                            self._piece_grads[(b, i)] = dest
                        _linear.mm_rows_into(dest, g2, x2, poff)
            except Exception as e:
                self._hook_failed(e)
                return False
            self._landed.add(pid)
            return True

    def _finish_landed(self, pid, g):
        """pid's AccumulateGrad ran after its gradient landed: count its pieces in, add what
        other users of the weight gave (g, or None) and submit the buckets now complete."""
        try:
            with self.link.lock, torch.no_grad():
                self._landed.discard(pid)
                self._arrived.add(pid)
                bs = self._buckets_of[pid]
                for b in bs:
                    i = self._piece_at[b][pid]
                    if (b, i) not in self._piece_grads:
                        self._filled[b].add(i)
                if g is not None:
                    self._add_again(pid, g.to_dense() if g.is_sparse else g)
                for b in bs:
                    self._done[b] += 1
                    if self._done[b] == len(self._bucket_pieces[b]):
                        self._send_bucket(b)
        except Exception as e:
            self._hook_failed(e)

    def _add_again(self, pid, g):
        """A second gradient for pid in one micro-step: added to its pieces already in open
        slots or in buffers of their own, and to the part still waiting."""
        for b in self._buckets_of[pid]:
            i = self._piece_at[b][pid]
            _, poff, _, n = self._bucket_pieces[b][i]
            part = g.reshape(-1)[poff:poff + n]
            if i in self._filled[b]:
                view = self._views(self._open[b], b)[i]
                view.add_(part.to(view.device))
            elif (b, i) in self._piece_grads:
                self._piece_grads[(b, i)].add_(part)
        if pid in self._pending:
            self._pending[pid] = self._pending[pid] + g

    def _fill_early(self, b, pid):
        """Copy pid's piece into bucket b's slot before b is complete, acquiring the slot if
        fewer than _max_open are held; otherwise the piece waits for b to complete."""
        slot = self._open.get(b)
        if slot is None:
            if len(self._open) >= self._max_open:
                return
            slot = self._acquire(b)
            self._open[b] = slot
        self._put_piece(b, slot, self._piece_at[b][pid])

    def _views(self, slot, b):
        key = (slot.index, b)
        views = self._slot_views.get(key)
        if views is None:
            flat = _tensor_at(slot.data, self._bucket_padded[b], self.link.dtype, self.link.dev)
            views = [flat[soff:soff + n] for _, _, soff, n in self._bucket_pieces[b]]
            self._slot_views[key] = views
        return views

    def _put_piece(self, b, slot, i):
        """Piece i of bucket b into the slot from its waiting gradient (zeros if the parameter
        got none); the gradient goes once its last piece is in."""
        pid, poff, soff, n = self._bucket_pieces[b][i]
        self._filled[b].add(i)
        own = self._piece_grads.pop((b, i), None)
        if own is not None:  # a landed gradient's piece (land_weight_grad)
            if n > 0:
                self._fill(slot, soff, own.data_ptr(), n)
            return
        g = self._pending.get(pid)
        if g is None:
            self._views(slot, b)[i].zero_()
            return
        if (self.link.dev is None and g.device.type == "cpu" and g.dtype == self.link.dtype
                and g.is_contiguous() and n > 0):
            # zerod's copy: large pieces stream past the caches where that is faster here
            # (host memory only: a device session's slot is written by torch on the GPU)
            self._fill(slot, soff, g.data_ptr() + poff * g.element_size(), n)
        else:
            self._views(slot, b)[i].copy_(g.reshape(-1)[poff:poff + n])
        self._left[pid] -= 1
        if self._left[pid] == 0:  # its last piece: the gradient can go
            del self._pending[pid]
            del self._left[pid]

    def _send_bucket(self, b):
        """Put bucket b's pieces not yet in its slot there (zeros for parameters that got no
        gradient this micro-step) and submit it. Called with the lock held."""
        slot = self._open.pop(b, None)
        if slot is None:
            slot = self._acquire(b)
        for i in range(len(self._bucket_pieces[b])):
            if i not in self._filled[b]:
                self._put_piece(b, slot, i)
        self._submit(slot, b)
        self._sent[b] = True

    def _slot_event(self, slot):
        """A device session: record the slot's interprocess CUDA event on the current stream,
        after the copies into the slot, and return its handle for BucketReady; the daemon
        waits for it before it reads the slot, and the backward goes on at once. One event per
        slot: the slot's SlotFree comes after the daemon's wait, so recording it again for the
        slot's next bucket cannot overtake that wait. (ZEROD_SLOT_EVENTS=0: wait on the CPU
        instead, for comparison.) Host sessions: None."""
        if self.link.dev is None:
            return None
        if not _SLOT_EVENTS:
            sync_device(self.link.dev)
            return None
        ev = self._slot_events.get(slot.index)
        if ev is None:
            ev = [torch.cuda.Event(interprocess=True), None]
            self._slot_events[slot.index] = ev
        ev[0].record(torch.cuda.current_stream(self.link.dev))
        if ev[1] is None:  # the handle stays the event's across records
            ev[1] = bytes(ev[0].ipc_handle())
        return ev[1]


def _post_accumulate_hook(stream, pid, param):
    stream._grad_ready(pid)


def _accumulate_node_hook(stream, pid, grad_inputs, grad_outputs):
    stream._grad_ready(pid)
