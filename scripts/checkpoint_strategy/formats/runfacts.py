"""What a run says about itself, and ready shell commands that act on its checkpoints.

- ``trainer_state_facts(path)``: max_steps, save_steps, global_step, ... from an HF
  ``trainer_state.json`` (JSON; read through `storage`).
- ``training_args_facts(folder)``: max_grad_norm, learning_rate, batch sizes from a
  ``training_args.json`` next to the log or in the run folder. ``training_args.bin`` is a pickle
  and is never read.
- ``launcher()``: how to run checkpoint-strategy in a later session (the launcher's absolute
  path, else ``python3 -m checkpoint_strategy``), never a bare name that may not be on PATH.
- ``pin_command`` / ``move_aside_command``: printed for the user, never executed here.
- ``rank_gap(path, names, declared)``: the per-rank files (HF ``rng_state_<rank>.pth``) a checkpoint lacks for the
  world size of its run (training_args.bin, the run's other checkpoints); validate asks it for every HF
  checkpoint, so every command and callback sees a torn multi-process save as incomplete.
  ``expected_rank_files(run_root)``: the same for a whole run folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from checkpoint_strategy import storage

_STATE_KEYS = ("max_steps", "save_steps", "global_step", "logging_steps", "train_batch_size")
_ARGS_KEYS = ("max_grad_norm", "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps",
              "max_steps", "save_steps", "save_total_limit")


@dataclass
class Facts:
    """Numbers a run's own files state, and the file each came from."""

    values: dict[str, float] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)

    def get(self, key: str) -> Optional[float]:
        return self.values.get(key)

    def int(self, key: str) -> Optional[int]:
        v = self.values.get(key)
        return int(v) if v is not None and float(v).is_integer() and v > 0 else None


def _numbers(data: dict, keys: Sequence[str], path: str, facts: Facts) -> Facts:
    for k in keys:
        v = data.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf") and v > 0:
            facts.values.setdefault(k, v)
            facts.source.setdefault(k, path)
    return facts


def trainer_state_facts(path: Optional[str], facts: Optional[Facts] = None) -> Facts:
    """max_steps, save_steps, global_step, logging_steps, train_batch_size of a trainer_state.json
    (a folder: its trainer_state.json). Missing or unreadable: no facts (never an error)."""
    facts = facts or Facts()
    if path is None:
        return facts
    if os.path.isdir(path):
        path = os.path.join(path, "trainer_state.json")
    try:
        data = storage.read_json(path, "trainer_state.json", allow_nan=True, expect=dict)
    except storage.ReadError:
        return facts
    return _numbers(data, _STATE_KEYS, path, facts)


def training_args_facts(folders: Sequence[str], facts: Optional[Facts] = None) -> Facts:
    """max_grad_norm, learning_rate, batch sizes from the first training_args.json found in
    `folders` (JSON only: training_args.bin is a pickle and is never read)."""
    facts = facts or Facts()
    for folder in folders:
        path = os.path.join(folder, "training_args.json")
        if not storage.is_regular(path):
            continue
        try:
            data = storage.read_json(path, "training_args.json", allow_nan=True, expect=dict)
        except storage.ReadError:
            continue
        return _numbers(data, _ARGS_KEYS, path, facts)
    return facts


def run_facts(log_path: Optional[str]) -> Facts:
    """trainer_state.json facts of the log (when it is one), then training_args.json next to it
    or in the run folder above it."""
    if log_path is None:
        return Facts()
    folder = log_path if os.path.isdir(log_path) else os.path.dirname(os.path.abspath(log_path))
    facts = trainer_state_facts(log_path if os.path.basename(log_path) == "trainer_state.json"
                                or os.path.isdir(log_path) else None)
    return training_args_facts([folder, os.path.dirname(folder)], facts)


def still_running(facts: Facts) -> bool:
    """The log's global_step is short of max_steps: the run is still writing checkpoints (or crashed)."""
    g, m = facts.int("global_step"), facts.int("max_steps")
    return g is not None and m is not None and g < m


def _quote(text: str) -> str:
    import shlex   # the commands printed for a user to run only (start-up time)

    return shlex.quote(text)


def launcher() -> str:
    """The command that runs checkpoint-strategy in any later shell: python3 and the skill
    launcher's absolute path when it exists, else `python3 -m checkpoint_strategy`."""
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # .../scripts/checkpoint_strategy
    path = os.path.join(os.path.dirname(here), "checkpoint-strategy")
    if os.path.isfile(path):
        return f"python3 {_quote(path)}"
    return "python3 -m checkpoint_strategy"


