"""`checkpoint-strategy verify-resume LOG --resume-step N [--checkpoints PATH ...]` (exit 1 when suspicious)."""

from __future__ import annotations

from checkpoint_strategy.cli.options import add_log_options, add_report_options, number, path_arg
from checkpoint_strategy.recovery.verify import verify_resume
from checkpoint_strategy.render import check_output_early, emit

HELP = "check that a resume kept optimizer state"


def add_arguments(parser) -> None:
    add_log_options(parser)
    parser.add_argument(
        "--resume-step",
        type=number("step_offset"),
        required=True,
        metavar="N",
        help="the step of the checkpoint the run resumed from",
    )
    parser.add_argument(
        "--checkpoints",
        metavar="PATH",
        type=path_arg,
        action="append",
        help="the run's checkpoint folder (or one checkpoint); repeat for a resumed run writing to "
        "another folder. Compares the optimizer's step counter with the training step in the "
        "checkpoints after the resume, and the world size / global batch before and after",
    )
    parser.add_argument(
        "--pre-points",
        type=number("points"),
        default=20,
        help="logged losses before the save (default 20)",
    )
    parser.add_argument(
        "--post-points",
        type=number("points"),
        default=5,
        help="logged losses after the resume (default 5)",
    )
    parser.add_argument(
        "--tolerance",
        type=number("relative"),
        default=0.05,
        help="allowed relative change (default 0.05)",
    )
    parser.add_argument(
        "--lr-tolerance",
        type=number("relative"),
        default=0.10,
        help="allowed lr deviation (default 0.10)",
    )
    add_report_options(parser)


def run(args) -> int:
    check_output_early(args.output, inputs=(args.log, *(args.checkpoints or ())))
    report = verify_resume(
        args.log,
        args.resume_step,
        log_format=args.log_format,
        step_key=args.step_key,
        loss_key=args.loss_key,
        lr_key=args.lr_key,
        run=args.run,
        pre_points=args.pre_points,
        post_points=args.post_points,
        tolerance=args.tolerance,
        lr_tolerance=args.lr_tolerance,
        checkpoints=args.checkpoints,
    )
    emit(
        report,
        args.format,
        args.output,
        inputs=(args.log, report.log.path, *(args.checkpoints or ())),
    )
    return 0 if report.verdict == "ok" else 1
