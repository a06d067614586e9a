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
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from checkpoint_strategy import storage
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.formats.base import Checker, Ctx, Layout, Role, ls
from checkpoint_strategy.formats.models import DcpItem
from checkpoint_strategy.storage import ReadError, read_bytes

TORCHTITAN_TRAIN_KEYS = ("optimizer", "lr_scheduler", "train_state", "dataloader")


def torchtitan_marked(keys: set[str]) -> bool:
    """torchtitan's own markers among a DCP .metadata's top-level keys: its TrainState saved as "train_state"
    (step, loss history) beside a model flattened to the top level (no "model" key; CheckpointManager.
    _flattened_model_states_sd). A plain loop's save ({"model": ..., "optimizer": ...}, or {"app": ...})
    has neither, whatever its folders are called."""
    return "train_state" in keys and "model" not in keys and "app" not in keys


def torchtitan_model_only_reason(keys: set[str], step: int | None) -> str | None:
    """The reason a torchtitan step-N cannot resume training, or None when it holds the training state."""
    if not keys or any(k in keys for k in TORCHTITAN_TRAIN_KEYS):
        return None
    name = f"step-{step}" if step is not None else "this step"
    return (
        f"not resumable: {name} holds model weights only (no optimizer, lr_scheduler or train_state in "
        ".metadata); torchtitan writes the final save model-only when checkpoint.last_save_model_only is "
        "true (its default since 0.2): resume from the previous full step-N, and set "
        "last_save_model_only = false for future runs"
    )


_DCP_META = "torch.distributed.checkpoint.metadata."


#: every class a DCP .metadata may name (torch 2.x): DCP reads it with pickle.load, which fails on any other name
#: under torch (a flipped letter in a class name is an AttributeError there)
DCP_CLASSES = frozenset(
    {
        _DCP_META + n
        for n in (
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    }
    | {
        "torch.distributed.checkpoint.filesystem._StorageInfo",
        "torch.distributed.checkpoint.filesystem._StoragePrefix",
        "torch.distributed.checkpoint.filesystem.SerializationFormat",
        "torch.distributed.checkpoint._extension.ZStandard",
        "torch.distributed.checkpoint._extension.StreamTransformExtension",
        "torch.Size",
        "torch.serialization._get_layout",
        "torch.device",
    }
)


#: the plain classes Python's unpickler builds for a .metadata's values besides DCP's own (`DCP_CLASSES`) and torch
#: dtypes and layouts: any other name (a flipped letter of a class name) is one dcp.load cannot unpickle
DCP_PLAIN = frozenset(
    {"collections.OrderedDict", "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib.Path"}
)

DCP_LAYOUTS = frozenset(
    f"torch.{n}"
    for n in (
        "strided",
        "sparse_coo",
        "sparse_csr",
        "sparse_csc",
        "sparse_bsr",
        "sparse_bsc",
        "_mkldnn",
        "jagged",
    )
)


#: DCP's _MEM_FORMAT_ENCODING values (contiguous, channels_last, preserve)
DCP_MEMORY_FORMATS = (0, 1, 2)


#: the DCP class pickled with a tuple as its state (TensorProperties: a 5-tuple); DCP's others pickle their __dict__
_STATE_IS_TUPLE = _DCP_META + "TensorProperties"


def dcp_odd_call(root: Any) -> str | None:
    """What in a .metadata's object tree dcp.load's unpickling refuses: the first object built from something that
    is not a class (a flipped memo index), a tensor layout other than torch.strided, or a DCP class with a state it
    cannot set (`_odd_state`); None when there is none. Iterative, each object once."""
    todo, seen = [root], set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, tp.Call):
            if not isinstance(obj.func, tp.Global):
                return f"an object is built from a {type(obj.func).__name__}, not a class"
            if obj.name == "torch.serialization._get_layout" and obj.args != ("torch.strided",):
                return f"tensor layout {tp.shown(str(obj.args), 40)}, not torch.strided"
            odd = _odd_state(obj)
            if odd:
                return odd
            todo += [obj.state, *obj.args, *obj.items.keys(), *obj.items.values(), *obj.listitems]
        elif isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple)):
            todo += obj
    return None


