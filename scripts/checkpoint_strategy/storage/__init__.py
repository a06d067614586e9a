"""The one place that touches bytes of user files: safe, bounded reads and whole writes.

Every read of a checkpoint, log, policy, event or state file goes through here, so the
hardening is written once:

- ``open_regular`` opens without blocking (``O_NONBLOCK``) and refuses anything that is not a
  regular file (FIFOs, sockets, devices) *before* reading a byte, so a FIFO named
  ``trainer_state.json`` can never hang a command;
- ``read_bytes`` caps how much is read (``limit``) so ``/dev/zero`` or a 50 GB "JSON" cannot
  exhaust memory;
- ``loads_json`` / ``read_json`` turn every way JSON can be bad (syntax, deep nesting that blows
  the recursion limit, 5000-digit integers, NaN where it is not allowed, wrong top-level type)
  into one ``ReadError`` line;
- ``describe_os_error`` names an OS error the same way everywhere ("permission denied", never
  "missing" or "corrupt").

Every ``loads_json`` reason reads after "is": "<what> is not valid JSON (...)", "... is nested too
deeply", "... is not an object (top level is a list)".

``ReadError`` is a ``UsageError``: a command that lets it propagate exits 2 with its one line.
Checkers that report problems instead use its short ``reason``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from checkpoint_strategy.atomic import atomic_write_bytes, hold_fifo
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.storage.base import ReadError, is_url  # noqa: F401 - part of this API (remote.py imports them from base)

#: Default cap on a JSON document read whole (policies, events, state files, headers).
MAX_JSON_BYTES = 64 << 20
#: Cap on a Trainer's trainer_state.json: it grows with log_history (800k log entries are over 64 MB).
MAX_TRAINER_STATE_BYTES = 2 << 30


_ERRNO_WORDS = {
    errno.ENOENT: "does not exist",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "is a folder",
    errno.ENOTDIR: "a parent is not a folder",
    errno.ELOOP: "too many levels of symbolic links",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.ENAMETOOLONG: "name too long",
    errno.EIO: "input/output error",
    errno.EBUSY: "busy",
    errno.ETXTBSY: "busy",
    errno.EEXIST: "already exists",
}


def describe_os_error(exc: BaseException) -> str:
    """A short, stable description of an OS error: 'permission denied', 'does not exist', ..."""
    if isinstance(exc, OSError):
        if exc.errno in _ERRNO_WORDS:
            return _ERRNO_WORDS[exc.errno]
        if exc.strerror:
            return exc.strerror.lower()
    return type(exc).__name__


def oserror_line(exc: BaseException, action: str, path: str | os.PathLike[str]) -> str:
    """'cannot <action> <path>: <reason>' - the one wording for OS errors in messages."""
    return f"cannot {action} {os.fspath(path)}: {describe_os_error(exc)}"


def kind_of(mode: int) -> str:
    """Human name of a non-regular file type."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def is_regular(path: str | os.PathLike[str]) -> bool:
    """True for a regular file (following symlinks); False for anything else or unreadable."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def open_regular(path: str | os.PathLike[str], what: str = "file") -> BinaryIO:
    """Open a regular file for binary reading without ever blocking on a FIFO or device.

    Raises ReadError naming the path and the reason ("is a FIFO: expected a regular file").
    """
    p = os.fspath(path)
    fd, _size = _open_fd(p, what)
    return _file_of(fd, p)


#: open for reading, never blocking on a FIFO, not inherited by a child process
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_fd(p: str, what: str, blocking: bool = True, regular: bool = False) -> tuple[int, int]:
    """(fd, size) of a regular file opened for reading; ReadError for anything else. ``blocking=False`` leaves
    the descriptor in O_NONBLOCK (no effect on a regular file's reads; saves two fcntl calls); ``regular``:
    the caller's listing just saw a regular file (a scandir entry's type), so the stat before the open is
    skipped. The fstat after the open refuses a non-regular file either way (a FIFO opened non-blocking
    never blocks)."""
    if p == "":
        raise ReadError(f"{what}: empty path: expected a file path", "empty path")
    if not regular:
        try:
            st = os.stat(p)
        except (OSError, ValueError) as exc:
            reason = describe_os_error(exc) if isinstance(exc, OSError) else "invalid path"
            raise ReadError(f"cannot read {what} {p}: {reason}", reason) from None
        if not stat.S_ISREG(st.st_mode):
            reason = f"is {kind_of(st.st_mode)}: expected a regular file"
            raise ReadError(f"{what} {p} {reason}", reason)
    try:
        fd = os.open(p, _READ_FLAGS)
    except (OSError, ValueError) as exc:
        reason = describe_os_error(exc) if isinstance(exc, OSError) else "invalid path"
        raise ReadError(f"cannot read {what} {p}: {reason}", reason) from None
    try:
        st2 = os.fstat(fd)
        if not stat.S_ISREG(st2.st_mode):  # swapped between stat (or the caller's listing) and open
            reason = f"is {kind_of(st2.st_mode)}: expected a regular file"
            raise ReadError(f"{what} {p} {reason}", reason)
        if blocking and hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return fd, st2.st_size
    except BaseException:
        os.close(fd)
        raise


def _file_of(fd: int, p: str) -> BinaryIO:
    """The open fd as a binary file (it is closed on failure)."""
    try:
        remote = _remote_file(p)  # a shadow of an object-storage listing: bytes come from the store
        if remote is not None:
            os.close(fd)
            return remote
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small(
    path: str | os.PathLike[str], what: str = "file", small: int = 1 << 16, regular: bool = False
) -> bytes | BinaryIO:
    """A regular file of at most ``small`` bytes read whole with plain reads on its descriptor (no file
    object: the quick walk reads thousands of small files); a larger one, one that changed size while
    read, or a file of an object-storage view comes back open at its start, as `open_regular` gives it
    (the caller closes it). ReadError as `open_regular`. ``regular``: the caller's listing just saw a regular
    file there (see `_open_fd`)."""
    p = os.fspath(path)
    remote = sys.modules.get("checkpoint_strategy.storage.remote")
    if remote is not None and remote.view_count():
        return open_regular(p, what)  # shadows of a listing open: their bytes come from the store
    fd, size = _open_fd(p, what, blocking=False, regular=regular)
    if size > small:
        return _blocking_file(fd, p)
    whole = False
    try:
        parts = []
        got = 0
        while (
            got <= size
        ):  # one read of size + 1: size bytes (the end) or more (it grew); more reads if fewer
            try:
                chunk = os.read(fd, size + 1 - got)
            except (
                BlockingIOError
            ):  # a file system that honours O_NONBLOCK on regular files: wait for it
                os.set_blocking(fd, True)
                continue
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
            if (
                got == size
            ):  # a regular file's read stops short only at its end: no second read to see it
                break
        whole = got == size
        if not whole:
            os.lseek(
                fd, 0, os.SEEK_SET
            )  # grown or shrunk meanwhile: read it as a file, as it is now
    except BaseException:
        os.close(fd)
        raise
    if whole:
        os.close(fd)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    return _blocking_file(fd, p)


def _blocking_file(fd: int, p: str) -> BinaryIO:
    """`_file_of` a descriptor opened non-blocking, made blocking first (as `open_regular` hands files out)."""
    try:
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return _file_of(fd, p)


def _remote_file(path: str) -> Any:
    remote = sys.modules.get("checkpoint_strategy.storage.remote")
    return remote.open_object(path) if remote is not None else None


# --------------------------------------------------------------------------- URLs (storage/remote.py)


def plain_path(text: str) -> str:
    """``file:///x`` -> ``/x``; anything else unchanged."""
    return text[len("file://") :] if text.lower().startswith("file://") else text


