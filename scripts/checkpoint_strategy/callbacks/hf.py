"""Hugging Face Trainer: ``HFCheckpointStrategy(policy)``, a ``transformers.TrainerCallback``.

    from checkpoint_strategy.callbacks import HFCheckpointStrategy, last_valid_checkpoint
    trainer = Trainer(..., callbacks=[HFCheckpointStrategy("plan.json")])
    trainer.train(resume_from_checkpoint=last_valid_checkpoint(args.output_dir))

What it does to the Trainer (logged at start):
  * ``save_strategy="steps"``, ``save_steps`` = the policy's frequency (a different value set by
    the user is replaced, with a warning); milestone steps off the interval are saved too;
  * ``save_total_limit=None``: the Trainer's own rotation (by mtime, before on_save, without
    checking the new checkpoint) is turned off, with a warning when it was set;
  * after each save (``on_save``): the new checkpoint-N is validated, and only when it is valid
    the project's keep rules prune the folder (keep_last valid, milestones, the Trainer's best,
    the rollback point of an unrecovered spike; never an invalid or incomplete one);
  * ``on_log``: the logged loss and grad norm feed the online spike detector; on a
    ``emergency_save_on`` event it sets ``control.should_save`` (marker first, see
    formats/marker.py); never on a NaN/inf loss;
  * ``on_train_begin`` of a resumed run: warns when the world size or global batch changed since the
    checkpoint resumed from was saved, and says what keeps the LR schedule the same;
  * ``on_train_end``: waits for the background validations (async_save) and writes the
    session-handoff state when ``handoff_dir`` is given;
  * a policy from a plan: each save's blocking time is measured; past 2x the plan's assumed cost the
    interval is re-solved with the plan's model and applied from the next save, logged once (adaptive.py);
  * preemption: SIGTERM / SIGUSR1 (``preemption_signals``) make it save at the next step end and stop
    training, a whole checkpoint that ``last_valid_checkpoint`` resumes from (preempt.py); on by
    default; under torchrun the request is exchanged over the ranks at each step end, so a signal that
    reached one rank makes every rank save at the same step and stop;
  * under torchrun every rank runs it: the ranks meet after each save, each checks its part of the
    files, the verdict is reduced over the run's process group; rank 0 alone prunes, writes the
    marker, the manifest and the handoff; an emergency save is rank 0's decision, broadcast
    (docs/callbacks.md, "Many processes").
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

from transformers import TrainerCallback

from checkpoint_strategy.callbacks.adaptive import for_settings, interruption
from checkpoint_strategy.callbacks.core import (
    DEFAULT_HANDOFF_DIR,
    PREFIX,
    StrategyCore,
    log,
    show_lines,
)
from checkpoint_strategy.callbacks.preempt import Preemption


class HFCheckpointStrategy(TrainerCallback):
    """Apply a checkpoint policy inside ``transformers.Trainer`` (see the module docstring).

    policy: the plan's JSON/YAML file, a PlanReport, or a dict of checkpoint_policy keys.
    level: validation depth after each save, "quick" (headers), "full" (every byte, CRC) or "deep"
        (every value finite, optimizer state whole, no weight-norm jump from the previous checkpoint).
    handoff_dir: session-handoff state folder written at the end, e.g. ".claude/state" for session-handoff
        (default None: no handoff; nothing is written into the working folder).
    handoff_every: also write it every N processed saves.
    join_timeout: seconds to wait at the end for background validations.
    manifest: write the sha256 manifest (integrity.json) of each save that validated, so
        `checkpoint-strategy validate --manifest verify` catches a byte that changes later.
    rank_timeout: under torchrun, seconds a rank waits for the others at the callback's own
        meeting points (after a save, the emergency decision) before it gives up coordinating.
    preemption_signals: the signals that mean "save now and stop" ("auto": SIGTERM and SIGUSR1;
        () turns it off); grace_seconds: how long after the
        signal a step end may take before the signal's own action runs.
    adaptive_interval: with a policy from a plan, follow the measured save cost (adaptive.py).
    """

    def __init__(
        self,
        policy: Any,
        *,
        level: str = "quick",
        handoff_dir: Optional[str] = DEFAULT_HANDOFF_DIR,
        handoff_every: Optional[int] = None,
        join_timeout: float = 600.0,
        manifest: bool = True,
        rank_timeout: float = 600.0,
        preemption_signals: Any = "auto",
        grace_seconds: float = 120.0,
        adaptive_interval: bool = True,
    ) -> None:
        self.core = StrategyCore(
            policy,
            level=level,
            handoff_dir=handoff_dir,
            handoff_every=handoff_every,
            join_timeout=join_timeout,
            manifest=manifest,
            rank_timeout=rank_timeout,
        )
        self._configured = False
        self._pending: dict[int, str] = {}
        self.preemption = Preemption(preemption_signals, grace_seconds)
        self.adaptive = for_settings(self.core.settings, self.core.frequency, adaptive_interval)
        self._save_t0: Optional[float] = None
        self.rollback_resume = (
            False  # train_with_recovery's next train is a rollback's resume (no interruption)
        )

    @property
    def preempted(self) -> Optional[dict]:
        """The preemption save's record, once made."""
        return self.preemption.record

    # ------------------------------------------------------------------ configuration

    def _configure(self, args, state=None) -> None:
        freq = self.core.frequency
        if state is not None:
            state.save_steps = freq  # the Trainer copied args.save_steps into the state already
        self.core.root = os.path.abspath(args.output_dir)
        if self._configured:
            return
        self._configured = True
        strategy = getattr(args.save_strategy, "value", args.save_strategy)
        if args.save_total_limit is not None:
            log.warning(
                PREFIX
                + f"save_total_limit={args.save_total_limit} turned off: the Trainer rotates by "
                "mtime before checking the new checkpoint; checkpoint-strategy validates it first and keeps "
                f"keep_last={self.core.settings.keep_last} valid checkpoints plus milestones and best"
            )
        if strategy != "steps" or args.save_steps not in (freq, 500):
            log.warning(
                PREFIX
                + f"save_strategy={strategy!r} save_steps={args.save_steps} replaced by the policy: "
                f"every {freq} steps"
            )
        args.set_save(
            strategy="steps", steps=freq, total_limit=None, on_each_node=args.save_on_each_node
        )
        if self.core.settings.save_optimizer and getattr(args, "save_only_model", False):
            log.warning(
                PREFIX
                + "save_only_model=True: checkpoints carry no optimizer state, but the policy says "
                "save_optimizer; a resume will restart Adam's moments from zero"
            )
        log.info(
            PREFIX
            + f"saving every {freq} steps into {self.core.root}"
            + (
                f", milestones {list(self.core.settings.milestones)[:8]}"
                if self.core.settings.milestones
                else ""
            )
            + (
                f", keep_last {self.core.settings.keep_last}"
                if self.core.settings.keep_last
                else ""
            )
            + f", validation {self.core.level}"
            + (" in the background" if self.core.settings.async_save else "")
            + (
                f", emergency saves on {', '.join(self.core.settings.emergency_save_on)}"
                if self.core.settings.emergency_save_on
                else ""
            )
        )

    def on_init_end(self, args, state, control, **kwargs):
        self._configure(args)
        return control

    def on_train_begin(self, args, state, control, **kwargs):
        self._configure(args, state)
        _show_lines(args, state)
        self.core.start()
        self.preemption.rank_zero = self.core.rank_zero
        self.preemption.install_for(int(args.world_size), ranks=self.core.ranks)
        if state.global_step > 0:
            self._interrupted(state)
        if (
            state.global_step > 0
        ):  # resumed: the Trainer loaded checkpoint-<global_step> (when it was this folder's)
            self.core.check_resume(
                os.path.join(args.output_dir, f"checkpoint-{state.global_step}"),
                world_size=int(args.world_size),
                per_device_batch=int(args.per_device_train_batch_size),
                accumulation=int(args.gradient_accumulation_steps),
            )
        return control

    def _interrupted(self, state) -> None:
        """A resumed run: one interruption of it (adaptive.interruption), for the adaptive interval's failure rate.
        A rollback's resume (train_with_recovery) is not one."""
        if self.rollback_resume:
            self.rollback_resume = False
            return
        self.core.record_action(
            interruption(
                self.core.root,
                state.global_step,
                self.core.previous_actions("checkpoint-strategy:interruption"),
                self.core.ranks if self.adaptive is not None else None,
                self.adaptive,
            )
        )

    # ------------------------------------------------------------------ hooks

    def on_step_end(self, args, state, control, **kwargs):
        if self.core.forced_save(state.global_step):
            control.should_save = True
        if self.preemption.at_step_end(state.global_step):
            control.should_save = control.should_training_stop = True
        if control.should_save:
            self._save_t0 = time.monotonic()
            self.preemption.begin_save(
                os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            )
            self.core.before_save()
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return control
        # every rank logs the same loss (the Trainer averages it over the processes), so every rank's
        # detector decides the same; on an event rank 0 writes the marker and broadcasts whether it
        # could: every rank saves or none does
        step = state.global_step
        kind = self.core.decide_emergency(
            step,
            _num(logs.get("loss")),
            _num(logs.get("grad_norm")),
            lambda: os.path.join(args.output_dir, f"checkpoint-{step}"),
        )
        if kind is not None:
            self._pending[state.global_step] = kind
            if not control.should_save:
                self.core.before_save()
            control.should_save = True  # the Trainer saves right after on_log, in the same step
            self.preemption.begin_save(os.path.join(args.output_dir, f"checkpoint-{step}"))
        return control

    def on_save(self, args, state, control, **kwargs):
        # every rank: the callback meets the other ranks (all finished writing) before anything reads the files
        step = state.global_step
        path = os.path.join(args.output_dir, f"checkpoint-{step}")
        if self.preemption.save_written(
            step
        ):  # the preemption save (or the signal came during this save)
            control.should_training_stop = True
        self.core.saved(path, step, self._pending.pop(step, None))
        if self.adaptive is not None and self._save_t0 is not None:
            new = self.adaptive.measured(time.monotonic() - self._save_t0, step, self.core.ranks)
            if new is not None:
                self.core.frequency_override = state.save_steps = args.save_steps = new
                self.core.record_action(self.adaptive.record(step))
        self._save_t0 = None
        self.preemption.finish_save(self.core.root, path, step, self.core.record_action)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.preemption.uninstall()
        self.core.end()
        return control


def _show_lines(args, state) -> None:
    """The routine lines (saved / validated / pruned, the end summary) shown as the Trainer shows its
    logs: on the main process, through tqdm.write (the progress bar stays whole), at INFO; at the
    Trainer's log level when set (``log_level`` / ``log_level_replica``)."""
    main = state.is_world_process_zero
    level = logging.INFO if main and args.log_level == "passive" else args.get_process_log_level()
    try:
        from tqdm.auto import tqdm

        write = tqdm.write
    except ImportError:
        write = None
    show_lines(level, write)


def _num(v) -> Optional[float]:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None
