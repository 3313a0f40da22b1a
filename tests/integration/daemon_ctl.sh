#!/usr/bin/env bash
# CTest fixture: start / stop one zerod for a group of integration tests.
#   daemon_ctl.sh start ZEROD RUNDIR [zerod flags...]
#   daemon_ctl.sh stop RUNDIR [expected-error-regex]
# The daemon's stdout/stderr go to RUNDIR/zerod.log (never to ctest's pipes), its exit code
# to RUNDIR/rc. `stop` sends SIGTERM, waits (bounded) for exit 0 and the socket's removal, and
# fails on any ERROR line in the log.
set -euo pipefail
cmd=$1
shift
case "$cmd" in
start)
    zerod=$1 rundir=$2
    shift 2
    rm -rf "$rundir"
    mkdir -p "$rundir"
    sock="$rundir/zerod.sock"
    # subshell keeps the exit code; setsid detaches it from ctest's process group
    # shellcheck disable=SC2016 # expanded by that bash
    setsid bash -c '"$@" >"$0/zerod.log" 2>&1 </dev/null & echo $! >"$0/pid"; wait $!; echo $? >"$0/rc"' \
        "$rundir" "$zerod" --socket "$sock" --device cpu "$@" >/dev/null 2>&1 </dev/null &
    for _ in $(seq 1 100); do
        if grep -q '^READY ' "$rundir/zerod.log" 2>/dev/null; then
            echo "zerod ready on $sock (pid $(cat "$rundir/pid"))"
            exit 0
        fi
        if [ -f "$rundir/rc" ]; then
            echo "zerod exited with $(cat "$rundir/rc") before it was ready:" >&2
            cat "$rundir/zerod.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "zerod not ready within 10 s:" >&2
    cat "$rundir/zerod.log" >&2
    exit 1
    ;;
stop)
    rundir=$1
    allowed=${2:-}
    pid=$(cat "$rundir/pid" 2>/dev/null || true)
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null || true
    fi
    for _ in $(seq 1 100); do
        [ -f "$rundir/rc" ] && break
        sleep 0.1
    done
    if [ ! -f "$rundir/rc" ]; then
        echo "zerod did not exit within 10 s of SIGTERM" >&2
        kill -KILL "$pid" 2>/dev/null || true
        exit 1
    fi
    rc=$(cat "$rundir/rc")
    status=0
    if [ "$rc" != 0 ]; then
        echo "zerod exited with $rc after SIGTERM" >&2
        status=1
    fi
    if [ -e "$rundir/zerod.sock" ]; then
        echo "zerod left its socket behind" >&2
        status=1
    fi
    errors=$(grep ' ERROR ' "$rundir/zerod.log" || true)
    if [ -n "$allowed" ] && [ -n "$errors" ]; then
        errors=$(printf '%s\n' "$errors" | grep -Ev -- "$allowed" || true)
    fi
    if [ -n "$errors" ]; then
        echo "unexpected ERROR lines in the daemon log:" >&2
        printf '%s\n' "$errors" >&2
        status=1
    fi
    echo "zerod stopped (rc $rc); log: $rundir/zerod.log ($(wc -l <"$rundir/zerod.log") lines)"
    exit $status
    ;;
*)
    echo "usage: daemon_ctl.sh start ZEROD RUNDIR [flags] | stop RUNDIR" >&2
    exit 2
    ;;
esac
