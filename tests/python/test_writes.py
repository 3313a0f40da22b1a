#!/usr/bin/env python3
"""Weights written after initialize() reach the daemon's master, and a client optimizer's lr
reaches the daemon (client/python/README.md, "Parameters live in shared memory").

    test_writes.py [--world N]

For fp32 (the params region is the master) and bf16 (the daemon keeps an fp32 master), after
two trained steps every rank writes the same new weights four ways: model.load_state_dict
(DeepSpeed's load-after-wrapping pattern), torch.nn.init on one layer, `p.data = t` (a new
storage), and `p.data.copy_(t)` followed by engine.reload_params(). Each is followed by a step
at lr 0 with no weight decay, which leaves the master as it is: the parameters after that step
must still be exactly the written values (the ranks meet at a barrier after each check: the
ranks of one host share the parameters' memory, so one rank's next write is seen at once by
the others). Before the fix, fp32 died with SIGSEGV (the region was
mapped read-only) and bf16 got its old weights back from the master.

Each rank builds its model from another seed, as an unseeded script does: with
torch.distributed initialized every rank starts from rank 0's model, as in DeepSpeed.

Then the lr: an AdamW and a LambdaLR built on it (lr 0 at first, as a warmup from 0 starts)
before initialize, the AdamW passed as optimizer= and the scheduler not (Accelerate's path):
stepping that scheduler must change the lr the daemon uses, so the weights move.
"""
import os
import sys

import zd_fixture as zf

torch = zf.require_torch()

WIDTH = 16


def _model(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
                               torch.nn.Linear(WIDTH, 4))


def _cfg(bf16):
    cfg = {"train_micro_batch_size_per_gpu": 4,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
           "zero_optimization": {"stage": 2, "reduce_bucket_size": 64}}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def _train_step(engine, seed, lr=None):
    if lr is not None:
        for g in engine.optimizer.param_groups:
            g["lr"] = lr
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, WIDTH, generator=g).to(engine.dtype)
    engine.backward(engine(x).float().pow(2).mean())
    engine.step()


def _target(model, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g).to(v.dtype) for k, v in
            model.state_dict().items()}


def _expect(model, want, what):
    for k, v in model.state_dict().items():
        if not torch.equal(v, want[k]):
            raise AssertionError("%s: %s is not the written value after a step at lr 0 "
                                 "(max diff %g)" % (what, k, (v.float() - want[k].float())
                                                    .abs().max()))
    # the ranks of one host share the parameters' memory: one rank's next write must not
    # land while another still checks this one
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _writes(bf16):
    import zerod.torch
    rank = int(os.environ["RANK"])
    if int(os.environ["WORLD_SIZE"]) > 1:
        zerod.torch.init_distributed()
    model = _model(1 + rank)  # an unseeded script: each rank builds another model
    engine, _, _, _ = zerod.torch.initialize(model=model, config=_cfg(bf16))
    dtype = engine.dtype
    for p, want in zip(model.parameters(), _model(1).to(dtype).parameters()):
        assert torch.equal(p.detach(), want.detach()), "the ranks did not start from rank 0's model"
    for s in range(2):
        _train_step(engine, s)

    want = _target(model, 10)
    model.load_state_dict(want)
    _train_step(engine, 2, lr=0.0)
    _expect(model, want, "load_state_dict")

    with torch.no_grad():
        torch.nn.init.constant_(model[0].weight, 0.25)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    _train_step(engine, 3, lr=0.0)
    _expect(model, want, "torch.nn.init")

    p = model[2].weight
    p.data = torch.full(p.shape, -0.5, dtype=p.dtype)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    _train_step(engine, 4, lr=0.0)
    _expect(model, want, "p.data = t")
    before = p.detach().clone()
    _train_step(engine, 5, lr=1e-2)  # the rebound parameter still trains
    assert not torch.equal(p.detach(), before), "p.data = t: the parameter no longer trains"

    want = _target(model, 11)
    for k, v in model.state_dict().items():
        v.data.copy_(want[k])  # not counted by torch: reload_params says so
    engine.reload_params()
    _train_step(engine, 6, lr=0.0)
    _expect(model, want, "p.data.copy_ + reload_params")
    engine.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return True


def _client_lr(bf16):
    import zerod.torch
    model = _model()
    if bf16:
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 2.0))
    cfg = _cfg(bf16)
    del cfg["optimizer"]
    engine, eopt, _, _ = zerod.torch.initialize(model=model, optimizer=opt, config=cfg)
    assert engine.get_lr() == [0.0], engine.get_lr()
    before = [p.detach().clone() for p in model.parameters()]
    seen = []
    for s in range(4):
        _train_step(engine, s)
        sched.step()
        seen.append(engine.get_lr()[0])
    assert seen == [0.5e-2, 1e-2, 1e-2, 1e-2], seen
    assert eopt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    moved = any(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    assert moved, "a scheduler on the client optimizer never reached the daemon"
    engine.close()
    return True


def main():
    world = zf.parse_world()
    zf.require_world(world)
    for bf16 in (False, True):
        for fn in (_writes, _client_lr):
            with zf.Cluster(world) as c:
                assert all(c.run(fn, (bf16,), timeout=50))
            print("%s %s: ok" % (fn.__name__.lstrip("_"), "bf16" if bf16 else "fp32"),
                  flush=True)
    print("OK")


if __name__ == "__main__":
    sys.exit(main())
