#!/usr/bin/env bash
# Multi-rank integration tests (issue [4 of 5]): real daemons on this host (or in two network
# namespaces), N test trainers at once. Usage: mesh_test.sh MODE ZEROD MESH_TRAINER
# Every wait is bounded; every process started here is stopped on exit.
set -uo pipefail
mode=$1 zerod=$2 trainer=$3
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
zd_case=$mode
zd_workdir mesh
declare -a dpids=() tpids=()
ns_made=()

cleanup() {
    zd_kill_all "${tpids[@]}" "${dpids[@]}"
    for n in "${ns_made[@]}"; do ip netns del "$n" 2>/dev/null; done
}
on_fail() {
    zd_show_logs 25 "$work"/*.log "$work"/*.out
}

zd_token "$work/token"
zd_token "$work/badtoken"
port=$(zd_free_port)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ZEROD_JOB="mesh-$mode-$$"

# collective_timeout 2 s: kill-daemon measures failure detection against it. Under a sanitizer
# (several times slower) the modes that expect success get 10 s, so that a busy CI machine
# cannot turn a slow collective into a lost peer.
coll_timeout=2s
if [ -n "${ASAN_OPTIONS:-}${TSAN_OPTIONS:-}" ] && [ "$mode" != kill-daemon ]; then
    coll_timeout=10s
fi

# start_daemon I [NETNS] [flags...]
start_daemon() {
    local i=$1 ns=$2
    shift 2
    local pre=()
    [ -n "$ns" ] && pre=(ip netns exec "$ns")
    zd_spawn "$work/d$i.out" "$work/d$i.log" "${pre[@]}" "$zerod" --socket "$work/z$i.sock" \
        --device "cpu:$i" --token-file "$work/token" --mesh-timeout 20s --collective-timeout "$coll_timeout" \
        --heartbeat-interval 500ms "$@"
    dpids[i]=$zd_pid
    zd_wait_ready "${dpids[$i]}" "$work/d$i.out" "daemon $i" || fail "daemon $i exited at start"
}

# start_trainer I RANK WORLD [NETNS] [args...]
start_trainer() {
    local i=$1 rank=$2 world=$3 ns=$4
    shift 4
    local pre=()
    [ -n "$ns" ] && pre=(ip netns exec "$ns")
    RANK=$rank WORLD_SIZE=$world ZEROD_SOCKET="$work/z$i.sock" \
        "${pre[@]}" env RANK="$rank" WORLD_SIZE="$world" ZEROD_SOCKET="$work/z$i.sock" \
        MASTER_ADDR="$MASTER_ADDR" MASTER_PORT="$MASTER_PORT" ZEROD_JOB="$ZEROD_JOB" \
        "$trainer" "$@" >"$work/t$i.out" 2>&1 </dev/null &
    tpids[i]=$!
}

# wait_trainer I SECONDS -> sets rc
wait_trainer() {
    zd_wait_pid "${tpids[$1]}" "$2" "trainer $1"
}

# stop_daemons: every daemon in dpids (a case unsets those it killed on purpose) is still
# running, stops on SIGTERM within 5 s with exit 0 and removes its socket
stop_daemons() {
    for i in "${!dpids[@]}"; do
        zd_stop "${dpids[$i]}" "daemon $i" 5
        [ -e "$work/z$i.sock" ] && fail "daemon $i left its socket"
    done
    dpids=()
}

# expect_algo REGEX: every daemon logged the collectives algorithm it agreed on, matching REGEX
expect_algo() {
    for i in "${!dpids[@]}"; do
        zd_wait_for_line "$work/d$i.log" "collectives: " 10
        grep -qE "collectives: $1" "$work/d$i.log" ||
            fail "daemon $i: collectives not '$1': $(grep -h 'collectives: ' "$work/d$i.log")"
    done
    grep -h "collectives: " "$work/d0.log" | head -n 1
}

# verified WORLD REGEX: every rank's trainer exits 0 and verifies, every daemon agreed on an
# algorithm matching REGEX; the daemons stop
verified() {
    for ((i = 0; i < $1; i++)); do
        wait_trainer $i 120
        [ "$rc" = 0 ] || fail "rank $i exited $rc"
        grep -q "verify ok" "$work/t$i.out" || fail "rank $i did not verify"
    done
    grep -h "verify ok" "$work"/t*.out
    expect_algo "$2"
    stop_daemons
}

# run_world WORLD [trainer args...]: every rank trains and verifies. DFLAGS: more daemon flags
# (an array of "I:flag value" per daemon, or "*:flag value" for all); ALGO: expected algorithm.
run_world() {
    local world=$1
    shift
    for ((i = 0; i < world; i++)); do
        local extra=()
        for f in "${DFLAGS[@]}"; do
            [ "${f%%:*}" = "*" ] || [ "${f%%:*}" = "$i" ] && read -ra more <<<"${f#*:}" &&
                extra+=("${more[@]}")
        done
        start_daemon $i "" "${extra[@]}"
    done
    for ((i = 0; i < world; i++)); do start_trainer $i $i "$world" "" --verify "$@"; done
    verified "$world" "${ALGO:-direct}"
}
DFLAGS=()

case "$mode" in
world2) run_world 2 --steps 10 ;;
world3) run_world 3 --steps 10 ;;
world4) run_world 4 --steps 10 ;;
world2-stage1) run_world 2 --steps 10 --stage 1 ;;
world2-accum) run_world 2 --steps 6 --accum 3 ;;
world2-bf16) run_world 2 --steps 10 --bf16 ;;
world3-tiny) run_world 3 --steps 10 --model tiny ;;
world2-large) # slices of MiBs: streaming stores in the direct reduce-scatter and all-gather
    run_world 2 --steps 6 --model large ;;
world3-threads) # the direct path split over 2 kernel threads per daemon
    DFLAGS=("*:--threads 2") run_world 3 --steps 6 --accum 2 --model large ;;
world3-ring) # the ring algorithm (between hosts) on one host
    DFLAGS=("*:--direct-collectives false") ALGO="ring over UCX .*direct_collectives = false"
    run_world 3 --steps 6 --accum 2 --model large ;;
world2-mixed) # one daemon without the direct path: both agree on the ring
    DFLAGS=("1:--direct-collectives false") ALGO="ring over UCX .*direct_collectives = false"
    run_world 2 --steps 10 --accum 2 ;;
world3-shared) # one params region for the host's ranks: no all-gather copies
    run_world 3 --steps 10 --accum 2 --own-slices
    grep -q "params region shared" "$work/t0.out" || fail "rank 0's params region is not shared"
    for i in 0 1 2; do
        grep -q "params region: one for the job's 3 ranks" "$work/d$i.log" ||
            fail "daemon $i did not take one params region"
    done ;;
world2-shared-bf16) # the same, where the master is a copy: each rank casts its own slices
    run_world 2 --steps 10 --bf16 --own-slices
    grep -q "params region shared" "$work/t1.out" || fail "rank 1's params region is not shared" ;;
world2-shared-ring) # no direct path, so one region per rank, though the trainers allow it
    DFLAGS=("*:--direct-collectives false") ALGO="ring over UCX .*direct_collectives = false"
    run_world 2 --steps 10 --own-slices
    ! grep -q "params region shared" "$work"/t*.out || fail "the ring shared a params region" ;;
kill-daemon)
    world=3
    for ((i = 0; i < world; i++)); do start_daemon $i ""; done
    for ((i = 0; i < world; i++)); do start_trainer $i $i $world "" --steps 100000 --sleep-ms 20; done
    zd_wait_for_line "$work/t0.out" "step 3 " 30
    kill -KILL "${dpids[1]}"
    t0=$(date +%s.%N)
    for i in 0 1 2; do wait_trainer $i 10; codes[i]=$rc; done
    elapsed=$(echo "$(date +%s.%N) - $t0" | bc)
    unset 'dpids[1]'
    for i in 0 2; do
        [ "${codes[$i]}" = 4 ] || fail "rank $i exited ${codes[$i]}, expected 4 (libzc error)"
        grep -q "ERR_PEER_LOST" "$work/t$i.out" || fail "rank $i did not report ERR_PEER_LOST"
        grep -q "rank 1" "$work/t$i.out" || fail "rank $i's error does not name rank 1"
    done
    grep -qE "ERR_CLOSED|ERR_PEER_LOST" "$work/t1.out" || fail "rank 1's trainer saw no error"
    echo "all trainers failed within ${elapsed} s of the kill (collective_timeout 2 s):"
    grep -h "ERR_" "$work"/t*.out
    (($(echo "$elapsed < 6" | bc))) || fail "took ${elapsed} s"
    stop_daemons
    ;;
peer-lost-w2 | peer-lost-w3)
    # A rank's daemon dies (kill -9) or hangs (SIGSTOP) with the default collective_timeout
    # (60 s): every other trainer gets ERR_PEER_LOST naming the rank from the watch, at once for
    # a killed daemon (its connections are reset) and within heartbeat_timeout for a hung one;
    # the hung daemon's own trainer too, when its keepalives stop.
    world=${mode#peer-lost-w}
    hb_timeout=3
    for how in KILL STOP; do
        for ((i = 0; i < world; i++)); do
            start_daemon $i "" --collective-timeout 60s --heartbeat-interval 1s \
                --heartbeat-timeout ${hb_timeout}s
        done
        for ((i = 0; i < world; i++)); do
            start_trainer $i $i "$world" "" --steps 100000 --sleep-ms 20
        done
        zd_wait_for_line "$work/t0.out" "step 3 " 30
        victim=1
        kill -$how "${dpids[$victim]}"
        t0=$(date +%s.%N)
        for ((i = 0; i < world; i++)); do
            [ $i = $victim ] && continue
            wait_trainer $i 20
            codes[i]=$rc
        done
        elapsed=$(echo "$(date +%s.%N) - $t0" | bc)
        for ((i = 0; i < world; i++)); do
            [ $i = $victim ] && continue
            [ "${codes[$i]}" = 4 ] || fail "$how: rank $i exited ${codes[$i]}, expected 4 (libzc error)"
            grep -q "ERR_PEER_LOST" "$work/t$i.out" || fail "$how: rank $i did not report ERR_PEER_LOST"
            grep -q "rank $victim lost" "$work/t$i.out" || fail "$how: rank $i's error does not name rank $victim"
        done
        if [ $how = KILL ]; then
            limit=2
            wait_trainer $victim 10
            grep -qE "ERR_CLOSED|ERR_PEER_LOST" "$work/t$victim.out" || fail "rank $victim's trainer saw no error"
        else
            limit=$((hb_timeout + 2))
            grep -q "no heartbeat for" "$work/t0.out" || fail "STOP: not reported as missed heartbeats"
            # the stopped daemon's own trainer: its keepalives stopped too (issue 41)
            wait_trainer $victim $limit
            [ "$rc" = 4 ] || fail "STOP: rank $victim's trainer exited $rc, expected 4"
            grep -q "ERR_PEER_LOST" "$work/t$victim.out" ||
                fail "STOP: rank $victim's trainer did not report ERR_PEER_LOST"
            grep -q "sent nothing for ${hb_timeout}.0 s" "$work/t$victim.out" ||
                fail "STOP: rank $victim's trainer was not told its daemon went silent"
            kill -KILL "${dpids[$victim]}" 2>/dev/null
            kill -CONT "${dpids[$victim]}" 2>/dev/null
        fi
        wait "${dpids[$victim]}" 2>/dev/null
        unset "dpids[$victim]"
        echo "world $world, daemon of rank $victim $( [ $how = KILL ] && echo killed || echo stopped):" \
            "every trainer had ERR_PEER_LOST in ${elapsed} s (limit ${limit} s, heartbeat_timeout" \
            "${hb_timeout} s, collective_timeout 60 s)"
        grep -h "ERR_" "$work"/t*.out
        (($(echo "$elapsed < $limit" | bc))) || fail "$how: took ${elapsed} s"
        stop_daemons
        for f in "$work"/t*.out; do mv "$f" "$f.$how"; done
    done
    ;;
kill-trainer)
    world=3
    for ((i = 0; i < world; i++)); do start_daemon $i "" --job-linger 60s; done
    start_trainer 0 0 $world "" --steps 8
    start_trainer 1 1 $world "" --steps 8 --hang-at 4
    start_trainer 2 2 $world "" --steps 8
    zd_wait_for_line "$work/t1.out" "hanging in step 4" 60
    sleep 0.3
    kill -KILL "${tpids[1]}"
    for i in 0 1 2; do wait_trainer $i 10; codes[i]=$rc; done
    [ "${codes[1]}" = 137 ] || fail "trainer 1 was not killed by SIGKILL (rc ${codes[1]})"
    for i in 0 2; do
        [ "${codes[$i]}" = 4 ] || fail "rank $i exited ${codes[$i]}, expected a clean libzc error"
        grep -q "ERR_PEER_LOST" "$work/t$i.out" || fail "rank $i did not report ERR_PEER_LOST"
        grep -q "rank 1" "$work/t$i.out" || fail "rank $i's error does not name rank 1"
    done
    grep -h "ERR_" "$work"/t0.out "$work"/t2.out
    for i in 0 1 2; do mv "$work/t$i.out" "$work/t$i.first.out"; done
    for i in 0 1 2; do start_trainer $i $i $world "" --steps 8 --verify; done
    for i in 0 1 2; do
        wait_trainer $i 60
        [ "$rc" = 0 ] || fail "rank $i exited $rc after re-attach"
        grep -q "(resumed)" "$work/t$i.out" || fail "rank $i did not resume"
        grep -q "verify ok" "$work/t$i.out" || fail "rank $i: wrong values after re-attach"
    done
    grep -h "attached\|verify" "$work"/t*.out | grep -v first
    stop_daemons
    ;;
stray-token)
    # A daemon with another token claims rank 1 before the real rank 1 comes: rank 0 refuses
    # it (ERR_AUTH to the stray), and the job forms all the same, because a refused claim fails
    # formation only if its rank has not joined within heartbeat_interval (2 s here: the real
    # rank 1 is started once the refusal is logged, with room for a slow machine)
    for i in 0 1; do start_daemon $i "" --heartbeat-interval 2s; done
    start_daemon 2 "" --heartbeat-interval 2s --token-file "$work/badtoken"
    start_trainer 2 1 2 "" --steps 2
    start_trainer 0 0 2 "" --verify --steps 4
    zd_wait_for_line "$work/d0.log" "refused: mesh hello claiming rank 1 .* wrong token" 10
    start_trainer 1 1 2 "" --verify --steps 4
    wait_trainer 2 20
    [ "$rc" = 4 ] || fail "the stray rank 1 exited $rc, expected a refused attach"
    grep -q "ERR_AUTH: .*wrong token" "$work/t2.out" || fail "the stray was not told ERR_AUTH"
    for i in 0 1; do
        wait_trainer $i 30
        [ "$rc" = 0 ] || fail "rank $i exited $rc"
        grep -q "verify ok" "$work/t$i.out" || fail "rank $i did not verify"
    done
    grep -h "ERR_\\|verify ok" "$work"/t*.out
    stop_daemons
    ;;
wrong-token | wrong-layout | duplicate-rank | unreachable | stranger)
    world=2
    [ "$mode" = duplicate-rank ] && world=3
    case "$mode" in
    wrong-token) # mesh_timeout 30 s: rank 0 must not wait it out (heartbeat_interval 500 ms)
        start_daemon 0 "" --mesh-timeout 30s
        start_daemon 1 "" --mesh-timeout 30s --token-file "$work/badtoken"
        t_start=$(date +%s.%N)
        start_trainer 0 0 2 "" --steps 2
        start_trainer 1 1 2 "" --steps 2
        ;;
    wrong-layout)
        start_daemon 0 "" --mesh-timeout 5s
        start_daemon 1 "" --mesh-timeout 5s
        start_trainer 0 0 2 "" --steps 2
        start_trainer 1 1 2 "" --steps 2 --model other
        ;;
    duplicate-rank)
        for i in 0 1 2; do start_daemon $i "" --mesh-timeout 5s; done
        start_trainer 0 0 3 "" --steps 2
        start_trainer 1 1 3 "" --steps 2
        sleep 0.5
        start_trainer 2 1 3 "" --steps 2
        ;;
    unreachable)
        start_daemon 1 "" --mesh-timeout 2s
        start_trainer 1 1 2 "" --steps 2
        ;;
    stranger) # a process that is not a daemon holds the coordinator's port (MASTER_PORT + 1)
        /usr/bin/python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8)
conns = []
end = time.time() + 30
while time.time() < end:
    s.settimeout(0.2)
    try:
        conns.append(s.accept()[0])
    except OSError:
        pass' $((MASTER_PORT + 1)) &
        stranger=$!
        sleep 0.3
        start_daemon 0 "" --mesh-timeout 3s
        start_daemon 1 "" --mesh-timeout 3s
        start_trainer 0 0 2 "" --steps 2
        start_trainer 1 1 2 "" --steps 2
        ;;
    esac
    for i in "${!tpids[@]}"; do wait_trainer "$i" 20; codes[i]=$rc; done
    elapsed=$(echo "$(date +%s.%N) - ${t_start:-0}" | bc)
    for i in "${!tpids[@]}"; do
        [ "${codes[$i]}" = 4 ] || fail "trainer $i exited ${codes[$i]}, expected a refused attach"
    done
    case "$mode" in
    wrong-token) # both ranks: ERR_AUTH naming rank 1 and where its hello came from, at once
        for i in 0 1; do
            grep -q "ERR_AUTH: .*claiming rank 1 of job '$ZEROD_JOB' from 127\.0\.0\.1:[0-9]* has a wrong token" \
                "$work/t$i.out" || fail "rank $i not told ERR_AUTH naming rank 1 and its address"
        done
        grep -q "rank 1 did not join within 0.5 s (heartbeat_interval)" "$work/t0.out" ||
            fail "rank 0 did not name the missing rank"
        grep -q "wrong token" "$work/d0.log" || fail "rank 0's daemon did not log the refusal"
        echo "both trainers had ERR_AUTH ${elapsed} s after they started (mesh_timeout 30 s)"
        (($(echo "$elapsed < 10" | bc))) || fail "took ${elapsed} s, expected under 10 s"
        ;;
    wrong-layout)
        for i in 0 1; do grep -q "layout hash" "$work/t$i.out" || fail "rank $i: no layout message"; done
        ;;
    duplicate-rank)
        grep -q "duplicate rank 1" "$work/t0.out" || fail "rank 0 did not name the duplicate"
        grep -qh "duplicate rank 1" "$work/t1.out" "$work/t2.out" || fail "the duplicate was not told"
        ;;
    unreachable)
        grep -q "unreachable" "$work/t1.out" || fail "no 'unreachable' in rank 1's error"
        ;;
    stranger) # rank 0 cannot listen; rank 1 meets a stranger; both daemons live on
        kill "$stranger" 2>/dev/null || true
        grep -q "cannot listen on coordinator" "$work/t0.out" || fail "rank 0 did not say why"
        grep -q "unreachable\|ERR_" "$work/t1.out" || fail "rank 1 got no error"
        for i in 0 1; do
            kill -0 "${dpids[$i]}" 2>/dev/null || fail "daemon $i died meeting a stranger"
        done
        ;;
    esac
    grep -h "ERR_" "$work"/t*.out
    stop_daemons
    ;;
netns)
    if [ "$(id -u)" != 0 ] || ! ip netns add "zdA$$" 2>/dev/null; then
        echo "SKIP: two-host test needs root and 'ip netns' (network namespaces)"
        exit 77
    fi
    ns_made+=("zdA$$")
    ip netns add "zdB$$" || fail "ip netns add"
    ns_made+=("zdB$$")
    ip link add "zdva$$" type veth peer name "zdvb$$" || fail "veth"
    ip link set "zdva$$" netns "zdA$$"
    ip link set "zdvb$$" netns "zdB$$"
    ip -n "zdA$$" addr add 198.18.0.1/24 dev "zdva$$"
    ip -n "zdB$$" addr add 198.18.0.2/24 dev "zdvb$$"
    for n in "zdA$$" "zdB$$"; do ip -n "$n" link set lo up; done
    ip -n "zdA$$" link set "zdva$$" up
    ip -n "zdB$$" link set "zdvb$$" up
    export MASTER_ADDR=198.18.0.1 UCX_TLS=tcp
    start_daemon 0 "zdA$$"
    start_daemon 1 "zdB$$"
    start_trainer 0 0 2 "zdA$$" --verify --steps 10
    start_trainer 1 1 2 "zdB$$" --verify --steps 10
    verified 2 "ring over UCX .*another host or in other namespaces"
    ;;
*)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac
echo "PASS ($mode)"
