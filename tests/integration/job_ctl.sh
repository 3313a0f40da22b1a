#!/usr/bin/env bash
# `zeroctl job ls` and `zeroctl job end` on two daemons (docs/design-notes.md "A job's life"):
#   - ls, as a table and --json: every daemon of the directory, its job, state and step;
#   - end JOB asked of one daemon of a world-2 job whose mesh is up: the mesh tells the other,
#     and neither holds a job afterwards (zeroctl status);
#   - end JOB of a live world-2 job, both daemons asked: the trainers fail with ERR_JOB_ENDED
#     (or the mesh's word of it, ERR_PEER_LOST) at their next call; --checkpoint is refused
#     while they live, and the job goes on;
#   - end JOB --checkpoint DIR of a kept world-2 job (its mesh up) and of an orphaned one (its
#     trainers killed, its mesh down: the daemons form it again), each saved then ended;
#     `zeroctl checkpoint verify` accepts both;
#   - end --all; a job no daemon holds, and usage errors, exit as other zeroctl errors.
#   job_ctl.sh ZEROD MESH_TRAINER ZEROCTL
set -uo pipefail
zerod=$1 trainer=$2 zeroctl=$3
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
zd_workdir job_ctl
zd_outdir=$work
declare -a dpids=() tpids=()

cleanup() {
    zd_kill_all "${tpids[@]}" "${dpids[@]}"
}
on_fail() {
    zd_show_logs 25 "$work"/*.log "$work"/t*.out "$work/out" "$work/err"
}

zd_token "$work/token"
mkdir "$work/run"
for i in 0 1; do
    zd_spawn "$work/d$i.out" "$work/d$i.log" "$zerod" --socket "$work/run/z$i.sock" \
        --device "cpu:$i" --token-file "$work/token" --mesh-timeout 20s --job-linger 60s \
        --heartbeat-interval 500ms
    dpids[i]=$zd_pid
    zd_wait_ready "${dpids[$i]}" "$work/d$i.out" "daemon $i" || fail "daemon $i exited at start"
done

# train JOB WORLD [mesh_trainer args...]: rank i of JOB on daemon i, in the background
train() {
    local job=$1 world=$2 port
    shift 2
    port=$(zd_free_port)
    for ((i = 0; i < world; i++)); do
        env RANK=$i WORLD_SIZE="$world" ZEROD_SOCKET="$work/run/z$i.sock" \
            MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" ZEROD_JOB="$job" \
            "$trainer" "$@" >"$work/t$i.out" 2>&1 </dev/null &
        tpids[i]=$!
    done
}

# trainers_exit CODE: every trainer started by train exits CODE within 60 s
trainers_exit() {
    for i in "${!tpids[@]}"; do
        zd_wait_pid "${tpids[$i]}" 60 "trainer $i"
        [ "$rc" = "$1" ] || fail "trainer $i exited $rc, expected $1"
    done
    tpids=()
}

# no_job I: daemon I holds no job (zeroctl status)
no_job() {
    "$zeroctl" -s "$work/run/z$1.sock" --json status | grep -q '"has_job":[[:space:]]*false'
}
no_jobs() {
    no_job 0 && no_job 1
}
both_hanging() {
    grep -q "hanging in step 5" "$work/t0.out" && grep -q "hanging in step 5" "$work/t1.out"
}

ls_json() {
    zd_expect_rc 0 "$zeroctl" --json job ls --dir "$work/run"
    /usr/bin/python3 - "$work/out" "$@" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
want_job, want_state, want_step = sys.argv[2], sys.argv[3], int(sys.argv[4])
assert doc["schema_version"] == 1 and doc["command"] == "job ls", doc
assert len(doc["daemons"]) == 2, doc
for d in doc["daemons"]:
    j = d["job"]
    assert j["id"] == want_job and j["state"] == want_state and j["step"] == want_step, d
    assert j["world"] == 2 and j["rank"] == int(d["socket"][-6]), d
    assert j["age_s"] >= 0 and j["linger_left_s"] >= 0, d
EOF
}

# ---- ls, and end through the mesh: the job kept with its mesh up (--keep)
zd_case="ls"
train kept 2 --steps 3 --keep
trainers_exit 0
zd_expect_rc 0 "$zeroctl" job ls --dir "$work/run"
grep -qE "z0.sock +kept +0/2 +kept +3 " "$work/out" || fail "job ls table: $(cat "$work/out")"
grep -qE "z1.sock +kept +1/2 +kept +3 " "$work/out" || fail "job ls table: $(cat "$work/out")"
cat "$work/out"
ls_json kept kept 3 || fail "job ls --json: $(cat "$work/out")"

zd_case=end-via-mesh
zd_expect_rc 0 "$zeroctl" -s "$work/run/z0.sock" job end kept
grep -q "its other daemons told" "$work/out" || fail "end: $(cat "$work/out")"
cat "$work/out"
zd_poll 10 no_job 0 || fail "daemon 0 still holds a job"
zd_poll 10 no_job 1 || fail "daemon 1 did not end the job its peer ended"
zd_wait_for_line "$work/d1.log" "job 'kept' ends \(ended on a peer: job 'kept' was ended by an operator" 5

# ---- a kept job, its mesh up: the final checkpoint is saved over it
zd_case=end-kept-checkpoint
train kept2 2 --steps 2 --keep
trainers_exit 0
zd_expect_rc 0 "$zeroctl" job end kept2 --dir "$work/run" --checkpoint "$work/ckpt-kept"
grep -q "ended at step 2; final checkpoint $work/ckpt-kept/global_step2" "$work/out" ||
    fail "end --checkpoint of a kept job: $(cat "$work/out")"
zd_expect_rc 0 "$zeroctl" checkpoint verify "$work/ckpt-kept"
no_jobs || fail "a daemon still holds the kept job"

# ---- a live job: --checkpoint refused while its trainers live; then ended on both daemons
zd_case=end-live
train live 2 --steps 100000 --sleep-ms 20
zd_poll 30 grep -q "step 3 " "$work/t0.out" || fail "the live job did not step"
zd_expect_rc 1 "$zeroctl" job end live --dir "$work/run" --checkpoint "$work/ckpt-live"
grep -q "live trainers" "$work/err" || fail "checkpoint of a live job: $(cat "$work/err")"
zd_expect_rc 0 "$zeroctl" job end live --dir "$work/run"
cat "$work/out"
trainers_exit 4
grep -q "ERR_JOB_ENDED" "$work/t0.out" "$work/t1.out" || fail "no trainer was told ERR_JOB_ENDED"
grep -h "ERR_" "$work"/t*.out
no_jobs || fail "a daemon still holds the ended job"

# ---- an orphan (trainers killed mid-step 5, the mesh down): a final checkpoint, then the end
zd_case=end-checkpoint
train orphan 2 --steps 10 --hang-at 5
zd_poll 30 both_hanging || fail "the trainers did not both reach step 5"
zd_kill_all "${tpids[@]}"
tpids=()
for i in 0 1; do
    zd_wait_for_line "$work/d$i.log" "trainer of job 'orphan' disconnected at step 4" 10
done
zd_expect_rc 0 "$zeroctl" job ls --dir "$work/run"
grep -qE "z0.sock +orphan +0/2 +orphaned +4 " "$work/out" || fail "job ls: $(cat "$work/out")"
zd_expect_rc 0 "$zeroctl" --json job end orphan --dir "$work/run" --checkpoint "$work/ckpt"
cat "$work/out"
grep -q "\"checkpoint\":[[:space:]]*\"$work/ckpt/global_step4\"" "$work/out" || fail "no checkpoint path"
zd_expect_rc 0 "$zeroctl" checkpoint verify "$work/ckpt"
cat "$work/out"
no_jobs || fail "a daemon still holds the orphan"

# ---- --all, on two world-1 jobs
zd_case=end-all
for i in 0 1; do
    env RANK=0 WORLD_SIZE=1 ZEROD_SOCKET="$work/run/z$i.sock" ZEROD_JOB="solo$i" \
        "$trainer" --steps 2 --keep >"$work/t$i.out" 2>&1 </dev/null &
    tpids[i]=$!
done
trainers_exit 0
zd_expect_rc 0 "$zeroctl" job end --all --dir "$work/run"
for i in 0 1; do
    grep -q "job 'solo$i'" "$work/out" || fail "end --all: $(cat "$work/out")"
done
no_jobs || fail "end --all left a job"
zd_expect_rc 0 "$zeroctl" job end --all --dir "$work/run"
grep -q "no job to end" "$work/out" || fail "end --all of nothing: $(cat "$work/out")"

# ---- errors
zd_case=errors
zd_expect_rc 1 "$zeroctl" -s "$work/run/z0.sock" job end nosuch
grep -q "holds job 'nosuch'" "$work/err" || fail "end of a job nobody holds: $(cat "$work/err")"
zd_expect_rc 7 "$zeroctl" -s "$work/run/none.sock" job ls
zd_expect_rc 7 "$zeroctl" job ls --dir "$work/nonexistent"
zd_expect_rc 2 "$zeroctl" job end --dir "$work/run"
zd_expect_rc 2 "$zeroctl" job end a --all --dir "$work/run"
zd_expect_rc 2 "$zeroctl" job frob
zd_expect_rc 0 "$zeroctl" job --help
grep -q "zeroctl \[--json\] job end" "$work/out" || fail "job --help"

# ---- the daemons stop cleanly; no ERROR but the killed trainers' aborts
zd_case=stop
for i in 0 1; do
    zd_stop "${dpids[$i]}" "daemon $i" 10
    if grep " ERROR " "$work/d$i.log" | grep -vq "its trainer disconnected"; then
        fail "daemon $i logged an unexpected ERROR: $(grep ' ERROR ' "$work/d$i.log")"
    fi
done
dpids=()
echo "PASS"
