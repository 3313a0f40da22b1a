"""ctypes bindings of libzc (client/include/zerod/zc.h) and a thin Python session over them.

Nothing here needs torch. The structs mirror zc.h field by field (ctypes lays them out with the
platform C ABI, the same as the compiler). Every failing call raises ZerodError with the status
name (zc_status_name) and libzc's message (zc_last_error, read on the calling thread right away).
"""
import ctypes
import ctypes.util
import os

__all__ = [
    "ZerodError",
    "Session",
    "load_libzc",
    "libzc_path",
    "DTYPE_F32",
    "DTYPE_F16",
    "DTYPE_BF16",
    "MEMORY_HOST",
    "MEMORY_DEVICE",
]

# The codes are generated from common's tables and checked at build time (_codes.py).
from ._codes import (  # noqa: F401 (DTYPE_*: the package's names for them)
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_F32,
    ZC_ERR_INVALID,
    ZC_ERR_NOT_FOUND,
    ZC_ERR_STATE,
    ZC_OK,
)

_OPEN_FIELD_SOCKET_PATH = 1 << 0
_OPEN_FIELD_TIMEOUT_MS = 1 << 1

_ATTACH_FIELD_JOB_ID = 1 << 0
_ATTACH_FIELD_RANK = 1 << 1
_ATTACH_FIELD_WORLD = 1 << 2
_ATTACH_FIELD_COORDINATOR = 1 << 3
_ATTACH_FIELD_DTYPE = 1 << 4
_ATTACH_FIELD_GROUPS = 1 << 5
_ATTACH_FIELD_CONFIG_JSON = 1 << 6
_ATTACH_FIELD_PARAM_INFO = 1 << 7
_ATTACH_FIELD_RESUME = 1 << 8
_ATTACH_FIELD_OWN_SLICES = 1 << 9

# zc_session_memory: where an attached session's regions live (zc.h ZC_MEMORY_*)
MEMORY_HOST = 0
MEMORY_DEVICE = 2

# zc_resume_t: what an attach does with a job the daemon keeps for a re-attach
RESUME = {"if_kept": 0, "auto": 1, "never": 2, "must": 3}

_STEP_FIELD_GROUP_LR = 1 << 0
_STEP_FIELD_TIMEOUT_MS = 1 << 1


class ZerodError(RuntimeError):
    """A libzc call failed. `status` is the (negative) status code, `name` its name
    (e.g. "ERR_BUSY"), `message` libzc's explanation."""

    def __init__(self, status, name, message):
        self.status = status
        self.name = name
        self.message = message
        # libzc's messages for daemon replies already name the status ("step: ERR_X: ...")
        if not message:
            text = name
        elif name in message:
            text = message
        else:
            text = "%s: %s" % (name, message)
        super().__init__(text)


# ---- structs (zc.h) ----------------------------------------------------------------------

c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64


class _OpenParams(ctypes.Structure):
    _fields_ = [
        ("field_mask", c_u64),
        ("socket_path", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int),
        ("control", ctypes.c_int),
    ]


class _Group(ctypes.Structure):
    _fields_ = [
        ("n_params", c_u32),
        ("numel", ctypes.POINTER(c_u64)),
        ("options_json", ctypes.c_char_p),
    ]


class _ParamInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("ndim", c_u32),
        ("dims", c_u64 * 8),
    ]


class _CheckpointParams(ctypes.Structure):
    _fields_ = [
        ("dir", ctypes.c_char_p),
        ("tag", ctypes.c_char_p),
        ("trainer_state", ctypes.c_void_p),
        ("trainer_state_len", ctypes.c_size_t),
        ("load_optimizer_states", ctypes.c_int),
        ("timeout_ms", ctypes.c_int),
    ]


class _CheckpointInfo(ctypes.Structure):
    _fields_ = [
        ("path", ctypes.c_char * 4096),
        ("tag", ctypes.c_char * 128),
        ("step", c_u64),
        ("loss_scale", ctypes.c_double),
        ("saved_world", c_u32),
        ("has_trainer_state", ctypes.c_int),
    ]


