"""Orbax (orbax-checkpoint 0.12, tensorstore): everything the package knows of its checkpoints.

- names: ``N/`` or ``prefix_N/`` with ``_CHECKPOINT_METADATA`` or ``commit_success.txt``; an unfinished save is
  ``N.orbax-checkpoint-tmp-*``; a soft-deleted step sits under the manager's ``todelete_subdir`` (formats/identify.py
  tells them);
- the checker (`CHECKERS`): the step's commit record, every item's ``_METADATA`` tree, ``array_metadatas/*`` and
  ``_sharding`` read the way a restore reads them, and at level full every OCDBT manifest and node (CRC-32C);
- the metadata readers below (``orbax_params``, ``orbax_array_metadatas``, ``orbax_sharding``, ``ocdbt_nodes``).

Checked against real saves made in tests/test_export_frameworks.py: ``<step>/<item>/_METADATA``:
``{"tree_metadata": {"('opt', 'mu')": {"key_metadata": [{"key": "opt", ...}, ...]}, ...}}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import struct
from collections.abc import Callable

from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats import zstd
from checkpoint_strategy.formats.base import Checker, Ctx, Layout, Refused, ls
from checkpoint_strategy.storage import ReadError, read_bytes


def _check_orbax(ctx: Ctx, found: fm.Found) -> Layout:
    path = found.path
    out = Layout(step=found.step)
    names = set(ls(path))
    if fm.ORBAX_TMP in os.path.basename(path):
        ctx.bad(path, "in-flight Orbax temporary folder (save not finalised)", "incomplete")
        return out
    _check_orbax_commit(ctx, path, names)
    items = sorted(n for n in names if os.path.isdir(os.path.join(path, n)))
    if not items:
        ctx.missing(os.path.join(path, "default"), "checkpoint items (e.g. default/, state/)")
    for item in items:
        if _check_orbax_folder(ctx, os.path.join(path, item)):
            out.resumable = True
    if ctx.deep:
        ctx.counter.notes.append(
            "Orbax/tensorstore arrays: values not checked at level deep (zarr/OCDBT chunks)"
        )
    out.sharded, out.portability = True, "orbax"
    return out


def _check_orbax_commit(ctx: Ctx, path: str, names: set[str]) -> None:
    """The step's commit: _CHECKPOINT_METADATA with its timestamp, or commit_success.txt (required when the other
    steps have one: ctx.want_commit)."""
    if "_CHECKPOINT_METADATA" in names:
        meta = ctx.json(os.path.join(path, "_CHECKPOINT_METADATA"))
        if isinstance(meta, dict) and meta.get("commit_timestamp_nsecs", 1) is None:
            ctx.bad(
                os.path.join(path, "_CHECKPOINT_METADATA"),
                "no commit timestamp: save not finalised",
                "incomplete",
            )
    elif "commit_success.txt" not in names:
        ctx.missing(
            os.path.join(path, "_CHECKPOINT_METADATA"), "_CHECKPOINT_METADATA / commit_success.txt"
        )
    if ctx.want_commit and "commit_success.txt" not in names:
        ctx.missing(
            os.path.join(path, "commit_success.txt"),
            "commit marker commit_success.txt (the other steps have one; the save did not finish)",
        )


def _check_orbax_folder(ctx: Ctx, ip: str) -> bool:
    """One item folder of an Orbax step: its JSON documents, manifest and (at full) data files, then the item as
    its restore reads it. True when it holds training state: its _METADATA tree has optimizer state, or its name
    says so (opt..., state, train_state)."""
    item = os.path.basename(ip)
    inner = ls(ip)
    if not inner:
        ctx.missing(ip, f"contents of item {item}/")
        return False
    docs: dict[str, object] = {}
    optimizer = "opt" in item.lower() or item in ("state", "train_state")
    for n in inner:
        p = os.path.join(ip, n)
        if n in ("_METADATA", "_sharding") or n.endswith(".json"):
            meta = docs[n] = ctx.json(p)
            optimizer = optimizer or (n == "_METADATA" and orbax_item_has_optimizer(meta))
        elif n == "manifest.ocdbt":
            _check_ocdbt(ctx, p, manifest=True)
        elif ctx.reads(p) and os.path.isfile(p):
            ctx.readable(p)
    _check_orbax_item(ctx, ip, inner, docs)
    return optimizer


def _check_orbax_item(ctx: Ctx, ip: str, inner: list[str], docs: dict[str, object]) -> None:
    """An Orbax item as its restore reads it: the _METADATA tree, array_metadatas/* and _sharding naming its values
    with the same shapes (every level: these files are read anyway); at full, every OCDBT manifest and node
    (CRC-32C) under d/ and ocdbt.process_*/."""
    meta = os.path.join(ip, "_METADATA")
    params = orbax_params(docs.get("_METADATA"))
    if isinstance(params, Refused):
        ctx.bad(meta, f"Orbax cannot restore from it: {params.reason}")
    if "array_metadatas" in inner:
        for n in ls(os.path.join(ip, "array_metadatas")):
            doc = ctx.json(os.path.join(ip, "array_metadatas", n))
            reason = (
                orbax_array_metadatas(doc, params)
                if isinstance(params, dict) and doc is not None
                else None
            )
            if reason:
                ctx.bad(
                    os.path.join(ip, "array_metadatas", n),
                    f"Orbax cannot restore from it: {reason}",
                )
    reason = (
        orbax_sharding(docs["_sharding"], params)
        if isinstance(params, dict) and docs.get("_sharding") is not None
        else None
    )
    if reason:
        ctx.bad(os.path.join(ip, "_sharding"), f"Orbax cannot restore from it: {reason}")
    if not ctx.full:
        return
    for sub in [ip] + [os.path.join(ip, n) for n in inner if n.startswith("ocdbt.process_")]:
        if sub != ip and "manifest.ocdbt" in ls(sub):
            _check_ocdbt(ctx, os.path.join(sub, "manifest.ocdbt"), manifest=True)
        for n in ls(os.path.join(sub, "d")):
            _check_ocdbt(ctx, os.path.join(sub, "d", n), manifest=False)


def _check_ocdbt(ctx: Ctx, path: str, manifest: bool) -> None:
    """One OCDBT file at full (its nodes' CRC-32C, ocdbt_nodes); a file too big to hold is read through."""
    if not ctx.reads(path):
        if manifest:
            ctx.readable(path)
        return
    try:
        data = read_bytes(path, "OCDBT file", limit=MAX_OCDBT_NODE)
    except ReadError:
        ctx.readable(path)  # a big data file (array values), or unreadable: readable() words it
        return
    ctx.counter.files += 1
    ctx.counter.bytes_read += len(data)
    reason = ocdbt_nodes(data, manifest)
    if reason:
        ctx.bad(path, reason)
    ctx._tick()


_OPTIMIZER_KEY = re.compile(r"^(opt|opt_state|optimizer|optimizer_state|optim|optim_state)$", re.I)


def orbax_item_has_optimizer(metadata: object) -> bool:
    """True when an Orbax item's _METADATA tree has a top-level optimizer-state key."""
    if not isinstance(metadata, dict):
        return False
    tree = metadata.get("tree_metadata")
    if not isinstance(tree, dict):
        return False
    for entry in tree.values():
        keys = entry.get("key_metadata") if isinstance(entry, dict) else None
        if isinstance(keys, list) and keys and isinstance(keys[0], dict):
            first = keys[0].get("key")
            if isinstance(first, str) and _OPTIMIZER_KEY.match(first):
                return True
    return False


#: the value types Orbax's type handlers and empty values write in _METADATA (orbax.checkpoint _src/serialization,
#: _src/metadata/empty_values.py); restore looks the handler up by this name
ORBAX_VALUE_TYPES = frozenset(
    {
        "jax.Array",
        "np.ndarray",
        "scalar",
        "string",
        "None",
        "Dict",
        "List",
        "Tuple",
        "NamedTuple",
        "Unknown",
        "placeholder",
    }
)


ORBAX_KEY_TYPES = (1, 2)  # KeyType.SEQUENCE, KeyType.DICT


ORBAX_SHARDINGS = frozenset(
    {"SingleDeviceSharding", "NamedSharding", "PositionalSharding", "GSPMDSharding"}
)


#: an Orbax item's values: param name ('a.b') -> write_shape (None for a value without one)
OrbaxParams = dict[str, list[int] | None]


def orbax_params(metadata: object) -> OrbaxParams | Refused | None:
    """An item's _METADATA tree read the way Orbax restores it: its params; or the reason it cannot be restored from
    (a flipped byte that left it JSON); None for a tree in another layout than orbax-checkpoint 0.12's (entries
    keyed by their key_metadata): not judged."""
    if not isinstance(metadata, dict):
        return None
    tree = metadata.get("tree_metadata")
    modern = any(k in metadata for k in ("use_ocdbt", "use_zarr3"))
    if not isinstance(tree, dict):
        return Refused("no tree_metadata object") if modern else None
    if not modern and not any(isinstance(e, dict) and "key_metadata" in e for e in tree.values()):
        return None
    for key in ("use_ocdbt", "use_zarr3", "store_array_data_equal_to_fill_value"):
        if key in metadata and type(metadata[key]) is not bool:
            return Refused(f"{key} is not true or false")
    params: OrbaxParams = {}
    for name, entry in tree.items():
        got = _orbax_entry(name, entry)
        if isinstance(got, Refused):
            return got
        params[got[0]] = got[1]
    return params


def _orbax_entry(name: str, entry: object) -> tuple[str, list[int] | None] | Refused:
    """One tree_metadata entry: (its param name, its write_shape), or why Orbax cannot restore it."""
    keys = entry.get("key_metadata") if isinstance(entry, dict) else None
    value = entry.get("value_metadata") if isinstance(entry, dict) else None
    if not isinstance(keys, list) or not keys or not isinstance(value, dict):
        return Refused(f"entry {name!r} has no key_metadata list and value_metadata object")
    parts = []
    for k in keys:
        if not (
            isinstance(k, dict)
            and isinstance(k.get("key"), str)
            and k.get("key_type") in ORBAX_KEY_TYPES
            and type(k.get("key_type")) is int
        ):
            return Refused(f"entry {name!r} has a key that is not a name with key_type 1 or 2")
        if k["key_type"] == 1 and not k["key"].isdigit():
            return Refused(f"entry {name!r} has a sequence key {k['key']!r} that is not an index")
        parts.append(k["key"])
    if name != str(tuple(parts)):
        return Refused(f"entry {name!r} does not match its keys {parts}")
    if value.get("value_type") not in ORBAX_VALUE_TYPES:
        return Refused(f"entry {name!r} has an unknown value_type {value.get('value_type')!r}")
    if type(value.get("skip_deserialize")) is not bool:
        return Refused(f"entry {name!r}: skip_deserialize is not true or false")
    shape = value.get("write_shape")
    if shape is not None and not (
        isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
    ):
        return Refused(f"entry {name!r} has an invalid write_shape")
    return ".".join(parts), shape


def orbax_array_metadatas(doc: object, params: OrbaxParams) -> str | None:
    """array_metadatas/process_N against the tree: each names a param of the tree, with its write_shape and a
    chunk_shape that fits in it; the reason it does not, or None."""
    entries = doc.get("array_metadatas") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        return "no array_metadatas list"
    for e in entries:
        am = e.get("array_metadata") if isinstance(e, dict) else None
        name = am.get("param_name") if isinstance(am, dict) else None
        if not isinstance(am, dict) or not isinstance(name, str) or name not in params:
            return f"names {name!r}, not a value of the tree in _METADATA"
        write, chunk = am.get("write_shape"), am.get("chunk_shape")
        if params[name] is not None and write != params[name]:
            return f"write_shape of {name!r} is {write}, _METADATA says {params[name]}"
        if not (
            isinstance(chunk, list)
            and isinstance(write, list)
            and len(chunk) == len(write)
            and all(
                type(c) is int and 0 < c <= max(w, 1) for c, w in zip(chunk, write, strict=True)
            )
        ):
            return f"chunk_shape of {name!r} does not fit its write_shape"
    return None


def orbax_sharding(doc: object, params: OrbaxParams) -> str | None:
    """_sharding: base64 of each param name -> the JSON of its sharding (a type Orbax knows); the reason it does
    not hold, or None."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    for key, value in doc.items():
        try:
            name = base64.b64decode(key.encode("ascii"), validate=True).decode("utf-8")
            spec = json.loads(value) if isinstance(value, str) else None
        except (binascii.Error, UnicodeError, ValueError):
            return f"key {key!r} is not the base64 of a value name, or its sharding is not JSON"
        if name not in params:
            return f"names {name!r}, not a value of the tree in _METADATA"
        if not (isinstance(spec, dict) and spec.get("sharding_type") in ORBAX_SHARDINGS):
            return f"the sharding of {name!r} is not one Orbax knows"
        if spec["sharding_type"] == "SingleDeviceSharding" and not (
            isinstance(spec.get("device_str"), str) and _ORBAX_DEVICE.match(spec["device_str"])
        ):
            return f"the sharding of {name!r} names no device jax knows (device_str)"
    return None


#: a jax device as SingleDeviceSharding records it (platform:id); which ids exist is the restoring host's business
_ORBAX_DEVICE = re.compile(r"^(cpu|gpu|cuda|rocm|tpu|METAL|neuron):\d+$")


_OCDBT_MAGIC = b"\x0c\xdb"


_CRC32C_TABLE: list[int] = []


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), the checksum tensorstore's OCDBT puts at the end of every manifest and node (table
    driven: OCDBT nodes are small; array values are not checksummed and are not read through this)."""
    table = _CRC32C_TABLE
    if not table:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            table.append(c)
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


MAX_OCDBT_NODE = 64 << 20


def ocdbt_nodes(data: bytes, manifest: bool) -> str | None:
    """The OCDBT nodes of a file (tensorstore: 4-byte magic 0x0cdb...., 8-byte length of the whole node, ...,
    CRC-32C of the bytes before it): every one whole and with its checksum. A manifest is one node that is the whole
    file. A data file holds nodes and array values; values compressed by Orbax's zarr3 zstd codec (zstd frames) are
    walked frame by frame (`zstd_frame_end`: headers and block structure; each frame decoded when the optional
    zstandard is installed, formats/zstd.py) to reach the nodes after them. Other bytes (uncompressed values) end the walk. The reason, or None."""
    pos = 0
    while (
        pos + 16 <= len(data)
        and data.startswith(_OCDBT_MAGIC, pos)
        or data.startswith(_ZSTD_MAGIC, pos)
    ):
        if data.startswith(_ZSTD_MAGIC, pos) and not manifest:
            end = zstd_frame_end(data, pos)
            if isinstance(end, str):
                return f"the zstd frame of array values at byte {pos}: {end}"
            decoded = _zstd_decodes(
                data, pos, end
            )  # (with the optional zstandard: formats/zstd.py)
            if decoded:
                return f"the zstd frame of array values at byte {pos}: {decoded}"
            pos = end
            if pos < len(data) and not data.startswith((_OCDBT_MAGIC, _ZSTD_MAGIC), pos):
                return f"bytes at {pos}, after a zstd frame of array values, are neither a frame nor an OCDBT node"
            continue
        if data.startswith(_ZSTD_MAGIC, pos):
            break
        (length,) = struct.unpack_from("<Q", data, pos + 4)
        if length < 16 or pos + length > len(data) or length > MAX_OCDBT_NODE:
            return f"an OCDBT node at byte {pos} declares {length} bytes, the file holds {len(data) - pos}: truncated?"
        (stored,) = struct.unpack_from("<I", data, pos + length - 4)
        if crc32c(data[pos : pos + length - 4]) != stored:
            return f"the OCDBT node at byte {pos}: CRC-32C mismatch (data corrupted)"
        pos += length
        if manifest:
            break
    if manifest and pos != len(data):
        return "not one whole OCDBT manifest (bad magic, length or trailing bytes)"
    if pos == 0 and not manifest:
        return _damaged_zstd_magic(data) if len(data) > 16 else "too short for OCDBT data"
    return None


def _damaged_zstd_magic(data: bytes) -> str | None:
    """A data file that starts one bit off the zstd magic and walks as a whole zstd frame from there: the magic of
    its first frame flipped (uncompressed values start so by chance 32 times in 2**32, and then no frame follows)."""
    off = int.from_bytes(data[:4], "little") ^ int.from_bytes(_ZSTD_MAGIC, "little")
    if off & (off - 1):
        return None
    end = zstd_frame_end(data, 0)  # (the walk reads the header after the magic, not the magic)
    if isinstance(end, int) and (
        end == len(data) or data.startswith((_OCDBT_MAGIC, _ZSTD_MAGIC), end)
    ):
        return "the zstd frame of array values at byte 0: its magic number has a flipped bit"
    return None


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


ZSTD_MAX_BLOCK = 128 << 10


def _zstd_header(data: bytes, pos: int) -> tuple[int, int, int, bool] | str:
    """(where the first block starts, the largest block size allowed, the declared content size or -1, content
    checksum present) of the zstd frame at pos (RFC 8878 3.1.1.1), or what is wrong with its header."""
    if pos + 6 > len(data):
        return "truncated header"
    fhd = data[pos + 4]
    if fhd & 0x08:
        return "reserved bit set in the frame header"
    single = bool(fhd & 0x20)
    fcs_size = (0, 2, 4, 8)[fhd >> 6] or (1 if single else 0)
    did_size = (0, 1, 2, 4)[fhd & 0x03]
    at = pos + 5
    window = 0
    if not single:
        wd = data[at]
        base = 1 << (10 + (wd >> 3))
        window = base + (base // 8) * (wd & 7)
        at += 1
    at += did_size
    if at + fcs_size > len(data):
        return "truncated header"
    content = (
        int.from_bytes(data[at : at + fcs_size], "little") + (256 if fcs_size == 2 else 0)
        if fcs_size
        else -1
    )
    window = window if not single else content
    return at + fcs_size, min(max(window, 1), ZSTD_MAX_BLOCK), content, bool(fhd & 0x04)


def zstd_frame_end(data: bytes, pos: int) -> int | str:
    """Where the zstd frame at pos ends, walking its blocks (3-byte headers: last flag, type raw/RLE/compressed,
    size within the frame's block maximum), or what is wrong: a reserved bit or block type, a block past the end of
    the file. The compressed blocks are not decoded here (`_zstd_decodes` does, with the optional zstandard): without
    it a flip inside one is the blind spot docs/checkpoints.md names."""
    header = _zstd_header(data, pos)
    if isinstance(header, str):
        return header
    at, largest, content, checksum = header
    blocks = 0
    while True:
        if at + 3 > len(data):
            return f"truncated: no block header at byte {at}"
        word = int.from_bytes(data[at : at + 3], "little")
        kind, size = (word >> 1) & 3, word >> 3
        if kind == 3:
            return f"reserved block type at byte {at}"
        if size > largest:
            return f"a block of {size} bytes at byte {at}, over the frame's maximum of {largest}"
        at += 3 + (1 if kind == 1 else size)
        blocks += 1
        if at > len(data):
            return f"truncated: a block runs past the end of the file ({len(data)} bytes)"
        if word & 1:
            break
    if content > blocks * largest:  # (each block regenerates at most the block maximum)
        return f"declares {content} bytes of content, more than its {blocks} blocks can hold"
    if not checksum:
        return at
    return at + 4 if at + 4 <= len(data) else "truncated content checksum"


def _zstd_decodes(data: bytes, pos: int, end: int) -> str | None:
    """What zstandard refuses of the walked frame data[pos:end] (None without the package): its output bounded
    by the declared content size and by what its blocks can regenerate (at least 4 bytes a block)."""
    header = _zstd_header(data, pos)
    declared = header[2] if not isinstance(header, str) else -1
    return zstd.frame_problem(data, pos, end, declared, ZSTD_MAX_BLOCK * max(1, (end - pos) // 4))


def soft_deleted_note(root: str, deleted: list[fm.Found]) -> str:
    where = sorted(
        {os.path.relpath(os.path.dirname(os.path.normpath(f.path)), root) for f in deleted}
    )
    steps = sorted(f.step for f in deleted if f.step is not None)
    shown_steps = ", ".join(map(str, steps[:5])) + (", ..." if len(steps) > 5 else "")
    return (
        f"{', '.join(w + '/' for w in where)}: {len(deleted)} Orbax step{'' if len(deleted) == 1 else 's'} "
        f"({shown_steps}) the CheckpointManager soft-deleted (its todelete_subdir): not checked, not resume "
        "points (prune and recover leave them out too)"
    )


def orbax_soft_deleted(found: list[fm.Found]) -> list[fm.Found]:
    """Orbax steps its CheckpointManager soft-deleted: with CheckpointManagerOptions(todelete_subdir="trash")
    a step it deletes is renamed to <directory>/trash/<step> (and left there), so an Orbax step whose folder
    sits one level below live Orbax steps is one of them. Not checkpoints to resume from or to count:
    `prune` and `recover` look only at the root's own entries and never see them."""
    orbax = [f for f in found if f.format == "orbax"]
    parents = {os.path.dirname(os.path.normpath(f.path)) for f in orbax}
    return [
        f for f in orbax if os.path.dirname(os.path.dirname(os.path.normpath(f.path))) in parents
    ]


def commit_marked(found: list[fm.Found], parent: str) -> bool:
    """An Orbax step beside others in `parent` carries commit_success.txt (then every step there must: the
    checker's ctx.want_commit)."""
    orbax = [f for f in found if f.format == "orbax" and os.path.dirname(f.path) == parent]
    return any(os.path.exists(os.path.join(f.path, "commit_success.txt")) for f in orbax)


CHECKERS: dict[str, Checker] = {"orbax": _check_orbax}
FOLDER_FORMATS: tuple[str, ...] = ("orbax",)
TRACKERS: dict[str, tuple[str, Callable[[str], str | None]]] = {}
