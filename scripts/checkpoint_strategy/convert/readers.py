"""Sources read as data: torch zip archives, safetensors files and DCP folders -> `Loaded`.

Nothing is unpickled: torch archives go through `formats.filechecks.scan_zip` (the opcode-level
reader `torchpickle`, the weights_only allow-list: a pickle naming ``os.system`` is refused before a
byte is written), safetensors headers are parsed as JSON and checked against the file size, and a
DCP `.metadata` is read with `torchpickle` too. Every problem is one `UsageError` line.
"""

from __future__ import annotations

import os
from typing import Any

from checkpoint_strategy.convert.pieces import Loaded, Piece, Tensor, Unsupported
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import dcp
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.formats import tensors as ts
from checkpoint_strategy.formats.models import DcpItem
from checkpoint_strategy.formats.torchfile import WEIGHT_KEYS

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
            else:  # a key no target can carry: kept as a named left-out entry, never dropped silently
                out[f"<{_kind(k)} key>#{len(out)}"] = Unsupported(
                    f"kept under a {_kind(k)} key, which no target writes"
                )
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
    return (
        "little"
        if e is None
        else "big"
        if zr.read_entry(fh, e, zr.Counter(), limit=1 << 10) == b"big"
        else "little"
    )


def _zip_tensor(
    path: str, z: fc.ZipScan, base: int, name: str, t: tp.TensorRef, order: str = "little"
) -> Tensor:
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
    elif t.numel and not t.contiguous():  # a zero-size tensor has no bytes to lay out
        out.problem = (
            f"it is a non-contiguous view (shape {list(t.shape)}, stride {list(t.stride)}): save "
            "it with .contiguous() first"
        )
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
    notes = (
        [
            f'{os.path.basename(path)}: big-endian (byteorder record "big"): every value byte-swapped to '
            "little-endian, as torch.load reads it"
        ]
        if order == "big"
        else []
    )
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
                raise _refuse(
                    os.path.join(folder, f), f"tensor {tp.shown(name)} is also in another shard"
                )
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
        raise Outside(
            f"{named_by}: {tp.shown(rel)} resolves outside the source folder (a symbolic link): not read; "
            "give the folder or file it links to as SRC"
        )
    return path


def _inside_file(folder: str, rel: Any) -> str:
    if (
        not isinstance(rel, str)
        or not rel
        or os.path.isabs(rel)
        or ".." in rel.replace("\\", "/").split("/")
    ):
        raise _refuse(
            os.path.join(folder, ".metadata"),
            f"a storage entry points outside the folder ({tp.shown(str(rel))})",
        )
    return within(folder, rel, os.path.join(folder, ".metadata"))


#: most dimensions a tensor of a DCP .metadata may have (torch allows 64)
MAX_DIMS = 64


