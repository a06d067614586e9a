"""Benchmark: `recover` analysis of a 1 000 000-entry trainer_state.json vs a bare json.load.

Prints both times and their ratio (target: at most 2x), measured in the same run.
Usage: python bench/bench_recover.py [--entries N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import numpy as np  # noqa: E402

from checkpoint_strategy.recovery import advise  # noqa: E402


def build(path: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(1, n + 1)
    loss = (2.0 + 3.0 * np.exp(-t / 20000)) * (1 + 0.03 * rng.standard_normal(n))
    loss[n - 5000:] *= 4  # a spike near the end that has not recovered
    gn = 0.5 + 0.05 * rng.standard_normal(n)
    lr = np.minimum(t / 2000, 1.0) * 3e-4
    hist = [{"epoch": round(float(i) / 5000, 4), "grad_norm": float(g), "learning_rate": float(l),
             "loss": float(x), "step": int(i)} for i, x, g, l in zip(t, loss, gn, lr, strict=True)]
    path.write_text(json.dumps({"global_step": n, "log_history": hist}, indent=2))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trainer_state.json"
        build(path, args.entries)
        size = os.path.getsize(path) / 1e6
        ckpts = list(range(1000, args.entries + 1, 1000))

        def bare():
            with open(path, "rb") as fh:
                json.load(fh)

        def analyse():
            report = advise(path, ckpts)
            assert report.status == "rollback", report.summary

        base = best(bare, args.repeat)
        ours = best(analyse, args.repeat)
    print(f"trainer_state.json: {args.entries} entries, {size:.0f} MB")
    print(f"json.load:          {base:.3f} s")
    print(f"recover analysis:   {ours:.3f} s")
    print(f"ratio:              {ours / base:.2f}x (target <= 2x)")
    return 0 if ours / base <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
