"""Lightning: ``LightningCheckpointStrategy(policy)``, a Callback of ``lightning.pytorch`` and/or
``pytorch_lightning`` (whichever are installed: the class derives from both Callback classes, so
either Trainer accepts it).

    from checkpoint_strategy.callbacks import LightningCheckpointStrategy, last_valid_checkpoint
    trainer = Trainer(..., callbacks=[LightningCheckpointStrategy("plan.json")])
    trainer.fit(model, data, ckpt_path=last_valid_checkpoint("checkpoints/"))

What it does (logged at setup):
  * the Trainer's ModelCheckpoint (yours, or Lightning's default one) is configured:
    ``every_n_train_steps`` = the policy's frequency (epoch/time triggers off) and
    ``save_top_k=-1`` (Lightning deletes old top-k files after a save without checking the new
    one; warned when you set something else); milestone steps off the interval are saved too.
    A ModelCheckpoint that monitors a metric with a top-k of its own (``save_top_k`` other than -1)
    is yours to keep the best: it is left exactly as you set it (monitor, top-k, triggers: widening it
    would make every file a "best" and fill the disk), and the callback writes the policy's saves
    itself (``epoch=E-step=N.ckpt`` every interval, in that ModelCheckpoint's dirpath);
  * every ``trainer.save_checkpoint`` (ModelCheckpoint's, yours, ours) is followed by the
    validation of the written file and, only when it is valid, the project's keep rules
    (keep_last valid, milestones, ModelCheckpoint's best_model_path, the rollback point of an
    unrecovered spike);
  * the training-step loss (every ``log_every_n_steps``, or ``detect_every``) and, when
    ``gradient_norm_exceeded`` is a trigger, the grad norm feed the online spike detector; an
    event saves ``epoch=E-step=N-emergency.ckpt`` with a ``.checkpoint-strategy.json`` marker
    beside it (written first); never on a NaN/inf loss;
  * at the end of fit: waits for background validations, writes the session-handoff state;
  * a policy from a plan: each save's blocking time is measured; past 2x the plan's assumed cost the
    interval is re-solved with the plan's model and applied from the next save (ModelCheckpoint's
    every_n_train_steps), logged once and recorded in the loss log (adaptive.py); each resumed fit is an
    interruption counted over the launches;
  * preemption: SIGTERM / SIGUSR1 (``preemption_signals``) make it save ``epoch=E-step=N.ckpt`` at the next
    ``on_train_batch_end`` and set ``trainer.should_stop``: ``fit`` returns, the process exits 0, and
    ``last_valid_checkpoint`` resumes from that save (preempt.py; the Trainer's min_steps / min_epochs do not hold the
    fit past it: lifted for the rest of that fit, warned at its start; nor does the validation pass Lightning runs
    when should_stop is set: skipped for that stop); Lightning's own SIGTERM handler is replaced
    for the fit; on by default; under DDP the request is exchanged over the ranks at each step end (every rank
    saves at the same step and stops);
  * under DDP / FSDP / DeepSpeed every rank runs it: the loss is averaged over the ranks (an
    all_reduce started at the detection step and taken at the next step's end, so the training
    thread does not wait on it: an emergency save comes one step after the spiked loss), every
    rank's detector decides the same, rank 0 alone writes the loss log, the marker, the manifest
    and prunes; the ranks share the validation of each save (docs/callbacks.md, "Many processes").
"""

from __future__ import annotations

import importlib
import os
import re
import time
from typing import Any, Optional

from checkpoint_strategy.callbacks.core import DEFAULT_HANDOFF_DIR, PREFIX, StrategyCore, log
from checkpoint_strategy.errors import UsageError


def _callback_bases() -> tuple[type, ...]:
    bases = []
    for mod in ("lightning.pytorch", "pytorch_lightning"):
        try:
            bases.append(importlib.import_module(mod).Callback)
        except ImportError:
            continue
    if not bases:
        raise ImportError(
            "LightningCheckpointStrategy needs lightning or pytorch_lightning installed"
        )
    return tuple(bases)


def _async_io_executor(trainer):
    """The single-thread executor of Lightning's AsyncCheckpointIO (the save returns before the file
    is written), or None for a synchronous CheckpointIO."""
    io = getattr(getattr(trainer, "strategy", None), "checkpoint_io", None)
    for _ in range(3):  # wrappers keep the inner plugin in .checkpoint_io
        if io is None:
            return None
        if type(io).__name__ == "AsyncCheckpointIO":
            return getattr(io, "_executor", None)
        io = getattr(io, "checkpoint_io", None)
    return None


