"""Benchmark: `validate --level quick` and a `prune` dry run on trees of HF-Trainer-shaped checkpoints
(9 files each: one safetensors file, its index, optimizer/scheduler/rng/args torch zip archives, three JSON
files), against an `os.walk` + `os.stat` of the same tree, at 500, 1000 and 2000 checkpoints (linear?).

Measured in process (the checks alone) and as the command (a fresh `python -m checkpoint_strategy`:
start-up included), by wall time and by CPU time (user + sys; steadier on a shared machine); the least
of --repeat runs each. Target (issue 30): at most 5x the walk at 2000 checkpoints, linear.

    python bench/bench_walk.py [--sizes 500,1000,2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_validate import build_tree, stat_walk  # noqa: E402

from checkpoint_strategy.checkpoints import prune, validate_paths  # noqa: E402
from bench_recover import least as _least  # noqa: E402  (bench/ is on sys.path when run as a script)


def _least_cli(argv: list[str], repeat: int) -> tuple[float, float]:
    """(least wall, least CPU) seconds of a fresh `python -m checkpoint_strategy ARGV` (the child's user+sys)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        w = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "checkpoint_strategy", *argv], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        walls.append(time.perf_counter() - w)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"{argv[0]} failed (rc {proc.returncode}): {proc.stderr.strip()[-300:]}")
    return min(walls), min(cpus)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="500,1000,2000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f} (2-core machine shared with other jobs)")
    print("ratios against an os.walk + os.stat of the same tree, least of "
          f"{args.repeat} runs; wall / CPU (user+sys)")
    ok = True
    tmp = Path(tempfile.mkdtemp(prefix="bench-walk-"))
    try:
        for n in sizes:
            tree = tmp / f"tree{n}"
            tree.mkdir()
            files = build_tree(tree, n, shards=1)
            stat_walk(tree)  # warm the dentry/inode cache for every measurement
            walk = _least(lambda t=tree: stat_walk(t), args.repeat)

            def quick(t=tree, n=n):
                r = validate_paths([str(t)], level="quick", progress=False)
                assert r.summary.valid == n, r.summary

            def dry(t=tree, n=n):
                r = prune(t, keep_last=1, spike_check=False)
                assert len(r.keep) + len(r.delete) == n and not r.applied, (len(r.keep), len(r.delete))

            rows = [("validate --level quick (in process)", _least(quick, args.repeat)),
                    ("prune dry run (in process)", _least(dry, args.repeat)),
                    ("validate --level quick (command)",
                     _least_cli(["validate", str(tree), "--level", "quick"], args.repeat)),
                    ("prune --keep-last 1 dry run (command)",
                     _least_cli(["prune", str(tree), "--keep-last", "1", "--no-spike-check"], args.repeat))]
            print(f"{n} checkpoints, {files} files: walk {walk[0] * 1000:.0f} ms wall, {walk[1] * 1000:.0f} ms CPU")
            for name, (w, c) in rows:
                print(f"  {name:40s} {w * 1000:6.0f} ms wall = {w / walk[0]:5.1f}x, {c * 1000:6.0f} ms CPU = "
                      f"{c / walk[1]:5.1f}x; {w / n * 1000:.2f} ms wall per checkpoint")
                if n == max(sizes) and "command" in name:
                    ok &= c / walk[1] <= 5.0
            shutil.rmtree(tree)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
