"""Planning: a checkpointing policy from a run's numbers (see planner.plan)."""

from checkpoint_strategy.planning.models import PlanArguments, PlanReport
from checkpoint_strategy.planning.planner import plan

__all__ = ["PlanArguments", "PlanReport", "plan"]
