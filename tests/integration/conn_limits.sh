#!/usr/bin/env bash
# No number of clients exhausts the daemon (issue "nothing a client does can kill or wedge
# zerod"): one uid may hold at most 256 connections, and all connections together at most
# 512 MiB of frame buffers; past either limit a connection is refused with ERR_LIMIT naming
# it, the daemon's memory stays bounded, and it answers and serves a trainer afterwards.
#   conn_limits.sh ZEROD ZEROCTL TRAIN_MLP RUNDIR
set -euo pipefail
zerod=$1 zeroctl=$2 train=$3 rundir=$4
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
# shellcheck source-path=SCRIPTDIR source=daemon_mem.sh
. "$here/daemon_mem.sh"
sock="$rundir/zerod.sock"
# Under a sanitizer the daemon's RSS also counts shadow memory (TSan) or freed blocks held in
# quarantine (ASan): the refusals still prove the limits, the RSS figures are only printed.
check_rss=1
if zd_sanitized; then
    check_rss=0
fi
zd_ctl_start "$zerod" "$rundir" --frame-timeout 30s --max-shard-bytes 64MiB

# 300 connections of one uid: those past 256 are refused naming the limit
/usr/bin/python3 - "$sock" <<'EOF' || fail "connection limit"
import socket, struct, sys, time
path = sys.argv[1]
conns = []
for _ in range(300):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    conns.append(s)
time.sleep(0.5)
refused = 0
for s in conns:
    s.setblocking(False)
    try:
        data = s.recv(4096)
    except BlockingIOError:
        continue
    if b"too many connections from uid" in data:
        refused += 1
print(f"300 connections of one uid: {refused} refused (limit 256)")
sys.exit(0 if refused == 300 - 256 else 1)
EOF

# 48 connections each sending 15 of a frame's 16 MiB: the buffers stop at 512 MiB in all
rss_before=$(zd_kib "$pid" VmRSS)
/usr/bin/python3 - "$sock" "$pid" "$check_rss" <<'EOF' || fail "buffer budget"
import socket, struct, sys, time
path, pid, check_rss = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
chunk = b"\0" * (1 << 20)
conns, refused = [], 0
for _ in range(48):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.settimeout(5)
    try:
        s.sendall(struct.pack("<I", 16 << 20))
        for _ in range(15):
            s.sendall(chunk)
    except (BrokenPipeError, ConnectionResetError, socket.timeout):
        pass
    conns.append(s)
time.sleep(0.5)
for s in conns:
    s.setblocking(False)
    try:
        data = s.recv(4096)
    except (BlockingIOError, ConnectionResetError):
        continue
    if b"frame buffers of all connections are full" in data:
        refused += 1
rss = int([l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1])
print(f"48 connections x 15 MiB of a 16 MiB frame: {refused} refused, daemon VmRSS {rss >> 10} MiB")
ok = refused >= 48 - 512 // 16 and (rss < 700 * 1024 or not check_rss)
for s in conns:
    s.close()
sys.exit(0 if ok else 1)
EOF
[ ! -f "$rundir/rc" ] || fail "zerod died (exit $(cat "$rundir/rc"))"
"$zeroctl" -s "$sock" status >/dev/null || fail "zeroctl status does not answer"
ZEROD_SOCKET=$sock ZEROD_JOB=conn_limits "$train" --steps 3 >"$rundir/train.out" 2>&1 ||
    { cat "$rundir/train.out"; fail "a trainer cannot train after the limits were hit"; }
rss_back() {
    rss_after=$(zd_kib "$pid" VmRSS)
    [ "$rss_after" -lt $((rss_before + 65536)) ]
}
zd_poll 5 rss_back || true
echo "daemon VmRSS: $((rss_before >> 10)) MiB before, $((rss_after >> 10)) MiB after the buffers were freed"
if [ "$check_rss" = 1 ]; then
    [ "$rss_after" -lt $((rss_before + 65536)) ] || fail "the frame buffers were not given back"
else
    echo "(a sanitizer build: RSS not checked)"
fi
zd_ctl_stop
echo "PASS"
