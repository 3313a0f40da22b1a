#!/usr/bin/env python3
"""zerod.torch API behaviour at world 1 (one daemon, several jobs one after the other).

  - initialize returns (engine, optimizer, None, None); the optimizer is a torch Optimizer
    with the groups' hyper-parameters; registration is reverse parameters() order per group;
  - parameters are views of the params region: their storage never moves, and a step changes
    them in place (no copy);
  - engine.step() is a no-op off the accumulation boundary; zero_grad() anywhere is harmless;
  - a parameter that gets no gradient contributes zeros (AdamW still decays it);
  - get_loss_scale() is 1 in fp32, get_global_grad_norm() is torch's norm of the gradient;
  - optimizer.state_dict()/load_state_dict() round-trip; a changed lr is applied; a changed
    fixed hyper-parameter is refused;
  - close(end_job=False) then initialize() again resumes the job: resumed, global_steps and
    the parameter values come from the daemon, not from the new model;
  - errors from the daemon raise zerod.ZerodError with the status name (bad config, busy
    daemon) and an unreachable socket raises ERR_UNREACHABLE;
  - close() leaves the model with private tensors holding the last values;
  - a CPU-backend session's regions are host memory (Session.memory, .device) and a model
    away from the daemon's regions is refused, naming both places.
"""
import os
import sys

import zd_fixture as zf

torch = zf.require_torch()
import zerod  # noqa: E402
import zerod.torch as zt  # noqa: E402
import zd_ref as zr  # noqa: E402


class WithUnused(zr.MLP):
    def __init__(self, seed=1):
        super().__init__(seed)
        self.unused = torch.nn.Parameter(torch.full((5,), 0.5))


def test_basics(sock):
    model = zr.MLP(1)
    cfg = zr.config(gas=2)
    engine, opt, a, b = zt.initialize(model=model, model_parameters=zr.param_groups(model),
                                      config=cfg, job="api-basics", socket_path=sock)
    assert a is None and b is None
    assert isinstance(opt, torch.optim.Optimizer)
    assert engine.module is model and engine.stage == 2 and not engine.resumed
    assert [g["lr"] for g in opt.param_groups] == [zr.GROUPS[0]["lr"], zr.GROUPS[1]["lr"]]
    assert opt.param_groups[1]["weight_decay"] == zr.GROUPS[1]["weight_decay"]
    assert opt.param_groups[0]["betas"] == zr.BETAS
    # registration: per group, reverse parameters() order
    names = {id(p): n for n, p in model.named_parameters()}
    assert [names[id(p)] for p in engine._params] == [
        "l3.weight", "l2.weight", "l1.weight", "l3.bias", "l2.bias", "l1.bias"]
    # parameters live in the params region
    for pid, p in enumerate(engine._params):
        assert p.data_ptr() == engine._sess.param_ptr(pid)
    ptrs = [p.data_ptr() for p in model.parameters()]
    assert engine.get_loss_scale() == 1.0 and engine.get_global_grad_norm() is None

    # gradient the reference sees at the initial parameters
    ref = zr.MLP(1)
    for k in range(2):
        x, t = zr.batch(0, k, 0)
        (zr.loss_fn(ref(x), t) / 2).backward()
    ref_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in ref.parameters())).item()

    before = zr.params_of(model)
    x, t = zr.batch(0, 0, 0)
    engine.backward(zr.loss_fn(engine(x), t))
    engine.zero_grad()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert engine.is_gradient_accumulation_boundary() is False
    engine.step()  # micro-step 1 of 2: no optimizer step
    assert engine.global_steps == 0 and engine.micro_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, zr.params_of(model)))
    x, t = zr.batch(0, 1, 0)
    engine.backward(zr.loss_fn(engine(x), t))
    engine.step()
    assert engine.global_steps == 1 and engine.skipped_steps == 0 and engine.was_step_applied()
    assert [p.data_ptr() for p in model.parameters()] == ptrs, "parameter storage moved"
    assert not any(torch.equal(a, b) for a, b in zip(before, zr.params_of(model)))
    norm = engine.get_global_grad_norm()
    assert abs(norm - ref_norm) <= 1e-5 * ref_norm, (norm, ref_norm)

    # train/eval reach the module
    assert engine.eval() is engine and not model.training
    engine.train()
    assert model.training

    # optimizer hyper-parameters: round trip, lr applied, fixed keys refused
    sd = opt.state_dict()
    assert sd["state"] == {} and len(sd["param_groups"]) == 2
    assert sd["param_groups"][0]["params"] == [0, 1, 2]
    sd["param_groups"][0]["lr"] = 0.0
    sd["param_groups"][1]["lr"] = 0.0
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["lr"] == 0.0
    bad = opt.state_dict()
    bad["param_groups"][0]["betas"] = (0.5, 0.5)
    try:
        opt.load_state_dict(bad)
    except ValueError as e:
        assert "betas" in str(e)
    else:
        raise AssertionError("a changed betas was accepted")
    try:
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    except RuntimeError:
        pass
    else:
        raise AssertionError("add_param_group after attach was accepted")
    # lr 0: AdamW with lr 0 leaves the parameters bit-identical
    held = zr.params_of(model)
    for k in range(2):
        x, t = zr.batch(1, k, 0)
        engine.backward(zr.loss_fn(engine(x), t))
        engine.step()
    assert engine.global_steps == 2
    assert all(torch.equal(a, b) for a, b in zip(held, zr.params_of(model))), \
        "lr 0 from load_state_dict did not reach the daemon"

    # keep the job, resume it from a differently initialized model
    engine.close(end_job=False)
    assert all(torch.equal(a, b) for a, b in zip(held, zr.params_of(model)))
    assert [p.data_ptr() for p in model.parameters()] != ptrs, "close() kept region views"
    other = zr.MLP(7)
    engine2, opt2, _, _ = zt.initialize(model=other, model_parameters=zr.param_groups(other),
                                        config=cfg, job="api-basics", socket_path=sock)
    assert engine2.resumed and engine2.global_steps == 2
    assert all(torch.equal(a, b) for a, b in zip(held, zr.params_of(other))), \
        "a resumed attach did not take the job's values"
    # a second trainer on the same daemon: busy
    try:
        zt.initialize(model=zr.MLP(1), config=cfg, job="api-other", socket_path=sock)
    except zerod.ZerodError as e:
        assert e.name == "ERR_BUSY", e
        print("busy daemon: %s" % e)
    else:
        raise AssertionError("a second job attached to a busy daemon")
    engine2.close()


