"""Sources read as data: torch zip archives, safetensors files and DCP folders -> `Loaded`.

Nothing is unpickled: torch archives go through `formats.filechecks.scan_zip` (the opcode-level
reader `torchpickle`, the weights_only allow-list: a pickle naming ``os.system`` is refused before a
byte is written), safetensors headers are parsed as JSON and checked against the file size, and a
DCP `.metadata` is read with `torchpickle` too. Every problem is one `UsageError` line.
"""

from __future__ import annotations

import os
from typing import Any

from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats.torchfile import WEIGHT_KEYS
from checkpoint_strategy.formats import tensors as ts
from checkpoint_strategy.formats import safepickle as tp
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
        out: dict = {}
        for k, v in obj.items():
            if _plain_key(k):
                out[k] = plain(v, resolve, depth + 1)
            else:   # a key no target can carry: kept as a named left-out entry, never dropped silently
                out[f"<{_kind(k)} key>#{len(out)}"] = Unsupported(f"kept under a {_kind(k)} key, which no target "
                                                                   "writes")
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


def _plain_key(k: Any, depth: int = 0) -> bool:
    """A dict key torch.load(weights_only=True) gives back as itself: str, int, float, bool, None, or a tuple
    of them."""
    if isinstance(k, tuple):
        return depth < 20 and all(_plain_key(x, depth + 1) for x in k)
    return isinstance(k, (str, int, float, bool, type(None)))


def _kind(k: Any) -> str:
    if isinstance(k, tp.Call):
        return f"pickled {tp.shown(str(k.name), 60)}"
    if isinstance(k, tp.Global):
        return tp.shown(k.qualname, 60)
    return type(k).__name__


def swap_width(dtype: str) -> int:
    """Bytes per swapped unit of a big-endian tensor (torch's byteswap: a complex number's two halves apart)."""
    item = tp.DTYPE_SIZE.get(dtype, 1)
    return item // 2 if dtype.startswith("complex") else item


def byteorder(fh: Any, z: fc.ZipScan, where: str) -> str:
    """The archive's `byteorder` record ("little" when there is none, as torch.load assumes on this machine), once
    its `version` and `byteorder` records pass the validator's own check of them (filechecks.record_findings:
    a version torch.load reads, an endianness it knows)."""
    problems = fc.record_findings(fh, z, zr.Counter())
    if problems:
        raise _refuse(where, str(problems[0]))
    e = z.entry(f"{z.prefix}byteorder")
    return "little" if e is None else "big" if zr.read_entry(fh, e, zr.Counter(), limit=1 << 10) == b"big" \
        else "little"


def _zip_tensor(path: str, z: fc.ZipScan, base: int, name: str, t: tp.TensorRef, order: str = "little") -> Tensor:
    out = Tensor(name, t.dtype, tuple(t.shape))
    if order == "big" and swap_width(t.dtype) > 1:
        out.swap = swap_width(t.dtype)
    e = z.entry(f"{z.prefix}data/{t.storage.key}")
    item = tp.DTYPE_SIZE.get(t.dtype)
    if item is None or t.dtype not in tp.DTYPE_SIZE:
        out.problem = f"dtype {t.dtype} is not one this converter writes"
    elif e is None:
        out.problem = f"its storage data/{t.storage.key} is missing from the archive"
    elif e.method != 0:
        out.problem = f"its storage data/{t.storage.key} is compressed (torch.save stores entries uncompressed)"
    elif t.numel and not t.contiguous():   # a zero-size tensor has no bytes to lay out
        out.problem = (f"it is a non-contiguous view (shape {list(t.shape)}, stride {list(t.stride)}): save "
                       "it with .contiguous() first")
    elif (t.offset + t.numel) * item > e.usize:
        out.problem = f"its view runs past the end of its storage data/{t.storage.key}"
    elif t.numel:
        out.pieces.append(Piece(path, base + e.data_start + t.offset * item, 0, t.numel * item))
    return out


