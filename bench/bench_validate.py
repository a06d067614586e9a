"""Benchmark `validate` (run: python bench/bench_validate.py [--small]).

1. quick validation of a tree of 1 000 checkpoints / 100 000 files (HF-Trainer-shaped: 92
   safetensors shards + index + optimizer/scheduler/rng/args zip archives + JSON), against a
   baseline in the same run: an os.stat walk of the same tree (the least any check can do).
2. full validation of a 2 GB torch zip checkpoint (CRC-32 of every entry) against
   `cat FILE > /dev/null` on a warm cache; ratio of read rates (target >= 0.8).
3. peak memory of full validation (tracemalloc peak and ru_maxrss) at 0.2 GB and 2 GB: flat.
4. `--level deep` (every value finite + per-tensor L2 norm) on a float32, a bfloat16 and a float16
   safetensors file against `cat FILE > /dev/null` (a character device, checked), warm cache and cold
   cache (posix_fadvise DONTNEED before each run), one scan thread; peak RSS of a process doing it.
   Targets (issue 12): fp32 >= 2x cat warm and >= 0.9x cold; bf16/fp16 >= 1.2x warm; RSS < 200 MB.
   Ratios by wall time (the targets' measure) and by CPU time, least of 5 runs each; "floor" is one numpy
   reduction over the same mapped bytes (the least any numpy check of every value costs).
Test data lives in a temp folder that is removed afterwards. `--deep-only` runs part 4 only; `--repeat N`
measures part 4 N times. `--crc-only`: part 2 with 1, 2 and 4 CRC threads and the rule's count
(archive.crc_workers), interleaved with cat, max(3, N) rounds: the measurements behind the rule.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from checkpoint_strategy.formats import archive as zr  # noqa: E402
from checkpoint_strategy.validate import validate_checkpoint, validate_paths  # noqa: E402


def _safetensors(nbytes_each: int = 64, prefix: str = "") -> bytes:
    header = {"__metadata__": {"format": "pt"}}
    for i in range(4):
        header[f"{prefix}layer.{i}.weight"] = {
            "dtype": "F32",
            "shape": [nbytes_each // 4],
            "data_offsets": [i * nbytes_each, (i + 1) * nbytes_each],
        }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0" * (4 * nbytes_each)


def _torch_zip(path: Path, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        for name, data in entries.items():
            zf.writestr(f"archive/data/{name}", data)
        zf.writestr("archive/version", b"3\n")


def _zips(root: Path) -> dict[str, bytes]:
    zips = {}
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        tmp = root / f".{name}"
        _torch_zip(tmp, {str(i): os.urandom(256) for i in range(8)})
        zips[name] = tmp.read_bytes()
        tmp.unlink()
    return zips


def build_tree(root: Path, n_ckpt: int, shards: int = 92, distinct: bool = False) -> int:
    """distinct: every checkpoint's torch archives drawn anew (as a real run's optimizer.pt, scheduler.pt and
    rng_state.pth differ), not one set copied into every checkpoint (a verdict kept by content serves copies)."""
    # each shard holds the names the index places in it (validate checks the index against the shards' headers)
    st = [_safetensors(prefix=f"s{s}.") for s in range(shards)]
    zips = _zips(root)
    files = 0
    for c in range(n_ckpt):
        if distinct and c:
            zips = _zips(root)
        d = root / f"checkpoint-{(c + 1) * 10}"
        d.mkdir()
        wm = {}
        for s in range(shards):
            name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            (d / name).write_bytes(st[s])
            for i in range(4):
                wm[f"s{s}.layer.{i}.weight"] = name
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": wm})
        )
        for name, data in zips.items():
            (d / name).write_bytes(data)
        (d / "trainer_state.json").write_text(
            json.dumps({"global_step": (c + 1) * 10, "log_history": []})
        )
        (d / "config.json").write_text("{}")
        (d / "generation_config.json").write_text("{}")
        files += shards + 1 + len(zips) + 3
    return files


def stat_walk(root: Path) -> int:
    n = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            os.stat(os.path.join(dirpath, name))
            n += 1
    return n


def build_big(path: Path, gb: float) -> None:
    block = os.urandom(64 << 20)
    entry_bytes = 512 << 20
    total = int(gb * 1e9)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        zf.writestr(
            "archive/version", b"3\n"
        )  # torch.load (and validate) refuse an archive without it
        i = 0
        while total > 0:
            size = min(entry_bytes, total)
            with zf.open(f"archive/data/{i}", "w", force_zip64=True) as fh:
                left = size
                while left > 0:
                    fh.write(block[: min(len(block), left)])
                    left -= min(len(block), left)
            total -= size
            i += 1


def cat_rate(path: Path, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(f"cat '{path}' > /dev/null", shell=True, check=True)
        best = min(best, time.perf_counter() - t)
    return path.stat().st_size / best


def full_rate(path: Path, runs: int = 2) -> tuple[float, str]:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        r = validate_checkpoint(path, level="full")
        best = min(best, time.perf_counter() - t)
        assert r.status == "valid", r.problems
    return path.stat().st_size / best, r.status


def peak_memory(path: Path) -> int:
    tracemalloc.start()
    validate_checkpoint(path, level="full")
    _cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def child_rss(path: Path | None) -> float:
    """Peak RSS (VmHWM, MB; ru_maxrss would carry the parent's size over fork+exec) of a fresh interpreter that validates `path` at full level (None: import only)."""
    code = (
        "import sys, resource; sys.path.insert(0, sys.argv[1]);"
        "from checkpoint_strategy.validate import validate_checkpoint;"
        "len(sys.argv) > 2 and validate_checkpoint(sys.argv[2], level='full');"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    )
    args = [sys.executable, "-c", code, str(Path(__file__).resolve().parent.parent / "scripts")]
    if path is not None:
        args.append(str(path))
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return int(out.strip()) / 1024


def build_safetensors(path: Path, gb: float, dtype: str) -> None:
    """A safetensors file of `gb` GB of random values in tensors of at most 256 MB (written in slices)."""
    import numpy as np

    item = {"F32": 4, "BF16": 2, "F16": 2}[dtype]
    total = int(gb * 1e9) // item
    per = (256 << 20) // item
    header, offsets, n, i = {}, 0, total, 0
    while n > 0:
        k = min(per, n)
        header[f"layers.{i}.weight"] = {
            "dtype": dtype,
            "shape": [k],
            "data_offsets": [offsets, offsets + k * item],
        }
        offsets += k * item
        n -= k
        i += 1
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(0)
    block = rng.standard_normal(8 << 20, dtype=np.float32)
    if dtype == "BF16":
        block = (block.view(np.uint32) >> 16).astype(np.uint16)
    elif dtype == "F16":
        block = block.astype(np.float16)
    data = block.tobytes()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        left = offsets
        while left > 0:
            fh.write(data[: min(len(data), left)])
            left -= min(len(data), left)


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _cat_seconds(path: Path, cold: bool) -> tuple[float, float]:
    """(wall, CPU) seconds of `cat FILE > /dev/null`; CPU is the child's user+sys time."""
    if cold:
        _drop_cache(path)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.devnull, "wb") as null:
        t = time.perf_counter()
        subprocess.run(["cat", str(path)], stdout=null, check=True)
        wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _deep_seconds(path: Path, cold: bool) -> tuple[float, float]:
    """(wall, CPU) seconds of validate --level deep; one scan thread, so the calling thread's CPU time."""
    if cold:
        _drop_cache(path)
    t, c = time.perf_counter(), time.thread_time()
    r = validate_checkpoint(path, level="deep")
    wall, cpu = time.perf_counter() - t, time.thread_time() - c
    assert r.status == "valid" and r.deep.nonfinite_values == 0, r.problems
    return wall, cpu


