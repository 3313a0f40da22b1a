#!/usr/bin/env bash
# The venv of `make test-torch2`: the Python suite (ctest -L python) against torch 2.x from
# the package index, beside Debian's python3-torch 1.13 that `make test` uses. Created once
# and reused; never a runtime dependency of zerod.
#
#   tests/python/torch2_venv.sh   create (or reuse) the venv; print its python on the last line
#
# ZEROD_TORCH2_CHECK_ONLY=1: print the python only if the venv is there; else create nothing
#                           (status 1)
# ZEROD_TORCH2_VERSION: torch's version, exact (default 2.15.0: the one bench/ds_venv.sh's
#                       venv got, so that where both come from PyPI one download serves both)
# ZEROD_TORCH2_NUMPY: numpy's version, exact (default 2.4.6; Tensor.numpy() in
#                     zerod.import_deepspeed needs it and torch 2 does not bring it)
# ZEROD_TORCH2_VENV: where (default ~/.cache/zerod/torch2-venv-TORCH_VERSION)
# ZEROD_TORCH2_CPU_INDEX: the extra index of the CPU-only torch build (default
#                         https://download.pytorch.org/whl/cpu; empty: none). Where it cannot
#                         be reached, torch comes from the plain index (PyPI: its build brings
#                         the CUDA libraries, about 5 GB)
# ZEROD_TORCH2_PYTHON: the interpreter the venv is made from (default /usr/bin/python3)
#
# Status 1 with one "torch2_venv: ..." line on stderr when the venv cannot be made, e.g. when
# the package index cannot be reached (callers such as .ci/run print it as the reason to skip).
set -euo pipefail
torch_version=${ZEROD_TORCH2_VERSION:-2.15.0}
numpy_version=${ZEROD_TORCH2_NUMPY:-2.4.6}
venv=${ZEROD_TORCH2_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/zerod/torch2-venv-$torch_version}
cpu_index=${ZEROD_TORCH2_CPU_INDEX-https://download.pytorch.org/whl/cpu}
py=${ZEROD_TORCH2_PYTHON:-/usr/bin/python3}
stamp=$venv/.zerod-ready

check() { # the venv's torch and numpy are the pinned ones (torch 2.15.0+cpu is 2.15.0)
    "$venv/bin/python" - "$torch_version" "$numpy_version" <<'EOF'
import sys, numpy, torch
sys.exit(torch.__version__.split("+")[0] != sys.argv[1] or numpy.__version__ != sys.argv[2])
EOF
}

if [ -f "$stamp" ] && check >/dev/null 2>&1; then
    echo "$venv/bin/python"
    exit 0
fi
if [ -n "${ZEROD_TORCH2_CHECK_ONLY:-}" ]; then
    exit 1
fi
fail() {
    echo "torch2_venv: $*" >&2
    exit 1
}

echo "torch2_venv: creating $venv (torch $torch_version, numpy $numpy_version)" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv" >&2 || fail "'$py -m venv' failed (Debian: apt-get install python3-venv)"
# a venv left half made is removed, so that the next run starts afresh
trap '[ -f "$stamp" ] || rm -rf "$venv"' EXIT
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }
# Reachable? A question to each index, short: a host that does not answer fails in seconds
# rather than after pip's retries.
reachable() { # [pip index options...]
    pip index versions torch --timeout 15 --retries 1 "$@" >/dev/null 2>&1
}
if ! reachable; then
    fail "the package index cannot be reached ('pip index versions torch' failed):" \
         "no torch $torch_version"
fi
extra=()
if [ -n "$cpu_index" ] && reachable --index-url "$cpu_index"; then
    # torch==V matches the index's V+cpu too, and pip takes that (a local version sorts higher)
    extra=(--extra-index-url "$cpu_index")
    echo "torch2_venv: torch from $cpu_index (CPU only)" >&2
else
    echo "torch2_venv: ${cpu_index:-no CPU index} not reachable: torch from the plain index" \
         "(with its CUDA libraries)" >&2
fi
pip install -q "${extra[@]}" "torch==$torch_version" "numpy==$numpy_version" >&2 ||
    fail "pip install torch==$torch_version numpy==$numpy_version failed (see above)"
check || fail "$venv: torch $torch_version or numpy $numpy_version does not import"
"$venv/bin/python" -c 'import torch, numpy; print("torch2_venv: torch", torch.__version__,
"numpy", numpy.__version__)' >&2
touch "$stamp"
echo "$venv/bin/python"
