"""Checkpoint validation and validated retention (`validate`, `prune`).

Python API for training scripts (the spec's ``validate_on_save``)::

    from checkpoint_strategy.checkpoints import validate_checkpoint
    result = validate_checkpoint("out/checkpoint-500", level="quick")
    if result.status != "valid":
        ...  # result.problems: [{file, reason, kind}]

Nothing here imports torch, and no checkpoint content is ever executed.
"""

from __future__ import annotations

from checkpoint_strategy.checkpoints.prune import load_policy, prune
from checkpoint_strategy.checkpoints.validate import validate_checkpoint, validate_paths

__all__ = ["validate_checkpoint", "validate_paths", "prune", "load_policy"]
