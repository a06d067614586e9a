"""The plan `simulate` and `tradeoffs` run on (their options: `cli/planoptions.py`)."""

from __future__ import annotations

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning.options import plan_arguments
from checkpoint_strategy.planning.planner import plan


def plan_from_args(args, two_tiers: bool = False):
    """Validated PlanArguments and the planner's PlanReport; a failure model that overflows is bad input.
    two_tiers: the caller simulates --local-tier plans (failures only: no corruption, no spikes)."""
    pargs = plan_arguments(args)
    if two_tiers and pargs.local_tier is not None:
        if getattr(args, "corrupt_prob", 0) or getattr(args, "spike_rate", 0):
            raise UsageError(
                "argument --local-tier: two tiers are simulated with failures only; drop "
                "--corrupt-prob and --spike-rate, or simulate the persistent tier alone"
            )
        return pargs, plan_or_usage(pargs, two_tiers=True)
    return pargs, plan_or_usage(pargs)


def plan_or_usage(pargs, two_tiers: bool = False):
    if pargs.local_tier is not None and not two_tiers:
        raise UsageError(
            "argument --local-tier: tradeoffs sweeps one checkpoint tier; plan the two tiers with "
            "`plan --local-tier` and simulate them with `simulate --local-tier`"
        )
    try:
        return plan(pargs)
    except OverflowError:
        raise UsageError(
            "the failure model overflows: the restart or checkpoint cost is so large against the MTBF "
            "that the run would practically never finish; check --restart-seconds, "
            "--checkpoint-write-seconds and --mtbf-hours"
        ) from None
