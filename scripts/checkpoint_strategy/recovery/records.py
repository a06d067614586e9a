"""Streaming readers for record logs: keep only the numeric series, never the parsed records.

* ``Collector`` takes records (dicts) one at a time. It picks the columns from the first
  KEY_SAMPLE records, then keeps step/loss/grad-norm/learning-rate/eval-loss as float arrays
  (``array('d')``: 8 bytes a value). A learning rate or eval loss logged in a row of its own (a
  Lightning metrics.csv with interleaved rows) is carried to the next loss row.
* ``json_document_batches`` reads a HF ``trainer_state.json`` and yields its log_history entries
  in lists. The ``log_history`` array is parsed in slices of SLICE_RECORDS entries
  (orjson when installed; the standard library when a slice holds HF's NaN/Infinity tokens, which
  orjson rejects), so the peak memory is the file's bytes plus one slice, not a million dicts.
  Anything unusual (a string holding ``},{``, nested records) falls back to one standard parse.
* ``jsonl_batches`` yields the records of JSON lines in batches with their line numbers (bounded memory:
  one 64 KB block of records at a time). A block whose lines all have the first line's shape - the same
  keys in the same order with the same spacing, every value a number - is ``Rows``: its numbers only, one
  flat orjson array (no dict a line; ``_rows_block``). Any other block of flat one-object lines is one orjson
  array of dicts; anything else line by line: orjson when installed, the standard library for any line it
  refuses. Every way gives the records the standard library gives line by line.

None of them holds the log's path: a problem is a ``logkeys.LogProblem`` worded as what follows "log NAME"
(a note of ``jsonl_batches`` too), which ``logs.read_log`` names.
"""

from __future__ import annotations

import json
import math
import mmap
import re
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO, Optional

from checkpoint_strategy.errors import NO_LOG_ENTRIES, UsageError
from checkpoint_strategy.recovery.logkeys import (
    GRAD_KEYS,
    LOSS_KEYS,
    LR_KEYS,
    STEP_KEYS,
    LogProblem,
    _pick,
    _show,
    _to_float,
)

KEY_SAMPLE = 2000
SLICE_RECORDS = 20000
BATCH_LINES = (
    20000  # JSON lines parsed and converted at a time (bounded memory: one batch of records)
)
BLOCK_BYTES = 1 << 16  # JSON lines read at a time (a small block: its records fit in the CPU cache)
SPLIT_KEYS = (
    "split",
    "phase",
    "mode",
    "stage",
)  # a column saying which rows are train and which validation
EVAL_SPLITS = ("val", "valid", "validation", "eval", "evaluation", "test", "dev")
EVAL_KEYS = (
    "eval_loss",
    "val_loss",
    "eval/loss",
    "val/loss",
    "validation_loss",
    "valid_loss",
    "val_loss_epoch",
    "validation/loss",
    "eval_loss_epoch",
)

SHORT_LINE = 2048  # bytes: a line this short cannot nest deeper than 1024 ('[' * 1024 + ']' * 1024)


def _orjson_module() -> tuple[Any, bool]:
    """(orjson or None, whether its loads limits nesting). Before 3.9.15 orjson recursed without a limit
    and a deeply nested input crashed the process (CVE-2024-27454): such a version parses only lines of
    at most SHORT_LINE bytes, and the standard library (RecursionError: a clean error) everything else."""
    try:  # optional: several times faster parsing of big logs (see pyproject's 'fast' extra)
        import orjson
    except ImportError:  # pragma: no cover - depends on the environment
        return None, False
    try:
        version = tuple(int(x) for x in re.findall(r"\d+", orjson.__version__)[:3])
    except (AttributeError, ValueError):  # pragma: no cover - every release has a version
        version = ()
    return orjson, version >= (3, 9, 15)


_orjson, _ORJSON_LIMITS_DEPTH = _orjson_module()


_NESTED_OBJECT = re.compile(rb":[ \t\n\r]*\{")


def _orjson_may_parse(data: bytes | bytearray) -> bool:
    """An orjson without a depth limit gets only what cannot nest deeper than 3: a short text, or one with at
    most one '[' and no object as a value (a log_history slice of flat entries: every '{' an array element)."""
    if _ORJSON_LIMITS_DEPTH or len(data) <= SHORT_LINE:
        return True
    return data.count(b"[") <= 1 and _NESTED_OBJECT.search(data) is None


def _loads(data: bytes) -> Any:
    if _orjson is not None and _orjson_may_parse(data):
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # NaN/Infinity tokens (HF writes them) or real errors: the standard library decides
    return json.loads(data)


