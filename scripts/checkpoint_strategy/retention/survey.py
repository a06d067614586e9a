"""What `prune` does on any store: what ROOT holds (`survey`), the keep rules on it with the loss-spike guard
(`plan_survey`), the re-check before deleting (`revalidator`, `recheck`) and the report (`report_of`).

`PruneStore` is what a store provides (`prune.LocalStore`, `prune_objects.ObjectStore`): the folder the
survey lists (object storage: its local view), the journal of an earlier prune, the deletion, and what an
earlier prune left. (This module sits below both stores so neither imports the other: no import cycle.)
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from checkpoint_strategy import storage
from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats.marker import describe as describe_marker
from checkpoint_strategy.formats.marker import read_marker
from checkpoint_strategy.formats.models import (
    CheckpointResult,
    Level,
    Problem,
    PruneEntry,
    PruneReport,
    PruneState,
    PruneSuggestion,
    SpikeGuard,
)
from checkpoint_strategy.retention import rules as rt
from checkpoint_strategy.validate.engine import (
    check,
    check_with_values,
    compare_consecutive,
    decode_results,
    encode_results,
    usable,
)
from checkpoint_strategy.validate.fanout import map_split

if TYPE_CHECKING:
    from checkpoint_strategy.retention.request import PruneRequest
    from checkpoint_strategy.validate import deep as dp

FINAL_EXPORT_NAME = "."


# --------------------------------------------------------------------------- survey


@dataclass
class Survey:
    """What ROOT holds, as the keep rules need it."""

    root: str
    candidates: list[rt.Candidate] = field(default_factory=list)
    results: dict[str, CheckpointResult] = field(default_factory=dict)  # name -> validator result
    found: dict[str, fm.Found] = field(default_factory=dict)  # name -> discovery
    best: dict[str, str] = field(default_factory=dict)  # name -> why it is the best
    best_name: str | None = None  # the trainer's best now (report's Best:)
    templates: list[str] = field(default_factory=list)  # Lightning filename templates
    emergency: dict[str, str] = field(default_factory=dict)  # name -> marker description
    final_export: str | None = None
    latest: str | None = None  # what the resume pointer names
    latest_why: str = ""
    notes: list[str] = field(default_factory=list)  # links out of ROOT, pointer trouble
    sizes: dict[str, int] = field(default_factory=dict)  # name -> bytes (_inner_links' walk)
    suggestion: PruneSuggestion | None = None  # nothing freed: a smaller keep_last


def _hf_best(survey: Survey) -> None:
    """The Trainer's best as it holds it now: best_model_checkpoint of the newest trainer_state.json, that is
    the newest valid checkpoint's, or the run folder's own (Trainer.save_state at the end of training) when
    its global_step is at least that checkpoint's step (or no valid checkpoint has one). A best an older
    checkpoint's state named is the past: every checkpoint names itself best when it was saved with an
    improving metric, and honouring those would keep them all."""
    newest = max(
        (
            c
            for c in survey.candidates
            if c.status == "valid"
            and c.step is not None
            and not c.symlink
            and not c.final_export
            and (f := survey.found.get(c.name)) is not None
            and f.format == "hf-trainer"
            and f.is_dir
        ),
        key=lambda c: (c.step, c.name),
        default=None,
    )
    own = _read_state(survey.root)
    if own is not None and (newest is None or _int(own.get("global_step")) >= (newest.step or 0)):
        _name_best(survey, own.get("best_model_checkpoint"), "the run folder's trainer_state.json")
        return
    if newest is None:
        return
    r = survey.results.get(newest.name)
    seen = r.seen if r is not None else None
    if (
        seen is not None and seen.state_read
    ):  # the checker read this checkpoint's trainer_state.json already
        best = seen.trainer_best
    else:
        state = _read_state(survey.found[newest.name].path)
        best = state.get("best_model_checkpoint") if state is not None else None
    _name_best(survey, best, f"{newest.name}/trainer_state.json (the newest valid checkpoint's)")


def _int(x: object) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else -1


def _read_state(folder: str) -> dict | None:
    try:
        return storage.read_json(
            os.path.join(folder, "trainer_state.json"),
            "trainer_state.json",
            limit=storage.MAX_TRAINER_STATE_BYTES,
            allow_nan=True,
            expect=dict,
        )
    except storage.ReadError:
        return None


def _name_best(survey: Survey, name: object, where: str) -> None:
    if isinstance(name, str) and name.strip():
        best = os.path.basename(os.path.normpath(name))
        survey.best.setdefault(best, f"trainer's best now: best_model_checkpoint in {where}")
        survey.best_name = survey.best_name or best


_PL_MONITOR = re.compile(r"^ModelCheckpoint\{.*'monitor': '([^']+)'")
#: monitor="step" (a rolling window, as `export` emits it) ranks by recency, not quality: not a best
_NOT_A_METRIC = frozenset({"step", "epoch", "global_step"})


def _lightning_best(survey: Survey) -> None:
    """Lightning's best as its ModelCheckpoints hold it now: the newest valid .ckpt holds every
    ModelCheckpoint's state (its pickle read symbolically by torchpickle, nothing runs). For each one that
    monitors a metric, the files its best_k_models and best_model_path name (the save_top_k best as the user
    configured it) are the trainer's best; its last_model_path is not a best. Once such a state is read, a
    metric in a file's name no longer makes it a best (only the state says which are the top-k now)."""
    newest = max(
        (
            c
            for c in survey.candidates
            if c.layout == "lightning"
            and c.status == "valid"
            and not c.symlink
            and c.step is not None
            and os.path.isfile(c.path)
        ),
        key=lambda c: (c.step, _mtime(c.path), c.name),
        default=None,
    )
    if newest is None:
        return
    z = fc.scan_zip(newest.path, zr.Counter())
    root = z.pickle.root if z.pickle is not None else None
    callbacks = root.get("callbacks") if isinstance(root, dict) else None
    if not isinstance(callbacks, dict):
        return
    names = {c.name for c in survey.candidates}
    read = False
    for key, state in callbacks.items():
        m = _PL_MONITOR.match(key) if isinstance(key, str) else None
        if m is None or m.group(1) in _NOT_A_METRIC or not isinstance(state, dict):
            continue
        read = True
        top = state.get("best_k_models")
        paths = [state.get("best_model_path"), *(top if isinstance(top, dict) else ())]
        for i, path in enumerate(paths):
            name = path.replace("\\", "/").rsplit("/", 1)[-1] if isinstance(path, str) else ""
            if name in names:
                what = "best_model_path" if i == 0 else "best_k_models"
                survey.best.setdefault(
                    name,
                    f"trainer's top-k by {m.group(1)} now: {what} of its ModelCheckpoint "
                    f"in {newest.name} (the newest valid checkpoint's state)",
                )
                if i == 0:
                    survey.best_name = survey.best_name or name
    if read:
        survey.candidates = [
            replace(c, metrics=()) if c.layout == "lightning" else c for c in survey.candidates
        ]


