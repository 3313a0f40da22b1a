#!/usr/bin/python3
"""The torch.distributed (gloo) peer of coll_bench.

Two processes (torch.multiprocessing) on this host, init_process_group("gloo",
tcp://127.0.0.1:PORT), one torch thread each. For each total size S (fp32): all_gather (list
form: gloo has no all_gather_into_tensor here), reduce_scatter if this gloo has one, and
all_reduce of S bytes (the stand-in for reduce_scatter). Timed as coll_bench times
zd_coll_ucx: warm-up, then iterations each started after a barrier; an iteration's time is the
slowest rank's; the median is reported.

nccl-tests conventions: S = total bytes (all_gather: the whole output, world x slice;
reduce_scatter: the whole input; all_reduce: the buffer); algbw = S / time; busbw = algbw x
(n-1)/n, all_reduce x 2(n-1)/n; GB = 1e9 B. Rank 0 prints one JSON line per (op, size).

    /usr/bin/python3 gloo_coll.py [--sizes 1,4,16,64,256] [--iters N]
"""
import argparse
import json
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def iters_for(fixed, nbytes):
    """The same counts as coll_bench: about 2 GiB per op and size, 8..40 iterations."""
    if fixed:
        return fixed
    return max(8, min(40, (2 << 30) // nbytes))


def timed(op, iters, warm):
    out = []
    mx = torch.zeros(1, dtype=torch.float64)
    for it in range(warm + iters):
        dist.barrier()
        t0 = time.perf_counter()
        op()
        mx[0] = time.perf_counter() - t0
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        if it >= warm:
            out.append(float(mx[0]))
    return statistics.median(out)


def worker(rank, port, sizes, fixed):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    factor = {"all_gather": (WORLD - 1) / WORLD, "reduce_scatter": (WORLD - 1) / WORLD,
              "all_reduce": 2 * (WORLD - 1) / WORLD}
    have_rs = True
    for mib in sizes:
        nbytes = mib << 20
        total = nbytes // 4
        slc = total // WORLD
        iters, warm = iters_for(fixed, nbytes), (2 if nbytes >= 64 << 20 else 5)
        own = torch.full((slc,), float(rank + 1))
        gathered = [torch.empty(slc) for _ in range(WORLD)]
        full = torch.full((total,), float(rank + 1))
        rs_out = torch.empty(slc)
        ops = [("all_gather", lambda: dist.all_gather(gathered, own))]
        if have_rs:
            try:
                dist.reduce_scatter(rs_out, list(full.chunk(WORLD)))
                ops.append(("reduce_scatter",
                            lambda: dist.reduce_scatter(rs_out, list(full.chunk(WORLD)))))
            except RuntimeError as e:
                have_rs = False
                if rank == 0:
                    print(f"gloo_coll: no reduce_scatter in this gloo ({str(e).splitlines()[0]});"
                          " all_reduce stands in", file=sys.stderr)
        ops.append(("all_reduce", lambda: dist.all_reduce(full)))
        for name, op in ops:
            med = timed(op, iters, warm)
            algbw = nbytes / med / 1e9
            if rank == 0:
                print(json.dumps({"peer": "gloo", "impl": f"torch {torch.__version__} gloo",
                                  "op": name, "world": WORLD, "dtype": "fp32", "bytes": nbytes,
                                  "iters": iters, "time_us": round(med * 1e6, 1),
                                  "algbw_gbps": round(algbw, 3),
                                  "busbw_gbps": round(algbw * factor[name], 3)}), flush=True)
        del own, gathered, full, rs_out
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,16,64,256", help="total sizes S in MiB")
    ap.add_argument("--iters", type=int, default=0, help="timed iterations (default by size)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.start_processes(worker, args=(port, sizes, a.iters), nprocs=WORLD, start_method="fork")


if __name__ == "__main__":
    main()
