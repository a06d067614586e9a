"""Hugging Face (the Trainer's checkpoint-N/ folders, save_pretrained folders): everything the package knows of them.

- names: ``checkpoint-N/`` (``tmp-checkpoint-N/`` in flight), or a folder with trainer_state.json, or model weights
  with optimizer.pt / config.json / an index (formats/identify.py; `HF_MODEL_STEMS` and the weight-file pattern live
  there, beside the run folder's final export);
- the checker (`CHECKERS`): the weights (safetensors, torch archives, every ``*.index.json`` shard present and
  holding the tensors the index places in it), FSDP shards (formats/dcp.py), a DeepSpeed ``global_stepN/``
  inside (formats/deepspeed.py), the optimizer/scheduler/rng pickles, trainer_state.json (the step, the best
  checkpoint) and the configs; the rng_state_<rank>.pth files the run's world size asks for
  (`rank_gap`, which validate, prune, recover, verify-resume and the callbacks all see through this checker);
- its own metadata: the world size training_args.bin records (`hf_args_world_size`).
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from checkpoint_strategy import storage
from checkpoint_strategy.formats import dcp, deepspeed
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.formats.base import Checker, Ctx, Layout
from checkpoint_strategy.formats.optstep import TorchArchive

_FSDP_OPTIM = re.compile(r"^optimizer_\d+$")


_RNG_STATE = re.compile(r"^rng_state.*\.pth$")


_HF_STATE_ZIPS = frozenset(("optimizer.pt", "scheduler.pt", "training_args.bin", "scaler.pt"))


@dataclass
class _HfNames:
    """The names of an HF Trainer folder that hold weights or shards, sorted into what each is."""

    weights: list[str] = field(default_factory=list)
    indexes: list[str] = field(default_factory=list)
    fsdp_model: list[str] = field(default_factory=list)
    fsdp_optim: list[str] = field(default_factory=list)
    ds_steps: list[str] = field(default_factory=list)


def _hf_names(listed: list[str], pre: str) -> _HfNames:
    """One pass over the sorted names; each pattern only on the names its literal start admits (`pre`: the
    folder joined with "")."""
    got = _HfNames()
    for n in listed:
        if n.startswith(fm.HF_MODEL_STEMS):
            if fm._HF_WEIGHTS.match(n):
                got.weights.append(n)
            if n.endswith(".index.json") and n.split(".")[0] in fm.HF_MODEL_STEMS:
                got.indexes.append(n)
            if n.startswith("pytorch_model_fsdp") and os.path.isdir(pre + n):
                got.fsdp_model.append(n)
        elif n.startswith("optimizer_"):
            if _FSDP_OPTIM.match(n) and os.path.isdir(pre + n):
                got.fsdp_optim.append(n)
        elif n.startswith("global_step") and fm._DS.match(n) and os.path.isdir(pre + n):
            got.ds_steps.append(n)
    return got


def _check_hf(ctx: Ctx, found: fm.Found) -> Layout:
    path = found.path
    out = Layout(step=found.step)
    got = (
        found.listing if found.listing is not None else fm.listing_types(path)
    )  # discover's, else one now
    listed, files = got if got is not None else ([], set())
    ctx.listed = listed if got is not None else None
    ctx.flat = ctx.flat and got is not None and len(files) == len(listed)
    names = set(listed)
    pre = os.path.join(
        path, ""
    )  # pre + a listed name (never holds a separator) is os.path.join(path, name)
    hf = _hf_names(listed, pre)
    for idx in hf.indexes:
        _check_hf_index(ctx, path, idx, names, idx in files)
    for w in hf.weights:
        if w.endswith(".safetensors"):
            ctx.safetensors(pre + w, regular=w in files)
        else:
            ctx.zip(pre + w, "weights", regular=w in files)
    for d in hf.fsdp_model:
        dcp.check_dcp_dir(ctx, os.path.join(path, d), role="weights")
    for d in hf.fsdp_optim:
        dcp.check_dcp_dir(ctx, os.path.join(path, d), role="optimizer")
    for d in hf.ds_steps:
        deepspeed.check_deepspeed_dir(ctx, os.path.join(path, d), out)
    if not hf.weights and not hf.fsdp_model and not hf.ds_steps and not hf.indexes:
        ctx.missing(
            os.path.join(path, "model.safetensors"),
            "model weights (model.safetensors, model-0000k-of-0000n.safetensors, pytorch_model.bin or FSDP folder)",
        )
    _check_hf_state_files(ctx, path, listed, names, files, out)
    out.resumable = "optimizer.pt" in names or bool(hf.fsdp_optim) or out.resumable
    if hf.fsdp_model or hf.fsdp_optim:
        out.sharded, out.portability = True, "fsdp"
    elif hf.ds_steps:
        out.sharded, out.portability = True, "zero"
    else:
        out.portability = "full" if out.resumable else "weights"
    return out


def _check_hf_index(ctx: Ctx, path: str, idx: str, names: set[str], regular: bool = False) -> None:
    """One *.index.json: a weight_map object whose every shard is a plain name present in the folder."""
    data = ctx.json(os.path.join(path, idx), regular=regular)
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict):
        if data is not None:  # None: unreadable JSON, ctx.json recorded why
            ctx.bad(os.path.join(path, idx), "index without a weight_map object")
        return
    shards: list = []
    for v in wm.values():
        if v not in shards:  # values may be unhashable (a list): no set()
            shards.append(v)
    for shard in sorted(shards, key=str):
        if not isinstance(shard, str) or "/" in shard or shard.startswith("."):
            ctx.bad(os.path.join(path, idx), f"weight_map names an invalid shard {shard!r}")
            continue
        if shard not in names:
            ctx.missing(os.path.join(path, shard), f"shard listed in {idx}")
        elif shard.endswith(".safetensors"):
            _check_index_names(
                ctx,
                os.path.join(path, idx),
                os.path.join(path, shard),
                [k for k, v in wm.items() if v == shard],
            )


def _check_index_names(ctx: Ctx, index: str, shard: str, keys: list) -> None:
    """Every tensor an index places in a safetensors shard is in that shard's header (the loader looks it up
    there: a name the shard lacks is a failed load)."""
    header = fc.safetensors_header(shard)
    if header is None:
        return  # an unreadable header is the shard's own problem (ctx.safetensors words it)
    lacking = [k for k in keys if k not in header or k == "__metadata__"]
    if lacking:
        ctx.bad(
            index,
            f"weight_map places {tp.shown(str(lacking[0]))!r} in {os.path.basename(shard)}, which does "
            f"not hold it{f' (and {len(lacking) - 1} more)' if len(lacking) > 1 else ''}",
        )


def _check_hf_state_files(
    ctx: Ctx, path: str, listed: list[str], names: set[str], files: set[str], out: Layout
) -> None:
    """The Trainer's other files: optimizer/scheduler/rng pickles, trainer_state.json (the step), the configs
    (`listed`: the folder's names sorted, `names` as a set; `files`: those its listing saw as regular files)."""
    pre = os.path.join(path, "")  # as in _check_hf
    for n in listed:
        if n in _HF_STATE_ZIPS or (n.startswith("rng_state") and _RNG_STATE.match(n)):
            z = ctx.zip(
                pre + n, "optimizer" if n == "optimizer.pt" else "other", regular=n in files
            )
            if n == "training_args.bin" and z.pickle is not None:
                ctx.args_world = hf_args_world_size(z.pickle.root)
    gap = rank_gap(
        path, listed, ctx.args_world
    )  # the run's world size says which rng_state_<rank>.pth must be here
    if gap is not None:
        ctx.missing(pre + gap.file, gap.what())
    if "trainer_state.json" in names:
        _check_trainer_state(ctx, pre + "trainer_state.json", "trainer_state.json" in files, out)
    elif fm._HF.match(os.path.basename(path)):
        ctx.missing(
            os.path.join(path, "trainer_state.json"),
            "trainer_state.json (the Trainer writes it with every checkpoint)",
        )
    for n in ("config.json", "generation_config.json", "adapter_config.json"):
        if n in names:
            ctx.json(pre + n, regular=n in files)


def _check_trainer_state(ctx: Ctx, file: str, regular: bool, out: Layout) -> None:
    """trainer_state.json: a JSON object; its best_model_checkpoint and global_step (the step) are kept."""
    state = ctx.json(file, storage.MAX_TRAINER_STATE_BYTES, regular)
    ctx.state_read = state is not None
    if state is not None and not isinstance(state, dict):
        ctx.bad(file, "not a JSON object")
    if not isinstance(state, dict):
        return
    if isinstance(state.get("best_model_checkpoint"), str):
        ctx.trainer_best = state["best_model_checkpoint"]
    if type(state.get("global_step")) is int:
        ctx.global_step = state["global_step"]
        if out.step is None:
            out.step = state["global_step"]


# --------------------------------------------------------------------------- the files each rank must write
# The one place that says which per-rank files a checkpoint must hold: the HF checker asks `rank_gap` for every
# checkpoint it checks, so `validate`, prune's survey, recover, verify-resume, release-gate and the callbacks'
# last_valid_checkpoint all see the same verdict. DCP shards are named by .metadata (checked against it) and ZeRO
# optimizer shards by dp_world_size in the model states (formats/deepspeed.py `zero_rank_gap`); the HF Trainer's
# rng_state_<rank>.pth files are named by nothing but the world size, read here.

_RNG_FILE = re.compile(r"^rng_state_(\d+)\.pth$")


_HF_DIR = re.compile(r"^checkpoint-(\d+)$")


#: the run's other checkpoints listed for its world size, nearest steps first (a torn save's neighbours were written
#: by the same launch; a bound on the cost: a run of thousands of checkpoints is not listed once per checkpoint)
MAX_SIBLINGS = 8


@dataclass
class RankGap:
    """Per-rank files a checkpoint lacks, and the world size of the run that says it must hold them."""

    missing: list[str]
    world: int
    evidence: str

    @property
    def file(self) -> str:
        return self.missing[0]

    def what(self) -> str:
        """The finding, after "missing: " (validate's wording for an unfinished save)."""
        ranks = [int(m.group(1)) for f in self.missing if (m := _RNG_FILE.match(f))]
        files = f"{len(ranks)} rank files ({_span_files(ranks)}): " if len(ranks) > 1 else ""
        who = f"rank {ranks[0]} did" if len(ranks) == 1 else f"ranks {_ranks(ranks)} did"
        return (
            f"{files}the run was saved by {self.world} processes ({self.evidence}); {who} not finish this "
            "save (not a resume point)"
        )


def _ranks(ranks: Sequence[int]) -> str:
    return (
        f"{ranks[0]}-{ranks[-1]}"
        if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1))
        else ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    )


