"""What a conversion moves: tensors as lists of byte ranges of source files, and a tree around them.

Every reader (torch zip, safetensors, DCP, DeepSpeed ZeRO) turns its headers and pickles, read as
data, into a `Loaded`: a tree of plain values whose tensor leaves are `Tensor` objects, each one a
list of `Piece`s (bytes [src, src+nbytes) of a file go to bytes [dst, dst+nbytes) of the tensor in
row-major order). Every writer streams those pieces in destination order, so a conversion reads
each byte once, hashes it and writes it once, whatever the source layout.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.storage import open_regular

CHUNK = 8 << 20


@dataclass(frozen=True)
class Piece:
    path: str
    src: int
    dst: int
    nbytes: int


@dataclass(eq=False)
class Tensor:
    name: str
    dtype: str
    shape: tuple
    pieces: list[Piece] = field(default_factory=list)
    problem: str | None = None  # why it cannot be converted (non-contiguous, compressed, ...)
    swap: int = 0  # a big-endian source: swap each run of this many bytes (0: as stored)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * tp.DTYPE_SIZE.get(self.dtype, 1)

    def alias_key(self) -> tuple | None:
        """Same bytes of the same file with the same dtype and shape: a tied weight."""
        if not self.pieces:
            return None
        return (
            tuple((p.path, p.src, p.dst, p.nbytes) for p in self.pieces),
            self.dtype,
            self.shape,
            self.swap,
        )

    def check_tiling(self) -> None:
        """The pieces cover the tensor exactly once, in destination order (raises UsageError)."""
        if self.problem:
            raise UsageError(f"cannot convert tensor {tp.shown(self.name)}: {self.problem}")
        self.pieces.sort(key=lambda p: p.dst)
        at = 0
        for p in self.pieces:
            if p.dst != at:
                what = "overlap" if p.dst < at else f"a gap at byte {at}"
                raise UsageError(
                    f"tensor {tp.shown(self.name)}: its chunks {what}: the source does not hold "
                    "the whole tensor exactly once"
                )
            at += p.nbytes
        if at != self.nbytes:
            raise UsageError(
                f"tensor {tp.shown(self.name)}: its chunks hold {at} bytes, {self.dtype}"
                f"{list(self.shape)} needs {self.nbytes}"
            )


@dataclass
class Loaded:
    """A source read as data: its format, the tree, and notes on what could not be carried."""

    fmt: str
    tree: Any
    notes: list[str] = field(default_factory=list)
    weights_key: str | None = None  # the subtree holding the model weights (None: the whole tree)
    extra_weights: list[Tensor] = field(
        default_factory=list
    )  # DeepSpeed: consolidated weights besides the tree
    byteorder: str = (
        "little"  # a torch archive's byteorder record (its tensors carry `swap` when big)
    )


class Unsupported:
    """A value a writer cannot carry (a pickled object of some class): named in the notes, left out."""

    def __init__(self, what: str) -> None:
        self.what = what


def _leaves(tree: Any, kind: type, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(dotted name, leaf) of every `kind` leaf in tree order; dict keys and list indexes joined with '.'."""
    if depth > 200:
        return
    if isinstance(tree, kind):
        yield prefix, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, kind, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _leaves(v, kind, f"{prefix}.{i}" if prefix else str(i), depth + 1)


def tensors(tree: Any) -> Iterator[tuple[str, Tensor]]:
    """(dotted name, tensor) in tree order; dict keys and list indexes joined with '.' (str(key))."""
    yield from _leaves(tree, Tensor)


def unsupported(tree: Any) -> Iterator[tuple[str, str]]:
    """(dotted name or "(root)", why) of every part of the tree that cannot be converted."""
    for name, leaf in _leaves(tree, Unsupported):
        yield name or "(root)", leaf.what


