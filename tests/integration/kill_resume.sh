#!/usr/bin/env bash
# A trainer killed with SIGKILL in the middle of a step re-attaches and finishes with exactly
# the parameters of an uninterrupted run (docs/design-notes.md "trainer dies mid-step"); then SIGTERM
# stops the daemon cleanly even while a job lingers.
#   kill_resume.sh ZEROD TRAIN_MLP RUNDIR
set -euo pipefail
zerod=$1 train=$2 rundir=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
export ZEROD_SOCKET="$rundir/zerod.sock"

# job_linger 30 s: the killed trainer's job must survive until the re-attach.
zd_ctl_start "$zerod" "$rundir" --job-linger 30s --max-shard-bytes 256MiB

# Run A, first life: SIGKILL during step 5 after the first of its 3 buckets went out.
set +e
ZEROD_JOB=resume_a "$train" --steps 12 --die-at 5:1 >"$rundir/a1.out" 2>&1
rc=$?
set -e
cat "$rundir/a1.out"
[ "$rc" = 137 ] || fail "run A should die by SIGKILL (exit 137), exited $rc"
grep -q '^dying at step 5 after 1 buckets$' "$rundir/a1.out" || fail "run A did not reach its kill point"
grep -q '^step 4 ' "$rundir/a1.out" || fail "run A did not complete step 4"
if grep -q '^step 5 ' "$rundir/a1.out"; then
    fail "run A completed step 5, which it should have died in"
fi

# The daemon dropped the partial step and keeps the job.
zd_poll 5 grep -q "trainer of job 'resume_a' disconnected at step 4; partial micro-step dropped" \
    "$rundir/zerod.log" || fail "daemon log does not show the dropped partial step"

# Run A, second life, as a launcher restarts it (TORCHELASTIC_RESTART_COUNT=1; with --resume
# auto a plain re-run would replace the job, docs/design-notes.md "A job's life"): resumes at
# step 4 and trains to 12.
ZEROD_JOB=resume_a TORCHELASTIC_RESTART_COUNT=1 "$train" --resume auto --steps 12 \
    --dump "$rundir/a.dump" >"$rundir/a2.out" 2>&1 ||
    { cat "$rundir/a2.out"; fail "resumed run A failed"; }
cat "$rundir/a2.out"
grep -q 'step 4 (resumed)$' "$rundir/a2.out" || fail "run A did not resume at step 4"
[ "$(grep -c '^step ' "$rundir/a2.out")" = 8 ] || fail "resumed run A should run steps 5..12"
grep -q '^step 12 ' "$rundir/a2.out" || fail "resumed run A did not reach step 12"

# Run B: the same training, uninterrupted, as a different job; --keep leaves it lingering.
ZEROD_JOB=resume_b "$train" --steps 12 --keep --dump "$rundir/b.dump" >"$rundir/b.out" 2>&1 ||
    { cat "$rundir/b.out"; fail "run B failed"; }
if grep -q '(resumed)' "$rundir/b.out"; then
    fail "run B is a fresh job, yet it resumed"
fi
[ "$(grep -c '^step ' "$rundir/b.out")" = 12 ] || fail "run B should run 12 steps"

[ "$(wc -l <"$rundir/a.dump")" = 676 ] || fail "a.dump has $(wc -l <"$rundir/a.dump") lines, not 676"
cmp "$rundir/a.dump" "$rundir/b.dump" || {
    diff "$rundir/a.dump" "$rundir/b.dump" | head -20 >&2
    fail "the resumed run's parameters differ from the uninterrupted run's"
}
echo "resumed run == uninterrupted run: 676 parameters bit-identical"

# SIGTERM with job resume_b lingering: exit 0 at once, socket removed.
kill -TERM "$pid"
zd_poll 10 test -f "$rundir/rc" || fail "zerod did not exit within 10 s of SIGTERM"
[ "$(cat "$rundir/rc")" = 0 ] || fail "zerod exited $(cat "$rundir/rc") after SIGTERM"
[ ! -e "$ZEROD_SOCKET" ] || fail "zerod left its socket $ZEROD_SOCKET behind"
grep -q "job 'resume_b' ends (daemon stopped)" "$rundir/zerod.log" ||
    fail "the lingering job was not dropped at shutdown"
# daemon_ctl.sh stop: checks rc, socket and the log's ERROR lines once more.
zd_ctl_stop
echo "PASS"
