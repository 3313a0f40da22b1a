#!/usr/bin/env bash
# A stopped daemon does not freeze its trainer (issue 41; docs/design-notes.md "Faults"): while
# a request is in progress the daemon sends StillWorking every heartbeat_interval, and libzc
# fails a wait that hears nothing for heartbeat_timeout, however long the request may take.
# Every step here pauses 3 s (ZEROD_TEST_PAUSE), past heartbeat_timeout (2 s): the trainer
# steps through them on keepalives alone. SIGSTOP of the daemon in the middle of a step fails
# the trainer's call with ERR_PEER_LOST naming the socket within heartbeat_timeout + slack;
# after SIGCONT the daemon keeps the job as after any trainer disconnect, and a re-attach
# continues it.
#   keepalive.sh ZEROD TRAIN_MLP RUNDIR
set -euo pipefail
zerod=$1 train=$2 rundir=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
export ZEROD_SOCKET="$rundir/zerod.sock"
hb_interval=0.5 hb_timeout=2
slack=2.5 # the loop's tick, poll rounding and a loaded 2-core host

on_fail() {
    zd_show_logs 20 "$rundir/zerod.log" "$rundir/a.out" "$rundir/b.out"
}
cleanup() {
    if [ -n "${pid:-}" ]; then
        kill -CONT "$pid" 2>/dev/null || true
    fi
    if [ -n "${tpid:-}" ]; then
        kill -KILL "$tpid" 2>/dev/null || true
    fi
}

ZEROD_TEST_PAUSE=step:3000 zd_ctl_start "$zerod" "$rundir" --job-linger 60s \
    --heartbeat-interval ${hb_interval}s --heartbeat-timeout ${hb_timeout}s

ZEROD_JOB=keepalive "$train" --steps 1000 >"$rundir/a.out" 2>&1 &
tpid=$!
zd_wait_for_line "$rundir/a.out" "^step 1 " 20
echo "a 3 s step under heartbeat_timeout ${hb_timeout} s: the trainer waited it out"

# in the middle of step 2's pause
paused() { [ "$(grep -c "ZEROD_TEST_PAUSE: step of step" "$rundir/zerod.log")" -ge 2 ]; }
zd_poll 10 paused || fail "the daemon did not reach step 2's pause"
sleep 0.5
kill -STOP "$pid"
t0=$(date +%s.%N)
zd_wait_pid "$tpid" 15 "the trainer of the stopped daemon"
elapsed=$(echo "$(date +%s.%N) - $t0" | bc)
tpid=
cat "$rundir/a.out"
[ "$rc" = 1 ] || fail "the trainer exited $rc, expected 1 (a failed step)"
grep -q "ERR_PEER_LOST" "$rundir/a.out" || fail "the trainer's error is not ERR_PEER_LOST"
grep -qF "daemon at $ZEROD_SOCKET sent nothing for ${hb_timeout}.0 s" "$rundir/a.out" ||
    fail "the error does not name the socket and how long it was silent"
echo "daemon stopped in a step: the trainer failed after ${elapsed} s" \
    "(heartbeat_timeout ${hb_timeout} s, limit +${slack} s)"
# silence counts from the last keepalive, up to an interval before the stop
low=$(echo "$hb_timeout - $hb_interval - 0.1" | bc)
(($(echo "$elapsed >= $low && $elapsed < $hb_timeout + $slack" | bc))) ||
    fail "the trainer failed after ${elapsed} s"

# SIGCONT: the daemon finishes the step it was in, sees the trainer gone and keeps the job
kill -CONT "$pid"
zd_wait_for_line "$rundir/zerod.log" \
    "trainer of job 'keepalive' disconnected at step [0-9]+.*keeping the job" 10
step=$(grep -oE "trainer of job 'keepalive' disconnected at step [0-9]+" "$rundir/zerod.log" |
    grep -oE "[0-9]+$")
ZEROD_JOB=keepalive TORCHELASTIC_RESTART_COUNT=1 "$train" --resume must --steps $((step + 1)) \
    >"$rundir/b.out" 2>&1 || fail "the re-attach failed"
grep -q "step $step (resumed)$" "$rundir/b.out" || fail "the re-attach did not resume at step $step"
grep -q "^step $((step + 1)) " "$rundir/b.out" || fail "the re-attach did not step on"
echo "after SIGCONT: the job was kept at step $step and a re-attach stepped on"
[ ! -f "$rundir/rc" ] || fail "zerod died (exit $(cat "$rundir/rc"))"
zd_ctl_stop
echo "PASS"
