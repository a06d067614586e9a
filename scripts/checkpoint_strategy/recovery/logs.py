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
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Optional, cast

import numpy as np

from checkpoint_strategy import storage
from checkpoint_strategy.errors import UsageError, no_log_entries
from checkpoint_strategy.formats.runlog import METRICS_FILE, find_run_log
from checkpoint_strategy.recovery import records
from checkpoint_strategy.recovery.logkeys import (
    GRAD_KEYS,
    LOSS_KEYS,
    LR_KEYS,
    LogProblem,
    _pick,
    _preview,
    _show,
    _to_float,
)
from checkpoint_strategy.vocabulary import BOUNDS

NO_LOG = "no training log found"  # the words callers match (integrations/handoff.py)
MAX_STEP = int(
    BOUNDS["logged_step"].hi
)  # 2**53: steps beyond it are not exact as floats; no real run gets near it

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
    eval_steps: Optional[np.ndarray] = None
    eval_loss: Optional[np.ndarray] = None
    eval_key: Optional[str] = None
    best_model_checkpoint: Optional[str] = None
    # the raw file-order arrays and segment ids, for verify-resume
    raw_steps: Optional[np.ndarray] = None
    raw_loss: Optional[np.ndarray] = None
    raw_lr: Optional[np.ndarray] = None
    raw_segment: Optional[np.ndarray] = None
    notes: list[str] = field(
        default_factory=list
    )  # what the reader left out (a torn last JSONL line)
    #: the usual steps between two logged values (the median of the last 10 000 gaps), set once by build_series:
    #: the adviser reads it as a value, it does not call back into the reader
    log_interval: int = 1


def _log_interval(steps: np.ndarray) -> int:
    if len(steps) < 2:
        return 1
    return max(1, int(np.median(np.diff(steps[-min(len(steps), 10001) :]))))


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
    """A file is returned as is; a folder is a run folder whose log `formats.runlog.find_run_log` names
    (the one discovery every command and callback uses: trainer_state.json, the callbacks' loss log,
    Lightning's metrics.csv, TensorBoard event files)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(
            f"log not found: {p} (expected a trainer_state.json, CSV, JSON lines or "
            "TensorBoard file, or a run/checkpoint folder)"
        )
    if p.is_file():
        return p
    if not p.is_dir():
        raise UsageError(f"log is neither a file nor a folder: {p}")
    found = find_run_log(p)
    if found is not None:
        return Path(found)
    raise UsageError(
        f"{NO_LOG} in {p}: expected trainer_state.json (HF Trainer), {METRICS_FILE} (the "
        "checkpoint-strategy callbacks), metrics.csv (Lightning) or events.out.tfevents.* (TensorBoard); "
        "pass a CSV or JSON lines log as a file"
    )


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


MAX_LOG_BYTES = 64 << 30  # a JSON document is read whole (bytes only); line formats are streamed


def read_log(
    path: str | os.PathLike, *, log_format: str = "auto", columns: Optional[Columns] = None
) -> LogSeries:
    """Read a log (file or folder) into a LogSeries; UsageError on any bad input.

    Memory: JSON lines and CSV are streamed (the numeric columns only); a JSON document is held
    as bytes while its log_history is parsed in slices (recovery/records.py)."""
    columns = columns or Columns()
    if log_format not in FORMATS:
        raise UsageError(f"unknown log format {log_format!r}; expected one of {', '.join(FORMATS)}")
    if str(path) == "":
        raise UsageError("LOG: empty path: expected a training log file or a run folder")
    p = find_log(path)
    try:
        return _read(p, log_format, columns)
    except (
        LogProblem
    ) as exc:  # the readers below word a problem without the log's name: it is named here
        raise exc.named(p) from None


def _read(p: Path, log_format: str, columns: Columns) -> LogSeries:
    if log_format == "tensorboard" or (
        log_format == "auto" and (p.is_dir() or "tfevents" in p.name)
    ):
        return _finish(p, "tensorboard", *_read_tensorboard(p, columns))
    with storage.open_regular(p, "log") as fh:
        try:
            head = fh.read(1 << 16)
            fmt = detect_format(p, head) if log_format == "auto" else log_format
            if fmt in ("json", "hf"):
                return _read_streamed(p, fh, head, fmt, columns) or _read_document(
                    p, _whole(fh, head), fmt, columns
                )
            if fmt == "jsonl":
                return _read_stream(p, fh, head, columns)
            return _read_csv(p, fh, head, columns)
        except OSError as exc:
            raise UsageError(storage.oserror_line(exc, "read log", p)) from None


STREAM_MIN_BYTES = 16 << 20  # a trainer_state.json this big is streamed (recovery/records.py)


def _read_streamed(p: Path, fh, head: bytes, fmt: str, columns: Columns) -> Optional[LogSeries]:
    """A big trainer_state.json read without holding its text: the same series, meta and first error as
    _read_document's sliced parse; None when it cannot be sliced (the caller then reads it whole)."""
    size = os.fstat(fh.fileno()).st_size
    if size < STREAM_MIN_BYTES or size > MAX_LOG_BYTES:
        return None
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    meta: dict = {}
    col = records.Collector(columns)
    first_error: Optional[UsageError] = None
    try:
        for batch in records.stream_history_batches(fh, head, meta):
            if (
                first_error is None
            ):  # a bad value counts once the document proves sliceable (checked last)
                try:
                    col.add_many(batch)
                except UsageError as exc:
                    first_error = exc
    except records._SliceError:
        return None
    if first_error is not None:
        raise first_error
    kind = _document_kind(p, meta.get("_format"), fmt, col.count)
    return _series_from(p, kind, col, meta)


