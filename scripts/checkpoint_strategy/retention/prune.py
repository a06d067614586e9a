"""Validated retention: one `PruneRequest` flowing survey -> plan -> apply over a store.

- ``PruneRequest`` (prunerequest.py) holds every option, each checked once there.
- A store (`prune_survey.PruneStore`) is where the checkpoints are: `LocalStore` here (a folder, under its
  lock) or `prune_objects.ObjectStore` (object storage, through a local view). Both are surveyed the same way.
- ``survey(root, level)`` (prune_survey.py) lists ROOT once, matches every name against the known layouts
  (`retention.classify_name`), validates the recognised checkpoints and reads what the trainer says is best;
  ``plan_survey`` reads the training log for a loss spike and applies the keep rules (`retention.plan_prune`:
  pure, shared with the callbacks); the store's ``delete`` re-checks the checkpoints that justify the deletions,
  then deletes. A local folder deletes crash-safely:

  1. the batch ``[{"name", "renamed": ".deleting-<random>"}, ...]`` is written to the journal
     ``ROOT/.checkpoint-strategy-prune.json`` (one atomic write);
  2. each checkpoint (and its ``.integrity.json`` sidecar) is renamed to its hidden name - one
     atomic rename in the same folder, outside the recognised namespace - and removed;
  3. the journal is rewritten with only what is left half deleted (removed when empty).

  A crash leaves either the intact checkpoint or a journalled ``.deleting-*`` leftover that the
  next ``prune --apply`` finishes. A ``.deleting-*`` name not in the journal was not made by
  prune and is never touched. A deletion that fails half-way stays in the journal: the report
  says "half deleted, rerun prune --apply to finish" and the command exits 1.

The whole run holds an exclusive lock on a local ROOT (``storage.locking``, an flock on the folder
itself): a second prune waits ``lock_timeout`` seconds, then exits 2 with one line.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from checkpoint_strategy import storage
from checkpoint_strategy.atomic import atomic_write_text, fsync_dir
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats.models import Problem, PruneReport, PruneSuggestion, SpikeGuard
from checkpoint_strategy.formats.runlog import trainer_state_facts
from checkpoint_strategy.formats.steps import scan
from checkpoint_strategy.planning.planner import SPIKE_WAIT_STEPS, milestone_schedule
from checkpoint_strategy.retention import rules as rt
from checkpoint_strategy.retention import safety
from checkpoint_strategy.retention.objects import object_store
from checkpoint_strategy.retention.request import PruneRequest
from checkpoint_strategy.retention.survey import (
    Outcome,
    PruneStore,
    Survey,
    _bytes,
    _size,
    recheck,
    report_of,
    revalidator,
    survey,
)
from checkpoint_strategy.storage.locking import locked

JOURNAL = ".checkpoint-strategy-prune.json"
_RENAMED = re.compile(r"^\.deleting-[0-9a-f]{16}$")


def _home_folders() -> set[str]:
    homes = {"/", "/root", "/home", os.path.expanduser("~")}
    try:
        import pwd

        homes |= {e.pw_dir for e in pwd.getpwall() if e.pw_dir and e.pw_dir != "/nonexistent"}
    except Exception:  # noqa: BLE001
        pass
    return {os.path.realpath(h) for h in homes if h}


def check_root(root: str) -> str:
    """The real path of a folder that may be pruned, or UsageError (exit 2)."""
    if root == "":
        raise UsageError("ROOT: empty path; expected the folder that holds the checkpoints")
    if not os.path.lexists(root):
        raise UsageError(f"{root}: no such folder; expected the folder that holds the checkpoints")
    real = os.path.realpath(root)
    if not os.path.isdir(real):
        raise UsageError(f"{root}: is a file; expected the folder that holds the checkpoints")
    if real in _home_folders():
        raise UsageError(
            f"{root}: refusing to prune / or a home folder; pass the run's checkpoint folder"
        )
    found = fm.identify(real)
    if found is not None and not fm.is_run_folder(found):
        raise UsageError(
            f"{root}: is itself a checkpoint; pass the folder that holds the checkpoints"
        )
    return real


# --------------------------------------------------------------------------- journal


def _journal_path(root: str) -> str:
    return os.path.join(root, JOURNAL)


def read_journal(root: str) -> list[dict]:
    """Pending deletions recorded by an earlier prune: [{"name", "renamed", "sidecar"}]."""
    path = _journal_path(root)
    if not os.path.lexists(path):
        return []
    what = "prune journal"
    data = storage.read_json(path, what, limit=16 << 20, expect=dict)
    pending = data.get("pending")
    ok = isinstance(pending, list) and all(
        isinstance(e, dict)
        and isinstance(e.get("name"), str)
        and isinstance(e.get("renamed"), str)
        and _RENAMED.match(e["renamed"])
        and e.get("sidecar") in (None, e["renamed"] + fm.MANIFEST_SUFFIX)
        for e in pending
    )
    if not ok:
        raise UsageError(
            f"{what} {path}: not a list of .deleting-<16 hex> entries; nothing was deleted "
            "(it records prune's half-deleted checkpoints: inspect it, then move it away)"
        )
    return list(pending)


def _write_journal(root: str, pending: list[dict]) -> None:
    path = _journal_path(root)
    if pending or not os.path.lexists(path):
        atomic_write_text(
            path,
            json.dumps({"version": 1, "pending": pending}, indent=1, ensure_ascii=False) + "\n",
        )
    if not pending:
        os.unlink(path)
        fsync_dir(root)


def _clean_journal_temps(root: str) -> None:
    """Temp files of a journal write killed mid-way (we hold the lock: nobody else writes one)."""
    prefix = "." + JOURNAL + "."
    for name in os.listdir(root):
        if name.startswith(prefix) and name.endswith(".tmp"):
            path = os.path.join(root, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)


def _remove(path: str) -> None:
    """Remove a renamed-away checkpoint (file or folder) without following symlinks."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


