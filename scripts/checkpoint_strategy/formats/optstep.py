"""The optimizer's own step counter against the checkpoint's training step. Nothing is loaded:
pickles are read as opcodes (`torchpickle`), DCP `.metadata` the same way, and only the few bytes
of each scalar `step` tensor are read from the archive or shard file.

Where each layout keeps the two numbers:

- HF Trainer ``checkpoint-N/``: ``trainer_state.json`` ``global_step``; ``optimizer.pt``
  ``state[i]['step']``; ``scheduler.pt`` ``last_epoch``. A DeepSpeed or FSDP save inside it is read as below.
- Lightning ``*.ckpt``: ``global_step``; ``optimizer_states[k]['state'][i]['step']`` (summed over the
  optimizers: Lightning's global_step counts the steps of every optimizer). A sharded ``*.ckpt/`` folder
  (FSDP): ``meta.pt`` ``global_step`` and the DCP optimizer entries.
- DeepSpeed ``global_stepN/``: ``global_steps`` and ``skipped_steps`` in ``mp_rank_00_model_states.pt``;
  ``*_optim_states.pt`` ``optimizer_state_dict`` ... ``state[i]['step']``.
- torch.distributed.checkpoint / torchtitan: ``train_state.step`` (or a top-level ``step``,
  ``global_step``, ``iteration``) and ``optimizer.state.<param>.step`` entries of ``.metadata``, their
  values in the ``__R_N.distcp`` shards (raw bytes, or a small torch.save archive);
  ``lr_scheduler.*.last_epoch``.

Assumptions (docs/recovery.md "Optimizer step counter"): torch optimizers with a per-parameter
``step`` (Adam, AdamW, Adafactor, ...) count one per ``optimizer.step()``; the training step above
counts optimizer steps too (HF's global_step advances once per gradient-accumulation cycle, as does
Lightning's and DeepSpeed's), so with gradient accumulation both count the same thing. Intact state:
counter = training step - skipped steps (DeepSpeed records its fp16-overflow skips; a torch
GradScaler's skips are not recorded and show as a small lag). A counter that covers only the steps
since a resume means the optimizer started from nothing there. An optimizer without a step
counter (SGD) gives no verdict.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any, Optional

from checkpoint_strategy import storage
from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import deepspeed as ds
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.formats.dcp import DcpBroken, DcpMetadata, dcp_metadata
from checkpoint_strategy.formats.models import OptimizerCheck, OptimizerSteps

#: step tensors read per checkpoint (every parameter normally has the same count)
MAX_READS = 4096
MAX_METADATA = 512 << 20
MAX_ITEM = 1 << 20
_DECODE = {
    "float32": "<f",
    "float64": "<d",
    "float16": "<e",
    "int64": "<q",
    "int32": "<i",
    "int16": "<h",
    "int8": "<b",
    "uint8": "<B",
}
_TORCH_OPTIM_FILE = re.compile(r"^optimizer(?:_\d+)?\.(?:pt|bin)$")
_TRAIN_LEAVES = ("step", "global_step", "global_steps", "iteration")
#: DCP folders level full already read (`validate --level deep`): normalised folder path -> its `.metadata` as
#: data and the item archives it parsed, by (relative path, offset) (formats/dcp.py `check_dcp_dir`)
DcpParsed = Mapping[str, tuple[DcpMetadata, Mapping[tuple[str, int], fc.ZipScan]]]


def _decode(raw: bytes, dtype: str) -> Optional[float]:
    if dtype == "bfloat16" and len(raw) >= 2:
        return struct.unpack("<f", b"\x00\x00" + raw[:2])[0]
    fmt = _DECODE.get(dtype)
    if fmt is None or len(raw) < struct.calcsize(fmt):
        return None
    return float(struct.unpack(fmt, raw[: struct.calcsize(fmt)])[0])


def _number(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# --------------------------------------------------------------------------- torch zip archives


class TorchArchive:
    """A torch.save zip archive, its pickle read as data, and scalar tensor values read on demand."""

    def __init__(self, path: str) -> None:
        self.path = path
        z = fc.scan_zip(path, zr.Counter())
        self.scan = z
        self.root = z.pickle.root if z.pickle is not None else None

    def value(self, v: Any) -> Optional[float]:
        if not isinstance(v, tp.TensorRef):
            return _number(v)
        at = _scalar_at(self.scan, v)
        if at is None:
            return None
        try:
            with storage.open_regular(self.path, "checkpoint file") as fh:
                fh.seek(at)
                return _decode(fh.read(tp.DTYPE_SIZE[v.dtype]), v.dtype)
        except (OSError, storage.ReadError):
            return None


def _scalar_at(z: fc.ZipScan, v: tp.TensorRef) -> Optional[int]:
    """Where a tensor's first element lies in its archive (its storage entry stored, not deflated), or None."""
    e = z.entry(f"{z.prefix}data/{v.storage.key}")
    size = tp.DTYPE_SIZE.get(v.dtype, 0)
    if e is None or not size or e.method != 0 or (v.offset + 1) * size > e.usize:
        return None
    return e.data_start + v.offset * size