def _floor_seconds(path: Path, cold: bool) -> tuple[float, float]:
    """One numpy reduction (max of the raw 32-bit words) over the file memory-mapped in 64 MB windows: the
    least any numpy check of every byte costs (the memory floor); no finite test, no norm."""
    import mmap

    import numpy as np

    if cold:
        _drop_cache(path)
    t, c = time.perf_counter(), time.thread_time()
    size = path.stat().st_size // 4096 * 4096
    with open(path, "rb") as fh:
        for off in range(0, size, 64 << 20):
            mm = mmap.mmap(
                fh.fileno(), min(64 << 20, size - off), access=mmap.ACCESS_READ, offset=off
            )
            words = np.frombuffer(mm, dtype=np.uint32)
            for i in range(0, len(words), 1 << 18):
                words[i : i + (1 << 18)].max()
            del words
            mm.close()
    return time.perf_counter() - t, time.thread_time() - c


def _ceiling_seconds(path: Path, cold: bool) -> tuple[float, float]:
    """One numpy dot over the same bytes already in this process's memory (no page cache, no mapping):
    the most one thread can reduce from RAM here, whatever the check (cold: not applicable, same)."""
    import numpy as np

    words = _CEILING.get(path)
    if words is None:
        words = _CEILING[path] = np.fromfile(path, dtype=np.float32, count=path.stat().st_size // 4)
    t, c = time.perf_counter(), time.thread_time()
    with np.errstate(
        over="ignore"
    ):  # 16-bit files read as float32 words: random bits overflow, same speed
        for i in range(0, len(words), 1 << 18):
            np.dot(words[i : i + (1 << 18)], words[i : i + (1 << 18)])
    return time.perf_counter() - t, time.thread_time() - c


_CEILING: dict = {}


def _kernel_load_seconds() -> float | None:
    """Seconds a fresh process takes to import numba and load the compiled kernels (cached), or None."""
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); t = time.perf_counter();"
        "from checkpoint_strategy.formats import kernels; print(time.perf_counter() - t)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).resolve().parent.parent / "scripts")],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        return None
    proc = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).resolve().parent.parent / "scripts")],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(proc.stdout.strip())