def display(path: str | os.PathLike[str]) -> str:
    """How a path is printed: the URL for a file of an object-storage view, else the path itself."""
    p = os.fspath(path)
    remote = sys.modules.get("checkpoint_strategy.storage.remote")
    return remote.display(p) if remote is not None else p


def unshadow(text: str) -> str:
    """Text with every object-storage shadow path replaced by its URL (rendered reports, messages)."""
    remote = sys.modules.get("checkpoint_strategy.storage.remote")
    return remote.unshadow(text) if remote is not None else text


def unshadow_model(model: Any) -> Any:
    """`unshadow` for a pydantic report (every string field)."""
    remote = sys.modules.get("checkpoint_strategy.storage.remote")
    return remote.unshadow_model(model) if remote is not None and remote.view_count() else model


@contextlib.contextmanager
def local_paths(
    paths: list[str], prefetch: bool = False, parents: int | Callable[[str], int] = 0
) -> Iterator[list[str]]:
    """Each path as something the local checkers can walk: a plain path unchanged, a URL as the
    shadow of its listing (storage/remote.py), removed at the end of the block. ``parents``: list
    that many prefix levels above each URL (what sits next to a log), or a function of the URL
    giving that number (asked of URLs only); the path returned is still the URL's own object. A
    UsageError raised inside names URLs, not shadow paths."""
    if not any(is_url(p) for p in paths):
        yield [plain_path(os.fspath(p)) for p in paths]
        return
    from checkpoint_strategy.storage import remote

    views: list[Any] = []
    try:
        out = []
        for p in paths:
            if is_url(p):
                levels = parents(os.fspath(p)) if callable(parents) else parents
                base, rel = remote.above(os.fspath(p), levels)
                views.append(remote.open_view(base, prefetch=prefetch))
                out.append(os.path.join(views[-1].local, *rel) if rel else views[-1].local)
            else:
                out.append(plain_path(os.fspath(p)))
        yield out
    except UsageError as exc:
        raise UsageError(remote.unshadow(str(exc))) from None
    finally:
        for v in views:
            remote.close_view(v)


