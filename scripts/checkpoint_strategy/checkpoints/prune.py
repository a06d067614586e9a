"""Validated retention for a local checkpoint folder: survey -> plan_prune -> apply_prune.

- ``survey(root, level)`` lists ROOT once, matches every name against the known layouts
  (`retention.classify_name`), validates the recognised checkpoints and reads what the trainer
  says is best; it returns `retention.Candidate`s.
- ``retention.plan_prune`` decides (pure keep rules; shared with the callbacks and any other
  storage).
- ``apply_prune(root, plan, ...)`` deletes what the plan marks, crash-safely:

  1. the batch ``[{"name", "renamed": ".deleting-<random>"}, ...]`` is written to the journal
     ``ROOT/.checkpoint-strategy-prune.json`` (one atomic write);
  2. each checkpoint (and its ``.integrity.json`` sidecar) is renamed to its hidden name - one
     atomic rename in the same folder, outside the recognised namespace - and removed;
  3. the journal is rewritten with only what is left half deleted (removed when empty).

  A crash leaves either the intact checkpoint or a journalled ``.deleting-*`` leftover that the
  next ``prune --apply`` finishes. A ``.deleting-*`` name not in the journal was not made by
  prune and is never touched. A deletion that fails half-way stays in the journal: the report
  says "half deleted, rerun prune --apply to finish" and the command exits 1.

The whole run holds an exclusive lock on ROOT (``storage.locking``, an flock on the folder
itself): a second prune waits ``lock_timeout`` seconds, then exits 2 with one line.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from checkpoint_strategy import storage
from checkpoint_strategy.atomic import atomic_write_text, fsync_dir
from checkpoint_strategy.checkpoints import formats as fm
from checkpoint_strategy.checkpoints.marker import describe as describe_marker
from checkpoint_strategy.checkpoints.marker import read_marker
from checkpoint_strategy.checkpoints import retention as rt
from checkpoint_strategy.checkpoints import safety
from checkpoint_strategy.checkpoints.models import (
    CheckpointPolicy,
    CheckpointResult,
    Level,
    Problem,
    PruneEntry,
    PruneReport,
    PruneState,
    PruneSuggestion,
    SpikeGuard,
)
from checkpoint_strategy.checkpoints.validate import check, check_with_values, compare_consecutive, usable
from checkpoint_strategy.errors import UsageError

if TYPE_CHECKING:
    from checkpoint_strategy.checkpoints import deep as dp

JOURNAL = ".checkpoint-strategy-prune.json"
LOCK_TIMEOUT_SECONDS = 5.0
_RENAMED = re.compile(r"^\.deleting-[0-9a-f]{16}$")
FINAL_EXPORT_NAME = "."


def load_policy(path: str | os.PathLike) -> CheckpointPolicy:
    """The checkpoint policy in a plan (YAML or JSON), the handoff state file or a bare mapping
    (`checkpoint_strategy.policyfile.load_policy_file`)."""
    from checkpoint_strategy.policyfile import load_policy_file

    return load_policy_file(path, "--policy").policy


def _home_folders() -> set[str]:
    homes = {"/", "/root", "/home", os.path.expanduser("~")}
    try:
        import pwd

        homes |= {e.pw_dir for e in pwd.getpwall() if e.pw_dir and e.pw_dir != "/nonexistent"}
    except Exception:  # noqa: BLE001
        pass
    return {os.path.realpath(h) for h in homes if h}


def check_root(root: str) -> str:
    """The real path of a folder that may be pruned, or UsageError (exit 2)."""
    if root == "":
        raise UsageError("ROOT: empty path; expected the folder that holds the checkpoints")
    if not os.path.lexists(root):
        raise UsageError(f"{root}: no such folder; expected the folder that holds the checkpoints")
    real = os.path.realpath(root)
    if not os.path.isdir(real):
        raise UsageError(f"{root}: is a file; expected the folder that holds the checkpoints")
    if real in _home_folders():
        raise UsageError(f"{root}: refusing to prune / or a home folder; pass the run's checkpoint folder")
    found = fm.identify(real)
    if found is not None and not fm.is_run_folder(found):
        raise UsageError(f"{root}: is itself a checkpoint; pass the folder that holds the checkpoints")
    return real


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
    latest: str | None = None                                            # what the resume pointer names
    latest_why: str = ""
    notes: list[str] = field(default_factory=list)                       # links out of ROOT, pointer trouble
    suggestion: PruneSuggestion | None = None                           # nothing freed: a smaller keep_last


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


def _link(root: str, name: str) -> tuple[bool, str | None, bool]:
    """(symlink, the ROOT entry it resolves into, resolves outside ROOT) for the entry `name` of ROOT.
    Only the link text is resolved (os.path.realpath); nothing it points at is opened."""
    path = os.path.join(root, name)
    if not os.path.islink(path):
        return False, None, False     # a real entry of ROOT (a real path): inside by construction
    real = os.path.realpath(path)
    if os.path.normpath(real) == os.path.normpath(os.path.realpath(root)):
        return True, None, False      # a link to ROOT itself: kept, names no checkpoint
    if not storage.inside(real, root):
        return True, None, True
    return True, os.path.relpath(real, os.path.realpath(root)).split(os.sep)[0], False


def _describe_links(s: Survey) -> None:
    for c in s.candidates:
        if c.outside and c.symlink:
            try:
                target = os.readlink(os.path.join(s.root, c.name))
            except OSError:
                target = "?"
            s.notes.append(f"{c.name} is a symlink to {target}, outside ROOT: reported, not followed, never deleted")
        elif c.symlink and c.links_to and c.links_to not in {x.name for x in s.candidates}:
            s.notes.append(f"{c.name} is a symlink to {c.links_to}, which does not exist (dangling): kept")


#: resume pointers: (file in ROOT, the framework, the layout of the names it holds)
_POINTERS = (("latest", "DeepSpeed", "deepspeed"), ("latest_checkpointed_iteration.txt", "Megatron-LM", "megatron"))


def _resume_pointer(s: Survey) -> None:
    """DeepSpeed's `latest` (a tag name) / Megatron's tracker file (an iteration): the checkpoint resuming loads."""
    for fname, framework, layout in _POINTERS:
        path = os.path.join(s.root, fname)
        if not os.path.lexists(path) or os.path.islink(path):
            continue
        try:
            text = storage.read_bytes(path, fname, limit=4096).decode("utf-8", "replace").strip()
        except storage.ReadError as exc:
            s.notes.append(f"{fname}: {exc}; ignored (nothing in ROOT is taken as in flight)")
            continue
        name = text if fname == "latest" else (f"iter_{int(text):07d}" if text.isdigit() else text)
        m = rt.classify_name(name)
        if m is None or m.step is None or m.layout != layout:
            s.notes.append(f"{fname} names {text[:60]!r}, not a {framework} checkpoint name; ignored")
            continue
        s.latest = name
        s.latest_why = f"named by {fname} ({framework} resumes from it)"
        if name not in {c.name for c in s.candidates}:
            s.notes.append(f"{fname} names {name}, which is not in ROOT: newer checkpoints are treated as in flight")
        return


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
        link, links_to, outside = _link(root, name) if os.path.dirname(f.path) == root else (False, None, True)
        symlink = link or outside
        s.found[name] = f
        if m is None or symlink:  # never validated: kept whatever they hold
            s.candidates.append(rt.Candidate(name, m.step if m else None, m.layout if m else None,
                                             symlink=symlink, format=f.format, path=f.path, links_to=links_to,
                                             outside=outside))
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
        link, links_to, outside = _link(root, name)
        s.candidates.append(rt.Candidate(name, None, None, symlink=link, path=os.path.join(root, name),
                                         links_to=links_to, outside=outside))
    s.templates = sorted(templates)
    _describe_links(s)
    _resume_pointer(s)
    _hf_best(s)
    _lightning_best(s)
    return s


# --------------------------------------------------------------------------- loss spike

UNRESOLVED = safety.UNRESOLVED


def spike_guard(valid: list[tuple[int, str]], log: str | None = None) -> SpikeGuard | None:
    """The training log read with the recovery adviser (`checkpoints.safety.read_spike`). When a
    loss spike has not recovered, the checkpoint `recover` would resume from must survive: spikes
    come after "best", and a rolling window rotates past them.

    valid: (step, path) of the valid checkpoints.

    A log that was there when the survey looked and is gone (or unreadable) when it is read is a
    UsageError: prune refuses rather than deleting without the spike check (issue 29).
    """
    guard = safety.read_spike(valid, log)
    if guard is not None and guard.status is None and not _readable(guard.log):
        raise UsageError(f"training log {storage.display(guard.log)} disappeared (or became unreadable) while prune "
                         "read it: nothing deleted; rerun, or pass --log FILE (or --no-spike-check)")
    return guard


def _readable(path: str) -> bool:
    return storage.is_regular(path) and os.access(path, os.R_OK)


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


# --------------------------------------------------------------------------- journal


def _journal_path(root: str) -> str:
    return os.path.join(root, JOURNAL)


def read_journal(root: str) -> list[dict]:
    """Pending deletions recorded by an earlier prune: [{"name", "renamed", "sidecar"}]."""
    path = _journal_path(root)
    if not os.path.lexists(path):
        return []
    what = "prune journal"
    data = storage.read_json(path, what, limit=16 << 20, expect=dict)
    pending = data.get("pending")
    ok = isinstance(pending, list) and all(
        isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("renamed"), str)
        and _RENAMED.match(e["renamed"]) and e.get("sidecar") in (None, e["renamed"] + fm.MANIFEST_SUFFIX)
        for e in pending)
    if not ok:
        raise UsageError(f"{what} {path}: not a list of .deleting-<16 hex> entries; nothing was deleted "
                         "(it records prune's half-deleted checkpoints: inspect it, then move it away)")
    return list(pending)


def _write_journal(root: str, pending: list[dict]) -> None:
    path = _journal_path(root)
    if pending or not os.path.lexists(path):
        import json

        atomic_write_text(path, json.dumps({"version": 1, "pending": pending}, indent=1, ensure_ascii=False) + "\n")
    if not pending:
        os.unlink(path)
        fsync_dir(root)


def _clean_journal_temps(root: str) -> None:
    """Temp files of a journal write killed mid-way (we hold the lock: nobody else writes one)."""
    prefix = "." + JOURNAL + "."
    for name in os.listdir(root):
        if name.startswith(prefix) and name.endswith(".tmp"):
            path = os.path.join(root, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)


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


def _remove(path: str) -> None:
    """Remove a renamed-away checkpoint (file or folder) without following symlinks."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


