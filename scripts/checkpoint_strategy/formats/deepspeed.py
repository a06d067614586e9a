"""DeepSpeed: everything the package knows of its checkpoints.

- names: ``global_stepN/`` with a ``latest`` file beside it naming it; a universal checkpoint (``ds_to_universal``
  output, e.g. ``global_stepN_universal/`` named by ``latest_universal``) holds ``zero/<param>/fp32.pt``,
  ``exp_avg.pt``, ... (formats/identify.py tells them; `TRACKERS` reads the two tracker files);
- the checker (`CHECKERS`): the model states ``mp_rank_XX_model_states.pt`` and the ZeRO optimizer shards
  ``zero_pp_rank_<dp>_mp_rank_<mp>_optim_states.pt``, every data-parallel rank's file present for the
  ``dp_world_size`` the model states record (`zero_rank_gap`); a universal checkpoint's per-parameter folders whole;
  `check_deepspeed_dir`: the same check of a ``global_stepN/`` inside an HF Trainer or Lightning checkpoint;
- its own metadata, read as data: the ZeRO stage and data-parallel size (`deepspeed_zero_layout`), the parameter
  names (`deepspeed_param_names`) and the engine's ``global_steps`` (`deepspeed_global_steps`) of the model states.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence

from checkpoint_strategy import storage
from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats.base import Checker, Ctx, Layout, ls


def _check_deepspeed(ctx: Ctx, found: fm.Found) -> Layout:
    out = Layout(step=found.step)
    if fm.is_ds_universal(found.path):
        _check_ds_universal(ctx, found.path, out)
    else:
        check_deepspeed_dir(ctx, found.path, out)
    return out


UNIVERSAL_STATE = ("fp32.pt", "exp_avg.pt", "exp_avg_sq.pt")


def _check_ds_universal(ctx: Ctx, path: str, out: Layout) -> None:
    """A DeepSpeed universal checkpoint, whole: the model states, zero/optimizer_state.pt, and one folder per
    parameter (the model states' param_shapes) holding fp32.pt and the same optimizer state files as every
    other parameter (Adam: exp_avg.pt with exp_avg_sq.pt; step.pt)."""
    names = ls(path)
    zero = os.path.join(path, "zero")
    model = [n for n in names if model_states(n, shards=True)]
    if not model:
        ctx.missing(os.path.join(path, MODEL_STATES), "model states (mp_rank_XX_model_states.pt)")
    expected_params: set[str] = set()
    for n in model:
        z = ctx.zip(os.path.join(path, n), "mixed")
        expected_params |= deepspeed_param_names(z.pickle.root if z.pickle is not None else None)
        out.step = (
            out.step
            if out.step is not None
            else deepspeed_global_steps(z.pickle.root if z.pickle else None)
        )
    inner = ls(zero)
    if "optimizer_state.pt" in inner:
        ctx.zip(os.path.join(zero, "optimizer_state.pt"))
    else:
        ctx.missing(
            os.path.join(zero, "optimizer_state.pt"),
            "common optimizer state (ds_to_universal writes zero/optimizer_state.pt)",
        )
    params = _universal_params(ctx, path, zero, inner)
    for name in sorted(expected_params - set(params)):
        ctx.missing(
            os.path.join(zero, name, "fp32.pt"),
            f"folder of parameter {name} (listed in the model states)",
        )
    wanted = _universal_files(params)
    for name, files in sorted(params.items()):
        for f in sorted(wanted - set(files)):
            ctx.missing(
                os.path.join(zero, name, f),
                "optimizer state file every other parameter has"
                if f != "fp32.pt"
                else "fp32 weights of this parameter",
            )
        for f in sorted(n for n in files if n.endswith(".pt")):
            p = os.path.join(zero, name, f)
            if storage.inside(p, path):
                ctx.zip(p, "optimizer", tensor=f"{name}.{f[:-3]}")
            else:
                ctx.bad(p, "a symbolic link to outside the checkpoint folder: not read")
    out.resumable = bool(params) and any(
        "exp_avg.pt" in f or "step.pt" in f for f in params.values()
    )
    out.sharded, out.portability = False, "ds-universal"
    ctx.counter.notes.append(
        f"DeepSpeed universal checkpoint: {len(params)} parameter folders under zero/"
    )
    if expected_params and set(params) - expected_params:
        extra = sorted(set(params) - expected_params)
        ctx.counter.notes.append(
            f"zero/ holds {len(extra)} folder(s) of parameters the model states do not list "
            f"(first: {extra[0]}): left from another model?"
        )


def _universal_params(ctx: Ctx, path: str, zero: str, inner: list[str]) -> dict[str, list[str]]:
    """Parameter folder -> its file names; a folder linked to outside the checkpoint is a problem, not read."""
    params: dict[str, list[str]] = {}
    for n in inner:
        folder = os.path.join(zero, n)
        if not os.path.isdir(folder):
            continue
        if not storage.inside(folder, path):
            ctx.bad(folder, "a symbolic link to outside the checkpoint folder: not read")
            continue
        params[n] = ls(folder)
    return params


def _universal_files(params: dict[str, list[str]]) -> set[str]:
    """The files every parameter folder must hold: fp32.pt, and each state file any of them has (Adam's two
    moments together)."""
    wanted = {"fp32.pt"} | {f for files in params.values() for f in files if f.endswith(".pt")}
    if wanted & {"exp_avg.pt", "exp_avg_sq.pt"}:
        wanted |= {"exp_avg.pt", "exp_avg_sq.pt"}
    return wanted


def check_deepspeed_dir(ctx: Ctx, path: str, out: Layout) -> None:
    names = ls(path)
    model = [n for n in names if model_states(n, shards=True)]
    optim = [n for n in names if n.endswith("_optim_states.pt")]
    if not model:
        ctx.missing(os.path.join(path, MODEL_STATES), "model states (mp_rank_XX_model_states.pt)")
    for n in sorted(model + optim):
        ctx.zip(
            os.path.join(path, n), "mixed" if n in model else "optimizer", flat="zero_pp_rank" in n
        )
    states_pkl = zip_pickle(os.path.join(path, model[0])) if model else None
    ctx.counter.bytes_read += len(states_pkl or b"")
    stage, dp = deepspeed_zero_layout(states_pkl) if states_pkl else (None, None)
    if stage and not optim:
        ctx.missing(
            os.path.join(path, "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
            f"ZeRO stage {stage} optimizer shards (the model states were saved with ZeRO; a copy without "
            "them cannot resume)",
        )
    if optim:
        out.resumable = True
    gap = zero_rank_gap(
        names, dp, stage
    )  # the model states' dp_world_size says which rank files must be here
    if gap is not None:
        ctx.missing(os.path.join(path, gap[0]), gap[1])
    out.sharded = bool(optim and any("zero_pp_rank" in n for n in optim)) or len(model) > 1
    out.portability = "zero" if out.sharded else ("full" if optim else "weights")


def _ds_tracked(text: str) -> str | None:
    """The folder a DeepSpeed `latest` tag's (stripped) text names: DeepSpeed joins it to the folder; None when
    it can load nothing from it (an empty tag, '.', '..')."""
    return None if text in ("", ".", "..") else text


#: the files DeepSpeed writes into a global_stepN folder: the model states (and at ZeRO-3 one per data-parallel rank),
#: the ZeRO optimizer shards (``bf16_`` under the bf16 optimizer), and the tag files beside it naming the newest step
ZERO_FILE = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(optim|model)_states\.pt$")
MODEL_STATES = "mp_rank_00_model_states.pt"
LATEST = "latest"
LATEST_UNIVERSAL = "latest_universal"


def model_states(name: str, shards: bool = False) -> bool:
    """A DeepSpeed model-states file: ``mp_rank_XX_model_states.pt`` (each model-parallel rank writes one); with
    `shards`, ZeRO-3's per-rank ``zero_pp_rank_<dp>_mp_rank_<mp>_model_states.pt`` too (any ``*_model_states.pt``)."""
    return name.endswith("_model_states.pt") and (shards or name.startswith("mp_rank_"))


def zero_shard(name: str, kind: str) -> tuple[int, int] | None:
    """(data-parallel rank, model-parallel rank) of a ZeRO shard file of `kind` ("optim": a
    ``[bf16_]zero_pp_rank_<dp>_mp_rank_<mp>_optim_states.pt``; "model": ZeRO-3's ``zero_pp_rank_<dp>_mp_rank_<mp>_
    model_states.pt``), or None."""
    m = ZERO_FILE.match(name)
    if m is None or m.group(4) != kind or (kind == "model" and m.group(1)):
        return None
    return int(m.group(2)), int(m.group(3))


def zero_rank_gap(
    names: Sequence[str], dp: int | None, stage: int | None
) -> tuple[str, str] | None:
    """(file, what) of the first ZeRO per-rank file a DeepSpeed global_stepN folder lacks, or None. Each data-parallel
    rank writes ``zero_pp_rank_<rank>_mp_rank_<mp>_optim_states.pt`` (and, at ZeRO-3, ``..._model_states.pt``);
    the data-parallel size is ``dp_world_size`` in the model states (`dp`, DeepSpeed's own record), else one past
    the highest rank present. A kind of file (optim or model) none of the ranks wrote is not asked for here."""
    by_kind: dict[tuple[str, int, str], set[int]] = {}
    for n in names:
        m = ZERO_FILE.match(n)
        if m:
            by_kind.setdefault((m.group(1) or "", int(m.group(3)), m.group(4)), set()).add(
                int(m.group(2))
            )
    for (prefix, mp, kind), ranks in sorted(
        by_kind.items(), key=lambda t: (t[0][2] != "optim", t[0][1], t[0][0])
    ):
        world = max(max(ranks) + 1, dp if dp and (stage or kind == "optim") else 0)
        missing = sorted(set(range(world)) - ranks)
        if missing:
            what = "optimizer shard" if kind == "optim" else "ZeRO-3 model-state shard"
            record = (
                f"dp_world_size {dp} in the model states"
                if dp == world
                else f"rank {max(ranks)} wrote one"
            )
            return (
                f"{prefix}zero_pp_rank_{missing[0]}_mp_rank_{mp:02d}_{kind}_states.pt",
                f"{what} for ZeRO rank {missing[0]} (ranks present: {sorted(ranks)}; the run's data-parallel "
                f"size is {world}: {record}); a rank did not finish this save",
            )
    return None


MAX_MODEL_STATES_PICKLE = 64 << 20


def deepspeed_zero_layout(data_pkl: bytes) -> tuple[int | None, int | None]:
    """(ZeRO stage, data-parallel world size) from mp_rank_XX_model_states.pt's data.pkl, read as opcodes.

    DeepSpeed 0.19.8 stores `dp_world_size` and the whole `ds_config` (with `zero_optimization.stage`) in
    the model states; (None, None) when they cannot be read. Nothing is unpickled."""
    tokens = _opcode_tokens(data_pkl)
    if tokens is None:
        return None, None

    def int_after(i: int) -> int | None:
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        return nxt if isinstance(nxt, int) else None

    dp = stage = None
    for i, tok in enumerate(tokens):
        if tok == "dp_world_size" and dp is None:
            dp = int_after(i)
        elif tok == "zero_optimization" and stage is None:
            for j in range(i + 1, min(i + 60, len(tokens))):
                if tokens[j] == "stage":
                    stage = int_after(j)
                    break
    return stage, dp


_MEMO_PUT = frozenset(("BINPUT", "LONG_BINPUT", "PUT"))


_MEMO_GET = frozenset(("BINGET", "LONG_BINGET", "GET"))


_INT_OPS = frozenset(("BININT", "BININT1", "BININT2", "LONG1", "INT"))


def _opcode_tokens(data_pkl: bytes) -> list[object] | None:
    """The pickle's values in opcode order, as far as a flat scan tells them: strings and ints (a memo fetch gives
    the value it stored), None for everything else; at most 2,000,000. None when the pickle is broken (the zip
    check reports that, not this)."""
    import pickletools

    tokens: list[object] = []
    memo: dict[object, object] = {}
    last: object = None
    try:
        for op, arg, _pos in pickletools.genops(data_pkl):
            name = op.name
            if name in _MEMO_PUT or name == "MEMOIZE":
                memo[arg if name != "MEMOIZE" else len(memo)] = last
                continue
            if name == "STOP":
                break
            last = _token(name, arg, memo)
            tokens.append(last)
            if len(tokens) > 2_000_000:
                break
    except Exception:  # noqa: BLE001 - a broken pickle is reported by the zip check, not here
        return None
    return tokens


def _token(name: str, arg: object, memo: dict[object, object]) -> object:
    """The value one opcode pushes, where a flat scan can tell it (see _opcode_tokens)."""
    if name in _MEMO_GET:
        return memo.get(arg)
    if isinstance(arg, str) and "UNICODE" in name:
        return arg
    if name in _INT_OPS and isinstance(arg, int) and not isinstance(arg, bool):
        return arg
    return None


def deepspeed_param_names(root: object) -> set[str]:
    """Trainable parameter names in DeepSpeed model states (param_shapes: a list of {name: torch.Size}, read as
    data). Frozen parameters (frozen_param_shapes) are not among them: ds_to_universal writes no zero/ folder
    for them."""
    shapes = root.get("param_shapes") if isinstance(root, dict) else None
    groups = shapes if isinstance(shapes, list) else [shapes]
    return {k for g in groups if isinstance(g, dict) for k in g if isinstance(k, str)}


def deepspeed_global_steps(root: object) -> int | None:
    """The engine's global_steps recorded in DeepSpeed model states, or None."""
    v = root.get("global_steps") if isinstance(root, dict) else None
    return v if type(v) is int and v >= 0 else None


def zip_pickle(path: str) -> bytes | None:
    """The data.pkl bytes of a torch zip archive (regular files only, bounded), or None."""
    try:
        with storage.open_regular(path, "checkpoint file") as fh:
            parsed = zr.read_directory(fh, fh.seek(0, 2))
            if isinstance(parsed, str):
                return None
            entry = next((e for e in parsed[0] if e.name.endswith("data.pkl")), None)
            if (
                entry is None
                or zr.local_headers(fh, [entry], parsed[1], zr.Counter(), False) is not None
            ):
                return None
            data = zr.read_entry(fh, entry, zr.Counter(), limit=MAX_MODEL_STATES_PICKLE)
        return data if isinstance(data, bytes) else None
    except (OSError, storage.ReadError):
        return None


CHECKERS: dict[str, Checker] = {"deepspeed": _check_deepspeed}
FOLDER_FORMATS: tuple[str, ...] = ("deepspeed",)
TRACKERS: dict[str, tuple[str, Callable[[str], str | None]]] = {
    LATEST: ("deepspeed", _ds_tracked),
    LATEST_UNIVERSAL: ("deepspeed", _ds_tracked),
}