class _AttachParams(ctypes.Structure):
    _fields_ = [
        ("field_mask", c_u64),
        ("job_id", ctypes.c_char_p),
        ("rank", c_u32),
        ("world", c_u32),
        ("coordinator", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("n_groups", c_u32),
        ("groups", ctypes.POINTER(_Group)),
        ("config_json", ctypes.c_char_p),
        ("param_info", ctypes.POINTER(_ParamInfo)),
        ("resume", ctypes.c_int),
        ("restart", ctypes.c_int),
        ("own_slices_only", ctypes.c_int),
    ]


class _AttachInfo(ctypes.Structure):
    _fields_ = [
        ("layout_hash", c_u64),
        ("step", c_u64),
        ("resumed", ctypes.c_int),
        ("loss_scale", ctypes.c_double),
        ("stage", c_u32),
        ("gradient_accumulation_steps", c_u32),
        ("n_params", c_u32),
        ("n_buckets", c_u32),
        ("n_slots", c_u32),
        ("total_numel", c_u64),
    ]


class _BucketInfo(ctypes.Structure):
    _fields_ = [
        ("group", c_u32),
        ("n_params", c_u32),
        ("numel", c_u64),
        ("padded", c_u64),
    ]


class _BucketPiece(ctypes.Structure):
    _fields_ = [
        ("id", c_u32),
        ("param_offset", c_u64),
        ("slot_offset", c_u64),
        ("numel", c_u64),
    ]


class Slot(ctypes.Structure):
    """zc_slot_t: `data` is the address of bucket.padded elements of the session dtype."""

    _fields_ = [
        ("index", c_u32),
        ("bucket", c_u32),
        ("data", ctypes.c_void_p),
        ("bytes", ctypes.c_size_t),
    ]


class _StepParams(ctypes.Structure):
    _fields_ = [
        ("field_mask", c_u64),
        ("n_group_lr", c_u32),
        ("group_lr", ctypes.POINTER(ctypes.c_double)),
        ("timeout_ms", ctypes.c_int),
    ]


class _StepResult(ctypes.Structure):
    _fields_ = [
        ("step", c_u64),
        ("skipped", ctypes.c_int),
        ("grad_norm", ctypes.c_double),
        ("loss_scale", ctypes.c_double),
        ("skipped_steps", c_u64),
    ]


# ---- loading -----------------------------------------------------------------------------

_lib = None
_lib_path = None


def _candidates():
    """Where libzc is looked for, in order: $ZEROD_LIBZC, next to this package (a wheel or an
    install that copied it in), the build tree of the repository this file sits in
    (client/python/zerod -> build/client), ./build/client, then the system loader's path."""
    env = os.environ.get("ZEROD_LIBZC")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    for name in ("libzc.so", "libzc.so.0"):
        out.append(os.path.join(here, name))
    repo = os.path.normpath(os.path.join(here, "..", "..", ".."))
    out.append(os.path.join(repo, "build", "client", "libzc.so"))
    cwd_build = os.path.join(os.getcwd(), "build", "client", "libzc.so")
    if cwd_build not in out:
        out.append(cwd_build)  # an installed package run from the repository's root
    found = ctypes.util.find_library("zc")
    out.append(found if found else "libzc.so.0")
    return out, False


def _binder(lib):
    def fn(name, restype, argtypes):
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = argtypes
    return fn


def _bind(lib):
    fn = _binder(lib)
    vp = ctypes.c_void_p
    fn("zc_session_open", ctypes.c_int, [ctypes.POINTER(_OpenParams), ctypes.POINTER(vp)])
    fn("zc_session_close", None, [vp])
    fn("zc_session_disconnect", None, [vp])
    fn("zc_session_attach", ctypes.c_int,
       [vp, ctypes.POINTER(_AttachParams), ctypes.POINTER(_AttachInfo)])
    fn("zc_session_params_ready", ctypes.c_int, [vp])
    fn("zc_session_params_reload", ctypes.c_int, [vp])
    fn("zc_session_ignored_keys", ctypes.c_char_p, [vp])
    fn("zc_session_replaced", ctypes.c_char_p, [vp])
    fn("zc_session_grads_dtype", ctypes.c_int, [vp])
    fn("zc_session_batch", ctypes.c_int, [vp, ctypes.POINTER(c_u32), ctypes.POINTER(c_u32)])
    fn("zc_session_restored", ctypes.c_int,
       [vp, ctypes.POINTER(c_u64), ctypes.POINTER(ctypes.c_double)])
    if hasattr(lib, "zc_session_restore_warning"):  # a libzc built before it has none
        fn("zc_session_restore_warning", ctypes.c_char_p, [vp])
    fn("zc_session_param_ptr", vp, [vp, c_u32])
    fn("zc_session_param_numel", c_u64, [vp, c_u32])
    fn("zc_session_params_shared", ctypes.c_int, [vp])
    fn("zc_session_replicated", ctypes.c_int, [vp])
    fn("zc_session_slot_copy_out", ctypes.c_int, [vp, ctypes.POINTER(Slot), vp])
    fn("zc_session_memory", ctypes.c_int, [vp, ctypes.POINTER(ctypes.c_int)])
    fn("zc_session_init_param", ctypes.c_int, [vp, c_u32, vp])
    fn("zc_session_dtype", ctypes.c_int, [vp])
    fn("zc_dtype_size", ctypes.c_size_t, [ctypes.c_int])
    fn("zc_session_bucket_info", ctypes.c_int, [vp, c_u32, ctypes.POINTER(_BucketInfo)])
    fn("zc_session_param_bucket", ctypes.c_int,
       [vp, c_u32, ctypes.POINTER(c_u32), ctypes.POINTER(c_u64)])
    fn("zc_session_bucket_param", ctypes.c_int, [vp, c_u32, c_u32, ctypes.POINTER(c_u32)])
    fn("zc_session_bucket_piece", ctypes.c_int, [vp, c_u32, c_u32, ctypes.POINTER(_BucketPiece)])
    fn("zc_session_slot_acquire", ctypes.c_int, [vp, c_u32, ctypes.c_int, ctypes.POINTER(Slot)])
    fn("zc_session_slot_submit", ctypes.c_int, [vp, ctypes.POINTER(Slot), c_u32])
    fn("zc_session_slot_submit_event", ctypes.c_int,
       [vp, ctypes.POINTER(Slot), c_u32, ctypes.c_char_p, ctypes.c_size_t])
    fn("zc_session_slot_fill", ctypes.c_int, [vp, ctypes.POINTER(Slot), c_u64, vp, c_u64])
    fn("zc_session_fill_stores", ctypes.c_int,
       [vp, c_u64, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint),
        ctypes.POINTER(ctypes.c_int)])
    fn("zc_session_grads_ptr", vp, [vp])
    fn("zc_session_param_grad_ptr", vp, [vp, c_u32])
    fn("zc_session_step", ctypes.c_int,
       [vp, ctypes.POINTER(_StepParams), ctypes.POINTER(_StepResult)])
    fn("zc_session_detach", ctypes.c_int, [vp, ctypes.c_int])
    _bind_other(lib)