def read_zip(path: str, shown_as: str | None = None, verify: bool = True) -> Loaded:
    """A torch.save archive (pytorch_model.bin, *.pt, Lightning .ckpt, DeepSpeed model states)."""
    from checkpoint_strategy.storage import ReadError, open_regular

    # full: the CRC-32 of every entry, so only verified bytes are copied (verify=False: a destination read back,
    # compared byte for byte with the verified source instead)
    z = fc.scan_zip(path, zr.Counter(), full=verify)
    if z.findings:
        raise _refuse(shown_as or path, str(z.findings[0]))
    if z.pickle is None:
        raise _refuse(shown_as or path, "no data.pkl read")
    try:
        with open_regular(path, "checkpoint") as fh:
            order = byteorder(fh, z, shown_as or path)
    except (OSError, ReadError) as exc:
        raise _refuse(shown_as or path, getattr(exc, "reason", None) or str(exc)) from None
    names: dict[int, str] = {id(t): n for n, t in tp.walk_tensors(z.pickle.root)}
    tree = plain(z.pickle.root, lambda t: _zip_tensor(path, z, 0, names.get(id(t), "?"), t, order))
    fmt = "lightning" if isinstance(tree, dict) and "pytorch-lightning_version" in tree else "torch"
    notes = [f"{os.path.basename(path)}: big-endian (byteorder record \"big\"): every value byte-swapped to "
             "little-endian, as torch.load reads it"] if order == "big" else []
    return Loaded(fmt, tree, notes=notes, weights_key=_weights_key(tree), byteorder=order)


def _weights_key(tree: Any) -> str | None:
    if not isinstance(tree, dict):
        return None
    for key in WEIGHT_KEYS:
        sub = tree.get(key)
        if isinstance(sub, dict) and any(isinstance(v, Tensor) for v in sub.values()):
            return key
    return None


def read_zips(paths: list[str], folder: str, verify: bool = True) -> Loaded:
    """Several torch archives of one state dict (pytorch_model-0000N-of-0000M.bin): merged, flat."""
    if len(paths) == 1:
        return read_zip(paths[0], verify=verify)
    tree: dict = {}
    notes: list[str] = []
    for p in paths:
        part = read_zip(p, verify=verify)
        notes += part.notes
        if not isinstance(part.tree, dict):
            raise _refuse(p, "is not a state dict (a mapping of names to tensors)")
        for k, v in part.tree.items():
            if k in tree:
                raise _refuse(p, f"tensor {tp.shown(str(k))} is also in another shard")
            tree[k] = v
    return Loaded("torch", tree, notes=notes)


# --------------------------------------------------------------------------- safetensors

