"""The plan's options on the command line: TOTAL_STEPS / --duration, every plan option, and simulate's and
tradeoffs' spike options (argparse types and adders; the plan's model and its check are `planning/options.py`)."""

from __future__ import annotations

import argparse
import copy
import functools
import re
import sys
from typing import Union

from checkpoint_strategy.cli.options import add_milestones, number
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning import sizing
from checkpoint_strategy.planning.options import FIELDS, RunLength
from checkpoint_strategy.planning.planner import SPIKE_MARGIN_STEPS, SPIKE_WAIT_STEPS
from checkpoint_strategy.vocabulary import BOUNDS, shown

whole_number = number("steps")


# "3w", "21d", "504h", "90min", "1.5 days": a run length in place of TOTAL_STEPS (issue 42)
_DURATION_RE = re.compile(
    r"^\s*([0-9]*\.?[0-9]+)\s*(w|wk|weeks?|d|days?|h|hr|hours?|min|minutes?)\s*$", re.I
)


_UNIT_HOURS = {"w": 168.0, "d": 24.0, "h": 1.0, "m": 1 / 60}


def duration(text: str) -> float:
    """argparse type for --duration: '3w' -> 504.0 (hours)."""
    match = _DURATION_RE.match(str(text))
    hours = float(match.group(1)) * _UNIT_HOURS[match.group(2)[0].lower()] if match else 0.0
    if not match or not 0 < hours <= BOUNDS["hours"].hi:
        raise argparse.ArgumentTypeError(
            f"expected {FIELDS['duration_hours'][1]}, got {shown(text)}"
        )
    return hours


# put first on the command line when --duration is given, so STEP_SECONDS BUDGET_GB alone parse
_NO_STEPS = "\x00no-steps"


def steps_or_duration(text: str) -> Union[int, float, RunLength, None]:
    """argparse type of TOTAL_STEPS: whole steps, or a run length (3w, 21d, 504h) as RunLength hours."""
    if text == _NO_STEPS:
        return None
    if _DURATION_RE.match(str(text)):
        return RunLength(duration(text))
    return whole_number(text)


def _duration_first(parser: argparse.ArgumentParser) -> None:
    """With --duration, TOTAL_STEPS may be left out: the parser first tries the command line with an empty
    TOTAL_STEPS in front, then as given (TOTAL_STEPS too, checked against the duration in run_numbers)."""
    plain = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        cut = argv.index("--") if "--" in argv else len(argv)
        if not any(a == "--duration" or a.startswith("--duration=") for a in argv[:cut]):
            return plain(argv, namespace)
        try:
            ns, extra = plain([_NO_STEPS, *argv], copy.copy(namespace))
        except UsageError as first:
            try:
                return plain(argv, namespace)
            except UsageError:
                raise first from None
        return (ns, extra) if not extra else plain(argv, namespace)

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def params_count(text: str) -> float:
    try:
        value = sizing.parse_params(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not BOUNDS["params"].contains(value):
        raise argparse.ArgumentTypeError(f"expected {FIELDS['params'][1]}, got {text!r}")
    return value


def tier_spec(text: str) -> dict:
    parts = [p for p in re.split(r"[,\s]+", str(text).strip()) if p]
    try:
        gb, gbps = (
            (number("gb")(parts[0]), number("gbps")(parts[1])) if len(parts) == 2 else (None, None)
        )
    except argparse.ArgumentTypeError:
        gb = gbps = None
    if gb is None or gbps is None:
        raise argparse.ArgumentTypeError(
            f"expected GB,GBPS (node-local space and write rate per node, e.g. "
            f"2000,5), got {text!r}"
        )
    return {"gb_per_node": gb, "gbps_per_node": gbps}


def formats_list(text: str) -> list[str]:
    allowed = ("full_state_dict", "sharded", "safetensors")
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    bad = [p for p in parts if p not in allowed]
    if not parts or bad:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(allowed)}, got {text!r}"
        )
    return list(dict.fromkeys(parts))


_DURATION_HELP = (
    "the run's length (3w, 21d, 504h, 90min) in place of TOTAL_STEPS: steps = D / STEP_SECONDS"
)


def add_optional_run(parser: argparse.ArgumentParser) -> None:
    """TOTAL_STEPS STEP_SECONDS BUDGET_GB as optional positionals (commands that also take --plan-file:
    export, handoff) and --duration in place of TOTAL_STEPS, as plan has it. argparse fills `?` positionals
    from the left, so they are read as text here and typed by optional_run_numbers once their places are
    known (with --duration, two numbers are STEP_SECONDS BUDGET_GB)."""
    parser.add_argument(
        "total_steps",
        metavar="TOTAL_STEPS",
        nargs="?",
        help="plan inputs, as for the plan command (or use --plan-file); TOTAL_STEPS may be a "
        "run length (3w, 21d, 504h) or left out for --duration",
    )
    parser.add_argument("step_seconds", metavar="STEP_SECONDS", nargs="?")
    parser.add_argument("budget_gb", metavar="BUDGET_GB", nargs="?")
    parser.add_argument(
        "--duration", dest="duration_hours", type=duration, metavar="D", help=_DURATION_HELP
    )


