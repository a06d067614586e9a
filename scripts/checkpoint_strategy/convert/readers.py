"""Sources read as data: torch zip archives, safetensors files and DCP folders -> `Loaded`.

Nothing is unpickled: torch archives go through `checkpoints.filechecks.scan_zip` (the opcode-level
reader `torchpickle`, the weights_only allow-list: a pickle naming ``os.system`` is refused before a
byte is written), safetensors headers are parsed as JSON and checked against the file size, and a
DCP `.metadata` is read with `torchpickle` too. Every problem is one `UsageError` line.
"""

from __future__ import annotations

import os
import struct
from typing import Any

from checkpoint_strategy.checkpoints import deep
from checkpoint_strategy.checkpoints import filechecks as fc
from checkpoint_strategy.checkpoints.framework_layouts import WEIGHT_KEYS
from checkpoint_strategy.checkpoints import tensorscan as ts
from checkpoint_strategy.checkpoints import torchpickle as tp
from checkpoint_strategy.convert.pieces import Loaded, Piece, Tensor, Unsupported
from checkpoint_strategy.errors import UsageError

_PLAIN = (str, int, float, bool, bytes, type(None))


def _refuse(path: str, reason: str) -> UsageError:
    return UsageError(f"{path}: {reason}")


# --------------------------------------------------------------------------- torch zip archives

def plain(obj: Any, resolve: Any, depth: int = 0) -> Any:  # noqa: C901 - one branch per symbolic kind
    """A pickle tree read by torchpickle as plain data: TensorRef -> resolve(ref), OrderedDict -> dict,
    any other object -> Unsupported (named, left out)."""
    if depth > 200:
        return Unsupported("nested more than 200 levels")
    if isinstance(obj, tp.TensorRef):
        return resolve(obj)
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(k, (str, int)) and not isinstance(k, bool):
                out[k] = plain(v, resolve, depth + 1)
        return out
    if isinstance(obj, list):
        return [plain(v, resolve, depth + 1) for v in obj]
    if isinstance(obj, tuple):
        return tuple(plain(v, resolve, depth + 1) for v in obj)
    if isinstance(obj, tp.Call) and obj.name == "collections.OrderedDict":
        return plain(obj.items, resolve, depth + 1)
    if isinstance(obj, tp.Global):
        return Unsupported(obj.qualname)
    if isinstance(obj, tp.Call):
        return Unsupported(f"a pickled {obj.name} object")
    return Unsupported(type(obj).__name__)


def _zip_tensor(path: str, z: fc.ZipScan, base: int, name: str, t: tp.TensorRef) -> Tensor:
    out = Tensor(name, t.dtype, tuple(t.shape))
    e = z.entry(f"{z.prefix}data/{t.storage.key}")
    item = tp.DTYPE_SIZE.get(t.dtype)
    if item is None or t.dtype not in tp.DTYPE_SIZE:
        out.problem = f"dtype {t.dtype} is not one this converter writes"
    elif e is None:
        out.problem = f"its storage data/{t.storage.key} is missing from the archive"
    elif e.method != 0:
        out.problem = f"its storage data/{t.storage.key} is compressed (torch.save stores entries uncompressed)"
    elif not t.contiguous():
        out.problem = (f"it is a non-contiguous view (shape {list(t.shape)}, stride {list(t.stride)}): save "
                       "it with .contiguous() first")
    elif (t.offset + t.numel) * item > e.usize:
        out.problem = f"its view runs past the end of its storage data/{t.storage.key}"
    elif t.numel:
        out.pieces.append(Piece(path, base + e.data_start + t.offset * item, 0, t.numel * item))
    return out


def read_zip(path: str, shown_as: str | None = None) -> Loaded:
    """A torch.save archive (pytorch_model.bin, *.pt, Lightning .ckpt, DeepSpeed model states)."""
    z = fc.scan_zip(path, fc.Counter())
    if z.findings:
        raise _refuse(shown_as or path, str(z.findings[0]))
    if z.pickle is None:
        raise _refuse(shown_as or path, "no data.pkl read")
    names: dict[int, str] = {id(t): n for n, t in tp.walk_tensors(z.pickle.root)}
    tree = plain(z.pickle.root, lambda t: _zip_tensor(path, z, 0, names.get(id(t), "?"), t))
    fmt = "lightning" if isinstance(tree, dict) and "pytorch-lightning_version" in tree else "torch"
    return Loaded(fmt, tree, weights_key=_weights_key(tree))