def read_safetensors(path: str) -> dict[str, Tensor]:
    """One safetensors file: its tensors as pieces (the header checked against the file first)."""
    reasons = fc.check_safetensors(path, zr.Counter())
    if reasons:
        raise _refuse(path, str(reasons[0]))
    got = zr.safetensors_header(path)
    if got is None:
        raise _refuse(path, "cannot read the safetensors header")
    header, data_start = got
    out: dict[str, Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = Tensor(name, ts.safetensors_dtype(info["dtype"]), tuple(info["shape"]))
        if end > begin:
            t.pieces.append(Piece(path, data_start + begin, 0, end - begin))
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
        within(os.path.dirname(index_path), f, index_path)
    return files


# --------------------------------------------------------------------------- DCP folders

class Outside(UsageError):
    """A file or folder a source names that resolves outside the source folder."""


def within(folder: str, rel: str, named_by: str) -> str:
    """folder/rel, refused when it resolves outside the source folder (a symbolic link out of it): the one rule
    for every file a source's own index, tag or metadata names (DCP's storage files, a sharded index's shards,
    a ZeRO `latest` tag and its rank files)."""
    from checkpoint_strategy.storage import inside

    path = os.path.join(folder, rel)
    if not inside(path, folder):
        raise Outside(f"{named_by}: {tp.shown(rel)} resolves outside the source folder (a symbolic link): not read; "
                      "give the folder or file it links to as SRC")
    return path


def _inside_file(folder: str, rel: Any) -> str:
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
        raise _refuse(os.path.join(folder, ".metadata"), f"a storage entry points outside the folder "
                                                         f"({tp.shown(str(rel))})")
    return within(folder, rel, os.path.join(folder, ".metadata"))


#: most dimensions a tensor of a DCP .metadata may have (torch allows 64)
MAX_DIMS = 64
_DCP = "torch.distributed.checkpoint."
#: the globals a DCP .metadata names (torch 2.13's dcp.save), besides torch dtypes: any other name (a flipped
#: letter of a class name) is one dcp.load cannot unpickle
DCP_GLOBALS = frozenset({
    *(f"{_DCP}metadata.{n}" for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                      "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                                      "_MEM_FORMAT_ENCODING", "StorageMeta")),
    f"{_DCP}filesystem._StorageInfo", "torch.Size", "torch.serialization._get_layout", "collections.OrderedDict",
    "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib.Path"})


def _read_metadata(folder: str) -> tp.PickleScan:
    from checkpoint_strategy.storage import read_bytes

    meta = os.path.join(folder, ".metadata")
    data = read_bytes(meta, "DCP .metadata", limit=fc.MAX_DCP_METADATA)
    held = _data_bytes_in(folder)
    if len(data) > (1 << 20) + 4 * held:
        # every chunk of a .metadata names bytes of a data file (an archive of ~600 bytes at least): a .metadata
        # four times the size of every other file of the folder describes chunks the files cannot hold
        raise _refuse(meta, f"{len(data)} bytes describe data the folder's other files ({held} bytes) cannot hold: "
                            "not read")
    framing = _framing(data)
    if framing:
        raise _refuse(meta, f"{framing}: dcp.load cannot unpickle it")
    scan = tp.read_pickle(data)
    found = fc.pickle_findings(scan, ".metadata", dcp=True)
    if found:
        raise _refuse(meta, str(found[0]))
    odd = [g for g in scan.globals if g not in DCP_GLOBALS and not (g.startswith("torch.") and g[6:] in tp.DTYPE_SIZE)]
    if odd:
        raise _refuse(meta, f"names {tp.shown(odd[0], 80)}, not a class or dtype a DCP .metadata holds: dcp.load "
                            "cannot read it")
    bad = _odd_call(scan.root)
    if bad:
        raise _refuse(meta, f"{bad}: dcp.load cannot read it")
    return scan


def _framing(data: bytes) -> str | None:
    """The pickle's protocol and frames as Python's unpickler takes them: protocol at most 5, and from protocol 4 on
    FRAME records (opcode 0x95, an 8-byte length) that chain from byte 2 to the end: dcp.save pickles its
    Metadata in frames that follow each other (only a string or bytes value of 64 KB or more goes unframed, which
    no .metadata holds)."""
    if data[:1] != b"\x80" or len(data) < 2:
        return None   # protocol 0/1: no PROTO, no frames (the symbolic read decides)
    if data[1] > 5:
        return f"pickle protocol {data[1]}: Python reads 0-5"
    at = 2
    while data[1] >= 4 and at < len(data) and data[at] == 0x95:
        if at + 9 > len(data):
            return "a FRAME record cut short"
        at += 9 + int.from_bytes(data[at + 1:at + 9], "little")
    if data[1] >= 4 and at != len(data):
        return f"its FRAME lengths end at byte {clip(at, 30)}, the pickle at {len(data)}"
    return None


#: DCP's classes pickled with their __dict__ as state (TensorProperties pickles a 5-tuple)
_STATE_IS_TUPLE = f"{_DCP}metadata.TensorProperties"
_MEM_FORMATS = {0, 1, 2}


def _odd_call(root: Any) -> str | None:
    """The first object built from something that is not a class (a flipped memo index), or a tensor layout
    other than torch.strided; None when there is none. Iterative, each object once."""
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
                return f"tensor layout {clip(obj.args, 40)}, not torch.strided"
            odd = _odd_state(obj)
            if odd:
                return odd
            todo += [obj.state, *obj.args, *obj.items.keys(), *obj.items.values(), *obj.listitems]
        elif isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple)):
            todo += obj
    return None


