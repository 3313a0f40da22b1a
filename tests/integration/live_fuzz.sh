#!/usr/bin/env bash
# Live-socket fuzz (issue "nothing a client, a peer or a newcomer does can kill or wedge
# zerod"): zd_live_fuzz sends random and mutated frames from many concurrent connections to a
# daemon this script starts; afterwards the daemon must never have died, must answer
# `zeroctl status`, must hold exactly its baseline fds and its baseline memory, must not let a
# client forge log lines, and must train a real model bit-identically to before the fuzz.
#   live_fuzz.sh ZEROD ZEROCTL TRAIN_MLP LIVE_FUZZ RUNDIR [SECONDS]
# SECONDS defaults to $ZEROD_FUZZ_SECONDS, else 120 (`make fuzz`; ctest passes a short run).
# ZEROD_FUZZ_SEED replays a run (the seed is printed; see live_fuzz.c for one connection).
#
# Memory (daemon_mem.sh says why): the daemon runs with glibc's malloc thresholds fixed and
# its tcache off. Then the bytes malloc has handed out must come back to the baseline
# exactly (as `zeroctl status` reports them), as must fds and shared memory (the jobs'
# regions); RssAnon may stay up to RSS_TOL_KIB (1 MiB) above it: heap fragmentation left by
# a chunk allocated near the top, up to ~0.6 MiB measured while "in use" stayed the same.
set -euo pipefail
zerod=$1 zeroctl=$2 train=$3 fuzz=$4 rundir=$5
seconds=${6:-${ZEROD_FUZZ_SECONDS:-120}}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
# shellcheck source-path=SCRIPTDIR source=daemon_mem.sh
. "$here/daemon_mem.sh"
sock="$rundir/zerod.sock"
export ZEROD_SOCKET="$sock"
RSS_TOL_KIB=${RSS_TOL_KIB:-1024}
WARMUP_SECONDS=5
FRAME_TIMEOUT_MS=1000

case "$seconds" in
'' | *[!0-9]*) fail "SECONDS '$seconds' is not a whole number of seconds" ;;
esac

# (the daemon warns about ZEROD_* variables it does not know: this script's stay here)
GLIBC_TUNABLES=$ZD_MALLOC_TUNABLES ZD_PRIVATE_ENV="ZEROD_FUZZ_SEED ZEROD_FUZZ_SECONDS" \
    zd_ctl_start "$zerod" "$rundir" --frame-timeout "${FRAME_TIMEOUT_MS}ms" \
    --max-shard-bytes 16MiB --job-linger 300ms

alive() { [ ! -f "$rundir/rc" ] && kill -0 "$pid" 2>/dev/null; }

# Idle: no job (the fuzz jobs linger 300 ms) and no connection open but the listening
# socket. Up to 15 s: a stalled connection is cut after frame_timeout.
idle() { zd_wait_idle "$pid" "$zeroctl" "$sock"; }

# The reference run of a well-behaved trainer, also part of the warm-up.
ZEROD_JOB=live_fuzz_probe "$train" --steps 20 --dump "$rundir/before.dump" >"$rundir/before.out" 2>&1 ||
    { cat "$rundir/before.out"; fail "train_mlp failed before the fuzz"; }

# Warm-up: the same kinds of traffic, so that the allocator's caches and the code pages the
# fuzz touches are in place before the baseline is taken.
# Its findings are the main run's to report; a daemon that dies in it fails here.
echo "warm-up: ${WARMUP_SECONDS} s of fuzz"
ZEROD_FUZZ_SEED=1 "$fuzz" --socket "$sock" --seconds "$WARMUP_SECONDS" \
    --frame-timeout-ms "$FRAME_TIMEOUT_MS" >"$rundir/warmup.out" 2>&1 || true
