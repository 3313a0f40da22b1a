#!/usr/bin/env python3
"""After a stage-2 backward the trainer does not keep the gradients it handed to the daemon:
zerod.torch copies each gradient into its bucket's slot as it arrives (acquiring the slot
before the bucket is complete) and frees it at once, so no gradient waits in the trainer for
the rest of its bucket; with ZEROD_TRIM_HEAP=1 it also gives the heap's free pages back
(malloc_trim), so the trainer's anonymous memory after several steps stays within an eighth of
the model's gradients of what it was before the first backward.

    test_heap.py

Linear(2048, 4096) then Linear(4096, 1024) (12.6 M fp32 parameters, 50 MB of gradient), world
1, stage 2, 1 Mi-element buckets (each weight spans several): a hook registered after
zerod's on each parameter sees how many gradients are still waiting for a slot, and that
must be none. Binding the first weight to the params region frees its 33.6 MB mmapped
storage, which raises glibc's mmap threshold above the second weight's gradient (16.8 MB), so
that gradient comes from the heap and, freed, stays there unless trimmed. Each trainer is a
fresh process (this script with --child TRIM), so that the figure is its own. Without the
trim the growth is printed, not asserted: what glibc keeps of freed blocks is its behaviour,
not zerod's.
"""
import json
import os
import subprocess
import sys

import zd_fixture as zf

torch = zf.require_torch()


def rss_anon_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def child():
    import zerod.torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.Linear(4096, 1024))
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 2, "reduce_bucket_size": 1 << 20}}
    engine, _, _, _ = zerod.torch.initialize(model=model, config=cfg)
    waiting, accs = [], []
    stream = engine._grads
    for p in model.parameters():  # after zerod's own hook on p, as zerod.torch hooks it
        if hasattr(p, "register_post_accumulate_grad_hook"):
            p.register_post_accumulate_grad_hook(lambda _p: waiting.append(len(stream._pending)))
            continue
        with torch.enable_grad():
            accs.append(p.expand_as(p).grad_fn.next_functions[0][0])
        accs[-1].register_hook(lambda *_: waiting.append(len(stream._pending)))
    x = torch.randn(8, 2048)
    before = rss_anon_kib()
    for _ in range(5):
        engine.backward(engine(x).square().mean())
        engine.step()
    after = rss_anon_kib()
    engine.close()
    grad_kib = sum(p.numel() for p in model.parameters()) * 4 // 1024
    print(json.dumps({"grow_kib": after - before, "grad_kib": grad_kib,
                      "max_waiting": max(waiting), "hooks": len(waiting)}), flush=True)


def run(cluster, trim):
    env = dict(os.environ)
    env.update(cluster.env(0, "heap-%s" % trim))
    env["ZEROD_TRIM_HEAP"] = trim
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    if sys.argv[1:] == ["--child"]:
        child()
        return 0
    if os.environ.get("ASAN_OPTIONS") or os.environ.get("TSAN_OPTIONS"):
        zf.skip("a sanitizer's allocator keeps freed memory on its own terms (quarantine): the "
                "trainer's heap says nothing about zerod.torch there")
    with zf.Cluster(world=1) as cluster:
        kept = run(cluster, "0")
        trimmed = run(cluster, "1")
    print("anonymous memory after 5 steps, above before the first backward: %d KiB with the "
          "trim, %d KiB without (gradients: %d KiB)"
          % (trimmed["grow_kib"], kept["grow_kib"], trimmed["grad_kib"]))
    print("gradients waiting for a slot after a parameter's hook: at most %d (%d hooks)"
          % (kept["max_waiting"], kept["hooks"]))
    assert kept["hooks"] == 20, kept
    assert kept["max_waiting"] == 0, \
        "%d gradients waited in the trainer for their bucket" % kept["max_waiting"]
    assert trimmed["grow_kib"] < trimmed["grad_kib"] // 8, \
        "the trainer kept %d KiB after backward (gradients %d KiB)" % (
            trimmed["grow_kib"], trimmed["grad_kib"])
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
