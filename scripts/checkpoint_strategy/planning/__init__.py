"""Planning: a checkpointing policy from a run's numbers (see planner.plan).

`plan`, `PlanArguments` and `PlanReport` load on first use: a module that needs only a small part of this
package (formats/models.py and planning/policytiers.py) does not load the planner."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from checkpoint_strategy.planning.models import PlanArguments, PlanReport
    from checkpoint_strategy.planning.planner import plan

__all__ = ["PlanArguments", "PlanReport", "plan"]
_WHERE = {"PlanArguments": "models", "PlanReport": "models", "plan": "planner"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(
            importlib.import_module(f"checkpoint_strategy.planning.{_WHERE[name]}"), name
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