def _read_metadata(folder: str) -> tp.PickleScan:
    from checkpoint_strategy.storage import read_bytes

    meta = os.path.join(folder, ".metadata")
    data = read_bytes(meta, "DCP .metadata", limit=fc.MAX_DCP_METADATA)
    held = _data_bytes_in(folder)
    if dcp.dcp_metadata_oversized(len(data), held):
        # every chunk of a .metadata names bytes of a data file (an archive of ~600 bytes at least): a .metadata
        # four times the size of every other file of the folder describes chunks the files cannot hold
        raise _refuse(
            meta,
            f"{len(data)} bytes describe data the folder's other files ({held} bytes) cannot hold: "
            "not read",
        )
    framing = tp.frame_refusal(data)
    if framing:
        raise _refuse(meta, f"broken .metadata: {framing} (dcp.load cannot unpickle it)")
    scan = tp.read_pickle(data)
    found = fc.pickle_findings(scan, ".metadata", dcp=True)
    if found:
        raise _refuse(meta, str(found[0]))
    return scan


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

    def locate(self, it: DcpItem) -> tuple[str, int, int]:
        if it.transformed:
            raise _refuse(
                os.path.join(self.folder, ".metadata"),
                f"entry {tp.shown(it.fqn)} is transformed (compressed or encrypted): not converted",
            )
        path = _inside_file(self.folder, it.rel)
        size = os.fstat(self.files.get(path).fileno()).st_size
        if it.offset + it.length > size:
            raise _refuse(
                path,
                f"entry {tp.shown(it.fqn)} needs bytes {clip(it.offset)}..{clip(it.offset)}+"
                f"{clip(it.length)}, the file holds {size}: truncated",
            )
        return path, it.offset, it.length

    def embedded(self, path: str, fqn: str, off: int, length: int) -> tuple[fc.ZipScan, str]:
        """The torch archive at [off, off+length) of path, every entry's CRC-32 checked, and its byte order."""
        fh = self.files.get(path)
        z = fc.scan_embedded_zip(fh, off, length, zr.Counter(), crc=self.verify)
        if z.findings:
            raise _refuse(path, f"entry {tp.shown(fqn)}: {z.findings[0]}")
        return z, byteorder(zr.Window(fh, off, length), z, f"{path}: entry {tp.shown(fqn)}")

    def chunk(self, it: DcpItem) -> tuple[str, int, int]:
        """(file, byte offset of the chunk's first element, byte-swap width), its bytes contiguous and row-major."""
        fqn, dtype, sizes = it.fqn, it.dtype or "", it.sizes or ()
        path, off, length = self.locate(it)
        fh = self.files.get(path)
        fh.seek(off)
        item = tp.DTYPE_SIZE.get(dtype, 1)
        numel = ts._prod(sizes)
        if fh.read(4) != b"PK\x03\x04":
            if length != numel * item:
                raise _refuse(
                    path,
                    f"entry {tp.shown(fqn)}: {length} bytes, {dtype}{clip(list(sizes))} needs "
                    f"{numel * item}",
                )
            return path, off, 0
        z, order = self.embedded(path, fqn, off, length)
        refs = list(tp.walk_tensors(z.pickle.root if z.pickle else None))
        if len(refs) != 1:
            raise _refuse(path, f"entry {tp.shown(fqn)} holds {len(refs)} tensors, one expected")
        t = _zip_tensor(path, z, off, fqn, refs[0][1], order)
        if t.problem or t.dtype != dtype or tuple(t.shape) != tuple(sizes):
            raise _refuse(
                path,
                f"entry {tp.shown(fqn)}: {t.problem or f'holds {t.dtype}{clip(list(t.shape))}, .metadata says {dtype}{clip(list(sizes))}'}",
            )
        return path, (t.pieces[0].src if t.pieces else off), t.swap

    def value(self, it: DcpItem) -> Any:
        """A non-tensor entry (torch.save of a Python value) as plain data, or Unsupported."""
        fqn = it.fqn
        path, off, length = self.locate(it)
        fh = self.files.get(path)
        fh.seek(off)
        if (
            fh.read(4) != b"PK\x03\x04"
        ):  # dcp.save writes every value with torch.save; dcp.load torch.loads it
            raise _refuse(
                path,
                f"entry {tp.shown(fqn)} is not a torch archive at byte {off}: dcp.load cannot read it",
            )
        z, _order = self.embedded(path, fqn, off, length)
        return plain(
            z.pickle.root if z.pickle else None,
            lambda t: Unsupported("a tensor inside a bytes entry"),
        )


def clip(v: Any, limit: int = 80) -> str:
    """A value from checkpoint content as printed in a one-line error: at most `limit` characters."""
    text = str(v)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


