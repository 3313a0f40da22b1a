#!/bin/sh
# The device check: everything of zerod that needs a GPU, in one run, with a summary table.
#   1. zk_gpu_check: every CUDA kernel against the CPU reference on random data (odd sizes,
#      NaN/inf injected), and fused Adam against a device-to-device copy of the same bytes;
#   2. zd_nccl_check: the daemon's NCCL collectives at world 1;
#   3. zd_share_check: device regions (VMM allocations exported as fds) and interprocess events
#      between two processes, the hand-off latency of one bucket, and a torch trainer seeing the
#      region as a tensor through libzc (bench/gpu/share_check.py);
#   4. train_check.py: zerod --device cuda:0 training a model on cuda:0 through zerod.torch,
#      against torch.optim.AdamW on the same GPU (fp32, accumulation, stage 1, bf16, fp16, and a
#      trainer killed with SIGKILL and re-attached).
#
#   bench/gpu/check.sh [BUILD_DIR]      (default build-gpu; run from anywhere)
# ZEROD_GPU_PREBUILT=1: BUILD_DIR already holds the binaries (bench/, client/libzc.so,
# daemon/zerod): no build.
# Exit: 0 every check passed, 1 a mismatch or a build failure, 3 no GPU on this machine.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "check.sh: no NVIDIA GPU on this machine (nvidia-smi -L failed); nothing to check" >&2
    exit 3
fi
nvidia-smi -L

if [ "${ZEROD_GPU_PREBUILT:-0}" != 1 ]; then
    if ! cmake -S "$root" -B "$build" -DZEROD_WITH_CUDA=ON -DZEROD_TESTS=OFF \
            -DCMAKE_BUILD_TYPE=Release >"$build.configure.log" 2>&1; then
        echo "check.sh: cmake configure failed (CUDA/NCCL or build deps missing); see" \
             "$build.configure.log" >&2
        tail -20 "$build.configure.log" >&2
        exit 1
    fi
    cmake --build "$build" --target zk_gpu_check zd_nccl_check zd_share_check zc zerod \
        -j"$(nproc)" || exit 1
fi

summary=""
failed=0
# run NAME TIMEOUT CMD...: run one check with a deadline, note its result
run() {
    name=$1
    limit=$2
    shift 2
    echo "=== $name"
    start=$(date +%s)
    timeout -k 5 "$limit" "$@"
    rc=$?
    secs=$(($(date +%s) - start))
    case $rc in
    0) res=pass ;;
    124 | 137) res="FAIL (timed out after ${limit} s)" ;;
    *) res="FAIL (exit $rc)" ;;
    esac
    [ $rc -eq 0 ] || failed=1
    summary="$summary$(printf '%-16s %-30s %5s s' "$name" "$res" "$secs")
"
}

run kernels 240 "$build/bench/zk_gpu_check"
run nccl 120 "$build/bench/zd_nccl_check"
PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
ZEROD_LIBZC="$build/client/libzc.so"
export PYTHONPATH ZEROD_LIBZC
run share 180 "$build/bench/zd_share_check" --python "$root/bench/gpu/share_check.py"
ZEROD_TEST_DAEMON="$build/daemon/zerod"
export ZEROD_TEST_DAEMON
run train 300 python3 "$root/bench/gpu/train_check.py"

# Two processes on one GPU time-slice unless NVIDIA MPS runs: the hand-off again under MPS,
# started here for this check alone (private pipe and log directories) when it is installed
# and not already running.
if command -v nvidia-cuda-mps-control >/dev/null 2>&1 && ! pgrep -x nvidia-cuda-mps >/dev/null; then
    mps=$(mktemp -d)
    CUDA_MPS_PIPE_DIRECTORY=$mps CUDA_MPS_LOG_DIRECTORY=$mps
    export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    if nvidia-cuda-mps-control -d; then
        run share-mps 180 "$build/bench/zd_share_check"
        echo quit | nvidia-cuda-mps-control
    else
        echo "check.sh: nvidia-cuda-mps-control -d failed; no MPS measurement" >&2
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    rm -rf "$mps"
else
    echo "check.sh: NVIDIA MPS not installed (or already running): no separate MPS measurement"
fi

echo
echo "check              result                          time"
printf '%s' "$summary"
exit $failed
