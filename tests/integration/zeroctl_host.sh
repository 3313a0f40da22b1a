#!/usr/bin/env bash
# `zeroctl status` without a socket (issue 17): every daemon of a directory in one table.
#   - two daemons and a stale socket (a file nobody listens on) in one directory: three rows,
#     the stale one an error, exit 7; 0 once every socket answers;
#   - a job of 20 steps on one daemon: its row has the job, rank, state, step, a step rate
#     (> 0 when asked within the rate's 10 s window), samples/s = rate x train_batch_size, and
#     the same in --json; the other daemon is idle;
#   - a stopped daemon (SIGSTOP) is a row with ERR_TIMEOUT after -t, not a hang;
#   - -l 1 draws at least two frames within `timeout 3`; SIGTERM ends it with the last frame's
#     exit code; --json -l prints one JSON object per line;
#   - every error under --json is a JSON object with "error": {"status", "message"} on stdout,
#     for status, shard, job and checkpoint, with the exit codes of old.
#   zeroctl_host.sh ZEROD TRAIN_MLP ZEROCTL
set -uo pipefail
zerod=$1 train=$2 zeroctl=$3
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
zd_workdir zeroctl_host
zd_outdir=$work
py=/usr/bin/python3
run=$work/run
declare -a dpids=()
unset ZEROD_SOCKET

cleanup() {
    for p in "${dpids[@]}"; do
        kill -CONT "$p" 2>/dev/null || true
    done
    zd_kill_all "${dpids[@]}"
}
on_fail() {
    zd_show_logs 25 "$work"/d*.log "$work/out" "$work/err" "$work/loop.out"
}

mkdir "$run"
for i in 0 1; do
    zd_spawn "$work/d$i.out" "$work/d$i.log" "$zerod" --socket "$run/z$i.sock" \
        --device "cpu:$i" --job-linger 60s
    dpids[i]=$zd_pid
    zd_wait_ready "${dpids[$i]}" "$work/d$i.out" "daemon $i" || fail "daemon $i exited at start"
done
# a stale socket: bound by a process gone, the file left behind
"$py" -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$run/stale.sock"

# json_check FILE PYTHON: PYTHON with d = the JSON object of FILE
json_check() {
    "$py" -c "import json, sys
d = json.load(open(sys.argv[1]))
$2" "$1" || fail "JSON check failed on $(cat "$1")"
}

# ---- idle: three rows, the stale one an error
zd_case=idle
zd_expect_rc 7 "$zeroctl" --dir "$run" status
cat "$work/out"
[ "$(wc -l <"$work/out")" = 4 ] || fail "not a header and 3 rows"
grep -q '^SOCKET .*STEPS/S .*SAMPLES/S .*BUSBW RS/AG (GB/s) .*MEM/FORMULA (MiB) .*TRAINER .*REPLICA@STEP$' \
    "$work/out" || fail "no header with units"
grep -q "^$run/stale.sock  *ERR_UNREACHABLE: connect($run/stale.sock)" "$work/out" ||
    fail "no error row for the stale socket"
for i in 0 1; do
    grep -q "^$run/z$i.sock  *cpu:$i  *${dpids[$i]}  *-  *-  *idle  " "$work/out" ||
        fail "no idle row for daemon $i"
done

# ---- a job on daemon 0
zd_case=job
ZEROD_SOCKET=$run/z0.sock ZEROD_JOB=host_a "$train" --steps 20 --keep >"$work/train.out" 2>&1 ||
    { cat "$work/train.out"; fail "train_mlp failed"; }
t_end=$(date +%s.%N)
zd_expect_rc 7 "$zeroctl" --json --dir "$run" status
t_asked=$(date +%s.%N)
cp "$work/out" "$work/host.json"
fresh=$("$py" -c "import sys; print(int(float(sys.argv[2]) - float(sys.argv[1]) < 9))" \
    "$t_end" "$t_asked")
