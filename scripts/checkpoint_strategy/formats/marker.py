"""The emergency marker: a small JSON file saying a checkpoint holds post-event weights.

The training callbacks (``checkpoint_strategy.callbacks``) save a checkpoint the moment the
online detector sees a loss spike or a grad-norm blow-up. That checkpoint holds the weights
*after* the event: useful to inspect or to compare, never a point to resume from. It is marked
with ``checkpoint-strategy.json``::

    {"producer": "checkpoint-strategy", "kind": "emergency", "event": "loss_spike_detected",
     "step": 46, "rules": [...], "written_at": "2026-11-30T00:12:03Z"}

Where the marker lives:
  a checkpoint folder (checkpoint-N/, step-N/ ...)  inside it: ``<folder>/checkpoint-strategy.json``
  a checkpoint file (*.ckpt, *.pt)                   beside it: ``<file>.checkpoint-strategy.json``

The callbacks write the marker *before* the save starts, so there is no moment when a
post-event checkpoint exists unmarked. ``validate`` notes it, ``recover`` never offers a marked
checkpoint as a resume point, and ``prune`` keeps it (outside keep_last) while the spike it
records has not recovered.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Optional

from checkpoint_strategy.atomic import atomic_write_text
from checkpoint_strategy.storage import ReadError, read_json

MARKER_NAME = "checkpoint-strategy.json"
MARKER_SUFFIX = "." + MARKER_NAME
MAX_MARKER_BYTES = 64 << 10
EVENTS = ("loss_spike_detected", "gradient_norm_exceeded")


def marker_path(checkpoint: str | os.PathLike) -> str:
    """Where the marker of `checkpoint` is: inside a folder, beside a file (a missing path that
    ends in a file extension such as .ckpt/.pt/.pth/.bin/.safetensors counts as a file)."""
    p = os.path.normpath(os.fspath(checkpoint))
    if os.path.isdir(p):
        return os.path.join(p, MARKER_NAME)
    if os.path.lexists(p) or os.path.splitext(p)[1].lower() in (
        ".ckpt",
        ".pt",
        ".pth",
        ".bin",
        ".safetensors",
    ):
        return p + MARKER_SUFFIX
    return os.path.join(p, MARKER_NAME)


def write_marker(
    checkpoint: str | os.PathLike,
    *,
    event: str,
    step: int,
    rules: list[str] | None = None,
    written_at: Optional[str] = None,
) -> str:
    """Write the emergency marker (atomically); creates the checkpoint folder if it does not exist
    yet (the marker goes in first). Returns the marker path."""
    if event not in EVENTS:
        raise ValueError(f"event must be one of {EVENTS}, got {event!r}")
    path = marker_path(checkpoint)
    if path.endswith(os.sep + MARKER_NAME):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    when = written_at or datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace(
        "+00:00", "Z"
    )
    doc = {
        "producer": "checkpoint-strategy",
        "kind": "emergency",
        "event": event,
        "step": int(step),
        "rules": list(rules or []),
        "written_at": when,
    }
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")
    return path


def read_marker(checkpoint: str | os.PathLike) -> Optional[dict]:
    """The marker of `checkpoint` as a dict when it is a well-formed emergency marker, else None.

    A marker that exists but cannot be read or parsed is treated as present with unknown event
    (``{"kind": "emergency", "event": None, "step": None, "unreadable": reason}``): a post-event
    checkpoint must never become a resume point because its marker got damaged.
    """
    path = marker_path(checkpoint)
    if not os.path.lexists(path):
        return None
    try:
        data = read_json(path, "emergency marker", limit=MAX_MARKER_BYTES, expect=dict)
    except ReadError as exc:
        return {"kind": "emergency", "event": None, "step": None, "unreadable": exc.reason}
    if data.get("kind") != "emergency":
        return None
    step = data.get("step")
    event = data.get("event")
    return {
        "kind": "emergency",
        "event": event if event in EVENTS else None,
        "step": step
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0
        else None,
    }


def is_emergency(checkpoint: str | os.PathLike) -> bool:
    return read_marker(checkpoint) is not None


def describe(mark: dict) -> str:
    """One phrase for reasons and notes."""
    event = mark.get("event") or "an event"
    step = mark.get("step")
    where = f" at step {step}" if step is not None else ""
    if mark.get("unreadable"):
        return f"emergency save (marker unreadable: {mark['unreadable']}; treated as post-event)"
    return f"emergency save on {event}{where} (post-event weights)"