def _is_model_checkpoint(cb: Any) -> bool:
    return any(c.__name__ == "ModelCheckpoint" for c in type(cb).__mro__)


class LightningCheckpointStrategy(*_callback_bases()):  # type: ignore[misc]
    """Apply a checkpoint policy inside a Lightning Trainer (see the module docstring).

    policy: the plan's JSON/YAML file, a PlanReport, or a dict of checkpoint_policy keys.
    level: "quick", "full" or "deep" validation after each save. handoff_dir / handoff_every /
    join_timeout / manifest / rank_timeout / preemption_signals / grace_seconds / adaptive_interval: as for
    HFCheckpointStrategy. detect_every: feed the detector every N steps (default: the Trainer's log_every_n_steps).
    """

    def __init__(
        self,
        policy: Any,
        *,
        level: str = "quick",
        handoff_dir: Optional[str] = DEFAULT_HANDOFF_DIR,
        handoff_every: Optional[int] = None,
        join_timeout: float = 600.0,
        detect_every: Optional[int] = None,
        manifest: bool = True,
        rank_timeout: float = 600.0,
        preemption_signals: Any = "auto",
        grace_seconds: float = 120.0,
        adaptive_interval: bool = True,
    ) -> None:
        from checkpoint_strategy.callbacks.adaptive import for_settings
        from checkpoint_strategy.callbacks.preempt import Preemption

        super().__init__()
        if detect_every is not None and (not isinstance(detect_every, int) or detect_every < 1):
            raise UsageError(f"detect_every must be a whole number >= 1, got {detect_every!r}")
        self.core = StrategyCore(
            policy,
            level=level,
            handoff_dir=handoff_dir,
            handoff_every=handoff_every,
            join_timeout=join_timeout,
            framework_log=True,
            manifest=manifest,
            rank_timeout=rank_timeout,
        )
        self.core.protect = self._protect
        self.detect_every = detect_every
        self._mc: Any = None  # the trainer's ModelCheckpoint, once found
        self._kept_mcs: list[
            Any
        ] = []  # milestone ModelCheckpoints (save_top_k=-1 on their own period): left alone
        self._own_interval = (
            False  # a monitoring top-k ModelCheckpoint left alone: the interval saves are ours
        )
        self._trainer = None
        self._orig_save = None
        self._pending: dict[str, str] = {}
        self._grad_norm: Optional[float] = None
        self._last_seen = -1
        self._inflight: Optional[tuple[int, Any]] = (
            None  # (step, the started loss average), many processes
        )
        self._want_grad = "gradient_norm_exceeded" in self.core.settings.emergency_save_on
        self._dir_given = True
        self.preemption = Preemption(preemption_signals, grace_seconds)
        self.adaptive = for_settings(self.core.settings, self.core.frequency, adaptive_interval)
        self.rollback_resume = (
            False  # the next fit is a rollback's resume (a playbook's): not an interruption
        )
        self._fits = 0
        # lifted by a preemption save: the Trainer's min limits; how the stop's validation pass is skipped
        self._min_limits: Optional[tuple[Any, Any]] = None
        self._skipped_val: Optional[str] = None

    @property
    def preempted(self) -> Optional[dict]:
        """The preemption save's record, once made."""
        return self.preemption.record

    # ------------------------------------------------------------------ configuration

    def setup(self, trainer, pl_module, stage) -> None:
        if stage != "fit":
            return
        mcs = [cb for cb in trainer.callbacks if _is_model_checkpoint(cb)]
        if not mcs:
            raise UsageError(
                "LightningCheckpointStrategy: the Trainer has no ModelCheckpoint "
                "(enable_checkpointing=False?); add ModelCheckpoint(dirpath=...) or enable checkpointing"
            )
        mc = _rolling(mcs)
        self._kept_mcs = [m for m in mcs if m is not mc]
        if len(mcs) > 1:
            log.warning(
                PREFIX + f"{len(mcs)} ModelCheckpoint callbacks: configuring the one saving to "
                f"{mc.dirpath or 'the default folder'} as {mc.filename or '{epoch}-{step}'}; the others keep "
                "their own settings and their files are never pruned"
            )
        self._mc = mc
        if _keeps_top_k(mc):
            self._own_interval = True
            log.info(
                PREFIX
                + f"ModelCheckpoint(monitor={mc.monitor}, save_top_k={mc.save_top_k}) left as you set it "
                f"(it keeps its own best); the policy's saves every {self.core.frequency} steps are written by "
                "checkpoint-strategy as epoch=E-step=N.ckpt in its dirpath"
            )
        else:
            self._configure(mc)
        if self.core.settings.save_optimizer and getattr(mc, "save_weights_only", False):
            log.warning(
                PREFIX
                + "ModelCheckpoint save_weights_only=True: no optimizer state, but the policy says "
                "save_optimizer; a resume will restart Adam's moments from zero"
            )
        self._dir_given = bool(
            mc.dirpath
        )  # before Lightning fills in its default (logger's version_N/checkpoints)
        self._wrap_save(trainer)

    def _configure(self, mc) -> None:
        """The rolling ModelCheckpoint: the policy's interval, every file kept (the keep rules prune them)."""
        freq = self.core.frequency
        every = getattr(mc, "_every_n_train_steps", 0)
        epochs = getattr(mc, "_every_n_epochs", 0)
        if (
            every not in (0, freq)
            or getattr(mc, "_train_time_interval", None) is not None
            or (every == 0 and epochs not in (0, 1))
        ):
            log.warning(
                PREFIX
                + f"ModelCheckpoint every_n_train_steps={every} replaced by the policy: every {freq} steps"
            )
        if mc.save_top_k not in (-1, 1):
            log.warning(
                PREFIX
                + f"ModelCheckpoint save_top_k={mc.save_top_k} turned off (-1): Lightning deletes old "
                "files after a save without checking the new one; checkpoint-strategy validates it first and "
                f"keeps keep_last={self.core.settings.keep_last} plus milestones and best_model_path"
            )
        mc._every_n_train_steps = freq
        mc._every_n_epochs = 0
        mc._train_time_interval = None
        mc.save_top_k = -1

    def _wrap_save(self, trainer) -> None:
        """Run our after-save step right after every trainer.save_checkpoint returns."""
        if self._orig_save is not None:
            return
        orig = trainer.save_checkpoint
        self._orig_save, self._trainer = orig, trainer

        def save_checkpoint(filepath, *args, **kwargs):
            t0 = time.monotonic()
            path = os.path.abspath(os.fspath(filepath))
            self.preemption.begin_save(path)
            self.core.before_save()
            out = orig(
                filepath, *args, **kwargs
            )  # ends with the strategy's barrier: every rank wrote its part
            step = trainer.global_step
            after = (path, step, self._pending.pop(path, None))
            preempt = self.preemption.save_written(step, resumable=after[2] is None)
            pool = _async_io_executor(trainer)
            if pool is not None and not self.core.ranks.multi and not preempt:
                pool.submit(
                    self.core.saved, *after
                )  # AsyncCheckpointIO: its one thread writes in order
            else:
                if (
                    pool is not None
                ):  # many processes (the ranks meet on the training thread, after the write),
                    _wait_for_writer(
                        pool, self.core.join_timeout
                    )  # or the preemption save: written before it stops
                self.core.saved(*after)
            self._measured(trainer, step, time.monotonic() - t0)
            if preempt:
                self._stop(trainer)
                self.preemption.finish_save(self.core.root, path, step, self.core.record_action)
            return out

        trainer.save_checkpoint = save_checkpoint

    def _unwrap(self) -> None:
        if self._trainer is not None and self._orig_save is not None:
            try:
                del self._trainer.save_checkpoint  # back to the class method
            except AttributeError:
                pass
        self._orig_save = self._trainer = None

    def _measured(self, trainer, step: int, seconds: float) -> None:
        """One save's blocking time (adaptive.py): a new interval applies from the next save."""
        if self.adaptive is None:
            return
        new = self.adaptive.measured(seconds, step, self.core.ranks)
        if new is None:
            return
        self.core.frequency_override = new
        if self._mc is not None and not self._own_interval:
            self._mc._every_n_train_steps = new
        self.core.record_action(self.adaptive.record(step))

    def _protect(self) -> dict[str, str]:
        mc = self._mc
        best = getattr(mc, "best_model_path", "") if mc is not None else ""
        out = {}
        if best and mc.monitor is not None:
            out[os.path.basename(best)] = f"ModelCheckpoint best_model_path ({mc.monitor})"
        for other in (
            self._kept_mcs
        ):  # e.g. export's milestone ModelCheckpoint: its files are its own to keep
            if not _keeps_top_k(other):
                out.update(_files_of(other, self.core.root))
                continue
            path: str = getattr(other, "best_model_path", None) or ""
            if path:
                out[os.path.basename(path)] = f"ModelCheckpoint best_model_path ({other.monitor})"
        return out

    def _dirpath(self) -> str:
        d = self._mc.dirpath if self._mc is not None else None
        if not d:
            raise UsageError("LightningCheckpointStrategy: ModelCheckpoint has no dirpath yet")
        return os.path.abspath(os.fspath(d))

    def on_train_start(self, trainer, pl_module) -> None:
        self.core.root = self._dirpath()
        os.makedirs(self.core.root, exist_ok=True)
        _show_lines(trainer)
        ckpt = getattr(trainer, "ckpt_path", None)
        # an interruption is a launch that resumes: the first fit of this callback (a playbook's refit after a
        # rollback is not one)
        resumed = (
            bool(ckpt) and trainer.global_step > 0 and not self.rollback_resume and not self._fits
        )
        self.rollback_resume = False
        self._fits += 1
        # the earlier launches' interruptions, from the loss log before it is set aside
        previous = self.core.previous_actions("checkpoint-strategy:interruption") if resumed else []
        if trainer.is_global_zero:
            self.core.retire_old_metrics()
        self.core.start()
        if resumed:
            from checkpoint_strategy.callbacks.adaptive import interruption

            self.core.record_action(
                interruption(
                    self.core.root,
                    trainer.global_step,
                    previous,
                    self.core.ranks if self.adaptive is not None else None,
                    self.adaptive,
                )
            )
        self._install_preemption(trainer)
        if (
            ckpt
        ):  # resumed: a DeepSpeed/DCP folder records its world size; a plain .ckpt records neither
            self.core.check_resume(
                os.fspath(ckpt),
                world_size=int(trainer.world_size),
                accumulation=int(getattr(trainer, "accumulate_grad_batches", 1) or 1),
            )
        s = self.core.settings
        log.info(
            PREFIX
            + f"saving every {s.frequency_steps} steps into {self.core.root}"
            + (f", keep_last {s.keep_last}" if s.keep_last else "")
            + f", validation {self.core.level}"
            + (" in the background" if s.async_save else "")
            + (
                f", emergency saves on {', '.join(s.emergency_save_on)}"
                if s.emergency_save_on
                else ""
            )
        )
        if trainer.is_global_zero and not ckpt and not self._dir_given:
            _say_where(self.core.root)

    def _install_preemption(self, trainer) -> None:
        """The preemption signals caught for this fit (exchanged over the ranks under DDP). The signal's own
        action after the grace period: the handler from before the fit, not Lightning's (which only sets a flag)."""
        self.preemption.rank_zero = bool(trainer.is_global_zero)
        if self.preemption.install_for(
            int(trainer.world_size),
            getattr(getattr(trainer, "_signal_connector", None), "_original_handlers", None),
            ranks=self.core.ranks,
        ):
            _say_min_limits(trainer)

    # ------------------------------------------------------------------ hooks

    def _detect_now(self, trainer, step: int) -> bool:
        every = self.detect_every or max(1, int(getattr(trainer, "log_every_n_steps", 50) or 50))
        return step % every == 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self._want_grad or not self._detect_now(trainer, trainer.global_step + 1):
            return
        import torch

        grads = [p.grad.detach() for p in pl_module.parameters() if p.grad is not None]
        if not grads:
            self._grad_norm = None
            return
        foreach = getattr(
            torch, "_foreach_norm", None
        )  # one kernel launch per dtype, as clip_grad_norm_ does
        norms = (
            foreach(grads) if foreach is not None else [torch.linalg.vector_norm(g) for g in grads]
        )
        self._grad_norm = float(torch.linalg.vector_norm(torch.stack(list(norms))))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._last_seen:
            return  # gradient accumulation: no optimizer step yet
        self._last_seen = step
        if self._inflight is not None:  # the previous detection step's average (many processes)
            (seen, pending), self._inflight = self._inflight, None
            self._decide(trainer, seen, *self.core.finish_reduced(pending))
        if self._detect_now(trainer, step):
            loss, grad = _loss_of(outputs), self._grad_norm
            self._grad_norm = None
            if self.core.ranks.multi:
                # each rank's loss is its own: one all_reduce averages it, started now and taken at the next
                # step's end (DDP's own gradient all_reduce of that step has completed it by then: the
                # training thread never waits for it); every rank's detector then decides the same
                self._inflight = (step, self.core.start_reduced(loss, grad))
            else:
                self._decide(trainer, step, loss, grad)
        if self.core.forced_save(step) or (self._own_interval and step % self.core.frequency == 0):
            trainer.save_checkpoint(
                os.path.join(self._dirpath(), f"epoch={trainer.current_epoch}-step={step}.ckpt")
            )
        if self.preemption.at_step_end(
            step
        ):  # after the signal: the preemption save, at this step end
            trainer.save_checkpoint(
                os.path.join(self._dirpath(), f"epoch={trainer.current_epoch}-step={step}.ckpt")
            )
            if (
                self._mc is not None and not self._own_interval
            ):  # the rolling ModelCheckpoint makes no second file
                self._mc._last_global_step_saved = (
                    step  # of this step (the others keep their own saves)
                )

    def _stop(self, trainer) -> None:
        """The preemption save is written: the fit stops at this step. Lightning ignores ``should_stop`` until
        the Trainer's min_steps / min_epochs are met (they are early stopping's floor); a preemption is no early
        stop (Lightning's own SIGTERM ends the fit past them too): they are lifted for the rest of this fit and
        put back at its end. The next launch resumes from the save and trains on to them."""
        trainer.should_stop = True
        loop = trainer.fit_loop
        if self._min_limits is None and not loop._can_stop_early:
            self._min_limits = (loop.min_epochs, loop.epoch_loop.min_steps)
            loop.min_epochs, loop.epoch_loop.min_steps = None, None
        self._skipped_val = _skip_validation(loop.epoch_loop)

    def _restore_min_limits(self, trainer) -> None:
        """The Trainer's min_steps / min_epochs and its validation check, as they were before the preemption."""
        if self._min_limits is not None:
            trainer.fit_loop.min_epochs, trainer.fit_loop.epoch_loop.min_steps = self._min_limits
            self._min_limits = None
        if self._skipped_val is not None:
            _unskip_validation(trainer.fit_loop.epoch_loop, self._skipped_val)
            self._skipped_val = None

    def on_train_end(self, trainer, pl_module) -> None:
        self.preemption.uninstall()  # before Lightning puts its own originals back
        self._restore_min_limits(trainer)

    def _decide(self, trainer, seen: int, loss: Optional[float], grad: Optional[float]) -> None:
        """Feed the detector the values of step `seen`; on an event (rank 0 writes the marker and broadcasts
        whether it could: every rank takes part in the save or none does) save now, at the current step."""

        def path() -> str:
            return os.path.join(
                self._dirpath(),
                f"epoch={trainer.current_epoch}-step={trainer.global_step}-emergency.ckpt",
            )

        kind = self.core.decide_emergency(seen, loss, grad, path)
        if kind is not None:
            target = path()
            self._pending[target] = kind
            trainer.save_checkpoint(target)

    def _drain(self) -> None:
        """At the end of fit: the last started average, into the detector and the loss log (no save after
        the last step)."""
        if self._inflight is not None:
            (seen, pending), self._inflight = self._inflight, None
            self.core.observe(seen, *self.core.finish_reduced(pending), saving=False)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._drain()
        self.core.end()

    def teardown(self, trainer, pl_module, stage) -> None:
        if stage == "fit":
            self._inflight = None  # a fit that raised: never wait on the ranks here
            self.preemption.uninstall()
            self._restore_min_limits(trainer)
            if not self.core._ended and self.core.root is not None:
                self.core.end()
            self._unwrap()


