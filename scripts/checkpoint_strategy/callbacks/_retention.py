"""Adapter: the project's validator and retention rules, as the callbacks call them.

The only place the callbacks touch ``checkpoints`` (validate_checkpoint, prune, the layout
table). A prune is one ``PruneRequest`` handed to ``prune``; nothing else in the callbacks knows how a prune
is done.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Optional

from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats import manifest
from checkpoint_strategy.retention import PruneRequest
from checkpoint_strategy.retention import prune as _prune
from checkpoint_strategy.validate import parts, validate_checkpoint

if TYPE_CHECKING:
    from checkpoint_strategy.formats.models import Level


def validate(path: str, level: str = "quick", part: tuple[int, int] = (0, 1)):
    """CheckpointResult of one checkpoint (never loads it); at level deep compared with the previous
    checkpoint of the same folder (a weights-norm jump is suspicious). part (K, N), 0-based K: at level
    full, read every byte of part K of N of the files only (validate/parts.py)."""
    with parts.splitting(*part):
        return validate_checkpoint(
            path, level=level, previous=previous_checkpoint(path) if level == "deep" else None
        )


def write_manifest(path: str) -> str:
    """Write the sha256 manifest of a checkpoint that validated (formats/manifest.py); its path."""
    return manifest.write_manifest(path, zr.Counter())


def previous_checkpoint(path: str) -> Optional[str]:
    """The checkpoint next to `path` with the next lower step (None: the first, or no step)."""
    step = fm.step_from_name(os.path.basename(os.path.normpath(path)))
    if step is None:
        return None
    older = [
        (s, p)
        for s, p in checkpoints_newest_first(os.path.dirname(os.path.normpath(path)) or ".")
        if s is not None and s < step and not os.path.islink(p)
    ]
    return older[0][1] if older else None


def prune(
    root: str,
    keep_last: int,
    milestones: list[int],
    *,
    level: Level = "quick",
    protect: Optional[dict[str, str]] = None,
    log: Optional[str] = None,
    lock_timeout: float = 600.0,
    on_start: Optional[Callable[[], None]] = None,
    on_end: Optional[Callable[[], None]] = None,
    delete_invalid: bool = False,
):
    """Apply the project's keep rules under root (deletes only after a newer checkpoint validated).
    Holds root's lock; waits up to lock_timeout for a save in progress (the callbacks hold it then).
    on_start: called once the lock is held, as the survey of the folder begins; on_end: the last thing before the
    lock is released. delete_invalid: also delete an invalid checkpoint older than a newer valid one (never
    the newest entry; off by default, as in `prune`)."""
    from checkpoint_strategy.recovery import advise

    return _prune(
        PruneRequest.of(
            root,
            keep_last=keep_last,
            milestones=list(milestones),
            apply=True,
            level=level,
            log=log,
            protect=protect or None,
            advise=advise,
            lock_timeout=lock_timeout,
            on_start=on_start,
            on_end=on_end,
            delete_invalid=delete_invalid,
        )
    )


def checkpoints_newest_first(root: str) -> list[tuple[Optional[int], str]]:
    """(step, path) of the checkpoints directly under root, newest first by step. A checkpoint without a
    step in its name (Lightning's last.ckpt) takes the step its own content records (the `global_step` its
    pickle root holds, read by the quick check as `validate` reports it), so a last.ckpt saved after
    epoch=0-step=40.ckpt is newer; one whose step cannot be read comes last, newest file first."""
    found, _unrec = fm.discover(root, max_depth=1)
    with_step = [(f.step, f.path) for f in found if f.step is not None]

    def mtime(p: str) -> float:
        try:
            return os.lstat(p).st_mtime
        except OSError:
            return 0.0

    without: list[str] = []
    for f in found:
        if f.step is None:
            step = _content_step(f.path)
            if step is None:
                without.append(f.path)
            else:
                with_step.append((step, f.path))
    return sorted(with_step, reverse=True) + [
        (None, p) for p in sorted(without, key=mtime, reverse=True)
    ]


def _content_step(path: str) -> Optional[int]:
    """The step a checkpoint without one in its name records inside (None: a folder, a symlink, unreadable)."""
    if os.path.islink(path) or not os.path.isfile(path):
        return None

    try:
        return validate_checkpoint(path, level="quick").step
    except Exception:  # noqa: BLE001 - a file that cannot be read is ordered by time; validation reports it
        return None
