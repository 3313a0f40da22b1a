#!/bin/sh
# One rank of `make demo` (run by zerorun, which sets RANK, WORLD_SIZE, ZEROD_SOCKET, ...):
# train the example MLP on this rank's own data, keep the job on the daemon, and show the
# daemon's shard with zeroctl.
set -eu
build=${ZEROD_BUILD:-build}
"$build/examples/train_mlp" --steps "${DEMO_STEPS:-30}" --keep
"$build/client/zeroctl" -s "$ZEROD_SOCKET" shard
