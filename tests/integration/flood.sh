#!/usr/bin/env bash
# A client that pipelines requests and never reads a reply (issue "nothing a client does can
# kill or wedge zerod"): each 9-byte Status request asks for a reply of a few hundred bytes,
# so a daemon that queues every reply for such a client grows ~40 times faster than the
# client writes, until the kernel's OOM killer ends it. What the daemon holds for one
# connection must be bounded: while 16 MiB of requests stream in (the replies would take
# ~650 MiB), its RssAnon may grow by at most GROWTH_MAX_KIB (64 MiB) over its baseline; it
# may push back instead (stop reading: the client's writes stall) or close the connection.
# Afterwards it must answer `zeroctl status`.
#   flood.sh ZEROD ZEROCTL LIVE_FUZZ RUNDIR
set -euo pipefail
zerod=$1 zeroctl=$2 fuzz=$3 rundir=$4
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
# shellcheck source-path=SCRIPTDIR source=daemon_mem.sh
. "$here/daemon_mem.sh"
sock="$rundir/zerod.sock"
FLOOD_MIB=16
GROWTH_MAX_KIB=$((64 * 1024))
# Under TSan (ctest sets TSAN_OPTIONS in that build only) the shadow and metadata of every
# byte the daemon touches count in its RssAnon: a bounded reply queue showed +85 MiB. An
# unbounded one still grows far past 8 times the bound (~650 MiB of replies before shadow).
# zeroctl's deadline after the flood: 5 s, 20 s in a sanitizer build, where a CI machine that
# runs a 3-daemon mesh test beside this one gave the daemon too little CPU to answer in 5 s.
STATUS_MS=5000
if [ -n "${TSAN_OPTIONS:-}" ]; then
    GROWTH_MAX_KIB=$((GROWTH_MAX_KIB * 8))
fi
if zd_sanitized; then
    STATUS_MS=20000
fi

GLIBC_TUNABLES=$ZD_MALLOC_TUNABLES zd_ctl_start "$zerod" "$rundir"
"$zeroctl" -s "$sock" status >/dev/null || fail "zeroctl status does not answer"
zd_wait_idle "$pid" "$zeroctl" "$sock" || fail "the daemon is not idle after start"
base=$(zd_kib "$pid" RssAnon)

"$fuzz" --socket "$sock" --flood "$FLOOD_MIB" >"$rundir/flood.out" 2>&1 &
fpid=$!
peak=$base
while kill -0 "$fpid" 2>/dev/null; do
    [ -f "$rundir/rc" ] && break
    kib=$(zd_kib "$pid" RssAnon 2>/dev/null || echo 0)
    [ "${kib:-0}" -gt "$peak" ] && peak=$kib
    sleep 0.05
done
rc=0
wait "$fpid" || rc=$?
cat "$rundir/flood.out"
[ "$rc" = 0 ] || fail "zd_live_fuzz --flood failed (exit $rc)"
[ ! -f "$rundir/rc" ] || fail "zerod died during the flood (exit $(cat "$rundir/rc"))"
echo "daemon RssAnon: $base KiB before, $peak KiB at most during the flood" \
    "(+$((peak - base)) KiB; bound +$GROWTH_MAX_KIB KiB)"
if ! "$zeroctl" -s "$sock" --timeout "$STATUS_MS" status >/dev/null; then
    for t in /proc/"$pid"/task/*; do # where each daemon thread is, for whoever reads the log
        echo "daemon thread $(cat "$t/comm" 2>/dev/null): state $(awk '{print $3}' "$t/stat" 2>/dev/null)" \
            "wchan $(cat "$t/wchan" 2>/dev/null)"
    done
    fail "zeroctl status does not answer within $STATUS_MS ms after the flood"
fi
zd_wait_idle "$pid" "$zeroctl" "$sock" || fail "the flood's connection is still open 15 s after it closed"
echo "after the flood: RssAnon $(zd_kib "$pid" RssAnon) KiB, zeroctl status answers"
[ $((peak - base)) -le "$GROWTH_MAX_KIB" ] ||
    fail "a client that never reads made the daemon grow by $((peak - base)) KiB for" \
        "$FLOOD_MIB MiB of requests: replies are queued without a bound"
zd_ctl_stop
echo "PASS"
