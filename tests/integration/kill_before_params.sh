#!/usr/bin/env bash
# A trainer killed (SIGKILL) after the AttachReply of a fresh job and before its ParamsReady
# leaves a job without parameters. The next trainer of that job must be able to start it:
# attach, write the initial values, ParamsReady, and train exactly like an uninterrupted run.
# (The leak check's "kill at a varied point", at the one point it cannot use: every later
# attach of the job would otherwise be refused steps until job_linger passes.)
#   kill_before_params.sh ZEROD TRAIN_MLP ZEROCTL RUNDIR
# strace kills train_mlp on entering its third sendto (Hello, Attach, then ParamsReady); the
# daemon's shard of the job must then be all zeros (no parameters loaded). Skips (77) without
# a strace that can trace here.
set -euo pipefail
zerod=$1 train=$2 zeroctl=$3 rundir=$4
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
export ZEROD_SOCKET="$rundir/zerod.sock"

if ! command -v strace >/dev/null 2>&1 || ! strace -f -o /dev/null -e trace=none true >/dev/null 2>&1; then
    echo "SKIP: no strace that can trace here (it places the kill between Attach and ParamsReady)"
    exit 77
fi

zd_ctl_start "$zerod" "$rundir" --job-linger 60s --max-shard-bytes 256MiB

# The uninterrupted run, as another job.
ZEROD_JOB=kbp_ref "$train" --steps 12 --dump "$rundir/ref.dump" >"$rundir/ref.out" 2>&1 ||
    { cat "$rundir/ref.out"; fail "the uninterrupted run failed"; }

# First life: attached, killed before ParamsReady.
rc=0
{ ZEROD_JOB=kbp strace -f -o /dev/null -e trace=sendto -e inject=sendto:signal=KILL:when=3 \
    "$train" --steps 12 --dump "$rundir/first.dump" >"$rundir/first.out" 2>&1; } 2>/dev/null || rc=$?
[ "$rc" = 137 ] || { cat "$rundir/first.out"; fail "the first trainer exited $rc, not 137 (SIGKILL)"; }
"$zeroctl" --json shard >"$rundir/shard.json" 2>&1 || { cat "$rundir/shard.json"; fail "no job after the kill"; }
grep -q '"job_id":[[:space:]]*"kbp"' "$rundir/shard.json" || fail "the daemon does not hold job kbp"
grep -q '"master_sumsq":[[:space:]]*0[,}[:space:]]' "$rundir/shard.json" ||
    fail "the job has parameters: the kill came after ParamsReady (libzc's sends changed?)"
echo "first trainer killed after Attach, before ParamsReady: job kbp held without parameters"

# Second life: must initialize the job and train it like the uninterrupted run.
rc=0
ZEROD_JOB=kbp "$train" --steps 12 --dump "$rundir/second.dump" >"$rundir/second.out" 2>&1 || rc=$?
cat "$rundir/second.out"
[ "$rc" = 0 ] || fail "the next trainer of the job failed (exit $rc): a job without parameters" \
    "that a re-attach cannot start"
[ "$(grep -c '^step ' "$rundir/second.out")" = 12 ] || fail "the next trainer did not run 12 steps"
cmp -s "$rundir/ref.dump" "$rundir/second.dump" ||
    fail "the next trainer's parameters differ from the uninterrupted run's"
echo "next trainer: 12 steps, $(wc -l <"$rundir/second.dump") parameters bit-identical to the uninterrupted run"

zd_ctl_stop
echo "PASS"
