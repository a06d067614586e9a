"""What real framework checkpoints say about themselves, read from their own metadata files.

Kept apart from the checker table in validate.py: each function takes already-read metadata
(parsed JSON, or the top-level keys of a DCP `.metadata`) and answers one question.

Checked against real saves made in tests/test_export_frameworks.py (HF training_args.bin: a 2-process torchrun save
in tests/test_checkpoints_ranks.py):
  orbax-checkpoint 0.12.8  <step>/<item>/_METADATA: {"tree_metadata": {"('opt', 'mu')": {"key_metadata":
                           [{"key": "opt", ...}, ...]}, ...}}; an unfinished save is <step>.orbax-checkpoint-tmp
  torchtitan               step-N/.metadata top-level keys: model FQNs (flattened) plus optimizer,
                           lr_scheduler, dataloader, train_state for a full save; model FQNs only for the
                           model-only final save (checkpoint.last_save_model_only, default true since 0.2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

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
    return (f"not resumable: {name} holds model weights only (no optimizer, lr_scheduler or train_state in "
            ".metadata); torchtitan writes the final save model-only when checkpoint.last_save_model_only is "
            "true (its default since 0.2): resume from the previous full step-N, and set "
            "last_save_model_only = false for future runs")


# --------------------------------------------------------------------------- HF Trainer


# --------------------------------------------------------------------------- DeepSpeed


# --------------------------------------------------------------------------- torch.distributed.checkpoint

_DCP_META = "torch.distributed.checkpoint.metadata."
#: every class a DCP .metadata may name (torch 2.x): DCP reads it with pickle.load, which fails on any other name
#: under torch (a flipped letter in a class name is an AttributeError there)
DCP_CLASSES = frozenset(
    {_DCP_META + n for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                             "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")}
    | {"torch.distributed.checkpoint.filesystem._StorageInfo", "torch.distributed.checkpoint.filesystem._StoragePrefix",
       "torch.distributed.checkpoint.filesystem.SerializationFormat",
       "torch.distributed.checkpoint._extension.ZStandard",
       "torch.distributed.checkpoint._extension.StreamTransformExtension",
       "torch.Size", "torch.serialization._get_layout", "torch.device"})
DCP_LAYOUTS = frozenset(f"torch.{n}" for n in ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                                               "sparse_bsc", "_mkldnn", "jagged"))
#: DCP's _MEM_FORMAT_ENCODING values (contiguous, channels_last, preserve)
DCP_MEMORY_FORMATS = (0, 1, 2)


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
    return (f"broken .metadata: {meta_bytes} bytes describing {data_bytes} bytes of .distcp data (more entries than "
            "the data files can hold): not read further")


class DcpBroken(Exception):
    """A .metadata that DCP's loader cannot use; the message is the one-line reason."""


@dataclass
class DcpItem:
    """One stored item a .metadata names: a tensor chunk (its sizes and dtype) or a bytes object."""

    fqn: str
    rel: str
    offset: int
    length: int
    sizes: tuple | None = None
    dtype: str | None = None
    transformed: bool = False


def dcp_items(scan: Any, dtypes: frozenset | set | dict) -> list[DcpItem]:
    """Every stored item of a DCP .metadata read as data (`scan`: torchpickle's PickleScan), checked the way
    dcp.load / dcp_to_torch_save use it: only DCP's own classes, every tensor's properties, size and chunks whole,
    every chunk and bytes entry found in storage_data, the planner_data paths nestable. Raises DcpBroken."""
    bad = [g for g in scan.globals if g.startswith("torch.") and g not in DCP_CLASSES
           and (not g.startswith("torch.") or g[6:] not in dtypes) and g not in DCP_LAYOUTS]
    if bad:
        raise DcpBroken(f"names {bad[0]!r}, not a class DCP's metadata holds (dcp.load cannot unpickle it)")
    root = scan.root
    if not (_is_call(root, _DCP_META + "Metadata") and isinstance(root.state, dict)):
        raise DcpBroken("the pickle is not a DCP Metadata record")
    state = root.state
    sdm, storage = state.get("state_dict_metadata"), state.get("storage_data")
    if not isinstance(sdm, dict) or not isinstance(storage, dict):
        raise DcpBroken("Metadata without its state_dict_metadata and storage_data tables")
    infos = _dcp_storage_infos(storage)
    items: list[DcpItem] = []
    for fqn, md in sdm.items():
        if not isinstance(fqn, str):
            raise DcpBroken(f"a state_dict_metadata key is not a name ({type(fqn).__name__})")
        items.extend(_dcp_entry_items(fqn, md, infos, dtypes))
    _dcp_planner_paths(state.get("planner_data"), sdm)
    return items


def _is_call(obj: Any, name: str) -> bool:
    from checkpoint_strategy.formats import safepickle as tp

    return isinstance(obj, tp.Call) and obj.name == name and not obj.args


def _dcp_storage_infos(storage: dict) -> dict[tuple, tuple[str, int, int, bool]]:
    """(fqn, chunk offsets or None) -> (relative_path, offset, length, transformed) of storage_data."""
    out = {}
    for idx, info in storage.items():
        i = getattr(idx, "state", None) if _is_call(idx, _DCP_META + "MetadataIndex") else None
        s = getattr(info, "state", None) if _is_call(info, "torch.distributed.checkpoint.filesystem._StorageInfo") \
            else None
        if not isinstance(i, dict) or not isinstance(s, dict) or not isinstance(i.get("fqn"), str):
            raise DcpBroken("a storage_data entry is not a MetadataIndex -> _StorageInfo pair")
        rel, off, length = s.get("relative_path"), s.get("offset"), s.get("length")
        if not isinstance(rel, str) or type(off) is not int or type(length) is not int or off < 0 or length < 0:
            raise DcpBroken(f"storage_data entry of {i['fqn']!r} has no valid relative_path, offset and length")
        offsets = i.get("offset")
        key = (i["fqn"], tuple(offsets) if isinstance(offsets, (tuple, list)) else None)
        out[key] = (rel, off, length, bool(s.get("transform_descriptors")))
    return out


