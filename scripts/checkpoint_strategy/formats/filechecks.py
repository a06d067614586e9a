"""Per-file integrity checks that never execute checkpoint content.

Every function returns a list of reasons (empty = fine) and adds to a `Counter` the
bytes it read. Quick checks read headers only (cost grows with the number of files);
`full=True` also streams every byte in fixed-size chunks (flat memory). The zip records and the
safetensors header are read by `archive` (the one reader of each); this module judges a torch archive
(its pickle, its records, its storages) and the other files.
"""

from __future__ import annotations

import io
import os
import pickletools
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, BinaryIO, TypeAlias, cast

from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.formats.archive import CHUNK, Counter, Finding, Update, ZipEntry, truncated
from checkpoint_strategy.storage import ReadError, open_regular, read_small

if TYPE_CHECKING:
    from checkpoint_strategy.formats.models import DcpItem

# A DCP .metadata is read whole: one of a 70B model sharded over 1024 ranks is a few MB; a link to /dev/zero
# must not grow memory.
MAX_DCP_METADATA = 64 << 20


def _oserror(exc: BaseException) -> str:
    """The one wording of a read failure in a problem line (archive.read_failure)."""
    return zr.read_failure(exc)


def read_chunks(path: str, counter: Counter, update: Update | None = None) -> Iterator[memoryview]:
    """Yield every byte of a file as memoryviews of one reused CHUNK buffer (flat memory),
    counting bytes read and reporting progress."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open_regular(path) as fh:
        while True:
            n = cast(io.BufferedReader, fh).readinto(buf)  # (typeshed's BinaryIO names no readinto)
            if not n:
                return
            counter.bytes_read += n
            if update is not None:
                update(update_bytes=n)
            yield view[:n]


def stream_file(path: str, counter: Counter, update: Update | None = None) -> list[str]:
    """Read every byte (full level, formats without their own checksum)."""
    try:
        for _chunk in read_chunks(path, counter, update):
            pass
    except (OSError, ReadError) as exc:
        return [_oserror(exc)]
    return []


# --------------------------------------------------------------------------- safetensors


def check_safetensors(
    path: str, counter: Counter, full: bool = False, regular: bool = False
) -> list[str]:
    """8-byte length, JSON header, dtype x shape == offsets, offsets tile the buffer, file size. ``regular``:
    the caller's folder listing saw a regular file (storage.read_small)."""
    counter.files += 1
    try:
        got = read_small(path, "file", zr.ST_SMALL_BYTES, regular=regular)
        if isinstance(got, bytes):  # a small file read whole: the header is a slice of it
            counter.sizes[path] = len(got)
            head = zr.st_head(got, len(got))
        else:
            with got as fh:
                head = zr.st_head(fh, os.fstat(fh.fileno()).st_size)
    except (OSError, ReadError) as exc:
        return [_oserror(exc)]
    if isinstance(head, list):
        return list(head)
    raw, data_size = head
    counter.bytes_read += 8 + len(raw)
    reasons: list[str] = list(zr.check_st_header(raw, data_size))
    if not reasons and full:
        reasons = stream_file(path, counter)
    return reasons


def safetensors_header(path: str, regular: bool = False) -> dict | None:
    """The parsed header, or None (used for index.json cross-checks; ``regular``: the caller's listing saw a
    regular file)."""
    got = zr.safetensors_header(path, regular)
    return got[0] if got is not None else None


# --------------------------------------------------------------------------- torch archives (zip)


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
        return self.by_name().get(name)

    def by_name(self) -> dict[str, ZipEntry]:
        """Entry name -> the first entry of that name (`entry`'s dict: built once per entry list)."""
        index = self._index
        if index is None or index[0] is not self.entries or index[1] != len(self.entries):
            by_name: dict[str, ZipEntry] = {}
            for e in self.entries:
                by_name.setdefault(e.name, e)
            index = self._index = (self.entries, len(self.entries), by_name)
        return index[2]


