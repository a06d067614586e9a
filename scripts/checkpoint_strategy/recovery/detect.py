"""Loss-spike detection against a robust rolling baseline.

The baseline at a logged value is the median of the previous ``window`` logged values and its
noise scale is 1.4826 x their median absolute deviation (MAD). Both are computed on blocks of
``window // 8`` values (the median of the block medians, the median of the block MADs), which is
vectorised with numpy and takes about 0.1 s for a million values. The blocks make the baseline lag
by at most one block, and a spike that covers less than half of the window cannot move it.

A logged loss ``x`` with rolling median ``m``, robust scale ``s`` and window maximum ``M`` is a
spike when any of these holds (defaults in brackets):

* ``(x - m) / s >= z_threshold`` [7] and ``x - m >= min_rise * |m|`` [5 %]. OLMo 2 counts a value
  7 standard deviations from a rolling average of the last 1000 values as a spike; llm.c's
  ``outlier_detector.h`` computes the same z-score over a sliding window of 128 values (its
  `-sl`/`-sg` flags skip updates above a z threshold). We use the median and MAD instead of mean
  and standard deviation so the spike itself does not inflate the baseline, and 128 values by
  default (llm.c's window) because a 1000-value window lags too far behind a falling loss early
  in training. The 5 % floor stops a near-constant loss (MAD ~ 0) from flagging rounding noise.
* ``x >= ratio_threshold * m`` [2.5] (with ``z >= 3``): the sibling training-stability-monitor
  skill's rule, 2.5 x the rolling median.
* ``x >= max_ratio * M`` [10]: Megatron-LM's ``check_for_spiky_loss`` (rerun state machine,
  ``is_unexpectedly_large(threshold=10)``: more than 10 x the largest value seen).
* ``x`` is NaN or +-inf: critical at once.

Grad norm (when logged) uses the same baseline and needs both the z and the ratio rule
(``z >= z_threshold`` and ``g >= ratio_threshold * median``): grad norms are heavier-tailed than
the loss, and a NaN/inf grad norm alone is not an event (fp16 loss scaling skips such steps).

An event starts at the first flagged value, walked back over the contiguous values already above
``m + 3 s``, and ends at the first value that is back near the pre-spike level (see
``recovery_level``) while the median of the last 5 values is too.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

DEFAULT_WINDOW = 128
DEFAULT_Z = 7.0
DEFAULT_RATIO = 2.5
DEFAULT_MAX_RATIO = 10.0
DEFAULT_MIN_RISE = 0.05
DEFAULT_TOLERANCE = 0.10
BASELINE_POINTS = 20
SMOOTH_POINTS = 5

RULE_Z = "z>=7 over rolling median/MAD (OLMo 2 7-sigma; llm.c z-score)"
RULE_RATIO = "loss >= 2.5x rolling median (training-stability-monitor)"
RULE_MAX = "loss >= 10x window max (Megatron-LM spiky loss)"
RULE_NONFINITE = "loss is NaN/inf (critical)"
RULE_GRAD = "grad norm z>=7 and >= 2.5x rolling median"


@dataclass
class Event:
    """A detected event, by index into the timeline arrays."""

    kind: str
    onset: int
    peak: int
    end: Optional[int]            # index of the recovery point, None if never
    baseline: Optional[float]     # pre-spike level (median of the values before onset)
    median: float                 # rolling median at detection
    scale: float                  # rolling robust scale at detection
    z_peak: Optional[float]
    rules: list[str] = field(default_factory=list)
    precursor: Optional[int] = None


def _ffill(x: np.ndarray) -> np.ndarray:
    """Replace NaN/inf with the previous finite value (leading ones with the first finite)."""
    ok = np.isfinite(x)
    if ok.all():
        return x
    if not ok.any():
        return np.full_like(x, np.nan)
    idx = np.where(ok, np.arange(len(x)), 0)
    np.maximum.accumulate(idx, out=idx)
    first = int(np.argmax(ok))
    idx[:first] = first
    return x[idx]


def rolling_stats(x: np.ndarray, window: int = DEFAULT_WINDOW):
    """Per value: (median, robust scale, max) of the preceding ~window values; NaN before 2 blocks."""
    n = len(x)
    xf = _ffill(np.asarray(x, dtype=np.float64))
    b = max(2, window // 8)
    k = max(2, window // b)
    nan = np.full(n, np.nan)
    if n == 0 or not np.isfinite(xf).any():
        return nan, nan.copy(), nan.copy()
    nb = -(-n // b)
    xp = np.concatenate((xf, np.repeat(xf[-1], nb * b - n))) if nb * b > n else xf
    blocks = xp.reshape(nb, b)
    bmed = np.median(blocks, axis=1)
    bmad = np.median(np.abs(blocks - bmed[:, None]), axis=1)
    bmax = blocks.max(axis=1)
    med_b = np.full(nb, np.nan)
    mad_b = np.full(nb, np.nan)
    max_b = np.full(nb, np.nan)
    if nb > 2:
        from numpy.lib.stride_tricks import sliding_window_view

        def win(a):
            padded = np.concatenate((np.full(k, np.nan), a))
            return sliding_window_view(padded, k)[:nb]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med_b[2:] = np.nanmedian(win(bmed)[2:], axis=1)
            mad_b[2:] = np.nanmedian(win(bmad)[2:], axis=1)
            max_b[2:] = np.nanmax(win(bmax)[2:], axis=1)
    block_of = np.arange(n) // b
    med = med_b[block_of]
    scale = 1.4826 * mad_b[block_of]
    scale = np.maximum(scale, 1e-4 * np.abs(med) + 1e-12)
    return med, scale, max_b[block_of]


def _first_recovery(x_inf: np.ndarray, start: int, level: float) -> Optional[int]:
    """First j >= start with x[j] <= level and median(x[j-4..j]) <= level (chunked, vectorised)."""
    n = len(x_inf)
    chunk = 4096
    from numpy.lib.stride_tricks import sliding_window_view

    j = start
    while j < n:
        hi = min(n, j + chunk)
        lo = max(0, j - SMOOTH_POINTS + 1)
        seg = x_inf[lo:hi]
        if len(seg) >= SMOOTH_POINTS:
            sm = np.median(sliding_window_view(seg, SMOOTH_POINTS), axis=1)
            sm = np.concatenate((np.full(SMOOTH_POINTS - 1, np.inf), sm))
        else:
            sm = np.full(len(seg), np.inf)
        off = j - lo
        ok = (seg[off:] <= level) & (sm[off:] <= level)
        hits = np.flatnonzero(ok)
        if len(hits):
            return j + int(hits[0])
        j = hi
    return None


def recovery_level(baseline: float, scale: float, tolerance: float = DEFAULT_TOLERANCE) -> float:
    """Back near baseline: within tolerance (10 %) of the pre-spike level, or 3 noise scales."""
    s = scale if math.isfinite(scale) else 0.0
    return baseline + max(tolerance * abs(baseline), 3.0 * s)


def find_events(x: np.ndarray, *, window: int = DEFAULT_WINDOW, z_threshold: float = DEFAULT_Z,  # noqa: C901 - complexity debt, see issue 10
                ratio_threshold: float = DEFAULT_RATIO, max_ratio: float = DEFAULT_MAX_RATIO,
                min_rise: float = DEFAULT_MIN_RISE, tolerance: float = DEFAULT_TOLERANCE,
                grad: bool = False) -> list[Event]:
    """Events in one series (loss, or grad norm with ``grad=True``), oldest first."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n == 0:
        return []
    med, scale, wmax = rolling_stats(x, window)
    finite = np.isfinite(x)
    have = np.isfinite(med)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        z = (x - med) / scale
        if grad:
            flag = have & finite & (z >= z_threshold) & (x >= ratio_threshold * med) & (med > 0)
            rule_a = flag
            rule_b = rule_c = np.zeros(n, dtype=bool)
            nonfinite = np.zeros(n, dtype=bool)
        else:
            rule_a = have & finite & (z >= z_threshold) & ((x - med) >= min_rise * np.abs(med))
            rule_b = have & finite & (med > 0) & (x >= ratio_threshold * med) & (z >= 3.0)
            rule_c = have & finite & (wmax > 0) & (x >= max_ratio * wmax)
            nonfinite = ~finite
            flag = rule_a | rule_b | rule_c | nonfinite
    if grad:
        xv = _ffill(x)
        x_inf = np.where(np.isfinite(xv), xv, np.inf)
    else:
        xv = x
        x_inf = np.where(finite, x, np.inf)
    cand = np.flatnonzero(flag)
    events: list[Event] = []
    pos = 0
    while True:
        k = int(np.searchsorted(cand, pos))
        if k >= len(cand):
            break
        i = int(cand[k])
        m0, s0 = float(med[i]), float(scale[i])
        if not math.isfinite(m0):  # no rolling history yet: use what came before
            prior = xv[max(0, i - BASELINE_POINTS):i]
            prior = prior[np.isfinite(prior)]
            m0 = float(np.median(prior)) if len(prior) else math.nan
            s0 = float(1.4826 * np.median(np.abs(prior - m0))) if len(prior) >= 3 else 0.0
        onset = i
        if math.isfinite(m0):
            back = m0 + max(3.0 * s0, 0.5 * min_rise * abs(m0))
            lo = max(0, i - window)
            while onset - 1 >= lo and math.isfinite(xv[onset - 1]) and xv[onset - 1] > back:
                onset -= 1
        pre = xv[max(0, onset - BASELINE_POINTS):onset]
        pre = pre[np.isfinite(pre)]
        if len(pre) >= 3:
            base = float(np.median(pre))
        elif math.isfinite(m0):
            base = m0
        else:
            base = None
        if base is not None:
            level = recovery_level(base, s0, tolerance)
            end = _first_recovery(x_inf, i + 1, level)
        else:
            end = None
        stop = end if end is not None else n
        span = x_inf[onset:max(stop, i + 1)]
        peak = onset + int(np.argmax(span))
        pv = xv[peak]
        zp = float((pv - m0) / s0) if (math.isfinite(pv) and math.isfinite(m0) and s0 > 0) else None
        rules = []
        for j in {i, peak}:
            if grad:
                if rule_a[j]:
                    rules.append(RULE_GRAD)
                continue
            if nonfinite[j]:
                rules.append(RULE_NONFINITE)
            if rule_a[j]:
                rules.append(RULE_Z)
            if rule_b[j]:
                rules.append(RULE_RATIO)
            if rule_c[j]:
                rules.append(RULE_MAX)
        order = [RULE_NONFINITE, RULE_Z, RULE_RATIO, RULE_MAX, RULE_GRAD]
        rules = [r for r in order if r in rules]
        kind = "grad_norm" if grad else ("loss" if np.isfinite(x[onset:max(stop, i + 1)]).all() else "nonfinite")
        events.append(Event(kind=kind, onset=onset, peak=peak, end=end, baseline=base, median=m0, scale=s0,
                            z_peak=zp, rules=rules))
        if end is None:
            break
        pos = end + 1
    return events
