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
``m + 3 s``, and ends at the first value that is back near the healthy level (see
``recovery_level``) while the median of the last 5 values is too.

The healthy reference does not drift with the damage: it is a low quantile (20 %) of the block
medians over a long window (8 x ``window`` values) before the onset, capped by the median of the 20
values before the onset, and it is frozen at the onset of the first event that has not come back.
A slow climb before a late detection therefore cannot raise the level a run must return to, and
"recovered" always means back within ``tolerance`` of the level before the trouble began (the spec's
``spike_value * 1.1`` playbook rule, read as the healthy level before the spike).

Kinds (``analyse``):

* ``spike``: flagged, and back near the healthy level (or still inside the wait window);
* ``divergence``: flagged and not back within the wait window (or only partly back);
* ``level_shift``: no single spike, but the block medians stay above the healthy level plus
  ``max(tolerance, 4 noise units)`` for at least ``max(wait_steps, 4 blocks)`` (a step change to a
  higher plateau, or a slow climb after an LR restart);
* ``nonfinite``: NaN/inf loss; ``collapse``: the loss pinned at one value for >= 8 logged values
  after a blow-up or an abrupt jump (including exactly 0.0);
* ``grad_norm``: a grad-norm spike without a loss event.

Steps, not log entries, measure waits: a log written every N steps gets the same wait window.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from checkpoint_strategy.recovery.settings import RecoveryOptions, rule_labels

DEFAULT_WINDOW = 128
DEFAULT_Z = 7.0
DEFAULT_RATIO = 2.5
DEFAULT_MAX_RATIO = 10.0
DEFAULT_MIN_RISE = 0.05
DEFAULT_TOLERANCE = 0.10
BASELINE_POINTS = 20
SMOOTH_POINTS = 5

REFERENCE_BLOCKS = 64  # long window of the healthy reference, in blocks (8 x window values)
REFERENCE_QUANTILE = 20.0  # percent: a low quantile of the block medians, not the minimum
SHIFT_NOISE_UNITS = 4.0  # a level shift's block medians stand this many noise units above
SHIFT_MIN_BLOCKS = 4  # ... for at least this many blocks (and the wait window)
COLLAPSE_POINTS = 8  # identical logged values that make a collapse
COLLAPSE_RELATIVE = 1e-5  # "identical": within this fraction of each other


@dataclass
class Event:
    """A detected event, by index into the timeline arrays."""

    kind: str
    onset: int
    peak: int
    end: Optional[int]  # index of the recovery point, None if never
    baseline: Optional[float]  # pre-spike level (median of the values before onset)
    median: float  # rolling median at detection
    scale: float  # rolling robust scale at detection
    z_peak: Optional[float]
    rules: list[str] = field(default_factory=list)
    precursor: Optional[int] = None
    # the healthy level it must come back to (frozen at the onset)
    reference: Optional[float] = None
    detected: Optional[int] = None  # index of the first flagged value
    detail: str = ""


def _all_finite(x: np.ndarray) -> bool:
    """np.isfinite(x).all() without a mask of the whole series (a chunk at a time, stopping at the first miss)."""
    step = max(1, min(FLAG_VALUES, STATS_VALUES))
    return all(np.isfinite(x[lo : lo + step]).all() for lo in range(0, len(x), step))


def _ffill(x: np.ndarray) -> np.ndarray:
    """Replace NaN/inf with the previous finite value (leading ones with the first finite)."""
    if _all_finite(x):
        return x
    ok = np.isfinite(x)
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
    st = _rolling_blocks(x, window)
    if st is None:
        nan = np.full(n, np.nan)
        return nan, nan.copy(), nan.copy()
    med_b, scale_b, max_b, b = st
    return np.repeat(med_b, b)[:n], np.repeat(scale_b, b)[:n], np.repeat(max_b, b)[:n]