def check_zip(
    path: str,
    counter: Counter,
    full: bool = False,
    want_pickle: bool = False,
    update: Update | None = None,
) -> tuple[list[str], list[str]]:
    """torch.save zip archive checks (see `scan_zip`). Returns (reasons, the pickle's strings if wanted)."""
    z = scan_zip(path, counter, full, update)
    return list(z.findings), z.strings() if want_pickle else []


def scan_zip(
    path: str,
    counter: Counter,
    full: bool = False,
    update: Update | None = None,
    regular: bool = False,
    crc: bool | None = None,
) -> ZipScan:
    """torch.save zip archive: end record, central directory (unique names), every local header and
    entry size, the `version` record; data.pkl read as opcodes (parses to STOP, globals against the
    weights_only allow-list, every persistent-id storage present with dtype x numel bytes);
    full: CRC-32 of every entry (streamed; `crc=False`: not here, the caller checks them as it reads the bytes,
    `deep.run`). A legacy (pre-1.6) file is parsed the same way. ``regular``: the caller's folder listing saw a
    regular file (storage.read_small)."""
    counter.files += 1
    z = ZipScan()
    try:
        # quick level: a file of at most SMALL_ZIP_BYTES is read in one call and served from memory: the same
        # bytes, one read instead of the end-record search's and two per entry
        got = (
            open_regular(path)
            if full
            else read_small(path, "file", zr.SMALL_ZIP_BYTES, regular=regular)
        )
        if isinstance(got, bytes):
            counter.sizes[path] = len(got)
            _scan_small_zip(got, path, z, counter)
        else:
            with got as fh:
                _scan_open_zip(fh, path, z, counter, full, update, crc)
    except (OSError, ReadError) as exc:
        z.findings.append(Finding(_oserror(exc)))
    return z


#: the quick level's verdicts on small archives, by their bytes: an archive byte for byte the same as one checked
#: already (the Trainer's training_args.bin in every checkpoint of a run, a tree of copies) gets that check's
#: findings, directory and pickle again, not a second parse of them. Looked up by the archive's last SCANNED_KEY
#: bytes (its end records and the end of its directory: hashing them costs a miss ~1k instructions, the whole
#: archive ~10k), then its whole bytes compared. Bounded: archives of at most SCANNED_BYTES, SCANNED_MAX of them
#: (then it starts again empty); a legacy file is not kept (its note names the file).
SCANNED_BYTES = 1 << 16
SCANNED_KEY = 128
SCANNED_MAX = 32
_Kept: TypeAlias = "tuple[bytes, tuple[Finding, ...], list[ZipEntry], str, tp.PickleScan | None, tuple | None, int]"
_SCANNED: dict[bytes, _Kept] = {}


def _scan_small_zip(data: bytes, path: str, z: ZipScan, counter: Counter) -> None:
    """`_scan_open_zip` at the quick level on an archive read whole (what it finds depends on its bytes alone:
    kept in `_SCANNED`, shared read-only)."""
    if len(data) > SCANNED_BYTES:
        _scan_open_zip(zr.InMemory(data), path, z, counter, False, None)
        return
    key = data[-SCANNED_KEY:]
    kept = _SCANNED.get(key)
    if kept is not None and kept[0] == data:
        _data, findings, z.entries, z.prefix, z.pickle, z._index, read = kept
        z.findings.extend(findings)
        counter.bytes_read += read
        return
    start = counter.bytes_read
    _scan_open_zip(zr.InMemory(data), path, z, counter, False, None)
    if not z.legacy:
        if len(_SCANNED) >= SCANNED_MAX:
            _SCANNED.clear()
        _SCANNED[key] = (
            data,
            tuple(z.findings),
            z.entries,
            z.prefix,
            z.pickle,
            z._index,
            counter.bytes_read - start,
        )


