"""Per-file integrity checks that never execute checkpoint content.

Every function returns a list of reasons (empty = fine) and adds to a `Counter` the
bytes it read. Quick checks read headers only (cost grows with the number of files);
`full=True` also streams every byte in fixed-size chunks (flat memory).
"""

from __future__ import annotations

import io
import os
import pickletools
import re
import struct
import threading
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.storage import ReadError, describe_os_error, loads_json, open_regular, read_small

try:  # optional accelerator: ISA-L's CRC-32 is ~3x zlib's (same polynomial, same values)
    from isal.isal_zlib import crc32 as _crc32  # type: ignore
    CRC32_IMPL = "isal"
except Exception:  # noqa: BLE001 - stdlib fallback
    _crc32 = zlib.crc32
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


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity set, capped by a cgroup v2 CPU quota (cpu.max)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    try:
        with open(CGROUP_CPU_MAX) as fh:   # a system file, not user input
            quota, period = fh.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def crc_workers() -> int:
    """CRC threads for one archive's entries (see CRC_WORKERS)."""
    return CRC_WORKERS if CRC_WORKERS is not None else min(MAX_CRC_WORKERS, usable_cores())

# safetensors dtype -> bits per element
ST_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
    "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
ST_MAX_HEADER = 100_000_000  # the safetensors library refuses larger headers
ST_SMALL_BYTES = 1 << 16     # a safetensors file no bigger is read whole in one read (quick level)
# Caps that keep memory bounded whatever a file declares (a zip bomb, a zip64 record pointing past a
# sparse file's data, a .metadata that is a link to /dev/zero). Sizes of real files for scale: the
# data.pkl of a 7B-parameter torch.save is about 100 KB (one record per tensor); a DCP .metadata of a
# 70B model sharded over 1024 ranks is a few MB; a zip central directory is ~100 bytes per entry.
MAX_PICKLE_BYTES = 256 << 20     # data.pkl inflated for the quick-level scan
MAX_CD_BYTES = 64 << 20          # zip central directory (about 600k entries)
MAX_DCP_METADATA = 64 << 20      # torch.distributed.checkpoint .metadata read whole
# torch.save writes every zip entry uncompressed (stored); a deflated entry means the archive was
# re-zipped. Inflating is streamed (flat memory) but capped so a bomb cannot burn minutes of CPU.
MAX_INFLATE_BYTES = 1 << 30


Kind = Literal["invalid", "incomplete", "not_resumable", "suspicious"]


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
    sizes: dict[str, int] = field(default_factory=dict)   # path -> bytes of each small file read whole


def _oserror(exc: BaseException) -> str:
    """The one wording of a read failure in a problem line: 'cannot read: permission denied',
    'is a FIFO: expected a regular file' (never "missing" or "corrupt" for an OS error)."""
    if isinstance(exc, ReadError):
        return exc.reason if exc.reason.startswith("is ") else f"cannot read: {exc.reason}"
    return f"cannot read: {describe_os_error(exc)}"


def read_chunks(path: str, counter: Counter, update=None):
    """Yield every byte of a file as memoryviews of one reused CHUNK buffer (flat memory),
    counting bytes read and reporting progress."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open_regular(path) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                return
            counter.bytes_read += n
            if update is not None:
                update(update_bytes=n)
            yield view[:n]


def stream_file(path: str, counter: Counter, update=None) -> list[str]:
    """Read every byte (full level, formats without their own checksum)."""
    try:
        for _chunk in read_chunks(path, counter, update):
            pass
    except (OSError, ReadError) as exc:
        return [_oserror(exc)]
    return []


# --------------------------------------------------------------------------- safetensors

def check_safetensors(path: str, counter: Counter, full: bool = False, regular: bool = False) -> list[str]:
    """8-byte length, JSON header, dtype x shape == offsets, offsets tile the buffer, file size. ``regular``:
    the caller's folder listing saw a regular file (storage.read_small)."""
    counter.files += 1
    try:
        got = read_small(path, "file", ST_SMALL_BYTES, regular=regular)
        if isinstance(got, bytes):   # a small file read whole: the header is a slice of it
            counter.sizes[path] = len(got)
            head = _st_head(got, len(got))
        else:
            with got as fh:
                head = _st_head(fh, os.fstat(fh.fileno()).st_size)
    except (OSError, ReadError) as exc:
        return [_oserror(exc)]
    if isinstance(head, list):
        return head
    raw, data_size = head
    counter.bytes_read += 8 + len(raw)
    reasons = _check_st_header(raw, data_size)
    if not reasons and full:
        reasons = stream_file(path, counter)
    return reasons


def _st_head(src, size: int) -> tuple[bytes, int] | list[str]:
    """(the JSON header's bytes, the data's size) of a safetensors file (`src`: its bytes, or it open), or the
    reason it has none."""
    if size == 0:
        return ["zero-byte file (expected an 8-byte header length, a JSON header and tensor data)"]
    if size < 8:
        return [truncated(f"truncated: {size} bytes, shorter than the 8-byte header length")]
    (hlen,) = struct.unpack_from("<Q", src[:8] if isinstance(src, bytes) else src.read(8))
    if hlen > ST_MAX_HEADER or 8 + hlen > size:
        return [f"broken header: header length {hlen} does not fit in a {size}-byte file"]
    raw = src[8:8 + hlen] if isinstance(src, bytes) else src.read(hlen)
    return raw, size - 8 - hlen


