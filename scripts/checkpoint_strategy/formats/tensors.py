"""The deep level's numeric pass: every floating-point value of a checkpoint read once, nothing executed.

Where the bytes are comes from the headers only: safetensors `data_offsets`, a torch zip's
`data/<key>` entries located by the pickle's persistent ids and `_rebuild_tensor_v2` arguments
(read with `torchpickle`), a DCP `.metadata`'s `_StorageInfo` offsets (each tensor chunk there is a
small torch zip archive of its own, or raw bytes). The values are memory-mapped in windows of at
most `WINDOW` bytes, unmapped as soon as they are done (peak RSS stays flat whatever the size),
and reduced per chunk (`CHUNK_ELEMS` float32/float64 values, `CHUNK16` 16-bit ones) with numpy:

- the sum of squares (float32 dots of `ROW` values, one `numpy.vecdot` call per chunk, added up in
  float64) is finite exactly when every value is (a NaN or Inf anywhere makes it NaN/Inf; an overflow
  of the squares is told apart by the exact re-check), and it is the squared L2 norm at the same time.
  Only a chunk whose sum is not finite is re-checked exactly (NaN and Inf counted, the norm of its
  finite values in float64). One float32 dot over a whole chunk would be up to ~2e-6 off on values
  with few significant bits (bfloat16 data); rows of 4096 keep it near 1e-7.
- bfloat16 is the top half of a float32: two values per uint32 word, a 16-bit shift and a mask into a
  reused buffer (`_Reducer.bf16`). float16 (`_Reducer.f16`): `x & 0x7fff` into a reused buffer; its
  max is >= 0x7c00 exactly when an Inf/NaN is there (exponent bits all ones); otherwise exponent and
  mantissa widened, shifted by 13 and scaled by 2**112 are the exact float32 values (zero and
  subnormals included). Integer, bool and float8 storages are skipped.
- with numba installed (`fast` extra) and at least `KERNEL_MIN_BYTES` of 16-bit values in a scan, both
  16-bit paths are one compiled pass instead (`kernels.py`: read every value once, widen and square in
  registers), two to three times the numpy path's rate (bfloat16 2x, float16 3.3x: docs/deep-validation.md);
  the numpy path above is the fallback and gives the same figures (the same exactness rules;
  tests/test_checkpoints_kernels.py compares them).
- max |x| (computed when asked, ``--stats``): one more reduction per chunk; for 16-bit values, the
  largest `x & 0x7fff` bit pattern (finite values of one sign order as their bits).

Files are scanned in parallel (numpy releases the GIL), one pass per file. A torch archive's entries are
CRC-checked in the same pass (`scan(..., crc=...)`, level deep: the archive is read once): each chunk's bytes go
through CRC-32 right after they are reduced, while they are in cache, and the bytes no tensor covers (the pickle,
the records, storage bytes outside every view) are read for the CRC alone (`_CrcCursor`).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.storage import ReadError, open_regular

CHUNK_ELEMS = 1 << 18  # float32/float64 values per reduction (1 MB of float32: stays in L2)
CHUNK16 = 1 << 17  # float16/bfloat16 values per reduction (256 KB raw + 512 KB widened, in L2)
ROW = 4096  # float32 partial sums of this many squares, added up in float64
WINDOW = (
    16 << 20
)  # bytes mapped at once (mapped pages count in RSS: 16 MB keeps the compiled path < 200 MB)
STRIDED_MAX = 32 << 20  # a non-contiguous view is gathered exactly up to this span
WORKERS = max(1, min(4, os.cpu_count() or 1))
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
# Importing numba and loading the compiled kernels costs about 1.2 s a process (bench/bench_validate.py);
# they save about 0.14 s a GB of 16-bit values, so below this the numpy path is faster end to end.
KERNEL_MIN_BYTES = 8 << 30

_SAFETENSORS_DTYPE = {
    "F32": "float32",
    "F64": "float64",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
}
_ITEM = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
_INT_ITEM = {"int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "i1", "uint8": "u1"}
# the largest bit pattern of a negative 16-bit float that is not NaN (-Inf): 0x8000 is -0.0
_NEG_LIMIT16 = {"float16": 0xFC00, "bfloat16": 0xFF80}


def safetensors_dtype(code: str) -> str:
    return _SAFETENSORS_DTYPE.get(code, code.lower())


@dataclass
class Job:
    """One tensor (or one chunk of a sharded tensor) to scan."""

    file: str  # absolute path
    rel: str  # as shown in messages (relative to the checkpoint)
    name: str  # tensor name
    role: str  # weights / optimizer / other
    dtype: str  # torch dtype name
    offset: int  # byte offset in `file` of element 0 of the view's storage range
    shape: tuple
    stride: tuple | None = None  # elements; None = contiguous
    scalar_value: bool = False
    span: int = 0  # strided views: elements from the first to the last one
    count_negative: bool = False  # count values below zero (second moments: never negative)
    nbytes: int = 0  # a non-float tensor's bytes, read through (not reduced) when set: the deep
    #                                 pass then reads every byte of a safetensors file, as full does


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
    value: float | None = (
        None  # the value of a one-element tensor (optimizer `step`; integer ones too)
    )
    negative: int = 0  # values below zero (counted for jobs with `count_negative`)
    checked: bool = False
    note: str | None = None

    @property
    def l2(self) -> float | None:
        return self.sumsq**0.5 if self.checked else None


@dataclass
class ScanOutcome:
    stats: list[Stat] = field(default_factory=list)
    bytes_scanned: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)  # (rel file, reason) read errors
    crc_problems: list[tuple[str, str]] = field(
        default_factory=list
    )  # (rel file, the first entry's CRC finding)
    bytes_crc: int = 0  # bytes read for the CRC alone (no tensor covers them)


class _CrcCursor:
    """The CRC-32 of a torch archive's entries, computed as the value scan reads the file: `feed` takes the bytes
    the scan has in hand (increasing offsets; bytes before the cursor are done already), the bytes between are
    read here (`os.pread`, CHUNK at a time); `finish` reads the rest and returns the first entry (archive order)
    whose CRC is wrong, worded as level full words it. Deflated entries (torch.save stores every entry; a
    re-zipped archive) are inflated and checked by `archive.crc_entry` at the end. `where`: id(entry) -> what a
    finding names before the entry (the DCP item whose archive holds it, the entries at their offsets in the
    .distcp file)."""

    def __init__(
        self, fh: Any, entries: list[zr.ZipEntry], where: dict[int, Callable[[], str]] | None = None
    ) -> None:
        self.fh, self.fd = fh, fh.fileno()
        self.order = entries
        self.where = where or {}
        self.stored = sorted((e for e in entries if e.method == 0), key=lambda e: e.data_start)
        self.crcs: dict[int, int] = {id(e): 0 for e in self.stored}
        self.k = 0
        self.pos = self.stored[0].data_start if self.stored else 0
        self.extra = 0  # bytes read here (no tensor covered them)
        self.short: str | None = None  # the file ended inside an entry

    def feed(self, off: int, buf: memoryview) -> None:
        end = off + len(buf)
        while self.k < len(self.stored) and end > self.pos:
            e = self.stored[self.k]
            e_end = e.data_start + e.csize
            if off >= e_end or off > self.pos:  # bytes no tensor covered first
                self._read_to(min(off, e_end))
                if self.pos < e_end:
                    continue
            else:
                b = min(end, e_end)
                self.crcs[id(e)] = zr.crc32(buf[self.pos - off : b - off], self.crcs[id(e)])
                self.pos = b
            if self.pos >= e_end:
                self._next()

    def _next(self) -> None:
        self.k += 1
        if self.k < len(self.stored):
            self.pos = max(self.pos, self.stored[self.k].data_start)

    def _read_to(self, target: int) -> None:
        e = self.stored[self.k]
        while self.pos < target:
            data = os.pread(self.fd, min(zr.CHUNK, target - self.pos), self.pos)
            if not data:
                self.short = (
                    self.short or f"entry {e.name!r}: file ends inside its data (truncated)"
                )
                self.pos = target
                return
            self.crcs[id(e)] = zr.crc32(data, self.crcs[id(e)])
            self.pos += len(data)
            self.extra += len(data)

    def finish(self) -> str | None:
        """Read what no tensor covered; the first entry whose CRC-32 is wrong (archive order), or None."""
        while self.k < len(self.stored):
            e = self.stored[self.k]
            self._read_to(e.data_start + e.csize)
            self._next()
        if self.short:
            return self.short  # (the file shrank since level full checked its size)
        counter = zr.Counter()
        for e in self.order:
            reason = (
                zr.crc_mismatch(e, self.crcs[id(e)])
                if id(e) in self.crcs
                else zr.crc_entry(self.fh, e, counter)
            )
            if reason:
                return f"{self.where[id(e)]()}: {reason}" if id(e) in self.where else reason
        self.extra += counter.bytes_read
        return None


def _prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class _Mapper:
    """Maps windows of one file on demand; the previous window is unmapped when the next is needed."""

    def __init__(self, path: str) -> None:
        self.fh = open_regular(path, "checkpoint file")
        if not hasattr(
            self.fh, "raw"
        ):  # an object-storage file (storage/remote.py): mmap would see no data
            self.fh.close()

            raise ReadError(
                f"{path}: level deep needs a local file",
                "level deep needs a local file (object storage)",
            )
        self.size = os.fstat(self.fh.fileno()).st_size
        self.mm: mmap.mmap | None = None
        self.start = self.end = 0

    def view(self, offset: int, nbytes: int) -> tuple[mmap.mmap, int]:
        """(map, offset inside it) covering [offset, offset+nbytes); nbytes <= WINDOW."""
        if offset < 0 or offset + nbytes > self.size:
            raise ValueError(
                f"bytes {offset}..{offset + nbytes} lie past the end of the file ({self.size} bytes)"
            )
        if self.mm is None or offset < self.start or offset + nbytes > self.end:
            self.close_map()
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            end = min(self.size, max(offset + nbytes, start + WINDOW))
            if end == start:
                end = start + 1
            # not MAP_POPULATE: 5-10 % less CPU warm, but cold it reads the whole window before the scan starts
            self.mm = mmap.mmap(
                self.fh.fileno(), end - start, access=mmap.ACCESS_READ, offset=start
            )
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
    """Per-chunk numeric reduction with reusable scratch buffers (no allocation per chunk)."""

    def __init__(self, want_max: bool, kernels: Any = None) -> None:
        import numpy as np

        self.np = np
        self.want_max = want_max
        self.kernels = kernels
        self.m16 = np.empty(CHUNK16, dtype=np.uint16)  # 16-bit magnitudes (sign cleared)
        self.u32 = np.empty(
            CHUNK16, dtype=np.uint32
        )  # 16-bit values widened to float32 bit patterns
        self.f32 = self.u32.view(np.float32)
        self.f16_scale = np.float32(2.0**112)
        vecdot = getattr(
            np, "vecdot", None
        )  # numpy >= 2.0; before it, a batched matmul does the same
        self.rowdots = vecdot or (lambda a, b: np.matmul(a[:, None, :], b[:, :, None]).reshape(-1))

    def widen(self, raw, dtype: str):
        """Exact float32 (or float64) values of a chunk (the slow path: re-checks, scalars)."""
        np = self.np
        if dtype == "float16":
            return raw.view(np.float16).astype(np.float32)
        if dtype == "bfloat16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw

    def feed(self, st: Stat, raw, dtype: str) -> None:
        if dtype == "bfloat16":
            done = self.bf16(st, raw)
        elif dtype == "float16":
            done = self.f16(st, raw)
        else:
            self.chunk(st, raw)
            return
        if not done:
            self.chunk(st, self.widen(raw, dtype))  # exact re-check of this chunk

    def bf16(self, st: Stat, raw) -> bool:
        """bfloat16 is the top half of a float32: two values per uint32 word (a 16-bit shift, a mask) into
        one reused buffer, one dot. False when the dot is not finite (the caller re-checks exactly)."""
        np = self.np
        if self.kernels is not None:
            d = self.kernels.bf16_sumsq(raw)
            if d != d or d == float("inf"):
                return False
            st.sumsq += d
            if self.want_max:
                m = self.m16[: len(raw)]
                np.bitwise_and(raw, 0x7FFF, out=m)
                self._max_bits(st, int(m.max()) << 16, np.uint32, np.float32)
            return True
        n = len(raw)
        u = self.u32
        if n % 2 == 0:
            w = raw.view(np.uint32)
            k = n // 2
            np.left_shift(w, 16, out=u[:k])
            np.bitwise_and(w, 0xFFFF0000, out=u[k:n])
        else:
            np.copyto(u[:n], raw)
            np.left_shift(u[:n], 16, out=u[:n])
        d = self.sumsq(self.f32[:n])
        if d != d or d == float("inf"):
            return False
        st.sumsq += d
        if self.want_max:
            m = self.m16[:n]
            np.bitwise_and(raw, 0x7FFF, out=m)
            self._max_bits(st, int(m.max()) << 16, np.uint32, np.float32)
        return True

    def f16(self, st: Stat, raw) -> bool:
        """float16: non-finite exactly when the exponent bits are all ones, so the max of `x & 0x7fff` is
        >= 0x7c00 iff an Inf/NaN is present (one and-pass, one uint16 reduction). Otherwise exponent and
        mantissa shifted by 13 and scaled by 2**112 are the exact float32 value (zero and subnormals
        included): one widening copy, a shift, a multiply and a dot in reused buffers."""
        np = self.np
        n = len(raw)
        m = self.m16[:n]
        if self.kernels is not None:
            d = self.kernels.f16_sumsq(raw)
            if d != d or d == float("inf"):
                return False
            st.sumsq += d
            if self.want_max:
                np.bitwise_and(raw, 0x7FFF, out=m)
                self._max_bits(st, int(m.max()), np.uint16, np.float16)
            return True
        np.bitwise_and(raw, 0x7FFF, out=m)
        top = int(m.max())
        if top >= 0x7C00:
            return False
        u = self.u32[:n]
        np.copyto(u, m)
        np.left_shift(u, 13, out=u)
        f = self.f32[:n]
        np.multiply(f, self.f16_scale, out=f)
        st.sumsq += self.sumsq(f)
        if self.want_max:
            self._max_bits(st, top, np.uint16, np.float16)
        return True

    def negatives(self, raw, dtype: str) -> int:
        """Values below zero in a chunk (-Inf included, NaN and -0.0 not): 16-bit values by their bits."""
        np = self.np
        lim = _NEG_LIMIT16.get(dtype)
        if lim is None:
            return int(np.count_nonzero(raw < 0))
        return int(np.count_nonzero((raw > 0x8000) & (raw <= lim)))

    def sumsq(self, x) -> float:
        """Sum of squares: float32 dots of ROW values each (one BLAS call per chunk), added in float64. A
        single float32 dot over 64 Ki squares can be 2e-6 off when the values have few significant bits
        (bfloat16 data); rows of 4096 keep it near 1e-7. NaN/Inf anywhere make the result non-finite."""
        np = self.np
        n = len(x)
        k = n - n % ROW
        s = 0.0
        if k:
            rows = x[:k].reshape(-1, ROW)
            s = float(self.rowdots(rows, rows).sum(dtype=np.float64))
        if n > k:
            s += float(np.dot(x[k:], x[k:]))
        return s

    def _max_bits(self, st: Stat, bits: int, int_type, float_type) -> None:
        """max |x| from the largest magnitude bit pattern (finite values of one sign order as their bits)."""
        m = float(self.np.array([bits], dtype=int_type).view(float_type)[0])
        if st.max_abs is None or m > st.max_abs:
            st.max_abs = m

    def chunk(self, st: Stat, x) -> None:
        np = self.np
        d = self.sumsq(x)
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
    return {
        "float32": np.float32,
        "float64": np.float64,
        "float16": np.uint16,
        "bfloat16": np.uint16,
    }[dtype]


def _scan_job(
    mapper: _Mapper, red: _Reducer, job: Job, st: Stat, crc: _CrcCursor | None = None
) -> int:
    """A float tensor's values, reduced chunk by chunk (each chunk's bytes through `crc` too): the bytes read."""
    item = _ITEM[job.dtype]
    numel = st.numel
    if numel == 0:
        st.checked = True
        return 0
    if job.stride is not None:
        if job.span * item <= STRIDED_MAX:
            return _scan_strided(mapper, red, job, st, crc)
        st.note = "non-contiguous view larger than 32 MB: figures cover its whole storage span"
        numel = job.span
    np = red.np
    npdt = _np_dtype(np, job.dtype)
    pos = 0
    step = CHUNK_ELEMS if item > 2 else CHUNK16
    per_window = max(step, (WINDOW // item) // step * step)
    while pos < numel:
        count = min(per_window, numel - pos)
        mm, off = mapper.view(job.offset + pos * item, count * item)
        arr = np.frombuffer(mm, dtype=npdt, count=count, offset=off)
        mv = memoryview(mm)[off : off + count * item] if crc is not None else None
        for i in range(0, count, step):
            raw = arr[i : i + step]
            red.feed(st, raw, job.dtype)
            if job.count_negative:
                st.negative += red.negatives(raw, job.dtype)
            if crc is not None and mv is not None:  # the same bytes, while they are in cache
                crc.feed(job.offset + (pos + i) * item, mv[i * item : (i + step) * item])
        if job.scalar_value and numel == 1:
            st.value = float(red.widen(arr[:1], job.dtype)[0])
        del arr, raw, mv
        pos += count
    st.checked = True
    return numel * item


def _scan_strided(
    mapper: _Mapper, red: _Reducer, job: Job, st: Stat, crc: _CrcCursor | None
) -> int:
    """A non-contiguous view (its storage span up to STRIDED_MAX) gathered exactly, then reduced."""
    np = red.np
    item = _ITEM[job.dtype]
    span = job.span
    nbytes = span * item
    mm, off = mapper.view(job.offset, nbytes)
    if crc is not None:
        crc.feed(job.offset, memoryview(mm)[off : off + nbytes])
    base = np.frombuffer(mm, dtype=_np_dtype(np, job.dtype), count=span, offset=off)
    view = np.lib.stride_tricks.as_strided(
        base, shape=job.shape, strides=tuple(s * item for s in job.stride or ())
    )
    flat = np.ascontiguousarray(view).reshape(-1)
    del base, view
    step = CHUNK_ELEMS if item > 2 else CHUNK16
    for i in range(0, len(flat), step):
        raw = flat[i : i + step]
        red.feed(st, raw, job.dtype)
        if job.count_negative:
            st.negative += red.negatives(raw, job.dtype)
    if job.scalar_value and len(flat) == 1:
        st.value = float(red.widen(flat[:1], job.dtype)[0])
    del flat
    st.checked = True
    return nbytes


def _touch(mapper: _Mapper, offset: int, nbytes: int) -> int:
    """Read `nbytes` from `offset` (window by window; an unreadable byte raises OSError): returns nbytes."""
    import numpy as np

    pos = 0
    while pos < nbytes:
        count = min(WINDOW // 2, nbytes - pos)
        mm, off = mapper.view(offset + pos, count)
        arr = np.frombuffer(mm, dtype=np.uint8, count=count, offset=off)
        arr.max()
        del arr
        pos += count
    return nbytes


def _int_scalar(mapper: _Mapper, job: Job) -> float:
    """The value of a one-element integer tensor (e.g. an optimizer's int64 `step`)."""
    import numpy as np

    dt = np.dtype(_INT_ITEM[job.dtype])
    mm, off = mapper.view(job.offset, dt.itemsize)
    return float(np.frombuffer(mm, dtype=dt, count=1, offset=off)[0])


def kernels(nbytes16: int) -> Any:
    """The compiled 16-bit kernels (module `kernels`) when a scan has enough 16-bit bytes to repay loading
    them and numba works here; else None (the numpy path)."""
    if os.environ.get("CHECKPOINT_STRATEGY_KERNELS", "").lower() in (
        "0",
        "off",
        "no",
        "false",
        "numpy",
    ):
        return None
    if nbytes16 < KERNEL_MIN_BYTES and not _load_kernels.cache_info().currsize:
        return None  # (once loaded in this process, e.g. by a training loop's callback, they cost nothing)
    return _load_kernels()


@lru_cache(maxsize=1)
def _load_kernels() -> Any:
    try:
        from checkpoint_strategy.formats import kernels as compiled
    except Exception:  # noqa: BLE001 - no numba, or it cannot compile here: the numpy path, same figures
        return None
    return compiled


#: one file's CRC-32 work for `scan`: its name in messages, its entries, id(entry) -> what a finding names first
CrcFile = tuple[str, list[zr.ZipEntry], dict[int, Callable[[], str]] | None]


@dataclass
class _FileScan:
    """One file's part of a scan: its tensors' figures, the bytes they took, a read error; the CRC finding."""

    stats: list[Stat]
    scanned: int = 0
    error: str | None = None
    crc_problem: str | None = None
    crc_bytes: int = 0


def _scan_file(
    path: str,
    jobs: list[Job],
    want_max: bool,
    kern: Any = None,
    entries: list[zr.ZipEntry] | None = None,
    where: dict[int, Callable[[], str]] | None = None,
) -> _FileScan:
    """Every job of one file in offset order (`entries`: the archive's entries, CRC-checked in the same pass;
    `where`: see _CrcCursor)."""
    red = _Reducer(want_max, kern)
    try:
        mapper = _Mapper(path)
    except Exception as exc:  # noqa: BLE001 - ReadError / OSError: reported as the file's problem
        reason = getattr(exc, "reason", None) or str(exc)
        return _FileScan(
            [
                Stat(j.file, j.name, j.role, j.dtype, j.shape, _prod(j.shape), note=reason)
                for j in jobs
            ],
            error=reason,
        )
    out = _FileScan([])
    crc = _CrcCursor(mapper.fh, entries, where) if entries else None
    try:
        for job in sorted(jobs, key=lambda j: j.offset):
            st = Stat(job.rel, job.name, job.role, job.dtype, tuple(job.shape), _prod(job.shape))
            out.stats.append(st)
            try:
                out.scanned += _scan_one(mapper, red, job, st, crc)
            except (ValueError, OSError) as exc:
                out.error = f"tensor {job.name}: {exc}"
                return out
        if crc is not None:
            out.crc_problem = crc.finish()
            out.crc_bytes = crc.extra
    finally:
        mapper.close()
    return out


def _scan_one(mapper: _Mapper, red: _Reducer, job: Job, st: Stat, crc: _CrcCursor | None) -> int:
    """One job: a float tensor's values reduced, another's bytes read through (its value when it is a scalar)."""
    if job.dtype in FLOAT_DTYPES:
        return _scan_job(mapper, red, job, st, crc)
    st.note = f"{job.dtype}: not a float, skipped"
    if job.scalar_value and job.dtype in _INT_ITEM and st.numel == 1:
        st.value = _int_scalar(mapper, job)  # an integer step counter
    return _touch(mapper, job.offset, job.nbytes)


def _scan_file_quiet(
    path: str,
    jobs: list[Job],
    want_max: bool,
    kern: Any = None,
    entries: list[zr.ZipEntry] | None = None,
    where: dict[int, Callable[[], str]] | None = None,
) -> _FileScan:
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):  # a float32 overflow is re-checked exactly
        return _scan_file(path, jobs, want_max, kern, entries, where)


