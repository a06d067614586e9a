"""The two names storage/remote.py shares with the storage API (`ReadError`, `is_url`): a leaf below both,
so the package and remote.py do not import each other. Import them from `checkpoint_strategy.storage`."""

from __future__ import annotations

import os
import re

from checkpoint_strategy.errors import UsageError


class ReadError(UsageError):
    """A file could not be read or parsed. ``reason`` is the short cause without the path."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = " ".join(str(reason or message).split())


_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://", re.S)


def is_url(text: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` other than ``file://`` (object storage, through storage/remote.py)."""
    m = _URL.match(os.fspath(text)) if isinstance(text, (str, os.PathLike)) else None
    return m is not None and m.group(1).lower() != "file"