def _span_files(ranks: Sequence[int]) -> str:
    return (
        f"rng_state_{ranks[0]}..{ranks[-1]}.pth"
        if ranks == list(range(ranks[0], ranks[-1] + 1))
        else ", ".join(f"rng_state_{r}.pth" for r in ranks[:4])
        + (", ..." if len(ranks) > 4 else "")
    )


def _hf_ranks(names: Sequence[str]) -> tuple[set[int], bool]:
    """(ranks of the rng_state_<rank>.pth files, a single rng_state.pth: saved by one process) of a listing."""
    ranks = {
        int(m.group(1)) for n in names if n.startswith("rng_state_") and (m := _RNG_FILE.match(n))
    }
    return ranks, "rng_state.pth" in names


def _consistent(ranks: set[int], single: bool) -> int | None:
    """The world size a complete HF save with these rng files was made by (0..N-1 with N >= 2, or the single
    file of one process), or None (a gap: that save is torn itself)."""
    if ranks and not single and ranks == set(range(len(ranks))) and len(ranks) >= 2:
        return len(ranks)
    return 1 if single and not ranks else None


def _run_steps(parent: str) -> list[tuple[int, str]]:
    """(step, name) of the checkpoint-N entries of `parent`, sorted: one listing per folder while it is unchanged
    (its mtime, link count and inode: an entry added or removed changes them), so checking every checkpoint of a
    run of thousands lists the run once, not once per checkpoint."""
    st = os.stat(parent)
    key = (st.st_mtime_ns, st.st_nlink, st.st_ino)
    hit = _RUN_STEPS.get(parent)
    if hit is not None and hit[0] == key:
        return hit[1]
    steps = sorted((int(m.group(1)), n) for n in os.listdir(parent) if (m := _HF_DIR.match(n)))
    if len(_RUN_STEPS) >= 16:
        _RUN_STEPS.clear()
    _RUN_STEPS[parent] = (key, steps)
    return steps