# --------------------------------------------------------------------------- apply


def _finish(root: str, pending: list[dict], out: Outcome) -> list[dict]:
    """Remove the journalled leftovers of an earlier prune; returns the entries still pending."""
    left = []
    for e in pending:
        try:
            for name in (e["renamed"], e.get("sidecar")):
                if name and os.path.lexists(os.path.join(root, name)):
                    _remove(os.path.join(root, name))
        except OSError as exc:
            out.errors.append(
                Problem(
                    file=e["renamed"],
                    reason=f"half deleted ({e['name']}): "
                    f"{storage.describe_os_error(exc)}; rerun prune --apply to finish",
                )
            )
            left.append(e)
            continue
        out.finished.append(e["renamed"])
    return left


def _entry_for(root: str, name: str) -> dict:
    renamed = fm.DELETING_PREFIX + secrets.token_hex(8)
    sidecar = os.path.lexists(os.path.join(root, name + fm.MANIFEST_SUFFIX))
    return {
        "name": name,
        "renamed": renamed,
        "sidecar": renamed + fm.MANIFEST_SUFFIX if sidecar else None,
    }


def _delete_one(root: str, entry: dict, out: Outcome) -> bool:
    """Rename then remove one journalled checkpoint. True when something is left half deleted."""
    name, renamed = entry["name"], entry["renamed"]
    src = os.path.join(root, name)
    size = _size(src)
    try:
        os.rename(src, os.path.join(root, renamed))
    except OSError as exc:
        out.failed[name] = (
            f"could not delete: {storage.describe_os_error(exc)}; the checkpoint is intact"
        )
        return False
    try:
        if entry["sidecar"]:
            os.rename(src + fm.MANIFEST_SUFFIX, os.path.join(root, entry["sidecar"]))
        fsync_dir(root)
        for n in (renamed, entry["sidecar"]):
            if n:
                _remove(os.path.join(root, n))
    except OSError as exc:
        out.failed[name] = (
            f"half deleted (left as {renamed}): {storage.describe_os_error(exc)}; "
            "rerun prune --apply to finish"
        )
        return True
    out.deleted[name] = size
    return False


