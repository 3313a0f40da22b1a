#!/usr/bin/env bash
# zerorun, the local launcher: a real job with a private zerod, the first failure named and the
# others stopped, the torchrun-like environment, SIGINT stopping everything, nothing left.
#   test_zerorun.sh CASE ZERORUN ZEROD TRAIN_MLP
#   CASE: usage | train | failure | env | sigint | term_grace | daemon_killed
# Every process this test starts carries a unique marker in its command line (the trainers
# literally, the daemons through --socket-dir), so pgrep never sees another test's processes.
set -euo pipefail
case_=$1 zerorun=$2 zerod=$3 train=$4
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zerorun-test.XXXXXX")
mark="zrtest$$x$RANDOM"
unset ZEROD_SOCKET_DIR ZEROD_SOCKET ZEROD_JOB

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
zd_case=$case_
zd_outdir=$tmp # zd_expect_rc's out and err
on_fail() {
    zd_show_logs +1 "$tmp/out" "$tmp/err"
}
cleanup() {
    pkill -KILL -f "$mark" 2>/dev/null || true
    pkill -KILL -f "$tmp/" 2>/dev/null || true
    rm -rf "$tmp"
}

# no_leftovers: no process of ours runs (trainers by marker, daemons by directory).
none_left() {
    left=$(pgrep -af -- "$mark|$tmp/" | grep -v pgrep || true)
    [ -z "$left" ]
}
no_leftovers() {
    zd_poll 2 none_left || fail "processes left behind: $left"
}

# daemons_running: both private daemons of a 2-rank zerorun run
daemons_running() {
    [ "$(pgrep -fc -- "$tmp/zerorun-.*/zerod-cpu")" = 2 ]
}

now_ms() {
    echo $(($(date +%s%N) / 1000000))
}

case "$case_" in
usage)
    zd_expect_rc 0 "$zerorun" --help
    grep -q -- '--spawn-daemons' "$tmp/out" || fail "--help does not document --spawn-daemons"
    grep -q 'TORCHELASTIC_RUN_ID' "$tmp/out" || fail "--help does not document the environment"
    zd_expect_rc 0 "$zerorun" --version
    grep -q '^zerorun ' "$tmp/out" || fail "--version prints no version"
    zd_expect_rc 2 "$zerorun" -- true
    grep -q -- '--nproc' "$tmp/err" || fail "missing --nproc not named"
    zd_expect_rc 2 "$zerorun" --nproc 0 -- true
    grep -q "'0'" "$tmp/err" || fail "bad --nproc value not named"
    zd_expect_rc 2 "$zerorun" --nproc 1
    zd_expect_rc 2 "$zerorun" --nproc 1 --frobnicate -- true
    zd_expect_rc 2 "$zerorun" --nproc 1 --timeout -1 -- true
    zd_expect_rc 2 "$zerorun" --nproc 1 --master-port 70000 -- true
    zd_expect_rc 2 "$zerorun" --nproc 1 --daemon "$tmp/no-such-zerod" -- true
    zd_expect_rc 2 "$zerorun" --nproc 1 --device gpu -- true
    grep -q "not cpu, cuda or auto" "$tmp/err" || fail "bad --device value not named"
    if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then # no GPU: cuda is refused, auto is the CPU
        zd_expect_rc 2 "$zerorun" --nproc 1 --device cuda -- true
        grep -q "need a GPU each" "$tmp/err" || fail "--device cuda without a GPU not explained"
        zd_expect_rc 0 "$zerorun" --nproc 1 -- sh -c 'echo "$ZEROD_SOCKET"'
        grep -q "zerod-cpu0.sock" "$tmp/out" || fail "--device auto without a GPU is not the CPU"
    fi
    ;;
