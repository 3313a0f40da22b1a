"""A trainer that survives a lost daemon in place (docs/design-notes.md "Buddy replicas",
"Re-attach in place").

With buddy replicas (AttachReply.replicated) a stage-2 engine on host memory keeps a copy of
every bucket of the accumulation window as it submits it (_grads.GradientStream, link.keep).
When a call to a daemon fails because a daemon of the job was lost -- its own daemon's
connection closed, or its daemon answering ERR_PEER_LOST -- the engine re-attaches the job on a
new session once the daemon is back, moves its parameters and its gradient stream there, and
submits the window's kept buckets again: no process restarts and no step is lost.

ZEROD_REATTACH=0 (read at initialize()) turns it off: the loss is raised, for the launcher's
restart, and no gradient is kept. ZEROD_REATTACH_WAIT_S (120): how long a trainer waits for its
daemon to be back (restarted by its launcher or systemd) and the job's mesh to form.
"""
import os
import sys
import time

from ._codes import (ZC_ERR_BUSY, ZC_ERR_CLOSED, ZC_ERR_IO, ZC_ERR_PEER_LOST, ZC_ERR_TIMEOUT,
                     ZC_ERR_UNREACHABLE)
from ._grads import is_loss
from ._libzc import Session, ZerodError

WAIT_S = float(os.environ.get("ZEROD_REATTACH_WAIT_S", "120"))
# what a daemon not back yet, or a mesh not formed yet, answers an attach
_RETRY = (ZC_ERR_BUSY, ZC_ERR_UNREACHABLE, ZC_ERR_CLOSED, ZC_ERR_IO, ZC_ERR_TIMEOUT,
          ZC_ERR_PEER_LOST)


def enabled(engine):
    """Does `engine` keep its window's buckets to survive a lost daemon in place? A job with
    buddy replicas, at stage 2 (stage 1 sums its gradients in the daemon's grads region), in
    host memory (not a device session nor ZeRO-Offload), unless ZEROD_REATTACH=0."""
    return (os.environ.get("ZEROD_REATTACH", "1") != "0"
            and engine._sess.info.get("replicated", False) and engine.stage == 2
            and engine._dev is None and engine._offload is None)


def survive_loss(engine, err, n_micro, lrs=None):
    """A daemon of the job was lost (err) with `n_micro` micro-steps of the window submitted,
    all of them kept: re-attach in place and submit them again; with lrs (the loss came in the
    step), step again and return its result. The daemons keep the job at its last committed
    step S (the buddy replicas hold the lost shard), so the step the loss interrupted runs
    again on the same inputs; a step that committed before the loss (the lost daemon died
    between its commit and its reply) is not run twice. Another loss meanwhile starts over,
    three times at most."""
    for _ in range(3):
        step0 = engine.global_steps
        lost = reattach(engine, err)
        try:
            if engine.global_steps > step0:  # it committed on every rank before the loss
                return None if lrs is None else {
                    "step": engine.global_steps, "skipped": False,
                    "grad_norm": engine._grad_norm, "loss_scale": engine._loss_scale,
                    "skipped_steps": engine.skipped_steps}
            engine._grads.replay(range(n_micro))
            return None if lrs is None else engine._sess.step(group_lr=lrs)
        except ZerodError as e:
            if not is_loss(e):
                raise
            err = e
        finally:
            # the lost daemon's regions, unmapped once the job went on (60 ms of a 0.7 s
            # recovery when it came before the replay)
            lost.close()
    raise err


def _attach_again(engine, err, t0):
    """A new session attached to the job, as a restarted trainer's attach would (the fresh
    daemon takes its shard from the buddy), retried while the daemon is not back or the mesh
    not formed, up to WAIT_S."""
    env, zdtype, zc_groups, config_json, timeout_ms = engine._attach_args
    while True:
        sess = None
        try:
            sess = Session(env["socket"], timeout_ms)
            sess.attach(env["job"], zc_groups, config_json, zdtype, env["rank"], env["world"],
                        env["coordinator"], resume="auto", restart=True, own_slices_only=True)
            return sess
        except ZerodError as e:
            if sess is not None:
                sess.close()
            if e.status not in _RETRY or time.monotonic() >= t0 + WAIT_S:
                raise ZerodError(e.status, e.name, "zerod: rank %d lost its job (%s) and could "
                                 "not re-attach within %.0f s: %s"
                                 % (engine.rank, err, WAIT_S, e)) from err
        time.sleep(0.02)


def reattach(engine, err):
    """Close the lost session's connection only (its regions stay mapped: the parameters are
    views of them), attach the job again on a new session, then move the parameters to the new
    params region (which holds the job's values at its step) and the gradient stream to the
    new slots, and return the lost session, for the caller to close once the job went on. A
    job that was not recovered (a shard and its replica both lost) raises: the launcher's
    restart goes on from the last checkpoint."""
    t0 = time.monotonic()
    old = engine._sess
    old.disconnect()
    engine._grads.materialize()  # (while the daemon comes back)
    sess = _attach_again(engine, err, t0)
    info = sess.info
    if not info["resumed"] or info["layout_hash"] != old.info["layout_hash"]:
        sess.close()  # the job stays on the daemon for the launcher's restart
        raise ZerodError(err.status, err.name, "zerod: rank %d lost its job (%s); the re-attach "
                         "found %s, so it cannot go on in place: the launcher's restart goes on"
                         % (engine.rank, err, "another layout" if info["resumed"] else
                            "no state to resume (a shard and its replica both lost: the "
                            "daemons fall back to the last checkpoint)")) from err
    engine._sess = sess
    engine.global_steps = info["step"]
    engine._loss_scale = info["loss_scale"] if info["loss_scale"] > 0 else 1.0
    engine._bind_params(fresh=False)
    engine._grads.rebind(engine._stream_link())
    engine.reattaches += 1
    print("zerod: rank %d re-attached in place after a lost daemon (%s): the job goes on at "
          "step %d (%.2f s)" % (engine.rank, err, engine.global_steps, time.monotonic() - t0),
          file=sys.stderr, flush=True)
    return old