def runs(full: tuple, offsets: tuple, sizes: tuple, item: int) -> list[tuple[int, int, int]]:
    """(byte offset in the chunk, byte offset in the full tensor, bytes) of each contiguous run of a
    chunk (a box `offsets` + `sizes` of a row-major tensor of shape `full`)."""
    n = len(full)
    j = n - 1
    while j > 0 and sizes[j] == full[j] and offsets[j] == 0:
        j -= 1
    inner = item
    for d in full[j + 1 :]:
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
        dst = sum((offsets[d] + idx[d]) * strides[d] for d in range(j)) + (
            offsets[j] * strides[j] if n else 0
        )
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
            if last in cur if isinstance(cur, dict) else cur[last] is not None:
                raise _refuse(where, f"planner_data puts two entries at {clip(list(path))}")
            cur[last] = value
            return
    raise _refuse(
        where,
        f"planner_data path {clip(list(path))} nests under a value that is not a mapping or list",
    )


def _check_bytes(folder: str, md: dcp.DcpMetadata) -> None:
    """The chunks' bytes fit in the data files they name (before a piece is made)."""
    where = os.path.join(folder, ".metadata")
    for t in md.tensors:
        if len(t.size) > MAX_DIMS:
            raise _refuse(
                where, f"entry {tp.shown(t.fqn)}: {len(t.size)} dimensions, torch allows {MAX_DIMS}"
            )
    files = set(md.needed)
    held = sum(os.path.getsize(_inside_file(folder, rel)) for rel in files)
    need = sum(
        ts._prod(c.sizes or ()) * tp.DTYPE_SIZE.get(t.dtype, 1)
        for t in md.tensors
        for c in t.chunks
    )
    if need > held:
        raise _refuse(
            where,
            f"its chunks need {need} bytes, the data files hold {held}: truncated or not this "
            "checkpoint's .metadata",
        )


def read_dcp(folder: str, verify: bool = True) -> Loaded:
    """A DCP folder of any world size: every tensor assembled from its chunks (pieces), every bytes
    entry read as plain data, nested by the .metadata's planner_data as dcp_to_torch_save does. The .metadata is
    read by formats/dcp.py (`dcp_metadata`), the one DCP reader."""
    where = os.path.join(folder, ".metadata")
    try:
        md = dcp.dcp_metadata(_read_metadata(folder))
    except dcp.DcpBroken as exc:
        raise _refuse(where, f"broken .metadata: {exc}") from None
    chunks = _Chunks(folder, verify)
    tree: dict = {}
    try:
        _check_bytes(folder, md)
        for t in md.tensors:
            _set(tree, md.planner.get(t.fqn, (t.fqn,)), _dcp_tensor(chunks, t), where)
        for fqn, it in md.values.items():
            _set(tree, md.planner.get(fqn, (fqn,)), chunks.value(it), where)
    except OSError as exc:
        from checkpoint_strategy.storage import oserror_line

        raise UsageError(oserror_line(exc, "read", exc.filename or folder)) from None
    finally:
        chunks.files.close()
    return Loaded(
        "dcp",
        tree,
        notes=chunks.notes,
        weights_key="model" if isinstance(tree.get("model"), dict) else None,
    )


def _dcp_tensor(chunks: _Chunks, md: dcp.DcpTensor) -> Tensor:
    fqn, size = md.fqn, md.size
    t = Tensor(fqn, md.dtype, tuple(size))
    item = tp.DTYPE_SIZE[md.dtype]  # dcp_metadata takes only the dtypes DTYPE_SIZE holds
    where = os.path.join(chunks.folder, ".metadata")
    swaps = set()
    for c in md.chunks:
        offsets, sizes = c.offsets or (), c.sizes or ()
        if ts._prod(sizes) == 0:
            continue
        path, base, swap = chunks.chunk(c)
        swaps.add(swap)
        for src, dst, n in runs(tuple(size), tuple(offsets), tuple(sizes), item):
            t.pieces.append(Piece(path, base + src, dst, n))
    if len(swaps) > 1:
        raise _refuse(where, f"the chunks of {tp.shown(fqn)} mix big- and little-endian archives")
    t.swap = swaps.pop() if swaps else 0
    if t.swap and not chunks.notes:
        chunks.notes.append(
            'big-endian chunks (byteorder record "big"): byte-swapped to little-endian, as '
            "torch.load reads them"
        )
    t.check_tiling()
    return t
