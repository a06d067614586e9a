"""The one zip reader and the safetensors header, read without executing anything.

A zip archive (torch.save, the archives inside a DCP .distcp) is read in three steps, each returning what it
found or the one-line reason it stopped:

- `read_directory(src, size)`: the end record (and zip64 records) and the central directory -> the entries and
  the directory's offset. Every offset and size a record declares is checked against the real size first.
- `local_headers(src, entries, cd_offset, counter, full)`: every entry's local header against the directory
  (sets `ZipEntry.data_start`) -> the first finding, or None.
- `read_entry(src, e, counter, limit)` -> a small entry's bytes (inflated when deflated); `crc_entry` /
  `crc_entries` -> the CRC-32 of entries streamed in flat memory (a zip bomb cannot grow it).

`src` is an open binary file, a `Window` on one (an archive embedded in a bigger file) or an `InMemory` (a small
archive read whole in one read: every record is then unpacked from its bytes, and the directory pass checks the
usual local header, a stored entry whose header carries its name, on the way). The safetensors header:
`st_head` (its bytes), `check_st_header` (what the safetensors loader needs of it) and `safetensors_header`.
"""

from __future__ import annotations

import io
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Literal, Protocol, TypeAlias, cast

from checkpoint_strategy.storage import (
    ReadError,
    describe_os_error,
    loads_json,
    open_regular,
    read_small,
)

try:  # optional accelerator: ISA-L's CRC-32 is ~3x zlib's (same polynomial, same values)
    from isal.isal_zlib import crc32 as _isal_crc32

    crc32: Callable[..., int] = _isal_crc32
    CRC32_IMPL = "isal"
except Exception:  # noqa: BLE001 - stdlib fallback
    crc32 = zlib.crc32
    CRC32_IMPL = "zlib"

CHUNK = 4 << 20  # streaming chunk: memory stays flat whatever the file size
# Full-level CRC of zip entries runs on several threads (zlib's and ISA-L's CRC-32 both release the GIL), each
# with its own file handle and one CHUNK buffer, so memory stays flat. Small archives are not worth the threads.
# The count is a measured rule (bench/bench_validate.py, docs/benchmarks.md): one thread per core this process
# may use (its CPU affinity, capped by a cgroup CPU quota), at most MAX_CRC_WORKERS. On the 2-core machine,
# under a load of 12, a 1 GB archive of 512 MB entries ran at a median 0.69x cat's rate on one thread, 0.85x
# on two and 0.66x on four with ISA-L (more threads than cores: the copies thrash); 0.17x / 0.21x / 0.24x
# with zlib's slower CRC. None: the rule decides; a number (tests) overrides it.
CRC_WORKERS: int | None = None
MAX_CRC_WORKERS = 4
PARALLEL_MIN_BYTES = 64 << 20
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"

# Caps that keep memory bounded whatever a file declares (a zip bomb, a zip64 record pointing past a sparse
# file's data). A zip central directory is ~100 bytes per entry; the data.pkl of a 7B-parameter torch.save is
# about 100 KB (one record per tensor).
# data.pkl inflated for the quick-level scan (read_entry's default limit)
MAX_PICKLE_BYTES = 256 << 20
MAX_CD_BYTES = 64 << 20  # zip central directory (about 600k entries)
# torch.save writes every zip entry uncompressed (stored); a deflated entry means the archive was re-zipped.
# Inflating is streamed (flat memory) but capped so a bomb cannot burn minutes of CPU.
MAX_INFLATE_BYTES = 1 << 30

Kind = Literal["invalid", "incomplete", "not_resumable", "suspicious"]
Update = Callable[..., None]  # progress: update(update_bytes=n)


class Finding(str):
    """One problem found in a file: the one-line reason (a str, so lists of findings read as
    reasons) with its kind as a value: invalid (present but corrupt), incomplete (the save did not
    finish), not_resumable, suspicious (deep level)."""

    kind: Kind

    def __new__(cls, reason: str, kind: Kind = "invalid") -> Finding:
        obj = super().__new__(cls, reason)
        obj.kind = kind
        return obj


def truncated(reason: str) -> Finding:
    return Finding(reason, "incomplete")


@dataclass
class Counter:
    bytes_read: int = 0
    files: int = 0
    notes: list[str] = field(default_factory=list)
    # path -> bytes of each small file read whole
    sizes: dict[str, int] = field(default_factory=dict)


