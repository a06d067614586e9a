"""`prune` on object storage (s3://, gs://, memory://): `ObjectStore`, the store (`prune_survey.PruneStore`)
`prune.prune` runs the same survey -> plan -> apply over as on disk; only its deletion differs.

Object stores have no rename, so a deletion is journalled instead:

  1. the journal object ``ROOT/.checkpoint-strategy-prune-objects.json`` lists the checkpoints about to
     go (``{"version": 1, "pending": [{"name": "checkpoint-10"}, ...]}``, one PUT: it appears whole);
  2. each checkpoint is deleted, oldest first (the newest unneeded one last); inside a checkpoint its
     commit markers go first (trainer_state.json, .metadata, commit_success.txt, _CHECKPOINT_METADATA),
     so a checkpoint stopped half-way is recognisably incomplete, then the rest in bulk;
  3. the journal is rewritten with what is left (deleted when empty).

The next run (dry run or --apply) reads the journal: an entry that the current plan deletes, or that
is no longer valid (half deleted), is finished by --apply; a valid one the current plan keeps (the
retention changed) is dropped from the journal untouched, so the newest valid checkpoint is never
lost. Only names the layouts recognise (`retention.classify_name`, no '/', not hidden) are ever
deleted. A versioned bucket is reported: its deletes leave old versions behind. There is no lock
across machines on object storage: run one prune per ROOT at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

from checkpoint_strategy import storage
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats.models import Problem
from checkpoint_strategy.retention import rules as rt
from checkpoint_strategy.retention.request import PruneRequest
from checkpoint_strategy.retention.survey import Outcome, Survey, recheck, revalidator
from checkpoint_strategy.storage import remote

JOURNAL = ".checkpoint-strategy-prune-objects.json"
MARKERS = ("trainer_state.json", ".metadata", "commit_success.txt", "_CHECKPOINT_METADATA")


def _safe_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
        and not name.startswith(".")
        and rt.classify_name(name) is not None
    )


def read_journal(root: str) -> list[str]:
    """Names journalled by an interrupted prune (the journal object, read through the view)."""
    path = os.path.join(root, JOURNAL)
    if not os.path.lexists(path):
        return []
    what = "prune journal"
    data = storage.read_json(path, what, limit=16 << 20, expect=dict)
    pending = data.get("pending")
    if not isinstance(pending, list) or not all(
        isinstance(e, dict) and _safe_name(e.get("name")) for e in pending
    ):
        raise UsageError(
            f"{what} {storage.display(path)}: not a list of checkpoint names; nothing was deleted "
            "(it records prune's half-deleted checkpoints: inspect it, then remove it)"
        )
    return [e["name"] for e in pending]


def _write_journal(view, names: list[str]) -> None:
    if names:
        doc = {"version": 1, "pending": [{"name": n} for n in names]}
        view.put(JOURNAL, (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    elif os.path.lexists(os.path.join(view.local, JOURNAL)) or view.exists(JOURNAL):
        view.delete([view.remote + "/" + JOURNAL])


def _keys(view, root: str, name: str) -> list[str]:
    """Every listed object of one checkpoint (folder or file) and its integrity sidecar, markers first."""
    keys = view.keys_under(os.path.join(root, name)) + view.keys_under(
        os.path.join(root, name + fm.MANIFEST_SUFFIX)
    )
    return sorted(set(keys), key=lambda k: (k.rsplit("/", 1)[-1] not in MARKERS, k))


def _delete_checkpoint(view, root: str, name: str, out: Outcome) -> bool:
    """Delete one journalled checkpoint's objects. True when something is left (half deleted)."""
    keys = _keys(view, root, name)
    if not keys:
        return False  # nothing left of it (finished by an earlier run before its journal update)
    size = sum(view.objects[p].size for p in view.objects if view.objects[p].key in set(keys))
    markers = [k for k in keys if k.rsplit("/", 1)[-1] in MARKERS]
    try:
        view.delete(markers)
        view.delete([k for k in keys if k not in markers])
    except Exception as exc:  # noqa: BLE001 - one line in the report, the journal keeps the entry
        out.failed[name] = f"half deleted: {remote.describe(exc)}; rerun prune --apply to finish"
        return True
    out.deleted[name] = size
    return False


