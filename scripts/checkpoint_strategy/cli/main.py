"""Thin command-line front end: parse, call the core, render.

Each subcommand lives in its capability's package as a module with
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Only the chosen subcommand's module is imported, so start-up stays cheap.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from checkpoint_strategy import __version__
from checkpoint_strategy.cli.options import join_milestones, normalise_underscores
from checkpoint_strategy.errors import UsageError

PROG = "checkpoint-strategy"

# name -> (module, one-line help). "plan" is the default command.
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("checkpoint_strategy.cli.plan", "design a checkpointing policy (default command)"),
    "simulate": (
        "checkpoint_strategy.cli.simulate",
        "Monte Carlo check of a policy under failures and spikes",
    ),
    "tradeoffs": (
        "checkpoint_strategy.cli.tradeoffs",
        "storage vs safety sweep with a Pareto front",
    ),
    "recover": (
        "checkpoint_strategy.cli.recover",
        "after a loss spike: which checkpoint to resume from",
    ),
    "verify-resume": (
        "checkpoint_strategy.cli.verify_resume",
        "check that a resume kept optimizer state",
    ),
    "validate": (
        "checkpoint_strategy.cli.validate",
        "check checkpoints are whole, without loading them",
    ),
    "prune": (
        "checkpoint_strategy.cli.prune",
        "apply retention; delete only after a newer one validated",
    ),
    "handoff": ("checkpoint_strategy.cli.handoff", "write checkpoint metadata for session-handoff"),
    "release-gate": (
        "checkpoint_strategy.cli.release_gate",
        "release-readiness gate for one checkpoint",
    ),
    "on-event": (
        "checkpoint_strategy.cli.on_event",
        "emergency-save decision for a stability event",
    ),
    "convert": (
        "checkpoint_strategy.cli.convert",
        "convert checkpoints (torch, safetensors, DCP, ZeRO), checked tensor by tensor",
    ),
    "export": (
        "checkpoint_strategy.cli.export",
        "the plan as hf/lightning/orbax/torchtitan/megatron/deepspeed settings",
    ),
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def parse_args(self, args=None, namespace=None):
        """One parse. Underscored long options are their dashed spelling (and back); `--milestones 1000 5000`
        joins the steps that follow it but never takes a word a positional argument lacks
        (cli.options.join_milestones)."""
        argv = normalise_underscores(self, list(sys.argv[1:] if args is None else args))
        return super().parse_args(join_milestones(self, argv), namespace)


def available_commands() -> list[str]:
    """Subcommands whose module is importable (the manifest test checks these)."""
    return [name for name, (module, _help) in COMMANDS.items() if _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _top_help() -> str:
    lines = [
        f"usage: {PROG} TOTAL_STEPS STEP_SECONDS BUDGET_GB [options]",
        f"       {PROG} COMMAND [args] [--help]",
        "",
        "commands:",
    ]
    for name in available_commands():
        lines.append(f"  {name:<14} {COMMANDS[name][1]}")
    lines.append("")
    lines.append(f"Run '{PROG} COMMAND --help' for a command's options.")
    return "\n".join(lines) + "\n"


def build_parser(command: str) -> tuple[ArgumentParser, ModuleType]:
    module = importlib.import_module(COMMANDS[command][0])
    parser = ArgumentParser(
        prog=f"{PROG} {command}" if command != "plan" else PROG,
        description=COMMANDS[command][1],
        epilog="Every long option may be spelled with dashes or underscores (--keep-last, --keep_last).",
        allow_abbrev=False,
    )
    module.add_arguments(parser)
    return parser, module


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # The command's own models need no third-party pydantic plugins; looking them up scans every
    # installed distribution's entry points (about a fifth of plan's start-up). Kept if set.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    try:
        if len(args) > 1 and args[0] == "help":  # help COMMAND = COMMAND --help
            args = [_command(args[1:]), "--help"]
        if args and args[0] in ("-h", "--help", "help"):
            sys.stdout.write(_top_help())
            return 0
        if args and args[0] == "--version":
            sys.stdout.write(f"{PROG} {__version__}\n")
            return 0
        command = _command(args)
        if args and command == args[0]:
            args = args[1:]
        parser, module = build_parser(command)
        namespace = parser.parse_args(args)
        return _run(module, namespace)
    except UsageError as exc:
        _err(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except ModuleNotFoundError as exc:
        line = missing_dependencies_line(exc)
        if line is None:
            _err(f"internal error (ModuleNotFoundError: {exc}); please report it")
            return 3
        _err(line)
        return 2
    except SystemExit as exc:  # argparse --help
        return int(exc.code or 0) if isinstance(exc.code, int) else 0
    except Exception as exc:  # noqa: BLE001 - never a traceback for users
        _err(f"internal error ({type(exc).__name__}: {exc}); please report it")
        return 3


def _run(module: ModuleType, namespace: argparse.Namespace) -> int:
    options = getattr(
        namespace, "storage_options", None
    )  # --storage-option KEY=VALUE (object-storage paths)
    if (
        options or "checkpoint_strategy.storage.remote" in sys.modules
    ):  # never left over from an earlier call
        from checkpoint_strategy.storage import remote

        remote.set_options(options)
    return int(module.run(namespace))


def _command(args: list[str]) -> str:
    """The command the first word names; plan when it is a number or an option. A word that is
    neither is a mistyped command: one line naming the closest command, exit 2."""
    if not args or args[0] in COMMANDS:
        return args[0] if args else "plan"
    word = args[0]
    if word.startswith("-") or _is_number(word) or _RUN_LENGTH.match(word):
        return "plan"

    close = difflib.get_close_matches(word, list(COMMANDS), n=1, cutoff=0.6)
    if close:
        raise UsageError(f"unknown command {word!r}; did you mean {close[0]!r}?")
    raise UsageError(
        f"unknown command {word!r}; expected one of {', '.join(COMMANDS)}, or TOTAL_STEPS "
        "STEP_SECONDS BUDGET_GB for a plan"
    )


# a plan's run length in place of TOTAL_STEPS ("3w", "21d"; cli/planoptions.py checks it)
_RUN_LENGTH = re.compile(
    r"^[0-9]*\.?[0-9]+\s*(w|wk|weeks?|d|days?|h|hr|hours?|min|minutes?)$", re.I
)


def _is_number(word: str) -> bool:
    try:
        float(word.replace("_", ""))
    except ValueError:
        return False
    return True


ERROR_PREFIX = f"{PROG}: error: "


# import name -> requirement, as in pyproject.toml's dependencies (numpy: `simulate` only)
DEPENDENCIES: dict[str, str] = {
    "pydantic": "pydantic>=2.6",
    "yaml": "pyyaml>=6.0",
    "jinja2": "jinja2>=3.1",
    "jsonschema": "jsonschema>=4.18",
    "numpy": "numpy>=1.24",
}


def missing_dependencies_line(exc: ModuleNotFoundError | None = None) -> str | None:
    """One line naming every missing dependency and the install command; None when the missing
    module is not one of ours (a real bug)."""
    name = ((exc.name if exc is not None else None) or "").split(".")[0]
    missing = [mod for mod in DEPENDENCIES if not _importable(mod)]
    if exc is not None and name not in DEPENDENCIES:
        return None
    if not missing:
        missing = [name]
    reqs = " ".join(f"'{DEPENDENCIES[m]}'" for m in missing)
    names = ", ".join("pyyaml" if m == "yaml" else m for m in missing)
    return (
        f"missing Python packages for {sys.executable}: {names}; install them with: "
        f"{sys.executable} -m pip install {reqs} (or pip install the checkpoint-strategy package)"
    )


def _err(message: str) -> None:
    """Every error the user sees: one line, one prefix."""
    line = " ".join(message.split())
    if not line.startswith(ERROR_PREFIX):
        line = ERROR_PREFIX + line
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