def _optimizer_dicts(root: Any) -> list[dict]:
    """Every torch optimizer state dict ({'state': {i: {'step': ...}}}) in an object tree, outermost first."""
    out: list[dict] = []
    todo: list[tuple[Any, int]] = [(root, 0)]
    seen: set[int] = set()
    while todo and len(seen) < 20_000:
        obj, depth = todo.pop(0)
        if id(obj) in seen or depth > 8:
            continue
        seen.add(id(obj))
        if isinstance(obj, tp.Call):
            obj = obj.state
        if isinstance(obj, dict):
            st = obj.get("state")
            if isinstance(st, dict) and any(
                isinstance(x, dict) and "step" in x for x in st.values()
            ):
                out.append(obj)
                continue
            todo.extend((v, depth + 1) for v in obj.values())
        elif isinstance(obj, (list, tuple)):
            todo.extend((v, depth + 1) for v in obj)
    return out


def _max_step(arc: TorchArchive, od: dict, budget: list[int]) -> Optional[int]:
    best: Optional[float] = None
    for st in od["state"].values():
        if not (isinstance(st, dict) and "step" in st) or budget[0] <= 0:
            continue
        budget[0] -= 1
        v = arc.value(st["step"])
        if v is not None and v == v and (best is None or v > best):
            best = v
    return int(best) if best is not None and abs(best) < 2**53 else None


def _archive_steps(
    path: str, sum_optimizers: bool = False
) -> tuple[Optional[int], int, Optional[TorchArchive]]:
    """(optimizer step, optimizers found, the archive) of one torch archive: the largest per-parameter step
    of its optimizer (of each, summed, with sum_optimizers)."""
    arc = TorchArchive(path)
    dicts = _optimizer_dicts(arc.root)
    budget = [MAX_READS]
    steps = [s for s in (_max_step(arc, od, budget) for od in dicts) if s is not None]
    if not steps:
        return None, len(dicts), arc
    return (sum(steps) if sum_optimizers else max(steps)), len(dicts), arc


def _root_int(root: Any, *keys: str) -> Optional[int]:
    for k in keys:
        v = root.get(k) if isinstance(root, dict) else None
        if type(v) is int:
            return v
    return None


# --------------------------------------------------------------------------- DCP


def _dcp_meta(folder: str) -> Optional[DcpMetadata]:
    """The folder's .metadata read as data (formats/dcp.py `dcp_metadata`); None when it cannot be (unreadable,
    huge, broken: validate's finding, here just "unknown")."""
    path = os.path.join(folder, ".metadata")
    try:
        with storage.open_regular(path, "DCP .metadata") as fh:
            data = fh.read(MAX_METADATA + 1)
    except (OSError, storage.ReadError):
        return None
    if len(data) > MAX_METADATA:
        return None
    try:
        return dcp_metadata(tp.read_pickle(data))
    except DcpBroken:
        return None


