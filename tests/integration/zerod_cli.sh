#!/usr/bin/env bash
# zerod's start-up checks (issue [1 of 8]): zero and nonsensical settings are refused by
# `zerod -t` naming the key; a token_file that cannot be used fails at start; the socket path
# replaces only a stale socket (never a file, a directory or a live socket) and is removed at
# stop only while it is still the daemon's own; the socket is mode 0660 with allowed_group as
# its group. Usage: zerod_cli.sh ZEROD ZEROCTL
set -uo pipefail
zerod=$1 zeroctl=$2
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
zd_workdir cli
pid=
cleanup() {
    zd_kill_all "$pid"
}
on_fail() {
    zd_show_logs +1 "$work/d.log"
}

# refused KEY ARGS...: zerod -t exits 2 and its message names KEY
refused() {
    local key=$1
    shift
    local out rc
    out=$("$zerod" -t --device cpu --socket "$work/t.sock" "$@" 2>&1)
    rc=$?
    [ $rc = 2 ] || fail "zerod -t $* exited $rc, expected 2: $out"
    grep -q "'$key'" <<<"$out" || fail "zerod -t $*: the message does not name '$key': $out"
    echo "refused: $* -> $out"
}

refused max_shard_bytes --max-shard-bytes 0
refused max_shard_bytes --max-shard-bytes 512KiB
refused frame_timeout --frame-timeout 0
refused collective_timeout --collective-timeout 0
refused mesh_timeout --mesh-timeout 0
refused heartbeat_interval --heartbeat-interval 0
refused heartbeat_timeout --heartbeat-timeout 0
refused heartbeat_timeout --heartbeat-interval 2s --heartbeat-timeout 3s
refused job_linger --job-linger -5s
refused bucket_slots --bucket-slots 65
refused threads --threads 0
refused socket --socket ""
ZEROD_FRAME_TIMEOUT=0 refused frame_timeout
refused token_file --token-file "$work/missing-token"
zd_token "$work/token"
chmod 644 "$work/token"
refused token_file --token-file "$work/token"
chmod 600 "$work/token"
"$zerod" -t --device cpu --socket "$work/t.sock" --token-file "$work/token" --job-linger 0 \
    >/dev/null || fail "a good config with job_linger 0 was refused"

# the training-config keys, in both formats; an unknown format is a usage error naming it
out=$("$zerod" --print-training-keys) || fail "--print-training-keys exited $?"
grep -q '^zero_optimization.stage ' <<<"$out" || fail "--print-training-keys lacks stage: $out"
out=$("$zerod" --print-training-keys=markdown) || fail "--print-training-keys=markdown failed"
grep -q '^| `optimizer.params.lr` |' <<<"$out" || fail "the markdown table lacks lr: $out"
# a training config resolved as a job of N ranks: values and their sources
printf '%s' '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}' >"$work/ds.json"
out=$("$zerod" --print-training-config "$work/ds.json" --world 2) ||
    fail "--print-training-config exited $?"
grep -q '^gradient_accumulation_steps  *4  *derived$' <<<"$out" || fail "no derived gas 4: $out"
grep -q '^train_batch_size  *32  *config$' <<<"$out" || fail "no train_batch_size 32: $out"
out=$("$zerod" --print-training-config "$work/ds.json" --world 3 2>&1)
rc=$?
[ $rc = 2 ] && grep -q "'train_batch_size' 32" <<<"$out" || fail "world 3 accepted: rc $rc, $out"
out=$("$zerod" --print-training-keys=md 2>&1)
rc=$?
[ $rc = 2 ] && grep -q "'md'" <<<"$out" || fail "--print-training-keys=md: rc $rc, $out"

# start ARGS...: a daemon on $work/z.sock in the background; waits for READY (status 1 when
# it exits first)
start() {
    zd_spawn "$work/d.out" "$work/d.log" "$zerod" --device cpu --socket "$work/z.sock" "$@"
    pid=$zd_pid
    zd_wait_ready "$pid" "$work/d.out" zerod
}
stop() {
    zd_stop "$pid" zerod
    pid=
}
# start_fails WHAT ARGS...: the daemon exits non-zero at start, logging WHAT
start_fails() {
    local what=$1
    shift
    if start "$@"; then
        fail "zerod started with $* (expected: $what)"
    fi
    wait $pid
    local rc=$?
    pid=
    [ $rc != 0 ] || fail "zerod exited 0 with $*"
    grep -q "$what" "$work/d.log" "$work/d.out" 2>/dev/null ||
        fail "no '$what' in the daemon's output: $(cat "$work/d.log")"
}

# a token file that cannot be used stops a real start too
chmod 640 "$work/token"
"$zerod" --device cpu --socket "$work/z.sock" --token-file "$work/token" >"$work/d.out" \
    2>"$work/d.log" </dev/null
rc=$?
[ $rc = 2 ] || fail "zerod with a 0640 token_file exited $rc, expected 2"
grep -q "mode 0600" "$work/d.log" || fail "the token_file refusal does not say why"
[ ! -e "$work/z.sock" ] || fail "a refused start left a socket"
chmod 600 "$work/token"

# the socket path: a regular file is never replaced
echo "precious" >"$work/z.sock"
start_fails "not a socket"
[ "$(cat "$work/z.sock")" = precious ] || fail "zerod replaced a regular file"
rm -f "$work/z.sock"
mkdir "$work/z.sock"
start_fails "not a socket"
[ -d "$work/z.sock" ] || fail "zerod removed a directory"
rmdir "$work/z.sock"

# a live socket is never taken over
start || fail "zerod did not start"
first=$pid
pid=
start_fails "is listening on"
pid=$first
"$zeroctl" -s "$work/z.sock" status >/dev/null || fail "the first daemon stopped answering"
stop
[ ! -e "$work/z.sock" ] || fail "zerod left its socket after SIGTERM"

# a stale socket (nothing listens) is replaced
/usr/bin/python3 -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' \
    "$work/z.sock"
[ -S "$work/z.sock" ] || fail "could not make a stale socket"
start || fail "zerod did not replace a stale socket"
grep -q "replaced a stale socket" "$work/d.log" || fail "the replacement is not logged"
"$zeroctl" -s "$work/z.sock" status >/dev/null || fail "zerod does not answer on the new socket"
# what replaced our socket while we ran is left alone at stop
rm -f "$work/z.sock"
echo "someone else's" >"$work/z.sock"
stop
[ -f "$work/z.sock" ] || fail "zerod removed a file that was no longer its socket"
rm -f "$work/z.sock"

# mode 0660, and allowed_group as the socket's group
start || fail "zerod did not start"
[ "$(stat -c %a "$work/z.sock")" = 660 ] || fail "socket mode $(stat -c %a "$work/z.sock")"
stop
if [ "$(id -u)" = 0 ]; then
    group=$(getent group 65534 | cut -d: -f1)
    start --allowed-group "$group" || fail "zerod with allowed_group $group did not start"
    got=$(stat -c '%G %a' "$work/z.sock")
    [ "$got" = "$group 660" ] || fail "socket is '$got', expected '$group 660'"
    stop
    echo "allowed_group: socket is $got"
else
    echo "allowed_group: not root, group ownership not checked"
fi
start_fails "no group named" --allowed-group no-such-group-zd
echo "PASS"