train)
    # (1) a real job on a private daemon, then (5) no daemon left and the directory removed
    zd_expect_rc 0 "$zerorun" --nproc 1 --spawn-daemons --daemon "$zerod" --socket-dir "$tmp" \
        -- "$train" --steps 5
    grep -q '^\[rank 0\] step 5 ' "$tmp/out" || fail "no '[rank 0] step 5' line"
    grep -q '^\[rank 0\] attached job zerorun-' "$tmp/out" || fail "default job id not used"
    no_leftovers
    [ -z "$(find "$tmp" -mindepth 1 -maxdepth 1 ! -name out ! -name err)" ] ||
        fail "private directory left: $(ls "$tmp")"
    # without --daemon: found next to zerorun's build tree (../daemon/zerod)
    zd_expect_rc 0 "$zerorun" --nproc 1 --spawn-daemons --socket-dir "$tmp" -- "$train" --steps 2
    grep -q '^\[rank 0\] step 2 ' "$tmp/out" || fail "no '[rank 0] step 2' line (default zerod)"
    no_leftovers
    # a daemon that cannot start: named with its log, everything stopped, the logs kept
    zd_expect_rc 1 "$zerorun" --nproc 2 --spawn-daemons --daemon /bin/false --socket-dir "$tmp" \
        -- sh -c ": $mark"
    grep -q 'zerod for rank [01] .*exited with code 1 before it was ready' "$tmp/err" ||
        fail "failed daemon not reported"
    grep -q 'daemon logs kept in' "$tmp/err" || fail "log directory not printed"
    no_leftovers
    ;;
failure)
    # (2) rank 1 fails with code 3: named, rank 0 (sleeping) stopped at once, exit 1
    t0=$(now_ms)
    zd_expect_rc 1 "$zerorun" --nproc 2 -- sh -c "[ \"\$RANK\" = 1 ] && exit 3; sleep 5; : $mark"
    t1=$(now_ms)
    grep -q '^zerorun: rank 1 exited with code 3$' "$tmp/err" || fail "failure not named"
    [ $((t1 - t0)) -lt 3000 ] || fail "took $((t1 - t0)) ms to stop the job"
    no_leftovers
    # a signal is named too
    zd_expect_rc 1 "$zerorun" --nproc 1 -- sh -c "kill -SEGV \$\$; : $mark"
    grep -q '^zerorun: rank 0 killed by signal 11' "$tmp/err" || fail "signal not named"
    # a command that does not exist: 127, with the reason under the rank prefix
    zd_expect_rc 1 "$zerorun" --nproc 1 -- "$tmp/no-such-trainer"
    grep -q '^\[rank 0\] zerorun: cannot execute' "$tmp/err" || fail "exec error not shown"
    grep -q '^zerorun: rank 0 exited with code 127$' "$tmp/err" || fail "127 not named"
    ;;
term_grace)
    # a trainer that ignores SIGTERM is killed after the grace period; its children too
    t0=$(now_ms)
    # (rank 1 fails only once rank 0 ignores SIGTERM: else rank 0 may die of it before its trap)
    zd_expect_rc 1 "$zerorun" --nproc 2 -- \
        sh -c "trap '' TERM; if [ \"\$RANK\" = 1 ]; then
                   while [ ! -e $tmp/trapped ]; do sleep 0.05; done; exit 4
               fi; touch $tmp/trapped; sleep 60; : $mark"
    t1=$(now_ms)
    grep -q 'rank 1 exited with code 4' "$tmp/err" || fail "failure not named"
    grep -q 'rank 0 .* still runs .* after SIGTERM; killing it' "$tmp/err" || fail "no SIGKILL"
    [ $((t1 - t0)) -lt 15000 ] || fail "took $((t1 - t0)) ms"
    no_leftovers
    ;;
