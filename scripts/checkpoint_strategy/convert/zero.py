"""DeepSpeed ZeRO per-rank files -> consolidated fp32 weights and Adam moments, read as data.

What deepspeed/utils/zero_to_fp32.py does (DeepSpeed 0.19.8), without torch.load:

- ZeRO-1/2: each data-parallel rank's ``*_optim_states.pt`` holds, per parameter group, its flat fp32
  partition (``single_partition_of_fp32_groups``, padding removed). Concatenated in rank order they are
  the group's flat vector; the parameters are consecutive slices of it in ``param_shapes`` order (from
  ``mp_rank_00_model_states.pt``), each followed by its ``param_alignment_paddings`` entry; the end must
  match to within the 2 x world-size alignment. The Adam moments (``base_optimizer_state.state[g]``
  ``exp_avg``/``exp_avg_sq``, partitions with the group's alignment padding at the end) consolidate the
  same way once cut to the fp32 partition's length; ``step`` is one per group.
- ZeRO-3: each rank's ``fp32_flat_groups`` concatenated per rank; every parameter takes
  ceil(numel / world) elements from each rank's flat vector at the same offset, in ``param_shapes``
  order, the padding dropped at the end. The moments (the inner optimizer's ``state[i]`` per sub-group,
  laid out as ``fp32_flat_groups[i]``) consolidate the same way; ``step`` is the first sub-group's.
- Buffers come from the model states' ``module`` (as saved), ``shared_params`` become tied names.

Every slice is a list of byte ranges of the rank files (`Piece`), so nothing is loaded in memory.
"""

from __future__ import annotations

import math
import os
from typing import Any

from checkpoint_strategy.convert import readers
from checkpoint_strategy.convert.pieces import Loaded, Piece, Tensor
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import deepspeed as ds
from checkpoint_strategy.formats import safepickle as tp

F32 = 4


def is_zero_folder(src: str, names: set[str]) -> bool:
    """ZeRO rank files here, or a `latest` file naming a folder that holds them (DeepSpeed's run folder, an HF
    Trainer checkpoint-N saved under DeepSpeed)."""
    if any(ds.zero_shard(n, "optim") for n in names) or ds.MODEL_STATES in names:
        return True
    if ds.LATEST not in names:
        return False
    try:
        tag = _step_folder(src)
        return tag != src and any(ds.zero_shard(n, "optim") for n in os.listdir(tag))
    except readers.Outside:
        raise  # a tag leading out of src: refused, never followed
    except (OSError, UsageError):
        return False


