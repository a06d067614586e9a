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
* ``jsonl_records`` yields one record per line from an open binary file (bounded memory).
"""

from __future__ import annotations

import json
import math
import re
from array import array
from pathlib import Path
from typing import Any, BinaryIO, Optional
from collections.abc import Iterable, Iterator

from checkpoint_strategy.errors import UsageError

KEY_SAMPLE = 2000
SLICE_RECORDS = 20000
SPLIT_KEYS = ("split", "phase", "mode", "stage")   # a column saying which rows are train and which validation
EVAL_SPLITS = ("val", "valid", "validation", "eval", "evaluation", "test", "dev")
EVAL_KEYS = ("eval_loss", "val_loss", "eval/loss", "val/loss", "validation_loss", "valid_loss", "val_loss_epoch",
             "validation/loss", "eval_loss_epoch")

_orjson: Any
try:  # optional: ~2-3x faster parsing of the big trainer_state.json (see pyproject's 'fast' extra)
    import orjson

    _orjson = orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


def _loads(data: bytes) -> Any:
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # NaN/Infinity tokens (HF writes them) or real errors: the standard library decides
    return json.loads(data)


# the columns a log's records are read from: step, loss, grad norm, learning rate, eval loss
Keys = tuple[str, str, Optional[str], Optional[str], Optional[str]]


class Collector:
    """Numeric columns of a stream of records (see the module docstring)."""

    def __init__(self, p: Path, columns, *, what: str = "entry", offset: int = 0,
                 known_keys: Optional[Iterable[str]] = None) -> None:
        self.p, self.columns, self.what, self.offset = p, columns, what, offset
        self.known_keys = list(known_keys) if known_keys is not None else None
        self.sample: list[tuple[int, dict]] = []
        self.keys: Optional[Keys] = None
        self.steps, self.loss, self.grad, self.lr = array("d"), array("d"), array("d"), array("d")
        self.eval_steps, self.eval_loss = array("d"), array("d")
        self.split_key: Optional[str] = None
        self.eval_from_split: Optional[str] = None
        self.count = 0
        self.objects = 0
        self._last_lr = math.nan

    def add(self, rec: Any) -> None:
        i = self.count
        self.count += 1
        if type(rec) is not dict:
            if self.what == "line":
                raise UsageError(f"log {self.p} line {i + self.offset} is not a JSON object; expected one record "
                                 "per line")
            return
        self.objects += 1
        if self.keys is None:
            self.sample.append((i, rec))
            if len(self.sample) >= KEY_SAMPLE:
                self._decide()
            return
        self._take(i, rec)

    def add_many(self, recs: list) -> None:
        """A batch of records: the same result as add() one by one, converted with numpy."""
        if self.keys is None or self.split_key is not None:
            k = 0
            while k < len(recs) and (self.keys is None or self.split_key is not None):
                self.add(recs[k])
                k += 1
            recs = recs[k:]
            if not recs:
                return
        if not all(type(r) is dict for r in recs):
            for r in recs:
                self.add(r)
            return
        import numpy as np

        first = self.count
        self.count += len(recs)
        self.objects += len(recs)
        assert self.keys is not None, "decided by the add() calls above"
        step_key, loss_key, grad_key, lr_key, eval_key = self.keys
        losses = [r.get(loss_key) for r in recs]
        at = [i for i, v in enumerate(losses) if v is not None]
        if eval_key is not None:
            self._add_eval_many(recs, first, step_key, eval_key)
        lr_all = self._lr_many(recs, first, lr_key) if lr_key is not None else None
        if not at:
            return
        self.loss.extend(self._floats([losses[i] for i in at], "loss", first, at))
        self.steps.extend(self._floats([recs[i].get(step_key) for i in at], "step", first, at, missing_ok=True))
        if grad_key is not None:
            self.grad.extend(self._floats([recs[i].get(grad_key) for i in at], "grad norm", first, at,
                                          missing_ok=True))
        if lr_all is not None:
            self.lr.extend(np.asarray(lr_all)[at] if len(at) != len(recs) else np.asarray(lr_all))

    def _add_eval_many(self, recs: list, first: int, step_key: str, eval_key: str) -> None:
        evs = [r.get(eval_key) for r in recs]
        ev_at = [i for i, v in enumerate(evs) if v is not None and recs[i].get(step_key) is not None]
        if ev_at:
            self.eval_steps.extend(self._floats([recs[i][step_key] for i in ev_at], "step", first, ev_at))
            self.eval_loss.extend(self._floats([evs[i] for i in ev_at], "eval loss", first, ev_at))

    def _lr_many(self, recs: list, first: int, lr_key: str):
        """The learning rate of every record of a batch, the last logged one carried over where a record has none."""
        import numpy as np

        lrs = [r.get(lr_key) for r in recs]
        have = [i for i, v in enumerate(lrs) if v is not None]
        if len(have) == len(recs):
            lr_all = self._floats(lrs, "learning rate", first, range(len(recs)))
        else:
            lr_all = np.full(len(recs), np.nan)
            if have:
                lr_all[have] = self._floats([lrs[i] for i in have], "learning rate", first, have)
            idx = np.where(~np.isnan(lr_all), np.arange(len(recs)), -1)
            np.maximum.accumulate(idx, out=idx)
            lr_all = np.where(idx >= 0, lr_all[np.maximum(idx, 0)], self._last_lr)
        if len(lr_all):
            self._last_lr = float(lr_all[-1])
        return lr_all

    def _floats(self, values: list, name: str, first: int, where, missing_ok: bool = False):
        import numpy as np

        if not any(type(v) is bool for v in values):  # numpy would read true/false as 1/0
            try:
                return np.fromiter(values, dtype=np.float64, count=len(values))
            except (TypeError, ValueError, OverflowError):
                pass
        where = list(where)
        out = np.empty(len(values), dtype=np.float64)
        for k, v in enumerate(values):
            out[k] = math.nan if (v is None and missing_ok) else self._num(v, name, first + where[k])
        return out

    def _decide(self) -> None:
        from checkpoint_strategy.recovery.logkeys import GRAD_KEYS, LOSS_KEYS, LR_KEYS, STEP_KEYS, _pick

        keys: dict[str, None] = dict.fromkeys(self.known_keys or ())
        for _, rec in self.sample:
            keys.update(dict.fromkeys(rec))
        if not keys:
            raise UsageError(f"log {self.p} holds no JSON objects; expected records with step and loss")
        c, p = self.columns, self.p
        loss_key = _pick(keys, c.loss, LOSS_KEYS, "loss", p, required=True)
        step_key = _pick(keys, c.step, STEP_KEYS, "step", p, required=True)
        grad_key = _pick(keys, c.grad_norm, GRAD_KEYS, "grad-norm", p, required=c.grad_norm is not None)
        lr_key = _pick(keys, c.lr, LR_KEYS, "learning-rate", p, required=c.lr is not None)
        assert loss_key is not None and step_key is not None, "required: _pick raises when they are missing"
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
            v, s = rec.get(loss_key), rec.get(step_key)   # a validation row of a "split" log: eval loss
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
        from checkpoint_strategy.recovery.logkeys import _show, _to_float

        num = _to_float(v)
        if num is None:
            if v is None and name == "step":
                return math.nan  # reported as "step ... is missing" by build_series
            label = f"{self.what} {i + self.offset}"
            raise UsageError(f"log {self.p}: {name} at {label} is {_show(v)}, not a number")
        return num

    def finish(self):
        import numpy as np

        if self.keys is None:
            if not self.count:
                raise UsageError(f"log {self.p} has no log entries (empty log_history or list)")
            if not self.objects:
                raise UsageError(f"log {self.p} holds no JSON objects; expected records with step and loss")
            self._decide()
        step_key, loss_key, grad_key, lr_key, _ = self.keys
        if not len(self.loss):
            raise UsageError(f"log {self.p} has no {loss_key!r} values; expected training loss entries")

        def arr(a):
            return np.frombuffer(a, dtype=np.float64) if len(a) else np.empty(0)  # shares the buffer

        grad = arr(self.grad) if grad_key is not None else None
        lr = arr(self.lr) if lr_key is not None else None
        return arr(self.steps), arr(self.loss), grad, lr, step_key, loss_key, grad_key, lr_key

    def eval_series(self):
        import numpy as np

        if not len(self.eval_loss):
            return None, None, None
        key = self.keys[4] or (f"{self.eval_from_split} ({self.split_key} = validation)" if self.eval_from_split
                               else "eval")
        return (np.frombuffer(self.eval_steps, dtype=np.float64).copy(),
                np.frombuffer(self.eval_loss, dtype=np.float64).copy(), key)


# --------------------------------------------------------------------------------------------
# JSON documents


_BOUNDARY = re.compile(rb"\}\s*,\s*(?=\{)")
_HISTORY = re.compile(rb'"log_history"\s*:\s*\[')


def json_document_batches(p: Path, data: bytes | bytearray, meta: dict) -> Iterator[list]:
    """Lists of log_history entries of a trainer_state.json, SLICE_RECORDS at a time; top-level
    fields other than log_history (best_model_checkpoint, ...) land in `meta`. Raises _SliceError
    when the document cannot be sliced safely (the caller then parses it whole)."""
    fast = _history_slices(data, meta)
    if fast is None:
        raise _SliceError()
    yield from fast


def _parse_whole(p: Path, data: bytes | bytearray) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise UsageError(f"log {p} is JSON nested too deeply to be a training log") from None
    except UnicodeDecodeError:
        raise UsageError(f"log {p} is not UTF-8 text (a binary file?); expected JSON, JSON lines or CSV") from None
    except json.JSONDecodeError as exc:
        raise _JSONError(exc) from None
    except ValueError as exc:  # e.g. a 5000-digit integer
        raise UsageError(f"log {p} is not valid JSON: {' '.join(str(exc).split())[:100]}") from None


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
        rest = json.loads(data[:start - 1] + b"[]" + data[end_arr + 1:])
    except (ValueError, RecursionError):
        return None
    if not isinstance(rest, dict) or rest.get("log_history") != []:
        return None
    meta.update({k: v for k, v in rest.items() if k != "log_history"})
    meta["_format"] = "hf"
    return _slices(data, cuts)


def _slices(data: bytes | bytearray, cuts: list[int]) -> Iterator[Any]:
    for a, b in zip(cuts, cuts[1:], strict=False):
        chunk = data[a:b].rstrip()
        if chunk.endswith(b","):
            chunk = chunk[:-1]
        try:
            part = _loads(b"[" + chunk + b"]")
        except (ValueError, RecursionError):
            raise _SliceError() from None
        if not isinstance(part, list):
            raise _SliceError()
        yield part


class _SliceError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# JSON lines


def jsonl_records(p: Path, fh: BinaryIO, first: bytes = b"", notes: Optional[list[str]] = None) -> Iterator[Any]:
    """One record per non-blank line of an open binary file (a UTF-8 BOM on the first line is fine).

    With `notes`: a last line without its newline that does not parse (the trainer is still writing
    it) is left out and a note appended; a bad line anywhere else is a UsageError."""
    lineno = 0
    for raw, terminated in _lines(fh, first):
        lineno += 1
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        try:
            yield json.loads(raw)
        except (ValueError, RecursionError) as exc:
            if terminated or notes is None:
                raise _bad_line(p, lineno, exc) from None
            notes.append(f"log {p} line {lineno} is incomplete (no newline yet, not valid JSON: the trainer is "
                         "probably still writing it): left out")


def _bad_line(p: Path, lineno: int, exc: Exception) -> UsageError:
    if isinstance(exc, UnicodeDecodeError):
        return UsageError(f"log {p} is not UTF-8 text (a binary file?); expected JSON lines")
    msg = getattr(exc, "msg", None) or ("too deeply nested" if isinstance(exc, RecursionError) else
                                         " ".join(str(exc).split())[:80])
    return UsageError(f"log {p} line {lineno} is not valid JSON (truncated?): {msg}")


def _lines(fh: BinaryIO, first: bytes) -> Iterable[tuple[bytes, bool]]:
    """(line, ended by a newline) of an open binary file, read 1 MB at a time."""
    buf = first
    while True:
        parts = buf.split(b"\n")
        buf = parts.pop()
        for part in parts:
            yield part, True
        chunk = fh.read(1 << 20)
        if not chunk:
            break
        buf += chunk
    if buf:
        yield buf, False
