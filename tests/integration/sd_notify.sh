#!/usr/bin/env bash
# The sd_notify protocol without systemd (daemon/src/server/sdnotify.c): the test binds its own
# NOTIFY_SOCKET (a Unix datagram socket, as systemd's) and starts zerod with WATCHDOG_USEC.
#   1. a job: READY=1, then STATUS= naming the job (training, lingering), WATCHDOG=1 every
#      ~200 ms (half of 400 ms) and never 400 ms apart, STOPPING=1 at SIGTERM.
#   2. a step stalled 4 s (ZEROD_TEST_PAUSE) with a peer deadline of 2.1 s: the pings go on while
#      the step may still be waiting for a peer, stop beyond it (one ERROR says why), and a
#      SIGTERM during the stall gets EXTEND_TIMEOUT_USEC= while the engine still counts as
#      making progress.
#   sd_notify.sh ZEROD TRAIN_MLP HAVE_SYSTEMD
set -euo pipefail
zerod=$1 train=$2 have_systemd=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
py=/usr/bin/python3

if [ "$have_systemd" != 1 ]; then
    echo "SKIP: zerod was built without libsystemd: it sends no sd_notify messages"
    exit 77
fi
zd_workdir sd_notify
listener=
trainer=
cleanup() {
    zd_kill_all "$listener" "$trainer" "${zd_pid:-}"
}
on_fail() {
    zd_show_logs +1 "$work/d.log" "$work/notify.log" "$work/train.out"
}

# listen LOG: messages to $work/notify.sock, one JSON line each in LOG ({"t": monotonic s,
# "m": text}); the listener gives up after 60 s.
listen() {
    rm -f "$work/notify.sock"
    "$py" - "$work/notify.sock" "$1" <<'EOF' &
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
end = time.monotonic() + 60
with open(sys.argv[2], "w") as log:
    while time.monotonic() < end:
        s.settimeout(max(0.01, end - time.monotonic()))
        try:
            m = s.recv(4096).decode()
        except socket.timeout:
            break
        log.write(json.dumps({"t": time.monotonic(), "m": m}) + "\n")
        log.flush()
EOF
    listener=$!
    zd_poll 5 test -S "$work/notify.sock" || fail "the listener did not bind $work/notify.sock"
}

stop_listener() {
    sleep 0.3 # the last datagrams
    kill "$listener" 2>/dev/null || true
    wait "$listener" 2>/dev/null || true
    listener=
}

# start_daemon FLAGS...: zerod with the notify socket, a 400 ms watchdog (WATCHDOG_PID unset:
# sd_watchdog_enabled then takes the variable as this process's) and the variables of
# extra_env
extra_env=()
start_daemon() {
    zd_spawn "$work/d.out" "$work/d.log" env NOTIFY_SOCKET="$work/notify.sock" \
        WATCHDOG_USEC=400000 "${extra_env[@]}" "$zerod" --socket "$work/zerod.sock" --device cpu \
        "$@"
    zd_wait_ready "$zd_pid" "$work/d.out" zerod || fail "zerod exited before it was ready"
}

# ---- 1. a job's life ----
listen "$work/notify1.log"
start_daemon
ZEROD_SOCKET="$work/zerod.sock" ZEROD_JOB=sdjob "$train" --steps 3 --keep \
    >"$work/train.out" 2>&1 </dev/null || fail "train_mlp failed"
sleep 2 # a lingering job, an idle engine: the pings go on
zd_stop "$zd_pid" zerod
stop_listener
cp "$work/notify1.log" "$work/notify.log"
"$py" - "$work/notify1.log" <<'EOF' || fail "the notify messages of a job's life"
import json, sys
msgs = [json.loads(l) for l in open(sys.argv[1])]
def fail(what):
    for m in msgs:
        print("%.3f %r" % (m["t"], m["m"]), file=sys.stderr)
    sys.exit("FAIL: " + what)
lines = [(m["t"], l) for m in msgs for l in m["m"].split("\n")]
ready = [t for t, l in lines if l == "READY=1"]
stopping = [t for t, l in lines if l == "STOPPING=1"]
status = [l[7:] for t, l in lines if l.startswith("STATUS=")]
pings = [t for t, l in lines if l == "WATCHDOG=1"]
if len(ready) != 1 or lines[0][1] != "READY=1":
    fail("READY=1 must come once, first")
if len(stopping) != 1:
    fail("STOPPING=1 must come once")
for want in ("job sdjob step", "training", "job sdjob step 3 lingering",
             "stopping: ending job sdjob at step 3"):
    if not any(want in s for s in status):
        fail("no STATUS= with %r in %r" % (want, status))
