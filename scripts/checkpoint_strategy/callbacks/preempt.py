"""Preemption: SIGTERM / SIGUSR1 (SLURM, Kubernetes, spot instances) make the run save at the next step
boundary and stop, within a grace period.

The signal handler only records the signal (a save in progress finishes untouched; nothing is written
from inside the handler). The callback sees the request at the next step end, saves, stops training and
records the save as a preemption save: a whole checkpoint and a valid resume point (unlike an emergency
save, it carries no marker), named in ``<root>/.checkpoint-strategy-preemption.json`` and in one
``checkpoint-strategy:`` line; ``last_valid_checkpoint(root)`` finds it at the next launch. When no step
boundary comes within ``grace_seconds`` of the signal (a hung step), the previous handler is put back and
the signal is raised again: the process ends as it would have without the callback.

A signal during a save: the save goes on (the handler writes nothing) and, once written, is itself the
preemption save (no second save). When the grace period ends while the save is still being written, it
gets ``grace_seconds`` once more to finish; still unfinished then, the adapter's ``abandon`` moves the
half-written checkpoint aside (renamed ``<name>.abandoned-preemption``: no checkpoint name, so nothing
resumes from it or counts it as whole; nothing is deleted) before the signal's own action ends the process.

The adapters (hf.py, lightning.py, guard.py) share the bookkeeping here: ``at_step_end`` (the step to save at),
``begin_save`` / ``save_written`` around every save (which one is the preemption save), ``finish_save`` (its record,
once). ``"auto"``: SIGTERM and SIGUSR1 (``install_for``).

Many processes (torchrun, Lightning DDP): a signal may reach some ranks only (a node's agent signalling its own
processes, ``kill -USR1 <pid>``). The request is exchanged at every step end (``at_step_end``: one all_reduce, max, of
this rank's signal number, on the run's process group, started at a step end and taken at the next, bounded by the
callback's ``rank_timeout``; or a playbook's loss all_reduce that carries it, ``agreed``), so every rank makes the
preemption save at the same step (the step end after the one the signal came in) and stops;
rank 0 alone writes the record. A signal during a save is then no preemption save by itself (each rank would
decide alone): the next step end's exchange makes the save.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any, Optional

from checkpoint_strategy.atomic import atomic_write_text
from checkpoint_strategy.callbacks._log import PREFIX, log
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.storage import read_json

RECORD_FILE = ".checkpoint-strategy-preemption.json"
DEFAULT_SIGNALS = ("SIGTERM", "SIGUSR1")
HUNG_SECONDS = (
    10.0  # after the grace period: how long the main thread may take to run the signal's own action
)


def _signals(names) -> list[signal.Signals]:
    out = []
    for n in names or ():
        name = n.name if isinstance(n, signal.Signals) else str(n).upper()
        name = name if name.startswith("SIG") else "SIG" + name
        sig = getattr(signal, name, None)
        if not isinstance(sig, signal.Signals) or name in ("SIGKILL", "SIGSTOP"):
            raise UsageError(
                f"preemption signal {n!r}: not a signal this system can catch; expected e.g. SIGTERM, SIGUSR1"
            )
        out.append(sig)
    return out


class Preemption:
    """``install()`` at the start of training, ``requested`` after a signal, ``finished()`` once saved."""

    def __init__(self, signals: Any = DEFAULT_SIGNALS, grace_seconds: float = 120.0) -> None:
        if not isinstance(grace_seconds, (int, float)) or not grace_seconds > 0:
            raise UsageError(f"grace_seconds must be a number > 0, got {grace_seconds!r}")
        self.auto = isinstance(signals, str) and signals == "auto"
        if isinstance(signals, (str, signal.Signals)) and not self.auto:
            signals = [signals]
        self.signals = _signals(DEFAULT_SIGNALS if self.auto else signals)
        self.grace = float(grace_seconds)
        self.requested: Optional[str] = None
        self.received_at: Optional[float] = None
        self._previous: dict[signal.Signals, Any] = {}
        self._timer: Optional[threading.Timer] = None
        self.saving: Optional[str] = (
            None  # the checkpoint being written now (begin_save .. save_written)
        )
        self.rank_zero = True  # the rank that moves a half-written save aside
        self.step: Optional[int] = None  # the preemption save's step, once chosen
        self.record: Optional[dict] = None  # its record, once written and validated (finish_save)
        self.in_save: Any = lambda: self.saving is not None
        self.abandon: Any = self._abandon  # move the save being written aside
        self._extended = False
        self._expired = False
        # many processes: the signal caught on this rank (its number: what the exchange carries), the run's ranks
        # (callbacks/_dist.Ranks) when the request is exchanged, the exchange started at the last step end
        # (callbacks/_dist.Pending), a playbook's answer for one step (step, any rank's request)
        self._signum = 0
        self.ranks: Any = None
        self._pending: Any = None
        self._agreed: Optional[tuple[int, bool]] = None

    def install_for(
        self, world_size: int, previous: Optional[dict] = None, ranks: Any = None
    ) -> bool:
        """install(); in a run of many processes the request is exchanged at every step end over `ranks`
        (callbacks/_dist.Ranks): without them "auto" stays off there (each rank would save on its own)."""
        if int(world_size) > 1 and self.signals:
            if ranks is None and self.auto:
                return False
            self.ranks = ranks
        return self.install(previous)

    @property
    def exchanges(self) -> bool:
        """The request goes over the ranks at each step end (many processes, the ranks still meeting)."""
        return self.ranks is not None and bool(self.ranks.ok)

    def agreed(self, step: int, any_rank: bool) -> None:
        """A playbook's per-step all_reduce carried this rank's request (``requested`` then) for `step`: whether
        any rank had one. at_step_end(step) takes it instead of exchanging again."""
        self._agreed = (int(step), bool(any_rank))

    def at_step_end(self, step: int) -> bool:
        """True once: at the first step end after the signal, the step whose save is the preemption save. Under
        many processes: the first step end whose exchange says a rank had the signal, the same on every rank."""
        if self.step is not None:
            return False
        if not (self._exchange(int(step)) if self.exchanges else self.requested is not None):
            return False
        self.step = int(step)
        return True

    def _exchange(self, step: int) -> bool:
        """Any rank's request: the all_reduce (max of the signal numbers) started at the previous step end, taken
        now (DDP's gradient all_reduce of this step has completed it: the training thread does not wait on the
        other rank), or the playbook's own of this step. Without an answer here, this rank's request now goes
        into a new one, taken at the next step end: the save comes at most two step ends after the signal, at
        the same step on every rank. This rank's own request when the ranks no longer meet (the framework's
        collectives end the run)."""
        signum, found = 0, False
        pending, self._pending = self._pending, None
        if pending is not None:
            out = self.ranks.finish(pending)
            if out is not None:
                signum = int(out[0])
                found = signum > 0
        agreed, self._agreed = self._agreed, None
        if agreed is not None and agreed[0] == step:
            found = found or agreed[1]
        elif not found:
            mine = float(self._signum if self.requested is not None else 0)
            self._pending = self.ranks.start([mine], "the preemption request", "max")
        if self.ranks.broken is not None:
            return self.requested is not None
        if found and self.requested is None:
            name = signal.Signals(signum).name if signum > 0 else "a preemption signal"
            self.requested = f"{name} on another rank"
            self.received_at = time.monotonic()
        return found

    def begin_save(self, path: str) -> None:
        self.saving = os.fspath(path)

    def save_written(self, step: Optional[int], resumable: bool = True) -> bool:
        """A save ended: True when it is the preemption save (a signal that came while it was written makes it
        one: no second save; never an emergency save, resumable=False). Stops the grace timer then (no timer
        during its validation)."""
        self.saving = None
        if (
            self._expired or not resumable
        ):  # past the grace period (moved aside), or an emergency save
            return False
        # one process: a signal during this save makes it the preemption save; many: the next step end's exchange
        if (
            self.requested is not None
            and self.step is None
            and step is not None
            and not self.exchanges
        ):
            self.step = int(step)
        if self.step is not None and step == self.step:
            self._cancel()
            return True
        return False

    def finish_save(
        self, root: Optional[str], checkpoint: str, step: Optional[int], record: Any
    ) -> Optional[dict]:
        """After the preemption save (``save_written`` said so) is handed over: its record, once (``record`` writes
        it into the run's loss log); None for any other save."""
        if self.record is not None or self.step is None or step != self.step:
            return None
        self.record = self.finished(root, checkpoint, self.step)
        record(self.record)
        return self.record

    def _abandon(self) -> None:
        if self.saving is not None and self.rank_zero:
            abandon_checkpoint(self.saving)

    def install(self, previous: Optional[dict] = None) -> bool:
        """Catch the signals (main thread only: Python delivers signals there). False when it cannot.
        previous: the handlers the signal's own action falls back to, where they are not the current ones (a
        framework's own handler that would not end the process: Lightning's)."""
        if not self.signals or self._previous:
            return bool(self._previous)
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                PREFIX + "preemption signals not caught: training does not run in the main thread"
            )
            return False
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handler)
            if previous and sig in previous:
                self._previous[sig] = previous[sig]
        return True

    def uninstall(self) -> None:
        """Put the previous handlers back (where the handler is still ours: a framework that restored its own
        originals meanwhile keeps them)."""
        for sig, prev in self._previous.items():
            if signal.getsignal(sig) == self._handler:
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._previous = {}
        self._cancel()

    def _handler(self, signum, frame) -> None:
        if (
            self._expired
        ):  # the grace period is over (raised again by the timer): the signal's own action, here
            sig = signal.Signals(signum)
            signal.signal(sig, self._previous.get(sig) or signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.requested is not None:
            return
        self.requested = signal.Signals(signum).name
        self._signum = int(signum)
        self.received_at = time.monotonic()
        self._arm(signum)

    def _arm(self, signum: int) -> None:
        self._timer = threading.Timer(self.grace, self._expire, args=(signum,))
        self._timer.daemon = True
        self._timer.start()

    def _expire(self, signum: int) -> None:
        """On the timer's thread: the handler is put back only on the main thread, so the signal is raised again
        for the handler there to do it; a main thread stuck in native code past HUNG_SECONDS more: exit."""
        if self.in_save():
            if not self._extended:
                self._extended = True
                log.warning(
                    PREFIX
                    + f"{signal.Signals(signum).name}: the grace period ended during a save; it gets "
                    f"{self.grace:g} s more to finish"
                )
                self._arm(signum)
                return
            self.abandon()
        log.error(
            PREFIX
            + f"{signal.Signals(signum).name}: no step boundary within the {self.grace:g} s grace "
            "period; the signal's own action now (no preemption save)"
        )
        self._expired = True
        os.kill(os.getpid(), signum)
        time.sleep(HUNG_SECONDS)
        os._exit(128 + signum)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def finished(self, root: Optional[str], checkpoint: str, step: int) -> dict:
        """The preemption save is written: stop the grace timer, record it, log one line."""
        self._cancel()
        took = time.monotonic() - self.received_at if self.received_at is not None else 0.0
        rec = {
            "event": "checkpoint-strategy:preemption",
            "signal": self.requested,
            "step": int(step),
            "checkpoint": os.fspath(checkpoint),
            "seconds_after_signal": round(took, 3),
        }
        if root is not None and self.rank_zero:  # one record, rank 0's
            try:
                atomic_write_text(os.path.join(root, RECORD_FILE), json.dumps(rec) + "\n")
            except OSError as exc:
                log.warning(PREFIX + f"cannot write the preemption record in {root}: {exc}")
        log.warning(
            PREFIX
            + f"{self.requested}: preemption save {os.path.basename(os.fspath(checkpoint))} (step {step}) "
            f"{took:.1f} s after the signal; training stops; the next launch resumes from it "
            "(last_valid_checkpoint)"
        )
        return rec


def abandon_checkpoint(path: str) -> Optional[str]:
    """Move a half-written checkpoint aside (``<path>.abandoned-preemption``); its new path, or None."""
    if not os.path.lexists(path):
        return None
    target = path.rstrip("/\\") + ".abandoned-preemption"
    try:
        os.replace(path, target)
    except OSError as exc:
        log.error(
            PREFIX
            + f"cannot move the half-written {os.path.basename(path)} aside: {exc}; it is not whole"
        )
        return None
    log.error(
        PREFIX
        + f"{os.path.basename(path)} was still being written at the end of the grace period: moved to "
        f"{os.path.basename(target)} (not a checkpoint; nothing resumes from it)"
    )
    return target


def read_record(root: str | os.PathLike) -> Optional[dict]:
    """The last preemption save recorded under `root`, or None."""
    path = os.path.join(os.fspath(root), RECORD_FILE)
    if not os.path.isfile(path):
        return None
    try:
        doc = read_json(path, "preemption record")
    except (UsageError, ValueError, OSError):
        return None
    return doc if isinstance(doc, dict) else None
