"""`checkpoint-strategy handoff [TOTAL_STEPS|--duration D STEP_SECONDS BUDGET_GB [plan options] | --plan-file PLAN.json]
[--checkpoints ROOT] [--state-dir DIR]`."""

from __future__ import annotations

from checkpoint_strategy import storage
from checkpoint_strategy.cli.options import (
    add_level,
    add_report_options,
    add_storage_options,
    path_arg,
)
from checkpoint_strategy.cli.planoptions import (
    add_optional_run,
    add_plan_options,
    optional_run_numbers,
    plan_options_given,
)
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.integrations import handoff
from checkpoint_strategy.planning.options import plan_arguments
from checkpoint_strategy.planning.planner import plan
from checkpoint_strategy.render import check_output_early, emit
from checkpoint_strategy.storage import read_text_input as read_text
from checkpoint_strategy.validate.engine import refuse_remote_deep

HELP = "write checkpoint metadata for session-handoff"


def add_arguments(parser) -> None:
    add_optional_run(parser)
    parser.add_argument(
        "--plan-file",
        dest="plan_file",
        metavar="PLAN.json",
        type=path_arg,
        help="the JSON printed by `plan --format json` (instead of plan options); - reads stdin",
    )
    parser.add_argument(
        "--checkpoints",
        metavar="ROOT",
        type=path_arg,
        help="the run's checkpoint folder or prefix URL (s3://BUCKET/PREFIX, gs://...): validated, "
        "newest first",
    )
    add_level(parser, help="validation depth for --checkpoints (default quick: headers only)")
    add_storage_options(parser)
    parser.add_argument(
        "--log",
        metavar="LOG",
        type=path_arg,
        help="the training log, filled into the recovery commands",
    )
    parser.add_argument(
        "--state-dir",
        dest="state_dir",
        default=".claude/state",
        metavar="DIR",
        type=path_arg,
        help="session-handoff state folder (default .claude/state)",
    )
    parser.add_argument(
        "--dry-run", dest="dry_run", action="store_true", help="print only; write nothing"
    )
    add_report_options(
        parser,
        default="markdown",
        help="markdown: the block for NEXT_ACTION.md (default); text: the same block; "
        "json: checkpoint-strategy.json",
    )
    add_plan_options(parser, positionals=False)


def run(args) -> int:
    inputs = (args.checkpoints, args.plan_file, args.log)
    check_output_early(args.output, inputs)

    given = optional_run_numbers(args)
    options = plan_options_given(args)
    report = None
    if args.plan_file:
        if given or options:
            raise UsageError(
                "give either --plan-file or plan arguments (TOTAL_STEPS STEP_SECONDS BUDGET_GB ...), "
                "not both"
            )
        text, name = read_text(args.plan_file, "plan file")
        report = handoff.load_plan_file(text, name)
    elif given:
        if len(given) != 3:
            raise UsageError(
                "plan arguments need all three of TOTAL_STEPS (or --duration) STEP_SECONDS BUDGET_GB"
            )

        report = plan(plan_arguments(args))
    elif options:
        raise UsageError(
            f"plan options (--{options[0].replace('_', '-')}) need TOTAL_STEPS STEP_SECONDS BUDGET_GB"
        )
    if report is None and args.checkpoints is None:
        raise UsageError(
            "nothing to hand off: give plan arguments, --plan-file PLAN.json and/or --checkpoints ROOT"
        )

    refuse_remote_deep([args.checkpoints], args.level)
    read = [p for p in (args.checkpoints, args.log) if p is not None]
    with storage.local_paths(
        read, prefetch=args.level == "quick"
    ) as local:  # URLs: listed once, ranged reads
        named = dict(zip(read, local, strict=True))
        doc = handoff.build(
            report, named.get(args.checkpoints), level=args.level, log=named.get(args.log)
        )
        doc = storage.unshadow_model(doc)
    if not args.dry_run:
        handoff.write(args.state_dir, doc)
    emit(
        doc,
        args.format,
        args.output,
        inputs=tuple(p for p in inputs if p),
        **handoff.block_context(doc),
    )
    return 0
