#!/bin/sh
# make bench: time the torch.optim.AdamW peer when /usr/bin/python3 has torch, and
# DeepSpeedCPUAdam when bench/ds_venv.sh's venv exists (`make bench-deepspeed` makes it), then
# zk_bench at 1 and 2 threads with the peers' results.
#   run.sh ZK_BENCH PEER_JSON
set -u
bench=$1
peer_json=$2
py=${ZEROD_TORCH_PYTHON:-/usr/bin/python3}
here=$(dirname "$0")

peer_arg=
if [ -x "$py" ] && "$py" -c 'import torch' 2>/dev/null; then
    if "$py" "$here/peers/torch_adamw.py" --threads 1 >"$peer_json"; then
        cat "$peer_json"
        peer_arg="--peer $peer_json"
    else
        echo "bench: torch peer failed; continuing without it" >&2
    fi
else
    echo "bench: $py has no torch (Debian: apt-get install python3-torch); no peer ratio" >&2
fi
ds_py=$(ZEROD_DS_CHECK_ONLY=1 bash "$here/ds_venv.sh" 2>/dev/null || true)
if [ -n "$ds_py" ]; then
    if "$ds_py" "$here/peers/torch_adamw.py" --impl deepspeed --threads 1 >"$peer_json.ds"; then
        tee -a "$peer_json" <"$peer_json.ds"
        peer_arg="--peer $peer_json"
    else
        echo "bench: DeepSpeedCPUAdam peer failed; continuing without it" >&2
    fi
else
    echo "bench: no DeepSpeed venv (make bench-deepspeed creates one); no DeepSpeedCPUAdam ratio" >&2
fi
# shellcheck disable=SC2086
exec "$bench" --threads 1,2 $peer_arg