_RUN_STEPS: dict[str, tuple[tuple[int, int, int], list[tuple[int, str]]]] = {}


def sibling_ranks(path: str, limit: int = MAX_SIBLINGS) -> list[tuple[str, int]]:
    """(name, world size) of the other checkpoint-N folders of the run beside `path` whose rng files are a
    complete set, nearest step first (the `limit` nearest are listed; links and unreadable folders are not
    evidence)."""
    parent, me = os.path.split(os.path.normpath(os.path.abspath(path)))
    mine = _HF_DIR.match(me)
    at = int(mine.group(1)) if mine else 0
    try:
        steps = _run_steps(parent)
    except OSError:
        return []
    i = bisect.bisect_left(steps, (at, ""))
    window = [
        (abs(step - at), -step, name)
        for step, name in steps[max(0, i - limit) : i + limit + 1]
        if name != me
    ]
    out: list[tuple[str, int]] = []
    for _dist, _neg, name in sorted(window)[:limit]:
        folder = os.path.join(parent, name)
        if os.path.islink(folder):
            continue
        try:
            world = _consistent(*_hf_ranks(os.listdir(folder)))
        except OSError:
            continue
        if world is not None:
            out.append((name, world))
    return out


def rank_gap(path: str, names: Sequence[str], declared: int | None = None) -> RankGap | None:
    """The rng_state_<rank>.pth files an HF Trainer checkpoint lacks for the world size of its run, or None.

    `names`: the checkpoint folder's listing; `declared`: the processes its training_args.bin records
    (`hf_args_world_size`; rank 0 writes it first). A folder with no rng_state_<rank>.pth is a
    one-process save (rng_state.pth) or a model-only one: nothing per rank. Otherwise the world size is the
    declared one (2 or more) and, where that is not recorded, the largest complete set of rank files among the
    run's other checkpoints, never fewer than this folder's own highest rank + 1; the siblings are listed only
    when they are needed (no declared size) or to name one that holds every rank's file."""
    ranks, single = _hf_ranks(names)
    if not ranks:
        return None
    if declared is not None and declared > 1 and ranks >= set(range(declared)):
        return None  # the common case: every rank's file, no listing of the run
    siblings = sibling_ranks(path)
    if declared is not None and declared > 1:
        world, evidence = declared, [f"training_args.bin records {declared} processes"]
    else:
        best = max(siblings, key=lambda s: s[1], default=None)
        world = max(max(ranks) + 1, 2, best[1] if best else 0)
        evidence = (
            [] if best is None or best[1] < world else [f"{best[0]} has rng_state_0..{world - 1}"]
        )
        evidence = evidence or [f"this folder holds rng_state_{max(ranks)}.pth"]
    missing = sorted(set(range(world)) - ranks)
    if not missing:
        return None
    whole = next((name for name, w in siblings if w == world), None)
    if whole is not None and not any(whole in e for e in evidence):
        evidence.append(f"{whole} has rng_state_0..{world - 1}")
    return RankGap([f"rng_state_{r}.pth" for r in missing], world, "; ".join(evidence))


