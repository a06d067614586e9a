"""`checkpoint-strategy recover LOG [--checkpoints ROOT_OR_LIST] [--format text|markdown|json] [-o FILE]`."""

from __future__ import annotations

from checkpoint_strategy import storage
from checkpoint_strategy.cli.options import (
    add_level,
    add_log_options,
    add_milestones,
    add_report_options,
    add_storage_options,
    path_arg,
)
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.steps import parse_step
from checkpoint_strategy.planning.planner import milestone_schedule
from checkpoint_strategy.recovery.advice import advise_with_series, complete
from checkpoint_strategy.recovery.plot import write_curve
from checkpoint_strategy.recovery.settings import (
    DETECTION,
    FLAGS,
    PLAYBOOK,
    RecoveryOptions,
    from_args,
)
from checkpoint_strategy.render import check_output_early, render, write_output
from checkpoint_strategy.simulation.plot import check_plot_path, require_matplotlib
from checkpoint_strategy.storage import check_output
from checkpoint_strategy.vocabulary import MAX_STEPS

HELP = "after a loss spike: which checkpoint to resume from"


def add_arguments(parser) -> None:
    add_log_options(parser)
    parser.add_argument(
        "--checkpoints",
        metavar="ROOT_OR_LIST",
        type=path_arg,
        help="checkpoint folder (checkpoint-N, step-N, iter_0000500, global_stepN, "
        "epoch=E-step=N.ckpt, numeric Orbax) or steps like 500,1000; default: next to the log",
    )
    add_milestones(
        parser,
        paths=True,
        help="long-kept milestone checkpoints: a folder or steps like 1000,5000 "
        "(comma or space separated), or seed, pow2, none (the plan's schedules)",
    )
    add_level(
        parser,
        help="validation of the candidate checkpoints (invalid, incomplete and not-resumable ones are "
        "skipped, each named): quick reads headers (default), full every byte, deep every tensor "
        "value, the optimizer state and the weights norm against the previous checkpoint",
    )
    parser.add_argument(
        "--grad-norm-column",
        "--grad-norm-key",
        dest="grad_norm_key",
        metavar="NAME",
        help="grad-norm column/key/tag (optional; default: grad_norm, grad-norm, ...)",
    )
    add_option_arguments(parser)
    parser.add_argument(
        "--plot",
        metavar="FILE",
        type=path_arg,
        help="draw the loss curve, healthy level, events and checkpoints to FILE (.png or .svg; "
        "needs the 'plot' extra: matplotlib)",
    )
    add_storage_options(parser)
    add_report_options(parser)


def add_option_arguments(parser) -> None:
    """The detection and playbook options (recovery/settings.py: FLAGS), grouped; defaults stay None so the
    model's apply."""
    fields = DETECTION + PLAYBOOK
    groups = {
        "detection": parser.add_argument_group("detection"),
        "playbook": parser.add_argument_group("playbook"),
    }
    for name in fields:
        flag, expected = FLAGS[name]
        field = RecoveryOptions.model_fields[name]
        kind = int if expected.startswith("a whole number") else float
        default = field.default
        spelled = [flag]
        under = "--" + flag[2:].replace("-", "_")
        if under != flag:
            spelled.append(under)
        group = groups["detection" if name in DETECTION else "playbook"]
        group.add_argument(
            *spelled,
            dest=name,
            type=_typed(kind, flag, expected),
            default=None,
            metavar="N",
            help=f"{field.description} (default {default})".replace("%", "%%"),
        )


def _typed(kind, flag: str, expected: str):
    def convert(text: str):
        try:
            value = float(str(text).replace("_", ""))
        except ValueError:
            raise UsageError(f"{flag}: expected {expected}, got {text!r}") from None
        if kind is int:
            if not value.is_integer():
                raise UsageError(f"{flag}: expected {expected}, got {text!r}")
            return int(value)
        return value

    convert.__name__ = kind.__name__
    return convert


def run(args) -> int:
    options = from_args(args)
    check_output_early(args.output, (args.log, args.checkpoints))
    if args.plot is not None:  # the one storage check: never an output over an input
        check_output(args.plot, "--plot", inputs=(args.log,))
    target = fmt = None
    if args.plot is not None:
        target, fmt = check_plot_path(args.plot)
        require_matplotlib()
    milestones = args.milestones  # a folder, or steps (a keyword names the plan's schedule)
    if isinstance(milestones, list) or milestones in ("seed", "pow2", "none"):
        milestones = milestone_schedule(milestones, MAX_STEPS) or None

    ck_url = [args.checkpoints] if args.checkpoints and storage.is_url(args.checkpoints) else []
    with (
        storage.local_paths([args.log], parents=log_parents) as (log,),
        storage.local_paths(ck_url) as cks,
    ):
        report, series, checkpoints = advise_with_series(
            log,
            cks[0] if cks else args.checkpoints,
            milestones=milestones,
            log_format=args.log_format,
            step_key=args.step_key,
            loss_key=args.loss_key,
            grad_norm_key=args.grad_norm_key,
            lr_key=args.lr_key,
            run=args.run,
            options=options,
            level=args.level,
        )
        report = complete(report)
        text = storage.unshadow(render(report, args.format))
        if target is not None:
            write_curve(report, series, checkpoints, target, str(fmt))
        log_path = storage.unshadow(report.log.path)
    write_output(text, args.output, inputs=(args.log, log_path, args.checkpoints))
    return 0


def log_parents(log: str) -> int:
    """For a log URL (`storage.local_paths` asks it of URLs only): how many prefix levels above it hold
    its checkpoints (what auto-discovery looks at on disk): 2 for RUN/checkpoint-N/trainer_state.json,
    1 for RUN/log.jsonl, 0 for a run prefix."""
    parts = log.split("://", 1)[1].rstrip("/").split("/")
    if "." not in parts[-1] or len(parts) < 3:
        return 0
    return (
        2
        if len(parts) >= 4 and (parse_step(parts[-2]) is not None or parts[-2] == "checkpoints")
        else 1
    )
