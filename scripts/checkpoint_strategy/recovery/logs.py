"""Read training logs into one loss timeline.

Formats: Hugging Face ``trainer_state.json`` (``log_history``), a JSON list of records, JSON lines,
CSV (any step/loss column names; W&B's panel export with ``<run> - <metric>`` and ``__MIN``/``__MAX``
columns works), and TensorBoard event files (optional: needs the ``tensorboard`` package).

Restarts: a run resumed from a checkpoint that appends to the same log repeats steps. The log is
split into segments wherever the step does not increase; a newer segment overrides every older
value at or after its first step (the timeline is rewound to the resume point), and each restart
is reported. Steps that go down twice in a row are not a restart but an unsorted log: exit 2.

Every problem with the input raises ``UsageError`` with one line.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from collections.abc import Iterable, Sequence

import numpy as np

from checkpoint_strategy.errors import UsageError

STEP_KEYS = ("step", "global_step", "train/global_step", "trainer/global_step", "_step", "iteration",
             "iter", "it")
LOSS_KEYS = ("loss", "train/loss", "train_loss", "training_loss", "train/train_loss", "lm loss", "lm_loss",
             "train/lm_loss", "train/loss_step", "train_loss_step", "loss_step", "train/lm loss")
GRAD_KEYS = ("grad_norm", "train/grad_norm", "grad-norm", "gradient_norm", "train/gradient_norm",
             "grad_norm/total", "train/grad-norm")
LR_KEYS = ("learning_rate", "train/learning_rate", "lr", "learning-rate", "train/lr", "lr-AdamW", "lr-Adam",
           "lr-SGD", "train/learning-rate")
MAX_STEP = 2**53  # steps beyond this are not exact as floats; no real run gets near it

FORMATS = ("auto", "hf", "json", "jsonl", "csv", "tensorboard")


@dataclass
class LogSeries:
    """A loss timeline. ``steps`` is strictly increasing; values are float64 (NaN = not logged,
    except in ``loss`` where NaN/inf are real logged values)."""

    path: str
    format: str
    step_key: str
    loss_key: str
    grad_norm_key: Optional[str]
    lr_key: Optional[str]
    steps: np.ndarray
    loss: np.ndarray
    grad_norm: Optional[np.ndarray]
    lr: Optional[np.ndarray]
    entries: int
    restarts: list[dict] = field(default_factory=list)
    # the raw file-order arrays and segment ids, for verify-resume
    raw_steps: Optional[np.ndarray] = None
    raw_loss: Optional[np.ndarray] = None
    raw_lr: Optional[np.ndarray] = None
    raw_segment: Optional[np.ndarray] = None

    @property
    def log_interval(self) -> int:
        if len(self.steps) < 2:
            return 1
        return max(1, int(np.median(np.diff(self.steps[-min(len(self.steps), 10001):]))))


@dataclass
class Columns:
    step: Optional[str] = None
    loss: Optional[str] = None
    grad_norm: Optional[str] = None
    lr: Optional[str] = None
    run: Optional[str] = None


# --------------------------------------------------------------------------------------------
# Finding the log


def find_log(path: str | os.PathLike) -> Path:
    """A file is returned as is; a folder is searched for the newest trainer_state.json
    (the folder itself and checkpoint folders up to two levels down), then for TensorBoard
    event files."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"log not found: {p} (expected a trainer_state.json, CSV, JSON lines or "
                         "TensorBoard file, or a run/checkpoint folder)")
    if p.is_file():
        return p
    if not p.is_dir():
        raise UsageError(f"log is neither a file nor a folder: {p}")
    states: list[Path] = []
    for pattern in ("trainer_state.json", "*/trainer_state.json", "*/*/trainer_state.json"):
        states.extend(q for q in p.glob(pattern) if q.is_file())
    if states:
        return _newest_state(states)
    events = [q for pattern in ("events.out.tfevents*", "*/events.out.tfevents*", "*/*/events.out.tfevents*")
              for q in p.glob(pattern) if q.is_file()]
    if events:
        newest = max(events, key=lambda q: (q.stat().st_mtime, q.name))
        return newest.parent
    raise UsageError(f"no training log found in {p}: expected trainer_state.json (HF Trainer) or "
                     "events.out.tfevents.* (TensorBoard); pass a CSV or JSON lines log as a file")


