"""The storage-vs-safety sweep behind `tradeoffs`: the planner's analytic model over a grid of
frequencies x keep_last values, with the Pareto front and the planner's recommendation marked.

Each point is the planner itself run with that frequency and keep_last (so storage, data loss and
overhead are exactly what `plan --frequency F --keep-last K` reports). Added per point:
- expected_lost_hours = compute hours x Daly's expected overhead fraction (saves, rework, restarts);
- rollback_horizon_hours = keep_last x frequency x step seconds: how far back the rolling window reaches;
- spike_window_rescue_probability: the probability that the rolling window still holds a checkpoint
  from at least `margin` steps before a spike's onset when the spike is acted on `wait` steps after
  it (the planner's spike horizon, 100 + 100 steps by default), exact over onsets with step
  granularity and saves still in flight, as simulate counts it; with --spike-rate also the
  probability that every spike of the run is rescued from the window.

Pareto front: a point is on it when no other point is at least as good on every objective and
better on one. Objectives: peak storage (lower; left out when the model size is unknown), expected
lost hours (lower), max data loss per failure (lower) and the spike-rescue probability of the
rolling window (higher). Storage buys rollback reach (keep_last); frequency trades save overhead
against rework, so the front runs from the Daly optimum towards more frequent saves, each with the
smallest window that reaches its level of spike safety. Budget and --max-loss-hours are shown, not
imposed: the front is the whole tradeoff space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.simulation.models import TradeoffPoint, TradeoffsReport
from checkpoint_strategy.simulation.montecarlo import LOST_DEFINITION, setup_from_plan
from checkpoint_strategy.simulation.options import plan_or_usage

DEFAULT_POINTS = 30
DEFAULT_KEEP_LAST = (1, 2, 3, 5, 7, 10, 15, 20, 30, 50)
MAX_SWEEP_POINTS = 20000


def _round_sig(x: float, sig: int = 2) -> int:
    if x < 10:
        return max(1, int(round(x)))
    digits = int(math.floor(math.log10(x))) + 1 - sig
    return int(round(x / 10**digits) * 10**digits)


def default_frequencies(
    recommended: int, optimal_steps: float, total_steps: int, n: int = DEFAULT_POINTS
) -> list[int]:
    """n frequencies log-spaced over a decade either side of the recommendation and the optimum,
    rounded to two significant figures, within 1..total_steps, the recommendation included."""
    opt = optimal_steps if math.isfinite(optimal_steps) and optimal_steps > 0 else recommended
    lo = max(1.0, min(recommended, opt) / 10.0)
    hi = min(float(total_steps), max(recommended, opt) * 10.0)
    values = {recommended}
    if hi > lo:
        ratio = (hi / lo) ** (1.0 / (n - 1))
        for i in range(n):
            v = _round_sig(lo * ratio**i)
            if 1 <= v <= total_steps:
                values.add(v)
    return sorted(values)


def default_keep_lasts(recommended: int) -> list[int]:
    return sorted(set(DEFAULT_KEEP_LAST) | {recommended})


def spike_window_rescue_probability(
    frequency: int, keep_last: int, wait: int, margin: int
) -> float:
    """P(the rolling window of keep_last checkpoints, every `frequency` steps, still holds one from at
    most onset - margin when a spike is acted on at onset + wait), onset uniform over the run.

    With H = wait + margin = (a + r) f (a whole, 0 <= r < 1), the window must reach back a + 1
    saves with probability r and a saves otherwise: P = 1 if keep_last - 1 >= a + 1, 1 - r if
    keep_last - 1 == a, else 0. Saves still in flight (async) only help, so this is a lower bound.
    """
    horizon = wait + margin
    a, rem = divmod(horizon, frequency)
    r = rem / frequency
    if keep_last - 1 >= a + 1:
        return 1.0
    if keep_last - 1 == a:
        return 1.0 - r
    return 0.0


def spike_window_rescue_exact(
    setup, keep_lasts: Sequence[int], wait: int, margin: int
) -> dict[int, float]:
    """P(the rolling window rescues a spike) for each keep_last, exact over onsets s = 1..N (uniform), by the
    rule simulate uses: the spike is acted on at step d = min(s + wait, N); the newest checkpoint on storage
    then is k (saves still in flight do not count); the rescue needs position (s - margin) // f or earlier
    (step 0 for s < margin: step 0 is a rollback point); the window k - K + 1 .. k misses when
    k - rescue >= K. `setup` is a montecarlo.Setup (no failures or corruption needed).

    Away from the run's start and end the gap k - rescue repeats with period f, so one period stands for the
    middle of the run and only the ends are enumerated: exact, in O(f + wait + margin) per frequency.
    """
    import numpy as np

    N, f = setup.total_steps, setup.frequency
    lag_steps = int(math.ceil(max(setup.P - setup.C, 0.0) / setup.step_seconds)) + 1

    def gap(s):
        d = np.minimum(s + wait, N)
        k = setup.newest_durable(setup.step_time(d).astype(float))
        return k - np.where(s >= margin, (s - margin) // f, 0)

    head_end = min(N + 1, margin + f + lag_steps + 1)
    tail_start = max(head_end, N - wait - 3 * f - lag_steps)
    ends = np.concatenate(
        [
            gap(np.arange(1, head_end, dtype=np.int64)),
            gap(np.arange(tail_start, N + 1, dtype=np.int64)),
        ]
    )
    middle = tail_start - head_end
    period = (
        gap(np.arange(head_end, head_end + min(f, middle), dtype=np.int64))
        if middle > 0
        else ends[:0]
    )
    full, rem = divmod(middle, f) if middle > 0 else (0, 0)
    out = {}
    for K in keep_lasts:
        misses = (
            int((ends >= K).sum())
            + full * int((period >= K).sum())
            + int((period[:rem] >= K).sum())
        )
        out[K] = 1.0 - misses / N
    return out


def pareto_front(objectives: Sequence[Sequence[float]], maximize: Sequence[bool]) -> list[bool]:
    """True for each row that no other row dominates (at least as good everywhere, better somewhere)."""
    import numpy as np

    if len(objectives) == 0:
        return []
    x = np.asarray(objectives, dtype=float)
    sign = np.where(np.asarray(maximize, dtype=bool), -1.0, 1.0)
    x = x * sign  # now every objective is minimised
    le = (x[:, None, :] <= x[None, :, :]).all(
        axis=2
    )  # le[i, j]: i at least as good as j everywhere
    lt = (x[:, None, :] < x[None, :, :]).any(axis=2)
    dominated = np.asarray((le & lt).any(axis=0))
    return [not bool(d) for d in dominated.tolist()]


def _r(x: float, nd: int = 6) -> float:
    return float(round(float(x), nd))


def sweep_grid(
    pargs, base, frequencies: Optional[Sequence[int]], keep_lasts: Optional[Sequence[int]]
):
    """The frequencies and keep_last values to sweep (the recommendation always among them): (freqs, keeps)."""
    rec_f, rec_k = base.frequency_steps, base.keep_last
    if frequencies:
        too_far = [f for f in frequencies if f > pargs.total_steps]
        if too_far:
            raise UsageError(
                f"argument --sweep-frequencies: {too_far[0]} is beyond TOTAL_STEPS {pargs.total_steps}; "
                "expected frequencies from 1 to TOTAL_STEPS"
            )
        freqs = sorted(set(frequencies) | {rec_f})
    else:
        freqs = default_frequencies(rec_f, base.optimal_interval_steps, pargs.total_steps)
    keeps = sorted(set(keep_lasts) | {rec_k}) if keep_lasts else default_keep_lasts(rec_k)
    if len(freqs) * len(keeps) > MAX_SWEEP_POINTS:
        raise UsageError(
            f"{len(freqs)} frequencies x {len(keeps)} keep_last values is more than "
            f"{MAX_SWEEP_POINTS} points; give shorter --sweep-frequencies / --sweep-keep-last lists"
        )
    return freqs, keeps


def _sweep_rows(
    pargs,
    base,
    freqs: list[int],
    keeps: list[int],
    spike_rate: Optional[float],
    wait: int,
    margin: int,
) -> list[dict]:
    """One row (TradeoffPoint fields but `pareto`) per frequency x keep_last: the planner run at that point."""
    compute_h = pargs.total_steps * pargs.step_seconds / 3600.0
    rows = []
    for f in freqs:
        reports = {
            k: plan_or_usage(pargs.model_copy(update={"frequency": f, "keep_last": k}))
            for k in keeps
        }
        rescue = spike_window_rescue_exact(setup_from_plan(reports[keeps[0]]), keeps, wait, margin)
        for k in keeps:
            rep = reports[k]
            horizon_h = rep.rollback_horizon_steps * pargs.step_seconds / 3600.0
            p_win = rescue[k]
            p_run = None
            if spike_rate is not None and spike_rate > 0:
                lam = spike_rate * pargs.total_steps / 1000.0
                p_run = math.exp(-lam * (1.0 - p_win))
            rows.append(
                dict(
                    frequency_steps=f,
                    keep_last=k,
                    frequency_hours=rep.frequency_hours,
                    peak_storage_gb=rep.total_storage_gb,
                    fits_budget=rep.fits_budget,
                    max_data_loss_hours=rep.max_data_loss_hours,
                    expected_overhead_fraction=rep.expected_overhead_fraction,
                    expected_lost_hours=_r(compute_h * rep.expected_overhead_fraction),
                    rollback_horizon_steps=rep.rollback_horizon_steps,
                    rollback_horizon_hours=_r(horizon_h),
                    spike_window_rescue_probability=_r(p_win),
                    spike_run_rescue_probability=None if p_run is None else _r(p_run),
                    recommended=(f == base.frequency_steps and k == base.keep_last),
                )
            )
    return rows


def _front(rows: list[dict], storage_known: bool) -> tuple[list[str], list[bool]]:
    """The Pareto objectives' names and, per row, whether it is on the front (storage only when known)."""
    objectives, maximize = [], []
    if storage_known:
        objectives.append("peak_storage_gb (lower)")
        maximize.append(False)
    objectives += [
        "expected_lost_hours (lower)",
        "max_data_loss_hours (lower)",
        "spike_window_rescue_probability (higher)",
    ]
    maximize += [False, False, True]
    matrix = []
    for row in rows:
        vec = [row["peak_storage_gb"]] if storage_known else []
        vec += [
            row["expected_lost_hours"],
            row["max_data_loss_hours"],
            row["spike_window_rescue_probability"],
        ]
        matrix.append(vec)
    return objectives, pareto_front(matrix, maximize)