def _zip_value(z: fc.ZipScan, read: Callable[[int, int], bytes]) -> Optional[float]:
    """The value of a torch.save'd int/float/scalar tensor (DCP writes non-tensor items this way) from its parsed
    archive `z`; `read(at, n)`: n bytes at offset `at` of the archive. None when it cannot give it (damaged bytes,
    not a number)."""
    root = z.pickle.root if z.pickle is not None and not z.findings else None
    if not isinstance(root, tp.TensorRef):
        return _number(root)
    at = _scalar_at(z, root)
    return None if at is None else _decode(read(at, tp.DTYPE_SIZE[root.dtype]), root.dtype)


def _archive_value(data: bytes) -> Optional[float]:
    """`_zip_value` of an item archive nobody parsed yet, read by the one reader of DCP's item archives
    (`filechecks.scan_embedded_zip`: directory, local headers, data.pkl, every CRC-32)."""
    z = fc.scan_embedded_zip(zr.InMemory(data), 0, len(data), zr.Counter())
    return _zip_value(z, lambda at, n: data[at : at + n])


def _read_at(path: str, at: int, n: int) -> bytes:
    try:
        with storage.open_regular(path, "DCP data file") as fh:
            fh.seek(at)
            return fh.read(n)
    except (OSError, storage.ReadError):
        return b""


class _Dcp:
    """One DCP folder: its entries and the values of scalar items, read on demand (from the item archives level
    full parsed, `archives`, when given: only the value's bytes are read)."""

    def __init__(
        self,
        folder: str,
        meta: DcpMetadata,
        archives: Optional[Mapping[tuple[str, int], fc.ZipScan]] = None,
    ) -> None:
        self.folder = folder
        self.archives = archives or {}
        dtypes = {t.fqn: t.dtype for t in meta.tensors}
        self.dtypes = {
            fqn: dtypes.get(fqn, "bytes") for fqn in meta.fqns
        }  # fqn -> dtype ('bytes': a value)
        self.where: dict[
            str, tuple[str, int, int]
        ] = {}  # fqn -> its first stored untransformed chunk
        for it in meta.items:
            if not it.transformed:
                self.where.setdefault(it.fqn, (it.rel, it.offset, it.length))

    def value(self, fqn: str) -> Optional[float]:
        loc = self.where.get(fqn)
        if loc is None or loc[2] > MAX_ITEM:
            return None
        rel, off, length = loc
        if os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
            return None
        parsed = self.archives.get((rel, off))
        if parsed is not None:
            path = os.path.join(self.folder, rel)
            return _zip_value(parsed, lambda at, n: _read_at(path, off + at, n))
        try:
            with storage.open_regular(os.path.join(self.folder, rel), "DCP data file") as fh:
                fh.seek(off)
                data = fh.read(length)
        except (OSError, storage.ReadError):
            return None
        if len(data) != length:
            return None
        if data[:4] == b"PK\x03\x04":
            return _archive_value(data)
        return _decode(data, self.dtypes.get(fqn, "?"))


def _is_optim(parts: list[str]) -> bool:
    return any(p.startswith("optim") or p == "opt" for p in parts)


def dcp_step_keys(fqns: list[str]) -> tuple[list[str], Optional[str], Optional[str]]:
    """(optimizer step fqns, the training-step fqn, the scheduler last_epoch fqn) among a DCP's entries."""
    opt, train, sched = [], [], []
    for fqn in fqns:
        parts = fqn.split(".")
        if (
            parts[-1] == "step"
            and "state" in parts[:-1]
            and _is_optim(parts[: parts.index("state")])
        ):
            opt.append(fqn)
        elif parts[-1] == "last_epoch" and any(p.startswith(("lr_sched", "sched")) for p in parts):
            sched.append(fqn)
        elif (
            parts[-1] in _TRAIN_LEAVES
            and not _is_optim(parts)
            and not any(p.startswith(("lr_sched", "sched", "dataloader")) for p in parts)
        ):
            train.append(fqn)
    pick = min(train, key=lambda f: (f.count("."), f)) if train else None
    return opt, pick, min(sched) if sched else None


