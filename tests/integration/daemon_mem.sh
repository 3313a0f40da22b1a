# shellcheck shell=bash
# Sourced by live_fuzz.sh, leak_check.sh, flood.sh and conn_limits.sh: what a daemon holds,
# from outside it.
#   ZD_MALLOC_TUNABLES  glibc settings to start the daemon with (see below)
#   zd_fd_count PID     open fds
#   zd_kib PID FIELD    a /proc/PID/status field in KiB (VmRSS, RssAnon, RssShmem)
#   zd_anon_maps PID    each mapping with anonymous pages: "start-end name KiB" (for a diff
#                       that says where RssAnon went: [heap], a thread's arena or stack, ...)
#   zd_wait_idle PID ZEROCTL SOCK
#                       wait (up to 15 s) until the daemon has no job and no connection
#                       open but its listening sockets (SOCK, and the metrics socket beside it
#                       when metrics_listen = auto made one); status 1 if it never gets there
#   zd_heap_in_use ZEROCTL SOCK
#                       bytes malloc has handed out and not had back, every arena and mmapped
#                       chunk (`zeroctl status`'s heap_in_use_bytes, the daemon's mallinfo2);
#                       prints nothing (status 1) where the daemon cannot say
#   zd_sanitized        status 0 in a sanitizer build (ctest sets ASAN_OPTIONS or TSAN_OPTIONS
#                       there): its allocator is its own, RSS says little, and LeakSanitizer
#                       checks the daemon's heap when it exits instead (daemon_ctl.sh stop)
#   zd_mem_baseline PID ZEROCTL SOCK DIR
#                       takes and prints the figures zd_mem_compare compares with: fds, malloc in
#                       use (asked twice: what the first Status touches belongs to the baseline;
#                       "?" unmeasured), RssAnon, RssShmem, VmRSS, and the anonymous mappings
#                       (DIR/anon0.txt)
#   zd_mem_compare PID ZEROCTL SOCK DIR WHAT TOL_KIB
#                       takes the same figures again and prints them with their differences;
#                       status 1 after a FAIL line for each that is not as before WHAT (e.g.
#                       "the fuzz"): fds, then (not in a sanitizer build) malloc in use,
#                       RssShmem, and RssAnon by more than TOL_KIB
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
# and what the first Status request touches (measure twice). Figures are read while the
# daemon has no connection but zeroctl's own, whose buffers are the same each time.
# shellcheck disable=SC2034 # used by the scripts that source this file
ZD_MALLOC_TUNABLES=glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072:glibc.malloc.tcache_count=0

zd_fd_count() {
    find "/proc/$1/fd" -mindepth 1 -maxdepth 1 | wc -l
}

zd_kib() {
    awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"
}