def scan_embedded_zip(
    fh: zr.Readable,
    base: int,
    length: int,
    counter: Counter,
    update: Update | None = None,
    crc: bool = True,
    whole: bool | None = None,
) -> ZipScan:
    """`scan_zip` at level full of the torch archive at [base, base+length) of an open file (each item of a DCP
    .distcp is one torch.save archive, which dcp.load reads with torch.load): directory, local headers, data.pkl
    and the CRC-32 of every entry (`crc=False`: left to the caller). A small archive is read once into memory
    (`whole=False`: never; level deep, whose value scan reads the entries' bytes and their CRC-32 in one pass). The
    one reader of these archives: validate's item checks, the deep level (the archives level full did not read) and
    convert ask it."""
    z = ZipScan()
    if length <= zr.SMALL_ZIP_BYTES if whole is None else whole:
        fh.seek(base)
        data = fh.read(length)
        counter.bytes_read += len(data)
        if len(data) != length:
            z.findings.append(
                truncated(f"truncated: the file ends inside the archive at byte {base}")
            )
            return z
        src: zr.Source = zr.InMemory(data)
    else:
        src = zr.Window(fh, base, length)
    _scan_open_zip(src, "archive", z, counter, True, update, None if crc else False)
    if z.legacy and not z.findings:
        z.findings.append(
            Finding("not a torch zip archive (dcp.load reads each item with torch.load)")
        )
    return z


def _scan_open_zip(
    src: zr.Source,
    path: str,
    z: ZipScan,
    counter: Counter,
    full: bool,
    update: Update | None,
    crc: bool | None = None,
) -> None:
    """scan_zip's steps on the open file (or its bytes); each stops at the first finding (added to z)."""
    parsed = _zip_entries(src, path, z, counter)
    if parsed is None:
        return
    entries, cd_offset = parsed
    for pkl in entries:  # (the first data.pkl, at the top or in one folder)
        name = pkl.name
        if name == "data.pkl" or name.endswith("/data.pkl"):
            break
    else:
        pkl = None
    if pkl is None and len({e.name.split("/", 1)[0] for e in entries}) == 1:
        z.findings.append(Finding("torch archive without data.pkl"))
        zr.unread(entries)
        return
    finding = zr.local_headers(src, entries, cd_offset, counter, full)
    if finding is not None:
        z.findings.append(finding)
        return
    if pkl is not None:
        z.prefix = pkl.name[: -len("data.pkl")]
        z.findings.extend(check_torch_pickle(src, z, counter))
        if z.findings:
            return
    if full and crc is not False:
        reason = zr.crc_entries(path, src, entries, counter, update)
        if reason:
            z.findings.append(Finding(reason))


def _zip_entries(src: zr.Source, path: str, z: ZipScan, counter: Counter) -> zr.Directory | None:
    """The central directory's entries (non-empty, unique names) and its offset; None once a finding is
    added (too short, not a zip archive, empty, a duplicate name) or a legacy torch file was checked instead."""
    if isinstance(src, zr.InMemory):
        size, magic = len(src.data), src.data[:2]
    else:
        size = zr.source_size(src)
        magic = b""
        if size:
            src.seek(0)
            magic = src.read(2)
    if size == 0:
        z.findings.append(Finding("zero-byte file (expected a torch zip archive)"))
        return None
    if size < 22 and magic[:1] != b"\x80":
        z.findings.append(Finding(f"truncated: {size} bytes, too short for a zip archive"))
        return None
    parsed = zr.read_directory(src, size) if size >= 22 else "not a zip archive"
    counter.bytes_read += min(size, 65535 + 42)
    if isinstance(parsed, str):
        if magic[:1] == b"\x80" and not parsed.startswith("broken"):
            z.legacy = True
            z.findings.extend(_check_legacy(src, size, counter, os.path.basename(path), z))
            return None
        z.findings.append(Finding(parsed))
        return None
    entries, cd_offset = parsed
    z.entries = entries
    if not entries:
        z.findings.append(Finding("empty zip archive (no entries)"))
        return None
    by_name = {
        e.name: e for e in reversed(entries)
    }  # the first entry of a name, as ZipScan.entry finds it
    if len(by_name) != len(entries):
        names = [e.name for e in entries]
        dup = next(n for n in names if names.count(n) > 1)
        z.findings.append(
            Finding(
                f"duplicate entry {dup!r} in the central directory (torch.load would "
                "refuse or read the wrong one)"
            )
        )
        zr.unread(entries)
        return None
    z._index = (entries, len(entries), by_name)
    return entries, cd_offset


