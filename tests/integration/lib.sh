# shellcheck shell=bash
# Sourced by the integration scripts: what they all do the same way. Every wait is bounded.
# Safe under `set -e` and without it.
#
# Failing and leaving:
#   fail MSG...         "FAIL: MSG" ("FAIL (ZD_CASE): MSG" while the script sets zd_case) on
#                       stderr, then the script's on_fail hook if it defines one (logs to show),
#                       then exit 1
#   zd_show_logs LINES FILE...
#                       "--- FILE" and its last LINES lines (as tail -n takes them: +1 is all)
#                       for each FILE that exists, on stderr
#   Sourcing this file sets an EXIT trap, zd_exit: the script's cleanup function if it defines
#   one, then the daemon zd_ctl_start started (stopped quietly unless zd_ctl_stop did), then
#   the work directory of zd_workdir (removed, or kept and named when the script failed).
#
# Waiting:
#   zd_poll SECONDS CMD...
#                       CMD every 0.1 s until it succeeds; status 1 if it never did
#   zd_wait_for_line FILE REGEX SECONDS
#                       fails unless a line of FILE matches REGEX (grep -E) within SECONDS
#   zd_wait_pid PID SECONDS WHAT
#                       waits for PID (a child of this shell) and sets rc to its exit code;
#                       fails "WHAT still running after SECONDS s"
#
# Commands:
#   zd_expect_rc RC CMD...
#                       runs CMD (stdin /dev/null) with its stdout in $zd_outdir/out and its
#                       stderr in $zd_outdir/err; fails "'CMD' exited X, expected RC" unless
#                       it exits RC (on_fail may show those files)
#
# Things to start with:
#   zd_workdir NAME     a new directory /tmp/zd-NAME-XXXXXX in $work (see zd_exit)
#   zd_token FILE       a new 64-hex-digit token file of mode 0600
#   zd_free_port        a TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral
#                       range (which UCX's own TCP listeners draw from)
#
# Daemons a script runs itself:
#   zd_spawn OUT LOG CMD...
#                       CMD in the background (stdin /dev/null, stdout to OUT, stderr to LOG),
#                       its pid in zd_pid. OUT and LOG are removed first: the child truncates
#                       them only once it runs, and an earlier daemon's READY must not be read.
#   zd_wait_ready PID OUT WHAT
#                       until OUT has zerod's READY line; status 1 when PID exits first, fails
#                       "WHAT not ready within 10 s"
#   zd_stop PID WHAT [SECONDS]
#                       SIGTERM, then exit 0 within SECONDS (10); fails "WHAT died before it
#                       was stopped (exit RC)", "WHAT ignored SIGTERM for SECONDS s" or "WHAT
#                       exited RC after SIGTERM"
#   zd_kill_all PID...  SIGKILL to each (gone or empty ones are fine)
#
# One daemon through daemon_ctl.sh (RUNDIR/zerod.sock, zerod.log, pid, rc):
#   zd_ctl_start ZEROD RUNDIR [FLAGS...]
#                       starts it, its pid in pid; fails when it does not start. ZD_PRIVATE_ENV
#                       names the script's own ZEROD_* variables, which the daemon does not get
#                       (it warns about those it does not know).
#   zd_ctl_stop         daemon_ctl.sh stop: exit 0, the socket removed, no ERROR in the log

zd_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ZD_CTL="$zd_lib_dir/daemon_ctl.sh"
zd_case=
zd_ctl_rundir=
zd_work=
zd_outdir=

fail() {
    echo "FAIL${zd_case:+ ($zd_case)}: $*" >&2
    if declare -F on_fail >/dev/null; then
        on_fail >&2
    fi
    exit 1
}

zd_show_logs() {
    local lines=$1 f
    shift
    for f in "$@"; do
        if [ -f "$f" ]; then
            echo "--- $f"
            tail -n "$lines" "$f"
        fi
    done >&2
}

