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
  Each checkpoint may be unloadable with probability ``corrupt_prob`` (drawn when it is first
  needed): then the rollback walks further back through the rolling window of the newest
  ``keep_last`` persisted checkpoints, then through the milestones kept outside the window,
  then to step 0.
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

# Work limits that keep a bad combination of arguments from running for hours or eating memory.
MAX_EVENTS_PER_RUN = 20000
MAX_SPIKE_CELLS = 50_000_000


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
        pos = sorted({min(self.checkpoints, -(-s // self.frequency)) for s in self.milestone_steps if s > 0})
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
        return self.full_segments * self.segment_seconds + self.remainder_steps * self.step_seconds + self.C

    def E(self, p):
        """End of the p-th save's stall (p = 0: the start)."""
        import numpy as np

        p = np.asarray(p)
        full = np.minimum(p, self.full_segments) * self.segment_seconds
        if self.remainder_steps:
            full = np.where(p > self.full_segments,
                            self.full_segments * self.segment_seconds + self.remainder_steps * self.step_seconds
                            + self.C, full)
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
        p = np.minimum(np.floor((t - lag) / self.segment_seconds), self.full_segments).astype(np.int64)
        if self.remainder_steps:
            p = np.where(t >= self.E_scalar(self.checkpoints) + lag, self.checkpoints, p)
        return np.maximum(p, 0)

    def step_time(self, steps):
        """Failure-free time at which step s has been computed (saves before it included)."""
        return steps * self.step_seconds + self.C * ((steps - 1) // self.frequency)


@dataclass
class RawResult:
    wall: Any  # np.ndarray, seconds per run (numpy is imported lazily, so arrays are typed Any)
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


def rollback(setup: Setup, rng, c, lo, good):
    """Where a rollback lands: newest loadable checkpoint at most position c.

    c: ceiling position (newest acceptable); lo: oldest position in the rolling window (may be
    <= 0: the start is still covered); good: the position last loaded (known loadable).
    Returns (target, source, skips) with source 0 = rolling window, 1 = milestone, 2 = step 0
    because nothing else was left.
    """
    import numpy as np

    n = c.shape[0]
    q = setup.corrupt_prob
    in_win = c >= lo
    if q > 0:
        skips_w = _geometric_skips(rng, q, n)
        cand = c - skips_w
        g_in = (good >= lo) & (good <= c)
        win_ok = in_win & ((cand >= lo) | g_in | (lo <= 0))
        target = np.where(g_in, np.maximum(cand, good), cand)
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
                g = good[miss]
                gi = np.searchsorted(ms, g)
                gi_c = np.minimum(gi, ms.size - 1)
                g_ms = (gi < ms.size) & (ms[gi_c] == g) & (g <= mc)
                idx2 = np.where(g_ms, np.maximum(idx2, gi_c), idx2)
            skips[miss] += np.maximum(idx - np.maximum(idx2, -1), 0)
            ok = idx2 >= 0
            target[miss] = np.where(ok, ms[np.maximum(idx2, 0)], 0)
            source[miss] = np.where(ok, 1, 2)
        else:
            target[miss] = 0
            source[miss] = 2
    return target, source, skips


def run_monte_carlo(setup: Setup, runs: int, seed: int, expected_failures: float = 0.0) -> RawResult:
    import numpy as np

    rng = np.random.default_rng(seed)
    N, f, K = setup.total_steps, setup.frequency, setup.keep_last
    lam = setup.spike_rate * N / 1000.0
    expected_events = expected_failures + lam
    if not math.isfinite(expected_events) or expected_events > MAX_EVENTS_PER_RUN:
        raise UsageError(f"about {expected_events:.3g} failures and spikes per run expected: the simulation "
                         f"handles at most {MAX_EVENTS_PER_RUN}; lower --spike-rate, raise the MTBF or save more often")
    max_iter = int(100 * (expected_events + 1) + 10000)

    # --- loss spikes, drawn up front: onset steps sorted per run -----------------------------
    smax = 0
    if lam > 0:
        cells = runs * (lam + 6 * math.sqrt(lam) + 10)
        if cells > MAX_SPIKE_CELLS:
            raise UsageError(f"{runs} runs x about {lam:.3g} spikes each is too much to simulate at once "
                             f"(limit {MAX_SPIKE_CELLS:.0e}); lower --runs or --spike-rate")
        counts = rng.poisson(lam, runs)
        smax = int(counts.max()) if runs else 0
    if smax:
        onsets = rng.integers(1, N + 1, size=(runs, smax), dtype=np.int64)
        absent = np.arange(smax)[None, :] >= counts[:, None]
        onsets = np.sort(np.where(absent, np.iinfo(np.int64).max, onsets), axis=1)
        absent = onsets == np.iinfo(np.int64).max
        det_step = np.minimum(np.where(absent, N, onsets) + setup.wait, N)
        det_time = np.where(absent, np.inf, setup.step_time(det_step).astype(float))
        rescue_pos = np.where(onsets >= setup.margin, (np.where(absent, 0, onsets) - setup.margin) // f, 0)
        det_time = np.concatenate([det_time, np.full((runs, 1), np.inf)], axis=1)
        rescue_pos = np.concatenate([rescue_pos, np.zeros((runs, 1), dtype=np.int64)], axis=1)

    end = setup.end_seconds
    M, R = setup.M, setup.R
    out_wall = np.zeros(runs)
    out_fail = np.zeros(runs, dtype=np.int64)
    skips_run = np.zeros(runs, dtype=np.int64)
    scratch_run = np.zeros(runs, dtype=bool)
    sp_n = np.zeros(runs, dtype=np.int64)
    sp_miss = np.zeros(runs, dtype=np.int64)
    sp_ms = np.zeros(runs, dtype=np.int64)
    sp_scratch = np.zeros(runs, dtype=np.int64)
    in_flight = 0
    fail_rollbacks = 0

    idx = np.arange(runs)
    pos = np.zeros(runs, dtype=np.int64)
    good = np.zeros(runs, dtype=np.int64)
    ptr = np.zeros(runs, dtype=np.int64)
    wall = np.zeros(runs)
    fails = np.zeros(runs, dtype=np.int64)
    need = np.zeros(runs, dtype=bool)
    it = 0
    while idx.size:
        it += 1
        if it > max_iter:
            raise UsageError(f"the simulation did not finish after {max_iter} events per run: under these "
                             "failure, spike and corruption rates the run barely makes progress")
        X = rng.standard_exponential(idx.size) * M
        # restart phase: a failure during the restart starts it again
        rf = need & (X < R)
        restarted = need & ~rf
        wall += np.where(rf, X, 0.0) + np.where(restarted, R, 0.0)
        fails += rf
        X = np.where(restarted, X - R, X)
        need = rf
        comp = ~rf
        start = setup.E(pos)
        t_fail = np.where(comp, start + X, np.inf)
        if smax:
            t_sp = det_time[idx, ptr]
        else:
            t_sp = np.full(idx.size, np.inf)
        done = comp & (end <= t_fail) & (end <= t_sp)
        spike = comp & ~done & (t_sp <= t_fail)
        fail = comp & ~done & ~spike
        wall = np.where(done, wall + (end - start), wall)
        wall = np.where(spike, wall + (t_sp - start), wall)
        wall = np.where(fail, wall + X, wall)
        fails += fail

        if fail.any():
            t = t_fail[fail]
            p0 = pos[fail]
            k = np.maximum(setup.newest_durable(t), p0)
            completed = np.maximum(setup.newest_completed(t), p0)
            in_flight += int(np.count_nonzero(completed > k))
            fail_rollbacks += int(k.size)
            target, source, skips = rollback(setup, rng, k, k - K + 1, good[fail])
            runs_f = idx[fail]
            skips_run[runs_f] += skips
            scratch_run[runs_f] |= source == 2
            pos[fail] = target
            good[fail] = target
            need[fail] = True

        if spike.any():
            t = t_sp[spike]
            p0 = pos[spike]
            k = np.maximum(setup.newest_durable(t), p0)
            lo = k - K + 1
            c = np.minimum(rescue_pos[idx[spike], ptr[spike]], k)
            target, source, skips = rollback(setup, rng, c, lo, good[spike])
            runs_s = idx[spike]
            sp_n[runs_s] += 1
            sp_miss[runs_s] += c < lo
            sp_ms[runs_s] += source == 1
            sp_scratch[runs_s] += source == 2
            skips_run[runs_s] += skips
            pos[spike] = target
            good[spike] = target
            need[spike] = True
            ptr[spike] += 1

        if done.any():
            out_wall[idx[done]] = wall[done]
            out_fail[idx[done]] = fails[done]
            keep = ~done
            idx, pos, good, ptr = idx[keep], pos[keep], good[keep], ptr[keep]
            wall, fails, need = wall[keep], fails[keep], need[keep]

    return RawResult(wall=out_wall, failures=out_fail, corrupt_skips=skips_run, failure_scratch=scratch_run,
                     in_flight_rollbacks=in_flight, failure_rollbacks=fail_rollbacks, spikes=sp_n,
                     spike_window_miss=sp_miss, spike_milestone=sp_ms, spike_scratch=sp_scratch, events=it)


ASSUMPTIONS = [
    "failures: Poisson with the plan's job MTBF; they also strike during saves and restarts",
    "a failure costs the restart plus the rework since the newest checkpoint fully on storage "
    "(with async saves the newest may still be in flight)",
    "corrupt checkpoints are found when loading; the rollback then walks back through the rolling window, "
    "the milestones, then step 0",
    "loss spikes: uniform onsets, noticed after the wait, rescued only from a checkpoint at least the margin "
    "before the onset; the bad data is skipped so a spike does not recur",
    "the run ends when the final save's stall ends; off-grid milestones count as the next regular save after them",
]


def setup_from_plan(report, corrupt_prob: float = 0.0, spike_rate: float = 0.0,
                    wait: int = 100, margin: int = 100) -> Setup:
    """A Setup from a PlanReport (checkpoint_strategy.planning.models)."""
    fm = report.failure_model
    C = fm.checkpoint_write_seconds
    P = fm.persist_seconds if (fm.async_save and fm.persist_seconds is not None) else C
    return Setup(total_steps=report.total_steps, step_seconds=report.step_seconds,
                 frequency=report.frequency_steps, keep_last=report.keep_last,
                 milestone_steps=tuple(report.milestone_steps), C=C, P=P, R=fm.restart_seconds,
                 M=fm.mtbf_hours * 3600.0, corrupt_prob=corrupt_prob, spike_rate=spike_rate,
                 wait=wait, margin=margin)


def _pct(values, qs):
    import numpy as np

    return [float(v) for v in np.percentile(values, qs)]


def _r(x: float, nd: int = 6) -> float:
    return float(round(float(x), nd))


def simulate(report, runs: int = 10000, seed: int = 0, corrupt_prob: float = 0.0, spike_rate: float = 0.0,
             wait: int = 100, margin: int = 100):
    """Simulate `runs` whole training runs under the plan `report`; returns a SimulationReport."""
    import numpy as np

    from checkpoint_strategy.simulation.models import SimulatedPolicy, SimulationReport, SpikeStats

    setup = setup_from_plan(report, corrupt_prob, spike_rate, wait, margin)
    raw = run_monte_carlo(setup, runs, seed, expected_failures=report.expected_failures)
    H = 3600.0
    wall_h = raw.wall / H
    lost_h = (raw.wall - setup.end_seconds) / H
    fails = raw.failures
    mean_wall = float(wall_h.mean())
    stderr = float(wall_h.std(ddof=1) / math.sqrt(runs)) if runs > 1 else 0.0
    analytic = report.expected_wall_hours
    z = (mean_wall - analytic) / stderr if stderr > 0 else None
    w50, w95, w99 = _pct(wall_h, [50, 95, 99])
    l50, l95, l99 = _pct(lost_h, [50, 95, 99])
    f50, f95, f99 = _pct(fails, [50, 95, 99])
    compute_h = setup.compute_seconds / H

    spikes = None
    if spike_rate > 0:
        total = int(raw.spikes.sum())

        def frac(a):
            return _r(a.sum() / total) if total else None

        spikes = SpikeStats(
            spike_rate_per_1000_steps=spike_rate, wait_steps=wait, margin_steps=margin,
            mean_spikes=_r(raw.spikes.mean()), spikes=total,
            window_miss_fraction=frac(raw.spike_window_miss),
            milestone_rescue_fraction=frac(raw.spike_milestone),
            scratch_fraction=frac(raw.spike_scratch),
            runs_with_window_miss_fraction=_r(np.mean(raw.spike_window_miss > 0)),
            runs_saved_only_by_milestone_fraction=_r(np.mean(raw.spike_milestone > 0)),
            runs_from_scratch_fraction=_r(np.mean(raw.spike_scratch > 0)),
        )
    fm = report.failure_model
    policy = SimulatedPolicy(
        total_steps=setup.total_steps, step_seconds=setup.step_seconds, frequency_steps=setup.frequency,
        keep_last=setup.keep_last, milestone_steps=list(setup.milestone_steps),
        checkpoints_per_run=setup.checkpoints, mtbf_hours=fm.mtbf_hours,
        checkpoint_write_seconds=setup.C, persist_seconds=setup.P, restart_seconds=setup.R,
        async_save=fm.async_save)
    return SimulationReport(
        runs=runs, seed=seed, policy=policy, corrupt_prob=corrupt_prob,
        compute_hours=_r(compute_h), failure_free_wall_hours=_r(setup.end_seconds / H),
        mean_wall_hours=_r(mean_wall), wall_hours_stderr=_r(stderr, 9),
        p50_wall_hours=_r(w50), p95_wall_hours=_r(w95), p99_wall_hours=_r(w99),
        analytic_wall_hours=analytic, analytic_z=None if z is None else _r(z, 3),
        mean_lost_hours=_r(lost_h.mean()), p50_lost_hours=_r(l50), p95_lost_hours=_r(l95),
        p99_lost_hours=_r(l99), max_lost_hours=_r(lost_h.max()),
        mean_failures=_r(fails.mean()), p50_failures=_r(f50), p95_failures=_r(f95), p99_failures=_r(f99),
        max_failures=int(fails.max()),
        overhead_fraction=_r(mean_wall / compute_h - 1.0),
        analytic_overhead_fraction=report.expected_overhead_fraction,
        in_flight_rollback_fraction=(_r(raw.in_flight_rollbacks / raw.failure_rollbacks)
                                     if raw.failure_rollbacks else None),
        corrupt_skips_per_run=_r(raw.corrupt_skips.mean()),
        failure_scratch_fraction=_r(raw.failure_scratch.mean()),
        spikes=spikes, plan_warnings=list(report.warnings), assumptions=list(ASSUMPTIONS),
    )