def _check_st_header(raw: bytes, data_size: int) -> list[str]:  # noqa: C901 - complexity debt, see issue 10
    try:
        header = loads_json(raw, "safetensors header", expect=dict)
    except ReadError as exc:
        if exc.reason.startswith("not a JSON object"):
            return ["broken header: JSON header is not an object"]
        return [f"broken header: JSON header is {exc.reason[:120]}"]
    spans = []
    bits = ST_DTYPE_BITS
    for name, info in header.items():
        if name == "__metadata__":
            if type(info) is not dict or not all(type(v) is str for v in info.values()):
                return ["broken header: __metadata__ must map strings to strings"]
            continue
        if type(info) is not dict or len(info) != 3:
            return [f"broken header: entry {name!r} is not {{dtype, shape, data_offsets}}"]
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if type(dtype) is not str or dtype not in bits:
            return [f"broken header: tensor {name!r} has unknown dtype {dtype!r}"]
        if type(shape) is not list:
            return [f"broken header: tensor {name!r} has an invalid shape {shape!r}"]
        numel = 1
        for d in shape:
            if type(d) is not int or d < 0:
                return [f"broken header: tensor {name!r} has an invalid shape {shape!r}"]
            numel *= d
        if (type(offsets) is not list or len(offsets) != 2 or type(offsets[0]) is not int
                or type(offsets[1]) is not int or not 0 <= offsets[0] <= offsets[1]):
            return [f"broken header: tensor {name!r} has invalid data_offsets {offsets!r}"]
        expected = (numel * bits[dtype] + 7) // 8
        if offsets[1] - offsets[0] != expected:
            return [f"broken header: tensor {name!r} {dtype}{shape} needs {expected} bytes, "
                    f"data_offsets span {offsets[1] - offsets[0]}"]
        spans.append((offsets[0], offsets[1], name))
    if not spans:
        return [Finding("no tensors: the header lists none (an empty or aborted save)")]
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            what = "overlaps the previous tensor" if begin < pos else f"leaves a gap at byte {pos}"
            return [f"broken header: tensor {name!r} {what}"]
        pos = end
    if pos != data_size:
        if pos > data_size:
            return [truncated(f"truncated: header describes {pos} data bytes, file holds {data_size}")]
        return [f"file size mismatch: header describes {pos} data bytes, file holds {data_size} "
                "(trailing bytes)"]
    return []


def safetensors_header(path: str) -> dict | None:
    """The parsed header, or None (used for index.json cross-checks)."""
    try:
        with open_regular(path) as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            if hlen > ST_MAX_HEADER:
                return None
            return loads_json(fh.read(hlen), "safetensors header", expect=dict)
    except (OSError, ReadError, struct.error):
        return None


# --------------------------------------------------------------------------- zip (torch.save)

_EOCD = b"PK\x05\x06"
_EOCD64_LOC = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_CDH = b"PK\x01\x02"
_LFH = b"PK\x03\x04"
# a central directory record from its signature to its local header offset (offset 42): one unpack of the
# signature, flags, method, crc, sizes, name/extra/comment lengths, disk, external attributes and offset
# (versions, times and internal attributes skipped); it fails (struct.error) exactly when fewer than the record's
# 46 bytes are left
# the end record, the zip64 end record and its locator (both the reference checks and `_scan_small_zip` read them)
_EOCD_RECORD = struct.Struct("<4sHHHHIIH")
_EOCD64_RECORD = struct.Struct("<4sQHHIIQQQQ")
_EOCD64_LOCATOR = struct.Struct("<4sIQI")
_CD_RECORD = struct.Struct("<4s4xHH4xIIIHHHH2xII")
# the MS-DOS folder bit of the external attributes: torch.load's reader (miniz) takes such an entry for a folder
# and extracts no bytes from it, whatever its sizes say
ZIP_DOS_FOLDER = 0x10
# a local header's signature and its name and extra-field lengths (offsets 0, 26, 28): one unpack
_LH_RECORD = struct.Struct("<4s22xHH")
# the end-record search reads this much of a file's end; a file no bigger (SMALL_ZIP_BYTES) is read whole once
# and every later read is served from memory
ZIP_TAIL_BYTES = 22 + 65535 + 20
SMALL_ZIP_BYTES = ZIP_TAIL_BYTES
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
    offset: int       # local header offset
    data_start: int = 0


def read_zip_directory(fh, size: int) -> tuple[list[ZipEntry], int] | str:
    """Parse the end record and central directory. Returns (entries, cd_offset) or a reason.

    Every offset and size a record declares is checked against the real file size (and the
    central directory against MAX_CD_BYTES) before anything is read: a zip64 record pointing far
    past the data of a sparse file never turns into a huge allocation."""
    try:
        return _read_zip_directory(fh, size)
    except struct.error:
        return "broken central directory (a record is cut short)"


def _read_zip_directory(fh, size: int) -> tuple[list[ZipEntry], int] | str:  # noqa: C901 - complexity debt, see issue 10
    tail_len = min(size, ZIP_TAIL_BYTES)
    fh.seek(size - tail_len)
    tail = fh.read(tail_len)
    pos = tail.rfind(_EOCD)
    if pos < 0 or len(tail) - pos < 22:
        return "truncated or not a zip archive: no end-of-central-directory record"
    (_sig, disk, cd_disk, n_disk, n_entries, cd_size, cd_offset, comment_len) = _EOCD_RECORD.unpack(tail[pos:pos + 22])
    eocd_at = size - tail_len + pos
    if pos + 22 + comment_len != len(tail):
        return "trailing bytes after the zip end record (file changed after it was written?)"
    z64 = _zip64_end(fh, tail[pos - 20:pos] if pos >= 20 else b"", size)
    if isinstance(z64, str):
        return z64
    if z64 is not None:  # torch.save writes both records; torch.load's reader then takes every field from zip64
        disk, cd_disk, n_disk, n_entries, cd_size, cd_offset, eocd_at = z64
    elif n_entries == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        return "broken zip64 end record locator"
    if n_disk != n_entries or ((disk | cd_disk) and (disk, cd_disk) != (1, 1)):
        return (f"multi-disk archive (disk {disk}, central directory on disk {cd_disk}, {n_disk} of {n_entries} "
                "entries on this disk): torch.load cannot read it")
    if cd_offset + cd_size > eocd_at:
        return f"central directory ({cd_size} bytes at {cd_offset}) runs past its end record: truncated?"
    if cd_size > MAX_CD_BYTES:
        return (f"central directory of {cd_size} bytes is larger than the {MAX_CD_BYTES >> 20} MB this "
                "checker reads (a torch archive holds ~100 bytes per entry): not a plausible checkpoint")
    if n_entries * 46 > cd_size:
        return f"broken central directory: {n_entries} entries cannot fit in {cd_size} bytes"
    fh.seek(cd_offset)
    cd = fh.read(cd_size)
    if len(cd) != cd_size:
        return "truncated central directory"
    parsed = _cd_entries(cd, n_entries, disk)
    if isinstance(parsed, str):
        return parsed
    return parsed, cd_offset


