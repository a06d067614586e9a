"""Vectorised Monte Carlo of a whole training run under a checkpointing plan.

The model (seconds throughout; the same model as Daly 2006 when saves are synchronous, nothing is
corrupt and there are no spikes):

- The run is ``total_steps`` steps of ``step_seconds``. A save happens every ``frequency`` steps
  and at the final step; each save stalls training ``C`` seconds. Segment p (compute up to the
  p-th save plus its stall) ends at E(p) on the failure-free time line.
- With async saves a checkpoint is on storage ``P`` seconds after its save began (P >= C), at
  D(p) = E(p) - C + P. The run ends when the final save's stall ends, E(m) (its background write
  after training is not counted), so a failure-free run takes exactly Daly's W + m C.
- Failures are a Poisson process with mean time between failures M; they strike during compute,
  during a save and during a restart alike. A failure costs the restart R (a failure during the
  restart starts it again) and the rework since the checkpoint rolled back to.
- The rollback goes to the newest checkpoint that was fully persisted when the failure struck.
  Each checkpoint may be unloadable with probability ``corrupt_prob``, drawn once, when it is
  first needed (a checkpoint that loaded once loads again until training rewrites it): then the
  rollback walks further back through the rolling window of the newest ``keep_last`` persisted
  checkpoints, then through the milestones kept outside the window, then to step 0. Step 0
  (the initial state) is always a rollback point: an early failure or spike restarts from it
  without counting as "nothing loadable left".
- Loss spikes start at uniformly random steps (a Poisson process, ``spike_rate`` per 1000
  steps). A spike is noticed ``wait`` steps after its onset and needs a checkpoint from at
  most ``onset - margin``: the newest such one still in the rolling window, else the newest
  such milestone, else step 0. The run rolls back there (a restart R), the bad data is skipped
  so the spike does not come back. A spike noticed after the end is noticed at the final step.
- Off-grid milestone steps are represented by the first save at or after them (conservative:
  the planner already warns to save an extra checkpoint at those steps).

The loop is over events, not steps: every iteration draws one failure time for each run still
going and moves it to its next event (failure, spike noticed, or the end). The cost is
O(runs x events per run), independent of the number of steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.simulation import twotier
from checkpoint_strategy.simulation.models import (
    SimulatedPolicy,
    SimulationReport,
    SpikeStats,
    TwoTierSimulation,
)
from checkpoint_strategy.simulation.restart import event_budget, restart_phase

# Work limits that keep a bad combination of arguments from running for hours or eating memory.
MAX_SPIKE_CELLS = 50_000_000
MAX_KNOWN_CELLS = 50_000_000  # checkpoints known to load, tracked per run when some may be corrupt


@dataclass(frozen=True)
class Setup:
    total_steps: int
    step_seconds: float
    frequency: int
    keep_last: int
    milestone_steps: tuple[int, ...]
    C: float
    P: float
    R: float
    M: float
    corrupt_prob: float = 0.0
    spike_rate: float = 0.0
    wait: int = 100
    margin: int = 100
    milestone_positions: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.P < self.C:
            object.__setattr__(self, "P", self.C)
        pos = sorted(
            {min(self.checkpoints, -(-s // self.frequency)) for s in self.milestone_steps if s > 0}
        )
        object.__setattr__(self, "milestone_positions", tuple(pos))

    # --- the failure-free time line --------------------------------------------------------
    @property
    def segment_seconds(self) -> float:
        return self.frequency * self.step_seconds + self.C

    @property
    def full_segments(self) -> int:
        return self.total_steps // self.frequency

    @property
    def remainder_steps(self) -> int:
        return self.total_steps - self.full_segments * self.frequency

    @property
    def checkpoints(self) -> int:
        return self.full_segments + (1 if self.remainder_steps else 0)

    @property
    def compute_seconds(self) -> float:
        return self.total_steps * self.step_seconds

    @property
    def end_seconds(self) -> float:
        """Failure-free wall time: the final save's stall has ended."""
        return self.E_scalar(self.checkpoints)

    def E_scalar(self, p: int) -> float:
        if p <= self.full_segments:
            return p * self.segment_seconds
        return (
            self.full_segments * self.segment_seconds
            + self.remainder_steps * self.step_seconds
            + self.C
        )

    def E(self, p):
        """End of the p-th save's stall (p = 0: the start)."""
        import numpy as np

        p = np.asarray(p)
        full = np.minimum(p, self.full_segments) * self.segment_seconds
        if self.remainder_steps:
            full = np.where(
                p > self.full_segments,
                self.full_segments * self.segment_seconds
                + self.remainder_steps * self.step_seconds
                + self.C,
                full,
            )
        return full

    def newest_completed(self, t):
        """Newest save whose stall had ended by time t."""
        import numpy as np

        p = np.minimum(np.floor(t / self.segment_seconds), self.full_segments).astype(np.int64)
        if self.remainder_steps:
            p = np.where(t >= self.E_scalar(self.checkpoints), self.checkpoints, p)
        return np.maximum(p, 0)

    def newest_durable(self, t):
        """Newest save that was on storage at time t (0: nothing yet, the start)."""
        import numpy as np

        lag = self.P - self.C
        p = np.minimum(np.floor((t - lag) / self.segment_seconds), self.full_segments).astype(
            np.int64
        )
        if self.remainder_steps:
            p = np.where(t >= self.E_scalar(self.checkpoints) + lag, self.checkpoints, p)
        return np.maximum(p, 0)

    def step_time(self, steps):
        """Failure-free time at which step s has been computed (saves before it included)."""
        return steps * self.step_seconds + self.C * ((steps - 1) // self.frequency)


@dataclass
class RawResult:
    wall: Any  # np.ndarray, seconds per run
    failures: Any
    corrupt_skips: Any
    failure_scratch: Any  # bool per run
    in_flight_rollbacks: int
    failure_rollbacks: int
    spikes: Any  # per run
    spike_window_miss: Any
    spike_milestone: Any
    spike_scratch: Any
    events: int = 0


def _geometric_skips(rng, q: float, n: int):
    """Corrupt checkpoints met before a loadable one: P(k) = q^k (1 - q)."""
    return rng.geometric(1.0 - q, n).astype("int64") - 1


class KnownGood:
    """Per run: the checkpoint positions that loaded and have not been rewritten since (they load again).

    Rows are increasing position lists (-1 padded) indexed by run id; the newest (the top) is where the
    run last rolled back to. Most rollbacks land at or above the top (an append, O(1)); only a rollback
    below it (a spike, or a fall back to a milestone) rewrites the row.
    """

    def __init__(self, rows) -> None:
        import numpy as np

        rows = np.asarray(rows, dtype=np.int64)
        self.known = (rows.reshape(rows.shape[0], -1) if rows.ndim < 2 else rows).copy()
        self.depth = (self.known >= 0).sum(axis=1)
        self.track = True

    @classmethod
    def start(cls, runs: int, track: bool = True) -> KnownGood:
        """Every run knows step 0 loads. track=False (nothing can be corrupt): pushes are not recorded."""
        import numpy as np

        kg = cls(np.zeros((runs if track else 0, 1), dtype=np.int64))
        kg.track = track
        return kg

    @property
    def size(self) -> int:
        return int(self.known.size)

    def top(self, ids):
        import numpy as np

        return np.where(
            self.depth[ids] > 0, self.known[ids, np.maximum(self.depth[ids] - 1, 0)], -1
        )

    def highest(self, ids, c, ms=None):
        """Per run: the highest known position <= c (a milestone position when ms is given), -1 if none."""
        import numpy as np

        top = self.top(ids)
        out = np.where(top <= c, top, -1)
        scan = (top > c) if ms is None else np.ones(ids.size, dtype=bool)
        if ms is not None:
            out = np.full(ids.size, -1, dtype=np.int64)
        if scan.any():
            rows = self.known[ids[scan]]
            ok = (rows >= 0) & (rows <= c[scan, None])
            if ms is not None:
                ok &= np.isin(rows, ms)
            out[scan] = np.where(ok, rows, -1).max(axis=1, initial=-1)
        return out

    def push(self, ids, target) -> None:
        """`target` loaded in each run of `ids`: positions above it will be rewritten (forgotten)."""
        import numpy as np

        if not self.track:
            return
        top = self.top(ids)
        below = target < top
        if below.any():
            r = ids[below]
            rows = self.known[r]
            keep = (rows >= 0) & (rows <= target[below, None])
            self.known[r] = np.where(keep, rows, -1)
            self.depth[r] = keep.sum(axis=1)
            top = self.top(ids)
        add = target != top
        if add.any():
            r = ids[add]
            if int(self.depth[r].max()) >= self.known.shape[1]:
                grow = max(4, self.known.shape[1] // 2)
                if self.known.size + self.known.shape[0] * grow > MAX_KNOWN_CELLS:
                    raise UsageError(
                        f"too many rollbacks to track which checkpoints loaded (limit "
                        f"{MAX_KNOWN_CELLS:.0e} cells); lower --runs or --corrupt-prob"
                    )
                self.known = np.concatenate(
                    [self.known, np.full((self.known.shape[0], grow), -1, dtype=np.int64)], axis=1
                )
            self.known[r, self.depth[r]] = target[add]
            self.depth[r] += 1


def push_known(known, rows, target):
    """Functional form of KnownGood.push on a -1 padded 2-D array (rows: run indices); returns the array."""
    kg = KnownGood(known)
    kg.push(rows, target)
    return kg.known


def rollback(setup: Setup, rng, c, lo, known, ids=None):
    """Where a rollback lands: newest loadable checkpoint at most position c.

    c: ceiling position (newest acceptable); lo: oldest position in the rolling window (may be
    <= 0: the start is still covered); known: positions that loaded before and have not been rewritten
    since (a KnownGood with the runs' ids, or an array: one position or a -1 padded row per run): they load
    again. Every other checkpoint is
    corrupt with probability corrupt_prob, drawn when it is first needed; a walk stops at the first
    loadable one, so the corrupt ones it passes are all rewritten before they could be needed again.
    Returns (target, source, skips) with source 0 = rolling window, 1 = milestone, 2 = step 0
    because nothing else was left.
    """
    import numpy as np

    n = c.shape[0]
    q = setup.corrupt_prob
    if not isinstance(known, KnownGood):
        known, ids = KnownGood(known), np.arange(n)
    in_win = c >= lo
    if q > 0:
        skips_w = _geometric_skips(rng, q, n)
        cand = c - skips_w
        g = known.highest(ids, c)
        g_in = (g >= 0) & (g >= lo)
        win_ok = in_win & ((cand >= lo) | g_in | (lo <= 0))
        target = np.where(g_in, np.maximum(cand, g), cand)
        target = np.maximum(target, 0)
    else:
        win_ok = in_win
        target = c.copy()
    source = np.zeros(n, dtype=np.int8)
    skips = np.where(win_ok, c - target, 0)
    miss = ~win_ok
    if miss.any():
        mc = np.minimum(c[miss], lo[miss] - 1)
        skips[miss] = np.maximum(c[miss] - np.maximum(lo[miss], 0) + 1, 0) * in_win[miss]
        ms = np.asarray(setup.milestone_positions, dtype=np.int64)
        if ms.size:
            idx = np.searchsorted(ms, mc, side="right") - 1
            idx2 = idx.copy()
            if q > 0:
                idx2 = idx - _geometric_skips(rng, q, int(miss.sum()))
                gm = known.highest(ids[miss], mc, ms)
                gi = np.searchsorted(ms, np.maximum(gm, 0))
                idx2 = np.where(gm >= 1, np.maximum(idx2, gi), idx2)
            skips[miss] += np.maximum(idx - np.maximum(idx2, -1), 0)
            ok = idx2 >= 0
            target[miss] = np.where(ok, ms[np.maximum(idx2, 0)], 0)
            source[miss] = np.where(ok, 1, 2)
        else:
            target[miss] = 0
            source[miss] = 2
    return target, source, skips


@dataclass
class _Spikes:
    """Loss spikes drawn up front, per run in onset order (one spare column past the last): when each is noticed
    (inf: none) and the newest checkpoint position early enough to rescue it."""

    det_time: Any
    rescue_pos: Any


def _draw_spikes(setup: Setup, rng, runs: int, lam: float) -> _Spikes | None:
    import numpy as np

    N, f = setup.total_steps, setup.frequency
    smax = 0
    if lam > 0:
        cells = runs * (lam + 6 * math.sqrt(lam) + 10)
        if cells > MAX_SPIKE_CELLS:
            raise UsageError(
                f"{runs} runs x about {lam:.3g} spikes each is too much to simulate at once "
                f"(limit {MAX_SPIKE_CELLS:.0e}); lower --runs or --spike-rate"
            )
        counts = rng.poisson(lam, runs)
        smax = int(counts.max()) if runs else 0
    if not smax:
        return None
    onsets = rng.integers(1, N + 1, size=(runs, smax), dtype=np.int64)
    absent = np.arange(smax)[None, :] >= counts[:, None]
    onsets = np.sort(np.where(absent, np.iinfo(np.int64).max, onsets), axis=1)
    absent = onsets == np.iinfo(np.int64).max
    det_step = np.minimum(np.where(absent, N, onsets) + setup.wait, N)
    det_time = np.where(absent, np.inf, setup.step_time(det_step).astype(float))
    rescue_pos = np.where(
        onsets >= setup.margin, (np.where(absent, 0, onsets) - setup.margin) // f, 0
    )
    return _Spikes(
        det_time=np.concatenate([det_time, np.full((runs, 1), np.inf)], axis=1),
        rescue_pos=np.concatenate([rescue_pos, np.zeros((runs, 1), dtype=np.int64)], axis=1),
    )


class _Tally:
    """What the simulation counts per run (indexed by run id) and over all runs."""

    def __init__(self, runs: int) -> None:
        import numpy as np

        self.wall, self.fail = np.zeros(runs), np.zeros(runs, dtype=np.int64)
        self.skips, self.scratch = np.zeros(runs, dtype=np.int64), np.zeros(runs, dtype=bool)
        self.sp_n, self.sp_miss = np.zeros(runs, dtype=np.int64), np.zeros(runs, dtype=np.int64)
        self.sp_ms, self.sp_scratch = np.zeros(runs, dtype=np.int64), np.zeros(runs, dtype=np.int64)
        self.in_flight = 0
        self.fail_rollbacks = 0

    def result(self, events: int) -> RawResult:
        return RawResult(
            wall=self.wall,
            failures=self.fail,
            corrupt_skips=self.skips,
            failure_scratch=self.scratch,
            in_flight_rollbacks=self.in_flight,
            failure_rollbacks=self.fail_rollbacks,
            spikes=self.sp_n,
            spike_window_miss=self.sp_miss,
            spike_milestone=self.sp_ms,
            spike_scratch=self.sp_scratch,
            events=events,
        )


def _fail_rollback(setup: Setup, rng, known: KnownGood, tally: _Tally, runs_f, t, p0):
    """Runs hit by a failure at time t (last rolled back to p0): roll back to the newest durable checkpoint that
    loads; returns the positions they restart from."""
    import numpy as np

    k = np.maximum(setup.newest_durable(t), p0)
    completed = np.maximum(setup.newest_completed(t), p0)
    tally.in_flight += int(np.count_nonzero(completed > k))
    tally.fail_rollbacks += int(k.size)
    target, source, skips = rollback(setup, rng, k, k - setup.keep_last + 1, known, runs_f)
    known.push(runs_f, target)
    tally.skips[runs_f] += skips
    tally.scratch[runs_f] |= source == 2
    return target


def _spike_rollback(setup: Setup, rng, known: KnownGood, tally: _Tally, runs_s, t, p0, rescue):
    """Runs whose spike is noticed at time t: roll back to a checkpoint at or before `rescue` (the newest position
    early enough); returns the positions they restart from."""
    import numpy as np

    k = np.maximum(setup.newest_durable(t), p0)
    lo = k - setup.keep_last + 1
    c = np.minimum(rescue, k)
    target, source, skips = rollback(setup, rng, c, lo, known, runs_s)
    known.push(runs_s, target)
    tally.sp_n[runs_s] += 1
    tally.sp_miss[runs_s] += c < lo
    tally.sp_ms[runs_s] += source == 1
    tally.sp_scratch[runs_s] += source == 2
    tally.skips[runs_s] += skips
    return target


def run_monte_carlo(
    setup: Setup, runs: int, seed: int, expected_failures: float = 0.0
) -> RawResult:
    """`runs` whole training runs under `setup`, event by event (see the module docstring)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lam = setup.spike_rate * setup.total_steps / 1000.0
    max_iter = event_budget(
        expected_failures + lam,
        "failures and spikes",
        "lower --spike-rate, raise the MTBF or save more often",
    )
    spikes = _draw_spikes(setup, rng, runs, lam)
    end = setup.end_seconds
    tally = _Tally(runs)
    known = KnownGood.start(runs, track=setup.corrupt_prob > 0)
    # the runs still going: id, position rolled back to, next spike, wall time so far, failures, restart pending
    idx = np.arange(runs)
    pos, ptr = np.zeros(runs, dtype=np.int64), np.zeros(runs, dtype=np.int64)
    wall, fails, need = np.zeros(runs), np.zeros(runs, dtype=np.int64), np.zeros(runs, dtype=bool)
    it = 0
    while idx.size:
        it += 1
        if it > max_iter:
            raise _stalled(max_iter)
        X, need = restart_phase(
            rng.standard_exponential(idx.size) * setup.M, need, setup.R, wall, fails
        )
        comp = ~need
        start = setup.E(pos)
        t_sp = spikes.det_time[idx, ptr] if spikes else np.full(idx.size, np.inf)
        t_fail, done, spike, fail, wall = _next_event(comp, start, X, t_sp, end, wall)
        fails += fail
        if fail.any():
            pos[fail] = _fail_rollback(setup, rng, known, tally, idx[fail], t_fail[fail], pos[fail])
            need[fail] = True
        if spikes and spike.any():
            pos[spike] = _spike_rollback(
                setup,
                rng,
                known,
                tally,
                idx[spike],
                t_sp[spike],
                pos[spike],
                spikes.rescue_pos[idx[spike], ptr[spike]],
            )
            need[spike] = True
            ptr[spike] += 1
        if done.any():
            tally.wall[idx[done]] = wall[done]
            tally.fail[idx[done]] = fails[done]
            keep = ~done
            idx, pos, ptr, wall, fails, need = (a[keep] for a in (idx, pos, ptr, wall, fails, need))
    return tally.result(it)


def _stalled(max_iter: int) -> UsageError:
    return UsageError(
        f"the simulation did not finish after {max_iter} events per run: under these "
        "failure, spike and corruption rates the run barely makes progress"
    )


def _next_event(comp, start, X, t_sp, end: float, wall):
    """Each computing run's next event: the end of training, a detected spike or a failure, whichever comes
    first; returns the failure times, the three masks and the wall time advanced to the event."""
    import numpy as np

    t_fail = np.where(comp, start + X, np.inf)
    done = comp & (end <= t_fail) & (end <= t_sp)
    spike = comp & ~done & (t_sp <= t_fail)
    fail = comp & ~done & ~spike
    wall = np.where(done, wall + (end - start), wall)
    wall = np.where(spike, wall + (t_sp - start), wall)
    wall = np.where(fail, wall + X, wall)
    return t_fail, done, spike, fail, wall


ASSUMPTIONS = [
    "failures: Poisson with the plan's job MTBF; they also strike during saves and restarts",
    "a failure costs the restart plus the rework since the newest checkpoint fully on storage "
    "(with async saves the newest may still be in flight)",
    "corrupt checkpoints are found when loading, each drawn once: one that loaded loads again until training "
    "rewrites it; the rollback walks back through the rolling window, the milestones, then step 0",
    "step 0 is always a rollback point: a failure before the first save, or a spike in the first margin steps, "
    "restarts from it and is not counted as 'nothing loadable left'",
    "loss spikes: uniform onsets, noticed after the wait, rescued only from a checkpoint at least the margin "
    "before the onset; the bad data is skipped so a spike does not recur",
    "the run ends when the final save's stall ends; off-grid milestones count as the next regular save after them",
]


def setup_from_plan(
    report, corrupt_prob: float = 0.0, spike_rate: float = 0.0, wait: int = 100, margin: int = 100
) -> Setup:
    """A Setup from a PlanReport (checkpoint_strategy.planning.models)."""
    fm = report.failure_model
    C = fm.checkpoint_write_seconds
    P = fm.persist_seconds if (fm.async_save and fm.persist_seconds is not None) else C
    return Setup(
        total_steps=report.total_steps,
        step_seconds=report.step_seconds,
        frequency=report.frequency_steps,
        keep_last=report.keep_last,
        milestone_steps=tuple(report.milestone_steps),
        C=C,
        P=P,
        R=fm.restart_seconds,
        M=fm.mtbf_hours * 3600.0,
        corrupt_prob=corrupt_prob,
        spike_rate=spike_rate,
        wait=wait,
        margin=margin,
    )


def _pct(values, qs):
    """Order statistics: each percentile is a value some run really had (no interpolation, so a count stays
    a whole number)."""
    import numpy as np

    return [float(v) for v in np.percentile(values, qs, method="inverted_cdf")]


def _piece(a: float, b: float, M: float, R: float) -> float:
    """Expected wall time to go a seconds of work, where every failure costs the restart R (failures during it
    start it again) and the retry needs b seconds: (1 - e^(-a/M)) e^(b/M) M e^(R/M). With a = b it is Daly's
    segment M e^(R/M) (e^(a/M) - 1)."""
    if a <= 0:
        return 0.0
    return -math.expm1(-a / M) * math.exp(b / M) * M * math.exp(R / M)


def in_flight_wall_seconds(setup: Setup) -> float | None:
    """Exact expected wall time with async saves, failures only: each moment a checkpoint reaches storage is a
    renewal point. From checkpoint k-1 on storage to checkpoint k on storage the first try needs the compute and
    stall of segment k; a failure on the way (also while k is still in flight) rolls back to k-1 and the retry
    needs segment k plus the lag L = P - C. The last piece runs from the last checkpoint on storage before the
    end to the final stall. None when saves overlap (a save still in flight as the next one ends)."""
    L, C, M, R = setup.P - setup.C, setup.C, setup.M, setup.R
    m, E = setup.checkpoints, setup.E_scalar
    full = setup.frequency * setup.step_seconds
    if m > 1 and L > full + C:
        return None
    j = m - 1
    while j > 0 and E(j) + L > E(m):  # the run ends before checkpoint j is on storage
        j -= 1
    if j == 0:
        return _piece(E(m), E(m), M, R)
    first = _piece(E(1) + L, E(1) + L, M, R)
    middle = (j - 1) * _piece(full + C, full + C + L, M, R)
    return first + middle + _piece(E(m) - E(j) - L, E(m) - E(j), M, R)


LOST_DEFINITION = (
    "lost = wall time beyond pure compute: save stalls, rework after failures, restarts and "
    "spike rollbacks (the same definition as tradeoffs' expected lost hours)"
)


def analytic_caveats(
    setup: Setup, corrupt_prob: float, spike_rate: float, in_flight: int
) -> list[str]:
    """Why the simulation may differ from the planner's Daly figure beyond sampling noise."""
    out = []
    if setup.P > setup.C and in_flight:
        exact = in_flight_wall_seconds(setup)
        with_term = (
            ""
            if exact is None
            else f"; with that rework counted exactly (each save reaching storage a renewal point) the "
            f"expectation is {exact / 3600.0:.6g} h (async_wall_hours)"
        )
        out.append(
            f"async saves: a save is on storage {setup.P:.4g} s after it starts but stalls training "
            f"{setup.C:.4g} s; Daly's model counts the stall only, so a failure while the newest save is "
            f"still in flight (rolling back one interval further) is rework the planner's figure leaves "
            f"out{with_term}"
        )
    if corrupt_prob > 0:
        out.append("corrupt checkpoints: the analytic model assumes every checkpoint loads")
    if spike_rate > 0:
        out.append("loss spikes: the analytic model has failures only")
    return out


def _r(x: float, nd: int = 6) -> float:
    return float(round(float(x), nd))


def _spike_stats(raw: RawResult, spike_rate: float, wait: int, margin: int):
    """How the spikes of all runs were rescued (a SpikeStats)."""
    import numpy as np

    total = int(raw.spikes.sum())

    def frac(a):
        return _r(a.sum() / total) if total else None

    return SpikeStats(
        spike_rate_per_1000_steps=spike_rate,
        wait_steps=wait,
        margin_steps=margin,
        mean_spikes=_r(raw.spikes.mean()),
        spikes=total,
        window_miss_fraction=frac(raw.spike_window_miss),
        milestone_rescue_fraction=frac(raw.spike_milestone),
        scratch_fraction=frac(raw.spike_scratch),
        runs_with_window_miss_fraction=_r(np.mean(raw.spike_window_miss > 0)),
        runs_saved_only_by_milestone_fraction=_r(np.mean(raw.spike_milestone > 0)),
        runs_from_scratch_fraction=_r(np.mean(raw.spike_scratch > 0)),
    )


def _simulated_policy(report, setup: Setup, tiers):
    """The policy as simulated (a SimulatedPolicy): with two tiers the MTBF is the job's, not the tier's."""
    fm = report.failure_model
    return SimulatedPolicy(
        total_steps=setup.total_steps,
        step_seconds=setup.step_seconds,
        frequency_steps=setup.frequency,
        keep_last=setup.keep_last,
        milestone_steps=list(setup.milestone_steps),
        checkpoints_per_run=setup.checkpoints,
        mtbf_hours=fm.mtbf_hours if tiers is None else report.two_tier.job_mtbf_hours,
        checkpoint_write_seconds=setup.C,
        persist_seconds=setup.P,
        restart_seconds=setup.R,
        async_save=fm.async_save,
    )


def simulate(
    report,
    runs: int = 10000,
    seed: int = 0,
    corrupt_prob: float = 0.0,
    spike_rate: float = 0.0,
    wait: int = 100,
    margin: int = 100,
):
    """Simulate `runs` whole training runs under the plan `report`; returns a SimulationReport."""
    setup = setup_from_plan(report, corrupt_prob, spike_rate, wait, margin)
    raw, failure_free_s, tiers = _run(report, setup, runs, seed)
    H = 3600.0
    wall_h = raw.wall / H
    lost_h = (raw.wall - setup.compute_seconds) / H
    fails = raw.failures
    mean_wall = float(wall_h.mean())
    stderr = float(wall_h.std(ddof=1) / math.sqrt(runs)) if runs > 1 else 0.0
    analytic = report.expected_wall_hours
    z = (mean_wall - analytic) / stderr if stderr > 0 else None
    exact = in_flight_wall_seconds(setup) if setup.P > setup.C and tiers is None else None
    async_h = None if exact is None else exact / H
    async_z = None if async_h is None or stderr <= 0 else (mean_wall - async_h) / stderr
    compute_h = setup.compute_seconds / H

    return SimulationReport(
        runs=runs,
        seed=seed,
        policy=_simulated_policy(report, setup, tiers),
        corrupt_prob=corrupt_prob,
        compute_hours=_r(compute_h),
        failure_free_wall_hours=_r(failure_free_s / H),
        mean_wall_hours=_r(mean_wall),
        wall_hours_stderr=_r(stderr, 9),
        **_spread(wall_h, lost_h, fails),
        analytic_wall_hours=analytic,
        analytic_z=None if z is None else _r(z, 3),
        async_wall_hours=None if async_h is None else _r(async_h),
        async_z=None if async_z is None else _r(async_z, 3),
        overhead_fraction=_r(mean_wall / compute_h - 1.0),
        analytic_overhead_fraction=report.expected_overhead_fraction,
        in_flight_rollback_fraction=(
            _r(raw.in_flight_rollbacks / int(fails.sum()))
            if fails.sum() and tiers is None
            else None
        ),
        corrupt_skips_per_run=_r(raw.corrupt_skips.mean()),
        failure_scratch_fraction=_r(raw.failure_scratch.mean()),
        spikes=_spike_stats(raw, spike_rate, wait, margin) if spike_rate > 0 else None,
        plan_warnings=list(report.warnings),
        assumptions=list(ASSUMPTIONS),
        lost_definition=LOST_DEFINITION,
        analytic_caveats=analytic_caveats(setup, corrupt_prob, spike_rate, raw.in_flight_rollbacks)
        + ([] if tiers is None else [TWO_TIER_CAVEAT]),
        two_tier=tiers,
    )


def _spread(wall_h, lost_h, fails) -> dict[str, Any]:
    """The percentiles, means and maxima of the wall time, the time lost and the failure count."""
    w50, w95, w99 = _pct(wall_h, [50, 95, 99])
    l50, l95, l99 = _pct(lost_h, [50, 95, 99])
    f50, f95, f99 = _pct(fails, [50, 95, 99])
    return dict(
        p50_wall_hours=_r(w50),
        p95_wall_hours=_r(w95),
        p99_wall_hours=_r(w99),
        mean_lost_hours=_r(lost_h.mean()),
        p50_lost_hours=_r(l50),
        p95_lost_hours=_r(l95),
        p99_lost_hours=_r(l99),
        max_lost_hours=_r(lost_h.max()),
        mean_failures=_r(fails.mean()),
        p50_failures=_r(f50),
        p95_failures=_r(f95),
        p99_failures=_r(f99),
        max_failures=int(fails.max()),
    )


TWO_TIER_CAVEAT = (
    "two tiers: the planner's figure is first order (each failure loses half an interval of its "
    "tier on average), the simulation follows every save and failure"
)


def _run(report, setup: Setup, runs: int, seed: int):
    """The Monte Carlo for one tier, or for two (simulation/twotier.py) when the plan has a local tier:
    (RawResult, failure-free wall seconds, TwoTierSimulation or None)."""
    if getattr(report, "two_tier", None) is None:
        return (
            run_monte_carlo(setup, runs, seed, expected_failures=report.expected_failures),
            setup.end_seconds,
            None,
        )
    import numpy as np

    tts = twotier.setup_from_plan(report)
    wall, fails, losses = twotier.run_two_tier(tts, runs, seed, report.expected_failures)
    zeros = np.zeros(runs, dtype=np.int64)
    raw = RawResult(
        wall=wall,
        failures=fails,
        corrupt_skips=zeros,
        failure_scratch=zeros.astype(bool),
        in_flight_rollbacks=0,
        failure_rollbacks=int(fails.sum()),
        spikes=zeros,
        spike_window_miss=zeros,
        spike_milestone=zeros,
        spike_scratch=zeros,
    )
    stats = TwoTierSimulation(
        local_frequency_steps=tts.f_local,
        persistent_frequency_steps=tts.f_persistent,
        node_loss_fraction=tts.node_loss_fraction,
        node_losses_per_run=_r(float(losses.mean())),
    )
    return raw, float(tts.timeline()[0][-1]), stats