def read_bytes(
    path: str | os.PathLike[str],
    what: str = "file",
    limit: int = MAX_JSON_BYTES,
    regular: bool = False,
) -> bytes:
    """The whole content of a regular file of at most ``limit`` bytes (ReadError otherwise). ``regular``: as
    `read_small`'s."""
    try:
        got = read_small(path, what, min(limit, 1 << 16), regular=regular)
    except OSError as exc:
        reason = describe_os_error(exc)
        raise ReadError(f"cannot read {what} {os.fspath(path)}: {reason}", reason) from None
    if isinstance(got, bytes):
        return got
    with got as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:  # refused before reading (a 10 GB sparse file)
            reason = f"larger than {_size(limit)}"
            raise ReadError(
                f"{what} {os.fspath(path)} is {reason}: expected a smaller file", reason
            )
        try:  # the size first: read(limit + 1) would allocate the whole limit (64 MB) for a 2 KB file
            data = fh.read(size + 1)
            if len(data) > size:  # grown since: read on to the limit, as before
                data += fh.read(limit + 1 - len(data))
        except OSError as exc:
            reason = describe_os_error(exc)
            raise ReadError(f"cannot read {what} {os.fspath(path)}: {reason}", reason) from None
    if len(data) > limit:
        reason = f"larger than {_size(limit)}"
        raise ReadError(f"{what} {os.fspath(path)} is {reason}: expected a smaller file", reason)
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n} bytes"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


#: the strict decoder, built once (json.loads with a keyword argument builds a new decoder on every call)
_STRICT_JSON = json.JSONDecoder(parse_constant=_reject_constant)


