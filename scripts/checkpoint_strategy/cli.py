"""Thin command-line front end: parse, call the core, render.

Each subcommand lives in its capability's package as a module with
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Only the chosen subcommand's module is imported, so start-up stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import Sequence

from checkpoint_strategy import __version__
from checkpoint_strategy.errors import UsageError

PROG = "checkpoint-strategy"

# name -> (module, one-line help). "plan" is the default command.
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("checkpoint_strategy.planning.cli", "design a checkpointing policy (default command)"),
    "simulate": ("checkpoint_strategy.simulation.cli", "Monte Carlo check of a policy under failures and spikes"),
    "tradeoffs": ("checkpoint_strategy.simulation.tradeoffs_cli", "storage vs safety sweep with a Pareto front"),
    "recover": ("checkpoint_strategy.recovery.cli", "after a loss spike: which checkpoint to resume from"),
    "verify-resume": ("checkpoint_strategy.recovery.verify_cli", "check that a resume kept optimizer state"),
    "validate": ("checkpoint_strategy.checkpoints.validate_cli", "check checkpoints are whole, without loading them"),
    "prune": ("checkpoint_strategy.checkpoints.prune_cli", "apply retention; delete only after a newer one validated"),
    "handoff": ("checkpoint_strategy.integrations.handoff_cli", "write checkpoint metadata for session-handoff"),
    "release-gate": ("checkpoint_strategy.integrations.release_cli", "release-readiness gate for one checkpoint"),
    "on-event": ("checkpoint_strategy.integrations.event_cli", "emergency-save decision for a stability event"),
    "export": ("checkpoint_strategy.export.cli", "the plan as hf/lightning/orbax/torchtitan/megatron/deepspeed settings"),
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2) instead of printing usage."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: error: {message}")


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


def build_parser(command: str) -> tuple[ArgumentParser, object]:
    module = importlib.import_module(COMMANDS[command][0])
    parser = ArgumentParser(
        prog=f"{PROG} {command}" if command != "plan" else PROG,
        description=COMMANDS[command][1],
        allow_abbrev=False,
    )
    module.add_arguments(parser)
    return parser, module


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in ("-h", "--help", "help"):
            sys.stdout.write(_top_help())
            return 0
        if args and args[0] == "--version":
            sys.stdout.write(f"{PROG} {__version__}\n")
            return 0
        command = args[0] if args else "plan"
        if args and command in COMMANDS:
            args = args[1:]
        else:
            command = "plan"
        parser, module = build_parser(command)
        namespace = parser.parse_args(args)
        return int(module.run(namespace))
    except UsageError as exc:
        _err(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except SystemExit as exc:  # argparse --help
        return int(exc.code or 0) if isinstance(exc.code, int) else 0
    except Exception as exc:  # noqa: BLE001 - never a traceback for users
        _err(f"internal error ({type(exc).__name__}: {exc}); please report it")
        return 3


def _err(message: str) -> None:
    line = " ".join(message.split())
    if not line.startswith(PROG):
        line = f"{PROG}: error: {line}"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