def test_unused(sock):
    """A parameter with no gradient contributes zeros: AdamW decays it and nothing else."""
    model = WithUnused(1)
    cfg = zr.config(lr=0.1, extra={"optimizer": {"params": {"lr": 0.1, "weight_decay": 0.2,
                                                            "betas": list(zr.BETAS)}}})
    engine, opt, _, _ = zt.initialize(model=model, config=cfg, job="api-unused", socket_path=sock)
    ref = WithUnused(1)
    ropt = torch.optim.AdamW(ref.parameters(), lr=0.1, weight_decay=0.2, betas=zr.BETAS)
    for s in range(5):
        x, t = zr.batch(s, 0, 0)
        engine.backward(zr.loss_fn(engine(x), t))
        engine.step()
        ropt.zero_grad()
        zr.loss_fn(ref(x), t).backward()
        ref.unused.grad = torch.zeros_like(ref.unused)
        ropt.step()
    d = zr.max_rel_diff(zr.params_of(model), zr.params_of(ref))
    assert d <= 1e-5, d
    want = 0.5 * (1 - 0.1 * 0.2) ** 5
    assert torch.allclose(model.unused.detach(), torch.full((5,), want), rtol=1e-6), model.unused
    engine.close()


def test_ignored_keys(sock):
    """Config keys the daemon accepts but does not use reach the user as a warning."""
    import warnings
    model = zr.MLP(1)
    cfg = zr.config(extra={"wall_clock_breakdown": True})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, _, _, _ = zt.initialize(model=model, config=cfg, job="api-ignored",
                                        socket_path=sock)
    msgs = [str(w.message) for w in caught if "not used" in str(w.message)]
    # train_micro_batch_size_per_gpu is honoured (the batch triple), not in the list
    assert len(msgs) == 1 and "wall_clock_breakdown" in msgs[0] and \
        "train_micro_batch_size_per_gpu" not in msgs[0], [str(w.message) for w in caught]
    assert engine._sess.info["ignored_keys"]
    print("ignored keys told: %s" % msgs[0])
    engine.close()


def test_optimizer_without_torch_add_param_group(sock):
    """The optimizer's groups do not go through torch.optim.Optimizer.add_param_group: in torch
    2.x its first call imports torch._dynamo and sympy (about 80 MiB of anonymous memory in
    every trainer). Defaults fill each group as torch fills them."""
    real = torch.optim.Optimizer.add_param_group

    def refuse(self, group):
        raise AssertionError("torch.optim.Optimizer.add_param_group was called")
    torch.optim.Optimizer.add_param_group = refuse
    try:
        model = zr.MLP(1)
        engine, opt, _, _ = zt.initialize(model=model, model_parameters=zr.param_groups(model),
                                          config=zr.config(), job="api-groups",
                                          socket_path=sock)
    finally:
        torch.optim.Optimizer.add_param_group = real
    assert [len(g["params"]) for g in opt.param_groups] == [3, 3]
    assert all(isinstance(g["params"], list) for g in opt.param_groups)
    assert opt.param_groups[0]["lr"] == zr.GROUPS[0]["lr"]
    for k, v in opt.defaults.items():  # what a group leaves out comes from the defaults
        assert all(k in g for g in opt.param_groups), k
        if k not in zr.GROUPS[0]:
            assert opt.param_groups[0][k] == v, k
    engine.close()


