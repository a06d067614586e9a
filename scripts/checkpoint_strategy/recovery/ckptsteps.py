"""Which steps have a checkpoint: from a folder's entry names (the names `formats/steps.py` lists and
`scan` reads: HF, torchtitan, Megatron, DeepSpeed, Lightning, Orbax; temporary entries and emergency saves
left out), or from an explicit list."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.marker import is_emergency
from checkpoint_strategy.formats.models import LEVELS
from checkpoint_strategy.formats.steps import MAX_STEP, scan
from checkpoint_strategy.vocabulary import BOUNDS, shown

_LIST = re.compile(r"^\s*\d+\s*(,\s*\d+\s*)*,?\s*$")


def parse_spec(spec: str) -> tuple[str, Optional[str], list[tuple[int, Optional[str]]]]:
    """--checkpoints ROOT_OR_LIST -> (source, root, [(step, path)])."""
    text = str(spec).strip()
    if _LIST.match(text):
        steps = sorted({int(s) for s in text.split(",") if s.strip()})
        if any(s > MAX_STEP for s in steps):
            raise UsageError(
                f"--checkpoints: step {max(steps)} is too large in {shown(spec)}; expected "
                f"{BOUNDS['logged_step'].expected().replace('a whole number of', 'whole numbers of')}"
            )
        return "list", None, [(s, None) for s in steps]
    root = Path(text)
    if not root.is_dir():
        raise UsageError(
            f"--checkpoints {spec!r} is neither a folder nor a list of steps like 500,1000"
        )
    found = scan(root)
    if not found:
        raise UsageError(
            f"no checkpoints found in {root}: expected entries named checkpoint-N, step-N, "
            "iter_0000500, global_stepN, epoch=E-step=N.ckpt or numeric Orbax folders"
        )
    return "folder", str(root), list(found)


def resume_candidates(
    checkpoints: list[tuple[int, Optional[str]]],
) -> list[tuple[int, Optional[str]]]:
    """Drop emergency saves (marked post-event checkpoints) from a (step, path) list."""
    return [(s, p) for s, p in checkpoints if p is None or not is_emergency(p)]


_WORDS = {
    "invalid": "invalid",
    "incomplete": "incomplete",
    "not_resumable": "not resumable",
    "suspicious": "suspicious",
}


def validated(
    checkpoints: list[tuple[int, Optional[str]]], level: Optional[str] = "quick"
) -> tuple[list[tuple[int, Optional[str]]], list[str]]:
    """The resume candidates the project's validator passes, and one line per candidate skipped
    ("checkpoint-200 skipped: invalid: 12 NaN values in ..."). `level`: quick, full or deep (deep also
    compares each checkpoint's weights norm with the previous one's); None: not validated (the caller
    did). A valid weights-only checkpoint (no optimizer state) is skipped when another candidate is
    resumable; candidates without a path (steps given as a list) or of a layout the validator does not
    know are kept as they are, with one note."""
    if level is not None and level not in LEVELS:
        raise UsageError(f"level must be quick, full or deep, got {level!r}")
    if level is None or not checkpoints:  # nothing to check: the validator is not even imported
        return list(checkpoints), []
    from checkpoint_strategy.formats import identify as fm
    from checkpoint_strategy.validate.engine import check_with_values, compare_consecutive

    checked: list[tuple[int, str, Any, Any]] = []
    unknown: list[tuple[int, Optional[str]]] = []
    for step, path in sorted(checkpoints, key=lambda t: t[0]):
        found = fm.identify(path) if path is not None and os.path.lexists(path) else None
        if found is None:
            unknown.append((step, path))
            continue
        result, outcome = check_with_values(found, level)
        checked.append((step, os.path.basename(os.path.normpath(found.path)), result, outcome))
    compare_consecutive(checked)
    verdicts = [(step, result, _skip_reason(result)) for step, _name, result, _o in checked]
    any_resumable = any(why is None and result.resumable for _s, result, why in verdicts)
    kept, notes = list(unknown), []
    for step, result, why in verdicts:
        if why is None and not result.resumable and any_resumable:
            why = "not resumable: no optimizer state (weights only: resuming from it resets the optimizer)"
        if why is None:
            kept.append((step, result.path))
        else:
            notes.append(f"{os.path.basename(os.path.normpath(result.path))} skipped: {why}")
    shown = [os.path.basename(os.path.normpath(p)) for _s, p in unknown if p is not None]
    if shown:
        notes.append(
            f"not validated (layout not recognised): {', '.join(shown[:5])}"
            + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
        )
    return sorted(kept, key=lambda t: t[0]), notes


def _skip_reason(result) -> Optional[str]:
    """Why a validated candidate is no resume point ("invalid: ...", "not resumable: ..."), or None."""
    from checkpoint_strategy.validate.engine import usable

    if result.status == "valid" and usable(result):
        return None
    bad = (
        [p for p in result.problems if p.kind == result.status]
        if result.status != "valid"
        else [p for p in result.problems if p.kind in ("suspicious", "not_resumable")]
    )
    if not bad:
        return result.status
    p = bad[0]
    word = _WORDS.get(p.kind, p.kind)
    body = p.reason.removeprefix(f"{word}: ")
    where = f" ({p.file})" if p.file and p.file != "." and p.file not in body else ""
    return f"{word}: {body}{where}"