def _bind_other(lib):
    """Checkpoints, device maps and the library's own calls."""
    fn = _binder(lib)
    vp = ctypes.c_void_p
    fn("zc_checkpoint_save", ctypes.c_int,
       [vp, ctypes.POINTER(_CheckpointParams), ctypes.POINTER(_CheckpointInfo)])
    fn("zc_checkpoint_wait", ctypes.c_int, [vp, ctypes.c_int, ctypes.POINTER(_CheckpointInfo)])
    fn("zc_checkpoint_load", ctypes.c_int,
       [vp, ctypes.POINTER(_CheckpointParams), ctypes.POINTER(_CheckpointInfo)])
    fn("zc_coordinator_from_env", ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t])
    fn("zc_device_map_import", ctypes.c_int, [ctypes.c_int, ctypes.c_int, c_u64, ctypes.POINTER(vp)])
    fn("zc_device_map_ptr", vp, [vp])
    fn("zc_device_map_size", c_u64, [vp])
    fn("zc_device_map_close", None, [vp])
    fn("zc_last_error", ctypes.c_char_p, [])
    fn("zc_status_name", ctypes.c_char_p, [ctypes.c_int])
    fn("zc_version", ctypes.c_char_p, [])


def load_libzc():
    """Load libzc once (see _candidates for where) and return the ctypes library."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    paths, explicit = _candidates()
    errors = []
    for path in paths:
        if os.sep in path and not os.path.exists(path):
            errors.append("%s: no such file" % path)
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
            continue
        _bind(lib)
        _lib, _lib_path = lib, path
        return lib
    hint = ("ZEROD_LIBZC=%s does not load" % paths[0]) if explicit else (
        "build it (cmake --build build) or set ZEROD_LIBZC to its path")
    raise ImportError("zerod: cannot load libzc (%s); tried: %s" % (hint, "; ".join(errors)))


def libzc_path():
    """The path libzc was loaded from (loading it if needed)."""
    load_libzc()
    return _lib_path


def _raise(lib, status, what=None):
    name = lib.zc_status_name(status)
    msg = lib.zc_last_error()
    name = name.decode() if name else str(status)
    msg = msg.decode(errors="replace") if msg else ""
    if what and not msg:
        msg = what
    raise ZerodError(status, name, msg)


def _check(lib, status, what=None):
    if status != ZC_OK:
        _raise(lib, status, what)


def _bytes(s):
    return None if s is None else (s.encode() if isinstance(s, str) else bytes(s))


def _group_array(groups, keep):
    """The zc_group_t array of attach's groups (their numel arrays appended to keep)."""
    garr = (_Group * len(groups))()
    for i, group in enumerate(groups):
        numels, opts = group[0], group[1]
        arr = (c_u64 * max(1, len(numels)))(*[int(n) for n in numels])
        keep.append(arr)
        garr[i].n_params = len(numels)
        garr[i].numel = arr
        garr[i].options_json = _bytes(opts)
    return garr


