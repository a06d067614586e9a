"""`convert`: one checkpoint layout to another, streamed, checked tensor by tensor, renamed into place whole.

1. SRC is read as data (`readers`, `zero`): nothing unpickled, a pickle naming anything outside the
   weights_only allow-list is refused with its name.
2. What the target carries is selected: safetensors gets the weights (a Lightning ``state_dict``,
   a DCP ``model``, ZeRO's consolidated fp32 weights); full and dcp get the whole state.
3. The writer streams every tensor into a temporary folder next to DST (`.DST.convert-*`), hashing.
4. The check reads the written files back with the same readers and compares every source tensor
   (dtype, shape, sha256 of its bytes); only when it passes is the folder renamed to DST.
Any failure (bad input, a full disk, a failed check) removes the temporary folder: DST never holds
half a conversion.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from checkpoint_strategy.atomic import fsync_dir, write_temp
from checkpoint_strategy.convert import readers, writers, zero
from checkpoint_strategy.convert.models import (
    ConvertCheck,
    ConvertReport,
    OptimizerCompare,
    OutputFile,
    TensorRow,
)
from checkpoint_strategy.convert.pieces import (
    CHUNK,
    Files,
    Loaded,
    Tensor,
    same_bytes,
    sha256,
    tensors,
    unsupported,
    without_unsupported,
)
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.storage import inside, is_regular, open_regular, oserror_line, read_bytes

DEFAULT_SHARD = 5 * 10**9
#: the files next to Hugging Face weights that from_pretrained / AutoTokenizer read: copied with safetensors
HF_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "preprocessor_config.json",
)
TEXT_ROWS = 40
#: the file names of a --to full destination: what `validate` (and the printed next step) recognises
FULL_SUFFIXES = (".pt", ".pth", ".ckpt")
#: top-level entries of a flat full state (torchtitan: model FQNs at the top) that are not weights
NOT_WEIGHTS = (
    "optimizer",
    "optimizer_states",
    "optim",
    "lr_scheduler",
    "lr_schedulers",
    "scheduler",
    "dataloader",
    "train_state",
    "loops",
    "callbacks",
    "rng",
    "rng_state",
)


@dataclass
class Selection:
    tree: Any  # what the writer gets (safetensors: flat name -> Tensor)
    items: list[tuple[str, Tensor]]  # every source tensor the destination must hold
    tied: dict[str, str]  # left-out name -> the name holding its bytes
    selected: str | None
    left_out: list[str]


# --------------------------------------------------------------------------- reading SRC


def load(src: str, verify: bool = True) -> Loaded:
    """Any supported layout, found from its files. verify: the CRC-32 of every torch archive entry read (a
    source); off for a destination, compared byte for byte with the verified source."""
    if os.path.isdir(src):
        return _load_folder(src, verify)

    with open_regular(src, "checkpoint") as fh:
        magic = fh.read(4)
    if magic == b"PK\x03\x04":
        return readers.read_zip(src, verify=verify)
    if magic[:1] == b"\x80":
        raise UsageError(
            f"{src}: a legacy (before torch 1.6) torch.save file: not converted; re-save it with a "
            "current torch"
        )
    if src.endswith(".safetensors"):
        return readers.read_safetensors_set(os.path.dirname(src) or ".", [os.path.basename(src)])
    raise UsageError(f"{src}: not a torch zip archive (.bin/.pt/.ckpt) or a .safetensors file")


def _load_folder(src: str, verify: bool) -> Loaded:
    names = set(os.listdir(src))
    if ".metadata" in names:
        return readers.read_dcp(src, verify)
    if zero.is_zero_folder(src, names):
        return zero.read_zero(src)
    for index, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        if index in names:
            files = readers.index_files(os.path.join(src, index))
            if single.endswith(".safetensors"):
                return readers.read_safetensors_set(src, files)
            return readers.read_zips([os.path.join(src, f) for f in files], src, verify)
        if single in names:
            path = readers.within(src, single, src)
            if single.endswith(".safetensors"):
                return readers.read_safetensors_set(src, [single])
            return readers.read_zip(path, verify=verify)
    raise UsageError(
        f"{src}: no checkpoint found: expected a DCP folder (.metadata), a DeepSpeed ZeRO folder "
        "(*_optim_states.pt), model.safetensors[.index.json] or pytorch_model.bin[.index.json]"
    )


# --------------------------------------------------------------------------- what the target carries


def _subtree(tree: Any, key: str) -> Any:
    cur = tree
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise UsageError(
                f"--key {key}: no such entry in the source (top-level keys: "
                f"{', '.join(map(str, list(tree)[:12])) if isinstance(tree, dict) else 'none'})"
            )
        cur = cur[part]
    return cur


def select(loaded: Loaded, target: str, key: str | None, keep_tied: bool) -> Selection:
    left = [f"{name}: {what} (not plain data)" for name, what in unsupported(loaded.tree)]
    if target != "safetensors":
        tree = without_unsupported(loaded.tree)
        if loaded.extra_weights:
            tree = {
                "model": by_name(loaded.extra_weights),
                **(tree if isinstance(tree, dict) else {}),
            }
        if key:
            tree = _subtree(tree, key)
            if not isinstance(tree, dict):
                raise UsageError(
                    f"--key {key} is not a mapping of names: nothing to write as a state dict"
                )
        items = list(tensors(tree))
        _unique_names(items)
        return Selection(tree, items, {}, key, left)
    weights, chosen, skipped = _weights(loaded, key)
    left = [f"{name}: {what} (not plain data)" for name, what in unsupported(weights)]
    if skipped:
        left.append(
            f"{', '.join(skipped[:8])}{' ...' if len(skipped) > 8 else ''}: not weights (safetensors holds "
            "tensors only; --to full or --to dcp keeps them)"
        )
    items = list(tensors(weights))
    if not items:
        raise UsageError(
            "the source holds no tensors to write as safetensors"
            + (f" under {chosen}" if chosen else "")
        )
    flat, tied = _untie(items, keep_tied)
    return Selection(flat, items, tied, chosen, left)


def _weights(loaded: Loaded, key: str | None) -> tuple[Any, str | None, list[str]]:
    """(the weights subtree, what it is called, the top-level entries left out) for safetensors."""
    if loaded.extra_weights:
        return by_name(loaded.extra_weights), "consolidated fp32 weights", []
    chosen = key or loaded.weights_key
    tree = loaded.tree
    if not isinstance(tree, dict):
        return tree, chosen, []
    if chosen:
        return _subtree(tree, chosen), chosen, [str(k) for k in tree if k != chosen.split(".")[0]]
    return (
        {k: v for k, v in tree.items() if k not in NOT_WEIGHTS},
        None,
        [str(k) for k in tree if k in NOT_WEIGHTS],
    )


def by_name(weights: list[Tensor]) -> dict[str, Tensor]:
    """name -> tensor; two tensors of one name are refused by name (never one silently replacing the other)."""
    out: dict[str, Tensor] = {}
    for t in weights:
        if t.name in out:
            raise UsageError(
                f"two tensors are both named {tp.shown(t.name)} (a buffer or shared name that is also "
                "a parameter's): not converted, one would replace the other"
            )
        out[t.name] = t
    return out


def _unique_names(items: list[tuple[str, Tensor]]) -> None:
    """The check compares tensors by dotted name: two of one name (keys 1 and "1", "a.b" and a -> b) are refused."""
    seen: set[str] = set()
    for name, _t in items:
        if name in seen:
            raise UsageError(
                f"two tensors are both named {tp.shown(name)} once keys are joined with '.' (keys 1 and "
                "'1', or 'a.b' and a -> b): rename one, the check compares tensors by name"
            )
        seen.add(name)


def _untie(
    items: list[tuple[str, Tensor]], keep_tied: bool
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """name -> tensor with each tied group (same bytes, dtype and shape) kept once under its first name,
    and the names left out -> the name kept (safetensors forbids two names sharing bytes)."""
    flat: dict[str, Tensor] = {}
    tied: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in items:
        if name in flat or name in tied:
            raise UsageError(f"two tensors are both named {tp.shown(name)} once flattened")
        ak = t.alias_key()
        if ak is not None and ak in seen and not keep_tied:
            tied[name] = seen[ak]
            continue
        if ak is not None:
            seen.setdefault(ak, name)
        flat[name] = t
    return flat, tied


# --------------------------------------------------------------------------- the check


def _readback(path: str, target: str) -> Loaded:
    if target == "full":
        return readers.read_zip(path, verify=False)
    return load(path, verify=False)


def compare(
    sel: Selection, src_hash: dict[int, str], dst: Loaded, dst_sel: Selection, files: Files
) -> ConvertCheck:
    """Every source tensor against the destination: present, same dtype and shape, identical bytes (read back
    and compared chunk by chunk; stronger than comparing hashes, and cheaper than a second sha256 pass). The
    table's sha256 is the source bytes' (computed during the copy, or here on the way)."""
    bufs = (bytearray(CHUNK), bytearray(CHUNK))
    theirs = {n: t for n, t in dst_sel.items}
    rows: list[TensorRow] = []
    for name, t in sel.items:
        rows.append(_row(name, t, src_hash, sel.tied.get(name), theirs, files, bufs))
    mine_names = {n for n, _t in sel.items}
    extra = [n for n in theirs if n not in mine_names][:50]
    problems = sum(r.status not in ("equal", "tied") for r in rows)
    opt = _optimizer_compare(sel.tree, dst_sel.tree)
    ok = problems == 0 and not extra and (opt is None or opt.complete)
    return ConvertCheck(
        ok=ok,
        compared=len(rows),
        equal=sum(r.status == "equal" for r in rows),
        tied=sum(r.status == "tied" for r in rows),
        problems=problems,
        extra=extra,
        optimizer=opt,
        rows=rows,
    )


def _row(
    name: str,
    t: Tensor,
    src_hash: dict[int, str],
    twin: str | None,
    theirs: dict[str, Tensor],
    files: Files,
    bufs: tuple[bytearray, bytearray],
) -> TensorRow:
    def done(status: Any, detail: str = "") -> TensorRow:
        if id(t) not in src_hash:
            src_hash[id(t)] = sha256(t, files, memoryview(bufs[0]))
        return TensorRow(
            name=name,
            dtype=t.dtype,
            shape=list(t.shape),
            sha256=src_hash[id(t)],
            status=status,
            detail=detail,
        )

    other = theirs.get(twin or name)
    if other is None:
        return done("missing", f"its bytes are {twin}'s" if twin else "")
    if other.dtype != t.dtype:
        return done("dtype differs", other.dtype)
    if tuple(other.shape) != tuple(t.shape):
        return done("shape differs", str(list(other.shape)))
    h = hashlib.sha256() if id(t) not in src_hash else None
    if not same_bytes(t, other, files, bufs, h):
        return done("bytes differ", twin or "")
    if h is not None:
        src_hash[id(t)] = h.hexdigest()
    return done("tied" if twin else "equal", twin or "")


def _optimizer_states(tree: Any, depth: int = 0) -> list[dict]:
    if depth > 6:
        return []
    if isinstance(tree, dict):
        if isinstance(tree.get("state"), dict) and "param_groups" in tree:
            return [tree["state"]]
        return [s for v in tree.values() for s in _optimizer_states(v, depth + 1)]
    if isinstance(tree, list):
        return [s for v in tree for s in _optimizer_states(v, depth + 1)]
    return []


def _optimizer_compare(src: Any, dst: Any) -> OptimizerCompare | None:
    mine = _optimizer_states(src)
    if not mine:
        return None
    theirs = _optimizer_states(dst)
    params = sum(len(s) for s in mine)
    moments = steps = 0
    for a, b in zip(mine, theirs, strict=False):
        by_key = {str(k): v for k, v in b.items()}
        for k, v in a.items():
            got = by_key.get(str(k))
            if isinstance(got, dict) and isinstance(v, dict):
                # whatever moments the optimizer keeps (Adam's two, Lion's exp_avg, SGD's momentum_buffer,
                # Adafactor's factored rows and columns): every one the source holds is in the destination
                held = {str(m) for m in got}
                moments += all(str(m) in held for m in v if m != "step")
                steps += "step" in held or "step" not in v
    return OptimizerCompare(
        parameters=params,
        with_moments=moments,
        with_step=steps,
        complete=moments == params and steps == params,
    )


# --------------------------------------------------------------------------- paths and the temporary folder


def check_paths(src: str, dst: str, must_exist: bool) -> None:
    for what, path in (("source", src), ("destination", dst)):
        if "://" in path:
            raise UsageError(
                f"{what} {tp.shown(path, 120)}: convert reads and writes local files and folders only, "
                "not URLs: copy the checkpoint to a local folder first"
            )
    if not os.path.exists(src):
        raise UsageError(f"source {src} does not exist")
    if must_exist:
        if not os.path.exists(dst):
            raise UsageError(
                f"destination {dst} does not exist: --check-only compares an existing conversion"
            )
        return
    if os.path.lexists(dst):
        raise UsageError(
            f"destination {dst} already exists: convert writes a new file or folder; remove it or "
            "choose another name"
        )
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(parent):
        raise UsageError(f"destination {dst}: its folder {parent} does not exist")
    if os.path.isdir(src) and (inside(parent, src) or inside(dst, src)):
        raise UsageError(
            f"destination {dst} is inside the source {src}: write it next to the source instead"
        )


def _write(
    target: str, tmp: str, name: str, sel: Selection, max_shard: int, files: Files
) -> tuple[writers.Written, str]:
    """Write into tmp; returns (what was written, the path the check reads back)."""
    try:
        if target == "safetensors":
            return writers.write_safetensors(tmp, list(sel.tree.items()), max_shard, files), tmp
        if target == "full":
            path = os.path.join(tmp, name)
            return writers.write_full(path, sel.tree, files), path
        return writers.write_dcp(tmp, sel.tree, files), tmp
    except ValueError as exc:
        raise UsageError(f"cannot write {target}: {exc}") from None


def _copy_side_files(src: str, tmp: str) -> list[tuple[str, int]]:
    """config.json and the tokenizer files of a Hugging Face folder, so DST loads with from_pretrained."""
    out = []
    for n in HF_SIDE_FILES:
        path = os.path.join(src, n)
        if is_regular(path) and not os.path.islink(path):
            data = read_bytes(path, "model side file", limit=256 << 20)
            os.replace(write_temp(os.path.join(tmp, n), data), os.path.join(tmp, n))
            out.append((n, len(data)))
    return out


def _place(tmp: str, written_path: str, dst: str, target: str) -> None:
    if os.path.lexists(dst):
        raise UsageError(f"destination {dst} appeared while converting: left as it is")
    if target == "full":
        try:
            os.link(written_path, dst)  # fails if dst appeared: never replaces
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            os.rename(written_path, dst)  # a file system without hard links
    else:
        os.rename(tmp, dst)
    fsync_dir(os.path.dirname(os.path.abspath(dst)))


def _oserror(exc: OSError, dst: str) -> UsageError:
    return UsageError(
        oserror_line(exc, "write", exc.filename or dst) + " (nothing left at the destination)"
    )


# --------------------------------------------------------------------------- entry points


def convert(
    src: str,
    dst: str,
    target: str,
    max_shard: int = DEFAULT_SHARD,
    key: str | None = None,
    keep_tied: bool = False,
) -> ConvertReport:
    check_paths(src, dst, must_exist=False)
    if target != "full" and dst.rstrip("/").endswith((".safetensors", ".pt", ".bin", ".pth")):
        raise UsageError(
            f"destination {dst}: --to {target} writes a folder (model.safetensors or .metadata inside); "
            "name the folder without a file suffix"
        )
    if target == "full" and (dst.endswith(("/", os.sep)) or not dst.endswith(FULL_SUFFIXES)):
        raise UsageError(
            f"destination {dst}: --to full writes one torch.save file; name it with "
            f"{', '.join(FULL_SUFFIXES[:-1])} or {FULL_SUFFIXES[-1]} (validate recognises the file by "
            "its suffix)"
        )
    loaded = load(src)
    sel = select(loaded, target, key, keep_tied)
    for _n, t in sel.items:
        t.check_tiling()
    parent = os.path.dirname(os.path.abspath(dst))
    name = os.path.basename(os.path.abspath(dst))
    stale = sorted(n for n in os.listdir(parent) if n.startswith(f".{name}.convert-"))
    try:
        tmp = tempfile.mkdtemp(prefix=f".{name}.convert-", dir=parent)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
    except OSError as exc:
        raise _oserror(exc, dst) from None
    placed = False
    try:
        with Files() as files:
            written, back = _write(target, tmp, name, sel, max_shard, files)
            if target == "safetensors" and os.path.isdir(src):
                written.files += _copy_side_files(src, tmp)
            dst_loaded = _readback(back, target)
            check = compare(
                sel, written.sha256, dst_loaded, select(dst_loaded, target, None, True), files
            )
        if check.ok:
            _place(tmp, back, dst, target)
            placed = True
    except OSError as exc:
        raise _oserror(exc, dst) from None
    finally:
        if not placed or target == "full":
            shutil.rmtree(tmp, ignore_errors=True)
    report = _report("convert", src, loaded, dst, target, sel, check, placed, written)
    if stale:
        report.notes.append(
            f"{', '.join(stale[:3])} next to the destination: left by an interrupted conversion "
            "(never renamed into place); remove it"
        )
    return report


def check_only(src: str, dst: str, target: str | None, key: str | None = None) -> ConvertReport:
    """Compare an existing conversion (this tool's, dcp_to_torch_save's, zero_to_fp32's) with its source."""
    check_paths(src, dst, must_exist=True)
    loaded = load(src)
    dst_loaded = load(dst, verify=False)
    flat = isinstance(dst_loaded.tree, dict) and all(
        isinstance(v, Tensor) for v in dst_loaded.tree.values()
    )
    target = target or (
        "safetensors"
        if dst_loaded.fmt == "safetensors"
        else "dcp"
        if dst_loaded.fmt == "dcp"
        else "full"
    )
    # a flat name -> tensor destination (zero_to_fp32's pytorch_model.bin, safetensors) holds the weights alone
    sel = select(loaded, "safetensors" if flat else target, key, keep_tied=False)
    for _n, t in sel.items:
        t.check_tiling()
    with Files() as files:
        try:
            check = compare(sel, {}, dst_loaded, select(dst_loaded, target, None, True), files)
        except OSError as exc:
            raise UsageError(oserror_line(exc, "read", exc.filename or dst)) from None
    return _report("check-only", src, loaded, dst, target, sel, check, False, None)


def _report(
    mode: str,
    src: str,
    loaded: Loaded,
    dst: str,
    target: str,
    sel: Selection,
    check: ConvertCheck,
    placed: bool,
    written: writers.Written | None,
) -> ConvertReport:
    notes = list(loaded.notes)
    if sel.tied:
        notes.append(
            f"{len(sel.tied)} tied name(s) left out, their bytes are another tensor's "
            f"({', '.join(f'{a} = {b}' for a, b in list(sel.tied.items())[:4])}): as save_pretrained "
            "writes them; from_pretrained re-ties them (--keep-tied writes a copy under each name)"
        )
    if mode == "convert" and not check.ok:
        notes.append("the check failed: nothing was written to the destination")
    nxt = []
    if placed:
        nxt.append(f"checkpoint-strategy validate {dst} --level deep")
    return ConvertReport(
        mode=mode,
        source=src,
        source_format=loaded.fmt,
        destination=dst,
        target=target,
        written=placed,
        files=[OutputFile(name=n, bytes=b) for n, b in (written.files if written else [])],
        tensors=len({id(t) for _n, t in sel.items})
        - (len(sel.tied) if target == "safetensors" else 0),
        bytes=written.bytes if written else 0,
        selected=sel.selected,
        left_out=sel.left_out,
        notes=notes,
        check=check,
        next_steps=nxt,
    )
