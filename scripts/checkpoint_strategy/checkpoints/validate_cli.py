"""`checkpoint-strategy validate PATH... [--level quick|full|deep] [--stats FILE.json] [--manifest write|verify]
[--format ...]`."""

from __future__ import annotations

import sys

HELP = "check checkpoints are whole, without loading them"


def add_arguments(parser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a checkpoint (folder or file) or a folder holding checkpoints")
    parser.add_argument("--level", choices=("quick", "full", "deep"), default="quick",
                        help="quick: headers only (default); full: read every byte, zip CRC-32; deep: every tensor "
                             "value finite, norms, optimizer state whole (moments per parameter, step)")
    parser.add_argument("--stats", default=None, metavar="FILE.json",
                        help="with --level deep: write per-tensor figures (NaN/Inf counts, L2 norm, max |x|)")
    parser.add_argument("--manifest", choices=("write", "verify"), default=None,
                        help="write or verify a SHA-256 integrity.json per checkpoint (implies --level full)")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text", dest="fmt")
    parser.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                        help="progress bar on stderr (auto: only on a terminal, after one second)")


def run(args) -> int:
    from checkpoint_strategy.checkpoints.validate import validate_paths
    from checkpoint_strategy.render import render_template, to_json

    progress = {"auto": None, "always": True, "never": False}[args.progress]
    report = validate_paths(args.paths, level=args.level, manifest=args.manifest, progress=progress,
                            stats=args.stats)
    if args.fmt == "json":
        sys.stdout.write(to_json(report.model_dump(mode="json")))
    else:
        name = "validate.md.j2" if args.fmt == "markdown" else "validate.txt.j2"
        sys.stdout.write(render_template(name, report=report.model_dump(mode="json")))
    return 0 if all(_ok(c) for c in report.checkpoints) else 1


def _ok(c) -> bool:
    """Exit 0 needs every checkpoint valid; at level deep also nothing suspicious and no partial optimizer
    state (a model-only export is reported as not resumable but is not a failure)."""
    from checkpoint_strategy.checkpoints.validate import deep_ok

    return deep_ok(c)