def _whole(v: Optional[float]) -> Optional[int]:
    """A counter read from a tensor as an int, or None where int() cannot take it exactly (NaN, inf, >= 2**53)."""
    return int(v) if v is not None and v == v and abs(v) < 2**53 else None


def _dcp_read(
    folder: str,
    out: OptimizerSteps,
    optimizer_only: bool = False,
    sum_optimizers: bool = False,
    parsed: Optional[DcpParsed] = None,
) -> None:
    """sum_optimizers: Lightning's `optimizer_<k>` entries, whose counters its global_step adds up. parsed: the
    folders level full read (their .metadata and item archives are not read again)."""
    known = (parsed or {}).get(os.path.normpath(folder))
    meta = known[0] if known is not None else _dcp_meta(folder)
    if meta is None:
        return
    d = _Dcp(folder, meta, known[1] if known is not None else None)
    opt, train, sched = dcp_step_keys(list(d.dtypes))
    rel = (
        os.path.relpath(os.path.join(folder, ".metadata"), out.path)
        if out.path != folder
        else ".metadata"
    )
    per_optimizer: dict[str, float] = {}
    for fqn in opt[:MAX_READS]:
        v = d.value(fqn)
        if v is not None and v == v and abs(v) < 2**53:
            key = fqn.split(".state.", 1)[0]
            per_optimizer[key] = max(v, per_optimizer.get(key, v))
    if per_optimizer and out.optimizer_step is None:
        n = len(per_optimizer)
        out.optimizer_step = int(
            sum(per_optimizer.values()) if sum_optimizers else max(per_optimizer.values())
        )
        out.optimizer_step_from = f"{'/'.join(sorted(per_optimizer))}.state.*.step in {rel}" + (
            f" (summed over {n} optimizers)" if sum_optimizers and n > 1 else ""
        )
    if optimizer_only:
        return
    if train and out.training_step is None:
        t = _whole(d.value(train))
        if t is not None and t >= 0:
            out.training_step, out.training_step_from = t, f"{train} in {rel}"
    if sched and out.scheduler_step is None:
        last = _whole(d.value(sched))
        if last is not None:
            out.scheduler_step, out.scheduler_step_from = last, f"{sched} in {rel}"


# --------------------------------------------------------------------------- layouts


def _hf(path: str, out: OptimizerSteps, parsed: Optional[DcpParsed] = None) -> None:
    try:
        state = storage.read_json(
            os.path.join(path, "trainer_state.json"),
            "trainer_state.json",
            allow_nan=True,
            expect=dict,
        )
    except storage.ReadError:
        state = {}
    if type(state.get("global_step")) is int:
        out.training_step, out.training_step_from = (
            state["global_step"],
            "trainer_state.json global_step",
        )
    opt = os.path.join(path, "optimizer.pt")
    if storage.is_regular(opt):
        step, _n, _arc = _archive_steps(opt)
        if step is not None:
            out.optimizer_step, out.optimizer_step_from = step, "optimizer.pt state[*]['step']"
    sched = os.path.join(path, "scheduler.pt")
    if storage.is_regular(sched):
        last = _root_int(TorchArchive(sched).root, "last_epoch")
        if last is not None:
            out.scheduler_step, out.scheduler_step_from = last, "scheduler.pt last_epoch"
    for name in sorted(os.listdir(path)):
        sub = os.path.join(path, name)
        if os.path.isdir(sub) and not os.path.islink(sub):
            if re.match(r"^global_step\d+$", name):
                _deepspeed(sub, out, rel=name + "/")
            elif os.path.isfile(os.path.join(sub, ".metadata")) and name.startswith("optimizer"):
                _dcp_read(sub, out, optimizer_only=True, parsed=parsed)


