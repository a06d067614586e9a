"""Checkpoint validation and validated retention (`validate`, `prune`).

Python API for training scripts (the spec's ``validate_on_save``)::

    from checkpoint_strategy.checkpoints import validate_checkpoint
    result = validate_checkpoint("out/checkpoint-500", level="quick")
    if result.status != "valid":
        ...  # result.problems: [{file, reason, kind}]

Retention (the keep rules shared by prune, the callbacks and any other storage)::

    from checkpoint_strategy.checkpoints import Candidate, Retention, plan_prune
    plan = plan_prune(candidates, Retention(keep_last=3, milestones=frozenset({1000})))

Resume checks (read as opcodes; verify-resume --checkpoints, and a callback at resume time)::

    from checkpoint_strategy.checkpoints.optstep import read_optimizer_steps, judge
    judge(read_optimizer_steps("out/checkpoint-1200"), resume_step=1000).verdict   # "reset" when Adam restarted
    from checkpoint_strategy.checkpoints.runshape import check_resume_shape
    check_resume_shape("out/checkpoint-1000", world_size=1)   # ["global batch changed ... accumulation to 2 ..."]

Nothing here imports torch, and no checkpoint content is ever executed.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from checkpoint_strategy.checkpoints.prune import prune
    from checkpoint_strategy.checkpoints.prunerequest import PruneRequest
    from checkpoint_strategy.checkpoints.retention import Candidate, Retention, classify_name, plan_prune
    from checkpoint_strategy.checkpoints.validate import validate_checkpoint, validate_paths

# The names come from their modules when first used (PEP 562): a command that needs one small module of
# this package (recover reads checkpoints.marker) does not load the validator, prune and their imports.
_WHERE = {"validate_checkpoint": "validate", "validate_paths": "validate", "prune": "prune", "PruneRequest": "prunerequest",
          "plan_prune": "retention", "Candidate": "retention", "Retention": "retention", "classify_name": "retention"}

__all__ = ["validate_checkpoint", "validate_paths", "prune", "PruneRequest", "plan_prune", "Candidate", "Retention",
           "classify_name"]


class _Package(types.ModuleType):
    """`prune` is both a submodule and the function the package names: importing the submodule must leave the
    package's `prune` the function (as the eager imports this replaced did)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "prune" and isinstance(value, types.ModuleType):
            value = value.prune
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value
