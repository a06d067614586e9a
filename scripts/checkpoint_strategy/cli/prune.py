"""`checkpoint-strategy prune ROOT [--keep-last N] [--milestones ...] [--policy FILE.yaml] [--apply]`."""

from __future__ import annotations

from checkpoint_strategy import storage
from checkpoint_strategy.cli.options import (
    add_level,
    add_milestones,
    add_policy,
    add_report_options,
    add_spike_check,
    add_storage_options,
    number,
    path_arg,
)
from checkpoint_strategy.formats.steps import scan
from checkpoint_strategy.planning.planner import milestone_schedule
from checkpoint_strategy.render import check_output_early, emit
from checkpoint_strategy.retention.prune import prune
from checkpoint_strategy.retention.request import PruneRequest

HELP = "apply retention; delete only after a newer one validated"


def add_arguments(parser) -> None:
    parser.add_argument(
        "root",
        metavar="ROOT",
        type=path_arg,
        help="the folder that holds the checkpoints, or a prefix URL (s3://BUCKET/PREFIX, gs://, "
        "memory://): deletions there are journalled (docs/object-storage.md)",
    )
    parser.add_argument(
        "--keep-last",
        type=number("keep"),
        default=None,
        metavar="N",
        help="keep the N newest valid checkpoints (overrides the policy's keep_last)",
    )
    add_milestones(
        parser,
        help="steps never deleted: 1000,5000 or 1000 5000, or seed, pow2, none (the plan's "
        "schedules); overrides the policy's keep_milestone",
    )
    add_policy(parser, help="its keep_last and keep_milestone")
    add_level(
        parser, help="validation level for the checkpoints that justify a deletion (default quick)"
    )
    add_spike_check(
        parser,
        log_help="training log checked for an unrecovered loss spike before deleting "
        "(default: the run folder's log: the newest valid checkpoint's trainer_state.json, "
        "else the callbacks' loss log, Lightning's metrics.csv, TensorBoard events)",
    )
    parser.add_argument(
        "--delete-invalid",
        action="store_true",
        help="also delete invalid or incomplete checkpoints older than a newer valid one (not a save "
        "in flight); the newest entry is never deleted (default: kept and reported)",
    )
    parser.add_argument(
        "--apply", action="store_true", help="delete (default: dry run, prints the plan)"
    )
    add_storage_options(parser)
    add_report_options(parser)


def run(args) -> int:
    check_output_early(args.output, (args.root, args.log))
    milestones = args.milestones
    if isinstance(
        milestones, str
    ):  # seed, pow2 or none: the plan's schedule up to the newest checkpoint here
        try:
            with storage.local_paths([args.root]) as (root,):
                newest = max((step for step, _path in scan(root)), default=0)
        except OSError:
            newest = 0  # prune reports the unreadable root itself
        milestones = milestone_schedule(milestones, newest)
    from checkpoint_strategy.recovery import advise

    report = prune(
        PruneRequest.of(
            args.root,
            keep_last=args.keep_last,
            milestones=milestones,
            policy=args.policy,
            apply=args.apply,
            level=args.level,
            log=args.log,
            spike_check=args.spike_check,
            advise=advise,
            delete_invalid=args.delete_invalid,
        )
    )
    emit(report, args.format, args.output, inputs=(args.root, args.log))
    return 1 if report.errors else 0
