#!/usr/bin/env bash
# metrics_listen = auto, the default (docs/metrics.md "Who can read it"; issue "[2 of 8] Nothing
# a local user does through zerod touches a file they could not touch themselves", item 6): a
# daemon serves /metrics on the unix socket beside its own, mode 0660 with the daemon socket's
# group, so exactly who may talk to the daemon may read it. Checked here: the path two daemons
# of one directory derive (no collision; zeroctl's table lists daemons, not metrics sockets), a
# stale metrics socket of a killed daemon replaced, a file there refused, `off` and `none`. As
# root also: a uid outside the socket's group cannot connect, and with allowed_group a member
# of that (temporary) group can read /healthz while a non-member cannot. Without root those
# last checks are skipped, saying so (exit 77 after the rest passed).
#   metrics_access.sh ZEROD ZEROCTL
set -uo pipefail
zerod=$1 zeroctl=$2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
py=/usr/bin/python3
zd_workdir maccess
declare -a dpids=()
group=

cleanup() {
    zd_kill_all "${dpids[@]}"
    [ -n "$group" ] && groupdel "$group" 2>/dev/null
}
on_fail() {
    zd_show_logs 30 "$work"/*.log "$work"/*.out
}

start_daemon() { # I [flags...]: zerod on $work/zI.sock, device cpu:I
    local i=$1
    shift
    zd_spawn "$work/d$i.out" "$work/d$i.log" "$zerod" --socket "$work/z$i.sock" --device "cpu:$i" "$@"
    dpids[i]=$zd_pid
    zd_wait_ready "${dpids[$i]}" "$work/d$i.out" "daemon $i" || fail "daemon $i exited at start"
}

# get SOCKET PATH [setpriv args...]: GET PATH over the unix socket SOCKET (as another user with
# setpriv args); prints the HTTP status, or the errno name when connect() fails
get() {
    local sock=$1 path=$2
    shift 2
    local pre=()
    [ $# -gt 0 ] && pre=(setpriv "$@")
    "${pre[@]}" "$py" -c 'import errno, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno)); sys.exit(0)
s.sendall(b"GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n" % sys.argv[2].encode())
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
print(data.split(b" ", 2)[1].decode())' "$sock" "$path"
}

expect_get() { # WANT SOCKET PATH [setpriv args...]
    local want=$1 got
    shift
    got=$(get "$@")
    [ "$got" = "$want" ] || fail "GET $2 on $1${3:+ (setpriv ${*:3})}: '$got', expected '$want'"
}

say() { echo "--- $*"; }

no_warnings() { # the daemons logged no WARN or ERROR line
    if grep -hE ' (WARN|ERROR) ' "$work"/d*.log; then
        fail "unexpected WARN or ERROR lines"
    fi
}

say "zerod -t names the metrics socket auto derives; off and none"
out=$("$zerod" -t --device cpu:0 --socket "$work/zerod-cpu0.sock" 2>&1) || fail "zerod -t: $out"
grep -qF "metrics $work/zerod-cpu0.metrics.sock," <<<"$out" || fail "zerod -t: $out"
for v in off none; do
    out=$("$zerod" -t --device cpu:0 --socket "$work/t.sock" --metrics-listen $v 2>&1) || fail "$out"
    grep -qF "metrics off," <<<"$out" || fail "metrics_listen $v: $out"
done
long=$work/$(printf 'd%.0s' $(seq 1 $((100 - ${#work}))))
out=$("$zerod" -t --device cpu:0 --socket "$long" 2>&1) && fail "a metrics path over 107 bytes was taken: $out"
grep -q "config key 'metrics_listen' (auto)" <<<"$out" || fail "no message for a long path: $out"
echo "ok: -t shows it; off, none; too long a path refused naming the key"

say "two daemons of one directory: each its own metrics socket, mode 0660, its socket's group"
start_daemon 0
start_daemon 1
for i in 0 1; do
    m=$work/z$i.metrics.sock
    [ -S "$m" ] || fail "daemon $i has no metrics socket at $m"
    got=$(stat -c '%a %g' "$m")
    want=$(stat -c '660 %g' "$work/z$i.sock")
    [ "$got" = "$want" ] || fail "$m is '$got' (mode gid), expected '$want' as the daemon socket"
    expect_get 200 "$m" /healthz
    expect_get 200 "$m" /metrics
done
"$py" "$here/metrics_check.py" --get "$work/z1.metrics.sock" /metrics "$work/m1.prom" >/dev/null
grep -q 'device="cpu:1"' "$work/m1.prom" || fail "z1.metrics.sock is not daemon 1's"
"$zeroctl" --json --dir "$work" status >"$work/table.json" || fail "zeroctl --dir: $(cat "$work/table.json")"
"$py" - "$work/table.json" <<'EOF' || fail "zeroctl's table of $work"
import json, sys
t = json.load(open(sys.argv[1]))
socks = sorted(d["socket"].rsplit("/", 1)[1] for d in t["daemons"])
assert socks == ["z0.sock", "z1.sock"], socks
EOF
echo "ok: z0.metrics.sock and z1.metrics.sock serve; zeroctl's table has the 2 daemons only"

say "a killed daemon's stale metrics socket is replaced; a file there is refused"
kill -KILL "${dpids[0]}"
wait "${dpids[0]}" 2>/dev/null
[ -S "$work/z0.metrics.sock" ] || fail "the killed daemon left no metrics socket to test with"
start_daemon 0
grep -qF "replaced a stale socket at $work/z0.metrics.sock" "$work/d0.log" ||
    fail "the stale metrics socket was not replaced as such"
expect_get 200 "$work/z0.metrics.sock" /readyz
zd_stop "${dpids[0]}" "daemon 0"
[ -e "$work/z0.metrics.sock" ] && fail "daemon 0 left its metrics socket at stop"
echo precious >"$work/z0.metrics.sock"
"$zerod" --socket "$work/z0.sock" --device cpu:0 >"$work/refused.out" 2>&1 &&
    fail "zerod started over a regular file at its metrics path"
grep -q "config key 'metrics_listen': '$work/z0.metrics.sock' exists and is not a socket" \
    "$work/refused.out" || fail "no message for the file: $(cat "$work/refused.out")"
[ "$(cat "$work/z0.metrics.sock")" = precious ] || fail "zerod replaced a regular file"
[ -e "$work/z0.sock" ] && fail "the refused zerod left its daemon socket"
rm -f "$work/z0.metrics.sock"
start_daemon 0 --metrics-listen off
[ -e "$work/z0.metrics.sock" ] && fail "metrics_listen = off made a metrics socket"
for i in 0 1; do zd_stop "${dpids[$i]}" "daemon $i"; done
dpids=()
echo "ok: stale socket replaced, a file left alone and refused, off serves nothing"

if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null || ! command -v groupadd >/dev/null; then
    no_warnings
    echo "SKIP: the checks as other users need root, setpriv and groupadd (the rest passed)"
    exit 77
fi

say "as root: a uid outside the socket's group cannot connect; allowed_group's members can"
chmod 755 "$work" # others may reach the sockets' directory: only the sockets' modes decide
nobody=(--reuid=65534 --regid=65534 --clear-groups)
start_daemon 0
expect_get 200 "$work/z0.metrics.sock" /healthz
expect_get EACCES "$work/z0.metrics.sock" /healthz "${nobody[@]}"
zd_stop "${dpids[0]}" "daemon 0"
group=zdm$$
groupadd "$group" || fail "groupadd $group"
gid=$(getent group "$group" | cut -d: -f3)
start_daemon 0 --allowed-group "$group"
for s in z0.sock z0.metrics.sock; do
    got=$(stat -c '%a %G' "$work/$s")
    [ "$got" = "660 $group" ] || fail "$s is '$got', expected '660 $group'"
done
expect_get 200 "$work/z0.metrics.sock" /healthz --reuid=65534 --regid=65534 --groups="$gid"
expect_get EACCES "$work/z0.metrics.sock" /healthz "${nobody[@]}"
zd_stop "${dpids[0]}" "daemon 0"
dpids=()
no_warnings
echo "PASS: uid 65534 refused (EACCES) outside the group; a member of '$group' (gid $gid) reads /healthz"