def apply_prune(root: str, plan: rt.Plan, revalidate, pending: list[dict]) -> Outcome:
    """Delete what `plan` marks, after finishing the journalled leftovers of an earlier prune.

    revalidate(name) -> None or why: every checkpoint that justifies the deletions is checked again
    right before the first deletion (`revalidator`: at least level full); if one fails nothing is
    deleted. Errors land in the
    Outcome (the caller exits 1); a journal that cannot be written is a UsageError (exit 2).
    """
    out = Outcome()
    to_delete = [d.candidate.name for d in plan.delete]
    try:
        _clean_journal_temps(root)
        if not to_delete and not pending:
            return out
        _write_journal(root, pending)  # also proves ROOT is writable before anything is touched
    except OSError as exc:
        raise UsageError(
            storage.oserror_line(exc, "write the prune journal in", root)
            + "; prune --apply needs write access to ROOT (nothing deleted)"
        ) from None
    pending = _finish(root, pending, out)
    for j, why in recheck(plan, revalidate):
        out.errors.append(Problem(file=j, reason=why))
        to_delete = []
    # One journal write for the whole batch: an entry whose .deleting-* name never appears (killed
    # before its rename) is simply dropped by the next run; the checkpoint is still there.
    entries = [_entry_for(root, name) for name in to_delete]
    try:
        _write_journal(root, pending + entries)
    except OSError as exc:
        out.errors.append(
            Problem(
                file=JOURNAL,
                reason=storage.oserror_line(exc, "write", JOURNAL) + "; nothing (more) deleted",
            )
        )
        entries = []
    half = [e for e in entries if _delete_one(root, e, out)]
    pending = pending + half
    try:
        _write_journal(root, pending)
    except OSError as exc:
        out.errors.append(
            Problem(
                file=JOURNAL,
                reason=f"could not update the journal: "
                f"{storage.describe_os_error(exc)}; the next prune --apply tidies it",
            )
        )
    for name, why in out.failed.items():
        out.errors.append(Problem(file=name, reason=why))
    out.half_deleted = [e["renamed"] for e in pending]
    return out


# --------------------------------------------------------------------------- the local store


class LocalStore:
    """A local folder (`PruneStore`): listed by the survey, journalled rename-then-remove deletes."""

    def __init__(self, root: str, log: str | None) -> None:
        self.root, self.log = root, log
        self.notes: list[str] = []
        self.pending: list[dict] = []
        self.found_leftovers: tuple[list[str], list[str]] = ([], [])

    def read_pending(self) -> None:
        """The journal of an earlier prune, and the .deleting-* entries ROOT holds (ours, foreign)."""
        self.pending = read_journal(self.root)
        ours = {n for e in self.pending for n in (e["renamed"], e.get("sidecar")) if n}
        names = sorted(n for n in os.listdir(self.root) if n.startswith(fm.DELETING_PREFIX))
        self.found_leftovers = [n for n in names if n in ours], [n for n in names if n not in ours]

    def delete(self, s: Survey, plan: rt.Plan, level: str) -> Outcome:
        return apply_prune(self.root, plan, revalidator(s.found, level), self.pending)

    def leftovers(self, out: Outcome | None) -> tuple[list[str], list[str]]:
        return self.found_leftovers


@contextlib.contextmanager
def local_store(req: PruneRequest) -> Iterator[LocalStore]:
    """ROOT checked (`check_root`) and locked for the whole prune."""
    root = check_root(req.root)
    busy = (
        f"{root} is being pruned by another checkpoint-strategy process (still locked after "
        f"{req.lock_timeout:g} s); wait for it to finish, then rerun"
    )
    with locked(root, req.lock_timeout, busy):
        yield LocalStore(root, req.log)


# --------------------------------------------------------------------------- the plan


