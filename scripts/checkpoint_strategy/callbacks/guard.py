"""The recovery playbook for a plain PyTorch loop (torchtitan- or nanoGPT-style): a guard the loop asks each step.

    guard = TrainingGuard("out/", policy="plan.json")        # or TrainingGuard("out/", frequency_steps=100)
    step = 0
    while step < max_steps:
        step += 1
        if guard.skip(step):                     # a batch of a rolled-back spike: drawn, not trained on
            continue
        loss, gn = train_one_step(batch(step), lr=base_lr * guard.lr_scale(step), clip=guard.grad_clip(step))
        decision = guard.step(step, loss, grad_norm=gn)
        if decision.action == "save":
            path = save(step)                    # the loop's own save (model + optimizer)
            guard.saved(step, path)
        elif decision.action == "rollback":
            load(decision.checkpoint)            # the loop's own load (model + optimizer)
            step = decision.resume_step
            if guard.resumed(optimizer).action == "stop":   # the resume check: optimizer state restored?
                break
        elif decision.action == "stop":
            break

The guard feeds `recover`'s online detector (recovery/online.py) and waits its wait window: a spike
that comes back within it is only logged; one that does not (``divergence``), a NaN/inf loss or a
collapsed loss answers ``rollback``:

* to the newest save the loop reported (``saved``) made before the onset whose loss was below
  ``stable_ratio`` (1.1) x the spike's value, never an emergency save, validated at level full
  (with optimizer state) by the package's validator; a checkpoint is used once;
* LR x ``lr_multiplier`` (0.5) and gradient clipping ``grad_clip`` (0.5) from the resume step for
  ``lr_reduced_steps`` (500) steps; the batches from the resume step to the onset + ``skip_past_onset``
  (20) are skipped. The numbers are recover's playbook (recovery/settings.py RecoveryOptions) and any
  of them can be passed as a keyword.

The resume is checked live (the `verify-resume` checks, online): ``resumed(optimizer)`` compares the
optimizer's own step counter after the load with the one the checkpoint records (read as bytes,
formats/optstep.py); a counter that does not continue from it (a fresh optimizer: 0) stops the
run with one ERROR line. Then the first ``post_points`` (5) losses trained after the skipped steps are
compared with the band around the level before the checkpoint (recovery/verify.py's band: the
median of the last 20 losses, max of 5% and 3 standard errors): one ``resume_check`` line and record,
ok or a WARNING (a jump: was the optimizer state loaded?); the detector still decides a rollback.

Preemption (``preemption_signals=("SIGTERM", "SIGUSR1")``, off by default here: the loop owns its
process): after the signal the next ``step`` answers ``save`` with ``stop=True``; once the loop reports
that save (``saved``) it is recorded as a preemption save (preempt.py) and every later ``step`` answers
``stop``.

An interval that follows the measured save cost (a policy from a plan; ``adaptive_interval=False`` turns it
off): each save's blocking time is the ``seconds=`` the loop passes to ``saved``, else the time from the
``save`` answer to ``saved``; past 2x the plan's assumed cost the interval is re-solved with the plan's
model once and the next ``save`` answers come at its multiples (adaptive.py: one line, a record in the
loss log). A guard whose first step is past 1 (the loop resumed) counts one interruption of the run (over
the launches, from the loss log's records) for the same model's failure rate.

Bounded: at most ``max_rollbacks`` (3) a run; past that, or with no stable checkpoint left, one ERROR
line and ``stop``. Every automatic action is one ``checkpoint-strategy:`` line and a record in the
run's loss log (``<root>/.checkpoint-strategy-metrics.jsonl``, which also holds every logged loss, so
`recover` on it shows the spike and the restart). Nothing here loads or saves a checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import IO, Any, Optional

from checkpoint_strategy.callbacks._log import PREFIX, log
from checkpoint_strategy.callbacks.adaptive import for_settings, interruption
from checkpoint_strategy.callbacks.core import read_actions
from checkpoint_strategy.callbacks.policy import resolve
from checkpoint_strategy.callbacks.preempt import Preemption
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.marker import read_marker
from checkpoint_strategy.formats.runlog import METRICS_FILE  # the loss log the commands find

# the detector's verdicts that a spike did not recover
ROLLBACK_ON = ("divergence", "nonfinite", "collapse")
STABLE_RATIO = 1.1


@dataclass
class Decision:
    """What the loop does after this step: continue, save, rollback or stop."""

    action: str = "continue"
    step: int = 0
    checkpoint: Optional[str] = None  # rollback: the path to load (model and optimizer state)
    # rollback: the step of that checkpoint; the loop goes on at resume_step + 1
    resume_step: Optional[int] = None
    lr_scale: float = 1.0  # rollback: multiply the LR by this ...
    lr_until: Optional[int] = None  # ... up to and including this step
    grad_clip: Optional[float] = None  # rollback: clip the gradient norm to this in the same window
    # rollback: the steps first..last whose batches are skipped
    skip_steps: tuple[int, int] = (0, -1)
    reason: str = ""
    stop: bool = False  # save: a preemption save; stop training once it is written

    @property
    def skipped(self) -> range:
        return range(self.skip_steps[0], self.skip_steps[1] + 1)


@dataclass
class _Save:
    step: int
    path: str
    loss: Optional[float]
    kind: str = "scheduled"  # scheduled | emergency | preemption


@dataclass
class _ResumeCheck:
    """What the live resume check compares (after each rollback)."""

    checkpoint: str
    step: int
    after: int  # losses of steps after this one (the skip window's end) are compared
    counter: Optional[int]  # the optimizer step counter the checkpoint records (None: unreadable)
    pre: list[float]  # the losses before the checkpoint (up to PRE_POINTS)
    post: list[float]
    optimizer_checked: bool = False


PRE_POINTS, POST_POINTS, TOLERANCE = 20, 5, 0.05  # recovery/verify.py's defaults


@dataclass
class _Window:
    resume: int
    lr_scale: float
    lr_until: int
    grad_clip: float
    skip: tuple[int, int]


class TrainingGuard:
    """``step(step, loss, grad_norm=None) -> Decision``; see the module docstring."""

    def __init__(
        self,
        root: Optional[str | os.PathLike] = None,
        policy: Any = None,
        *,
        frequency_steps: Optional[int] = None,
        max_rollbacks: int = 3,
        stable_ratio: float = STABLE_RATIO,
        level: str = "full",
        options: Any = None,
        metrics_log: bool = True,
        preemption_signals: Any = (),
        grace_seconds: float = 120.0,
        average_loss: bool = True,
        rank_timeout: float = 600.0,
        adaptive_interval: bool = True,
        **playbook: Any,
    ) -> None:
        from checkpoint_strategy.recovery import settings

        _check_arguments(max_rollbacks, level)
        self.options = settings.build(options, **playbook)
        self.frequency = _frequency(policy, frequency_steps)
        self.adaptive = (
            for_settings(resolve(policy), self.frequency, adaptive_interval)
            if policy is not None and frequency_steps is None and self.frequency
            else None
        )
        # (step, monotonic time) of the last save answer
        self._save_asked: Optional[tuple[int, float]] = None
        self._first = True
        self.root = os.fspath(root) if root is not None else None
        self.max_rollbacks = max_rollbacks
        self.stable_ratio = float(stable_ratio)
        self.level = level
        self.saves: list[_Save] = []
        self.used: set[str] = set()
        self.rollbacks: list[dict] = []
        self.skipped: list[int] = []
        self.actions: list[dict] = []
        self.windows: list[_Window] = []
        self.history: list[tuple[int, float, Optional[float]]] = []
        self.stopped: Optional[str] = None
        self._metrics: Optional[IO[str]] = None
        self._metrics_on = metrics_log and self.root is not None
        self._detector = self._new_detector()
        # (onset step, spike value) of the open event
        self._onset: Optional[tuple[int, float]] = None
        self._check: Optional[_ResumeCheck] = None
        # a callable given each action record (the playbooks: the handoff state's list)
        self.on_action: Any = None
        self.average_loss, self.rank_timeout = bool(average_loss), float(rank_timeout)
        self._ranks: Any = None
        self.preemption = Preemption(preemption_signals, grace_seconds)
        self.preemption.install()

    # ------------------------------------------------------------------ what the loop asks

    def lr_scale(self, step: int) -> float:
        w = self._window(step)
        return w.lr_scale if w is not None and step <= w.lr_until else 1.0

    def grad_clip(self, step: int) -> Optional[float]:
        """The clipping norm in force at `step` (None: the loop's own)."""
        w = self._window(step)
        return w.grad_clip if w is not None and step <= w.lr_until else None

    def skip(self, step: int) -> bool:
        """True: the batch of this step is drawn and not trained on (logged once per rollback)."""
        w = self._window(step)
        if w is None or not (w.skip[0] <= step <= w.skip[1]):
            return False
        # asked once per micro-batch under accumulation
        if not self.skipped or self.skipped[-1] != step:
            self.skipped.append(int(step))
        return True

    def _window(self, step: int) -> Optional[_Window]:
        return self.windows[-1] if self.windows and step > self.windows[-1].resume else None

    def step(self, step: int, loss: float, grad_norm: Optional[float] = None) -> Decision:
        """One trained step's loss (and grad norm): continue, save (on the policy's interval), rollback or stop."""
        step = int(step)
        if self._first:
            self._first = False
            # the loop resumed: an interruption of the run
            if step > 1 and self.adaptive is not None:
                self._interrupted(step - 1)
        if self.stopped is not None:
            return Decision("stop", step, reason=self.stopped)
        together = self.average_loss and self.ranks.multi
        # at this step boundary: save (a resume point) and stop
        if self.preemption.requested and not together:
            return self._ask_save(
                Decision(
                    "save", step, reason=f"preemption ({self.preemption.requested})", stop=True
                )
            )
        loss_f = float(loss)
        gn = None if grad_norm is None else float(grad_norm)
        if together:
            loss_f, gn = self._mean(loss_f, gn)
            # this rank's signal or another's (the same all_reduce): every rank
            if self.preemption.requested:
                return self._ask_save(
                    Decision(
                        "save", step, reason=f"preemption ({self.preemption.requested})", stop=True
                    )
                )
        self.history.append((step, loss_f, gn))
        self._write({"step": step, "loss": loss_f, **({"grad_norm": gn} if gn is not None else {})})
        if self._check is not None and step > self._check.after:
            self._check_loss(step, loss_f)
        ev = self._detector.update(step, loss_f, gn)
        if ev is not None:
            out = self._event(ev, step, loss_f)
            if out is not None:
                return out
        if self.frequency and step % self.frequency == 0 and self._onset is None:
            return self._ask_save(Decision("save", step, reason=f"every {self.frequency} steps"))
        return Decision("continue", step)

    def _ask_save(self, d: Decision) -> Decision:
        self._save_asked = (d.step, time.monotonic())
        return d

    def saved(
        self,
        step: int,
        path: str | os.PathLike,
        *,
        kind: str = "scheduled",
        seconds: Optional[float] = None,
    ) -> None:
        """The loop saved `path` at `step` (kind: scheduled, emergency - never a rollback target - or preemption).
        seconds: how long the save blocked the loop (default: the time since this step's ``save`` answer)."""
        step = int(step)
        loss = next((v for s, v, _ in reversed(self.history) if s == step), None)
        if self.preemption.save_written(step, resumable=kind != "emergency"):
            kind = "preemption"
            self.stopped = f"preempted by {self.preemption.requested} at step {step}"
        self.saves.append(_Save(step, os.fspath(path), loss, kind))
        asked, self._save_asked = self._save_asked, None
        if seconds is None and asked is not None and asked[0] == step:
            seconds = time.monotonic() - asked[1]
        if self.adaptive is not None and seconds is not None:
            new = self.adaptive.measured(seconds, step, self.ranks)
            if new is not None:
                self.frequency = new
                self._record(self.adaptive.record(step))
        zero = self._ranks is None or self._ranks.rank == 0  # rank 0 alone writes the record
        self.preemption.finish_save(self.root if zero else None, os.fspath(path), step, self._write)
        if self._metrics is not None:
            self._metrics.flush()

    @property
    def preempted(self) -> Optional[dict]:
        """The preemption save's record, once made."""
        return self.preemption.record

    def _interrupted(self, at_step: int) -> None:
        event = "checkpoint-strategy:interruption"
        previous = read_actions(os.path.join(self.root, METRICS_FILE) if self.root else None, event)
        self._record(interruption(self.root, at_step, previous, self.ranks, self.adaptive))

    # ------------------------------------------------------------------ events

    def _event(self, ev, step: int, loss: float) -> Optional[Decision]:
        if ev.kind == "grad_norm":  # the detector opens no event for it: logged, the loss decides
            self._act("grad_norm", step, ev.message + ": logged, the loss decides")
            return None
        if ev.kind == "spike" and self._onset is None:
            value = loss if math.isfinite(loss) else math.inf
            self._onset = (int(ev.onset_step), value)
            self._act(
                "spike",
                step,
                f"{ev.kind} at step {step} (onset {ev.onset_step}): waiting up to "
                f"{self.options.wait_steps} steps for it to come back",
                onset=int(ev.onset_step),
            )
            return None
        if ev.kind == "recovered":
            if self._onset is not None:
                self._act(
                    "recovered",
                    step,
                    f"the loss came back by step {step} (onset {self._onset[0]}): no rollback",
                    onset=self._onset[0],
                )
            self._onset = None
            return None
        if ev.kind in ROLLBACK_ON:
            onset = self._onset[0] if self._onset is not None else int(ev.onset_step)
            value = self._onset[1] if self._onset is not None else loss
            return self._rollback(step, min(onset, int(ev.onset_step)), value, ev.kind)
        return None

    def _rollback(self, step: int, onset: int, value: float, why: str) -> Decision:
        if len(self.rollbacks) >= self.max_rollbacks:
            return self._stop(
                step,
                f"{why} at step {step} (onset {onset}) after {len(self.rollbacks)} "
                f"rollbacks (max_rollbacks={self.max_rollbacks})",
            )
        # rank 0 validates and chooses; the others take its choice
        target = self._agreed(self._stable(onset, value) if self.ranks.rank == 0 else None)
        if target is None:
            return self._stop(
                step,
                f"{why} at step {step} (onset {onset}) and no stable checkpoint left to roll "
                f"back to (saved before step {onset}, loss below {self.stable_ratio:g}x "
                f"{value:.4g}, valid at level {self.level}, not used before)",
            )
        w = self._open_window(step, onset, target, why)
        self._arm_check(target, w.skip[1])
        self._restart(target.step)
        self._act(
            "rollback",
            step,
            f"{why} at step {step} (onset {onset}): rollback {len(self.rollbacks)}/"
            f"{self.max_rollbacks} to {os.path.basename(target.path)} (step {target.step}); LR x{w.lr_scale:g} "
            f"and clipping {w.grad_clip:g} to step {w.lr_until}; skipping steps {w.skip[0]}-{w.skip[1]}",
            level="warning",
            **{k: v for k, v in self.rollbacks[-1].items() if k != "step"},
        )
        # the loss log restarts at the checkpoint: its timeline is the resumed one
        if target.loss is not None:
            self._write({"step": target.step, "loss": target.loss})
        return Decision(
            "rollback",
            step,
            target.path,
            target.step,
            w.lr_scale,
            w.lr_until,
            w.grad_clip,
            w.skip,
            f"{why} at step {step}, onset {onset}",
        )

    def _open_window(self, step: int, onset: int, target: _Save, why: str) -> _Window:
        """The rollback's playbook window from `target` (LR, clipping, skipped batches), opened and recorded; the
        target used."""
        o = self.options
        self.used.add(target.path)
        w = _Window(
            target.step,
            o.lr_multiplier,
            target.step + o.lr_reduced_steps,
            o.grad_clip,
            (target.step + 1, max(onset + o.skip_past_onset, target.step + 1)),
        )
        self.windows.append(w)
        self.rollbacks.append(
            {
                "step": step,
                "onset": onset,
                "checkpoint": target.path,
                "resume_step": target.step,
                "skip": list(w.skip),
                "lr_scale": w.lr_scale,
                "lr_until": w.lr_until,
                "grad_clip": w.grad_clip,
                "reason": why,
            }
        )
        return w

    def _stable(self, onset: int, value: float) -> Optional[_Save]:
        """The newest reported save before the onset with a loss below stable_ratio x the spike that validates."""
        from checkpoint_strategy.callbacks import _retention
        from checkpoint_strategy.validate.engine import usable

        for s in sorted(self.saves, key=lambda s: s.step, reverse=True):
            if s.kind == "emergency" or s.step >= onset or s.path in self.used:
                continue
            if s.loss is not None and not (
                math.isfinite(s.loss) and s.loss < self.stable_ratio * value
            ):
                continue
            if read_marker(s.path) is not None:
                continue
            result = _retention.validate(s.path, self.level)
            if usable(result) and result.resumable:
                return s
            log.warning(
                PREFIX + f"{os.path.basename(s.path)} (step {s.step}) does not validate at level "
                f"{self.level} with optimizer state: not a rollback target"
            )
            self.used.add(s.path)
        return None

    # ------------------------------------------------------------------ many processes

    @property
    def ranks(self):
        """This process's rank (callbacks/_dist.py), taken at the first step: torch.distributed is set up by then."""
        if self._ranks is None:
            from checkpoint_strategy.callbacks._dist import Ranks

            self._ranks = Ranks(self.rank_timeout)
            if self._ranks.rank != 0:
                self._metrics_on = False  # rank 0 alone writes the loss log
        return self._ranks

    def _mean(self, loss: float, gn: Optional[float]) -> tuple[float, Optional[float]]:
        """The loss (and grad norm) averaged over the ranks (one all_reduce, bounded): every rank's detector then
        decides the same at the same step. A rank's own values when the ranks did not meet.
        The same all_reduce carries the preemption request (issue 43): a signal that reached only some ranks is
        every rank's at this step boundary, so all save and stop together (alone, the signalled rank left the
        collective and the others waited for it up to rank_timeout)."""
        flag = float(self.preemption.requested is not None)
        out = self.ranks.reduce(
            [loss, 0.0 if gn is None else gn, float(gn is None), flag], "the guard's loss", "sum"
        )
        if out is None:
            return loss, gn
        if out[3] > 0 and self.preemption.requested is None:
            self.preemption.requested = "a preemption signal on another rank"
            self.preemption.received_at = time.monotonic()
        n = self.ranks.world
        return out[0] / n, (None if out[2] > 0 else out[1] / n)

    def _agreed(self, target: Optional[_Save]) -> Optional[_Save]:
        """Rank 0's rollback target on every rank (one broadcast of its step): the same checkpoint everywhere."""
        if not self.ranks.multi:
            return target
        out = self.ranks.broadcast(
            [float(target.step) if target is not None else -1.0], "the rollback target"
        )
        step = int(out[0]) if out is not None else -1
        return next((s for s in self.saves if s.step == step), None) if step >= 0 else None

    # ------------------------------------------------------------------ the live resume check

    def _arm_check(self, target: _Save, skip_end: int) -> None:
        from checkpoint_strategy.formats.optstep import read_optimizer_steps

        counter = read_optimizer_steps(target.path).optimizer_step
        pre = [v for s, v, _ in self.history if s <= target.step and math.isfinite(v)][-PRE_POINTS:]
        self._check = _ResumeCheck(target.path, target.step, skip_end, counter, pre, [])

    def resumed(self, optimizer: Any) -> Decision:
        """After the loop loaded a rollback's checkpoint: its optimizer (or its step counter as a number).
        ``stop`` (one ERROR line) when the counter does not continue from the checkpoint's; else ``continue``."""
        c = self._check
        if c is None or c.optimizer_checked:
            return Decision("continue", c.step if c else 0)
        c.optimizer_checked = True
        live = (
            optimizer
            if optimizer is None or isinstance(optimizer, (int, float))
            else optimizer_step_count(optimizer)
        )
        name = os.path.basename(c.checkpoint)
        return self._resume_verdict(c.step, name, self._compare_counter(c, live, name))

    def _compare_counter(self, c: _ResumeCheck, live: Any, name: str) -> Optional[str]:
        """The optimizer's live step counter against the checkpoint's: one resume_check record (unknown, reset or
        ok); the reason to stop when it does not continue from the checkpoint's."""
        bad: Optional[str] = None
        if c.counter is None or live is None:
            self._act(
                "resume_check",
                c.step,
                f"resumed from {name} (step {c.step}): optimizer step counter not "
                "compared ("
                + (
                    "the checkpoint records none"
                    if c.counter is None
                    else "the optimizer keeps none"
                )
                + ")",
                checkpoint=c.checkpoint,
                counter=live,
                expected=c.counter,
                verdict="unknown",
            )
        elif int(live) != c.counter:
            why = (
                "a fresh optimizer: its state was not loaded"
                if int(live) == 0
                else "the optimizer state is not the checkpoint's"
            )
            self._act(
                "resume_check",
                c.step,
                f"resumed from {name} (step {c.step}): optimizer step counter "
                f"{int(live)}, the checkpoint's is {c.counter}",
                checkpoint=c.checkpoint,
                counter=int(live),
                expected=c.counter,
                verdict="reset",
            )
            bad = (
                f"the resume from {name} (step {c.step}) did not restore the optimizer: its step counter is "
                f"{int(live)}, the checkpoint's {c.counter} ({why})"
            )
        else:
            self._act(
                "resume_check",
                c.step,
                f"resumed from {name} (step {c.step}): optimizer step counter "
                f"{int(live)} continues from the checkpoint's",
                checkpoint=c.checkpoint,
                counter=int(live),
                expected=c.counter,
                verdict="ok",
            )
        return bad

    def _resume_verdict(self, step: int, name: str, bad: Optional[str]) -> Decision:
        """The resume check is one verdict of every rank (issue 43): one bounded all_reduce (max) of the failing
        rank, so a rank whose optimizer did not come back stops every rank at the same step (alone, it stopped
        while the others trained on into DDP's all_reduce with it). This rank's own verdict when the ranks did not
        meet."""
        failing = self.ranks.rank if bad is not None else -1
        if self.ranks.multi:
            out = self.ranks.reduce([float(failing)], "the resume check", "max")
            failing = int(out[0]) if out is not None else failing
        if bad is None and failing >= 0:
            bad = (
                f"rank {failing}'s resume from {name} (step {step}) did not restore the optimizer (its step "
                "counter does not continue from the checkpoint's)"
            )
        return self._stop(step, bad) if bad is not None else Decision("continue", step)

    def _check_loss(self, step: int, loss: float) -> None:
        """The first POST_POINTS losses after the skip window against the band before the checkpoint (verify.py)."""
        c = self._check
        assert c is not None
        c.post.append(loss)
        if len(c.post) < POST_POINTS:
            return
        self._check = None
        if not c.pre:
            return
        pre_level = statistics.median(c.pre)
        noise = (
            1.4826 * statistics.median(abs(v - pre_level) for v in c.pre)
            if len(c.pre) >= 3
            else 0.0
        )
        band = max(TOLERANCE * abs(pre_level), 3.0 * 1.2533 * noise / math.sqrt(len(c.post)))
        post = statistics.median(c.post) if all(math.isfinite(v) for v in c.post) else math.inf
        ok = post - pre_level <= band
        line = (
            f"after the rollback to step {c.step}: loss {post:.4g} over steps {step - len(c.post) + 1}-{step} vs "
            f"{pre_level:.4g} before the checkpoint (band {band:.3g}): "
            + (
                "back within the band"
                if ok
                else "a jump above the band; was the optimizer state loaded?"
            )
        )
        self._act(
            "resume_check",
            step,
            line,
            level="info" if ok else "warning",
            checkpoint=c.checkpoint,
            loss_after=post,
            pre_level=pre_level,
            band=band,
            verdict="ok" if ok else "jump",
        )

    def _restart(self, resume: int) -> None:
        """A fresh detector fed the history up to the resume step (steps must increase in one detector)."""
        self.history = [h for h in self.history if h[0] <= resume]
        self.saves = [s for s in self.saves if s.step <= resume]
        self._detector = self._new_detector()
        self._onset = None
        for s, v, g in self.history:
            self._detector.update(s, v, g)

    def _new_detector(self):
        from checkpoint_strategy.recovery.online import OnlineDetector

        return OnlineDetector(self.options)

    def _stop(self, step: int, what: str) -> Decision:
        self.stopped = what
        self._act(
            "stop",
            step,
            what + ": training stops; roll back by hand with `checkpoint-strategy recover`",
            level="error",
        )
        return Decision("stop", step, reason=what)

    # ------------------------------------------------------------------ records

    def _act(self, action: str, step: int, line: str, level: str = "info", **extra: Any) -> None:
        rec = {
            "event": f"checkpoint-strategy:{action}",
            "at_step": int(step),
            **extra,
            "message": line,
        }
        zero = self._ranks is None or self._ranks.rank == 0
        getattr(log, level if zero else "debug")(PREFIX + line)
        self._record(rec)

    def _record(self, rec: dict) -> None:
        """An action already logged (its line): kept, written to the loss log, given to on_action."""
        self.actions.append(rec)
        self._write(rec)
        if self.on_action is not None:
            self.on_action(rec)

    def _write(self, rec: dict) -> None:
        if not self._metrics_on:
            return
        if self._metrics is None:
            try:
                os.makedirs(self.root, exist_ok=True)  # type: ignore[arg-type]
                self._metrics = open(os.path.join(self.root, METRICS_FILE), "a", encoding="utf-8")  # type: ignore[arg-type]
            except OSError as exc:
                log.warning(
                    PREFIX
                    + f"cannot write the loss log in {self.root}: {exc}; actions are logged only"
                )
                self._metrics_on = False
                return
        self._metrics.write(json.dumps(rec) + "\n")

    def summary(self) -> dict:
        """What happened: rollbacks (step, onset, checkpoint, resume step, skip, LR window), skipped steps, stop."""
        return {
            "rollbacks": [dict(r) for r in self.rollbacks],
            "skipped_steps": list(self.skipped),
            "stopped": self.stopped,
            "actions": [dict(a) for a in self.actions],
        }

    def close(self) -> dict:
        self.preemption.uninstall()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        return self.summary()


def optimizer_step_count(optimizer: Any) -> Optional[int]:
    """The optimizer's own step counter (the largest per-parameter ``step``, as formats/optstep.py reads it
    from a checkpoint); 0 for an optimizer with no state yet; None when its state keeps no counter (SGD)."""
    state = getattr(optimizer, "state", None)
    if state is None:
        return None
    steps = [st["step"] for st in state.values() if isinstance(st, dict) and "step" in st]
    if not steps:
        return 0 if not state else None
    return int(max(float(x) for x in steps))


def _check_arguments(max_rollbacks: Any, level: Any) -> None:
    """The guard's own arguments: max_rollbacks a whole number >= 0, level quick, full or deep."""
    if not isinstance(max_rollbacks, int) or max_rollbacks < 0:
        raise UsageError(f"max_rollbacks must be a whole number >= 0, got {max_rollbacks!r}")
    if level not in ("quick", "full", "deep"):
        raise UsageError(f"level must be quick, full or deep, got {level!r}")


def _frequency(policy: Any, frequency_steps: Optional[int]) -> Optional[int]:
    if frequency_steps is not None:
        if not isinstance(frequency_steps, int) or frequency_steps < 1:
            raise UsageError(
                f"frequency_steps must be a whole number >= 1, got {frequency_steps!r}"
            )
        return frequency_steps
    if policy is None:
        return None

    return resolve(policy).frequency_steps
