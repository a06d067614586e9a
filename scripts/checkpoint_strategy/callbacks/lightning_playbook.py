"""Lightning: ``fit_with_recovery(trainer, model, ...)``, the recovery playbook around ``trainer.fit``.

    from checkpoint_strategy.callbacks import LightningCheckpointStrategy, fit_with_recovery, last_valid_checkpoint
    trainer = Trainer(..., callbacks=[LightningCheckpointStrategy("plan.json"), ModelCheckpoint(dirpath="ckpt/")])
    result = fit_with_recovery(trainer, model, datamodule=dm, ckpt_path=last_valid_checkpoint("ckpt/"))

As for the HF Trainer (hf_playbook.py): a ``TrainingGuard`` (guard.py) reads the training-step loss of
every step; on its ``rollback`` the fit stops (``trainer.should_stop``), then ``trainer.fit(...,
ckpt_path=<the stable checkpoint>)`` starts again from it with its optimizer state (checked live at
its first batch: the guard's ``resumed``; a counter that does not continue stops the run), and for the
guard's window:

* LR x0.5: the optimizers' param-group LR is scaled from the batch start to the batch end (before the
  LR scheduler's step, so a scheduler keeps its own course);
* ``trainer.gradient_clip_val`` 0.5 (norm), the user's value back after the window;
* the batches from the resume step to the onset + 20 are drawn and skipped: ``training_step`` returns
  None without a forward pass (Lightning then makes no backward and the optimizer moves no weight); under
  DDP, where Lightning refuses None, it returns the last trained loss plus 0 x the weights (every rank runs
  the backward and DDP's all_reduce together) and the zero gradients are dropped before the optimizer step.

Checkpoints the first pass saved after the onset (spiked weights) get the emergency marker (not a
resume point for ``last_valid_checkpoint``, not a rollback target). The data order of the resumed fit
is Lightning's: a checkpoint at an epoch end (or a resumable loader) continues with the same batches (one
a resumed fit saved too: the playbook counts the epoch Lightning 2.6 leaves uncounted there, which a later
resume from it would draw again); a mid-epoch checkpoint with a plain DataLoader restarts the epoch
(Lightning warns), and the skipped steps are then other batches. Returns the guard's summary plus ``fits``
and ``global_step``.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from checkpoint_strategy.callbacks._log import PREFIX, log
from checkpoint_strategy.callbacks.guard import Decision, TrainingGuard
from checkpoint_strategy.callbacks.lightning import (
    LightningCheckpointStrategy,
    _callback_bases,
    _loss_of,
)
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.marker import read_marker, write_marker


class _Playbook(*_callback_bases()):  # type: ignore[misc]
    """Feeds the guard each step's loss; applies its LR and clipping window; stops the fit on a rollback."""

    def __init__(self, guard: TrainingGuard, core: Any, preemption: Any = None) -> None:
        super().__init__()
        self.guard, self.core, self.preemption = guard, core, preemption
        self.decision: Optional[Decision] = None
        self.user_clip: Any = None
        self._clip_read = False
        self._lrs: Optional[list[list[float]]] = None

    def on_train_start(self, trainer, pl_module) -> None:
        if not self._clip_read:
            self.user_clip, self._clip_read = trainer.gradient_clip_val, True
        self.decision = None
        _count_resumed_epoch(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # the strategy's on_train_start has run
        if self.guard.root is None and self.core.root is not None:
            self.guard.root, self.guard._metrics_on = self.core.root, bool(trainer.is_global_zero)
        step = trainer.global_step + 1
        if self.guard.rollbacks and self.decision is None and trainer.optimizers:
            # the optimizer state back? (the guard's live check)
            d = self.guard.resumed(trainer.optimizers[0])
            if d.action == "stop":
                self.decision = Decision(
                    "stop", trainer.global_step, reason=str(self.guard.stopped)
                )
                trainer.should_stop = True
        clip = self.guard.grad_clip(step)
        trainer.gradient_clip_val = clip if clip is not None else self.user_clip
        scale = self.guard.lr_scale(step)
        if scale != 1.0:
            self._lrs = [[g["lr"] for g in opt.param_groups] for opt in trainer.optimizers]
            for opt in trainer.optimizers:
                for g in opt.param_groups:
                    g["lr"] = g["lr"] * scale

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        # a skipped step under DDP: its zero gradients go, the optimizer then steps no weight
        if self.guard.skipped[-1:] == [trainer.global_step + 1]:
            for p in pl_module.parameters():
                p.grad = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._lrs is not None:
            for opt, lrs in zip(trainer.optimizers, self._lrs, strict=False):
                for g, lr in zip(opt.param_groups, lrs, strict=False):
                    g["lr"] = lr
            self._lrs = None
        step = trainer.global_step
        loss = _loss_of(outputs)
        if self.decision is not None or loss is None or self.guard.skipped[-1:] == [step]:
            return
        d = self._step(step, loss)
        if d.action in ("rollback", "stop"):
            self.decision = d
            trainer.should_stop = True

    def _step(self, step: int, loss: float) -> Decision:
        """The guard's step. Under many processes the strategy's preemption request rides on the guard's loss
        all_reduce (its 4th number, as in a plain loop): whether any rank had one goes to the strategy, whose
        step end then saves on every rank or on none, without an all_reduce of its own."""
        pre, guard = self.preemption, self.guard
        if pre is None or not pre.exchanges or guard.stopped is not None or not guard.average_loss:
            return guard.step(step, loss)
        carried = guard.preemption
        carried.requested = pre.requested  # this rank's request now (a later signal: the next step)
        try:
            d = guard.step(step, loss)
            pre.agreed(step, carried.requested is not None)
        finally:
            carried.requested = carried.received_at = None
        return d


def _count_resumed_epoch(trainer) -> None:
    """Lightning (2.6.6) resuming from a save at an epoch's last batch (restarted mid-epoch) finishes that epoch,
    then starts the next without counting it ready and started: every save of the resumed fit says that epoch was
    never begun, and a fit resumed from one of them (a second rollback's target) draws it again (the samplers'
    set_epoch one behind: other batches at every step, the skipped steps not the batches of the first pass). Counted
    here, at the start of the fit, before its first epoch; a Lightning that counts it leaves nothing to count."""
    loop = getattr(trainer, "fit_loop", None)
    progress = getattr(loop, "epoch_progress", None)
    if progress is None or getattr(loop, "restarted_mid_epoch", False) is not True:
        return
    total = progress.total
    if total.ready == total.started == total.processed:
        progress.increment_ready()
        progress.increment_started()


def fit_with_recovery(
    trainer,
    model,
    datamodule=None,
    *,
    train_dataloaders=None,
    val_dataloaders=None,
    ckpt_path: Optional[str] = None,
    max_rollbacks: int = 3,
    level: str = "full",
    **playbook: Any,
) -> dict:
    """Run ``trainer.fit`` to the end with the recovery playbook (see the module docstring).

    trainer: a Lightning ``Trainer`` with a ``LightningCheckpointStrategy`` among its callbacks.
    playbook: the guard's keywords (wait_steps, lr_multiplier, lr_reduced_steps, grad_clip,
    skip_past_onset, stable_ratio, the detection thresholds); numbers from recover's RecoveryOptions.
    """
    strategy = _strategy(trainer)
    # the ranks wait as long as the strategy's
    playbook.setdefault("rank_timeout", strategy.core.rank_timeout)
    guard = TrainingGuard(None, None, max_rollbacks=max_rollbacks, level=level, **playbook)
    core, plain_step = strategy.core, model.training_step
    cb = _Playbook(guard, core, strategy.preemption)
    # first: the LR is restored before any callback saves the optimizer
    trainer.callbacks.insert(0, cb)
    own_step = _install(trainer, model, cb, plain_step)
    data = {
        "train_dataloaders": train_dataloaders,
        "val_dataloaders": val_dataloaders,
        "datamodule": datamodule,
    }
    try:
        fits = _fit_until_done(trainer, model, cb, data, ckpt_path)
    finally:
        _uninstall(trainer, model, cb, own_step, plain_step)
    return {**guard.close(), "fits": fits, "global_step": int(trainer.global_step)}


def _strategy(trainer) -> LightningCheckpointStrategy:
    """The Trainer's LightningCheckpointStrategy callback; a UsageError when it has none."""
    strategy = next(
        (c for c in trainer.callbacks if isinstance(c, LightningCheckpointStrategy)), None
    )
    if strategy is None:
        raise UsageError(
            "fit_with_recovery: the Trainer has no LightningCheckpointStrategy among its callbacks; "
            "expected Trainer(..., callbacks=[LightningCheckpointStrategy(policy)])"
        )
    return strategy


def _install(trainer, model, cb: _Playbook, plain_step: Any) -> bool:
    """The guard wired into the strategy and the model: the strategy's saves reported to it, the skipped steps'
    ``training_step``, one loss log (the guard's). Whether the model had its own ``training_step`` attribute."""
    guard, core = cb.guard, cb.core
    plain_saved = core.saved

    def saved(path, step, emergency=None):
        # not a save after this fit's rollback decision (its batch end, the checkpoint callbacks after ours): spiked
        # weights, marked after the fit; the resumed fit saves that step again under another name (ModelCheckpoint's
        # -v1), and the ranks agree on a rollback target by its step alone (guard._agreed): told of both, every
        # rank took the first, the spiked one
        if cb.decision is None or cb.decision.action != "rollback":
            guard.saved(int(step), path, kind="emergency" if emergency else "scheduled")
        return plain_saved(path, step, emergency)

    def training_step(*args, **kwargs):
        if guard.skip(trainer.global_step + 1):
            return _skipped_step(trainer, model, guard)
        return plain_step(*args, **kwargs)

    guard.on_action = core.actions.append  # the guard's actions go to the handoff state
    # the strategy's (preemption, interval) into the guard's loss log
    core.action_sink = _sink(guard, core)
    own_step = "training_step" in model.__dict__
    model.training_step = training_step
    # one loss log: the guard writes every loss and action to it (prune reads it); the strategy writes none
    vars(core).update(saved=saved, _log_metric=lambda *a, **k: None)
    return own_step


def _fit_until_done(trainer, model, cb: _Playbook, data: dict, resume: Optional[str]) -> int:
    """``trainer.fit`` again from the stable checkpoint after each rollback; how many fits it took."""
    guard, core = cb.guard, cb.core
    fits = 0
    while True:
        fits += 1
        trainer.should_stop = False
        trainer.fit(model, **data, ckpt_path=resume)
        d = cb.decision
        if d is None or d.action != "rollback":
            return fits
        _mark_after_onset(guard, core.root, d, trainer.is_global_zero)
        log.info(
            PREFIX + f"resuming from {os.path.basename(str(d.checkpoint))} (step {d.resume_step})"
        )
        core.restart()
        vars(core)["retire_old_metrics"] = lambda: None  # the log of this run, kept across its fits
        resume = d.checkpoint


def _uninstall(trainer, model, cb: _Playbook, own_step: bool, plain_step: Any) -> None:
    """The model, the strategy and the Trainer as they were before the playbook (the user's clipping back)."""
    if own_step:
        model.training_step = plain_step
    else:
        model.__dict__.pop("training_step", None)
    for name in ("saved", "_log_metric", "retire_old_metrics"):
        cb.core.__dict__.pop(name, None)
    cb.core.action_sink = None
    trainer.callbacks.remove(cb)
    trainer.gradient_clip_val = cb.user_clip


def _sink(guard: TrainingGuard, core: Any) -> Any:
    """The strategy's records (preemption, interval, a resumed launch's interruption), written by the guard into its
    loss log, the one handle on it. The interruption comes at on_train_start, before the guard's first batch gives
    it the folder: it gets it here (record_action calls this on rank 0 alone)."""

    def write(rec: dict) -> None:
        if guard.root is None and core.root is not None:
            guard.root, guard._metrics_on = core.root, True
        guard._write(rec)

    return write


def _skipped_step(trainer, model, guard: TrainingGuard) -> Any:
    """What `training_step` returns for a skipped step: None alone (no forward pass, no backward, no weight
    moved). Lightning refuses None under DDP (every rank must run the backward, DDP's gradient all_reduce): the last
    trained loss plus 0 x the weights, no forward pass; its zero gradients are dropped before the optimizer step
    (_Playbook.on_before_optimizer_step), so the optimizer moves no weight, as with None."""
    if int(getattr(trainer, "world_size", 1) or 1) <= 1:
        return None
    import torch

    last = guard.history[-1][1] if guard.history else 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    zero = torch.stack([p.sum() for p in params]).sum() * 0.0 if params else torch.zeros(())
    return zero + last


def _mark_after_onset(guard: TrainingGuard, root: Optional[str], d: Decision, zero: bool) -> None:
    """The checkpoints the rolled-back pass saved after the onset hold spiked weights: marked, never a resume point."""
    from checkpoint_strategy.formats import identify as fm

    onset = guard.rollbacks[-1]["onset"] if guard.rollbacks else d.step
    if not zero or root is None or not os.path.isdir(root):
        return
    for name in sorted(os.listdir(root)):
        step = fm.step_from_name(name)
        path = os.path.join(root, name)
        if (
            step is None
            or step < onset
            or not name.endswith(".ckpt")
            or read_marker(path) is not None
        ):
            continue
        try:
            write_marker(
                path,
                event="loss_spike_detected",
                step=step,
                rules=[
                    f"saved after the onset {onset} of a spike rolled back to step {d.resume_step}"
                ],
            )
        except OSError as exc:
            log.warning(
                PREFIX + f"cannot mark {name} (saved after the spike) as not a resume point: {exc}"
            )
