"""`checkpoint-strategy validate PATH... [--level quick|full] [--manifest write|verify] [--part K/N] [--format ...]`."""

from __future__ import annotations

from checkpoint_strategy import storage
from checkpoint_strategy.cli.options import (
    add_level,
    add_report_options,
    add_spike_check,
    add_storage_options,
    add_target_gpus,
    path_arg,
)
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.worldsize import annotate_hardware
from checkpoint_strategy.render import check_output_early, emit
from checkpoint_strategy.retention.safety import annotate_validation
from checkpoint_strategy.validate import parts
from checkpoint_strategy.validate.engine import deep_ok, refuse_remote, validate_paths
from checkpoint_strategy.validate.parts import parse_part

HELP = "check checkpoints are whole, without loading them"


def add_arguments(parser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        type=path_arg,
        help="a checkpoint (folder or file) or a folder holding checkpoints; or a URL: "
        "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, memory://PATH (docs/object-storage.md)",
    )
    add_level(
        parser,
        help="quick: headers only (default); full: read every byte, zip CRC-32; deep: all of full, "
        "every tensor value finite, norms, optimizer state whole (moments per parameter, step)",
    )
    parser.add_argument(
        "--stats",
        default=None,
        metavar="FILE.json",
        help="with --level deep: write per-tensor figures (NaN/Inf counts, L2 norm, max |x|)",
    )
    parser.add_argument(
        "--manifest",
        choices=("write", "verify"),
        default=None,
        help="write or verify a SHA-256 integrity.json per checkpoint (implies --level full)",
    )
    parser.add_argument(
        "--part",
        default=None,
        metavar="K/N",
        help="read every byte of part K of N of each checkpoint only (implies --level full; the "
        "layout is still checked whole): N jobs with K=1..N together check it all; "
        "see docs/checkpoints.md",
    )
    add_storage_options(parser)
    add_spike_check(parser)
    add_target_gpus(parser)
    add_report_options(parser)
    parser.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress bar on stderr (auto: only on a terminal, after one second)",
    )


def run(args) -> int:
    check_output_early(args.output, tuple(args.paths))
    progress = {"auto": None, "always": True, "never": False}[args.progress]

    from checkpoint_strategy.recovery import advise

    refuse_remote(args.paths, args.level, args.manifest)
    part = _part(args)
    # URLs: one view for the validation and the annotations that read the run's files (log, rank files)
    with storage.local_paths(args.paths, prefetch=args.level == "quick") as paths:
        with parts.splitting(*part):
            report = validate_paths(
                paths, level=args.level, manifest=args.manifest, progress=progress, stats=args.stats
            )
        annotate_validation(report, paths, args.log, args.spike_check, advise)
        annotate_hardware(report, args.target_gpus, args.log)
        if report.hardware_move is not None:
            from checkpoint_strategy.integrations.migration import add_replan

            add_replan(report, args.log)
        report = storage.unshadow_model(report)
    emit(report, args.format, args.output, inputs=tuple(args.paths))
    # at level deep also nothing suspicious and no partial optimizer state (model-only is not a failure)
    return 0 if all(deep_ok(c) for c in report.checkpoints) else 1


def _part(args) -> tuple[int, int]:
    """(K, N) of --part, 0-based K; (0, 1) without it. --part implies --level full."""
    if args.part is None:
        return 0, 1
    part = parse_part(args.part)
    if args.level == "deep" or args.manifest:
        raise UsageError(
            f"--part splits the byte reads of --level full; it does not combine with "
            f"{'--level deep' if args.level == 'deep' else '--manifest'} (they read every file)"
        )
    args.level = "full"
    return part
