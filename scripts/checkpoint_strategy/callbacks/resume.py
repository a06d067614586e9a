"""Resume safety: the newest checkpoint that validates (not merely the highest checkpoint-N)."""

from __future__ import annotations

import os
from typing import Optional

from checkpoint_strategy.errors import UsageError


def last_valid_checkpoint(output_dir: str | os.PathLike, level: str = "quick",
                          include_emergency: bool = False) -> Optional[str]:
    """Path of the newest checkpoint under `output_dir` that validates, or None.

    For ``trainer.train(resume_from_checkpoint=...)`` (HF: pass the run's output_dir) and
    ``trainer.fit(model, ckpt_path=...)`` (Lightning: pass the ModelCheckpoint dirpath). A
    half-written newest checkpoint (a torn .ckpt, a checkpoint-N without trainer_state.json) is
    skipped, and so are emergency saves (post-event weights, never a resume point) unless
    include_emergency. None when the folder does not exist yet or holds no valid checkpoint,
    so ``resume_from_checkpoint=last_valid_checkpoint(out)`` starts fresh on a first run.
    Checks newest first and stops at the first valid one.
    """
    from checkpoint_strategy.callbacks import _retention

    if level not in ("quick", "full"):
        raise UsageError(f"level must be quick or full, got {level!r}")
    root = os.fspath(output_dir)
    if not os.path.lexists(root):
        return None
    if not os.path.isdir(root):
        raise UsageError(f"{root}: is a file; expected the folder that holds the checkpoints")
    for _step, path in _retention.checkpoints_newest_first(root):
        if not include_emergency and _retention.read_marker(path) is not None:
            continue
        if os.path.islink(path):
            continue
        if _retention.validate(path, level).status == "valid":
            return path
    return None
