"""torch.distributed.checkpoint (DCP), and torchtitan's saves in it: everything the package knows of the format.

- the checker (`CHECKERS`): a step folder's `.metadata` read as data (only DCP's own classes), every storage file
  it names inside the folder and long enough, at level full every item's torch archive (CRC-32); torchtitan is
  told by its own markers in `.metadata` (`torchtitan_marked`);
- `check_dcp_dir`: the same check of a DCP folder inside another framework's checkpoint (HF FSDP shards, Lightning
  and NeMo sharded saves, Megatron torch_dist).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from checkpoint_strategy import storage
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats import frameworks as fl
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.formats.base import Checker, Ctx, Layout, Role, ls
from checkpoint_strategy.storage import ReadError, read_bytes


def check_dcp_dir(ctx: Ctx, path: str, out: Layout | None = None, require_metadata: bool = True,
                   role: Role = "mixed") -> None:
    names = ls(path)
    meta = os.path.join(path, ".metadata")
    if ".metadata" not in names:
        if require_metadata:
            ctx.missing(meta, ".metadata (DCP writes it last; without it the save did not finish)")
        for n in names:
            if n.endswith(".distcp"):
                ctx.readable(os.path.join(path, n))
        return
    data = _read_dcp_metadata(ctx, path, meta)
    if data is None:
        return
    oversized = fl.dcp_metadata_oversized(len(data), sum(_size(os.path.join(path, n)) for n in names if n != ".metadata"))
    if oversized:
        ctx.bad(meta, oversized)
        return
    scan = tp.read_pickle(data)
    if scan.unsafe(dcp=True):
        ctx.bad(meta, fc.pickle_findings(scan, ".metadata", dcp=True)[0])
        return
    items = _dcp_items(ctx, meta, scan)
    parsed = fc.dcp_storage_map(data) if items is not None else "broken .metadata"
    if isinstance(parsed, str):
        if items is not None:
            ctx.bad(meta, parsed)
        return
    needed, keys = parsed
    if out is not None:
        out.resumable = any(k.startswith("optim") for k in keys) or out.resumable
        out.dcp_keys = set(keys)
    problems_before = len(ctx.problems)
    _check_dcp_data_files(ctx, path, names, needed, items or [])
    if ctx.deep and len(ctx.problems) == problems_before and scan.complete:
        ctx.source(path, role, "dcp", dcp=scan)


def _check_dcp_data_files(ctx: Ctx, path: str, names: list[str], needed: dict[str, int],
                          items: list[fl.DcpItem]) -> None:
    """The data files a .metadata names (`needed`: relative path -> bytes it must hold; `items`: what each stores),
    and no .distcp file it does not name."""
    meta = os.path.join(path, ".metadata")
    if not needed:
        ctx.bad(meta, "no storage entries found in .metadata")
    by_file: dict[str, list[fl.DcpItem]] = {}
    for it in items:
        by_file.setdefault(it.rel, []).append(it)
    for rel, nbytes in sorted(needed.items()):
        _check_dcp_data_file(ctx, path, meta, rel, nbytes, by_file.get(rel, []))
    for n in names:
        if n.endswith(".distcp") and n not in needed:
            ctx.bad(os.path.join(path, n), "data file not referenced by .metadata (left from another save?)")


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _dcp_items(ctx: Ctx, meta: str, scan: tp.PickleScan) -> list | None:
    """The items a .metadata stores (framework_layouts.dcp_items), or None once its problem is recorded."""
    if not scan.complete:
        ctx.bad(meta, fc.pickle_findings(scan, ".metadata", dcp=True)[0])
        return None
    try:
        return fl.dcp_items(scan, tp.DTYPE_SIZE)
    except fl.DcpBroken as exc:
        ctx.bad(meta, f"broken .metadata: {exc}")
        return None


def _read_dcp_metadata(ctx: Ctx, path: str, meta: str) -> bytes | None:
    """The .metadata bytes, or None once its problem is recorded (outside the folder, unreadable, huge, empty)."""
    ctx.counter.files += 1
    if not storage.inside(meta, path):  # never read outside the checkpoint (a link to /dev/zero, /etc/...)
        ctx.bad(meta, "a symbolic link to outside the checkpoint folder: not read")
        return None
    try:  # bounded: a .metadata that is a device or a huge sparse file is refused
        data = read_bytes(meta, ".metadata", limit=fc.MAX_DCP_METADATA)
        ctx.counter.bytes_read += len(data)
    except ReadError as exc:
        ctx.bad(meta, fc._oserror(exc) if not exc.reason.startswith("larger") else
                f"{exc.reason}: not a plausible DCP .metadata")
        return None
    if not data:
        ctx.bad(meta, "zero-byte file (expected a pickled DCP Metadata)", "incomplete")
        return None
    return data


def _check_dcp_data_file(ctx: Ctx, path: str, meta: str, rel: str, nbytes: int, items: list) -> None:
    """One storage file .metadata names: inside the folder, a regular file, at least nbytes long."""
    p = os.path.join(path, rel)
    if (os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/") or "\0" in rel
            or not storage.inside(p, path)):
        ctx.bad(meta, f"storage path {rel!r} points outside the checkpoint folder: invalid (never read)")
        return
    try:
        st = os.stat(p)
        size = st.st_size
    except FileNotFoundError:
        ctx.missing(p, "data file referenced by .metadata")
        return
    except OSError as exc:
        ctx.bad(p, fc._oserror(exc))
        return
    if not os.path.isfile(p):
        ctx.bad(p, f"is {storage.kind_of(st.st_mode)}: expected a regular file")
        return
    ctx.counter.files += 1
    if size < nbytes:
        ctx.bad(p, f"truncated: .metadata needs {nbytes} bytes, file has {size}", "incomplete")
    elif ctx.reads(p):   # every item: the torch archive dcp.load reads, CRC-32 included
        for r in fc.check_dcp_file(p, items, ctx.counter, ctx.update):
            ctx.bad(p, r)
    ctx._tick()


def _check_dcp(ctx: Ctx, found: fm.Found) -> Layout:
    """torch.distributed.checkpoint; labelled torchtitan only by torchtitan's own markers in .metadata (its
    train_state beside a flattened model), or for a model-only step-N beside such a step (its final save)."""
    out = Layout(step=found.step, sharded=True, portability="dcp")
    check_dcp_dir(ctx, found.path, out)
    titan = fl.torchtitan_marked(out.dcp_keys) or (
        not out.resumable and bool(out.dcp_keys) and fm._STEP.match(os.path.basename(os.path.normpath(found.path)))
        is not None and _torchtitan_sibling(found.path))
    out.format = "torchtitan" if titan else "dcp"
    if titan and ctx.sources and ctx.sources[-1].kind == "dcp":
        ctx.sources[-1].flat_model = True   # torchtitan flattens the model to the top level
    if titan and not out.resumable:
        reason = fl.torchtitan_model_only_reason(out.dcp_keys, out.step)
        if reason:
            ctx.counter.notes.append(reason)
    return out


def _torchtitan_sibling(path: str, limit: int = 3) -> bool:
    """True when one of the (at most `limit`) nearest other step-N folders beside `path` carries torchtitan's
    markers in its .metadata (read bounded, never through a link to outside that folder)."""
    parent, me = os.path.split(os.path.normpath(path))
    steps = sorted(((int(m.group(1)), n) for n in ls(parent) if n != me and (m := fm._STEP.match(n))), reverse=True)
    for _step, name in steps[:limit]:
        folder = os.path.join(parent, name)
        meta = os.path.join(folder, ".metadata")
        if not storage.inside(meta, folder) or not storage.is_regular(meta):
            continue
        try:
            parsed = fc.dcp_storage_map(read_bytes(meta, ".metadata", limit=fc.MAX_DCP_METADATA))
        except ReadError:
            continue
        if not isinstance(parsed, str) and fl.torchtitan_marked(parsed[1]):
            return True
    return False


CHECKERS: dict[str, Checker] = {"dcp": _check_dcp, "torchtitan": _check_dcp}
FOLDER_FORMATS: tuple[str, ...] = ("torchtitan", "dcp")
TRACKERS: dict[str, tuple[str, Callable[[str], str | None]]] = {}
