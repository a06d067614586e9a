"""Writers: safetensors (sharded the way Hugging Face publishes), a full torch.save archive, a DCP folder.

Each writes into a folder it was given (the temporary folder next to DST) and streams every tensor's
pieces in order through one reused buffer, hashing the bytes as they pass (`Written.sha256`), so the
check afterwards compares what the source held with what the destination reads back.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, BinaryIO

from checkpoint_strategy.convert import torchzip as tz
from checkpoint_strategy.convert.pieces import CHUNK, Files, Tensor, stream, tensors
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import safepickle as tp

ST_CODE = {
    "float32": "F32",
    "float64": "F64",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "complex64": "C64",
}
DCP_MODULE = "torch.distributed.checkpoint.metadata"


@dataclass
class Written:
    files: list[tuple[str, int]] = field(default_factory=list)  # (name relative to DST, bytes)
    sha256: dict[int, str] = field(default_factory=dict)  # id(Tensor) -> hash of the bytes written
    bytes: int = 0


def _hash_and_write(h: Any, chunk: memoryview, write: Any) -> None:
    h.update(chunk)
    write(chunk)


class _Copier:
    """Streams tensors into a sink, hashing as it goes: the next chunk is read while a second thread hashes and
    writes the previous one (read, sha256 and write all release the GIL), two buffers taken in turn."""

    def __init__(self, files: Files, out: Written) -> None:
        self.files, self.out = files, out
        self.bufs = [memoryview(bytearray(CHUNK)), memoryview(bytearray(CHUNK))]
        self.pool = _pool()

    def copy(self, t: Tensor, write: Any) -> None:
        h = hashlib.sha256()
        pending = None
        try:
            for chunk in stream(t, self.files, self.bufs):
                if pending is not None:
                    pending.result()  # its buffer is the one the next read fills
                pending = self.pool.submit(_hash_and_write, h, chunk, write)
        finally:
            if pending is not None:
                pending.result()
        self.out.sha256[id(t)] = h.hexdigest()
        self.out.bytes += t.nbytes


@lru_cache(maxsize=1)
def _pool() -> Any:
    """One writer thread for the process (idle between conversions)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="convert-write")


def _create(path: str) -> BinaryIO:
    return open(path, "xb")


def _finish(fh: BinaryIO) -> None:
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()


# --------------------------------------------------------------------------- safetensors


def shards(items: list[tuple[str, Tensor]], max_bytes: int) -> list[list[tuple[str, Tensor]]]:
    """Hugging Face's split: in order, a new shard when the next tensor would pass max_bytes; a tensor
    larger than max_bytes alone in its shard (huggingface_hub split_torch_state_dict_into_shards)."""
    out: list[list[tuple[str, Tensor]]] = []
    cur: list[tuple[str, Tensor]] = []
    size = 0
    for name, t in items:
        if cur and size + t.nbytes > max_bytes:
            out.append(cur)
            cur, size = [], 0
        cur.append((name, t))
        size += t.nbytes
    if cur:
        out.append(cur)
    return out


def _st_header(items: list[tuple[str, Tensor]]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, t in items:
        code = ST_CODE.get(t.dtype)
        if code is None:
            raise UsageError(f"tensor {tp.shown(name)}: dtype {t.dtype} has no safetensors code")
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [at, at + t.nbytes]}
        at += t.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_safetensors(
    folder: str, items: list[tuple[str, Tensor]], max_bytes: int, files: Files
) -> Written:
    out = Written()
    groups = shards(items, max_bytes)
    copier = _Copier(files, out)
    names = (
        ["model.safetensors"]
        if len(groups) == 1
        else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    )
    weight_map: dict[str, str] = {}
    for fname, group in zip(names, groups, strict=False):
        path = os.path.join(folder, fname)
        fh = _create(path)
        try:
            fh.write(_st_header(group))
            for name, t in group:
                copier.copy(t, fh.write)
                weight_map[name] = fname
        finally:
            _finish(fh) if not fh.closed else None
        out.files.append((fname, os.path.getsize(path)))
    if len(groups) > 1:
        index = {
            "metadata": {"total_size": sum(t.nbytes for _n, t in items)},
            "weight_map": weight_map,
        }
        data = (json.dumps(index, indent=2, ensure_ascii=False) + "\n").encode()
        with _create(os.path.join(folder, "model.safetensors.index.json")) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        out.files.append(("model.safetensors.index.json", len(data)))
    return out