def check_torch_pickle(src: zr.Source, z: ZipScan, counter: Counter) -> list[Finding]:
    """data.pkl read as data (`z.pickle`), then the version and byteorder records and every storage the pickle
    names, as torch.load needs them; the findings (at most 5)."""
    by_name, prefix = z.by_name(), z.prefix
    pkl = by_name.get(prefix + "data.pkl")
    if pkl is None:
        return [Finding(f"no {prefix}data.pkl in the archive")]
    data = zr.read_entry(src, pkl, counter)
    if isinstance(data, str):
        return [Finding(data)]
    if not data:
        return [Finding(f"{pkl.name} is empty (torch.load cannot open this archive)")]
    scan = tp.read_pickle(data)
    z.pickle = scan
    out = pickle_findings(scan, pkl.name)
    if out:
        return out
    if prefix + "version" not in by_name and prefix + ".data/version" not in by_name:
        out.append(Finding(f"no {prefix}version record (torch.load refuses an archive without it)"))
    else:
        out.extend(record_findings(src, z, counter))
    if scan.past_end is not None:
        return [*out, _view_past_storage(scan.past_end)]
    if not scan.storages:  # (nothing to look up: a pickle of plain values)
        return out
    return out + _storage_findings(scan, z, pkl.name, 5 - len(out))


def _view_past_storage(t: tp.TensorRef) -> Finding:
    """The first tensor view that runs past the end of its storage (`PickleScan.past_end`: torch.load fails on it;
    the reader finds it as it makes the tensors)."""
    return Finding(
        f"a tensor view ({t.dtype}{list(t.shape)} at offset {t.offset}) runs past the end "
        f"of its storage data/{t.storage.key} (torch.load would fail)"
    )


def _storage_findings(scan: tp.PickleScan, z: ZipScan, pkl_name: str, room: int) -> list[Finding]:
    """Each storage the pickle names: its entry present, dtype x numel bytes long (at most `room` findings, and
    always the first one)."""
    out: list[Finding] = []
    by_name, at, size = z.by_name(), f"{z.prefix}data/", tp.DTYPE_SIZE.get
    for (
        key,
        ref,
    ) in scan.storages.items():  # (every storage whole, the usual case: one pass, unsorted)
        e = by_name.get(at + key)
        if e is None or (ref.dtype != "unknown" and e.usize != ref.numel * size(ref.dtype, 1)):
            break
    else:
        return out
    for key, ref in sorted(scan.storages.items()):
        e = by_name.get(at + key)
        if e is None:
            out.append(
                Finding(f"storage data/{key} referenced by {pkl_name} is missing from the archive")
            )
        elif ref.dtype != "unknown" and e.usize != ref.nbytes:
            out.append(
                Finding(
                    f"storage data/{key}: {e.usize} bytes, {pkl_name} needs {ref.nbytes} "
                    f"({ref.numel} x {ref.dtype})"
                )
            )
        if len(out) >= max(1, room):
            break
    return out


#: the archive format versions torch.load reads (torch 2.x caffe2/serialize: kMinSupportedFileFormatVersion 1,
#: kMaxSupportedFileFormatVersion 0xA); the record is read as C's strtoull does (spaces, a '+', leading digits)
TORCH_FILE_VERSIONS = range(1, 11)
_VERSION_TEXT = re.compile(rb"^\s*\+?(\d+)")


