"""The survey and keep rules `prune` applies on any storage: what ROOT holds (`survey`), the keep
rules on it with the loss-spike guard (`plan_survey`), and the report (`report_of`).

`prune.py` (a local folder) and `prune_objects.py` (object storage) both use this module; only their
apply step differs. (It sits below both so neither imports the other's internals: no import cycle.)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from checkpoint_strategy import storage
from checkpoint_strategy.checkpoints import formats as fm
from checkpoint_strategy.checkpoints.marker import describe as describe_marker
from checkpoint_strategy.checkpoints.marker import read_marker
from checkpoint_strategy.checkpoints import retention as rt
from checkpoint_strategy.checkpoints import safety
from checkpoint_strategy.checkpoints.models import (
    CheckpointResult,
    Level,
    Problem,
    PruneEntry,
    PruneReport,
    PruneState,
    SpikeGuard,
)
from checkpoint_strategy.checkpoints.validate import check, check_with_values, compare_consecutive, usable

if TYPE_CHECKING:
    from checkpoint_strategy.checkpoints import deep as dp

FINAL_EXPORT_NAME = "."


# --------------------------------------------------------------------------- survey


@dataclass
class Survey:
    """What ROOT holds, as the keep rules need it."""

    root: str
    candidates: list[rt.Candidate] = field(default_factory=list)
    results: dict[str, CheckpointResult] = field(default_factory=dict)   # name -> validator result
    found: dict[str, fm.Found] = field(default_factory=dict)             # name -> discovery
    best: dict[str, str] = field(default_factory=dict)                   # name -> why it is the best
    templates: list[str] = field(default_factory=list)                   # Lightning filename templates
    emergency: dict[str, str] = field(default_factory=dict)              # name -> marker description
    final_export: str | None = None


def _hf_best(survey: Survey) -> None:
    """best_model_checkpoint named by any trainer_state.json in ROOT (each checkpoint's, and the
    run folder's own)."""
    states = [(os.path.join(survey.root, "trainer_state.json"), "the run folder's ")]
    for c in survey.candidates:
        f = survey.found.get(c.name)
        if f is not None and f.format == "hf-trainer" and not c.symlink and f.is_dir and not c.final_export:
            states.append((os.path.join(f.path, "trainer_state.json"), f"{c.name}/"))
    for path, where in states:
        try:
            data = storage.read_json(path, "trainer_state.json", limit=storage.MAX_TRAINER_STATE_BYTES,
                                     allow_nan=True, expect=dict)
        except storage.ReadError:
            continue
        name = data.get("best_model_checkpoint")
        if isinstance(name, str) and name.strip():
            best = os.path.basename(os.path.normpath(name))
            survey.best.setdefault(best, f"trainer's best: best_model_checkpoint in {where}trainer_state.json")


_PL_MONITOR = re.compile(r"^ModelCheckpoint\{.*'monitor': '([^']+)'")


def _lightning_best(survey: Survey) -> None:
    """Lightning's top-k: the newest valid .ckpt holds every ModelCheckpoint's state (read from
    the pickle's string constants, nothing runs). When one monitors a metric, the .ckpt paths
    in that state (best_model_path, best_k_models, kth_best_model_path) are the trainer's best."""
    from checkpoint_strategy.checkpoints import filechecks as fc

    newest = max((c for c in survey.candidates if c.layout == "lightning" and c.status == "valid"
                  and not c.symlink and c.step is not None and os.path.isfile(c.path)),
                 key=lambda c: (c.step, c.name), default=None)
    if newest is None:
        return
    _reasons, strings = fc.check_zip(newest.path, fc.Counter(), False, True)
    # monitor="step" (a rolling window, as `export` emits it) ranks by recency, not quality: not a best
    monitors = sorted({m.group(1) for x in strings if (m := _PL_MONITOR.match(x))} - {"step", "epoch", "global_step"})
    if not monitors:
        return
    names = {c.name for c in survey.candidates}
    for x in strings:
        name = x.replace("\\", "/").rsplit("/", 1)[-1]
        if x.endswith(".ckpt") and name in names:
            survey.best.setdefault(name, f"trainer's top-k by {', '.join(monitors)} (ModelCheckpoint state in "
                                         f"{newest.name})")


def _deep_verdicts(s: Survey, deep: list[tuple[int, str, CheckpointResult, dp.DeepOutcome | None]]) -> None:
    """Level deep: compare consecutive checkpoints (the norm jump needs the previous one), then a valid
    checkpoint failing the deep check (NaN/Inf, partial optimizer, norm jump) is invalid here: it never
    justifies a deletion."""
    compare_consecutive(deep)
    s.candidates = [replace(c, status="invalid") if c.name in s.results and not c.final_export
                    and c.status == "valid" and not usable(s.results[c.name]) else c for c in s.candidates]


def survey(root: str, level: str = "quick") -> Survey:
    """List ROOT (one level), classify every name, validate the recognised checkpoints."""
    s = Survey(root)
    found, unrecognised = fm.discover(root, max_depth=1)
    templates: set[str] = set()
    deep: list[tuple[int, str, CheckpointResult, dp.DeepOutcome | None]] = []  # level deep: norm jumps
    for f in found:
        if f.role == fm.FINAL_EXPORT:
            r = check(f, level)
            s.final_export = f.path
            s.found[FINAL_EXPORT_NAME], s.results[FINAL_EXPORT_NAME] = f, r
            s.candidates.append(rt.Candidate(FINAL_EXPORT_NAME, status=r.status, resumable=r.resumable,
                                             final_export=True, format=f.format, path=f.path))
            continue
        name = os.path.basename(f.path)
        m = rt.classify_name(name)
        symlink = os.path.islink(f.path) or not storage.inside(f.path, root)
        s.found[name] = f
        if m is None or symlink:  # never validated: kept whatever they hold
            s.candidates.append(rt.Candidate(name, m.step if m else None, m.layout if m else None,
                                             symlink=symlink, format=f.format, path=f.path))
            continue
        r, outcome = check_with_values(f, level)
        s.results[name] = r
        if m.step is not None:
            deep.append((m.step, name, r, outcome))
        if m.template and m.template != "last":
            templates.add(m.template)
        mark = read_marker(f.path)
        if mark is not None:  # post-event weights (callbacks): never counts towards keep_last/newest
            s.emergency[name] = describe_marker(mark)
        s.candidates.append(rt.Candidate(name, m.step, m.layout, r.status, r.resumable and mark is None, False,
                                         m.metrics, format=f.format, path=f.path))
    _deep_verdicts(s, deep)
    for name in unrecognised:
        path = os.path.join(root, name)
        s.candidates.append(rt.Candidate(name, None, None, symlink=os.path.islink(path), path=path))
    s.templates = sorted(templates)
    _hf_best(s)
    _lightning_best(s)
    return s


# --------------------------------------------------------------------------- loss spike

UNRESOLVED = safety.UNRESOLVED


def spike_guard(valid: list[tuple[int, str]], log: str | None = None,
                advise: safety.Adviser | None = None) -> SpikeGuard | None:
    """The training log read with the recovery adviser (`checkpoints.safety.read_spike`). When a
    loss spike has not recovered, the checkpoint `recover` would resume from must survive: spikes
    come after "best", and a rolling window rotates past them.

    valid: (step, path) of the valid checkpoints. advise: `checkpoint_strategy.recovery.advise` (passed in).
    """
    return safety.read_spike(valid, log, advise)


def spike_retention(guard: SpikeGuard | None, candidates: list[rt.Candidate]) -> dict:
    """Retention keywords from the spike guard: the rollback point, the checkpoint before each
    spike (recovered ones too), and the post-onset checkpoints that keep_last never counts."""
    if guard is None:
        return {}
    why = safety.do_not_resume(guard) + " (holds spiked weights); not counted by keep_last"
    post = {c.name: why for c in candidates
            if c.status == "valid" and c.layout and not c.symlink and safety.after_onset(c.step, guard)}
    pre = {n: w for n, w in guard.pre_spike.items() if n != guard.protected and n not in post}
    return dict(rollback=guard.protected, post_onset=post, pre_spike=pre,
                rollback_why=f"rollback point before the unrecovered loss spike at step {guard.onset_step}")


def _size(path: str) -> int:
    total = 0
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            return os.lstat(path).st_size
        for dirpath, _dirs, files in os.walk(path, followlinks=False):
            for n in files:
                try:
                    total += os.lstat(os.path.join(dirpath, n)).st_size
                except OSError:
                    pass
    except OSError:
        pass
    return total


@dataclass
class Outcome:
    deleted: dict[str, int] = field(default_factory=dict)       # name -> bytes freed
    failed: dict[str, str] = field(default_factory=dict)        # name -> why
    finished: list[str] = field(default_factory=list)           # journalled leftovers removed
    errors: list[Problem] = field(default_factory=list)
    half_deleted: list[str] = field(default_factory=list)       # still in the journal

    @property
    def freed(self) -> int:
        return sum(self.deleted.values())


def _entry(d: rt.Decision, s: Survey, out: Outcome | None) -> PruneEntry:
    c = d.candidate
    r = s.results.get(c.name)
    deleted = out is not None and c.name in out.deleted
    error = out.failed.get(c.name) if out is not None else None
    size = _size(c.path) if c.layout and not c.symlink and c.path else None
    return PruneEntry(path=storage.display(c.path), name=c.name, format=c.format, step=c.step,
                      status=r.status if r else None,
                      resumable=r.resumable if r else None, layout=c.layout, symlink=c.symlink, action=d.action,
                      bytes=size,
                      reasons=[x.text for x in d.reasons], reason_kinds=[x.kind for x in d.reasons],
                      justified_by=d.justified_by, deleted=deleted, error=error)


def plan_survey(s: Survey, keep_last: int, ms: list[int], log: str | None, spike_check: bool,
                protect: dict[str, str] | None,
                advise: safety.Adviser | None = None) -> tuple[rt.Plan, SpikeGuard | None]:
    """The keep rules on a survey (any storage): the spike guard first, then `retention.plan_prune`."""
    valid = [(c.step, c.path) for c in s.candidates
             if c.status == "valid" and c.step is not None and c.layout and not c.symlink]
    guard = spike_guard(valid, log, advise) if spike_check else None
    keep_emergency = spike_check and (guard is None or guard.status is None or guard.status in UNRESOLVED)
    why = ("kept, the spike's status is unknown (no training log read)" if guard is None or guard.status is None
           else f"kept until the loss spike at step {guard.onset_step} recovers")
    held = {n: f"{d}: {why}" for n, d in s.emergency.items()} if keep_emergency else {}
    retention = rt.Retention(keep_last=keep_last, milestones=frozenset(ms),
                             best={**s.best, **(protect or {}), **held}, **spike_retention(guard, s.candidates))
    return rt.plan_prune(s.candidates, retention), guard


def report_of(root: str, s: Survey, plan: rt.Plan, guard: SpikeGuard | None, out: Outcome | None, *, apply: bool,
              level: Level, keep_last: int, milestones: list[int], leftovers: tuple[list[str], list[str]],
              notes: list[str] | None = None, proposed: str | None = None) -> PruneReport:
    """The PruneReport of a survey, its plan and (with --apply) what was deleted."""
    entries = [_entry(d, s, out) for d in plan.decisions]
    keep = [e for e in entries if e.action == "keep"]
    delete = [e for e in entries if e.action == "delete"]
    state: PruneState = "dry_run"
    if out is not None:
        state = "half_deleted" if out.half_deleted else "failed" if out.errors else "done"
    best = sorted(s.best)
    if guard is not None:
        guard.log = storage.display(guard.log)
    return PruneReport(
        root=storage.display(root), applied=apply, level=level, keep_last=keep_last, milestones=milestones,
        best_checkpoint=best[0] if best else None,
        newest_valid=plan.newest.name if plan.newest else None, counts_resumable=plan.counts_resumable,
        final_export=storage.display(s.final_export) if s.final_export else None, lightning_templates=s.templates,
        keep=keep, delete=delete, leftovers=leftovers[0], foreign_leftovers=leftovers[1],
        reasons={e.name: e.reasons for e in entries},
        deleted=len(out.deleted) if out else 0, failed=len(out.failed) if out else 0,
        freed_bytes=out.freed if out else 0, state=state, proposed=proposed,
        bytes_to_free=sum(e.bytes or 0 for e in delete if not e.deleted),
        errors=out.errors if out else [], spike_guard=guard, notes=notes or [])
