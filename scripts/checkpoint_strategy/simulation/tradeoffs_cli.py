"""`checkpoint-strategy tradeoffs TOTAL_STEPS STEP_SECONDS BUDGET_GB [plan options] [--plot FILE]`."""

from __future__ import annotations

import argparse
import re
import sys

from checkpoint_strategy.planning.options import add_format_option, add_plan_options
from checkpoint_strategy.simulation.options import add_spike_options
from checkpoint_strategy.storage import path_arg

HELP = "storage vs safety sweep with a Pareto front"
MAX_LIST = 200


def _whole_list(text: str) -> list[int]:
    parts = [p for p in re.split(r"[,\s]+", str(text).strip()) if p]
    expected = f"a comma-separated list of whole numbers from 1 to 10^12 (at most {MAX_LIST})"
    if not parts or len(parts) > MAX_LIST:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    out = []
    for p in parts:
        try:
            v = float(p.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not (v.is_integer() and 1 <= v <= 10**12):  # nan and inf are not integers
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        out.append(int(v))
    return sorted(set(out))


def add_arguments(parser) -> None:
    add_plan_options(parser)
    add_spike_options(parser)
    sw = parser.add_argument_group("sweep")
    sw.add_argument("--sweep-frequencies", "--sweep_frequencies", dest="sweep_frequencies", type=_whole_list,
                    metavar="LIST", help="frequencies to sweep (default: 30 around the recommendation)")
    sw.add_argument("--sweep-keep-last", "--sweep_keep_last", dest="sweep_keep_last", type=_whole_list,
                    metavar="LIST", help="keep_last values to sweep (default 1,2,3,5,7,10,15,20,30,50)")
    sw.add_argument("--plot", dest="plot", metavar="FILE", type=path_arg,
                    help="draw storage vs expected lost hours to FILE (.png or .svg; needs matplotlib)")
    sw.add_argument("--all", dest="show_all", action="store_true",
                    help="text/markdown: list every point (default: the Pareto front and the recommendation)")
    add_format_option(parser, ("text", "markdown", "json"))


def run(args) -> int:
    from checkpoint_strategy.planning.options import plan_arguments
    from checkpoint_strategy.simulation.report import render_tradeoffs
    from checkpoint_strategy.simulation.sweep import tradeoffs

    target = fmt = None
    if args.plot is not None:
        from checkpoint_strategy.simulation.plot import check_plot_path, require_matplotlib

        target, fmt = check_plot_path(args.plot)
        require_matplotlib()
    pargs = plan_arguments(args)
    report = tradeoffs(pargs, frequencies=args.sweep_frequencies, keep_lasts=args.sweep_keep_last,
                       spike_rate=args.spike_rate, wait=args.spike_wait_steps, margin=args.spike_margin_steps,
                       plot=None if target is None else str(target))
    if target is not None:
        from checkpoint_strategy.simulation.plot import write_plot

        write_plot(report, target, fmt)
    sys.stdout.write(render_tradeoffs(report, args.format, show_all=args.show_all))
    return 0