def record_findings(src: zr.Source, z: ZipScan, counter: Counter) -> list[Finding]:
    """The version and byteorder records as torch.load reads them: a version it supports, an endianness it knows."""
    by_name, prefix = z.by_name(), z.prefix
    e = by_name.get(prefix + "version") or by_name.get(prefix + ".data/version")
    data = zr.read_entry(src, e, counter, limit=1 << 10) if e is not None else b""
    m = _VERSION_TEXT.match(data) if isinstance(data, bytes) else None
    if m is None or int(m.group(1)) not in TORCH_FILE_VERSIONS:
        shown_text = data[:20] if isinstance(data, bytes) else data
        return [
            Finding(
                f"{e.name if e else 'version'}: format version {shown_text!r}: torch.load reads versions "
                f"{TORCH_FILE_VERSIONS.start}-{TORCH_FILE_VERSIONS.stop - 1} only"
            )
        ]
    bo = by_name.get(prefix + "byteorder")
    order = zr.read_entry(src, bo, counter, limit=1 << 10) if bo is not None else b"little"
    if order not in (b"little", b"big"):
        return [
            Finding(
                f"{bo.name if bo else 'byteorder'}: {order!r} is not an endianness torch.load knows "
                "(little or big)"
            )
        ]
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
        return [
            Finding(
                f"{what}: pickle protocol 0 (storage ids written as text): torch.load cannot read it; "
                "save with the default pickle protocol"
            )
        ]
    return []


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _check_legacy(
    fh: zr.Source, size: int, counter: Counter, name: str, z: ZipScan
) -> list[Finding]:
    """Legacy (pre-1.6, non-zip) torch.save: five pickles (magic number, protocol, sys info, the
    object, the sorted storage keys) then, per key, an 8-byte element count and the raw bytes."""
    fh.seek(0)
    reader = io.BufferedReader(fh, buffer_size=1 << 16) if isinstance(fh, io.RawIOBase) else fh
    scans = _legacy_pickles(reader, name, z)
    if isinstance(scans, Finding):
        return [scans]
    if scans[0].root != _LEGACY_MAGIC:
        return [Finding("legacy torch file: wrong magic number (not written by torch.save)")]
    keys = scans[4].root
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return [Finding("legacy torch file: storage key list is not a list of names")]
    refs = scans[3].storages
    missing = sorted(set(refs) - set(keys))
    if missing:
        return [Finding(f"legacy torch file: storage {missing[0]} is referenced but not written")]
    pos = _legacy_storages(reader, keys, refs, size)
    if isinstance(pos, Finding):
        return [pos]
    counter.bytes_read += pos
    if pos != size:
        return [Finding(f"legacy torch file: {size - pos} trailing bytes after the last storage")]
    counter.notes.append(
        f"{name}: legacy (pre-1.6) torch serialization; pickle and storage sizes checked"
    )
    return []


def _legacy_pickles(
    reader: zr.Source | io.BufferedReader, name: str, z: ZipScan
) -> list[tp.PickleScan] | Finding:
    """The five pickles of a legacy file read as data (the object's is `z.pickle`), or the first finding."""
    scans = []
    for i in range(5):
        scan = tp.read_pickle(reader)
        scans.append(scan)
        if i == 3:
            z.pickle = scan
        if scan.unsafe() or (i == 3 and not scan.complete):
            return pickle_findings(scan, f"{name} (legacy torch file)")[0]
        if not scan.complete:
            return Finding(f"legacy torch file: pickle {i + 1} of 5 is broken ({scan.error})")
    return scans


def _legacy_storages(
    reader: zr.Source | io.BufferedReader,
    keys: list[str],
    refs: dict[str, tp.StorageRef],
    size: int,
) -> int | Finding:
    """Each storage's element count after the pickles, as the object's pickle says, within the file: the offset
    where the last one ends, or the first finding."""
    pos = reader.tell()
    for key in keys:
        reader.seek(pos)
        head = reader.read(8)
        if len(head) != 8:
            return truncated(f"truncated: legacy torch file ends before storage {key}")
        (numel,) = struct.unpack("<q", head)
        ref = refs.get(key)
        item = tp.DTYPE_SIZE.get(ref.dtype, 1) if ref is not None else 1
        if numel < 0 or (ref is not None and numel != ref.numel):
            return Finding(
                f"legacy torch file: storage {key} holds {numel} elements, the pickle says "
                f"{ref.numel if ref else '?'}"
            )
        pos += 8 + numel * item
        if pos > size:
            return truncated(f"truncated: legacy torch file ends inside storage {key}")
    return pos


