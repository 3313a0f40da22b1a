# shellcheck shell=bash
# Sourced by live_fuzz.sh and leak_check.sh: what a daemon holds, from outside it.
#   ZD_MALLOC_TUNABLES  glibc settings to start the daemon with (see below)
#   zd_fd_count PID     open fds
#   zd_kib PID FIELD    a /proc/PID/status field in KiB (VmRSS, RssAnon, RssShmem)
#   zd_anon_maps PID    each mapping with anonymous pages: "start-end name KiB" (for a diff
#                       that says where RssAnon went: [heap], a thread's arena or stack, ...)
#   zd_wait_idle PID ZEROCTL SOCK
#                       wait (up to 15 s) until the daemon has no job and no connection
#                       open but its listening socket; status 1 if it never gets there
#   zd_heap_in_use PID FILE
#                       bytes malloc has handed out and not had back (malloc_stats' "Total
#                       (incl. mmap) in use"), read by attaching gdb for a second; prints
#                       nothing (status 1) without gdb or without ptrace permission.
#
# Why the tunables. glibc's defaults make RSS a poor measure of what the daemon holds:
#  - the mmap threshold rises to the size of the largest mmapped block freed (up to 32 MiB)
#    and the trim threshold to twice that, so after one 16 MiB frame later buffers come from
#    the heap and up to 64 MiB of freed heap may stay resident;
#  - each thread's tcache keeps up to 7 freed chunks of each of 64 sizes, which malloc counts
#    as in use;
#  - freed memory below a live chunk cannot be returned (fragmentation).
# With the thresholds fixed at 128 KiB and the tcache off, every big buffer is mmapped and
# unmapped, freed heap above 128 KiB at the top is trimmed, and "in use" is exactly the bytes
# the daemon's allocations hold, so a leak of a single allocation shows. Fragmentation is
# left: RSS can stay up to a few hundred KiB above the baseline with "in use" unchanged (a
# long-lived chunk allocated near the top of the heap pins the free space below it).
#
# High-water marks stay after their first use and so belong in a warm-up, before a baseline:
# libuv's table of watched fds (it grows with the highest fd the daemon has had: hold many
# connections at once), the deepest stack a thread has used and the libc data that the first
# strerror() touches (a trainer gone while its AttachReply is sent: zd_live_fuzz --vanish),
# and what gdb's first call into the daemon's libc touches (measure twice).
# shellcheck disable=SC2034 # used by the scripts that source this file
ZD_MALLOC_TUNABLES=glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072:glibc.malloc.tcache_count=0

zd_fd_count() {
    find "/proc/$1/fd" -mindepth 1 -maxdepth 1 | wc -l
}

zd_kib() {
    awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"
}

zd_wait_idle() {
    local pid=$1 zeroctl=$2 sock=$3 s
    for _ in $(seq 1 150); do
        kill -0 "$pid" 2>/dev/null || return 1
        s=$("$zeroctl" -s "$sock" --json status 2>/dev/null || true)
        sleep 0.1 # zeroctl's own connection closes
        if [[ $s =~ \"has_job\":[[:space:]]*false ]] &&
            [ "$(find "/proc/$pid/fd" -lname 'socket:*' | wc -l)" = 1 ]; then
            return 0
        fi
    done
    return 1
}

zd_anon_maps() {
    awk '/^[0-9a-f]+-[0-9a-f]+ / { m = $1 " " ($6 == "" ? "anon" : $6) }
         /^Anonymous:/ { if ($2 > 0) print m, $2 }' "/proc/$1/smaps"
}

# shellcheck disable=SC2016 # $fd, $path, $saved are gdb's convenience variables
zd_heap_in_use() {
    local pid=$1 out=$2
    command -v gdb >/dev/null 2>&1 || return 1
    rm -f "$out"
    # malloc_stats() prints to stderr: point the daemon's fd 2 at $out for the call. gdb
    # copies a string argument into memory it mallocs in the daemon and never frees: take
    # that pointer and free it before counting. open/dup/dup2 do not allocate, and an idle
    # daemon holds no malloc lock.
    timeout 60 gdb -batch -nx -p "$pid" \
        -ex "set \$path = (char *)\"$out\"" \
        -ex 'set $fd = (int)open($path, 577, 384)' \
        -ex 'call (void)free($path)' \
        -ex 'set $saved = (int)dup(2)' \
        -ex 'call (int)dup2($fd, 2)' \
        -ex 'call (void)malloc_stats()' \
        -ex 'call (int)dup2($saved, 2)' \
        -ex 'call (int)close($saved)' \
        -ex 'call (int)close($fd)' >"$out.gdb" 2>&1 || return 1
    awk '/^Total/ { t = 1 } t && /in use bytes/ { print $NF; found = 1; exit }
         END { exit !found }' "$out" 2>/dev/null
}