def pinned_name(path: str) -> str:
    """Where a pinned copy goes: beside it, outside the checkpoint-* namespace the trainer rotates
    (HF save_total_limit globs checkpoint-*; prune never deletes a name it does not recognise)."""
    p = os.path.abspath(path)
    return os.path.join(os.path.dirname(p), "pinned-" + os.path.basename(p))


def pin_command(path: str) -> str:
    return f"cp -a {_quote(os.path.abspath(path))} {_quote(pinned_name(path))}"


def move_aside_command(paths: Sequence[str], root: Optional[str], onset: Optional[int]) -> Optional[str]:
    """mkdir + mv of the post-onset checkpoints into ROOT/post-spike-<onset>/ (outside the
    checkpoint-* namespace: no trainer resumes from them by accident)."""
    if not paths:
        return None
    base = os.path.abspath(root or os.path.dirname(os.path.normpath(paths[0])))
    dest = os.path.join(base, f"post-spike-{onset}" if onset is not None else "post-spike")
    moved = " ".join(_quote(os.path.abspath(p)) for p in paths)
    return f"mkdir -p {_quote(dest)} && mv {moved} {_quote(dest)}/"


# --------------------------------------------------------------------------- the files each rank must write
# The one place that says which per-rank files a checkpoint must hold: validate's HF checker asks `rank_gap` for
# every checkpoint it checks, so `validate`, prune's survey, recover, verify-resume, release-gate and the callbacks'
# last_valid_checkpoint all see the same verdict. DCP shards are named by .metadata (checked against it) and ZeRO
# optimizer shards by dp_world_size in the model states (validate's DeepSpeed checker); the HF Trainer's
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
        return (f"{files}the run was saved by {self.world} processes ({self.evidence}); {who} not finish this "
                "save (not a resume point)")


def _ranks(ranks: Sequence[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)) \
        else ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")


def _span_files(ranks: Sequence[int]) -> str:
    return f"rng_state_{ranks[0]}..{ranks[-1]}.pth" if ranks == list(range(ranks[0], ranks[-1] + 1)) else \
        ", ".join(f"rng_state_{r}.pth" for r in ranks[:4]) + (", ..." if len(ranks) > 4 else "")


def _hf_ranks(names: Sequence[str]) -> tuple[set[int], bool]:
    """(ranks of the rng_state_<rank>.pth files, a single rng_state.pth: saved by one process) of a listing."""
    ranks = {int(m.group(1)) for n in names if n.startswith("rng_state_") and (m := _RNG_FILE.match(n))}
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
    import bisect

    parent, me = os.path.split(os.path.normpath(os.path.abspath(path)))
    mine = _HF_DIR.match(me)
    at = int(mine.group(1)) if mine else 0
    try:
        steps = _run_steps(parent)
    except OSError:
        return []
    i = bisect.bisect_left(steps, (at, ""))
    window = [(abs(step - at), -step, name) for step, name in steps[max(0, i - limit): i + limit + 1] if name != me]
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
    (framework_layouts.hf_args_world_size; rank 0 writes it first). A folder with no rng_state_<rank>.pth is a
    one-process save (rng_state.pth) or a model-only one: nothing per rank. Otherwise the world size is the
    declared one (2 or more) and, where that is not recorded, the largest complete set of rank files among the
    run's other checkpoints, never fewer than this folder's own highest rank + 1; the siblings are listed only
    when they are needed (no declared size) or to name one that holds every rank's file."""
    ranks, single = _hf_ranks(names)
    if not ranks:
        return None
    if declared is not None and declared > 1 and ranks >= set(range(declared)):
        return None                                   # the common case: every rank's file, no listing of the run
    siblings = sibling_ranks(path)
    if declared is not None and declared > 1:
        world, evidence = declared, [f"training_args.bin records {declared} processes"]
    else:
        best = max(siblings, key=lambda s: s[1], default=None)
        world = max(max(ranks) + 1, 2, best[1] if best else 0)
        evidence = [] if best is None or best[1] < world else [f"{best[0]} has rng_state_0..{world - 1}"]
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
    from checkpoint_strategy.formats.frameworks import hf_args_world_size
    from checkpoint_strategy.formats.optstep import TorchArchive

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
