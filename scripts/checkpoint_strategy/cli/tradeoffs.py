"""`checkpoint-strategy tradeoffs TOTAL_STEPS STEP_SECONDS BUDGET_GB [plan options] [--plot FILE]`."""

from __future__ import annotations

from checkpoint_strategy.cli.options import add_report_options, number_list, path_arg
from checkpoint_strategy.cli.planoptions import add_plan_options, add_spike_options
from checkpoint_strategy.planning.options import plan_arguments
from checkpoint_strategy.render import emit
from checkpoint_strategy.simulation.plot import check_plot_path, require_matplotlib, write_plot
from checkpoint_strategy.simulation.sweep import tradeoffs

HELP = "storage vs safety sweep with a Pareto front"


def add_arguments(parser) -> None:
    add_plan_options(parser)
    add_spike_options(parser)
    sw = parser.add_argument_group("sweep")
    sw.add_argument(
        "--sweep-frequencies",
        dest="sweep_frequencies",
        type=number_list("steps"),
        metavar="LIST",
        help="frequencies to sweep (default: 30 around the recommendation)",
    )
    sw.add_argument(
        "--sweep-keep-last",
        dest="sweep_keep_last",
        type=number_list("keep"),
        metavar="LIST",
        help="keep_last values to sweep (default 1,2,3,5,7,10,15,20,30,50)",
    )
    sw.add_argument(
        "--plot",
        dest="plot",
        metavar="FILE",
        type=path_arg,
        help="draw storage vs expected lost hours to FILE (.png or .svg; needs matplotlib)",
    )
    sw.add_argument(
        "--all",
        dest="show_all",
        action="store_true",
        help="text/markdown: list every point (default: the Pareto front and the recommendation)",
    )
    add_report_options(parser)


def run(args) -> int:
    target = fmt = None
    if args.plot is not None:
        target, fmt = check_plot_path(args.plot)
        require_matplotlib()
    pargs = plan_arguments(args)
    report = tradeoffs(
        pargs,
        frequencies=args.sweep_frequencies,
        keep_lasts=args.sweep_keep_last,
        spike_rate=args.spike_rate,
        wait=args.spike_wait_steps,
        margin=args.spike_margin_steps,
        plot=None if target is None else str(target),
    )
    if target is not None:
        write_plot(report, target, str(fmt))
    rows = [p for p in report.points if args.show_all or p.pareto or p.recommended]
    emit(report, args.format, args.output, rows=rows, show_all=args.show_all)
    return 0
