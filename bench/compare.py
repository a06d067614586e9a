"""Before and after, interleaved: run one bench script from two checkouts in alternating rounds (A B A B ...) and
print, for every line of its output that carries numbers, the least of each number over the rounds on each side
and after/before.

    python bench/compare.py BEFORE_CHECKOUT AFTER_CHECKOUT --rounds 3 -- bench_walk.py --sizes 2000 --repeat 3

Each side runs its own copy of the script (`CHECKOUT/bench/SCRIPT`), which puts that checkout's `scripts/` first
on its path: the two package layouts may differ (module names moved), the bench measures the same thing. Lines
are matched by their text with the numbers taken out; a line whose text differs between the sides (a renamed
row) is printed once per side. The least over rounds is the figure (a shared machine only ever adds time).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def run(checkout: str, script: str, args: list[str]) -> str:
    path = os.path.join(checkout, "bench", script)
    env = {**os.environ, "PYTHONPATH": os.path.join(checkout, "scripts")}
    out = subprocess.run(
        [sys.executable, path, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=checkout,
        check=False,
    )
    if out.returncode != 0 and not out.stdout.strip():
        sys.exit(f"{path} exited {out.returncode}: {out.stderr.strip().splitlines()[-3:]}")
    if (
        out.returncode != 0
    ):  # a bench that judges its own target exits 1 when it misses it: its figures still count
        print(f"({path} exited {out.returncode})", file=sys.stderr)
    return out.stdout


def rows(text: str) -> dict[str, list[float]]:
    """label (the line with each number replaced by '#') -> its numbers, for lines that carry numbers."""
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        numbers = [float(n) for n in NUMBER.findall(line)]
        if numbers:
            found.setdefault(
                " ".join(NUMBER.sub("#", line).split()), numbers
            )  # column widths may differ
    return found


def least(runs: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in runs:
        for label, nums in r.items():
            prev = out.get(label)
            out[label] = (
                nums
                if prev is None or len(prev) != len(nums)
                else [min(a, b) for a, b in zip(prev, nums, strict=True)]
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    sides: dict[str, list[dict[str, list[float]]]] = {"before": [], "after": []}
    for i in range(a.rounds):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for side in order:
            sides[side].append(rows(run(getattr(a, side), a.script, a.args)))
    before, after = least(sides["before"]), least(sides["after"])
    print(
        f"{a.script} {' '.join(a.args)}: least of {a.rounds} interleaved rounds; before {a.before}, after {a.after}"
    )
    for label in list(dict.fromkeys([*before, *after])):
        b, f = before.get(label), after.get(label)
        if b and f and len(b) == len(f):
            ratios = " ".join(f"{y / x:.2f}" if x else "-" for x, y in zip(b, f, strict=True))
            print(f"{label}\n    before {b}\n    after  {f}\n    after/before {ratios}")
        else:
            print(f"{label}\n    {'before' if b else 'after'} only: {b or f}")


if __name__ == "__main__":
    main()
