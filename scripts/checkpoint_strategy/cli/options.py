"""The command line's options: the argparse side of the option vocabulary (`checkpoint_strategy.vocabulary`:
the bounds, the choices, the wording). The argparse ``type`` of each quantity (``number("steps")``), the shared
option adders (``add_format`` / ``add_output`` / ``add_milestones`` / ``add_level`` ...: the same option spelled
and checked the same way wherever a command has it; ``VOCABULARY`` lists what tests/test_cli_vocabulary.py checks
on every command's parser), and the argv normalisation applied before parsing (``--foo_bar`` is ``--foo-bar``;
``--milestones 1000 5000 ROOT`` is ``--milestones 1000,5000 ROOT``, never swallowing a positional).

Kept import-light: the ``plan`` command loads it on its start-up path.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from functools import cache
from typing import Union

from checkpoint_strategy.vocabulary import (
    BOUNDS,
    FORMATS,
    MAX_LIST,
    MILESTONE_KEYWORDS,
    MILESTONES_EXPECTED,
    POLICY_FORMATS,
    Milestones,
    Quantity,
    shown,
)


def parse_quantity(q: Quantity, text: str) -> Union[int, float]:
    """argparse type of one quantity: the number, or ArgumentTypeError naming the expected range."""
    raw = str(text).strip().replace("_", "")
    try:
        value = int(raw) if q.whole and raw.isdigit() else float(raw)
    except ValueError:
        value = math.nan
    if isinstance(value, float) and (not math.isfinite(value) or not q.contains(value)):
        raise argparse.ArgumentTypeError(f"expected {q.expected()}, got {shown(text)}")
    if not q.contains(value):
        raise argparse.ArgumentTypeError(f"expected {q.expected()}, got {shown(text)}")
    return int(value) if q.whole else float(value)


def path_arg(text: str) -> str:
    """argparse type for every path argument: an empty string is bad input, never "the current folder"."""
    if text is None or str(text).strip() == "":
        raise argparse.ArgumentTypeError("empty path: expected a file or folder path")
    if "\0" in str(text):
        raise argparse.ArgumentTypeError("path contains a NUL byte: expected a file or folder path")
    return str(text)


@cache
def number(quantity: str) -> Callable[[str], Union[int, float]]:
    """The argparse ``type`` for one quantity of ``BOUNDS`` (named, so argparse and tests can tell)."""
    q = BOUNDS[quantity]

    def parse(text: str) -> Union[int, float]:
        return parse_quantity(q, text)

    parse.__name__ = f"number_{quantity}"
    parse.quantity = quantity  # type: ignore[attr-defined]
    return parse


def number_list(quantity: str) -> Callable[[str], list[int]]:
    """argparse type: comma- or space-separated numbers of one quantity, sorted, at most MAX_LIST."""
    q = BOUNDS[quantity]
    expected = (
        f"a comma-separated list of {q.expected().replace('a whole number of', 'whole numbers of')} "
        f"(at most {MAX_LIST})"
    )

    def parse(text: str) -> list[int]:
        parts = [p for p in re.split(r"[,\s]+", str(text).strip()) if p]
        if not parts or len(parts) > MAX_LIST:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {shown(text)}")
        try:
            return sorted({int(parse_quantity(q, p)) for p in parts})
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {shown(text)}") from None

    parse.__name__ = f"list_{quantity}"
    parse.quantity = quantity  # type: ignore[attr-defined]
    return parse


def milestones(text: str) -> Milestones:
    """argparse type for --milestones: 'seed', 'pow2', 'none' or a sorted list of whole steps."""
    t = str(text).strip().lower()
    if t in MILESTONE_KEYWORDS:
        return t
    parts = [p for p in re.split(r"[,\s]+", t) if p]
    if not parts or len(parts) > MAX_LIST:
        raise argparse.ArgumentTypeError(f"expected {MILESTONES_EXPECTED}, got {shown(text)}")
    try:
        return sorted({int(parse_quantity(BOUNDS["steps"], p)) for p in parts})
    except argparse.ArgumentTypeError:
        expected = MILESTONES_EXPECTED
        if any(p.isdigit() for p in parts):  # a step out of range: say the range
            expected = (
                expected[:-1] + "; each step " + BOUNDS["steps"].expected().split(", ", 1)[1] + ")"
            )
        raise argparse.ArgumentTypeError(f"expected {expected}, got {shown(text)}") from None


def milestones_or_path(text: str) -> Milestones:
    """--milestones where a checkpoint folder is also meaningful (recover): a keyword, steps, or the path."""
    try:
        return milestones(text)
    except argparse.ArgumentTypeError:
        if not str(text).strip() or "\0" in str(text) or re.fullmatch(r"[\d,\s_.eE+-]+", str(text)):
            raise
        return str(text)


milestones_or_path.__name__ = "milestones"


def add_format(
    parser, *, yaml: bool = False, default: str = "text", help: str | None = None
) -> None:
    """--format text|markdown|json (and yaml where the output is a policy)."""
    choices = POLICY_FORMATS if yaml else FORMATS
    parser.add_argument(
        "--format",
        dest="format",
        choices=choices,
        default=default,
        help=help or f"report format (default {default})",
    )


def add_output(parser) -> None:
    """-o/--output FILE: the report is written there atomically instead of stdout."""
    parser.add_argument(
        "-o",
        "--output",
        dest="output",
        metavar="FILE",
        default=None,
        type=path_arg,
        help="write the report to FILE (atomically) instead of stdout",
    )


def add_report_options(parser, **format_kw) -> None:
    add_format(parser, **format_kw)
    add_output(parser)


def add_milestones(parser, *, paths: bool = False, help: str | None = None) -> None:
    """--milestones seed|pow2|none|STEPS (comma or space separated; a folder too when paths=True)."""
    parser.add_argument(
        "--milestones",
        dest="milestones",
        type=milestones_or_path if paths else milestones,
        default=None,
        metavar="SPEC",
        help=help or f"milestone steps never deleted: {MILESTONES_EXPECTED}",
    )


POLICY_HELP = (
    "the checkpoint policy, detected by content: the plan (--format yaml or json), the handoff state "
    "file checkpoint-strategy.json, or a bare policy mapping"
)


def add_policy(parser, help: str | None = None) -> None:
    """--policy FILE: the same forms wherever a command reads a policy."""
    parser.add_argument(
        "--policy",
        dest="policy",
        default=None,
        metavar="FILE",
        type=path_arg,
        help=POLICY_HELP + (f" ({help})" if help else ""),
    )


def add_level(parser, help: str | None = None) -> None:
    parser.add_argument(
        "--level",
        choices=("quick", "full", "deep"),
        default="quick",
        help=help
        or "validation level: quick reads headers (default), full reads every byte, "
        "deep reads every tensor value and the optimizer state",
    )


def add_storage_options(parser) -> None:
    """--storage-option KEY=VALUE (repeatable): passed to the object-storage driver (s3fs, gcsfs) for
    s3:// and gs:// paths; values are never printed."""
    parser.add_argument(
        "--storage-option",
        dest="storage_options",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="for s3:// / gs:// paths: a driver option, e.g. endpoint_url=http://host:9000, "
        "anon=true, client_kwargs.region_name=eu-west-1 (repeatable; credentials otherwise "
        "come from the environment and config files, as for the AWS/GCS tools)",
    )


