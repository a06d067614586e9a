"""One checkpoint's files split into N parts, so N processes can share a `--level full` check.

`validate --part K/N` (a cluster scheduler's N jobs) and the training callbacks' validate-on-save
under torchrun / Lightning DDP (rank r of W checks part r+1 of W) use the same split:

* the files are the checkpoint's regular files (`manifest.list_files`: every file under a folder
  checkpoint, symlinked folders not followed; the file itself for a single-file checkpoint);
* sorted by size, largest first, then by relative path; each goes to the part holding the fewest
  bytes so far (ties: the lowest part). Deterministic for a given listing, so N processes that list
  the same finished checkpoint agree on who reads what; parts are disjoint and their union is every
  file; parts differ in bytes by at most one file;
* a file the checkers reach that the listing does not hold goes to part ``crc32(path) % N + 1``.

Only the byte reads of level full are split (CRC-32 of zip entries, every byte of safetensors,
DCP shards and other files): every part still checks the whole layout at the quick level (names,
headers, sizes, indexes, metadata), so a missing or truncated file is reported by every part, a
flipped byte only by the part that reads it. A checkpoint is valid when every part is; the problems
of the whole are the union of the parts' problems.
"""

from __future__ import annotations

import contextvars
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.manifest import list_files

MAX_PARTS = 100_000

#: the (K, N) split in force for the checks started in this context (see `splitting`), 0-based K
_ACTIVE: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "checkpoint_part", default=None
)


def parse_part(text: str) -> tuple[int, int]:
    """'K/N' (1 <= K <= N) -> (K - 1, N). UsageError with one line otherwise."""
    k, sep, n = str(text).strip().partition("/")
    if not sep or not k.strip().isdigit() or not n.strip().isdigit():
        raise UsageError(f"--part {text!r}: expected K/N, e.g. 2/4 (part 2 of 4)")
    ki, ni = int(k), int(n)
    if not 1 <= ni <= MAX_PARTS or not 1 <= ki <= ni:
        raise UsageError(f"--part {text!r}: expected 1 <= K <= N <= {MAX_PARTS}")
    return ki - 1, ni


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def assign(files: dict[str, int], n: int) -> dict[str, int]:
    """relative path -> part (0-based) for files {relative path: size}; see the module docstring."""
    loads = [0] * n
    out: dict[str, int] = {}
    for rel, size in sorted(files.items(), key=lambda kv: (-kv[1], kv[0])):
        k = min(range(n), key=lambda i: (loads[i], i))
        out[rel] = k
        loads[k] += size
    return out


@dataclass(frozen=True)
class Split:
    """Part `index` (0-based) of `count` of one checkpoint."""

    index: int
    count: int
    owner: dict[str, int]

    def owns(self, rel: str) -> bool:
        k = self.owner.get(rel)
        if k is None:
            k = zlib.crc32(rel.encode("utf-8", "surrogateescape")) % self.count
        return k == self.index

    def files(self) -> list[str]:
        return sorted(r for r, k in self.owner.items() if k == self.index)


def split(checkpoint: str, index: int, count: int) -> Split:
    """The split of `checkpoint`'s files into `count` parts, seen from part `index` (0-based)."""
    if not 0 <= index < count:
        raise UsageError(f"part {index + 1}/{count}: expected 1 <= K <= N")
    files = {rel: _size(full) for rel, full in list_files(checkpoint).items()}
    return Split(index, count, assign(files, count))


@contextmanager
def splitting(index: int, count: int) -> Iterator[None]:
    """Within this block, a level-full check reads every byte of part `index` (0-based) of `count`
    of each checkpoint only (the layout is still checked whole)."""
    token = _ACTIVE.set((index, count) if count > 1 else None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def for_checkpoint(checkpoint: str) -> Split | None:
    """The split in force for `checkpoint` (None: every byte is this process's to read)."""
    active = _ACTIVE.get()
    if active is None:
        return None
    return split(checkpoint, *active)


def describe(part: Split) -> str:
    """The note a part's result carries."""
    mine = part.files()
    return (
        f"part {part.index + 1}/{part.count}: every byte of {len(mine)} of {len(part.owner)} files read, the "
        "others' headers only; the checkpoint is valid when every part is"
    )
