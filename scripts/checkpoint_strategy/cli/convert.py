"""`checkpoint-strategy convert SRC DST --to safetensors|full|dcp [--max-shard-size 5GB] [--check-only]`."""

from __future__ import annotations

from checkpoint_strategy.cli.options import add_report_options, byte_size, path_arg
from checkpoint_strategy.convert.core import DEFAULT_SHARD, check_only, convert
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.render import check_output_early, emit

HELP = "convert checkpoints (torch, safetensors, DCP, ZeRO), checked tensor by tensor"


def add_arguments(parser) -> None:
    parser.add_argument(
        "src",
        metavar="SRC",
        type=path_arg,
        help="a torch archive (pytorch_model.bin, *.pt, Lightning .ckpt), a .safetensors file, or a "
        "folder: DCP (.metadata + __N_0.distcp), DeepSpeed ZeRO global_stepN/, a Hugging Face "
        "model folder",
    )
    parser.add_argument(
        "dst",
        metavar="DST",
        type=path_arg,
        help="a new folder (safetensors, dcp) or file (full); must not exist (with --check-only: an "
        "existing conversion to compare with SRC)",
    )
    parser.add_argument(
        "--to",
        dest="target",
        choices=("safetensors", "full", "dcp"),
        default=None,
        help="safetensors: the weights, sharded as Hugging Face publishes them; full: one torch.save "
        "archive of the whole state (weights and optimizer); dcp: a torch.distributed.checkpoint "
        "folder any world size loads",
    )
    parser.add_argument(
        "--max-shard-size",
        type=byte_size,
        default=None,
        metavar="SIZE",
        help="safetensors shard size, e.g. 5GB (the default, as Hugging Face), 500MB, 2GiB",
    )
    parser.add_argument(
        "--key",
        default=None,
        metavar="KEY",
        help="the subtree to convert (dotted, e.g. state_dict); default: the weights for "
        "safetensors, everything for full and dcp",
    )
    parser.add_argument(
        "--keep-tied",
        action="store_true",
        help="safetensors: write tied weights (lm_head = wte) under each name instead of once",
    )
    parser.add_argument(
        "--check-only",
        action="store_true",
        help="write nothing: compare an existing DST (e.g. dcp_to_torch_save's or zero_to_fp32's "
        "output) with SRC, tensor by tensor",
    )
    add_report_options(parser)


#: longest error line convert prints (a line naming checkpoint content: chunk offsets, shapes, names)
MAX_ERROR = 300


def run(args) -> int:
    try:
        return _run(args)
    except UsageError as exc:
        text = str(exc)
        if len(text) <= MAX_ERROR:
            raise
        raise UsageError(f"{text[: MAX_ERROR - 40]}... ({len(text)} characters, cut)") from None


def _run(args) -> int:
    check_output_early(args.output, (args.src, args.dst))
    if args.check_only:
        if args.max_shard_size is not None or args.keep_tied:
            raise UsageError(
                "--check-only writes nothing: --max-shard-size and --keep-tied do not apply"
            )
        report = check_only(args.src, args.dst, args.target, args.key)
    else:
        if args.target is None:
            raise UsageError(
                "--to is required: safetensors, full or dcp (or --check-only to compare)"
            )
        if args.max_shard_size is not None and args.target != "safetensors":
            raise UsageError("--max-shard-size applies to --to safetensors only")
        report = convert(
            args.src,
            args.dst,
            args.target,
            args.max_shard_size or DEFAULT_SHARD,
            args.key,
            args.keep_tied,
        )
    emit(report, args.format, args.output, inputs=(args.src, args.dst))
    return 0 if report.check.ok else 1