def loads_json(
    data: bytes | str,
    what: str = "JSON",
    *,
    allow_nan: bool = False,
    expect: type | tuple[type, ...] | None = None,
) -> Any:
    """Parse JSON from bytes or text; every failure is one ReadError line naming ``what``.

    ``allow_nan``: accept the NaN/Infinity tokens (HF Trainer writes them in trainer_state.json).
    ``expect``: required top-level type(s), e.g. ``dict``.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
    except UnicodeDecodeError:
        raise ReadError(f"{what} is not UTF-8 text: expected JSON", "not UTF-8 text") from None
    try:
        if allow_nan:
            obj = json.loads(text)
        elif text.startswith("\ufeff"):  # json.loads' own words for a byte-order mark
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        else:
            obj = _STRICT_JSON.decode(text)
    except RecursionError:
        raise ReadError(
            f"{what} is nested too deeply: expected plain JSON", "nested too deeply"
        ) from None
    except ValueError as exc:  # JSONDecodeError, int digit limit, rejected constants
        if "digits" in str(exc) and "integer" in str(exc):
            reason = "not valid JSON (an integer with thousands of digits)"
        else:
            reason = f"not valid JSON ({_short(exc)})"
        raise ReadError(f"{what} is {reason}", reason) from None
    if expect is not None and not isinstance(obj, expect):
        names = " or ".join(
            t.__name__ for t in (expect if isinstance(expect, tuple) else (expect,))
        )
        names = names.replace("dict", "a JSON object").replace("list", "a JSON list")
        reason = f"not {names} (top level is {_json_type(obj)})"
        raise ReadError(f"{what} is {reason}", reason)
    return obj


def _json_type(obj: Any) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "a number",
        float: "a number",
    }.get(type(obj), type(obj).__name__)


def _short(exc: Exception) -> str:
    msg = " ".join(str(exc).split())
    return msg[:120]


def read_json(
    path: str | os.PathLike[str],
    what: str = "JSON file",
    *,
    limit: int = MAX_JSON_BYTES,
    allow_nan: bool = False,
    expect: type | tuple[type, ...] | None = None,
) -> Any:
    """Read and parse a JSON file safely (regular file only, bounded size, one-line errors)."""
    data = read_bytes(path, what, limit)
    return loads_json(data, f"{what} {os.fspath(path)}", allow_nan=allow_nan, expect=expect)


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """True when ``path`` resolves (symlinks followed) to ``root`` or somewhere below it."""
    try:
        rp = Path(path).resolve()
        rr = Path(root).resolve()
    except (OSError, RuntimeError):
        return False
    return rp == rr or rr in rp.parents


def read_input(path: str, what: str, limit: int = MAX_JSON_BYTES) -> tuple[bytes, str]:
    """(bytes, display name) of a regular file, or of stdin for '-'; ReadError when unreadable or too big."""
    if path == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is not None:
            data = stream.read(limit + 1)
        else:  # a text stream (tests replace sys.stdin with StringIO)
            data = sys.stdin.read(limit + 1).encode("utf-8", "surrogateescape")
        if len(data) > limit:
            reason = f"larger than {_size(limit)}"
            raise ReadError(f"{what} on stdin is {reason}: expected a smaller input", reason)
        return data, "stdin"
    return read_bytes(path, what, limit), os.fspath(path)


def read_text_input(path: str, what: str, limit: int = MAX_JSON_BYTES) -> tuple[str, str]:
    """(text, display name) of a UTF-8 file or stdin ('-'); ReadError otherwise."""
    data, name = read_input(path, what, limit)
    try:
        return data.decode("utf-8"), name
    except UnicodeDecodeError:
        raise ReadError(f"{what} {name} is not UTF-8 text", "not UTF-8 text") from None


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """True when two paths name the same existing file (hard links and symlinks included)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_output(path: str | os.PathLike[str], what: str, inputs: tuple = ()) -> str:
    """Refuse an output path that is empty, a folder, one of the command's inputs, or inside an input
    that is a folder (a checkpoint, a run folder; symlinks resolved) (UsageError)."""
    p = os.fspath(path)
    if p.strip() == "":
        raise UsageError(f"{what}: empty path: expected a file path to write")
    if os.path.isdir(p):
        raise UsageError(f"{what} {p} is a folder: expected a file path to write")
    _refuse_special_output(p, what)
    for inp in inputs:
        if inp is None or inp == "-":
            continue
        if same_file(p, inp) or os.path.abspath(p) == os.path.abspath(os.fspath(inp)):
            raise UsageError(
                f"{what} {p} is also an input of this command: refusing to overwrite it; "
                "write the report to another file"
            )
    for inp in inputs:
        if inp is not None and inp != "-" and _lands_inside(p, inp):
            raise UsageError(
                f"{what} {p} is inside {os.fspath(inp)}, which is also an input of this command: "
                "refusing to write there; write the report to another file"
            )
    return p