def _whole(fh, head: bytes) -> bytearray:
    """The whole file (head included) from its start, wherever a streamed read left it."""
    if fh.tell() != len(head):
        fh.seek(0)
        head = fh.read(len(head))
    return _read_rest(fh, head)


def _read_rest(fh, head: bytes) -> bytearray:
    """head + the rest of the file in one buffer, without a second copy of a big document."""
    size = os.fstat(fh.fileno()).st_size
    if size > MAX_LOG_BYTES:
        raise UsageError(
            f"log {fh.name} is larger than {MAX_LOG_BYTES >> 30} GB; expected a training log"
        )
    buf = bytearray(max(size, len(head)) + 1)
    buf[: len(head)] = head
    view = memoryview(buf)
    n = len(head)
    while True:
        got = fh.readinto(view[n:])
        if not got:
            break
        n += got
        if n == len(buf):  # the file grew while being read: take what is there
            buf.extend(fh.read())
            n = len(buf)
            break
    view.release()
    del buf[n:]
    return buf


def _series_from(p: Path, fmt: str, col, meta: Optional[dict] = None) -> LogSeries:
    series = _finish(p, fmt, *col.finish())
    es, ev, key = col.eval_series()
    series.eval_steps, series.eval_loss, series.eval_key = es, ev, key
    if meta:
        best = meta.get("best_model_checkpoint")
        series.best_model_checkpoint = best if isinstance(best, str) and best else None
    return series