def _odd_state(obj: tp.Call) -> str | None:
    """A DCP class whose state dcp.load's unpickling refuses: not a dict (TensorProperties: not its 5-tuple of
    dtype, layout, requires_grad, memory format, pin_memory), or a memory format enum value it does not know."""
    name = obj.name
    if name.endswith("._MEM_FORMAT_ENCODING"):
        ok = len(obj.args) == 1 and type(obj.args[0]) is int and obj.args[0] in DCP_MEMORY_FORMATS
        return (
            None
            if ok
            else f"memory format {tp.shown(str(obj.args), 40)} is not one _MEM_FORMAT_ENCODING holds"
        )
    if not name.startswith("torch.distributed.checkpoint.") or obj.state is None:
        return None
    if name != _STATE_IS_TUPLE:
        return (
            None
            if isinstance(obj.state, dict)
            else f"a {name.rsplit('.', 1)[-1]} whose state is not a mapping"
        )
    st = obj.state
    ok = (
        isinstance(st, tuple)
        and len(st) == 5
        and isinstance(st[0], tp.Global)
        and isinstance(st[1], tp.Call)
        and st[1].name == "torch.serialization._get_layout"
        and type(st[2]) is bool
        and isinstance(st[3], tp.Call)
        and st[3].name.endswith("._MEM_FORMAT_ENCODING")
        and type(st[4]) is bool
    )
    return (
        None
        if ok
        else "a TensorProperties that is not (dtype, layout, requires_grad, memory format, pin_memory)"
    )


#: a .metadata describes its data files: per stored item a few hundred bytes (fqn, chunk, storage entry), and each
#: item holds a torch archive of ~1 KB at least (raw items of older DCP: the values, where a model's weights
#: outweigh its metadata many times; the test DCP of a 4-layer MLP: 0.14 bytes of .metadata per byte of data).
#: More than this many bytes of .metadata per byte of data (past the first MB) describe more than the files hold:
#: refused before the pickle is walked, so its cost stays in proportion to the data (a 40 MB .metadata of a million
#: chunks beside 43 kB of data: 0.25 s, where it took 55 s and 1.35 GB)
DCP_METADATA_PER_DATA_BYTE = 4


DCP_METADATA_FLOOR = 1 << 20


def dcp_metadata_oversized(meta_bytes: int, data_bytes: int) -> str | None:
    """Why a .metadata is too big for the data files beside it, or None."""
    if meta_bytes <= DCP_METADATA_FLOOR + DCP_METADATA_PER_DATA_BYTE * data_bytes:
        return None
    return (
        f"broken .metadata: {meta_bytes} bytes describing {data_bytes} bytes of .distcp data (more entries than "
        "the data files can hold): not read further"
    )


class DcpBroken(Exception):
    """A .metadata that DCP's loader cannot use; the message is the one-line reason."""


@dataclass
class DcpTensor:
    """One tensor of a DCP .metadata: its dtype, full size and stored chunks (each a DcpItem with its offsets)."""

    fqn: str
    dtype: str
    size: tuple[int, ...]
    chunks: list[DcpItem]


@dataclass
class DcpMetadata:
    """A DCP .metadata read as data (`dcp_metadata`): the one parse every command asks (validate's checker and deep
    level, convert, the optimizer step counters)."""

    items: list[DcpItem]  # every stored item: tensor chunks and bytes entries, in .metadata's order
    tensors: list[DcpTensor]
    values: dict[str, DcpItem]  # fqn -> the item of each bytes entry (a torch.save'd Python value)
    fqns: list[str]  # state_dict_metadata's names, in order
    # fqn -> the path dcp_to_torch_save nests it by (planner_data, checked)
    planner: dict[str, tuple]
    # relative path -> bytes its storage entries need (largest offset + length)
    needed: dict[str, int]
    # the top-level state_dict keys (first part of each fqn)
    keys: set[str] = field(default_factory=set)