def checkpoint_rank_gap(path: str) -> RankGap | None:
    """`rank_gap` of one HF checkpoint-N folder on disk (its listing, its training_args.bin read as data); None for
    anything else or a folder that cannot be listed."""
    if not _HF_DIR.match(os.path.basename(os.path.normpath(path))) or not os.path.isdir(path):
        return None
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    return rank_gap(path, names, declared_world(path) if "training_args.bin" in names else None)


def declared_world(path: str) -> int | None:
    """The processes an HF checkpoint's training_args.bin records (read as data), or None."""
    args = os.path.join(path, "training_args.bin")
    return hf_args_world_size(TorchArchive(args).root) if storage.is_regular(args) else None


def expected_rank_files(run_root: str) -> dict[str, list[str]]:
    """checkpoint path -> the per-rank files it lacks, for every HF checkpoint-N folder directly under
    `run_root` that lacks any (the verdict validate reaches for each: `rank_gap`)."""
    out: dict[str, list[str]] = {}
    try:
        names = sorted(os.listdir(run_root))
    except OSError:
        return out
    for name in names:
        folder = os.path.join(run_root, name)
        gap = None if os.path.islink(folder) else checkpoint_rank_gap(folder)
        if gap is not None:
            out[folder] = gap.missing
    return out


def hf_args_world_size(root: object) -> int | None:
    """The number of processes an HF Trainer save was made by, from its training_args.bin read as data: the
    TrainingArguments pickle holds accelerate's PartialState as ``distributed_state`` (transformers 4.3x-5.x),
    whose ``num_processes`` is the world size (rank 0 writes the file, first of the save). None when not
    recorded (an older transformers, a hand-made file)."""
    state = getattr(root, "state", None)
    dist = state.get("distributed_state") if isinstance(state, dict) else None
    dist_state = getattr(dist, "state", None)
    n = dist_state.get("num_processes") if isinstance(dist_state, dict) else None
    return n if type(n) is int and 0 < n < 1_000_000 else None


def _check_hf_folder(ctx: Ctx, found: fm.Found) -> Layout:
    """The registered checker: a tmp-checkpoint-N is the Trainer's save in flight (from validate/engine.py's
    _precheck, which stops at a missing, dangling or file path first)."""
    path = found.path
    if os.path.basename(path).startswith("tmp-checkpoint-"):
        ctx.bad(
            path,
            "in-flight temporary folder tmp-checkpoint-N (the Trainer renames it when the save ends)",
            "incomplete",
        )
        return Layout(step=found.step)
    return _check_hf(ctx, found)


CHECKERS: dict[str, Checker] = {"hf-trainer": _check_hf_folder}
FOLDER_FORMATS: tuple[str, ...] = ("hf-trainer",)
TRACKERS: dict[str, tuple[str, Callable[[str], str | None]]] = {}