# the columns a log's records are read from: step, loss, grad norm, learning rate, eval loss
Keys = tuple[str, str, Optional[str], Optional[str], Optional[str]]
_PLAIN_NUMBERS = {int, float}


class Collector:
    """Numeric columns of a stream of records (see the module docstring)."""

    def __init__(
        self,
        columns,
        *,
        what: str = "entry",
        offset: int = 0,
        known_keys: Optional[Iterable[str]] = None,
    ) -> None:
        self.columns, self.what, self.offset = columns, what, offset
        self.known_keys = list(known_keys) if known_keys is not None else None
        self.sample: list[tuple[int, dict]] = []
        self.keys: Optional[Keys] = None
        self.steps, self.loss, self.grad, self.lr = _Column(), _Column(), _Column(), _Column()
        self.eval_steps, self.eval_loss = _Column(), _Column()
        self.split_key: Optional[str] = None
        self.eval_from_split: Optional[str] = None
        self.count = 0
        self.objects = 0
        self._last_lr = math.nan

    def add(self, rec: Any, at: Optional[int] = None) -> None:
        """One record; `at` is its number for messages (minus the offset; default: records so far)."""
        i = self.count if at is None else at
        self.count += 1
        if type(rec) is not dict:
            if self.what == "line":
                raise LogProblem(
                    f" line {i + self.offset} is not a JSON object; expected one record per line"
                )
            return
        self.objects += 1
        if self.keys is None:
            self.sample.append((i, rec))
            if len(self.sample) >= KEY_SAMPLE:
                self._decide()
            return
        self._take(i, rec)

    def add_many(self, recs: list | Rows, at: Optional[Sequence[int]] = None) -> None:
        """A batch of records: the same result as add() one by one (the same first error too), converted
        with numpy. `at`: each record's number for messages (default: consecutive from the records so far)."""
        if isinstance(recs, Rows):
            if self.keys is not None and self.split_key is None:
                self._store(recs.n, self._rows_columns(recs))
                return
            recs = recs.dicts()
        pos: Sequence[int] = range(self.count, self.count + len(recs)) if at is None else at
        k = 0
        while k < len(recs) and (self.keys is None or self.split_key is not None):
            self.add(recs[k], pos[k])
            k += 1
        if k:
            recs, pos = recs[k:], pos[k:]
        if not recs:
            return
        if type(recs) is not Dicts and set(map(type, recs)) != {
            dict
        }:  # not all plain dicts (C-speed check)
            for r, i in zip(recs, pos, strict=True):
                self.add(r, i)
            return
        saved_lr = self._last_lr
        try:
            columns = self._columns(recs, pos)
        except UsageError:  # report the first bad value in record order, as add() does
            self._last_lr = saved_lr
            for r, i in zip(recs, pos, strict=True):
                self.add(r, i)
            return
        self._store(len(recs), columns)

    def _store(self, n: int, columns: tuple) -> None:
        """Append a batch's columns (see _columns) and count its n records."""
        self.count += n
        self.objects += n
        for target, values in zip(
            (self.eval_steps, self.eval_loss, self.loss, self.steps, self.grad, self.lr),
            columns,
            strict=True,
        ):
            if values is not None and len(values):
                target.extend(values)

    def _rows_columns(self, rows: Rows) -> tuple:
        """_columns of Rows: every record has the same keys and every value is a number, so a column is there
        for every record or for none (what _columns gives for such records, without a dict a record)."""
        import numpy as np

        assert self.keys is not None, "decided by the add() calls before"
        step_key, loss_key, grad_key, lr_key, eval_key = self.keys
        n, width = rows.n, len(rows.keys)
        table = np.fromiter(rows.values, dtype=np.float64, count=n * width).reshape(n, width)
        where = {k: j for j, k in enumerate(rows.keys)}

        def column(key: Optional[str], missing: float = math.nan):
            if key is None:
                return None
            return (
                np.ascontiguousarray(table[:, where[key]]) if key in where else np.full(n, missing)
            )

        ev_steps = ev_loss = None
        if eval_key in where and step_key in where:
            ev_steps, ev_loss = column(step_key), column(eval_key)
        lr = column(lr_key, self._last_lr)  # not logged: the last learning rate carried over
        if lr is not None and n:
            self._last_lr = float(lr[-1])
        if loss_key not in where:
            return ev_steps, ev_loss, None, None, None, None
        return ev_steps, ev_loss, column(loss_key), column(step_key), column(grad_key), lr

    def _columns(self, recs: list, pos: Sequence[int]) -> tuple:
        """(eval steps, eval loss, loss, steps, grad norm, lr) of a batch of dict records, nothing stored yet."""
        import numpy as np

        assert self.keys is not None, "decided by the add() calls before"
        step_key, loss_key, grad_key, lr_key, eval_key = self.keys
        ev_steps = ev_loss = grad = lr = None
        if eval_key is not None:
            ev_steps, ev_loss = self._eval_many(recs, pos, step_key, eval_key)
        lr_all = self._lr_many(recs, pos, lr_key) if lr_key is not None else None
        losses = [r.get(loss_key) for r in recs]
        loss_types = set(map(type, losses))
        whole = type(None) not in loss_types
        at: Sequence[int] = (
            range(len(recs)) if whole else [i for i, v in enumerate(losses) if v is not None]
        )
        if not at:
            return ev_steps, ev_loss, None, None, None, None
        rows = recs if whole else [recs[i] for i in at]
        loss = self._floats(
            losses if whole else [losses[i] for i in at],
            "loss",
            pos,
            at,
            types=loss_types if whole else None,
        )
        steps = self._floats([r.get(step_key) for r in rows], "step", pos, at, missing_ok=True)
        if grad_key is not None:
            grad = self._floats(
                [r.get(grad_key) for r in rows], "grad norm", pos, at, missing_ok=True
            )
        if lr_all is not None:
            lr = lr_all if whole else np.asarray(lr_all)[at]
        return ev_steps, ev_loss, loss, steps, grad, lr

    def _eval_many(self, recs: list, pos: Sequence[int], step_key: str, eval_key: str):
        evs = [r.get(eval_key) for r in recs]
        ev_at = [
            i for i, v in enumerate(evs) if v is not None and recs[i].get(step_key) is not None
        ]
        if not ev_at:
            return None, None
        return (
            self._floats([recs[i][step_key] for i in ev_at], "step", pos, ev_at),
            self._floats([evs[i] for i in ev_at], "eval loss", pos, ev_at),
        )

    def _lr_many(self, recs: list, pos: Sequence[int], lr_key: str):
        """The learning rate of every record of a batch, the last logged one carried over where a record has none."""
        import numpy as np

        lrs = [r.get(lr_key) for r in recs]
        have = [i for i, v in enumerate(lrs) if v is not None]
        if len(have) == len(recs):
            lr_all = self._floats(lrs, "learning rate", pos, range(len(recs)))
        else:
            lr_all = np.full(len(recs), np.nan)
            if have:
                lr_all[have] = self._floats([lrs[i] for i in have], "learning rate", pos, have)
            idx = np.where(~np.isnan(lr_all), np.arange(len(recs)), -1)
            np.maximum.accumulate(idx, out=idx)
            lr_all = np.where(idx >= 0, lr_all[np.maximum(idx, 0)], self._last_lr)
        if len(lr_all):
            self._last_lr = float(lr_all[-1])
        return lr_all

    def _floats(
        self,
        values: list,
        name: str,
        pos: Sequence[int],
        where,
        missing_ok: bool = False,
        types: Optional[set] = None,
    ):
        """float64 values, as _num converts them one by one; numpy converts a batch of plain ints and floats
        (strings, booleans, None and the rest go through _num: numpy reads true as 1 and parses strings its way).
        types: the set of the values' types when the caller has it."""
        import numpy as np

        if (set(map(type, values)) if types is None else types) <= _PLAIN_NUMBERS:
            try:
                return np.fromiter(values, dtype=np.float64, count=len(values))
            except OverflowError:  # an integer beyond float64: _num gives +-inf
                pass
        where = list(where)
        out = np.empty(len(values), dtype=np.float64)
        for k, v in enumerate(values):
            out[k] = math.nan if (v is None and missing_ok) else self._num(v, name, pos[where[k]])
        return out

    def _decide(self) -> None:
        keys: dict[str, None] = dict.fromkeys(self.known_keys or ())
        for _, rec in self.sample:
            keys.update(dict.fromkeys(rec))
        if not keys:
            raise LogProblem(" holds no JSON objects; expected records with step and loss")
        c = self.columns
        loss_key = _pick(keys, c.loss, LOSS_KEYS, "loss", required=True)
        step_key = _pick(keys, c.step, STEP_KEYS, "step", required=True)
        grad_key = _pick(
            keys, c.grad_norm, GRAD_KEYS, "grad-norm", required=c.grad_norm is not None
        )
        lr_key = _pick(keys, c.lr, LR_KEYS, "learning-rate", required=c.lr is not None)
        assert loss_key is not None and step_key is not None, (
            "required: _pick raises when they are missing"
        )
        eval_key = next((k for k in EVAL_KEYS if k in keys and k != loss_key), None)
        self.keys = (step_key, loss_key, grad_key, lr_key, eval_key)
        self.split_key = next((k for k in SPLIT_KEYS if k in keys), None)
        if self.split_key is not None and eval_key is None:
            self.keys = (step_key, loss_key, grad_key, lr_key, None)
            self.eval_from_split = loss_key
        sample, self.sample = self.sample, []
        for i, rec in sample:
            self._take(i, rec)

    def _take(self, i: int, rec: dict) -> None:
        assert self.keys is not None, "decided before records are taken"
        step_key, loss_key, grad_key, lr_key, eval_key = self.keys
        split = self.split_key and rec.get(self.split_key)
        if isinstance(split, str) and split.strip().lower() in EVAL_SPLITS:
            v, s = (
                rec.get(loss_key),
                rec.get(step_key),
            )  # a validation row of a "split" log: eval loss
            if v is not None and s is not None:
                self.eval_steps.append(self._num(s, "step", i))
                self.eval_loss.append(self._num(v, "eval loss", i))
            return
        if lr_key is not None:
            v = rec.get(lr_key)
            if v is not None:
                self._last_lr = self._num(v, "learning rate", i)
        if eval_key is not None:
            v = rec.get(eval_key)
            if v is not None:
                s = rec.get(step_key)
                if s is not None:
                    self.eval_steps.append(self._num(s, "step", i))
                    self.eval_loss.append(self._num(v, "eval loss", i))
        v = rec.get(loss_key)
        if v is None:
            return
        self.loss.append(self._num(v, "loss", i))
        self.steps.append(self._num(rec.get(step_key), "step", i))
        if grad_key is not None:
            g = rec.get(grad_key)
            self.grad.append(math.nan if g is None else self._num(g, "grad norm", i))
        if lr_key is not None:
            self.lr.append(self._last_lr)

    def _num(self, v: Any, name: str, i: int) -> float:
        if type(v) is float:
            return v

        num = _to_float(v)
        if num is None:
            if v is None and name == "step":
                return math.nan  # reported as "step ... is missing" by build_series
            label = f"{self.what} {i + self.offset}"
            raise LogProblem(f": {name} at {label} is {_show(v)}, not a number")
        return num

    def finish(self):
        if self.keys is None:
            if not self.count:
                raise LogProblem(NO_LOG_ENTRIES)
            if not self.objects:
                raise LogProblem(" holds no JSON objects; expected records with step and loss")
            self._decide()
        step_key, loss_key, grad_key, lr_key, _ = self.keys
        if not len(self.loss):
            raise LogProblem(f" has no {loss_key!r} values; expected training loss entries")

        grad = self.grad.array() if grad_key is not None else None
        lr = self.lr.array() if lr_key is not None else None
        return self.steps.array(), self.loss.array(), grad, lr, step_key, loss_key, grad_key, lr_key

    def eval_series(self):
        if not len(self.eval_loss):
            return None, None, None
        key = self.keys[4] or (
            f"{self.eval_from_split} ({self.split_key} = validation)"
            if self.eval_from_split
            else "eval"
        )
        return self.eval_steps.array().copy(), self.eval_loss.array().copy(), key