def _weights_key(tree: Any) -> str | None:
    if not isinstance(tree, dict):
        return None
    for key in WEIGHT_KEYS:
        sub = tree.get(key)
        if isinstance(sub, dict) and any(isinstance(v, Tensor) for v in sub.values()):
            return key
    return None


def read_zips(paths: list[str], folder: str) -> Loaded:
    """Several torch archives of one state dict (pytorch_model-0000N-of-0000M.bin): merged, flat."""
    if len(paths) == 1:
        return read_zip(paths[0])
    tree: dict = {}
    for p in paths:
        part = read_zip(p)
        if not isinstance(part.tree, dict):
            raise _refuse(p, "is not a state dict (a mapping of names to tensors)")
        for k, v in part.tree.items():
            if k in tree:
                raise _refuse(p, f"tensor {tp.shown(str(k))} is also in another shard")
            tree[k] = v
    return Loaded("torch", tree)


# --------------------------------------------------------------------------- safetensors

def read_safetensors(path: str) -> dict[str, Tensor]:
    """One safetensors file: its tensors as pieces (the header checked against the file first)."""
    from checkpoint_strategy.storage import ReadError, loads_json, open_regular

    reasons = fc.check_safetensors(path, fc.Counter())
    if reasons:
        raise _refuse(path, str(reasons[0]))
    try:
        with open_regular(path, "safetensors file") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            header = loads_json(fh.read(hlen), "safetensors header", expect=dict)
    except (OSError, ReadError, struct.error) as exc:
        raise _refuse(path, getattr(exc, "reason", None) or str(exc)) from None
    out: dict[str, Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = Tensor(name, ts.safetensors_dtype(info["dtype"]), tuple(info["shape"]))
        if end > begin:
            t.pieces.append(Piece(path, 8 + hlen + begin, 0, end - begin))
        out[name] = t
    return out


def read_safetensors_set(folder: str, files: list[str]) -> Loaded:
    tree: dict = {}
    for f in files:
        for name, t in read_safetensors(os.path.join(folder, f)).items():
            if name in tree:
                raise _refuse(os.path.join(folder, f), f"tensor {tp.shown(name)} is also in another shard")
            tree[name] = t
    return Loaded("safetensors", tree)


def index_files(index_path: str) -> list[str]:
    """The shard files a model.safetensors.index.json (or pytorch_model.bin.index.json) names, in order."""
    from checkpoint_strategy.storage import read_json

    data = read_json(index_path, "index file", expect=dict)
    wm = data.get("weight_map")
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise _refuse(index_path, "has no weight_map of tensor names to file names")
    files = list(dict.fromkeys(wm.values()))
    for f in files:
        if os.path.isabs(f) or "/" in f or "\\" in f or f in ("", ".", ".."):
            raise _refuse(index_path, f"names file {tp.shown(f)}, outside its folder")
    return files


# --------------------------------------------------------------------------- DCP folders

def _inside_file(folder: str, rel: Any) -> str:
    from checkpoint_strategy.storage import inside

    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
        raise _refuse(os.path.join(folder, ".metadata"), f"a storage entry points outside the folder "
                                                         f"({tp.shown(str(rel))})")
    path = os.path.join(folder, rel)
    if not inside(path, folder):
        raise _refuse(os.path.join(folder, ".metadata"), f"storage file {tp.shown(rel)} resolves outside the folder "
                                                         "(a symbolic link)")
    return path


def _read_metadata(folder: str) -> tp.PickleScan:
    from checkpoint_strategy.storage import read_bytes

    meta = os.path.join(folder, ".metadata")
    data = read_bytes(meta, "DCP .metadata", limit=fc.MAX_DCP_METADATA)
    scan = tp.read_pickle(data)
    found = fc.pickle_findings(scan, ".metadata", dcp=True)
    if found:
        raise _refuse(meta, str(found[0]))
    return scan


class _Chunks:
    """Locates DCP entries: each chunk an embedded torch archive or raw bytes at (file, offset, length)."""

    def __init__(self, folder: str) -> None:
        from checkpoint_strategy.convert.pieces import Files

        self.folder = folder
        self.files = Files()

    def locate(self, fqn: str, info: tuple) -> tuple[str, int, int]:
        rel, off, length, transformed = info
        if transformed:
            raise _refuse(os.path.join(self.folder, ".metadata"), f"entry {tp.shown(fqn)} is transformed "
                                                                 "(compressed or encrypted): not converted")
        path = _inside_file(self.folder, rel)
        size = os.fstat(self.files.get(path).fileno()).st_size
        if type(off) is not int or type(length) is not int or off < 0 or length < 0 or off + length > size:
            raise _refuse(path, f"entry {tp.shown(fqn)} needs bytes {off}..{off}+{length}, the file holds {size}: "
                                "truncated")
        return path, off, length

    def chunk(self, fqn: str, dtype: str, sizes: tuple, info: tuple) -> tuple[str, int]:
        """(file, byte offset) of a chunk's first element, its bytes contiguous and row-major."""
        path, off, length = self.locate(fqn, info)
        fh = self.files.get(path)
        fh.seek(off)
        item = tp.DTYPE_SIZE.get(dtype, 1)
        numel = ts._prod(sizes)
        if fh.read(4) != b"PK\x03\x04":
            if length != numel * item:
                raise _refuse(path, f"entry {tp.shown(fqn)}: {length} bytes, {dtype}{list(sizes)} needs {numel * item}")
            return path, off
        z = deep.embedded_zip(deep.Window(fh, off, length), length)
        if isinstance(z, str):
            raise _refuse(path, f"entry {tp.shown(fqn)}: {z}")
        refs = list(tp.walk_tensors(z.pickle.root if z.pickle else None))
        if len(refs) != 1:
            raise _refuse(path, f"entry {tp.shown(fqn)} holds {len(refs)} tensors, one expected")
        t = _zip_tensor(path, z, off, fqn, refs[0][1])
        if t.problem or t.dtype != dtype or tuple(t.shape) != tuple(sizes):
            raise _refuse(path, f"entry {tp.shown(fqn)}: {t.problem or f'holds {t.dtype}{list(t.shape)}, .metadata says {dtype}{list(sizes)}'}")
        return path, (t.pieces[0].src if t.pieces else off)

    def value(self, fqn: str, info: tuple) -> Any:
        """A non-tensor entry (torch.save of a Python value) as plain data, or Unsupported."""
        path, off, length = self.locate(fqn, info)
        fh = self.files.get(path)
        fh.seek(off)
        if fh.read(4) != b"PK\x03\x04":
            return Unsupported("a non-tensor entry that is not a torch archive")
        z = deep.embedded_zip(deep.Window(fh, off, length), length)
        if isinstance(z, str):
            raise _refuse(path, f"entry {tp.shown(fqn)}: {z}")
        return plain(z.pickle.root if z.pickle else None, lambda t: Unsupported("a tensor inside a bytes entry"))


def runs(full: tuple, offsets: tuple, sizes: tuple, item: int) -> list[tuple[int, int, int]]:
    """(byte offset in the chunk, byte offset in the full tensor, bytes) of each contiguous run of a
    chunk (a box `offsets` + `sizes` of a row-major tensor of shape `full`)."""
    n = len(full)
    j = n - 1
    while j > 0 and sizes[j] == full[j] and offsets[j] == 0:
        j -= 1
    inner = item
    for d in full[j + 1:]:
        inner *= d
    run = sizes[j] * inner if n else item
    strides = [0] * n
    acc = item
    for d in range(n - 1, -1, -1):
        strides[d] = acc
        acc *= full[d]
    out = []
    count = 1
    for d in sizes[:j]:
        count *= d
    for flat in range(count):
        idx, rest = [], flat
        for d in reversed(sizes[:j]):
            idx.append(rest % d)
            rest //= d
        idx.reverse()
        dst = sum((offsets[d] + idx[d]) * strides[d] for d in range(j)) + (offsets[j] * strides[j] if n else 0)
        out.append((flat * run, dst, run))
    return out


def _set(root: dict, path: tuple, value: Any) -> None:
    """torch.distributed.checkpoint's set_element: str keys make dicts, int keys make lists."""
    cur: Any = root
    for prev, key in zip(path, path[1:], strict=False):
        default: Any = {} if isinstance(key, str) else []
        if isinstance(cur, dict):
            cur = cur.setdefault(prev, default)
        else:
            while len(cur) <= prev:
                cur.append(None)
            if cur[prev] is None:
                cur[prev] = default
            cur = cur[prev]
    last = path[-1]
    if isinstance(cur, list):
        while len(cur) <= last:
            cur.append(None)
    cur[last] = value


def read_dcp(folder: str) -> Loaded:
    """A DCP folder of any world size: every tensor assembled from its chunks (pieces), every bytes
    entry read as plain data, nested by the .metadata's planner_data as dcp_to_torch_save does."""
    meta = _read_metadata(folder)
    listed = deep.dcp_tensors(meta)
    if listed is None:
        raise _refuse(os.path.join(folder, ".metadata"), "no state_dict_metadata: not a DCP .metadata")
    storage = deep.dcp_storage(meta)
    state = tp.state_of(meta.root)
    planner = state.get("planner_data") if isinstance(state, dict) else None
    planner = planner if isinstance(planner, dict) else {}
    sdm = state.get("state_dict_metadata") if isinstance(state, dict) else None
    sdm = sdm if isinstance(sdm, dict) else {}
    chunks = _Chunks(folder)
    tree: dict = {}
    try:
        done = set()
        for fqn, dtype, size, boxes in listed:
            done.add(fqn)
            _set(tree, _path(planner, fqn), _dcp_tensor(chunks, storage, fqn, dtype, size, boxes))
        for fqn in sdm:
            if fqn in done or not isinstance(fqn, str):
                continue
            info = storage.get((fqn, None))
            value = chunks.value(fqn, info) if info else Unsupported("no storage entry")
            _set(tree, _path(planner, fqn), value)
    finally:
        chunks.files.close()
    return Loaded("dcp", tree, weights_key="model" if isinstance(tree.get("model"), dict) else None)


def _path(planner: dict, fqn: str) -> tuple:
    p = planner.get(fqn)
    if isinstance(p, (tuple, list)) and p and all(isinstance(x, (str, int)) for x in p):
        return tuple(p)
    return (fqn,)


def _dcp_tensor(chunks: _Chunks, storage: dict, fqn: str, dtype: str, size: tuple, boxes: list) -> Tensor:
    t = Tensor(fqn, dtype, tuple(size))
    if dtype not in tp.DTYPE_SIZE:
        t.problem = f"dtype {dtype} is not one this converter writes"
        return t
    item = tp.DTYPE_SIZE[dtype]
    for offsets, sizes in boxes:
        info = storage.get((fqn, tuple(offsets)))
        if info is None:
            raise _refuse(os.path.join(chunks.folder, ".metadata"), f"chunk {list(offsets)} of {tp.shown(fqn)} "
                                                                   "has no storage entry")
        if len(offsets) != len(size) or len(sizes) != len(size) or any(
                o + s > d for o, s, d in zip(offsets, sizes, size, strict=False)):
            raise _refuse(os.path.join(chunks.folder, ".metadata"), f"chunk {list(offsets)} of {tp.shown(fqn)} "
                                                                   f"lies outside its {list(size)} tensor")
        if ts._prod(sizes) == 0:
            continue
        path, base = chunks.chunk(fqn, dtype, tuple(sizes), info)
        for src, dst, n in runs(tuple(size), tuple(offsets), tuple(sizes), item):
            t.pieces.append(Piece(path, base + src, dst, n))
    t.check_tiling()
    return t