def _cd_entries(cd: bytes, n_entries: int, disk: int) -> list[ZipEntry] | str:
    """The central directory's records (`cd`: all of its bytes) as entries, or the first reason."""
    entries: list[ZipEntry] = []
    unpack, append = _CD_RECORD.unpack_from, entries.append
    p = 0
    for i in range(n_entries):
        try:
            sig, flags, method, crc, csize, usize, nlen, xlen, clen, e_disk, attrs, offset = unpack(cd, p)
        except struct.error:   # fewer than 46 bytes left
            sig = b""
        if sig != _CDH:
            return f"broken central directory at entry {i}"
        name = cd[p + 46:p + 46 + nlen].decode("utf-8", "replace")
        if flags & ZIP_REFUSED_FLAGS or (e_disk != disk and e_disk != 1):  # what torch.load's reader (miniz) refuses
            what = f"on disk {e_disk} of a multi-disk archive" if e_disk not in (disk, 1) else "marked encrypted or patched"
            return f"entry {name!r} is {what} (general-purpose flags 0x{flags:04x}): torch.load cannot read it"
        if attrs & ZIP_DOS_FOLDER and not name.endswith("/"):
            return (f"entry {name!r} is marked a folder (external attributes 0x{attrs:08x}): torch.load reads no "
                    "bytes from it")
        if 0xFFFFFFFF in (csize, usize, offset):
            csize, usize, offset = _zip64_extra(cd[p + 46 + nlen:p + 46 + nlen + xlen], csize, usize, offset)
        append(ZipEntry(name, method, crc, csize, usize, offset))
        p += 46 + nlen + xlen + clen
    if p != len(cd):
        return f"central directory size mismatch ({p} parsed, {len(cd)} declared)"
    return entries


def _zip64_end(fh, loc: bytes, size: int) -> tuple[int, int, int, int, int, int, int] | str | None:
    """The zip64 end record the locator `loc` (the 20 bytes before the end record) points at, read as torch.load's
    reader (miniz) reads it: (disk, cd disk, entries on this disk, entries, cd size, cd offset, record offset);
    None when there is no locator or no record at its offset, a reason when miniz refuses the archive."""
    if len(loc) != 20 or not loc.startswith(_EOCD64_LOC):
        return None
    (_s, _d, at, disks) = _EOCD64_LOCATOR.unpack(loc)
    if at + 56 > size:
        return "broken zip64 end record offset"
    fh.seek(at)
    rec = fh.read(56)
    if not rec.startswith(_EOCD64):
        return None
    (_s, rec_size, _v1, _v2, disk, cd_disk, n_disk, n_entries, cd_size, cd_offset) = _EOCD64_RECORD.unpack(rec)
    if rec_size < 44:
        return f"broken zip64 end record (declares {rec_size} bytes, at least 44 expected)"
    if disks != 1:
        return f"multi-disk archive (the zip64 locator counts {disks} disks): torch.load cannot read it"
    if max(n_disk, n_entries, cd_size) > 0xFFFFFFFF:
        return f"zip64 end record declares {n_entries} entries in {cd_size} bytes: more than torch.load reads"
    return disk, cd_disk, n_disk, n_entries, cd_size, cd_offset, at