def add_spike_check(parser, log_help: str | None = None) -> None:
    """--log LOG and --no-spike-check: the training log read for an unrecovered loss spike
    (retention/safety.py), wherever a command decides which checkpoints are safe to resume from."""
    parser.add_argument(
        "--log",
        default=None,
        metavar="LOG",
        type=path_arg,
        help=log_help
        or "training log checked for an unrecovered loss spike (default: the run folder's "
        "log: the newest valid checkpoint's trainer_state.json, else the callbacks' "
        "loss log, Lightning's metrics.csv, TensorBoard events)",
    )
    parser.add_argument(
        "--no-spike-check",
        dest="spike_check",
        action="store_false",
        help="do not read the training log (checkpoints after a spike are then not flagged)",
    )


def add_target_gpus(parser) -> None:
    """--target-gpus N: the world size the run moves to (what stays constant, what changes)."""
    parser.add_argument(
        "--target-gpus",
        dest="target_gpus",
        type=number("gpus"),
        default=None,
        metavar="N",
        help="GPUs the run will resume on: says what must stay constant (global batch) and what "
        "changes (shards to consolidate, per-rank RNG files)",
    )


# What tests/test_cli_vocabulary.py checks on every command that has the option.
VOCABULARY: dict[str, dict] = {
    "--format": {"dest": "format", "must_have": FORMATS, "only": POLICY_FORMATS},
    "--output": {"dest": "output", "also": "-o"},
    "--milestones": {"dest": "milestones", "types": ("milestones",)},
    "--level": {"dest": "level", "choices": ("quick", "full", "deep")},
    "--policy": {"dest": "policy", "metavar": "FILE"},
    "--no-spike-check": {"dest": "spike_check"},
    "--duration": {"dest": "duration_hours", "types": ("duration",), "metavar": "D"},
}


EVERY_COMMAND = ("--format", "--output")


_STEP_TOKEN = re.compile(r"\d[\d_]*(,\d[\d_]*)*,?")


