#!/usr/bin/env bash
# One local client must not make zerod unresponsive (issue "nothing a client, a peer or a
# newcomer does can kill or wedge zerod"): while a trainer's Attach of a world-2 job waits
# for an unreachable coordinator (up to mesh_timeout), `zeroctl status` must still answer
# within 2 s. A client that repeats such attaches would otherwise keep the daemon deaf to
# status, and to every other client, for as long as it likes.
#   status_during_mesh.sh ZEROD TRAIN_MLP ZEROCTL RUNDIR
set -euo pipefail
zerod=$1 train=$2 zeroctl=$3 rundir=$4
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
MESH_TIMEOUT_S=10

tpid=
cleanup() {
    zd_kill_all "$tpid"
}

rm -rf "$rundir"
mkdir -p "$rundir"
zd_token "$rundir/token"
zd_ctl_start "$zerod" "$rundir/d" --token-file "$rundir/token" --mesh-timeout "${MESH_TIMEOUT_S}s"
sock="$rundir/d/zerod.sock"

# Rank 1 of a world-2 job whose coordinator (port 9, discard) never answers.
ZEROD_SOCKET=$sock ZEROD_JOB=status_during_mesh RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=9 "$train" --steps 1 >"$rundir/trainer.out" 2>&1 &
tpid=$!
sleep 1 # the engine has taken the Attach and retries the coordinator
kill -0 "$tpid" 2>/dev/null || { cat "$rundir/trainer.out"; fail "the trainer did not wait for its mesh"; }

t0=$(date +%s%N)
rc=0
"$zeroctl" -s "$sock" --timeout 2000 status >"$rundir/status.out" 2>&1 || rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
cat "$rundir/status.out"
echo "zeroctl status while a world-2 attach waits for its coordinator: exit $rc after $ms ms"
rc_t=0
wait "$tpid" || rc_t=$?
tpid=
echo "the trainer's attach ended with exit $rc_t: $(tail -n 1 "$rundir/trainer.out")"
[ "$rc" = 0 ] || fail "zeroctl status got no answer within 2 s while one client's attach waited" \
    "for its mesh (up to mesh_timeout = ${MESH_TIMEOUT_S} s): the engine serves nothing else"
zd_ctl_stop
echo "PASS"