def _read_document(p: Path, data: bytearray, fmt: str, columns: Columns) -> LogSeries:
    if not re.search(rb"\S", data):
        raise UsageError(
            f"log {p} is empty (0 bytes or only whitespace); expected training log entries"
        )
    if data.startswith(b"\xef\xbb\xbf"):
        del data[:3]
    for attempt in ("sliced", "whole"):
        meta: dict = {}
        col = records.Collector(columns)
        try:
            _collect_document(p, data, attempt, col, meta)
        except records._SliceError:
            continue
        except records._JSONError as err:
            exc = err.exc
            if (
                fmt == "json"
                and exc.msg == "Extra data"
                and re.match(rb"\s*\{", data)
                and _on_next_line(data, exc.pos)
            ):
                return _read_stream(
                    p, io.BytesIO(data), b"", columns
                )  # JSON lines under a .json name
            why = "text after the document" if exc.msg == "Extra data" else "truncated?"
            raise UsageError(
                f"log {p} is not valid JSON ({why}): {exc.msg} at line {exc.lineno} "
                f"column {exc.colno}"
            ) from None
        kind = _document_kind(p, meta.get("_format"), fmt, col.count)
        del data  # the raw text goes before the series are built
        return _series_from(p, kind, col, meta)
    raise UsageError(
        f"log {p} could not be read"
    )  # pragma: no cover - the whole parse always decides


def _on_next_line(data: bytearray, pos: int) -> bool:
    """The extra data after a JSON document starts on a line of its own (JSON lines), not after the document on
    its line (`{...} garbage`: a damaged document, reported as invalid JSON where the garbage starts)."""
    i = pos
    while i > 0 and data[i - 1] in b" \t\r\n":
        i -= 1
    return b"\n" in data[i:pos]


def _collect_document(p: Path, data: bytearray, attempt: str, col, meta: dict) -> None:
    """Feed a JSON document's records to the collector: in slices of the text, or parsed whole."""
    if attempt == "sliced":
        for batch in records.json_document_batches(data, meta):
            col.add_many(batch)
        return
    obj = records._parse_whole(data)
    items = _document_items(p, obj, meta)
    del obj
    for k in range(0, len(items), records.SLICE_RECORDS):
        col.add_many(items[k : k + records.SLICE_RECORDS])


def _document_kind(p: Path, kind: Optional[str], fmt: str, count: int) -> str:
    """The document's format ("hf" or "json") once it is known to fit --log-format and to hold entries."""
    if kind == "other":
        if fmt == "hf":
            raise UsageError(
                f"log {p} has no log_history list; expected a Hugging Face trainer_state.json"
            )
        raise UsageError(
            f"log {p} is JSON but neither a trainer_state.json (no log_history) nor a list of "
            "records; expected one of those or JSON lines"
        )
    if kind == "json" and fmt == "hf":
        raise UsageError(
            f"log {p} has no log_history list; expected a Hugging Face trainer_state.json"
        )
    if count == 0:
        raise no_log_entries(p)
    return str(kind)


def _document_items(p: Path, obj: Any, meta: dict) -> list:
    if isinstance(obj, dict) and "log_history" in obj:
        meta.update({k: v for k, v in obj.items() if k != "log_history"})
        meta["_format"] = "hf"
        if not isinstance(obj["log_history"], list):
            raise UsageError(
                f"log {p}: log_history is not a list; expected a Hugging Face trainer_state.json"
            )
        return obj["log_history"]
    if isinstance(obj, list):
        meta["_format"] = "json"
        return obj
    meta["_format"] = "other"
    return []


def _read_stream(p: Path, fh, head: bytes, columns: Columns) -> LogSeries:
    col = records.Collector(columns, what="line", offset=1)
    notes: list[str] = []
    for recs, linenos in records.jsonl_batches(fh, head, notes):
        col.add_many(
            recs,
            range(linenos.start - 1, linenos.stop - 1)
            if isinstance(linenos, range)
            else [n - 1 for n in linenos],
        )  # the collector counts lines from 0 (offset 1)
    if col.count == 0:
        raise UsageError(
            f"log {p} is empty (0 bytes or only whitespace); expected training log entries"
        )
    series = _series_from(p, "jsonl", col)
    series.notes = [
        f"log {p}{note}" for note in notes
    ]  # what follows "log NAME" (records.jsonl_batches)
    return series


def _numbers(
    p: Path, values: list, name: str, index: Sequence[int], what: str, missing_ok: bool = False
) -> np.ndarray:
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