# --------------------------------------------------------------------------- apply


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


def _finish(root: str, pending: list[dict], out: Outcome) -> list[dict]:
    """Remove the journalled leftovers of an earlier prune; returns the entries still pending."""
    left = []
    for e in pending:
        try:
            for name in (e["renamed"], e.get("sidecar")):
                if name and os.path.lexists(os.path.join(root, name)):
                    _remove(os.path.join(root, name))
        except OSError as exc:
            out.errors.append(Problem(file=e["renamed"], reason=f"half deleted ({e['name']}): "
                                      f"{storage.describe_os_error(exc)}; rerun prune --apply to finish"))
            left.append(e)
            continue
        out.finished.append(e["renamed"])
    return left


def _entry_for(root: str, name: str) -> dict:
    renamed = fm.DELETING_PREFIX + secrets.token_hex(8)
    sidecar = os.path.lexists(os.path.join(root, name + fm.MANIFEST_SUFFIX))
    return {"name": name, "renamed": renamed, "sidecar": renamed + fm.MANIFEST_SUFFIX if sidecar else None}


def _delete_one(root: str, entry: dict, out: Outcome) -> bool:
    """Rename then remove one journalled checkpoint. True when something is left half deleted."""
    name, renamed = entry["name"], entry["renamed"]
    src = os.path.join(root, name)
    size = _size(src)
    try:
        os.rename(src, os.path.join(root, renamed))
    except OSError as exc:
        out.failed[name] = f"could not delete: {storage.describe_os_error(exc)}; the checkpoint is intact"
        return False
    try:
        if entry["sidecar"]:
            os.rename(src + fm.MANIFEST_SUFFIX, os.path.join(root, entry["sidecar"]))
        fsync_dir(root)
        for n in (renamed, entry["sidecar"]):
            if n:
                _remove(os.path.join(root, n))
    except OSError as exc:
        out.failed[name] = (f"half deleted (left as {renamed}): {storage.describe_os_error(exc)}; "
                            "rerun prune --apply to finish")
        return True
    out.deleted[name] = size
    return False


