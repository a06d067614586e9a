"""Crash-safe writes: a temp file in the same folder, fsync, then rename.

An existing target that is not a regular file (``/dev/null``, a FIFO, a terminal) is written in
place and never replaced: renaming over ``/dev/null`` as root would turn it into a regular file
and break the whole machine.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import time
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    target = Path(path)
    if str(path) == "":
        raise FileNotFoundError(2, "empty path", "")
    try:
        st = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    if st is not None and stat.S_ISFIFO(st.st_mode):
        _write_fifo(target, data)
        return target
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        with open(target, "wb", buffering=0) as fh:  # device: write through, keep it
            fh.write(data)
        return target
    tmp = write_temp(target, data)
    try:
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(target.parent)  # make the rename itself durable
    return target


#: how long a write to a FIFO waits for a reader to open it before giving up (ENXIO)
FIFO_READER_WAIT = 10.0


#: FIFOs opened ahead of their write (hold_fifo), by real path: the write takes the open descriptor
_HELD_FIFOS: dict[str, int] = {}


def hold_fifo(path: str | os.PathLike) -> None:
    """Open the FIFO at `path` for writing now (waiting for a reader as `_write_fifo` does) and keep it
    open for the write that comes later: a command that acts before it reports (prune --apply deletes)
    learns that nobody reads its report before it has done anything."""
    key = os.path.realpath(path)
    if key not in _HELD_FIFOS:
        _HELD_FIFOS[key] = _open_fifo(Path(path), None)


def _open_fifo(target: Path, wait: float | None) -> int:
    """A non-blocking open of a FIFO for writing (ENXIO while no reader has it open), retried for `wait`
    seconds, returned as a blocking descriptor."""
    deadline = time.monotonic() + (FIFO_READER_WAIT if wait is None else wait)
    while True:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def _write_fifo(target: Path, data: bytes, wait: float | None = None) -> None:
    """Write to a FIFO without ever blocking on one nobody reads: the descriptor `hold_fifo` opened, or
    one opened now (`_open_fifo`), then ordinary blocking writes."""
    fd = _HELD_FIFOS.pop(os.path.realpath(target), None)
    if fd is None:
        fd = _open_fifo(target, wait)
    with os.fdopen(fd, "wb", buffering=0) as fh:
        fh.write(data)


def write_temp(path: str | os.PathLike, data: bytes) -> str:
    """The first half of an atomic write: `data` in a fsynced temp file next to `path`, with the
    permissions `path` has (or 0666 & ~umask for a new file). The caller renames it into place
    (os.replace) or removes it; several can be prepared before the first rename."""
    target = Path(path)
    try:  # keep an existing file's permissions; a new file gets the usual 0666 & ~umask
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return tmp


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a folder so renames inside it are durable (best effort)."""
    try:
        dfd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
