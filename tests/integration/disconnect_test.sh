#!/usr/bin/env bash
# The disconnect matrix (issue [1 of 8]): at world 1 and 2, rank 0's client closes its socket
# or is killed with SIGKILL at each point of the protocol -- before Hello, after Hello, half-way
# through a frame, after Attach before its reply, with a BucketReady in flight, inside Step,
# during the all-gather (world 2), after Detach -- and as a refused uid. After each: every
# daemon is alive and answers `zeroctl status`, the job is at its last completed step, and
# new trainers re-attach, train on, and end with the values of an fp64 reference of an
# uninterrupted run (zd_mesh_trainer --verify).
#   disconnect_test.sh WORLD ZEROD MESH_TRAINER DISCONNECT_CLIENT ZEROCTL
set -uo pipefail
world=$1 zerod=$2 trainer=$3 client=$4 zeroctl=$5
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
zd_workdir disc
zd_case="world $world"
declare -a dpids=() tpids=()
summary=()
cleanup() {
    zd_kill_all "${tpids[@]}" "${dpids[@]}"
}
on_fail() {
    zd_show_logs 20 "$work"/*.log "$work"/*.out
}
# begin NAME: the case that runs now (in FAIL lines and job ids)
begin() {
    case_=$1
    zd_case="world $world, $case_"
}

zd_token "$work/token"
port=$(zd_free_port)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$world
trained=2 # steps before the disruption
final=5   # steps the last trainers train to, then verify

# start_daemons [ENV=VALUE...]: one daemon per rank, a 60 s linger, quick peer detection
start_daemons() {
    for ((i = 0; i < world; i++)); do
        zd_spawn "$work/d$i.out" "$work/d$i.log" env "$@" "$zerod" --socket "$work/z$i.sock" \
            --device "cpu:$i" --token-file "$work/token" --job-linger 60s --mesh-timeout 20s \
            --collective-timeout 5s --heartbeat-interval 200ms --heartbeat-timeout 2s
        dpids[i]=$zd_pid
    done
    for ((i = 0; i < world; i++)); do
        zd_wait_ready "${dpids[$i]}" "$work/d$i.out" "daemon $i" || fail "daemon $i exited at start"
    done
}

stop_daemons() {
    for i in "${!dpids[@]}"; do
        zd_stop "${dpids[$i]}" "daemon $i"
    done
    dpids=()
}

# trainer I OUT [args...]: rank I's zd_mesh_trainer in the background
trainer() {
    local i=$1 out=$2
    shift 2
    RANK=$i ZEROD_SOCKET="$work/z$i.sock" ZEROD_JOB="disc-$world-$case_-$$" \
        "$trainer" "$@" >"$work/$out" 2>&1 </dev/null &
    tpids[i]=$!
}

# wait_pid PID SECONDS -> rc (fails when it outlives the limit)
wait_pid() {
    zd_wait_pid "$1" "$2" "process $1"
}

# train_all STEPS TAG [args...]: every rank trains to STEPS and keeps the job (detach, no end)
train_all() {
    local steps=$1 tag=$2
    shift 2
    for ((i = 0; i < world; i++)); do trainer $i "t$i.$tag.out" --steps "$steps" --keep "$@"; done
    for ((i = 0; i < world; i++)); do
        wait_pid "${tpids[$i]}" 60
        [ $rc = 0 ] || fail "rank $i ($tag) exited $rc"
    done
}

# check_daemons STEP: every daemon alive, answering, its job at STEP. A step the daemon had
# the request for when its trainer died may still be running (under TSan, well after the
# trainer is gone): wait up to 10 s for the job to reach STEP, never past it.
check_daemons() {
    local want=$1
    for ((i = 0; i < world; i++)); do
        local js step
        for _ in $(seq 1 50); do
            kill -0 "${dpids[$i]}" 2>/dev/null || fail "daemon $i died"
            js=$("$zeroctl" -s "$work/z$i.sock" --json status) ||
                fail "daemon $i does not answer status"
            step=$(/usr/bin/python3 -c 'import json, sys
d = json.load(sys.stdin)
print(int(d["job"]["step"]) if d["has_job"] else "none")' <<<"$js")
            [ "$step" = "$want" ] && break
            if ! { [ "$step" != none ] && [ "$step" -lt "$want" ]; }; then
                break
            fi
            sleep 0.2
        done
        [ "$step" = "$want" ] || fail "daemon $i: job at step '$step', expected $want ($js)"
    done
}

# finish: new trainers on every rank re-attach (resumed at STEP), train to $final, verify
finish() {
    local at=$1
    for ((i = 0; i < world; i++)); do trainer $i "t$i.final.out" --steps $final --verify; done
    for ((i = 0; i < world; i++)); do
        wait_pid "${tpids[$i]}" 60
        [ $rc = 0 ] || fail "rank $i's re-attached trainer exited $rc"
        grep -q "attached at step $at (resumed)" "$work/t$i.final.out" ||
            fail "rank $i did not resume at step $at: $(head -n 1 "$work/t$i.final.out")"
        grep -q "verify ok" "$work/t$i.final.out" || fail "rank $i: wrong values after the re-attach"
    done
}

# case NAME EXPECTED_STEP: the disruption ran; check, re-attach, verify, stop
close_case() {
    local at=$1
    check_daemons "$at"
    finish "$at"
    stop_daemons
    summary+=("$case_: daemons alive, job at step $at, re-attached and verified")
    echo "ok: $case_ (job at step $at)"
}

# raw POINT HOW: rank 0's raw client leaves at POINT
raw() {
    RANK=0 ZEROD_SOCKET="$work/z0.sock" ZEROD_JOB="disc-$world-$case_-$$" \
        "$client" "$1" "$2" >>"$work/raw.out" 2>&1
    rc=$?
    if [ "$2" = kill ]; then
        [ $rc = 137 ] || fail "raw client ($1, kill) exited $rc, expected 137"
    else
        [ $rc = 0 ] || fail "raw client ($1, close) exited $rc"
    fi
}

# the rank 1.. trainers while rank 0 misbehaves: each runs one more step, which must fail
# cleanly (the mesh is aborted when rank 0's trainer goes) or succeed (when it did not yet)
others_start() {
    for ((i = 1; i < world; i++)); do trainer $i "t$i.peer.out" --steps $((trained + 1)) --keep; done
}
others_wait() {
    for ((i = 1; i < world; i++)); do
        wait_pid "${tpids[$i]}" 30
        [ $rc = 0 ] || [ $rc = 4 ] || fail "rank $i exited $rc while rank 0 went away"
        if [ $rc = 4 ]; then
            grep -q "ERR_PEER_LOST" "$work/t$i.peer.out" ||
                fail "rank $i failed without ERR_PEER_LOST: $(tail -n 1 "$work/t$i.peer.out")"
        fi
    done
}

for point in before-hello after-hello mid-frame; do
    for how in close kill; do
        begin "$point-$how"
        start_daemons
        train_all $trained first
        raw "$point" "$how"
        close_case $trained
    done
done

# after Attach, before its reply: the attach runs (a re-attach of the lingering job), its reply
# goes nowhere, the disconnect releases the job again (and at world 2 aborts the mesh)
for how in close kill; do
    begin "attach-$how"
    start_daemons
    train_all $trained first
    if [ "$world" -gt 1 ]; then
        # rank 1 re-attaches too, so that the mesh forms for rank 0's attach; rank 0 leaves
        # only once it has (else rank 1 would attach to a mesh rank 0 already aborted, and
        # wait mesh_timeout for a coordinator that never comes: a slow start, under TSan)
        others_start
        for ((i = 1; i < world; i++)); do
            zd_wait_for_line "$work/d$i.log" "re-attached at step $trained" 30
        done
    fi
    raw attach "$how"
    others_wait
    close_case $trained
done

# a refused uid: SO_PEERCRED refuses it; it closes before the refusal is written
begin "refused-uid"
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && [[ $(ldd "$client") != *"not found"* ]]; then
    install -m 755 "$client" "$work/client-copy"
    # and the build tree's libraries it loads (libzc in a sanitizer build): uid 65534 may not
    # enter the checkout (a clone in a mktemp -d directory is 0700)
    ldd "$client" | awk '$2 == "=>" && $3 ~ /^\// && $3 !~ /^\/(usr\/)?lib/ { print $3 }' |
        while read -r lib; do install -m 644 "$lib" "$work/"; done
    chmod 755 "$work"
    start_daemons
    train_all $trained first
    chmod 666 "$work/z0.sock" # let the connection reach the daemon's own check
    for how in close kill; do
        for point in before-hello after-hello attach; do
            RANK=0 ZEROD_SOCKET="$work/z0.sock" LD_LIBRARY_PATH="$work" \
                setpriv --reuid=65534 --regid=65534 --clear-groups \
                "$work/client-copy" "$point" "$how" >>"$work/raw.out" 2>&1
        done
    done
    chmod 660 "$work/z0.sock"
    grep -q "permission denied for pid .* uid 65534" "$work/d0.log" ||
        fail "the refused uid is not logged"
    close_case $trained
else
    echo "SKIP: refused-uid case needs root and setpriv (to connect as uid 65534)"
    summary+=("refused-uid: skipped (needs root and setpriv)")
fi

# a BucketReady in flight: the trainer dies right after its first bucket of step 3 went out
for how in close kill; do
    begin "bucket-$how"
    start_daemons
    train_all $trained first
    others_start
    trainer 0 t0.die.out --steps $final --die-at $((trained + 1)):bucket --die-how "$how"
    wait_pid "${tpids[0]}" 30
    [ "$how" = kill ] && { [ $rc = 137 ] || fail "trainer exited $rc, expected 137"; }
    [ "$how" = close ] && { [ $rc = 0 ] || fail "trainer exited $rc, expected 0"; }
    grep -q "dying at step $((trained + 1)) after bucket" "$work/t0.die.out" || fail "no die point"
    others_wait
    close_case $trained
done

# inside Step (every daemon pauses at the start of each step), and during the all-gather
# (world 2: after the first bucket's all-gather): rank 0's trainer is killed there; the step
# it asked for completes (the daemon had the request), so the job is one step further
phases=(step)
[ "$world" -gt 1 ] && phases+=(allgather)
for phase in "${phases[@]}"; do
    for how in TERM KILL; do
        begin "$phase-$how"
        start_daemons ZEROD_TEST_PAUSE="$phase:400"
        train_all $trained first
        others_start
        trainer 0 t0.die.out --steps $final
        zd_wait_for_line "$work/d0.log" "ZEROD_TEST_PAUSE: $phase of step $((trained + 1)) " 30
        kill -$how "${tpids[0]}"
        wait_pid "${tpids[0]}" 30
        others_wait
        for ((i = 1; i < world; i++)); do
            grep -q "step $((trained + 1)) " "$work/t$i.peer.out" ||
                fail "rank $i did not complete step $((trained + 1))"
        done
        close_case $((trained + 1))
    done
done
[ "$world" = 1 ] && summary+=("allgather: world 1 has no all-gather")

# after Detach (the job kept): the trainer then dies with its socket open
for how in close kill; do
    begin "detach-$how"
    start_daemons
    for ((i = 0; i < world; i++)); do
        if [ $i = 0 ]; then
            trainer $i t0.die.out --steps $trained --keep --die-at $trained:detach --die-how "$how"
        else
            trainer $i "t$i.first.out" --steps $trained --keep
        fi
    done
    for ((i = 0; i < world; i++)); do
        wait_pid "${tpids[$i]}" 60
        if [ $i = 0 ] && [ "$how" = kill ]; then
            [ $rc = 137 ] || fail "trainer exited $rc, expected 137"
        else
            [ $rc = 0 ] || fail "rank $i exited $rc"
        fi
    done
    grep -q "dying at step $trained after detach" "$work/t0.die.out" || fail "no die point"
    close_case $trained
done

echo "world $world disconnect matrix:"
printf '  %s\n' "${summary[@]}"
echo "PASS (world $world)"
