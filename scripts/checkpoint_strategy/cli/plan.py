"""`checkpoint-strategy [plan] TOTAL_STEPS STEP_SECONDS BUDGET_GB [options]`."""

from __future__ import annotations

from checkpoint_strategy.cli.options import add_report_options
from checkpoint_strategy.cli.planoptions import add_plan_options
from checkpoint_strategy.planning.options import plan_arguments
from checkpoint_strategy.planning.planner import plan
from checkpoint_strategy.render import emit

HELP = "design a checkpointing policy (default command)"


def add_arguments(parser) -> None:
    add_plan_options(parser)
    add_report_options(parser, yaml=True)


def run(args) -> int:
    report = plan(plan_arguments(args))
    emit(report, args.format, args.output)
    return 0