def _data_bytes_in(folder: str) -> int:
    total = 0
    with os.scandir(folder) as it:
        for e in it:
            if e.name != ".metadata" and e.is_file(follow_symlinks=False):
                total += e.stat(follow_symlinks=False).st_size
    return total


class _Chunks:
    """Locates DCP entries: each chunk an embedded torch archive or raw bytes at (file, offset, length)."""

    def __init__(self, folder: str, verify: bool = True) -> None:
        from checkpoint_strategy.convert.pieces import Files

        self.folder = folder
        self.verify = verify
        self.files = Files()
        self.notes: list[str] = []

    def locate(self, fqn: str, info: tuple) -> tuple[str, int, int]:
        rel, off, length, transformed = info
        if transformed:
            raise _refuse(os.path.join(self.folder, ".metadata"), f"entry {tp.shown(fqn)} is transformed "
                                                                 "(compressed or encrypted): not converted")
        path = _inside_file(self.folder, rel)
        size = os.fstat(self.files.get(path).fileno()).st_size
        if type(off) is not int or type(length) is not int or off < 0 or length < 0 or off + length > size:
            raise _refuse(path, f"entry {tp.shown(fqn)} needs bytes {clip(off)}..{clip(off)}+{clip(length)}, the file "
                                f"holds {size}: truncated")
        return path, off, length

    def embedded(self, path: str, fqn: str, off: int, length: int) -> tuple[fc.ZipScan, str]:
        """The torch archive at [off, off+length) of path, every entry's CRC-32 checked, and its byte order."""
        win = zr.Window(self.files.get(path), off, length)
        z = fc.embedded_torch_zip(win, length)
        if isinstance(z, str):
            raise _refuse(path, f"entry {tp.shown(fqn)}: {z}")
        for e in z.entries if self.verify else ():
            reason = zr.crc_entry(win, e, zr.Counter())
            if reason:
                raise _refuse(path, f"entry {tp.shown(fqn)}: {reason}")
        return z, byteorder(win, z, f"{path}: entry {tp.shown(fqn)}")

    def chunk(self, fqn: str, dtype: str, sizes: tuple, info: tuple) -> tuple[str, int, int]:
        """(file, byte offset of the chunk's first element, byte-swap width), its bytes contiguous and row-major."""
        path, off, length = self.locate(fqn, info)
        fh = self.files.get(path)
        fh.seek(off)
        item = tp.DTYPE_SIZE.get(dtype, 1)
        numel = ts._prod(sizes)
        if fh.read(4) != b"PK\x03\x04":
            if length != numel * item:
                raise _refuse(path, f"entry {tp.shown(fqn)}: {length} bytes, {dtype}{clip(list(sizes))} needs "
                                    f"{numel * item}")
            return path, off, 0
        z, order = self.embedded(path, fqn, off, length)
        refs = list(tp.walk_tensors(z.pickle.root if z.pickle else None))
        if len(refs) != 1:
            raise _refuse(path, f"entry {tp.shown(fqn)} holds {len(refs)} tensors, one expected")
        t = _zip_tensor(path, z, off, fqn, refs[0][1], order)
        if t.problem or t.dtype != dtype or tuple(t.shape) != tuple(sizes):
            raise _refuse(path, f"entry {tp.shown(fqn)}: {t.problem or f'holds {t.dtype}{clip(list(t.shape))}, .metadata says {dtype}{clip(list(sizes))}'}")
        return path, (t.pieces[0].src if t.pieces else off), t.swap

    def value(self, fqn: str, info: tuple) -> Any:
        """A non-tensor entry (torch.save of a Python value) as plain data, or Unsupported."""
        path, off, length = self.locate(fqn, info)
        fh = self.files.get(path)
        fh.seek(off)
        if fh.read(4) != b"PK\x03\x04":   # dcp.save writes every value with torch.save; dcp.load torch.loads it
            raise _refuse(path, f"entry {tp.shown(fqn)} is not a torch archive at byte {off}: dcp.load cannot read it")
        z, _order = self.embedded(path, fqn, off, length)
        return plain(z.pickle.root if z.pickle else None, lambda t: Unsupported("a tensor inside a bytes entry"))


