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

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import IO, Any, Optional

from checkpoint_strategy.atomic import atomic_write_text
from checkpoint_strategy.callbacks._detector import OnlineDetector
from checkpoint_strategy.callbacks._dist import Ranks
from checkpoint_strategy.callbacks._log import PREFIX, log
from checkpoint_strategy.callbacks._worker import ONE_THREAD, handoff_job, part_job, process_job
from checkpoint_strategy.callbacks.policy import Settings, resolve
from checkpoint_strategy.callbacks.resume import last_valid_checkpoint
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.marker import write_marker
from checkpoint_strategy.formats.runlog import (
    METRICS_FILE,  # the loss log's name: the commands find it by it
)
from checkpoint_strategy.formats.runshape import check_resume_shape
from checkpoint_strategy.storage import describe_os_error
from checkpoint_strategy.storage.locking import locked

#: no session-handoff state unless asked for (handoff_dir="..."): nothing is written into the working folder or
#: beside the checkpoints that the user did not name (docs/callbacks.md, "Handoff")
DEFAULT_HANDOFF_DIR: Optional[str] = None
HISTORY_LIMIT = 200_000  # logged values kept in memory before the first event (about 20 MB at most)


class _LineHandler(logging.Handler):
    """Writes each line through `write` (HF: tqdm.write, so a progress bar stays whole; else stderr)."""

    def __init__(self, write: Optional[Callable[[str], None]] = None) -> None:
        super().__init__()
        self.write = write
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = self.format(record)
            if self.write is not None:
                self.write(msg)
            else:
                import sys

                sys.stderr.write(msg + "\n")
        except Exception:  # noqa: BLE001 - logging never breaks training
            self.handleError(record)


def show_lines(level: int, write: Optional[Callable[[str], None]] = None) -> None:
    """Make the callbacks' lines visible at `level` the way the framework shows its own progress,
    unless the program configured logging for them already (a handler on this logger or above it):
    then its configuration decides. Set on the rank that reports (rank 0); see docs/callbacks.md."""
    if log.level == logging.NOTSET:
        log.setLevel(level)
    if not log.hasHandlers():
        log.addHandler(_LineHandler(write))


@dataclass
class SaveRecord:
    """What happened to one save (``core.records``)."""

    step: Optional[int]
    path: str
    emergency: Optional[str] = None  # the event, for an emergency save
    status: Optional[str] = None  # valid | invalid | incomplete | None (not validated)
    problem: Optional[str] = None
    deleted: list[str] = field(default_factory=list)
    kept_reasons: dict[str, list[str]] = field(default_factory=dict)
    prune_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


VERDICT_CODE = {
    "valid": 0,
    "incomplete": 1,
    "invalid": 2,
    "gone": 4,
}  # reduced with max over the ranks
NOT_DONE = 3
PENDING = 9.0  # a rank's part still running at a meeting (max over the ranks: that verdict waits for the next)
CODE_VERDICT = {1: "incomplete", 2: "invalid", NOT_DONE: "unchecked", 4: "gone"}


@dataclass
class RankedState:
    """The saves whose per-rank verdicts are not reduced yet (many processes; keyed by save number,
    the same on every rank)."""

    seq: int = 0
    records: dict[int, SaveRecord] = field(default_factory=dict)
    # this rank's part: None until done
    results: dict[int, Optional[dict]] = field(default_factory=dict)
    part_ids: dict[int, int] = field(default_factory=dict)  # worker job id -> save number
    cond: threading.Condition = field(default_factory=threading.Condition)


