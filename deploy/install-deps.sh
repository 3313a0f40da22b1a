#!/usr/bin/env bash
# Install everything zerod needs to build, test and benchmark, from Debian packages.
# Idempotent and non-interactive: packages already installed are skipped, and
# `apt-get update` runs at most once per invocation (and only when something is missing).
# Used by `make deps`, the README and .ci/run.
set -euo pipefail

PACKAGES=(
    # build
    build-essential cmake pkg-config git
    clang clang-format cppcheck libclang-rt-14-dev
    protobuf-c-compiler libprotobuf-c-dev
    # runtime libraries
    libuv1-dev libucx-dev ucx-utils libinih-dev libcjson-dev libssl-dev
    libmicrohttpd-dev libsystemd-dev libxxhash-dev
    # tests
    libcriterion-dev iproute2 procps prometheus
    # Python binding, PyTorch parity tests and benchmark peers
    python3 python3-numpy python3-torch
    openmpi-bin libopenmpi-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps: all ${#PACKAGES[@]} packages present"
    exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        echo "install-deps: ${#missing[@]} packages missing, and not root and no sudo; as root, run:" >&2
        echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
        exit 1
    fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done"