def read_failure(exc: BaseException) -> str:
    """The one wording of a read failure in a problem line: 'cannot read: permission denied',
    'is a FIFO: expected a regular file' (never "missing" or "corrupt" for an OS error)."""
    if isinstance(exc, ReadError):
        return exc.reason if exc.reason.startswith("is ") else f"cannot read: {exc.reason}"
    return f"cannot read: {describe_os_error(exc)}"


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity set, capped by a cgroup v2 CPU quota (cpu.max)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    try:
        with open(CGROUP_CPU_MAX) as fh:  # a system file, not user input
            quota, period = fh.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def crc_workers() -> int:
    """CRC threads for one archive's entries (see CRC_WORKERS)."""
    return CRC_WORKERS if CRC_WORKERS is not None else min(MAX_CRC_WORKERS, usable_cores())


# --------------------------------------------------------------------------- sources


class Readable(Protocol):
    def seek(self, pos: int, whence: int = 0, /) -> int: ...
    def read(self, n: int = -1, /) -> bytes: ...


class Window:
    """A file object seeing only bytes [base, base+length) of another (the torch archives inside a DCP .distcp)."""

    def __init__(self, fh: Readable, base: int, length: int) -> None:
        self.fh, self.base, self.length, self.pos = fh, base, length, 0

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.length + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.pos if n < 0 else max(0, min(n, self.length - self.pos))
        self.fh.seek(self.base + self.pos)
        data = self.fh.read(n)
        self.pos += len(data)
        return data

    def readinto(self, buf: memoryview | bytearray) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)


class InMemory(io.BytesIO):
    """A small file's bytes, read once (`data`: its size is len(data))."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.data = data


Source: TypeAlias = "InMemory | Window | IO[bytes]"


def source_size(src: Source) -> int:
    """The archive's size: an in-memory one's length, a window's, a file's."""
    if isinstance(src, InMemory):
        return len(src.data)
    if isinstance(src, Window):
        return src.length
    return os.fstat(src.fileno()).st_size


# --------------------------------------------------------------------------- safetensors header

# safetensors dtype -> bits per element
ST_DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
ST_MAX_HEADER = 100_000_000  # the safetensors library refuses larger headers
ST_SMALL_BYTES = 1 << 16  # a safetensors file no bigger is read whole in one read (quick level)


def st_head(src: bytes | IO[bytes], size: int) -> tuple[bytes, int] | list[Finding]:
    """(the JSON header's bytes, the data's size) of a safetensors file (`src`: its bytes, or it open), or the
    reason it has none."""
    if size == 0:
        return [
            Finding(
                "zero-byte file (expected an 8-byte header length, a JSON header and tensor data)"
            )
        ]
    if size < 8:
        return [truncated(f"truncated: {size} bytes, shorter than the 8-byte header length")]
    (hlen,) = struct.unpack_from("<Q", src[:8] if isinstance(src, bytes) else src.read(8))
    if hlen > ST_MAX_HEADER or 8 + hlen > size:
        return [Finding(f"broken header: header length {hlen} does not fit in a {size}-byte file")]
    raw = src[8 : 8 + hlen] if isinstance(src, bytes) else src.read(hlen)
    return raw, size - 8 - hlen


def _st_entry(name: str, info: object) -> tuple[int, int] | str:
    """One tensor's (begin, end) data offsets, checked against its dtype and shape; or why not."""
    if type(info) is not dict or len(info) != 3:
        return f"broken header: entry {name!r} is not {{dtype, shape, data_offsets}}"
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if type(dtype) is not str or dtype not in ST_DTYPE_BITS:
        return f"broken header: tensor {name!r} has unknown dtype {dtype!r}"
    if type(shape) is not list:
        return f"broken header: tensor {name!r} has an invalid shape {shape!r}"
    numel = 1
    for d in shape:  # (one loop: each an int, not a bool, none negative; and their product)
        if type(d) is not int or d < 0:
            return f"broken header: tensor {name!r} has an invalid shape {shape!r}"
        numel *= d
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or type(offsets[0]) is not int
        or type(offsets[1]) is not int
        or not 0 <= offsets[0] <= offsets[1]
    ):
        return f"broken header: tensor {name!r} has invalid data_offsets {offsets!r}"
    expected = (numel * ST_DTYPE_BITS[dtype] + 7) // 8
    if offsets[1] - offsets[0] != expected:
        return (
            f"broken header: tensor {name!r} {dtype}{shape} needs {expected} bytes, "
            f"data_offsets span {offsets[1] - offsets[0]}"
        )
    return offsets[0], offsets[1]