def child_deep_rss(path: Path, compiled: bool = False) -> float:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from checkpoint_strategy.validate import validate_checkpoint; from checkpoint_strategy.formats import tensors as tensorscan;"
        f"tensorscan.KERNEL_MIN_BYTES = {0 if compiled else 1 << 62};"
        "validate_checkpoint(sys.argv[2], level='deep');"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(Path(__file__).resolve().parent.parent / "scripts"),
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.strip()) / 1024


def _best(fn, path: Path, cold: bool, n: int = 5) -> tuple[float, float]:
    """Least wall and least CPU time of n runs (the machine is shared: the least is the least disturbed)."""
    runs = [fn(path, cold) for _ in range(n)]
    return min(w for w, _c in runs), min(c for _w, c in runs)


def bench_deep(tmp: Path, gb: float, repeat: int = 1) -> None:
    import stat

    from checkpoint_strategy.formats import tensors as tensorscan

    mode = os.stat(os.devnull).st_mode
    if not stat.S_ISCHR(mode):
        print(
            f"{os.devnull} is not a character device: the cat baseline would not be trustworthy; skipped"
        )
        return
    tensorscan.WORKERS = 1  # the targets are for one scan thread
    load = _kernel_load_seconds()
    paths = ["numpy"] + (["compiled"] if load is not None else [])
    print(
        f"deep level (finite check + per-tensor L2 norm, one thread) on {gb:.2f} GB files; "
        f"baseline cat > {os.devnull} (character device); ratio = deep rate / cat rate, by wall time "
        "(the target's measure) and by CPU time (steadier on a shared machine); floor = one numpy pass over "
        "the mapped file; ceiling = one numpy dot over the same bytes already in RAM (the most one thread "
        "reduces here). 16-bit paths: numpy, and compiled (numba kernels, the `fast` extra; "
        + (
            f"a process loads them in {load:.2f} s)"
            if load is not None
            else "numba not installed: not measured)"
        )
        + ":"
    )
    for dtype, warm_target in (("F32", 2.0), ("BF16", 1.2), ("F16", 1.2)):
        path = tmp / f"model-{dtype}.safetensors"
        build_safetensors(path, gb, dtype)
        size = path.stat().st_size
        _cat_seconds(path, False)
        for way in paths if dtype != "F32" else ["numpy"]:
            tensorscan.KERNEL_MIN_BYTES = 0
            os.environ["CHECKPOINT_STRATEGY_KERNELS"] = "on" if way == "compiled" else "off"
            _deep_seconds(path, False)
            for _ in range(repeat):
                for cold in (False, True):
                    cat_w, cat_c = _best(_cat_seconds, path, cold)
                    deep_w, deep_c = _best(_deep_seconds, path, cold)
                    floor_w, floor_c = _best(_floor_seconds, path, cold, 3)
                    ceil_w, ceil_c = _best(_ceiling_seconds, path, cold, 3)
                    target = (0.9 if dtype == "F32" else None) if cold else warm_target
                    print(
                        f"  {dtype:5s} {way:8s} {'cold' if cold else 'warm'}: cat {size / cat_w / 1e9:.2f} GB/s, "
                        f"deep {size / deep_w / 1e9:.2f} GB/s, ratio {cat_w / deep_w:.2f} wall, "
                        f"{cat_c / deep_c:.2f} CPU"
                        + (f" (target >= {target})" if target else "")
                        + f"; floor {cat_w / floor_w:.2f} wall, {cat_c / floor_c:.2f} CPU"
                        + ("" if cold else f"; ceiling {cat_w / ceil_w:.2f} wall")
                    )
            print(
                f"  {dtype:5s} {way:8s} peak RSS of a process running the deep check: "
                f"{child_deep_rss(path, way == 'compiled'):.0f} MB (target < 200 MB)"
            )
        _CEILING.clear()
        path.unlink()


