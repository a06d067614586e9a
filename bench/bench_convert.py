"""Benchmark `convert` (run: python bench/bench_convert.py [--gb 2] [--repeat 3]).

A torch.save checkpoint of `--gb` GB (float32 tensors of 16-256 MB, as a 0.5B-parameter model) is
converted to safetensors (and to a full archive and to DCP from its safetensors), each in a fresh
process, against baselines measured in the same run on a warm page cache:

- ``cat SRC > OUT`` then ``sync OUT`` (the same bytes copied and made durable: convert fsyncs what it
  writes) and plain ``cat SRC > OUT`` (no fsync);
- what a user runs today: ``torch.load(SRC, weights_only=True)`` + ``safetensors.torch.save_file``.

Figures: wall time and CPU time (user + sys; steadier on a shared machine), least of --repeat runs, the
ratio to ``cat + sync`` (target <= 1.5x warm: convert reads each byte once, sha256-hashes and writes it, then
reads source and destination back and compares them with memcmp for the check), and the peak RSS of each
process (os.wait4): convert streams through two 8 MB buffers, so its peak must not grow with the
checkpoint; torch.load holds the whole state dict. Prints `uptime` (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))

TORCH_WAY = """
import sys, torch
from safetensors.torch import save_file
sd = torch.load(sys.argv[1], weights_only=True)
save_file(sd, sys.argv[2])
"""


BUILD = """
import sys, torch
sizes = [256, 128, 64, 32, 16]   # MB per tensor, cycled
total, i, sd, made = int(float(sys.argv[2]) * 1e9), 0, {}, 0
while made < total:
    n = min(sizes[i % len(sizes)] << 20, total - made) // 4
    sd[f"model.layers.{i}.weight"] = torch.full((n,), float(i), dtype=torch.float32)
    made += n * 4
    i += 1
torch.save(sd, sys.argv[1])
print(made)
"""


def build(path: Path, gb: float) -> int:
    """In a child process, so this one stays small (a child's peak RSS starts from its parent's at fork)."""
    out = subprocess.run(
        [sys.executable, "-c", BUILD, str(path), str(gb)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


CPU: dict[str, float] = {}


def run(cmd: list[str], shell: bool = False) -> tuple[float, int]:
    """(wall seconds, peak RSS in MB) of one process; its CPU seconds (user + sys) kept in CPU[label]."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd if not shell else ["/bin/sh", "-c", cmd[0]],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    CPU["last"] = usage.ru_utime + usage.ru_stime
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(
            f"failed: {cmd}: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}"
        )
    return wall, usage.ru_maxrss // 1024


def best(label: str, make, clean, repeat: int) -> tuple[float, int]:
    times, cpus, rss = [], [], 0
    for _ in range(repeat):
        clean()
        os.sync()  # no writeback of an earlier run's pages inside this one
        wall, peak = make()
        times.append(wall)
        cpus.append(CPU["last"])
        rss = max(rss, peak)
    clean()
    CPU[label] = min(cpus)
    print(
        f"  {label:<44} {min(times):7.2f} s  (runs {', '.join(f'{t:.2f}' for t in times)})  CPU {min(cpus):6.2f} s"
        f"  peak RSS {rss} MB",
        flush=True,
    )
    return min(times), rss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    tmp = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=os.environ.get("BENCH_DIR")))
    try:
        src = tmp / "pytorch_model.bin"
        nbytes = build(src, args.gb)
        print(f"checkpoint: {src.stat().st_size / 1e9:.2f} GB ({nbytes / 1e9:.2f} GB of tensors)")
        subprocess.run(
            ["cat", str(src)], stdout=subprocess.DEVNULL, check=True
        )  # warm the page cache
        out = tmp / "out"

        def clean() -> None:
            for p in (
                out,
                tmp / "cat.bin",
                tmp / "torch.safetensors",
                tmp / "full.pt",
                tmp / "dcp",
            ):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

        cli = [sys.executable, "-m", "checkpoint_strategy", "convert"]
        cat_sync, _ = best(
            "cat SRC > OUT; sync OUT",
            lambda: run([f"cat {src} > {tmp / 'cat.bin'} && sync {tmp / 'cat.bin'}"], shell=True),
            clean,
            args.repeat,
        )
        cat, _ = best(
            "cat SRC > OUT (no fsync)",
            lambda: run([f"cat {src} > {tmp / 'cat.bin'}"], shell=True),
            clean,
            args.repeat,
        )
        conv, conv_rss = best(
            "convert --to safetensors (with the check)",
            lambda: run([*cli, str(src), str(out), "--to", "safetensors"]),
            clean,
            args.repeat,
        )
        torch_way, torch_rss = best(
            "torch.load + safetensors save_file",
            lambda: run(
                [sys.executable, "-c", TORCH_WAY, str(src), str(tmp / "torch.safetensors")]
            ),
            clean,
            args.repeat,
        )
        print(
            f"wall: convert / (cat + sync): {conv / cat_sync:.2f}x   convert / cat: {conv / cat:.2f}x   "
            f"convert / torch way: {conv / torch_way:.2f}x"
        )
        c_conv, c_cat = (
            CPU["convert --to safetensors (with the check)"],
            CPU["cat SRC > OUT; sync OUT"],
        )
        print(
            f"CPU:  convert / (cat + sync): {c_conv / c_cat:.2f}x   convert / torch way: "
            f"{c_conv / CPU['torch.load + safetensors save_file']:.2f}x"
        )
        print(
            f"peak RSS: convert {conv_rss} MB, torch way {torch_rss} MB (checkpoint {nbytes >> 20} MB)"
        )
        subprocess.run(
            [*cli, str(src), str(out), "--to", "safetensors"],
            env=ENV,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        st = out / "model.safetensors"
        for target, dst in (("full", tmp / "full.pt"), ("dcp", tmp / "dcp")):

            def clean_one(dst=dst) -> None:
                shutil.rmtree(dst, ignore_errors=True) if dst.is_dir() else dst.unlink(
                    missing_ok=True
                )

            t, r = best(
                f"convert safetensors --to {target}",
                lambda target=target, dst=dst: run([*cli, str(st), str(dst), "--to", target]),
                clean_one,
                args.repeat,
            )
            print(f"  -> {t / cat_sync:.2f}x cat + sync, peak RSS {r} MB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
