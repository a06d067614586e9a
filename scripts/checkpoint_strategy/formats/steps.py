"""Which steps have a checkpoint, from a folder's entry names (`recovery/ckptsteps.py` adds explicit lists
and auto-discovery next to a log; `prune` and the spike check in `safety.py` use `scan` directly).

Names understood (the step is N):
  checkpoint-N            Hugging Face Trainer
  step-N, step_N, stepN   torchtitan, many custom loops
  iter_0000500            Megatron-LM
  global_stepN            DeepSpeed
  epoch=E-step=N[...].ckpt  PyTorch Lightning ModelCheckpoint
  N                       Orbax (plain numeric folders)
Temporary entries (names containing 'tmp' or 'temp', e.g. Orbax's '500.orbax-checkpoint-tmp-1',
HF's 'tmp-checkpoint-500') are ignored: they are not complete checkpoints. So are emergency saves
(a `checkpoint-strategy.json` marker, see formats/marker.py): they hold post-event weights.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.marker import is_emergency
from checkpoint_strategy.storage import oserror_line

_PATTERNS = (
    re.compile(r"^checkpoint-(\d+)$"),
    re.compile(r"^step[-_]?(\d+)$"),
    re.compile(r"^iter_(\d+)$"),
    re.compile(r"^global_step(\d+)$"),
    re.compile(r"^(\d+)$"),
)
_LIGHTNING = re.compile(r"(?:^|[-_])step=(\d+)(?:[-_.].*)?\.ckpt$")
MAX_STEP = 2**53


def parse_step(name: str, is_dir: bool = True) -> Optional[int]:
    """The step a checkpoint entry's name gives, or None."""
    low = name.lower()
    if "tmp" in low or "temp" in low:
        return None
    if name.endswith(".ckpt"):
        m = _LIGHTNING.search(name)
        return _bounded(int(m.group(1))) if m else None
    for pattern in _PATTERNS:
        m = pattern.match(name)
        if m:
            if pattern.pattern == r"^(\d+)$" and not is_dir:
                return None
            return _bounded(int(m.group(1)))
    return None


def _bounded(step: int) -> Optional[int]:
    return step if step <= MAX_STEP else None


def scan(root: str | os.PathLike) -> list[tuple[int, str]]:
    """(step, path) of every checkpoint entry directly in `root`, oldest first."""
    root = Path(root)
    found: dict[int, str] = {}
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        raise UsageError(oserror_line(exc, "list checkpoint folder", root)) from None
    for entry in entries:
        try:
            is_dir = entry.is_dir()
        except OSError:
            continue
        step = parse_step(entry.name, is_dir)
        if step is not None and is_emergency(entry.path):
            continue  # post-event weights saved by the training callbacks: never a resume point
        if step is not None and (step not in found or is_dir):
            found[step] = str(Path(root) / entry.name)
    return sorted(found.items())