def bench_crc_workers(tmp: Path, gb: float, rounds: int) -> None:
    """Full validation with 1, 2 and 4 CRC threads and with the rule's count (archive.crc_workers), each
    between two `cat` runs of the same warm file (ratio = the better cat's time / validate's time), in
    alternating order, `rounds` times: median and range. The data for the rule in archive.CRC_WORKERS."""
    import statistics

    big = tmp / "big.ckpt"
    build_big(big, gb)
    rule = zr.crc_workers()
    counts = sorted({1, 2, 4, rule})
    ratios: dict[int, list[float]] = {w: [] for w in counts}
    cat_rate(big)
    saved = zr.CRC_WORKERS
    try:
        for r in range(rounds):
            for w in counts if r % 2 == 0 else counts[::-1]:
                zr.CRC_WORKERS = w
                c1 = big.stat().st_size / cat_rate(big, 1)
                rate, _ = full_rate(big, 1)
                c2 = big.stat().st_size / cat_rate(big, 1)
                ratios[w].append(rate * min(c1, c2) / big.stat().st_size)
    finally:
        zr.CRC_WORKERS = saved
    print(
        f"full validation of a {big.stat().st_size / 1e9:.2f} GB torch zip (entries of 512 MB), CRC-32 via "
        f"{zr.CRC32_IMPL}, warm cache, {rounds} rounds, load average {os.getloadavg()[0]:.1f}; usable cores "
        f"{zr.usable_cores()}, the rule picks {rule} thread(s):"
    )
    for w in counts:
        v = ratios[w]
        print(
            f"  {w} thread(s){' (rule)' if w == rule else ''}: median {statistics.median(v):.2f}x cat's rate, "
            f"range {min(v):.2f}-{max(v):.2f} (target >= 0.8)"
        )
    big.unlink()


