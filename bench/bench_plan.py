"""Cold start of the default plan command against its own dependencies, in the same run.

    python bench/bench_plan.py [--repeat 15]

Prints the least wall and CPU time of each command over interleaved repeats and the ratios (the least: on a
shared machine the median moves with the load, docs/DEVELOPING.md "Benchmarks").
Target: plan / importing its dependencies (pydantic's BaseModel, jinja2, jsonschema, yaml) <= 1.25x (issue 10:
the project's own share - model building, template compile, argument checks - stays small). plan / bare
interpreter is printed beside the floor the dependencies set: issue 2's 3x is not reachable where importing
them alone takes more than 3x a bare interpreter (4-5x on the 2-core machine of 2026-12-06), so it is
reported, not judged. The first plan run fills the compiled-template cache (~/.cache/checkpoint-strategy), as
any user's first run does.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN = [
    sys.executable,
    str(ROOT / "scripts" / "checkpoint-strategy"),
    "100000",
    "2.5",
    "500",
    "--model-size-gb",
    "4",
]
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    # what the plan path needs from its dependencies (issue 10's baseline)
    "import deps": [
        sys.executable,
        "-c",
        "from pydantic import BaseModel; import jinja2, jsonschema, yaml",
    ],
    "plan (text)": PLAN,
    "plan (json)": PLAN + ["--format", "json"],
}


# As users run it: with .pyc files (a PYTHONDONTWRITEBYTECODE=1 in the environment would make every
# run compile this package from source while the dependencies keep their installed bytecode).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    n = ap.parse_args().repeat
    times: dict[str, list[float]] = {k: [] for k in COMMANDS}
    cpu: dict[str, list[float]] = {k: [] for k in COMMANDS}  # user+sys: steadier on a busy machine
    for cmd in COMMANDS.values():  # warm the page cache and .pyc files
        subprocess.run(cmd, capture_output=True, check=True, env=ENV)
    for _ in range(n):
        for name, cmd in COMMANDS.items():
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True, env=ENV)
            times[name].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    base, deps = min(times["python -c pass"]), min(times["import deps"])
    print(f"{'command':<16} {'least ms':>10} {'x python':>9} {'x deps':>7}")
    for name, ts in times.items():
        print(f"{name:<16} {min(ts) * 1000:>10.1f} {min(ts) / base:>9.2f} {min(ts) / deps:>7.2f}")
    ratio, floor = min(times["plan (text)"]) / base, deps / base
    print(
        f"plan / python -c pass = {ratio:.2f}x; importing the dependencies alone is {floor:.2f}x"
        + (
            ": issue 2's 3x is below that floor here (reported, not judged)"
            if floor > 3
            else f" (issue 2's target <= 3x: {'OK' if ratio <= 3 else 'OVER'})"
        )
    )
    for label, table in (("wall", times), ("CPU", cpu)):
        ratio = min(table["plan (text)"]) / min(table["import deps"])
        print(
            f"plan / import deps = {ratio:.2f}x {label} (target <= 1.25x): {'OK' if ratio <= 1.25 else 'OVER'}"
        )
    print(f"{'command':<16} {'least CPU ms':>13} {'x deps':>7}")
    cdeps = min(cpu["import deps"])
    for name, ts in cpu.items():
        print(f"{name:<16} {min(ts) * 1000:>13.1f} {min(ts) / cdeps:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