def recheck_level(level: str) -> Level:
    """The level a checkpoint that justifies deletions is checked at right before anything is deleted:
    at least full (the CRC-32 of every file), whatever level the survey used (issue 29: a byte flipped
    in optimizer.pt passes the quick level)."""
    return "deep" if level == "deep" else "full"


def recheck(plan: rt.Plan, revalidate) -> list[tuple[str, str]]:
    """(name, why) of every checkpoint justifying a deletion of `plan` that fails `revalidate`."""
    failed = []
    for j in sorted({d.justified_by for d in plan.delete if d.justified_by}):
        problem = revalidate(j)
        if problem:
            failed.append((j, f"the newer checkpoint that justifies the deletions no longer validates in the check "
                              f"right before deleting ({problem}): nothing deleted"))
    return failed


def revalidator(found: dict[str, fm.Found], level: str, before=None):
    """revalidate(name) -> None when the checkpoint passes at `recheck_level(level)`, else its first problem."""
    lvl = recheck_level(level)

    def revalidate(name: str) -> str | None:
        if before is not None:
            before(name)
        r = check(found[name], lvl)
        if usable(r):
            return None
        first = next((p for p in r.problems), None)
        return f"level {lvl}: {r.status}" + (f", {first.file}: {first.reason}" if first is not None else "")

    return revalidate


