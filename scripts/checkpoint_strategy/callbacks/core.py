"""The framework-free part of the training callbacks: schedule, validate-then-prune, emergency
saves, end-of-training report and handoff. hf.py and lightning.py only translate hooks.

Log lines (logger ``checkpoint_strategy.callbacks``), one per event, all starting with
``checkpoint-strategy:``:
  ``saved checkpoint-40 (step 40): valid (quick, 0.01 s); pruned checkpoint-20``        INFO
  ``checkpoint-30 (step 30) is INVALID right after its save: ...; kept, nothing deleted``  ERROR
  ``emergency save at step 46: loss_spike_detected (loss 9.1 vs median 1.1) -> checkpoint-46``  WARNING
  ``loss is NaN/inf at step 61: no emergency save (a NaN state is never saved)``          WARNING
  ``end of training: 8 saves validated, 1 invalid, 6 pruned; last valid checkpoint-80``   INFO
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from checkpoint_strategy.callbacks.policy import Settings, resolve

log = logging.getLogger("checkpoint_strategy.callbacks")
PREFIX = "checkpoint-strategy: "
METRICS_FILE = ".checkpoint-strategy-metrics.jsonl"
DEFAULT_STATE_DIR = ".claude/state"


@dataclass
class SaveRecord:
    """What happened to one save (``core.records``)."""

    step: Optional[int]
    path: str
    emergency: Optional[str] = None       # the event, for an emergency save
    status: Optional[str] = None          # valid | invalid | incomplete | None (not validated)
    problem: Optional[str] = None
    deleted: list[str] = field(default_factory=list)
    kept_reasons: dict[str, list[str]] = field(default_factory=dict)
    prune_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


class StrategyCore:
    """Shared logic. ``root`` (the folder the framework saves into) is set by the adapter."""

    def __init__(self, policy: Any, *, level: str = "quick", handoff_dir: Optional[str] = DEFAULT_STATE_DIR,
                 handoff_every: Optional[int] = None, join_timeout: float = 600.0,
                 framework_log: bool = False) -> None:
        from checkpoint_strategy.errors import UsageError

        self.settings: Settings = resolve(policy)
        if level not in ("quick", "full"):
            raise UsageError(f"level must be quick or full, got {level!r}")
        if handoff_every is not None and (not isinstance(handoff_every, int) or handoff_every < 1):
            raise UsageError(f"handoff_every must be a whole number >= 1, got {handoff_every!r}")
        self.level = level
        self.handoff_dir = handoff_dir
        self.handoff_every = handoff_every
        self.join_timeout = float(join_timeout)
        self.framework_log = framework_log   # True: the framework writes no log we can read (Lightning)
        self.root: Optional[str] = None
        self.records: list[SaveRecord] = []
        self.flags: list[Any] = []
        self.problems: list[str] = []
        self.protect: Callable[[], dict[str, str]] = dict
        # test hooks: after_save_hook(path) runs right after a save, before validation;
        # phase_hook(phase, path) runs as the worker enters "validate" / "prune" / "idle".
        self.after_save_hook: Optional[Callable[[str], None]] = None
        self.phase_hook: Optional[Callable[[str, str], None]] = None
        self._detector = None
        if self.settings.emergency_save_on or framework_log:
            from checkpoint_strategy.callbacks._detector import OnlineDetector

            self._detector = OnlineDetector(self.settings.emergency_save_on)
        self._history: list[tuple[int, float, Optional[float]]] = []
        self._spike_seen = False
        self._executor = None
        self._futures: list[Any] = []
        self._lock = threading.Lock()
        self._saves_done = 0
        self._ended = False

    # ------------------------------------------------------------------ schedule

    @property
    def frequency(self) -> int:
        return self.settings.frequency_steps

    def forced_save(self, step: int) -> bool:
        """A milestone step that the interval does not hit."""
        return step in self._milestones and step % self.frequency != 0

    @property
    def _milestones(self) -> frozenset:
        ms = getattr(self, "_ms_cache", None)
        if ms is None:
            ms = self._ms_cache = frozenset(self.settings.milestones)
        return ms

    # ------------------------------------------------------------------ detection

    def observe(self, step: int, loss: Optional[float], grad_norm: Optional[float] = None):
        """Feed one logged loss (and grad norm). Returns the Flag when an emergency save is due."""
        if self._detector is None or loss is None:
            return None
        if self.framework_log:
            self._history.append((int(step), float(loss), None if grad_norm is None else float(grad_norm)))
        flag = self._detector.update(step, loss, grad_norm)
        if flag is None:
            return None
        self._spike_seen = True
        if flag.new_event or flag.save:
            self.flags.append(flag)
        if flag.kind == "nonfinite":
            if flag.new_event:
                log.warning(PREFIX + f"loss is NaN/inf at step {step}: no emergency save (a NaN state is never "
                            "saved); roll back with `checkpoint-strategy recover`")
            return None
        if flag.save:
            what = "loss" if flag.kind == "loss_spike_detected" else "grad norm"
            med = f" vs median {flag.median:.4g}" if flag.median is not None else ""
            log.warning(PREFIX + f"emergency save at step {step}: {flag.kind} ({what} {flag.value:.4g}{med}; "
                        f"{'; '.join(flag.rules)})")
            return flag
        if flag.new_event:
            log.warning(PREFIX + f"{flag.kind} at step {step} (not in emergency_save_on: no emergency save)")
        return None

    def mark_emergency(self, checkpoint: str, flag) -> bool:
        """Write the marker before the save starts (see checkpoints/marker.py). False when it cannot
        be written: then no emergency save is made (an unmarked post-event checkpoint would look
        like a resume point)."""
        from checkpoint_strategy.callbacks import _retention
        from checkpoint_strategy.storage import describe_os_error

        try:
            _retention.write_marker(checkpoint, event=flag.kind, step=flag.step, rules=flag.rules)
        except OSError as exc:
            line = (f"emergency save at step {flag.step} skipped: cannot write its marker in "
                    f"{os.path.dirname(os.fspath(checkpoint))}: {describe_os_error(exc)}")
            with self._lock:
                self.problems.append(line)
            log.error(PREFIX + line)
            return False
        return True

    # ------------------------------------------------------------------ after a save

    def saved(self, path: str, step: Optional[int], emergency: Optional[str] = None) -> None:
        """The framework finished writing `path`: validate it, then prune (in the background
        when async_save)."""
        path = os.path.normpath(os.fspath(path))
        if self.after_save_hook is not None:
            self.after_save_hook(path)
        rec = SaveRecord(step=step, path=path, emergency=emergency)
        with self._lock:
            self.records.append(rec)
        protect = dict(self.protect() or {})
        metrics = self._metrics_snapshot()
        if self.settings.async_save:
            if self._executor is None:
                from concurrent.futures import ThreadPoolExecutor

                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-strategy")
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(self._executor.submit(self._process, rec, protect, metrics))
        else:
            self._process(rec, protect, metrics)

    def _metrics_snapshot(self) -> Optional[list]:
        if not (self.framework_log and self._spike_seen):
            return None
        return list(self._history)

    def _phase(self, phase: str, path: str) -> None:
        if self.phase_hook is not None:
            self.phase_hook(phase, path)

    def _process(self, rec: SaveRecord, protect: dict, metrics: Optional[list]) -> None:
        from checkpoint_strategy.callbacks import _retention

        started = time.perf_counter()
        name = os.path.basename(rec.path)
        at = f" (step {rec.step})" if rec.step is not None else ""
        try:
            if self.settings.validate_on_save or self.settings.keep_last:
                self._phase("validate", rec.path)
                try:
                    result = _retention.validate(rec.path, self.level)
                except Exception as exc:  # noqa: BLE001 - a missing path is a problem, not a crash
                    rec.status, rec.problem = "invalid", str(exc)
                else:
                    rec.status = result.status
                    if result.problems:
                        p = result.problems[0]
                        more = f" (+{len(result.problems) - 1} more)" if len(result.problems) > 1 else ""
                        rec.problem = f"{p.file}: {p.reason}{more}"
                if rec.status != "valid":
                    line = (f"{name}{at} is {str(rec.status).upper()} right after its save: {rec.problem}; kept for "
                            "inspection, nothing deleted")
                    with self._lock:
                        self.problems.append(line)
                    log.error(PREFIX + line)
                    return
            if self.settings.keep_last and self.root is not None:
                self._phase("prune", rec.path)
                logfile = self._write_metrics(metrics) if metrics else None
                report = _retention.prune(self.root, self.settings.keep_last, list(self.settings.milestones),
                                          level=self.level, protect=protect, log=logfile)
                rec.deleted = [e.name for e in report.delete if e.deleted]
                rec.kept_reasons = {e.name: e.reasons for e in report.keep}
                rec.prune_errors = [f"{p.file}: {p.reason}" for p in report.errors]
                for err in rec.prune_errors:
                    log.warning(PREFIX + f"prune: {err}")
            rec.seconds = time.perf_counter() - started
            pruned = f"; pruned {', '.join(rec.deleted)}" if rec.deleted else ""
            kind = f"emergency save ({rec.emergency})" if rec.emergency else "saved"
            log.info(PREFIX + f"{kind} {name}{at}: {rec.status or 'not validated'} ({self.level}, "
                     f"{rec.seconds:.2f} s){pruned}")
        except Exception as exc:  # noqa: BLE001 - never take the training run down
            line = f"after saving {name}: {type(exc).__name__}: {exc}"
            with self._lock:
                self.problems.append(line)
            log.error(PREFIX + line)
        finally:
            self._phase("idle", rec.path)
            with self._lock:
                self._saves_done += 1
                due = self.handoff_every is not None and self._saves_done % self.handoff_every == 0
            if due:
                self.write_handoff()

    def _write_metrics(self, metrics: list) -> Optional[str]:
        """The callback's own loss log (JSON lines) for the spike check of frameworks whose
        checkpoints carry no log (Lightning); written whole, atomically."""
        import json

        from checkpoint_strategy.atomic import atomic_write_text

        if self.root is None:
            return None
        path = os.path.join(self.root, METRICS_FILE)
        lines = []
        for step, loss, gn in metrics:
            rec = {"step": step, "loss": loss}    # NaN/inf as the NaN/Infinity tokens, as HF's log does
            if gn is not None:
                rec["grad_norm"] = gn
            lines.append(json.dumps(rec))
        atomic_write_text(path, "\n".join(lines) + "\n")
        return path

    # ------------------------------------------------------------------ end of training

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the background validations; True when all finished."""
        from concurrent.futures import wait as _wait

        pending = [f for f in self._futures if not f.done()]
        if not pending:
            return True
        done, not_done = _wait(pending, timeout=self.join_timeout if timeout is None else timeout)
        return not not_done

    def end(self) -> dict:
        """Join the worker (with the timeout), report, write the handoff state. Idempotent."""
        if self._ended:
            return self.summary()
        self._ended = True
        finished = self.wait()
        if not finished:
            line = (f"validation of the last saves did not finish within {self.join_timeout:g} s: they are not "
                    "checked yet; run `checkpoint-strategy validate` on the folder")
            self.problems.append(line)
            log.error(PREFIX + line)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        summary = self.summary()
        log.info(PREFIX + f"end of training: {summary['validated']} saves validated, {summary['invalid']} invalid, "
                 f"{summary['pruned']} pruned, {summary['emergency_saves']} emergency; last valid "
                 f"{summary['last_valid'] or 'none'}")
        self.write_handoff()
        return summary

    def summary(self) -> dict:
        with self._lock:
            recs = list(self.records)
        last = None
        if self.root is not None:
            from checkpoint_strategy.callbacks.resume import last_valid_checkpoint

            try:
                last = last_valid_checkpoint(self.root, level=self.level)
            except Exception:  # noqa: BLE001
                last = None
        return {"validated": sum(r.status is not None for r in recs),
                "invalid": sum(r.status not in (None, "valid") for r in recs),
                "pruned": sum(len(r.deleted) for r in recs),
                "emergency_saves": sum(r.emergency is not None for r in recs),
                "last_valid": os.path.basename(last) if last else None,
                "problems": list(self.problems)}

    def write_handoff(self) -> None:
        """The session-handoff state the `handoff` command writes, plus this run's problems."""
        if not self.handoff_dir or self.root is None:
            return
        from checkpoint_strategy.integrations import handoff

        try:
            doc = handoff.build(self.settings.report, self.root, level=self.level)
            with self._lock:
                extra = [f"training callback: {p}" for p in self.problems]
            doc.pending_risks.extend(r for r in extra if r not in doc.pending_risks)
            handoff.write(self.handoff_dir, doc)
        except Exception as exc:  # noqa: BLE001 - a handoff problem must not end training
            log.error(PREFIX + f"could not write the handoff state to {self.handoff_dir}: {exc}")
