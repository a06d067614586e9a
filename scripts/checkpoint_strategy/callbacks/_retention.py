"""Adapter: the project's validator and retention rules, as the callbacks call them.

The only place the callbacks touch ``checkpoints`` (validate_checkpoint, prune, the layout
table). When retention is split into ``plan_prune`` / ``apply_prune`` this is the module to
switch; nothing else in the package knows how a prune is done.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

from checkpoint_strategy.checkpoints import formats as fm
from checkpoint_strategy.checkpoints.marker import read_marker, write_marker  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from checkpoint_strategy.checkpoints.models import Level


def validate(path: str, level: str = "quick"):
    """CheckpointResult of one checkpoint (never loads it); at level deep compared with the previous
    checkpoint of the same folder (a weights-norm jump is suspicious)."""
    from checkpoint_strategy.checkpoints import validate_checkpoint

    return validate_checkpoint(path, level=level, previous=previous_checkpoint(path) if level == "deep" else None)


def previous_checkpoint(path: str) -> Optional[str]:
    """The checkpoint next to `path` with the next lower step (None: the first, or no step)."""
    step = fm.step_from_name(os.path.basename(os.path.normpath(path)))
    if step is None:
        return None
    older = [(s, p) for s, p in checkpoints_newest_first(os.path.dirname(os.path.normpath(path)) or ".")
             if s is not None and s < step and not os.path.islink(p)]
    return older[0][1] if older else None


def prune(root: str, keep_last: int, milestones: list[int], *, level: Level = "quick",
          protect: Optional[dict[str, str]] = None, log: Optional[str] = None):
    """Apply the project's keep rules under root (deletes only after a newer checkpoint validated)."""
    from checkpoint_strategy.checkpoints import prune as _prune
    from checkpoint_strategy.recovery import advise

    return _prune(root, keep_last=keep_last, milestones=list(milestones), apply=True, level=level,
                  log=log, protect=protect or None, advise=advise)


def checkpoints_newest_first(root: str) -> list[tuple[Optional[int], str]]:
    """(step, path) of the checkpoints directly under root, newest first by step; checkpoints
    without a step in their name (e.g. Lightning's last.ckpt) come last, newest file first."""
    found, _unrec = fm.discover(root, max_depth=1)
    with_step = sorted(((f.step, f.path) for f in found if f.step is not None), reverse=True)

    def mtime(p: str) -> float:
        try:
            return os.lstat(p).st_mtime
        except OSError:
            return 0.0

    without = sorted((f.path for f in found if f.step is None), key=mtime, reverse=True)
    return with_step + [(None, p) for p in without]