def _anonymous_map(size: int) -> mmap.mmap:
    """Zeroed memory of `size` bytes, private where the platform has MAP_PRIVATE (a shared anonymous map that grows
    past its first size faults with SIGBUS when written)."""
    private = getattr(mmap, "MAP_PRIVATE", None)
    return mmap.mmap(-1, size) if private is None else mmap.mmap(-1, size, flags=private)


class _Column:
    """A float64 column. Single values go to an array('d') (appended in C); batches to an anonymous memory map that
    doubles when full (the values waiting in the array('d') move there first). The map grows in place (mremap: no
    copy, pages touched only when written) and is no malloc block: glibc's allocator never sees a big block freed,
    which would raise its mmap threshold for the rest of the process and keep the analysis' freed temporaries
    resident. array('d') alone grows by 1/16 at a time, and once that threshold has risen (any second read in a
    process) every growth is a copy."""

    __slots__ = ("small", "append", "mm", "n")

    def __init__(self) -> None:
        self.small = array("d")
        self.append = self.small.append
        self.mm: Optional[mmap.mmap] = None
        self.n = 0

    def __len__(self) -> int:
        return self.n + len(self.small)

    def extend(self, values: Any) -> None:
        """Append a float64 numpy array."""
        self._flush()
        self._put(values)

    def _flush(self) -> None:
        import numpy as np

        if len(self.small):
            self._put(np.frombuffer(self.small, dtype=np.float64).copy())
            self.small = array("d")
            self.append = self.small.append

    def _put(self, values: Any) -> None:
        import numpy as np

        k = len(values)
        need = 8 * (self.n + k)
        if self.mm is None:
            self.mm = _anonymous_map(max(need, 1 << 15))
        elif need > len(self.mm):
            size = max(need, 2 * len(self.mm))
            try:
                self.mm.resize(size)
            except (BufferError, OSError, SystemError, ValueError):
                # array() handed out a view of it, or no mremap (macOS): a new map, the values copied once
                grown = _anonymous_map(size)
                grown[: 8 * self.n] = self.mm[: 8 * self.n]
                self.mm = grown
        view = np.frombuffer(self.mm, dtype=np.float64, count=k, offset=8 * self.n)
        view[:] = values
        del view  # (no view may outlive a write: the map could not grow)
        self.n += k

    def array(self) -> Any:
        """The values (shares the column's memory)."""
        import numpy as np

        if self.mm is None:
            return np.frombuffer(self.small, dtype=np.float64) if len(self.small) else np.empty(0)
        self._flush()
        return np.frombuffer(self.mm, dtype=np.float64, count=self.n)