def _read_csv(p: Path, fh, head: bytes, columns: Columns) -> LogSeries:
    """CSV rows as records (empty cells are not logged values): W&B exports, Lightning metrics.csv
    with interleaved train/validation/LR rows, any step/loss column names."""
    if b"\x00" in head:
        raise UsageError(f"log {p} contains NUL bytes; expected a CSV text file")
    # a raw stream serves TextIOWrapper at run time; typeshed asks for a buffered one
    text = io.TextIOWrapper(cast(BinaryIO, _Prefixed(head, fh)), encoding="utf-8-sig", newline="")
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace")
    delimiter = (
        "\t" if (p.name.lower().endswith(".tsv") or ("\t" in first and "," not in first)) else ","
    )
    reader = csv.reader(text, delimiter=delimiter)
    try:
        header = next(
            ([h.strip() for h in row] for row in reader if any(c.strip() for c in row)), None
        )
        if header is None:
            raise UsageError(f"log {p} is empty; expected a CSV header and rows")
        names = _wandb_names(header, columns.run, p)
        col = records.Collector(columns, what="line", offset=2, known_keys=names)
        rows = _csv_rows(p, reader, list(names.items()), col)
    except csv.Error as exc:
        raise UsageError(f"log {p} is not valid CSV: {exc}") from None
    except UnicodeDecodeError:
        raise UsageError(
            f"log {p} is not UTF-8 text (a binary file?); expected JSON, JSON lines or CSV"
        ) from None
    if not rows:
        raise UsageError(f"log {p} has a header but no rows; expected training log rows")
    if col.keys is None:
        col._decide()
    assert col.keys is not None, "_decide sets the keys"
    if not len(col.loss):
        raise UsageError(f"log {p} has no values in its loss column {col.keys[1]!r}")
    return _series_from(p, "csv", col)


def _csv_rows(p: Path, reader, items: list[tuple[str, int]], col) -> int:
    """Each non-blank row as a record of its non-empty cells (name -> text); returns the number of rows."""
    rows = 0
    for row in reader:
        if "\x00" in "".join(row):
            raise UsageError(f"log {p} contains NUL bytes; expected a CSV text file")
        if not any(c.strip() for c in row):
            continue
        rows += 1
        rec = {}
        for name, i in items:
            if i < len(row):
                cell = row[i].strip()
                if cell:
                    rec[name] = cell
        col.add(rec)
    return rows