json_check "$work/host.json" "
assert d['schema_version'] == 1 and d['command'] == 'status', d
assert d['dir'] == '$run', d
socks = [x['socket'] for x in d['daemons']]
assert socks == ['$run/stale.sock', '$run/z0.sock', '$run/z1.sock'], socks
stale, a, b = d['daemons']
assert stale['error']['status'] == 'ERR_UNREACHABLE', stale
assert 'connect(' in stale['error']['message'], stale
assert a['error'] is None and b['error'] is None, d
assert a['device'] == 'cpu:0' and a['pid'] == ${dpids[0]}, a
assert b['has_job'] is False and b['job'] is None, b
j = a['job']
assert j['id'] == 'host_a' and j['rank'] == 0 and j['world'] == 1, j
assert j['step'] == 20 and j['state'] == 'kept' and j['trainer_pid'] == 0, j
assert j['train_batch_size'] == 32, j          # train_mlp: micro 32 x accumulation 1 x world 1
assert j['steps_per_s'] >= 0, j
if $fresh:                                     # asked within the 10 s window of the rate
    assert j['steps_per_s'] > 0, j
assert abs(j['samples_per_s'] - 32 * j['steps_per_s']) <= 1e-9 * max(1, j['samples_per_s']), j
assert j['busbw_bytes_per_s'] == {'reduce_scatter': 0, 'all_gather': 0}, j   # world 1
assert j['wait_s'] == {'reduce_scatter': 0, 'all_gather': 0}, j
assert j['params_shared'] is False, j
assert {m['name'] for m in a['memory']} >= {'params', 'master', 'm', 'v'}, a
print('host --json: steps/s %.1f, samples/s %.1f' % (j['steps_per_s'], j['samples_per_s']))
"

zd_expect_rc 7 "$zeroctl" --dir "$run" status
cat "$work/out"
grep -q "^$run/z0.sock  *cpu:0  *${dpids[0]}  *host_a  *0/1  *kept  *20  *[0-9.]*  *[0-9.]*  *-  *-  *[0-9.]*/[0-9.]*  *-  *-$" \
    "$work/out" || fail "no row of the job"
grep -q "^$run/z1.sock  *cpu:1 .* idle " "$work/out" || fail "daemon 1 not idle"

# one daemon, as ever (-s or $ZEROD_SOCKET): the FIELD/VALUE table, the old JSON and the new keys
ZEROD_SOCKET=$run/z0.sock zd_expect_rc 0 "$zeroctl" status
grep -q '^steps/s  *[0-9.]*$' "$work/out" && grep -q '^samples/s  *[0-9.]*$' "$work/out" &&
    grep -q '^busbw rs/ag (GB/s)  *-$' "$work/out" && grep -q '^wait rs/ag (ms)  *-$' "$work/out" &&
    grep -q '^state  *kept$' "$work/out" ||
    fail "the one-daemon table lacks the rates"
zd_expect_rc 0 "$zeroctl" --json -s "$run/z0.sock" status
json_check "$work/out" "
assert d['command'] == 'status' and d['socket'] == '$run/z0.sock', d
assert d['job']['step'] == 20 and 'steps_per_s' in d['job'] and d['job']['state'] == 'kept', d
assert 'daemons' not in d and 'error' not in d, d
"
# --dir wins over \$ZEROD_SOCKET
ZEROD_SOCKET=$run/z0.sock zd_expect_rc 7 "$zeroctl" --json --dir "$run" status
json_check "$work/out" "assert len(d['daemons']) == 3, d"

# ---- a stopped daemon: its row says ERR_TIMEOUT after -t, the others answer
zd_case=stopped
kill -STOP "${dpids[1]}"
zd_expect_rc 7 timeout 20 "$zeroctl" --json -t 500 --dir "$run" status
kill -CONT "${dpids[1]}"
json_check "$work/out" "
stale, a, b = d['daemons']
assert b['error']['status'] == 'ERR_TIMEOUT', b
assert a['error'] is None and a['job']['step'] == 20, a
"