# --------------------------------------------------------------------------------------------
# JSON documents


_BOUNDARY = re.compile(rb"\}\s*,\s*(?=\{)")
_HISTORY = re.compile(rb'"log_history"\s*:\s*\[')


def json_document_batches(data: bytes | bytearray, meta: dict) -> Iterator[list]:
    """Lists of log_history entries of a trainer_state.json, SLICE_RECORDS at a time; top-level
    fields other than log_history (best_model_checkpoint, ...) land in `meta`. Raises _SliceError
    when the document cannot be sliced safely (the caller then parses it whole)."""
    fast = _history_slices(data, meta)
    if fast is None:
        raise _SliceError()
    yield from fast


def _parse_whole(data: bytes | bytearray) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise LogProblem(" is JSON nested too deeply to be a training log") from None
    except UnicodeDecodeError:
        raise LogProblem(
            " is not UTF-8 text (a binary file?); expected JSON, JSON lines or CSV"
        ) from None
    except json.JSONDecodeError as exc:
        raise _JSONError(exc) from None
    except ValueError as exc:  # e.g. a 5000-digit integer
        raise LogProblem(f" is not valid JSON: {' '.join(str(exc).split())[:100]}") from None


class _JSONError(Exception):
    def __init__(self, exc: json.JSONDecodeError) -> None:
        super().__init__(exc.msg)
        self.exc = exc