def test_deepspeed_surface(sock, tmp):
    """The DeepSpeed engine calls a ZeRO-1/2 script uses (part of issue 16)."""
    import argparse
    model = zr.MLP(1)
    engine, _, _, _ = zt.initialize(model=model, config=zr.config(gas=2), job="api-ds",
                                    socket_path=sock)
    assert engine.device == torch.device("cpu") and engine.global_rank == 0
    assert engine.dp_world_size == 1 and engine.was_step_applied() is None
    assert engine.train_micro_batch_size_per_gpu() == zr.BATCH
    assert engine.train_batch_size() == zr.BATCH * 2
    for s in range(4):
        x, t = zr.batch(s // 2, s % 2, 0)
        engine.backward(zr.loss_fn(engine(x), t))
        engine.step(lr_kwargs={})
    assert engine.global_steps == 2 and engine.was_step_applied() is True
    assert engine.global_samples == 4 * zr.BATCH
    assert engine.local_rank == 0 and engine.world_size == 1 and engine.module is model
    assert engine.gradient_accumulation_steps() == 2 and engine.get_lr() == [1e-3]
    assert engine.loss_scale == 1.0 and engine.get_loss_scale() == 1.0
    assert engine.get_global_grad_norm() > 0
    assert engine.is_gradient_accumulation_boundary() is False
    engine.set_gradient_accumulation_boundary(True)  # step at the next call, not the second
    assert engine.is_gradient_accumulation_boundary() is True
    x, t = zr.batch(2, 0, 0)
    engine.backward(zr.loss_fn(engine(x), t))
    engine.step()
    assert engine.global_steps == 3, engine.global_steps
    engine.set_gradient_accumulation_boundary(None)
    assert engine.eval() is engine and not model.training
    assert engine.train() is engine and model.training
    try:
        with engine.no_sync():
            pass
    except RuntimeError as e:
        assert "stage 2" in str(e), e
    else:
        raise AssertionError("no_sync was accepted at stage 2")
    assert engine.save_16bit_model(tmp, "m.bin")
    sd = torch.load(os.path.join(tmp, "m.bin"))
    assert set(sd) == set(model.state_dict()) and all(
        torch.equal(sd[k], v) for k, v in model.state_dict().items())
    engine.close()
    args = zt.add_config_arguments(argparse.ArgumentParser()).parse_args(
        ["--deepspeed", "--deepspeed_config", "ds.json"])
    assert args.deepspeed and args.deepspeed_config == "ds.json"
    try:
        zt.zero.Init()
    except RuntimeError as e:
        assert "stage" in str(e), e
    else:
        raise AssertionError("zero.Init was accepted")
    print("DeepSpeed surface: device, ranks, batch sizes, global_samples, was_step_applied(), "
          "no_sync refused at stage 2, save_16bit_model, add_config_arguments, zero.Init refused")


def test_memory(sock):
    """A CPU-backend daemon's regions are host memory: the Session says so after its attach
    (zc_session_memory: MEMORY_HOST, device -1) and forgets it at detach; the engine's
    parameters stay CPU tensors. The device checks of zerod.torch, without a GPU: the model
    must be where the daemon keeps its regions, naming both places."""
    import types
    sess = zerod.Session(sock)
    assert sess.memory is None and sess.device == -1
    info = sess.attach("api-memory", [([4, 16], None)])
    assert sess.memory == zerod.MEMORY_HOST == 0 and sess.device == -1
    assert info["memory"] == zerod.MEMORY_HOST and info["device"] == -1
    sess.fill_stores(16)  # host sessions keep the store plan
    sess.detach()
    assert sess.memory is None and sess.device == -1
    sess.close()

    model = zr.MLP(1)
    engine, _, _, _ = zt.initialize(model=model, config=zr.config(), job="api-memory",
                                    socket_path=sock)
    assert engine._sess.memory == zerod.MEMORY_HOST and engine._dev is None
    assert engine.device == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in model.parameters())
    engine.close()

    def check(memory, device, where, says):
        stub = types.SimpleNamespace(_sess=types.SimpleNamespace(memory=memory, device=device),
                                     socket_path="/run/zerod/x.sock")
        try:
            got = zt.ZerodEngine._check_daemon_device(stub, torch.device(where))
        except ValueError as e:
            assert all(w in str(e) for w in says), (str(e), says)
            return None
        assert not says, "%s accepted on memory %d device %d" % (where, memory, device)
        return got
    assert check(zerod.MEMORY_HOST, -1, "cpu", []) is None
    assert check(zerod.MEMORY_DEVICE, 1, "cuda:1", []) == torch.device("cuda:1")
    check(zerod.MEMORY_DEVICE, 1, "cpu", ["on cpu", "on cuda:1", "x.sock", "model.to('cuda:1')"])
    check(zerod.MEMORY_DEVICE, 1, "cuda:0", ["on cuda:0", "on cuda:1"])
    check(zerod.MEMORY_HOST, -1, "cuda:0", ["on cuda:0", "host memory", "must be on cpu",
                                            "offload_optimizer.device"])
    # ZeRO-Offload: a GPU model with a CPU daemon when the config says offload_optimizer cpu
    offload = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    stub = types.SimpleNamespace(_sess=types.SimpleNamespace(memory=zerod.MEMORY_HOST, device=-1),
                                 socket_path="/run/zerod/x.sock", config=offload, _offload=None)
    assert zt.ZerodEngine._check_daemon_device(stub, torch.device("cuda:0")) is None
    assert stub._offload == torch.device("cuda:0")
    offload["zero_optimization"]["offload_optimizer"]["device"] = "none"
    stub._offload = None
    try:
        zt.ZerodEngine._check_daemon_device(stub, torch.device("cuda:0"))
    except ValueError:
        pass
    else:
        raise AssertionError("offload_optimizer none accepted a GPU model with a CPU daemon")
    # a refusal after the attach leaves the model as it was and ends the job it created
    real = zt.ZerodEngine._check_daemon_device

    def refuse(self, where):
        raise ValueError("zerod: refused for the test (%s)" % where)
    zt.ZerodEngine._check_daemon_device = refuse
    model = zr.MLP(1)
    before, ptrs = zr.params_of(model), [p.data_ptr() for p in model.parameters()]
    try:
        zt.initialize(model=model, config=zr.config(), job="api-refused", socket_path=sock)
    except ValueError as e:
        assert "refused for the test (cpu)" in str(e), e
    else:
        raise AssertionError("the refusal did not reach the caller")
    finally:
        zt.ZerodEngine._check_daemon_device = real
    assert [p.data_ptr() for p in model.parameters()] == ptrs
    assert all(torch.equal(a, b) for a, b in zip(before, zr.params_of(model)))
    try:
        zt.initialize(model=model, config=zr.config(), job="api-refused", socket_path=sock,
                      resume="must")
    except zerod.ZerodError as e:
        assert e.name == "ERR_NOT_FOUND", e
    else:
        raise AssertionError("the refused attach left its job on the daemon")
    meta = torch.nn.Parameter(torch.empty(3, device="meta"))
    try:
        zt.ZerodEngine._params_device([{"params": [meta]}])
    except ValueError as e:
        assert "meta" in str(e), e
    else:
        raise AssertionError("a parameter on meta was accepted")
    print("memory: host session (MEMORY_HOST, device -1); parameters refused away from the "
          "daemon's regions")


