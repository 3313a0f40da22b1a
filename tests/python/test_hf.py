#!/usr/bin/env python3
"""zerod.hf: Hugging Face's Trainer on zerod, the script changed by its import line only. A
tiny randomly initialised GPT-2 (2 layers, n_embd 64, vocab 64, no dropout, seed 0; nothing
downloaded) on sequences that count up modulo the vocabulary, two ranks (a trainer process
and a zerod each), per_device_train_batch_size 4, gradient_accumulation_steps 2, lr 1e-2.

    test_hf.py resume|parity

resume  A DeepSpeed config whose values are "auto" (batch sizes, clipping, AdamW's lr, betas,
        eps and weight decay, WarmupDecayLR's warmup and total steps, ZeRO-2's
        reduce_bucket_size). Run A trains 8 steps with save_steps 4; run B, new processes and
        a new job, copies A's checkpoint-4 into its own output_dir and resumes with
        train(resume_from_checkpoint=True). Asserted: the "auto" values as HF fills them for
        DeepSpeed, and the refusals of a value that disagrees with the arguments, of an
        "auto" that HF does not fill, and of another transformers version; the loop trained the engine and Accelerate prepared no model (no DDP); the
        loss falls (the mean of A's last two logged losses under 0.8 times its first two:
        ln 64 = 4.16 at the start, where a model that learns nothing stays; measured 4.16 ->
        3.01); checkpoint-4 holds HF's files and zerod's (latest, global_step4); B starts at
        step 5 and ends at step 8, and its losses of steps 5-8 and its final parameters are
        A's, bit for bit (same data order, RNG states, masters and Adam state).
parity  No config (the default: ZeRO-2, HF's AdamW with its no-decay split, HF's linear
        schedule with warmup, max_grad_norm 1.0) against transformers.Trainer itself (DDP
        over gloo, torch.optim.AdamW), 6 steps each from the same initial weights and data.
        Both are fp32, but the two ranks' gradients are summed in another order, so bits
        differ. Asserted: every final parameter within 1e-5 of HF's (a thousandth of one Adam
        step at lr 1e-2; measured 5.5e-6, in c_attn.bias, whose key third has a gradient that
        is zero but for rounding, which Adam divides by its own tiny root mean square), each
        weight matrix within 1e-5 relative L2 (measured 4.9e-6), the logged losses within
        1e-5 relative and the logged grad_norm (the daemon's, before clipping) within 1e-4
        relative of HF's (measured 4e-6); both ranks' parameters equal.

transformers and accelerate come from the venv of tests/python/hf_venv.sh (transformers 4.44.2,
accelerate 0.32.1, this python's torch): when the python running this cannot import
transformers 4.44, the script makes the venv (once, about 10 s) and runs itself again with its
python. Skips (exit 77, "SKIP: ...") without torch, or when the venv cannot be made (no package
index).
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import zd_fixture as zf  # noqa: E402

WORLD = 2
MICRO, GAS = 4, 2
VOCAB, SEQ = 64, 32

AUTO_CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 1000,
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                             "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                             "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "bf16": {"enabled": "auto"},
}


def supported_transformers():
    try:
        import transformers
    except ImportError:
        return False
    return transformers.__version__.startswith("4.44.")


def into_venv():
    """Run again under the venv's python unless this one has a supported transformers."""
    if supported_transformers():
        return
    if os.environ.get("ZEROD_HF_TEST_IN_VENV"):
        zf.skip("%s (the hf venv's) cannot import transformers 4.44" % sys.executable)
    try:
        r = subprocess.run(["bash", os.path.join(HERE, "hf_venv.sh")], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        zf.skip("tests/python/hf_venv.sh did not make the venv within 240 s")
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["status %d" % r.returncode])[-1]
        zf.skip("no transformers/accelerate venv: %s" % why)
    py = r.stdout.strip().splitlines()[-1]
    os.environ["ZEROD_HF_TEST_IN_VENV"] = "1"
    sys.stdout.flush()
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


def build_model():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def patterns(n):
    """n sequences counting up from a random start, modulo the vocabulary: each token predicts
    the next, so the loss falls within a few steps."""
    import torch
    g = torch.Generator().manual_seed(1234)
    starts = torch.randint(0, VOCAB, (n,), generator=g)
    rows = (starts[:, None] + torch.arange(SEQ)[None, :]) % VOCAB
    return [{"input_ids": r, "labels": r} for r in rows]