def normalise_underscores(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """--foo_bar[=v] -> --foo-bar[=v] when only the dashed spelling is an option (and vice versa)."""
    known = parser._option_string_actions  # noqa: SLF001 - argparse has no public lookup
    out: list[str] = []
    for i, tok in enumerate(argv):
        if tok == "--":
            return out + argv[i:]
        if tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok.partition("=")
            if name not in known:
                for alt in (
                    name[:2] + name[2:].replace("_", "-"),
                    name[:2] + name[2:].replace("-", "_"),
                ):
                    if alt in known:
                        tok = alt + eq + value
                        break
        out.append(tok)
    return out


def join_milestones(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """argv with the steps after `--milestones` (`1000 5000`, `1000, 5000`) joined into the option's one value, so
    one parse reads them. The run of step words after the option gives the parser's positional arguments the
    words they lack elsewhere in argv (counted in one pass over it, from the parser's own option table) and
    --milestones the rest: `--milestones 1000 5000 100000 2 500` is two milestones and a plan's three numbers."""
    first = _milestones_value(argv)
    if first is None:
        return argv
    end = first + 1
    while end < len(argv) and _STEP_TOKEN.fullmatch(argv[end]):
        end += 1
    stop = end
    if end - first <= MAX_LIST:  # more are refused by the type anyway: joined whole, it says so
        lacking = _positional_slots(parser) - _positional_words(parser, argv, range(first, end))
        stop = max(first + 1, end - max(lacking, 0))
    if stop - first < 2:
        return argv
    return argv[:first] + [",".join(t.strip(",") for t in argv[first:stop])] + argv[stop:]


def _milestones_value(argv: list[str]) -> int | None:
    """The index of --milestones' first value word (`--milestones=1000`: that word itself), or None."""
    for i, tok in enumerate(argv):
        if tok == "--":
            return None
        if tok == "--milestones" and i + 1 < len(argv):
            return i + 1
        if tok.startswith("--milestones="):
            return i
    return None


def _positional_slots(parser: argparse.ArgumentParser) -> int:
    """How many words the parser's positional arguments take (an optional one counts: it is there to be filled)."""
    slots = 0
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list
        if not action.option_strings:
            slots += (
                action.nargs
                if isinstance(action.nargs, int)
                else 1
                if action.nargs in (None, "?")
                else MAX_LIST
            )
    return slots


_NEGATIVE = re.compile(
    r"^-\d+$|^-\d*\.\d+$"
)  # argparse's own: a word, not an option, when no option looks like it


def _positional_words(parser: argparse.ArgumentParser, argv: list[str], run: range) -> int:
    """The words of argv outside `run` that argparse gives to positional arguments (not options nor their values;
    the option just before `run` takes its values from it)."""
    known = parser._option_string_actions  # noqa: SLF001
    count, i = 0, 0
    while i < len(argv):
        if i in run:
            i = run.stop
            continue
        tok = argv[i]
        if tok == "--":
            return count + sum(1 for j in range(i + 1, len(argv)) if j not in run)
        action = known.get(tok.partition("=")[0]) if tok.startswith("-") and tok != "-" else None
        i += 1
        if action is None:
            count += not tok.startswith("-") or tok == "-" or bool(_NEGATIVE.match(tok))
        elif "=" not in tok and i not in run:
            i += _option_values(action.nargs, argv, i)
    return count


def _option_values(nargs: int | str | None, argv: list[str], i: int) -> int:
    """How many words from argv[i] on an option of this nargs takes."""
    if nargs is None:
        return 1
    if isinstance(nargs, int):
        return nargs
    words = 0
    while i + words < len(argv) and (not argv[i + words].startswith("-") or argv[i + words] == "-"):
        words += 1
        if nargs == "?":
            break
    return words


_BYTE_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?)B?\s*$", re.I)


def byte_size(text: str) -> int:
    """argparse type: '5GB' (10**9, as Hugging Face counts), '500MiB' (2**20), '1000000' -> bytes (at least 1)."""
    m = _BYTE_SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is not a size: expected e.g. 5GB, 500MB, 2GiB or a byte count"
        )
    power = "_KMGT".index(m.group(2).upper() or "_")
    value = int(float(m.group(1)) * ((1024 if m.group(3) else 1000) ** power))
    if value < 1 or value > 1 << 60:
        raise argparse.ArgumentTypeError(f"{shown(text)}: expected a size from 1 byte to 1 EiB")
    return value


def add_log_options(parser) -> None:
    parser.add_argument(
        "log",
        metavar="LOG",
        type=path_arg,
        help="trainer_state.json, CSV (W&B export too), JSON/JSON lines, TensorBoard events, "
        "or a run/checkpoint folder (newest trainer_state.json)",
    )
    g = parser.add_argument_group("log columns")
    g.add_argument(
        "--log-format",
        default="auto",
        choices=("auto", "hf", "json", "jsonl", "csv", "tensorboard"),
        help="default: from the file name and content",
    )
    g.add_argument(
        "--step-column",
        "--step-key",
        dest="step_key",
        metavar="NAME",
        help="step column/key (default: step, global_step, _step, Step, ...)",
    )
    g.add_argument(
        "--loss-column",
        "--loss-key",
        "--tag",
        dest="loss_key",
        metavar="NAME",
        help="loss column/key or TensorBoard scalar tag (default: loss, train/loss, lm loss, ...)",
    )
    g.add_argument(
        "--lr-column",
        "--lr-key",
        dest="lr_key",
        metavar="NAME",
        help="learning-rate column (optional)",
    )
    g.add_argument("--run", metavar="NAME", help="W&B CSV export with several runs: which run")