zd_wait_idle() {
    local pid=$1 zeroctl=$2 sock=$3 s listening=1
    # metrics_listen = auto: ${sock%.sock}.metrics.sock (docs/metrics.md)
    [ -S "${sock%.sock}.metrics.sock" ] && listening=2
    for _ in $(seq 1 150); do
        kill -0 "$pid" 2>/dev/null || return 1
        s=$("$zeroctl" -s "$sock" --json status 2>/dev/null || true)
        sleep 0.1 # zeroctl's own connection closes
        if [[ $s =~ \"has_job\":[[:space:]]*false ]] &&
            [ "$(find "/proc/$pid/fd" -lname 'socket:*' | wc -l)" = "$listening" ]; then
            return 0
        fi
    done
    return 1
}

zd_anon_maps() {
    awk '/^[0-9a-f]+-[0-9a-f]+ / { m = $1 " " ($6 == "" ? "anon" : $6) }
         /^Anonymous:/ { if ($2 > 0) print m, $2 }' "/proc/$1/smaps"
}

zd_heap_in_use() {
    local heap
    heap=$("$1" -s "$2" --timeout 5000 --json status 2>/dev/null |
        sed -n 's/.*"heap_in_use_bytes":[[:space:]]*\([0-9][0-9]*\).*/\1/p')
    sleep 0.1 # zeroctl's connection closes before fds are counted
    [ -n "$heap" ] && [ "$heap" != 0 ] && echo "$heap"
}

zd_sanitized() {
    [ -n "${ASAN_OPTIONS:-}${TSAN_OPTIONS:-}" ]
}

# zd_mem_figures PID ZEROCTL SOCK DIR N: "fds heap anon shmem rss" (heap first: the others are
# read once zeroctl has gone); the anonymous mappings in DIR/anonN.txt
zd_mem_figures() {
    local heap
    heap=$(zd_heap_in_use "$2" "$3" || echo "?")
    zd_anon_maps "$1" >"$4/anon$5.txt"
    echo "$(zd_fd_count "$1") $heap $(zd_kib "$1" RssAnon) $(zd_kib "$1" RssShmem)" \
        "$(zd_kib "$1" VmRSS)"
}

zd_mem_baseline() {
    zd_heap_in_use "$2" "$3" >/dev/null || true
    read -r zd_mem0_fds zd_mem0_heap zd_mem0_anon zd_mem0_shmem zd_mem0_rss \
        < <(zd_mem_figures "$1" "$2" "$3" "$4" 0)
    echo "baseline: fds $zd_mem0_fds, malloc in use $zd_mem0_heap B, RssAnon $zd_mem0_anon KiB," \
        "RssShmem $zd_mem0_shmem KiB, VmRSS $zd_mem0_rss KiB"
}

zd_mem_compare() {
    local pid=$1 zeroctl=$2 sock=$3 dir=$4 what=$5 tol=$6 status=0
    local fds0=$zd_mem0_fds heap0=$zd_mem0_heap anon0=$zd_mem0_anon shmem0=$zd_mem0_shmem
    local fds1 heap1 anon1 shmem1 rss1
    read -r fds1 heap1 anon1 shmem1 rss1 < <(zd_mem_figures "$pid" "$zeroctl" "$sock" "$dir" 1)
    echo "after:    fds $fds1, malloc in use $heap1 B, RssAnon $anon1 KiB, RssShmem $shmem1 KiB," \
        "VmRSS $rss1 KiB"
    echo "          (fds $((fds1 - fds0)), RssAnon $((anon1 - anon0)) KiB of a tolerance of" \
        "$tol KiB, RssShmem $((shmem1 - shmem0)) KiB, VmRSS $((rss1 - zd_mem0_rss)) KiB)"
    if [ "$anon1" != "$anon0" ]; then
        echo "          anonymous memory by mapping, before and after (KiB):"
        diff "$dir/anon0.txt" "$dir/anon1.txt" | sed -n 's/^\([<>]\)/            \1/p' || true
    fi
    if [ "$fds1" != "$fds0" ]; then
        echo "FAIL: the daemon holds $fds1 fds, $fds0 before $what:" >&2
        ls -l "/proc/$pid/fd" >&2
        status=1
    fi
    if zd_sanitized; then
        echo "sanitizer build: memory not compared (LeakSanitizer checks the heap at exit)"
        return "$status"
    fi
    if [ "$heap0" = "?" ] || [ "$heap1" = "?" ]; then
        echo "malloc in use: not measured (the daemon's C library cannot say)"
    elif [ "$heap1" != "$heap0" ]; then
        echo "FAIL: malloc holds $heap1 bytes, $heap0 before $what: $((heap1 - heap0)) bytes" \
            "leaked" >&2
        status=1
    fi
    if [ $((anon1 - anon0)) -gt "$tol" ]; then
        echo "FAIL: RssAnon grew by $((anon1 - anon0)) KiB (tolerance $tol KiB)" >&2
        status=1
    fi
    if [ "$shmem1" != "$shmem0" ]; then
        echo "FAIL: RssShmem is $shmem1 KiB, $shmem0 KiB before: shared regions outlive their" \
            "job" >&2
        status=1
    fi
    return "$status"
}