def plan_survey(s: Survey, req: PruneRequest, log: str | None) -> tuple[rt.Plan, SpikeGuard | None]:
    """The keep rules of `req` on a survey (any store): the spike guard first (the training log `log`, as the
    store reads it), then `retention.plan_prune`."""
    assert (
        req.keep_last is not None and req.milestones is not None
    )  # given, from the policy, or proposed
    valid = [
        (c.step, c.path)
        for c in s.candidates
        if c.status == "valid" and c.step is not None and c.layout and not c.symlink
    ]
    guard = spike_guard(valid, log, req.advise, s.root) if req.spike_check else None
    keep_emergency = req.spike_check and (
        guard is None or guard.status is None or guard.status in safety.UNRESOLVED
    )
    why = (
        "kept, the spike's status is unknown (no training log read)"
        if guard is None or guard.status is None
        else f"kept until the loss spike at step {guard.onset_step} recovers"
    )
    held = {n: f"{d}: {why}" for n, d in s.emergency.items()} if keep_emergency else {}
    retention = rt.Retention(
        keep_last=req.keep_last,
        milestones=frozenset(req.milestones),
        best={**s.best, **(req.protect or {}), **held},
        **spike_retention(guard, s.candidates),
        delete_invalid=req.delete_invalid,
    )
    if s.latest:
        retention = replace(retention, latest=s.latest, latest_why=s.latest_why)
    plan = rt.plan_prune(s.candidates, retention)
    s.suggestion = None if plan.delete else smaller_keep_last(s, retention)
    return plan, guard


def smaller_keep_last(s: Survey, retention: rt.Retention) -> PruneSuggestion | None:
    """When `retention` frees nothing: the smallest keep_last whose plan still keeps every rollback point
    (the spike guard's rollback checkpoint and the checkpoint before each spike of the log), the trainer's best
    now (HF's newest trainer_state.json, Lightning's monitored top-k; kept at every keep_last) and the newest,
    with the bytes it would free. None when no smaller keep_last deletes anything."""
    must = {n for n in (retention.rollback, *retention.pre_spike) if n}
    best = {n for n in retention.best if n in {c.name for c in s.candidates}}
    for k in range(
        1, min(retention.keep_last, len(s.candidates) + 1)
    ):  # past the count every plan is the same
        plan = rt.plan_prune(s.candidates, replace(retention, keep_last=k))
        kept = {d.candidate.name for d in plan.keep}
        if (
            not plan.delete
            or not must | best <= kept
            or (plan.newest is not None and plan.newest.name not in kept)
        ):
            continue
        names = [d.candidate.name for d in plan.delete]
        return PruneSuggestion(
            keep_last=k,
            delete=names,
            bytes=sum(_bytes(s, d.candidate) for d in plan.delete),
            rollback_points=sorted(must),
            best=sorted(best),
        )
    return None


# --------------------------------------------------------------------------- loss spike


def spike_guard(
    valid: list[tuple[int, str]],
    log: str | None = None,
    advise: safety.Adviser | None = None,
    root: str | None = None,
) -> SpikeGuard | None:
    """The training log read with the recovery adviser (`retention.safety.read_spike`). When a
    loss spike has not recovered, the checkpoint `recover` would resume from must survive: spikes
    come after "best", and a rolling window rotates past them.

    valid: (step, path) of the valid checkpoints; root: the run folder (its log: `formats.runlog`). advise: `checkpoint_strategy.recovery.advise` (passed in).

    A log that was there when the survey looked and is gone (or unreadable) when it is read is a
    UsageError: prune refuses rather than deleting without the spike check (issue 29).
    """
    guard = safety.read_spike(valid, log, advise, root)
    if guard is not None and guard.status is None and not _readable(guard.log):
        raise UsageError(
            f"training log {storage.display(guard.log)} disappeared (or became unreadable) while prune "
            "read it: nothing deleted; rerun, or pass --log FILE (or --no-spike-check)"
        )
    return guard


def _readable(path: str) -> bool:
    """A log file, or a TensorBoard log's folder, that is still there and readable."""
    return (storage.is_regular(path) or os.path.isdir(path)) and os.access(path, os.R_OK)


def spike_retention(guard: SpikeGuard | None, candidates: list[rt.Candidate]) -> dict:
    """Retention keywords from the spike guard: the rollback point, the checkpoint before each
    spike (recovered ones too), and the post-onset checkpoints that keep_last never counts."""
    if guard is None:
        return {}
    why = safety.do_not_resume(guard) + " (holds spiked weights); not counted by keep_last"
    post = {
        c.name: why
        for c in candidates
        if c.status == "valid" and c.layout and not c.symlink and safety.after_onset(c.step, guard)
    }
    pre = {n: w for n, w in guard.pre_spike.items() if n != guard.protected and n not in post}
    return dict(
        rollback=guard.protected,
        post_onset=post,
        pre_spike=pre,
        rollback_why=f"rollback point before the unrecovered loss spike at step {guard.onset_step}",
    )