# ---- -l: frames until a signal
zd_case=loop
rc=0
timeout 3 "$zeroctl" --dir "$run" status -l 1 >"$work/loop.out" 2>"$work/err" || rc=$?
[ "$rc" = 124 ] || fail "status -l 1 under timeout 3 exited $rc, expected 124 (timeout's)"
frames=$(grep -c "^.*Every 1s: zeroctl status ($run)" "$work/loop.out")
[ "$frames" -ge 2 ] || fail "$frames frames of status -l 1 within 3 s"
[ "$(grep -c $'\e\[H\e\[2J' "$work/loop.out")" = "$frames" ] || fail "a frame without its clear"
echo "status -l 1: $frames frames in 3 s"

timeout 3 "$zeroctl" --json --dir "$run" --loop 1 status >"$work/loop.out" 2>"$work/err"
"$py" - "$work/loop.out" <<'EOF' || fail "status --json -l: not one JSON object per line"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) >= 2, lines
for line in lines:
    d = json.loads(line)
    assert d["command"] == "status" and len(d["daemons"]) == 3, d
EOF

# SIGTERM between frames ends the loop with the last frame's exit code (7: the stale socket)
"$zeroctl" --dir "$run" status -l 1 >"$work/loop.out" 2>"$work/err" </dev/null &
loop_pid=$!
two_frames() { [ "$(grep -c 'Every 1s' "$work/loop.out")" -ge 2 ]; }
zd_poll 20 two_frames || fail "no 2 frames within 20 s"
kill -TERM "$loop_pid"
zd_wait_pid "$loop_pid" 10 "status -l after SIGTERM"
[ "$rc" = 7 ] || fail "status -l exited $rc after SIGTERM, expected 7"

# ---- errors under --json: an object with error.status and error.message, the exit codes kept
zd_case=errors
# expect_error RC COMMAND STATUS ARGS...: exits RC; stdout is the error object (COMMAND null:
# the command line named none; STATUS '*': any)
expect_error() {
    local want=$1 cmd=$2 status=$3
    shift 3
    zd_expect_rc "$want" "$zeroctl" "$@"
    json_check "$work/out" "
assert d['schema_version'] == 1, d
assert d['command'] == (None if '$cmd' == 'null' else '$cmd'), d
assert '$status' == '*' or d['error']['status'] == '$status', d
assert d['error']['status'].startswith('ERR_'), d
assert d['error']['message'] and '\n' not in d['error']['message'], d
"
    [ -s "$work/err" ] || fail "'$*': nothing on stderr"
}
expect_error 7 status ERR_UNREACHABLE --json -s "$run/stale.sock" status
expect_error 7 status ERR_UNREACHABLE --json -s "$work/nothing.sock" status
expect_error 7 status ERR_UNREACHABLE --json --dir "$work/no-such-dir" status
mkdir "$work/empty"
expect_error 7 status ERR_UNREACHABLE --json --dir "$work/empty" status
expect_error 1 shard ERR_NOT_FOUND --json -s "$run/z1.sock" shard
expect_error 7 config ERR_UNREACHABLE -s "$run/stale.sock" config --json
expect_error 2 null ERR_INVALID --json frobnicate
expect_error 2 status ERR_INVALID --json status --loop 0
expect_error 2 status ERR_INVALID --json -s "$run/z0.sock" --dir "$run" status
expect_error 2 shard ERR_INVALID --json --dir "$run" shard
expect_error 2 status ERR_INVALID --json --frob status
grep -q "^zeroctl: unknown option '--frob'$" "$work/err" || fail "--frob: no message naming it"
expect_error 7 "job ls" ERR_UNREACHABLE --json job ls --dir "$work/empty"
expect_error 2 "job ls" ERR_INVALID job ls --json --all
expect_error 1 "checkpoint verify" '*' --json checkpoint verify "$work/no-ckpt"

# ---- every socket answers: 0
zd_case=all-answer
rm "$run/stale.sock"
zd_expect_rc 0 "$zeroctl" --dir "$run" status
[ "$(wc -l <"$work/out")" = 3 ] || fail "not a header and 2 rows"

zd_case=
for i in 0 1; do
    zd_stop "${dpids[$i]}" "daemon $i"
    ! grep -q ' ERROR ' "$work/d$i.log" || fail "daemon $i logged an ERROR"
done
dpids=()
echo "PASS"
