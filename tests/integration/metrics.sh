#!/usr/bin/env bash
# metrics_listen (docs/metrics.md; issue 17 "[8 of 8] Run it like a service"): two daemons with
# /metrics on 127.0.0.1 run a 2-rank job, a third serves it on a unix socket and runs a 1-rank
# job. Every scrape passes `promtool check metrics` (or prints "SKIP promtool: why") and a
# strict reader of the text format (metrics_check.py); its numbers equal zeroctl --json status
# and what the job did; /healthz and /readyz answer 200; garbage and 300 stalled HTTP
# connections leave the daemon serving zeroctl status, with its fds bounded.
#   metrics.sh ZEROD MESH_TRAINER TRAIN_MLP ZEROCTL
set -uo pipefail
zerod=$1 trainer=$2 train_mlp=$3 zeroctl=$4
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
py=/usr/bin/python3
check="$here/metrics_check.py"
zd_workdir metrics
declare -a dpids=() tpids=()
stall_pid=
t_all=$SECONDS

cleanup() {
    zd_kill_all "${tpids[@]}" "${dpids[@]}" "$stall_pid"
}
on_fail() {
    zd_show_logs 30 "$work"/*.log "$work"/*.out "$work"/*.err
}
say() { # what is checked now, with the seconds the script has run
    echo "--- [$((SECONDS - t_all)) s] $*"
}

zd_token "$work/token"
port=$(zd_free_port) # MASTER_PORT; rank 0's daemon listens on port + 1
mport=$(zd_free_port)
while [ "$mport" -ge $((port - 1)) ] && [ "$mport" -le $((port + 1)) ]; do mport=$(zd_free_port); done
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ZEROD_JOB="metrics-$$"
# where each daemon serves its metrics: a port on 127.0.0.1, or a unix socket path
mwhere=("$mport" "$((mport + 1))" "$work/m2.sock")
steps_a=3 steps_b=40

# scrape I PATH OUT: GET PATH from daemon I's metrics into OUT; prints the HTTP status
scrape() {
    local where=${mwhere[$1]}
    if ! command -v curl >/dev/null 2>&1; then
        "$py" "$check" --get "$where" "$2" "$3"
    elif [[ $where == /* ]]; then
        curl -s --max-time 5 -o "$3" -w '%{http_code}' --unix-socket "$where" "http://localhost$2"
    else
        curl -s --max-time 5 -o "$3" -w '%{http_code}' "http://127.0.0.1:$where$2"
    fi
}

# expect_http I PATH CODE: daemon I answers PATH with CODE
expect_http() {
    local got
    got=$(scrape "$1" "$2" "$work/http.out")
    [ "$got" = "$3" ] || fail "daemon $1 $2: HTTP $got, expected $3: $(cat "$work/http.out" 2>/dev/null)"
    echo "daemon $1 $2: $got $(head -c 200 "$work/http.out")"
}

# valid FILE: the scrape in FILE passes promtool and metrics_check.py
promtool_said=
valid() {
    if command -v promtool >/dev/null 2>&1; then
        promtool check metrics <"$1" >"$work/promtool.out" 2>&1 ||
            { cat "$work/promtool.out"; fail "promtool check metrics failed on $1"; }
        echo "promtool check metrics $(basename "$1"): ok"
    elif [ -z "$promtool_said" ]; then
        echo "SKIP promtool: promtool is not installed (Debian package prometheus)"
        promtool_said=1
    fi
    "$py" "$check" "$1" || fail "$1 is not the Prometheus text format"
}

# metrics I NAME: scrape daemon I's /metrics into $work/NAME.prom and validate it
metrics() {
    local code
    code=$(scrape "$1" /metrics "$work/$2.prom")
    [ "$code" = 200 ] || fail "daemon $1 /metrics: HTTP $code"
    valid "$work/$2.prom"
}

start_daemon() { # I [flags...]
    local i=$1 listen=${mwhere[$1]}
    shift
    [[ $listen == /* ]] || listen=127.0.0.1:$listen
    zd_spawn "$work/d$i.out" "$work/d$i.log" "$zerod" --socket "$work/z$i.sock" \
        --device "cpu:$i" --token-file "$work/token" --heartbeat-interval 500ms \
        --metrics-listen "$listen" "$@"
    dpids[i]=$zd_pid
    zd_wait_ready "${dpids[$i]}" "$work/d$i.out" "daemon $i" || fail "daemon $i exited at start"
}

start_trainer() { # I RANK WORLD [args...]
    local i=$1 rank=$2 world=$3
    shift 3
    RANK=$rank WORLD_SIZE=$world ZEROD_SOCKET="$work/z$i.sock" "$trainer" "$@" \
        >"$work/t$i.out" 2>&1 </dev/null &
    tpids[i]=$!
}

healthy() { # I: daemon I's /healthz says 200
    [ "$(scrape "$1" /healthz "$work/http.out")" = 200 ]
}

nfds() { # PID: its open file descriptors
    find /proc/"$1"/fd -mindepth 1 -maxdepth 1 | wc -l
}

trainers_ok() { # WHAT: both ranks' trainers exit 0
    for i in 0 1; do
        zd_wait_pid "${tpids[$i]}" 120 "trainer $i"
        [ "$rc" = 0 ] || fail "$1: rank $i exited $rc"
    done
}

say "metrics_listen values zerod -t refuses"
for bad in 127.0.0.1 127.0.0.1:0 127.0.0.1:65536 ::1:80 relative/m.sock "h st:80"; do
    "$zerod" -t --socket "$work/t.sock" --metrics-listen "$bad" >"$work/t.out" 2>&1 && fail "zerod -t took metrics_listen '$bad'"
    grep -q "config key 'metrics_listen': invalid value" "$work/t.out" || fail "no message for '$bad': $(cat "$work/t.out")"
done
"$zerod" -t --socket "$work/t.sock" --metrics-listen "[::1]:9400" >/dev/null || fail "zerod -t refused [::1]:9400"
echo "zerod -t refused each bad value, naming the key"

say "three daemons: metrics on 127.0.0.1:${mwhere[0]}, 127.0.0.1:${mwhere[1]} and ${mwhere[2]}"
for i in 0 1 2; do start_daemon $i; done
mode=$(stat -c %a "${mwhere[2]}") || fail "no unix metrics socket at ${mwhere[2]}"
[ "$mode" = 660 ] || fail "the metrics socket has mode $mode, expected 660"
# TCP only when asked for, and then said once: any local user can read it
for i in 0 1; do
    n=$(grep -c "metrics_listen 127.0.0.1:${mwhere[$i]} (TCP): .*any local user" "$work/d$i.log")
    [ "$n" = 1 ] || fail "daemon $i logged the TCP exposure $n times, expected once"
done
grep -q "any local user" "$work/d2.log" && fail "daemon 2 (unix socket) logged TCP exposure"
for i in 0 1 2; do
    expect_http $i /healthz 200
    expect_http $i /readyz 200
    metrics $i idle$i
done
expect_http 0 /nothing 404
# a port in use stops the start, and the daemon socket it had bound goes
"$zerod" --socket "$work/busy.sock" --metrics-listen "127.0.0.1:${mwhere[0]}" >"$work/busy.out" 2>&1 &&
    fail "a second zerod started on daemon 0's metrics port"
grep -q "config key 'metrics_listen': cannot listen on 127.0.0.1:${mwhere[0]}" "$work/busy.out" ||
    fail "no message for a metrics port in use: $(cat "$work/busy.out")"
[ -e "$work/busy.sock" ] && fail "the refused zerod left its socket"
echo "a metrics port in use: refused at start"

say "a 2-rank job, $steps_a steps, kept (the mesh stays up)"
for i in 0 1; do start_trainer $i $i 2 --steps $steps_a --keep; done
trainers_ok "first run"
for i in 0 1; do
    metrics $i kept$i
    expect_http $i /readyz 200
done

say "the job re-attached and run to step $steps_b, scraped while it trains"
for i in 0 1; do start_trainer $i $i 2 --steps $steps_b --sleep-ms 50 --keep; done
zd_wait_for_line "$work/t0.out" "rank 0: step 6 " 60
for i in 0 1; do metrics $i during$i; done
alive=1
for i in 0 1; do kill -0 "${tpids[$i]}" 2>/dev/null || alive=0; done
"$py" - "$here" "$alive" "$steps_b" "$work/during0.prom" "$work/during1.prom" <<'EOF' || fail "scrape during the run"
import sys
sys.path.insert(0, sys.argv[1])
from metrics_check import parse
alive, steps = sys.argv[2] == "1", int(sys.argv[3])
for rank, path in enumerate(sys.argv[4:]):
    s = {(n, dict(l).get("phase"), dict(l).get("rank")): v for (n, l), v in parse(open(path).read()).items()}
    step = s[("zerod_steps_total", None, str(rank))]
    assert 6 <= step <= steps, "rank %d: steps_total %r during the run" % (rank, step)
    if alive:  # both trainers ran on after the scrape: they were attached during it
        assert s[("zerod_trainers_attached", None, str(rank))] == 1, "rank %d: not attached" % rank
        assert s[("zerod_mesh_peers_up", None, str(rank))] == 1, "rank %d: peer not up" % rank
    print("rank %d during the run: step %d, trainer attached %d" %
          (rank, step, s[("zerod_trainers_attached", None, str(rank))]))
if not alive:
    print("NOTE: a trainer finished before the scrape did (a slow machine): attachment not checked")
EOF
trainers_ok "second run"

say "after the run: the numbers against zeroctl --json status and the job"
for i in 0 1; do
    metrics $i after$i
    "$zeroctl" --json -s "$work/z$i.sock" status >"$work/status$i.json" || fail "zeroctl status of daemon $i"
    expect_http $i /readyz 200
done
"$py" - "$here" "$steps_b" "$ZEROD_JOB" "$work/after0.prom" "$work/status0.json" \
    "$work/after1.prom" "$work/status1.json" <<'EOF' || fail "the metrics of the 2-rank job"
import json, math, sys
sys.path.insert(0, sys.argv[1])
from metrics_check import parse
steps, job = int(sys.argv[2]), sys.argv[3]
for rank in (0, 1):
    samples = parse(open(sys.argv[4 + 2 * rank]).read())
    st = json.load(open(sys.argv[5 + 2 * rank]))
    j = st["job"]
    want = {"job": job, "rank": str(rank), "device": "cpu:%d" % rank}
    by = {}
    for (name, labels), v in samples.items():
        l = dict(labels)
        assert l.get("device") == want["device"], (name, l)
        if name.startswith("zerod_") and "job" in l:
            assert all(l.get(k) == x for k, x in want.items()), (name, l)
        extra = tuple(sorted((k, x) for k, x in l.items() if k not in want))
        by[(name, extra)] = v
    def get(name, **extra):
        return by[(name, tuple(sorted(extra.items())))]
    assert j["rank"] == rank and j["world"] == 2 and j["step"] == steps, j
    assert get("zerod_job_info", world="2", stage="2", dtype=j["dtype"]) == 1
    assert get("zerod_steps_total") == steps == j["step"]
    assert get("zerod_skipped_steps_total") == j["skipped_steps"] == 0
    assert get("zerod_loss_scale") == j["loss_scale"]
    assert math.isclose(get("zerod_grad_norm"), j["grad_norm"], rel_tol=1e-12), (get("zerod_grad_norm"), j)
    assert get("zerod_trainers_attached") == 0 and get("zerod_reattaches_total") == 1
    assert get("zerod_mesh_peers") == 1 and get("zerod_mesh_peers_up") == 1
    mem = {t["name"]: t for t in st["memory"]}
    for name, t in mem.items():
        assert get("zerod_memory_bytes", term=name) == t["bytes"], name
        assert get("zerod_memory_formula_bytes", term=name) == t["formula_bytes"], name
    # every step of both runs ran each phase once (fp32: none skipped)
    for phase in ("bucket_wait", "reduce_scatter", "norm", "adam", "all_gather"):
        n = get("zerod_step_phase_duration_seconds_count", phase=phase)
        total = get("zerod_step_phase_duration_seconds_sum", phase=phase)
        assert n == steps and total > 0, (phase, n, total)
    # the full buffer of every collective: each step reduce-scatters and all-gathers the params
    # once; the job's first all-gather loaded them
    params = mem["params"]["bytes"]
    assert get("zerod_collective_bytes_total", collective="reduce_scatter") == steps * params
    assert get("zerod_collective_bytes_total", collective="all_gather") == (steps + 1) * params
    # one params region per rank: the all-gather moves bytes; each collective's time is its
    # wait plus its transfer, the bandwidth over the transfer alone
    assert get("zerod_params_region_shared") == 0 and j["params_shared"] is False, j
    for c in ("reduce_scatter", "all_gather"):
        assert get("zerod_collective_bus_bandwidth_bytes_per_second", collective=c) > 0, c
        assert get("zerod_collective_wait_seconds_total", collective=c) >= 0, c
        assert get("zerod_collective_transfer_seconds_total", collective=c) > 0, c
        assert math.isclose(get("zerod_collective_last_wait_seconds", collective=c),
                            j["wait_s"][c], rel_tol=1e-9, abs_tol=1e-12), (c, j["wait_s"])
        assert math.isclose(get("zerod_collective_bus_bandwidth_bytes_per_second", collective=c),
                            j["busbw_bytes_per_s"][c], rel_tol=1e-9), (c, j["busbw_bytes_per_s"])
    print("rank %d: %d steps, %d params bytes, memory and counters as zeroctl says" %
          (rank, steps, params))
EOF

say "daemon 2: a 1-rank job of train_mlp, scraped over its unix socket"
ZEROD_SOCKET="$work/z2.sock" RANK=0 WORLD_SIZE=1 ZEROD_JOB=unix-$$ "$train_mlp" --steps 3 --keep \
    >"$work/t2.out" 2>&1 || fail "train_mlp on daemon 2"
metrics 2 unix2
"$zeroctl" --json -s "$work/z2.sock" status >"$work/status2.json" || fail "zeroctl status of daemon 2"
"$py" - "$here" "$work/unix2.prom" "$work/status2.json" <<'EOF' || fail "the metrics of the 1-rank job"
import json, sys
sys.path.insert(0, sys.argv[1])
from metrics_check import parse
s = {(n, tuple(sorted(dict(l).items()))): v for (n, l), v in parse(open(sys.argv[2]).read()).items()}
st = json.load(open(sys.argv[3]))
labels = (("device", "cpu:2"), ("job", st["job"]["id"]), ("rank", "0"))
assert s[("zerod_steps_total", labels)] == 3 == st["job"]["step"]
assert s[("zerod_mesh_peers", labels)] == 0 and s[("zerod_mesh_peers_up", labels)] == 0
busbw = [v for (n, l), v in s.items() if n == "zerod_collective_bus_bandwidth_bytes_per_second"]
assert busbw == [0, 0], busbw  # world 1: (N - 1) / N = 0
print("daemon 2: 3 steps over the unix socket, world 1")
EOF
expect_http 2 /healthz 200
expect_http 2 /readyz 200

say "garbage and 300 stalled connections to daemon 0's metrics port"
"$py" "$check" --garbage "${mwhere[0]}" || fail "sending garbage"
base_fds=$(nfds "${dpids[0]}")
touch "$work/hold"
"$py" "$check" --stall "${mwhere[0]}" 300 "$work/hold" >"$work/stall.out" 2>&1 &
stall_pid=$!
zd_wait_for_line "$work/stall.out" "^open " 20
cat "$work/stall.out"
t0=$(date +%s%N)
"$zeroctl" -t 2000 -s "$work/z0.sock" status >"$work/status-stall.out" 2>&1 ||
    fail "zeroctl status while 300 HTTP connections stall: $(cat "$work/status-stall.out")"
ms=$((($(date +%s%N) - t0) / 1000000))
fds=$(nfds "${dpids[0]}")
echo "zeroctl status answered in $ms ms; daemon 0 holds $fds fds ($base_fds before)"
[ "$fds" -le $((base_fds + 32 + 4)) ] || fail "daemon 0 holds $fds fds (> $base_fds + 32 + 4)"
"$zeroctl" -t 2000 -s "$work/z1.sock" status >/dev/null || fail "daemon 1 stopped answering"
rm -f "$work/hold"
zd_wait_pid "$stall_pid" 20 "the stalling client"
stall_pid=
zd_poll 10 healthy 0 || fail "/healthz did not recover"
expect_http 0 /healthz 200
metrics 0 recovered0

say "stop: exit 0, sockets removed, no WARN or ERROR in the logs"
for i in 0 1 2; do
    zd_stop "${dpids[$i]}" "daemon $i" 10
done
dpids=()
[ -e "${mwhere[2]}" ] && fail "daemon 2 left its metrics socket"
if grep -hE ' (WARN|ERROR) ' "$work"/d*.log; then
    fail "unexpected WARN or ERROR lines"
fi
say "PASS"