# --------------------------------------------------------------------------- the command


def proposed_retention(req: PruneRequest, root: str) -> tuple[PruneRequest, str]:
    """keep_last and milestones from the run itself when none were given: a rolling window that spans
    recover's wait window at the run's save interval (save_steps in the newest trainer_state.json,
    else the spacing of the checkpoint names), and the plan's pow2 milestones up to max_steps.
    --apply never deletes on proposed numbers (UsageError)."""
    found = scan(root)
    facts = trainer_state_facts(None)
    for _step, path in reversed(found):
        facts = trainer_state_facts(path)
        if facts.values:
            break
    every, where = facts.int("save_steps"), facts.source.get("save_steps")
    if every is None and len(found) >= 2:
        gaps = sorted(b - a for (a, _), (b, _) in zip(found, found[1:], strict=False))
        every, where = max(1, gaps[len(gaps) // 2]), "the spacing of the checkpoint names"
    if every is None:
        raise UsageError(
            "no retention given and none can be read from the run: pass --keep-last N (and "
            "--milestones) or --policy FILE"
        )
    keep = max(2, math.ceil(SPIKE_WAIT_STEPS / every) + 1)
    last = facts.int("max_steps") or (found[-1][0] if found else 0)
    given = req.milestones
    ms = given if given is not None else milestone_schedule("pow2", last)
    shown = ", ".join(map(str, ms)) or "none"
    note = (
        f"keep_last {keep}: save_steps {every} (from {where}); the window spans recover's "
        f"{SPIKE_WAIT_STEPS}-step wait window, so a checkpoint before a spike survives until it is judged; "
        f"milestones {shown}"
        + (
            ""
            if given is not None
            else f" (the plan's pow2 schedule up to max_steps {last}"
            + (f", from {facts.source['max_steps']})" if "max_steps" in facts.source else ")")
        )
    )
    if req.apply:
        raise UsageError(
            f"--apply needs --keep-last N or --policy FILE: nothing deleted on proposed numbers "
            f"(the dry run proposes keep_last {keep}, milestones {shown})"
        )
    return req.model_copy(update={"keep_last": keep, "milestones": sorted(set(ms))}), note


def prune(root: PruneRequest | str | os.PathLike[str], **options: Any) -> PruneReport:
    """Plan validated retention under root; with apply=True, delete what the plan marks.

    `prune(PruneRequest(...))`, or `prune(root, keep_last=3, ...)` with the options of `PruneRequest` (its
    docstring says what each does; it checks them). Symlinked and unrecognised entries are never deleted;
    nothing is deleted before a newer checkpoint re-validated; the newest is never deleted; nothing outside
    ROOT is touched. On object storage (a URL ROOT) deletions are journalled objects
    (`prune_objects.ObjectStore`); a local ROOT is locked for the whole run.
    """
    if isinstance(root, PruneRequest) and options:
        raise TypeError(
            f"prune(request): the options belong in the PruneRequest, got {', '.join(options)} too"
        )
    req = root if isinstance(root, PruneRequest) else PruneRequest.of(root, **options)
    if req.is_url:
        opened: contextlib.AbstractContextManager[PruneStore] = object_store(req)
    else:
        opened = local_store(req)
    with opened as store:
        proposed = None
        if req.keep_last is None:  # a local dry run (the request refuses it on object storage)
            req, proposed = proposed_retention(req, store.root)
        if req.on_start is not None:
            req.on_start()
        s = survey(store.root, req.level)
        store.read_pending()
        plan, guard = plan_survey(s, req, store.log)
        out = store.delete(s, plan, req.level) if req.apply else None
        if req.on_end is not None:
            req.on_end()
        return report_of(store, s, plan, guard, out, req, proposed)