def train_rank(use_zerod, output_dir, max_steps, save_steps, config, resume):
    """One rank of a Trainer run; returns what the parent compares."""
    import torch
    if use_zerod:
        from zerod.hf import Trainer, TrainingArguments
    else:
        from transformers import Trainer, TrainingArguments
    # ddp_find_unused_parameters: GPT-2 uses every parameter (else DDP warns each run)
    kw = {"deepspeed": config} if use_zerod else {"ddp_find_unused_parameters": False}
    args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=GAS, max_steps=max_steps, learning_rate=1e-2,
        warmup_steps=2, weight_decay=0.1, logging_steps=1, save_strategy="steps",
        save_steps=save_steps, report_to="none", disable_tqdm=True, use_cpu=True, seed=7,
        **kw)
    model = build_model()
    if not use_zerod:
        # DDP broadcasts the buffers at start; gloo (torch 1.13) has no bool, and GPT-2's
        # causal masks are bool buffers, the same on every rank anyway
        model._ddp_params_and_buffers_to_ignore = [
            n for n, b in model.named_buffers() if b.dtype == torch.bool]
    data = patterns(WORLD * MICRO * GAS * max_steps)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    filled = getattr(args, "zerod_config", None)
    engine_cfg = {}
    if use_zerod:
        orig_create = trainer.create_optimizer_and_scheduler

        def create(num_training_steps):  # the config the engine attached with, for the test
            orig_create(num_training_steps)
            engine_cfg.update(trainer.engine.config)
        trainer.create_optimizer_and_scheduler = create
    out = trainer.train(resume_from_checkpoint=resume)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {"global_step": out.global_step,
            "losses": {h["step"]: h["loss"] for h in logs},
            "grad_norms": {h["step"]: h.get("grad_norm") for h in logs},
            "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "filled": filled, "engine_cfg": engine_cfg,
            "engine_after": trainer.engine if use_zerod else None,
            # what the loop trained: zerod's engine, with no model prepared (DDP) by Accelerate
            "wrapped": type(trainer.model_wrapped).__name__,
            "prepared": len(trainer.accelerator._models)}


def check_auto(filled, engine_cfg, max_steps):
    want = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
            "train_batch_size": WORLD * MICRO * GAS, "gradient_clipping": 1.0}
    for k, v in want.items():
        assert filled[k] == v, (k, filled[k], v)
    p = filled["optimizer"]["params"]
    assert p == {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1}, p
    assert filled["bf16"]["enabled"] is False
    sp = engine_cfg["scheduler"]["params"]
    assert sp == {"warmup_min_lr": 0, "warmup_max_lr": 1e-2, "warmup_num_steps": 2,
                  "total_num_steps": max_steps}, sp
    assert engine_cfg["zero_optimization"]["reduce_bucket_size"] == 64 * 64
    print("auto values filled as HF does: %s" % {k: filled[k] for k in want})


def check_refusals(tmp):
    """In this process (world 1, no daemon): what zerod.hf refuses, each naming the problem."""
    import zerod.hf as zh
    try:
        zh.TrainingArguments(output_dir=tmp, report_to="none", use_cpu=True, max_grad_norm=1.0,
                             deepspeed={"gradient_clipping": 0.5})
        raise AssertionError("a config disagreeing with max_grad_norm was accepted")
    except ValueError as e:
        assert "gradient_clipping=0.5" in str(e) and "max_grad_norm=1.0" in str(e), e
    args = zh.TrainingArguments(output_dir=tmp, report_to="none", use_cpu=True,
                                deepspeed={"zero_optimization": {"stage": 2,
                                                                 "sub_group_size": "auto"}})
    try:
        zh.fill_from_model(zh._config.load_config(args.zerod_config), args, build_model(), 8)
        raise AssertionError("an \"auto\" zerod.hf does not fill was accepted")
    except ValueError as e:
        assert "zero_optimization.sub_group_size" in str(e), e
    try:
        zh._check_version("4.46.0")
        raise AssertionError("transformers 4.46.0 was accepted")
    except ImportError as e:
        assert "4.46.0" in str(e) and "4.44.x" in str(e), e
    print("refused, naming the problem: a mismatch, an unfilled \"auto\", another version")