# --------------------------------------------------------------------------- pickles (opcodes only)


def pickle_strings(data: bytes, limit: int = 200_000) -> list[str]:
    """String constants of a pickle, read from its opcodes (pickletools.genops): nothing runs."""
    out: list[str] = []
    try:
        for op, arg, _pos in pickletools.genops(data):
            if (
                isinstance(arg, str)
                and "UNICODE" in op.name
                or op.name in ("SHORT_BINSTRING", "BINSTRING")
            ):
                out.append(arg if isinstance(arg, str) else str(arg))
                if len(out) >= limit:
                    break
    except Exception:  # noqa: BLE001 - a broken pickle just yields fewer strings
        pass
    return out


def check_dcp_file(
    path: str,
    items: list[DcpItem],
    counter: Counter,
    update: Update | None = None,
    archives: dict[tuple[str, int], ZipScan] | None = None,
    defer_crc: bool = False,
) -> list[Finding]:
    """Level full of one DCP data file: every item `.metadata` places in it (formats.models.DcpItem) is a torch
    archive torch.load reads (scan_embedded_zip, CRC-32 included) holding what the metadata says: a tensor of the
    chunk's sizes. Raw tensor bytes (an item exactly numel x itemsize long, not an archive) are read through. The
    first finding of the file, or none; `archives` gets each item's archive as read, by (item.rel, item.offset),
    for the deep level (which reads their tensors, not their structure again). `defer_crc` (level deep): the
    archives' CRC-32s are left to the value scan (`dcp_crc_entries`: one pass over the bytes), or to
    `dcp_crc_findings` when it does not run; an item's finding is reported after the CRC-32s of the archives
    before it, as level full finds them; a file with a finding leaves none of its archives in `archives`."""
    checked: list[DcpItem] = []
    try:
        with open_regular(path) as fh:
            for it in sorted(items, key=lambda i: i.offset):
                reason = _dcp_item_finding(fh, it, counter, update, archives, defer_crc)
                if reason is not None and defer_crc and archives is not None:
                    reason = _first_crc_finding(fh, checked, archives, counter, update) or reason
                    for done in checked:
                        archives.pop((done.rel, done.offset), None)
                if reason is not None:
                    return [reason]
                checked.append(it)
    except (OSError, ReadError) as exc:
        return [Finding(_oserror(exc))]
    return []


def dcp_item_where(it: DcpItem) -> str:
    """How a finding names a DCP item: its fqn and its bytes in the storage file."""
    return f"item {tp.shown(it.fqn)} (bytes {it.offset}..{it.offset + it.length})"


def _first_crc_finding(
    fh: BinaryIO,
    items: list[DcpItem],
    archives: dict[tuple[str, int], ZipScan],
    counter: Counter,
    update: Update | None,
) -> Finding | None:
    """Level full's CRC-32 of the deferred archives of `items` (one file, offset order): the first finding."""
    for it in items:
        z = archives.get((it.rel, it.offset))
        if z is None:
            continue
        reason = zr.crc_entries(
            "archive", zr.Window(fh, it.offset, it.length), z.entries, counter, update
        )
        if reason:
            return Finding(f"{dcp_item_where(it)}: {reason}")
    return None


