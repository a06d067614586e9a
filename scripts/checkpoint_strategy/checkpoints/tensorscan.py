"""The deep level's numeric pass: every floating-point value of a checkpoint read once, nothing executed.

Where the bytes are comes from the headers only: safetensors `data_offsets`, a torch zip's
`data/<key>` entries located by the pickle's persistent ids and `_rebuild_tensor_v2` arguments
(read with `torchpickle`), a DCP `.metadata`'s `_StorageInfo` offsets (each tensor chunk there is a
small torch zip archive of its own, or raw bytes). The values are memory-mapped in windows of at
most `WINDOW` bytes, unmapped as soon as they are done (peak RSS stays flat whatever the size),
and reduced per chunk of `CHUNK_ELEMS` values with numpy:

- ``numpy.dot(x, x)`` is finite exactly when every value is (a NaN or Inf anywhere makes it
  NaN/Inf; an overflow of the squares is told apart by the exact re-check), and it is the squared
  L2 norm at the same time, at about the memory floor. Only a chunk whose dot is not finite is
  re-checked exactly (NaN and Inf counted, the norm of its finite values in float64).
- float16 and bfloat16 are read two values per uint32 word with no widening conversion: bfloat16 is
  the top half of a float32 (a mask or a 16-bit shift); float16's exponent and mantissa shifted by 13
  and scaled by 2**112 are its exact float32 value; its Inf/NaN show as exponent 31 (`Reducer.pairs`).
  Integer, bool and float8 storages are skipped.
- chunk results are summed in float64 (64 Ki values per dot keeps the float32 rounding of each
  partial sum near 1e-8 relative).
- max |x| costs one more pass over each (cache-resident) chunk: computed when asked (``--stats``).

Files are scanned in parallel (numpy releases the GIL), one pass per file.
"""

from __future__ import annotations

import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from collections.abc import Iterable

CHUNK_ELEMS = 1 << 16           # values per dot (256 KB of float32: stays in L2)
WINDOW = 64 << 20               # bytes mapped at once
STRIDED_MAX = 32 << 20          # a non-contiguous view is gathered exactly up to this span
WORKERS = max(1, min(4, os.cpu_count() or 1))
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")

_SAFETENSORS_DTYPE = {"F32": "float32", "F64": "float64", "F16": "float16", "BF16": "bfloat16",
                      "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                      "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64"}
_ITEM = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


def safetensors_dtype(code: str) -> str:
    return _SAFETENSORS_DTYPE.get(code, code.lower())


@dataclass
class Job:
    """One tensor (or one chunk of a sharded tensor) to scan."""

    file: str              # absolute path
    rel: str               # as shown in messages (relative to the checkpoint)
    name: str              # tensor name
    role: str              # weights / optimizer / other
    dtype: str             # torch dtype name
    offset: int            # byte offset in `file` of element 0 of the view's storage range
    shape: tuple
    stride: tuple | None = None     # elements; None = contiguous
    scalar_value: bool = False
    span: int = 0                   # strided views: elements from the first to the last one


@dataclass
class Stat:
    file: str
    name: str
    role: str
    dtype: str
    shape: tuple
    numel: int
    nan: int = 0
    inf: int = 0
    sumsq: float = 0.0
    max_abs: float | None = None
    value: float | None = None      # the value of a one-element tensor (optimizer `step`)
    checked: bool = False
    note: str | None = None

    @property
    def l2(self) -> float | None:
        return self.sumsq ** 0.5 if self.checked else None


@dataclass
class ScanOutcome:
    stats: list[Stat] = field(default_factory=list)
    bytes_scanned: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)   # (rel file, reason) read errors