def tradeoffs(
    pargs,
    frequencies: Optional[Sequence[int]] = None,
    keep_lasts: Optional[Sequence[int]] = None,
    spike_rate: Optional[float] = None,
    wait: int = 100,
    margin: int = 100,
    plot: Optional[str] = None,
):
    """The sweep for PlanArguments `pargs`; returns a TradeoffsReport."""
    base = plan_or_usage(pargs)
    freqs, keeps = sweep_grid(pargs, base, frequencies, keep_lasts)
    spikes_on = spike_rate is not None and spike_rate > 0
    rows = _sweep_rows(pargs, base, freqs, keeps, spike_rate, wait, margin)
    objectives, front = _front(rows, base.checkpoint_size_gb is not None)
    points = [TradeoffPoint(pareto=on, **row) for row, on in zip(rows, front, strict=True)]
    rec_on_front = any(p.pareto and p.recommended for p in points)
    return TradeoffsReport(
        total_steps=pargs.total_steps,
        step_seconds=pargs.step_seconds,
        compute_hours=_r(pargs.total_steps * pargs.step_seconds / 3600.0),
        storage_budget_gb=pargs.budget_gb,
        checkpoint_size_gb=base.checkpoint_size_gb,
        spike_rate_per_1000_steps=spike_rate if spikes_on else None,
        spike_wait_steps=wait,
        spike_margin_steps=margin,
        recommended_frequency_steps=base.frequency_steps,
        recommended_keep_last=base.keep_last,
        frequencies=list(freqs),
        keep_last_values=list(keeps),
        pareto_objectives=objectives,
        pareto_count=sum(front),
        recommended_on_front=rec_on_front,
        points=points,
        plot=plot,
        plan_warnings=list(base.warnings),
        lost_definition=LOST_DEFINITION,
    )
