"""What a run says about itself, and ready shell commands that act on its checkpoints.

- ``trainer_state_facts(path)``: max_steps, save_steps, global_step, ... from an HF
  ``trainer_state.json`` (JSON; read through `storage`).
- ``training_args_facts(folder)``: max_grad_norm, learning_rate, batch sizes from a
  ``training_args.json`` next to the log or in the run folder. ``training_args.bin`` is a pickle
  and is never read.
- ``launcher()``: how to run checkpoint-strategy in a later session (the launcher's absolute
  path, else ``python3 -m checkpoint_strategy``), never a bare name that may not be on PATH.
- ``pin_command`` / ``move_aside_command``: printed for the user, never executed here.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from checkpoint_strategy import storage

_STATE_KEYS = ("max_steps", "save_steps", "global_step", "logging_steps", "train_batch_size")
_ARGS_KEYS = (
    "max_grad_norm",
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_steps",
    "save_steps",
    "save_total_limit",
)


@dataclass
class Facts:
    """Numbers a run's own files state, and the file each came from."""

    values: dict[str, float] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)

    def get(self, key: str) -> Optional[float]:
        return self.values.get(key)

    def int(self, key: str) -> Optional[int]:
        v = self.values.get(key)
        return int(v) if v is not None and float(v).is_integer() and v > 0 else None


def _numbers(data: dict, keys: Sequence[str], path: str, facts: Facts) -> Facts:
    for k in keys:
        v = data.get(k)
        if (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and v == v
            and abs(v) != float("inf")
            and v > 0
        ):
            facts.values.setdefault(k, v)
            facts.source.setdefault(k, path)
    return facts


def trainer_state_facts(path: Optional[str], facts: Optional[Facts] = None) -> Facts:
    """max_steps, save_steps, global_step, logging_steps, train_batch_size of a trainer_state.json
    (a folder: its trainer_state.json). Missing or unreadable: no facts (never an error)."""
    facts = facts or Facts()
    if path is None:
        return facts
    if os.path.isdir(path):
        path = os.path.join(path, "trainer_state.json")
    try:
        data = storage.read_json(path, "trainer_state.json", allow_nan=True, expect=dict)
    except storage.ReadError:
        return facts
    return _numbers(data, _STATE_KEYS, path, facts)


def training_args_facts(folders: Sequence[str], facts: Optional[Facts] = None) -> Facts:
    """max_grad_norm, learning_rate, batch sizes from the first training_args.json found in
    `folders` (JSON only: training_args.bin is a pickle and is never read)."""
    facts = facts or Facts()
    for folder in folders:
        path = os.path.join(folder, "training_args.json")
        if not storage.is_regular(path):
            continue
        try:
            data = storage.read_json(path, "training_args.json", allow_nan=True, expect=dict)
        except storage.ReadError:
            continue
        return _numbers(data, _ARGS_KEYS, path, facts)
    return facts


def run_facts(log_path: Optional[str]) -> Facts:
    """trainer_state.json facts of the log (when it is one), then training_args.json next to it
    or in the run folder above it."""
    if log_path is None:
        return Facts()
    folder = log_path if os.path.isdir(log_path) else os.path.dirname(os.path.abspath(log_path))
    facts = trainer_state_facts(
        log_path
        if os.path.basename(log_path) == "trainer_state.json" or os.path.isdir(log_path)
        else None
    )
    return training_args_facts([folder, os.path.dirname(folder)], facts)


def still_running(facts: Facts) -> bool:
    """The log's global_step is short of max_steps: the run is still writing checkpoints (or crashed)."""
    g, m = facts.int("global_step"), facts.int("max_steps")
    return g is not None and m is not None and g < m


def _quote(text: str) -> str:
    return shlex.quote(text)


def launcher() -> str:
    """The command that runs checkpoint-strategy in any later shell: python3 and the skill
    launcher's absolute path when it exists, else `python3 -m checkpoint_strategy`."""
    here = os.path.dirname(
        os.path.dirname(os.path.realpath(__file__))
    )  # .../scripts/checkpoint_strategy
    path = os.path.join(os.path.dirname(here), "checkpoint-strategy")
    if os.path.isfile(path):
        return f"python3 {_quote(path)}"
    return "python3 -m checkpoint_strategy"


def pinned_name(path: str) -> str:
    """Where a pinned copy goes: beside it, outside the checkpoint-* namespace the trainer rotates
    (HF save_total_limit globs checkpoint-*; prune never deletes a name it does not recognise)."""
    p = os.path.abspath(path)
    return os.path.join(os.path.dirname(p), "pinned-" + os.path.basename(p))


def pin_command(path: str) -> str:
    return f"cp -a {_quote(os.path.abspath(path))} {_quote(pinned_name(path))}"


def move_aside_command(
    paths: Sequence[str], root: Optional[str], onset: Optional[int]
) -> Optional[str]:
    """mkdir + mv of the post-onset checkpoints into ROOT/post-spike-<onset>/ (outside the
    checkpoint-* namespace: no trainer resumes from them by accident)."""
    if not paths:
        return None
    base = os.path.abspath(root or os.path.dirname(os.path.normpath(paths[0])))
    dest = os.path.join(base, f"post-spike-{onset}" if onset is not None else "post-spike")
    moved = " ".join(_quote(os.path.abspath(p)) for p in paths)
    return f"mkdir -p {_quote(dest)} && mv {moved} {_quote(dest)}/"
