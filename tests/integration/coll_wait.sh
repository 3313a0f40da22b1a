#!/usr/bin/env bash
# The collectives' wait for a late peer apart from their transfer (docs/metrics.md "Collective
# bytes, wait and bus bandwidth"): a world-2 job on this host runs 6 steps with both trainers
# on time, then 6 more with rank 1's trainer sleeping 200 ms before each step's buckets. Rank 0's
# reduce-scatter waits for it; that wait goes to zerod_collective_wait_seconds_total and
# `zeroctl status`'s WAIT, and the bandwidth, over the transfer time only, does not collapse.
# Twice: the direct path with one params region for both ranks (the all-gather a barrier:
# "shared", no GB/s figure), and the ring (direct_collectives = false: an all-gather that moves
# bytes). The ratios are generous: a shared 2-core machine may run slowly, never 10x.
#   coll_wait.sh ZEROD MESH_TRAINER ZEROCTL
set -uo pipefail
zerod=$1 trainer=$2 zeroctl=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
py=/usr/bin/python3
zd_workdir coll_wait
declare -a dpids=() tpids=()
sleep_ms=200

cleanup() {
    zd_kill_all "${tpids[@]}" "${dpids[@]}"
}
on_fail() {
    zd_show_logs 25 "$work"/*.log "$work"/*.out
}

zd_token "$work/token"

start_daemons() { # [flags...]
    for i in 0 1; do
        zd_spawn "$work/d$i.out" "$work/d$i.log" "$zerod" --socket "$work/z$i.sock" \
            --device "cpu:$i" --token-file "$work/token" --mesh-timeout 20s \
            --collective-timeout 20s --heartbeat-interval 500ms "$@"
        dpids[i]=$zd_pid
        zd_wait_ready "${dpids[$i]}" "$work/d$i.out" "daemon $i" || fail "daemon $i exited at start"
    done
}

# run NAME STEPS RANK1_ARGS...: both ranks train to STEPS (kept), then rank 0's daemon is
# scraped into NAME.prom and NAME.json
run() {
    local name=$1 steps=$2
    shift 2
    for i in 0 1; do
        local more=()
        [ "$i" = 1 ] && more=("$@")
        RANK=$i WORLD_SIZE=2 ZEROD_SOCKET="$work/z$i.sock" "$trainer" --steps "$steps" \
            --model large --own-slices --keep "${more[@]}" >"$work/t$i-$name.out" 2>&1 </dev/null &
        tpids[i]=$!
    done
    for i in 0 1; do
        zd_wait_pid "${tpids[$i]}" 50 "trainer $i"
        [ "$rc" = 0 ] || { cat "$work/t$i-$name.out"; fail "$name: rank $i exited $rc"; }
    done
    tpids=()
    code=$("$py" "$here/metrics_check.py" --get "$work/z0.metrics.sock" /metrics "$work/$name.prom")
    [ "$code" = 200 ] || fail "$name: /metrics of daemon 0: HTTP $code"
    "$py" "$here/metrics_check.py" "$work/$name.prom" || fail "$name.prom is not the text format"
    "$zeroctl" --json -s "$work/z0.sock" status >"$work/$name.json" || fail "$name: zeroctl status"
}

# check MODE: the on-time run against the late one, on rank 0
check() {
    "$py" - "$here" "$1" "$sleep_ms" "$work/ontime.prom" "$work/late.prom" "$work/late.json" \
        <<'EOF' || fail "$1: the wait is not apart from the transfer"
import json, sys
sys.path.insert(0, sys.argv[1])
from metrics_check import parse
mode, sleep_s = sys.argv[2], int(sys.argv[3]) * 1e-3
def series(path):
    out = {}
    for (name, labels), v in parse(open(path).read()).items():
        l = dict(labels)
        out[(name, l.get("collective"))] = v
    return out
a, b = series(sys.argv[4]), series(sys.argv[5])
st = json.load(open(sys.argv[6]))["job"]
def delta(name, c):
    return b[(name, c)] - a.get((name, c), 0)
rs = "reduce_scatter"
# per step of each run: 6 steps each
by0, w0, t0 = (a[(n, rs)] for n in ("zerod_collective_bytes_total",
                                    "zerod_collective_wait_seconds_total",
                                    "zerod_collective_transfer_seconds_total"))
by1, w1, t1 = (delta(n, rs) for n in ("zerod_collective_bytes_total",
                                      "zerod_collective_wait_seconds_total",
                                      "zerod_collective_transfer_seconds_total"))
bw0, bw1 = by0 / t0, by1 / t1
old1 = by1 / (t1 + w1)  # what the bandwidth read when the wait counted as transfer
print("%s: on time: wait %.1f ms/step, %.2f GB/s; peer %d ms late: wait %.1f ms/step, "
      "%.2f GB/s over the transfer (%.3f GB/s counting the wait)"
      % (mode, w0 / 6e-3, bw0 * 1e-9, sleep_s * 1e3, w1 / 6e-3, bw1 * 1e-9, old1 * 1e-9))
assert by1 == by0 > 0, (by0, by1)
assert w1 / 6 >= 0.5 * sleep_s, "the late peer's wait is not counted: %r s/step" % (w1 / 6)
assert bw1 >= bw0 / 10, "the bandwidth collapsed with the wait: %r -> %r" % (bw0, bw1)
assert bw1 >= 2 * old1, (bw1, old1)
# the last step, as zeroctl --json status says it
assert st["wait_s"]["reduce_scatter"] >= 0.5 * sleep_s, st
assert st["busbw_bytes_per_s"]["reduce_scatter"] > 0, st
ag_bw = b.get(("zerod_collective_bus_bandwidth_bytes_per_second", "all_gather"))
if mode == "shared":
    assert st["params_shared"] is True and st["busbw_bytes_per_s"]["all_gather"] is None, st
    assert ag_bw is None, "a shared params region's all-gather has a bandwidth: %r" % ag_bw
    assert b[("zerod_params_region_shared", None)] == 1
    assert delta("zerod_collective_bytes_total", "all_gather") == 0
    assert delta("zerod_collective_transfer_seconds_total", "all_gather") == 0
    assert delta("zerod_collective_wait_seconds_total", "all_gather") > 0
else:
    assert st["params_shared"] is False and st["busbw_bytes_per_s"]["all_gather"] > 0, st
    assert ag_bw > 0 and b[("zerod_params_region_shared", None)] == 0, ag_bw
EOF
}

zd_case=shared
port=$(zd_free_port)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ZEROD_JOB="coll-wait-shared-$$"
start_daemons
run ontime 6
run late 12 --sleep-ms "$sleep_ms"
grep -q "params region: one for the job's 2 ranks" "$work/d0.log" ||
    fail "the daemons did not take one params region"
check shared
"$zeroctl" -s "$work/z0.sock" status >"$work/table.out" || fail "zeroctl status"
grep -E '^(busbw|wait) rs/ag' "$work/table.out"
grep -qE '^busbw rs/ag \(GB/s\)  *[0-9.]+/shared$' "$work/table.out" ||
    fail "the one-daemon table shows no shared all-gather: $(cat "$work/table.out")"
grep -qE '^wait rs/ag \(ms\)  *[0-9.]+/[0-9.]+$' "$work/table.out" || fail "no wait in the table"
"$zeroctl" --dir "$work" status >"$work/host.out"
grep -qE "^$work/z0.sock .* [0-9.]+/shared  *[0-9.]+/[0-9.]+ " "$work/host.out" ||
    fail "the host table shows no shared all-gather: $(cat "$work/host.out")"
# the trace marks the all-gather as a barrier of 0 bytes
"$zeroctl" trace --dir "$work" -n 2 -o "$work/trace.json" >/dev/null 2>&1 || fail "zeroctl trace"
"$py" - "$work/trace.json" <<'EOF' || fail "the shared all-gather's trace spans"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"]
      if e.get("ph") == "X" and e["name"].startswith("all-gather")]
assert ev and all(e["args"].get("barrier") is True and e["args"]["bytes"] == 0 for e in ev), ev
print("trace: %d all-gather spans, each a barrier of 0 bytes" % len(ev))
EOF
for i in 0 1; do zd_stop "${dpids[$i]}" "daemon $i" 10; done
dpids=()

zd_case=ring
port=$(zd_free_port)
export MASTER_PORT=$port ZEROD_JOB="coll-wait-ring-$$"
start_daemons --direct-collectives false
run ontime 6
run late 12 --sleep-ms "$sleep_ms"
check ring
for i in 0 1; do zd_stop "${dpids[$i]}" "daemon $i" 10; done
dpids=()
if grep -hE ' (WARN|ERROR) ' "$work"/d*.log; then
    fail "unexpected WARN or ERROR lines"
fi
echo PASS
