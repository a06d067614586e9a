"""Which training log belongs to a run folder: the one answer every command (validate, prune, recover,
verify-resume, release-gate, handoff) and both training callbacks use when no ``--log`` is given.

    find_run_log(folder, checkpoints=None)   # path of the log (a TensorBoard log: its folder), or None

Order (the first kind found wins; an explicit ``--log`` is the caller's and comes before all of them):

1. ``trainer_state.json`` (HF Trainer). Given the run's valid checkpoints (``checkpoints``, (step, path)):
   the newest one's; else the newest of the folder's own and its checkpoint folders' up to two levels down
   (`newest_state`: the highest checkpoint-N; the folder's own only when at least as recent).
2. The callbacks' own loss log (`METRICS_FILE`, written beside the checkpoints by the Lightning callback).
3. Lightning's ``metrics.csv`` (CSVLogger).
4. TensorBoard event files (``events.out.tfevents.*``): the folder holding the newest one.

Kinds 2-4 are looked for in the log places of the folder, in this order: the folder itself; its parent
when the folder is named ``checkpoints`` (Lightning's default ModelCheckpoint folder is
``<logger folder>/version_N/checkpoints``, and that version folder is the run's own logger folder: only
its own entries are read, nothing above it); the folder's ``checkpoints/``; and the newest logger version
folder under it (``version_N`` or ``*/version_N``, e.g. ``lightning_logs/version_N`` under the Trainer's
``default_root_dir``: the highest N) with its ``checkpoints/``. Event files further down (two levels, HF's
``runs/<date>/``) are the last resort. Sub-folders named with a number at the end (checkpoint-N,
global_stepN, ...; ``version_N`` excepted) are never listed. A set-aside loss log
(``.checkpoint-strategy-metrics.previous.jsonl``, an earlier fit's) is never read.

    versioned_checkpoint_dirs(path)          # Lightning rerun: the version folders' checkpoints/, newest first
    find_run_checkpoints(log)                # the converse: the checkpoints next to a log (recover's default)

And what the run says about itself, from the JSON files next to its log (never ``training_args.bin``, a
pickle; read through `storage`; missing or unreadable: no facts, never an error):

    run_facts(log)                 # Facts: trainer_state.json's max_steps, save_steps, global_step, ...
                                   # (when the log is one), then training_args.json's max_grad_norm,
                                   # learning_rate, batch sizes next to it or in the run folder above
    trainer_state_facts(path)      # the trainer_state.json part alone; still_running(facts)

Below `recovery` (which reads the log) so that `retention.safety` can ask it too (docs/DEVELOPING.md,
Layers). Finding the log and the checkpoints opens nothing (`find_run_checkpoints` lists folders with
`formats.steps.scan`); only the facts read files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from checkpoint_strategy import storage
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.steps import parse_step, scan

#: the callbacks' own loss log (Lightning writes none the checkpoints carry), beside the checkpoints
METRICS_FILE = ".checkpoint-strategy-metrics.jsonl"
LIGHTNING_CSV = "metrics.csv"
TRAINER_STATE = "trainer_state.json"
EVENTS = "events.out.tfevents"

_VERSION = re.compile(r"version_(\d+)$")


def find_run_log(
    folder: str | os.PathLike, checkpoints: Optional[Sequence[tuple[Optional[int], str]]] = None
) -> Optional[str]:
    """The training log of the run in `folder` (see the module docstring), or None.

    checkpoints: (step, path) of the run's valid checkpoints (the commands that validated them pass
    them): HF's log is then the newest one's trainer_state.json, never an invalid one's."""
    p = Path(folder)
    if not p.is_dir():
        return None
    state = checkpoint_state(checkpoints) if checkpoints is not None else _state_under(p)
    if state is not None:
        return state
    subs = _subfolders(p)  # listed once
    places = log_places(p, subs)
    for name in (METRICS_FILE, LIGHTNING_CSV):
        for place in places:
            if (place / name).is_file():
                return str(place / name)
    return _events(places, subs)