def _deepspeed(path: str, out: OptimizerSteps, rel: str = "") -> None:
    names = sorted(os.listdir(path))
    model = next((n for n in names if ds.model_states(n)), None)
    if model is not None:
        arc = TorchArchive(os.path.join(path, model))
        gs = _root_int(arc.root, "global_steps")
        if gs is not None and out.training_step is None:
            out.training_step, out.training_step_from = gs, f"{rel}{model} global_steps"
        skipped = _root_int(arc.root, "skipped_steps")
        if skipped is not None:
            out.skipped_steps = skipped
        lr = arc.root.get("lr_scheduler") if isinstance(arc.root, dict) else None
        last = _root_int(lr, "last_batch_iteration", "last_epoch")
        if last is not None and out.scheduler_step is None:
            out.scheduler_step, out.scheduler_step_from = last, f"{rel}{model} lr_scheduler"
    steps = []
    for n in [n for n in names if ds.zero_shard(n, "optim") or _TORCH_OPTIM_FILE.match(n)][:8]:
        s, _n, _arc = _archive_steps(os.path.join(path, n))
        if s is not None:
            steps.append(s)
    if steps and out.optimizer_step is None:
        out.optimizer_step = max(steps)
        out.optimizer_step_from = f"{rel}*_optim_states.pt optimizer_state_dict state[*]['step']"


def _lightning(path: str, out: OptimizerSteps, parsed: Optional[DcpParsed] = None) -> None:
    if os.path.isdir(path):  # a sharded strategy's folder: DCP shards, the loop state in meta.pt
        _dcp_read(path, out, optimizer_only=True, sum_optimizers=True, parsed=parsed)
        meta = os.path.join(path, "meta.pt")
        gs = _root_int(TorchArchive(meta).root, "global_step") if storage.is_regular(meta) else None
        if gs is not None:
            out.training_step, out.training_step_from = gs, "meta.pt global_step"
        return
    step, n, arc = _archive_steps(path, sum_optimizers=True)
    root = arc.root if arc is not None else None
    gs = _root_int(root, "global_step")
    if gs is not None:
        out.training_step, out.training_step_from = gs, "global_step"
    if step is not None:
        out.optimizer_step = step
        out.optimizer_step_from = (
            "optimizer_states[0]['state'][*]['step']"
            if n == 1
            else f"optimizer_states[*]['state'][*]['step'] summed over {n} optimizers"
        )
    scheds = root.get("lr_schedulers") if isinstance(root, dict) else None
    if isinstance(scheds, list) and scheds:
        last = _root_int(tp.state_of(scheds[0]), "last_epoch")
        if last is not None:
            out.scheduler_step, out.scheduler_step_from = last, "lr_schedulers[0]['last_epoch']"


def read_optimizer_steps(
    path: str, fmt: Optional[str] = None, parsed: Optional[DcpParsed] = None
) -> OptimizerSteps:
    """Both counters of one checkpoint (a folder or a .ckpt/.pt file); unreadable parts stay None.
    fmt: the format `formats.identify` gives; found from the path when None. parsed: the DCP folders level full
    read (`validate --level deep`); without them each DCP folder's .metadata and step entries are read here.
    Never raises on content."""
    from checkpoint_strategy.formats import identify as fm

    if fmt is None:
        found = fm.identify(path)
        fmt = found.format if found is not None else "unknown"
    out = OptimizerSteps(path=path, format=fmt)
    try:
        if fmt == "hf-trainer" and os.path.isdir(path):
            _hf(path, out, parsed)
        elif fmt == "deepspeed" and os.path.isdir(path):
            _deepspeed(path, out)
        elif fmt in ("lightning", "nemo"):
            _lightning(path, out, parsed)
        elif fmt in ("dcp", "torchtitan") and os.path.isdir(path):
            _dcp_read(path, out, parsed=parsed)
        elif fmt == "torch" and not os.path.isdir(path):
            step, _n, arc = _archive_steps(path)
            gs = _root_int(arc.root if arc else None, "global_step", "step", "iteration")
            if gs is not None:
                out.training_step, out.training_step_from = gs, "global_step in the archive"
            if step is not None:
                out.optimizer_step, out.optimizer_step_from = (
                    step,
                    "state[*]['step'] in the archive",
                )
    except (OSError, storage.ReadError):
        pass
    return judge(out)


