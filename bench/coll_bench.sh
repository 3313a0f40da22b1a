#!/bin/sh
# make bench (bench_coll): the collective peers, then coll_bench with their JSON lines.
#   coll_bench.sh COLL_BENCH MPI_PEER|"" OUTDIR [coll_bench options...]
# MPI_PEER: bench/peers/mpi_coll built (empty when CMake found no MPI); /usr/bin/python3 (or
# $ZEROD_TORCH_PYTHON) with torch runs the gloo peer. A missing peer is said (stderr) and
# skipped. ZEROD_COLL_SIZES overrides the sizes (MiB, default 1,4,16,64,256).
set -u
bench=$1
mpi_peer=$2
out=$3
shift 3
py=${ZEROD_TORCH_PYTHON:-/usr/bin/python3}
here=$(dirname "$0")
sizes=${ZEROD_COLL_SIZES:-1,4,16,64,256}
mkdir -p "$out"
set -- "$@" --sizes "$sizes"

if [ -n "$mpi_peer" ] && [ -x "$mpi_peer" ] && command -v mpirun >/dev/null 2>&1; then
    # two ranks on this host, shared memory (vader) only, as root too (containers)
    if timeout 300 mpirun -np 2 --allow-run-as-root --oversubscribe --mca btl self,vader \
        "$mpi_peer" --sizes "$sizes" >"$out/mpi_coll.json"; then
        cat "$out/mpi_coll.json"
        set -- "$@" --peer "$out/mpi_coll.json"
    else
        echo "peer mpi: failed; continuing without it" >&2
    fi
else
    echo "peer mpi: not installed (Debian: apt-get install openmpi-bin libopenmpi-dev, then" \
        "re-run cmake)" >&2
fi

if [ -x "$py" ] && "$py" -c 'import torch.distributed as d; assert d.is_gloo_available()' \
    2>/dev/null; then
    if timeout 300 "$py" "$here/peers/gloo_coll.py" --sizes "$sizes" >"$out/gloo_coll.json"; then
        cat "$out/gloo_coll.json"
        set -- "$@" --peer "$out/gloo_coll.json"
    else
        echo "peer gloo: failed; continuing without it" >&2
    fi
else
    echo "peer gloo: not installed ($py has no torch.distributed with gloo; Debian:" \
        "apt-get install python3-torch)" >&2
fi
echo >&2
exec "$bench" "$@"