def log_places(folder: Path, subs: Optional[list[Path]] = None) -> list[Path]:
    """The folders a run folder's loss log may sit in, most specific first (module docstring).
    subs: `_subfolders(folder)` when the caller listed it already."""
    places = [folder]
    if folder.name == "checkpoints" and folder.parent != folder:
        places.append(folder.parent)
    places.append(folder / "checkpoints")
    version = newest_version(folder, subs)
    if version is not None:
        places += [version, version / "checkpoints"]
    return [q for q in dict.fromkeys(places) if q.is_dir()]


def newest_version(folder: Path, subs: Optional[list[Path]] = None) -> Optional[Path]:
    """The logger version folder with the highest N directly under `folder` or one level below it
    (``lightning_logs/version_N``), or None."""
    subs = _subfolders(folder) if subs is None else subs
    best: Optional[tuple[int, str]] = None
    for q in subs + [
        q for parent in subs if not _VERSION.match(parent.name) for q in _subfolders(parent, True)
    ]:
        m = _VERSION.match(q.name)
        if m and (best is None or (int(m.group(1)), str(q)) > best):
            best = (int(m.group(1)), str(q))
    return Path(best[1]) if best is not None else None


def _subfolders(folder: Path, numbered: bool = False) -> list[Path]:
    """The folders directly in a run folder a log folder may be: not hidden, and (unless `numbered`, for the
    level below one of these) not named with a number at the end unless ``version_N`` (checkpoint-N,
    global_stepN, step_N, iter_N, numeric Orbax steps hold no log folder: 2000 of them cost no listing each;
    a logger named like ``exp2`` is found when it is named itself)."""
    try:
        with os.scandir(folder) as it:
            return [
                Path(e.path)
                for e in it
                if not e.name.startswith(".")
                and e.is_dir(follow_symlinks=False)
                and (numbered or not e.name[-1:].isdigit() or _VERSION.match(e.name) is not None)
            ]
    except OSError:
        return []