def dcp_metadata(scan: Any, dtypes: frozenset | set | dict = tp.DTYPE_SIZE) -> DcpMetadata:
    """Every stored item of a DCP .metadata read as data (`scan`: safepickle's PickleScan), checked the way
    dcp.load / dcp_to_torch_save use it: only DCP's own classes, every tensor's properties, size and chunks whole,
    every chunk and bytes entry found in storage_data, the planner_data paths nestable. Raises DcpBroken."""
    bad = [
        g
        for g in scan.globals
        if g not in DCP_CLASSES
        and g not in DCP_PLAIN
        and g not in DCP_LAYOUTS
        and not (g.startswith("torch.") and g[6:] in dtypes)
    ]
    if bad:
        raise DcpBroken(
            f"names {tp.shown(bad[0], 80)}, not a class DCP's metadata holds (dcp.load cannot unpickle it)"
        )
    root = scan.root
    odd = dcp_odd_call(root)
    if odd:
        raise DcpBroken(f"{odd} (dcp.load cannot unpickle it)")
    if not (_is_call(root, _DCP_META + "Metadata") and isinstance(root.state, dict)):
        raise DcpBroken("the pickle is not a DCP Metadata record")
    state = root.state
    sdm, storage = state.get("state_dict_metadata"), state.get("storage_data")
    if not isinstance(sdm, dict) or not isinstance(storage, dict):
        raise DcpBroken("Metadata without its state_dict_metadata and storage_data tables")
    infos = _dcp_storage_infos(storage)
    out = DcpMetadata([], [], {}, [], {}, {})
    for fqn, md in sdm.items():
        if not isinstance(fqn, str):
            raise DcpBroken(f"a state_dict_metadata key is not a name ({type(fqn).__name__})")
        out.fqns.append(fqn)
        entry = _dcp_entry(fqn, md, infos, dtypes)
        if isinstance(entry, DcpTensor):
            out.tensors.append(entry)
            out.items.extend(entry.chunks)
        else:
            out.values[fqn] = entry
            out.items.append(entry)
    out.planner = _dcp_planner_paths(state.get("planner_data"), sdm)
    for (fqn, _offsets), (rel, off, length, _t) in infos.items():
        out.needed[rel] = max(out.needed.get(rel, 0), off + length)
        out.keys.add(fqn.split(".", 1)[0])
    return out


def _is_call(obj: Any, name: str) -> bool:
    return isinstance(obj, tp.Call) and obj.name == name and not obj.args


def _dcp_storage_infos(storage: dict) -> dict[tuple, tuple[str, int, int, bool]]:
    """(fqn, chunk offsets or None) -> (relative_path, offset, length, transformed) of storage_data."""
    out = {}
    for idx, info in storage.items():
        i = getattr(idx, "state", None) if _is_call(idx, _DCP_META + "MetadataIndex") else None
        s = (
            getattr(info, "state", None)
            if _is_call(info, "torch.distributed.checkpoint.filesystem._StorageInfo")
            else None
        )
        if not isinstance(i, dict) or not isinstance(s, dict) or not isinstance(i.get("fqn"), str):
            raise DcpBroken("a storage_data entry is not a MetadataIndex -> _StorageInfo pair")
        rel, off, length = s.get("relative_path"), s.get("offset"), s.get("length")
        if (
            not isinstance(rel, str)
            or type(off) is not int
            or type(length) is not int
            or off < 0
            or length < 0
        ):
            raise DcpBroken(
                f"storage_data entry of {i['fqn']!r} has no valid relative_path, offset and length"
            )
        offsets = i.get("offset")
        key = (i["fqn"], tuple(offsets) if isinstance(offsets, (tuple, list)) else None)
        out[key] = (rel, off, length, bool(s.get("transform_descriptors")))
    return out


def _dcp_entry(
    fqn: str, md: Any, infos: dict, dtypes: frozenset | set | dict
) -> DcpItem | DcpTensor:
    if _is_call(md, _DCP_META + "BytesStorageMetadata"):
        info = infos.get((fqn, None))
        if info is None:
            raise DcpBroken(f"bytes entry {fqn!r} has no storage_data entry")
        return DcpItem(fqn, info[0], info[1], info[2], transformed=info[3])
    if not (_is_call(md, _DCP_META + "TensorStorageMetadata") and isinstance(md.state, dict)):
        raise DcpBroken(f"entry {fqn!r} is neither a tensor nor a bytes entry")
    dtype = _dcp_dtype(fqn, md.state.get("properties"), dtypes)
    size = md.state.get("size")
    if not _ints(size):
        raise DcpBroken(f"tensor {fqn!r} has no valid size")
    chunks = md.state.get("chunks")
    if not isinstance(chunks, list):
        raise DcpBroken(f"tensor {fqn!r} has no chunk list")
    out = []
    for c in chunks:
        cs = c.state if _is_call(c, _DCP_META + "ChunkStorageMetadata") else None
        offsets, sizes = (
            (cs.get("offsets"), cs.get("sizes")) if isinstance(cs, dict) else (None, None)
        )
        if not (
            _ints(offsets)
            and _ints(sizes)
            and len(offsets) == len(sizes) == len(size)
            and all(o + s <= d for o, s, d in zip(offsets, sizes, size, strict=True))
        ):
            raise DcpBroken(f"tensor {fqn!r}{list(size)} has a chunk outside it")
        info = infos.get((fqn, tuple(offsets)))
        if info is None:
            raise DcpBroken(f"chunk {list(offsets)} of tensor {fqn!r} has no storage_data entry")
        out.append(
            DcpItem(fqn, info[0], info[1], info[2], tuple(sizes), dtype, info[3], tuple(offsets))
        )
    return DcpTensor(fqn, dtype, tuple(size), out)


