"""`checkpoint-strategy release-gate CHECKPOINT [--require safetensors,...] [--level quick|full|deep]`."""

from __future__ import annotations

import argparse
import sys

HELP = "release-readiness gate for one checkpoint"


def _require(text: str) -> list[str]:
    from checkpoint_strategy.errors import UsageError
    from checkpoint_strategy.integrations.release import parse_require

    try:
        return parse_require(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--require: ")) from None


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="one checkpoint folder or file")
    parser.add_argument("--require", type=_require, default=[], metavar="LIST",
                        help="comma-separated: safetensors, full_state_dict, sharded, resumable")
    parser.add_argument("--level", choices=["quick", "full", "deep"], default="quick",
                        help="quick: headers only; full: every byte (a manifest, if present, is always verified); "
                             "deep: every tensor value finite and the optimizer state whole")
    parser.add_argument("--format", dest="format", choices=["text", "markdown", "json"], default="text")


def run(args) -> int:
    from checkpoint_strategy.integrations.release import gate
    from checkpoint_strategy.render import render_template, to_json

    record = gate(args.checkpoint, args.require, args.level)
    data = record.model_dump(mode="json")
    if args.format == "json":
        sys.stdout.write(to_json(data))
    else:
        name = "release-gate.md.j2" if args.format == "markdown" else "release-gate.txt.j2"
        sys.stdout.write(render_template(name, g=data))
    return 0 if record.gate == "pass" else 1