def check_st_header(raw: bytes, data_size: int) -> list[Finding]:
    """What the safetensors loader needs of a header: JSON object, every entry {dtype, shape, data_offsets}
    consistent, the tensors tiling the data exactly."""
    try:
        header = loads_json(raw, "safetensors header", expect=dict)
    except ReadError as exc:
        if exc.reason.startswith("not a JSON object"):
            return [Finding("broken header: JSON header is not an object")]
        return [Finding(f"broken header: JSON header is {exc.reason[:120]}")]
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            if type(info) is not dict or not all(type(v) is str for v in info.values()):
                return [Finding("broken header: __metadata__ must map strings to strings")]
            continue
        span = _st_entry(name, info)
        if isinstance(span, str):
            return [Finding(span)]
        spans.append((span[0], span[1], name))
    if not spans:
        return [Finding("no tensors: the header lists none (an empty or aborted save)")]
    return _st_tiling(sorted(spans), data_size)


def _st_tiling(spans: list[tuple[int, int, str]], data_size: int) -> list[Finding]:
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            what = "overlaps the previous tensor" if begin < pos else f"leaves a gap at byte {pos}"
            return [Finding(f"broken header: tensor {name!r} {what}")]
        pos = end
    if pos != data_size:
        if pos > data_size:
            return [
                truncated(f"truncated: header describes {pos} data bytes, file holds {data_size}")
            ]
        return [
            Finding(
                f"file size mismatch: header describes {pos} data bytes, file holds {data_size} "
                "(trailing bytes)"
            )
        ]
    return []


def safetensors_header(path: str, regular: bool = False) -> tuple[dict, int] | None:
    """The parsed header and the offset of the data after it, or None (index.json cross-checks, deep's jobs). A
    file of at most ST_SMALL_BYTES is read whole with plain reads on its descriptor (storage.read_small: no file
    object); a bigger one is read from its start. ``regular``: the caller's listing saw a regular file."""
    try:
        got = read_small(path, "file", ST_SMALL_BYTES, regular=regular)
        if isinstance(got, bytes):
            (hlen,) = struct.unpack_from("<Q", got)  # (struct.error: fewer than 8 bytes)
            if hlen > ST_MAX_HEADER:
                return None
            return loads_json(got[8 : 8 + hlen], "safetensors header", expect=dict), 8 + hlen
        with got as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            if hlen > ST_MAX_HEADER:
                return None
            return loads_json(fh.read(hlen), "safetensors header", expect=dict), 8 + hlen
    except (OSError, ReadError, struct.error):
        return None


# --------------------------------------------------------------------------- zip: directory

_EOCD = b"PK\x05\x06"
_EOCD64_LOC = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_CDH = b"PK\x01\x02"
LFH = b"PK\x03\x04"
# the end record, the zip64 end record and its locator
_EOCD_RECORD = struct.Struct("<4sHHHHIIH")
_EOCD64_RECORD = struct.Struct("<4sQHHIIQQQQ")
_EOCD64_LOCATOR = struct.Struct("<4sIQI")
# a central directory record from its signature to its local header offset (offset 42): one unpack of the
# signature, flags, method, crc, sizes, name/extra/comment lengths, disk, external attributes and offset
# (versions, times and internal attributes skipped); it fails (struct.error) exactly when fewer than the record's
# 46 bytes are left
_CD_RECORD = struct.Struct("<4s4xHH4xIIIHHHH2xII")
# the MS-DOS folder bit of the external attributes: torch.load's reader (miniz) takes such an entry for a folder
# and extracts no bytes from it, whatever its sizes say
ZIP_DOS_FOLDER = 0x10
# a local header's signature and its name and extra-field lengths (offsets 0, 26, 28): one unpack
_LH_RECORD = struct.Struct("<4s22xHH")
_LH_LENS = struct.Struct("<HH")  # a local header's name and extra-field lengths (offset 26)
# the end-record search reads this much of a file's end; a file up to SMALL_ZIP_BYTES is read whole once and
# every later read is served from memory: one read of 1 MiB costs about what the tail read and a seek + read per
# local header cost (a real Trainer's optimizer.pt of a small model: ~100 entries in 250 kB)
ZIP_TAIL_BYTES = 22 + 65535 + 20
SMALL_ZIP_BYTES = 1 << 20
ZIP_SHORT_TAIL = 1 << 10  # the end-record search's first read of a file (`_tail`)
# general-purpose flag bits torch.load refuses: encrypted (0), patched data (5), strong encryption (6),
# masked local headers (13)
ZIP_REFUSED_FLAGS = 0x2061