class _Flat:
    """A virtual flat fp32 vector made of consecutive byte ranges (partitions of several files)."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, int, int, int]] = []  # (path, src, start element, elements)
        self.numel = 0

    def add(self, t: Tensor, elements: int | None = None) -> None:
        n = t.numel if elements is None else min(elements, t.numel)
        if n and t.pieces:
            self.parts.append((t.pieces[0].path, t.pieces[0].src, self.numel, n))
        self.numel += n

    def slice(self, start: int, count: int, dst: int = 0) -> list[Piece]:
        out = []
        for path, src, first, n in self.parts:
            lo, hi = max(start, first), min(start + count, first + n)
            if lo < hi:
                out.append(
                    Piece(path, src + (lo - first) * F32, dst + (lo - start) * F32, (hi - lo) * F32)
                )
        return out


def _ranked(src: str, names: set[str], kind: str) -> list[str]:
    found = {}
    for n in names:
        m = ds.zero_shard(n, kind)
        if m:
            if m[1] != 0:
                raise UsageError(
                    f"{src}: {n}: tensor-parallel ZeRO (mp_rank > 0) is not converted; "
                    "consolidate with Megatron/DeepSpeed's own tools"
                )
            found[m[0]] = readers.within(src, n, src)
    ranks = sorted(found)
    if ranks != list(range(len(ranks))):
        missing = sorted(set(range(max(ranks) + 1)) - set(ranks)) if ranks else [0]
        raise UsageError(
            f"{src}: the files of data-parallel rank(s) {missing} are missing: a ZeRO checkpoint "
            "needs every rank's partition"
        )
    return [found[r] for r in ranks]


def _dict(v: Any, what: str, where: str) -> dict:
    if not isinstance(v, dict):
        raise UsageError(f"{where}: no {what} (not a DeepSpeed ZeRO {what.split()[0]} file?)")
    return v


def _stage(model: dict, optim: dict) -> int:
    for tree in (optim, model):
        cfg = tree.get("ds_config")
        zo = cfg.get("zero_optimization") if isinstance(cfg, dict) else None
        if isinstance(zo, dict) and type(zo.get("stage")) is int:
            return zo["stage"]
    osd = optim.get("optimizer_state_dict")
    return 3 if isinstance(osd, dict) and "fp32_flat_groups" in osd else 2


def read_zero(src: str) -> Loaded:
    src = _step_folder(src)
    names = set(os.listdir(src))
    optim_files = _ranked(src, names, "optim")
    if not optim_files:
        raise UsageError(
            f"{src}: no *_optim_states.pt: the fp32 weights of a ZeRO checkpoint live in the "
            "optimizer partitions (a model-states-only save cannot be consolidated)"
        )
    optims = [_little_endian(readers.read_zip(p), p).tree for p in optim_files]
    model_path = os.path.join(src, ds.MODEL_STATES)
    if not os.path.exists(model_path):
        model_files = _ranked(src, names, "model")
        model_path = model_files[0] if model_files else model_path
    model = _dict(
        _little_endian(
            readers.read_zip(readers.within(src, os.path.basename(model_path), src)), model_path
        ).tree,
        "model states",
        model_path,
    )
    stage = _stage(model, optims[0])
    osds = [
        _dict(o.get("optimizer_state_dict"), "optimizer_state_dict", p)
        for o, p in zip(optims, optim_files, strict=True)
    ]
    shapes = model.get("param_shapes")
    if not isinstance(shapes, list) or not all(isinstance(g, dict) for g in shapes):
        raise UsageError(f"{model_path}: no param_shapes list (not a ZeRO model states file?)")
    world = _world(osds, optim_files)
    notes = [
        f"DeepSpeed ZeRO-{stage}, {world} data-parallel rank(s): fp32 master weights consolidated as "
        "zero_to_fp32 does"
    ]
    if stage <= 2:
        weights, optimizer = _zero12(src, osds, shapes, world, notes)
    else:
        weights, optimizer = _zero3(src, osds, shapes, world, notes)
    weights += _buffers_and_shared(model, weights, notes)
    tree: dict = {"optimizer": optimizer} if optimizer else {}
    return Loaded(f"deepspeed-zero{stage}", tree, notes=notes, extra_weights=weights)


def _little_endian(loaded: Loaded, path: str) -> Loaded:
    if loaded.byteorder != "little":
        raise UsageError(
            f'{path}: a big-endian DeepSpeed file (byteorder record "big"): not consolidated here; '
            "load it with DeepSpeed"
        )
    return loaded


def _step_folder(src: str) -> str:
    """A run folder with `latest` -> the global_stepN it names."""
    latest = os.path.join(src, ds.LATEST)
    if not any(ds.zero_shard(n, "optim") for n in os.listdir(src)) and os.path.isfile(latest):
        from checkpoint_strategy.storage import read_bytes

        tag = (
            read_bytes(latest, "DeepSpeed latest file", limit=4096)
            .decode("utf-8", "replace")
            .strip()
        )
        if not tag or "/" in tag or tag in (".", ".."):
            raise UsageError(f"{latest}: names no tag folder")
        return readers.within(src, tag, latest)
    return src


def _world(osds: list[dict], files: list[str]) -> int:
    pc = osds[0].get("partition_count")
    world = max(pc) if isinstance(pc, list) and pc and all(type(x) is int for x in pc) else pc
    if type(world) is not int or world < 1:
        raise UsageError(f"{files[0]}: no partition_count: not a ZeRO optimizer partition")
    if world != len(files):
        raise UsageError(
            f"{os.path.dirname(files[0])}: {len(files)} *_optim_states.pt files, partition_count says "
            f"{world}: a rank's save is missing or left from another run"
        )
    return world


def _tensor_list(osd: dict, key: str, where: str) -> list[Tensor]:
    groups = osd.get(key)
    if not isinstance(groups, list) or not all(
        isinstance(t, Tensor) and t.dtype == "float32" for t in groups
    ):
        raise UsageError(f"{where}: no float32 {key}: not a ZeRO partition this converter reads")
    for t in groups:
        if t.problem:
            raise UsageError(f"{where}: {key}: {t.problem}")
    return groups


def _shape(v: Any) -> tuple:
    if isinstance(v, (list, tuple)) and all(type(d) is int and d >= 0 for d in v):
        return tuple(v)
    raise UsageError(f"param_shapes holds {tp.shown(str(v))[:60]}, not a shape")


def _zero12(
    src: str, osds: list[dict], shapes: list[dict], world: int, notes: list[str]
) -> tuple[list[Tensor], dict | None]:
    parts = [_tensor_list(o, "single_partition_of_fp32_groups", src) for o in osds]
    if len({len(p) for p in parts}) != 1 or len(parts[0]) != len(shapes):
        raise UsageError(
            f"{src}: the ranks' fp32 partitions hold {[len(p) for p in parts]} groups, param_shapes "
            f"{len(shapes)}"
        )
    paddings = osds[0].get("param_alignment_paddings")
    weights: list[Tensor] = []
    moments: dict[str, dict] = {}
    groups: list[dict] = []
    for g, group_shapes in enumerate(shapes):
        flat = _Flat()
        for r in range(world):
            flat.add(parts[r][g])
        pads = paddings[g] if isinstance(paddings, list) and g < len(paddings) else None
        spans = _spans(src, group_shapes, flat.numel, pads, world)
        for name, shape, start, numel in spans:
            weights.append(Tensor(name, "float32", shape, flat.slice(start, numel)))
        got = _group_moments(osds, parts, g, spans, world)
        if got is None:
            notes.append(
                f"parameter group {g}: no exp_avg/exp_avg_sq partitions: its optimizer moments are not "
                "converted"
            )
            continue
        moments.update(got[0])
        groups.append(got[1])
    if not moments:
        return weights, None
    return weights, {"state": moments, "param_groups": groups}


def _spans(
    src: str, group_shapes: dict, avail: int, pads: Any, world: int
) -> list[tuple[str, tuple, int, int]]:
    out, offset = [], 0
    for i, (name, shape) in enumerate(group_shapes.items()):
        shape = _shape(shape)
        numel = math.prod(shape)
        out.append((str(name), shape, offset, numel))
        offset += numel
        if isinstance(pads, list) and i < len(pads) and type(pads[i]) is int:
            offset += pads[i]
    align = 2 * world
    if math.ceil(offset / align) * align != math.ceil(avail / align) * align:
        raise UsageError(
            f"{src}: the parameters need {offset} fp32 values, the rank partitions hold {avail}: "
            "param_shapes and the partitions do not match (a rank file from another save?)"
        )
    return out


def _group_moments(
    osds: list[dict], parts: list[list[Tensor]], g: int, spans: list, world: int
) -> tuple[dict, dict] | None:
    states = []
    for o in osds:
        base = o.get("base_optimizer_state")
        st = base.get("state") if isinstance(base, dict) else None
        st = st.get(g) if isinstance(st, dict) else None
        if not isinstance(st, dict) or not all(
            isinstance(st.get(k), Tensor) for k in ("exp_avg", "exp_avg_sq")
        ):
            return None
        states.append(st)
    out: dict[str, dict] = {}
    flats = {}
    for key in ("exp_avg", "exp_avg_sq"):
        flat = _Flat()
        for r in range(world):
            flat.add(states[r][key], parts[r][g].numel)
        flats[key] = flat
    step = states[0].get("step")
    for name, shape, start, numel in spans:
        entry: dict[str, Any] = {
            k: Tensor(f"{name}.{k}", "float32", shape, flats[k].slice(start, numel))
            for k in ("exp_avg", "exp_avg_sq")
        }
        if isinstance(step, Tensor) or isinstance(step, (int, float)):
            entry["step"] = step
        out[name] = entry
    base0 = osds[0].get("base_optimizer_state")
    pg = base0.get("param_groups") if isinstance(base0, dict) else None
    group = dict(pg[g]) if isinstance(pg, list) and g < len(pg) and isinstance(pg[g], dict) else {}
    group["params"] = [name for name, *_ in spans]
    return out, group


def _zero3(
    src: str, osds: list[dict], shapes: list[dict], world: int, notes: list[str]
) -> tuple[list[Tensor], dict | None]:
    groups = [_tensor_list(o, "fp32_flat_groups", src) for o in osds]
    flats = [_flat(g) for g in groups]
    spans, offset = [], 0
    for group_shapes in shapes:
        for name, shape in group_shapes.items():
            shape = _shape(shape)
            spans.append((str(name), shape, offset, math.prod(shape)))
            offset += math.ceil(math.prod(shape) / world)
    if offset != flats[0].numel:
        raise UsageError(
            f"{src}: the parameters take {offset} values per rank, the fp32 flat groups hold "
            f"{flats[0].numel}: param_shapes and the partitions do not match"
        )
    weights = [
        Tensor(name, "float32", shape, _gather3(flats, start, numel, world))
        for name, shape, start, numel in spans
    ]
    moments = _moments3(osds, groups)
    if moments is None:
        notes.append(
            "ZeRO-3 optimizer moments not found in the partitions' optimizer_state_dict: weights only"
        )
        return weights, None
    flat_m, step, group = moments
    state = {}
    for name, shape, start, numel in spans:
        entry: dict[str, Any] = {
            k: Tensor(f"{name}.{k}", "float32", shape, _gather3(flat_m[k], start, numel, world))
            for k in ("exp_avg", "exp_avg_sq")
        }
        if step is not None:
            entry["step"] = step
        state[name] = entry
    group["params"] = [name for name, *_ in spans]
    return weights, {"state": state, "param_groups": [group]}


def _flat(tensors: list[Tensor], lengths: list[int] | None = None) -> _Flat:
    flat = _Flat()
    for i, t in enumerate(tensors):
        flat.add(t, lengths[i] if lengths else None)
    return flat


def _gather3(flats: list[_Flat], start: int, numel: int, world: int) -> list:
    """ZeRO-3: a parameter is ceil(numel / world) values at the same offset of every rank's flat vector."""
    part = math.ceil(numel / world)
    pieces = []
    for r in range(world):
        take = min(part, numel - r * part)
        if take > 0:
            pieces += flats[r].slice(start, take, dst=r * part * F32)
    return pieces