pings = [t for t in pings if ready[0] <= t <= stopping[0]]
gaps = sorted(b - a for a, b in zip(pings, pings[1:]))
if len(gaps) < 8:
    fail("only %d WATCHDOG=1 in %.1f s" % (len(pings), stopping[0] - ready[0]))
median = gaps[len(gaps) // 2]
if not 0.15 <= median <= 0.3 or gaps[-1] >= 0.4:
    fail("WATCHDOG=1 every %.3f s (median), at most %.3f s apart: want ~0.2 s, never 0.4 s"
         % (median, gaps[-1]))
print("job's life: %d STATUS, %d WATCHDOG=1 (median gap %.3f s, max %.3f s)"
      % (len(status), len(pings), median, gaps[-1]))
EOF

# ---- 2. a stalled step ----
# peer deadline = max(mesh_timeout 2 s, collective_timeout 0.1 s) + heartbeat_timeout 0.1 s
listen "$work/notify2.log"
extra_env=(ZEROD_TEST_PAUSE=step:4000)
start_daemon --mesh-timeout 2s --collective-timeout 100ms --heartbeat-interval 10ms \
    --heartbeat-timeout 100ms
ZEROD_SOCKET="$work/zerod.sock" ZEROD_JOB=sdstall "$train" --steps 1 \
    >"$work/train.out" 2>&1 </dev/null &
trainer=$!
zd_wait_for_line "$work/d.log" "ZEROD_TEST_PAUSE: step of step 1 " 20
sleep 0.5
kill -TERM "$zd_pid" # stops after the stalled step
zd_poll 15 zd_gone "$zd_pid" || fail "zerod still running 15 s after SIGTERM"
"$py" -c 'import time; print(time.monotonic())' >"$work/gone" # the listener's clock
src=0
wait "$zd_pid" || src=$?
[ "$src" = 0 ] || fail "zerod exited $src after SIGTERM"
zd_wait_pid "$trainer" 10 train_mlp
trainer=
stop_listener
cp "$work/notify2.log" "$work/notify.log"
grep -q "watchdog: the engine shows no progress: a step for " "$work/d.log" ||
    fail "no ERROR line saying why the pings stopped"
"$py" - "$work/notify2.log" "$(cat "$work/gone")" <<'EOF' || fail "the notify messages of a stalled step"
import json, sys
msgs = [json.loads(l) for l in open(sys.argv[1])]
def fail(what):
    for m in msgs:
        print("%.3f %r" % (m["t"], m["m"]), file=sys.stderr)
    sys.exit("FAIL: " + what)
lines = [(m["t"], l) for m in msgs for l in m["m"].split("\n")]
pings = [t for t, l in lines if l == "WATCHDOG=1"]
stop = [t for t, l in lines if l == "STOPPING=1"]
extend = [t for t, l in lines if l.startswith("EXTEND_TIMEOUT_USEC=")]
if len(stop) != 1:
    fail("STOPPING=1 must come once")
# the daemon may end right after the stall: its exit closes the last gap
gone = float(sys.argv[2])
gaps = [(b - a, a) for a, b in zip(pings, pings[1:] + [gone])]
long_gaps = [(g, a) for g, a in gaps if g >= 0.4]
if len(long_gaps) != 1 or long_gaps[0][0] < 1.0:
    fail("want one pause of the pings of at least 1 s, got gaps %r"
         % [round(g, 3) for g, _ in long_gaps])
gap, since = long_gaps[0]
# before the gap the stalled step (begun ~0.5 s before STOPPING) was still within its peer
# deadline: pings went on for >= 1 s of it
if since - (stop[0] - 0.5) < 1.0:
    fail("the pings stopped %.3f s into the stall, before its peer deadline"
         % (since - (stop[0] - 0.5)))
# while the step still counts as making progress: after STOPPING=1, up to the last ping; none
# while the pings pause (the step's end and the teardown may send more)
early = [t for t in extend if stop[0] <= t <= since + 0.5]
stalled = [t for t in extend if since + 0.5 < t < since + gap - 0.05]
if not early or stalled:
    fail("EXTEND_TIMEOUT_USEC= must come after STOPPING=1 while the step still counts as "
         "making progress (until %.3f), never during the pause: %r" % (since, extend))
if gone - stop[0] < 3.0:
    fail("zerod stopped %.3f s after SIGTERM: it should have finished the stalled step first"
         % (gone - stop[0]))
print("stalled step: pings paused %.3f s, %d EXTEND_TIMEOUT_USEC" % (gap, len(extend)))
EOF
echo "sd_notify: OK"