def _param_info_array(groups, keep):
    """The zc_param_info_t array of attach's groups' names and shapes, in registration order
    (appended to keep), or None when no parameter has a name or a shape."""
    infos = []
    for group in groups:
        n = len(group[0])
        names = group[2] if len(group) > 2 and group[2] is not None else [""] * n
        shapes = group[3] if len(group) > 3 and group[3] is not None else [()] * n
        infos += list(zip(names, shapes))
    if not any(name or shape for name, shape in infos):
        return None
    pi = (_ParamInfo * len(infos))()
    for i, (name, shape) in enumerate(infos):
        pi[i].name = _bytes(name)
        shape = [int(d) for d in shape]
        if 0 < len(shape) <= 8:
            pi[i].ndim = len(shape)
            for j, d in enumerate(shape):
                pi[i].dims[j] = d
    keep.append(pi)
    return pi


class Session:
    """One libzc session (zc_session_t). Not thread-safe, like the C handle: callers serialize.

    The attached regions stay mapped until detach() or close(); memory views made from
    param_ptr()/slot data must not be used after that. After attach(), `memory` says where
    they live: MEMORY_HOST (a CPU-backend daemon: host addresses) or MEMORY_DEVICE (a daemon
    on CUDA device `device`: every address is a device address there, zc_session_memory in
    zc.h); `device` is -1 for host memory. Both are None and -1 while not attached."""

    def __init__(self, socket_path=None, timeout_ms=None):
        self._lib = load_libzc()
        p = _OpenParams()
        if socket_path is not None:
            p.field_mask |= _OPEN_FIELD_SOCKET_PATH
            p.socket_path = _bytes(socket_path)
        if timeout_ms is not None:
            p.field_mask |= _OPEN_FIELD_TIMEOUT_MS
            p.timeout_ms = int(timeout_ms)
        h = ctypes.c_void_p()
        _check(self._lib, self._lib.zc_session_open(ctypes.byref(p), ctypes.byref(h)), "open")
        self._h = h
        self.info = None
        self.memory = None  # MEMORY_HOST or MEMORY_DEVICE once attached
        self.device = -1  # the CUDA ordinal of device regions
        # [{group, n_params, numel, padded, pieces: [(id, param_offset, slot_offset, numel)]}]
        self.buckets = []

    # ---- attach -------------------------------------------------------------------------

    def attach(self, job_id, groups, config_json="{}", dtype=DTYPE_F32, rank=0, world=1,
               coordinator=None, resume=None, restart=False, own_slices_only=False):
        """groups: list of (numels, options_json or None[, names, shapes]): names and shapes
        (lists, one per parameter) go into checkpoints. resume: None (the daemon re-attaches a
        job it keeps whenever it fits), or "auto", "never", "must" (zc_resume_t); restart: the
        launcher says this process is a restart; own_slices_only: a fresh job's values will be
        written with init_param (which then writes only this rank's slices if the daemons give
        the host's ranks one params region). Returns the attach info as a dict (keys of
        zc_attach_info_t, "replaced": the kept job this attach replaced, or "", and
        "params_shared") and fills self.buckets with the layout."""
        lib = self._lib
        keep = []  # keep the ctypes arrays alive during the call
        ap = _AttachParams()
        ap.field_mask = (_ATTACH_FIELD_JOB_ID | _ATTACH_FIELD_RANK | _ATTACH_FIELD_WORLD
                         | _ATTACH_FIELD_DTYPE | _ATTACH_FIELD_GROUPS | _ATTACH_FIELD_CONFIG_JSON)
        ap.groups = _group_array(groups, keep)
        ap.n_groups = len(groups)
        ap.job_id = _bytes(job_id)
        ap.rank = int(rank)
        ap.world = int(world)
        if coordinator:
            ap.field_mask |= _ATTACH_FIELD_COORDINATOR
            ap.coordinator = _bytes(coordinator)
        ap.dtype = int(dtype)
        ap.config_json = _bytes(config_json)
        if resume is not None:
            if resume not in RESUME:
                raise ValueError("zerod: resume=%r is not one of %s" % (resume, sorted(RESUME)))
            ap.field_mask |= _ATTACH_FIELD_RESUME
            ap.resume = RESUME[resume]
            ap.restart = 1 if restart else 0
        if own_slices_only:
            ap.field_mask |= _ATTACH_FIELD_OWN_SLICES
            ap.own_slices_only = 1
        pi = _param_info_array(groups, keep)
        if pi is not None:
            ap.field_mask |= _ATTACH_FIELD_PARAM_INFO
            ap.param_info = pi
        info = _AttachInfo()
        _check(lib, lib.zc_session_attach(self._h, ctypes.byref(ap), ctypes.byref(info)),
               "attach")
        self._read_attach_info(info)
        self.buckets = [self._read_bucket(b) for b in range(info.n_buckets)]
        return dict(self.info)

    def _read_attach_info(self, info):
        """self.info (and memory, device) from a successful attach's zc_attach_info_t and the
        session's getters."""
        lib = self._lib
        self.info = {name: getattr(info, name) for name, _ in _AttachInfo._fields_}
        self.info["resumed"] = bool(info.resumed)
        rep = lib.zc_session_replaced(self._h)
        self.info["replaced"] = rep.decode(errors="replace") if rep else ""
        ign = lib.zc_session_ignored_keys(self._h)
        self.info["ignored_keys"] = ign.decode() if ign else ""
        self.info["grads_dtype"] = lib.zc_session_grads_dtype(self._h)
        self.info["params_shared"] = bool(lib.zc_session_params_shared(self._h))
        self.info["replicated"] = bool(lib.zc_session_replicated(self._h))
        dev = ctypes.c_int(-1)
        mem = lib.zc_session_memory(self._h, ctypes.byref(dev))
        if mem < 0:
            _raise(lib, mem, "memory")
        self.memory, self.device = mem, dev.value
        self.info["memory"], self.info["device"] = mem, dev.value
        tb, mb = c_u32(0), c_u32(0)
        _check(lib, lib.zc_session_batch(self._h, ctypes.byref(tb), ctypes.byref(mb)), "batch")
        self.info["train_batch_size"] = tb.value
        self.info["train_micro_batch_size_per_gpu"] = mb.value

    def _read_bucket(self, b):
        """Bucket b of the attached layout, as an entry of self.buckets."""
        lib = self._lib
        bi = _BucketInfo()
        _check(lib, lib.zc_session_bucket_info(self._h, b, ctypes.byref(bi)))
        pieces = []
        for i in range(bi.n_params):
            pc = _BucketPiece()
            _check(lib, lib.zc_session_bucket_piece(self._h, b, i, ctypes.byref(pc)))
            pieces.append((pc.id, pc.param_offset, pc.slot_offset, pc.numel))
        return {"group": bi.group, "n_params": bi.n_params, "numel": bi.numel,
                "padded": bi.padded, "pieces": pieces}

    def init_param(self, pid, ptr):
        """A fresh job's initial values of parameter pid (param_numel elements of the session
        dtype at address ptr) into the params region: only this rank's slices when the region
        is shared (info["params_shared"])."""
        _check(self._lib, self._lib.zc_session_init_param(self._h, pid, ptr), "init_param")

    def params_ready(self):
        """Returns None, or (step, loss_scale, warning) when the daemons resumed the job from
        their checkpoint_dir instead (the params region then holds the checkpoint's values);
        warning: why it is not the checkpoint `latest` names, or ""."""
        _check(self._lib, self._lib.zc_session_params_ready(self._h), "params_ready")
        step, scale = c_u64(0), ctypes.c_double(0)
        if self._lib.zc_session_restored(self._h, ctypes.byref(step), ctypes.byref(scale)):
            why = getattr(self._lib, "zc_session_restore_warning", None)
            why = why(self._h) if why is not None else None
            return step.value, scale.value, why.decode(errors="replace") if why else ""
        return None

    def params_reload(self):
        """The trainer wrote new values into the params region (weights loaded after attach):
        the daemon's master takes them (fp32: the region is the master already), and with
        replication = buddy its replica on the buddy daemon."""
        _check(self._lib, self._lib.zc_session_params_reload(self._h), "params_reload")

    @property
    def dtype(self):
        return self._lib.zc_session_dtype(self._h)

    @property
    def dtype_size(self):
        return self._lib.zc_dtype_size(self.dtype)

    def param_ptr(self, pid):
        addr = self._lib.zc_session_param_ptr(self._h, pid)
        if not addr:
            _raise(self._lib, ZC_ERR_INVALID, "param_ptr(%d) failed" % pid)
        return addr

    def param_numel(self, pid):
        return self._lib.zc_session_param_numel(self._h, pid)

    def param_grad_ptr(self, pid):
        """Stage 1: parameter pid's place in the full-gradient region."""
        addr = self._lib.zc_session_param_grad_ptr(self._h, pid)
        if not addr:
            _raise(self._lib, ZC_ERR_STATE, "param_grad_ptr(%d) failed" % pid)
        return addr

    # ---- stage 2 slots ------------------------------------------------------------------

    def slot_acquire(self, bucket, timeout_ms=-1):
        slot = Slot()
        _check(self._lib, self._lib.zc_session_slot_acquire(self._h, bucket, int(timeout_ms),
                                                            ctypes.byref(slot)), "slot_acquire")
        return slot

    def slot_fill(self, slot, offset, addr, numel):
        """Copy numel elements at address addr into the slot from element offset, streaming
        the way the daemon measured copies stream best (a device session: a CUDA copy from
        host or device memory, complete on return)."""
        _check(self._lib, self._lib.zc_session_slot_fill(self._h, ctypes.byref(slot), int(offset),
                                                         addr, int(numel)), "slot_fill")

    def slot_copy_out(self, slot, addr):
        """The acquired slot's whole bucket (padded) copied to address addr, streaming as
        slot_fill does; also after the connection closed (zc_session_slot_copy_out)."""
        _check(self._lib, self._lib.zc_session_slot_copy_out(self._h, ctypes.byref(slot), addr),
               "slot_copy_out")

    def fill_stores(self, numel):
        """(non-temporal, prefetch elements, the daemon's plan) of a slot_fill of numel elements
        now; without the daemon's plan: regular stores, no prefetch. ERR_UNSUPPORTED on a
        device session."""
        nt, pf, planned = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        _check(self._lib, self._lib.zc_session_fill_stores(self._h, int(numel), ctypes.byref(nt),
                                                           ctypes.byref(pf), ctypes.byref(planned)),
               "fill_stores")
        return bool(nt.value), pf.value, bool(planned.value)

    def slot_submit(self, slot, micro_step, event=None):
        """event: a device session's interprocess CUDA event handle (bytes), recorded after the
        writes into the slot; the daemon waits for it. None: the writes are complete."""
        if event is None:
            _check(self._lib, self._lib.zc_session_slot_submit(self._h, ctypes.byref(slot),
                                                               int(micro_step)), "slot_submit")
            return
        event = bytes(event)
        _check(self._lib, self._lib.zc_session_slot_submit_event(
            self._h, ctypes.byref(slot), int(micro_step), event, len(event)), "slot_submit")

    # ---- step / detach ------------------------------------------------------------------

    def step(self, group_lr=None, timeout_ms=None):
        """Returns a dict with step, skipped, grad_norm, loss_scale, skipped_steps."""
        sp = _StepParams()
        keep = None
        if group_lr is not None:
            keep = (ctypes.c_double * len(group_lr))(*[float(x) for x in group_lr])
            sp.field_mask |= _STEP_FIELD_GROUP_LR
            sp.n_group_lr = len(group_lr)
            sp.group_lr = keep
        if timeout_ms is not None:
            sp.field_mask |= _STEP_FIELD_TIMEOUT_MS
            sp.timeout_ms = int(timeout_ms)
        res = _StepResult()
        _check(self._lib, self._lib.zc_session_step(self._h, ctypes.byref(sp), ctypes.byref(res)),
               "step")
        del keep
        return {"step": res.step, "skipped": bool(res.skipped), "grad_norm": res.grad_norm,
                "loss_scale": res.loss_scale, "skipped_steps": res.skipped_steps}

    # ---- checkpoints ----------------------------------------------------------------------

    def _checkpoint(self, fn, what, save_dir, tag, state=b"", load_optimizer_states=True,
                    timeout_ms=0):
        cp = _CheckpointParams()
        cp.dir = _bytes(os.path.abspath(os.fspath(save_dir)))
        cp.tag = _bytes(tag) if tag is not None else None
        buf = None
        if state:
            buf = ctypes.create_string_buffer(bytes(state), len(state))
            cp.trainer_state = ctypes.cast(buf, ctypes.c_void_p)
            cp.trainer_state_len = len(state)
        cp.load_optimizer_states = 1 if load_optimizer_states else 0
        cp.timeout_ms = int(timeout_ms or 0)
        info = _CheckpointInfo()
        _check(self._lib, fn(self._h, ctypes.byref(cp), ctypes.byref(info)), what)
        del buf
        return {"path": info.path.decode(), "tag": info.tag.decode(), "step": info.step,
                "loss_scale": info.loss_scale, "saved_world": info.saved_world,
                "has_trainer_state": bool(info.has_trainer_state)}

    def checkpoint_save(self, save_dir, tag=None, trainer_state=b"", timeout_ms=0):
        """Every rank at the same step; trainer_state (bytes, rank 0's counts) is stored as
        trainer_state.pt. Returns {path, tag, step, ...}."""
        return self._checkpoint(self._lib.zc_checkpoint_save, "checkpoint_save", save_dir, tag,
                                trainer_state, timeout_ms=timeout_ms)

    def checkpoint_wait(self, timeout_ms=0):
        """Every rank: until the last save is written and committed. Returns {path, tag,
        step} of that save (path "" when there was none)."""
        info = _CheckpointInfo()
        _check(self._lib, self._lib.zc_checkpoint_wait(self._h, int(timeout_ms or 0),
                                                       ctypes.byref(info)), "checkpoint_wait")
        return {"path": info.path.decode(), "tag": info.tag.decode(), "step": info.step}

    def checkpoint_load(self, load_dir, tag=None, load_optimizer_states=True, timeout_ms=0):
        """Every rank, after params_ready: returns {path, tag, step, loss_scale, saved_world,
        has_trainer_state}."""
        return self._checkpoint(self._lib.zc_checkpoint_load, "checkpoint_load", load_dir, tag,
                                load_optimizer_states=load_optimizer_states,
                                timeout_ms=timeout_ms)

    def detach(self, end_job=True):
        _check(self._lib, self._lib.zc_session_detach(self._h, 1 if end_job else 0), "detach")
        self.memory, self.device = None, -1

    def disconnect(self):
        """Close the connection only: the regions stay mapped until close(), so views of them
        stay valid while the trainer re-attaches on a new session (zc_session_disconnect)."""
        if self._h is not None:
            self._lib.zc_session_disconnect(self._h)

    def close(self):
        if self._h is not None:
            self._lib.zc_session_close(self._h)
            self._h = None
        self.memory, self.device = None, -1

    @property
    def closed(self):
        return self._h is None


def coordinator_from_env():
    """libzc's rule (zc_coordinator_from_env): ZEROD_COORDINATOR, else MASTER_ADDR and
    MASTER_PORT + 1 (torch's store keeps MASTER_PORT); None when the environment names none."""
    lib = load_libzc()
    buf = ctypes.create_string_buffer(512)
    st = lib.zc_coordinator_from_env(buf, len(buf))
    if st == ZC_OK:
        return buf.value.decode()
    if st == ZC_ERR_NOT_FOUND:
        return None
    _raise(lib, st, "coordinator")


def version():
    """libzc's version string."""
    v = load_libzc().zc_version()
    return v.decode() if v else ""