def case_resume(tmp):
    check_refusals(tmp)
    a_dir, b_dir = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    with zf.Cluster(WORLD) as c:
        a = c.run(train_rank, (True, a_dir, 8, 4, AUTO_CONFIG, None), job="hf-a", timeout=120)
        check_auto(a[0]["filled"], a[0]["engine_cfg"], 8)
        ckpt = os.path.join(a_dir, "checkpoint-4")
        have = set(os.listdir(ckpt))
        for name in ("model.safetensors", "trainer_state.json", "latest", "global_step4",
                     "rng_state_0.pth", "rng_state_1.pth"):
            assert name in have, "checkpoint-4 lacks %s: %s" % (name, sorted(have))
        losses = a[0]["losses"]
        print("run A losses: %s" % ", ".join("%d: %.4f" % kv for kv in sorted(losses.items())))
        first, last = (losses[1] + losses[2]) / 2, (losses[7] + losses[8]) / 2
        # ln(64) = 4.16 at the start; a model that learns nothing stays there (+- 0.05)
        assert last < 0.8 * first, "the loss did not fall: %.4f -> %.4f" % (first, last)
        assert a[0]["engine_after"] is None, "train() left the engine open"
        assert (a[0]["wrapped"], a[0]["prepared"]) == ("ZerodEngine", 0), (
            "the loop trained a %s, Accelerate prepared %d models" % (a[0]["wrapped"],
                                                                     a[0]["prepared"]))
        shutil.copytree(ckpt, os.path.join(b_dir, "checkpoint-4"))
        b = c.run(train_rank, (True, b_dir, 8, 4, AUTO_CONFIG, True), job="hf-b", timeout=120)
    for r in range(WORLD):
        assert a[r]["global_step"] == 8 and b[r]["global_step"] == 8, (a[r]["global_step"],
                                                                       b[r]["global_step"])
    resumed = {s: v for s, v in b[0]["losses"].items() if s > 4}
    assert sorted(resumed) == [5, 6, 7, 8], sorted(b[0]["losses"])
    for s in resumed:
        assert resumed[s] == losses[s], "step %d: resumed loss %r, uninterrupted %r" % (
            s, resumed[s], losses[s])
    for r in range(WORLD):
        for n, p in a[r]["params"].items():
            q = b[r]["params"][n]
            assert p.equal(q), "rank %d %s: resumed differs by %.3g" % (
                r, n, float((p - q).abs().max()))
    print("resumed at step 5 from checkpoint-4: losses of steps 5-8 and the final "
          "parameters equal the uninterrupted run's, bit for bit")


def case_parity(tmp):
    with zf.Cluster(WORLD) as c:
        z = c.run(train_rank, (True, os.path.join(tmp, "z"), 6, 1000, None, None), job="hf-z",
                  timeout=120)
        h = c.run(train_rank, (False, os.path.join(tmp, "h"), 6, 1000, None, None),
                  job="hf-h", timeout=120)
    worst_rel, worst_abs = 0.0, 0.0
    for n, p in h[0]["params"].items():
        q = z[0]["params"][n]
        assert z[1]["params"][n].equal(q), "%s: the ranks' parameters differ" % n
        diff = float((q - p).abs().max())
        worst_abs = max(worst_abs, diff)
        assert diff <= 1e-5, "%s: zerod %.3g from transformers.Trainer" % (n, diff)
        if p.dim() >= 2:
            rel = float((q - p).norm() / p.norm())
            worst_rel = max(worst_rel, rel)
            assert rel <= 1e-5, "%s: zerod %.3g relative L2 from transformers.Trainer" % (
                n, rel)
    print("final parameters against transformers.Trainer: largest difference %.3g, largest "
          "relative L2 of a weight matrix %.3g" % (worst_abs, worst_rel))
    for s, loss in h[0]["losses"].items():
        zl, zn, hn = z[0]["losses"][s], z[0]["grad_norms"][s], h[0]["grad_norms"][s]
        print("step %d: loss %.6f / %.6f, grad_norm %.6f / %.6f (zerod / HF)"
              % (s, zl, loss, zn, hn))
        assert abs(zl - loss) <= 1e-5 * abs(loss), (s, zl, loss)
        assert abs(zn - hn) <= 1e-4 * hn, (s, zn, hn)


def main():
    zf.require_torch()
    case = sys.argv[1] if len(sys.argv) > 1 else ""
    cases = {"resume": case_resume, "parity": case_parity}
    if case not in cases:
        sys.exit("usage: test_hf.py %s" % "|".join(cases))
    into_venv()
    zf.require_world(WORLD)
    import tempfile
    tmp = tempfile.mkdtemp(prefix="zd-hf-")
    try:
        cases[case](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS %s" % case)


if __name__ == "__main__":
    main()
