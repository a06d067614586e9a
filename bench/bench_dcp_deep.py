"""`validate --level deep` of a real torch.distributed.checkpoint folder: time, and how often the torch archive of
each item embedded in the .distcp files is parsed (issue 40/41: level full checks every item's archive, then the
deep level read each again; now it takes the ones full read).

    python bench/bench_dcp_deep.py [--layers 48] [--width 256] [--shards 4] [--repeat 5]

The checkpoint is written by torch's own `dcp.save` (FileSystemWriter, `--shards` writer threads): a Sequential of
`--layers` Linear(width, width) layers and its AdamW state after one step (every weight, bias and moment an item;
tests/realruns.py `build_dcp_sharded`, the tests' `dcp_sharded` folder at another size).
Printed: best-of-N wall and CPU seconds of `validate_checkpoint(level="deep")`, the bytes one run of each level reads
(read syscalls, /proc/self/io rchar, and the bytes the value scan maps), and the embedded archive parses
(`formats.filechecks` scan_embedded_zip, and embedded_torch_zip where a checkout has it) of one level full run (one
per item) and of one level deep run. Run it from both checkouts with bench/compare.py for a before/after figure.

Measured (issue 41, this machine, 2 shared cores; compare.py, 3 interleaved rounds, best of 5; 48 layers, 38.6 MB):
before the deep level took level full's item archives, 1.97 archive parses per item and 490-563 ms wall /
179-208 ms CPU; after, 1.00 parse per item and 286-294 ms wall / 108-165 ms CPU (0.51-0.60x wall, 0.60-0.79x CPU).
Bytes read at level deep (issue 40: the tensor bytes read twice, full's CRC then the value scan; now the scan
computes the CRC-32s from the bytes it reduces): 1.99x -> 1.15x the folder (read syscalls 1.01x -> 0.16x, mapped
0.98x), CPU unchanged within the noise (114-127 -> 120-132 ms, load average 11-13; docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from realruns import build_dcp_sharded  # noqa: E402

from checkpoint_strategy.formats import filechecks as fc  # noqa: E402
from checkpoint_strategy.validate import validate_checkpoint  # noqa: E402


def counted(names: tuple[str, ...]) -> dict[str, int]:
    """Count calls of the named filechecks functions (those a checkout has)."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(fc, name, None)
        if real is None:
            continue

        def wrap(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        setattr(fc, name, wrap)
    return calls


def rchar() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def read_through(path: Path, level: str) -> tuple[int, int]:
    """Bytes one validate run reads through syscalls (rchar: read, pread; page-cache hits count) and the bytes its
    value scan maps (deep: bytes_scanned)."""
    before = rchar()
    r = validate_checkpoint(str(path), level=level)
    read = rchar() - before
    return read, r.deep.bytes_scanned if r.deep is not None else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-dcp-deep-"))
    try:
        path = build_dcp_sharded(tmp, shards=a.shards, width=a.width, layers=a.layers)
        size = sum(f.stat().st_size for f in path.iterdir())
        validate_checkpoint(str(path), level="deep")  # imports, page cache
        walls, cpus = [], []
        for _ in range(a.repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            r = validate_checkpoint(str(path), level="deep")
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            assert r.status == "valid", r.problems
        calls = counted(("scan_embedded_zip", "embedded_torch_zip"))
        validate_checkpoint(str(path), level="full")
        full = sum(calls.values())
        for k in calls:
            calls[k] = 0
        validate_checkpoint(str(path), level="deep")
        print(
            f"DCP {a.layers} layers x Linear({a.width}) + AdamW, {a.shards} files, {size / 1e6:.1f} MB"
        )
        print(
            f"  validate --level deep: best of {a.repeat} {min(walls) * 1e3:.1f} ms wall, "
            f"{min(cpus) * 1e3:.1f} ms CPU"
        )
        deep = sum(calls.values())
        full_io, deep_io = read_through(path, "full"), read_through(path, "deep")
        print(
            f"  bytes read (read syscalls, /proc/self/io rchar; + bytes the value scan maps): level full "
            f"{full_io[0] / size:.2f}x the folder, level deep {deep_io[0] / size:.2f}x + {deep_io[1] / size:.2f}x "
            f"mapped = {sum(deep_io) / size:.2f}x"
        )
        print(
            f"  embedded archive parses: level full {full} (one per item), level deep {deep} "
            f"({deep / max(1, full):.2f} per item)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