def main() -> None:
    small = "--small" in sys.argv
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    if "--crc-only" in sys.argv:
        tmp = Path(tempfile.mkdtemp(prefix="bench-validate-"))
        try:
            bench_crc_workers(tmp, 0.2 if small else 2.0, max(3, repeat))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if "--deep-only" in sys.argv:
        tmp = Path(tempfile.mkdtemp(prefix="bench-validate-"))
        try:
            bench_deep(tmp, 0.25 if small else 1.0, repeat)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    n_ckpt = 100 if small else 1000
    big_gb = 0.2 if small else 2.0
    tmp = Path(tempfile.mkdtemp(prefix="bench-validate-"))
    try:
        tree = tmp / "tree"
        tree.mkdir()
        t = time.perf_counter()
        files = build_tree(tree, n_ckpt)
        print(f"built {n_ckpt} checkpoints / {files} files in {time.perf_counter() - t:.1f} s")
        stat_walk(tree)  # warm the dentry/inode cache for both measurements
        t = time.perf_counter()
        stat_walk(tree)
        t_stat = time.perf_counter() - t
        t = time.perf_counter()
        report = validate_paths([str(tree)], level="quick", progress=False)
        t_quick = time.perf_counter() - t
        assert report.summary.valid == n_ckpt, report.summary
        checked = sum(c.files_checked for c in report.checkpoints)
        print(
            f"quick validate: {n_ckpt} checkpoints, {checked} files checked in {t_quick:.2f} s "
            f"({checked / t_quick:,.0f} files/s; target ~3 s for 100 000 files)"
        )
        print(
            f"  baseline os.stat walk: {t_stat:.2f} s; validate/stat ratio {t_quick / t_stat:.1f}x"
        )
        shutil.rmtree(tree)

        big = tmp / "big.ckpt"
        build_big(big, big_gb)
        size_gb = big.stat().st_size / 1e9
        rc = cat_rate(big)
        results = {}
        for impl, fn in (("zlib", zlib.crc32), (zr.CRC32_IMPL, zr.crc32)):
            saved = zr.crc32
            zr.crc32 = fn
            try:
                results[impl] = full_rate(big)[0]
            finally:
                zr.crc32 = saved
        print(f"full validate of a {size_gb:.2f} GB torch zip checkpoint (warm cache):")
        print(f"  cat > /dev/null: {rc / 1e9:.2f} GB/s")
        for impl, rate in results.items():
            print(
                f"  validate --level full, CRC-32 via {impl}: {rate / 1e9:.2f} GB/s, ratio {rate / rc:.2f} of cat "
                "(target >= 0.8)"
            )
        t = time.perf_counter()
        validate_checkpoint(big, manifest="write")
        t_m = time.perf_counter() - t
        print(f"  --manifest write (sha256 + CRC pass): {big.stat().st_size / t_m / 1e9:.2f} GB/s")
        small_file = tmp / "small.ckpt"
        build_big(small_file, big_gb / 10)
        p_small = peak_memory(small_file)
        p_big = peak_memory(big)
        rss_base = child_rss(None)
        rss_small, rss_big = child_rss(small_file), child_rss(big)
        print(
            f"peak Python memory during full validation: {p_small / 1e6:.1f} MB at {big_gb / 10:.2f} GB, "
            f"{p_big / 1e6:.1f} MB at {big_gb:.2f} GB (flat)"
        )
        print(
            f"peak RSS of a process doing the full validation: {rss_small:.0f} MB at {big_gb / 10:.2f} GB, "
            f"{rss_big:.0f} MB at {big_gb:.2f} GB (baseline: the same process importing the package only "
            f"{rss_base:.0f} MB; target < 100 MB)"
        )
        big.unlink()
        small_file.unlink()
        bench_deep(tmp, 0.25 if small else 1.0, repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
