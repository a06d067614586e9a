"""Options shared by `simulate` and `tradeoffs` (on top of every plan option)."""

from __future__ import annotations

import argparse

from checkpoint_strategy.cli_options import number
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning.options import plan_arguments
from checkpoint_strategy.planning.planner import SPIKE_MARGIN_STEPS, SPIKE_WAIT_STEPS

runs_count = number("runs")
seed_value = number("seed")
spike_rate = number("spike_rate")
corrupt_prob = number("probability")
spike_steps = number("step_offset")


def add_spike_options(parser: argparse.ArgumentParser) -> None:
    grp = parser.add_argument_group("loss spikes")
    grp.add_argument("--spike-rate", dest="spike_rate", type=spike_rate, default=0.0, metavar="R",
                     help="loss spikes per 1000 steps (default 0: none)")
    grp.add_argument("--spike-wait-steps", dest="spike_wait_steps", type=spike_steps,
                     default=SPIKE_WAIT_STEPS, metavar="N",
                     help=f"steps between a spike's onset and acting on it (default {SPIKE_WAIT_STEPS}, the spec's wait)")
    grp.add_argument("--spike-margin-steps", dest="spike_margin_steps", type=spike_steps,
                     default=SPIKE_MARGIN_STEPS, metavar="N",
                     help=f"the rescue checkpoint must be this far before the onset (default {SPIKE_MARGIN_STEPS}, PaLM)")


def plan_from_args(args, two_tiers: bool = False):
    """Validated PlanArguments and the planner's PlanReport; a failure model that overflows is bad input.
    two_tiers: the caller simulates --local-tier plans (failures only: no corruption, no spikes)."""
    pargs = plan_arguments(args)
    if two_tiers and pargs.local_tier is not None:
        if getattr(args, "corrupt_prob", 0) or getattr(args, "spike_rate", 0):
            raise UsageError("argument --local-tier: two tiers are simulated with failures only; drop "
                             "--corrupt-prob and --spike-rate, or simulate the persistent tier alone")
        return pargs, plan_or_usage(pargs, two_tiers=True)
    return pargs, plan_or_usage(pargs)


def plan_or_usage(pargs, two_tiers: bool = False):
    from checkpoint_strategy.planning.planner import plan

    if pargs.local_tier is not None and not two_tiers:
        raise UsageError("argument --local-tier: tradeoffs sweeps one checkpoint tier; plan the two tiers with "
                         "`plan --local-tier` and simulate them with `simulate --local-tier`")
    try:
        return plan(pargs)
    except OverflowError:
        raise UsageError("the failure model overflows: the restart or checkpoint cost is so large against the MTBF "
                         "that the run would practically never finish; check --restart-seconds, "
                         "--checkpoint-write-seconds and --mtbf-hours") from None