def _ints(v: object) -> TypeGuard[tuple[int, ...]]:
    return isinstance(v, tuple) and all(type(x) is int and x >= 0 for x in v)


def _dcp_dtype(fqn: str, props: Any, dtypes: frozenset | set | dict) -> str:
    """The dtype of a TensorProperties record (its pickled state: (dtype, layout, requires_grad, memory_format,
    pin_memory), or a dict of those fields)."""
    st = props.state if _is_call(props, _DCP_META + "TensorProperties") else None
    if isinstance(st, dict):
        st = (
            st.get("dtype"),
            st.get("layout"),
            st.get("requires_grad"),
            st.get("memory_format"),
            st.get("pin_memory"),
        )
    if not (
        isinstance(st, tuple)
        and len(st) == 5
        and isinstance(st[0], tp.Global)
        and st[0].name in dtypes
    ):
        raise DcpBroken(f"tensor {fqn!r} has no valid properties (dtype, layout, memory format)")
    layout, fmt = st[1], st[3]
    if not (
        isinstance(layout, tp.Call)
        and layout.name == "torch.serialization._get_layout"
        and layout.args
        and layout.args[0] in DCP_LAYOUTS
    ):
        raise DcpBroken(f"tensor {fqn!r} has an unknown layout")
    if not (_is_enum(fmt) and fmt.args[0] in DCP_MEMORY_FORMATS):
        raise DcpBroken(f"tensor {fqn!r} has an unknown memory format")
    return st[0].name


def _is_enum(v: Any) -> bool:
    return (
        isinstance(v, tp.Call) and v.name == _DCP_META + "_MEM_FORMAT_ENCODING" and len(v.args) == 1
    )


def _dcp_planner_paths(planner: Any, sdm: dict) -> dict[str, tuple]:
    """planner_data: fqn -> the path dcp_to_torch_save nests each entry by (torch's set_element): names (a dict
    key) and list indexes, joined with dots the entry's own name; no path may lead through another entry, nor a name
    into a list or an index into a dict, and an index is never negative nor past the number of entries (a list of
    10**10 slots is not built)."""
    if planner is None:
        return {}
    if not isinstance(planner, dict):
        raise DcpBroken("planner_data is not a table of paths")
    limit = len(sdm)
    tree: dict = {}
    paths: dict[str, tuple] = {}
    for fqn in sdm:
        path = planner.get(fqn)
        if path is None:
            continue
        if not (
            isinstance(path, (tuple, list)) and path and all(type(k) in (str, int) for k in path)
        ):
            raise DcpBroken(f"planner_data path of {fqn!r} is not a list of names and indexes")
        if any(type(k) is int and not 0 <= k < limit for k in path):
            raise DcpBroken(f"planner_data path of {fqn!r} has a list index outside 0..{limit - 1}")
        if (
            ".".join(map(str, path)) != fqn
        ):  # the loader flattens the nested state dict back by this join
            raise DcpBroken(f"planner_data path of {fqn!r} leads to another name")
        _dcp_nest(tree, fqn, path)
        paths[fqn] = tuple(path)
    return paths


_LEAF = object()


def _dcp_nest(tree: dict, fqn: str, path: Any) -> None:
    """Place one planner_data path in `tree` (key -> subtree or _LEAF; a subtree records the type of its keys)."""
    node = tree
    for i, key in enumerate(path):
        kinds = node.setdefault("\0kind", type(key)) if i else str
        if i and kinds is not type(key):
            raise DcpBroken(
                f"planner_data path of {fqn!r} mixes names and list indexes at one level"
            )
        nxt = node.get(key)
        if i == len(path) - 1:
            if nxt is not None:
                raise DcpBroken(f"planner_data path of {fqn!r} is taken by another entry")
            node[key] = _LEAF
            return
        if nxt is _LEAF:
            raise DcpBroken(f"planner_data path of {fqn!r} is nested under another entry")
        node = node.setdefault(key, {})


