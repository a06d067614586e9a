"""The column names a training log's records are matched against (step, loss, grad norm, LR) and the
value helpers both log readers use: `logs.py` (the formats) and `records.py` (the record collector).
A leaf below both, so neither imports the other's internals: no import cycle."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from checkpoint_strategy.errors import UsageError

STEP_KEYS = (
    "step",
    "global_step",
    "train/global_step",
    "trainer/global_step",
    "_step",
    "current_steps",
    "iteration",
    "iter",
    "it",
)
LOSS_KEYS = (
    "loss",
    "train/loss",
    "train_loss",
    "training_loss",
    "train/train_loss",
    "lm loss",
    "lm_loss",
    "train/lm_loss",
    "train/loss_step",
    "train_loss_step",
    "loss_step",
    "train/lm loss",
)
GRAD_KEYS = (
    "grad_norm",
    "train/grad_norm",
    "grad-norm",
    "gradient_norm",
    "train/gradient_norm",
    "grad_norm/total",
    "train/grad-norm",
)
LR_KEYS = (
    "learning_rate",
    "train/learning_rate",
    "lr",
    "learning-rate",
    "train/lr",
    "lr-AdamW",
    "lr-Adam",
    "lr-SGD",
    "train/learning-rate",
)


class LogProblem(UsageError):
    """What is wrong with the log being read, worded without its name: `detail` is what follows "log NAME"
    (" line 3 is not valid JSON ...", ": loss at entry 2 is ..."). The readers below `logs.read_log` (records.py,
    _pick) never hold the log's path; read_log, which does, words the error (`named`)."""

    def __init__(self, detail: str) -> None:
        super().__init__("log" + detail)
        self.detail = detail

    def named(self, log: object) -> UsageError:
        return UsageError(f"log {log}{self.detail}")


def _pick(
    available: Iterable[str],
    wanted: Optional[str],
    candidates: Sequence[str],
    what: str,
    required: bool,
) -> Optional[str]:
    names = list(available)
    if wanted is not None:
        if wanted in names:
            return wanted
        if required:
            raise LogProblem(f" has no {what} column {wanted!r}; columns: {_preview(names)}")
        return None
    lower = {n.lower(): n for n in names}
    for cand in candidates:
        if cand.lower() in lower:
            return lower[cand.lower()]
    if required:
        hint = "--step-column" if what == "step" else "--loss-column"
        raise LogProblem(
            f" has no {what} column (looked for {', '.join(candidates[:4])}, ...); "
            f"columns: {_preview(names)}; name it with {hint}"
        )
    return None


def _preview(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:limit])
    more = len(names) - limit
    return (shown + f" and {more} more") if more > 0 else (shown or "none")


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