zd_exit() {
    local rc=$?
    if declare -F cleanup >/dev/null; then
        cleanup
    fi
    if [ -n "$zd_ctl_rundir" ]; then
        "$ZD_CTL" stop "$zd_ctl_rundir" >/dev/null 2>&1 || true
    fi
    if [ -n "$zd_work" ]; then
        if [ "$rc" = 0 ] || [ "$rc" = 77 ]; then
            rm -rf "$zd_work"
        else
            echo "logs kept in $zd_work" >&2
        fi
    fi
}
trap zd_exit EXIT

zd_poll() {
    local n=$(($1 * 10))
    shift
    while [ "$n" -gt 0 ]; do
        if "$@"; then
            return 0
        fi
        sleep 0.1
        n=$((n - 1))
    done
    return 1
}

zd_wait_for_line() {
    zd_poll "$3" grep -qsE -- "$2" "$1" || fail "no line matching '$2' in $1 within $3 s"
}

zd_gone() {
    ! kill -0 "$1" 2>/dev/null
}

zd_wait_pid() {
    zd_poll "$2" zd_gone "$1" || fail "$3 still running after $2 s"
    rc=0
    wait "$1" || rc=$?
}

zd_expect_rc() {
    local want=$1 got=0
    shift
    "$@" >"$zd_outdir/out" 2>"$zd_outdir/err" </dev/null || got=$?
    [ "$got" = "$want" ] || fail "'$*' exited $got, expected $want"
}

zd_workdir() {
    zd_work=$(mktemp -d "/tmp/zd-$1-XXXXXX")
    # shellcheck disable=SC2034 # the sourcing script's
    work=$zd_work
}

zd_token() {
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"
    chmod 600 "$1"
}

zd_free_port() {
    /usr/bin/python3 -c '
import random, socket
for _ in range(256):  # p and p + 1: rank 0 daemon listens on MASTER_PORT + 1
    p = random.randrange(20000, 32767)
    try:
        for q in (p, p + 1):
            with socket.socket() as s:
                s.bind(("127.0.0.1", q))
    except OSError:
        continue
    print(p)
    break'
}

zd_spawn() {
    local out=$1 log=$2
    shift 2
    rm -f "$out" "$log"
    "$@" >"$out" 2>"$log" </dev/null &
    # shellcheck disable=SC2034 # the sourcing script's
    zd_pid=$!
}

zd_ready() {
    grep -q '^READY' "$1" 2>/dev/null
}

zd_wait_ready() {
    local n=100
    while [ "$n" -gt 0 ]; do
        if zd_ready "$2"; then
            return 0
        fi
        if zd_gone "$1"; then
            return 1
        fi
        sleep 0.1
        n=$((n - 1))
    done
    fail "$3 not ready within 10 s"
}

zd_stop() {
    local p=$1 what=$2 limit=${3:-10} src=0
    if zd_gone "$p"; then
        wait "$p" || src=$?
        fail "$what died before it was stopped (exit $src)"
    fi
    kill -TERM "$p"
    zd_poll "$limit" zd_gone "$p" || fail "$what ignored SIGTERM for $limit s"
    wait "$p" || src=$?
    [ "$src" = 0 ] || fail "$what exited $src after SIGTERM"
}

zd_kill_all() {
    local p
    for p in "$@"; do
        if [ -n "$p" ]; then
            kill -KILL "$p" 2>/dev/null || true
        fi
    done
}

zd_ctl_start() {
    local zerod=$1 v
    local drop=()
    zd_ctl_rundir=$2
    shift 2
    for v in ${ZD_PRIVATE_ENV:-}; do
        drop+=(-u "$v")
    done
    env "${drop[@]}" "$ZD_CTL" start "$zerod" "$zd_ctl_rundir" "$@" || fail "zerod did not start"
    # shellcheck disable=SC2034 # the sourcing script's
    pid=$(cat "$zd_ctl_rundir/pid")
}

zd_ctl_stop() {
    local rundir=$zd_ctl_rundir
    zd_ctl_rundir=
    "$ZD_CTL" stop "$rundir"
}
