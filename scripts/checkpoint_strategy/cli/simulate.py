"""`checkpoint-strategy simulate TOTAL_STEPS STEP_SECONDS BUDGET_GB [plan options] [--runs N] [--seed S]`."""

from __future__ import annotations

from checkpoint_strategy.cli.options import add_report_options
from checkpoint_strategy.cli.planoptions import (
    add_plan_options,
    add_spike_options,
    corrupt_prob,
    runs_count,
    seed_value,
)
from checkpoint_strategy.render import emit
from checkpoint_strategy.simulation.montecarlo import simulate
from checkpoint_strategy.simulation.options import plan_from_args

HELP = "Monte Carlo check of a policy under failures and spikes"
DEFAULT_RUNS = 10000


def add_arguments(parser) -> None:
    add_plan_options(parser)
    sim = parser.add_argument_group("simulation")
    sim.add_argument(
        "--runs",
        dest="runs",
        type=runs_count,
        default=DEFAULT_RUNS,
        metavar="N",
        help=f"simulated runs (default {DEFAULT_RUNS})",
    )
    sim.add_argument(
        "--seed",
        dest="seed",
        type=seed_value,
        default=0,
        metavar="S",
        help="random seed; the same seed gives the same report (default 0)",
    )
    sim.add_argument(
        "--corrupt-prob",
        dest="corrupt_prob",
        type=corrupt_prob,
        default=0.0,
        metavar="Q",
        help="probability that a saved checkpoint is unloadable when needed (default 0)",
    )
    add_spike_options(parser)
    add_report_options(parser)


def run(args) -> int:
    _pargs, report = plan_from_args(args, two_tiers=True)
    result = simulate(
        report,
        runs=args.runs,
        seed=args.seed,
        corrupt_prob=args.corrupt_prob,
        spike_rate=args.spike_rate,
        wait=args.spike_wait_steps,
        margin=args.spike_margin_steps,
    )
    emit(result, args.format, args.output)
    return 0