class _Prefixed(io.RawIOBase):
    """An already-read head followed by the rest of a binary file, as one readable stream."""

    def __init__(self, head: bytes, fh) -> None:
        self.head, self.fh = head, fh

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.head:
            n = min(len(b), len(self.head))
            b[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = self.fh.read(len(b))
        b[: len(data)] = data
        return len(data)


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
        with_loss = [
            r
            for r, m in by_run.items()
            if any(k.lower() in {c.lower() for c in LOSS_KEYS} for k in m)
        ]
        pool = with_loss or list(by_run)
        if len(pool) > 1:
            raise UsageError(
                f"log {p} holds several W&B runs ({_preview(sorted(pool), 4)}); pick one with --run"
            )
        chosen = pool[0]
    names = dict(plain)
    for metric, i in by_run[chosen].items():
        names.setdefault(metric, i)
    return names


def _read_tensorboard(p: Path, columns: Columns):
    if storage.display(str(p)) != str(
        p
    ):  # TensorBoard's reader opens files itself: not through storage/
        raise UsageError(
            f"{storage.display(str(p))}: TensorBoard event files are read from local disk only; "
            "copy them down first (or export the scalars to CSV)"
        )
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise UsageError(
            "reading TensorBoard event files needs the optional 'tensorboard' package: "
            "pip install 'checkpoint-strategy[tensorboard]' (or export the scalars to CSV)"
        ) from None
    try:
        acc = EventAccumulator(str(p), size_guidance={"scalars": 0}, purge_orphaned_data=False)
        acc.Reload()
        tags = list(acc.Tags().get("scalars", []))
    except Exception as exc:  # noqa: BLE001 - corrupt files surface as assorted errors
        raise UsageError(
            f"cannot read TensorBoard events {p}: {type(exc).__name__}: {exc}"
        ) from None
    if not tags:
        raise UsageError(f"TensorBoard log {p} has no scalar tags; expected a training loss scalar")
    loss_tag = _pick(tags, columns.loss, LOSS_KEYS, "loss", required=True)
    grad_tag = _pick(
        tags, columns.grad_norm, GRAD_KEYS, "grad-norm", required=columns.grad_norm is not None
    )
    lr_tag = _pick(tags, columns.lr, LR_KEYS, "learning-rate", required=columns.lr is not None)

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


def _finish(
    p: Path, fmt: str, steps, loss, grad, lr, step_key, loss_key, grad_key, lr_key
) -> LogSeries:
    """The series of a reader's own arrays (its float64 steps become the int64 ones in place)."""
    return build_series(
        steps,
        loss,
        grad,
        lr,
        path=str(p),
        fmt=fmt,
        step_key=step_key,
        loss_key=loss_key,
        grad_norm_key=grad_key,
        lr_key=lr_key,
        reuse_steps=True,
    )


def _merge_repeats(isteps, loss, grad_norm, lr):
    """Consecutive rows with the same step are one optimizer step logged per micro-batch (gradient
    accumulation in Lightning) or twice: their mean loss, largest grad norm and last LR, not a restart."""
    new = np.empty(len(isteps), dtype=bool)
    new[0] = True
    new[1:] = isteps[1:] != isteps[:-1]
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(isteps)))
    with np.errstate(invalid="ignore", over="ignore"):
        loss = np.add.reduceat(np.asarray(loss, dtype=np.float64), starts) / counts
        if grad_norm is not None:
            grad_norm = np.fmax.reduceat(np.asarray(grad_norm, dtype=np.float64), starts)
    if lr is not None:
        lr = np.asarray(lr, dtype=np.float64)[np.append(starts[1:], len(isteps)) - 1]
    return isteps[starts], loss, grad_norm, lr


def _segments(isteps: np.ndarray, path: str) -> tuple[np.ndarray, Optional[np.ndarray], list[dict]]:
    """Restart segments of file-order steps: (segment id per entry, the entries the timeline keeps - a later
    segment wins for the steps it repeats - or None when there is no restart, the restarts)."""
    n = len(isteps)
    new_seg = np.empty(n, dtype=bool)
    new_seg[0] = False
    new_seg[1:] = isteps[1:] <= isteps[:-1]
    down = np.zeros(n, dtype=bool)
    down[1:] = isteps[1:] < isteps[:-1]
    twice = down[1:] & down[:-1]
    if twice.any():
        k = int(np.flatnonzero(twice)[0])
        raise UsageError(
            f"log {path}: steps are out of order at entry {k + 1} ({isteps[k - 1]}, {isteps[k]}, "
            f"{isteps[k + 1]}); expected increasing steps (a restart goes back once, then increases)"
        )
    if not new_seg.any():
        return (
            np.zeros(n, dtype=np.int64),
            None,
            [],
        )  # calloc'd: no memory is touched for a log without restarts
    seg = np.cumsum(new_seg)
    starts_idx = np.concatenate(([0], np.flatnonzero(new_seg)))
    seg_start = isteps[starts_idx]
    later_min = np.empty(len(seg_start), dtype=np.float64)
    later_min[-1] = np.inf
    if len(seg_start) > 1:
        later_min[:-1] = np.minimum.accumulate(seg_start[::-1].astype(np.float64))[::-1][1:]
    restarts = []
    for i in starts_idx[1:]:
        prev = int(isteps[i - 1])
        restarts.append(
            {
                "step": int(isteps[i]),
                "previous_step": prev,
                "repeated_steps": int(max(0, prev - int(isteps[i]) + 1)),
                "entry": int(i),
            }
        )
    return seg, isteps < later_min[seg], restarts