def scan(
    jobs: list[Job],
    want_max: bool = False,
    workers: int | None = None,
    crc: dict[str, CrcFile] | None = None,
) -> ScanOutcome:
    """Scan every job; files in parallel, each file in one pass in offset order. `crc`: path -> (its name in
    messages, the torch archive's entries, what a finding names before each entry or None), each file's entries
    CRC-checked in the same pass (a file without a job is read for its CRC alone). A DCP storage file's entries are
    those of every item archive in it, at their offsets in the file."""
    by_file: dict[str, list[Job]] = {}
    rel = {f: c[0] for f, c in (crc or {}).items()}
    for j in jobs:
        if j.stride is not None:
            j.span = _span(j)
        by_file.setdefault(j.file, []).append(j)
        rel[j.file] = j.rel
    for f in crc or {}:
        by_file.setdefault(f, [])
    out = ScanOutcome()
    n = min(workers or WORKERS, len(by_file)) or 1
    files = sorted(by_file, key=lambda f: -sum(_prod(j.shape) for j in by_file[f]))
    kern = kernels(sum(2 * _prod(j.shape) for j in jobs if j.dtype in ("float16", "bfloat16")))

    def one(f: str) -> _FileScan:
        _name, entries, where = (crc or {}).get(f, ("", None, None))
        return _scan_file_quiet(f, by_file[f], want_max, kern, entries, where)

    if n == 1:
        results = [one(f) for f in files]
    else:
        with ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(one, files))
    for f, r in zip(files, results):
        out.stats.extend(r.stats)
        out.bytes_scanned += r.scanned
        out.bytes_crc += r.crc_bytes
        if r.error:
            out.problems.append((rel[f], f"cannot scan values: {r.error}"))
        if r.crc_problem:
            out.crc_problems.append((rel[f], r.crc_problem))
    return out


def _span(job: Job) -> int:
    """Elements from the view's first to its last element (inclusive)."""
    if _prod(job.shape) == 0:
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(job.shape, job.stride or ()))
