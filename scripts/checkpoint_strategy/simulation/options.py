"""Options shared by `simulate` and `tradeoffs` (on top of every plan option)."""

from __future__ import annotations

import argparse
import math

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning.options import finite_number, plan_arguments
from checkpoint_strategy.planning.planner import SPIKE_MARGIN_STEPS, SPIKE_WAIT_STEPS

MAX_RUNS = 1_000_000
MAX_SEED = 2**63 - 1
MAX_SPIKE_RATE = 1000.0  # one spike per step
MAX_CORRUPT_PROB = 0.5
MAX_SPIKE_STEPS = 10**12


def _integer(text: str, lo: int, hi: int, what: str) -> int:
    try:
        value = finite_number(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not value.is_integer() or not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return int(value)


def runs_count(text: str) -> int:
    return _integer(text, 1, MAX_RUNS, f"a whole number of simulated runs from 1 to {MAX_RUNS}")


def seed_value(text: str) -> int:
    t = str(text).strip()
    if not t.isdigit():  # exact integers only: 1e3 or 1.0 are not seeds
        raise argparse.ArgumentTypeError(f"expected a whole number seed from 0 to 2^63-1, got {text!r}")
    value = int(t)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a whole number seed from 0 to 2^63-1, got {text!r}")
    return value


def _bounded(text: str, hi: float, expected: str) -> float:
    try:
        value = finite_number(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not 0 <= value <= hi:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def spike_rate(text: str) -> float:
    return _bounded(text, MAX_SPIKE_RATE, f"spikes per 1000 steps, a number from 0 to {MAX_SPIKE_RATE:g}")


def corrupt_prob(text: str) -> float:
    return _bounded(text, MAX_CORRUPT_PROB, f"a probability from 0 to {MAX_CORRUPT_PROB:g}")


def spike_steps(text: str) -> int:
    return _integer(text, 0, MAX_SPIKE_STEPS, "a whole number of steps from 0 to 10^12")


def add_spike_options(parser: argparse.ArgumentParser) -> None:
    grp = parser.add_argument_group("loss spikes")
    grp.add_argument("--spike-rate", "--spike_rate", dest="spike_rate", type=spike_rate, default=0.0, metavar="R",
                     help="loss spikes per 1000 steps (default 0: none)")
    grp.add_argument("--spike-wait-steps", "--spike_wait_steps", dest="spike_wait_steps", type=spike_steps,
                     default=SPIKE_WAIT_STEPS, metavar="N",
                     help=f"steps between a spike's onset and acting on it (default {SPIKE_WAIT_STEPS}, the spec's wait)")
    grp.add_argument("--spike-margin-steps", "--spike_margin_steps", dest="spike_margin_steps", type=spike_steps,
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
