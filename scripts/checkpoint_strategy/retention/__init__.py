"""Validated retention: which checkpoints a policy keeps (small pure rules), the survey of a folder or a bucket,
and the apply step that deletes only after a newer checkpoint re-validated.

    from checkpoint_strategy.retention import Candidate, Retention, plan_prune
    plan = plan_prune(candidates, Retention(keep_last=3, milestones=frozenset({1000})))

Nothing here imports torch, and no checkpoint content is ever executed.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from checkpoint_strategy.retention.prune import prune
    from checkpoint_strategy.retention.request import PruneRequest
    from checkpoint_strategy.retention.rules import Candidate, Retention, classify_name, plan_prune

# The names come from their modules when first used (PEP 562): a command that needs one small module of this
# package does not load prune and its imports.
_WHERE = {
    "prune": "prune",
    "PruneRequest": "request",
    "plan_prune": "rules",
    "Candidate": "rules",
    "Retention": "rules",
    "classify_name": "rules",
}

__all__ = ["prune", "PruneRequest", "plan_prune", "Candidate", "Retention", "classify_name"]


class _Package(types.ModuleType):
    """`prune` is both a submodule and the function the package names: importing the submodule must leave the
    package's `prune` the function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "prune" and isinstance(value, types.ModuleType):
            value = value.prune
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value
