#!/usr/bin/env bash
# `zeroctl trace` (docs/trace.md; issue 17): two daemons run a 2-rank job of 6 steps with a
# checkpoint every 2 steps; a trace taken while it runs is valid JSON whatever it caught; after
# it, `zeroctl trace --steps 3` of the socket directory passes trace_check.py (the Trace Event
# format, events in order, spans that do not overlap, both ranks named, every track, the same
# 3 steps on both); --json, -o -, a rank not asked, more steps than held, another job, a daemon
# with trace_buffer 0 and usage errors exit as zeroctl's other commands.
#   trace.sh ZEROD MESH_TRAINER ZEROCTL
set -uo pipefail
zerod=$1 trainer=$2 zeroctl=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
py=/usr/bin/python3
check="$here/trace_check.py"
zd_workdir trace
zd_outdir=$work
declare -a dpids=() tpids=()
all_tracks=step,buckets,reduce-scatter,norm,adam,all-gather,checkpoint

cleanup() {
    zd_kill_all "${tpids[@]}" "${dpids[@]}"
}
on_fail() {
    zd_show_logs 25 "$work"/*.log "$work"/t*.out "$work/out" "$work/err"
}

zd_token "$work/token"
mkdir "$work/run" "$work/ckpt" "$work/off"
for i in 0 1; do
    zd_spawn "$work/d$i.out" "$work/d$i.log" "$zerod" --socket "$work/run/z$i.sock" \
        --device "cpu:$i" --token-file "$work/token" --mesh-timeout 20s \
        --checkpoint-dir "$work/ckpt" --checkpoint-every-steps 2
    dpids[i]=$zd_pid
    zd_wait_ready "${dpids[$i]}" "$work/d$i.out" "daemon $i" || fail "daemon $i exited at start"
done

echo "--- a 2-rank job of 6 steps; a trace while it runs"
port=$(zd_free_port)
for i in 0 1; do
    env RANK=$i WORLD_SIZE=2 ZEROD_SOCKET="$work/run/z$i.sock" MASTER_ADDR=127.0.0.1 \
        MASTER_PORT="$port" ZEROD_JOB=trace-job "$trainer" --steps 6 --sleep-ms 100 \
        >"$work/t$i.out" 2>&1 </dev/null &
    tpids[i]=$!
done
zd_wait_for_line "$work/t0.out" "step 2 " 60
rc=0
"$zeroctl" trace --dir "$work/run" --steps 2 -o "$work/during.json" >"$work/out" 2>"$work/err" ||
    rc=$?
case $rc in
0) "$py" -c 'import json, sys; json.load(open(sys.argv[1]))' "$work/during.json" ||
    fail "the trace taken during the job is not JSON" ;;
1) grep -q "none of the 2 daemons" "$work/err" || fail "trace during the job: $(cat "$work/err")" ;;
*) fail "zeroctl trace during the job exited $rc: $(cat "$work/err")" ;;
esac
echo "trace during the job: exit $rc"
for i in 0 1; do
    zd_wait_pid "${tpids[$i]}" 60 "trainer $i"
    [ "$rc" = 0 ] || fail "trainer $i exited $rc"
done
tpids=()

echo "--- zeroctl trace --steps 3 of the directory, after the job"
zd_expect_rc 0 "$zeroctl" trace --dir "$work/run" --steps 3 -o "$work/t.json"
cat "$work/out"
grep -q "job 'trace-job' (world 2)" "$work/out" || fail "no summary line: $(cat "$work/out")"
[ ! -s "$work/err" ] || fail "zeroctl trace warned: $(cat "$work/err")"
"$py" "$check" "$work/t.json" --ranks 2 --steps 3 --tracks "$all_tracks" ||
    fail "t.json is not a valid trace of 2 ranks and 3 steps"

echo "--- --json, and -o - (the trace on stdout, the summary on stderr)"
zd_expect_rc 0 "$zeroctl" --json trace --dir "$work/run" -n 3 -o "$work/t2.json"
"$py" - "$work/out" <<'EOF' || fail "zeroctl --json trace: $(cat "$work/out")"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["schema_version"] == 1 and s["command"] == "trace", s
assert s["job"] == "trace-job" and s["world"] == 2 and s["events"] > 0, s
assert sorted(r["rank"] for r in s["ranks"]) == [0, 1], s
assert all(r["steps"] == 3 and r["first_step"] == 4 and r["last_step"] == 6 for r in s["ranks"]), s
EOF
zd_expect_rc 0 "$zeroctl" trace --dir "$work/run" -n 1 -o -
"$py" "$check" "$work/out" --ranks 2 --steps 1 || fail "-o -: stdout is not the trace"
grep -q "job 'trace-job'" "$work/err" || fail "-o -: no summary on stderr: $(cat "$work/err")"

echo "--- one daemon asked: its rank, and a word about the other"
zd_expect_rc 0 "$zeroctl" -s "$work/run/z1.sock" trace -n 2 -o "$work/t1.json"
grep -q "rank 0 of job 'trace-job' (world 2) is not among the daemons asked" "$work/err" ||
    fail "no word of rank 0: $(cat "$work/err")"
"$py" - "$work/t1.json" <<'EOF' || fail "-s z1.sock: not rank 1 alone"
import json, sys
evs = json.load(open(sys.argv[1]))["traceEvents"]
assert {e["pid"] for e in evs} == {1}, {e["pid"] for e in evs}
EOF

echo "--- more steps than the job made: all 6, said on stderr"
zd_expect_rc 0 "$zeroctl" trace --dir "$work/run" -n 100 -o "$work/t6.json"
grep -q "6 of the 100 steps asked" "$work/err" || fail "no word of 6 of 100: $(cat "$work/err")"
"$py" "$check" "$work/t6.json" --ranks 2 --steps 6 --tracks "$all_tracks" || fail "t6.json"

echo "--- another job, a daemon that records nothing, usage errors"
zd_expect_rc 1 "$zeroctl" trace --dir "$work/run" --job nope -o "$work/x.json"
grep -q "none of the 2 daemons asked holds a trace of job 'nope'" "$work/err" ||
    fail "--job nope: $(cat "$work/err")"
[ ! -e "$work/x.json" ] || fail "--job nope wrote a file"
zd_spawn "$work/d2.out" "$work/d2.log" "$zerod" --socket "$work/off/z.sock" --device cpu:2 \
    --trace-buffer 0
dpids[2]=$zd_pid
zd_wait_ready "${dpids[2]}" "$work/d2.out" "daemon 2" || fail "daemon 2 exited at start"
zd_expect_rc 1 "$zeroctl" trace --dir "$work/off" -o "$work/x.json"
grep -q "ERR_UNSUPPORTED.*trace_buffer is 0" "$work/err" || fail "trace_buffer 0: $(cat "$work/err")"
zd_expect_rc 1 "$zeroctl" --json trace --dir "$work/off" -o "$work/x.json"
grep -qE '"status":[[:space:]]*"ERR_UNSUPPORTED"' "$work/out" || fail "--json error: $(cat "$work/out")"
zd_expect_rc 2 "$zeroctl" trace --steps 0
zd_expect_rc 2 "$zeroctl" trace --frob
zd_expect_rc 2 "$zeroctl" trace extra
zd_expect_rc 0 "$zeroctl" trace --help
grep -q -- "--steps N" "$work/out" || fail "trace --help says nothing of --steps"
zd_expect_rc 7 "$zeroctl" trace --dir "$work/nowhere"

for i in 0 1 2; do
    zd_stop "${dpids[$i]}" "daemon $i"
done
dpids=()
for i in 0 1 2; do
    if grep -E "ERROR|WARN" "$work/d$i.log" | grep -v "checkpoint"; then
        fail "daemon $i logged a warning or an error"
    fi
done
echo "PASS"
