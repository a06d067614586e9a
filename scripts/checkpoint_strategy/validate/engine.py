"""Checkpoint validation: the level engine, roots with many checkpoints, the Python API.

Each checkpoint goes through the checker of its format's module (formats/hf.py, lightning.py, torchfile.py, dcp.py,
deepspeed.py, orbax.py, megatron.py, listed in formats/registry.py): the engine builds the context
(formats/base.py `Ctx`, with the part split and the deep level's Source), runs the checker, then the deep level,
the manifest and the emergency marker, and words the result. A format is added in formats/ alone. What the engine
still knows by name: Orbax's soft-deleted steps and commit markers beside its steps (`_discover_jobs`), and the
wording of a broken resume pointer (`_precheck`).
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from checkpoint_strategy import storage
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import filechecks as fc
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats import orbax, registry
from checkpoint_strategy.formats.archive import ZipEntry
from checkpoint_strategy.formats.base import Ctx, Layout, ProgressFn, named
from checkpoint_strategy.formats.marker import MARKER_NAME
from checkpoint_strategy.formats.models import (
    LEVELS,
    CheckpointResult,
    CheckpointStats,
    DeepStats,
    Problem,
    Seen,
    ValidationReport,
    ValidationSummary,
)
from checkpoint_strategy.storage import ReadError
from checkpoint_strategy.validate import parts
from checkpoint_strategy.validate.fanout import map_split

# imported where level deep runs (`_deep`): the quick and full levels never load its scanner
if TYPE_CHECKING:
    from checkpoint_strategy.validate import deep as dp


def _deep() -> ModuleType:
    """validate.deep, imported where level deep needs it (its value scanner and dataclasses: ~4 ms of every
    start-up that only runs the quick or full level)."""
    from checkpoint_strategy.validate import deep

    return deep


PORTABILITY = {
    "full": "full state dict: loads on any hardware; re-shard after loading on the new hardware",
    "weights": "weights only (no optimizer state): fine for inference or fine-tuning, a resume would reset "
    "the optimizer (watch for a sudden loss drop)",
    # accelerate's SHARDED_STATE_DICT (utils/fsdp_utils.py save_fsdp_model/load_fsdp_model: dist_cp.save with a
    # FileSystemWriter into pytorch_model_fsdp_0/, dist_cp.load on resume) is DCP, which re-shards on load
    "fsdp": "FSDP sharded state (pytorch_model_fsdp_0/, optimizer_0/) is torch.distributed.checkpoint: accelerate "
    "loads it with dcp.load, which re-shards to the new world size, so a resume on other hardware needs no "
    "conversion (keep fsdp_state_dict_type SHARDED_STATE_DICT); a single file for publishing or a run "
    "without FSDP: checkpoint-strategy convert DIR/pytorch_model_fsdp_0 OUT.pt --to full (or --to "
    "safetensors: the weights), as accelerate merge-weights does",
    "dcp": "torch.distributed.checkpoint shards: dcp.load re-shards to a new world size; for a full state dict "
    "checkpoint-strategy convert DIR OUT.pt --to full (--to safetensors: the weights to publish); a file "
    "dcp_to_torch_save wrote is checked against its shards by convert DIR OUT.pt --check-only",
    "zero": "DeepSpeed ZeRO shards are tied to the data-parallel size: checkpoint-strategy convert DIR OUT --to dcp "
    "(fp32 weights + Adam moments, any world size loads it) or --to safetensors (weights), as "
    "zero_to_fp32.py does but checked tensor by tensor; validate --target-gpus N names the command",
    "ds-universal": "DeepSpeed universal checkpoint (per-parameter fp32 weights and optimizer state): loads at any "
    "data/tensor/pipeline-parallel degree with checkpoint.load_universal: true (the file "
    "latest_universal names it)",
    "megatron": "Megatron tensor/pipeline-parallel shards: convert with Megatron-LM tools/checkpoint/convert.py "
    "(or save with --ckpt-format torch_dist, which re-shards on load) before changing parallelism",
    "orbax": "Orbax/tensorstore arrays: restore on the new mesh with a target sharding (ArrayRestoreArgs); "
    "the saved sharding is only the default",
    "lightning-sharded": "sharded Lightning checkpoint: consolidate with python -m pytorch_lightning."
    "utilities.consolidate_checkpoint PATH.ckpt (FSDP) or "
    "convert_zero_checkpoint_to_fp32_state_dict (DeepSpeed) before moving hardware",
    "unknown": "unknown layout: cannot say",
}

# --------------------------------------------------------------------------- before the checker (every format alike)


def _precheck(ctx: Ctx, found: fm.Found) -> Layout | None:
    """Problems that stop a checker before it starts (missing, dangling, a file for a folder format)."""
    path, fmt = found.path, found.format
    try:
        # one lstat: exists, a link, a folder (os.path's three calls)
        mode: int | None = os.lstat(path).st_mode
    except (OSError, ValueError):
        mode = None
    link = mode is not None and stat.S_ISLNK(mode)
    # a folder until the checker's listing tells otherwise
    ctx.flat = mode is not None and stat.S_ISDIR(mode)
    if mode is None:
        ctx.missing(path, "checkpoint")
    elif link and not os.path.exists(path):
        ctx.bad(path, "dangling symlink")
    elif found.role == POINTER:
        ctx.bad(
            path,
            "resume pointer names no checkpoint: "
            + (
                "its text is no iteration number nor 'release' (Megatron-LM reads int(text))"
                if fmt == "megatron"
                else "an empty tag, '.' or '..' (DeepSpeed loads the folder the tag names)"
            ),
        )
    elif fmt in registry.FOLDER_FORMATS and not (
        os.path.isdir(path) if link else stat.S_ISDIR(mode)
    ):
        ctx.bad(path, f"is a file, expected a {fmt} checkpoint folder")
    elif fmt not in registry.CHECKERS:
        ctx.bad(path, f"no checker for format {fmt!r}")
    else:
        return None
    return Layout(step=found.step)


# --------------------------------------------------------------------------- public API


def check(
    found: fm.Found,
    level: str = "quick",
    update: ProgressFn | None = None,
    want_commit: bool = False,
    manifest: str | None = None,
    root: str | None = None,
) -> CheckpointResult:
    """Validate one recognised checkpoint. ``root``: the folder the user named; a manifest is never
    written outside it (a symlinked checkpoint pointing elsewhere is left alone)."""
    return check_with_values(found, level, update, want_commit, manifest, root=root)[0]


def _deep_outcome(ctx: Ctx, stats: bool) -> dp.DeepOutcome | None:
    """Level deep's outcome, when the checks before it found the checkpoint whole. The torch archives' CRC-32s
    (level full's, left to the value scan so each archive is read once) are checked here either way: a wrong one
    is the archive's problem, as at level full, and then there is no deep outcome."""
    if not ctx.deep:
        return None
    if any(p.kind in ("invalid", "incomplete") for p in ctx.problems):
        for src in ctx.sources:
            if src.crc and src.zip is not None:
                _crc_here(ctx, src.path, src.zip.entries)
            elif src.crc and src.kind == "dcp" and src.dcp is not None and src.archives:
                for p, reason in fc.dcp_crc_findings(
                    src.path, src.dcp.items, src.archives, ctx.counter, ctx.update
                ):
                    ctx.bad(p, reason)
        return None
    outcome = _deep().run(ctx.sources, global_step=ctx.global_step, want_max=stats)
    ctx.counter.bytes_read += outcome.bytes_crc
    if not outcome.crc_problems:
        return outcome
    ctx.counter.bytes_read += outcome.check.bytes_scanned
    for file, reason in outcome.crc_problems:
        ctx.problems.append(Problem(file=file, reason=reason, kind="invalid"))
    return None


def _crc_here(ctx: Ctx, path: str, entries: list[ZipEntry]) -> None:
    """Level full's CRC-32 of a torch archive's entries (the deep scan did not run)."""
    try:
        with storage.open_regular(path) as fh:
            reason = zr.crc_entries(path, fh, entries, ctx.counter, ctx.update)
    except (OSError, ReadError) as exc:
        reason = fc._oserror(exc)
    if reason:
        ctx.bad(path, reason)


def check_with_values(
    found: fm.Found,
    level: str = "quick",
    update: ProgressFn | None = None,
    want_commit: bool = False,
    manifest: str | None = None,
    stats: bool = False,
    root: str | None = None,
) -> tuple[CheckpointResult, dp.DeepOutcome | None]:
    """`check`, plus the deep level's per-tensor outcome (None below level deep)."""
    path = found.path
    part = parts.for_checkpoint(path) if level in ("full", "deep") else None
    ctx = Ctx(path, level, update, want_commit, part, _deep().Source if level == "deep" else None)
    if part is not None:
        ctx.counter.notes.append(parts.describe(part))
    layout = _precheck(ctx, found)
    if layout is None:
        layout = registry.CHECKERS[found.format](ctx, found)
    outcome = _deep_outcome(ctx, stats)
    if outcome is not None:
        _apply_deep(ctx, found, layout, outcome)
    manifest_state = None
    if manifest and os.path.lexists(path) and not any(p.kind == "incomplete" for p in ctx.problems):
        manifest_state = _manifest(ctx, path, manifest, root)
    mark = _note_marker(ctx, path)
    kinds = {p.kind for p in ctx.problems}
    status = "invalid" if "invalid" in kinds else "incomplete" if "incomplete" in kinds else "valid"
    result = CheckpointResult(
        path=str(path),
        format=layout.format or found.format,
        step=layout.step,
        status=status,
        resumable=layout.resumable,
        sharded=layout.sharded,
        portability=PORTABILITY[layout.portability],
        pointer=found.role == POINTER,
        level=level,
        files_checked=ctx.counter.files,
        bytes_read=ctx.counter.bytes_read,
        manifest=manifest_state,
        problems=ctx.problems,
        notes=ctx.counter.notes,
        deep=outcome.check if outcome else None,
    )
    seen = result._seen = Seen(
        marker=mark, trainer_best=ctx.trainer_best, state_read=ctx.state_read
    )
    if ctx.listed is not None:
        from checkpoint_strategy.validate.coverage import families

        seen.families = families(result.format, path, ctx.listed)
        if ctx.flat:
            seen.flat_names = tuple(ctx.listed)
            seen.flat_read, seen.flat_unread = _flat_parts(path, seen.flat_names, ctx.counter.sizes)
    return result, outcome


def _apply_deep(ctx: Ctx, found: fm.Found, layout: Layout, outcome: dp.DeepOutcome) -> None:
    """Level deep's outcome (`_deep_outcome`) into the context: its findings, notes and bytes."""
    from checkpoint_strategy.formats.optstep import fill_deep_check

    parsed = {
        os.path.normpath(s.path): (s.dcp, s.archives)
        for s in ctx.sources
        if s.kind == "dcp" and s.dcp is not None and s.archives is not None
    }
    # DCP, DeepSpeed step counters
    mismatch = fill_deep_check(found.path, found.format, outcome.check.optimizer, parsed)
    if mismatch is not None:
        outcome.findings.append(_deep().Finding(".", mismatch[1], mismatch[0]))
    for f in outcome.findings:
        ctx.problems.append(Problem(file=ctx.named(f.file), reason=f.reason, kind=f.kind))
    ctx.counter.notes.extend(outcome.notes)
    ctx.counter.bytes_read += outcome.check.bytes_scanned
    if any(f.kind == "not_resumable" for f in outcome.findings):
        layout.resumable = False


def _manifest(
    ctx: Ctx, path: str, manifest: str, root: str | None
) -> Literal["written", "verified"] | None:
    """validate --manifest write|verify on a checkpoint that is not incomplete; the state it leaves."""
    from checkpoint_strategy.formats import manifest as mf

    if manifest == "write" and not ctx.problems:
        target = mf.manifest_path(path)
        if root is not None and not storage.inside(os.path.dirname(target) or ".", root):
            ctx.counter.notes.append(
                f"{os.path.basename(path)}: a symlink to outside {root}: "
                "manifest not written there (validate the target itself to write one)"
            )
            return None
        mf.write_manifest(path, ctx.counter, ctx.update)
        return "written"
    if manifest == "verify":
        for rel, reason in mf.verify_manifest(path, ctx.counter, ctx.update):
            ctx.problems.append(Problem(file=rel, reason=reason, kind="invalid"))
        return "verified"
    return None


def _flat_parts(
    folder: str, names: tuple[str, ...], sizes: dict[str, int]
) -> tuple[int, tuple[str, ...]]:
    """(bytes of the files of a flat folder read whole, the names of the others): `sizes` as the checks keep it,
    by os.path.join(folder, name)."""
    prefix = os.path.join(folder, "")
    read, unread = 0, []
    for n in names:
        size = sizes.get(prefix + n)
        if size is None:
            unread.append(n)
        else:
            read += size
    return read, tuple(unread)


def _note_marker(ctx: Ctx, path: str) -> dict | None:
    """The emergency marker's note (written by the training callbacks: post-event weights, not a resume point);
    the marker (marker.read_marker), or None. A folder the checker listed without one is not looked at again."""
    if ctx.listed is not None and MARKER_NAME not in ctx.listed:
        return None
    from checkpoint_strategy.formats.marker import describe, read_marker

    mark = read_marker(path) if os.path.lexists(path) else None
    if mark is not None:
        ctx.counter.notes.append(f"{describe(mark)}: not a resume point")
    return mark


def _check_level(level: str, manifest: str | None) -> str:
    if level not in LEVELS:
        raise UsageError(f"level must be quick, full or deep, got {level!r}")
    if manifest not in (None, "write", "verify"):
        raise UsageError(f"manifest must be write or verify, got {manifest!r}")
    return "full" if manifest and level == "quick" else level


def validate_checkpoint(
    path: str | os.PathLike,
    level: str = "quick",
    manifest: str | None = None,
    previous: str | os.PathLike | None = None,
) -> CheckpointResult:
    """Check one checkpoint is whole without loading it (the spec's `validate_on_save`).

    Call it right after a save, e.g. ``validate_checkpoint("out/checkpoint-500").status == "valid"``.
    Never executes checkpoint content (no torch.load / pickle.load).

    Args:
        path: a checkpoint folder (checkpoint-N/, step-N/, global_stepN/, iter_N/, Orbax step, *.ckpt/)
            or file (*.ckpt, *.pt, *.safetensors).
        level: "quick" reads headers only (cost grows with the number of files); "full" reads every
            byte and checks the CRC-32 of every zip entry; "deep" reads every tensor value (NaN/Inf
            counts, norms) and the optimizer state (moments per parameter, step), see `validate.deep`.
        manifest: None, "write" (write integrity.json after a clean full check) or "verify".
        previous: level deep: the previous checkpoint of the same run; a global weight norm that moved
            more than 2x from it is "suspicious" (the callbacks and recover pass the one before).

    Returns:
        CheckpointResult (stable fields): path, format, step, status ("valid" | "invalid" |
        "incomplete"), resumable (optimizer state present), sharded (per-rank shards),
        portability (cross-hardware advice), level, files_checked, bytes_read, manifest,
        problems [{file, reason, kind}], notes, deep (level deep). `result.passes_deep()` is the
        deep verdict: valid, resumable state whole, nothing suspicious.

    Raises:
        UsageError: the path does not exist or level/manifest is not one of the allowed values.
    """
    level = _check_level(level, manifest)
    p = os.fspath(path)
    # one listing, then the same checks through ranged reads (storage/remote.py)
    if storage.is_url(p):
        refuse_remote_deep([p], level)
        if manifest == "write":
            raise UsageError(
                f"{p}: manifest write is local only; manifest verify works on object storage"
            )
        with storage.local_paths([p], prefetch=level == "quick") as (local,):
            return storage.unshadow_model(validate_checkpoint(local, level, manifest))
    if not os.path.lexists(p):
        raise UsageError(f"{p}: no such file or folder; expected a checkpoint folder or file")
    found = fm.identify(p)
    if found is None:
        return _unrecognised(p, level)
    result, outcome = check_with_values(found, level, manifest=manifest)
    if outcome is not None and previous is not None:
        _against_previous(result, outcome, os.fspath(previous), level)
    return result


def _unrecognised(p: str, level: str) -> CheckpointResult:
    """The result for a path no format recognises: invalid, one problem."""
    return CheckpointResult(
        path=p,
        format="unknown",
        step=fm.step_from_name(os.path.basename(p)),
        status="invalid",
        resumable=False,
        sharded=False,
        portability=PORTABILITY["unknown"],
        level=level,
        problems=[
            Problem(
                file=".",
                reason="not a recognised checkpoint layout (see the formats table in the README)",
            )
        ],
    )


def _against_previous(
    result: CheckpointResult, outcome: dp.DeepOutcome, previous: str, level: str
) -> None:
    """Level deep: check the `previous` checkpoint of the run too and compare `result` with it (when it exists
    and gives deep values)."""
    if not os.path.lexists(previous):
        return
    prev_found = fm.identify(previous)
    if prev_found is not None:
        _prev, prev_outcome = check_with_values(prev_found, level)
        if prev_outcome is not None:
            _compare(result, outcome, prev_outcome, os.path.basename(os.path.normpath(previous)))


def _compare(
    result: CheckpointResult, outcome: dp.DeepOutcome, prev: dp.DeepOutcome, prev_name: str
) -> None:
    finding = _deep().compare(outcome, prev, prev_name)
    if finding is not None:
        result.problems.append(
            Problem(file=named(finding.file, result.path), reason=finding.reason, kind=finding.kind)
        )


def compare_consecutive(
    checked: list[tuple[int, str, CheckpointResult, dp.DeepOutcome | None]],
) -> None:
    """Level deep over one run's checkpoints, (step, name, result, deep outcome): each one's global weight
    norm against the previous one with a deep outcome (next lower step), as `validate_paths` does; a jump
    adds the "suspicious" problem to the result."""
    prev: tuple[int, str, dp.DeepOutcome] | None = None
    for step, name, result, outcome in sorted(checked, key=lambda t: t[0]):
        if outcome is None:
            continue
        if prev is not None and prev[0] != step:
            _compare(result, outcome, prev[2], prev[1])
        prev = (step, name, outcome)


def deep_ok(result: CheckpointResult) -> bool:
    """Valid and, when the deep level ran, nothing suspicious and no partial optimizer state (a model-only
    checkpoint is reported "not resumable" but is not a failure: prune's resumable-first rule weighs it)."""
    if result.status != "valid":
        return False
    if result.deep is None:
        return True
    return not any(
        p.kind == "suspicious"
        or (p.kind == "not_resumable" and result.deep.optimizer.kind != "none")
        for p in result.problems
    )


def usable(result: CheckpointResult) -> bool:
    """May this checkpoint justify deleting older ones? Valid, and at level deep also `deep_ok`."""
    return deep_ok(result)


def deep_check(
    path: str | os.PathLike, previous: str | os.PathLike | None = None
) -> CheckpointResult:
    """The deep verdict on one checkpoint (for validate-on-save callbacks and `recover`):
    ``deep_check(p).passes_deep()`` is False for NaN/Inf anywhere, partial or missing optimizer state,
    an optimizer step ahead of the trainer's, or (with `previous`) a weight norm that jumped."""
    return validate_checkpoint(path, level="deep", previous=previous)


def _tracker_entries(folder: str, found: list[fm.Found]) -> list[fm.Found]:
    """Checkpoints named by DeepSpeed `latest` / Megatron `latest_checkpointed_iteration.txt`
    that are not on disk: reported as incomplete; a pointer that names nothing the framework can load (an empty
    tag, Megatron text that is no number): the pointer itself, reported as invalid."""
    extra: list[fm.Found] = []
    present = {os.path.normpath(f.path) for f in found}
    for tracker, (fmt, pointer_target) in registry.TRACKERS.items():
        tpath = os.path.join(folder, tracker)
        if not os.path.isfile(tpath):
            continue
        try:
            with storage.open_regular(tpath, tracker) as fh:
                text = fh.read(256).decode("utf-8", "replace").strip()
        except (OSError, storage.ReadError):
            continue
        name = pointer_target(text)
        # the framework's resume reads nothing from this text: the pointer itself is broken
        if name is None:
            extra.append(fm.Found(tpath, fmt, None, False, role=POINTER))
            continue
        if not name or "/" in name:
            continue  # Megatron's 'release'; a path is the symlink rule's (storage.inside), not a step's name
        target = os.path.normpath(os.path.join(folder, name))
        # (one on disk the user did not name: not ours)
        if target not in present and not os.path.lexists(target):
            extra.append(fm.Found(target, fmt, fm.step_from_name(name), True))
    return extra


POINTER = "resume-pointer"  # fm.Found.role of a DeepSpeed `latest` / Megatron tracker that names no checkpoint


def _discover_jobs(
    paths: list[str], notes: list[str]
) -> tuple[list[fm.Found], set[str], dict[str, str]]:
    """Every checkpoint at or under the paths, the folders whose Orbax steps carry commit markers, and
    checkpoint -> the path the user named. Orbax steps soft-deleted into a todelete_subdir are left out, with a
    line in `notes`."""
    jobs: list[fm.Found] = []
    orbax_commit_roots: set[str] = set()
    roots: dict[str, str] = {}
    seen: set[str] = set()
    for raw in paths:
        p = os.fspath(raw)
        if not os.path.lexists(p):
            raise UsageError(
                f"{p}: no such file or folder; expected a checkpoint or a folder of checkpoints"
            )
        if os.path.islink(p) and not os.path.exists(p):
            raise UsageError(
                f"{p}: dangling or looping symlink; expected a checkpoint or a folder of checkpoints"
            )
        found, _unrec = fm.discover(p)
        deleted = orbax.orbax_soft_deleted(found)
        if deleted:
            found = [f for f in found if f not in deleted]
            notes.append(orbax.soft_deleted_note(p, deleted))
        if not found and not deleted:
            kind = "folder" if os.path.isdir(p) else "file"
            raise UsageError(
                f"{p}: no checkpoint recognised in this {kind}; expected checkpoint-N/, *.ckpt, "
                "*.safetensors, a DCP/Orbax/DeepSpeed/Megatron step folder, or a folder of them"
            )
        parents = sorted({os.path.dirname(f.path) for f in found if f.role != fm.FINAL_EXPORT})
        for f in found:
            roots.setdefault(f.path, p)
        for parent in parents:
            found += _tracker_entries(
                parent, [f for f in found if os.path.dirname(f.path) == parent]
            )
            if orbax.commit_marked(found, parent):
                orbax_commit_roots.add(parent)
        for f in found:  # once each: `latest` beside two given checkpoints names one of them
            if os.path.normpath(f.path) not in seen:
                seen.add(os.path.normpath(f.path))
                jobs.append(f)
    return jobs, orbax_commit_roots, roots


def _check_quick(
    jobs: list[fm.Found], update: ProgressFn, orbax_commit_roots: set[str], roots: dict[str, str]
) -> list[CheckpointResult]:
    """`validate_paths` at the quick level: every job's result, in order, split over processes (fanout; the
    progress bar's `update` is called in this process only)."""

    def work(part: Sequence[int], here: bool) -> list[CheckpointResult]:
        out = []
        for i in part:
            out.append(
                _check_job(jobs[i], "quick", update if here else None, orbax_commit_roots, roots)[0]
            )
            if here:
                update(checkpoints=1)
        return out

    return map_split(
        range(len(jobs)),
        work,
        encode_results,
        decode_results,
        progress=lambda k: update(checkpoints=k),  # the children's checkpoints on the bar too
    )


def _check_job(
    f: fm.Found,
    level: str,
    update: ProgressFn | None,
    orbax_commit_roots: set[str],
    roots: dict[str, str],
    manifest: str | None = None,
    stats: bool = False,
) -> tuple[CheckpointResult, dp.DeepOutcome | None]:
    """One checkpoint of `validate_paths`: its result and (level deep) its outcome."""
    export = f.role == fm.FINAL_EXPORT  # a manifest there would cover every checkpoint-N/
    result, outcome = check_with_values(
        f,
        level,
        update,
        os.path.dirname(f.path) in orbax_commit_roots,
        None if export else manifest,
        stats=stats,
        root=roots.get(f.path),
    )
    if export:
        result.notes.append(FINAL_EXPORT_NOTE)
    return result, outcome


FINAL_EXPORT_NOTE = (
    "final export: the run folder's own top-level model files "
    "(its checkpoint-N/ folders are checked one by one)"
)


def seen_data(r: CheckpointResult) -> list | None:
    """What the checker saw of a result (`Seen`) as JSON data, or None."""
    seen = r.seen
    return (
        None
        if seen is None
        else [
            seen.families,
            seen.flat_names,
            seen.flat_read,
            seen.flat_unread,
            seen.marker,
            seen.trainer_best,
            seen.state_read,
        ]
    )


def encode_results(results: list[CheckpointResult]) -> bytes:
    """Results as bytes (fanout: a child process sends a chunk back): one line of JSON with what the checker
    saw of each, then each result as pydantic's own JSON on a line of its own (JSON text holds no raw newline).
    pydantic-core writes and reads these itself: a third of the time of model_dump + json and back. A result
    it cannot write as UTF-8 (a path with a byte that is not UTF-8, read by os.listdir as a lone surrogate)
    goes as "!" and the stdlib's ASCII-escaped JSON instead."""
    dump = CheckpointResult.__pydantic_serializer__.to_json
    lines = [json.dumps([seen_data(r) for r in results], separators=(",", ":")).encode()]
    for r in results:
        try:
            lines.append(dump(r))
        except ValueError:  # PydanticSerializationError: surrogates not allowed
            lines.append(
                b"!" + json.dumps(r.model_dump(mode="json"), separators=(",", ":")).encode()
            )
    return b"\n".join(lines)


def decode_results(data: bytes) -> list[CheckpointResult]:
    """`encode_results` undone: the same results, validated again as any input is (ValueError, TypeError or
    KeyError: not what encode_results writes)."""
    lines = data.split(b"\n")
    seen = json.loads(lines[0])
    load = CheckpointResult.__pydantic_validator__.validate_json
    results = [
        CheckpointResult.model_validate(json.loads(line[1:]))
        if line.startswith(b"!")
        else load(line)
        for line in lines[1:]
    ]
    if len(seen) != len(results):
        raise ValueError(f"{len(seen)} records of what was seen for {len(results)} results")
    for r, s in zip(results, seen, strict=True):
        if s is not None:
            fam, flat, read, unread, marker, best, state_read = s
            r._seen = Seen(
                tuple(fam) if fam is not None else None,
                tuple(flat) if flat is not None else None,
                int(read),
                tuple(unread),
                marker,
                best,
                bool(state_read),
            )
    return results


def _hash_algorithm() -> str:
    from checkpoint_strategy.formats.manifest import ALGORITHM  # with --manifest only (hashlib)

    return ALGORITHM


def refuse_remote_deep(paths: Iterable[str | None], level: str) -> None:
    """Level deep maps tensor data into memory (mmap): a URL is refused with one line (exit 2)."""
    urls = [p for p in paths if p is not None and storage.is_url(p)]
    if urls and level == "deep":
        raise UsageError(
            f"{urls[0]}: --level deep maps tensor data into memory and needs a local copy; on object "
            "storage use --level quick or full (or copy the checkpoint to local disk first)"
        )


def validate_paths(
    paths: Iterable[str],
    level: str = "quick",
    manifest: str | None = None,
    progress: bool | None = None,
    stats: str | None = None,
) -> ValidationReport:
    """Validate every checkpoint at or under each path (roots with many checkpoints allowed).

    A path may be a URL (s3://BUCKET/PREFIX, gs://..., memory://...): one listing of the prefix,
    then the same checks on the objects' bytes through ranged reads (storage/remote.py); levels
    quick and full, manifest verify.

    Level deep compares each checkpoint with the previous one of the same run (same folder, next
    lower step): a global weight norm that moved more than 2x is "suspicious". `stats`: write the
    per-tensor figures of every checkpoint to this JSON file (level deep only).
    """
    started = time.perf_counter()
    level = _check_level(level, manifest)
    paths = [os.fspath(p) for p in paths]
    urls = refuse_remote(paths, level, manifest)
    with storage.local_paths(paths, prefetch=level == "quick") as local:
        report = _validate_local(local, level, manifest, progress, stats, started)
        # a caller inside a view keeps its paths
        return storage.unshadow_model(report) if urls else report


def refuse_remote(paths: list[str], level: str, manifest: str | None) -> list[str]:
    """The URLs among `paths`, after refusing what object storage cannot do (deep, --manifest write)."""
    urls = [p for p in paths if storage.is_url(p)]
    refuse_remote_deep(urls, level)
    if urls and manifest == "write":
        raise UsageError(
            f"{urls[0]}: --manifest write is local only (it writes integrity.json beside each "
            "checkpoint); --manifest verify works on object storage"
        )
    return urls


def _validate_local(
    paths: list[str],
    level: str,
    manifest: str | None,
    progress: bool | None,
    stats: str | None,
    started: float,
) -> ValidationReport:
    if stats is not None:
        _check_stats_path(stats, level, paths)
    notes: list[str] = []
    jobs, orbax_commit_roots, roots = _discover_jobs(paths, notes)
    results, per_ckpt = _check_jobs(
        jobs, level, manifest, progress, stats is not None, orbax_commit_roots, roots
    )
    if stats is not None:
        from checkpoint_strategy.render import to_json

        storage.write_output(
            stats,
            to_json(DeepStats(checkpoints=per_ckpt).model_dump(mode="json")),
            "--stats",
            inputs=tuple(paths),
        )
    counts = {s: sum(r.status == s for r in results) for s in ("valid", "invalid", "incomplete")}
    from checkpoint_strategy.validate.coverage import blind_spots, families

    return ValidationReport(
        level=level,
        manifest=manifest,
        hash_algorithm=_hash_algorithm() if manifest else None,
        checkpoints=results,
        blind_spots=blind_spots(
            ((seen := r.seen) and seen.families or families(r.format, r.path) for r in results),
            level,
            manifest,
        ),
        notes=notes,
        summary=ValidationSummary(
            checkpoints=len(results), seconds=round(time.perf_counter() - started, 3), **counts
        ),
    )


def _check_stats_path(stats: str, level: str, paths: list[str]) -> None:
    """--stats: level deep, a JSON file path in an existing folder, never inside a checkpoint this command reads."""
    if level != "deep":
        raise UsageError(
            "--stats needs --level deep (the per-tensor figures come from the deep pass)"
        )
    if stats.strip() == "":
        raise UsageError("--stats: empty path; expected a JSON file to write")
    if os.path.isdir(stats) or not os.path.isdir(os.path.dirname(os.path.abspath(stats))):
        raise UsageError(
            f"--stats: cannot write {stats}: "
            + ("is a folder" if os.path.isdir(stats) else "its folder does not exist")
            + "; expected a JSON file path"
        )
    storage.check_output(stats, "--stats", inputs=tuple(paths))


def _check_jobs(
    jobs: list[fm.Found],
    level: str,
    manifest: str | None,
    progress: bool | None,
    want_stats: bool,
    orbax_commit_roots: set[str],
    roots: dict[str, str],
) -> tuple[list[CheckpointResult], list[CheckpointStats]]:
    """Check every job, its results in the jobs' order; level deep goes through each run folder by step and
    compares each checkpoint with the one before (`want_stats`: and keeps their per-tensor figures)."""
    from checkpoint_strategy.validate.progress import Progress

    per_ckpt: list[CheckpointStats] = []
    previous: dict[str, tuple[int, str, dp.DeepOutcome]] = {}  # run folder -> last deep outcome
    order = (
        sorted(
            range(len(jobs)),
            key=lambda i: (os.path.dirname(jobs[i].path), jobs[i].step is None, jobs[i].step or 0),
        )
        if level == "deep"
        else range(len(jobs))
    )
    by_index: dict[int, CheckpointResult] = {}
    with Progress(total=len(jobs), enabled=progress) as bar:
        # nothing carried from one checkpoint to the next: split
        if level == "quick" and manifest is None:
            order = []
            by_index = dict(enumerate(_check_quick(jobs, bar.update, orbax_commit_roots, roots)))
        for i in order:
            f = jobs[i]
            export = f.role == fm.FINAL_EXPORT
            result, outcome = _check_job(
                f, level, bar.update, orbax_commit_roots, roots, manifest, want_stats
            )
            if outcome is not None:
                run = os.path.dirname(f.path)
                prev = previous.get(run)
                if prev is not None and f.step is not None and prev[0] != f.step and not export:
                    _compare(result, outcome, prev[2], prev[1])
                if f.step is not None and not export:
                    previous[run] = (f.step, os.path.basename(f.path), outcome)
                if want_stats:
                    per_ckpt.append(
                        CheckpointStats(
                            path=result.path,
                            step=result.step,
                            weights_norm=outcome.check.weights_norm,
                            tensors=outcome.tensors,
                        )
                    )
            by_index[i] = result
            bar.update(checkpoints=1)
    return [by_index[i] for i in range(len(jobs))], per_ckpt