@dataclass(slots=True)
class ZipEntry:
    name: str
    method: int
    crc: int
    csize: int
    usize: int
    offset: int  # local header offset
    # the data's start, set by `local_headers`; in an archive held in memory, by `read_directory` for the usual local
    # headers it checks (`local_headers` checks the others, and leaves 0 where a file's check would: `unread`)
    data_start: int = 0


# the entries and the central directory's offset
Directory: TypeAlias = "tuple[list[ZipEntry], int]"
_End: TypeAlias = "tuple[int, int, int, int, int, int, int]"  # disk, cd disk, entries here, entries, size, offset, at


def read_directory(src: Source, size: int) -> Directory | str:
    """Parse the end record and central directory. Returns (entries, cd_offset) or a reason.

    Every offset and size a record declares is checked against the real file size (and the
    central directory against MAX_CD_BYTES) before anything is read: a zip64 record pointing far
    past the data of a sparse file never turns into a huge allocation. From an `InMemory` source each
    stored entry's local header is checked on the way (`data_start` set when it is the usual one)."""
    try:
        end = _end_records(src, size)
        if isinstance(end, str):
            return end
        disk, _cd_disk, _n_disk, n_entries, cd_size, cd_offset, _at = end
        if isinstance(src, InMemory):
            whole = src.data
            parsed = _cd_records(whole, cd_offset, cd_offset + cd_size, n_entries, disk, whole)
        else:
            src.seek(cd_offset)
            cd = src.read(cd_size)
            if len(cd) != cd_size:
                return "truncated central directory"
            parsed = _cd_records(cd, 0, cd_size, n_entries, disk, None)
    except struct.error:
        return "broken central directory (a record is cut short)"
    if isinstance(parsed, str):
        return parsed
    return parsed, cd_offset


def _tail(src: Source, size: int) -> tuple[bytes, int]:
    """The last ZIP_TAIL_BYTES of a file, or of a window on one, and their offset (an archive in memory no longer
    than that is its own tail: `_end_records`). The file's last ZIP_SHORT_TAIL bytes first: when they hold an end
    record with its locator's 20 bytes before it, that is the one the whole tail's last match finds (torch writes
    no comment), and the rest is not read."""
    tail_len = min(size, ZIP_TAIL_BYTES)
    if tail_len > ZIP_SHORT_TAIL and not isinstance(src, InMemory):
        src.seek(size - ZIP_SHORT_TAIL)
        short = src.read(ZIP_SHORT_TAIL)
        if short.rfind(_EOCD) >= 20:
            return short, size - len(short)
    src.seek(size - tail_len)
    return src.read(tail_len), size - tail_len


