"""Validated retention: keep the newest valid checkpoint, milestones, the best one and anything
unrecognised; delete older valid checkpoints past keep_last, only once a newer one validated.

Deletion is crash-safe: the checkpoint is first renamed to a `.deleting-<name>` sibling (one
atomic rename in the same folder, outside the recognised namespace: `validate` and `prune`
ignore it) and only then removed. A crash leaves either the intact checkpoint or a
`.deleting-*` leftover that the next `prune --apply` finishes.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

from checkpoint_strategy.checkpoints import formats as fm
from checkpoint_strategy.checkpoints.models import CheckpointPolicy, Problem, PruneEntry, PruneReport, SpikeGuard
from checkpoint_strategy.checkpoints.validate import check, usable
from checkpoint_strategy.errors import UsageError, pydantic_message


def load_policy(path: str | os.PathLike) -> CheckpointPolicy:
    """Read the plan's `checkpoint_policy:` YAML (yaml.safe_load) and validate it."""
    import yaml
    from pydantic import ValidationError

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--policy {p}: cannot read ({getattr(exc, 'strerror', None) or type(exc).__name__}); "
                         "expected a YAML file with a checkpoint_policy: mapping") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise UsageError(f"--policy {p}: not valid YAML{line}; expected a checkpoint_policy: mapping") from None
    if isinstance(data, dict) and "checkpoint_policy" in data:
        data = data["checkpoint_policy"]
    if not isinstance(data, dict):
        raise UsageError(f"--policy {p}: expected a mapping under checkpoint_policy: "
                         "(frequency, keep_last, keep_milestone, ...)")
    data = dict(data)
    ms = data.get("keep_milestone")
    if isinstance(ms, list) and ms and ms[-1] in ("...", Ellipsis, None):
        data["keep_milestone"] = [m for m in ms if isinstance(m, int)]
        data["_continue"] = True
    cont = data.pop("_continue", False)
    try:
        policy = CheckpointPolicy.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"--policy {p}: " + pydantic_message(exc, "checkpoint_policy")) from None
    if cont and policy.keep_milestone:
        # "[1000, 5000, 10000, 25000, ...]": the spec's "powers of 2 * 1000" continues by doubling
        last = policy.keep_milestone[-1]
        extra = [last * 2 ** k for k in range(1, 21)]
        policy = policy.model_copy(update={"keep_milestone": policy.keep_milestone + extra})
    return policy


def _home_folders() -> set[str]:
    homes = {"/", "/root", "/home", os.path.expanduser("~")}
    try:
        import pwd

        homes |= {e.pw_dir for e in pwd.getpwall() if e.pw_dir and e.pw_dir != "/nonexistent"}
    except Exception:  # noqa: BLE001
        pass
    return {os.path.realpath(h) for h in homes if h}


def check_root(root: str) -> str:
    if not os.path.lexists(root):
        raise UsageError(f"{root}: no such folder; expected the folder that holds the checkpoints")
    real = os.path.realpath(root)
    if not os.path.isdir(real):
        raise UsageError(f"{root}: is a file; expected the folder that holds the checkpoints")
    if real in _home_folders():
        raise UsageError(f"{root}: refusing to prune / or a home folder; pass the run's checkpoint folder")
    if fm.identify(real) is not None:
        raise UsageError(f"{root}: is itself a checkpoint; pass the folder that holds the checkpoints")
    return real


def _best_names(found: list[fm.Found]) -> set[str]:
    """Checkpoint folder names that any trainer_state.json calls best_model_checkpoint."""
    best: set[str] = set()
    for f in found:
        ts = os.path.join(f.path, "trainer_state.json")
        if not os.path.isfile(ts):
            continue
        try:
            with open(ts, "rb") as fh:
                data = json.loads(fh.read(64 << 20))
        except (OSError, ValueError):
            continue
        name = data.get("best_model_checkpoint") if isinstance(data, dict) else None
        if isinstance(name, str) and name:
            best.add(os.path.basename(os.path.normpath(name)))
    return best


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), root]) == root


