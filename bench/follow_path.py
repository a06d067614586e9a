"""Follow a command's LOG path through the package: which modules it crosses, in call order (not CI).

Usage: python bench/follow_path.py recover LOG [options...]     (run where LOG's relative path means it)

It runs the command in process with a profiler and lists every package function that receives the log path (as
given, made absolute) or a package object holding it up to two levels down (the LogSeries, the report and its
`log`), called from a function that held it too (a chain from `cli.main`). The containers of every argument (argv,
the argparse namespace) are followed only on the way from `cli` into the command's `run`: a helper handed the whole
namespace for its own options is not following the log. Consecutive calls in one module are one hop. It prints the
hops, the distinct modules, the returns to `recovery.advice`, and the modules without the I/O layers every command
crosses the same way to read and print (`storage`, `render`). docs/DEVELOPING.md ("Following a path") keeps the
counts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

PACKAGE = "checkpoint_strategy"
IO_LAYERS = ("storage", "render")


def follow(argv: list[str]) -> tuple[int, list[tuple[str, str]]]:
    """(exit code, [(module, first function) per hop]) of `checkpoint-strategy *argv`; argv[1] is the log."""
    argv = list(argv)
    argv[1] = os.path.abspath(argv[1])
    log = argv[1]

    def holds(v: object, depth: int = 0, containers: bool = False) -> bool:
        if isinstance(v, (str, os.PathLike)):
            s = os.fspath(v)
            return isinstance(s, str) and os.path.abspath(s) == log
        if depth >= 2:
            return False
        if (containers and isinstance(v, argparse.Namespace)) or (
            type(v).__module__.startswith(PACKAGE) and hasattr(v, "__dict__")
        ):
            return any(holds(x, depth + 1) for x in vars(v).values())
        if containers and isinstance(v, (list, tuple)) and depth == 0:
            return any(holds(x, depth + 1) for x in v[:4])
        return False

    hops: list[tuple[str, str]] = []
    custody: set[int] = set()

    def profile(frame, event, arg) -> None:
        mod = frame.f_globals.get("__name__", "")
        if event != "call" or not mod.startswith(PACKAGE):
            return
        code, caller = frame.f_code, frame.f_back
        entry = caller is not None and not caller.f_globals.get("__name__", "").startswith(PACKAGE)
        containers = mod == f"{PACKAGE}.cli.main" or (
            code.co_name == "run" and mod.startswith(f"{PACKAGE}.cli.")
        )
        params = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if (entry or id(caller) in custody) and any(
            holds(frame.f_locals.get(a), 0, containers) for a in params
        ):
            custody.add(id(frame))
            name = mod.removeprefix(PACKAGE + ".")
            if not hops or hops[-1][0] != name:
                hops.append((name, code.co_name))

    from checkpoint_strategy.cli.main import main

    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
    finally:
        sys.setprofile(None)
    return rc, hops


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__.split("\n\n")[1])
        return 2
    rc, hops = follow(sys.argv[1:])
    mods = [m for m, _ in hops]
    own = sorted({m for m in mods if m.split(".")[0] not in IO_LAYERS})
    print(f"exit code {rc}")
    print(" -> ".join(f"{m}.{f}" for m, f in hops))
    print(
        f"{len(hops)} hops, {len(set(mods))} modules, {max(0, mods.count('recovery.advice') - 1)} returns to "
        f"recovery.advice"
    )
    print(f"without {', '.join(IO_LAYERS)}: {len(own)} modules: {', '.join(own)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