def check_dcp_dir(
    ctx: Ctx,
    path: str,
    out: Layout | None = None,
    require_metadata: bool = True,
    role: Role = "mixed",
) -> None:
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
    oversized = dcp_metadata_oversized(
        len(data), sum(_size(os.path.join(path, n)) for n in names if n != ".metadata")
    )
    if oversized:
        ctx.bad(meta, oversized)
        return
    framing = tp.frame_refusal(data)
    if framing:
        ctx.bad(meta, f"broken .metadata: {framing} (dcp.load cannot unpickle it)")
        return
    scan = tp.read_pickle(data)
    if scan.unsafe(dcp=True):
        ctx.bad(meta, fc.pickle_findings(scan, ".metadata", dcp=True)[0])
        return
    md = _dcp_parsed(ctx, meta, scan)
    if md is None:
        return
    if out is not None:
        out.resumable = any(k.startswith("optim") for k in md.keys) or out.resumable
        out.dcp_keys = set(md.keys)
    problems_before = len(ctx.problems)
    archives: dict[tuple[str, int], fc.ZipScan] = {}
    _check_dcp_data_files(ctx, path, names, md.needed, md.items, archives)
    if ctx.deep:
        _dcp_deep_source(ctx, path, role, md, archives, len(ctx.problems) == problems_before)


def _dcp_deep_source(
    ctx: Ctx,
    path: str,
    role: Role,
    md: DcpMetadata,
    archives: dict[tuple[str, int], fc.ZipScan],
    whole: bool,
) -> None:
    """Level deep of a DCP folder level full found `whole`: the item archives it read (`archives`) go to the value
    scan, which does not parse them again and checks their CRC-32s as it scans their values (each storage file's
    bytes read once). Not whole: no value scan, level full's CRC-32s of the archives are checked here."""
    if whole:
        ctx.source(path, role, "dcp", dcp=md, archives=archives, crc=True)
        return
    for p, reason in fc.dcp_crc_findings(path, md.items, archives, ctx.counter, ctx.update):
        ctx.bad(p, reason)


def _check_dcp_data_files(
    ctx: Ctx,
    path: str,
    names: list[str],
    needed: dict[str, int],
    items: list[DcpItem],
    archives: dict[tuple[str, int], fc.ZipScan],
) -> None:
    """The data files a .metadata names (`needed`: relative path -> bytes it must hold; `items`: what each stores),
    and no .distcp file it does not name. `archives` gets each item's torch archive level full read, by
    (relative path, offset)."""
    meta = os.path.join(path, ".metadata")
    if not needed:
        ctx.bad(meta, "no storage entries found in .metadata")
    by_file: dict[str, list[DcpItem]] = {}
    for it in items:
        by_file.setdefault(it.rel, []).append(it)
    for rel, nbytes in sorted(needed.items()):
        _check_dcp_data_file(ctx, path, meta, rel, nbytes, by_file.get(rel, []), archives)
    for n in names:
        if n.endswith(".distcp") and n not in needed:
            ctx.bad(
                os.path.join(path, n),
                "data file not referenced by .metadata (left from another save?)",
            )


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _dcp_parsed(ctx: Ctx, meta: str, scan: tp.PickleScan) -> DcpMetadata | None:
    """The .metadata read as data (`dcp_metadata`), or None once its problem is recorded."""
    if not scan.complete:
        ctx.bad(meta, fc.pickle_findings(scan, ".metadata", dcp=True)[0])
        return None
    try:
        return dcp_metadata(scan)
    except DcpBroken as exc:
        ctx.bad(meta, f"broken .metadata: {exc}")
        return None