env)
    unset OMP_NUM_THREADS PYTHON PYTHONUNBUFFERED
    # (3) the torchrun environment, one line per rank, prefixed
    # shellcheck disable=SC2016 # expanded by the ranks' sh
    show='echo $RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT $ZEROD_JOB $ZEROD_SOCKET'
    zd_expect_rc 0 "$zerorun" --nproc 2 -- sh -c "$show"
    for r in 0 1; do
        grep -Eq "^\[rank $r\] $r 2 $r 127\.0\.0\.1 [0-9]+ zerorun-[0-9]+-[0-9]+ /run/zerod/zerod-cpu$r\.sock$" \
            "$tmp/out" || fail "rank $r environment wrong"
    done
    [ "$(cut -d' ' -f7,8 "$tmp/out" | sort -u | wc -l)" = 1 ] || fail "ranks differ in port/job"
    zd_expect_rc 0 "$zerorun" --nproc 2 --master-addr 127.0.0.2 --master-port 29555 --job j7 \
        --socket-dir /srv/zd -- sh -c "$show; echo to-stderr >&2; printf no-newline"
    grep -q '^\[rank 1\] 1 2 1 127\.0\.0\.2 29555 j7 /srv/zd/zerod-cpu1\.sock$' "$tmp/out" ||
        fail "explicit options not passed"
    grep -q '^\[rank 0\] to-stderr$' "$tmp/err" || fail "stderr not prefixed"
    grep -q '^\[rank 1\] no-newline$' "$tmp/out" || fail "last partial line lost"
    # shellcheck disable=SC2016 # expanded by the rank's sh
    ZEROD_SOCKET_DIR=/srv/zz zd_expect_rc 0 "$zerorun" --nproc 1 -- sh -c 'echo $ZEROD_SOCKET'
    grep -q '^\[rank 0\] /srv/zz/zerod-cpu0\.sock$' "$tmp/out" || fail "ZEROD_SOCKET_DIR ignored"
    # with daemons: ZEROD_SOCKET is the private daemon's socket
    # shellcheck disable=SC2016 # expanded by the rank's sh
    zd_expect_rc 0 "$zerorun" --nproc 1 --spawn-daemons --daemon "$zerod" --socket-dir "$tmp" \
        -- sh -c 'echo $ZEROD_SOCKET; test -S "$ZEROD_SOCKET"'
    grep -Eq "^\[rank 0\] $tmp/zerorun-[^/]+/zerod-cpu0\.sock$" "$tmp/out" ||
        fail "ZEROD_SOCKET is not the private daemon's"
    # torchrun's whole per-process environment of one node (each rank prints `env`), and
    # OMP_NUM_THREADS=1 with a notice when it is not set and there are several ranks
    zd_expect_rc 0 "$zerorun" --nproc 2 --master-port 29556 --job j8 -- env
    for r in 0 1; do
        for kv in RANK=$r LOCAL_RANK=$r ROLE_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 \
            ROLE_WORLD_SIZE=2 GROUP_RANK=0 GROUP_WORLD_SIZE=1 ROLE_NAME=default \
            MASTER_ADDR=127.0.0.1 MASTER_PORT=29556 TORCHELASTIC_RESTART_COUNT=0 \
            TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_RUN_ID=j8 \
            TORCHELASTIC_USE_AGENT_STORE=False ZEROD_JOB=j8 OMP_NUM_THREADS=1; do
            grep -Fqx "[rank $r] $kv" "$tmp/out" || fail "rank $r's environment has no $kv"
        done
    done
    grep -q '^zerorun: setting OMP_NUM_THREADS=1 for every rank' "$tmp/err" ||
        fail "no notice about OMP_NUM_THREADS"
    # shellcheck disable=SC2016 # expanded by the ranks' sh
    OMP_NUM_THREADS=3 zd_expect_rc 0 "$zerorun" --nproc 2 -- sh -c 'echo "omp=$OMP_NUM_THREADS"'
    [ "$(grep -c '^\[rank [01]\] omp=3$' "$tmp/out")" = 2 ] || fail "OMP_NUM_THREADS=3 not kept"
    if grep -q OMP_NUM_THREADS "$tmp/err"; then fail "a notice although OMP_NUM_THREADS is set"; fi
    # shellcheck disable=SC2016 # expanded by the rank's sh
    zd_expect_rc 0 "$zerorun" --nproc 1 -- sh -c 'echo "omp=${OMP_NUM_THREADS-unset}"'
    grep -q '^\[rank 0\] omp=unset$' "$tmp/out" || fail "OMP_NUM_THREADS set for one rank"
    # a CMD ending in .py runs with python3 from PATH, unbuffered (-u), as torchrun runs it
    printf '%s\n' 'import os, sys' 'unbuffered = int(sys.stdout.write_through)' \
        'print("py", unbuffered, os.environ["RANK"], *sys.argv[1:])' >"$tmp/show.py"
    zd_expect_rc 0 "$zerorun" --nproc 2 -- "$tmp/show.py" a "b c"
    for r in 0 1; do
        grep -Fqx "[rank $r] py 1 $r a b c" "$tmp/out" || fail "rank $r: not run by python3 -u"
    done
    # ... or with $PYTHON
    printf '#!/bin/sh\necho "via-PYTHON $*"\nexec python3 "$@"\n' >"$tmp/py"
    chmod +x "$tmp/py"
    PYTHON="$tmp/py" zd_expect_rc 0 "$zerorun" --nproc 1 -- "$tmp/show.py" x
    grep -Fqx "[rank 0] via-PYTHON -u $tmp/show.py x" "$tmp/out" || fail "\$PYTHON not used"
    grep -Fqx "[rank 0] py 1 0 x" "$tmp/out" || fail "$tmp/show.py not run through \$PYTHON"
    no_leftovers
    ;;
