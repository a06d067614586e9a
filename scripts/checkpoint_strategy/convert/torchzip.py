"""Write torch.save archives without torch: a pickle made of plain opcodes plus stored zip entries.

`torch.load(weights_only=True)` reads what this writes: the pickle references only
``torch._utils._rebuild_tensor_v2``, ``collections.OrderedDict`` and the legacy storage classes
(``torch.FloatStorage`` ...), each storage a persistent id ``('storage', cls, key, 'cpu', numel)``
whose bytes are the zip entry ``<prefix>/data/<key>``, aligned to 64 bytes like torch's own writer.
Writing a pickle is building bytes; nothing here reads or runs one.

The zip is streamed: a local header with the sizes known up front (entries are stored, never
compressed), the data written in chunks by the caller, the CRC-32 patched into the local header
afterwards; zip64 records wherever a size or offset passes 4 GB.
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.formats.archive import crc32  # ISA-L's CRC-32 when installed, else zlib's

#: torch dtype name -> the legacy storage class torch.save names for it
STORAGE_CLASS = {d: c for c, d in tp.STORAGE_DTYPE.items() if c != "UntypedStorage"}
ALIGN = 64
_Z64 = 0xFFFFFFFF


class TensorLeaf:
    """A tensor in a tree handed to `pickle_bytes`: written as storage `key` (numel elements)."""

    def __init__(self, key: str, dtype: str, shape: tuple, numel: int) -> None:
        self.key, self.dtype, self.shape, self.numel = key, dtype, tuple(shape), numel


class Ref:
    """A global (GLOBAL module name): torch.float32, torch.strided."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class Reduce:
    """module.name(*args) at load time (REDUCE): torch.Size((3, 4)), an enum member."""

    def __init__(self, module: str, name: str, args: tuple) -> None:
        self.module, self.name, self.args = module, name, args


class Obj:
    """A dataclass instance the way pickle writes one: cls.__new__ (NEWOBJ) then BUILD(state)."""

    def __init__(self, module: str, name: str, state: Any) -> None:
        self.module, self.name, self.state = module, name, state


