#!/usr/bin/env bash
# Socket security (issue [3 of 5]): the socket is created mode 0660; SO_PEERCRED admits the
# daemon's uid, root and members of allowed_group; anyone else is refused with an error naming
# the peer, and logged. Usage: peercred.sh ZEROD ZEROCTL
set -uo pipefail
zerod=$1 zeroctl=$2
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null; then
    echo "SKIP: needs root and setpriv to connect as another user"
    exit 77
fi
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
zd_workdir cred
chmod 755 "$work"
# the build tree may sit under a directory other users cannot enter: run a copy
install -m 755 "$zeroctl" "$work/zeroctl"
ldd "$work/zeroctl" | grep -q "not found" && { echo "SKIP: zeroctl needs libraries outside the system path"; exit 77; }
zeroctl=$work/zeroctl
pid=
cleanup() { zd_kill_all "$pid"; }
on_fail() { zd_show_logs +1 "$work/d.log"; }

start() { # flags...
    zd_spawn "$work/d.out" "$work/d.log" "$zerod" --socket "$work/z.sock" --device cpu "$@"
    pid=$zd_pid
    zd_wait_ready "$pid" "$work/d.out" zerod || fail "zerod exited at start"
}
stop() {
    zd_stop "$pid" zerod
    pid=
}
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }

start
mode=$(stat -c %a "$work/z.sock")
[ "$mode" = 660 ] || fail "socket mode is $mode, not 660"
"$zeroctl" -s "$work/z.sock" status >/dev/null || fail "root was refused"
as_nobody "$zeroctl" -s "$work/z.sock" status >"$work/o1" 2>&1
rc=$?
[ $rc = 7 ] || fail "nobody reached a 0660 root socket (zeroctl exit $rc)"
# open the file mode: SO_PEERCRED must still refuse
chmod 666 "$work/z.sock"
as_nobody "$zeroctl" -s "$work/z.sock" status >"$work/o2" 2>&1
rc=$?
[ $rc = 7 ] || fail "nobody got exit $rc, expected 7 (refused by the daemon): $(cat "$work/o2")"
grep -q "permission denied" "$work/o2" || fail "no 'permission denied' for nobody: $(cat "$work/o2")"
grep -q "uid 65534" "$work/d.log" || fail "the refusal is not logged with the peer's uid"
cat "$work/o2"
stop
# allowed_group admits its members
group=$(getent group 65534 | cut -d: -f1)
start --allowed-group "$group"
got=$(stat -c '%G %a' "$work/z.sock")
[ "$got" = "$group 660" ] || fail "socket is '$got', expected '$group 660'"
# no chmod: the socket's group lets the member in, SO_PEERCRED admits it
as_nobody "$zeroctl" -s "$work/z.sock" status >"$work/o3" 2>&1 || fail "group $group member refused: $(cat "$work/o3")"
stop
# a refused peer that closes at once (before the refusal is written) does not kill the daemon
start
chmod 666 "$work/z.sock"
for _ in $(seq 1 50); do
    as_nobody /usr/bin/python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.close()' "$work/z.sock" 2>/dev/null
done
sleep 0.2
kill -0 "$pid" 2>/dev/null || fail "zerod died after refused peers closed early"
"$zeroctl" -s "$work/z.sock" status >/dev/null || fail "zerod stopped answering after refused peers"
stop
echo "PASS: 0660 socket, SO_PEERCRED refusal logged, allowed_group '$group' owns the socket and its member is admitted, 50 refused early closers survived"
