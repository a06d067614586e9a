"""Object storage (``s3://``, ``gs://``, ``memory://``) through fsspec: the only module that talks to it.

A URL is turned into a *view*: one recursive listing of the prefix becomes a local shadow tree of
empty sparse files with the objects' names and sizes (so the existing layout detection, ``os.stat``
sizes and keep rules run unchanged), and every byte a checker reads is served by
``storage.open_regular`` from ranged GETs of the object itself (``RemoteFile``). The shadow files
hold no data: a read never returns a byte that was not fetched from the store. At level quick the
header ranges (safetensors header, zip end record and central directory, small JSON / ``.metadata``
files) are fetched up front by a bounded thread pool; anything else a checker asks for is fetched
on demand, in blocks.

fsspec and the scheme's driver (s3fs, gcsfs) are imported only when a URL is used; a missing one is
one line naming the extra to install. Credentials and the endpoint come from the driver's usual
places (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``~/.aws/config``, ...) plus ``--storage-option
key=value``; option values are never printed. Retries and timeouts are kept low so an unreachable
endpoint is one line within seconds, not a retry storm.
"""

from __future__ import annotations

import atexit
import errno
import importlib
import io
import json
import os
import re
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.storage.base import ReadError, is_url

#: scheme -> (driver module, pip extra); None: built into fsspec.
SCHEMES: dict[str, tuple[str | None, str]] = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "memory": (None, "s3"),
}
PREFETCH_WORKERS = 16
READ_AHEAD_WORKERS = 8  # level full: one chunk ahead per open file (the CRC threads each have one)
PREFETCH_BATCH = 64  # objects whose headers are fetched together (memory: about 64 x 320 KB)
BLOCK = 256 << 10  # on-demand reads fetch at least this much (local zip headers sit close together)
HEAD_BYTES = 256 << 10  # safetensors header / first zip entries fetched up front (quick level)
TAIL_BYTES = 65535 + 22 + 20 + 1024  # zip end record, its comment and the zip64 locator
WHOLE_BYTES = 1 << 20  # small objects (JSON, .metadata, markers) are fetched whole
CACHE_BYTES = (
    64 << 20
)  # on-demand blocks kept per view (prefetched headers: until their file is closed)
CONNECT_TIMEOUT = 5
READ_TIMEOUT = 30

_options: dict[str, Any] = {}


def split_url(text: str) -> tuple[str, str] | None:
    """(scheme, rest) of a URL, or None for a plain path (``file://`` counts as a plain path)."""
    if not is_url(text):
        return None
    scheme, _sep, rest = str(text).partition("://")
    return scheme.lower(), rest


def parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` -> (key, value); true/false/none and integers are typed, dotted keys nest one level."""
    key, sep, value = str(text).partition("=")
    key = key.strip()
    if (
        not sep
        or not key
        or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?", key)
    ):
        raise UsageError(
            f"--storage-option {key or '?'}: expected key=value (e.g. endpoint_url=http://host:9000, "
            "anon=true, client_kwargs.region_name=us-east-1)"
        )
    low = value.strip().lower()
    typed: Any = value
    if low in ("true", "false"):
        typed = low == "true"
    elif low == "none":
        typed = None
    elif re.fullmatch(r"-?\d{1,18}", low):
        typed = int(low)
    return key, typed


#: driver options that are groups of options (s3fs/botocore dictionaries): only KEY.SUB=VALUE sets them
GROUP_OPTIONS = ("client_kwargs", "config_kwargs", "s3_additional_kwargs", "requester_pays_kwargs")


def set_options(pairs: list[str] | None) -> None:
    """The ``--storage-option key=value`` pairs of this command (passed to the fsspec driver)."""
    _options.clear()
    for text in pairs or ():
        key, value = parse_option(text)
        if key in GROUP_OPTIONS:
            raise UsageError(
                f"--storage-option {key}: is a group of driver options; set its keys one by one as "
                f"{key}.KEY=VALUE (e.g. client_kwargs.region_name=us-east-1)"
            )
        if "." in key:
            outer, inner = key.split(".", 1)
            sub = _options.setdefault(outer, {})
            if not isinstance(sub, dict):
                raise UsageError(
                    f"--storage-option {key}: {outer} is given both as a value and as a group"
                )
            sub[inner] = value
        else:
            _options[key] = value


def _driver_kwargs(scheme: str) -> dict[str, Any]:
    opts: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in _options.items()}
    opts["skip_instance_cache"] = True
    if scheme in ("s3", "s3a"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in opts:
            opts["endpoint_url"] = endpoint
        config = opts.setdefault("config_kwargs", {})
        config.setdefault("connect_timeout", CONNECT_TIMEOUT)
        config.setdefault("read_timeout", READ_TIMEOUT)
        config.setdefault("retries", {"max_attempts": 2, "mode": "standard"})
        opts.setdefault("use_listings_cache", False)
    return opts  # gs://: gcsfs's own defaults (not tuned here: no GCS endpoint to test against)


def filesystem(url: str) -> Any:
    """The fsspec filesystem for ``url`` (UsageError naming the extra when its driver is missing)."""
    parts = split_url(url)
    if parts is None:
        raise UsageError(
            f"{shown(url)}: not a URL; expected s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or memory://PATH"
        )
    scheme = parts[0]
    if scheme not in SCHEMES:
        raise UsageError(
            f"{shown(url)}: unknown scheme {scheme}://; expected s3://, gs://, memory:// or a local path"
        )
    driver, extra = SCHEMES[scheme]
    for module in ("fsspec", driver):
        if module is None:
            continue
        try:
            importlib.import_module(
                module
            )  # the driver is present (fsspec, s3fs, gcsfs), nothing else
        except ImportError:
            raise UsageError(
                f"{scheme}:// needs the Python package {module}: install it with "
                f"pip install 'checkpoint-strategy[{extra}]' (or pip install {module})"
            ) from None
    import fsspec

    try:
        fs = fsspec.filesystem("s3" if scheme == "s3a" else scheme, **_driver_kwargs(scheme))
        if scheme in ("s3", "s3a") and "retries" not in _options:
            fs.retries = (
                1  # s3fs's own retry loop (on top of botocore's two attempts): no retry storm
            )
        return fs
    except (TypeError, ValueError, KeyError) as exc:
        raise UsageError(
            f"{scheme}://: the storage options were refused by the driver ({type(exc).__name__}); "
            "check the --storage-option keys"
        ) from None


def shown(text: str) -> str:
    """A URL as printed: never with credentials (user:password@ is dropped)."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1", str(text))


def describe(exc: BaseException) -> str:
    """One short reason for a failed storage call (never the option values)."""
    if isinstance(exc, FileNotFoundError):
        return "does not exist"
    if isinstance(exc, PermissionError):
        return "permission denied (check the credentials: AWS_ACCESS_KEY_ID/AWS_PROFILE or --storage-option)"
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    low = (name + " " + text).lower()
    if "credential" in low:
        return "no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or --storage-option)"
    if (
        "connect" in low
        or "refused" in low
        or "endpoint" in low
        or isinstance(exc, ConnectionError)
    ):
        return "cannot connect to the storage endpoint (check AWS_ENDPOINT_URL / --storage-option endpoint_url)"
    if "timeout" in low or "timed out" in low:
        return "the storage endpoint did not answer in time"
    if "nosuchbucket" in low or "bucket does not exist" in low:
        return "no such bucket"
    if "invalid bucket name" in low:
        return "invalid bucket name (expected s3://BUCKET/PREFIX with a valid bucket name)"
    if isinstance(
        exc, (AttributeError, TypeError)
    ):  # an option of the wrong type reaches the driver's code
        return f"the driver refused the storage options ({name}); check the --storage-option keys and their types"
    for value in _secret_values():
        text = text.replace(value, "***")
    return f"{name}: {text[:120]}" if text else name


def _secret_values() -> list[str]:
    out = [
        os.environ[k]
        for k in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN")
        if len(os.environ.get(k, "")) >= 4
    ]
    for v in _options.values():
        for x in v.values() if isinstance(v, dict) else (v,):
            if isinstance(x, str) and len(x) >= 4:
                out.append(x)
    return out


# --------------------------------------------------------------------------- views


@dataclass
class Entry:
    key: str  # the object's full path as the driver names it (bucket/prefix/name)
    size: int


@dataclass
class View:
    """A listed prefix: its shadow root (local), its URL, and the objects under it."""

    fs: Any
    url: str  # the URL the user named (trailing '/' removed)
    remote: str  # the driver's path of the prefix (bucket/prefix)
    tmp: str  # temporary folder holding the shadow
    local: str  # shadow root (tmp/<basename>)
    objects: dict[str, Entry] = field(default_factory=dict)  # local path -> object
    skipped: list[str] = field(default_factory=list)  # keys that cannot be a local name
    lock: threading.Lock = field(default_factory=threading.Lock)
    blocks: dict[str, list[tuple[int, bytes]]] = field(
        default_factory=dict
    )  # local path -> fetched ranges
    pinned: set[tuple[str, int]] = field(default_factory=set)
    cached: int = 0
    requests: int = 0
    is_file: bool = False
    headers: bool = False  # level quick: prefetch header ranges (see `prefetch`)
    prefetched: set[str] = field(default_factory=set)
    siblings: dict[str, list[str]] = field(default_factory=dict)
    _pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------ paths
    def to_url(self, local: str) -> str:
        rel = os.path.relpath(local, self.local)
        return self.url if rel == "." else self.url + "/" + rel.replace(os.sep, "/")

    def to_key(self, local: str) -> str:
        rel = os.path.relpath(local, self.local)
        return self.remote if rel == "." else self.remote + "/" + rel.replace(os.sep, "/")

    def keys_under(self, local: str) -> list[str]:
        """Every listed object at or under a shadow path (the object keys to delete)."""
        base = os.path.normpath(local)
        return sorted(
            e.key for p, e in self.objects.items() if p == base or p.startswith(base + os.sep)
        )

    # ------------------------------------------------------------ bytes
    def fetch(
        self, local: str, start: int, end: int, keep: bool = True, pin: bool = False
    ) -> bytes:
        """Bytes [start, end) of the object behind a shadow file: one ranged GET."""
        entry = self.objects[local]
        with self.lock:
            self.requests += 1
        try:
            data = self.fs.cat_file(entry.key, start=start, end=end)
        except Exception as exc:  # noqa: BLE001 - every driver error is one line
            reason = describe(exc)
            raise ReadError(f"cannot read {shown(self.to_url(local))}: {reason}", reason) from None
        data = bytes(data)
        if keep and data:
            with self.lock:
                self.blocks.setdefault(local, []).append((start, data))
                if pin:
                    self.pinned.add((local, start))
                else:
                    self.cached += len(data)
                    self._evict()
        return data

    def _evict(self) -> None:
        while self.cached > CACHE_BYTES:
            victim = next(
                (
                    (p, i)
                    for p, bl in self.blocks.items()
                    for i, (s, _d) in enumerate(bl)
                    if (p, s) not in self.pinned
                ),
                None,
            )
            if victim is None:
                return
            p, i = victim
            self.cached -= len(self.blocks[p].pop(i)[1])

    def forget(self, local: str) -> None:
        """Drop the fetched ranges of everything at or under a shadow path (the next read goes to the store)."""
        base = os.path.normpath(local)
        with self.lock:
            for p in [p for p in self.blocks if p == base or p.startswith(base + os.sep)]:
                for start, data in self.blocks.pop(p):
                    if (p, start) in self.pinned:
                        self.pinned.discard((p, start))
                    else:
                        self.cached -= len(data)

    def cached_piece(self, local: str, pos: int, n: int) -> bytes | None:
        with self.lock:
            for start, data in self.blocks.get(local, ()):
                if start <= pos < start + len(data):
                    return data[pos - start : pos - start + n]
        return None

    def read(self, local: str, pos: int, n: int) -> bytes:
        """n bytes at pos (fewer only at the end of the object), from fetched ranges only."""
        size = self.objects[local].size
        n = max(0, min(n, size - pos))
        out = bytearray()
        while len(out) < n:
            at = pos + len(out)
            want = n - len(out)
            piece = self.cached_piece(local, at, want)
            if piece is None:
                big = want >= BLOCK  # streaming (level full): fetch exactly, do not keep
                piece = self.fetch(local, at, min(size, at + max(want, BLOCK)), keep=not big)[:want]
                if not piece:
                    break  # the object shrank since it was listed: a short read, as from a truncated file
            out += piece
        assert len(out) <= n  # every byte returned came from a ranged GET of this object
        return bytes(out)

    def prefetch(self, local: str) -> None:
        """Fetch, with a bounded pool, the header ranges of ``local`` and of the next objects beside it
        not fetched yet (at most PREFETCH_BATCH): the files a checker reads next (level quick)."""
        folder = os.path.dirname(local)
        with self.lock:
            if local in self.prefetched:
                return
            siblings = self.siblings.get(folder)
            if siblings is None:
                siblings = self.siblings[folder] = sorted(
                    p for p in self.objects if os.path.dirname(p) == folder
                )
            start = siblings.index(local) if local in siblings else 0
            batch = [
                p
                for p in dict.fromkeys([local, *siblings[start:], *siblings[:start]])
                if p not in self.prefetched
            ]
            batch = batch[:PREFETCH_BATCH]
            self.prefetched.update(batch)
        jobs = [
            (p, a, b)
            for p in batch
            for a, b in header_ranges(os.path.basename(p), self.objects[p].size)
        ]
        if not jobs:
            return
        with ThreadPoolExecutor(max_workers=min(PREFETCH_WORKERS, len(jobs))) as pool:
            for f in [pool.submit(self._prefetch_one, *job) for job in jobs]:
                f.result()

    def _prefetch_one(self, local: str, start: int, end: int) -> None:
        try:
            self.fetch(local, start, end, pin=True)
        except Exception:  # noqa: BLE001 - the checker's own read reports it, on its own file
            pass

    def pool(self) -> ThreadPoolExecutor:
        """The view's read-ahead threads (level full: the next chunk downloads while this one is hashed)."""
        with self.lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=READ_AHEAD_WORKERS)
            return self._pool

    def open(self, local: str) -> RemoteFile:
        if self.headers:
            self.prefetch(local)
        return RemoteFile(self, local)

    # ------------------------------------------------------------ writes (prune's journal and deletions)
    def put(self, rel: str, data: bytes) -> None:
        """Write one whole object ROOT/rel (a PUT appears whole or not at all)."""
        self.fs.pipe_file(self.remote + "/" + rel, data)

    def delete(self, keys: list[str]) -> None:
        if keys:
            self.fs.rm(keys)

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.remote + "/" + rel))

    def versioning(self) -> str | None:
        """'Enabled' or 'Suspended' for a versioned S3 bucket; None otherwise or when unknown."""
        call = getattr(self.fs, "call_s3", None)
        if call is None:
            return None
        try:
            out = call("get_bucket_versioning", Bucket=self.remote.split("/", 1)[0])
        except Exception:  # noqa: BLE001 - not allowed to ask: say nothing rather than guess
            return None
        status = out.get("Status") if isinstance(out, dict) else None
        return status if status in ("Enabled", "Suspended") else None


def header_ranges(name: str, size: int) -> list[tuple[int, int]]:
    """The byte ranges a quick check of this object reads, by its name: [(start, end)]."""
    if size <= 0:
        return []
    low = name.lower()
    if size <= WHOLE_BYTES and (
        low.endswith((".json", ".txt", ".yaml"))
        or low in (".metadata", "latest", "_checkpoint_metadata", "_metadata", "_sharding")
    ):
        return [(0, size)]
    if low.endswith(".safetensors"):
        return [(0, min(size, HEAD_BYTES))]
    if low.endswith((".pt", ".pth", ".bin", ".ckpt")):
        if size <= HEAD_BYTES + TAIL_BYTES:
            return [(0, size)]
        return [(0, HEAD_BYTES), (size - TAIL_BYTES, size)]
    return []


class RemoteFile(io.RawIOBase):
    """A read-only file over one object: seek/read/readinto from ranged GETs; ``fileno()`` is the
    shadow file's (so ``os.fstat`` gives the object's size), its zero bytes are never read."""

    def __init__(self, view: View, local: str) -> None:
        super().__init__()
        self.view = view
        self.local = local
        self.size = view.objects[local].size
        self.pos = 0
        self._ahead: tuple[tuple[int, int], Any] | None = None
        self._fd = os.open(local, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, "negative seek position")
        self.pos = base + offset
        return self.pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        if (
            len(view) >= BLOCK and not self.view.headers
        ):  # streaming (level full, hashes): read ahead
            data = self._stream(len(view))
        else:
            data = self.view.read(self.local, self.pos, len(view))
        view[: len(data)] = data
        self.pos += len(data)
        return len(data)

    def _stream(self, n: int) -> bytes:
        """n bytes at pos by one ranged GET, the next n requested in the background (one ahead)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == (self.pos, n):
            data = ahead[1].result()
        else:
            data = (
                self.view.fetch(self.local, self.pos, min(self.size, self.pos + n), keep=False)
                if self.pos < self.size
                else b""
            )
        nxt = self.pos + len(data)
        if data and nxt < self.size:
            self._ahead = (
                (nxt, n),
                self.view.pool().submit(
                    self.view.fetch, self.local, nxt, min(self.size, nxt + n), False
                ),
            )
        return data

    def close(self) -> None:
        if not self.closed:
            try:
                if self._ahead is not None:
                    self._ahead[1].cancel()
                    self._ahead = None
                os.close(self._fd)
                self.view.forget(
                    self.local
                )  # its headers were read: memory stays bounded on huge prefixes
            finally:
                super().close()


# --------------------------------------------------------------------------- the registry

_views: dict[str, View] = {}  # shadow root -> view
_registry_lock = threading.Lock()


def view_of(path: str) -> View | None:
    """The view whose shadow holds ``path`` (None for a real local path)."""
    if not _views:
        return None
    p = os.path.abspath(path)
    for root, v in list(_views.items()):
        if p == root or p.startswith(root + os.sep):
            return v
    return None


def open_object(path: str) -> RemoteFile | None:
    v = view_of(path)
    if v is None:
        return None
    local = os.path.abspath(path)
    return v.open(local) if local in v.objects else None


def display(path: str) -> str:
    v = view_of(path)
    return shown(v.to_url(os.path.abspath(path))) if v is not None else path


def view_count() -> int:
    return len(_views)


def unshadow(text: str) -> str:
    for v in list(_views.values()):
        text = text.replace(v.local, shown(v.url))
    return text


def unshadow_model(model: Any) -> Any:
    """A pydantic model with every shadow path in its strings replaced by its URL."""
    text = model.model_dump_json()
    for v in list(_views.values()):
        text = text.replace(json.dumps(v.local)[1:-1], json.dumps(shown(v.url))[1:-1])
    return type(model).model_validate_json(text)


def above(url: str, parents: int) -> tuple[str, list[str]]:
    """(the URL ``parents`` levels up, never above BUCKET/x; the components stripped)."""
    scheme, rest = split_url(url) or ("", url)
    parts = [x for x in rest.rstrip("/").split("/")]
    keep = max(min(2, len(parts)), len(parts) - parents)
    return f"{scheme}://" + "/".join(parts[:keep]), parts[keep:]


def _safe_rel(rel: str) -> bool:
    parts = rel.split("/")
    return all(
        p not in ("", ".", "..")
        and "\0" not in p
        and len(p.encode("utf-8", "surrogateescape")) <= 255
        for p in parts
    )


def _mtime(info: dict) -> float | None:
    """The object's modification time from its listing entry (S3 LastModified, fsspec mtime/created)."""
    for key in ("LastModified", "mtime", "created", "updated"):
        value: Any = info.get(key)
        if value is not None and hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def _missing_bucket(fs: Any, remote: str, url: str) -> str | None:
    """The bucket of an s3:// or gs:// URL when it does not exist (None: it exists, or cannot tell)."""
    parts = split_url(url)
    if parts is None or parts[0] not in ("s3", "s3a", "gs"):
        return None
    bucket = remote.split("/", 1)[0]
    try:
        return None if fs.exists(bucket) else bucket
    except Exception:  # noqa: BLE001 - cannot tell: the caller says "empty listing"
        return None


def _listing(fs: Any, remote: str, url: str) -> tuple[dict[str, int], bool, dict[str, float]]:
    """{key: size} under the prefix (one recursive, paged listing), whether the URL is one object, and
    {key: modification time} where the listing gives one."""
    try:
        found = fs.find(remote, detail=True)
    except FileNotFoundError:
        found = {}
    except Exception as exc:  # noqa: BLE001 - one line, exit 2
        raise UsageError(f"cannot list {shown(url)}: {describe(exc)}") from None
    objects = {
        k.rstrip("/"): int(v.get("size") or 0)
        for k, v in found.items()
        if v.get("type", "file") == "file" and not k.endswith("/")
    }
    if not objects:
        bucket = _missing_bucket(fs, remote, url)
        if bucket is not None:
            raise UsageError(
                f"{shown(url)}: no such bucket {bucket} (check the bucket name, the endpoint and the "
                "credentials' account)"
            )
        raise UsageError(
            f"{shown(url)}: no such object or prefix (empty listing); expected a checkpoint or a "
            "prefix holding checkpoints"
        )
    is_file = list(objects) == [remote]
    mtimes = {
        k: t for k in objects if (t := _mtime(found.get(k) or found.get(k + "/") or {})) is not None
    }
    return objects, is_file, mtimes


def _shadow(v: View, objects: dict[str, int], is_file: bool, mtimes: dict[str, float]) -> None:
    if is_file:
        _make_file(v, v.local, v.remote, objects[v.remote], mtimes.get(v.remote))
        return
    os.mkdir(v.local)
    for key in sorted(objects):
        rel = key[len(v.remote) + 1 :] if key.startswith(v.remote + "/") else None
        if rel is None or not _safe_rel(rel):
            v.skipped.append(key)
            continue
        local = os.path.join(v.local, *rel.split("/"))
        try:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            _make_file(v, local, key, objects[key], mtimes.get(key))
        except (
            OSError
        ):  # a key that is also a "folder" (a and a/b), or a name the local disk refuses
            v.skipped.append(key)


def _make_file(v: View, local: str, key: str, size: int, mtime: float | None) -> None:
    fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    try:
        os.ftruncate(fd, size)  # sparse: holds no byte of the object
    finally:
        os.close(fd)
    if mtime is not None:  # the object's time (recover picks the newest trainer_state.json by it)
        os.utime(local, (mtime, mtime))
    v.objects[local] = Entry(key, size)


SHADOW_PREFIX = "checkpoint-strategy-view-"


def _remove_stale_shadows() -> None:
    """Shadow folders left by a process that was killed (SIGKILL skips the cleanup): empty sparse files
    under the temp folder, named with the dead process's id. A live process's shadow is never touched."""
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        m = re.fullmatch(re.escape(SHADOW_PREFIX) + r"(\d+)-[A-Za-z0-9_]+", name)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # alive (or not ours to signal): keep
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        except (PermissionError, OverflowError, OSError):
            continue


def open_view(url: str, prefetch: bool = False) -> View:
    """List ``url`` once and build its shadow; registered until `close_view` (or exit)."""
    parts = split_url(url)
    assert parts is not None
    fs = filesystem(url)
    clean = url.rstrip("/") if not url.endswith("://") else url
    names = parts[1].rstrip("/").split("/")
    if not names[0] or any(n in ("", ".", "..") for n in names) or "\0" in parts[1]:
        raise UsageError(
            f"{shown(url)}: expected a bucket and a prefix without empty, '.' or '..' parts, e.g. "
            "s3://BUCKET/runs/RUN"
        )
    remote = (
        fs._strip_protocol(clean).rstrip("/")
        if hasattr(fs, "_strip_protocol")
        else parts[1].rstrip("/")
    )
    objects, is_file, mtimes = _listing(fs, remote, url)
    _remove_stale_shadows()
    tmp = tempfile.mkdtemp(prefix=f"{SHADOW_PREFIX}{os.getpid()}-")
    base = remote.rstrip("/").rsplit("/", 1)[-1] or "root"
    if not _safe_rel(base):
        base = "root"
    v = View(
        fs=fs,
        url=clean,
        remote=remote,
        tmp=tmp,
        local=os.path.join(os.path.realpath(tmp), base),
        is_file=is_file,
    )
    try:
        _shadow(v, objects, is_file, mtimes)
        v.headers = prefetch
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    with _registry_lock:
        _views[v.local] = v
    return v


def close_view(v: View) -> None:
    with _registry_lock:
        _views.pop(v.local, None)
    if v._pool is not None:
        v._pool.shutdown(wait=True, cancel_futures=True)
    shutil.rmtree(v.tmp, ignore_errors=True)


@atexit.register
def _close_all() -> None:
    for v in list(_views.values()):
        close_view(v)
