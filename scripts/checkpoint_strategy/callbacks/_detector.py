"""Adapter: `recover`'s spike rules (recovery/detect.py), fed one logged value at a time.

This is the only place the callbacks touch detection. The batch detector's baseline only changes
at block boundaries (a value's median/scale/max come from the previous ``window // block`` whole
blocks of ``window // 8`` values), so the online baseline is updated once per block, in plain
Python (numpy's nanmedian costs milliseconds per call), and each step costs a few float
comparisons (about 15 us for loss + grad norm). The flag expressions, the onset walk-back, the
pre-spike baseline and the recovery test mirror ``detect.find_events`` line by line, with the
thresholds, rule names and ``recovery_level`` taken from detect.py; tests/test_callbacks_detector.py
checks that the baseline equals ``detect.rolling_stats`` and that the online and batch detectors
flag the same values and events on random series. When recovery/ gains its own online detector,
switch this module to it.

An *event* runs from its first flagged value until every series that flagged in it is back near
its pre-spike level (``detect.recovery_level`` and the five-value median, as ``recover`` does).
One event gives at most one emergency save, and none once the loss has been NaN/inf in it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from checkpoint_strategy.recovery import detect

LOSS_TRIGGER = "loss_spike_detected"
GRAD_TRIGGER = "gradient_norm_exceeded"


@dataclass
class Flag:
    """A flagged value: kind is loss_spike_detected, gradient_norm_exceeded or nonfinite."""

    kind: str
    step: int
    value: float
    median: Optional[float]
    rules: list[str] = field(default_factory=list)
    save: bool = False           # the caller should make an emergency save now
    new_event: bool = False


class _Series:
    def __init__(self, grad: bool, window: int, z: float, ratio: float, max_ratio: float, min_rise: float,
                 tolerance: float) -> None:
        self.grad = grad
        self.window, self.z, self.ratio, self.max_ratio, self.min_rise, self.tol = \
            window, z, ratio, max_ratio, min_rise, tolerance
        self.b = max(2, window // 8)
        self.k = max(2, window // self.b)
        self.blocks: deque[tuple[float, float, float]] = deque(maxlen=self.k)   # (median, MAD, max) per block
        self.seen_nonfinite = False
        self.block: list[float] = []
        self.stats = (math.nan, math.nan, math.nan)   # median, scale, window max for the current block
        self.last_finite: Optional[float] = None
        self.recent: deque[float] = deque(maxlen=window + detect.BASELINE_POINTS + 2)  # xv before this value
        self.tail_inf: deque[float] = deque(maxlen=detect.SMOOTH_POINTS)
        self.level: Optional[float] = None    # recovery level while this series is in an event
        self.in_event = False

    def _close_block(self) -> None:
        """detect.rolling_stats for the next block, in plain Python: the block's median, MAD and max,
        then the median of the last k block medians, 1.4826 x the median of their MADs (floored at
        1e-4 x |median|), and the max of their maxima; NaN until two blocks are complete."""
        self.blocks.append(self._block_stats(self.block))
        self.block = []
        self._update_stats()

    @staticmethod
    def _block_stats(block: list[float]) -> tuple[float, float, float]:
        if any(v != v for v in block):            # leading values before the first finite one
            return (math.nan, math.nan, math.nan)
        med = statistics.median(block)
        return (med, statistics.median([abs(v - med) for v in block]), max(block))

    def _update_stats(self) -> None:
        stats = [b for b in self.blocks if b[0] == b[0]]
        if len(self.blocks) < 2 or not stats:
            self.stats = (math.nan, math.nan, math.nan)
            return
        med = statistics.median([b[0] for b in stats])
        scale = max(1.4826 * statistics.median([b[1] for b in stats]), 1e-4 * abs(med) + 1e-12)
        self.stats = (med, scale, max(b[2] for b in stats))

    def _backfill(self, x: float) -> None:
        """rolling_stats fills values before the first finite one with it: redo those blocks."""
        self.block = [x if v != v else v for v in self.block]
        if any(b[0] != b[0] for b in self.blocks):
            # every value of a NaN block was before the first finite one: the block is all x
            self.blocks = deque(((x, 0.0, x) if b[0] != b[0] else b for b in self.blocks), maxlen=self.k)
            self._update_stats()

    def add(self, x: float) -> tuple[list[str], bool]:
        """Feed one value; returns (rules that flagged it, nonfinite)."""
        finite = math.isfinite(x)
        med, scale, wmax = self.stats
        have = math.isfinite(med)
        rules: list[str] = []
        nonfinite = False
        if self.grad:
            if have and finite and med > 0 and (x - med) / scale >= self.z and x >= self.ratio * med:
                rules.append(detect.RULE_GRAD)
        elif not finite:
            nonfinite = True
            rules.append(detect.RULE_NONFINITE)
        elif have:
            z = (x - med) / scale
            if z >= self.z and (x - med) >= self.min_rise * abs(med):
                rules.append(detect.RULE_Z)
            if med > 0 and x >= self.ratio * med and z >= 3.0:
                rules.append(detect.RULE_RATIO)
            if wmax > 0 and x >= self.max_ratio * wmax:
                rules.append(detect.RULE_MAX)
        if finite:
            if self.last_finite is None and self.seen_nonfinite:
                self._backfill(x)
            self.last_finite = x
        else:
            self.seen_nonfinite = True
        xs = x if finite else (self.last_finite if self.last_finite is not None else math.nan)
        xv = xs if self.grad else x          # find_events: grad series ffilled, loss series raw
        x_inf = xv if math.isfinite(xv) else math.inf
        self.tail_inf.append(x_inf)
        if self.in_event:                    # _first_recovery: value and 5-value median back under the level
            if self.level is not None and len(self.tail_inf) == detect.SMOOTH_POINTS and x_inf <= self.level \
                    and statistics.median(self.tail_inf) <= self.level:
                self.in_event = False
                self.level = None
        elif rules:
            self._start_event(med, scale)
        self.recent.append(xv)
        self._push(xs)
        return rules, nonfinite

    def _push(self, xs: float) -> None:
        self.block.append(xs)
        if len(self.block) == self.b:
            self._close_block()

    def _start_event(self, med: float, scale: float) -> None:
        """find_events: baseline m0/s0, onset walk-back, pre-spike level, recovery level."""
        m0, s0 = med, scale
        hist = list(self.recent)
        if not math.isfinite(m0):
            prior = [v for v in hist[-detect.BASELINE_POINTS:] if math.isfinite(v)]
            m0 = statistics.median(prior) if prior else math.nan
            s0 = 1.4826 * statistics.median([abs(v - m0) for v in prior]) if len(prior) >= 3 else 0.0
        onset = len(hist)
        if math.isfinite(m0):
            back = m0 + max(3.0 * s0, 0.5 * self.min_rise * abs(m0))
            lo = max(0, len(hist) - self.window)
            while onset - 1 >= lo and math.isfinite(hist[onset - 1]) and hist[onset - 1] > back:
                onset -= 1
        pre = [v for v in hist[max(0, onset - detect.BASELINE_POINTS):onset] if math.isfinite(v)]
        if len(pre) >= 3:
            base: Optional[float] = statistics.median(pre)
        elif math.isfinite(m0):
            base = m0
        else:
            base = None
        self.level = detect.recovery_level(base, s0, self.tol) if base is not None else None
        self.in_event = True


class OnlineDetector:
    """``update(step, loss, grad_norm=None) -> Flag | None``, the rules of `recover`, one value at a time.

    ``triggers``: the policy's emergency_save_on. A flag's ``save`` is True on the first flagged
    value of a new event whose kind is a trigger (never for NaN/inf loss, never twice per event).
    """

    def __init__(self, triggers=(LOSS_TRIGGER, GRAD_TRIGGER), *, window: int = detect.DEFAULT_WINDOW,
                 z_threshold: float = detect.DEFAULT_Z, ratio_threshold: float = detect.DEFAULT_RATIO,
                 max_ratio: float = detect.DEFAULT_MAX_RATIO, min_rise: float = detect.DEFAULT_MIN_RISE,
                 tolerance: float = detect.DEFAULT_TOLERANCE) -> None:
        kw = dict(window=window, z=z_threshold, ratio=ratio_threshold, max_ratio=max_ratio, min_rise=min_rise,
                  tolerance=tolerance)
        self.triggers = tuple(triggers)
        self.loss = _Series(False, **kw)
        self.grad = _Series(True, **kw)
        self.event_open = False
        self.event_saved = False
        self.event_nonfinite = False
        self.events = 0

    def update(self, step: int, loss: float, grad_norm: Optional[float] = None) -> Optional[Flag]:
        loss_rules, nonfinite = self.loss.add(float(loss))
        grad_rules: list[str] = []
        if grad_norm is not None:
            grad_rules, _ = self.grad.add(float(grad_norm))
        if self.event_open and not (self.loss.in_event or self.grad.in_event):
            self.event_open = False
        if not loss_rules and not grad_rules:
            return None
        new = not self.event_open
        if new:
            self.event_open, self.event_saved, self.event_nonfinite = True, False, False
            self.events += 1
        if nonfinite:
            self.event_nonfinite = True
            return Flag("nonfinite", step, float(loss), _fin(self.loss.stats[0]), loss_rules, False, new)
        if loss_rules:
            flag = Flag(LOSS_TRIGGER, step, float(loss), _fin(self.loss.stats[0]), loss_rules, False, new)
        else:
            flag = Flag(GRAD_TRIGGER, step, float(grad_norm), _fin(self.grad.stats[0]), grad_rules, False, new)
        if flag.kind in self.triggers and not self.event_saved and not self.event_nonfinite:
            flag.save = True
            self.event_saved = True
        return flag

    @property
    def unresolved(self) -> bool:
        return self.event_open


def _fin(v: float) -> Optional[float]:
    return v if math.isfinite(v) else None
