"""Peak memory of the hostile-file worst cases of issue 9 (run: python bench/bench_io_memory.py [--gb N]).

Each case runs `checkpoint-strategy validate ...` (both levels where they differ) in its own child
process; the child's peak RSS (ru_maxrss from wait4) is reported in MB, as a ratio to the baseline
measured in the same run (the same command on a small valid safetensors file: interpreter +
imports; VmHWM of the child, read when it exits), and against the absolute target of 200 MB. Nothing is timed.

Cases (the files are built here; sizes before the fix in parentheses, from the issue):
  zip bomb      a ~3 MB .ckpt whose data.pkl inflates to N GB, sizes declared honestly
                (3 GB: "valid after 21 s at 6.3 GB RSS")
  zip bomb lie  the same data, the entry declaring 1000 bytes
  zip64 sparse  a sparse N GB file whose zip64 end record declares a 2 GB central directory
                ("allocates 2 GB")
  /dev/zero     a DCP .metadata that is a symlink to /dev/zero ("exhausts memory")
  sparse meta   a DCP .metadata that is a 10 GB sparse file
  opcode soup   a 63 MB .metadata of 22M memoized BININT1 opcodes (1.6 GB RSS and 98 s before the
                bounded walk; still ~100 s: Python's pickletools walks ~4 µs per opcode)
  FIFO          a FIFO named trainer_state.json (hung forever before)
  deep JSON     a 60 MB trainer_state.json of '[' (just under the 64 MB JSON cap)
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MB = 200


# The child reports its own VmHWM (peak RSS of its address space, reset at exec) when the command
# ends: ru_maxrss of a child would include the parent's RSS at fork time on Linux.
_CHILD = """
import atexit, os, sys
def _hwm():
    with open("/proc/self/status") as fh:
        kb = next(int(l.split()[1]) for l in fh if l.startswith("VmHWM:"))
    with open(os.environ["CS_HWM_FILE"], "w") as out:
        out.write(str(kb))
atexit.register(_hwm)
from checkpoint_strategy.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def peak_rss_mb(argv: list[str]) -> tuple[float, int]:
    with tempfile.NamedTemporaryFile("r", suffix=".hwm") as hwm:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts"), "CS_HWM_FILE": hwm.name}
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            timeout=600,
        )
        return int(open(hwm.name).read()) / 1024, proc.returncode


def zip_bomb(path: Path, inflated: int, declared: int | None = None) -> None:
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = b"\0" * (16 << 20)
    parts, crc, left = [], 0, inflated
    while left:
        c = chunk[: min(left, len(chunk))]
        parts.append(co.compress(c))
        crc = zlib.crc32(c, crc)
        left -= len(c)
    parts.append(co.flush())
    data = b"".join(parts)
    usize = min(inflated if declared is None else declared, 0xFFFFFFFF)
    name = b"archive/data.pkl"
    lh = (
        struct.pack(
            "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, len(data), usize, len(name), 0
        )
        + name
    )
    cd = (
        struct.pack(
            "<4sHHHHHHIIIHHHHHII",
            b"PK\x01\x02",
            20,
            20,
            0,
            8,
            0,
            0,
            crc,
            len(data),
            usize,
            len(name),
            0,
            0,
            0,
            0,
            0,
            0,
        )
        + name
    )
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(cd), len(lh) + len(data), 0)
    path.write_bytes(lh + data + cd + eocd)


def zip64_sparse(path: Path, size: int) -> None:
    eocd64_at = size - 22 - 20 - 56
    rec = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, 2 << 30, 1 << 20)
    loc = struct.pack("<4sIQI", b"PK\x06\x07", 0, eocd64_at, 1)
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    with open(path, "wb") as fh:
        fh.truncate(eocd64_at)
        fh.seek(eocd64_at)
        fh.write(rec + loc + eocd)


