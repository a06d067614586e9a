"""`checkpoint-strategy release-gate CHECKPOINT [--require safetensors,...] [--level quick|full]`."""

from __future__ import annotations

import argparse

from checkpoint_strategy import storage
from checkpoint_strategy.cli.options import (
    add_level,
    add_report_options,
    add_spike_check,
    add_storage_options,
    path_arg,
)
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.integrations.release import apply_spike_check, gate, parse_require
from checkpoint_strategy.render import check_output_early, emit
from checkpoint_strategy.validate.engine import refuse_remote_deep

HELP = "release-readiness gate for one checkpoint"


def _require(text: str) -> list[str]:
    try:
        return parse_require(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--require: ")) from None


def add_arguments(parser) -> None:
    parser.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        type=path_arg,
        help="one checkpoint folder or file, or its URL (s3://BUCKET/PREFIX/checkpoint-N, gs://...)",
    )
    parser.add_argument(
        "--require",
        type=_require,
        default=[],
        metavar="LIST",
        help="comma-separated: safetensors, full_state_dict, sharded, resumable",
    )
    add_level(
        parser,
        help="quick: headers only; full: every byte (a manifest, if present, is always verified); "
        "deep: every tensor value finite and the optimizer state whole",
    )
    add_storage_options(parser)
    add_spike_check(parser)
    add_report_options(parser)


def run(args) -> int:
    check_output_early(args.output, (args.checkpoint,))
    refuse_remote_deep([args.checkpoint], args.level)
    # a URL: its listing (and its run's, where the spike check looks for the newest log), bytes by ranged reads
    with storage.local_paths([args.checkpoint], parents=1 if args.spike_check else 0) as (
        checkpoint,
    ):
        record = storage.unshadow_model(
            apply_spike_check(
                gate(checkpoint, args.require, args.level), args.log, args.spike_check
            )
        )
    emit(record, args.format, args.output, inputs=(args.checkpoint,))
    return 0 if record.gate == "pass" else 1