def _moments3(osds: list[dict], groups: list[list[Tensor]]) -> tuple[dict, Any, dict] | None:
    """Per rank, the inner optimizer's state per sub-group (exp_avg/exp_avg_sq laid out as fp32_flat_groups)."""
    flats: dict[str, list[_Flat]] = {"exp_avg": [], "exp_avg_sq": []}
    step: Any = None
    group: dict = {}
    for o, mine in zip(osds, groups, strict=True):
        inner = o.get("optimizer_state_dict")
        state = inner.get("state") if isinstance(inner, dict) else None
        if not isinstance(state, dict):
            return None
        subs = [state.get(i) for i in range(len(mine))]
        if not all(
            isinstance(sg, dict)
            and all(isinstance(sg.get(k), Tensor) and sg[k].numel == t.numel for k in flats)
            for sg, t in zip(subs, mine, strict=True)
        ):
            return None
        for k in flats:
            flats[k].append(_flat([sg[k] for sg in subs]))  # type: ignore[index]
        if step is None:
            step = subs[0].get("step") if subs else None  # type: ignore[union-attr]
            pg = inner.get("param_groups") if isinstance(inner, dict) else None
            group = dict(pg[0]) if isinstance(pg, list) and pg and isinstance(pg[0], dict) else {}
    return flats, step, group