_RUN_PLACES = (
    ("total_steps", "TOTAL_STEPS", steps_or_duration),
    ("step_seconds", "STEP_SECONDS", None),
    ("budget_gb", "BUDGET_GB", None),
)


def optional_run_numbers(ns: argparse.Namespace) -> list:
    """The plan positionals of a command of add_optional_run, put in place and typed (the same bounds and
    words as plan's); returns those given, --duration standing for a left-out TOTAL_STEPS."""
    texts = [getattr(ns, dest) for dest, _, _ in _RUN_PLACES]
    if (
        ns.duration_hours is not None
        and texts[2] is None
        and texts[0] is not None
        and not _DURATION_RE.match(str(texts[0]))
    ):
        texts = [None, *texts[:2]]
    typed = {"step_seconds": number("step_seconds"), "budget_gb": number("gb")}
    for (dest, metavar, kind), text in zip(_RUN_PLACES, texts, strict=True):
        try:
            value = None if text is None else (kind or typed[dest])(text)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"argument {metavar}: {exc}") from None
        setattr(ns, dest, value)
    given = [p for p in (ns.total_steps, ns.step_seconds, ns.budget_gb) if p is not None]
    return (
        given + [ns.duration_hours]
        if ns.duration_hours is not None and ns.total_steps is None
        else given
    )


def add_plan_options(parser: argparse.ArgumentParser, positionals: bool = True) -> None:
    """Every plan option (TOTAL_STEPS STEP_SECONDS BUDGET_GB unless positionals=False). Underscored
    spellings (--model_size_gb, --keep_last) are accepted for every option by cli.ArgumentParser."""
    if positionals:
        parser.add_argument(
            "total_steps",
            metavar="TOTAL_STEPS",
            type=steps_or_duration,
            help="optimizer steps in the run, or its length: 3w, 21d, 504h (or --duration)",
        )
        parser.add_argument(
            "step_seconds",
            metavar="STEP_SECONDS",
            type=number("step_seconds"),
            help="wall seconds per step",
        )
        parser.add_argument(
            "budget_gb", metavar="BUDGET_GB", type=number("gb"), help="storage budget, GB"
        )
        _duration_first(parser)
        parser.add_argument(
            "--duration", dest="duration_hours", type=duration, metavar="D", help=_DURATION_HELP
        )
    size = parser.add_argument_group("model size")
    size.add_argument(
        "--model-size-gb",
        dest="model_size_gb",
        type=number("gb"),
        metavar="N",
        help="model weights in GB (fp32 unless --weights-dtype); checkpoint = 3x for fp32",
    )
    size.add_argument("--weights-dtype", dest="weights_dtype", choices=["fp32", "bf16", "fp16"])
    size.add_argument(
        "--params",
        dest="params",
        type=params_count,
        metavar="N",
        help="parameter count: 7B, 350M, 1.3e9",
    )
    size.add_argument(
        "--precision",
        dest="precision",
        choices=["fp32", "mixed", "mixed-no-master"],
        help="fp32: 12 bytes/param; mixed: 14 bytes/param (ZeRO accounting without gradients); "
        "mixed-no-master: 10 bytes/param (16-bit weights, fp32 Adam moments, as OPT-175B)",
    )
    pol = parser.add_argument_group("policy")
    pol.add_argument(
        "--preset",
        dest="preset",
        choices=["conservative", "aggressive", "auto"],
        help="default auto",
    )
    pol.add_argument(
        "--frequency",
        dest="frequency",
        type=number("steps"),
        metavar="N",
        help="save every N steps",
    )
    pol.add_argument(
        "--keep-last",
        dest="keep_last",
        type=number("keep"),
        metavar="N",
        help="rolling window size",
    )
    add_milestones(
        pol,
        help="seed (default: 1000, 5000, 10000, 25000, 50000, ...), pow2, none, or steps "
        "1000,5000,... (comma or space separated)",
    )
    pol.add_argument(
        "--formats",
        dest="formats",
        type=formats_list,
        metavar="LIST",
        help="full_state_dict,sharded,safetensors (default full_state_dict,safetensors)",
    )
    pol.add_argument("--save-optimizer", dest="save_optimizer", action="store_const", const=True)
    pol.add_argument(
        "--no-save-optimizer",
        dest="save_optimizer",
        action="store_const",
        const=False,
        help="weights only (warned: resuming resets Adam)",
    )
    fm = parser.add_argument_group("failure model")
    fm.add_argument(
        "--gpus", dest="gpus", type=number("gpus"), metavar="N", help="GPUs in the job (default 8)"
    )
    fm.add_argument(
        "--gpu-mtbf-hours",
        dest="gpu_mtbf_hours",
        type=number("hours"),
        metavar="H",
        help="per-GPU MTBF (default 50000, from the Llama 3 paper)",
    )
    fm.add_argument(
        "--mtbf-hours",
        dest="mtbf_hours",
        type=number("hours"),
        metavar="H",
        help="job MTBF (overrides --gpus)",
    )
    fm.add_argument(
        "--checkpoint-write-seconds",
        dest="checkpoint_write_seconds",
        type=number("seconds"),
        metavar="S",
        help="seconds one save stalls training (Daly's C)",
    )
    fm.add_argument(
        "--write-gbps",
        dest="write_gbps",
        type=number("gbps"),
        metavar="G",
        help="the job's write rate GB/s (default: --node-write-gbps x nodes, capped by --storage-gbps)",
    )
    fm.add_argument(
        "--gpus-per-node",
        dest="gpus_per_node",
        type=number("gpus_per_node"),
        metavar="N",
        help="default 8",
    )
    fm.add_argument(
        "--node-write-gbps",
        dest="node_write_gbps",
        type=number("gbps"),
        metavar="G",
        help="one node's write rate GB/s (default 1)",
    )
    fm.add_argument(
        "--storage-gbps",
        dest="storage_gbps",
        type=number("storage_gbps"),
        metavar="G",
        help="aggregate rate the storage sustains GB/s (default 2000, Llama 3's Tectonic)",
    )
    fm.add_argument(
        "--min-interval-seconds",
        dest="min_interval_seconds",
        type=number("seconds"),
        metavar="S",
        help="the planner never saves more often (default 300)",
    )
    fm.add_argument(
        "--restart-seconds",
        dest="restart_seconds",
        type=number("seconds"),
        metavar="S",
        help="default 600",
    )
    fm.add_argument(
        "--async", dest="async_save", action="store_const", const=True, help="async saves (default)"
    )
    fm.add_argument("--no-async", dest="async_save", action="store_const", const=False)
    fm.add_argument(
        "--max-loss-hours",
        dest="max_loss_hours",
        type=number("hours"),
        metavar="H",
        help="cap on training lost to one failure (default 1)",
    )
    fm.add_argument(
        "--local-tier",
        dest="local_tier",
        type=tier_spec,
        metavar="GB,GBPS",
        help="plan two tiers: node-local space and write rate per node (frequent saves) + persistent storage",
    )
    fm.add_argument(
        "--node-loss-fraction",
        dest="node_loss_fraction",
        type=number("fraction"),
        metavar="F",
        help="share of failures that lose a node's local checkpoints (default 0.78, Llama 3)",
    )


