"""Adapter: `recover`'s online detector (recovery/online.py), as the callbacks use it.

This is the only place the callbacks touch detection. ``recovery.online.OnlineDetector`` applies
the rules of `recover` one logged value at a time (same rolling baseline, same onsets); this
adapter turns its state changes into emergency-save decisions:

* a new ``spike`` (loss) or ``grad_norm`` event -> one save when its trigger
  (``loss_spike_detected`` / ``gradient_norm_exceeded``) is in emergency_save_on;
* ``nonfinite`` (NaN/inf loss) -> never a save, and no save later in that event;
* ``recovered`` -> the event is over; the next event may save again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery.online import OnlineDetector as _Online

LOSS_TRIGGER = "loss_spike_detected"
GRAD_TRIGGER = "gradient_norm_exceeded"
_KIND = {"spike": LOSS_TRIGGER, "grad_norm": GRAD_TRIGGER}


@dataclass
class Flag:
    """A detector event: kind is loss_spike_detected, gradient_norm_exceeded or nonfinite."""

    kind: str
    step: int
    value: float
    median: Optional[float]
    rules: list[str] = field(default_factory=list)
    save: bool = False  # the caller should make an emergency save now
    new_event: bool = False


class OnlineDetector:
    """``update(step, loss, grad_norm=None) -> Flag | None``; see the module docstring."""

    def __init__(self, triggers=(LOSS_TRIGGER, GRAD_TRIGGER), **options) -> None:
        self.triggers = tuple(triggers)
        self._det = _Online(**options)
        self.event_saved = False
        self.event_nonfinite = False
        self.event_open = False
        self.events = 0

    def update(self, step: int, loss: float, grad_norm: Optional[float] = None) -> Optional[Flag]:
        try:
            ev = self._det.update(step, loss, grad_norm)
        except UsageError:
            return None  # a repeated step (e.g. two logs at one step): nothing new to judge
        if ev is None:
            return None
        ref = ev.reference if ev.reference is not None and math.isfinite(ev.reference) else None
        if ev.kind == "recovered":
            self.event_open = self.event_saved = self.event_nonfinite = False
            return None
        if ev.kind == "nonfinite":
            new = not self.event_open
            self.event_open, self.event_nonfinite = True, True
            self.events += new
            return Flag("nonfinite", step, float(loss), ref, list(ev.rules), False, new)
        kind = _KIND.get(ev.kind)
        if kind is None:  # divergence, level_shift, collapse: no new save
            return None
        new = not self.event_open
        if new:
            self.event_open, self.event_saved, self.event_nonfinite = True, False, False
            self.events += 1
        value = float(grad_norm) if kind == GRAD_TRIGGER and grad_norm is not None else float(loss)
        flag = Flag(kind, step, value, ref, list(ev.rules), False, new)
        if kind in self.triggers and not self.event_saved and not self.event_nonfinite:
            flag.save = True
            self.event_saved = True
        return flag

    @property
    def unresolved(self) -> bool:
        return self.event_open