_KERNEL_FILESYSTEMS = ("/proc", "/sys")


def _refuse_special_output(p: str, what: str) -> None:
    """A disk, a socket or a kernel file (/proc, /sys) is not a place for a report (UsageError). A FIFO is
    written when a reader opens it (`atomic`: ENXIO after a bounded wait); /dev/null and terminals are fine."""
    try:
        mode = os.stat(p).st_mode
    except OSError:
        mode = 0
    if stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
        raise UsageError(
            f"{what} {p} is {kind_of(mode)}: expected a file path to write (or /dev/null, a FIFO)"
        )
    if mode and not stat.S_ISREG(mode):
        return  # /dev/null, a terminal, a FIFO or pipe (/dev/stdout): written in place
    real = os.path.realpath(p)
    kernel = next((k for k in _KERNEL_FILESYSTEMS if real == k or real.startswith(k + "/")), None)
    if kernel is not None:
        raise UsageError(
            f"{what} {p} is a kernel file under {kernel} (not ordinary storage, nothing can be "
            "written there): expected a file path to write"
        )


def _lands_inside(path: str, folder: str | os.PathLike[str]) -> bool:
    """True when ``folder`` is a folder and writing ``path`` would put or change a file under it: the
    file's resolved target, or its name in its resolved parent (an atomic rename replaces a symlink)."""
    if not os.path.isdir(folder):
        return False
    return inside(path, folder) or inside(os.path.dirname(os.path.abspath(path)), folder)


def write_output(
    path: str | os.PathLike[str], data: bytes | str, what: str = "output", inputs: tuple = ()
) -> None:
    """Write a command's output file whole (atomic temp + rename; devices and FIFOs written in
    place, never replaced); every failure is one UsageError line."""
    p = check_output(path, what, inputs)
    try:
        atomic_write_bytes(p, data.encode("utf-8") if isinstance(data, str) else data)
    except OSError as exc:
        raise _write_error(exc, p, what) from None


def hold_output(path: str | os.PathLike[str], what: str) -> None:
    """When the output is a FIFO, open it now and keep it for `write_output`: a command that acts before
    it reports (prune --apply) stops, before it acts, when nobody reads the FIFO (exit 2, nothing done)."""
    p = os.fspath(path)
    if stat.S_ISFIFO(_mode(p)):
        try:
            hold_fifo(p)
        except OSError as exc:
            raise _write_error(exc, p, what) from None


def _write_error(exc: OSError, p: str, what: str) -> UsageError:
    if exc.errno == errno.ENXIO and stat.S_ISFIFO(_mode(p)):
        from checkpoint_strategy.atomic import FIFO_READER_WAIT

        return UsageError(
            f"{what} {p} is a FIFO that nobody reads (no reader opened it within "
            f"{FIFO_READER_WAIT:g} s): nothing written; start the reader first"
        )
    return UsageError(f"{what}: {oserror_line(exc, 'write', p)}")


def _mode(p: str) -> int:
    try:
        return os.stat(p).st_mode
    except OSError:
        return 0


def loads_yaml(text: str, what: str = "YAML") -> Any:
    """yaml.safe_load with every failure as one ReadError: syntax (with its line), deep nesting,
    integers past Python's digit limit."""
    import yaml

    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise ReadError(f"{what} is nested too deeply", "nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        reason = f"not valid YAML{where}"
        raise ReadError(f"{what} is {reason}", reason) from None
    except ValueError as exc:  # int() digit limit, bad timestamps, ...
        reason = f"not valid YAML ({_short(exc)[:60]})"
        raise ReadError(f"{what} is {reason}", reason) from None