def _read_dcp_metadata(ctx: Ctx, path: str, meta: str) -> bytes | None:
    """The .metadata bytes, or None once its problem is recorded (outside the folder, unreadable, huge, empty)."""
    ctx.counter.files += 1
    if not storage.inside(
        meta, path
    ):  # never read outside the checkpoint (a link to /dev/zero, /etc/...)
        ctx.bad(meta, "a symbolic link to outside the checkpoint folder: not read")
        return None
    try:  # bounded: a .metadata that is a device or a huge sparse file is refused
        data = read_bytes(meta, ".metadata", limit=fc.MAX_DCP_METADATA)
        ctx.counter.bytes_read += len(data)
    except ReadError as exc:
        ctx.bad(
            meta,
            fc._oserror(exc)
            if not exc.reason.startswith("larger")
            else f"{exc.reason}: not a plausible DCP .metadata",
        )
        return None
    if not data:
        ctx.bad(meta, "zero-byte file (expected a pickled DCP Metadata)", "incomplete")
        return None
    return data


def _check_dcp_data_file(
    ctx: Ctx,
    path: str,
    meta: str,
    rel: str,
    nbytes: int,
    items: list,
    archives: dict[tuple[str, int], fc.ZipScan],
) -> None:
    """One storage file .metadata names: inside the folder, a regular file, at least nbytes long."""
    p = os.path.join(path, rel)
    if (
        os.path.isabs(rel)
        or ".." in rel.replace("\\", "/").split("/")
        or "\0" in rel
        or not storage.inside(p, path)
    ):
        ctx.bad(
            meta, f"storage path {rel!r} points outside the checkpoint folder: invalid (never read)"
        )
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
    elif ctx.reads(p):  # every item: the torch archive dcp.load reads, CRC-32 included
        for r in fc.check_dcp_file(p, items, ctx.counter, ctx.update, archives, ctx.deep):
            ctx.bad(p, r)
    ctx._tick()


def _check_dcp(ctx: Ctx, found: fm.Found) -> Layout:
    """torch.distributed.checkpoint; labelled torchtitan only by torchtitan's own markers in .metadata (its
    train_state beside a flattened model), or for a model-only step-N beside such a step (its final save)."""
    out = Layout(step=found.step, sharded=True, portability="dcp")
    check_dcp_dir(ctx, found.path, out)
    titan = torchtitan_marked(out.dcp_keys) or (
        not out.resumable
        and bool(out.dcp_keys)
        and fm._STEP.match(os.path.basename(os.path.normpath(found.path))) is not None
        and _torchtitan_sibling(found.path)
    )
    out.format = "torchtitan" if titan else "dcp"
    if titan and ctx.sources and ctx.sources[-1].kind == "dcp":
        ctx.sources[-1].flat_model = True  # torchtitan flattens the model to the top level
    if titan and not out.resumable:
        reason = torchtitan_model_only_reason(out.dcp_keys, out.step)
        if reason:
            ctx.counter.notes.append(reason)
    return out


def _torchtitan_sibling(path: str, limit: int = 3) -> bool:
    """True when one of the (at most `limit`) nearest other step-N folders beside `path` carries torchtitan's
    markers in its .metadata (read bounded, never through a link to outside that folder)."""
    parent, me = os.path.split(os.path.normpath(path))
    steps = sorted(
        ((int(m.group(1)), n) for n in ls(parent) if n != me and (m := fm._STEP.match(n))),
        reverse=True,
    )
    for _step, name in steps[:limit]:
        folder = os.path.join(parent, name)
        meta = os.path.join(folder, ".metadata")
        if not storage.inside(meta, folder) or not storage.is_regular(meta):
            continue
        keys = _dcp_keys(folder, meta)
        if keys is not None and torchtitan_marked(keys):
            return True
    return False


def _dcp_keys(folder: str, meta: str) -> set[str] | None:
    """The top-level keys of another step's .metadata (read bounded, in proportion to its data), or None when it
    cannot be read as a DCP Metadata."""
    try:
        data = read_bytes(meta, ".metadata", limit=fc.MAX_DCP_METADATA)
    except ReadError:
        return None
    if dcp_metadata_oversized(
        len(data), sum(_size(os.path.join(folder, n)) for n in ls(folder) if n != ".metadata")
    ):
        return None
    scan = tp.read_pickle(data)
    if not scan.complete or scan.unsafe(dcp=True):
        return None
    try:
        return dcp_metadata(scan).keys
    except DcpBroken:
        return None


CHECKERS: dict[str, Checker] = {"dcp": _check_dcp, "torchtitan": _check_dcp}
FOLDER_FORMATS: tuple[str, ...] = ("torchtitan", "dcp")
TRACKERS: dict[str, tuple[str, Callable[[str], str | None]]] = {}
