"""What every framework module in formats/ shares: the `Format` protocol, the checker's context and its result.

A framework module (formats/hf.py, lightning.py, torchfile.py, dcp.py, deepspeed.py, orbax.py, megatron.py) holds
what the package knows of one framework: its checker at each level (`CHECKERS`: format name -> checker), its
trackers (`TRACKERS`), its own metadata readers, and the run facts the whole job needs where they are its own
(HF's rng_state_<rank>.pth and ZeRO's per-rank shards: `hf.rank_gap`, `deepspeed.zero_rank_gap`).
`formats/registry.py` lists the modules; `validate/engine.py` dispatches through it (no format named in its
table). Still by task, outside the modules: the names (formats/identify.py: one ordered chain decides between
frameworks, and recover/prune read it without loading any checker), optimizer step counters (formats/optstep.py),
the world size from file names (formats/worldsize.py), each level's blind spots (validate/coverage.py).

A checker takes the context (`Ctx`: where problems, notes and, at level deep, tensor sources go) and what
`identify` found, and returns what it learned (`Layout`). Nothing here imports validate/: the engine hands the
context what the level needs from above (the part split, the deep level's Source).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from checkpoint_strategy import storage
from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats.archive import Kind
from checkpoint_strategy.formats.models import Problem
from checkpoint_strategy.storage import ReadError, describe_os_error, loads_json, read_bytes

if TYPE_CHECKING:
    from checkpoint_strategy.formats.identify import Found

ProgressFn = Callable[..., None]
Portability = Literal[
    "full",
    "weights",
    "fsdp",
    "dcp",
    "zero",
    "ds-universal",
    "megatron",
    "orbax",
    "lightning-sharded",
    "unknown",
]
#: what a file holds for the deep level (validate.deep reads by it)
Role = Literal["weights", "optimizer", "mixed", "other"]


class Part(Protocol):
    """One part of a checkpoint's files (validate/parts.py's Split): which files this process reads whole."""

    def owns(self, rel: str) -> bool: ...


@dataclass
class Layout:
    """What a format checker learned about one checkpoint (its problems go to the context)."""

    resumable: bool = False
    sharded: bool = False
    portability: Portability = "unknown"
    step: int | None = None
    dcp_keys: set[str] = field(default_factory=set)  # top-level state-dict keys of a DCP checkpoint
    format: str | None = (
        None  # what the content says it is, where the name alone could not (torchtitan)
    )


class Ctx:
    """Collects problems/notes (and, at level deep, the files that hold tensors) for one checkpoint.

    The engine (validate/engine.py) builds it: `part` is the `validate --part K/N` split in force (validate/parts.py),
    `make_source` builds the deep level's `Source` (validate/deep.py); formats/ never imports validate/."""

    def __init__(
        self,
        root: str,
        level: str,
        update: ProgressFn | None,
        want_commit: bool = False,
        part: Part | None = None,
        make_source: Callable[..., Any] | None = None,
    ) -> None:
        self.root = root
        self.want_commit = (
            want_commit  # Orbax: the other steps have commit_success.txt, so this one must
        )
        self.level = level
        self.full = level in (
            "full",
            "deep",
        )  # deep includes every check of full (CRC-32, every byte read)
        self.deep = level == "deep"
        self.counter = zr.Counter()
        self.problems: list[Problem] = []
        self.update = update
        self.sources: list[Any] = []  # validate.deep.Source, made by `make_source` (level deep)
        self.make_source = make_source
        self.global_step: int | None = None
        self.listed: list[str] | None = (
            None  # the checker's listing of the checkpoint folder (HF Trainer)
        )
        self.flat = False  # that listing saw only regular files, and the folder is no symlink
        self.trainer_best: str | None = (
            None  # trainer_state.json's best_model_checkpoint, once the checker read it
        )
        self.state_read = False  # the checker parsed trainer_state.json (a dict or not)
        self.args_world: int | None = None  # the processes training_args.bin records (HF Trainer)
        self.part = part  # validate --part K/N (validate/parts.py); the engine adds its note

    def reads(self, path: str) -> bool:
        """Level full reads every byte of `path` (in this process's part, when the files are split)."""
        return self.full and (self.part is None or self.part.owns(self.rel(path)))

    def rel(self, path: str) -> str:
        if os.path.normpath(path) == os.path.normpath(self.root):
            return self.named(".")
        base = self.root if os.path.isdir(self.root) else os.path.dirname(self.root)
        return os.path.relpath(path, base)

    def named(self, file: str) -> str:
        return named(file, self.root)

    def bad(self, path: str, reason: str, kind: Kind | None = None) -> None:
        """Record a problem; its kind is the finding's own (archive.Finding) unless given."""
        kind = kind or getattr(reason, "kind", "invalid")
        self.problems.append(Problem(file=self.rel(path), reason=str(reason), kind=kind))

    def missing(self, path: str, what: str) -> None:
        self.bad(path, f"missing: {what}", "incomplete")

    def safetensors(self, path: str, role: Role = "weights", regular: bool = False) -> None:
        """At level deep the value scan reads every byte of the data (non-float tensors read through), which
        is all full's pass over a safetensors file does (the format has no checksum): it is not read twice.
        ``regular`` (here and below): the checker's listing (formats.listing_types) saw a regular file (no stat before the open)."""
        # (`reads` and `_tick` spelled out here and in `zip` and `json`: a method call a file counts in a walk)
        full = self.full and not self.deep and self.reads(path)
        reasons = fc.check_safetensors(path, self.counter, full, regular)
        for r in reasons:
            self.bad(path, r)
        if not reasons and self.deep:
            self.source(path, role, "safetensors")
        if self.update is not None:
            self.update(files=1)

    def zip(
        self,
        path: str,
        role: Role = "other",
        flat: bool = False,
        tensor: str | None = None,
        regular: bool = False,
    ) -> fc.ZipScan:
        """A torch zip archive; at level deep its tensors are scanned (`tensor`: the one name they all take,
        for DeepSpeed universal checkpoints' per-parameter files)."""
        scanned = (
            self.deep and role != "other"
        )  # its CRC-32s are checked by the value scan (read once)
        reads = self.full and self.reads(path)
        z = fc.scan_zip(path, self.counter, reads, self.update, regular, crc=not scanned)
        for r in z.findings:
            self.bad(path, r)
        if scanned and not z.findings and not z.legacy:
            self.source(path, role, "zip", zip=z, flat=flat, tensor=tensor, crc=reads)
        elif self.deep and z.legacy and role != "other":
            self.counter.notes.append(
                f"{os.path.basename(path)}: legacy torch file: values not checked (deep)"
            )
        if self.update is not None:
            self.update(files=1)
        return z

    def json(
        self, path: str, limit: int = storage.MAX_JSON_BYTES, regular: bool = False
    ) -> object | None:
        self.counter.files += 1
        try:
            raw = read_bytes(path, "JSON file", limit, regular)
        except ReadError as exc:
            self.bad(path, fc._oserror(exc))
            self._tick()
            return None
        self.counter.bytes_read += len(raw)
        self.counter.sizes[path] = len(raw)
        if self.update is not None:
            self.update(files=1)
        if not raw:
            self.bad(path, "zero-byte file (expected JSON)")
            return None
        try:
            return loads_json(raw, os.path.basename(path), allow_nan=True)
        except ReadError as exc:
            self.bad(path, exc.reason)
        return None

    def readable(self, path: str) -> None:
        """Generic file: must be a readable, non-empty file; full level reads it all."""
        self.counter.files += 1
        try:
            st = os.stat(path)
        except OSError as exc:
            self.bad(path, f"cannot read: {describe_os_error(exc)}")
            return
        if not os.path.isfile(path):
            self.bad(path, f"is {storage.kind_of(st.st_mode)}: expected a regular file")
            return
        if st.st_size == 0:
            self.bad(path, "zero-byte file")
            return
        if self.reads(path):
            for r in fc.stream_file(path, self.counter, self.update):
                self.bad(path, r)
        else:
            try:
                with storage.open_regular(path) as fh:
                    fh.read(1)
            except (OSError, storage.ReadError) as exc:
                self.bad(path, fc._oserror(exc))
        self._tick()

    def source(self, path: str, role: Role, kind: str, **more: Any) -> None:
        """Level deep: `path` holds tensors the value scan reads (validate.deep.Source)."""
        assert self.make_source is not None, "level deep needs the engine's Source"
        self.sources.append(self.make_source(path, self.rel(path), role, kind, **more))

    def _tick(self) -> None:
        if self.update is not None:
            self.update(files=1)


def named(file: str, checkpoint: str) -> str:
    """A problem's file: '.' (the checkpoint itself) is the file's name for a single-file checkpoint."""
    return (
        os.path.basename(os.path.normpath(checkpoint))
        if file == "." and not os.path.isdir(checkpoint)
        else file
    )


def ls(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


Checker = Callable[[Ctx, "Found"], Layout]


class Format(Protocol):
    """A framework module as the engine and the registry see it (module attributes)."""

    #: format name (as `identify` names it, formats/identify.py) -> its checker
    CHECKERS: dict[str, Checker]
    #: those of its formats that are always a folder (a file there is reported, never checked)
    FOLDER_FORMATS: tuple[str, ...]
    #: a tracker file beside its checkpoints (DeepSpeed `latest`, Megatron's latest_checkpointed_iteration.txt)
    #: -> (the format of the checkpoint it names, the checkpoint's name from the file's text or None)
    TRACKERS: dict[str, tuple[str, Callable[[str], str | None]]]


@dataclass(frozen=True)
class Refused:
    """Why a metadata document cannot be used (one line): the error side of a value-or-reason result, `T | Refused`,
    told from the value by its type."""

    reason: str
