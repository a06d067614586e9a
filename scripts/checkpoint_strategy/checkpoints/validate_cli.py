"""`checkpoint-strategy validate PATH... [--level quick|full] [--manifest write|verify] [--format ...]`."""

from __future__ import annotations

from checkpoint_strategy.cli_options import (add_level, add_report_options, add_spike_check, add_storage_options,
                                             add_target_gpus)

HELP = "check checkpoints are whole, without loading them"


def add_arguments(parser) -> None:
    from checkpoint_strategy.storage import path_arg

    parser.add_argument("paths", nargs="+", metavar="PATH", type=path_arg,
                        help="a checkpoint (folder or file) or a folder holding checkpoints; or a URL: "
                             "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, memory://PATH (docs/object-storage.md)")
    add_level(parser, help="quick: headers only (default); full: read every byte, zip CRC-32; deep: all of full, "
                           "every tensor value finite, norms, optimizer state whole (moments per parameter, step)")
    parser.add_argument("--stats", default=None, metavar="FILE.json",
                        help="with --level deep: write per-tensor figures (NaN/Inf counts, L2 norm, max |x|)")
    parser.add_argument("--manifest", choices=("write", "verify"), default=None,
                        help="write or verify a SHA-256 integrity.json per checkpoint (implies --level full)")
    add_storage_options(parser)
    add_spike_check(parser)
    add_target_gpus(parser)
    add_report_options(parser)
    parser.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                        help="progress bar on stderr (auto: only on a terminal, after one second)")


def run(args) -> int:
    from checkpoint_strategy.checkpoints.validate import validate_paths
    from checkpoint_strategy.render import check_output_early, emit

    check_output_early(args.output, tuple(args.paths))
    progress = {"auto": None, "always": True, "never": False}[args.progress]
    from checkpoint_strategy.checkpoints.validate import deep_ok

    from checkpoint_strategy import storage
    from checkpoint_strategy.checkpoints.safety import annotate_validation
    from checkpoint_strategy.recovery import advise
    from checkpoint_strategy.checkpoints.validate import refuse_remote
    from checkpoint_strategy.checkpoints.worldsize import annotate_hardware

    refuse_remote(args.paths, args.level, args.manifest)
    # URLs: one view for the validation and the annotations that read the run's files (log, rank files)
    with storage.local_paths(args.paths, prefetch=args.level == "quick") as paths:
        report = validate_paths(paths, level=args.level, manifest=args.manifest, progress=progress,
                                stats=args.stats)
        annotate_validation(report, paths, args.log, args.spike_check, advise)
        annotate_hardware(report, args.target_gpus, args.log)
        if report.hardware_move is not None:
            from checkpoint_strategy.integrations.migration import add_replan

            add_replan(report, args.log)
        report = storage.unshadow_model(report)
    emit(report, args.format, args.output, inputs=tuple(args.paths))
    # at level deep also nothing suspicious and no partial optimizer state (model-only is not a failure)
    return 0 if all(deep_ok(c) for c in report.checkpoints) else 1