def _rolling_blocks(x: np.ndarray, window: int, shared: Optional[SharedBlocks] = None):
    """rolling_stats per block of b values (every value of a block has its block's figures): (median, robust
    scale, max, b), or None when there is no finite value. n/b floats each, not n. `shared`: x's block medians
    when the caller has them."""
    n = len(x)
    xf = _ffill(np.asarray(x, dtype=np.float64))
    b = max(2, window // 8)
    k = max(2, window // b)
    if n == 0 or not math.isfinite(xf[0]):  # _ffill leaves no NaN/inf unless every value is one
        return None
    nb = -(-n // b)
    stats = list(
        _block_stats(
            xf, nb, b, medians=shared.bmed if shared is not None and shared.b == b else None
        )
    )
    rolled = []
    # median, MAD, max; each block's own freed
    for reduce in (_row_nanmedian, _row_nanmedian, _row_nanmax):
        out = np.full(nb, np.nan)
        if nb > 2:
            from numpy.lib.stride_tricks import sliding_window_view

            padded = np.concatenate((np.full(k, np.nan), stats.pop(0)))
            out[2:] = _by_rows(reduce, sliding_window_view(padded, k)[:nb][2:])
            del padded
        else:
            stats.pop(0)
        rolled.append(out)
    med_b, scale_b, max_b = rolled
    scale_b *= 1.4826  # the MAD's robust scale, in place
    # the floor: a part in 10^4 of the level, and the log's own rounding step (a loss near 0.0002 logged
    # with 4 decimals moves by 50% in one rounding step; that is not a spike)
    floor = np.abs(med_b)
    floor *= 1e-4
    floor += 1e-12
    np.maximum(floor, _quantum(xf), out=floor)
    np.maximum(scale_b, floor, out=scale_b)
    return med_b, scale_b, max_b, b


def _by_rows(reduce, rows: np.ndarray) -> np.ndarray:
    """reduce(rows) (one figure a row: _row_nanmedian, _row_nanmax; all-NaN rows give NaN quietly), STATS_VALUES
    values at a time: a sliding window's rows overlap, and a copy of them is k times the memory of the series."""
    out = np.empty(len(rows))
    step = max(1, STATS_VALUES // max(1, rows.shape[1]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for lo in range(0, len(rows), step):
            out[lo : lo + step] = reduce(rows[lo : lo + step])
    return out


def _row_nanmax(rows: np.ndarray) -> np.ndarray:
    return np.nanmax(rows, axis=1)


def _row_median(rows: np.ndarray) -> np.ndarray:
    """np.median(rows, axis=1), bit for bit (the middle value, or the sum of the middle two halved; NaN for a row
    holding NaN), from one sort of the rows: several times faster than median's partition on short rows."""
    k = rows.shape[1]
    srt = np.sort(rows, axis=1)
    # a sum from +0.0
    med = 0.0 + srt[:, k // 2] if k % 2 else (0.0 + srt[:, k // 2 - 1] + srt[:, k // 2]) / 2
    med[np.isnan(srt[:, -1])] = np.nan
    return med


def _row_nanmedian(rows: np.ndarray) -> np.ndarray:
    """np.nanmedian(rows, axis=1), bit for bit: rows without NaN from one sort (nanmedian halves the sum of the
    low and high middle values, the same one twice for an odd count), the rest by nanmedian itself."""
    k = rows.shape[1]
    srt = np.sort(rows, axis=1)
    lo, hi = (k // 2, k // 2) if k % 2 else (k // 2 - 1, k // 2)
    med = (0.0 + srt[:, lo] + srt[:, hi]) / 2  # a sum from +0.0, as median's: -0.0 comes out +0.0
    nan = np.flatnonzero(np.isnan(srt[:, -1]))  # sort puts NaN last
    if len(nan):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med[nan] = np.nanmedian(rows[nan], axis=1)
    return med


def _per_value(a_b: np.ndarray, b: int, lo: int, hi: int) -> np.ndarray:
    """Values lo..hi-1 of np.repeat(a_b, b) without building the whole repeat."""
    return np.repeat(a_b[lo // b : (hi - 1) // b + 1], b)[lo % b : lo % b + (hi - lo)]


# Chunks of 8192 values (64 KB of float64): a chunk's temporaries stay under glibc's 128 KB mmap threshold, so they
# come from the heap and are reused chunk after chunk. At 65536 values (512 KB) each was a fresh mapping whose
# pages faulted in every chunk: 421 mappings, ~217 MB of page faults on a 1M-value log (the analysis 0.36 s
# instead of 0.24 s in a fresh process), and a peak RSS 2.7 MB higher.
# blocks whose medians are taken at a time (bounded temporaries: np.median copies them)
STATS_ROWS = 1 << 9
STATS_VALUES = 1 << 13  # values of a sliding window partitioned at a time


def _block_stats(
    xf: np.ndarray,
    nb: int,
    b: int,
    medians: Optional[np.ndarray] = None,
    only_medians: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per block of b values of xf (nb blocks; a last partial block padded with the last value): median, median
    absolute deviation from it, maximum; STATS_ROWS rows at a time (no padded copy of the series). `medians`: the
    blocks' medians, already known (returned as they are); only_medians: the other two are left empty."""
    bmed = np.empty(nb) if medians is None else medians
    bmad, bmax = np.empty(0 if only_medians else nb), np.empty(0 if only_medians else nb)
    full = min(nb, len(xf) // b)
    for lo in range(0, nb, STATS_ROWS):
        hi = min(nb, lo + STATS_ROWS)
        if hi <= full:
            part = xf[lo * b : hi * b].reshape(hi - lo, b)
        else:
            tail = xf[lo * b :]
            part = np.concatenate((tail, np.repeat(tail[-1], (hi - lo) * b - len(tail)))).reshape(
                hi - lo, b
            )
        if medians is None:
            med = bmed[lo:hi] = _row_median(part)
            if only_medians:
                continue
        else:
            med = medians[lo:hi]
        dev = part - med[:, None]
        np.abs(dev, out=dev)
        bmad[lo:hi] = _row_median(dev)
        bmax[lo:hi] = part.max(axis=1)
    return bmed, bmad, bmax


class SharedBlocks:
    """The block figures of one series that the analysis' passes over it share - the reference, the rolling
    figures and the level shifts take the same block medians, the level shifts the reference's healthy level -
    computed once (the medians read-only: a pass that wrote to them would raise). The deviations and maxima
    are not held: each pass takes them from the medians (a sort less each), and they are not alive in between."""

    def __init__(self, xf: np.ndarray, b: int) -> None:
        self.b = b
        # the last block padded
        self.bmed = _block_stats(xf, -(-len(xf) // b), b, only_medians=True)[0]
        self.bmed.flags.writeable = False
        self.ref_b: Optional[np.ndarray] = None  # reference_blocks' per block, once it ran


def shared_blocks(x: np.ndarray, window: int) -> Optional[SharedBlocks]:
    """SharedBlocks of a loss series for `analyse` (None when it has no finite value)."""
    xf = _ffill(np.asarray(x, dtype=np.float64))
    if len(xf) == 0 or not math.isfinite(xf[0]):
        return None
    return SharedBlocks(xf, block_size(window))


def _first_recovery(
    x_inf: np.ndarray, start: int, level: float, smooth_level: Optional[float] = None
) -> Optional[int]:
    """First j >= start with x[j] <= level and median(x[j-4..j]) <= smooth_level (default: level; chunked,
    vectorised)."""
    smooth_level = level if smooth_level is None else smooth_level
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
        ok = (seg[off:] <= level) & (sm[off:] <= smooth_level)
        hits = np.flatnonzero(ok)
        if len(hits):
            return j + int(hits[0])
        j = hi
    return None


def recovery_level(baseline: float, scale: float, tolerance: float = DEFAULT_TOLERANCE) -> float:
    """Back near baseline: within tolerance (10 %) of the pre-spike level, or 3 noise scales."""
    s = scale if math.isfinite(scale) else 0.0
    return baseline + max(tolerance * abs(baseline), 3.0 * s)


def _sliding(a: np.ndarray, k: int, fill: float) -> np.ndarray:
    """Row j = a[j-k .. j-1] (the k values before j), padded with `fill`."""
    from numpy.lib.stride_tricks import sliding_window_view

    padded = np.concatenate((np.full(k, fill), a))
    return sliding_window_view(padded, k)[: len(a)]


def effective_window(n: int, window: int) -> int:
    """A short log (fewer than 4 windows of values) gets a window of a quarter of its length (at
    least 16 values), so that a 50-entry log still has a rolling baseline and level shifts."""
    return window if n >= 4 * window else max(16, min(window, n // 4))


START_STEPS = 100  # a log that starts at or before this step shows the loss of the untrained model


def _never_trained(
    x: np.ndarray, steps: np.ndarray, events: list[Event], o, labels: dict
) -> Optional[Event]:
    """A run that ends above the loss it started from (the untrained model's) has diverged, even when
    no rule fired because the rolling baseline sat inside the bad stretch from the start."""
    n = len(x)
    if (
        n < 4 * SMOOTH_POINTS
        or steps[0] > START_STEPS
        or any(e.end is None and e.kind != "grad_norm" for e in events)
    ):
        return None
    tail = x[-max(SMOOTH_POINTS, n // 10) :]
    s0 = _start_level(x, o.max_ratio)
    if s0 is None or not np.isfinite(tail).all():
        return None
    now = float(np.median(tail))
    spread = 1.4826 * float(np.median(np.abs(tail - now)))
    if not (now > s0 + max(o.tolerance * abs(s0), 3 * spread / math.sqrt(len(tail)))):
        return None
    # over the medians of 5 (NaN/inf as +inf): the least after the first, and the last one not above the start
    lowest, last_low = math.inf, -1
    for at, sm in _smooth_chunks(x, nonfinite=np.inf):
        rest = sm[1:] if at == 0 else sm
        if len(rest):
            lowest = min(lowest, float(rest.min()))
        low = np.flatnonzero(~(sm > s0))
        if len(low):
            last_low = at + int(low[-1])
    if lowest < s0:
        return None  # it did get below where it started: the other rules judge it
    onset = last_low + SMOOTH_POINTS - 1 + 1 if last_low >= 0 else 1
    onset = min(max(onset, 1), n - 1)
    onset = max(
        1,
        int(np.flatnonzero(x[: onset + 1] > s0 * (1 + o.tolerance))[0])
        if (x[: onset + 1] > s0 * (1 + o.tolerance)).any()
        else onset,
    )
    peak = onset + int(np.argmax(np.where(np.isfinite(x[onset:]), x[onset:], -np.inf)))
    return Event(
        kind="divergence",
        onset=onset,
        peak=peak,
        end=None,
        baseline=s0,
        median=now,
        scale=spread,
        z_peak=None,
        rules=[labels["start"]],
        reference=s0,
        detected=n - 1,
        detail=f"never back below the starting loss {s0:.4g}: {now:.4g} now",
    )


def _start_level(x: np.ndarray, max_ratio: float) -> Optional[float]:
    """The level a run started from, for the never-trained rule: the median of its first SMOOTH_POINTS values
    (the level it held), not its first value alone: a fine-tune's first logged loss can be its lowest (one easy
    batch), and a run that then trains at a higher level for thousands of steps has not diverged. The first
    value alone only when the loss blew up from it at once (the next value max_ratio x it, Megatron's rule):
    then there is no held level after it to take."""
    head = x[:SMOOTH_POINTS]
    if not math.isfinite(x[0]) or not np.isfinite(head).all():
        return None
    x0 = float(x[0])
    if len(x) > 1 and x0 > 0 and float(x[1]) >= max_ratio * x0:
        return x0
    return float(np.median(head))


def _smooth_chunks(x: np.ndarray, nonfinite: Optional[float] = None):
    """(index of the first window, the medians of SMOOTH_POINTS values of each window starting there), STATS_VALUES
    windows at a time (a sliding window's median copies k values a window); NaN/inf as `nonfinite` when given."""
    from numpy.lib.stride_tricks import sliding_window_view

    count = len(x) - SMOOTH_POINTS + 1
    step = max(1, STATS_VALUES)
    for at in range(0, count, step):
        part = x[at : min(count, at + step) + SMOOTH_POINTS - 1]
        if nonfinite is not None:
            part = np.where(np.isfinite(part), part, nonfinite)
        yield at, np.median(sliding_window_view(part, SMOOTH_POINTS), axis=1)


def block_size(window: int) -> int:
    return max(2, window // 8)


def low_quantile(values) -> float:
    """The healthy reference of a set of block medians: the REFERENCE_QUANTILE-th lowest (no interpolation)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return math.nan
    idx = int(REFERENCE_QUANTILE / 100.0 * (len(v) - 1))
    return float(np.partition(v, idx)[idx])


def _low_quantile_before(bmed: np.ndarray, k: int) -> np.ndarray:
    """Row j: low_quantile of bmed[j-k .. j-1] (fewer at the start), vectorised for full rows."""
    nb = len(bmed)
    out = np.full(nb, np.nan)
    for j in range(1, min(k, nb)):
        out[j] = low_quantile(bmed[:j])
    if nb > k:
        from numpy.lib.stride_tricks import sliding_window_view

        win = sliding_window_view(bmed, k)[: nb - k]  # row j-k holds bmed[j-k .. j-1]
        idx = int(REFERENCE_QUANTILE / 100.0 * (k - 1))
        # the values the rows cover (np.isfinite(win) would be k x nb bytes)
        if _all_finite(bmed[: nb - 1]):
            # the partition copies its rows: STATS_VALUES values at a time
            rows = max(1, STATS_VALUES // k)
            for lo in range(0, nb - k, rows):
                out[k + lo : k + lo + rows] = np.partition(win[lo : lo + rows], idx, axis=1)[:, idx]
        else:
            out[k:] = [low_quantile(row) for row in win]
    return out


def healthy_reference(x: np.ndarray, window: int = DEFAULT_WINDOW) -> np.ndarray:
    """Per value: the healthy level before it, a low quantile (20 %) of the block medians of the
    REFERENCE_BLOCKS blocks before its own (NaN until two blocks are logged). Never follows a
    divergence up while the long window still holds the healthy stretch."""
    return reference_blocks(x, window).values()


class Blocked:
    """A per-value array whose values come in blocks of b equal ones, held per block: a[i] is values[i // b]."""

    def __init__(self, per_block: np.ndarray, b: int, n: int) -> None:
        self.per_block, self.b, self.n = per_block, b, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return float(self.per_block[i // self.b])

    def values(self) -> np.ndarray:
        return np.repeat(self.per_block, self.b)[: self.n]


def reference_blocks(
    x: np.ndarray, window: int = DEFAULT_WINDOW, shared: Optional[SharedBlocks] = None
) -> Blocked:
    """healthy_reference, held per block (n/b floats). `shared`: x's block statistics (its full blocks' medians
    are taken from there; the reference is left there for level_shifts)."""
    n = len(x)
    xf = _ffill(np.asarray(x, dtype=np.float64))
    if n == 0 or not math.isfinite(xf[0]):  # _ffill leaves no NaN/inf unless every value is one
        return Blocked(np.full(n, np.nan), 1, n)
    b = block_size(window)
    nb = -(-n // b)
    full = n // b
    if shared is not None and shared.b == b and full == nb:
        bmed = shared.bmed  # read only here
    elif shared is not None and shared.b == b:
        bmed = np.empty(nb)
        bmed[:full] = shared.bmed[:full]
    else:
        bmed = np.empty(nb)
        for lo in range(0, full, STATS_ROWS):  # bounded temporaries, as _block_stats
            hi = min(full, lo + STATS_ROWS)
            bmed[lo:hi] = _row_median(xf[lo * b : hi * b].reshape(hi - lo, b))
    # the last, partial block is not a block median yet (alone: padded with its last value)
    if n % b:
        tail = xf[full * b :]
        bmed[-1] = (
            np.median(tail)
            if nb >= 2
            else np.median(np.concatenate((tail, np.repeat(tail[-1], b - len(tail)))))
        )
    ref_b = _low_quantile_before(bmed, REFERENCE_BLOCKS)
    ref_b[:2] = np.nan
    if shared is not None and shared.b == b:
        # row j covers blocks before j only: the same rows as level_shifts' full blocks
        shared.ref_b = ref_b
    return Blocked(ref_b, b, n)


def find_events(
    x: np.ndarray,
    *,
    window: int = DEFAULT_WINDOW,
    z_threshold: float = DEFAULT_Z,
    ratio_threshold: float = DEFAULT_RATIO,
    max_ratio: float = DEFAULT_MAX_RATIO,
    min_rise: float = DEFAULT_MIN_RISE,
    tolerance: float = DEFAULT_TOLERANCE,
    grad: bool = False,
    reference: Optional[np.ndarray | Blocked] = None,
    labels: Optional[dict] = None,
    shared: Optional[SharedBlocks] = None,
) -> list[Event]:
    """Flagged events in one series (loss, or grad norm with ``grad=True``), oldest first (`shared`: x's block
    statistics, when the caller has them).

    kind is "loss", "nonfinite" or "grad_norm" here; ``analyse`` names spikes, divergences, level
    shifts and collapses. An event that does not come back ends the search (what follows is part of
    the same bad stretch)."""
    if labels is None:
        labels = rule_labels(
            RecoveryOptions(
                window=window,
                z_threshold=z_threshold,
                ratio_threshold=ratio_threshold,
                max_ratio=max_ratio,
                min_rise=min_rise,
                tolerance=tolerance,
            )
        )
    x = np.asarray(x, dtype=np.float64)
    if len(x) == 0:
        return []
    rules = dict(
        z_threshold=z_threshold,
        ratio_threshold=ratio_threshold,
        max_ratio=max_ratio,
        min_rise=min_rise,
        grad=grad,
    )
    sc = _scan_of(x, _series_blocks(x, window, shared), rules, reference, labels)
    return _walk_events(sc, min_rise=min_rise, window=window, tolerance=tolerance)


def _series_blocks(x: np.ndarray, window: int, shared: Optional[SharedBlocks]) -> tuple:
    """`_rolling_blocks` of x, or all-NaN blocks when x has no finite value."""
    st = _rolling_blocks(x, window, shared)
    if st is None:
        b = max(2, window // 8)
        nan = np.full(-(-len(x) // b), np.nan)
        st = (nan, nan, nan, b)
    return st


def _scan_of(
    x: np.ndarray, st: tuple, rules: dict, reference: Optional[np.ndarray | Blocked], labels: dict
) -> _Scan:
    """x prepared for the event search from its block statistics `st` and the spike `rules` (grad: a grad norm,
    no reference)."""
    grad = rules["grad"]
    med_b, scale_b, max_b, b = st
    flags = _Flags(x, st, rules)
    xv = _ffill(x) if grad else x
    # shared when all finite
    x_inf = xv if _all_finite(xv) else np.where(np.isfinite(xv), xv, np.inf)
    return _Scan(
        x=x,
        xv=xv,
        x_inf=x_inf,
        med=med_b,
        scale=scale_b,
        b=b,
        flags=flags,
        reference=reference if not grad else None,
        grad=grad,
        labels=labels,
    )


def _walk_events(sc: _Scan, *, min_rise: float, window: int, tolerance: float) -> list[Event]:
    """The events from the first flagged value on, each search starting after the previous event came back;
    one that does not come back ends it."""
    cand = sc.flags.flagged()
    events: list[Event] = []
    pos = 0
    while True:
        k = int(np.searchsorted(cand, pos))
        if k >= len(cand):
            break
        ev = _event_at(
            sc, int(cand[k]), min_rise=min_rise, window=window, tolerance=tolerance, floor=pos
        )
        events.append(ev)
        if ev.end is None:
            break
        pos = ev.end + 1
    return events


@dataclass
class _Scan:
    """One series prepared for the event search."""

    x: np.ndarray  # as logged
    xv: np.ndarray  # a grad norm's NaN/inf forward-filled (it is not an event on its own)
    x_inf: np.ndarray  # xv with NaN/inf as +inf: never back, always the peak
    med: np.ndarray  # rolling median, scale: per block of b values (value i: [i // b])
    scale: np.ndarray
    b: int
    flags: _Flags  # the spike rules of any value
    reference: Optional[np.ndarray | Blocked]  # the healthy reference (loss only)
    grad: bool
    labels: dict


def _event_at(
    sc: _Scan, i: int, *, min_rise: float, window: int, tolerance: float, floor: int = 0
) -> Event:
    """The event flagged first at value i: its onset (walked back, never below `floor`: the previous
    event ended at floor - 1), healthy level, recovery point and peak."""
    n = len(sc.x)
    xv = sc.xv
    m0, s0 = float(sc.med[i // sc.b]), float(sc.scale[i // sc.b])
    if not math.isfinite(m0):  # no rolling history yet: use what came before
        prior = xv[max(0, i - BASELINE_POINTS) : i]
        prior = prior[np.isfinite(prior)]
        m0 = float(np.median(prior)) if len(prior) else math.nan
        s0 = float(1.4826 * np.median(np.abs(prior - m0))) if len(prior) >= 3 else 0.0
    r_i = float(sc.reference[i]) if sc.reference is not None else math.nan
    onset = walk_back(xv, i, m0, s0, min_rise, window, cap=_walk_cap(r_i, m0, s0, tolerance))
    onset = max(onset, floor)  # never back into the previous event
    pre = xv[max(0, onset - BASELINE_POINTS) : onset]
    pre = pre[np.isfinite(pre)]
    base = float(np.median(pre)) if len(pre) >= 3 else (m0 if math.isfinite(m0) else None)
    ref = base
    if base is not None and sc.reference is not None:
        r = float(sc.reference[onset]) if onset < n else math.nan
        if math.isfinite(r) and r < base:
            ref = r
    end = _recovery_of(sc, i, onset, ref, s0, pre, tolerance)
    stop = end if end is not None else n
    span = sc.x_inf[onset : max(stop, i + 1)]
    peak = onset + int(np.argmax(span))
    pv = xv[peak]
    zp = float((pv - m0) / s0) if (math.isfinite(pv) and math.isfinite(m0) and s0 > 0) else None
    rules = _rules({i, peak}, sc.flags, sc.labels, sc.grad)
    kind = (
        "grad_norm"
        if sc.grad
        else ("loss" if np.isfinite(sc.x[onset : max(stop, i + 1)]).all() else "nonfinite")
    )
    return Event(
        kind=kind,
        onset=onset,
        peak=peak,
        end=end,
        baseline=base,
        median=m0,
        scale=s0,
        z_peak=zp,
        rules=rules,
        reference=ref,
        detected=i,
    )


def _recovery_of(
    sc: _Scan,
    i: int,
    onset: int,
    ref: Optional[float],
    s0: float,
    pre: np.ndarray,
    tolerance: float,
) -> Optional[int]:
    """Where the event flagged at i is back near the healthy level `ref` (None: never). A NaN/inf is back only
    when the loss is within the healthy band: the noise allowance is the healthy stretch's own (the values before
    the onset), not the rolling scale at the NaN, which a noisy or climbing stretch before it inflates, and the
    median of SMOOTH_POINTS values must be within the band a median of that many values has (a loss still 2x
    its healthy level is not back because single values dip into the noise)."""
    if ref is None:
        return None
    if sc.grad or np.isfinite(sc.x[onset : i + 1]).all():
        return _first_recovery(sc.x_inf, i + 1, recovery_level(ref, s0, tolerance))
    s_pre = 1.4826 * float(np.median(np.abs(pre - np.median(pre)))) if len(pre) >= 3 else s0
    s_h = min(s0, s_pre) if math.isfinite(s0) else s_pre
    smooth = ref + max(tolerance * abs(ref), 3.0 * 1.2533 * s_h / math.sqrt(SMOOTH_POINTS))
    return _first_recovery(
        sc.x_inf, i + 1, recovery_level(ref, s_h, tolerance), smooth_level=smooth
    )


def _walk_cap(r_i: float, m0: float, s0: float, tolerance: float) -> Optional[float]:
    """walk_back's cap when the rolling median m0 is above the healthy level r_i: the healthy level + 20 %, or +
    3 noise units when the rolling median is still near the healthy level (its scale is the healthy noise: a
    noisy loss is not walked back over); a rolling median lifted by a blow-up has the blow-up's scale, not used."""
    if not (math.isfinite(r_i) and 0 < r_i < m0):
        return None
    cap = r_i * (1 + 2 * tolerance)
    if m0 <= cap and math.isfinite(s0):
        cap = max(cap, r_i + 3.0 * s0)
    return cap


def spike_flags(
    x,
    med,
    scale,
    wmax,
    *,
    z_threshold: float,
    ratio_threshold: float,
    max_ratio: float,
    min_rise: float,
    grad: bool = False,
):
    """The four spike rules on arrays or scalars (the batch and the online detector share them):
    (z rule, ratio rule, Megatron max rule, non-finite)."""
    x = np.asarray(x, dtype=np.float64)
    med = np.asarray(med, dtype=np.float64)
    finite = np.isfinite(x)
    have = np.isfinite(med)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        z = (x - med) / scale
        if grad:
            a = have & finite & (z >= z_threshold) & (x >= ratio_threshold * med) & (med > 0)
            zero = np.zeros_like(a)
            return a, zero, zero, zero
        a = have & finite & (z >= z_threshold) & ((x - med) >= min_rise * np.abs(med))
        b = have & finite & (med > 0) & (x >= ratio_threshold * med) & (z >= 3.0)
        c = have & finite & (np.asarray(wmax) > 0) & (x >= max_ratio * np.asarray(wmax))
    return a, b, c, ~finite


def _ieee_div(a: float, b: float) -> float:
    """a / b as numpy's float64 division gives it (inf or nan for a zero divisor, never ZeroDivisionError)."""
    if b != 0.0:
        return a / b
    if a == 0.0 or a != a:
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def spike_flags_one(
    x: float,
    med: float,
    scale: float,
    wmax: float,
    *,
    z_threshold: float,
    ratio_threshold: float,
    max_ratio: float,
    min_rise: float,
    grad: bool = False,
) -> tuple[bool, bool, bool, bool]:
    """spike_flags for one value, in float arithmetic (the online detector's every step: about 1 us instead of
    about 20 us through numpy); the same IEEE-754 double results, tested against spike_flags value by value."""
    finite = math.isfinite(x)
    ok = finite and math.isfinite(med)
    z = _ieee_div(x - med, scale) if ok else math.nan
    if grad:
        return (
            ok and z >= z_threshold and x >= ratio_threshold * med and med > 0,
            False,
            False,
            False,
        )
    a = ok and z >= z_threshold and (x - med) >= min_rise * abs(med)
    b = ok and med > 0 and x >= ratio_threshold * med and z >= 3.0
    c = finite and math.isfinite(med) and wmax > 0 and x >= max_ratio * wmax
    return a, b, c, not finite


FLAG_VALUES = 1 << 13  # values whose spike rules are computed at a time (at most STATS_VALUES)


class _Flags:
    """The spike rules (spike_flags) of one series from its per-block statistics (`stats`: _rolling_blocks),
    never held for every value: flagged() computes them FLAG_VALUES (or STATS_VALUES, the fewer) at a time and
    keeps the indices where any rule fires; at(j) computes one value's (the same elementwise arithmetic)."""

    def __init__(self, x: np.ndarray, stats: tuple, rules: dict) -> None:
        self.x, self.stats, self.rules = x, stats, rules

    def _rows(self, lo: int, hi: int) -> tuple:
        med_b, scale_b, max_b, b = self.stats
        return spike_flags(
            self.x[lo:hi],
            _per_value(med_b, b, lo, hi),
            _per_value(scale_b, b, lo, hi),
            _per_value(max_b, b, lo, hi),
            **self.rules,
        )

    def flagged(self) -> np.ndarray:
        n = len(self.x)
        step = max(1, min(FLAG_VALUES, STATS_VALUES))
        parts = [np.empty(0, dtype=np.int64)]
        for lo in range(0, n, step):
            a, b, c, nf = self._rows(lo, min(n, lo + step))
            a |= b
            a |= c
            a |= nf
            parts.append(np.flatnonzero(a) + lo)
        return np.concatenate(parts)

    def at(self, j: int) -> tuple[bool, bool, bool, bool]:
        a, b, c, nf = self._rows(j, j + 1)
        return bool(a[0]), bool(b[0]), bool(c[0]), bool(nf[0])


def walk_back(
    xv: np.ndarray,
    i: int,
    m0: float,
    s0: float,
    min_rise: float,
    window: int,
    cap: Optional[float] = None,
) -> int:
    """The onset: back from the first flagged value over the contiguous values already high (above
    the rolling median + 3 noise units, or above the healthy level + 2 x tolerance when the rolling
    median is already inside a blow-up)."""
    onset = i
    if math.isfinite(m0):
        back = m0 + max(3.0 * s0, 0.5 * min_rise * abs(m0))
        if cap is not None:
            back = min(back, cap)
        lo = max(0, i - window)
        while onset - 1 >= lo and math.isfinite(xv[onset - 1]) and xv[onset - 1] > back:
            onset -= 1
    return onset


def _rules(at, flags: _Flags, labels: dict, grad: bool) -> list[str]:
    found = []
    for j in at:
        a, b, c, nf = flags.at(j)
        if grad:
            if a:
                found.append(labels["grad"])
            continue
        for flag, key in ((nf, "nonfinite"), (a, "z"), (b, "ratio"), (c, "max")):
            if flag:
                found.append(labels[key])
    order = [labels[k] for k in ("nonfinite", "z", "ratio", "max", "grad")]
    return [r for r in order if r in found]


# --------------------------------------------------------------------------------------------
# Level shifts, collapses, LR restarts


def level_shifts(
    x: np.ndarray,
    steps: np.ndarray,
    *,
    window: int,
    tolerance: float,
    wait_steps: int,
    skip: list[tuple[int, int]],
    labels: dict,
    shared: Optional[SharedBlocks] = None,
) -> list[Event]:
    """Sustained rises with no single spike: runs of block medians above the healthy level."""
    n = len(x)
    b = max(3, block_size(window))
    nb = n // b
    if nb < SHIFT_MIN_BLOCKS + 2:
        return []
    xf = _ffill(np.asarray(x, dtype=np.float64))
    if not math.isfinite(xf[0]):  # _ffill leaves no NaN/inf unless every value is one
        return []
    bmed, ref_b, noise_b, above = _shift_blocks(xf, nb, b, window, tolerance, skip, shared)
    bstart = np.arange(nb) * b
    out: list[Event] = []
    after = 0  # the first value after the previous shift came back: the next one starts later
    for j, j2, r0, thr0 in _runs_above(bmed, ref_b, noise_b, above, nb, tolerance):
        first, last = int(bstart[j]), min(n - 1, int(bstart[j2]) + b - 1)
        long_enough = (j2 - j + 1) >= SHIFT_MIN_BLOCKS and steps[last] - steps[first] >= wait_steps
        if not long_enough:
            continue
        s_raw = float(noise_b[j]) * math.sqrt(b) / 1.2533
        end = int(bstart[j2 + 1]) if j2 + 1 < nb else None
        onset = _shift_onset(xf, first, b, thr0, r0, s_raw, tolerance, window, skip, after)
        peak = onset + int(np.argmax(xf[onset : (end if end is not None else n)]))
        climbing = _climbing(bmed, j, j2, r0, float(noise_b[j]))
        kind = "divergence" if (climbing and end is None) else "level_shift"
        out.append(
            Event(
                kind=kind,
                onset=onset,
                peak=peak,
                end=end,
                baseline=r0,
                median=float(bmed[j]),
                scale=s_raw,
                z_peak=None,
                rules=[labels["level"]],
                reference=r0,
                detected=last,
                detail="slow climb, no single spike" if climbing else "plateau, no single spike",
            )
        )
        if end is None:
            break
        after = end + 1
    return out


def _runs_above(
    bmed: np.ndarray,
    ref_b: np.ndarray,
    noise_b: np.ndarray,
    above: np.ndarray,
    nb: int,
    tolerance: float,
) -> list[tuple[int, int, float, float]]:
    """The runs of block medians above the healthy level, oldest first: (first block, last block, the healthy
    level at the first, the threshold every block of the run is above)."""
    runs: list[tuple[int, int, float, float]] = []
    j = 0
    while j < nb:
        if not above[j]:
            j += 1
            continue
        j2 = j
        r0 = float(ref_b[j])
        thr0 = r0 + max(tolerance * abs(r0), SHIFT_NOISE_UNITS * float(noise_b[j]))
        while j2 + 1 < nb and bmed[j2 + 1] > thr0:
            j2 += 1
        runs.append((j, j2, r0, thr0))
        j = j2 + 1
    return runs


def _shift_onset(
    xf: np.ndarray,
    first: int,
    b: int,
    thr0: float,
    r0: float,
    s_raw: float,
    tolerance: float,
    window: int,
    skip: list[tuple[int, int]],
    after: int,
) -> int:
    """Where a shift whose run starts at value `first` began: the first value of the rise whose smoothed loss is
    above the threshold, walked back to where the loss left the healthy level (not into an earlier event, nor
    before `after`)."""
    onset = first
    seg = xf[max(0, first - b) : first + b]
    sm = np.array([np.median(seg[max(0, t - SMOOTH_POINTS + 1) : t + 1]) for t in range(len(seg))])
    hits = np.flatnonzero(sm > thr0)
    if len(hits):
        onset = max(0, first - b) + int(hits[0])
    floor = max([after] + [hi + 1 for lo_, hi in skip if hi <= onset])
    return max(
        climb_start(
            xf, onset, healthy_top(r0, xf, onset, s_raw, tolerance), window, floor, trend=True
        ),
        after,
    )


def _climbing(bmed: np.ndarray, j: int, j2: int, r0: float, noise: float) -> bool:
    """Whether the run of blocks j..j2 still climbs: its last third's median well above its first third's."""
    third = max(1, (j2 - j + 1) // 3)
    lo_m, hi_m = (
        float(np.median(bmed[j : j + third])),
        float(np.median(bmed[j2 + 1 - third : j2 + 1])),
    )
    return hi_m - lo_m > max(0.5 * (lo_m - r0), 2 * noise)


def healthy_top(ref: float, xf: np.ndarray, onset: int, scale: float, tolerance: float) -> float:
    """The top of the healthy band for climb_start: the level before the onset (the median of the values from
    BASELINE_POINTS to SMOOTH_POINTS before it: not the last few, where a climb is; never below the reference, a
    low quantile) + half the tolerance or 3 noise units (the smaller of `scale` and the step noise there: each
    is inflated by something the other is not). A value above that, next to the trouble, is part of it."""
    pre = xf[max(0, onset - BASELINE_POINTS) : max(0, onset - SMOOTH_POINTS)]
    pre = pre[np.isfinite(pre)]
    level = max(ref, float(np.median(pre))) if len(pre) else ref
    s = min(scale if math.isfinite(scale) else math.inf, step_noise(pre)) if len(pre) >= 3 else 0.0
    return level + max(0.5 * tolerance * abs(ref), 3.0 * (s if math.isfinite(s) else 0.0))


def step_noise(values: np.ndarray) -> float:
    """The noise of a stretch of logged values from one value to the next (1.4826 x the median absolute
    difference / sqrt 2): a trend (a run still falling) does not count as noise, as it does in the MAD."""
    v = values[np.isfinite(values)]
    if len(v) < 3:
        return 0.0
    return 1.4826 * float(np.median(np.abs(np.diff(v)))) / math.sqrt(2)


def climb_start(
    xf: np.ndarray, onset: int, top: float, window: int, floor: int = 0, trend: bool = False
) -> int:
    """Where a rise first detected at `onset` left the healthy band (values at or below `top`): back over the
    contiguous logged values above it (each with its two neighbours' median; at most `window`), never into a stretch whose median of SMOOTH_POINTS is
    higher than at the onset (a run's early fall). A slow climb or a plateau crosses the detection threshold
    late; the trouble began where the loss left the band, and the resume point must be before that. Never back
    to or before `floor` - 1 (the previous event's recovery point)."""
    lo = max(0, floor, onset - window)
    if lo >= onset:
        return onset
    seg = xf[max(0, lo - SMOOTH_POINTS + 1) : onset + 1]
    sm = np.array([np.median(seg[max(0, t - SMOOTH_POINTS + 1) : t + 1]) for t in range(len(seg))])[
        -(onset - lo + 1) :
    ]
    j = len(sm) - 1
    while j > 0 and _centred3(xf, lo + j - 1) > top and sm[j - 1] <= sm[-1]:
        j -= 1
    return trend_start(xf, lo + j, lo) if trend else lo + j


# the healthy band over the trough before a rise: this many step-noise units (TREND_NOISE_UNITS) or this share
# of the tolerance (TREND_TOLERANCE), the larger
TREND_NOISE_UNITS = 1.0
TREND_TOLERANCE = 0.5
# a rise that steps up by more than this many step-noise units at its onset is abrupt
TREND_STEP_UNITS = 3.0


def trend_start(xf: np.ndarray, onset: int, lo: int, tolerance: float = DEFAULT_TOLERANCE) -> int:
    """Where a rise that starts inside the noise left the healthy band (a slow climb or plateau whose threshold
    crossing comes late): the band is the trough of the smoothed curve before the onset (the lowest median of a
    value and its two neighbours from `lo`: the healthy level just before the trouble, not the noise a
    threshold is set in) + the larger of TREND_NOISE_UNITS step-noise units (from the trough on) and
    TREND_TOLERANCE x the tolerance; the walk goes back from the onset over the values above it, each alone and
    with its neighbours (a low value ends it). Not for an abrupt step (more than TREND_STEP_UNITS noise units
    from one value to the next at the onset or in the two values after it): there the values before it are
    the healthy noise."""
    if onset - lo < 2:
        return onset
    c3 = np.array([_centred3(xf, k) for k in range(lo, onset)])
    if not np.isfinite(c3).any():
        return onset
    t = lo + int(np.flatnonzero(c3 == np.nanmin(c3))[-1])  # the last trough
    level = float(c3[t - lo])
    noise = step_noise(xf[t : onset + 1])
    top = level + max(TREND_NOISE_UNITS * noise, TREND_TOLERANCE * tolerance * abs(level))
    if not np.max(np.diff(xf[onset - 1 : onset + 3])) <= TREND_STEP_UNITS * noise:
        return onset  # an abrupt step at or just after the onset: the values before it are the healthy noise
    k = onset
    while k - 1 > t and xf[k - 1] > top and _centred3(xf, k - 1) > top:
        k -= 1
    return k


def _centred3(xf: np.ndarray, k: int) -> float:
    """The median of value k and its two neighbours (the ones that exist): one noisy value does not end a climb
    or start one."""
    v = xf[max(0, k - 1) : k + 2]
    v = v[np.isfinite(v)]
    return float(np.median(v)) if len(v) else math.inf


def _shift_blocks(
    xf: np.ndarray,
    nb: int,
    b: int,
    window: int,
    tolerance: float,
    skip: list[tuple[int, int]],
    shared: Optional[SharedBlocks] = None,
):
    """Per block of b values: (median, healthy reference, noise of a block median, above the reference by more
    than the tolerance or SHIFT_NOISE_UNITS noise units; never inside a spike's bad stretch in `skip`). `shared`:
    the full blocks' figures come from there when its block size is b and its reference is there."""
    known = shared if shared is not None and shared.b == b and shared.ref_b is not None else None
    bmed, bmad, _bmax = _block_stats(
        xf[: nb * b], nb, b, medians=None if known is None else known.bmed[:nb]
    )
    del _bmax
    if known is not None and known.ref_b is not None:
        ref_b = known.ref_b[:nb].copy()
    else:
        ref_b = _low_quantile_before(bmed, REFERENCE_BLOCKS)
    kk = max(2, window // b)
    noise_b = _by_rows(_row_nanmedian, _sliding(bmad, kk, np.nan))
    del bmad
    noise_b *= 1.4826  # in place, in the order of `x * 1.4826 * 1.2533 / sqrt(b)`: the same bits
    noise_b *= 1.2533
    noise_b /= math.sqrt(b)
    ref_b[:2] = np.nan
    # bmed > ref_b + max(tolerance |ref_b|, SHIFT_NOISE_UNITS noise), in place
    with np.errstate(invalid="ignore"):
        thr = np.abs(ref_b)
        thr *= tolerance
        np.maximum(thr, SHIFT_NOISE_UNITS * noise_b, out=thr)
        thr += ref_b
        above = bmed > thr
        del thr
    # a run does not start inside a spike's bad stretch (it belongs to that event)
    for lo, hi in skip:
        # blocks j with j*b + b > lo and j*b < hi
        above[max(0, (lo - b) // b + 1) : max(0, -(-hi // b))] = False
    return bmed, ref_b, noise_b, above


def _in(spans: list[tuple[int, int]], i: int) -> bool:
    return any(lo <= i < hi for lo, hi in spans)


def pinned_to(value: float, pinned: float) -> bool:
    """The collapse rule's "the same value" (batch and online)."""
    return (
        math.isfinite(value)
        and math.isfinite(pinned)
        and abs(value - pinned) <= COLLAPSE_RELATIVE * abs(value) + 1e-12
    )


def collapse_is_abrupt(value: float, pre: np.ndarray, tolerance: float) -> bool:
    """A pinned value that the loss jumped to from the finite values `pre` logged before it (at least 3),
    by more than the tolerance, the noise and the log's own rounding step (HF rounds to 4 decimals:
    0.0003 -> 0.0002 is not a jump)."""
    if len(pre) < 3:
        return False
    p = float(np.median(pre))
    sp = 1.4826 * float(np.median(np.abs(pre - p)))
    return abs(value - p) > max(tolerance * abs(p), 3.0 * sp, 1.5 * _quantum(pre)) and abs(p) > 0


ROUNDING_DECIMALS = 8  # a log whose values all have at most this many decimals was rounded (HF: 4)


def value_decimals(value: float) -> int:
    """The fewest decimals that write `value` exactly (0-8), or 9: not a rounded number."""
    for k in range(ROUNDING_DECIMALS + 1):
        scaled = value * 10.0**k
        if abs(scaled - round(scaled)) <= 1e-6:
            return k
    return ROUNDING_DECIMALS + 1


def quantum_of(decimals: int) -> float:
    """The rounding step of a log whose values need at most `decimals` decimals (0.0: not rounded)."""
    return 10.0**-decimals if decimals <= ROUNDING_DECIMALS else 0.0


def _quantum(values: np.ndarray) -> float:
    """The log's rounding step: 10^-k when every value is written exactly with k decimals (HF rounds the
    logged loss to 4), else 0.0. A one-step move is no spike and no jump."""
    v = np.asarray(values, dtype=np.float64)
    for k in range(ROUNDING_DECIMALS + 1):
        if _has_decimals(v, k):
            return quantum_of(k)
    return 0.0


# values checked at a time (bounded temporaries; the first chunk that fails decides)
QUANTUM_CHUNK = 1 << 13


def _has_decimals(v: np.ndarray, k: int) -> bool:
    """Every finite value of v is written exactly with k decimals (within 1e-6 of a multiple of 10^-k), and there
    is at least one finite value."""
    seen = False
    for lo in range(0, len(v), QUANTUM_CHUNK):
        part = v[lo : lo + QUANTUM_CHUNK]
        part = part[np.isfinite(part)]
        if not len(part):
            continue
        seen = True
        scaled = part * 10.0**k
        if not bool(np.all(np.abs(scaled - np.round(scaled)) <= 1e-6)):
            return False
    return seen


def collapses(
    x: np.ndarray,
    steps: np.ndarray,
    *,
    tolerance: float,
    after_event: list[int],
    wait_steps: int,
    labels: dict,
) -> list[Event]:
    """The loss pinned at one value for COLLAPSE_POINTS logged values or more, reached abruptly or
    right after a blow-up (a model predicting a constant, or exactly 0.0 after an fp16 overflow)."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n < COLLAPSE_POINTS:
        return []
    # equal within 1e-5 relative: a pinned loss logged as a float32 mean still wobbles in its last
    # digits (a real collapse at 0.58258 varied by 4e-6), while real training noise is far larger
    starts, ends = _same_runs(x)
    out = []
    for s, e in zip(starts, ends, strict=False):  # values s .. e are equal
        if e - s + 1 < COLLAPSE_POINTS or s == 0:
            continue
        v = float(x[s])
        pre = x[max(0, s - BASELINE_POINTS) : s]
        pre = pre[np.isfinite(pre)]
        blown = any(0 <= steps[s] - steps[o] <= max(wait_steps, 1) * 10 for o in after_event)
        if not (blown or collapse_is_abrupt(v, pre, tolerance)):
            continue
        end = None if e >= n - 1 else int(e) + 1
        out.append(
            Event(
                kind="collapse",
                onset=int(s),
                peak=int(s),
                end=end,
                baseline=float(np.median(pre)) if len(pre) else None,
                median=v,
                scale=0.0,
                z_peak=None,
                rules=[labels["collapse"]],
                reference=float(np.median(pre)) if len(pre) else None,
                detected=int(s + COLLAPSE_POINTS - 1),
                detail=f"pinned at {v:g} for {e - s + 1} logged values",
            )
        )
    return out


def _same_runs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of `same` (value i+1 equal to value i within COLLAPSE_RELATIVE, and finite): run
    s..e-1 of `same` means values s..e are equal. A chunk at a time (bounded temporaries), the same indices as
    the edges of the whole array padded with False."""
    n = len(x)
    step = max(1, min(FLAG_VALUES, STATS_VALUES))
    starts, ends = [np.empty(0, dtype=np.int64)], [np.empty(0, dtype=np.int64)]
    prev = np.zeros(1, dtype=np.int8)
    with np.errstate(invalid="ignore"):
        for lo in range(0, n - 1, step):
            hi = min(n - 1, lo + step)
            nxt = x[lo + 1 : hi + 1]
            same = (
                np.abs(nxt - x[lo:hi]) <= COLLAPSE_RELATIVE * np.abs(nxt) + 1e-12
            ) & np.isfinite(nxt)
            edges = np.diff(np.concatenate((prev, same.view(np.int8))))
            starts.append(np.flatnonzero(edges == 1) + lo)
            ends.append(np.flatnonzero(edges == -1) + lo)
            prev = same[-1:].view(np.int8)
    if prev[0]:
        ends.append(np.array([n - 1], dtype=np.int64))
    return np.concatenate(starts), np.concatenate(ends)


def lr_restarts(steps: np.ndarray, lr: Optional[np.ndarray]) -> list[tuple[int, float, float, int]]:
    """Where the learning rate climbs again after it had decayed: (index where the climb starts,
    lr there, the highest lr of the climb, index of that high). Warm-up at the start is not one."""
    if lr is None:
        return []
    v = _ffill(np.asarray(lr, dtype=np.float64))
    if not np.isfinite(v).any() or len(v) < 3:
        return []
    run_max = np.maximum.accumulate(np.where(np.isfinite(v), v, -np.inf))
    out = []
    n = len(v)
    with np.errstate(invalid="ignore"):
        cand = (
            np.flatnonzero((v[1:] > v[:-1]) & (v[:-1] <= 0.5 * run_max[:-1]) & (run_max[:-1] > 0))
            + 1
        )
    nxt = 0
    for i in cand:
        if i < nxt:
            continue
        prev = v[i - 1]
        j = i
        while j + 1 < n and v[j + 1] >= v[j]:
            j += 1
        if v[j] >= max(2.0 * prev, 0.25 * run_max[i - 1]) and v[j] > 0:
            out.append((int(i) - 1, float(prev), float(v[j]), int(j)))
            nxt = j + 1
    return out


# --------------------------------------------------------------------------------------------
# The whole analysis of a loss timeline


@dataclass
class Analysis:
    """Events of every kind (oldest first), the healthy reference, and the end-of-log verdict."""

    events: list[Event]
    reference_blocks: Blocked  # the healthy reference, per block of values (see reference)
    verdict: str  # healthy | recovering | diverged
    target: Optional[int] = None  # index in events of the first event that has not come back
    rate: Optional[float] = None  # fraction of the excess shed per step (recovering)
    eta_step: Optional[int] = None  # step at which it would be back within tolerance
    excess: Optional[float] = None  # smoothed loss now minus the healthy level
    lr_restarts: list = field(default_factory=list)

    @property
    def reference(self) -> np.ndarray:
        """The healthy reference of every value (healthy_reference)."""
        return self.reference_blocks.values()


def analyse(
    steps: np.ndarray,
    loss: np.ndarray,
    grad_norm: Optional[np.ndarray],
    options,
    lr: Optional[np.ndarray] = None,
) -> Analysis:
    """Every event of a timeline, classified, and the verdict at the end of the log."""
    o = options
    labels = rule_labels(o)
    window = effective_window(len(steps), o.window)
    kw = dict(
        window=window,
        z_threshold=o.z_threshold,
        ratio_threshold=o.ratio_threshold,
        max_ratio=o.max_ratio,
        min_rise=o.min_rise,
        tolerance=o.tolerance,
        labels=labels,
    )
    shared = shared_blocks(loss, window)  # the block figures the three passes over the loss share
    ref = reference_blocks(loss, window, shared)
    n = len(steps)
    loss_events = find_events(loss, reference=ref, shared=shared, **kw)
    _settle_loss_events(loss_events, loss, steps, window, o)
    spans = [(ev.onset, ev.end if ev.end is not None else n) for ev in loss_events]
    shifts = level_shifts(
        loss,
        steps,
        window=window,
        tolerance=o.tolerance,
        wait_steps=o.wait_steps,
        skip=spans,
        labels=labels,
        shared=shared,
    )
    del shared
    blowups = [ev.onset for ev in loss_events] + [ev.onset for ev in shifts]
    pinned = collapses(
        loss,
        steps,
        tolerance=o.tolerance,
        after_event=blowups,
        wait_steps=o.wait_steps,
        labels=labels,
    )
    events = loss_events + shifts + pinned
    never = _never_trained(loss, steps, events, o, labels)
    if never is not None:
        events.append(never)
    if grad_norm is not None:
        grads = find_events(grad_norm, grad=True, **kw)
        events += _unmatched_grads(grads, loss_events, n)
    return _conclude(events, ref, steps, loss, lr, o)


def _settle_loss_events(
    loss_events: list[Event], loss: np.ndarray, steps: np.ndarray, window: int, o
) -> None:
    """Name each loss event (a spike, or what `_unrecovered_kind` says of one not back within the wait) and walk
    the onset of one not back (or NaN/inf to the end) back to where the loss left the band."""
    last_step = int(steps[-1])
    floor = 0  # the first value after the previous event came back: a walk back stops there
    for ev in loss_events:
        gone = ev.end is None and last_step - int(steps[ev.onset]) >= o.wait_steps
        if ev.kind == "loss":
            ev.kind, ev.detail = _unrecovered_kind(ev, loss, steps, o) if gone else ("spike", "")
        # not back: the trouble began where the loss left the band
        if (
            (gone or (ev.kind == "nonfinite" and ev.end is None))
            and ev.reference is not None
            and math.isfinite(ev.reference)
        ):
            xf = _ffill(loss)
            ev.onset = climb_start(
                xf,
                ev.onset,
                healthy_top(ev.reference, xf, ev.onset, ev.scale, o.tolerance),
                window,
                floor,
                trend=ev.kind in ("divergence", "level_shift"),
            )
        floor = ev.end + 1 if ev.end is not None else floor


def _conclude(
    events: list[Event],
    ref: Blocked,
    steps: np.ndarray,
    loss: np.ndarray,
    lr: Optional[np.ndarray],
    o,
) -> Analysis:
    """The analysis of every event found: in onset order (at one onset a collapse, then a NaN/inf, a grad norm
    last), a collapse's lead-in merged into it, what follows the first unrecovered one trimmed
    (`_trim_after_first_unrecovered`); that one is the target, and the verdict is about it."""
    events.sort(
        key=lambda e: (
            e.onset,
            {"collapse": 0, "nonfinite": 1}.get(e.kind, 2),
            e.kind == "grad_norm",
        )
    )
    events = _trim_after_first_unrecovered(_collapse_leads(events))
    target = next(
        (k for k, e in enumerate(events) if e.end is None and e.kind != "grad_norm"), None
    )
    a = Analysis(
        events=events,
        reference_blocks=ref,
        verdict="healthy",
        target=target,
        lr_restarts=lr_restarts(steps, lr),
    )
    if target is not None:
        _verdict(a, events[target], steps, loss, o)
    return a


def _unrecovered_kind(ev: Event, x: np.ndarray, steps: np.ndarray, o) -> tuple[str, str]:
    """A flagged event not back within the wait window: a divergence when it blew up and came back
    only partly, or keeps climbing; a level shift when it stepped to a plateau and stayed there.
    "early" is the median over the first 2 wait windows after the onset, "now" over the last one."""

    seg = x[ev.onset :]
    seg_s = steps[ev.onset :]
    r = ev.reference if ev.reference is not None else ev.baseline
    if r is None or len(seg) < 2 * SMOOTH_POINTS or not np.isfinite(seg).all():
        return "divergence", "not back within the wait window"
    interval = max(1, int(np.median(np.diff(seg_s[:50])))) if len(seg_s) > 1 else 1
    span = max(2 * o.wait_steps, 20 * interval)
    early_v = seg[seg_s <= seg_s[0] + span]
    tail = seg[seg_s >= seg_s[-1] - span // 2]
    if len(early_v) < SMOOTH_POINTS:
        early_v = seg[:SMOOTH_POINTS]
    if len(tail) < SMOOTH_POINTS:
        tail = seg[-SMOOTH_POINTS:]
    peak = max(float(sm.max()) for _at, sm in _smooth_chunks(seg))
    early, now = float(np.median(early_v)), float(np.median(tail))
    noise = 3 * ev.scale / math.sqrt(max(1, len(tail)))
    ratio = (
        f"{now / r:.2f}x the healthy level" if r > 0 else f"{now - r:+.3g} over the healthy level"
    )
    if now - early > max(0.5 * (early - r), noise):
        return "divergence", f"still climbing: {now:.4g} now, {ratio}"
    if early <= r or peak - r > 1.5 * (early - r):
        # the one peak the report shows
        shown = float(x[ev.peak]) if math.isfinite(x[ev.peak]) else peak
        return "divergence", f"came back only partly: peak {shown:.4g}, now {now:.4g} ({ratio})"
    return "level_shift", f"plateau at {now:.4g} ({ratio})"


PRECURSOR_POINTS = 5  # a grad-norm spike this many logged values before a loss onset leads it


def _unmatched_grads(grads: list[Event], loss_events: list[Event], n: int) -> list[Event]:
    used = set()
    before = -1  # where the previous loss event ended: a precursor never reaches back into it
    for ev in sorted(loss_events, key=lambda e: e.onset):
        for gi, g in enumerate(grads):
            if ev.onset - PRECURSOR_POINTS <= g.onset <= ev.onset:
                used.add(gi)
                if before < g.onset < ev.onset:
                    ev.precursor = g.onset
            elif ev.onset < g.onset <= (ev.end if ev.end is not None else n):
                used.add(gi)  # grad norm blew up inside the loss event: part of it
        before = max(before, ev.end if ev.end is not None else n)
    return [g for gi, g in enumerate(grads) if gi not in used]


def _collapse_leads(events: list[Event]) -> list[Event]:
    """A rise that a collapse pins a few logged values later is the collapse's lead-in: one event, named a
    collapse, from the rise's onset (not a level shift whose kind hides the pinned loss)."""
    out = list(events)
    for c in [e for e in events if e.kind == "collapse"]:
        lead = [
            e
            for e in out
            if e is not c
            and e.kind in ("level_shift", "divergence")
            and e.end is None
            and 0 < c.onset - e.onset <= SMOOTH_POINTS
        ]
        for e in lead:
            c.onset = min(c.onset, e.onset)
            out.remove(e)
    return out


def _trim_after_first_unrecovered(events: list[Event]) -> list[Event]:
    """What follows the first loss event that never came back is part of its bad stretch, except a
    NaN or a collapse, which make it worse and are kept (named) as events of their own."""
    out = []
    bad = None
    for e in events:
        if bad is None:
            out.append(e)
            if e.end is None and e.kind != "grad_norm":
                bad = e
        elif e.kind in ("nonfinite", "collapse") and e.onset >= bad.onset:
            out.append(e)
    return out


def _verdict(a: Analysis, ev: Event, steps: np.ndarray, loss: np.ndarray, o) -> None:
    last_step = int(steps[-1])
    elapsed = last_step - int(steps[ev.onset])
    tail_nf = not np.isfinite(loss[-1])
    if tail_nf or any(e.kind == "collapse" and e.end is None for e in a.events):
        a.verdict = "diverged"
        return
    r = ev.reference if ev.reference is not None else ev.baseline
    if r is None:
        a.verdict = "diverged"
        return
    band = recovery_level(r, ev.scale, o.tolerance) - r
    k = SMOOTH_POINTS
    interval = max(
        1, int(np.median(np.diff(steps[-min(len(steps), 50) :]))) if len(steps) > 1 else 1
    )
    span = max(o.wait_steps, 10 * interval)
    lo = int(np.searchsorted(steps, last_step - span))
    lo = max(ev.detected if ev.detected is not None else ev.onset, min(lo, len(steps) - 2 * k))
    seg_x, seg_s = loss[lo:], steps[lo:]
    if len(seg_x) < 2 * k or not np.isfinite(seg_x).all():
        a.verdict = "recovering" if elapsed < o.min_wait_steps else "diverged"
        return
    e1 = float(np.median(seg_x[:k])) - r
    e2 = float(np.median(seg_x[-k:])) - r
    a.excess = e2
    dt = float(np.median(seg_s[-k:]) - np.median(seg_s[:k]))
    if e2 <= band:
        a.verdict = "recovering"
        a.rate = None
        a.eta_step = last_step
        return
    if e1 > e2 > 0 and dt > 0:
        a.rate = math.log(e1 / e2) / dt
        eta = last_step + math.log(e2 / max(band, 1e-12)) / a.rate
        if eta - last_step <= 10 * max(o.wait_steps, 10 * interval):
            a.verdict = "recovering"
            a.eta_step = int(math.ceil(eta))
            return
    a.verdict = "recovering" if elapsed < o.min_wait_steps else "diverged"
