"""Benchmark: `recover` on a big trainer_state.json and a big JSON lines log.

Time: the full analysis (read + detect + advice) of a 1 000 000-entry trainer_state.json against a
bare ``json.load`` of the same file, measured in the same run (target: at most 2x).
Memory: peak RSS of a fresh process running the analysis, against the file size (targets: at most
2x the file for a JSON document; for JSON lines, the growth per extra line at most 128 bytes: only
the numeric series and the analysis arrays, never the parsed records), and the peak RSS of a fresh
process that only imports the package and numpy (the floor).
Usage: python bench/bench_recover.py [--entries N] [--lines N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

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


def build_jsonl(path: Path, n: int) -> None:
    rng = np.random.default_rng(1)
    with open(path, "w") as fh:
        for start in range(0, n, 100_000):
            k = min(100_000, n - start)
            loss = 2.0 * (1 + 0.02 * rng.standard_normal(k))
            fh.write("".join(f'{{"step": {start + i + 1}, "loss": {v:.5f}}}\n' for i, v in enumerate(loss)))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def peak_rss_mb(code: str) -> float:
    """Peak RSS (MB) of a fresh interpreter running `code`: its VmHWM, reset first through
    /proc/self/clear_refs (a forked child starts with its parent's peak)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))
    wrapped = ("open('/proc/self/clear_refs', 'w').write('5')\n" + code +
               "\nprint(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))")
    out = subprocess.run([sys.executable, "-c", wrapped], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child failed: {out.stderr.strip()[-300:]}")
    return int(out.stdout.split()[-1]) / 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    ok = True
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
        floor = peak_rss_mb("import checkpoint_strategy.recovery.advice, numpy")
        rss_load = peak_rss_mb(f"import json; json.load(open({str(path)!r}, 'rb'))")
        rss_ours = peak_rss_mb(f"from checkpoint_strategy.recovery import advise; advise({str(path)!r}, [])")
        print(f"trainer_state.json: {args.entries} entries, {size:.0f} MB")
        print(f"  json.load:          {base:.3f} s, peak RSS {rss_load:.0f} MB")
        print(f"  recover analysis:   {ours:.3f} s, peak RSS {rss_ours:.0f} MB (import floor {floor:.0f} MB)")
        print(f"  time ratio:         {ours / base:.2f}x json.load (target <= 2x)")
        print(f"  memory ratio:       {rss_ours / size:.2f}x the file (target <= 2x)")
        ok &= ours / base <= 2.0 and rss_ours / size <= 2.0
        os.unlink(path)

        jl = Path(d) / "train.jsonl"
        build_jsonl(jl, args.lines)
        jsize = os.path.getsize(jl) / 1e6
        half = Path(d) / "half.jsonl"
        with open(jl, "rb") as src, open(half, "wb") as dst:
            for i, line in enumerate(src):
                if i >= args.lines // 2:
                    break
                dst.write(line)
        rss_half = peak_rss_mb(f"from checkpoint_strategy.recovery import advise; advise({str(half)!r}, [])")
        rss_full = peak_rss_mb(f"from checkpoint_strategy.recovery import advise; advise({str(jl)!r}, [])")
        print(f"JSON lines: {args.lines} lines, {jsize:.0f} MB")
        print(f"  peak RSS:           {rss_half:.0f} MB at half the lines, {rss_full:.0f} MB at all of them "
              f"(import floor {floor:.0f} MB; the numeric series are 16 bytes a line)")
        per_line = (rss_full - rss_half) * 1024 * 1024 / (args.lines - args.lines // 2)
        print(f"  memory ratio:       {rss_full / jsize:.2f}x the file; {per_line:.0f} bytes per extra line "
              "(the kept series and the analysis arrays; target <= 128)")
        ok &= per_line <= 128
        ev = Path(d) / "events.jsonl"
        n_ev = min(args.lines, 700_000)  # ~57 MB: under on-event's 64 MB input cap
        with open(ev, "w") as fh:
            fh.write("".join(f'{{"event": "GRADIENT_NORM_EXCEEDED", "step": {i}, "value": 9, "threshold": 10}}\n'
                             for i in range(n_ev)))
        esize = os.path.getsize(ev) / 1e6
        rss_ev = peak_rss_mb("from checkpoint_strategy.cli import main; import contextlib, io\n"
                             f"with contextlib.redirect_stdout(io.StringIO()): rc = main(['on-event', {str(ev)!r}])\n"
                             "assert rc == 0, rc")
        print(f"on-event: {n_ev} event lines, {esize:.0f} MB: peak RSS {rss_ev:.0f} MB "
              f"({rss_ev / esize:.2f}x the file; target <= 3x: the text and one decision at a time)")
        ok &= rss_ev / esize <= 3
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