def judge(s: OptimizerSteps, resume_step: Optional[int] = None) -> OptimizerSteps:
    """Set s.verdict / restart_step / reason. resume_step: the step a resumed run started from (its
    checkpoints after it are judged against it: a counter <= training step - resume_step was reset there)."""
    s.restart_step = None
    if s.optimizer_step is None or s.training_step is None:
        missing = "optimizer step counter" if s.optimizer_step is None else "training step"
        s.verdict = "unknown"
        s.reason = f"no {missing} recorded" + (
            " (a model-only checkpoint, or an optimizer without a per-parameter step such as SGD)"
            if s.optimizer_step is None
            else " in the checkpoint's content"
        )
        return s
    t, o = s.training_step, s.optimizer_step
    expected = t - (s.skipped_steps or 0)
    skipped = f" - {s.skipped_steps} skipped" if s.skipped_steps else ""
    if o == expected:
        s.verdict = "consistent"
        s.reason = f"optimizer step counter {o} = training step {t}{skipped}"
    elif o > expected:
        s.verdict = "ahead"
        s.reason = (
            f"optimizer step counter {o} is ahead of the training step {t}{skipped}: the training step "
            "restarted while the optimizer state carried on (the LR schedule and data position restarted "
            "too?), or the optimizer state comes from another save"
        )
    else:
        s.restart_step = t - o
        if resume_step is not None and 0 < resume_step < t and o <= t - resume_step:
            s.verdict = "reset"
            s.reason = (
                f"optimizer step counter {o} at training step {t}: it counts only the {o} steps since the "
                f"resume from step {resume_step}, so the optimizer started from nothing there (Adam's "
                "moments and step count were not restored)"
            )
        else:
            s.verdict = "behind"
            s.reason = (
                f"optimizer step counter {o} is {expected - o} behind the training step {t}{skipped}: "
                f"a counter restarted at step {t - o} (a resume with a fresh optimizer there?), or steps "
                "the optimizer skipped (fp16 loss-scale overflows) that the checkpoint does not record"
            )
    return s


def fill_deep_check(
    path: str, fmt: str, opt: OptimizerCheck, parsed: Optional[DcpParsed] = None
) -> Optional[tuple[str, str]]:
    """For `validate --level deep`: where its own pass left the optimizer's step or the training step unread
    (DCP / torchtitan train_state, DeepSpeed's partitioned optimizer and global_steps), read them here and fill
    `opt` (a DCP folder in `parsed`, from the archives level full parsed). Returns (problem kind, reason) for a counter behind ("suspicious") or ahead ("not_resumable") of the
    training step, worded as the deep level words it for HF and Lightning; None otherwise."""
    if opt.kind == "none" or (opt.step is not None and opt.global_step is not None):
        return None
    s = read_optimizer_steps(path, fmt, parsed)
    if opt.step is None:
        opt.step = s.optimizer_step
    if opt.global_step is None:
        opt.global_step = s.training_step
    if s.verdict == "ahead":
        return "not_resumable", f"not resumable: {s.reason}"
    if s.verdict == "behind":
        return "suspicious", f"suspicious: {s.reason}"
    return None
