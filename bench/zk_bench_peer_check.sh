#!/bin/sh
# CTest bench/zk_bench_output: zk_bench's --peer pairs each peer line with adam_step at the
# peer's own size and says so where it ran none, and --limit-only prints limits alone. Checks
# the lines' form only, never a rate.
#   zk_bench_peer_check.sh ZK_BENCH SCRATCH_DIR
set -eu
# the lines' form does not depend on the stores: no store plan timed at each start (~5 s)
export ZEROD_KERNEL_STORES=regular
zk=$1
dir=$2
mkdir -p "$dir"
peer=$dir/peer.json
printf '%s\n' \
    '{"peer": "torch_adamw", "n": 1048576, "threads": 1, "seconds": 1.0, "elements_per_s": 1048576}' \
    '{"peer": "torch_adamw", "n": 2097152, "threads": 1, "seconds": 1.0, "elements_per_s": 1}' \
    >"$peer"
fail() {
    echo "zk_bench_peer_check: $1" >&2
    printf '%s\n' "$2" >&2
    exit 1
}
# AVX2 runs wherever zk_bench does (its limit needs it), and faster than scalar
run="$zk --kernels adam_step --variants avx2 --dtype fp32 --n 1048576 --reps 1"
out=$($run --peer "$peer")
echo "$out" | grep -q '^adam_step vs torch_adamw (1 thread, n = 1048576): .* = [0-9.]*x: ' ||
    fail "no comparison at the peer's size n = 1048576" "$out"
echo "$out" | grep -q '^adam_step vs torch_adamw (1 thread, n = 2097152): not compared' ||
    fail "the peer line at n = 2097152 was not said to be uncompared" "$out"
[ "$(echo "$out" | grep -c '^adam_step vs ')" -eq 2 ] || fail "not one line per peer line" "$out"
out=$($run --json --peer "$peer")
echo "$out" | grep -q '"peer": "torch_adamw", "threads": 1, "n": 1048576, "elements_per_s": [0-9]' ||
    fail "no JSON comparison at n = 1048576" "$out"
echo "$out" | grep -q '"n": 2097152, "elements_per_s": null, .*"speedup": null, "ok": null}' ||
    fail "no JSON null comparison at n = 2097152" "$out"
out=$($run --json --limit-only)
echo "$out" | grep -q '^{"kernel": "adam_step", "variant": "limit", "threads": 1, "n": 1048576, ' ||
    fail "no limit line under --limit-only" "$out"
[ "$(echo "$out" | grep -c '"kernel"')" -eq 1 ] || fail "kernel lines under --limit-only" "$out"
echo "zk_bench_peer_check: ok"