def _newest_state(states: list[Path]) -> Path:
    """The checkpoint-N folder with the highest step wins (mtimes change under `cp -r`); a
    trainer_state.json without a step in its folder name (the run folder's own, written when
    training ends) wins only when it is at least as recent as that checkpoint's."""
    def mtime(q: Path) -> float:
        try:
            return q.stat().st_mtime
        except OSError:
            return 0.0

    numbered: list[tuple[int, float, Path]] = []
    plain: list[tuple[int, float, Path]] = []
    for q in states:
        m = re.search(r"(\d+)$", q.parent.name)
        (numbered if m else plain).append((int(m.group(1)) if m else -1, mtime(q), q))
    best = max(numbered, key=lambda t: t[:2], default=None)
    newest_plain = max(plain, key=lambda t: t[1], default=None)
    if best is None or (newest_plain is not None and newest_plain[1] >= best[1]):
        return (newest_plain or best or (0, 0.0, states[0]))[2]
    return best[2]


def detect_format(path: Path, head: bytes) -> str:
    name = path.name.lower()
    if path.is_dir() or "tfevents" in name:
        return "tensorboard"
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith((".csv", ".tsv")):
        return "csv"
    stripped = head.lstrip()
    if name.endswith(".json") or stripped[:1] in (b"{", b"["):
        return "json"
    return "csv"


# --------------------------------------------------------------------------------------------
# Reading


def read_log(path: str | os.PathLike, *, log_format: str = "auto", columns: Optional[Columns] = None) -> LogSeries:  # noqa: C901 - complexity debt, see issue 10
    """Read a log (file or folder) into a LogSeries; UsageError on any bad input."""
    columns = columns or Columns()
    if log_format not in FORMATS:
        raise UsageError(f"unknown log format {log_format!r}; expected one of {', '.join(FORMATS)}")
    p = find_log(path)
    if log_format == "tensorboard" or (log_format == "auto" and (p.is_dir() or "tfevents" in p.name)):
        return _finish(p, "tensorboard", *_read_tensorboard(p, columns))
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read log {p}: {exc.strerror or exc}") from None
    if not data.strip():
        raise UsageError(f"log {p} is empty (0 bytes or only whitespace); expected training log entries")
    fmt = detect_format(p, data[:64]) if log_format == "auto" else log_format
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"log {p} is not UTF-8 text (a binary file?); expected JSON, JSON lines or CSV") from None
    if fmt in ("json", "hf"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            if fmt == "json" and exc.msg == "Extra data" and text.lstrip().startswith("{"):
                return _finish(p, "jsonl", *_read_jsonl(p, text, columns))
            raise UsageError(f"log {p} is not valid JSON (truncated?): {exc.msg} at line {exc.lineno} "
                             f"column {exc.colno}") from None
        except RecursionError:
            raise UsageError(f"log {p} is JSON nested too deeply to be a training log") from None
        if isinstance(obj, dict) and "log_history" in obj:
            return _finish(p, "hf", *_read_records(p, obj["log_history"], columns, hf=True))
        if isinstance(obj, list):
            return _finish(p, "json", *_read_records(p, obj, columns, hf=False))
        if fmt == "hf":
            raise UsageError(f"log {p} has no log_history list; expected a Hugging Face trainer_state.json")
        raise UsageError(f"log {p} is JSON but neither a trainer_state.json (no log_history) nor a list of "
                         "records; expected one of those or JSON lines")
    if fmt == "jsonl":
        return _finish(p, "jsonl", *_read_jsonl(p, text, columns))
    return _finish(p, "csv", *_read_csv(p, text, columns))


def _read_jsonl(p: Path, text: str, columns: Columns):
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            msg = getattr(exc, "msg", "too deeply nested")
            raise UsageError(f"log {p} line {lineno} is not valid JSON (truncated?): {msg}") from None
        if not isinstance(rec, dict):
            raise UsageError(f"log {p} line {lineno} is not a JSON object; expected one record per line")
        records.append(rec)
    return _read_records(p, records, columns, hf=False, what="line")


def _pick(available: Iterable[str], wanted: Optional[str], candidates: Sequence[str], what: str,
          p: Path, required: bool) -> Optional[str]:
    names = list(available)
    if wanted is not None:
        if wanted in names:
            return wanted
        if required:
            raise UsageError(f"log {p} has no {what} column {wanted!r}; columns: {_preview(names)}")
        return None
    lower = {n.lower(): n for n in names}
    for cand in candidates:
        if cand.lower() in lower:
            return lower[cand.lower()]
    if required:
        hint = "--step-column" if what == "step" else "--loss-column"
        raise UsageError(f"log {p} has no {what} column (looked for {', '.join(candidates[:4])}, ...); "
                         f"columns: {_preview(names)}; name it with {hint}")
    return None


def _preview(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:limit])
    more = len(names) - limit
    return (shown + f" and {more} more") if more > 0 else (shown or "none")