def dcp_crc_findings(
    folder: str,
    items: list[DcpItem],
    archives: dict[tuple[str, int], ZipScan],
    counter: Counter,
    update: Update | None = None,
) -> list[tuple[str, Finding]]:
    """Level full's CRC-32s of the archives `check_dcp_file(defer_crc=True)` left in `archives`, when the value
    scan does not check them: (file path, its first finding) per storage file."""
    by_file: dict[str, list[DcpItem]] = {}
    for it in sorted(items, key=lambda i: i.offset):
        if (it.rel, it.offset) in archives:
            by_file.setdefault(it.rel, []).append(it)
    out = []
    for rel, its in sorted(by_file.items()):
        path = os.path.join(folder, rel)
        try:
            with open_regular(path) as fh:
                reason = _first_crc_finding(fh, its, archives, counter, update)
        except (OSError, ReadError) as exc:
            reason = Finding(_oserror(exc))
        if reason is not None:
            out.append((path, reason))
    return out


def dcp_crc_entries(
    items: list[DcpItem], archives: dict[tuple[str, int], ZipScan]
) -> dict[str, tuple[list[ZipEntry], dict[int, Callable[[], str]]]]:
    """For the value scan's one pass: per storage file (relative path), the entries of its deferred archives at
    their offsets in the file (item order, then archive order: the order level full reports them in) and the
    item each is in (id(entry) -> its `dcp_item_where`, worded when a finding needs it)."""
    out: dict[str, tuple[list[ZipEntry], dict[int, Callable[[], str]]]] = {}
    for it in sorted(items, key=lambda i: i.offset):
        z = archives.get((it.rel, it.offset))
        if z is None:
            continue
        entries, where = out.setdefault(it.rel, ([], {}))
        label = partial(dcp_item_where, it)
        base = it.offset
        for e in z.entries:
            moved = ZipEntry(
                e.name, e.method, e.crc, e.csize, e.usize, base + e.offset, base + e.data_start
            )
            entries.append(moved)
            where[id(moved)] = label
    return out


def _dcp_item_finding(
    fh: BinaryIO,
    it: DcpItem,
    counter: Counter,
    update: Update | None,
    archives: dict[tuple[str, int], ZipScan] | None = None,
    defer_crc: bool = False,
) -> Finding | None:
    if it.transformed:  # compressed / encrypted by a DCP extension: its bytes are read, not parsed
        fh.seek(it.offset)
        counter.bytes_read += len(fh.read(min(it.length, CHUNK)))
        return None
    fh.seek(it.offset)
    head = fh.read(4)
    numel = 1
    for d in it.sizes or ():
        numel *= d
    if (
        it.sizes is not None
        and head != zr.LFH
        and it.length == numel * tp.DTYPE_SIZE.get(it.dtype or "", -1)
    ):
        for _chunk in _window_chunks(fh, it.offset, it.length, counter, update):
            pass
        return None
    deferred = defer_crc and archives is not None
    z = scan_embedded_zip(
        fh,
        it.offset,
        it.length,
        counter,
        update,
        crc=not deferred,
        whole=False if deferred else None,
    )
    where = dcp_item_where(it)
    if z.findings:
        return Finding(f"{where}: {z.findings[0]}", getattr(z.findings[0], "kind", "invalid"))
    root = z.pickle.root if z.pickle is not None else None
    if it.sizes is not None and not (
        isinstance(root, tp.TensorRef) and tuple(root.shape) == tuple(it.sizes)
    ):
        shape = list(root.shape) if isinstance(root, tp.TensorRef) else type(root).__name__
        crc = (
            zr.crc_entries(
                "archive", zr.Window(fh, it.offset, it.length), z.entries, counter, update
            )
            if deferred
            else None
        )  # level full finds the archive's CRC-32 wrong first
        return Finding(
            f"{where}: {crc}"
            if crc
            else f"{where}: holds {shape}, .metadata says a tensor of {list(it.sizes)} (dcp.load refuses it)"
        )
    if archives is not None:
        archives[(it.rel, it.offset)] = z
    return None


def _window_chunks(
    fh: BinaryIO, base: int, length: int, counter: Counter, update: Update | None
) -> Iterator[bytes]:
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
