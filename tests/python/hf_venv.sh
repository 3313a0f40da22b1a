#!/usr/bin/env bash
# The venv of tests/python/test_hf.py: transformers and accelerate from the package index, on
# top of the python's own packages (--system-site-packages: Debian's python3-torch, the torch
# that `make test` uses). Created once and reused; never a runtime dependency of zerod.
#
#   tests/python/hf_venv.sh   create (or reuse) the venv; print its python on the last line
#
# ZEROD_HF_CHECK_ONLY=1: print the python only if the venv is there; else create nothing
#                        (status 1)
# ZEROD_HF_TRANSFORMERS: transformers' version, exact (default 4.44.2: the one zerod.hf
#                        supports, SUPPORTED_TRANSFORMERS in client/python/zerod/hf.py)
# ZEROD_HF_ACCELERATE: accelerate's version, exact (default 0.32.1: the newest whose
#                      multi-process CPU state works with torch 1.13; 0.33 and later call
#                      torch.cpu.device_count, which torch 2.1 brought)
# ZEROD_HF_VENV: where (default ~/.cache/zerod/hf-venv-TRANSFORMERS-ACCELERATE)
# ZEROD_HF_PYTHON: the interpreter the venv is made from (default /usr/bin/python3)
#
# Status 1 with one "hf_venv: ..." line on stderr when the venv cannot be made, e.g. when the
# package index cannot be reached (test_hf.py prints it as the reason to skip). Tests running
# at once (ctest -j) make it once: the second waits for the first (flock).
set -euo pipefail
# Under a sanitizer build the test's environment preloads the runtime into every process
# (cmake/ZerodSanitize.cmake): the venv's pip and checks are no code of ours, so they run
# without it (a leak report from pip would read as a broken venv).
unset LD_PRELOAD ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS
tf_version=${ZEROD_HF_TRANSFORMERS:-4.44.2}
acc_version=${ZEROD_HF_ACCELERATE:-0.32.1}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/zerod
venv=${ZEROD_HF_VENV:-$cache/hf-venv-$tf_version-$acc_version}
py=${ZEROD_HF_PYTHON:-/usr/bin/python3}
stamp=$venv/.zerod-ready

check() { # the venv's transformers and accelerate are the pinned ones, and import
    "$venv/bin/python" - "$tf_version" "$acc_version" <<'EOF'
import sys, accelerate, transformers
sys.exit(transformers.__version__ != sys.argv[1] or accelerate.__version__ != sys.argv[2])
EOF
}

ready() { [ -f "$stamp" ] && check >/dev/null 2>&1; }

if ready; then
    echo "$venv/bin/python"
    exit 0
fi
if [ -n "${ZEROD_HF_CHECK_ONLY:-}" ]; then
    exit 1
fi
fail() {
    echo "hf_venv: $*" >&2
    exit 1
}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock -w 600 9 || fail "another hf_venv.sh held $venv.lock for 10 minutes"
if ready; then # made while this one waited
    echo "$venv/bin/python"
    exit 0
fi
echo "hf_venv: creating $venv (transformers $tf_version, accelerate $acc_version)" >&2
rm -rf "$venv"
"$py" -m venv --system-site-packages "$venv" >&2 ||
    fail "'$py -m venv' failed (Debian: apt-get install python3-venv)"
# a venv left half made is removed, so that the next run starts afresh
trap '[ -f "$stamp" ] || rm -rf "$venv"' EXIT
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }
# Reachable? One short question: a host that does not answer fails in seconds rather than
# after pip's retries.
if ! pip index versions transformers --timeout 15 --retries 1 >/dev/null 2>&1; then
    fail "the package index cannot be reached ('pip index versions transformers' failed):" \
         "no transformers $tf_version"
fi
pip install -q "transformers==$tf_version" "accelerate==$acc_version" >&2 ||
    fail "pip install transformers==$tf_version accelerate==$acc_version failed (see above)"
check || fail "$venv: transformers $tf_version or accelerate $acc_version does not import"
"$venv/bin/python" -c 'import torch, transformers, accelerate; print("hf_venv: transformers",
transformers.__version__, "accelerate", accelerate.__version__, "torch", torch.__version__)' >&2
touch "$stamp"
echo "$venv/bin/python"