def _end_records(src: Source, size: int) -> _End | str:
    """The end record's fields (from the zip64 record when there is one, as torch.load's reader takes them),
    checked against the file; or a reason. (One function with the checks: a small archive's directory step is a
    few Python calls, each one counts.)"""
    if size <= ZIP_TAIL_BYTES and isinstance(src, InMemory):  # (its bytes are its tail)
        tail, base = src.data, 0
    else:
        tail, base = _tail(src, size)
    pos = tail.rfind(_EOCD)
    if pos < 0 or len(tail) - pos < 22:
        return "truncated or not a zip archive: no end-of-central-directory record"
    (_sig, disk, cd_disk, n_disk, n_entries, cd_size, cd_offset, comment_len) = (
        _EOCD_RECORD.unpack_from(tail, pos)
    )
    if pos + 22 + comment_len != len(tail):
        return "trailing bytes after the zip end record (file changed after it was written?)"
    eocd_at = base + pos
    # torch.save writes both records; torch.load's reader then takes every field from zip64 (the locator: the 20
    # bytes before the end record)
    if pos >= 20 and tail[pos - 20 : pos - 16] == _EOCD64_LOC:
        z64 = _zip64_end(src, tail[pos - 20 : pos], size)
        if isinstance(z64, str):
            return z64
        if z64 is not None:
            disk, cd_disk, n_disk, n_entries, cd_size, cd_offset, eocd_at = z64
    else:
        z64 = None
    if z64 is None and (n_entries == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF):
        return "broken zip64 end record locator"
    if n_disk != n_entries or ((disk | cd_disk) and (disk, cd_disk) != (1, 1)):
        return (
            f"multi-disk archive (disk {disk}, central directory on disk {cd_disk}, {n_disk} of {n_entries} "
            "entries on this disk): torch.load cannot read it"
        )
    if cd_offset + cd_size > eocd_at:
        return f"central directory ({cd_size} bytes at {cd_offset}) runs past its end record: truncated?"
    if cd_size > MAX_CD_BYTES:
        return (
            f"central directory of {cd_size} bytes is larger than the {MAX_CD_BYTES >> 20} MB this "
            "checker reads (a torch archive holds ~100 bytes per entry): not a plausible checkpoint"
        )
    if n_entries * 46 > cd_size:
        return f"broken central directory: {n_entries} entries cannot fit in {cd_size} bytes"
    return disk, cd_disk, n_disk, n_entries, cd_size, cd_offset, eocd_at


def _zip64_end(src: Source, loc: bytes, size: int) -> _End | str | None:
    """The zip64 end record the locator `loc` (the 20 bytes before the end record) points at, read as torch.load's
    reader (miniz) reads it: (disk, cd disk, entries on this disk, entries, cd size, cd offset, record offset);
    None when there is no record at its offset, a reason when miniz refuses the archive."""
    (_s, _d, at, disks) = _EOCD64_LOCATOR.unpack(loc)
    if at + 56 > size:
        return "broken zip64 end record offset"
    if isinstance(src, InMemory):
        rec = src.data[at : at + 56]
    else:
        src.seek(at)
        rec = src.read(56)
    if not rec.startswith(_EOCD64):
        return None
    (_s, rec_size, _v1, _v2, disk, cd_disk, n_disk, n_entries, cd_size, cd_offset) = (
        _EOCD64_RECORD.unpack(rec)
    )
    if rec_size < 44:
        return f"broken zip64 end record (declares {rec_size} bytes, at least 44 expected)"
    if disks != 1:
        return f"multi-disk archive (the zip64 locator counts {disks} disks): torch.load cannot read it"
    if max(n_disk, n_entries, cd_size) > 0xFFFFFFFF:
        return f"zip64 end record declares {n_entries} entries in {cd_size} bytes: more than torch.load reads"
    return disk, cd_disk, n_disk, n_entries, cd_size, cd_offset, at


def _cd_records(
    cd: bytes, p: int, end: int, n_entries: int, disk: int, whole: bytes | None
) -> list[ZipEntry] | str:
    """The central directory's records (`cd[p:end]`) as entries, or the first reason. `whole`: the archive's bytes
    (`cd` is then the same bytes): a stored entry whose local header carries its name, with its data before the
    directory, gets its `data_start` here (`local_headers` checks the others)."""
    entries: list[ZipEntry] = []
    unpack, lh_unpack = _CD_RECORD.unpack_from, _LH_RECORD.unpack_from
    append, new = entries.append, _new_entry
    top, m32, odd_flags, folder = p, 0xFFFFFFFF, ZIP_REFUSED_FLAGS, ZIP_DOS_FOLDER
    for i in range(n_entries):
        if p + 46 > end:
            return f"broken central directory at entry {i}"
        sig, flags, method, crc, csize, usize, nlen, xlen, clen, e_disk, attrs, offset = unpack(
            cd, p
        )
        q = p + 46 + nlen
        raw = cd[p + 46 : q] if q <= end else cd[p + 46 : end]
        name = raw.decode("utf-8", "replace")
        if (
            sig != _CDH
            or flags & odd_flags
            or attrs & folder
            or (e_disk != disk and e_disk != 1)
            or csize == m32
            or usize == m32
            or offset == m32
        ):  # anything but the usual record
            extra = cd[min(q, end) : min(q + xlen, end)]
            odd = _odd_record(
                i, sig, flags, e_disk, disk, attrs, name, extra, (csize, usize, offset)
            )
            if isinstance(odd, str):
                return odd
            csize, usize, offset = odd
        e = new(ZipEntry)  # (its fields set here: a dataclass __init__ is one more call an entry)
        e.name = name
        e.method = method
        e.crc = crc
        e.csize = csize
        e.usize = usize
        e.offset = offset
        e.data_start = 0
        # (a stored entry's usual local header, its name's bytes compared with a slice: bytes.startswith parses
        # its arguments the slow way; `raw` is shorter than nlen only when the name runs past the directory, which
        # the next record's check or the size check reports)
        if whole is not None and not method and csize == usize and offset + 30 <= top:
            lsig, lnlen, lxlen = lh_unpack(whole, offset)
            start = offset + 30 + lnlen + lxlen
            if lsig == LFH and lnlen == nlen and start + csize <= top:
                if whole[offset + 30 : start - lxlen] == raw:
                    e.data_start = start
        append(e)
        p = q + xlen + clen
    if p != end:
        return f"central directory size mismatch ({p - top} parsed, {end - top} declared)"
    return entries