def _size(path: str) -> int:
    total = 0
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            return os.lstat(path).st_size
        for dirpath, _dirs, files in os.walk(path, followlinks=False):
            for n in files:
                try:
                    total += os.lstat(os.path.join(dirpath, n)).st_size
                except OSError:
                    pass
    except OSError:
        pass
    return total


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _remove(path: str) -> None:
    """Remove a renamed-away checkpoint (file or folder) without following symlinks."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


UNRESOLVED = ("rollback", "wait", "no_clean_checkpoint")


def spike_guard(found: list[fm.Found], results: dict, log: str | None = None) -> SpikeGuard | None:
    """Read the training log (default: the newest valid checkpoint's trainer_state.json) with the
    recovery adviser. When a loss spike has not recovered, the checkpoint `recover` would resume
    from must survive: spikes come after "best", and a rolling window rotates past them."""
    from checkpoint_strategy.recovery import advise

    valid = sorted((f.step, f.path) for f in found if f.step is not None and results[f.path].status == "valid")
    if log is None:
        logs = [os.path.join(p, "trainer_state.json") for _s, p in valid
                if os.path.isfile(os.path.join(p, "trainer_state.json"))]
        if not logs:
            return None
        log = logs[-1]
        explicit = False
    else:
        explicit = True
    try:
        report = advise(log, checkpoints=valid)
    except UsageError as exc:
        if explicit:
            raise
        return SpikeGuard(log=log, note=f"training log not usable ({exc}); no spike check")
    onset = report.spike.onset_step if report.spike is not None else None
    if report.status not in UNRESOLVED:
        return SpikeGuard(log=log, status=report.status, onset_step=onset,
                          note=f"no unrecovered loss spike ({report.status})")
    resume = report.resume_checkpoint
    protected = os.path.basename(os.path.normpath(resume.path)) if resume is not None and resume.path else None
    if protected:
        note = (f"loss spike at step {onset} has not recovered ({report.status}): {protected} is the checkpoint "
                "to resume from and is kept; run `checkpoint-strategy recover` before pruning further")
    else:
        note = (f"loss spike at step {onset} has not recovered and no checkpoint before it is left "
                "(run `checkpoint-strategy recover`)")
    return SpikeGuard(log=log, status=report.status, onset_step=onset, protected=protected, note=note)


def prune(root: str | os.PathLike, keep_last: int | None = None, milestones: list[int] | None = None,
          policy: CheckpointPolicy | str | os.PathLike | None = None, apply: bool = False,
          level: str = "quick", log: str | None = None, spike_check: bool = True) -> PruneReport:
    """Plan validated retention under root; with apply=True, delete what the plan marks.

    keep_last/milestones override the policy's keep_last/keep_milestone. Invalid and incomplete
    checkpoints are never deleted (a save may still be in flight; remove them by hand). With
    spike_check (default) the training log (`log`, or the newest valid checkpoint's
    trainer_state.json) is read first, and the rollback checkpoint of an unrecovered loss spike is
    kept.
    """
    root = check_root(os.fspath(root))
    if policy is not None and not isinstance(policy, CheckpointPolicy):
        policy = load_policy(policy)
    if keep_last is None and policy is not None:
        keep_last = policy.keep_last
    if keep_last is None:
        raise UsageError("no retention given: pass --keep-last N or --policy FILE.yaml with checkpoint_policy.keep_last")
    if keep_last < 1:
        raise UsageError(f"--keep-last must be at least 1, got {keep_last}")
    ms = sorted(set(milestones if milestones is not None else (policy.keep_milestone if policy else [])))
    found, unrecognised = fm.discover(root, max_depth=1)
    leftovers = sorted(n for n in os.listdir(root) if n.startswith(fm.DELETING_PREFIX))
    best = _best_names(found)
    results = {f.path: check(f, level) for f in found}
    entries: list[PruneEntry] = []
    valid_steps = sorted((f.step, f.path) for f in found
                         if f.step is not None and usable(results[f.path]))
    newest_valid = valid_steps[-1] if valid_steps else None
    kept_recent = {p for _s, p in valid_steps[-keep_last:]}
    guard = spike_guard(found, results, log) if spike_check else None
    for f in found:
        r = results[f.path]
        name = os.path.basename(f.path)
        reasons: list[str] = []
        action = "delete"
        if os.path.islink(f.path) or not _inside(f.path, root):
            reasons.append("symlink or outside ROOT: never deleted")
        if r.status != "valid":
            reasons.append(f"{r.status}: not deleted automatically (a save may be in flight; inspect it)")
        if f.step is None:
            reasons.append("no step number in its name: not ordered, kept")
        if newest_valid and f.path == newest_valid[1]:
            reasons.append("newest valid checkpoint")
        elif f.path in kept_recent:
            reasons.append(f"within keep_last={keep_last} newest valid")
        if f.step is not None and f.step in ms:
            reasons.append(f"milestone step {f.step}")
        if name in best:
            reasons.append("best_model_checkpoint in trainer_state.json")
        if guard is not None and guard.protected == name:
            reasons.append(f"rollback point before the unrecovered loss spike at step {guard.onset_step}")
        if not reasons:
            if newest_valid is None or f.step is None or f.step >= newest_valid[0]:
                reasons.append("no newer checkpoint validated: kept")
            else:
                reasons.append(f"older than keep_last={keep_last}; newer {os.path.basename(newest_valid[1])} "
                               f"validated ({level})")
        else:
            action = "keep"
        if action == "delete" and reasons[0].startswith("no newer"):
            action = "keep"
        entries.append(PruneEntry(path=f.path, name=name, format=f.format, step=f.step, status=r.status,
                                  action=action, reasons=reasons))
    for name in unrecognised:
        entries.append(PruneEntry(path=os.path.join(root, name), name=name, format="unknown", status=None,
                                  action="keep", reasons=["not recognised as a checkpoint: never touched"]))
    errors: list[Problem] = []
    freed = 0
    to_delete = [e for e in entries if e.action == "delete"]
    if apply:
        for name in leftovers:
            try:
                _remove(os.path.join(root, name))
            except OSError as exc:
                errors.append(Problem(file=name, reason=f"could not finish earlier deletion: {exc.strerror}"))
        if to_delete:
            again = check(fm.Found(newest_valid[1], _fmt(found, newest_valid[1]), newest_valid[0],
                                   os.path.isdir(newest_valid[1])), level)
            if not usable(again):
                errors.append(Problem(file=os.path.basename(newest_valid[1]),
                                      reason="newest valid checkpoint no longer validates: nothing deleted"))
                to_delete = []
        for e in to_delete:
            src = e.path
            dst = os.path.join(root, fm.DELETING_PREFIX + e.name)
            size = _size(src)
            try:
                os.rename(src, dst)
                sidecar = src + fm.MANIFEST_SUFFIX
                if os.path.lexists(sidecar):
                    os.rename(sidecar, os.path.join(root, fm.DELETING_PREFIX + e.name + fm.MANIFEST_SUFFIX))
                _fsync_dir(root)
                _remove(dst)
                sc = os.path.join(root, fm.DELETING_PREFIX + e.name + fm.MANIFEST_SUFFIX)
                if os.path.lexists(sc):
                    os.unlink(sc)
            except OSError as exc:
                errors.append(Problem(file=e.name, reason=f"could not delete: {exc.strerror or type(exc).__name__}"))
                continue
            e.deleted = True
            freed += size
    keep = [e for e in entries if e.action == "keep"]
    delete = [e for e in entries if e.action == "delete"]
    return PruneReport(
        root=root, applied=apply, level=level, keep_last=keep_last, milestones=ms,
        best_checkpoint=sorted(best)[0] if best else None,
        newest_valid=os.path.basename(newest_valid[1]) if newest_valid else None,
        keep=keep, delete=delete, leftovers=leftovers,
        reasons={e.name: e.reasons for e in entries}, freed_bytes=freed, errors=errors, spike_guard=guard)


def _fmt(found: list[fm.Found], path: str) -> str:
    return next(f.format for f in found if f.path == path)
