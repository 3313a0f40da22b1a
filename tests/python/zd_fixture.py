"""Fixture for the Python tests: real zerod daemons in a temp dir, one per rank; rank launching;
skips.

A test script calls require_torch() first, then e.g.

    with Cluster(world) as c:          # world daemons, each on its own socket
        results = c.run(train_fn, args)  # train_fn(*args) on every rank, with the rank's env

World 1 runs train_fn in this process. World > 1 starts one process per rank (spawn) with the
torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
ZEROD_SOCKET, ZEROD_JOB) and collects each rank's result (torch.save'd through the temp dir).
require_world(world) skips (exit 77, printed reason) while zerod refuses that world size.

Environment: ZEROD_TEST_DAEMON (the zerod binary; default build/daemon/zerod of this
repository), ZEROD_LIBZC and PYTHONPATH (set by CTest). The daemons get the environment without
ZEROD_* variables other than ZEROD_LOG_* (zerod warns about ZEROD_* names it does not know). Stopping a daemon fails the test when its log has
an ERROR line the test did not allow, or when it does not exit 0 after SIGTERM.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SKIP_CODE = 77
REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

if os.path.join(REPO, "client", "python") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "client", "python"))


def skip(reason):
    print("SKIP: %s" % reason, flush=True)
    sys.exit(SKIP_CODE)


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        skip("%s cannot import torch (Debian: apt-get install python3-torch; run the tests "
             "with /usr/bin/python3)" % sys.executable)
    return sys.modules["torch"]


def zerod_bin():
    path = os.environ.get("ZEROD_TEST_DAEMON") or os.path.join(REPO, "build", "daemon", "zerod")
    if not os.access(path, os.X_OK):
        raise RuntimeError("no zerod at %s (build it, or set ZEROD_TEST_DAEMON)" % path)
    return path


def free_port():
    """A coordinator port below the ephemeral range (32768+): a port from bind(0) may be handed
    to another process's UCX TCP listener before rank 0's daemon binds it."""
    import random
    for _ in range(256):
        port = random.randrange(20000, 32767)
        try:  # MASTER_PORT and MASTER_PORT + 1 (rank 0's daemon: zc_coordinator_from_env)
            for p in (port, port + 1):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free TCP port in 20000..32767")


class Daemon:
    """One zerod (--device cpu, or `device`) in its own directory; its log is dir/zerod.log."""

    def __init__(self, rundir, flags=(), allowed_errors=None, env=None, device="cpu"):
        self.device = device
        self.extra_env = dict(env or {})
        self.rundir = rundir
        self.socket = os.path.join(rundir, "zerod.sock")
        self.log_path = os.path.join(rundir, "zerod.log")
        self.flags = list(flags)
        self.allowed_errors = allowed_errors
        self.proc = None

    def start(self, timeout=10.0):
        os.makedirs(self.rundir, exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ZEROD_") or k.startswith("ZEROD_LOG_")}
        env.update(self.extra_env)
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                [zerod_bin(), "--socket", self.socket, "--device", self.device] + self.flags,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
        finally:
            log.close()
        return self.wait_ready(timeout)

    def wait_ready(self, timeout):
        """Until the started daemon's log says READY; it is killed when it does not in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(r"^READY ", self.log(), re.M):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError("zerod exited with %d before READY:\n%s"
                                   % (self.proc.returncode, self.log()))
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError("zerod not READY within %.0f s:\n%s" % (timeout, self.log()))

    def log(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self, check=True):
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        unmasked = _threads_taking_stop_signals(proc.pid) if check else []
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            stacks = _thread_stacks(proc.pid)
            proc.kill()
            proc.wait()
            raise AssertionError("zerod did not exit within 10 s of SIGTERM; its threads:\n%s\n"
                                 "the end of its log:\n%s"
                                 % (stacks, "\n".join(self.log().splitlines()[-30:])))
        if not check:
            return
        problems = []
        if rc != 0:  # an abort's message (glibc, libuv, UCX) is on its stderr: the log
            problems.append("zerod exited with %d after SIGTERM; the end of %s:\n%s"
                            % (rc, self.log_path, "\n".join(self.log().splitlines()[-40:])))
        errors = [ln for ln in self.log().splitlines() if " ERROR " in ln]
        if self.allowed_errors:
            errors = [ln for ln in errors if not re.search(self.allowed_errors, ln)]
        if errors:
            problems.append("unexpected ERROR lines in %s:\n  %s"
                            % (self.log_path, "\n  ".join(errors)))
        if os.path.exists(self.socket):
            problems.append("zerod left its socket behind")
        if unmasked:
            problems.append("threads other than the main one take SIGTERM/SIGINT/SIGHUP (a stop "
                            "sent to them can be lost): %s" % ", ".join(unmasked))
        if problems:
            raise AssertionError("; ".join(problems))


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _threads_taking_stop_signals(pid):
    """The daemon's threads, other than its main one, that leave a stop signal unblocked: the
    daemon handles them on its loop, and one the kernel hands to another thread can stay pending
    (zs/thread.h)."""
    found = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return found
    for tid in tids:
        if int(tid) == pid:
            continue
        try:
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                fields = dict(ln.split(":", 1) for ln in f.read().splitlines() if ":" in ln)
        except OSError:
            continue  # the thread ended meanwhile
        blocked = int(fields["SigBlk"].strip(), 16)
        if any(not (blocked >> (int(s) - 1)) & 1 for s in _STOP_SIGNALS):
            found.append("%s (tid %s, SigBlk %s)" % (fields["Name"].strip(), tid,
                                                     fields["SigBlk"].strip()))
    return found