def _dcp_entry_items(fqn: str, md: Any, infos: dict, dtypes: frozenset | set | dict) -> list[DcpItem]:
    if _is_call(md, _DCP_META + "BytesStorageMetadata"):
        info = infos.get((fqn, None))
        if info is None:
            raise DcpBroken(f"bytes entry {fqn!r} has no storage_data entry")
        return [DcpItem(fqn, info[0], info[1], info[2], transformed=info[3])]
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
        offsets, sizes = (cs.get("offsets"), cs.get("sizes")) if isinstance(cs, dict) else (None, None)
        if not (_ints(offsets) and _ints(sizes) and len(offsets) == len(sizes) == len(size)
                and all(o + s <= d for o, s, d in zip(offsets, sizes, size, strict=True))):
            raise DcpBroken(f"tensor {fqn!r}{list(size)} has a chunk outside it")
        info = infos.get((fqn, tuple(offsets)))
        if info is None:
            raise DcpBroken(f"chunk {list(offsets)} of tensor {fqn!r} has no storage_data entry")
        out.append(DcpItem(fqn, info[0], info[1], info[2], tuple(sizes), dtype, info[3]))
    return out


def _ints(v: object) -> TypeGuard[tuple[int, ...]]:
    return isinstance(v, tuple) and all(type(x) is int and x >= 0 for x in v)


def _dcp_dtype(fqn: str, props: Any, dtypes: frozenset | set | dict) -> str:
    """The dtype of a TensorProperties record (its pickled state: (dtype, layout, requires_grad, memory_format,
    pin_memory), or a dict of those fields)."""
    from checkpoint_strategy.formats import safepickle as tp

    st = props.state if _is_call(props, _DCP_META + "TensorProperties") else None
    if isinstance(st, dict):
        st = (st.get("dtype"), st.get("layout"), st.get("requires_grad"), st.get("memory_format"),
              st.get("pin_memory"))
    if not (isinstance(st, tuple) and len(st) == 5 and isinstance(st[0], tp.Global) and st[0].name in dtypes):
        raise DcpBroken(f"tensor {fqn!r} has no valid properties (dtype, layout, memory format)")
    layout, fmt = st[1], st[3]
    if not (isinstance(layout, tp.Call) and layout.name == "torch.serialization._get_layout"
            and layout.args and layout.args[0] in DCP_LAYOUTS):
        raise DcpBroken(f"tensor {fqn!r} has an unknown layout")
    if not (_is_enum(fmt) and fmt.args[0] in DCP_MEMORY_FORMATS):
        raise DcpBroken(f"tensor {fqn!r} has an unknown memory format")
    return st[0].name


def _is_enum(v: Any) -> bool:
    from checkpoint_strategy.formats import safepickle as tp

    return isinstance(v, tp.Call) and v.name == _DCP_META + "_MEM_FORMAT_ENCODING" and len(v.args) == 1


def _dcp_planner_paths(planner: Any, sdm: dict) -> None:
    """planner_data: fqn -> the path dcp_to_torch_save nests each entry by (torch's set_element): names (a dict
    key) and list indexes, joined with dots the entry's own name; no path may lead through another entry, nor a name
    into a list or an index into a dict, and an index is never negative nor past the number of entries (a list of
    10**10 slots is not built)."""
    if planner is None:
        return
    if not isinstance(planner, dict):
        raise DcpBroken("planner_data is not a table of paths")
    limit = len(sdm)
    tree: dict = {}
    for fqn in sdm:
        path = planner.get(fqn)
        if path is None:
            continue
        if not (isinstance(path, (tuple, list)) and path and all(type(k) in (str, int) for k in path)):
            raise DcpBroken(f"planner_data path of {fqn!r} is not a list of names and indexes")
        if ".".join(map(str, path)) != fqn:   # the loader flattens the nested state dict back by this join
            raise DcpBroken(f"planner_data path of {fqn!r} leads to another name")
        if any(type(k) is int and not 0 <= k < limit for k in path):
            raise DcpBroken(f"planner_data path of {fqn!r} has a list index outside 0..{limit - 1}")
        _dcp_nest(tree, fqn, path)


_LEAF = object()


def _dcp_nest(tree: dict, fqn: str, path: Any) -> None:
    """Place one planner_data path in `tree` (key -> subtree or _LEAF; a subtree records the type of its keys)."""
    node = tree
    for i, key in enumerate(path):
        kinds = node.setdefault("\0kind", type(key)) if i else str
        if i and kinds is not type(key):
            raise DcpBroken(f"planner_data path of {fqn!r} mixes names and list indexes at one level")
        nxt = node.get(key)
        if i == len(path) - 1:
            if nxt is not None:
                raise DcpBroken(f"planner_data path of {fqn!r} is taken by another entry")
            node[key] = _LEAF
            return
        if nxt is _LEAF:
            raise DcpBroken(f"planner_data path of {fqn!r} is nested under another entry")
        node = node.setdefault(key, {})