def _skip_validation(epoch_loop) -> str:
    """No validation pass between the preemption save and the stop. Lightning validates when ``should_stop`` is
    set and it may stop (``_should_check_val_fx``: early stopping's last look at the metric); after a preemption
    save that pass spends the grace period, and a long one is killed by the signal's SIGKILL (exit code not 0).
    Lightning >= 2.5 has a one-shot flag for it (``_skip_next_val``, which it clears when it has skipped the
    check of this batch end, its own use on a resume saved at an epoch's last batch); before it, the loop's
    check answers False for the rest of this fit (an instance attribute, deleted at the fit's end)."""
    if isinstance(getattr(epoch_loop, "_skip_next_val", None), bool):
        epoch_loop._skip_next_val = True
        return "flag"
    epoch_loop._should_check_val_fx = lambda *args, **kwargs: False
    return "check"


def _unskip_validation(epoch_loop, how: str) -> None:
    if how == "flag":
        epoch_loop._skip_next_val = (
            False  # consumed already unless the fit ended before that batch's end
        )
    elif "_should_check_val_fx" in vars(epoch_loop):
        del epoch_loop._should_check_val_fx  # back to the class method


def _say_min_limits(trainer) -> None:
    """One WARNING at the start of a fit that catches the preemption signals while the Trainer's min_steps /
    min_epochs are not met yet: a preemption stops the fit before them (LightningCheckpointStrategy._stop)."""
    steps, epochs = trainer.fit_loop.epoch_loop.min_steps, trainer.fit_loop.min_epochs
    unmet = []
    if steps and trainer.global_step < steps:
        unmet.append(f"min_steps={steps}")
    if epochs and trainer.current_epoch < epochs:
        unmet.append(f"min_epochs={epochs}")
    if unmet and trainer.is_global_zero:
        log.warning(
            PREFIX
            + f"{' and '.join(unmet)} not met yet: a preemption signal still stops the fit at its save "
            "(the next launch resumes from it and trains on to them)"
        )