STEP_CHUNK = (
    1 << 13
)  # steps checked and converted at a time (64 KB temporaries: see detect.STATS_VALUES)


def _whole_steps(steps: np.ndarray, path: str, *, in_place: bool) -> np.ndarray:
    """The steps as int64; UsageError naming the first one that is not a whole number in 0..MAX_STEP. in_place: the
    float64 array's own memory becomes the int64 one (a chunk at a time: no second copy of a long series)."""
    n = len(steps)
    own = (
        in_place
        and steps.dtype == np.float64
        and steps.flags.c_contiguous
        and steps.flags.writeable
    )
    isteps = steps.view(np.int64) if own else np.empty(n, dtype=np.int64)
    for lo in range(0, n, STEP_CHUNK):
        part = steps[lo : lo + STEP_CHUNK]
        with np.errstate(
            invalid="ignore"
        ):  # NaN/inf/huge steps cast to anything: they are refused below
            whole = part.astype(np.int64)
        bad = ~np.isfinite(part)
        bad |= part < 0
        bad |= part > MAX_STEP
        bad |= whole != part  # not a whole number (the cast truncates; steps >= 0 here)
        if bad.any():
            k = lo + int(np.flatnonzero(bad)[0])
            shown = "missing" if np.isnan(steps[k]) else repr(float(steps[k]))
            raise UsageError(
                f"log {path}: step at entry {k + 1} is {shown}; expected {BOUNDS['logged_step'].expected()}"
            )
        isteps[lo : lo + STEP_CHUNK] = whole  # (in place: this chunk's floats are read already)
    return isteps


def build_series(
    steps,
    loss,
    grad_norm=None,
    lr=None,
    *,
    path: str = "<memory>",
    fmt: str = "json",
    step_key: str = "step",
    loss_key: str = "loss",
    grad_norm_key: Optional[str] = None,
    lr_key: Optional[str] = None,
    reuse_steps: bool = False,
) -> LogSeries:
    """Validate raw file-order arrays, merge restart segments (latest wins) and return the timeline.
    reuse_steps: a float64 `steps` array may become the int64 steps in place (a reader's own array)."""
    steps = np.asarray(steps, dtype=np.float64)
    loss = np.asarray(loss, dtype=np.float64)
    n = len(steps)
    if n == 0 or len(loss) != n:
        raise UsageError(f"log {path} has no loss values; expected training log entries")
    isteps = _whole_steps(steps, path, in_place=reuse_steps)
    read = n
    if n > 1 and (isteps[1:] == isteps[:-1]).any():
        isteps, loss, grad_norm, lr = _merge_repeats(isteps, loss, grad_norm, lr)
        n = len(isteps)
    grad_norm = None if grad_norm is None else np.asarray(grad_norm, dtype=np.float64)
    if grad_norm is not None and not np.isfinite(grad_norm).any() and np.isnan(grad_norm).all():
        grad_norm, grad_norm_key = None, None
    lr = None if lr is None else np.asarray(lr, dtype=np.float64)
    if lr is not None and np.isnan(lr).all():
        lr, lr_key = None, None

    seg, keep, restarts = _segments(isteps, path)

    def sel(a):
        if a is None:
            return None
        return a if keep is None else a[keep]

    steps_kept = sel(isteps)
    return LogSeries(
        path=path,
        format=fmt,
        step_key=step_key,
        loss_key=loss_key,
        grad_norm_key=grad_norm_key,
        lr_key=lr_key,
        steps=steps_kept,
        loss=sel(loss),
        grad_norm=sel(grad_norm),
        lr=sel(lr),
        entries=read,
        restarts=restarts,
        raw_steps=isteps,
        raw_loss=loss,
        raw_lr=lr,
        raw_segment=seg,
        log_interval=_log_interval(steps_kept),
    )
