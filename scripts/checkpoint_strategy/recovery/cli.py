"""`checkpoint-strategy recover LOG [--checkpoints ROOT_OR_LIST] [--format text|markdown|json]`."""

from __future__ import annotations

from checkpoint_strategy.recovery.options import add_log_options, add_output_options, emit

HELP = "after a loss spike: which checkpoint to resume from"


def add_arguments(parser) -> None:
    add_log_options(parser)
    parser.add_argument("--checkpoints", metavar="ROOT_OR_LIST",
                        help="checkpoint folder (checkpoint-N, step-N, iter_0000500, global_stepN, "
                             "epoch=E-step=N.ckpt, numeric Orbax) or steps like 500,1000; default: next to the log")
    parser.add_argument("--milestones", metavar="ROOT_OR_LIST", help="long-kept milestone checkpoints (same forms)")
    parser.add_argument("--grad-norm-column", "--grad-norm-key", dest="grad_norm_key", metavar="NAME",
                        help="grad-norm column/key/tag (optional; default: grad_norm, grad-norm, ...)")
    from checkpoint_strategy.recovery.settings import add_arguments as add_option_arguments

    add_option_arguments(parser)
    parser.add_argument("--plot", metavar="FILE",
                        help="draw the loss curve, healthy level, events and checkpoints to FILE (.png or .svg; "
                             "needs the 'plot' extra: matplotlib)")
    add_output_options(parser)


def run(args) -> int:
    from checkpoint_strategy.recovery.advice import advise_with_series
    from checkpoint_strategy.recovery.report import render_recovery
    from checkpoint_strategy.recovery.settings import from_args

    options = from_args(args)
    _refuse_overwriting_the_log(args.log, {"-o/--output": args.output, "--plot": args.plot})
    target = None
    if args.plot is not None:
        from checkpoint_strategy.simulation.plot import check_plot_path, require_matplotlib

        target, fmt = check_plot_path(args.plot)
        require_matplotlib()
    report, series, checkpoints = advise_with_series(
        args.log, args.checkpoints, milestones=args.milestones, log_format=args.log_format, step_key=args.step_key,
        loss_key=args.loss_key, grad_norm_key=args.grad_norm_key, lr_key=args.lr_key, run=args.run, options=options)
    text = render_recovery(report, args.format)
    if target is not None:
        from checkpoint_strategy.recovery.plot import write_curve

        write_curve(report, series, checkpoints, target, fmt)
    emit(text, args.output)
    return 0


def _refuse_overwriting_the_log(log: str, outputs: dict) -> None:
    """An output path that is the log itself would replace the user's log: exit 2 first."""
    import os

    from checkpoint_strategy.errors import UsageError

    for flag, out in outputs.items():
        if not out:
            continue
        try:
            same = os.path.exists(out) and os.path.isfile(log) and os.path.samefile(out, log)
        except OSError:
            same = False
        if same:
            raise UsageError(f"{flag} {out} is the training log itself: expected another file (it would be replaced)")