def _say_where(root: str) -> None:
    """One WARNING at the start of a fit that saves into Lightning's versioned default folder
    (``<logger>/version_N/checkpoints``) without ckpt_path: a rerun makes version_N+1 and starts from step 0."""
    version = os.path.dirname(root)
    if os.path.basename(root) != "checkpoints" or not re.match(
        r"version_\d+$", os.path.basename(version)
    ):
        return
    logger = os.path.dirname(version)
    log.warning(
        PREFIX
        + f"checkpoints go to {root}, a new version_N folder each run (Lightning's default logger): "
        f"a rerun starts from step 0; to resume, pass trainer.fit(..., ckpt_path=last_valid_checkpoint("
        f"{logger!r})) (it finds the previous versions' checkpoints), or set ModelCheckpoint(dirpath=...) "
        "and ckpt_path=last_valid_checkpoint(that dirpath)"
    )


def _wait_for_writer(pool, timeout: float) -> None:
    """Until AsyncCheckpointIO's writer thread has finished the saves queued so far (at most timeout)."""
    import concurrent.futures

    try:
        pool.submit(lambda: None).result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        log.warning(
            PREFIX + f"AsyncCheckpointIO still writing after {timeout:g} s: the ranks meet anyway"
        )


def _loss_of(outputs) -> Optional[float]:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if loss is None:
        return None
    try:
        return float(loss)
    except (TypeError, ValueError, RuntimeError):
        return None


