"""`checkpoint-strategy validate PATH... [--level quick|full] [--manifest write|verify] [--format ...]`."""

from __future__ import annotations

import sys

HELP = "check checkpoints are whole, without loading them"


def add_arguments(parser) -> None:
    from checkpoint_strategy.storage import path_arg

    parser.add_argument("paths", nargs="+", metavar="PATH", type=path_arg,
                        help="a checkpoint (folder or file) or a folder holding checkpoints")
    parser.add_argument("--level", choices=("quick", "full"), default="quick",
                        help="quick: headers only (default); full: read every byte, zip CRC-32")
    parser.add_argument("--manifest", choices=("write", "verify"), default=None,
                        help="write or verify a SHA-256 integrity.json per checkpoint (implies --level full)")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text", dest="fmt")
    parser.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                        help="progress bar on stderr (auto: only on a terminal, after one second)")


def run(args) -> int:
    from checkpoint_strategy.checkpoints.validate import validate_paths
    from checkpoint_strategy.render import render_template, to_json

    progress = {"auto": None, "always": True, "never": False}[args.progress]
    report = validate_paths(args.paths, level=args.level, manifest=args.manifest, progress=progress)
    if args.fmt == "json":
        sys.stdout.write(to_json(report.model_dump(mode="json")))
    else:
        name = "validate.md.j2" if args.fmt == "markdown" else "validate.txt.j2"
        sys.stdout.write(render_template(name, report=report.model_dump(mode="json")))
    return 0 if all(c.status == "valid" for c in report.checkpoints) else 1
