#!/usr/bin/env bash
# Leak check (issue "nothing a client, a peer or a newcomer does can kill or wedge zerod"):
# CYCLES times a trainer attaches the same job (re-attaching it after the first), does some
# work and is killed with SIGKILL at a varied point; then a last trainer re-attaches, finishes,
# and must end with exactly the parameters of an uninterrupted run. The daemon's fds, shared
# memory and malloc'd bytes must then be exactly what they were before the cycles, and its
# RSS within two pages of it. Every figure is printed.
#   leak_check.sh ZEROD TRAIN_MLP ZEROCTL LIVE_FUZZ RUNDIR [CYCLES]
# CYCLES defaults to 200. ZEROD_LEAK_SEED replays the choice of kill points (printed);
# ZEROD_LEAK_KINDS="timer" (say) uses only these kinds after the first cycle.
#
# Kill points, by cycle (the first one is always a --die-at, so that the job has its initial
# parameters before any other kind of kill):
#   die-at  train_mlp --die-at STEP:B kills itself in step STEP after B bucket submissions
#           (B = 0: before the first; 2: both sent, Step not yet)
#   syscall strace kills it on entering its Nth sendto or recvmsg: between any two frames,
#           after a request and before its reply, ... (skipped without a usable strace)
#   timer   kill -9 from here after 0..5 ms (a whole cycle takes a few): anywhere, in the
#           middle of a computation too
# Memory (daemon_mem.sh says why): the daemon runs with glibc's malloc thresholds fixed and
# its tcache off, so "in use" counts exactly the bytes its allocations hold.
set -euo pipefail
zerod=$1 train=$2 zeroctl=$3 fuzz=$4 rundir=$5
cycles=${6:-200}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
# shellcheck source-path=SCRIPTDIR source=daemon_mem.sh
. "$here/daemon_mem.sh"
sock="$rundir/zerod.sock"
export ZEROD_SOCKET="$sock"
seed=${ZEROD_LEAK_SEED:-$(((RANDOM << 15) | RANDOM))}
RANDOM=$seed
RSS_TOL_KIB=8 # two pages
MAX_ADVANCE=3 # steps a cycle's trainer may complete before it is killed
final=$((cycles * MAX_ADVANCE + 10))

case "$cycles" in
'' | *[!0-9]* | 0) fail "CYCLES '$cycles' is not a positive number" ;;
esac
have_strace=0
if command -v strace >/dev/null 2>&1 &&
    strace -f -o /dev/null -e trace=none true >/dev/null 2>&1; then
    have_strace=1
fi

# (the daemon warns about ZEROD_* variables it does not know: this script's stay here)
GLIBC_TUNABLES=$ZD_MALLOC_TUNABLES ZD_PRIVATE_ENV="ZEROD_LEAK_SEED ZEROD_LEAK_KINDS" \
    zd_ctl_start "$zerod" "$rundir" --job-linger 60s --max-shard-bytes 256MiB

alive() { [ ! -f "$rundir/rc" ] && kill -0 "$pid" 2>/dev/null; }
status_json() { "$zeroctl" -s "$sock" --json status 2>/dev/null || true; }

# Wait until the daemon has let go of the trainer (the next attach would be busy); prints the
# job's step ("-" without a job).
released() {
    local s
    for _ in $(seq 1 500); do
        alive || fail "zerod died (exit $(cat "$rundir/rc" 2>/dev/null || echo '?'))"
        s=$(status_json)
        if [[ $s =~ \"has_job\":[[:space:]]*false ]]; then
            echo -
            return 0
        fi
        if [[ $s =~ \"trainer_attached\":[[:space:]]*false ]] &&
            [[ $s =~ \"step\":[[:space:]]*([0-9]+) ]]; then
            echo "${BASH_REMATCH[1]}"
            return 0
        fi
        sleep 0.01
    done
    fail "the daemon still holds a killed trainer after 5 s"
}

# One cycle on job $1: a trainer killed by $2 (die-at|syscall|timer). Sets $how to what
# happened: killed, or finished (the kill point came after its last step; --keep leaves the
# job lingering all the same).
how=
cycle() {
    local job=$1 kind=$2 step rc=0 out="$rundir/cycle.out"
    step=$(released)
    [ "$step" = - ] && step=0
    local steps=$((step + MAX_ADVANCE))
    case "$kind" in
    die-at)
        { ZEROD_JOB=$job "$train" --steps "$steps" --keep \
            --die-at "$((step + 1 + RANDOM % MAX_ADVANCE)):$((RANDOM % 3))" >"$out" 2>&1; } \
            2>/dev/null || rc=$?
        ;;
    syscall)
        local call=sendto
        [ $((RANDOM % 2)) = 0 ] && call=recvmsg
        # LeakSanitizer cannot run under ptrace (a trainer that finishes would abort at its
        # exit check); the daemon, not the traced trainer, is what this test checks for leaks
        { ZEROD_JOB=$job ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
            strace -f -o /dev/null -e trace=$call \
            -e inject=$call:signal=KILL:when=$((1 + RANDOM % 12)) \
            "$train" --steps "$steps" --keep >"$out" 2>&1; } 2>/dev/null || rc=$?
        ;;
    timer)
        ZEROD_JOB=$job "$train" --steps "$steps" --keep >"$out" 2>&1 &
        local tpid=$!
        sleep "$(printf '0.%03d' $((RANDOM % 6)))"
        kill -KILL "$tpid" 2>/dev/null || true
        { wait "$tpid"; } 2>/dev/null || rc=$?
        ;;
    esac
    case "$rc" in
    137) how=killed ;;
    0) how=finished ;;
    *)
        cat "$out" >&2
        fail "cycle on job '$job' ($kind): the trainer exited $rc"
        ;;
    esac
}