def _rolling(mcs: list) -> Any:
    """The ModelCheckpoint the policy configures: one without a monitor (or monitoring `step`, as
    `export --framework lightning` writes it) that is not a milestone keeper; a milestone keeper
    (save_top_k=-1 on its own period, beside another ModelCheckpoint) is left alone."""

    def keeper(m) -> bool:
        return len(mcs) > 1 and m.save_top_k == -1 and bool(getattr(m, "_every_n_train_steps", 0))

    rolling = [m for m in mcs if not keeper(m)] or mcs
    return next((m for m in rolling if m.monitor in (None, "step")), rolling[0])


def _keeps_top_k(mc) -> bool:
    """A ModelCheckpoint that monitors a metric (not `step`: a rolling window) and keeps a top-k of its own:
    the user's best keeper, never widened to save_top_k=-1."""
    return mc.monitor not in (None, "step", "epoch", "global_step") and mc.save_top_k != -1


def _files_of(mc, root: Optional[str]) -> dict[str, str]:
    """Files in root a left-alone ModelCheckpoint wrote (by its filename's fixed prefix)."""
    prefix = (mc.filename or "").split("{", 1)[0]
    d = os.path.abspath(os.fspath(mc.dirpath)) if mc.dirpath else root
    if not prefix or d is None or root is None or os.path.normpath(d) != os.path.normpath(root):
        return {}
    try:
        names = os.listdir(root)
    except OSError:
        return {}
    return {
        n: f"kept by its own ModelCheckpoint ({mc.filename}, save_top_k=-1)"
        for n in names
        if n.startswith(prefix) and n.endswith(".ckpt")
    }


def _show_lines(trainer) -> None:
    """The routine lines shown as Lightning shows its own progress (rank_zero_info): INFO on the
    global-zero rank at the level of Lightning's own logger, WARNING on the others."""
    import logging

    from checkpoint_strategy.callbacks.core import show_lines

    pkg = type(trainer).__module__.split(".trainer")[0]
    level = (
        logging.getLogger(pkg).getEffectiveLevel() if trainer.is_global_zero else logging.WARNING
    )
    show_lines(level)
