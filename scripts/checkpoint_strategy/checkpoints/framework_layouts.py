"""What real framework checkpoints say about themselves, read from their own metadata files.

Kept apart from the checker table in validate.py: each function takes already-read metadata
(parsed JSON, or the top-level keys of a DCP `.metadata`) and answers one question.

Checked against real saves made in tests/test_export_frameworks.py:
  orbax-checkpoint 0.12.8  <step>/<item>/_METADATA: {"tree_metadata": {"('opt', 'mu')": {"key_metadata":
                           [{"key": "opt", ...}, ...]}, ...}}; an unfinished save is <step>.orbax-checkpoint-tmp
  torchtitan               step-N/.metadata top-level keys: model FQNs (flattened) plus optimizer,
                           lr_scheduler, dataloader, train_state for a full save; model FQNs only for the
                           model-only final save (checkpoint.last_save_model_only, default true since 0.2)
"""

from __future__ import annotations

import re

_OPTIMIZER_KEY = re.compile(r"^(opt|opt_state|optimizer|optimizer_state|optim|optim_state)$", re.I)
TORCHTITAN_TRAIN_KEYS = ("optimizer", "lr_scheduler", "train_state", "dataloader")


def orbax_item_has_optimizer(metadata: object) -> bool:
    """True when an Orbax item's _METADATA tree has a top-level optimizer-state key."""
    if not isinstance(metadata, dict):
        return False
    tree = metadata.get("tree_metadata")
    if not isinstance(tree, dict):
        return False
    for entry in tree.values():
        keys = entry.get("key_metadata") if isinstance(entry, dict) else None
        if isinstance(keys, list) and keys and isinstance(keys[0], dict):
            first = keys[0].get("key")
            if isinstance(first, str) and _OPTIMIZER_KEY.match(first):
                return True
    return False


def torchtitan_model_only_reason(keys: set[str], step: int | None) -> str | None:
    """The reason a torchtitan step-N cannot resume training, or None when it holds the training state."""
    if not keys or any(k in keys for k in TORCHTITAN_TRAIN_KEYS):
        return None
    name = f"step-{step}" if step is not None else "this step"
    return (f"not resumable: {name} holds model weights only (no optimizer, lr_scheduler or train_state in "
            ".metadata); torchtitan writes the final save model-only when checkpoint.last_save_model_only is "
            "true (its default since 0.2): resume from the previous full step-N, and set "
            "last_save_model_only = false for future runs")