# --------------------------------------------------------------------------- full torch.save archive


def _leaves(tree: Any, keys: dict, order: list, depth: int = 0) -> Any:
    """The tree with each Tensor replaced by a TensorLeaf; tied tensors (same bytes) share one storage."""
    if isinstance(tree, Tensor):
        if tree.dtype not in tz.STORAGE_CLASS:
            raise UsageError(
                f"tensor {tp.shown(tree.name)}: dtype {tree.dtype} has no torch storage class "
                "this writer names"
            )
        ak = tree.alias_key() or id(tree)
        if ak not in keys:
            keys[ak] = str(len(keys))
            order.append(tree)
        return tz.TensorLeaf(keys[ak], tree.dtype, tree.shape, tree.numel)
    if isinstance(tree, dict):
        return {k: _leaves(v, keys, order, depth + 1) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_leaves(v, keys, order, depth + 1) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_leaves(v, keys, order, depth + 1) for v in tree)
    return tree


def write_full(path: str, tree: Any, files: Files) -> Written:
    """One torch.save archive at `path` (torch.load(weights_only=True) reads it)."""
    out = Written()
    keys: dict = {}
    order: list[Tensor] = []
    pickled = tz.pickle_bytes(_leaves(tree, keys, order))
    copier = _Copier(files, out)
    fh = _create(path)
    try:
        z = tz.ZipWriter(fh)
        z.add("data.pkl", pickled)
        z.add("byteorder", b"little")
        for key, t in zip(keys.values(), order, strict=False):
            z.begin(f"data/{key}", t.nbytes)
            copier.copy(t, z.write)
            z.end()
        z.add("version", b"3\n")
        z.finish()
    finally:
        _finish(fh) if not fh.closed else None
    first = {id(t): out.sha256[id(t)] for t in order}
    for _n, t in tensors(tree):  # a tied tensor's hash is its storage's
        ak = t.alias_key()
        if id(t) not in out.sha256 and ak is not None:
            twin = next((o for o in order if o.alias_key() == ak), None)
            if twin is not None and first.get(id(twin)):
                out.sha256[id(t)] = first[id(twin)]
    out.files.append((os.path.basename(path), os.path.getsize(path)))
    return out


# --------------------------------------------------------------------------- DCP


def _terminal(value: Any) -> bool:
    """torch.distributed.checkpoint._traverse: a list holding no dict, list or tensor is one value."""
    if isinstance(value, dict):
        return False
    if not isinstance(value, list):
        return True
    return all(
        not isinstance(v, (dict, list, Tensor)) or (isinstance(v, list) and _terminal(v))
        for v in value
    )


def flatten(
    tree: Any, path: tuple = (), out: dict | None = None, depth: int = 0
) -> dict[str, tuple[tuple, Any]]:
    """fqn -> (path, leaf) the way dcp.save flattens a state dict (dict keys as str, list indexes as int)."""
    out = {} if out is None else out
    if depth > 200:
        raise UsageError("the state dict is nested more than 200 levels")
    if not path and not isinstance(tree, dict):
        raise UsageError(
            f"the state is a {type(tree).__name__ if not isinstance(tree, Tensor) else 'tensor'} at the "
            "top, not a mapping of names: dcp.save and dcp_to_torch_save need a dict there (--to full "
            "keeps it as it is; --key picks a mapping inside it)"
        )
    if isinstance(tree, dict):
        for k, v in tree.items():
            flatten(v, path + (str(k),), out, depth + 1)
    elif isinstance(tree, Tensor) or _terminal(tree):
        fqn = ".".join(map(str, path))
        if fqn in out:
            raise UsageError(
                f"two entries are both named {tp.shown(fqn)} once flattened (DCP names an entry by its "
                "keys as strings joined with '.'): rename one, or convert --to full"
            )
        if isinstance(tree, tuple) and next(tensors(tree), None) is not None:
            raise UsageError(
                f"entry {tp.shown(fqn)} is a tuple holding tensors: dcp.save keeps a tuple as one pickled "
                "value, which this writer does not build (--to full keeps it)"
            )
        out[fqn] = (path, tree)
    else:
        for i, v in enumerate(tree):
            flatten(v, path + (i,), out, depth + 1)
    return out