# Reference: the same training, uninterrupted, as another job that ends.
ZEROD_JOB=leak_ref "$train" --steps "$final" --dump "$rundir/ref.dump" >"$rundir/ref.out" 2>&1 ||
    { cat "$rundir/ref.out"; fail "the uninterrupted run failed"; }

# Warm-up: one cycle of each kind on a job of its own, which then finishes and ends.
cycle leak_warm die-at
[ "$have_strace" = 1 ] && cycle leak_warm syscall
cycle leak_warm timer
released >/dev/null
ZEROD_JOB=leak_warm "$train" --steps $((MAX_ADVANCE * 4)) >"$rundir/warm.out" 2>&1 ||
    { cat "$rundir/warm.out"; fail "the warm-up job did not finish"; }
[ "$(released)" = - ] || fail "the warm-up job did not end"
# A killed trainer's connection and the next one's (and zeroctl's) may overlap in the daemon:
# 32 at once take libuv's table of watched fds past that high-water mark now.
"$fuzz" --socket "$sock" --hold 32 >/dev/null || fail "zerod did not answer 32 connections at once"
# A trainer gone while the daemon sends its AttachReply: that sendmsg fails with EPIPE and is
# logged with its errno text (the first strerror() and the deepest stack of the loop thread).
"$fuzz" --socket "$sock" --vanish 2 >/dev/null || fail "the vanished trainers' job did not end"

zd_wait_idle "$pid" "$zeroctl" "$sock" || fail "the daemon is not idle after the warm-up"
# Status twice: what the first one touches in the daemon is then part of the baseline, not
# of the cycles.
zd_mem_baseline "$pid" "$zeroctl" "$sock" "$rundir"

# The cycles.
kinds=(die-at timer)
[ "$have_strace" = 1 ] && kinds=(die-at syscall timer)
[ "$have_strace" = 1 ] || echo "no usable strace: kill points from --die-at and a timer only"
if [ -n "${ZEROD_LEAK_KINDS:-}" ]; then # e.g. "timer syscall", to tell which kind leaks
    read -r -a kinds <<<"$ZEROD_LEAK_KINDS"
fi
echo "$cycles cycles on job 'leak', kill points drawn from seed $seed (ZEROD_LEAK_SEED)"
declare -A count=()
killed=0 finished=0 t0=$SECONDS
for i in $(seq 1 "$cycles"); do
    kind=die-at
    [ "$i" -gt 1 ] && kind=${kinds[$((RANDOM % ${#kinds[@]}))]}
    cycle leak "$kind"
    count[$kind]=$((${count[$kind]:-0} + 1))
    if [ "$how" = killed ]; then
        killed=$((killed + 1))
    else
        finished=$((finished + 1))
    fi
done
at=$(released)
echo "cycles: $killed killed (die-at ${count[die-at]:-0}, syscall ${count[syscall]:-0}," \
    "timer ${count[timer]:-0}), $finished finished before their kill point;" \
    "job at step $at after $((SECONDS - t0)) s"
[ "$at" != - ] || fail "the job 'leak' is gone after the cycles"

# The last trainer re-attaches, finishes and ends the job.
ZEROD_JOB=leak "$train" --steps "$final" --dump "$rundir/final.dump" >"$rundir/final.out" 2>&1 ||
    { cat "$rundir/final.out"; fail "the last trainer failed"; }
grep -q "step $at (resumed)$" "$rundir/final.out" || fail "the last trainer did not resume at step $at"
grep -q "^step $final " "$rundir/final.out" || fail "the last trainer did not reach step $final"
cmp -s "$rundir/ref.dump" "$rundir/final.dump" || {
    diff "$rundir/ref.dump" "$rundir/final.dump" | head -n 10 >&2
    fail "after $cycles kills the parameters differ from the uninterrupted run's"
}
echo "final: resumed at step $at, trained to $final: $(wc -l <"$rundir/final.dump") parameters" \
    "bit-identical to the uninterrupted run"
[ "$(released)" = - ] || fail "the job did not end with its last trainer"
zd_wait_idle "$pid" "$zeroctl" "$sock" || echo "the daemon is not idle 15 s after the last trainer"

zd_mem_compare "$pid" "$zeroctl" "$sock" "$rundir" "the $cycles cycles" "$RSS_TOL_KIB" || exit 1
zd_ctl_stop
echo "PASS"
