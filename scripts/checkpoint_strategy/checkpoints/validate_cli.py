"""`checkpoint-strategy validate PATH... [--level quick|full] [--manifest write|verify] [--format ...]`."""

from __future__ import annotations

from checkpoint_strategy.cli_options import add_level, add_report_options

HELP = "check checkpoints are whole, without loading them"


def add_arguments(parser) -> None:
    from checkpoint_strategy.storage import path_arg

    parser.add_argument("paths", nargs="+", metavar="PATH", type=path_arg,
                        help="a checkpoint (folder or file) or a folder holding checkpoints")
    add_level(parser, help="quick: headers only (default); full: read every byte, zip CRC-32; deep: every tensor "
                           "value finite, norms, optimizer state whole (moments per parameter, step)")
    parser.add_argument("--stats", default=None, metavar="FILE.json",
                        help="with --level deep: write per-tensor figures (NaN/Inf counts, L2 norm, max |x|)")
    parser.add_argument("--manifest", choices=("write", "verify"), default=None,
                        help="write or verify a SHA-256 integrity.json per checkpoint (implies --level full)")
    add_report_options(parser)
    parser.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                        help="progress bar on stderr (auto: only on a terminal, after one second)")


def run(args) -> int:
    from checkpoint_strategy.checkpoints.validate import validate_paths
    from checkpoint_strategy.render import check_output_early, emit

    check_output_early(args.output, tuple(args.paths))
    progress = {"auto": None, "always": True, "never": False}[args.progress]
    from checkpoint_strategy.checkpoints.validate import deep_ok

    report = validate_paths(args.paths, level=args.level, manifest=args.manifest, progress=progress,
                            stats=args.stats)
    emit(report, args.format, args.output, inputs=tuple(args.paths))
    # at level deep also nothing suspicious and no partial optimizer state (model-only is not a failure)
    return 0 if all(deep_ok(c) for c in report.checkpoints) else 1