def apply_prune(root: str, plan: rt.Plan, revalidate, pending: list[dict]) -> Outcome:
    """Delete what `plan` marks, after finishing the journalled leftovers of an earlier prune.

    revalidate(name) -> None or why: every checkpoint that justifies the deletions is checked again
    right before the first deletion (`revalidator`: at least level full); if one fails nothing is deleted. Errors land in the
    Outcome (the caller exits 1); a journal that cannot be written is a UsageError (exit 2).
    """
    out = Outcome()
    to_delete = [d.candidate.name for d in plan.delete]
    try:
        _clean_journal_temps(root)
        if not to_delete and not pending:
            return out
        _write_journal(root, pending)  # also proves ROOT is writable before anything is touched
    except OSError as exc:
        raise UsageError(storage.oserror_line(exc, "write the prune journal in", root)
                         + "; prune --apply needs write access to ROOT (nothing deleted)") from None
    pending = _finish(root, pending, out)
    for j, why in recheck(plan, revalidate):
        out.errors.append(Problem(file=j, reason=why))
        to_delete = []
    # One journal write for the whole batch: an entry whose .deleting-* name never appears (killed
    # before its rename) is simply dropped by the next run; the checkpoint is still there.
    entries = [_entry_for(root, name) for name in to_delete]
    try:
        _write_journal(root, pending + entries)
    except OSError as exc:
        out.errors.append(Problem(file=JOURNAL, reason=storage.oserror_line(exc, "write", JOURNAL)
                                  + "; nothing (more) deleted"))
        entries = []
    half = [e for e in entries if _delete_one(root, e, out)]
    pending = pending + half
    try:
        _write_journal(root, pending)
    except OSError as exc:
        out.errors.append(Problem(file=JOURNAL, reason=f"could not update the journal: "
                                  f"{storage.describe_os_error(exc)}; the next prune --apply tidies it"))
    for name, why in out.failed.items():
        out.errors.append(Problem(file=name, reason=why))
    out.half_deleted = [e["renamed"] for e in pending]
    return out


# --------------------------------------------------------------------------- the command


def _entry(d: rt.Decision, s: Survey, out: Outcome | None) -> PruneEntry:
    c = d.candidate
    r = s.results.get(c.name)
    deleted = out is not None and c.name in out.deleted
    error = out.failed.get(c.name) if out is not None else None
    size = (out.deleted[c.name] if deleted and out is not None else
            _size(c.path) if c.layout and not c.symlink and c.path else None)
    return PruneEntry(path=storage.display(c.path), name=c.name, format=c.format, step=c.step,
                      status=r.status if r else None,
                      resumable=r.resumable if r else None, layout=c.layout, symlink=c.symlink, action=d.action,
                      bytes=size,
                      reasons=[x.text for x in d.reasons], reason_kinds=[x.kind for x in d.reasons],
                      justified_by=d.justified_by, deleted=deleted, error=error)