def _event_files(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as it:
            return [Path(e.path) for e in it if e.name.startswith(EVENTS) and e.is_file()]
    except OSError:
        return []


def checkpoint_state(checkpoints: Sequence[tuple[Optional[int], str]]) -> Optional[str]:
    """The newest of these checkpoints' trainer_state.json (one stat each, newest first)."""
    for _s, path in sorted(
        checkpoints, key=lambda t: (t[0] is not None, t[0] or 0, t[1]), reverse=True
    ):
        state = os.path.join(path, TRAINER_STATE)
        if storage.is_regular(state):
            return state
    return None


def _state_under(p: Path) -> Optional[str]:
    states: list[Path] = []
    for pattern in (TRAINER_STATE, f"*/{TRAINER_STATE}", f"*/*/{TRAINER_STATE}"):
        states.extend(q for q in p.glob(pattern) if q.is_file())
    return str(newest_state(states)) if states else None


def newest_state(states: list[Path]) -> Path:
    """The checkpoint-N folder with the highest step wins (mtimes change under `cp -r`); a
    trainer_state.json without a step in its folder name (the run folder's own, written when
    training ends) wins only when it is at least as recent as that checkpoint's."""
    numbered: list[tuple[int, float, Path]] = []
    plain: list[tuple[int, float, Path]] = []
    for q in states:
        m = re.search(r"(\d+)$", q.parent.name)
        (numbered if m else plain).append((int(m.group(1)) if m else -1, _mtime(q), q))
    best = max(numbered, key=lambda t: t[:2], default=None)
    newest_plain = max(plain, key=lambda t: t[1], default=None)
    if newest_plain is not None and (best is None or newest_plain[1] >= best[1]):
        return newest_plain[2]
    assert best is not None, "states is not empty"
    return best[2]


def _mtime(q: Path) -> float:
    try:
        return q.stat().st_mtime
    except OSError:
        return 0.0


def _events(places: list[Path], subs: list[Path]) -> Optional[str]:
    """The folder holding the newest TensorBoard event file: in the log places, else up to two levels down
    (`subs`, the run folder's `_subfolders`: HF's ``runs/<date>/``; checkpoint folders are not looked into)."""
    found = [q for place in places for q in _event_files(place)]
    if not found:
        for sub in subs:
            found += _event_files(sub)
            for below in _subfolders(sub, True):
                found += _event_files(below)
    return str(max(found, key=lambda q: (_mtime(q), q.name)).parent) if found else None


def versioned_checkpoint_dirs(path: str | os.PathLike) -> list[str]:
    """Lightning's default layout, ``<logger folder>/version_N/checkpoints`` (a rerun makes version_N+1 and
    starts from step 0): the checkpoint folders a resume may come from, newest version first. `path` a version
    folder: its own checkpoints/, then the earlier versions'; its checkpoints/ (made or not yet): the earlier
    versions'; the logger folder (``lightning_logs``) or the folder holding it (``default_root_dir``): every
    version's. [] for any other folder. Names only."""
    p = Path(path)
    own: Optional[Path] = None
    up = _VERSION.match(p.parent.name) if p.name == "checkpoints" else None
    here = _VERSION.match(p.name)
    if up is not None:
        loggers, below = [p.parent.parent], int(up.group(1))
    elif here is not None:
        own, loggers, below = p, [p.parent], int(here.group(1))
    else:
        loggers, below = [p, *_subfolders(p)], -1
    versions = []
    for logger in loggers:
        for q in _subfolders(logger):
            m = _VERSION.match(q.name)
            if m and (below < 0 or int(m.group(1)) < below):
                versions.append((int(m.group(1)), str(q)))
    dirs = ([own] if own is not None else []) + [
        Path(v) for _n, v in sorted(versions, reverse=True)
    ]
    return [str(d / "checkpoints") for d in dirs if (d / "checkpoints").is_dir()]


# --------------------------------------------------------------------------- the converse: a log's checkpoints


def find_run_checkpoints(
    log_path: str | os.PathLike,
) -> tuple[str, Optional[str], list[tuple[int, Optional[str]]]]:
    """Checkpoints next to the log: the log folder, the run folder above a checkpoint folder, or the log
    folder's checkpoints/ (Lightning's metrics.csv or event files in ``version_N/``, its checkpoints in
    ``version_N/checkpoints``). A run folder with none there: next to the log found in it
    (`find_run_log`, e.g. ``default_root_dir/lightning_logs/version_N``). ("folder", root, [(step, path)]), or
    ("none", None, []). The converse of `find_run_log`, here beside it: recover's log path asks this module both
    questions and goes no further."""
    got = _next_to(Path(log_path))
    if got[0] == "none" and Path(log_path).is_dir():
        found = find_run_log(log_path)
        if found is not None and Path(found) != Path(log_path):
            return _next_to(Path(found))
    return got


def _next_to(p: Path) -> tuple[str, Optional[str], list[tuple[int, Optional[str]]]]:
    base = p if p.is_dir() else p.parent
    candidates = [base]
    if parse_step(base.name) is not None or base.name in ("checkpoints",):
        candidates.append(base.parent)
    candidates.append(base / "checkpoints")
    for root in candidates:
        if root.is_dir():
            try:
                found = scan(root)
            except UsageError:
                continue
            if found:
                return "folder", str(root), list(found)
    return "none", None, []


_STATE_KEYS = ("max_steps", "save_steps", "global_step", "logging_steps", "train_batch_size")
_ARGS_KEYS = (
    "max_grad_norm",
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_steps",
    "save_steps",
    "save_total_limit",
)


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
        if (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and v == v
            and abs(v) != float("inf")
            and v > 0
        ):
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
    facts = trainer_state_facts(
        log_path
        if os.path.basename(log_path) == "trainer_state.json" or os.path.isdir(log_path)
        else None
    )
    return training_args_facts([folder, os.path.dirname(folder)], facts)


def still_running(facts: Facts) -> bool:
    """The log's global_step is short of max_steps: the run is still writing checkpoints (or crashed)."""
    g, m = facts.int("global_step"), facts.int("max_steps")
    return g is not None and m is not None and g < m