def _size(dims: tuple) -> tz.Reduce:
    return tz.Reduce("torch", "Size", (tuple(dims),))


def _tensor_md(t: Tensor) -> tz.Obj:
    props = tz.Obj(
        DCP_MODULE,
        "TensorProperties",
        (
            tz.Ref("torch", t.dtype),
            tz.Reduce("torch.serialization", "_get_layout", ("torch.strided",)),
            False,
            tz.Reduce(DCP_MODULE, "_MEM_FORMAT_ENCODING", (0,)),
            False,
        ),
    )
    chunk = tz.Obj(
        DCP_MODULE,
        "ChunkStorageMetadata",
        {"offsets": _size((0,) * len(t.shape)), "sizes": _size(t.shape)},
    )
    return tz.Obj(
        DCP_MODULE,
        "TensorStorageMetadata",
        {"properties": props, "size": _size(t.shape), "chunks": [chunk]},
    )


def write_dcp(folder: str, tree: Any, files: Files) -> Written:
    """`.metadata` + one `__0_0.distcp`: every tensor one whole chunk (dcp.load re-shards it to any world
    size), every other value a torch.save archive of plain data, as dcp.save writes them."""
    out = Written()
    copier = _Copier(files, out)
    flat = flatten(tree)
    sdm: dict = {}
    planner: dict = {}
    storage: dict = {}
    data = "__0_0.distcp"
    fh = _create(os.path.join(folder, data))
    try:
        for fqn, (path, leaf) in flat.items():
            at = fh.tell()
            planner[fqn] = path
            sdm[fqn], index, length = _dcp_entry(fh, copier, fqn, leaf)
            storage[index] = tz.Obj(
                "torch.distributed.checkpoint.filesystem",
                "_StorageInfo",
                {"relative_path": data, "offset": at, "length": length},
            )
    finally:
        _finish(fh) if not fh.closed else None
    meta = tz.Obj(
        DCP_MODULE,
        "Metadata",
        {
            "state_dict_metadata": sdm,
            "planner_data": planner,
            "storage_data": storage,
            "version": "1.0.0",
        },
    )
    raw = tz.pickle_bytes(meta)
    with _create(os.path.join(folder, ".metadata")) as mh:
        mh.write(raw)
        mh.flush()
        os.fsync(mh.fileno())
    out.files += [(data, os.path.getsize(os.path.join(folder, data))), (".metadata", len(raw))]
    return out


def _dcp_entry(fh: BinaryIO, copier: _Copier, fqn: str, leaf: Any) -> tuple[tz.Obj, tz.Obj, int]:
    """One entry of the `.distcp` file at its current end, as dcp.save writes it: a tensor as a torch.save
    archive of its one whole chunk, any other value as an archive of plain data. Its storage metadata, its
    MetadataIndex and the bytes written."""
    if not isinstance(leaf, Tensor):
        length = tz.write_small_archive(fh, leaf)
        return (
            tz.Obj(DCP_MODULE, "BytesStorageMetadata", {}),
            tz.Obj(DCP_MODULE, "MetadataIndex", {"fqn": fqn, "index": None}),
            length,
        )
    if leaf.dtype not in tz.STORAGE_CLASS:
        raise UsageError(f"tensor {tp.shown(fqn)}: dtype {leaf.dtype} has no torch storage class")
    z = tz.ZipWriter(fh)
    z.add("data.pkl", tz.pickle_bytes(tz.TensorLeaf("0", leaf.dtype, leaf.shape, leaf.numel)))
    z.add("byteorder", b"little")
    z.begin("data/0", leaf.nbytes)
    copier.copy(leaf, z.write)
    z.end()
    z.add("version", b"3\n")
    length = z.finish()
    index = tz.Obj(
        DCP_MODULE,
        "MetadataIndex",
        {"fqn": fqn, "offset": _size((0,) * len(leaf.shape)), "index": 0},
    )
    return _tensor_md(leaf), index, length