def clip(v: Any, limit: int = 80) -> str:
    """A value from checkpoint content as printed in a one-line error: at most `limit` characters."""
    text = str(v)
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text)} characters)"


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




def _set(root: dict, path: tuple, value: Any, where: str) -> None:
    """torch.distributed.checkpoint's set_element: str keys make dicts, int keys make lists. Refused: a path
    through a value that is not a container, or to a place another entry holds."""
    cur: Any = root
    for prev, key in zip(path, path[1:], strict=False):
        default: Any = {} if isinstance(key, str) else []
        if isinstance(cur, dict):
            cur = cur.setdefault(prev, default)
        elif isinstance(cur, list) and isinstance(prev, int):
            while len(cur) <= prev:
                cur.append(None)
            if cur[prev] is None:
                cur[prev] = default
            cur = cur[prev]
        else:
            break
        if not isinstance(cur, (dict, list)):
            break
    else:
        last = path[-1]
        if isinstance(cur, list) and isinstance(last, int):
            while len(cur) <= last:
                cur.append(None)
        if isinstance(cur, (dict, list)) and (isinstance(cur, dict) or isinstance(last, int)):
            if (last in cur if isinstance(cur, dict) else cur[last] is not None):
                raise _refuse(where, f"planner_data puts two entries at {clip(list(path))}")
            cur[last] = value
            return
    raise _refuse(where, f"planner_data path {clip(list(path))} nests under a value that is not a mapping or list")


def _dims(v: Any) -> tuple | None:
    if isinstance(v, (tuple, list)) and len(v) <= MAX_DIMS and all(type(d) is int and d >= 0 for d in v):
        return tuple(v)
    return None


def _odd_state(obj: tp.Call) -> str | None:
    """A DCP class whose state dcp.load's unpickling refuses: not a dict (TensorProperties: not its 5-tuple of
    dtype, layout, requires_grad, memory format, pin_memory), or a memory format enum value it does not know."""
    name = obj.name
    if name.endswith("._MEM_FORMAT_ENCODING"):
        ok = len(obj.args) == 1 and type(obj.args[0]) is int and obj.args[0] in _MEM_FORMATS
        return None if ok else f"memory format {clip(obj.args, 40)} is not one _MEM_FORMAT_ENCODING holds"
    if not name.startswith(_DCP) or obj.state is None:
        return None
    if name != _STATE_IS_TUPLE:
        return None if isinstance(obj.state, dict) else f"a {name.rsplit('.', 1)[-1]} whose state is not a mapping"
    st = obj.state
    ok = (isinstance(st, tuple) and len(st) == 5 and isinstance(st[0], tp.Global) and isinstance(st[1], tp.Call)
          and st[1].name == "torch.serialization._get_layout" and type(st[2]) is bool and isinstance(st[3], tp.Call)
          and st[3].name.endswith("._MEM_FORMAT_ENCODING") and type(st[4]) is bool)
    return None if ok else "a TensorProperties that is not (dtype, layout, requires_grad, memory format, pin_memory)"