_new_entry = object.__new__


def _odd_record(
    i: int,
    sig: bytes,
    flags: int,
    e_disk: int,
    disk: int,
    attrs: int,
    name: str,
    extra: bytes,
    sizes: tuple[int, int, int],
) -> tuple[int, int, int] | str:
    """A central directory record out of the usual: the reason torch.load's reader (miniz) refuses it, or its
    (compressed size, size, offset) with the zip64 extra field's values."""
    if sig != _CDH:
        return f"broken central directory at entry {i}"
    if flags & ZIP_REFUSED_FLAGS or (e_disk != disk and e_disk != 1):
        what = (
            f"on disk {e_disk} of a multi-disk archive"
            if e_disk not in (disk, 1)
            else "marked encrypted or patched"
        )
        return f"entry {name!r} is {what} (general-purpose flags 0x{flags:04x}): torch.load cannot read it"
    if attrs & ZIP_DOS_FOLDER and not name.endswith("/"):
        return (
            f"entry {name!r} is marked a folder (external attributes 0x{attrs:08x}): torch.load reads no "
            "bytes from it"
        )
    if 0xFFFFFFFF in sizes:
        return _zip64_extra(extra, *sizes)
    return sizes


def _zip64_extra(extra: bytes, csize: int, usize: int, offset: int) -> tuple[int, int, int]:
    i = 0
    while i + 4 <= len(extra):
        tag, ln = struct.unpack("<HH", extra[i : i + 4])
        if tag == 1:
            vals = list(struct.unpack(f"<{ln // 8}Q", extra[i + 4 : i + 4 + (ln // 8) * 8]))
            if usize == 0xFFFFFFFF and vals:
                usize = vals.pop(0)
            if csize == 0xFFFFFFFF and vals:
                csize = vals.pop(0)
            if offset == 0xFFFFFFFF and vals:
                offset = vals.pop(0)
            break
        i += 4 + ln
    return csize, usize, offset


# --------------------------------------------------------------------------- zip: local headers


def local_headers(
    src: Source, entries: list[ZipEntry], cd_offset: int, counter: Counter, full: bool
) -> Finding | None:
    """Every entry's local header (sets e.data_start); the first finding, or None. Each header and the
    name after it are one read (a slice of an archive held in memory, whose usual headers `read_directory`
    checked already)."""
    in_memory = isinstance(src, InMemory)
    if in_memory:  # the usual headers, checked by `read_directory` (their data_start set)
        for e in entries:
            if not e.data_start:
                break
        else:
            counter.bytes_read += 30 * len(entries)
            return None
    lens = _LH_LENS.unpack_from
    for i, e in enumerate(entries):
        if in_memory and e.data_start:
            continue
        off = e.offset
        # the name's length in bytes when it is ASCII (else read again below)
        want = 30 + len(e.name)
        src.seek(off)
        lh = src.read(want)
        # the usual case: stored, all in order
        if not in_memory and len(lh) == want and lh.startswith(LFH):
            nlen, xlen = lens(lh, 26)
            start = off + 30 + nlen + xlen
            if (
                nlen == want - 30
                and e.method == 0
                and e.csize == e.usize
                and start + e.csize <= cd_offset
                and lh[30:].decode("utf-8", "replace") == e.name
            ):
                e.data_start = start
                continue
        # every other case, and the finding's words
        finding = _local_header_finding(src, lh, e, cd_offset, full)
        if finding is not None:
            counter.bytes_read += 30 * (i + 1)
            unread(entries[i + 1 :])
            return finding
    counter.bytes_read += 30 * len(entries)
    return None


def unread(entries: list[ZipEntry]) -> None:
    """Entries whose local headers were not read (the scan stopped before them): no data_start, as from a file (an
    archive in memory had its usual headers' set by `read_directory`)."""
    for e in entries:
        e.data_start = 0


def _local_header_finding(
    src: Source, lh: bytes, e: ZipEntry, cd_offset: int, full: bool
) -> Finding | None:
    """One entry's local header (`lh`: its bytes from the header on): present, same name, data before the
    central directory, a method torch reads with consistent sizes (sets e.data_start); the finding, or None."""
    if len(lh) < 30 or not lh.startswith(LFH):
        return Finding(f"broken local header for entry {e.name!r} at offset {e.offset}")
    nlen, xlen = _LH_LENS.unpack_from(lh, 26)
    raw = lh[30 : 30 + nlen]
    if len(lh) - 30 != nlen:  # a name of another length (or not ASCII): read exactly its nlen bytes
        src.seek(e.offset + 30)
        raw = src.read(nlen)
    name = raw.decode("utf-8", "replace")
    if name != e.name:
        return Finding(f"entry name mismatch: central directory {e.name!r}, local header {name!r}")
    e.data_start = e.offset + 30 + nlen + xlen
    if e.data_start + e.csize > cd_offset:
        return truncated(
            f"entry {e.name!r} ({e.csize} bytes) runs past the central directory: truncated"
        )
    if e.method not in (0, 8):
        return Finding(f"entry {e.name!r} uses unsupported compression method {e.method}")
    if e.method == 0 and e.csize != e.usize:
        return Finding(f"entry {e.name!r}: stored sizes disagree ({e.csize} vs {e.usize})")
    if e.method == 8 and full and e.usize > MAX_INFLATE_BYTES:
        return Finding(
            f"entry {e.name!r} is deflated to inflate to {e.usize} bytes, more than "
            f"the {MAX_INFLATE_BYTES >> 30} GB this checker inflates (torch.save "
            "stores entries uncompressed: a re-zipped archive or a zip bomb)"
        )
    return None


# --------------------------------------------------------------------------- zip: entry bytes and CRC-32


def read_entry(
    src: Source, e: ZipEntry, counter: Counter, limit: int = MAX_PICKLE_BYTES
) -> bytes | str:
    """A (small) entry's bytes, decompressed with a cap from its declared size; or a reason."""
    if e.usize > limit or e.csize > limit:
        return f"entry {e.name!r} declares {e.usize} bytes (more than {limit >> 20} MB): not read"
    if isinstance(src, InMemory):
        data = src.data[e.data_start : e.data_start + e.csize]
    else:
        src.seek(e.data_start)
        data = src.read(e.csize)
    counter.bytes_read += len(data)
    if e.method == 8:
        d = zlib.decompressobj(-15)
        try:
            data = d.decompress(data, e.usize + 1)
        except zlib.error as exc:
            return f"entry {e.name!r}: corrupt compressed data ({exc})"
    if len(data) != e.usize:
        return (
            f"entry {e.name!r}: size fields disagree ({'more than ' if len(data) > e.usize else ''}"
            f"{len(data)} bytes, its header declares {e.usize}): a zip bomb or a corrupt size field"
        )
    return data


def crc_entries(
    path: str, src: Source, entries: list[ZipEntry], counter: Counter, update: Update | None = None
) -> str | None:
    """CRC-32 of every entry; the first failing entry (in archive order) is reported. A big archive on disk is
    checked on `crc_workers()` threads, each with its own handle on `path`."""
    workers = 1 if isinstance(src, (Window, InMemory)) else min(crc_workers(), len(entries))
    if workers < 2 or sum(e.csize for e in entries) < PARALLEL_MIN_BYTES:
        for e in entries:
            reason = crc_entry(src, e, counter, update)
            if reason:
                return reason
        return None
    lock = threading.Lock()

    def locked_update(**kw: int) -> None:
        with lock:
            if update is not None:
                update(**kw)

    def work(e: ZipEntry) -> tuple[str | None, int]:
        own = Counter()
        try:
            with open_regular(path) as own_fh:
                return crc_entry(
                    own_fh, e, own, locked_update if update is not None else None
                ), own.bytes_read
        except (OSError, ReadError) as exc:
            return f"entry {e.name!r}: {read_failure(exc)}", own.bytes_read

    # largest entries first keeps the threads evenly loaded; results come back in archive order
    order = sorted(range(len(entries)), key=lambda i: -entries[i].csize)
    from concurrent.futures import ThreadPoolExecutor  # big archives at level full only

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {i: pool.submit(work, entries[i]) for i in order}
        results = [futures[i].result() for i in range(len(entries))]
    counter.bytes_read += sum(n for _r, n in results)
    return next((r for r, _n in results if r), None)


def _inflate_overrun(e: ZipEntry, produced: int) -> str:
    return (
        f"entry {e.name!r} inflates to more than its declared {e.usize} bytes ({produced}+ produced): "
        "invalid (a zip bomb or a corrupt size field)"
    )


def crc_mismatch(e: ZipEntry, crc: int) -> str | None:
    """The finding of an entry whose computed CRC-32 is `crc`, or None when it is the stored one."""
    if crc != e.crc:
        return f"entry {e.name!r}: CRC-32 mismatch (stored {e.crc:08x}, computed {crc:08x}): data corrupted"
    return None


def _readinto(src: Source, view: memoryview) -> int:
    """Read into `view` (a file object's own readinto: no copy), the bytes read."""
    if isinstance(src, (Window, InMemory)):
        return src.readinto(view)
    return cast(io.BufferedReader, src).readinto(view)  # (typeshed's IO[bytes] names no readinto)


def _stored_chunks(
    src: Source, e: ZipEntry, counter: Counter, update: Update | None
) -> Iterator[memoryview]:
    """An entry's stored bytes as views of one reused buffer (at most CHUNK bytes); a short read ends them early."""
    src.seek(e.data_start)
    remaining = e.csize
    buf = bytearray(min(CHUNK, max(remaining, 1)))
    view = memoryview(buf)
    while remaining > 0:
        n = _readinto(src, view[: min(len(buf), remaining)])
        if not n:
            return
        remaining -= n
        counter.bytes_read += n
        if update is not None:
            update(update_bytes=n)
        yield view[:n]


def crc_entry(
    src: Source, e: ZipEntry, counter: Counter, update: Update | None = None
) -> str | None:
    """CRC-32 of one entry, streamed. Deflated data is inflated at most CHUNK bytes at a time and
    never past its declared size, so memory stays flat even for a zip bomb."""
    crc = 0
    seen = 0
    inflate = _Inflate(e) if e.method == 8 else None
    for chunk in _stored_chunks(src, e, counter, update):
        seen += len(chunk)
        if inflate is None:
            crc = crc32(chunk, crc)
            continue
        reason = inflate.feed(chunk)
        if reason:
            return reason
    if seen < e.csize:
        return f"entry {e.name!r}: file ends inside its data (truncated)"
    if inflate is not None:
        reason = inflate.finish()
        if reason:
            return reason
        crc = inflate.crc
    return crc_mismatch(e, crc)


class _Inflate:
    """A deflated entry's CRC-32, inflated CHUNK bytes at a time, never past its declared size."""

    def __init__(self, e: ZipEntry) -> None:
        self.e, self.crc, self.produced = e, 0, 0
        self.d = zlib.decompressobj(-15)

    def _out(self, out: bytes) -> str | None:
        self.produced += len(out)
        if self.produced > self.e.usize:
            return _inflate_overrun(self.e, self.produced)
        self.crc = crc32(out, self.crc)
        return None

    def feed(self, data: bytes | memoryview) -> str | None:
        try:
            while True:
                out = self.d.decompress(data, CHUNK)
                reason = self._out(out)
                if reason:
                    return reason
                data = self.d.unconsumed_tail
                if not data and len(out) < CHUNK:
                    return None
        except zlib.error as exc:
            return f"entry {self.e.name!r}: corrupt compressed data ({exc})"

    def finish(self) -> str | None:
        try:
            out = self.d.flush()
        except zlib.error as exc:
            return f"entry {self.e.name!r}: corrupt compressed data ({exc})"
        reason = self._out(out)
        if reason:
            return reason
        if self.produced != self.e.usize:
            return f"entry {self.e.name!r} inflates to {self.produced} bytes, declared {self.e.usize}: size field wrong"
        return None
