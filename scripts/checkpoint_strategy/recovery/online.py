"""The detector step by step, for training callbacks: the same rules as `recover`, bounded memory.

    det = OnlineDetector()                       # or OnlineDetector(RecoveryOptions(z_threshold=6))
    for step, loss in training:
        event = det.update(step, loss, grad_norm=gn)
        if event is not None and event.kind in ("spike", "nonfinite"):
            ...                                  # e.g. an emergency save (never for nonfinite)

`update` returns an OnlineEvent on a change of state and None otherwise:

* ``spike`` / ``nonfinite`` / ``grad_norm``: a new event starts (onset walked back as in the batch);
* ``divergence``: the event is not back within the wait window (steps, not calls);
* ``level_shift``: the block medians stayed above the healthy level for the wait window (no spike);
* ``collapse``: the loss is pinned at one value after a blow-up or an abrupt jump;
* ``recovered``: back within tolerance of the healthy level it was judged against.

The rolling statistics are the batch ones computed incrementally (blocks of window // 8 values, the
median of the block medians and MADs of the previous blocks, the healthy reference as a low quantile
of the last 64 block medians), so `recover` on the same log names the same onsets.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery import detect, settings
from checkpoint_strategy.recovery.settings import RecoveryOptions


@dataclass
class OnlineEvent:
    """One change of state of the run."""

    kind: str  # spike | divergence | level_shift | nonfinite | collapse | grad_norm | recovered
    step: int  # the step at which it was decided
    onset_step: int  # where the event began
    loss: float  # the loss logged at `step`
    reference: Optional[float]  # the healthy level it is judged against
    rules: list[str] = field(default_factory=list)
    message: str = ""


WARMUP_POINTS = 8  # finite values logged before the warm-up statistics judge the next one


class _Rolling:
    """Incremental rolling_stats + healthy_reference for one series. `warmup`: until two blocks are closed (2 x
    window // 8 values: 32 at the default window), the values seen so far (at least WARMUP_POINTS) give the
    median, scale and maximum a new value is judged against, so an early jump is caught when it happens, not
    once the blocks exist; `warm` says the figures `push` returned came from there."""

    def __init__(self, window: int, warmup: bool = False) -> None:
        self.b = detect.block_size(window)
        self.k = max(2, window // self.b)
        self.warmup = warmup
        self.warm = False
        # the finite values before the second block closed (warm-up only)
        self.seen: list[float] = []
        self.cur: list[float] = []
        self.blocks = 0
        self.stats: deque = deque(maxlen=self.k)  # (median, MAD, max) of finished blocks
        self.medians: deque = deque(maxlen=detect.REFERENCE_BLOCKS)
        self.last = math.nan
        self.decimals = 0  # the most decimals a logged value needed so far (9: not a rounded log)
        self.med = self.scale = self.wmax = self.ref = math.nan

    def push(self, x: float) -> tuple[float, float, float, float]:
        """Stats that apply to x (from the blocks before its own), then x joins its block."""
        v = x if math.isfinite(x) else self.last
        if not math.isfinite(v):
            v = math.nan
        else:
            # the log's rounding step, as the batch floor
            if self.decimals <= detect.ROUNDING_DECIMALS:
                self.decimals = max(self.decimals, detect.value_decimals(v))
            self.last = v
        out = (self.med, self.scale, self.wmax, self.ref)
        self.warm = False
        if self.warmup and self.blocks < 2:
            if len(self.seen) >= WARMUP_POINTS and not math.isfinite(self.med):
                out = self._warm_stats()
            if math.isfinite(x):
                self.seen.append(x)
        self.cur.append(v)
        if len(self.cur) == self.b:
            self._close()
        return out

    def _warm_stats(self) -> tuple[float, float, float, float]:
        """(median, robust scale, maximum, no reference) of the finite values seen so far."""
        self.warm = True
        m = _median(self.seen)
        scale = max(
            1.4826 * _median([abs(v - m) for v in self.seen]),
            1e-4 * abs(m) + 1e-12,
            detect.quantum_of(self.decimals),
        )
        return m, scale, max(self.seen), math.nan

    def _close(self) -> None:
        """The block's (median, MAD, max) and the rolling figures over the last k blocks, in float arithmetic
        on a few dozen values (numpy's call overhead was most of an update); the same doubles as numpy's
        median / nanmedian / nanmax (`_median`; tests/test_recovery_online_arith.py)."""
        cur = self.cur  # finite values and NaN only (push)
        finite = [v for v in cur if v == v]
        if finite:  # values before the first finite one are filled with it, as the batch does
            first = finite[0]
            arr = [v if v == v else first for v in cur]
            m = _median(arr)
            self.stats.append((m, _median([abs(v - m) for v in arr]), max(arr)))
        else:
            m = math.nan
            self.stats.append((m, m, m))
        self.medians.append(m)
        self.blocks += 1
        self.cur = []
        if self.blocks >= 2:
            meds = [t[0] for t in self.stats if t[0] == t[0]]
            mads = [t[1] for t in self.stats if t[1] == t[1]]
            self.med = _median(meds) if meds else math.nan
            self.scale = max(
                1.4826 * _median(mads) if mads else math.nan,
                1e-4 * abs(self.med) + 1e-12,
                detect.quantum_of(self.decimals),
            )
            self.wmax = max(t[2] for t in self.stats if t[2] == t[2]) if meds else math.nan
            self.ref = _low_quantile(self.medians)

    def noise(self) -> float:
        mads = [s[1] for s in self.stats]
        if not mads:
            return math.nan
        return float(np.median(mads)) * 1.4826 * 1.2533 / math.sqrt(self.b)


def _median(values: list[float]) -> float:
    """numpy's median of finite values: the middle one, or the mean of the two middle ones ((a + b) / 2,
    the same double np.mean gives)."""
    v = sorted(values)
    h = len(v) // 2
    return v[h] if len(v) % 2 else (v[h - 1] + v[h]) / 2


def _low_quantile(values) -> float:
    """detect.low_quantile on a few dozen block medians: the REFERENCE_QUANTILE-th lowest finite one."""
    v = sorted(x for x in values if math.isfinite(x))
    return v[int(detect.REFERENCE_QUANTILE / 100.0 * (len(v) - 1))] if v else math.nan


class OnlineDetector:
    """Feed (step, loss[, grad_norm]) one logged value at a time; see the module docstring."""

    def __init__(self, options: Optional[RecoveryOptions] = None, **values) -> None:
        self.options = settings.build(options, **values)
        o = self.options
        self.labels = settings.rule_labels(o)
        self.loss_stats = _Rolling(o.window, warmup=True)
        self.grad_stats = _Rolling(o.window)
        self.recent: deque = deque(maxlen=max(o.window, detect.BASELINE_POINTS + 1))  # (step, loss)
        self.state = "healthy"  # healthy | event | diverged
        self.current: Optional[OnlineEvent] = None
        self.level = math.nan
        self.events: list[OnlineEvent] = []
        self.last_step: Optional[int] = None
        self._shift_blocks = 0
        # step the run of high blocks began (read only while _shift_blocks > 0)
        self._shift_start = 0
        self._shift_thr = math.nan
        self._shift_ref = math.nan
        self._pinned = 0
        self._pinned_value = math.nan
        self._block_values: list[tuple[int, float]] = []

    # ------------------------------------------------------------------ public

    def update(
        self, step: int, loss: float, grad_norm: Optional[float] = None
    ) -> Optional[OnlineEvent]:
        """One logged value. Steps must increase. Returns an OnlineEvent on a change of state."""
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return self._update(step, loss, grad_norm)

    def _update(self, step: int, loss: float, grad_norm: Optional[float]) -> Optional[OnlineEvent]:
        step = int(step)
        if self.last_step is not None and step <= self.last_step:
            raise UsageError(
                f"OnlineDetector.update: step {step} after step {self.last_step}; expected increasing "
                "steps (start a new detector after a resume)"
            )
        self.last_step = step
        x = float(loss)
        med, scale, wmax, ref = self.loss_stats.push(x)
        g_event = None
        if grad_norm is not None:
            g = float(grad_norm)
            gm, gs, gw, _ = self.grad_stats.push(g)
            ga = detect.spike_flags_one(
                g,
                gm,
                gs,
                gw,
                z_threshold=self.options.z_threshold,
                ratio_threshold=self.options.ratio_threshold,
                max_ratio=self.options.max_ratio,
                min_rise=self.options.min_rise,
                grad=True,
            )[0]
            if ga and self.state == "healthy":
                g_event = OnlineEvent(
                    "grad_norm",
                    step,
                    step,
                    x,
                    None,
                    [self.labels["grad"]],
                    f"grad norm {g:g} at step {step} vs median {gm:g}",
                )
        out = self._loss(step, x, med, scale, wmax, ref)
        self.recent.append((step, x))
        out = out or self._collapse(step, x) or self._shift(step, x)
        if out is None and g_event is not None:
            out = g_event
        if out is not None:
            self.events.append(out)
        return out

    # ------------------------------------------------------------------ rules

    def _loss(self, step, x, med, scale, wmax, ref) -> Optional[OnlineEvent]:
        o = self.options
        if self.state == "healthy":
            flags = detect.spike_flags_one(
                x,
                med,
                scale,
                wmax,
                z_threshold=o.z_threshold,
                ratio_threshold=o.ratio_threshold,
                max_ratio=o.max_ratio,
                min_rise=o.min_rise,
            )
            # a few values' MAD is too rough for the z rule alone: magnitude rules only
            if self.loss_stats.warm:
                flags = (False, flags[1], flags[2], flags[3])
            if not any(flags):
                return None
            return self._start(step, x, med, scale, ref, flags)
        if self.state != "event" or self.current is None:
            return None
        return self._follow(step, x, self.current)

    def _follow(self, step, x, ev: OnlineEvent) -> Optional[OnlineEvent]:
        """The event `ev` under way, at loss `x`: recovered (the smoothed loss back at the healthy level), turned
        non-finite, or diverged (a spike not back within wait_steps); None while it stays open."""
        o = self.options
        if math.isfinite(x) and x <= self.level:
            window = [v for _, v in list(self.recent)[-(detect.SMOOTH_POINTS - 1) :]] + [x]
            if (
                len(window) >= detect.SMOOTH_POINTS
                and all(math.isfinite(v) for v in window)
                and float(np.median(window)) <= self.level
            ):
                self.state = "healthy"
                self.current = None
                return OnlineEvent(
                    "recovered",
                    step,
                    ev.onset_step,
                    x,
                    ev.reference,
                    [],
                    f"back within {o.tolerance:.0%} of the healthy level by step {step}",
                )
        if not math.isfinite(x) and ev.kind != "nonfinite":
            self.state = "diverged"
            return OnlineEvent(
                "nonfinite",
                step,
                ev.onset_step,
                x,
                ev.reference,
                [self.labels["nonfinite"]],
                f"loss NaN/inf at step {step}",
            )
        if ev.kind == "spike" and step - ev.onset_step >= o.wait_steps:
            self.state = "diverged"
            return OnlineEvent(
                "divergence",
                step,
                ev.onset_step,
                x,
                ev.reference,
                ev.rules,
                f"not back within {o.tolerance:.0%} of {ev.reference:g} {o.wait_steps} steps after "
                f"the onset at step {ev.onset_step}",
            )
        return None

    def _start(self, step, x, med, scale, ref, flags) -> OnlineEvent:
        o = self.options
        steps = [s for s, _ in self.recent] + [step]
        vals = np.array([v for _, v in self.recent] + [x], dtype=np.float64)
        i = len(vals) - 1
        m0, s0 = med, scale
        if not math.isfinite(m0):
            prior = vals[max(0, i - detect.BASELINE_POINTS) : i]
            prior = prior[np.isfinite(prior)]
            m0 = float(np.median(prior)) if len(prior) else math.nan
            s0 = float(1.4826 * np.median(np.abs(prior - m0))) if len(prior) >= 3 else 0.0
        onset = detect.walk_back(vals, i, m0, s0, o.min_rise, o.window)
        # never into the last event
        back = max((e.step for e in self.events if e.kind == "recovered"), default=-1)
        onset = max(onset, int(np.searchsorted(steps, back, side="right")))
        pre = vals[max(0, onset - detect.BASELINE_POINTS) : onset]
        pre = pre[np.isfinite(pre)]
        base = float(np.median(pre)) if len(pre) >= 3 else (m0 if math.isfinite(m0) else None)
        level_ref = base
        if base is not None and math.isfinite(ref) and ref < base:
            level_ref = ref
        self.level = (
            detect.recovery_level(level_ref, s0, o.tolerance) if level_ref is not None else math.inf
        )
        a, b, c, nf = flags
        rules = [
            self.labels[k]
            for k, on in (("nonfinite", nf), ("z", a), ("ratio", b), ("max", c))
            if on
        ]
        kind = "nonfinite" if nf else "spike"
        ev = OnlineEvent(
            kind,
            step,
            int(steps[onset]),
            x,
            level_ref,
            rules,
            f"{'NaN/inf loss' if nf else 'loss spike'} at step {steps[onset]}"
            + (f" vs healthy level {level_ref:g}" if level_ref is not None else ""),
        )
        self.current = ev
        self.state = "diverged" if nf else "event"
        return ev

    def _collapse(self, step, x) -> Optional[OnlineEvent]:
        if detect.pinned_to(x, self._pinned_value):
            self._pinned += 1
        else:
            self._pinned, self._pinned_value = 1, x
        if self._pinned != detect.COLLAPSE_POINTS:
            return None
        vals = [v for _, v in self.recent]
        pre = np.array(vals[: -detect.COLLAPSE_POINTS][-detect.BASELINE_POINTS :], dtype=np.float64)
        pre = pre[np.isfinite(pre)]
        if not (
            detect.collapse_is_abrupt(x, pre, self.options.tolerance) or self.state != "healthy"
        ):
            return None
        onset = (
            list(self.recent)[-detect.COLLAPSE_POINTS][0]
            if len(self.recent) >= detect.COLLAPSE_POINTS
            else step
        )
        self.state = "diverged"
        return OnlineEvent(
            "collapse",
            step,
            int(onset),
            x,
            float(np.median(pre)) if len(pre) else None,
            [self.labels["collapse"]],
            f"loss pinned at {x:g} since step {onset}",
        )

    def _shift(self, step, x) -> Optional[OnlineEvent]:
        """At each finished block: is its median above the healthy level for long enough?"""
        st = self.loss_stats
        self._block_values.append((step, x))
        if st.cur or len(self._block_values) < st.b:
            return None
        block = self._block_values
        self._block_values = []
        if self.state != "healthy" or st.blocks < 3:
            self._shift_blocks = 0
            return None
        bmed = st.medians[-1]
        ref = detect.low_quantile(list(st.medians)[:-1])
        if not math.isfinite(ref):
            return None
        noise = st.noise()
        o = self.options
        if self._shift_blocks == 0:
            thr = ref + max(
                o.tolerance * abs(ref),
                detect.SHIFT_NOISE_UNITS * (noise if math.isfinite(noise) else 0),
            )
            if bmed > thr:
                self._shift_blocks, self._shift_start = 1, block[0][0]
                self._shift_thr, self._shift_ref = thr, ref
            return None
        if bmed > self._shift_thr:
            self._shift_blocks += 1
            if (
                self._shift_blocks >= detect.SHIFT_MIN_BLOCKS
                and step - self._shift_start >= o.wait_steps
            ):
                self._shift_blocks = 0
                self.state = "diverged"
                return OnlineEvent(
                    "level_shift",
                    step,
                    int(self._shift_start),
                    x,
                    self._shift_ref,
                    [self.labels["level"]],
                    f"loss held above {self._shift_thr:g} (healthy level {self._shift_ref:g}) since "
                    f"step {self._shift_start}",
                )
        else:
            self._shift_blocks = 0
        return None
