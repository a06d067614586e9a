"""Hugging Face Trainer: ``train_with_recovery(trainer)``, the recovery playbook around ``trainer.train``.

    from checkpoint_strategy.callbacks import HFCheckpointStrategy, train_with_recovery, last_valid_checkpoint
    trainer = Trainer(..., callbacks=[HFCheckpointStrategy("plan.json")])
    result = train_with_recovery(trainer, resume_from_checkpoint=last_valid_checkpoint(args.output_dir))

The Trainer cannot reload in the middle of its loop, so: a ``TrainingGuard`` (guard.py) reads every
logged loss; on its ``rollback`` the callback stops training (``control.should_training_stop``, and
the post-onset save of that step is not made), then ``trainer.train(resume_from_checkpoint=<the
stable checkpoint>)`` starts again from it with its optimizer state (checked live at its first step:
the guard's ``resumed``; a counter that does not continue stops the run), and for the guard's window:

* LR x0.5: each optimizer step of the window runs with the param groups' LR scaled, restored right
  after the step (before the scheduler's step, so any scheduler keeps its own course);
* ``args.max_grad_norm`` 0.5, the user's value back after the window;
* the batches from the resume step to the onset + 20 skipped: the Trainer draws them (the data order
  stays the run's) and ``training_step`` returns without a forward pass, so no gradient and no
  optimizer update (params without a grad are not stepped) come from them; the loss logged for such a
  step is the last trained step's (the weights did not change), not a zero that reads as a drop.

Bounded as the guard is (max_rollbacks, each checkpoint once); on ``stop`` the run ends with the
guard's ERROR line. Returns a dict: rollbacks (step, onset, checkpoint, resume step, skip, LR window),
skipped_steps, stopped, trains (how many ``trainer.train`` calls), global_step.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from transformers import TrainerCallback

from checkpoint_strategy.callbacks._log import PREFIX, log
from checkpoint_strategy.callbacks.guard import Decision, TrainingGuard
from checkpoint_strategy.callbacks.hf import HFCheckpointStrategy
from checkpoint_strategy.errors import UsageError


class PlaybookCallback(TrainerCallback):
    """Feeds the guard the Trainer's logged losses; applies its LR and clipping window; stops on a rollback."""

    def __init__(self, guard: TrainingGuard, strategy: Any) -> None:
        self.guard = guard
        self.strategy = strategy
        self.decision: Optional[Decision] = None
        self._lrs: Optional[list[float]] = None
        self._user_clip: Optional[float] = None

    def on_train_begin(self, args, state, control, **kwargs):
        # the ranks read now (torch.distributed is set up): rank 0 alone writes the loss log and says the actions
        # from the first step on, not only from the first collective (the rollback's broadcast) on
        _ = self.guard.ranks
        if self._user_clip is None:
            self._user_clip = float(args.max_grad_norm)
        self.decision = None
        return control

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        if (
            self.guard.rollbacks
            and self.decision is None
            and self.guard.resumed(optimizer).action == "stop"
        ):
            self.decision = Decision("stop", state.global_step, reason=str(self.guard.stopped))
            # the optimizer state did not come back: no training on
            control.should_training_stop = True
        step = state.global_step + 1
        clip = self.guard.grad_clip(step)
        args.max_grad_norm = clip if clip is not None else self._user_clip
        scale = self.guard.lr_scale(step)
        if scale != 1.0 and optimizer is not None:
            self._lrs = [g["lr"] for g in optimizer.param_groups]
            for g in optimizer.param_groups:
                g["lr"] = g["lr"] * scale
        return control

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self._lrs is not None and optimizer is not None:
            for g, lr in zip(optimizer.param_groups, self._lrs, strict=False):
                g["lr"] = lr
            self._lrs = None
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or self.decision is not None:
            return control
        step = state.global_step
        if self.guard.skipped and self.guard.skipped[-1] > step - max(1, int(args.logging_steps)):
            # a log that averages skipped (zero) steps says nothing about the weights
            return control
        d = self.guard.step(step, float(logs["loss"]), _num(logs.get("grad_norm")))
        if d.action in ("rollback", "stop"):
            self.decision = d
            control.should_training_stop = True
            if step not in getattr(self.strategy, "_pending", {}):
                control.should_save = False  # this step's weights are the spiked ones
        return control

    def on_save(self, args, state, control, **kwargs):
        self.guard.saved(
            state.global_step, os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        )
        return control