def test_errors(sock):
    model = zr.MLP(1)
    try:
        zt.initialize(model=model, config={"zero_optimization": {"stage": 3}}, job="api-bad",
                      socket_path=sock)
    except zerod.ZerodError as e:
        assert e.name == "ERR_CONFIG" and "stage" in e.message, e
        print("bad config: %s" % e)
    else:
        raise AssertionError("stage 3 was accepted")
    # the failed attach left the model untouched (no region views)
    assert all(p.grad is None for p in model.parameters())
    try:  # a refused bf16 config: the model keeps its dtype (converted only once accepted)
        zt.initialize(model=model, config={"bf16": {"enabled": True},
                                           "zero_optimization": {"stage": 3}},
                      job="api-bad", socket_path=sock)
    except zerod.ZerodError as e:
        assert e.name == "ERR_CONFIG", e
    else:
        raise AssertionError("stage 3 was accepted")
    assert all(p.dtype == torch.float32 for p in model.parameters()), \
        [p.dtype for p in model.parameters()]
    try:
        zt.initialize(model=model, config={}, job="api-bad",
                      socket_path=os.path.join(os.path.dirname(sock), "nobody.sock"))
    except zerod.ZerodError as e:
        assert e.name == "ERR_UNREACHABLE", e
    else:
        raise AssertionError("an absent socket did not fail")
    try:
        zt.initialize(model=model, config={}, optimizer=torch.optim.SGD(model.parameters(), 1.0))
    except ValueError:
        pass
    else:
        raise AssertionError("optimizer= was accepted")


def main():
    with zf.Cluster(1, allowed_errors=None) as c:
        sock = c.daemons[0].socket
        test_basics(sock)
        test_unused(sock)
        test_ignored_keys(sock)
        test_optimizer_without_torch_add_param_group(sock)
        test_deepspeed_surface(sock, c.tmp)
        test_memory(sock)
        test_errors(sock)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