def _read_records(p: Path, records: Any, columns: Columns, *, hf: bool, what: str = "entry"):
    if not isinstance(records, list):
        raise UsageError(f"log {p}: log_history is not a list; expected a Hugging Face trainer_state.json")
    if not records:
        raise UsageError(f"log {p} has no log entries (empty log_history or list)")
    keys: dict[str, None] = {}
    for rec in records[:2000]:
        if isinstance(rec, dict):
            keys.update(dict.fromkeys(rec))
    if not keys:
        raise UsageError(f"log {p} holds no JSON objects; expected records with step and loss")
    loss_key = _pick(keys, columns.loss, LOSS_KEYS, "loss", p, required=True)
    step_key = _pick(keys, columns.step, STEP_KEYS, "step", p, required=True)
    grad_key = _pick(keys, columns.grad_norm, GRAD_KEYS, "grad-norm", p, required=columns.grad_norm is not None)
    lr_key = _pick(keys, columns.lr, LR_KEYS, "learning-rate", p, required=columns.lr is not None)
    index = [i for i, rec in enumerate(records)
             if type(rec) is dict and rec.get(loss_key) is not None]
    if not index:
        raise UsageError(f"log {p} has no {loss_key!r} values; expected training loss entries")
    recs = [records[i] for i in index]
    steps = _numbers(p, [r.get(step_key) for r in recs], "step", index, what)
    loss = _numbers(p, [r[loss_key] for r in recs], "loss", index, what)
    grad = _numbers(p, [r.get(grad_key) for r in recs], "grad norm", index, what, missing_ok=True) if grad_key else None
    lr = _numbers(p, [r.get(lr_key) for r in recs], "learning rate", index, what, missing_ok=True) if lr_key else None
    return steps, loss, grad, lr, step_key, loss_key, grad_key, lr_key


