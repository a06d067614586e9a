"""Recognise checkpoints by layout (names and one folder listing; nothing is opened here).

Recognised (documented names of each framework):
  hf-trainer  checkpoint-N/ (or a folder with trainer_state.json / model*.safetensors + optimizer.pt)
  lightning   *.ckpt file (torch zip) or *.ckpt/ folder (sharded strategies)
  nemo        a checkpoint with a `<name>-unfinished` marker beside it, or a folder with weights/ + context/
  torch       *.pt / *.pth / *.bin file (torch.save zip archive)
  safetensors *.safetensors file
  dcp         folder with .metadata and/or __R_N.distcp (torch.distributed.checkpoint); the checker labels
              it torchtitan when its .metadata carries torchtitan's markers (formats/dcp.py torchtitan_marked)
  orbax       N/ or prefix_N/ with _CHECKPOINT_METADATA or commit_success.txt; *.orbax-checkpoint-tmp-* in flight
  deepspeed   global_stepN/ (with a `latest` file beside it); a universal checkpoint (ds_to_universal output,
              e.g. global_stepN_universal/ named by `latest_universal`): zero/<param>/fp32.pt, exp_avg.pt, ...
  megatron    iter_NNNNNNN/ (with latest_checkpointed_iteration.txt beside it)
An HF output_dir holding checkpoint-N/ folders is a run folder (`is_run_folder`): `discover` returns
its checkpoints plus, when it has top-level weights, its final export (role FINAL_EXPORT).
Names starting with '.deleting-' (a prune in progress) and other hidden names are ignored.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

DELETING_PREFIX = ".deleting-"
MANIFEST_NAME = "integrity.json"
MANIFEST_SUFFIX = ".integrity.json"
# emergency marker beside a checkpoint file (formats/marker.py)
EMERGENCY_SUFFIX = ".checkpoint-strategy.json"
NEMO_UNFINISHED = "-unfinished"
ORBAX_TMP = ".orbax-checkpoint-tmp"
FINAL_EXPORT = "final-export"

_HF = re.compile(r"^(?:tmp-)?checkpoint-(\d+)$")
_STEP = re.compile(r"^step[-_=]?(\d+)$")
_DS = re.compile(r"^global_step(\d+)$")
_MEG = re.compile(r"^iter_(\d+)$")
_ORBAX = re.compile(r"^(?:.*?_)?(\d+)$")
_ORBAX_TMP = re.compile(r"^(?:.*?_)?(\d+)?\.orbax-checkpoint-tmp(?:-\d+)?$")
_NUM_IN_NAME = [
    re.compile(r"(?:^|[^a-z])step[=_-]?(\d+)", re.I),
    re.compile(r"checkpoint-(\d+)"),
    re.compile(r"global_step(\d+)"),
    re.compile(r"iter_(\d+)"),
    re.compile(r"(?:^|[^a-z])epoch[=_-]?(\d+)", re.I),
]
#: the stems of HF weight files (and of their *.index.json files)
HF_MODEL_STEMS = ("model", "pytorch_model", "adapter_model")
_HF_WEIGHTS = re.compile(rf"^({'|'.join(HF_MODEL_STEMS)})(-\d+-of-\d+)?\.(safetensors|bin)$")
_TORCH_EXT = (".pt", ".pth")


@dataclass(frozen=True)
class Found:
    path: str
    format: str
    step: int | None
    is_dir: bool
    role: str = "checkpoint"  # or FINAL_EXPORT: a run folder's own top-level model files
    # discover's listing of an HF Trainer folder: (names sorted, those it saw as regular files); the checker uses
    # it instead of listing the folder again
    listing: tuple[list[str], set[str]] | None = field(default=None, compare=False, repr=False)


def step_from_name(name: str) -> int | None:
    for rx in (_HF, _STEP, _DS, _MEG):
        m = rx.match(name)
        if m:
            return int(m.group(1))
    for rx in _NUM_IN_NAME[:-1]:
        m = rx.search(name)
        if m:
            return int(m.group(1))
    return None


def ignored(name: str) -> bool:
    return (
        name.startswith(".")
        or name.endswith(MANIFEST_SUFFIX)
        or name == MANIFEST_NAME
        or name.endswith(EMERGENCY_SUFFIX)
    )


def listdir(path: str) -> list[str] | None:
    try:
        return os.listdir(path)
    except OSError:
        return None


def identify(
    path: str,
    names: list[str] | None = None,
    is_dir: bool | None = None,
    siblings: set[str] | None = None,
) -> Found | None:
    """What checkpoint `path` is, or None. Looks at the name and (for folders) one listing. A caller that listed
    the folder holding `path` passes what it saw: `is_dir` (a folder, not a link: no stat) and the folder's names
    (`siblings`: no lstat for NeMo's -unfinished marker beside it)."""
    return _identify(path, os.path.basename(os.path.normpath(path)), names, is_dir, siblings)


def _identify(
    path: str,
    base: str,
    names: list[str] | None,
    is_dir: bool | None,
    siblings: set[str] | None,
    listing: tuple[list[str], set[str]] | None = None,
) -> Found | None:
    """`identify`, `base` the name of `path` (os.path.basename(os.path.normpath(path))), given; `listing`: the
    folder's (`listing_types`), kept on an hf-trainer Found for the checker (`names` is then its names)."""
    if base.startswith(DELETING_PREFIX):
        return None
    if _ORBAX_TMP.match(base) or ORBAX_TMP in base:
        m = re.match(r"^(?:.*?_)?(\d+)\.orbax", base)
        return Found(path, "orbax", int(m.group(1)) if m else None, os.path.isdir(path))
    if not is_dir:
        try:
            is_dir = os.path.isdir(path)
            exists = is_dir or os.path.lexists(path)
        except OSError:
            return None
        if not exists:
            return None
    if not is_dir:
        return _identify_file(path, base)
    return _identify_folder(path, base, names, siblings, listing)


def _identify_folder(
    path: str,
    base: str,
    names: list[str] | None,
    siblings: set[str] | None,
    listing: tuple[list[str], set[str]] | None,
) -> Found | None:
    """`identify` of a folder (`base`: its name), from its name, its names (listed here when not given) and
    NeMo's -unfinished marker beside it (looked up in `siblings` when given)."""
    # listed here: the listing is kept on an hf-trainer Found, so the checker lists no more
    if names is None:
        listing = listing_types(path)
        names = listing[0] if listing is not None else []
    nameset = set(names)
    if _unfinished_beside(path, base, siblings):
        return Found(path, "nemo", step_from_name(base), True)
    if base.lower().endswith(".ckpt"):
        return Found(path, "lightning", step_from_name(base), True)
    if "weights" in nameset and "context" in nameset:
        return Found(path, "nemo", step_from_name(base), True)
    m = _HF.match(base)
    if m or "trainer_state.json" in nameset:
        return Found(
            path,
            "hf-trainer",
            int(m.group(1)) if m else step_from_name(base),
            True,
            "checkpoint",
            listing,
        )
    if _DS.match(base) or ("zero" in nameset and is_ds_universal(path)):
        return Found(path, "deepspeed", step_from_name(base), True)
    if _MEG.match(base):
        return Found(path, "megatron", step_from_name(base), True)
    if "_CHECKPOINT_METADATA" in nameset or "commit_success.txt" in nameset:
        m = _ORBAX.match(base)
        return Found(path, "orbax", int(m.group(1)) if m else None, True)
    if ".metadata" in nameset or any(n.endswith(".distcp") for n in names):
        # torchtitan or a plain loop's DCP save: only the .metadata's keys tell (the checker reads them)
        return Found(path, "dcp", step_from_name(base), True)
    if _hf_weights_folder(names, nameset):
        return Found(path, "hf-trainer", step_from_name(base), True, "checkpoint", listing)
    return _empty_step_folder(path, base, names)


def _empty_step_folder(path: str, base: str, names: list[str]) -> Found | None:
    """A folder named like a step (step_N, N) and empty: in-flight or broken, still a checkpoint slot."""
    if _STEP.match(base) or (_ORBAX.match(base) and base.isdigit()):
        if not names:
            fmt = "orbax" if base.isdigit() else "dcp"
            return Found(path, fmt, step_from_name(base) if not base.isdigit() else int(base), True)
    return None


def _hf_weights_folder(names: list[str], nameset: set[str]) -> bool:
    """Whether a folder of `names` holds HF weights saved with an optimizer, a config or an index (a sharded
    save_pretrained / save_torch_state_dict folder: its index names every shard)."""
    return any(_HF_WEIGHTS.match(n) for n in names) and (
        "optimizer.pt" in nameset
        or "config.json" in nameset
        or any(n.endswith(".index.json") for n in names)
    )


def _unfinished_beside(path: str, base: str, siblings: set[str] | None) -> bool:
    """Whether NeMo's -unfinished marker sits beside `path` (named `base`): looked up in `siblings` (the names of
    the folder holding it) when given, else one lstat."""
    if siblings is not None:
        return unfinished_name(base) in siblings
    return os.path.lexists(unfinished_marker(path))


def _identify_file(path: str, base: str) -> Found | None:
    """`identify` of a file (`base`: its name)."""
    low = base.lower()
    if low.endswith(".safetensors"):
        return Found(path, "safetensors", step_from_name(base), False)
    if low.endswith(".ckpt"):
        fmt = "nemo" if os.path.lexists(unfinished_marker(path)) else "lightning"
        return Found(path, fmt, step_from_name(base), False)
    if (
        low.endswith(_TORCH_EXT)
        and not _HF_WEIGHTS.match(base)
        and base not in ("optimizer.pt", "scheduler.pt", "training_args.bin", "rng_state.pth")
    ):
        return Found(path, "torch", step_from_name(base), False)
    if _HF.match(base) or _DS.match(base) or _MEG.match(base):
        # a file where a checkpoint folder is expected: report it as that format
        fmt = "hf-trainer" if _HF.match(base) else "deepspeed" if _DS.match(base) else "megatron"
        return Found(path, fmt, step_from_name(base), False)
    return None


def is_ds_universal(path: str) -> bool:
    """A DeepSpeed universal checkpoint (deepspeed.checkpoint.ds_to_universal output): a zero/ folder holding
    optimizer_state.pt or per-parameter folders with fp32.pt (two listings, nothing opened)."""
    zero = os.path.join(path, "zero")
    inner = listdir(zero) if os.path.isdir(zero) and not os.path.islink(zero) else None
    if not inner:
        return False
    if "optimizer_state.pt" in inner:
        return True
    first = next((n for n in sorted(inner) if os.path.isdir(os.path.join(zero, n))), None)
    return first is not None and "fp32.pt" in (listdir(os.path.join(zero, first)) or [])


def resume_order(path: str | None) -> tuple[int, str]:
    """Sort key among checkpoints of one step: the one a plain resume loads first. A DeepSpeed universal checkpoint
    loads only with ``checkpoint.load_universal: true`` (its ``global_stepN`` twin loads as saved), so at an equal
    step the twin is named; then by path, so the choice never depends on listing or set order."""
    return (1 if path is not None and is_ds_universal(path) else 0, path or "")


def unfinished_marker(path: str) -> str:
    """NeMo's marker path: checkpoint path minus .nemo/.ckpt/-EMA, plus '-unfinished'."""
    p = os.path.normpath(path)
    for suffix in (".nemo", ".ckpt", "-EMA"):
        if p.endswith(suffix):
            p = p[: -len(suffix)]
    return p + NEMO_UNFINISHED


def unfinished_name(name: str) -> str:
    """The name of NeMo's marker beside a checkpoint named `name`: os.path.basename(unfinished_marker(path)) for
    any path whose last name is `name` (the suffixes hold no separator)."""
    for suffix in (".nemo", ".ckpt", "-EMA"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name + NEMO_UNFINISHED


def is_run_folder(found: Found) -> bool:
    """True for an HF Trainer output_dir: a folder recognised as hf-trainer by its own top-level
    files (model.safetensors, config.json, trainer_state.json) that also holds checkpoint-N/
    folders. Its top-level files are the final export; the checkpoint-N/ folders are the run's
    checkpoints."""
    if (
        found.format != "hf-trainer"
        or not found.is_dir
        or _HF.match(os.path.basename(os.path.normpath(found.path)))
    ):
        return False
    try:
        with os.scandir(found.path) as it:
            return any(_HF.match(e.name) and e.is_dir(follow_symlinks=False) for e in it)
    except OSError:
        return False


def discover(root: str, max_depth: int = 3) -> tuple[list[Found], list[str]]:
    """Checkpoints at or under root (not following symlinked folders), plus unrecognised names
    directly under root. Does not descend into recognised checkpoints."""
    found = identify(root)
    results: list[Found] = []
    if found is not None:
        if not is_run_folder(found):
            return [found], []
        # an HF output_dir: its own top-level weights are the final export, its children the checkpoints
        if any(
            _HF_WEIGHTS.match(n) or n.endswith(".safetensors.index.json")
            for n in listdir(root) or []
        ):
            results.append(Found(found.path, found.format, None, True, FINAL_EXPORT))
    unrecognised: list[str] = []
    _walk(root, 0, max_depth, results, unrecognised)
    if found is not None:  # a run folder: its top-level weight files belong to the final export
        top = os.path.normpath(root)
        results = [
            f
            for f in results
            if f.is_dir
            or os.path.dirname(os.path.normpath(f.path)) != top
            or not _HF_WEIGHTS.match(os.path.basename(f.path))
        ]
    results.sort(key=lambda f: (f.step is None, f.step if f.step is not None else 0, f.path))
    return results, unrecognised


def listing_types(path: str) -> tuple[list[str], set[str]] | None:
    """A folder's names (sorted) and those the listing itself saw as regular files (scandir's entry type, no stat;
    a link is not one): a file check may skip its stat before the open (storage.read_small's ``regular``). None:
    not listed."""
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError:
        return None
    try:  # (is_file needs a stat only where the folder's file system gives no entry type; that can fail)
        files = {e.name for e in entries if e.is_file(follow_symlinks=False)}
    except OSError:
        files = set()
        for e in entries:
            try:
                if e.is_file(follow_symlinks=False):
                    files.add(e.name)
            except OSError:
                pass
    names = [e.name for e in entries]
    names.sort()
    return names, files


def _walk(
    folder: str, depth: int, max_depth: int, results: list[Found], unrecognised: list[str]
) -> None:
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    siblings = {e.name for e in entries}
    for entry in entries:
        name = entry.name
        if name.startswith(DELETING_PREFIX):
            continue
        if (
            (name.startswith(".") and ORBAX_TMP not in name)
            or name.endswith(MANIFEST_SUFFIX)
            or name == MANIFEST_NAME
            or name.endswith(NEMO_UNFINISHED)
            or name.endswith(EMERGENCY_SUFFIX)
        ):
            continue
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        listing = listing_types(entry.path) if is_dir else None
        found = _identify(
            entry.path,
            name,
            listing[0] if listing else [] if is_dir else None,
            is_dir or None,
            siblings,
            listing,
        )
        if found is not None:
            results.append(found)
            continue
        if is_dir and depth + 1 < max_depth and not entry.is_symlink():
            before = len(results)
            _walk(entry.path, depth + 1, max_depth, results, [])
            if len(results) > before:
                continue
        if depth == 0:
            unrecognised.append(name)