def _settings(keep_last, milestones, policy) -> tuple[int, list[int]]:
    if policy is not None and not isinstance(policy, CheckpointPolicy):
        policy = load_policy(policy)
    if keep_last is None and policy is not None:
        keep_last = policy.keep_last
    if keep_last is None:
        raise UsageError("no retention given: pass --keep-last N or --policy FILE (the plan, YAML or JSON, or the "
                         "handoff state file) with a keep_last")
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise UsageError(f"--keep-last must be an integer of at least 1, got {keep_last}")
    ms = sorted(set(milestones if milestones is not None else (policy.keep_milestone if policy else [])))
    return keep_last, ms


def proposed_retention(root: str, milestones: list[int] | None, apply: bool) -> tuple[int, list[int], str]:
    """keep_last and milestones from the run itself when none were given: a rolling window that spans
    recover's wait window at the run's save interval (save_steps in the newest trainer_state.json,
    else the spacing of the checkpoint names), and the plan's pow2 milestones up to max_steps.
    --apply never deletes on proposed numbers (UsageError)."""
    import math

    from checkpoint_strategy.checkpoints.runfacts import trainer_state_facts
    from checkpoint_strategy.cli_options import milestone_schedule
    from checkpoint_strategy.recovery.ckptsteps import scan
    from checkpoint_strategy.recovery.settings import DEFAULTS

    found = scan(root)
    facts = trainer_state_facts(None)
    for _step, path in reversed(found):
        facts = trainer_state_facts(path)
        if facts.values:
            break
    every, where = facts.int("save_steps"), facts.source.get("save_steps")
    if every is None and len(found) >= 2:
        gaps = sorted(b - a for (a, _), (b, _) in zip(found, found[1:], strict=False))
        every, where = max(1, gaps[len(gaps) // 2]), "the spacing of the checkpoint names"
    if every is None:
        raise UsageError("no retention given and none can be read from the run: pass --keep-last N (and "
                         "--milestones) or --policy FILE")
    keep = max(2, math.ceil(DEFAULTS.wait_steps / every) + 1)
    last = facts.int("max_steps") or (found[-1][0] if found else 0)
    ms = milestones if milestones is not None else milestone_schedule("pow2", last)
    note = (f"keep_last {keep}: save_steps {every} (from {where}); the window spans recover's "
            f"{DEFAULTS.wait_steps}-step wait window, so a checkpoint before a spike survives until it is judged; "
            f"milestones {', '.join(map(str, ms)) or 'none'}"
            + ("" if milestones is not None else f" (the plan's pow2 schedule up to max_steps {last}"
               + (f", from {facts.source['max_steps']})" if "max_steps" in facts.source else ")")))
    if apply:
        raise UsageError(f"--apply needs --keep-last N or --policy FILE: nothing deleted on proposed numbers "
                         f"(the dry run proposes keep_last {keep}, milestones {', '.join(map(str, ms)) or 'none'})")
    return keep, list(ms), note


def _leftovers(root: str, pending: list[dict]) -> tuple[list[str], list[str]]:
    ours = {n for e in pending for n in (e["renamed"], e.get("sidecar")) if n}
    names = sorted(n for n in os.listdir(root) if n.startswith(fm.DELETING_PREFIX))
    return [n for n in names if n in ours], [n for n in names if n not in ours]


def prune(root: str | os.PathLike, keep_last: int | None = None, milestones: list[int] | None = None,
          policy: CheckpointPolicy | str | os.PathLike | None = None, apply: bool = False,
          level: Level = "quick", log: str | None = None, spike_check: bool = True,
          lock_timeout: float = LOCK_TIMEOUT_SECONDS, protect: dict[str, str] | None = None) -> PruneReport:
    """Plan validated retention under root; with apply=True, delete what the plan marks.

    keep_last/milestones override the policy's keep_last/keep_milestone. keep_last counts
    resumable valid checkpoints when the run has any. Invalid, incomplete, symlinked and
    unrecognised entries are never deleted. With spike_check (default) the training log (`log`,
    or the newest valid checkpoint's trainer_state.json) is read first, and the rollback
    checkpoint of an unrecovered loss spike is kept. Holds an exclusive lock on ROOT; another
    prune of the same ROOT waits `lock_timeout` seconds, then UsageError. Emergency saves (a
    checkpoint-strategy.json marker, checkpoints/marker.py) never count towards keep_last and are
    kept while the spike has not recovered or its status is unknown. `protect`: more names to keep
    as the trainer's best, name -> reason (the Lightning callback passes best_model_path).
    """
    from checkpoint_strategy.storage.locking import locked

    if storage.is_url(os.fspath(root)):  # object storage: same survey and keep rules, journalled deletes
        from checkpoint_strategy.checkpoints import prune_objects

        keep_last, ms = _settings(keep_last, milestones, policy)
        return prune_objects.prune_url(os.fspath(root), keep_last, ms, apply, level, log, spike_check, protect)
    root = check_root(os.fspath(root))
    proposed = None
    if keep_last is None and policy is None:
        keep_last, milestones, proposed = proposed_retention(root, milestones, apply)
    keep_last, ms = _settings(keep_last, milestones, policy)
    busy = (f"{root} is being pruned by another checkpoint-strategy process (still locked after "
            f"{lock_timeout:g} s); wait for it to finish, then rerun")
    with locked(root, lock_timeout, busy):
        s = survey(root, level)
        pending = read_journal(root)
        plan, guard = plan_survey(s, keep_last, ms, log, spike_check, protect)
        ours, foreign = _leftovers(root, pending)
        out = apply_prune(root, plan, revalidator(s.found, level), pending) if apply else None
    return report_of(root, s, plan, guard, out, apply=apply, level=level, keep_last=keep_last, milestones=ms,
                     leftovers=(ours, foreign), proposed=proposed)


def plan_survey(s: Survey, keep_last: int, ms: list[int], log: str | None, spike_check: bool,
                protect: dict[str, str] | None) -> tuple[rt.Plan, SpikeGuard | None]:
    """The keep rules on a survey (any storage): the spike guard first, then `retention.plan_prune`."""
    valid = [(c.step, c.path) for c in s.candidates
             if c.status == "valid" and c.step is not None and c.layout and not c.symlink]
    guard = spike_guard(valid, log) if spike_check else None
    keep_emergency = spike_check and (guard is None or guard.status is None or guard.status in UNRESOLVED)
    why = ("kept, the spike's status is unknown (no training log read)" if guard is None or guard.status is None
           else f"kept until the loss spike at step {guard.onset_step} recovers")
    held = {n: f"{d}: {why}" for n, d in s.emergency.items()} if keep_emergency else {}
    retention = rt.Retention(keep_last=keep_last, milestones=frozenset(ms),
                             best={**s.best, **(protect or {}), **held}, **spike_retention(guard, s.candidates))
    if s.latest:
        retention = replace(retention, latest=s.latest, latest_why=s.latest_why)
    plan = rt.plan_prune(s.candidates, retention)
    s.suggestion = None if plan.delete else smaller_keep_last(s, retention)
    return plan, guard


def smaller_keep_last(s: Survey, retention: rt.Retention) -> PruneSuggestion | None:
    """When `retention` frees nothing: the smallest keep_last whose plan still keeps every rollback point
    (the spike guard's rollback checkpoint and the checkpoint before each spike of the log) and the newest,
    with the bytes it would free. None when no smaller keep_last deletes anything."""
    must = {n for n in (retention.rollback, *retention.pre_spike) if n}
    for k in range(1, min(retention.keep_last, len(s.candidates) + 1)):  # past the count every plan is the same
        plan = rt.plan_prune(s.candidates, replace(retention, keep_last=k))
        kept = {d.candidate.name for d in plan.keep}
        if not plan.delete or not must <= kept or (plan.newest is not None and plan.newest.name not in kept):
            continue
        names = [d.candidate.name for d in plan.delete]
        return PruneSuggestion(keep_last=k, delete=names, bytes=sum(_size(d.candidate.path) for d in plan.delete),
                               rollback_points=sorted(must))
    return None


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
        errors=out.errors if out else [], spike_guard=guard, notes=[*s.notes, *(notes or [])],
        recheck_level=recheck_level(level), suggestion=s.suggestion,
        justifiers=sorted({d.justified_by for d in plan.delete if d.justified_by}))
