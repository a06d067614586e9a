"""Validated retention for a local checkpoint folder: survey -> plan_prune -> apply_prune.

- ``survey(root, level)`` (prune_survey.py, shared with prune_objects.py) lists ROOT once, matches
  every name against the known layouts (`retention.classify_name`), validates the recognised
  checkpoints and reads what the trainer says is best; it returns `retention.Candidate`s.
- ``retention.plan_prune`` decides (pure keep rules; shared with the callbacks and any other
  storage).
- ``apply_prune(root, plan, ...)`` deletes what the plan marks, crash-safely:

  1. the batch ``[{"name", "renamed": ".deleting-<random>"}, ...]`` is written to the journal
     ``ROOT/.checkpoint-strategy-prune.json`` (one atomic write);
  2. each checkpoint (and its ``.integrity.json`` sidecar) is renamed to its hidden name - one
     atomic rename in the same folder, outside the recognised namespace - and removed;
  3. the journal is rewritten with only what is left half deleted (removed when empty).

  A crash leaves either the intact checkpoint or a journalled ``.deleting-*`` leftover that the
  next ``prune --apply`` finishes. A ``.deleting-*`` name not in the journal was not made by
  prune and is never touched. A deletion that fails half-way stays in the journal: the report
  says "half deleted, rerun prune --apply to finish" and the command exits 1.

The whole run holds an exclusive lock on ROOT (``storage.locking``, an flock on the folder
itself): a second prune waits ``lock_timeout`` seconds, then exits 2 with one line.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable

from checkpoint_strategy import storage
from checkpoint_strategy.atomic import atomic_write_text, fsync_dir
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.retention import rules as rt
from checkpoint_strategy.formats.models import (
    CheckpointPolicy,
    Level,
    Problem,
    PruneReport,
)
from checkpoint_strategy.retention.survey import (  # noqa: F401 - survey names re-exported (old paths)
    FINAL_EXPORT_NAME,
    UNRESOLVED,
    Outcome,
    Survey,
    _size,
    plan_survey,
    recheck,
    recheck_level,
    report_of,
    revalidator,
    smaller_keep_last,
    spike_guard,
    spike_retention,
    survey,
)
from checkpoint_strategy.retention.safety import Adviser
from checkpoint_strategy.errors import UsageError

JOURNAL = ".checkpoint-strategy-prune.json"
LOCK_TIMEOUT_SECONDS = 5.0
_RENAMED = re.compile(r"^\.deleting-[0-9a-f]{16}$")


def load_policy(path: str | os.PathLike) -> CheckpointPolicy:
    """The checkpoint policy in a plan (YAML or JSON), the handoff state file or a bare mapping
    (`checkpoint_strategy.retention.policyfile.load_policy_file`)."""
    from checkpoint_strategy.retention.policyfile import load_policy_file

    return load_policy_file(path, "--policy").policy


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
        raise UsageError(f"{root}: refusing to prune / or a home folder; pass the run's checkpoint folder")
    found = fm.identify(real)
    if found is not None and not fm.is_run_folder(found):
        raise UsageError(f"{root}: is itself a checkpoint; pass the folder that holds the checkpoints")
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
        isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("renamed"), str)
        and _RENAMED.match(e["renamed"]) and e.get("sidecar") in (None, e["renamed"] + fm.MANIFEST_SUFFIX)
        for e in pending)
    if not ok:
        raise UsageError(f"{what} {path}: not a list of .deleting-<16 hex> entries; nothing was deleted "
                         "(it records prune's half-deleted checkpoints: inspect it, then move it away)")
    return list(pending)


def _write_journal(root: str, pending: list[dict]) -> None:
    path = _journal_path(root)
    if pending or not os.path.lexists(path):
        import json

        atomic_write_text(path, json.dumps({"version": 1, "pending": pending}, indent=1, ensure_ascii=False) + "\n")
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
            out.errors.append(Problem(file=e["renamed"], reason=f"half deleted ({e['name']}): "
                                      f"{storage.describe_os_error(exc)}; rerun prune --apply to finish"))
            left.append(e)
            continue
        out.finished.append(e["renamed"])
    return left


def _entry_for(root: str, name: str) -> dict:
    import secrets   # only when deleting (a dry run does not load it)

    renamed = fm.DELETING_PREFIX + secrets.token_hex(8)
    sidecar = os.path.lexists(os.path.join(root, name + fm.MANIFEST_SUFFIX))
    return {"name": name, "renamed": renamed, "sidecar": renamed + fm.MANIFEST_SUFFIX if sidecar else None}


def _delete_one(root: str, entry: dict, out: Outcome) -> bool:
    """Rename then remove one journalled checkpoint. True when something is left half deleted."""
    name, renamed = entry["name"], entry["renamed"]
    src = os.path.join(root, name)
    size = _size(src)
    try:
        os.rename(src, os.path.join(root, renamed))
    except OSError as exc:
        out.failed[name] = f"could not delete: {storage.describe_os_error(exc)}; the checkpoint is intact"
        return False
    try:
        if entry["sidecar"]:
            os.rename(src + fm.MANIFEST_SUFFIX, os.path.join(root, entry["sidecar"]))
        fsync_dir(root)
        for n in (renamed, entry["sidecar"]):
            if n:
                _remove(os.path.join(root, n))
    except OSError as exc:
        out.failed[name] = (f"half deleted (left as {renamed}): {storage.describe_os_error(exc)}; "
                            "rerun prune --apply to finish")
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
        raise UsageError(storage.oserror_line(exc, "write the prune journal in", root)
                         + "; prune --apply needs write access to ROOT (nothing deleted)") from None
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
        out.errors.append(Problem(file=JOURNAL, reason=storage.oserror_line(exc, "write", JOURNAL)
                                  + "; nothing (more) deleted"))
        entries = []
    half = [e for e in entries if _delete_one(root, e, out)]
    pending = pending + half
    try:
        _write_journal(root, pending)
    except OSError as exc:
        out.errors.append(Problem(file=JOURNAL, reason=f"could not update the journal: "
                                  f"{storage.describe_os_error(exc)}; the next prune --apply tidies it"))
    for name, why in out.failed.items():
        out.errors.append(Problem(file=name, reason=why))
    out.half_deleted = [e["renamed"] for e in pending]
    return out


# --------------------------------------------------------------------------- the command


def _settings(keep_last, milestones, policy) -> tuple[int, list[int]]:
    if policy is not None and not isinstance(policy, CheckpointPolicy):
        policy = load_policy(policy)
    if keep_last is None and policy is not None:
        keep_last = policy.keep_last
    if keep_last is None:
        raise UsageError("no retention given: pass --keep-last N or --policy FILE (the plan, YAML or JSON, or the "
                         "handoff state file) with a keep_last")
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise UsageError(f"--keep-last must be an integer of at least 1, got {keep_last}")
    ms = sorted(set(milestones if milestones is not None else (policy.keep_milestone if policy else [])))
    return keep_last, ms


def proposed_retention(root: str, milestones: list[int] | None, apply: bool) -> tuple[int, list[int], str]:
    """keep_last and milestones from the run itself when none were given: a rolling window that spans
    recover's wait window at the run's save interval (save_steps in the newest trainer_state.json,
    else the spacing of the checkpoint names), and the plan's pow2 milestones up to max_steps.
    --apply never deletes on proposed numbers (UsageError)."""
    import math

    from checkpoint_strategy.formats.runfacts import trainer_state_facts
    from checkpoint_strategy.planning.planner import SPIKE_WAIT_STEPS, milestone_schedule
    from checkpoint_strategy.formats.steps import scan

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
        raise UsageError("no retention given and none can be read from the run: pass --keep-last N (and "
                         "--milestones) or --policy FILE")
    keep = max(2, math.ceil(SPIKE_WAIT_STEPS / every) + 1)
    last = facts.int("max_steps") or (found[-1][0] if found else 0)
    ms = milestones if milestones is not None else milestone_schedule("pow2", last)
    note = (f"keep_last {keep}: save_steps {every} (from {where}); the window spans recover's "
            f"{SPIKE_WAIT_STEPS}-step wait window, so a checkpoint before a spike survives until it is judged; "
            f"milestones {', '.join(map(str, ms)) or 'none'}"
            + ("" if milestones is not None else f" (the plan's pow2 schedule up to max_steps {last}"
               + (f", from {facts.source['max_steps']})" if "max_steps" in facts.source else ")")))
    if apply:
        raise UsageError(f"--apply needs --keep-last N or --policy FILE: nothing deleted on proposed numbers "
                         f"(the dry run proposes keep_last {keep}, milestones {', '.join(map(str, ms)) or 'none'})")
    return keep, list(ms), note


def _leftovers(root: str, pending: list[dict]) -> tuple[list[str], list[str]]:
    ours = {n for e in pending for n in (e["renamed"], e.get("sidecar")) if n}
    names = sorted(n for n in os.listdir(root) if n.startswith(fm.DELETING_PREFIX))
    return [n for n in names if n in ours], [n for n in names if n not in ours]


def prune(root: str | os.PathLike, keep_last: int | None = None, milestones: list[int] | None = None,
          policy: CheckpointPolicy | str | os.PathLike | None = None, apply: bool = False,
          level: Level = "quick", log: str | None = None, spike_check: bool = True,
          lock_timeout: float = LOCK_TIMEOUT_SECONDS, protect: dict[str, str] | None = None,
          advise: Adviser | None = None, on_start: Callable[[], None] | None = None,
          on_end: Callable[[], None] | None = None, delete_invalid: bool = False) -> PruneReport:
    """Plan validated retention under root; with apply=True, delete what the plan marks.

    keep_last/milestones override the policy's keep_last/keep_milestone. keep_last counts
    resumable valid checkpoints when the run has any. Symlinked and unrecognised entries are never deleted;
    invalid and incomplete ones only with `delete_invalid` and only when older than a newer valid one. With spike_check (default) the training log (`log`,
    or the run folder's as `formats.runlog` finds it) is read first, and the rollback
    checkpoint of an unrecovered loss spike is kept. Holds an exclusive lock on ROOT; another
    prune of the same ROOT waits `lock_timeout` seconds, then UsageError. Emergency saves (a
    checkpoint-strategy.json marker, formats/marker.py) never count towards keep_last and are
    kept while the spike has not recovered or its status is unknown. `protect`: more names to keep
    as the trainer's best, name -> reason (the Lightning callback passes best_model_path). `advise`: the
    recovery adviser that reads the log (`checkpoint_strategy.recovery.advise`; needed when a log is found
    and spike_check is on), passed in because checkpoints/ does not import recovery/. `on_start`: called
    once the lock is held, as the survey of a local ROOT begins, `on_end` the last thing before the lock is
    released (the callbacks report the prune's start and end: a save that waits for the lock starts after both).
    `delete_invalid`: an invalid or incomplete checkpoint older than a newer valid one is not a save in flight:
    delete it like a superseded one (default: kept, and the report names it with its bytes).
    """
    from checkpoint_strategy.storage.locking import locked

    if storage.is_url(os.fspath(root)):  # object storage: same survey and keep rules, journalled deletes
        from checkpoint_strategy.retention import objects as prune_objects

        keep_last, ms = _settings(keep_last, milestones, policy)
        return prune_objects.prune_url(os.fspath(root), keep_last, ms, apply, level, log, spike_check, protect,
                                       advise, delete_invalid)
    root = check_root(os.fspath(root))
    proposed = None
    if keep_last is None and policy is None:
        keep_last, milestones, proposed = proposed_retention(root, milestones, apply)
    keep_last, ms = _settings(keep_last, milestones, policy)
    busy = (f"{root} is being pruned by another checkpoint-strategy process (still locked after "
            f"{lock_timeout:g} s); wait for it to finish, then rerun")
    with locked(root, lock_timeout, busy):
        if on_start is not None:
            on_start()
        s = survey(root, level)
        pending = read_journal(root)
        plan, guard = plan_survey(s, keep_last, ms, log, spike_check, protect, advise, delete_invalid)
        ours, foreign = _leftovers(root, pending)
        out = apply_prune(root, plan, revalidator(s.found, level), pending) if apply else None
        if on_end is not None:
            on_end()
    return report_of(root, s, plan, guard, out, apply=apply, level=level, keep_last=keep_last, milestones=ms,
                     leftovers=(ours, foreign), proposed=proposed, delete_invalid=delete_invalid)