def _thread_stacks(pid):
    """Every thread's stack of a hung process (gdb), to say where it hangs."""
    try:
        out = subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60)
        return "\n".join(ln for ln in out.stdout.splitlines()
                         if ln.startswith(("Thread ", "#")))
    except (OSError, subprocess.TimeoutExpired) as e:
        return "(no stacks: %s)" % e


class Cluster:
    """`world` daemons (one per rank) in a temp dir, the coordinator address, and rank
    launching. Use as a context manager; the temp dir is removed unless ZD_KEEP_TMP is set."""

    def __init__(self, world=1, flags=("--job-linger", "60s"), job="pytest-job",
                 allowed_errors=None, env=None, device="cpu"):
        self.world = world
        self.job = job
        self.tmp = tempfile.mkdtemp(prefix="zd-py-")
        self._ports = {}
        self._ports_lock = threading.Lock()
        flags = list(flags)
        if world > 1:
            # the daemons of a multi-rank job authenticate each other with a shared token
            token = os.path.join(self.tmp, "token")
            fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(os.urandom(32).hex() + "\n")
            flags += ["--token-file", token]
        self.daemons = [Daemon(os.path.join(self.tmp, "rank%d" % r), flags, allowed_errors, env,
                               device)
                        for r in range(world)]

    def __enter__(self):
        try:
            for d in self.daemons:
                d.start()
        except BaseException:
            self._stop(check=False)
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self._stop(check=exc_type is None)
        finally:
            if exc_type is not None:
                for d in self.daemons:
                    sys.stderr.write("---- %s ----\n%s" % (d.log_path, d.log()[-4000:]))
            if not os.environ.get("ZD_KEEP_TMP"):
                shutil.rmtree(self.tmp, ignore_errors=True)
        return False

    def _stop(self, check):
        first = None
        for d in self.daemons:
            try:
                d.stop(check=check)
            except AssertionError as e:
                first = first or e
        if first is not None:
            raise first

    def port(self, job=None):
        """The coordinator port of `job`: one per job, as a launcher picks one per run.
        Thread-safe: the ranks of one job attach from several threads at once."""
        job = job or self.job
        with self._ports_lock:
            if job not in self._ports:
                self._ports[job] = free_port()
            return self._ports[job]

    def env(self, rank, job=None):
        """The environment a launcher (torchrun/zerorun) gives rank `rank`."""
        e = {"RANK": str(rank), "WORLD_SIZE": str(self.world), "LOCAL_RANK": str(rank),
             "ZEROD_SOCKET": self.daemons[rank].socket, "ZEROD_JOB": job or self.job}
        if self.world > 1:
            e.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.port(job))})
        return e

    def run(self, fn, args=(), job=None, timeout=300):
        """fn(*args) on every rank with the rank's environment; returns [result per rank]."""
        if self.world == 1:
            saved = {k: os.environ.get(k) for k in self.env(0, job)}
            os.environ.update(self.env(0, job))
            for k in ("MASTER_ADDR", "MASTER_PORT"):
                saved.setdefault(k, os.environ.get(k))
                os.environ.pop(k, None)
            try:
                return [fn(*args)]
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        procs = []
        outs = [os.path.join(self.tmp, "result%d.pt" % r) for r in range(self.world)]
        for r in range(self.world):
            p = ctx.Process(target=_rank_main, args=(fn, args, self.env(r, job), outs[r]))
            p.start()
            procs.append(p)
        deadline = time.monotonic() + timeout
        for r, p in enumerate(procs):
            p.join(max(1.0, deadline - time.monotonic()))
            if p.is_alive():
                for q in procs:
                    if q.is_alive():
                        q.kill()
                raise AssertionError("rank %d did not finish within %d s" % (r, timeout))
        import torch
        results = []
        for r, p in enumerate(procs):
            if p.exitcode != 0:
                raise AssertionError("rank %d exited with %s" % (r, p.exitcode))
            results.append(torch.load(outs[r]))
        return results


def _rank_main(fn, args, env, out):
    os.environ.update(env)
    import torch
    torch.save(fn(*args), out)


def require_world(world):
    """Skip (exit 77) when zerod refuses `world` ranks; probes with a tiny job on `world`
    daemons, every rank attaching at once (a mesh forms only when all ranks arrive)."""
    if world == 1:
        return
    import zerod
    with Cluster(world, job="probe-world", allowed_errors=r".") as c:
        errors = [None] * world
        sessions = [None] * world

        def attach(r):
            try:
                s = zerod.Session(c.daemons[r].socket, timeout_ms=30000)
                sessions[r] = s
                s.attach("probe-world", [([16], None)], "{}", zerod.DTYPE_F32, r, world,
                         "127.0.0.1:%d" % c.port())
            except zerod.ZerodError as e:
                errors[r] = e

        threads = [threading.Thread(target=attach, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r, s in enumerate(sessions):
            if s is None:
                continue
            if errors[r] is None:
                try:
                    s.detach(True)
                except zerod.ZerodError:
                    pass
            s.close()
    refused = [e for e in errors if e is not None]
    if refused:
        e = refused[0]
        if e.name in ("ERR_UNSUPPORTED",):
            skip("world %d: zerod refuses it for now (%s)" % (world, e))
        raise AssertionError("world %d probe failed: %s" % (world, e))


def parse_world(argv=None):
    """--world N from the command line (default 1)."""
    argv = sys.argv[1:] if argv is None else argv
    world = 1
    for i, a in enumerate(argv):
        if a == "--world" and i + 1 < len(argv):
            world = int(argv[i + 1])
        elif a.startswith("--world="):
            world = int(a.split("=", 1)[1])
    return world