daemon_killed)
    # a rank's daemon killed with signal 9 while the job runs: reported as killed by signal 9
    # (not "after SIGTERM": zerorun never sent it one), the job stopped, exit 1, nothing left
    "$zerorun" --nproc 2 --spawn-daemons --daemon "$zerod" --socket-dir "$tmp" -- \
        "$train" --steps 100000 >"$tmp/out" 2>"$tmp/err" </dev/null &
    pid=$!
    zd_poll 20 grep -qs '^\[rank 1\] step 3 ' "$tmp/out" || fail "the job did not reach step 3"
    dpid=$(pgrep -f -- "$tmp/zerorun-.*/zerod-cpu1") || fail "rank 1's daemon not found"
    kill -KILL "$dpid"
    rc=0
    wait "$pid" || rc=$?
    [ "$rc" = 1 ] || fail "zerorun exited $rc, expected 1"
    grep -q "zerod for rank 1 (pid $dpid) killed by signal 9 (Killed)" "$tmp/err" ||
        fail "the killed daemon is not reported as killed by signal 9"
    if grep -q "zerod for rank 1 .*after SIGTERM" "$tmp/err"; then
        fail "the killed daemon is reported as if zerorun's SIGTERM had ended it"
    fi
    [ "$(grep -c "zerod for rank 1 " "$tmp/err")" = 1 ] || fail "rank 1's daemon reported twice"
    # rank 0's daemon was stopped with SIGTERM and must exit 0 (zerorun names it otherwise)
    if grep -q "zerod for rank 0 " "$tmp/err"; then
        fail "rank 0's daemon did not stop cleanly: $(grep "zerod for rank 0 " "$tmp/err")"
    fi
    grep "zerod for rank\|^zerorun: rank" "$tmp/err"
    no_leftovers
    ;;
sigint)
    # (4) SIGINT: trainers (and what they started), then daemons, stop; exit 130; nothing left.
    # zerorun runs as a background job of a script, where SIGINT starts out ignored.
    "$zerorun" --nproc 2 --spawn-daemons --daemon "$zerod" --socket-dir "$tmp" -- \
        sh -c "sh -c 'sleep 60; : $mark' & touch $tmp/started-\$RANK; sleep 60; : $mark" \
        >"$tmp/out" 2>"$tmp/err" </dev/null &
    pid=$!
    both_started() { [ -e "$tmp/started-0" ] && [ -e "$tmp/started-1" ]; }
    zd_poll 10 both_started || fail "job did not start"
    daemons_running || fail "daemons are not running"
    kill -INT "$pid"
    zd_poll 15 zd_gone "$pid" || fail "zerorun still runs 15 s after SIGINT"
    rc=0
    wait "$pid" || rc=$?
    [ "$rc" = 130 ] || fail "zerorun exited $rc after SIGINT, expected 130"
    grep -q 'SIGINT received' "$tmp/err" || fail "SIGINT not reported"
    # the daemons got SIGTERM and must exit 0 (zerorun names one that did not)
    if grep -q "zerod for rank" "$tmp/err"; then
        fail "a daemon did not stop cleanly: $(grep "zerod for rank" "$tmp/err")"
    fi
    no_leftovers
    # SIGTERM while the daemons start (this one never gets ready): 143, nothing left
    printf '#!/bin/sh\nsleep 60\n' >"$tmp/slow-zerod" # its sleep is killed with its group
    chmod +x "$tmp/slow-zerod"
    "$zerorun" --nproc 2 --spawn-daemons --daemon "$tmp/slow-zerod" --socket-dir "$tmp" -- \
        sh -c ": $mark" >"$tmp/out" 2>"$tmp/err" </dev/null &
    pid=$!
    zd_poll 10 daemons_running || fail "daemons did not start"
    kill -TERM "$pid"
    rc=0
    wait "$pid" || rc=$?
    [ "$rc" = 143 ] || fail "zerorun exited $rc after SIGTERM, expected 143"
    no_leftovers
    ;;
*)
    echo "usage: test_zerorun.sh usage|train|failure|term_grace|env|sigint|daemon_killed ZERORUN ZEROD TRAIN_MLP" >&2
    exit 2
    ;;
esac
echo "PASS ($case_)"
