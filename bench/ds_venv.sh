#!/usr/bin/env bash
# The peers' venv for bench/ds_vs_zerod.py and `make test-deepspeed` / `make bench-deepspeed`:
# torch 2.x (the CPU build) and DeepSpeed from the package index, created once and reused.
# Never a runtime dependency of zerod.
#
#   bench/ds_venv.sh          create (or reuse) the venv; print its python on the last line
#
# ZEROD_DS_CHECK_ONLY=1: print the python only if the venv is there; create nothing (status 1)
# ZEROD_DS_VENV: where (default ~/.cache/zerod/ds-venv-DEEPSPEED_VERSION)
# ZEROD_DS_VERSION: DeepSpeed's version (default 0.19.8)
# ZEROD_TORCH_INDEX: where torch comes from (default PyPI, whose build brings the CUDA
#                    libraries; https://download.pytorch.org/whl/cpu has a CPU-only one)
set -euo pipefail
ds_version=${ZEROD_DS_VERSION:-0.19.8}
venv=${ZEROD_DS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/zerod/ds-venv-$ds_version}
torch_index=${ZEROD_TORCH_INDEX:-https://pypi.org/simple}
py=${ZEROD_DS_PYTHON:-/usr/bin/python3}
stamp=$venv/.zerod-ready

if [ -f "$stamp" ] && "$venv/bin/python" -c 'import torch, deepspeed' >/dev/null 2>&1; then
    echo "$venv/bin/python"
    exit 0
fi
if [ -n "${ZEROD_DS_CHECK_ONLY:-}" ]; then
    exit 1
fi
echo "ds_venv: creating $venv (torch 2.x from $torch_index, deepspeed $ds_version)" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv" >&2 || {
    echo "ds_venv: '$py -m venv' failed (Debian: apt-get install python3-venv)" >&2
    exit 1
}
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" >&2; }
pip install --upgrade pip
pip install --index-url "$torch_index" "torch>=2,<3"
# DeepSpeed's setup builds no ops (DS_BUILD_OPS=0); CPUAdam is JIT-built on first use with
# ninja and the system compiler.
DS_BUILD_OPS=0 pip install "deepspeed==$ds_version" ninja numpy psutil py-cpuinfo
"$venv/bin/python" -c 'import torch, deepspeed; print("ds_venv: torch", torch.__version__,
"deepspeed", deepspeed.__version__)' >&2
# DeepSpeed builds its CPU ops (FusedAdam, the shared-memory comm, CPUAdam) with the system
# compiler the first time they are used: minutes on two cores, which would fall on the first
# test or benchmark that runs DeepSpeed (make test's 60 s limit of a test). Built here, once.
echo "ds_venv: building DeepSpeed's CPU ops (once)" >&2
"$venv/bin/python" - >&2 <<'PY'
from deepspeed.accelerator import get_accelerator

acc = get_accelerator()
for name in ("FusedAdamBuilder", "ShareMemCommBuilder", "CPUAdamBuilder"):
    builder = acc.create_op_builder(name)
    if builder is not None:
        builder.load(verbose=False)
PY
touch "$stamp"
echo "$venv/bin/python"
