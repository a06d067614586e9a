"""Small input helpers shared by the integration commands: read a file or stdin, one-line errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from checkpoint_strategy.errors import UsageError

MAX_INPUT_BYTES = 64 << 20


def read_text(path: str, what: str) -> tuple[str, str]:
    """(text, display name) of a file, or of stdin for '-'. UsageError when unreadable."""
    if path == "-":
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1) if hasattr(sys.stdin, "buffer") else \
            sys.stdin.read().encode("utf-8", "surrogateescape")
        name = "stdin"
    else:
        p = Path(path)
        name = str(path)
        if p.is_dir():
            raise UsageError(f"{what} {name} is a folder: expected a file (or - for stdin)")
        try:
            with open(p, "rb") as fh:
                data = fh.read(MAX_INPUT_BYTES + 1)
        except FileNotFoundError:
            raise UsageError(f"{what} {name} does not exist") from None
        except OSError as exc:
            raise UsageError(f"cannot read {what} {name}: {exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise UsageError(f"{what} {name} is larger than {MAX_INPUT_BYTES >> 20} MB")
    try:
        return data.decode("utf-8"), name
    except UnicodeDecodeError:
        raise UsageError(f"{what} {name} is not UTF-8 text") from None


def oserror_line(exc: OSError, action: str, path: str | os.PathLike) -> str:
    reason = exc.strerror or type(exc).__name__
    return f"cannot {action} {path}: {reason}"