def train_with_recovery(
    trainer,
    *,
    resume_from_checkpoint: Optional[str] = None,
    max_rollbacks: int = 3,
    level: str = "full",
    **playbook: Any,
) -> dict:
    """Run ``trainer.train`` to the end with the recovery playbook (see the module docstring).

    trainer: a ``transformers.Trainer`` with an ``HFCheckpointStrategy`` among its callbacks.
    playbook: the guard's keywords (wait_steps, lr_multiplier, lr_reduced_steps, grad_clip,
    skip_past_onset, stable_ratio, the detection thresholds); numbers from recover's RecoveryOptions.
    """
    strategy = _strategy(trainer)
    # the Trainer logs the loss averaged over the ranks already: every rank's guard decides the same
    # the ranks wait as long as the strategy's
    playbook.setdefault("rank_timeout", strategy.core.rank_timeout)
    guard = TrainingGuard(
        trainer.args.output_dir,
        None,
        max_rollbacks=max_rollbacks,
        level=level,
        average_loss=False,
        **playbook,
    )
    cb = PlaybookCallback(guard, strategy)
    trainer.add_callback(cb)
    # the guard's actions go to the handoff state; the strategy's (preemption, interval) into the guard's loss log
    guard.on_action = strategy.core.actions.append
    strategy.core.action_sink = guard._write
    plain_step = trainer.training_step
    trainer.training_step = _skipping_step(trainer, guard, plain_step)
    try:
        trains = _train_until_done(trainer, cb, strategy, resume_from_checkpoint)
    finally:
        trainer.training_step = plain_step
        strategy.core.action_sink = None
        trainer.remove_callback(cb)
        trainer.args.max_grad_norm = (
            cb._user_clip if cb._user_clip is not None else trainer.args.max_grad_norm
        )
    return {**guard.close(), "trains": trains, "global_step": int(trainer.state.global_step)}


def _strategy(trainer) -> HFCheckpointStrategy:
    """The Trainer's HFCheckpointStrategy callback; a UsageError when it has none."""
    strategy = next(
        (c for c in trainer.callback_handler.callbacks if isinstance(c, HFCheckpointStrategy)), None
    )
    if strategy is None:
        raise UsageError(
            "train_with_recovery: the Trainer has no HFCheckpointStrategy among its callbacks; "
            "expected Trainer(..., callbacks=[HFCheckpointStrategy(policy)])"
        )
    return strategy


def _skipping_step(trainer, guard: TrainingGuard, plain_step):
    """The Trainer's ``training_step`` for the playbook: a step the guard skips makes no forward pass."""

    def training_step(model, inputs, num_items_in_batch=None):
        if guard.skip(trainer.state.global_step + 1):
            import torch

            # no forward pass, no gradient; logged as the last trained loss (the weights did not change)
            last = guard.history[-1][1] if guard.history else 0.0
            accum = max(1, int(getattr(trainer, "current_gradient_accumulation_steps", 1) or 1))
            return torch.tensor(last / accum, device=trainer.args.device)
        return plain_step(model, inputs, num_items_in_batch)

    return training_step


def _train_until_done(
    trainer, cb: PlaybookCallback, strategy: HFCheckpointStrategy, resume: Optional[str]
) -> int:
    """``trainer.train`` again from the stable checkpoint after each rollback; how many calls it took."""
    trains = 0
    while True:
        trains += 1
        trainer.train(resume_from_checkpoint=resume)
        d = cb.decision
        if d is None or d.action != "rollback":
            return trains
        log.info(
            PREFIX + f"resuming from {os.path.basename(str(d.checkpoint))} (step {d.resume_step})"
        )
        strategy.core.restart()
        strategy.rollback_resume = True
        resume = d.checkpoint


def _num(v) -> Optional[float]:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None