# --------------------------------------------------------------------------- pickle (protocol 2, plain opcodes)


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _int(v: int) -> bytes:
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if 0 <= v < 65536:
        return b"M" + struct.pack("<H", v)
    if -(1 << 31) <= v < (1 << 31):
        return b"J" + struct.pack("<i", v)
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _str(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw


def _tuple(items: list[bytes]) -> bytes:
    return b"(" + b"".join(items) + b"t"


def _tensor(t: TensorLeaf) -> bytes:
    cls = STORAGE_CLASS[t.dtype]
    stride, acc = [], 1
    for d in reversed(t.shape):
        stride.append(acc)
        acc *= d
    pid = (
        _tuple([_str("storage"), _global("torch", cls), _str(t.key), _str("cpu"), _int(t.numel)])
        + b"Q"
    )
    args = _tuple(
        [
            pid,
            _int(0),
            _tuple([_int(d) for d in t.shape]),
            _tuple([_int(s) for s in reversed(stride)]),
            b"\x89",
            _global("collections", "OrderedDict") + b")R",
        ]
    )
    return _global("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def _value(v: Any, depth: int = 0) -> bytes:  # noqa: C901 - one branch per value type, a flat dispatch
    if depth > 100:
        raise ValueError("nested more than 100 levels")
    if isinstance(v, TensorLeaf):
        return _tensor(v)
    if isinstance(v, Ref):
        return _global(v.module, v.name)
    if isinstance(v, Reduce):
        return _global(v.module, v.name) + _value(v.args, depth + 1) + b"R"
    if isinstance(v, Obj):
        return _global(v.module, v.name) + b")\x81" + _value(v.state, depth + 1) + b"b"
    if v is None:
        return b"N"
    if v is True or v is False:
        return b"\x88" if v else b"\x89"
    if isinstance(v, int):
        return _int(v)
    if isinstance(v, float):
        return b"G" + struct.pack(">d", v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, (bytes, bytearray)):
        return (
            _global("_codecs", "encode")
            + _tuple([_str(bytes(v).decode("latin-1")), _str("latin1")])
            + b"R"
        )
    if isinstance(v, tuple):
        return _tuple([_value(x, depth + 1) for x in v])
    if isinstance(v, list):
        return b"](" + b"".join(_value(x, depth + 1) for x in v) + b"e"
    if isinstance(v, dict):
        return (
            b"}("
            + b"".join(_value(k, depth + 1) + _value(x, depth + 1) for k, x in v.items())
            + b"u"
        )
    raise ValueError(f"cannot write a {type(v).__name__} value")


def pickle_bytes(tree: Any) -> bytes:
    """Protocol-2 pickle (torch.save's) of plain data (dict, list, tuple, str, int, float, bool, None, bytes) and
    TensorLeaf objects, as torch.save lays tensors out."""
    return b"\x80\x02" + _value(tree) + b"."


# --------------------------------------------------------------------------- zip (stored entries, streamed)


class ZipWriter:
    """Stored zip entries written to `fh` from its current position (`base`: the archive's own offset 0,
    so an archive embedded in a DCP .distcp file reads as a whole when sliced out)."""

    def __init__(self, fh: BinaryIO, prefix: str = "archive") -> None:
        self.fh = fh
        self.base = fh.tell()
        self.prefix = prefix
        self.entries: list[tuple[bytes, int, int, int]] = []  # name, crc, size, local header offset
        self._open: tuple[bytes, int, int, int] | None = None
        self.crc = 0

    def _pos(self) -> int:
        return self.fh.tell() - self.base

    def begin(self, name: str, size: int) -> None:
        """Local header of entry `name` holding `size` bytes; data aligned to 64 bytes."""
        raw = f"{self.prefix}/{name}".encode()
        at = self._pos()
        z64 = size >= _Z64
        extra = struct.pack("<HHQQ", 1, 16, size, size) if z64 else b""
        pad = (-(at + 30 + len(raw) + len(extra) + 4)) % ALIGN
        extra += struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # torch's "FB" padding record
        self.fh.write(
            struct.pack(
                "<4sHHHHHIIIHH",
                b"PK\x03\x04",
                45 if z64 else 20,
                0,
                0,
                0,
                0x21,
                0,
                _Z64 if z64 else size,
                _Z64 if z64 else size,
                len(raw),
                len(extra),
            )
            + raw
            + extra
        )
        self._open = (raw, size, at, self._pos())
        self.crc = 0

    def write(self, data: Any) -> None:
        self.crc = crc32(data, self.crc)
        self.fh.write(data)

    def end(self) -> None:
        raw, size, at, start = self._open  # type: ignore[misc]
        if self._pos() - start != size:
            raise ValueError(
                f"entry {raw.decode()} got {self._pos() - start} bytes, {size} declared"
            )
        here = self.fh.tell()
        self.fh.seek(self.base + at + 14)
        self.fh.write(struct.pack("<I", self.crc))
        self.fh.seek(here)
        self.entries.append((raw, self.crc, size, at))
        self._open = None

    def add(self, name: str, data: bytes) -> None:
        self.begin(name, len(data))
        self.write(data)
        self.end()

    def finish(self) -> int:
        """Central directory and end records; returns the archive's length."""
        cd_at = self._pos()
        cd = bytearray()
        for raw, crc, size, at in self.entries:
            z64 = [v for v in (size, size, at) if v >= _Z64] if (size >= _Z64 or at >= _Z64) else []
            extra = (
                struct.pack("<HH", 1, 8 * len(z64)) + b"".join(struct.pack("<Q", v) for v in z64)
                if z64
                else b""
            )
            cd += (
                struct.pack(
                    "<4sHHHHHHIIIHHHHHII",
                    b"PK\x01\x02",
                    45 if z64 else 20,
                    45 if z64 else 20,
                    0,
                    0,
                    0,
                    0x21,
                    crc,
                    _Z64 if size >= _Z64 else size,
                    _Z64 if size >= _Z64 else size,
                    len(raw),
                    len(extra),
                    0,
                    0,
                    0,
                    0,
                    _Z64 if at >= _Z64 else at,
                )
                + raw
                + extra
            )
        self.fh.write(cd)
        end_at = self._pos()
        n = len(self.entries)
        if n >= 0xFFFF or cd_at >= _Z64 or len(cd) >= _Z64 or end_at >= _Z64:
            self.fh.write(
                struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, len(cd), cd_at)
            )
            self.fh.write(struct.pack("<4sIQI", b"PK\x06\x07", 0, end_at, 1))
            self.fh.write(
                struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, _Z64, _Z64, 0)
            )
        else:
            self.fh.write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, n, n, len(cd), cd_at, 0))
        return self._pos()


def write_small_archive(fh: BinaryIO, tree: Any, storages: list[tuple[str, bytes]] = ()) -> int:  # type: ignore[assignment]
    """A whole torch.save archive of `tree` (whose TensorLeaf keys name `storages`) at fh's position."""
    z = ZipWriter(fh)
    z.add("data.pkl", pickle_bytes(tree))
    z.add("byteorder", b"little")
    for key, data in storages:
        z.add(f"data/{key}", data)
    z.add("version", b"3\n")
    return z.finish()