def _prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class _Mapper:
    """Maps windows of one file on demand; the previous window is unmapped when the next is needed."""

    def __init__(self, path: str) -> None:
        from checkpoint_strategy.storage import open_regular

        self.fh = open_regular(path, "checkpoint file")
        if not hasattr(self.fh, "raw"):  # an object-storage file (storage/remote.py): mmap would see no data
            self.fh.close()
            from checkpoint_strategy.storage import ReadError

            raise ReadError(f"{path}: level deep needs a local file", "level deep needs a local file (object storage)")
        self.size = os.fstat(self.fh.fileno()).st_size
        self.mm: mmap.mmap | None = None
        self.start = self.end = 0

    def view(self, offset: int, nbytes: int) -> tuple[mmap.mmap, int]:
        """(map, offset inside it) covering [offset, offset+nbytes); nbytes <= WINDOW."""
        if offset < 0 or offset + nbytes > self.size:
            raise ValueError(f"bytes {offset}..{offset + nbytes} lie past the end of the file ({self.size} bytes)")
        if self.mm is None or offset < self.start or offset + nbytes > self.end:
            self.close_map()
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            end = min(self.size, max(offset + nbytes, start + WINDOW))
            if end == start:
                end = start + 1
            self.mm = mmap.mmap(self.fh.fileno(), end - start, access=mmap.ACCESS_READ, offset=start)
            if hasattr(self.mm, "madvise"):
                try:
                    self.mm.madvise(mmap.MADV_SEQUENTIAL)
                    self.mm.madvise(mmap.MADV_WILLNEED)
                except (OSError, AttributeError):
                    pass
            self.start, self.end = start, end
        return self.mm, offset - self.start

    def close_map(self) -> None:
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # a numpy view still alive: the map goes when it does
                pass
            self.mm = None

    def close(self) -> None:
        self.close_map()
        self.fh.close()


class _Reducer:
    """Per-chunk numeric reduction with reusable scratch buffers."""

    def __init__(self, want_max: bool) -> None:
        import numpy as np

        self.np = np
        self.want_max = want_max
        self.lo = np.empty(CHUNK_ELEMS, dtype=np.uint32)
        self.hi = np.empty(CHUNK_ELEMS, dtype=np.uint32)
        self.f16_scale = np.float32(2.0 ** 112)

    def widen(self, raw, dtype: str):
        """Exact float32 (or float64) values of a chunk (the slow path: re-checks, odd tails, scalars)."""
        np = self.np
        if dtype == "float16":
            return raw.view(np.float16).astype(np.float32)
        if dtype == "bfloat16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw

    def feed(self, st: Stat, raw, dtype: str) -> None:
        if dtype in ("float32", "float64"):
            self.chunk(st, raw)
        elif len(raw) % 2:
            if len(raw) > 1:
                self.pairs(st, raw[:-1], dtype)
            self.chunk(st, self.widen(raw[-1:], dtype))
        else:
            self.pairs(st, raw, dtype)

    def pairs(self, st: Stat, raw, dtype: str) -> None:
        """16-bit floats two at a time in a uint32 word, no widening conversion: bfloat16 is the top half
        of a float32 (mask / shift by 16); float16's exponent and mantissa shifted by 13 and scaled by
        2**112 are its exact float32 value (zero and subnormals included; Inf/NaN become >= 65536)."""
        np = self.np
        x = raw.view(np.uint32)
        k = len(x)
        lo, hi = self.lo[:k], self.hi[:k]
        if dtype == "bfloat16":
            np.left_shift(x, 16, out=lo)
            np.bitwise_and(x, 0xFFFF0000, out=hi)
            a, b = lo.view(np.float32), hi.view(np.float32)
            d = float(np.dot(a, a)) + float(np.dot(b, b))
            if d == d and d != float("inf"):
                st.sumsq += d
                if self.want_max:
                    self._max(st, a, b)
                return
        else:
            np.bitwise_and(x, 0x7FFF, out=lo)
            np.right_shift(x, 16, out=hi)
            np.bitwise_and(hi, 0x7FFF, out=hi)
            if max(int(lo.max()), int(hi.max())) < 0x7C00:  # every exponent below 31: all finite
                for part in (lo, hi):
                    np.left_shift(part, 13, out=part)
                    f = part.view(np.float32)
                    np.multiply(f, self.f16_scale, out=f)
                    st.sumsq += float(np.dot(f, f))
                if self.want_max:
                    self._max(st, lo.view(np.float32), hi.view(np.float32))
                return
        self.chunk(st, self.widen(raw, dtype))  # exact re-check of this chunk

    def _max(self, st: Stat, a, b) -> None:
        np = self.np
        m = max(float(np.abs(a).max()), float(np.abs(b).max())) if len(a) else 0.0
        if st.max_abs is None or m > st.max_abs:
            st.max_abs = m

    def chunk(self, st: Stat, x) -> None:
        np = self.np
        d = float(np.dot(x, x))
        if d == d and d != float("inf"):
            st.sumsq += d
            if self.want_max and len(x):
                m = max(float(x.max()), -float(x.min()))
                if st.max_abs is None or m > st.max_abs:
                    st.max_abs = m
            return
        nan = np.isnan(x)
        inf = np.isinf(x)
        st.nan += int(np.count_nonzero(nan))
        st.inf += int(np.count_nonzero(inf))
        fin = x[~(nan | inf)].astype(np.float64)
        st.sumsq += float(np.dot(fin, fin))
        if self.want_max and len(fin):
            m = float(np.abs(fin).max())
            if st.max_abs is None or m > st.max_abs:
                st.max_abs = m


