"""Resume safety: the newest checkpoint that validates (not merely the highest checkpoint-N)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Optional

from checkpoint_strategy.callbacks import _retention
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.marker import read_marker
from checkpoint_strategy.formats.runlog import versioned_checkpoint_dirs
from checkpoint_strategy.retention.safety import after_onset, read_spike
from checkpoint_strategy.validate.engine import usable


def last_valid_checkpoint(
    output_dir: str | os.PathLike,
    level: str = "quick",
    include_emergency: bool = False,
    spike_check: bool = True,
) -> Optional[str]:
    """Path of the newest *resumable* checkpoint under `output_dir` that validates, or None.

    For ``trainer.train(resume_from_checkpoint=...)`` (HF: pass the run's output_dir) and
    ``trainer.fit(model, ckpt_path=...)`` (Lightning: pass the ModelCheckpoint dirpath). A
    half-written newest checkpoint (a torn .ckpt, a checkpoint-N without trainer_state.json, one a rank did
    not finish: a per-rank file the run's world size needs is missing, formats/runfacts.py) is
    skipped, and so are emergency saves (post-event weights, never a resume point) unless
    include_emergency. A valid weights-only checkpoint (no optimizer state: resuming from it resets
    the optimizer) is returned only when no valid checkpoint is resumable; then the newest of them.
    None when the folder does not exist yet or holds no valid checkpoint, so
    ``resume_from_checkpoint=last_valid_checkpoint(out)`` starts fresh on a first run.
    Lightning's default folder (``lightning_logs/version_N/checkpoints``: a rerun makes version_N+1): given the
    logger folder (``lightning_logs``), the folder holding it (``default_root_dir``), a version folder or its
    checkpoints/ (made or not yet), the newest version with a valid checkpoint is used: its own first, then the
    earlier ones (`formats.runlog.versioned_checkpoint_dirs`).
    level: "quick" (default), "full" or "deep" (also every value finite, the optimizer state whole and
    no weight-norm jump from the previous checkpoint). Checks newest first and stops at the first
    valid resumable one. With spike_check (default) the run's training log (the one every command finds:
    trainer_state.json, the callbacks' own loss log, Lightning's metrics.csv, TensorBoard; formats/runlog.py)
    is read the way `prune` reads it (retention/safety.py): a checkpoint saved after the onset of an unrecovered
    loss spike is skipped (it holds spiked weights); not with include_emergency, which asks for
    post-event weights.
    """
    if level not in ("quick", "full", "deep"):
        raise UsageError(f"level must be quick, full or deep, got {level!r}")
    root = os.fspath(output_dir)
    if os.path.lexists(root) and not os.path.isdir(root):
        raise UsageError(f"{root}: is a file; expected the folder that holds the checkpoints")

    got = (
        _last_valid_in(root, level, include_emergency, spike_check) if os.path.isdir(root) else None
    )
    for folder in (
        [] if got is not None else versioned_checkpoint_dirs(root)
    ):  # listed only when needed
        got = _last_valid_in(folder, level, include_emergency, spike_check)
        if got is not None:
            break
    return got


def _last_valid_in(
    root: str, level: str, include_emergency: bool, spike_check: bool
) -> Optional[str]:
    """last_valid_checkpoint in one folder that holds checkpoints."""
    found = _retention.checkpoints_newest_first(root)
    spike_check = (
        spike_check and not include_emergency
    )  # asking for emergency saves asks for post-event weights
    guard: list = []  # read once, when the first valid checkpoint is found
    weights_only = None
    for step, path, resumable in _valid_newest_first(found, level, include_emergency):
        if spike_check and not guard:
            guard.append(_spike_guard(found, root))
        if spike_check and _after_onset(step, guard[0]):
            continue
        if resumable:
            return path
        weights_only = weights_only or path
    return weights_only


def _valid_newest_first(
    found, level: str, include_emergency: bool
) -> Iterator[tuple[Optional[int], str, bool]]:
    """(step, path, resumable) of the checkpoints found that validate (at level deep: pass the deep
    check), newest first; emergency saves only with include_emergency; symlinks never."""
    for step, path in found:
        if not include_emergency and read_marker(path) is not None:
            continue
        if os.path.islink(path):
            continue
        result = _retention.validate(path, level)
        if usable(result):
            yield step, path, bool(result.resumable)


def _spike_guard(found, root: str):
    """The run's log as every command finds it (`formats.runlog`: trainer_state.json, the callbacks' loss
    log, Lightning's metrics.csv, TensorBoard), read with the recovery adviser."""
    from checkpoint_strategy.recovery import advise

    return read_spike([(s, p) for s, p in found if s is not None], advise=advise, root=root)


def _after_onset(step, guard) -> bool:
    return after_onset(step, guard)