def _tensor_md(fqn: str, md: Any, where: str) -> tuple[str, str, tuple, list[tuple[tuple, tuple]]] | None:
    """(fqn, dtype, size, [(offsets, sizes)]) of one TensorStorageMetadata; None for a bytes entry."""
    if not (isinstance(md, tp.Call) and md.name.endswith("TensorStorageMetadata")):
        return None
    st = md.state if isinstance(md.state, dict) else {}
    props = tp.state_of(st.get("properties"))
    first = props[0] if isinstance(props, tuple) and props else props.get("dtype") if isinstance(props, dict) else None
    size = _dims(st.get("size"))
    chunks = st.get("chunks")
    if not isinstance(first, tp.Global) or size is None or not isinstance(chunks, list):
        raise _refuse(where, f"entry {tp.shown(fqn)}: its tensor metadata (dtype, size, chunks) does not parse")
    boxes = []
    for c in chunks:
        cs = tp.state_of(c)
        offsets = _dims(cs.get("offsets")) if isinstance(cs, dict) else None
        sizes = _dims(cs.get("sizes")) if isinstance(cs, dict) else None
        if offsets is None or sizes is None or len(offsets) != len(size) or len(sizes) != len(size):
            raise _refuse(where, f"entry {tp.shown(fqn)}: a chunk without {len(size)} offsets and sizes")
        boxes.append((offsets, sizes))
    return fqn, first.name, size, boxes


def _storage(meta: tp.PickleScan) -> dict[tuple, tuple[str, Any, Any, bool]]:
    """(fqn, chunk offsets or None) -> (relative_path, offset, length, transformed)."""
    state = tp.state_of(meta.root)
    sd = state.get("storage_data") if isinstance(state, dict) else None
    out: dict[tuple, tuple[str, Any, Any, bool]] = {}
    for idx, info in (sd.items() if isinstance(sd, dict) else ()):
        i, s = tp.state_of(idx), tp.state_of(info)
        if isinstance(i, dict) and isinstance(s, dict) and isinstance(s.get("relative_path"), str) and isinstance(
                i.get("fqn"), str):
            off = i.get("offset")
            out[(i["fqn"], _dims(off) if off is not None else None)] = (
                s["relative_path"], s.get("offset"), s.get("length"), bool(s.get("transform_descriptors")))
    return out


def _listing(meta: tp.PickleScan, where: str) -> tuple[list, dict, dict, dict]:
    """(tensor entries, storage map, planner_data, state_dict_metadata), refused when it describes more chunks
    than the storage entries, or chunk bytes than the data files hold."""
    state = tp.state_of(meta.root)
    sdm = state.get("state_dict_metadata") if isinstance(state, dict) else None
    if not isinstance(sdm, dict):
        raise _refuse(where, "no state_dict_metadata: not a DCP .metadata")
    listed = []
    for fqn, md in sdm.items():
        if not isinstance(fqn, str):
            raise _refuse(where, f"an entry named by a {type(fqn).__name__}, not a string")
        got = _tensor_md(fqn, md, where)
        if got is not None:
            listed.append(got)
    storage = _storage(meta)
    chunks = sum(len(boxes) for *_x, boxes in listed)
    held = sum(1 for _fqn, offsets in storage if offsets is not None)
    if chunks > held:
        raise _refuse(where, f"{chunks} tensor chunks, {held} tensor storage entries: chunks without data")
    planner = state.get("planner_data")
    return listed, storage, planner if isinstance(planner, dict) else {}, sdm


def _check_bytes(folder: str, listed: list, storage: dict) -> None:
    """The chunks' bytes fit in the data files they name (before a piece is made)."""
    files = {info[0] for info in storage.values()}
    held = sum(os.path.getsize(_inside_file(folder, rel)) for rel in files)
    need = sum(ts._prod(sizes) * tp.DTYPE_SIZE.get(dtype, 1) for _f, dtype, _s, boxes in listed for _o, sizes in boxes)
    if need > held:
        raise _refuse(os.path.join(folder, ".metadata"), f"its chunks need {need} bytes, the data files hold {held}: "
                                                         "truncated or not this checkpoint's .metadata")


