"""Resume safety: the newest checkpoint that validates (not merely the highest checkpoint-N)."""

from __future__ import annotations

import os
from typing import Optional

from checkpoint_strategy.errors import UsageError


def last_valid_checkpoint(output_dir: str | os.PathLike, level: str = "quick",
                          include_emergency: bool = False, spike_check: bool = True) -> Optional[str]:
    """Path of the newest checkpoint under `output_dir` that validates, or None.

    For ``trainer.train(resume_from_checkpoint=...)`` (HF: pass the run's output_dir) and
    ``trainer.fit(model, ckpt_path=...)`` (Lightning: pass the ModelCheckpoint dirpath). A
    half-written newest checkpoint (a torn .ckpt, a checkpoint-N without trainer_state.json) is
    skipped, and so are emergency saves (post-event weights, never a resume point) unless
    include_emergency. None when the folder does not exist yet or holds no valid checkpoint,
    so ``resume_from_checkpoint=last_valid_checkpoint(out)`` starts fresh on a first run.
    Checks newest first and stops at the first valid one. With spike_check (default) the run's
    trainer_state.json is read the way `prune` reads it (checkpoints/safety.py): a checkpoint saved
    after the onset of an unrecovered loss spike is skipped (it holds spiked weights); not with
    include_emergency, which asks for post-event weights.
    """
    from checkpoint_strategy.callbacks import _retention

    if level not in ("quick", "full"):
        raise UsageError(f"level must be quick or full, got {level!r}")
    root = os.fspath(output_dir)
    if not os.path.lexists(root):
        return None
    if not os.path.isdir(root):
        raise UsageError(f"{root}: is a file; expected the folder that holds the checkpoints")
    found = _retention.checkpoints_newest_first(root)
    spike_check = spike_check and not include_emergency   # asking for emergency saves asks for post-event weights
    guard: list = []   # read once, when the first valid checkpoint is found
    for step, path in found:
        if not include_emergency and _retention.read_marker(path) is not None:
            continue
        if os.path.islink(path):
            continue
        if _retention.validate(path, level).status == "valid":
            if spike_check and not guard:
                guard.append(_spike_guard(found))
            if spike_check and _after_onset(step, guard[0]):
                continue
            return path
    return None


def _spike_guard(found):
    from checkpoint_strategy.checkpoints.safety import read_spike

    return read_spike([(s, p) for s, p in found if s is not None])


def _after_onset(step, guard) -> bool:
    from checkpoint_strategy.checkpoints.safety import after_onset

    return after_onset(step, guard)
