"""`checkpoint-strategy [plan] TOTAL_STEPS STEP_SECONDS BUDGET_GB [options]`."""

from __future__ import annotations

import sys

from checkpoint_strategy.planning.options import add_format_option, add_plan_options, plan_arguments

HELP = "design a checkpointing policy (default command)"


def add_arguments(parser) -> None:
    add_plan_options(parser)
    add_format_option(parser)


def run(args) -> int:
    from checkpoint_strategy.planning.planner import plan
    from checkpoint_strategy.planning.report import render_plan

    report = plan(plan_arguments(args))
    sys.stdout.write(render_plan(report, args.format))
    return 0
