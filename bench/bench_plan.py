"""Cold start of the default plan command against `python3 -c pass`, in the same run.

    python bench/bench_plan.py [--repeat 15]

Prints the median wall time of each command over interleaved repeats and the ratios.
Target (issue 2): plan / bare interpreter <= 3x. The dependency-import line shows how much
of that is pydantic + jinja2 + jsonschema + yaml rather than this project's own code.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN = [sys.executable, str(ROOT / "scripts" / "checkpoint-strategy"), "100000", "2.5", "500", "--model_size_gb", "4"]
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    # what the plan path needs from its dependencies (pydantic imports BaseModel lazily)
    "import deps": [sys.executable, "-c", "from pydantic import BaseModel, ConfigDict, Field; import jinja2, jsonschema"],
    "plan (text)": PLAN,
    "plan (json)": PLAN + ["--format", "json"],
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    n = ap.parse_args().repeat
    times: dict[str, list[float]] = {k: [] for k in COMMANDS}
    for cmd in COMMANDS.values():  # warm the page cache and .pyc files
        subprocess.run(cmd, capture_output=True, check=True)
    for _ in range(n):
        for name, cmd in COMMANDS.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["python -c pass"])
    deps = statistics.median(times["import deps"])
    print(f"{'command':<16} {'median ms':>10} {'x python':>9} {'x deps':>7}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<16} {med * 1000:>10.1f} {med / base:>9.2f} {med / deps:>7.2f}")
    ratio = statistics.median(times["plan (text)"]) / base
    print(f"plan / python -c pass = {ratio:.2f}x (target <= 3x): {'OK' if ratio <= 3 else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
