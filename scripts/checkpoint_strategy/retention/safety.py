"""One notion of "safe to resume from", shared by every command that names checkpoints.

A checkpoint is safe to resume from when it is valid, resumable (optimizer state present) and not
saved after the onset of a loss event that has not recovered. The training log is read the way
`prune` always read it: the recovery adviser on the log (default: the run folder's log as
`formats/runlog.py` finds it: the newest valid checkpoint's trainer_state.json, else the callbacks'
loss log, Lightning's metrics.csv, TensorBoard event files), offered the valid checkpoints as resume
points. "After the onset" is the adviser's own cut: a step above `checkpoints.cutoff_step` (onset - margin), i.e. exactly the
checkpoints `recover` lists in `checkpoints.post_event`.

Public API::

    guard = read_spike([(step, path), ...], log=None, advise=recovery.advise)   # SpikeGuard | None (no log)
    after_onset(step, guard)                            # True: holds spiked weights, do not resume
    safe_to_resume(status, resumable, step, guard)
    do_not_resume(guard)                                # "after the spike at step 121: do not resume"
    pre_spike_names(guard)                              # name -> why, checkpoints kept before any spike

The adviser is passed in (`advise=checkpoint_strategy.recovery.advise`) by the caller above: checkpoints/
sits below recovery/ and never imports it (docs/DEVELOPING.md, Layers). Every function here that reads
a log takes it and hands it on.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from checkpoint_strategy import storage
from checkpoint_strategy.errors import UsageError, no_log_entries
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats import runlog
from checkpoint_strategy.formats.models import RunSafety, SpikeGuard
from checkpoint_strategy.formats.steps import scan

#: recovery statuses that mean a loss event has not recovered
UNRESOLVED = ("rollback", "wait", "no_clean_checkpoint")

#: the recovery adviser's signature: advise(log, checkpoints=[(step, path)], level=None) -> RecoveryReport
Adviser = Callable[..., Any]


def default_log(valid: Sequence[tuple[int, str]], root: Optional[str] = None) -> Optional[str]:
    """The run's training log when no --log is given (`formats.runlog.find_run_log`, the one discovery):
    the newest valid checkpoint's trainer_state.json, else the callbacks' loss log, Lightning's metrics.csv or
    TensorBoard event files of the run folder `root` (default: the one folder holding the checkpoints). None:
    no log."""
    if root is None:
        parents = {os.path.dirname(os.path.normpath(p)) for _s, p in valid}
        if (
            len(parents) != 1
        ):  # none, or checkpoints of several folders: no one run folder to look in
            return runlog.checkpoint_state(valid)
        root = parents.pop()
    return runlog.find_run_log(root, valid)


def _no_log_entries(log: str) -> bool:
    """True for a small trainer_state.json whose log_history is an empty list: the adviser (recovery.logs.read_log)
    finds no log entries in it. Anything else (bigger, unreadable, another shape) is left to the adviser."""
    try:
        got = storage.read_small(log, "log", 4096)
        if (
            not isinstance(got, bytes) or got.count(b'"log_history"') != 1
        ):  # one key: no parser's choice
            if not isinstance(got, bytes):
                got.close()
            return False
        doc = storage.loads_json(got, "log", allow_nan=True)
    except (OSError, storage.ReadError):
        return False
    return (
        isinstance(doc, dict)
        and doc.get("log_history") == []
        and isinstance(doc["log_history"], list)
    )


def read_spike(
    valid: Sequence[tuple[int, str]],
    log: Optional[str] = None,
    advise: Optional[Adviser] = None,
    root: Optional[str] = None,
) -> Optional[SpikeGuard]:
    """Read the training log (default: `default_log`, the run folder's log as every command finds it) with the
    recovery adviser. None when no log is found; an explicit `log` that cannot be read is a
    UsageError, a default one only a note ("no spike check").

    valid: (step, path) of the valid checkpoints (the resume points offered to the adviser).
    root: the run folder (default: the folder holding them).
    advise: `checkpoint_strategy.recovery.advise`, passed in by the caller (required once a log is found).
    """
    valid = sorted(valid)
    explicit = log is not None
    log = log if explicit else default_log(valid, root)
    if log is None:
        return None
    if advise is None:
        raise TypeError(
            "read_spike: a training log was found but no adviser was passed; pass "
            "advise=checkpoint_strategy.recovery.advise (or spike_check=False)"
        )
    if not explicit and _no_log_entries(
        log
    ):  # the adviser's verdict, without loading it (and numpy)
        return SpikeGuard(
            log=log, note=f"training log not usable ({no_log_entries(Path(log))}); no spike check"
        )
    try:
        report = advise(
            log, checkpoints=list(valid), level=None
        )  # the callers validated them (or need only the onset)
    except UsageError as exc:
        if explicit:
            raise
        return SpikeGuard(log=log, note=f"training log not usable ({exc}); no spike check")
    return guard_from_report(report, log, valid)


def guard_from_report(report, log: str, valid: Sequence[tuple[int, str]] = ()) -> SpikeGuard:
    """The SpikeGuard of a RecoveryReport (`recovery.advise`): status, onset, cut-off, rollback point."""
    spike = report.spike
    onset = spike.onset_step if spike is not None else None
    pre = _pre_spike(report, valid)
    if report.status not in UNRESOLVED:
        return SpikeGuard(
            log=log,
            status=report.status,
            onset_step=onset,
            pre_spike=pre,
            note=f"no unrecovered loss spike ({report.status})",
        )
    resume = report.resume_checkpoint
    protected = (
        os.path.basename(os.path.normpath(resume.path))
        if resume is not None and resume.path
        else None
    )
    if protected:
        note = (
            f"loss spike at step {onset} has not recovered ({report.status}): {protected} is the checkpoint "
            "to resume from and is kept; run 'checkpoint-strategy recover' before pruning further"
        )
    else:
        note = (
            f"loss spike at step {onset} has not recovered and no checkpoint before it is left "
            "(run `checkpoint-strategy recover`)"
        )
    return SpikeGuard(
        log=log,
        status=report.status,
        onset_step=onset,
        cutoff_step=report.checkpoints.cutoff_step,
        protected=protected,
        pre_spike=pre,
        note=note,
    )


def _pre_spike(report, valid: Sequence[tuple[int, str]]) -> dict[str, str]:
    """name -> why: the newest valid checkpoint before each loss event of the log (recovered ones
    too): the only copy of the weights from before it."""
    out: dict[str, str] = {}
    margin = (
        report.log.log_interval + 1
    )  # the adviser's default margin: checkpoint N's loss is logged at N+1
    for s in report.spikes:
        if s.kind == "grad_norm":
            continue
        before = [(step, path) for step, path in valid if step <= s.onset_step - margin]
        if before:
            name = os.path.basename(os.path.normpath(max(before)[1]))
            out.setdefault(
                name,
                f"last checkpoint before the loss spike at step {s.onset_step}"
                + (
                    f" (recovered by step {s.recovered_step})"
                    if s.recovered_step is not None
                    else ""
                ),
            )
    return out


def unresolved(guard: Optional[SpikeGuard]) -> bool:
    """An unrecovered loss event with recover's cut-off (a grad-norm-only "wait" has none)."""
    return guard is not None and guard.status in UNRESOLVED and guard.cutoff_step is not None


def after_onset(step: Optional[int], guard: Optional[SpikeGuard]) -> bool:
    """Saved after the onset of an unrecovered loss event (holds spiked weights): above recover's
    cut-off, as in its checkpoints.post_event."""
    if guard is None or not unresolved(guard) or step is None or guard.cutoff_step is None:
        return False
    return step > guard.cutoff_step


def safe_to_resume(
    status: Optional[str],
    resumable: Optional[bool],
    step: Optional[int],
    guard: Optional[SpikeGuard],
) -> bool:
    """Valid, resumable and not after the onset of an unrecovered loss event."""
    return status == "valid" and bool(resumable) and not after_onset(step, guard)


def do_not_resume(guard: Optional[SpikeGuard]) -> str:
    onset = guard.onset_step if guard is not None else None
    return f"after the spike at step {onset}: do not resume"


# --------------------------------------------------------------------------- validate on a run folder


def _run_folders(paths: Sequence[str], results) -> dict[str, list]:
    """run folder given on the command line -> the stepped results directly inside it."""
    runs: dict[str, list] = {}
    reals: dict[
        str, str
    ] = {}  # each result's realpath once (it walks every component: 2000 checkpoints)
    folders: dict[str, str] = {}  # each folder holding results, resolved once
    for p in paths:
        real = os.path.realpath(p)
        if not os.path.isdir(real):
            continue
        inside = []
        for r in results:
            if r.step is None:
                continue
            rr = reals.get(r.path)
            if rr is None:
                rr = reals[r.path] = _realpath(r.path, folders)
            if os.path.dirname(rr) == real and rr != real:
                inside.append(r)
        if inside:
            runs[p] = inside
    return runs


def _realpath(path: str, parents: dict[str, str]) -> str:
    """os.path.realpath(path), its folder's resolved once (`parents` caches it): a name that is no symlink
    resolves to itself inside its resolved folder, one lstat instead of one per component."""
    folder, name = os.path.split(path)
    if not folder or name in ("", ".", ".."):
        return os.path.realpath(path)
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return os.path.realpath(path)
    except (OSError, ValueError):
        return os.path.realpath(path)
    real = parents.get(folder)
    if real is None:
        real = parents[folder] = os.path.realpath(folder)
    return os.path.join(real, name)


def run_safety(
    root: str,
    results,
    log: Optional[str] = None,
    spike_check: bool = True,
    advise: Optional[Adviser] = None,
):
    """RunSafety for one run folder: read its log, mark post-onset results with a note."""
    valid = sorted((r.step, r.path) for r in results if r.status == "valid")
    guard = read_spike(valid, log, advise, root) if spike_check else None
    safe = sorted(
        (r for r in results if r.status == "valid" and not after_onset(r.step, guard)),
        key=lambda r: (r.step, r.path),
    )
    resumable = [r for r in safe if r.resumable]
    post = [
        r
        for r in sorted(results, key=lambda r: (r.step, r.path))
        if r.status == "valid" and after_onset(r.step, guard)
    ]
    for r in post:
        r.notes.append(do_not_resume(guard) + " (holds spiked weights)")
    pool = (
        resumable or safe
    )  # newest first; at one step, what a plain resume loads (fm.resume_order)
    newest = (
        min(pool, key=lambda r: (r.step is None, -(r.step or 0), fm.resume_order(r.path)))
        if pool
        else None
    )
    note = (
        "spike check off (--no-spike-check)"
        if not spike_check
        else "no training log found: not checked for loss spikes"
        if guard is None
        else guard.note
    )
    return RunSafety(
        root=root,
        log=guard.log if guard else None,
        spike_status=guard.status if guard else None,
        onset_step=guard.onset_step if guard is not None and unresolved(guard) else None,
        newest_safe=newest.path if newest else None,
        newest_safe_step=newest.step if newest else None,
        newest_safe_resumable=bool(newest and newest.resumable),
        safe=len(safe),
        post_onset=[r.path for r in post],
        note=note,
    )


def annotate_validation(
    report,
    paths: Sequence[str],
    log: Optional[str] = None,
    spike_check: bool = True,
    advise: Optional[Adviser] = None,
):
    """Fill `report.safety` for every run folder among `paths` (a checkpoint given alone gets none)."""
    for root, results in _run_folders(paths, report.checkpoints).items():
        report.safety.append(run_safety(root, results, log, spike_check, advise))
    return report


# --------------------------------------------------------------------------- one checkpoint (release-gate)


def checkpoint_spike(
    path: str,
    step: Optional[int],
    log: Optional[str] = None,
    spike_check: bool = True,
    advise: Optional[Adviser] = None,
) -> Optional[tuple[bool, str]]:
    """(ok, detail) for one checkpoint against its run's training log: not ok when it was saved
    after the onset of an unrecovered loss event. None when there is no log to read (or
    spike_check is off). The run is the checkpoint's folder's parent; its siblings are offered to
    the adviser as resume points (only their names are read)."""
    if not spike_check or step is None:
        return None

    parent = os.path.dirname(os.path.abspath(path))
    try:
        siblings = scan(parent)
    except UsageError:
        siblings = []
    guard = read_spike(siblings, log, advise, parent)
    if guard is None or guard.status is None:
        return None
    if after_onset(step, guard):
        return False, (
            f"{do_not_resume(guard)} or release: saved after the onset (recover's cut-off step "
            f"{guard.cutoff_step}); resume point: {guard.protected or 'none left'}"
        )
    if unresolved(guard):
        return True, (
            f"saved before the loss spike at step {guard.onset_step} (at or before recover's cut-off step "
            f"{guard.cutoff_step}; {guard.log})"
        )
    return True, f"no unrecovered loss spike in {guard.log} ({guard.status})"


def post_onset_note(report) -> Optional[str]:
    """One line naming the newest safe checkpoint and the post-onset ones of a RecoveryReport
    (on-event, recover): None when no loss event is unrecovered."""
    guard = guard_from_report(report, report.log.path)
    post = report.checkpoints.post_event
    if not unresolved(guard) or not post:
        return None
    names = [
        os.path.basename(os.path.normpath(c.path)) if c.path else f"step {c.step}" for c in post
    ]
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    resume = report.resume_checkpoint
    where = (
        (resume.path or f"step {resume.step}") if resume is not None else "no checkpoint before it"
    )
    return f"{do_not_resume(guard)}: {shown}; the newest safe checkpoint is {where}"
