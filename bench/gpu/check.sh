#!/bin/sh
# Device check for the CUDA kernels: build zk_gpu_check with CUDA, compare every CUDA kernel
# with the CPU reference on random data (odd sizes, NaN/inf injected) and time fused Adam
# against a device-to-device copy of the same byte count.
#   bench/gpu/check.sh [BUILD_DIR]      (default build-gpu; run from anywhere)
# Exit: 0 ok, 1 mismatch or build failure, 3 no GPU on this machine.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "check.sh: no NVIDIA GPU on this machine (nvidia-smi -L failed); nothing to check" >&2
    exit 3
fi
nvidia-smi -L

if ! cmake -S "$root" -B "$build" -DZEROD_WITH_CUDA=ON -DZEROD_TESTS=OFF \
        -DCMAKE_BUILD_TYPE=Release >"$build.configure.log" 2>&1; then
    echo "check.sh: cmake configure failed (CUDA/NCCL or build deps missing); see" \
         "$build.configure.log" >&2
    tail -20 "$build.configure.log" >&2
    exit 1
fi
cmake --build "$build" --target zk_gpu_check zd_nccl_check -j"$(nproc)"
"$build/bench/zk_gpu_check"
exec "$build/bench/zd_nccl_check"