def _mtime(path: str) -> int:
    """Two files of one step (a monitoring ModelCheckpoint's `-v1` beside the rolling save): the later written
    holds the newer state (Lightning updates best_k_models before it saves)."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _not_links(root: str) -> frozenset[str]:
    """The entries of ROOT its listing saw as no symlink (the entry type scandir reports: no lstat each)."""
    try:
        with os.scandir(root) as it:
            return frozenset(e.name for e in it if not e.is_symlink())
    except OSError:
        return frozenset()


def _link(
    root: str, name: str, not_links: frozenset[str] = frozenset()
) -> tuple[bool, str | None, bool]:
    """(symlink, the ROOT entry it resolves into, resolves outside ROOT) for the entry `name` of ROOT.
    Only the link text is resolved (os.path.realpath); nothing it points at is opened. `not_links`: names a
    listing of ROOT saw as no symlink (any other name is looked at with lstat)."""
    if name in not_links:
        return False, None, False
    path = os.path.join(root, name)
    if not os.path.islink(path):
        return False, None, False  # a real entry of ROOT (a real path): inside by construction
    real = os.path.realpath(path)
    if os.path.normpath(real) == os.path.normpath(os.path.realpath(root)):
        return True, None, False  # a link to ROOT itself: kept, names no checkpoint
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
            s.notes.append(
                f"{c.name} is a symlink to {target}, outside ROOT: reported, not followed, never deleted"
            )
        elif c.symlink and c.links_to and c.links_to not in {x.name for x in s.candidates}:
            s.notes.append(
                f"{c.name} is a symlink to {c.links_to}, which does not exist (dangling): kept"
            )


#: entries looked at per ROOT entry for symlinks into another entry; past it, a note says so
MAX_LINK_SCAN = 200_000


def _inner_links(s: Survey) -> None:
    """A symlink inside one entry of ROOT (checkpoint-20/model.safetensors -> ../checkpoint-10/...,
    a final export's model file -> checkpoint-500/...) makes its target entry needed: `links_into`
    names it, and the keep rules keep it while the link is there. Only link texts are resolved."""
    root_real = os.path.realpath(s.root)
    names = {c.name for c in s.candidates}
    for i, c in enumerate(s.candidates):
        if c.symlink or c.outside or not c.path:
            continue
        r = s.results.get(c.name)
        seen = r.seen if r is not None else None
        if (
            seen is not None
            and seen.flat_names is not None
            and not c.final_export
            and len(seen.flat_names) <= MAX_LINK_SCAN
        ):
            s.sizes[c.name] = _flat_size(
                c.path, seen.flat_read, seen.flat_unread
            )  # regular files only: no link
            continue
        top = c.path if not c.final_export else s.root
        found, complete, size = _links_under(
            top, s.root, root_real, names, c.name, recurse=not c.final_export
        )
        if not complete:
            s.notes.append(
                f"{c.name}: more than {MAX_LINK_SCAN} entries, not all looked at for symlinks into "
                "other checkpoints"
            )
        elif not c.final_export and os.path.isdir(c.path):
            s.sizes[c.name] = (
                size  # the same walk counts what _size would (one walk per checkpoint, not two)
            )
        if found:
            s.candidates[i] = replace(c, links_into=tuple(found))


def _flat_size(folder: str, read: int, unread: tuple[str, ...]) -> int:
    """The bytes of a folder the validator listed as regular files only (`read`: the bytes of the files it read
    whole; `unread`: the names of the others): what `_links_under` counts, with one lstat per file it did not read."""
    total = read
    for n in unread:
        try:
            total += os.lstat(os.path.join(folder, n)).st_size
        except OSError:
            pass
    return total


def _links_under(
    top: str, root: str, root_real: str, names: set[str], own: str, recurse: bool
) -> tuple[list[tuple[str, str]], bool, int]:
    """([(ROOT entry a symlink under `top` resolves into, the link's path under ROOT)], all entries seen, bytes
    as `_size` counts them). recurse=False: ROOT's own files (a final export), not the entries that are
    candidates themselves."""
    found: list[tuple[str, str]] = []
    stack, seen, total = [top], 0, 0
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                entries = list(it)
        except OSError:
            continue
        for e in entries:
            seen += 1
            if seen > MAX_LINK_SCAN:
                return found, False, total
            if not recurse and e.name in names:
                continue
            try:
                link = e.is_symlink()
                if link:
                    rel = os.path.relpath(os.path.realpath(e.path), root_real)
                    first = rel.split(os.sep)[0]
                    if first not in (own, os.curdir, os.pardir) and first in names:
                        found.append((first, os.path.relpath(e.path, root)))
                if e.is_dir():  # a link to a folder: neither entered nor counted (as _size)
                    if recurse and not link:
                        stack.append(e.path)
                else:
                    total += e.stat(follow_symlinks=False).st_size
            except OSError:
                pass
    return found, True, total


#: resume pointers: (file in ROOT, the framework, the layout of the names it holds)
_POINTERS = (
    ("latest", "DeepSpeed", "deepspeed"),
    ("latest_checkpointed_iteration.txt", "Megatron-LM", "megatron"),
)


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
            s.notes.append(
                f"{fname} names {text[:60]!r}, not a {framework} checkpoint name; ignored"
            )
            continue
        s.latest = name
        s.latest_why = f"named by {fname} ({framework} resumes from it)"
        if name not in {c.name for c in s.candidates}:
            s.notes.append(
                f"{fname} names {name}, which is not in ROOT: resuming from {fname} fails until it "
                f"names a valid checkpoint; checkpoints newer than {name} are treated as in flight"
            )
        return


def _deep_verdicts(
    s: Survey, deep: list[tuple[int, str, CheckpointResult, dp.DeepOutcome | None]]
) -> None:
    """Level deep: compare consecutive checkpoints (the norm jump needs the previous one), then a valid
    checkpoint failing the deep check (NaN/Inf, partial optimizer, norm jump) is invalid here: it never
    justifies a deletion."""
    compare_consecutive(deep)
    s.candidates = [
        replace(c, status="invalid")
        if c.name in s.results
        and not c.final_export
        and c.status == "valid"
        and not usable(s.results[c.name])
        else c
        for c in s.candidates
    ]


def _check_ahead(todo: list[fm.Found], level: str) -> dict[str, tuple[CheckpointResult, None]]:
    """At the quick level, the checkpoints `survey` validates, checked ahead, split over processes (fanout: the
    results are the ones one process gives); at other levels nothing (the survey checks each in turn)."""
    if level != "quick":
        return {}

    def work(part: Sequence[fm.Found], _here: bool) -> list[CheckpointResult]:
        return [check_with_values(f, level)[0] for f in part]

    return {
        f.path: (r, None)
        for f, r in zip(todo, map_split(todo, work, encode_results, decode_results), strict=True)
    }


_Named = tuple[str, rt.NameMatch | None, bool, str | None, bool]


def _classify(root: str, found: list[fm.Found], not_links: frozenset[str]) -> dict[str, _Named]:
    """path -> (name, its classification, symlink, links_to, outside ROOT), for every checkpoint but the
    final export."""
    named = {}
    for f in found:
        if f.role != fm.FINAL_EXPORT:
            name = os.path.basename(f.path)
            link, links_to, outside = (
                _link(root, name, not_links)
                if os.path.dirname(f.path) == root
                else (False, None, True)
            )
            named[f.path] = (name, rt.classify_name(name), link or outside, links_to, outside)
    return named


def _add_final_export(s: Survey, f: fm.Found, level: str) -> None:
    r = check(f, level)
    s.final_export = f.path
    s.found[FINAL_EXPORT_NAME], s.results[FINAL_EXPORT_NAME] = f, r
    s.candidates.append(
        rt.Candidate(
            FINAL_EXPORT_NAME,
            status=r.status,
            resumable=r.resumable,
            final_export=True,
            format=f.format,
            path=f.path,
        )
    )


def _unvalidated(f: fm.Found, named: _Named) -> rt.Candidate:
    """A candidate never validated (name not recognised, or a link): kept whatever it holds."""
    name, m, symlink, links_to, outside = named
    return rt.Candidate(
        name,
        m.step if m else None,
        m.layout if m else None,
        symlink=symlink,
        format=f.format,
        path=f.path,
        links_to=links_to,
        outside=outside,
    )


def _validated(
    s: Survey, f: fm.Found, name: str, m: rt.NameMatch, r: CheckpointResult
) -> rt.Candidate:
    """A validated candidate; post-event weights (callbacks) never count towards keep_last/newest."""
    mark = seen.marker if (seen := r.seen) is not None else read_marker(f.path)
    if mark is not None:
        s.emergency[name] = describe_marker(mark)
    return rt.Candidate(
        name,
        m.step,
        m.layout,
        r.status,
        r.resumable and mark is None,
        False,
        m.metrics,
        format=f.format,
        path=f.path,
    )


def _add_unrecognised(
    s: Survey, root: str, unrecognised: Sequence[str], not_links: frozenset[str]
) -> None:
    for name in unrecognised:
        link, links_to, outside = _link(root, name, not_links)
        s.candidates.append(
            rt.Candidate(
                name,
                None,
                None,
                symlink=link,
                path=os.path.join(root, name),
                links_to=links_to,
                outside=outside,
            )
        )


def survey(root: str, level: str = "quick") -> Survey:
    """List ROOT (one level), classify every name, validate the recognised checkpoints."""
    s = Survey(root)
    found, unrecognised = fm.discover(root, max_depth=1)
    templates: set[str] = set()
    # level deep: norm jumps
    deep: list[tuple[int, str, CheckpointResult, dp.DeepOutcome | None]] = []
    not_links = _not_links(root)
    named = _classify(root, found, not_links)
    checked = _check_ahead(
        [
            f
            for f in found
            if f.path in named and named[f.path][1] is not None and not named[f.path][2]
        ],
        level,
    )
    for f in found:
        if f.role == fm.FINAL_EXPORT:
            _add_final_export(s, f, level)
            continue
        name, m, symlink, _, _ = named[f.path]
        s.found[name] = f
        if m is None or symlink:  # never validated: kept whatever they hold
            s.candidates.append(_unvalidated(f, named[f.path]))
            continue
        r, outcome = checked[f.path] if f.path in checked else check_with_values(f, level)
        s.results[name] = r
        if m.step is not None:
            deep.append((m.step, name, r, outcome))
        if m.template and m.template != "last":
            templates.add(m.template)
        s.candidates.append(_validated(s, f, name, m, r))
    _deep_verdicts(s, deep)
    _add_unrecognised(s, root, unrecognised, not_links)
    s.templates = sorted(templates)
    _describe_links(s)
    _inner_links(s)
    _resume_pointer(s)
    _hf_best(s)
    _lightning_best(s)
    return s


def _bytes(s: Survey, c: rt.Candidate) -> int:
    """A candidate's bytes: the survey's link walk counted them (`_inner_links`), else one walk now."""
    return s.sizes[c.name] if c.name in s.sizes else _size(c.path)


def _size(path: str) -> int:
    """Bytes of a checkpoint: a file's (or link's) own size; a folder's files, as os.walk without following
    links lists them (a link to a folder is neither entered nor counted; a link to a file counts its own size)."""
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            return os.lstat(path).st_size
    except OSError:
        return 0
    total = 0
    todo = [path]
    while todo:  # one scandir per folder: its entries' lstat without joining paths (prune's report, 18k files)
        try:
            it = os.scandir(todo.pop())
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir():
                        if not e.is_symlink():
                            todo.append(e.path)
                    else:
                        total += e.stat(follow_symlinks=False).st_size
                except OSError:
                    pass
    return total


@dataclass
class Outcome:
    deleted: dict[str, int] = field(default_factory=dict)  # name -> bytes freed
    failed: dict[str, str] = field(default_factory=dict)  # name -> why
    finished: list[str] = field(default_factory=list)  # journalled leftovers removed
    errors: list[Problem] = field(default_factory=list)
    half_deleted: list[str] = field(default_factory=list)  # still in the journal

    @property
    def freed(self) -> int:
        return sum(self.deleted.values())


def _entry(d: rt.Decision, s: Survey, out: Outcome | None) -> PruneEntry:
    c = d.candidate
    r = s.results.get(c.name)
    deleted = out is not None and c.name in out.deleted
    error = out.failed.get(c.name) if out is not None else None
    size = (
        out.deleted[c.name]
        if deleted and out is not None
        else _bytes(s, c)
        if c.layout and not c.symlink and c.path
        else None
    )
    return PruneEntry(
        path=storage.display(c.path),
        name=c.name,
        format=c.format,
        step=c.step,
        status=r.status if r else None,
        resumable=r.resumable if r else None,
        layout=c.layout,
        symlink=c.symlink,
        action=d.action,
        bytes=size,
        reasons=[x.text for x in d.reasons],
        reason_kinds=[x.kind for x in d.reasons],
        justified_by=d.justified_by,
        deleted=deleted,
        error=error,
    )


def recheck_level(level: str) -> Level:
    """The level a checkpoint that justifies deletions is checked at right before anything is deleted:
    at least full (the CRC-32 of every file), whatever level the survey used (issue 29: a byte flipped
    in optimizer.pt passes the quick level). Full is the lowest level held to the framework's own loader: every
    mutation torch/safetensors/DCP/Orbax refuse, full calls invalid (tests/test_oracle_mutations.py)."""
    return "deep" if level == "deep" else "full"


def recheck(plan: rt.Plan, revalidate) -> list[tuple[str, str]]:
    """(name, why) of every checkpoint justifying a deletion of `plan` that fails `revalidate`."""
    failed = []
    for j in sorted({d.justified_by for d in plan.delete if d.justified_by}):
        problem = revalidate(j)
        if problem:
            failed.append(
                (
                    j,
                    f"the newer checkpoint that justifies the deletions no longer validates in the check "
                    f"right before deleting ({problem}): nothing deleted",
                )
            )
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
        return f"level {lvl}: {r.status}" + (
            f", {first.file}: {first.reason}" if first is not None else ""
        )

    return revalidate


def report_of(
    store: PruneStore,
    s: Survey,
    plan: rt.Plan,
    guard: SpikeGuard | None,
    out: Outcome | None,
    req: PruneRequest,
    proposed: str | None = None,
) -> PruneReport:
    """The PruneReport of a survey, its plan and (with --apply) what was deleted."""
    entries = [_entry(d, s, out) for d in plan.decisions]
    keep = [e for e in entries if e.action == "keep"]
    delete = [e for e in entries if e.action == "delete"]
    state: PruneState = "dry_run"
    if out is not None:
        state = "half_deleted" if out.half_deleted else "failed" if out.errors else "done"
    best = [s.best_name] if s.best_name else sorted(s.best)
    old_invalid = [e for e in keep if "old_invalid" in e.reason_kinds]
    if guard is not None:
        guard.log = storage.display(guard.log)
    leftovers = store.leftovers(out)
    return PruneReport(
        root=storage.display(store.root),
        applied=req.apply,
        level=req.level,
        keep_last=req.keep_last,
        milestones=req.milestones,
        best_checkpoint=best[0] if best else None,
        newest_valid=plan.newest.name if plan.newest else None,
        counts_resumable=plan.counts_resumable,
        final_export=storage.display(s.final_export) if s.final_export else None,
        lightning_templates=s.templates,
        keep=keep,
        delete=delete,
        leftovers=leftovers[0],
        foreign_leftovers=leftovers[1],
        reasons={e.name: e.reasons for e in entries},
        deleted=len(out.deleted) if out else 0,
        failed=len(out.failed) if out else 0,
        freed_bytes=out.freed if out else 0,
        state=state,
        proposed=proposed,
        bytes_to_free=sum(e.bytes or 0 for e in delete if not e.deleted),
        errors=out.errors if out else [],
        spike_guard=guard,
        notes=[*s.notes, *store.notes],
        recheck_level=recheck_level(req.level),
        suggestion=s.suggestion,
        justifiers=sorted({d.justified_by for d in plan.delete if d.justified_by}),
        delete_invalid=req.delete_invalid,
        old_invalid=[e.name for e in old_invalid],
        old_invalid_bytes=sum(e.bytes or 0 for e in old_invalid),
    )


class PruneStore(Protocol):
    """Where the checkpoints are, as prune reads and deletes them (`prune.LocalStore`,
    `prune_objects.ObjectStore`). `survey(store.root)` lists and stats it; the rest:"""

    root: str  # the folder the survey lists (object storage: its local view)
    log: (
        str | None
    )  # the training log as the survey reads it (object storage: a local copy), or None
    notes: list[
        str
    ]  # what the store has to say in the report (bucket versioning, journal entries dropped)

    def read_pending(self) -> None:
        """Read what an earlier prune left half done (its journal)."""

    def delete(self, s: Survey, plan: rt.Plan, level: str) -> Outcome:
        """Re-check the checkpoints that justify the deletions (`revalidator`, `recheck`), then delete what
        `plan` marks and finish what the journal holds; nothing is deleted when a re-check fails."""
        ...

    def leftovers(self, out: Outcome | None) -> tuple[list[str], list[str]]:
        """(what an earlier prune left half deleted, .deleting-* names it did not make)."""
        ...
