"""The one inter-process lock of the package: an exclusive ``fcntl.flock`` held for a block.

Used by the handoff state folder (a lock file inside it) and by ``prune`` (the checkpoint
folder itself, so a read-only folder can still be locked for a dry run and no file is left
behind). Closing the descriptor releases the lock, so a process killed with SIGKILL never
leaves a stale lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.storage import oserror_line

_BUSY = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)
POLL_SECONDS = 0.02


def _open(path: str) -> int:
    """A descriptor to lock: an existing folder is opened read-only, anything else is a lock
    file created if missing."""
    if os.path.isdir(path) and not os.path.islink(path):
        return os.open(
            path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
        )
    return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)


@contextlib.contextmanager
def locked(path: str | os.PathLike[str], timeout: float, busy: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (a folder, or a lock file created if missing).

    Waits up to ``timeout`` seconds for another holder, then raises ``UsageError(busy)`` (one
    line, exit 2). A path that cannot be opened raises ``UsageError("cannot create lock file
    ...")``.
    """
    p = os.fspath(path)
    try:
        fd = _open(p)
    except OSError as exc:
        raise UsageError(oserror_line(exc, "create lock file", p)) from None
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in _BUSY:
                    raise UsageError(oserror_line(exc, "lock", p)) from None
                if time.monotonic() > deadline:
                    raise UsageError(busy) from None
                time.sleep(POLL_SECONDS)
        yield
    finally:
        os.close(fd)  # closing releases the lock
