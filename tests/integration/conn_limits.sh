#!/usr/bin/env bash
# No number of clients exhausts the daemon, nor locks a uid out of its own tools (issue 41;
# docs/design-notes.md "Nothing a client can do kills the daemon"): per uid, at most 32
# connections that have not sent their Hello, 256 of the trainer role and 64 of the control
# role; past a cap the uid's oldest idle one of the kind is closed with ERR_LIMIT naming the cap
# and the uid, so `zeroctl status` and a trainer of that uid still get in. All connections
# together hold at most 512 MiB of frame buffers; the daemon's memory stays bounded, and it
# answers and serves a trainer afterwards. A Hello that came while the loop was held past
# frame_timeout is read before the deadline is judged.
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
cleanup() {
    rm -f "$rundir/held"
}
zd_ctl_start "$zerod" "$rundir" --frame-timeout 30s --max-shard-bytes 64MiB

# 300 connections of one uid that never send their Hello, then 300 that send a trainer's Hello
# and nothing more (conn_hold.py), each kind held open while `zeroctl status` and a trainer of
# that uid run.
for kind in half-open idle-trainer; do
    rm -f "$rundir/held"
    /usr/bin/python3 "$here/conn_hold.py" "$sock" $kind "$rundir/held" >"$rundir/$kind.out" 2>&1 &
    holder=$!
    zd_poll 20 test -f "$rundir/held" || { cat "$rundir/$kind.out"; fail "$kind: no connections"; }
    "$zeroctl" -s "$sock" status >/dev/null ||
        fail "$kind: zeroctl status of the same uid does not answer"
    ZEROD_SOCKET=$sock ZEROD_JOB=conn_limits "$train" --steps 2 >"$rundir/train.out" 2>&1 ||
        { cat "$rundir/train.out"; fail "$kind: a trainer of the same uid cannot train"; }
    rm -f "$rundir/held"
    zd_wait_pid "$holder" 10 "the $kind connections"
    cat "$rundir/$kind.out"
    [ "$rc" = 0 ] || fail "$kind: not exactly the oldest past the cap were closed"
    echo "$kind: zeroctl status and a trainer of the same uid got in"
done

# 48 connections each sending 15 of a frame's 16 MiB: the buffers stop at 512 MiB in all
rss_before=$(zd_kib "$pid" VmRSS)
PYTHONPATH=$here /usr/bin/python3 - "$sock" "$pid" "$check_rss" <<'EOF' || fail "buffer budget"
import socket, struct, sys, time
from conn_hold import hello
path, pid, check_rss = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
chunk = b"\0" * (1 << 20)
conns, refused = [], 0
for _ in range(48):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.settimeout(5)
    try:
        s.sendall(hello(1))  # a trainer: past 32 unnamed ones the oldest would be closed
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

# A loop held past frame_timeout just after it accepted a connection (ZEROD_TEST_PAUSE=accept,
# as a long callback on a loaded machine would): the Hello that came meanwhile is read, not
# timed out as "no Hello within frame_timeout".
ZEROD_TEST_PAUSE=accept:1500 zd_ctl_start "$zerod" "$rundir/held-loop" --frame-timeout 1000ms
for i in 1 2; do
    "$zeroctl" -s "$rundir/held-loop/zerod.sock" status >"$rundir/held-loop/status.out" 2>&1 ||
        { cat "$rundir/held-loop/status.out"; fail "status $i behind a loop held 1.5 s failed"; }
done
grep -q "ZEROD_TEST_PAUSE: accept paused" "$rundir/held-loop/zerod.log" ||
    fail "the loop was never held (ZEROD_TEST_PAUSE=accept)"
echo "a Hello that came while the loop was held past frame_timeout was answered"
zd_ctl_stop
echo "PASS"