def _zip64_extra(extra: bytes, csize: int, usize: int, offset: int) -> tuple[int, int, int]:
    i = 0
    while i + 4 <= len(extra):
        tag, ln = struct.unpack("<HH", extra[i:i + 4])
        if tag == 1:
            vals = list(struct.unpack(f"<{ln // 8}Q", extra[i + 4:i + 4 + (ln // 8) * 8]))
            if usize == 0xFFFFFFFF and vals:
                usize = vals.pop(0)
            if csize == 0xFFFFFFFF and vals:
                csize = vals.pop(0)
            if offset == 0xFFFFFFFF and vals:
                offset = vals.pop(0)
            break
        i += 4 + ln
    return csize, usize, offset


@dataclass
class ZipScan:
    """What `scan_zip` found in a torch archive: problems, the directory, the pickle read as data."""

    findings: list[Finding] = field(default_factory=list)
    entries: list[ZipEntry] = field(default_factory=list)
    prefix: str = ""
    pickle: tp.PickleScan | None = None
    legacy: bool = False
    _index: tuple | None = field(default=None, repr=False, compare=False)

    def keys(self) -> list[str]:
        """Top-level keys of the pickled object (a dict), else its string constants."""
        root = self.pickle.root if self.pickle is not None else None
        if isinstance(root, dict):
            return [k for k in root if isinstance(k, str)]
        return []

    def strings(self, limit: int = 200_000) -> list[str]:
        """Every string in the pickled object (keys and values, first appearance order)."""
        out: list[str] = []
        if self.pickle is None:
            return out
        seen: set[int] = set()
        todo = [self.pickle.root]
        while todo and len(out) < limit:
            obj = todo.pop()
            if isinstance(obj, str):
                out.append(obj)
                continue
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, dict):
                for k, v in reversed(list(obj.items())):
                    todo.extend((v, k))
            elif isinstance(obj, (list, tuple)):
                todo.extend(reversed(obj))
            elif isinstance(obj, tp.Call):
                todo.extend((obj.items, obj.state, *reversed(obj.args)))
        return out

    def entry(self, name: str) -> ZipEntry | None:
        """The entry of that name (the first, as a scan would find it): a dict built once per entry list, so
        looking up every storage of a big archive stays linear."""
        index = self._index
        if index is None or index[0] is not self.entries or index[1] != len(self.entries):
            by_name: dict[str, ZipEntry] = {}
            for e in self.entries:
                by_name.setdefault(e.name, e)
            index = self._index = (self.entries, len(self.entries), by_name)
        return index[2].get(name)


def check_zip(path: str, counter: Counter, full: bool = False, want_pickle: bool = False,
              update=None) -> tuple[list[str], list[str]]:
    """torch.save zip archive checks (see `scan_zip`). Returns (reasons, the pickle's strings if wanted)."""
    z = scan_zip(path, counter, full, update)
    return list(z.findings), z.strings() if want_pickle else []


def scan_zip(path: str, counter: Counter, full: bool = False, update=None, regular: bool = False) -> ZipScan:
    """torch.save zip archive: end record, central directory (unique names), every local header and
    entry size, the `version` record; data.pkl read as opcodes (parses to STOP, globals against the
    weights_only allow-list, every persistent-id storage present with dtype x numel bytes);
    full: CRC-32 of every entry (streamed). A legacy (pre-1.6) file is parsed the same way. ``regular``: the
    caller's folder listing saw a regular file (storage.read_small)."""
    counter.files += 1
    z = ZipScan()
    try:
        # quick level: a file of at most SMALL_ZIP_BYTES (the end-record search reads that much anyway) is read
        # in one call and served from memory: the same bytes, one read instead of two per entry
        got = open_regular(path) if full else read_small(path, "file", SMALL_ZIP_BYTES, regular=regular)
        if isinstance(got, bytes):
            counter.sizes[path] = len(got)
            if not _scan_small_zip(got, z, counter):
                _scan_open_zip(_InMemory(got), path, z, counter, full, update)
        else:
            with got as fh:
                _scan_open_zip(fh, path, z, counter, full, update)
    except (OSError, ReadError) as exc:
        z.findings.append(Finding(_oserror(exc)))
    return z


class Window:
    """A file object seeing only bytes [base, base+length) of another (the torch archives inside a DCP .distcp)."""

    def __init__(self, fh, base: int, length: int) -> None:
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

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)


def scan_embedded_zip(fh, base: int, length: int, counter: Counter, update=None) -> ZipScan:
    """`scan_zip` at level full of the torch archive at [base, base+length) of an open file (each item of a DCP
    .distcp is one torch.save archive, which dcp.load reads with torch.load): directory, local headers, data.pkl
    and the CRC-32 of every entry. A small archive is read once into memory."""
    z = ZipScan()
    if length <= SMALL_ZIP_BYTES:
        fh.seek(base)
        data = fh.read(length)
        counter.bytes_read += len(data)
        if len(data) != length:
            z.findings.append(truncated(f"truncated: the file ends inside the archive at byte {base}"))
            return z
        src: _InMemory | Window = _InMemory(data)
    else:
        src = Window(fh, base, length)
    _scan_open_zip(src, "archive", z, counter, True, update)
    if z.legacy and not z.findings:
        z.findings.append(Finding("not a torch zip archive (dcp.load reads each item with torch.load)"))
    return z


class _InMemory(io.BytesIO):
    """A small file's bytes, read once (`data`: its size is len(data))."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.data = data


def _scan_small_zip(data: bytes, z: ZipScan, counter: Counter) -> bool:
    """The quick level's common case, a small archive read whole whose every record is in order, checked in one
    pass over its bytes: end record (and zip64 record) at the end, each central-directory record and its local
    header together, no duplicate name, then data.pkl as `_scan_open_zip` reads it. False, with nothing
    changed: the archive is anything else (a record cut short, a refused flag, a zip64 size field, a deflated
    entry, a duplicate...), and `_scan_open_zip` checks it from the start and words the finding. Every test it
    makes is one `_zip_entries` and `_local_headers` make; it accepts nothing they refuse
    (tests/test_checkpoints_walkspeed.py compares the two on mutated real torch.save archives)."""
    end = _small_zip_end(data)
    if end is None:
        return False
    disk, n_entries, cd_offset, cd_size = end
    parsed = _small_zip_entries(data, disk, n_entries, cd_offset, cd_size)
    if parsed is None:
        return False
    entries, by_name = parsed
    counter.bytes_read += min(len(data), 65535 + 42)
    z.entries = entries
    z._index = (entries, n_entries, by_name)
    pkl = next((e for e in entries if e.name == "data.pkl" or e.name.endswith("/data.pkl")), None)
    if pkl is None and len({e.name.split("/", 1)[0] for e in entries}) == 1:
        z.findings.append(Finding("torch archive without data.pkl"))   # as the reference: before the local headers
        for e in entries:   # (which it leaves unread)
            e.data_start = 0
        return True
    counter.bytes_read += 30 * n_entries
    if pkl is None:
        return True
    z.prefix = pkl.name[: -len("data.pkl")]
    z.findings.extend(_check_torch_pickle(data, z, counter))
    return True


def _small_zip_end(data: bytes) -> tuple[int, int, int, int] | None:
    """`_scan_small_zip`'s end records: (disk, entries, directory offset, directory size) when the end record ends
    the file with no comment, the zip64 record (if any) is whole, and the directory lies before them; else None."""
    size = len(data)
    pos = size - 22
    if pos < 0 or data.rfind(_EOCD) != pos:
        return None
    (_sig, disk, cd_disk, n_disk, n_entries, cd_size, cd_offset, comment_len) = _EOCD_RECORD.unpack_from(data, pos)
    if comment_len:
        return None
    eocd_at = pos
    if pos >= 20 and data.startswith(_EOCD64_LOC, pos - 20):
        (_s, _d, at, disks) = _EOCD64_LOCATOR.unpack_from(data, pos - 20)
        if at + 56 > size or disks != 1:
            return None
        if data.startswith(_EOCD64, at):
            (_s, rec_size, _v1, _v2, disk, cd_disk, n_disk, n_entries, cd_size,
             cd_offset) = _EOCD64_RECORD.unpack_from(data, at)
            if rec_size < 44 or max(n_disk, n_entries, cd_size) > 0xFFFFFFFF:
                return None
            eocd_at = at
    # (without a zip64 record, the 0xFFFF / 0xFFFFFFFF fields that mean "see zip64" cannot pass the bounds below in
    # a file of at most SMALL_ZIP_BYTES; the reference path words it: a broken locator)
    if (n_disk != n_entries or not n_entries or (disk | cd_disk and (disk, cd_disk) != (1, 1))
            or cd_offset + cd_size > eocd_at or cd_size > MAX_CD_BYTES or n_entries * 46 > cd_size):
        return None
    return disk, n_entries, cd_offset, cd_size


def _small_zip_entries(data: bytes, disk: int, n_entries: int, cd_offset: int,
                       cd_size: int) -> tuple[list[ZipEntry], dict[str, ZipEntry]] | None:
    """`_scan_small_zip`'s directory: each record with its local header (a stored entry, the same name, its data
    before the directory), names unique; the entries (data_start set) and the name index, or None."""
    size = len(data)
    entries: list[ZipEntry] = []
    by_name: dict[str, ZipEntry] = {}
    append = entries.append
    cd_unpack, lh_unpack = _CD_RECORD.unpack_from, _LH_RECORD.unpack_from
    p = cd_offset
    end = cd_offset + cd_size
    for _ in range(n_entries):
        if p + 46 > end:
            return None
        sig, flags, method, crc, csize, usize, nlen, xlen, clen, e_disk, attrs, offset = cd_unpack(data, p)
        if sig != _CDH or flags & ZIP_REFUSED_FLAGS or (e_disk != disk and e_disk != 1) or method or csize != usize:
            return None
        raw = data[p + 46:p + 46 + nlen]
        name = raw.decode("utf-8", "replace")
        if (attrs & ZIP_DOS_FOLDER and not name.endswith("/")) or offset + 30 > size or name in by_name:
            return None   # (a 0xFFFFFFFF offset or size, "see zip64", fails the bounds: the reference reads it)
        lsig, lnlen, lxlen = lh_unpack(data, offset)
        start = offset + 30 + lnlen + lxlen
        if lsig != _LFH or start + csize > cd_offset or data[offset + 30:offset + 30 + lnlen] != raw:
            return None
        e = ZipEntry(name, method, crc, csize, usize, offset, start)
        append(e)
        by_name[name] = e
        p += 46 + nlen + xlen + clen
    return (entries, by_name) if p == end else None


def _scan_open_zip(fh, path: str, z: ZipScan, counter: Counter, full: bool, update) -> None:
    """scan_zip's steps on the open file; each stops at the first finding (added to z)."""
    parsed = _zip_entries(fh, path, z, counter)
    if parsed is None:
        return
    entries, cd_offset = parsed
    pkl = next((e for e in entries if e.name.endswith("/data.pkl") or e.name == "data.pkl"), None)
    if pkl is None and len({e.name.split("/", 1)[0] for e in entries}) == 1:
        z.findings.append(Finding("torch archive without data.pkl"))
        return
    finding = _local_headers(fh, entries, cd_offset, counter, full)
    if finding is not None:
        z.findings.append(finding)
        return
    if pkl is not None:
        z.prefix = pkl.name[: -len("data.pkl")]
        z.findings.extend(_check_torch_pickle(fh, z, counter))
        if z.findings:
            return
    if full:
        reason = _crc_entries(path, fh, entries, counter, update)
        if reason:
            z.findings.append(Finding(reason))


def _zip_entries(fh, path: str, z: ZipScan, counter: Counter) -> tuple[list[ZipEntry], int] | None:
    """The central directory's entries (non-empty, unique names) and its offset; None once a finding is
    added (too short, not a zip archive, empty, a duplicate name) or a legacy torch file was checked instead."""
    size = len(fh.data) if isinstance(fh, _InMemory) else fh.length if isinstance(fh, Window) else \
        os.fstat(fh.fileno()).st_size
    if size == 0:
        z.findings.append(Finding("zero-byte file (expected a torch zip archive)"))
        return None
    if isinstance(fh, _InMemory):
        magic = fh.data[:2]
    else:
        fh.seek(0)
        magic = fh.read(2)
    if size < 22 and magic[:1] != b"\x80":
        z.findings.append(Finding(f"truncated: {size} bytes, too short for a zip archive"))
        return None
    parsed = read_zip_directory(fh, size) if size >= 22 else "not a zip archive"
    counter.bytes_read += min(size, 65535 + 42)
    if isinstance(parsed, str):
        if magic[:1] == b"\x80" and not parsed.startswith("broken"):
            z.legacy = True
            z.findings.extend(_check_legacy(fh, size, counter, os.path.basename(path), z))
            return None
        z.findings.append(Finding(parsed))
        return None
    entries, cd_offset = parsed
    z.entries = entries
    if not entries:
        z.findings.append(Finding("empty zip archive (no entries)"))
        return None
    by_name = {e.name: e for e in reversed(entries)}   # the first entry of a name, as ZipScan.entry finds it
    if len(by_name) == len(entries):
        z._index = (entries, len(entries), by_name)
    else:
        names = [e.name for e in entries]
        dup = next(n for n in names if names.count(n) > 1)
        z.findings.append(Finding(f"duplicate entry {dup!r} in the central directory (torch.load would "
                                  "refuse or read the wrong one)"))
        return None
    return entries, cd_offset


_LH_LENS = struct.Struct("<HH")   # a local header's name and extra-field lengths (offset 26)


def _local_headers(fh, entries: list[ZipEntry], cd_offset: int, counter: Counter, full: bool) -> Finding | None:
    """Every entry's local header (sets e.data_start); the first finding, or None. Each header and the
    name after it are one read (a slice of a small archive read whole)."""
    if isinstance(fh, _InMemory):
        return _local_headers_in_memory(fh, entries, cd_offset, counter, full)
    lens = _LH_LENS.unpack_from
    for i, e in enumerate(entries):
        off = e.offset
        want = 30 + len(e.name)   # the name's length in bytes when it is ASCII (else read again below)
        fh.seek(off)
        lh = fh.read(want)
        if len(lh) == want and lh.startswith(_LFH):   # the usual case, decided here: a stored entry, all in order
            nlen, xlen = lens(lh, 26)
            start = off + 30 + nlen + xlen
            if (nlen == want - 30 and e.method == 0 and e.csize == e.usize and start + e.csize <= cd_offset
                    and lh[30:].decode("utf-8", "replace") == e.name):
                e.data_start = start
                continue
        finding = _local_header_finding(fh, lh, e, cd_offset, full)   # every other case, and the finding's words
        if finding is not None:
            counter.bytes_read += 30 * (i + 1)
            return finding
    counter.bytes_read += 30 * len(entries)
    return None


def _local_headers_in_memory(fh: _InMemory, entries: list[ZipEntry], cd_offset: int, counter: Counter,
                             full: bool) -> Finding | None:
    """`_local_headers` on a small archive's bytes: the usual case (a stored entry whose header carries its
    name, with its data before the central directory) decided from one unpack and one slice per entry; any
    other entry goes through `_local_header_finding` exactly as from the file."""
    data = fh.data
    unpack = _LH_RECORD.unpack_from
    for i, e in enumerate(entries):
        off = e.offset
        try:
            sig, nlen, xlen = unpack(data, off)
        except struct.error:   # fewer than 30 bytes left
            sig = b""
        if sig == _LFH:
            start = off + 30 + nlen + xlen
            if (e.method == 0 and e.csize == e.usize and start + e.csize <= cd_offset
                    and data[off + 30:off + 30 + nlen].decode("utf-8", "replace") == e.name):
                e.data_start = start
                continue
        finding = _local_header_finding(fh, data[off:off + 30 + len(e.name)], e, cd_offset, full)
        if finding is not None:
            counter.bytes_read += 30 * (i + 1)
            return finding
    counter.bytes_read += 30 * len(entries)
    return None


def _local_header_finding(fh, lh: bytes, e: ZipEntry, cd_offset: int, full: bool) -> Finding | None:
    """One entry's local header (`lh`: its bytes from the header on): present, same name, data before the
    central directory, a method torch reads with consistent sizes (sets e.data_start); the finding, or None."""
    if len(lh) < 30 or not lh.startswith(_LFH):
        return Finding(f"broken local header for entry {e.name!r} at offset {e.offset}")
    nlen, xlen = _LH_LENS.unpack_from(lh, 26)
    raw = lh[30:30 + nlen]
    if len(lh) - 30 != nlen:   # a name of another length (or not ASCII): read exactly its nlen bytes
        fh.seek(e.offset + 30)
        raw = fh.read(nlen)
    name = raw.decode("utf-8", "replace")
    if name != e.name:
        return Finding(f"entry name mismatch: central directory {e.name!r}, local header {name!r}")
    e.data_start = e.offset + 30 + nlen + xlen
    if e.data_start + e.csize > cd_offset:
        return truncated(f"entry {e.name!r} ({e.csize} bytes) runs past the central directory: truncated")
    if e.method not in (0, 8):
        return Finding(f"entry {e.name!r} uses unsupported compression method {e.method}")
    if e.method == 0 and e.csize != e.usize:
        return Finding(f"entry {e.name!r}: stored sizes disagree ({e.csize} vs {e.usize})")
    if e.method == 8 and full and e.usize > MAX_INFLATE_BYTES:
        return Finding(f"entry {e.name!r} is deflated to inflate to {e.usize} bytes, more than "
                       f"the {MAX_INFLATE_BYTES >> 30} GB this checker inflates (torch.save "
                       "stores entries uncompressed: a re-zipped archive or a zip bomb)")
    return None


MAX_PICKLE = MAX_PICKLE_BYTES  # data.pkl holds structure only (tensors live in data/N)


def _read_entry(fh, e: ZipEntry, counter: Counter, limit: int = MAX_PICKLE) -> bytes | str:
    """A (small) entry's bytes (`fh`: the archive open, or its bytes), decompressed with a cap from its declared
    size; or a reason."""
    if e.usize > limit or e.csize > limit:
        return f"entry {e.name!r} declares {e.usize} bytes (more than {limit >> 20} MB): not read"
    if isinstance(fh, bytes):   # a small archive's bytes (`_scan_small_zip`)
        data = fh[e.data_start:e.data_start + e.csize]
    else:
        fh.seek(e.data_start)
        data = fh.read(e.csize)
    counter.bytes_read += len(data)
    if e.method == 8:
        d = zlib.decompressobj(-15)
        try:
            data = d.decompress(data, e.usize + 1)
        except zlib.error as exc:
            return f"entry {e.name!r}: corrupt compressed data ({exc})"
    if len(data) != e.usize:
        return (f"entry {e.name!r}: size fields disagree ({'more than ' if len(data) > e.usize else ''}"
                f"{len(data)} bytes, its header declares {e.usize}): a zip bomb or a corrupt size field")
    return data


def _check_torch_pickle(fh, z: ZipScan, counter: Counter) -> list[Finding]:
    pkl = z.entry(z.prefix + "data.pkl")
    data = _read_entry(fh, pkl, counter)
    if isinstance(data, str):
        return [Finding(data)]
    if not data:
        return [Finding(f"{pkl.name} is empty (torch.load cannot open this archive)")]
    scan = tp.read_pickle(data)
    z.pickle = scan
    out = pickle_findings(scan, pkl.name)
    if out:
        return out
    if z.entry(z.prefix + "version") is None and z.entry(z.prefix + ".data/version") is None:
        out.append(Finding(f"no {z.prefix}version record (torch.load refuses an archive without it)"))
    else:
        out.extend(_record_findings(fh, z, counter))
    for t in scan.tensors:
        span = t.span()
        if span is not None and (span[1] > t.storage.numel * tp.DTYPE_SIZE.get(t.storage.dtype, 1)
                                 // max(1, tp.DTYPE_SIZE.get(t.dtype, 1))):
            out.append(Finding(f"a tensor view ({t.dtype}{list(t.shape)} at offset {t.offset}) runs past the end "
                               f"of its storage data/{t.storage.key} (torch.load would fail)"))
            return out
    for key, ref in sorted(scan.storages.items()):
        e = z.entry(f"{z.prefix}data/{key}")
        if e is None:
            out.append(Finding(f"storage data/{key} referenced by {pkl.name} is missing from the archive"))
        elif ref.dtype != "unknown" and e.usize != ref.nbytes:
            out.append(Finding(f"storage data/{key}: {e.usize} bytes, {pkl.name} needs {ref.nbytes} "
                               f"({ref.numel} x {ref.dtype})"))
        if len(out) >= 5:
            break
    return out


#: the archive format versions torch.load reads (torch 2.x caffe2/serialize: kMinSupportedFileFormatVersion 1,
#: kMaxSupportedFileFormatVersion 0xA); the record is read as C's strtoull does (spaces, a '+', leading digits)
TORCH_FILE_VERSIONS = range(1, 11)
_VERSION_TEXT = re.compile(rb"^\s*\+?(\d+)")


def _record_findings(fh, z: ZipScan, counter: Counter) -> list[Finding]:
    """The version and byteorder records as torch.load reads them: a version it supports, an endianness it knows."""
    e = z.entry(z.prefix + "version") or z.entry(z.prefix + ".data/version")
    data = _read_entry(fh, e, counter, limit=1 << 10) if e is not None else b""
    m = _VERSION_TEXT.match(data) if isinstance(data, bytes) else None
    if m is None or int(m.group(1)) not in TORCH_FILE_VERSIONS:
        shown_text = data[:20] if isinstance(data, bytes) else data
        return [Finding(f"{e.name if e else 'version'}: format version {shown_text!r}: torch.load reads versions "
                        f"{TORCH_FILE_VERSIONS.start}-{TORCH_FILE_VERSIONS.stop - 1} only")]
    bo = z.entry(z.prefix + "byteorder")
    order = _read_entry(fh, bo, counter, limit=1 << 10) if bo is not None else b"little"
    if order not in (b"little", b"big"):
        return [Finding(f"{bo.name if bo else 'byteorder'}: {order!r} is not an endianness torch.load knows "
                        "(little or big)")]
    return []


def pickle_findings(scan: tp.PickleScan, what: str, dcp: bool = False) -> list[Finding]:
    """Problems of a pickle read as data: unsafe globals first (named), then a pickle that does not
    parse to its STOP."""
    unsafe = scan.unsafe(dcp)
    if unsafe:
        more = f" (and {len(unsafe) - 1} more)" if len(unsafe) > 1 else ""
        return [Finding(f"unsafe pickle: would execute {tp.shown(unsafe[0])} on load{more}")]
    if not scan.complete:
        return [Finding(f"{what}: not a complete pickle ({scan.error})")]
    if scan.text_persistent_ids:
        # torch.save(..., pickle_protocol=0) writes each storage id as text; torch.load asserts a tuple
        # ("saved_id must be a tuple") and cannot read the file at all, with or without weights_only
        return [Finding(f"{what}: pickle protocol 0 (storage ids written as text): torch.load cannot read it; "
                        "save with the default pickle protocol")]
    return []


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _check_legacy(fh, size: int, counter: Counter, name: str, z: ZipScan) -> list[Finding]:
    """Legacy (pre-1.6, non-zip) torch.save: five pickles (magic number, protocol, sys info, the
    object, the sorted storage keys) then, per key, an 8-byte element count and the raw bytes."""
    fh.seek(0)
    reader = io.BufferedReader(fh, buffer_size=1 << 16) if isinstance(fh, io.RawIOBase) else fh
    scans = []
    for i in range(5):
        scan = tp.read_pickle(reader)
        scans.append(scan)
        if i == 3:
            z.pickle = scan
        if scan.unsafe() or (i == 3 and not scan.complete):
            return pickle_findings(scan, f"{name} (legacy torch file)")
        if not scan.complete:
            return [Finding(f"legacy torch file: pickle {i + 1} of 5 is broken ({scan.error})")]
    if scans[0].root != _LEGACY_MAGIC:
        return [Finding("legacy torch file: wrong magic number (not written by torch.save)")]
    keys = scans[4].root
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return [Finding("legacy torch file: storage key list is not a list of names")]
    refs = scans[3].storages
    missing = sorted(set(refs) - set(keys))
    if missing:
        return [Finding(f"legacy torch file: storage {missing[0]} is referenced but not written")]
    pos = reader.tell()
    for key in keys:
        reader.seek(pos)
        head = reader.read(8)
        if len(head) != 8:
            return [truncated(f"truncated: legacy torch file ends before storage {key}")]
        (numel,) = struct.unpack("<q", head)
        ref = refs.get(key)
        item = tp.DTYPE_SIZE.get(ref.dtype, 1) if ref is not None else 1
        if numel < 0 or (ref is not None and numel != ref.numel):
            return [Finding(f"legacy torch file: storage {key} holds {numel} elements, the pickle says "
                            f"{ref.numel if ref else '?'}")]
        pos += 8 + numel * item
        if pos > size:
            return [truncated(f"truncated: legacy torch file ends inside storage {key}")]
    counter.bytes_read += pos
    if pos != size:
        return [Finding(f"legacy torch file: {size - pos} trailing bytes after the last storage")]
    counter.notes.append(f"{name}: legacy (pre-1.6) torch serialization; pickle and storage sizes checked")
    return []


def _crc_entries(path: str, fh, entries: list, counter: Counter, update=None) -> str | None:
    """CRC-32 of every entry; the first failing entry (in archive order) is reported."""
    workers = 1 if isinstance(fh, (Window, _InMemory)) else min(crc_workers(), len(entries))
    if workers < 2 or sum(e.csize for e in entries) < PARALLEL_MIN_BYTES:
        for e in entries:
            reason = _crc_entry(fh, e, counter, update)
            if reason:
                return reason
        return None
    lock = threading.Lock()

    def locked_update(**kw) -> None:
        with lock:
            update(**kw)

    def work(e) -> tuple[str | None, int]:
        own = Counter()
        try:
            with open_regular(path) as own_fh:
                return _crc_entry(own_fh, e, own, locked_update if update is not None else None), own.bytes_read
        except (OSError, ReadError) as exc:
            return f"entry {e.name!r}: {_oserror(exc)}", own.bytes_read

    # largest entries first keeps the threads evenly loaded; results come back in archive order
    order = sorted(range(len(entries)), key=lambda i: -entries[i].csize)
    from concurrent.futures import ThreadPoolExecutor   # big archives at level full only

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {i: pool.submit(work, entries[i]) for i in order}
        results = [futures[i].result() for i in range(len(entries))]
    counter.bytes_read += sum(n for _r, n in results)
    return next((r for r, _n in results if r), None)


def _inflate_overrun(e: ZipEntry, produced: int) -> str:
    return (f"entry {e.name!r} inflates to more than its declared {e.usize} bytes ({produced}+ produced): "
            "invalid (a zip bomb or a corrupt size field)")


def _crc_entry(fh, e: ZipEntry, counter: Counter, update=None) -> str | None:  # noqa: C901 - complexity debt, see issue 10
    """CRC-32 of one entry, streamed. Deflated data is inflated at most CHUNK bytes at a time and
    never past its declared size, so memory stays flat even for a zip bomb."""
    fh.seek(e.data_start)
    remaining = e.csize
    crc = 0
    produced = 0
    decomp = zlib.decompressobj(-15) if e.method == 8 else None
    buf = bytearray(min(CHUNK, max(remaining, 1)))
    view = memoryview(buf)
    while remaining > 0:
        n = fh.readinto(view[:min(len(buf), remaining)])
        if not n:
            return f"entry {e.name!r}: file ends inside its data (truncated)"
        remaining -= n
        counter.bytes_read += n
        if update is not None:
            update(update_bytes=n)
        if decomp is None:
            crc = _crc32(view[:n], crc)
            continue
        data = view[:n]
        try:
            while True:
                out = decomp.decompress(data, CHUNK)
                produced += len(out)
                if produced > e.usize:
                    return _inflate_overrun(e, produced)
                crc = _crc32(out, crc)
                data = decomp.unconsumed_tail
                if not data and len(out) < CHUNK:
                    break
        except zlib.error as exc:
            return f"entry {e.name!r}: corrupt compressed data ({exc})"
    if decomp is not None:
        try:
            out = decomp.flush()
        except zlib.error as exc:
            return f"entry {e.name!r}: corrupt compressed data ({exc})"
        produced += len(out)
        if produced > e.usize:
            return _inflate_overrun(e, produced)
        crc = _crc32(out, crc)
        if produced != e.usize:
            return f"entry {e.name!r} inflates to {produced} bytes, declared {e.usize}: size field wrong"
    if crc != e.crc:
        return f"entry {e.name!r}: CRC-32 mismatch (stored {e.crc:08x}, computed {crc:08x}): data corrupted"
    return None


# --------------------------------------------------------------------------- pickles (opcodes only)

def pickle_strings(data: bytes, limit: int = 200_000) -> list[str]:
    """String constants of a pickle, read from its opcodes (pickletools.genops): nothing runs."""
    out: list[str] = []
    try:
        for op, arg, _pos in pickletools.genops(data):
            if isinstance(arg, str) and "UNICODE" in op.name or op.name in ("SHORT_BINSTRING", "BINSTRING"):
                out.append(arg if isinstance(arg, str) else str(arg))
                if len(out) >= limit:
                    break
    except Exception:  # noqa: BLE001 - a broken pickle just yields fewer strings
        pass
    return out


_INT_OPS = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}


#: memoized strings remembered while walking a DCP .metadata (a real one memoizes each fqn and
#: path string once; a hostile one could memoize millions): past this, further strings are not
#: remembered and memory stays bounded (~60 MB at worst).
MAX_MEMO_STRINGS = 500_000


def dcp_storage_map(data: bytes) -> tuple[dict[str, int], set[str]] | str:  # noqa: C901 - complexity debt, see issue 10
    """From a torch.distributed.checkpoint `.metadata` pickle, without unpickling it:
    {relative_path: bytes needed (max offset+length)} and the top-level state_dict keys.

    A tiny symbolic walk over the opcodes with a six-token window: enough to follow
    `_StorageInfo(relative_path=..., offset=..., length=...)` entries and `fqn` strings. Only
    memoized strings are remembered (at most MAX_MEMO_STRINGS), so memory stays bounded whatever
    the pickle holds; nothing but the results grows with the file.
    """
    if len(data) > (1 << 20) and b"relative_path" not in data:  # a big pickle of something else: no walk
        return "no storage entries found in .metadata (no relative_path in the pickle)"
    _obj = object()
    memo: dict[int, str] = {}
    memo_len = 0  # MEMOIZE numbers entries by count, remembered or not
    window: deque = deque(maxlen=6)
    last: object = _obj
    needed: dict[str, int] = {}
    keys: set[str] = set()
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name == "MEMOIZE" or name in _PUT_OPS:
                index = memo_len if name == "MEMOIZE" else arg
                if name == "MEMOIZE":
                    memo_len += 1
                if isinstance(last, str) and (len(memo) < MAX_MEMO_STRINGS or index in memo):
                    memo[index] = last
                else:
                    memo.pop(index, None)
                continue
            if name in _GET_OPS:
                last = memo.get(arg, _obj)
            elif isinstance(arg, str) and name not in ("GLOBAL", "INST"):
                last = arg
            elif name in _INT_OPS and isinstance(arg, int) and not isinstance(arg, bool):
                last = arg
            elif name == "STOP":
                break
            else:
                last = _obj
            window.append(last)
            if len(window) == 6 and window[0] == "relative_path" and window[2] == "offset" and window[4] == "length":
                rel, off, ln = window[1], window[3], window[5]
                if isinstance(rel, str) and isinstance(off, int) and isinstance(ln, int):
                    needed[rel] = max(needed.get(rel, 0), off + ln)
            if len(window) >= 2 and window[-2] == "fqn" and isinstance(last, str):
                keys.add(last.split(".", 1)[0])
        else:
            return "broken .metadata: pickle ends without STOP (truncated)"
    except Exception as exc:  # noqa: BLE001 - genops raises ValueError on garbage
        return f"broken .metadata: not a complete pickle ({str(exc)[:80]})"
    return needed, keys


def check_dcp_file(path: str, items: list, counter: Counter, update=None) -> list[Finding]:
    """Level full of one DCP data file: every item `.metadata` places in it (framework_layouts.DcpItem) is a torch
    archive torch.load reads (scan_embedded_zip, CRC-32 included) holding what the metadata says: a tensor of the
    chunk's sizes. Raw tensor bytes (an item exactly numel x itemsize long, not an archive) are read through. The
    first finding of the file, or none."""
    try:
        with open_regular(path) as fh:
            for it in sorted(items, key=lambda i: i.offset):
                reason = _dcp_item_finding(fh, it, counter, update)
                if reason is not None:
                    return [reason]
    except (OSError, ReadError) as exc:
        return [Finding(_oserror(exc))]
    return []


def _dcp_item_finding(fh, it, counter: Counter, update) -> Finding | None:
    if it.transformed:   # compressed / encrypted by a DCP extension: its bytes are read, not parsed
        fh.seek(it.offset)
        counter.bytes_read += len(fh.read(min(it.length, CHUNK)))
        return None
    fh.seek(it.offset)
    head = fh.read(4)
    numel = 1
    for d in it.sizes or ():
        numel *= d
    if it.sizes is not None and head != _LFH and it.length == numel * tp.DTYPE_SIZE.get(it.dtype or "", -1):
        for _chunk in _window_chunks(fh, it.offset, it.length, counter, update):
            pass
        return None
    z = scan_embedded_zip(fh, it.offset, it.length, counter, update)
    where = f"item {tp.shown(it.fqn)} (bytes {it.offset}..{it.offset + it.length})"
    if z.findings:
        return Finding(f"{where}: {z.findings[0]}", getattr(z.findings[0], "kind", "invalid"))
    root = z.pickle.root if z.pickle is not None else None
    if it.sizes is not None and not (isinstance(root, tp.TensorRef) and tuple(root.shape) == tuple(it.sizes)):
        shape = list(root.shape) if isinstance(root, tp.TensorRef) else type(root).__name__
        return Finding(f"{where}: holds {shape}, .metadata says a tensor of {list(it.sizes)} (dcp.load refuses it)")
    return None


def _window_chunks(fh, base: int, length: int, counter: Counter, update):
    fh.seek(base)
    left = length
    while left > 0:
        data = fh.read(min(CHUNK, left))
        if not data:
            return
        left -= len(data)
        counter.bytes_read += len(data)
        if update is not None:
            update(update_bytes=len(data))
        yield data