def apply_objects(
    view,
    root: str,
    plan: rt.Plan,
    revalidate,
    journalled: list[str],
    status: dict[str, str],
    notes: list[str],
) -> Outcome:
    """Finish the journalled deletions that are still due, then journal and delete what `plan` marks."""
    out = Outcome()
    planned = {d.candidate.name for d in plan.delete}
    # due: still planned, half deleted (no longer valid), or already gone; a valid one kept now is dropped
    finish = [
        n
        for n in journalled
        if n in planned or status.get(n, "gone") in ("invalid", "incomplete", "gone")
    ]
    dropped = [n for n in journalled if n not in finish]
    if dropped:
        notes.append(
            f"journalled by an interrupted prune but whole and kept now: {', '.join(dropped)} (not deleted)"
        )
    order = {d.candidate.name: (d.candidate.step or 0) for d in plan.delete}
    todo = sorted(planned - set(finish), key=lambda n: (order.get(n, 0), n))
    for j, why in recheck(plan, revalidate):
        out.errors.append(Problem(file=j, reason=why))
        todo = []
    batch = finish + todo
    try:
        if batch or journalled:
            _write_journal(view, batch)
    except Exception as exc:  # noqa: BLE001
        raise UsageError(
            f"cannot write the prune journal in {storage.display(root)}: {remote.describe(exc)}; prune "
            "--apply needs write access to ROOT (nothing deleted)"
        ) from None
    left = [n for n in batch if _delete_checkpoint(view, root, n, out)]
    out.finished = [n for n in finish if n not in left]
    try:
        _write_journal(view, left)
    except Exception as exc:  # noqa: BLE001
        out.errors.append(
            Problem(
                file=JOURNAL,
                reason=f"could not update the journal: {remote.describe(exc)}; the next "
                "prune --apply tidies it",
            )
        )
    for name, why in out.failed.items():
        out.errors.append(Problem(file=name, reason=why))
    out.half_deleted = left
    return out


class ObjectStore:
    """A prefix on object storage (`PruneStore`), through its local view (`storage.remote`): journalled deletes."""

    def __init__(self, view, root: str, log: str | None) -> None:
        self.view, self.root, self.log = view, root, log
        self.notes: list[str] = []
        self.journalled: list[str] = []

    def read_pending(self) -> None:
        self.journalled = read_journal(self.root)
        versioning = self.view.versioning()
        if versioning:
            self.notes.append(
                f"bucket versioning is {versioning}: deleted objects stay as noncurrent versions "
                "(still stored and billed) until a lifecycle rule or a version delete removes them"
            )

    def delete(self, s: Survey, plan: rt.Plan, level: str) -> Outcome:
        revalidate = revalidator(
            s.found, level, before=lambda name: self.view.forget(s.found[name].path)
        )
        status: dict[str, str] = {n: r.status for n, r in s.results.items()}
        status.update({n: "present" for n in s.found if n not in status})
        return apply_objects(
            self.view, self.root, plan, revalidate, self.journalled, status, self.notes
        )

    def leftovers(self, out: Outcome | None) -> tuple[list[str], list[str]]:
        return (out.half_deleted if out is not None else self.journalled), []


@contextlib.contextmanager
def object_store(req: PruneRequest) -> Iterator[ObjectStore]:
    """The prefix `req.root` viewed locally (and the training log, when one is given, copied locally)."""
    with storage.local_paths([req.root], prefetch=req.level == "quick") as (root,):
        view = remote.view_of(root)
        assert view is not None
        found = fm.identify(root)
        if view.is_file or (found is not None and not fm.is_run_folder(found)):
            raise UsageError(
                f"{remote.shown(req.root)}: is itself a checkpoint; pass the prefix that holds the "
                "checkpoints"
            )
        with storage.local_paths([req.log] if req.log else []) as logs:
            yield ObjectStore(view, root, logs[0] if logs else None)