def read_dcp(folder: str, verify: bool = True) -> Loaded:
    """A DCP folder of any world size: every tensor assembled from its chunks (pieces), every bytes
    entry read as plain data, nested by the .metadata's planner_data as dcp_to_torch_save does."""
    where = os.path.join(folder, ".metadata")
    listed, storage, planner, sdm = _listing(_read_metadata(folder), where)
    chunks = _Chunks(folder, verify)
    tree: dict = {}
    try:
        _check_bytes(folder, listed, storage)
        done = set()
        for fqn, dtype, size, boxes in listed:
            done.add(fqn)
            _set(tree, _path(planner, fqn, len(sdm), where), _dcp_tensor(chunks, storage, fqn, dtype, size, boxes),
                 where)
        for fqn in sdm:
            if fqn in done:
                continue
            info = storage.get((fqn, None))
            if info is None:   # dcp.load looks it up and fails (KeyError)
                raise _refuse(where, f"entry {tp.shown(fqn)} has no storage entry: dcp.load cannot read it")
            _set(tree, _path(planner, fqn, len(sdm), where), chunks.value(fqn, info), where)
    except OSError as exc:
        from checkpoint_strategy.storage import oserror_line

        raise UsageError(oserror_line(exc, "read", exc.filename or folder)) from None
    finally:
        chunks.files.close()
    return Loaded("dcp", tree, notes=chunks.notes, weights_key="model" if isinstance(tree.get("model"), dict) else None)


def _path(planner: dict, fqn: str, entries: int, where: str) -> tuple:
    """planner_data's path of an entry; a list index at most the number of entries (every list item dcp.save
    flattens is an entry of its own), so no index makes a list bigger than the .metadata describes."""
    p = planner.get(fqn)
    if p is None:
        return (fqn,)
    if not isinstance(p, (tuple, list)) or not p or not all(
            isinstance(x, str) or (type(x) is int and 0 <= x < entries) for x in p) or len(p) > 200:
        raise _refuse(where, f"planner_data of {tp.shown(fqn)} is {clip(p)}: not a path of names and list indexes "
                             f"below {entries}")
    if ".".join(map(str, p)) != fqn:   # dcp.load names each entry by its path again
        raise _refuse(where, f"planner_data puts {tp.shown(fqn, 80)} at {clip(list(p))}, which dcp.load names "
                             "otherwise: the entry would be missing")
    return tuple(p)


def _dcp_tensor(chunks: _Chunks, storage: dict, fqn: str, dtype: str, size: tuple, boxes: list) -> Tensor:
    t = Tensor(fqn, dtype, tuple(size))
    if dtype not in tp.DTYPE_SIZE:
        t.problem = f"dtype {dtype} is not one this converter writes"
        return t
    item = tp.DTYPE_SIZE[dtype]
    where = os.path.join(chunks.folder, ".metadata")
    swaps = set()
    for offsets, sizes in boxes:
        info = storage.get((fqn, tuple(offsets)))
        if info is None:
            raise _refuse(where, f"chunk {clip(list(offsets))} of {tp.shown(fqn)} has no storage entry")
        if any(o + s > d for o, s, d in zip(offsets, sizes, size, strict=True)):
            raise _refuse(where, f"chunk {clip(list(offsets))} of {tp.shown(fqn)} lies outside its {clip(list(size))} "
                                 "tensor")
        if ts._prod(sizes) == 0:
            continue
        path, base, swap = chunks.chunk(fqn, dtype, tuple(sizes), info)
        swaps.add(swap)
        for src, dst, n in runs(tuple(size), tuple(offsets), tuple(sizes), item):
            t.pieces.append(Piece(path, base + src, dst, n))
    if len(swaps) > 1:
        raise _refuse(where, f"the chunks of {tp.shown(fqn)} mix big- and little-endian archives")
    t.swap = swaps.pop() if swaps else 0
    if t.swap and not chunks.notes:
        chunks.notes.append("big-endian chunks (byteorder record \"big\"): byte-swapped to little-endian, as "
                            "torch.load reads them")
    t.check_tiling()
    return t