def _numbers(p: Path, values: list, name: str, index: Sequence[int], what: str, missing_ok: bool = False) -> np.ndarray:
    """Fast path: numpy converts numbers (and numeric strings); anything else gets a one-line error."""
    try:
        return np.fromiter(values, dtype=np.float64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        pass
    out = np.empty(len(values), dtype=np.float64)
    for k, v in enumerate(values):
        if v is None and missing_ok:
            out[k] = math.nan
            continue
        num = _to_float(v)
        if num is None:
            label = f"{what} {index[k] + (1 if what == 'line' else 0)}"
            raise UsageError(f"log {p}: {name} at {label} is {_show(v)}, not a number")
        out[k] = num
    return out


def _to_float(v: Any) -> Optional[float]:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:
            return math.inf if v > 0 else -math.inf
    if isinstance(v, str):
        s = v.strip()
        if not s:
            return None
        try:
            return float(s)
        except ValueError:
            return None
    return None


def _show(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _read_csv(p: Path, text: str, columns: Columns):
    if "\x00" in text:
        raise UsageError(f"log {p} contains NUL bytes; expected a CSV text file")
    first = text.split("\n", 1)[0]
    delimiter = "\t" if (p.name.lower().endswith(".tsv") or ("\t" in first and "," not in first)) else ","
    try:
        rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    except csv.Error as exc:
        raise UsageError(f"log {p} is not valid CSV: {exc}") from None
    rows = [r for r in rows if any(c.strip() for c in r)]
    if not rows:
        raise UsageError(f"log {p} is empty; expected a CSV header and rows")
    header = [h.strip() for h in rows[0]]
    body = rows[1:]
    if not body:
        raise UsageError(f"log {p} has a header but no rows; expected training log rows")
    names = _wandb_names(header, columns.run, p)
    avail = list(names)
    loss_col = _pick(avail, columns.loss, LOSS_KEYS, "loss", p, required=True)
    if columns.loss is None and loss_col is None:  # pragma: no cover - _pick raises
        raise UsageError(f"log {p} has no loss column")
    step_col = _pick(avail, columns.step, STEP_KEYS, "step", p, required=True)
    grad_col = _pick(avail, columns.grad_norm, GRAD_KEYS, "grad-norm", p, required=columns.grad_norm is not None)
    lr_col = _pick(avail, columns.lr, LR_KEYS, "learning-rate", p, required=columns.lr is not None)
    li, si = names[str(loss_col)], names[str(step_col)]
    gi = names[grad_col] if grad_col else None
    ri = names[lr_col] if lr_col else None
    steps, loss, grad, lr, lines = [], [], [], [], []
    for n, row in enumerate(body, 2):
        cell = row[li].strip() if li < len(row) else ""
        if not cell:
            continue  # W&B exports leave a run's cell empty at steps it did not log
        steps.append(row[si] if si < len(row) else "")
        loss.append(cell)
        grad.append(row[gi] if gi is not None and gi < len(row) else None)
        lr.append(row[ri] if ri is not None and ri < len(row) else None)
        lines.append(n - 1)
    if not loss:
        raise UsageError(f"log {p} has no values in its loss column {loss_col!r}")
    grad = [None if (g is None or not g.strip()) else g for g in grad]
    lr = [None if (v is None or not v.strip()) else v for v in lr]
    step_arr = _numbers(p, steps, "step", lines, "line")
    loss_arr = _numbers(p, loss, "loss", lines, "line")
    grad_arr = _numbers(p, grad, "grad norm", lines, "line", missing_ok=True) if gi is not None else None
    lr_arr = _numbers(p, lr, "learning rate", lines, "line", missing_ok=True) if ri is not None else None
    return step_arr, loss_arr, grad_arr, lr_arr, step_col, loss_col, grad_col, lr_col


def _wandb_names(header: list[str], run: Optional[str], p: Path) -> dict[str, int]:
    """Map metric names to column indexes. W&B panel exports name columns '<run> - <metric>' and
    add '<run> - <metric>__MIN' / '__MAX'; the x-axis column is 'Step'."""
    plain: dict[str, int] = {}
    by_run: dict[str, dict[str, int]] = {}
    for i, h in enumerate(header):
        if h.endswith(("__MIN", "__MAX")):
            continue
        if " - " in h:
            r, metric = h.rsplit(" - ", 1)
            by_run.setdefault(r.strip(), {}).setdefault(metric.strip(), i)
        else:
            plain.setdefault(h, i)
    if not by_run:
        if run is not None:
            raise UsageError(f"--run {run!r} given but {p} has no W&B '<run> - <metric>' columns")
        return plain
    if run is not None:
        if run not in by_run:
            raise UsageError(f"log {p} has no run {run!r}; runs: {_preview(sorted(by_run))}")
        chosen = run
    else:
        with_loss = [r for r, m in by_run.items() if any(k.lower() in {c.lower() for c in LOSS_KEYS} for k in m)]
        pool = with_loss or list(by_run)
        if len(pool) > 1:
            raise UsageError(f"log {p} holds several W&B runs ({_preview(sorted(pool), 4)}); pick one with --run")
        chosen = pool[0]
    names = dict(plain)
    for metric, i in by_run[chosen].items():
        names.setdefault(metric, i)
    return names


def _read_tensorboard(p: Path, columns: Columns):
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise UsageError("reading TensorBoard event files needs the optional 'tensorboard' package: "
                         "pip install 'checkpoint-strategy[tensorboard]' (or export the scalars to CSV)") from None
    try:
        acc = EventAccumulator(str(p), size_guidance={"scalars": 0}, purge_orphaned_data=False)
        acc.Reload()
        tags = list(acc.Tags().get("scalars", []))
    except Exception as exc:  # noqa: BLE001 - corrupt files surface as assorted errors
        raise UsageError(f"cannot read TensorBoard events {p}: {type(exc).__name__}: {exc}") from None
    if not tags:
        raise UsageError(f"TensorBoard log {p} has no scalar tags; expected a training loss scalar")
    loss_tag = _pick(tags, columns.loss, LOSS_KEYS, "loss", p, required=True)
    grad_tag = _pick(tags, columns.grad_norm, GRAD_KEYS, "grad-norm", p, required=columns.grad_norm is not None)
    lr_tag = _pick(tags, columns.lr, LR_KEYS, "learning-rate", p, required=columns.lr is not None)

    def scalars(tag):
        try:
            events = acc.Scalars(tag)
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"cannot read TensorBoard tag {tag!r} in {p}: {exc}") from None
        return sorted(events, key=lambda e: e.wall_time)

    loss_ev = scalars(loss_tag)
    if not loss_ev:
        raise UsageError(f"TensorBoard tag {loss_tag!r} in {p} has no values")
    steps = np.array([e.step for e in loss_ev], dtype=np.float64)
    loss = np.array([e.value for e in loss_ev], dtype=np.float64)

    def aligned(tag):
        if tag is None:
            return None
        lookup = {e.step: e.value for e in scalars(tag)}
        return np.array([lookup.get(e.step, math.nan) for e in loss_ev], dtype=np.float64)

    return steps, loss, aligned(grad_tag), aligned(lr_tag), "step", loss_tag, grad_tag, lr_tag


# --------------------------------------------------------------------------------------------
# Validation and restart segments


def _finish(p: Path, fmt: str, steps, loss, grad, lr, step_key, loss_key, grad_key, lr_key) -> LogSeries:
    return build_series(steps, loss, grad, lr, path=str(p), fmt=fmt, step_key=step_key, loss_key=loss_key,
                        grad_norm_key=grad_key, lr_key=lr_key)


def build_series(steps, loss, grad_norm=None, lr=None, *, path: str = "<memory>", fmt: str = "json",
                 step_key: str = "step", loss_key: str = "loss", grad_norm_key: Optional[str] = None,
                 lr_key: Optional[str] = None) -> LogSeries:
    """Validate raw file-order arrays, merge restart segments (latest wins) and return the timeline."""
    steps = np.asarray(steps, dtype=np.float64)
    loss = np.asarray(loss, dtype=np.float64)
    n = len(steps)
    if n == 0 or len(loss) != n:
        raise UsageError(f"log {path} has no loss values; expected training log entries")
    bad = ~np.isfinite(steps) | (steps < 0) | (steps > MAX_STEP) | (steps != np.floor(steps))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        shown = "missing" if np.isnan(steps[k]) else repr(float(steps[k]))
        raise UsageError(f"log {path}: step at entry {k + 1} is {shown}; expected a whole number >= 0")
    isteps = steps.astype(np.int64)
    grad_norm = None if grad_norm is None else np.asarray(grad_norm, dtype=np.float64)
    if grad_norm is not None and not np.isfinite(grad_norm).any() and np.isnan(grad_norm).all():
        grad_norm, grad_norm_key = None, None
    lr = None if lr is None else np.asarray(lr, dtype=np.float64)
    if lr is not None and np.isnan(lr).all():
        lr, lr_key = None, None

    new_seg = np.empty(n, dtype=bool)
    new_seg[0] = False
    new_seg[1:] = isteps[1:] <= isteps[:-1]
    down = np.zeros(n, dtype=bool)
    down[1:] = isteps[1:] < isteps[:-1]
    twice = down[1:] & down[:-1]
    if twice.any():
        k = int(np.flatnonzero(twice)[0])
        raise UsageError(f"log {path}: steps are out of order at entry {k + 1} ({isteps[k - 1]}, {isteps[k]}, "
                         f"{isteps[k + 1]}); expected increasing steps (a restart goes back once, then increases)")
    seg = np.cumsum(new_seg)
    restarts: list[dict] = []
    if new_seg.any():
        starts_idx = np.concatenate(([0], np.flatnonzero(new_seg)))
        seg_start = isteps[starts_idx]
        later_min = np.empty(len(seg_start), dtype=np.float64)
        later_min[-1] = np.inf
        if len(seg_start) > 1:
            later_min[:-1] = np.minimum.accumulate(seg_start[::-1].astype(np.float64))[::-1][1:]
        keep = isteps < later_min[seg]
        for i in starts_idx[1:]:
            prev = int(isteps[i - 1])
            restarts.append({"step": int(isteps[i]), "previous_step": prev,
                             "repeated_steps": int(max(0, prev - int(isteps[i]) + 1)), "entry": int(i)})
    else:
        keep = None

    def sel(a):
        if a is None:
            return None
        return a if keep is None else a[keep]

    return LogSeries(path=path, format=fmt, step_key=step_key, loss_key=loss_key, grad_norm_key=grad_norm_key,
                     lr_key=lr_key, steps=sel(isteps), loss=sel(loss), grad_norm=sel(grad_norm), lr=sel(lr),
                     entries=n, restarts=restarts, raw_steps=isteps, raw_loss=loss, raw_lr=lr, raw_segment=seg)