class StrategyCore:
    """Shared logic. ``root`` (the folder the framework saves into) is set by the adapter."""

    def __init__(
        self,
        policy: Any,
        *,
        level: str = "quick",
        handoff_dir: Optional[str] = DEFAULT_HANDOFF_DIR,
        handoff_every: Optional[int] = None,
        join_timeout: float = 600.0,
        framework_log: bool = False,
        manifest: bool = True,
        rank_timeout: float = 600.0,
    ) -> None:
        self.settings: Settings = resolve(policy)
        _check_arguments(level, handoff_dir, handoff_every)
        self.level = level
        self.handoff_dir = handoff_dir
        self.handoff_every = handoff_every
        self.join_timeout = float(join_timeout)
        # write the sha256 manifest of each valid save (formats/manifest.py)
        self.manifest = bool(manifest)
        self.rank_timeout = float(rank_timeout)
        self._ranks: Any = None
        # True: the framework writes no log we can read (Lightning)
        self.framework_log = framework_log
        self.root: Optional[str] = None
        self.records: list[SaveRecord] = []
        self.flags: list[Any] = []
        self.problems: list[str] = []
        self.protect: Callable[[], dict[str, str]] = dict
        # test hooks: after_save_hook(path) runs right after a save, before validation;
        # phase_hook(phase, path, t) runs as the worker reports entering "validate" / "prune" / "idle"; t is the
        # worker's wall clock when it entered (the line reaches this process later, when its reader thread runs).
        self.after_save_hook: Optional[Callable[[str], None]] = None
        self.phase_hook: Optional[Callable[[str, str, float], None]] = None
        self._detector = None
        if self.settings.emergency_save_on or framework_log:
            self._detector = OnlineDetector(self.settings.emergency_save_on)
        # the last logged values before the first event (Lightning): written to the loss log then
        self._history: deque[tuple[int, float, Optional[float]]] = deque(maxlen=HISTORY_LIMIT)
        self._metrics_fh: Optional[IO[str]] = None
        self._spike_seen = False
        self._worker: Optional[_ProcessWorker] = None
        self._worker_failed = False
        self._jobs: dict[int, SaveRecord] = {}
        self._deleted: set[str] = set()
        self._next_id = 0
        self.phase_delay = 0.0  # test hook: seconds the worker lingers as it enters each phase
        self._lock = threading.Lock()
        self._saves_done = 0
        self._ended = False
        self._ranked = RankedState()
        self._holds: list[Any] = []  # the folder's lock, held from before_save to saved (rank 0)
        # world size / global batch changed at the resume (check_resume)
        self.resume_warnings: list[str] = []
        # the interval re-solved for the measured save cost (adaptive.py)
        self.frequency_override: Optional[int] = None
        # every automatic action (rollback, skip, preemption, interval, interruption)
        self.actions: list[dict] = []
        # a playbook's loss log writer, when one runs
        self.action_sink: Optional[Callable[[dict], None]] = None

    # ------------------------------------------------------------------ schedule

    @property
    def frequency(self) -> int:
        return self.frequency_override or self.settings.frequency_steps

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

    def observe(
        self,
        step: int,
        loss: Optional[float],
        grad_norm: Optional[float] = None,
        saving: bool = True,
    ):
        """Feed one logged loss (and grad norm). Returns the Flag when an emergency save is due. Under
        many processes every rank feeds the same values (so decides the same); rank 0 alone logs and
        writes the loss log. saving=False: training has ended, no save can follow (said so, None)."""
        if self._detector is None or loss is None:
            return None
        flag = self._detector.update(step, loss, grad_norm)
        if flag is not None:
            self._spike_seen = True
        zero = self.rank_zero
        if self.framework_log and zero:
            if self._metrics_fh is None:
                self._history.append(
                    (int(step), float(loss), None if grad_norm is None else float(grad_norm))
                )
            if self._spike_seen or self._metrics_fh is not None:
                self._log_metric(step, loss, grad_norm)
        if flag is None:
            return None
        if flag.new_event or flag.save:
            self.flags.append(flag)
        return self._report(flag, step, zero, saving)

    def _report(self, flag, step: int, zero: bool, saving: bool):
        """Log a detector flag (rank 0); the flag when an emergency save is due now, else None."""
        if flag.kind == "nonfinite":
            if flag.new_event and zero:
                log.warning(
                    PREFIX
                    + f"loss is NaN/inf at step {step}: no emergency save (a NaN state is never "
                    "saved); roll back with `checkpoint-strategy recover`"
                )
            return None
        if flag.save and not saving:
            if zero:
                log.warning(
                    PREFIX
                    + f"{flag.kind} at step {step}, the last step: no emergency save after training ended"
                )
            return None
        if flag.save:
            what = "loss" if flag.kind == "loss_spike_detected" else "grad norm"
            med = f" vs median {flag.median:.4g}" if flag.median is not None else ""
            (log.warning if zero else log.debug)(
                PREFIX
                + f"emergency save at step {step}: {flag.kind} ({what} {flag.value:.4g}{med}; "
                f"{'; '.join(flag.rules)})"
            )
            return flag
        if flag.new_event and zero:
            log.warning(
                PREFIX + f"{flag.kind} at step {step} (not in emergency_save_on: no emergency save)"
            )
        return None

    def mark_emergency(self, checkpoint: str, flag) -> bool:
        """Write the marker before the save starts (see formats/marker.py). False when it cannot
        be written: then no emergency save is made (an unmarked post-event checkpoint would look
        like a resume point)."""
        try:
            write_marker(checkpoint, event=flag.kind, step=flag.step, rules=flag.rules)
        except OSError as exc:
            line = (
                f"emergency save at step {flag.step} skipped: cannot write its marker in "
                f"{os.path.dirname(os.fspath(checkpoint))}: {describe_os_error(exc)}"
            )
            with self._lock:
                self.problems.append(line)
            log.error(PREFIX + line)
            return False
        return True

    # ------------------------------------------------------------------ automatic actions

    def record_action(self, rec: dict) -> None:
        """One automatic action: kept for the handoff state and written (rank 0) as a record of the run's loss
        log (METRICS_FILE): through the playbook's writer when one runs, else appended to the file (HF: the
        Trainer's own log is trainer_state.json; the file then holds the records only)."""
        with self._lock:
            self.actions.append(dict(rec))
        if not self.rank_zero:
            return
        if self.action_sink is not None:
            self.action_sink(rec)
        elif self.framework_log:
            if self._metrics_fh is None:
                self._open_metrics()  # from now on every logged loss is written too
            if self._metrics_fh is not None:
                self._metrics_fh.write(json.dumps(rec) + "\n")
                self._flush_metrics()
        elif self.root is not None:
            try:
                with open(os.path.join(self.root, METRICS_FILE), "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(rec) + "\n")
            except OSError as exc:
                log.warning(PREFIX + f"cannot record {rec.get('event')} in {self.root}: {exc}")

    def previous_actions(self, event: str) -> list[dict]:
        """The records of `event` earlier launches of this run wrote into the loss log (rank 0's folder)."""
        return read_actions(os.path.join(self.root, METRICS_FILE) if self.root else None, event)

    # ------------------------------------------------------------------ after a save

    def saved(self, path: str, step: Optional[int], emergency: Optional[str] = None) -> None:
        """The framework finished writing `path`: validate it, then prune (in the background
        worker process when async_save, inline otherwise)."""
        path = os.path.normpath(os.fspath(path))
        if self.ranks.multi:
            self._saved_ranked(path, step, emergency)
            return
        self._release_folder()
        if self.after_save_hook is not None:
            self.after_save_hook(path)
        rec = SaveRecord(step=step, path=path, emergency=emergency)
        s = self.settings
        job = self._prune_job(path, validate=bool(s.validate_on_save or s.keep_last))
        self._flush_metrics()
        self._submit(job, rec)

    def _prune_job(self, path: str, validate: bool) -> dict[str, Any]:
        """The worker's job after a save: validate (unless the ranks already did), manifest, prune."""
        s = self.settings
        return {
            "kind": "save",
            "path": path,
            "root": self.root,
            "level": self.level,
            "validate": validate,
            "keep_last": s.keep_last,
            "milestones": list(s.milestones),
            "protect": dict(self.protect() or {}),
            "delete_invalid": s.delete_invalid,
            "log": self._metrics_path(),
            "phase_delay": self.phase_delay,
            "manifest": self.manifest,
            "lock_timeout": self.join_timeout,
        }

    def _submit(self, job: dict[str, Any], rec: Optional[SaveRecord]) -> None:
        """To the background worker (async_save), else inline; the answer comes to _on_message."""
        with self._lock:
            self._next_id += 1
            job["id"] = self._next_id
            if rec is not None:
                if rec not in self.records:
                    self.records.append(rec)
                self._jobs[job["id"]] = rec
            else:
                self._ranked.part_ids[job["id"]] = job["seq"]
        worker = self._get_worker() if self.settings.async_save else None
        if worker is None or not worker.submit(job):
            self._on_message((part_job if job["kind"] == "part" else process_job)(job, self._phase))

    # ------------------------------------------------------------------ resume

    def check_resume(
        self,
        checkpoint: Optional[str],
        *,
        world_size: int,
        per_device_batch: Optional[int] = None,
        accumulation: Optional[int] = None,
    ) -> list[str]:
        """At the start of a resumed run: warnings (logged on rank 0, kept in `resume_warnings`) when this run's
        world size or global batch differs from what `checkpoint` was saved with, with what keeps the schedule
        the same (formats/runshape.py, the same lines `verify-resume --checkpoints` prints). Nothing when
        the checkpoint is not on disk or records neither; never raises on its content."""
        if not checkpoint or not os.path.exists(checkpoint):
            return []

        try:
            lines = check_resume_shape(
                checkpoint,
                world_size=world_size,
                per_device_batch=per_device_batch,
                accumulation=accumulation,
            )
        except (
            ValueError
        ) as e:  # a framework value that is not a whole number >= 1: say so, never stop training
            lines = [f"resume shape not checked: {e}"]
        self.resume_warnings = lines
        if self.rank_zero:
            for line in lines:
                log.warning(PREFIX + line)
        return lines

    # ------------------------------------------------------------------ many processes (torchrun, DDP)

    @property
    def ranks(self):
        """This process's rank (callbacks/_dist.py); rank 0 of 1 without torch.distributed."""
        if self._ranks is None:
            self._ranks = Ranks(self.rank_timeout)
        return self._ranks

    @property
    def rank_zero(self) -> bool:
        return self.ranks.rank == 0

    def before_save(self) -> None:
        """Right before the framework starts a save (every rank). Rank 0 takes the folder's lock, the
        one `prune` holds while it surveys and deletes: a save waits only for a prune in progress (not
        for validations, which read finished checkpoints), and no prune starts until the save is
        written (released in `saved`). Then the ranks meet, so no rank writes before the lock is held."""
        if self.rank_zero and self.root is not None and self.settings.keep_last:
            self._hold_folder()
        if self.ranks.multi:
            self.ranks.barrier("before a save", slack=self.join_timeout)

    def _hold_folder(self) -> None:
        stack = ExitStack()
        try:
            stack.enter_context(
                locked(self.root or ".", self.join_timeout, "a prune still holds it")
            )
        except UsageError as exc:
            log.warning(PREFIX + f"cannot hold {self.root} against a prune ({exc}); saving anyway")
            return
        with self._lock:
            self._holds.append(stack)

    def _release_folder(self) -> None:
        """The save is written: a prune may run (the oldest hold: saves end in the order they began)."""
        with self._lock:
            stack = self._holds.pop(0) if self._holds else None
        if stack is not None:
            stack.close()

    def _saved_ranked(self, path: str, step: Optional[int], emergency: Optional[str]) -> None:
        """Every rank, after the framework's save returned: meet (every rank finished writing), check
        this rank's part of the files, and settle the verdicts whose parts are done (see _settle). With
        the worker, the verdicts of the earlier saves whose parts every rank has finished ride on the meeting
        itself (one collective a save, and the training never waits for its worker here); the others wait
        for the next save, or the end of training."""
        rec = SaveRecord(step=step, path=path, emergency=emergency)
        with self._lock:
            self.records.append(rec)
        st = self._ranked
        st.seq += 1
        name = os.path.basename(path)
        s = self.settings
        checking = bool(s.validate_on_save or s.keep_last)
        # the policy's, the same on every rank (not whether a worker started)
        riding = checking and bool(s.async_save)
        seqs, codes = self._ready_parts(st.seq - 1) if riding else ([], [])
        met = self.ranks.reduce([0.0] + codes, f"after the save of {name}")
        self._release_folder()
        if met is not None and checking:
            if self.after_save_hook is not None:
                self.after_save_hook(path)
            self._flush_metrics()
            self._submit_part(path, rec)
        for q, code in zip(seqs, met[1:] if met else [], strict=False):
            if code < PENDING:  # every rank's part is done: the verdict (the same on every rank)
                with st.cond:
                    mine = st.results.pop(q) or {}
                self._verdict(st.records.pop(q), mine, code)
        if met is None:
            self._problem(
                f"{name}: not validated and nothing pruned: the ranks did not all finish this save "
                f"({self.ranks.broken})"
            )
        elif not checking:
            if self.after_save_hook is not None:
                self.after_save_hook(path)
            self._flush_metrics()
        elif not riding:
            self._settle(st.seq)

    def _submit_part(self, path: str, rec: SaveRecord) -> None:
        """This rank's part of the new save's validation, to the worker (or inline)."""
        st = self._ranked
        st.records[st.seq] = rec
        st.results[st.seq] = None
        if self.level == "deep":  # deep compares across files: rank 0 checks it whole
            part = [0, 1] if self.rank_zero else None
        else:
            part = [self.ranks.rank, self.ranks.world]
        job = {
            "kind": "part",
            "seq": st.seq,
            "path": path,
            "level": self.level,
            "part": part,
            "phase_delay": self.phase_delay,
        }
        self._submit(job, None)

    def _problem(self, line: str) -> None:
        if self.rank_zero:
            with self._lock:
                self.problems.append(line)
            log.error(PREFIX + line)

    def _ready_parts(self, upto: int) -> tuple[list[int], list[float]]:
        """The saves up to `upto` whose verdicts are not reduced yet, with this rank's code for each: its
        verdict when its part is done, PENDING while it runs (never waited for here: a save's meeting holds
        the folder's lock, which the worker's prune ahead of that part may be waiting for)."""
        st = self._ranked
        with st.cond:
            seqs = sorted(q for q in st.results if q <= upto)
            res = [st.results[q] for q in seqs]
        return seqs, [PENDING if r is None else self._codes([r])[0] for r in res]

    def _own_parts(self, upto: int) -> tuple[list[int], list[dict]]:
        """The saves up to `upto` whose verdicts are not reduced yet, and this rank's part of each (waiting
        for them at most join_timeout; a part not done by then counts as not finished)."""
        st = self._ranked
        seqs = sorted(q for q in st.results if q <= upto)
        if not seqs:
            return [], []
        deadline = time.monotonic() + self.join_timeout
        with st.cond:
            while any(st.results[q] is None for q in seqs) and time.monotonic() < deadline:
                st.cond.wait(max(0.01, deadline - time.monotonic()))
            own = [
                st.results.pop(q)
                or {"status": None, "problem": "this rank's part did not finish in time"}
                for q in seqs
            ]
        return seqs, own

    @staticmethod
    def _codes(own: list[dict]) -> list[float]:
        return [float(VERDICT_CODE.get(str(r.get("status")), NOT_DONE)) for r in own]

    def _settle(self, upto: int) -> None:
        """Reduce the verdicts of the saves up to `upto` over the ranks (max of the per-part codes):
        valid only when every part is. Rank 0 then writes the manifest and prunes (valid) or reports
        every rank's problem (not valid). Every rank calls this at the same point."""
        seqs, own = self._own_parts(upto)
        if not seqs:
            return
        codes = self.ranks.reduce(self._codes(own), "validation verdicts", slack=self.join_timeout)
        for q, mine, code in zip(seqs, own, codes or [None] * len(seqs), strict=True):
            self._verdict(self._ranked.records.pop(q), mine, code)

    def _verdict(self, rec: SaveRecord, mine: dict, code: Optional[float]) -> None:
        name = os.path.basename(rec.path)
        if code is None:
            self._problem(
                f"{name}: no verdict: the ranks did not meet ({self.ranks.broken}); nothing pruned"
            )
            return
        if code == VERDICT_CODE["valid"]:
            if self.rank_zero:
                self._submit(self._prune_job(rec.path, validate=False) | {"verdict": "valid"}, rec)
            return
        if code == VERDICT_CODE["gone"]:  # a rank found it pruned already: as on one process
            if self.rank_zero:
                self._apply(rec, {"status": "gone"})
            return
        lines = self.ranks.gather_text(mine.get("problem") or "", f"the problems of {name}")
        rec.status = CODE_VERDICT.get(int(code), "invalid")
        if self.rank_zero:
            said = [f"rank {r}: {t}" for r, t in enumerate(lines or []) if t]
            rec.problem = "; ".join(said) or "a rank's part did not finish"
            line = (
                f"{name}"
                + (f" (step {rec.step})" if rec.step is not None else "")
                + f" is {rec.status.upper()} right after its save: {rec.problem}; kept for inspection, "
                "nothing deleted"
            )
            self._problem(line)

    def start(self) -> None:
        """At the start of training: launch the background worker now, not inside the first save."""
        if self.settings.async_save and (self.settings.validate_on_save or self.settings.keep_last):
            self._get_worker()

    def _get_worker(self):
        if self._worker is None and not self._worker_failed:
            try:
                self._worker = _ProcessWorker(self._on_message)
            except OSError as exc:
                self._worker_failed = True
                log.warning(
                    PREFIX + f"cannot start the background worker ({exc}): validating inline"
                )
        return self._worker

    # the callback's own loss log, for frameworks whose checkpoints carry none (Lightning): written
    # whole at the first flagged value, then appended each logged step and flushed before each save
    # is handed over, so a prune always reads the newest values when it runs.

    def _metrics_path(self) -> Optional[str]:
        return os.path.join(self.root, METRICS_FILE) if (self.framework_log and self.root) else None

    def retire_old_metrics(self) -> None:
        """At the start of a fit: an earlier attempt's loss log is kept aside (renamed), not read."""
        path = self._metrics_path()
        if path and os.path.lexists(path):
            try:
                os.replace(path, path[: -len(".jsonl")] + ".previous.jsonl")
            except OSError as exc:
                log.warning(PREFIX + f"cannot set aside the previous loss log {path}: {exc}")

    def _log_metric(self, step: int, loss: float, grad_norm: Optional[float]) -> None:
        rec = {"step": int(step), "loss": float(loss)}
        if grad_norm is not None:
            rec["grad_norm"] = float(grad_norm)
        if self._metrics_fh is None:
            if self._spike_seen:
                self._open_metrics()  # the history holds this value already
            return
        self._metrics_fh.write(json.dumps(rec) + "\n")

    def _open_metrics(self) -> None:
        """Write the loss log whole (the values kept so far) and keep it open for appending; a log another writer
        started already (a playbook's guard) is appended to as it is."""
        path = self._metrics_path()
        if path is None:
            return

        try:
            if not os.path.exists(path):
                lines = [
                    json.dumps(
                        {"step": s_, "loss": l_, **({"grad_norm": g_} if g_ is not None else {})}
                    )
                    for s_, l_, g_ in self._history
                ]
                atomic_write_text(path, "".join(x + "\n" for x in lines))
            self._metrics_fh = open(path, "a", encoding="utf-8")
        except OSError as exc:
            log.warning(
                PREFIX + f"cannot write the loss log {path}: {exc}; the spike check of prune is off"
            )
            self.framework_log = False
        self._history.clear()

    def _flush_metrics(self) -> None:
        if self._metrics_fh is not None:
            try:
                self._metrics_fh.flush()
            except OSError:
                pass

    def _phase(self, phase: str, path: str, t: Optional[float] = None) -> None:
        if self.phase_hook is not None:
            self.phase_hook(phase, path, time.time() if t is None else t)

    def _on_message(self, msg: dict) -> None:
        """A phase or a result from the worker (or from an inline job)."""
        if "phase" in msg:
            t = msg.get("t")
            self._phase(
                msg["phase"], msg.get("path", ""), float(t) if isinstance(t, (int, float)) else None
            )
            return
        with self._lock:
            jid = msg.get("id")
            rec = self._jobs.pop(jid, None) if isinstance(jid, int) else None
            seq = self._ranked.part_ids.pop(jid, None) if isinstance(jid, int) else None
        if seq is not None:  # this rank's part of a save (many processes)
            with self._ranked.cond:
                self._ranked.results[seq] = msg
                self._ranked.cond.notify_all()
            return
        if rec is None:  # a handoff job's answer
            if msg.get("error"):
                log.error(
                    PREFIX
                    + f"could not write the handoff state to {self.handoff_dir}: {msg['error']}"
                )
            return
        self._apply(rec, msg)

    def _apply(self, rec: SaveRecord, res: dict) -> None:
        name = os.path.basename(rec.path)
        at = f" (step {rec.step})" if rec.step is not None else ""
        rec.status, rec.problem = res.get("status"), res.get("problem")
        rec.deleted, rec.kept_reasons = (
            list(res.get("deleted") or []),
            dict(res.get("kept_reasons") or {}),
        )
        rec.prune_errors, rec.seconds = (
            list(res.get("prune_errors") or []),
            float(res.get("seconds") or 0.0),
        )
        self._deleted.update(rec.deleted)
        if rec.status == "gone":
            if name in self._deleted:
                log.info(
                    PREFIX
                    + f"{name}{at} was pruned before its own validation ran (a newer checkpoint had "
                    "validated)"
                )
            else:
                line = f"{name}{at} disappeared before it was validated (removed by hand?)"
                with self._lock:
                    self.problems.append(line)
                log.error(PREFIX + line)
        elif res.get("error"):
            line = f"after saving {name}: {res['error']}"
            with self._lock:
                self.problems.append(line)
            log.error(PREFIX + line)
        elif rec.status not in (None, "valid"):
            line = (
                f"{name}{at} is {str(rec.status).upper()} right after its save: {rec.problem}; kept for "
                "inspection, nothing deleted"
            )
            with self._lock:
                self.problems.append(line)
            log.error(PREFIX + line)
        else:
            if res.get("manifest_error"):
                log.warning(PREFIX + f"{name}: manifest not written: {res['manifest_error']}")
            for err in rec.prune_errors:
                log.warning(PREFIX + f"prune: {err}")
            pruned = f"; pruned {', '.join(rec.deleted)}" if rec.deleted else ""
            kind = f"emergency save ({rec.emergency})" if rec.emergency else "saved"
            log.info(
                PREFIX + f"{kind} {name}{at}: {rec.status or 'not validated'} ({self.level}, "
                f"{rec.seconds:.2f} s){pruned}"
            )
        with self._lock:
            self._saves_done += 1
            due = self.handoff_every is not None and self._saves_done % self.handoff_every == 0
        if due:
            self.write_handoff()

    # ------------------------------------------------------------------ end of training

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the background jobs; True when all finished."""
        if self._worker is None:
            return True
        return self._worker.wait(self.join_timeout if timeout is None else timeout)

    def end(self) -> dict:
        """Join the worker (with the timeout), report, write the handoff state. Idempotent."""
        if self._ended:
            return self.summary()
        self._ended = True
        while self._holds:
            self._release_folder()
        started = time.monotonic()
        if self.ranks.multi:
            self._settle(self._ranked.seq)
            if not self.rank_zero:
                self._close_worker(started)
                return {}
        finished = self.wait()
        if not finished:
            line = (
                f"validation of the last saves did not finish within {self.join_timeout:g} s: they are not "
                "checked yet; run `checkpoint-strategy validate` on the folder"
            )
            self.problems.append(line)
            log.error(PREFIX + line)
        summary = self.summary()
        log.info(
            PREFIX
            + f"end of training: {summary['validated']} saves validated, {summary['invalid']} invalid, "
            f"{summary['pruned']} pruned, {summary['emergency_saves']} emergency; last valid "
            f"{summary['last_valid'] or 'none'}"
        )
        self.write_handoff()
        if self._metrics_fh is not None:
            self._metrics_fh.close()
            self._metrics_fh = None
        self._close_worker(started)
        return summary

    def restart(self) -> None:
        """Another ``train`` on the same callback (train_with_recovery's resume after a rollback): end() runs again."""
        self._ended = False
        self._worker = None
        self._worker_failed = False

    def _close_worker(self, started: float) -> None:
        if self._worker is not None:
            self._worker.wait(max(1.0, self.join_timeout - (time.monotonic() - started)))
            self._worker.close()

    def decide_emergency(
        self,
        step: int,
        loss: Optional[float],
        grad_norm: Optional[float],
        checkpoint: str | Callable[[], str],
    ) -> Optional[str]:
        """Every rank at the same hook, with the same values (HF logs the loss averaged over the
        processes; Lightning's is averaged by `start_reduced` / `finish_reduced`), so every rank's detector
        decides the same. On an event rank 0 writes the marker first and broadcasts whether it could:
        every rank saves or none does. No collective on the steps without an event. checkpoint: the
        path the save will write, or a function giving it (called only on an event). The trigger, or None."""
        flag = self.observe(step, loss, grad_norm)
        if flag is None:
            return None
        path = checkpoint() if callable(checkpoint) else checkpoint
        marked = self.mark_emergency(path, flag) if self.rank_zero else True
        if self.ranks.multi:
            out = self.ranks.broadcast([float(marked)], f"the emergency decision at step {step}")
            marked = bool(out and out[0])
        return flag.kind if marked else None

    def reduced(
        self, loss: Optional[float], grad_norm: Optional[float]
    ) -> tuple[Optional[float], Optional[float]]:
        """The loss (and grad norm) averaged over the ranks, waiting for it; as is on one process. None when
        a rank has none, or the ranks did not meet."""
        if not self.ranks.multi:
            return loss, grad_norm
        return self.finish_reduced(self.start_reduced(loss, grad_norm))

    def start_reduced(self, loss: Optional[float], grad_norm: Optional[float]):
        """Start averaging the loss (and grad norm) over the ranks without waiting (one all_reduce of four
        numbers); `finish_reduced` takes the result. Every rank calls both at the same hooks."""
        vals = [
            0.0 if loss is None else loss,
            0.0 if grad_norm is None else grad_norm,
            float(loss is None),
            float(grad_norm is None),
        ]
        return self.ranks.start(vals, "the logged loss", "sum")

    def finish_reduced(self, pending) -> tuple[Optional[float], Optional[float]]:
        """The averages a `start_reduced` began: (loss, grad norm); None when a rank had none, or the ranks
        did not meet."""
        out = self.ranks.finish(pending)
        if out is None or out[2] > 0:
            return None, None
        n = self.ranks.world
        return out[0] / n, (None if out[3] > 0 else out[1] / n)

    def summary(self) -> dict:
        with self._lock:
            recs = list(self.records)
        last = None
        if self.root is not None:
            try:
                last = last_valid_checkpoint(self.root, level=self.level)
            except Exception:  # noqa: BLE001
                last = None
        return {
            "validated": sum(r.status is not None for r in recs),
            "invalid": sum(r.status not in (None, "valid", "gone") for r in recs),
            "pruned": sum(len(r.deleted) for r in recs),
            "emergency_saves": sum(r.emergency is not None for r in recs),
            "last_valid": os.path.basename(last) if last else None,
            "problems": list(self.problems),
        }

    def write_handoff(self) -> None:
        """The session-handoff state the `handoff` command writes, plus this run's problems (on the
        worker when there is one)."""
        if not self.handoff_dir or self.root is None:
            return

        with self._lock:
            risks = [f"training callback: {p}" for p in self.problems]
            self._next_id += 1
            jid = self._next_id
            actions = [dict(a) for a in self.actions[-50:]]
        report = self.settings.report
        job = {
            "kind": "handoff",
            "id": jid,
            "root": self.root,
            "level": self.level,
            "state_dir": self.handoff_dir,
            "report": report.model_dump(mode="json") if report is not None else None,
            "risks": risks,
            "actions": actions,
        }
        worker = self._worker if self.settings.async_save else None
        if worker is None or not worker.submit(job):
            self._on_message(handoff_job(job))


def _check_arguments(level: Any, handoff_dir: Optional[str], handoff_every: Any) -> None:
    """The core's own arguments: level quick, full or deep; handoff_every a whole number >= 1, with a handoff_dir."""
    if level not in ("quick", "full", "deep"):
        raise UsageError(f"level must be quick, full or deep, got {level!r}")
    if handoff_every is not None and (not isinstance(handoff_every, int) or handoff_every < 1):
        raise UsageError(f"handoff_every must be a whole number >= 1, got {handoff_every!r}")
    if handoff_every is not None and not handoff_dir:
        raise UsageError(
            "handoff_every needs handoff_dir (the folder to write the handoff state to; "
            "no handoff is written by default)"
        )


def read_actions(path: Optional[str], event: str) -> list[dict]:
    """The records of `event` in a loss log (the callbacks' and the guard's, METRICS_FILE); [] without one."""
    out: list[dict] = []
    if path is None or not os.path.isfile(path):
        return out
    key = f'"{event}"'
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if key in line:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(rec, dict) and rec.get("event") == event:
                        out.append(rec)
    except OSError:
        return []
    return out


class _ProcessWorker:
    """One child process (`python -m checkpoint_strategy.callbacks._worker`) fed JSON lines; a
    daemon thread reads its answers (blocked in read, it holds no GIL)."""

    def __init__(self, on_message: Callable[[dict], None]) -> None:
        scripts = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

        env = dict(os.environ, **ONE_THREAD)
        env["PYTHONPATH"] = scripts + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
        )
        self.on_message = on_message
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "checkpoint_strategy.callbacks._worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            encoding="utf-8",
            bufsize=1,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None, "both are pipes"
        self._stdin: IO[str] = self.proc.stdin
        self._stdout: IO[str] = self.proc.stdout
        self._lock = threading.Lock()
        self.pending: dict[int, threading.Event] = {}
        self.dead = False
        self.thread = threading.Thread(
            target=self._read, name="checkpoint-strategy-reader", daemon=True
        )
        self.thread.start()

    def submit(self, job: dict) -> bool:
        ev = threading.Event()
        with self._lock:
            if self.dead:
                return False
            self.pending[job["id"]] = ev
        try:
            self._stdin.write(json.dumps(job) + "\n")
            self._stdin.flush()
        except (OSError, ValueError):
            with self._lock:
                self.pending.pop(job["id"], None)
                self.dead = True
            return False
        return True

    def _read(self) -> None:
        for line in self._stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            try:
                self.on_message(msg)
            except Exception as exc:  # noqa: BLE001 - keep reading whatever a hook does
                log.error(PREFIX + f"handling a worker message: {type(exc).__name__}: {exc}")
            if "id" in msg:
                with self._lock:
                    ev = self.pending.pop(msg["id"], None)
                if ev is not None:
                    ev.set()
        with self._lock:
            self.dead = True
            left = list(self.pending.items())
            self.pending.clear()
        for jid, ev in left:
            self.on_message(
                {"id": jid, "error": "the background worker exited before finishing this job"}
            )
            ev.set()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                events = list(self.pending.values())
            if not events:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            events[0].wait(left)

    def close(self) -> None:
        try:
            self._stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            self.proc.kill()