@functools.cache
def _plan_option_names() -> tuple[str, ...]:
    """The namespace names of add_plan_options's options (TOTAL_STEPS / --duration aside), in declared order."""
    parser = argparse.ArgumentParser(add_help=False)
    add_plan_options(parser, positionals=False)
    return tuple(vars(parser.parse_args([])))


def plan_options_given(ns: argparse.Namespace) -> list[str]:
    """The plan options given on the command line (each add_plan_options option whose value is not None), in the
    order add_plan_options declares them: a command taking --plan-file refuses them next to it."""
    return [name for name in _plan_option_names() if getattr(ns, name, None) is not None]


runs_count = number("runs")


seed_value = number("seed")


spike_rate = number("spike_rate")


corrupt_prob = number("probability")


spike_steps = number("step_offset")


def add_spike_options(parser: argparse.ArgumentParser) -> None:
    grp = parser.add_argument_group("loss spikes")
    grp.add_argument(
        "--spike-rate",
        dest="spike_rate",
        type=spike_rate,
        default=0.0,
        metavar="R",
        help="loss spikes per 1000 steps (default 0: none)",
    )
    grp.add_argument(
        "--spike-wait-steps",
        dest="spike_wait_steps",
        type=spike_steps,
        default=SPIKE_WAIT_STEPS,
        metavar="N",
        help=f"steps between a spike's onset and acting on it (default {SPIKE_WAIT_STEPS}, the spec's wait)",
    )
    grp.add_argument(
        "--spike-margin-steps",
        dest="spike_margin_steps",
        type=spike_steps,
        default=SPIKE_MARGIN_STEPS,
        metavar="N",
        help=f"the rescue checkpoint must be this far before the onset (default {SPIKE_MARGIN_STEPS}, PaLM)",
    )