def _np_dtype(np, dtype: str):
    return {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": np.uint16}[dtype]


def _scan_job(mapper: _Mapper, red: _Reducer, job: Job, st: Stat) -> int:
    np = red.np
    item = _ITEM[job.dtype]
    npdt = _np_dtype(np, job.dtype)
    numel = st.numel
    if numel == 0:
        st.checked = True
        return 0
    if job.stride is not None:
        span = job.span
        nbytes = span * item
        if nbytes > STRIDED_MAX:
            st.note = "non-contiguous view larger than 32 MB: figures cover its whole storage span"
            numel = span
        else:
            mm, off = mapper.view(job.offset, nbytes)
            base = np.frombuffer(mm, dtype=npdt, count=span, offset=off)
            view = np.lib.stride_tricks.as_strided(base, shape=job.shape,
                                                   strides=tuple(s * item for s in job.stride))
            flat = np.ascontiguousarray(view).reshape(-1)
            del base, view
            step = CHUNK_ELEMS if item > 2 else 2 * CHUNK_ELEMS
            for i in range(0, len(flat), step):
                raw = flat[i:i + step]
                red.feed(st, raw, job.dtype)
            if job.scalar_value and len(flat) == 1:
                st.value = float(red.widen(flat[:1], job.dtype)[0])
            del flat, raw
            st.checked = True
            return nbytes
    total = numel * item
    pos = 0
    per_window = max(CHUNK_ELEMS, (WINDOW // item) // CHUNK_ELEMS * CHUNK_ELEMS)
    while pos < numel:
        count = min(per_window, numel - pos)
        mm, off = mapper.view(job.offset + pos * item, count * item)
        arr = np.frombuffer(mm, dtype=npdt, count=count, offset=off)
        step = CHUNK_ELEMS if item > 2 else 2 * CHUNK_ELEMS
        for i in range(0, count, step):
            raw = arr[i:i + step]
            red.feed(st, raw, job.dtype)
        if job.scalar_value and numel == 1:
            st.value = float(red.widen(arr[:1], job.dtype)[0])
        del arr, raw
        pos += count
    st.checked = True
    return total


def _scan_file(path: str, jobs: list[Job], want_max: bool) -> tuple[list[Stat], int, str | None]:
    stats: list[Stat] = []
    scanned = 0
    red = _Reducer(want_max)
    try:
        mapper = _Mapper(path)
    except Exception as exc:  # noqa: BLE001 - ReadError / OSError: reported as the file's problem
        reason = getattr(exc, "reason", None) or str(exc)
        return [Stat(j.file, j.name, j.role, j.dtype, j.shape, _prod(j.shape), note=reason) for j in jobs], 0, reason
    try:
        for job in sorted(jobs, key=lambda j: j.offset):
            st = Stat(job.rel, job.name, job.role, job.dtype, tuple(job.shape), _prod(job.shape))
            stats.append(st)
            if job.dtype not in FLOAT_DTYPES:
                st.note = f"{job.dtype}: not a float, skipped"
                continue
            try:
                scanned += _scan_job(mapper, red, job, st)
            except (ValueError, OSError) as exc:
                return stats, scanned, f"tensor {job.name}: {exc}"
    finally:
        mapper.close()
    return stats, scanned, None


def scan(jobs: list[Job], want_max: bool = False, workers: int | None = None) -> ScanOutcome:
    """Scan every job; files in parallel, each file in one pass in offset order."""
    by_file: dict[str, list[Job]] = {}
    for j in jobs:
        if j.stride is not None:
            j.span = _span(j)
        by_file.setdefault(j.file, []).append(j)
    out = ScanOutcome()
    n = min(workers or WORKERS, len(by_file)) or 1
    files = sorted(by_file, key=lambda f: -sum(_prod(j.shape) for j in by_file[f]))
    if n == 1:
        results = [_scan_file(f, by_file[f], want_max) for f in files]
    else:
        with ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(lambda f: _scan_file(f, by_file[f], want_max), files))
    rel = {j.file: j.rel for j in jobs}
    for f, (stats, nbytes, err) in zip(files, results):
        out.stats.extend(stats)
        out.bytes_scanned += nbytes
        if err:
            out.problems.append((rel[f], f"cannot scan values: {err}"))
    return out


def _span(job: Job) -> int:
    """Elements from the view's first to its last element (inclusive)."""
    if _prod(job.shape) == 0:
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(job.shape, job.stride or ()))