def without_unsupported(tree: Any, depth: int = 0) -> Any:
    if depth > 200:
        return None
    if isinstance(tree, dict):
        return {
            k: without_unsupported(v, depth + 1)
            for k, v in tree.items()
            if not isinstance(v, Unsupported)
        }
    if isinstance(tree, list):
        return [
            None if isinstance(v, Unsupported) else without_unsupported(v, depth + 1) for v in tree
        ]
    if isinstance(tree, tuple):
        return tuple(
            None if isinstance(v, Unsupported) else without_unsupported(v, depth + 1) for v in tree
        )
    return tree


# --------------------------------------------------------------------------- reading pieces


class Files:
    """Open source files, one handle each, closed together."""

    def __init__(self) -> None:
        self.handles: dict[str, BinaryIO] = {}

    def get(self, path: str) -> BinaryIO:
        fh = self.handles.get(path)
        if fh is None:
            fh = self.handles[path] = open_regular(path, "checkpoint file")
        return fh

    def close(self) -> None:
        for fh in self.handles.values():
            fh.close()
        self.handles.clear()

    def __enter__(self) -> Files:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _read_into(fh: BinaryIO, view: memoryview, t: Tensor, p: Piece) -> int:
    """Fill `view` whole from fh (a short read is read on: a byte swap needs whole elements)."""
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise UsageError(
                f"{p.path}: ends before byte {p.src + p.nbytes} that tensor "
                f"{tp.shown(t.name)} needs: truncated"
            )
        got += n
    return got


def _little(view: memoryview, swap: int) -> memoryview:
    """The bytes of whole elements of a big-endian tensor, swapped in place to little-endian (torch.load swaps
    them the same way when the archive's byteorder record is "big")."""
    if swap > 1 and len(view):
        import numpy as np

        np.frombuffer(view, dtype=f"u{swap}").byteswap(inplace=True)
    return view


def stream(t: Tensor, files: Files, buf: memoryview | list[memoryview]) -> Iterator[memoryview]:
    """The tensor's bytes in order, in chunks of at most len(buf): one reused buffer, or several taken in turn
    (the caller may still be using the previous chunk while the next is read)."""
    bufs = buf if isinstance(buf, list) else [buf]
    turn = 0
    for p in t.pieces:
        fh = files.get(p.path)
        fh.seek(p.src)
        left = p.nbytes
        while left:
            b = bufs[turn % len(bufs)]
            turn += 1
            n = _read_into(fh, b[: min(left, len(b))], t, p)
            left -= n
            yield _little(b[:n], t.swap)


def fixed(t: Tensor, files: Files, buf: bytearray) -> Iterator[int]:
    """Fill `buf` with the tensor's next len(buf) bytes (fewer at the end) and yield how many: two tensors with
    different piece boundaries read in lockstep. Each read seeks first (the two may share a file handle)."""
    mv = memoryview(buf)
    filled = 0
    for p in t.pieces:
        fh = files.get(p.path)
        done = 0
        while done < p.nbytes:
            fh.seek(p.src + done)
            n = _read_into(fh, mv[filled : filled + min(p.nbytes - done, len(buf) - filled)], t, p)
            _little(mv[filled : filled + n], t.swap)
            filled += n
            done += n
            if filled == len(buf):
                yield filled
                filled = 0
    if filled:
        yield filled


def same_bytes(
    a: Tensor, b: Tensor, files: Files, bufs: tuple[bytearray, bytearray], h: Any = None
) -> bool:
    """True when the two tensors' bytes are identical (compared chunk by chunk with memcmp); `h` (a hashlib
    object) gets a's bytes on the way."""
    x, y = bufs
    gb = fixed(b, files, y)
    for n in fixed(a, files, x):
        if next(gb, 0) != n:
            return False
        if h is not None:
            h.update(memoryview(x)[:n])
        if (x if n == len(x) else x[:n]) != (y if n == len(y) else y[:n]):
            return False
    return next(gb, None) is None


def sha256(t: Tensor, files: Files, buf: memoryview) -> str:
    h = hashlib.sha256()
    for chunk in stream(t, files, buf):
        h.update(chunk)
    return h.hexdigest()


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1