def small_safetensors(path: Path) -> None:
    import json

    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--gb",
        type=float,
        default=3.0,
        help="inflated size of the zip bomb / sparse file (default 3)",
    )
    args = ap.parse_args()
    n = int(args.gb * (1 << 30))
    with tempfile.TemporaryDirectory() as d:
        t = Path(d)
        small_safetensors(t / "model.safetensors")
        zip_bomb(t / "bomb.ckpt", n)
        zip_bomb(t / "bomb-lie.ckpt", n, declared=1000)
        zip64_sparse(t / "sparse.pt", max(n, 3 << 30))
        for name, target in (("zero", "/dev/zero"), ("sparse", None)):
            step = t / f"dcp-{name}" / "step-1"
            step.mkdir(parents=True)
            (step / "__0_0.distcp").write_bytes(b"\0" * 16)
            if target:
                (step / ".metadata").symlink_to(target)
            else:
                with open(step / ".metadata", "wb") as fh:
                    fh.truncate(10 << 30)
        soup = t / "dcp-soup" / "step-1"  # 63 MB of tiny memoized opcodes (22M), one relative_path
        soup.mkdir(parents=True)
        (soup / "__0_0.distcp").write_bytes(b"\0" * 16)
        n_ops = (63 << 20) // 3
        (soup / ".metadata").write_bytes(
            b"\x80\x04\x8c\rrelative_path\x94" + b"K\x01\x94" * n_ops + b"."
        )
        fifo = t / "fifo" / "checkpoint-1"
        fifo.mkdir(parents=True)
        small_safetensors(fifo / "model.safetensors")
        os.mkfifo(fifo / "trainer_state.json")
        deep = t / "deep" / "checkpoint-1"
        deep.mkdir(parents=True)
        small_safetensors(deep / "model.safetensors")
        (deep / "trainer_state.json").write_bytes(b"[" * (60 << 20))

        base, rc = peak_rss_mb(["validate", str(t / "model.safetensors")])
        print(
            f"baseline: validate a small valid safetensors file: {base:.0f} MB peak RSS (rc {rc})"
        )
        cases = [
            (
                f"zip bomb ({(t / 'bomb.ckpt').stat().st_size / 1e6:.1f} MB -> {args.gb:g} GB), quick",
                ["validate", str(t / "bomb.ckpt")],
            ),
            ("zip bomb, full", ["validate", str(t / "bomb.ckpt"), "--level", "full"]),
            ("zip bomb lying about its size, quick", ["validate", str(t / "bomb-lie.ckpt")]),
            (
                "zip bomb lying about its size, full",
                ["validate", str(t / "bomb-lie.ckpt"), "--level", "full"],
            ),
            (
                "zip64 record past a sparse file's data, full",
                ["validate", str(t / "sparse.pt"), "--level", "full"],
            ),
            (".metadata -> /dev/zero", ["validate", str(t / "dcp-zero" / "step-1")]),
            (
                ".metadata sparse 10 GB",
                ["validate", str(t / "dcp-sparse" / "step-1"), "--level", "full"],
            ),
            (".metadata: 63 MB, 22M memoized opcodes", ["validate", str(soup)]),
            ("FIFO trainer_state.json", ["validate", str(fifo)]),
            ("60 MB deeply nested trainer_state.json", ["validate", str(deep)]),
        ]
        worst = 0.0
        print(f"{'case':<52} {'peak MB':>8} {'x base':>7} {'rc':>3}  target <= {TARGET_MB} MB")
        for label, argv in cases:
            mb, rc = peak_rss_mb(argv)
            worst = max(worst, mb)
            print(
                f"{label:<52} {mb:>8.0f} {mb / base:>7.2f} {rc:>3}  {'ok' if mb <= TARGET_MB and rc == 1 else 'FAIL'}"
            )
        print(
            f"worst case: {worst:.0f} MB = {worst / base:.2f}x the baseline; target {TARGET_MB} MB: "
            f"{'met' if worst <= TARGET_MB else 'NOT met'}"
        )
        return 0 if worst <= TARGET_MB else 1


if __name__ == "__main__":
    sys.exit(main())