# ... and more connections at once than the fuzz ever holds (high-water marks, e.g. libuv's
# table of watched fds, belong in the baseline).
"$fuzz" --socket "$sock" --hold 100 >>"$rundir/warmup.out" 2>&1 || true
alive || { cat "$rundir/warmup.out"; fail "zerod died during the warm-up (exit $(cat "$rundir/rc"))"; }
idle || fail "the daemon is not idle 15 s after the warm-up:$(echo; ls -l "/proc/$pid/fd")"
zd_mem_baseline "$pid" "$zeroctl" "$sock" "$rundir"

# The fuzz.
echo "fuzz: $seconds s"
fuzz_rc=0
"$fuzz" --socket "$sock" --seconds "$seconds" --frame-timeout-ms "$FRAME_TIMEOUT_MS" \
    >"$rundir/fuzz.out" 2>&1 || fuzz_rc=$?
cat "$rundir/fuzz.out"

deaths=0
if ! alive; then
    deaths=1
    echo "daemon deaths: 1 (exit code $(cat "$rundir/rc" 2>/dev/null || echo '?'); last log lines:)" >&2
    tail -n 20 "$rundir/zerod.log" >&2
    fail "zerod died during the fuzz"
fi
echo "daemon deaths: $deaths"
status=0
if [ "$fuzz_rc" != 0 ]; then
    echo "FAIL: zd_live_fuzz found a problem (exit $fuzz_rc); see its FAIL lines above" >&2
    status=1
fi

"$zeroctl" -s "$sock" --timeout 5000 status >"$rundir/status.out" 2>&1 ||
    { cat "$rundir/status.out"; fail "zeroctl status does not answer after the fuzz"; }
echo "zeroctl status answers"

idle || echo "the daemon is not idle 15 s after the fuzz (a connection or a job kept?)"
zd_mem_compare "$pid" "$zeroctl" "$sock" "$rundir" "the fuzz" "$RSS_TOL_KIB" || status=1

# Every log line is one of the daemon's own: a client's bytes (job ids, versions) must not
# start a line of their own (a forged WARN/ERROR, or a `<0>` priority under journald).
forged=$(grep -a -c -v -E '^(READY |[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+ [^ ]+:[0-9]+:[0-9]+ (\[rank -?[0-9]+\] )?(TRACE|DEBUG|INFO|WARN|ERROR) [A-Za-z0-9_]+\.c:[0-9]+ )' \
    "$rundir/zerod.log" || true)
echo "daemon log: $(wc -l <"$rundir/zerod.log") lines, $forged not written by the daemon's logger"
if [ "$forged" != 0 ]; then
    echo "FAIL: client bytes start $forged lines of the daemon log, e.g.:" >&2
    grep -a -n -v -E '^(READY |[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+ [^ ]+:[0-9]+:[0-9]+ (\[rank -?[0-9]+\] )?(TRACE|DEBUG|INFO|WARN|ERROR) [A-Za-z0-9_]+\.c:[0-9]+ )' \
        "$rundir/zerod.log" | head -n 5 | cat -v >&2
    status=1
fi

# A well-behaved trainer still attaches, and trains exactly as before the fuzz.
ZEROD_JOB=live_fuzz_probe "$train" --steps 20 --dump "$rundir/after.dump" >"$rundir/after.out" 2>&1 ||
    { cat "$rundir/after.out"; fail "train_mlp failed after the fuzz"; }
[ "$(grep -c '^step ' "$rundir/after.out")" = 20 ] || fail "train_mlp did not run 20 steps after the fuzz"
cmp -s "$rundir/before.dump" "$rundir/after.dump" ||
    fail "train_mlp's parameters after the fuzz differ from those before it"
echo "train_mlp after the fuzz: 20 steps, $(wc -l <"$rundir/after.dump") parameters bit-identical to before"

# SIGTERM, whatever failed above: exit 0 (a sanitizer build's leak check at exit), socket
# removed, and no ERROR line in the log.
zd_ctl_stop || status=1
[ "$status" = 0 ] || exit 1
echo "PASS"