def _buffers_and_shared(model: dict, weights: list[Tensor], notes: list[str]) -> list[Tensor]:
    out: list[Tensor] = []
    module = model.get("module")
    buffers = model.get("buffer_names")
    params = {t.name for t in weights}
    if isinstance(module, dict) and isinstance(buffers, list):
        for name in buffers:
            t = module.get(name)
            if str(name) in params:
                raise UsageError(
                    f"buffer_names lists {tp.shown(str(name))}, which is also a parameter's name: one "
                    "would replace the other; not converted"
                )
            if isinstance(t, Tensor):
                out.append(Tensor(str(name), t.dtype, t.shape, list(t.pieces), t.problem))
    frozen = model.get("frozen_param_shapes")
    if isinstance(frozen, dict) and frozen:
        notes.append(
            f"{len(frozen)} frozen parameter(s) are not converted (zero_to_fp32 reads them from "
            "frozen_param_fragments)"
        )
    shared = model.get("shared_params")
    by_name = {t.name: t for t in weights + out}
    if isinstance(shared, dict):
        for name, twin in shared.items():
            t = by_name.get(twin)
            if isinstance(name, str) and name in by_name:
                raise UsageError(
                    f"shared_params names {tp.shown(name)} as a copy of {tp.shown(str(twin))}, but "
                    f"{tp.shown(name)} is a parameter or buffer of its own: one would replace the other; "
                    "not converted"
                )
            if isinstance(name, str) and t is not None:
                out.append(Tensor(name, t.dtype, t.shape, list(t.pieces)))
    return out
