"""Hosts for the Python tests: network namespaces on one switch, a zerod inside one, and a
zd_fixture.Cluster with one host per rank.

    hosts = Hosts(3)
    why = hosts.create()          # None, or why namespaces cannot be made here (skip on it)
    ...
    hosts.close()                 # on every exit: removes whatever create() made

Host k is namespace hosts.ns[k] with address hosts.addr[k] (10.77.0.k+1/24) on its interface
hosts.ifname[k]; each host's interface is one end of a veth pair whose other end is a port of a
bridge in a namespace of its own (the switch), so any number of hosts reach one another. Needs
root and iproute2's `ip`. `ip netns exec NS CMD` execs CMD: a process started through
exec_prefix(k) keeps its pid, so killing it kills the program.
"""
import os
import shutil
import signal
import subprocess

import zd_fixture as zf

SUBNET = "10.77.0.%d"


def ip_bin():
    return shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.access(p, os.X_OK)), None)


class Hosts:
    """`n` network namespaces on one bridge; removed by close() whatever was made."""

    def __init__(self, n):
        pid = os.getpid()
        self.n = n
        self.ip = ip_bin()
        self.ns = ["zdh%d-%d" % (k, pid) for k in range(n)]
        self.switch = "zdsw-%d" % pid
        self.ifname = ["zdeth%d" % k for k in range(n)]  # each in its own namespace
        self.addr = [SUBNET % (k + 1) for k in range(n)]
        self.made = []

    def run(self, *args, check=True):
        # not a sanitizer build's preloaded runtime (it is for libzc): LeakSanitizer would
        # report ip's own allocations at its exit and fail it
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS",
                            "TSAN_OPTIONS")}
        out = subprocess.run([self.ip] + list(args), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=20, env=env)
        if check and out.returncode != 0:
            raise AssertionError("ip %s: %s" % (" ".join(args), out.stdout.strip()))
        return out

    def create(self):
        """Returns None, or why namespaces cannot be made here (a reason to skip)."""
        what = "%d hosts need network namespaces" % self.n
        if os.geteuid() != 0:
            return "%s: not root" % what
        if self.ip is None:
            return "%s: no 'ip' (iproute2)" % what
        out = self.run("netns", "add", self.switch, check=False)
        if out.returncode != 0:
            return "%s: ip netns add: %s" % (what, out.stdout.strip())
        self.made.append(self.switch)
        out = self.run("-n", self.switch, "link", "add", "br0", "type", "bridge", check=False)
        if out.returncode != 0:
            return "%s and a bridge: ip link add: %s" % (what, out.stdout.strip())
        self.run("-n", self.switch, "link", "set", "br0", "up")
        for k in range(self.n):
            self.run("netns", "add", self.ns[k])
            self.made.append(self.ns[k])
            port = "p%d" % k
            out = self.run("-n", self.switch, "link", "add", port, "type", "veth", "peer",
                           "name", self.ifname[k], "netns", self.ns[k], check=False)
            if out.returncode != 0:
                return "%s and veth pairs: ip link add: %s" % (what, out.stdout.strip())
            self.run("-n", self.switch, "link", "set", port, "master", "br0")
            self.run("-n", self.switch, "link", "set", port, "up")
            self.run("-n", self.ns[k], "addr", "add", self.addr[k] + "/24", "dev", self.ifname[k])
            self.run("-n", self.ns[k], "link", "set", "lo", "up")
            self.run("-n", self.ns[k], "link", "set", self.ifname[k], "up")
        return None

    def exec_prefix(self, k):
        return [self.ip, "netns", "exec", self.ns[k]]

    def pids(self, k):
        """Every process in host k's namespace."""
        out = self.run("netns", "pids", self.ns[k])
        return [int(p) for p in out.stdout.split()]

    def kill_all(self, k):
        """SIGKILL every process of host k: the host is lost. Returns the pids killed."""
        pids = self.pids(k)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def close(self):
        for n in reversed(self.made):  # a namespace takes its ends of the veth pairs with it
            try:
                self.run("netns", "del", n, check=False)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.made = []


class NsDaemon(zf.Daemon):
    """zf.Daemon started inside host k's namespace (same pid as a plain one)."""

    def __init__(self, hosts, k, rundir, flags, allowed_errors=None, device="cpu"):
        super().__init__(rundir, flags, allowed_errors, device=device)
        self.prefix = hosts.exec_prefix(k)

    def start(self, timeout=10.0):
        os.makedirs(self.rundir, exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ZEROD_") or k.startswith("ZEROD_LOG_")}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.prefix + [zf.zerod_bin(), "--socket", self.socket, "--device", self.device]
                + self.flags, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True)
        return self.wait_ready(timeout)


class NsCluster(zf.Cluster):
    """zf.Cluster with rank r's daemon on host r of `hosts` (made by the caller): the
    coordinator is host 0's address, and prefix(r) runs a trainer on host r."""

    def __init__(self, hosts, world, flags, allowed_errors=None, job="pytest-job"):
        super().__init__(world, flags=flags, job=job, allowed_errors=allowed_errors)
        self.hosts = hosts
        self.daemons = [NsDaemon(hosts, r, d.rundir, d.flags, d.allowed_errors)
                        for r, d in enumerate(self.daemons)]

    def env(self, rank, job=None):
        e = super().env(rank, job)
        e["MASTER_ADDR"] = self.hosts.addr[0]
        return e

    def prefix(self, rank):
        return self.hosts.exec_prefix(rank)