def _history_slices(data: bytes | bytearray, meta: dict) -> Optional[Iterator[Any]]:
    """The fast path for a trainer_state.json: None when the document does not look like one whose
    log_history can be sliced safely (then the caller parses it whole)."""
    m = _HISTORY.search(data)
    if m is None or re.match(rb"\s*\{", data) is None:
        return None
    start = m.end()
    bounds = [start]
    pos = start
    first = [h.end() for _, h in zip(range(64), _BOUNDARY.finditer(data, start), strict=False)]
    avg = max(16, (first[-1] - start) // len(first)) if first else 64
    while True:  # jump about SLICE_RECORDS entries ahead, cut at the next boundary
        hit = _BOUNDARY.search(data, pos + SLICE_RECORDS * avg)
        if hit is None or data.find(b"]", pos, hit.start()) != -1:
            break  # the array ends first (or an entry holds a list): the rest is one slice
        pos = hit.end()
        bounds.append(pos)
    close = re.compile(rb"\}\s*\]").search(data, pos)
    empty = re.compile(rb"\s*\]").match(data, start)
    if empty is not None:
        end_arr = empty.end() - 1
        cuts = []
    elif close is None:
        return None
    else:
        end_arr = close.end() - 1
        cuts = bounds + [end_arr]
    try:
        rest = json.loads(data[: start - 1] + b"[]" + data[end_arr + 1 :])
    except (ValueError, RecursionError):
        return None
    if not isinstance(rest, dict) or rest.get("log_history") != []:
        return None
    meta.update({k: v for k, v in rest.items() if k != "log_history"})
    meta["_format"] = "hf"
    return _slices(data, cuts)


def _slices(data: bytes | bytearray, cuts: list[int]) -> Iterator[Any]:
    for a, b in zip(cuts, cuts[1:], strict=False):
        yield _slice(data[a:b])


def _slice(chunk: bytes | bytearray) -> list:
    """Entries `{...}, {...}` (a trailing comma is fine) parsed as one list; _SliceError when they do not parse."""
    chunk = chunk.rstrip()
    if chunk.endswith(b","):
        chunk = chunk[:-1]
    try:
        part = _loads(b"[" + chunk + b"]")
    except (ValueError, RecursionError):
        raise _SliceError() from None
    if not isinstance(part, list):
        raise _SliceError()
    return part


STREAM_SLICE_BYTES = 1 << 20  # a streamed log_history is parsed about this many bytes at a time
STREAM_PREFIX_BYTES = 16 << 20  # "log_history" must start within this much of a streamed document


def stream_history_batches(fh: BinaryIO, head: bytes, meta: dict) -> Iterator[list]:
    """json_document_batches on an open file, never holding it whole: the text before log_history, one
    slice, one read block and the text after the array. The same cuts rule (a boundary `},{` with no `]`
    before it; the rest of the array as one slice once a `]` shows) and the same check of everything but
    the array (parsed with `"log_history": []`, at the end: meta is filled then). Raises _SliceError
    whenever json_document_batches would (the caller then parses the document whole)."""
    buf = bytearray(head)
    m = _HISTORY.search(buf)
    while m is None:
        more = fh.read(BLOCK_BYTES) if len(buf) <= STREAM_PREFIX_BYTES else b""
        if not more:
            raise _SliceError()
        buf += more
        m = _HISTORY.search(buf)
    if re.match(rb"\s*\{", buf) is None:
        raise _SliceError()
    prefix = bytes(buf[: m.end() - 1])
    del buf[: m.end()]
    first = True
    while True:
        hit = _BOUNDARY.search(buf, min(len(buf), STREAM_SLICE_BYTES))
        if hit is None or buf.find(b"]", 0, hit.start()) != -1:
            more = fh.read(BLOCK_BYTES) if hit is None else b""
            if more:
                buf += more
                continue
            break  # the array ends first (or an entry holds a list): the rest is one slice
        yield _slice(buf[: hit.end()])
        del buf[: hit.end()]
        first = False
    buf += fh.read()
    yield from _history_end(buf, prefix, first, meta)


def _history_end(rest: bytearray, prefix: bytes, first: bool, meta: dict) -> Iterator[list]:
    """The last slice of a streamed log_history (`rest`: from the slice's start to the end of the file), then the
    check of the document without its array."""
    empty = re.compile(rb"\s*\]").match(rest) if first else None
    if empty is not None:
        end_arr = empty.end() - 1
    else:
        close = re.compile(rb"\}\s*\]").search(rest)
        if close is None:
            raise _SliceError()
        end_arr = close.end() - 1
        yield _slice(rest[:end_arr])
    try:
        doc = json.loads(prefix + b"[]" + rest[end_arr + 1 :])
    except (ValueError, RecursionError):
        raise _SliceError() from None
    if not isinstance(doc, dict) or doc.get("log_history") != []:
        raise _SliceError()
    meta.update({k: v for k, v in doc.items() if k != "log_history"})
    meta["_format"] = "hf"


class _SliceError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# JSON lines


def jsonl_batches(
    fh: BinaryIO, first: bytes = b"", notes: Optional[list[str]] = None
) -> Iterator[tuple[list | Rows, Sequence[int]]]:
    """The records of jsonl_records in batches, each with the records' line numbers (1-based). Lines are cut
    from blocks of BLOCK_BYTES (a long line is joined once, never re-split). With orjson installed, a block
    whose lines all have the first line's shape is Rows (_rows_block; after a block that is not, the try is
    skipped for 1, 2, 4 ... 64 blocks: a log of mixed lines pays for few tries), else a block of flat
    one-object lines is one array (_flat_block); any other block in batches of at most BATCH_LINES lines,
    line by line: by orjson when installed, and a batch with a line orjson refuses (a blank line, NaN/Infinity
    tokens, a BOM, a lone surrogate, an error) with the standard library deciding each line orjson refuses,
    so the records are the same either way."""
    wait, gap = 0, 1
    for block, lineno, n, terminated in line_blocks(fh, first):
        recs: Optional[list | Rows] = None
        if terminated:
            if wait:
                wait -= 1
            else:
                recs = _rows_block(block, n)
                wait, gap = (0, 1) if recs is not None else (gap, min(2 * gap, 64))
            if recs is None:
                recs = _flat_block(block, n)
        if recs is not None:
            yield recs, range(lineno, lineno + len(recs))
            continue
        lines = block.split(b"\n")
        if lineno == 1 and lines[0].startswith(b"\xef\xbb\xbf"):
            lines[0] = lines[0][3:]
        for k in range(0, len(lines), BATCH_LINES):
            part = lines[k : k + BATCH_LINES]
            start = lineno + k
            recs = _fast_lines(part)
            if recs is not None:
                yield recs, range(start, start + len(part))
                continue
            last = terminated or k + BATCH_LINES < len(lines)
            yield from _slow_lines(part, start, last, notes)


_NOT_BRACES = bytes(c for c in range(256) if c not in b"{}\n")


def _flat_block(block: bytes, n: int) -> Optional[list]:
    """The lines of a block (joined by newlines) parsed by orjson as one array `[line,line,...]`, when every
    line holds exactly one '{' and after it one '}' (and no '[' for an orjson without a depth limit) and the
    array is n objects for the n lines. None otherwise (the caller parses line by line).

    The same records as parsing each line alone: n objects need n structural '{', so no brace is in a string,
    object i is line i's braces, and what lies between two objects (the end of one line, the joining comma,
    the start of the next) is the array's separator: each line is whitespace, its object, whitespace."""
    if _orjson is None or (not _ORJSON_LIMITS_DEPTH and b"[" in block):
        return None
    if block.translate(None, _NOT_BRACES) != b"{}\n" * (n - 1) + b"{}":
        return None
    try:
        recs = _orjson.loads(b"[" + block.replace(b"\n", b",") + b"]")
    except (ValueError, TypeError):  # NaN tokens, bad UTF-8, an error: line by line decides
        return None
    return Dicts(recs) if len(recs) == n and set(map(type, recs)) == {dict} else None


class Dicts(list):
    """A list of records known to be plain dicts (Collector.add_many does not check their types again)."""


class Rows:
    """n records with the same keys, all values numbers (int or float, as orjson reads them): `values` holds them
    flat, record after record, in the order of `keys`."""

    __slots__ = ("keys", "values", "n")

    def __init__(self, keys: tuple[str, ...], values: list, n: int) -> None:
        self.keys, self.values, self.n = keys, values, n

    def __len__(self) -> int:
        return self.n

    def dicts(self) -> Dicts:
        """The records as the dicts a line-by-line parse gives (keys in line order)."""
        width, keys, values = len(self.keys), self.keys, self.values
        return Dicts(
            dict(zip(keys, values[i * width : (i + 1) * width], strict=True)) for i in range(self.n)
        )


# the shape of a line of numbers: `{"key": number, "key": number}` (JSON whitespace but newlines around any token;
# keys without escapes, quotes or control bytes); a number here is what JSON numbers are made of (orjson decides)
_SHAPE_OPEN = re.compile(rb"[ \t\r]*\{")
_SHAPE_ITEM = re.compile(
    rb'[ \t\r]*"([^"\\\x00-\x1f]*)"[ \t\r]*:[ \t\r]*([-0-9][-+.0-9eE]*)[ \t\r]*([,}])'
)
_NUMBER_BYTES = b"-+.0123456789eE"
# control bytes JSON text never holds raw (\t \n \r excepted): markers put in place of a shape's pieces
_MARKS = bytes([*range(0x02, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20)])
_JOIN, _FILL = b"\x01", b"\x00"  # the marker of a line break (its piece's other bytes become _FILL)
_TO_COMMAS = bytes.maketrans(_JOIN + _MARKS, b"," * (1 + len(_MARKS)))


def _line_shape(line: bytes) -> Optional[tuple[tuple[str, ...], list[bytes]]]:
    """(keys, pieces) of a line `{"k1": v1, ..., "km": vm}` whose values are number-like and keys distinct:
    pieces[0] is the text before v1, pieces[i] between vi and vi+1, pieces[m] after vm. None for any other line."""
    opened = _SHAPE_OPEN.match(line)
    if opened is None:
        return None
    pos, start = opened.end(), 0
    keys: list[bytes] = []
    pieces: list[bytes] = []
    while True:
        item = _SHAPE_ITEM.match(line, pos)
        if item is None or len(keys) > len(_MARKS):
            return None
        keys.append(item.group(1))
        pieces.append(line[start : item.start(2)])
        start, pos = item.end(2), item.end()
        if item.group(3) == b"}":
            break
    if line[pos:].strip(b" \t\r") or len(set(keys)) != len(keys):
        return None
    pieces.append(line[start:])
    try:
        return tuple(k.decode() for k in keys), pieces
    except UnicodeDecodeError:
        return None


def _rows_block(block: bytes, n: int) -> Optional[Rows]:
    """The n lines of a block as Rows when every line is its first line's shape (_line_shape) with other numbers;
    None otherwise (the caller parses the block another way).

    The pieces between the numbers are replaced by marker bytes (a line break's piece by one of the same length,
    the others by one byte each) and what is left must be numbers and the markers in the shape's order, line
    after line; orjson then reads the numbers as one array. Why that is each line's own parse: the markers are
    control bytes no piece holds, so no replacement matches across an earlier one; no newline is left, and each
    line-break piece holds one, so all n-1 line breaks are real pieces; the other markers are real too, for the
    text shrank by exactly what n real replacements of each piece take away (a marker byte already in the text
    would have shrunk nothing). So each line is the first line's pieces with number bytes between them, and the
    array has n x m elements only when each of those is one JSON number."""
    if _orjson is None:
        return None
    nl = block.find(b"\n")
    shape = _line_shape(block if nl == -1 else block[:nl])
    if shape is None:
        return None
    keys, pieces = shape
    head, inner, tail = pieces[0], pieces[1:-1], pieces[-1]
    if len(block) <= len(head) + len(tail) or not block.endswith(tail):
        return None
    text = block[len(head) : len(block) - len(tail)]
    for k, piece in enumerate(inner):
        text = text.replace(piece, _MARKS[k : k + 1])
    if len(block) - len(head) - len(tail) - len(text) != n * sum(len(piece) - 1 for piece in inner):
        return None  # (a line of another shape mostly shows here, before the rest of the work)
    join = tail + b"\n" + head
    joined = _JOIN + _FILL * (len(join) - 1)
    text = text.replace(join, joined)  # same length: done in place
    marks = _MARKS[: len(inner)]
    if text.translate(None, _NUMBER_BYTES) != (marks + joined) * (n - 1) + marks:
        return None
    try:
        values = _orjson.loads(b"[" + text.translate(_TO_COMMAS, _FILL) + b"]")
    except (ValueError, TypeError):
        return None
    return Rows(keys, values, n) if len(values) == n * len(keys) else None


def _fast_lines(lines: list[bytes]) -> Optional[list]:
    if _orjson is None or (
        not _ORJSON_LIMITS_DEPTH and max(map(len, lines), default=0) > SHORT_LINE
    ):
        return None
    loads = _orjson.loads
    try:
        return [loads(raw) for raw in lines]
    except (ValueError, TypeError):
        return None


def _slow_lines(
    lines: list[bytes], start: int, terminated: bool, notes: Optional[list[str]]
) -> Iterator[tuple[list, list[int]]]:
    """Each non-blank line parsed alone (orjson first when installed, the standard library for what it
    refuses). The records before a bad line are yielded before its error is raised: whatever is wrong
    first, in file order, is what gets reported."""
    recs: list = []
    linenos: list[int] = []
    for k, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            recs.append(_load_line(raw))
        except (ValueError, RecursionError) as exc:
            if terminated or k + 1 < len(lines) or notes is None:
                if recs:
                    yield recs, linenos
                raise _bad_line(start + k, exc) from None
            notes.append(
                f" line {start + k} is incomplete (no newline yet, not valid JSON: the trainer is "
                "probably still writing it): left out"
            )
            continue
        linenos.append(start + k)
    yield recs, linenos


def _load_line(raw: bytes | str) -> Any:
    """One JSON text, as json.loads reads it: orjson when installed (and safe for it), the standard library
    for whatever orjson refuses (NaN tokens, a lone surrogate, a BOM on bytes, an error: it then raises)."""
    if _orjson is not None and (_ORJSON_LIMITS_DEPTH or len(raw) <= SHORT_LINE):
        try:
            return _orjson.loads(raw)
        except (ValueError, TypeError):
            pass
    return json.loads(raw)


loads_line = _load_line


def _bad_line(lineno: int, exc: Exception) -> LogProblem:
    if isinstance(exc, UnicodeDecodeError):
        return LogProblem(" is not UTF-8 text (a binary file?); expected JSON lines")
    msg = getattr(exc, "msg", None) or (
        "too deeply nested" if isinstance(exc, RecursionError) else " ".join(str(exc).split())[:80]
    )
    return LogProblem(f" line {lineno} is not valid JSON (truncated?): {msg}")


def line_blocks(fh: BinaryIO, first: bytes) -> Iterator[tuple[bytes, int, int, bool]]:
    """(lines joined by newlines - no final one -, the first line's number, the number of lines, the last one
    ended by a newline) of an open binary file, read BLOCK_BYTES at a time; only a file's unterminated last line
    comes with False."""
    pending = [first] if first else []
    lineno = 1
    while True:
        chunk = fh.read(BLOCK_BYTES)
        if not chunk:
            break
        cut = chunk.rfind(b"\n")
        if cut == -1:
            pending.append(chunk)  # a line longer than a block: joined once, when its end comes
            continue
        pending.append(chunk[:cut])
        block = b"".join(pending)
        pending = [chunk[cut + 1 :]]
        n = block.count(b"\n") + 1
        yield block, lineno, n, True
        lineno += n
    rest = b"".join(pending)
    cut = rest.rfind(b"\n")
    if cut != -1:
        n = rest.count(b"\n", 0, cut) + 1
        yield rest[:cut], lineno, n, True
        lineno += n
    if rest[cut + 1 :]:
        yield rest[cut + 1 :], lineno, 1, False
