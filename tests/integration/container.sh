#!/usr/bin/env bash
# deploy/Containerfile builds, and its image runs zerod as a non-root user whose HEALTHCHECK
# (zeroctl status) turns healthy; zeroctl in the container talks to the daemon; SIGTERM (podman
# stop) ends it with exit 0. With ZEROD_TEST_CUDA_IMAGE=1, deploy/Containerfile.cuda is built
# too (not run: that needs a GPU and the NVIDIA Container Toolkit).
# Runs with ZEROD_LONG_TESTS=1 only. Needs a working podman (and network for the image's apt-get); without one it skips (77).
#   container.sh SOURCE_DIR
set -euo pipefail
src=$1
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

if [ "${ZEROD_LONG_TESTS:-}" != 1 ]; then
    echo "SKIP: the container build is a soak; it runs with ZEROD_LONG_TESTS=1"
    exit 77
fi
if ! command -v podman >/dev/null; then
    echo "SKIP: podman not available"
    exit 77
fi
if ! podman info >/tmp/zd-podman-info.$$ 2>&1; then
    echo "SKIP: podman does not work here: $(tail -n 1 /tmp/zd-podman-info.$$)"
    rm -f /tmp/zd-podman-info.$$
    exit 77
fi
rm -f /tmp/zd-podman-info.$$
zd_workdir container
tag=localhost/zerod-test:$$
name=zerod-test-$$
cleanup() {
    podman rm -f -t 0 "$name" >/dev/null 2>&1 || true
    podman rmi -f "$tag" "$tag-cuda" >/dev/null 2>&1 || true
}
on_fail() {
    podman logs "$name" 2>&1 | tail -n 40 || true
    zd_show_logs 40 "$work/build.log"
}

timeout 3000 podman build --format docker -f "$src/deploy/Containerfile" -t "$tag" "$src" \
    >"$work/build.log" 2>&1 || fail "podman build failed"
[ "$(podman image inspect --format '{{.Config.User}}' "$tag")" = zerod ] ||
    fail "the image does not run as the user zerod"
podman image inspect --format '{{.Config.Healthcheck}}' "$tag" | grep -q zeroctl ||
    fail "the image has no HEALTHCHECK calling zeroctl"

# the socket directory, writable by the image's zerod (uid 999; through the user namespace
# when rootless)
mkdir -p "$work/run"
if [ "$(id -u)" = 0 ]; then
    chown 999:999 "$work/run"
else
    podman unshare chown 999:999 "$work/run"
fi
podman run -d --name "$name" -v "$work/run:/run/zerod" \
    -e ZEROD_SOCKET=/run/zerod/zerod-cpu0.sock "$tag" --device cpu:0 >/dev/null ||
    fail "podman run failed"
healthy() { podman healthcheck run "$name" >/dev/null 2>&1; }
zd_poll 60 healthy || fail "the container's HEALTHCHECK did not pass within 60 s"
uid=$(podman exec "$name" id -u)
[ "$uid" != 0 ] || fail "zerod runs as root in the container"
podman exec "$name" zeroctl status >"$work/status" || fail "zeroctl status in the container"
podman exec "$name" zerod --version | grep -q '^zerod [0-9]' || fail "zerod --version"
podman stop -t 20 "$name" >/dev/null
code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || fail "zerod exited $code after podman stop (SIGTERM)"

if [ "${ZEROD_TEST_CUDA_IMAGE:-0}" = 1 ]; then
    timeout 5400 podman build --format docker -f "$src/deploy/Containerfile.cuda" \
        -t "$tag-cuda" "$src" >"$work/build.log" 2>&1 || fail "podman build (CUDA) failed"
    echo "container: CUDA image built (not run: needs a GPU and the NVIDIA toolkit)"
else
    echo "container: CUDA image not built (ZEROD_TEST_CUDA_IMAGE=1 builds it)"
fi
echo "container: OK (uid $uid, healthy, exit 0)"
