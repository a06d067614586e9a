"""The Monte Carlo against Daly 2006, determinism, async in-flight rollbacks, corruption and spikes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from checkpoint_strategy.planning import failure
from checkpoint_strategy.planning.options import validate_arguments
from checkpoint_strategy.planning.planner import plan
from checkpoint_strategy.simulation.montecarlo import Setup, rollback, setup_from_plan, simulate
from checkpoint_strategy.simulation.sweep import spike_window_rescue_probability

C_SECONDS, R_SECONDS = 300.0, 600.0  # Daly's scenarios: C = 5 min, R = 10 min


def daly_plan(mtbf_hours: float, segments: int = 20, **extra):
    """A synchronous plan whose interval is Daly's optimum (in whole 1-minute steps)."""
    tau = failure.exact_interval(C_SECONDS, mtbf_hours * 3600.0)
    frequency = round(tau / 60.0)
    args = dict(
        total_steps=frequency * segments,
        step_seconds=60.0,
        budget_gb=1000.0,
        checkpoint_write_seconds=C_SECONDS,
        restart_seconds=R_SECONDS,
        mtbf_hours=mtbf_hours,
        async_save=False,
        frequency=frequency,
        max_loss_hours=1000.0,
    )
    args.update(extra)
    return plan(validate_arguments(args))


@pytest.mark.parametrize("mtbf_hours, expected_minutes", [(24.0, 116.69), (6.0, 56.71)])
def test_daly_scenarios_mean_wall_time_within_three_standard_errors(mtbf_hours, expected_minutes):
    report = daly_plan(mtbf_hours)
    # the planner's interval is Daly's: the test vectors of Daly 2006 (eq. 37 / exact optimum)
    assert report.frequency_steps == round(expected_minutes)
    sim = simulate(report, runs=20000, seed=12345)
    assert sim.runs == 20000
    assert sim.mean_failures > 1.0  # failures really happen in these runs
    assert abs(sim.mean_wall_hours - sim.analytic_wall_hours) <= 3 * sim.wall_hours_stderr
    assert abs(sim.analytic_z) <= 3
    # and the analytic figure is the minimum of Daly's T(tau), found here on a dense grid (not by the planner):
    # the interval is the optimum rounded to whole minutes, where T is flat
    W, M = report.total_steps * report.step_seconds, mtbf_hours * 3600.0
    taus = np.linspace(60.0, 6 * 3600.0, 1_000_001)
    wall = M * math.exp(R_SECONDS / M) * np.expm1((taus + C_SECONDS) / M) * W / taus
    assert taus[np.argmin(wall)] / 60 == pytest.approx(expected_minutes, abs=0.01)
    assert sim.analytic_wall_hours == pytest.approx(wall.min() / 3600.0, rel=2e-5)
    assert sim.analytic_wall_hours >= wall.min() / 3600.0 * (1 - 1e-9)


def test_failures_during_saves_and_restarts_count_like_daly():
    """A save as long as the compute between saves and a restart of an hour against a 2 h MTBF:
    only a model where saves and restarts can fail matches Daly's e^(R/M) (e^((tau+C)/M) - 1)."""
    report = plan(
        validate_arguments(
            dict(
                total_steps=600,
                step_seconds=60.0,
                budget_gb=1000.0,
                checkpoint_write_seconds=3600.0,
                restart_seconds=3600.0,
                mtbf_hours=2.0,
                async_save=False,
                frequency=60,
                max_loss_hours=1000.0,
            )
        )
    )
    sim = simulate(report, runs=20000, seed=7)
    assert abs(sim.mean_wall_hours - sim.analytic_wall_hours) <= 3 * sim.wall_hours_stderr
    # a model where only compute can fail would expect 10 (M (e^(tau/M) - 1) + C + R (e^(tau/M) - 1)),
    # about 29.5 h here: far below both the simulation and Daly
    M, tau, C, R = 7200.0, 3600.0, 3600.0, 3600.0
    compute_only = 10 * (M * math.expm1(tau / M) + C + R * math.expm1(tau / M)) / 3600.0
    assert sim.mean_wall_hours > 1.5 * compute_only


def test_same_seed_same_report_other_seed_differs():
    report = daly_plan(6.0)
    a = simulate(report, runs=3000, seed=99, spike_rate=0.5, corrupt_prob=0.05)
    b = simulate(report, runs=3000, seed=99, spike_rate=0.5, corrupt_prob=0.05)
    c = simulate(report, runs=3000, seed=100, spike_rate=0.5, corrupt_prob=0.05)
    assert a.model_dump() == b.model_dump()
    assert a.mean_wall_hours != c.mean_wall_hours


def test_no_failure_no_spike_is_exactly_the_failure_free_run():
    report = plan(
        validate_arguments(
            dict(
                total_steps=1050,
                step_seconds=2.0,
                budget_gb=100.0,
                checkpoint_write_seconds=10.0,
                mtbf_hours=1e9,
                frequency=100,
            )
        )
    )
    sim = simulate(report, runs=200, seed=0)
    # 10 full segments of 100 steps + one of 50, each followed by a 10 s stall
    assert sim.failure_free_wall_hours == pytest.approx((1050 * 2.0 + 11 * 10.0) / 3600.0)
    assert sim.policy.checkpoints_per_run == 11
    # lost = beyond pure compute: only the 11 save stalls (the definition tradeoffs uses too)
    assert sim.mean_failures == 0 and sim.max_lost_hours == pytest.approx(110.0 / 3600.0, abs=1e-6)
    assert sim.p99_wall_hours == pytest.approx(sim.failure_free_wall_hours)


def test_async_newest_checkpoint_in_flight_rolls_back_one_further():
    base = dict(
        total_steps=20000,
        step_seconds=1.0,
        budget_gb=1e6,
        model_size_gb=100.0,
        write_gbps=0.5,
        mtbf_hours=0.5,
        frequency=100,
        keep_last=5,
        restart_seconds=60.0,
        max_loss_hours=100,
    )
    # 300 GB at 0.5 GB/s: 600 s until a save is on storage, longer than the 100 s between saves: the planner
    # moves the interval so saves never overlap (540 s rounded up to 1000 steps): the newest save is in flight
    # 540 s of every 1060
    asynchronous = plan(validate_arguments(dict(base, async_save=True)))
    assert asynchronous.failure_model.persist_seconds == pytest.approx(600.0)
    assert asynchronous.frequency_steps == 1000
    sim = simulate(asynchronous, runs=3000, seed=3)
    assert sim.policy.persist_seconds == pytest.approx(600.0)
    assert sim.in_flight_rollback_fraction > 0.2  # of all failures, those during restarts included
    # the analytic model counts only the 60 s stall: the in-flight window costs extra rework
    assert sim.mean_wall_hours > sim.analytic_wall_hours + 5 * sim.wall_hours_stderr
    synchronous = simulate(
        plan(validate_arguments(dict(base, async_save=False))), runs=3000, seed=3
    )
    assert synchronous.in_flight_rollback_fraction == 0


def test_corrupt_checkpoints_push_rollbacks_further_back():
    report = daly_plan(6.0, keep_last=2)
    clean = simulate(report, runs=4000, seed=5)
    dirty = simulate(report, runs=4000, seed=5, corrupt_prob=0.3)
    assert clean.corrupt_skips_per_run == 0 and clean.failure_scratch_fraction == 0
    assert dirty.corrupt_skips_per_run > 0.3 * clean.mean_failures
    assert dirty.mean_lost_hours > clean.mean_lost_hours
    # keep_last 2 and both corrupt: the milestones or step 0 have to save the run
    assert dirty.failure_scratch_fraction > 0


def _setup(**kw):
    base = dict(
        total_steps=1000,
        step_seconds=1.0,
        frequency=100,
        keep_last=3,
        milestone_steps=(300, 1000),
        C=0.0,
        P=0.0,
        R=0.0,
        M=1e9,
    )
    base.update(kw)
    return Setup(**base)


def test_rollback_by_hand():
    rng = np.random.default_rng(0)
    s = _setup()
    a = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    # failure: newest persisted is position 7, window 5..7 -> 7 from the window
    t, src, skips = rollback(s, rng, a(7), a(5), a(0))
    assert (t.tolist(), src.tolist(), skips.tolist()) == ([7], [0], [0])
    # spike needing position 4 when the window holds 6..8: window misses, milestone 3 (step 300)
    t, src, _ = rollback(s, rng, a(4), a(6), a(0))
    assert (t.tolist(), src.tolist()) == ([3], [1])
    # spike needing position 2 with the window at 6..8 and no milestone that early: step 0
    t, src, _ = rollback(s, rng, a(2), a(6), a(0))
    assert (t.tolist(), src.tolist()) == ([0], [2])
    # early in the run the start is still inside the window
    t, src, _ = rollback(s, rng, a(0), a(-1), a(0))
    assert (t.tolist(), src.tolist()) == ([0], [0])


def test_rollback_with_every_checkpoint_corrupt_but_the_known_good_one():
    s = _setup(corrupt_prob=0.5)

    class AllCorrupt:  # a generator stand-in: every draw says "corrupt for ever"
        def geometric(self, p, n):
            return np.full(n, 10**6)

    a = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    # the position last loaded (6) is known good: the walk stops there
    t, src, skips = rollback(s, AllCorrupt(), a(8), a(6), a(6))
    assert (t.tolist(), src.tolist(), skips.tolist()) == ([6], [0], [2])
    # nothing known good in the window: window (3), milestone 3 (1) all corrupt -> step 0
    t, src, skips = rollback(s, AllCorrupt(), a(8), a(6), a(0))
    assert (t.tolist(), src.tolist(), skips.tolist()) == ([0], [2], [4])


@pytest.mark.parametrize(
    "frequency, keep_last", [(1000, 1), (150, 2), (120, 2), (300, 1), (100, 3)]
)
def test_spike_window_miss_rate_matches_the_analytic_probability(frequency, keep_last):
    report = plan(
        validate_arguments(
            dict(
                total_steps=200000,
                step_seconds=1.0,
                budget_gb=1e6,
                model_size_gb=1.0,
                mtbf_hours=1e9,
                async_save=False,
                frequency=frequency,
                keep_last=keep_last,
                milestones="none",
            )
        )
    )
    sim = simulate(report, runs=4000, seed=11, spike_rate=0.01)
    assert (sim.spikes.wait_steps, sim.spikes.margin_steps) == (100, 100)  # the documented defaults
    expected = 1.0 - spike_window_rescue_probability(frequency, keep_last, 100, 100)
    n = sim.spikes.spikes
    assert n > 5000
    se = math.sqrt(max(expected * (1 - expected), 1e-4) / n)
    assert abs(sim.spikes.window_miss_fraction - expected) <= 4 * se + 0.002
    # milestones none: every spike the window misses restarts from step 0
    assert sim.spikes.milestone_rescue_fraction == 0
    assert sim.spikes.scratch_fraction == pytest.approx(sim.spikes.window_miss_fraction, abs=0.003)


def test_spikes_after_best_only_a_milestone_saves_the_run():
    common = dict(
        total_steps=100000, step_seconds=2.5, budget_gb=1e6, model_size_gb=4.0, frequency=1000
    )
    narrow = simulate(
        plan(validate_arguments(dict(common, keep_last=1))), runs=4000, seed=2, spike_rate=0.02
    )
    wide = simulate(
        plan(validate_arguments(dict(common, keep_last=10))), runs=4000, seed=2, spike_rate=0.02
    )
    assert narrow.spikes.mean_spikes == pytest.approx(2.0, rel=0.05)
    assert 0.1 < narrow.spikes.window_miss_fraction < 0.3
    assert narrow.spikes.milestone_rescue_fraction > 0.1  # seed milestones 1000, 5000, 10000, ...
    assert narrow.spikes.runs_saved_only_by_milestone_fraction > 0.2
    assert wide.spikes.window_miss_fraction == 0 and wide.spikes.milestone_rescue_fraction == 0
    assert narrow.mean_lost_hours > wide.mean_lost_hours  # milestone rescues throw away hours


def test_setup_maps_off_grid_milestones_to_the_next_save():
    report = plan(
        validate_arguments(
            dict(
                total_steps=10000,
                step_seconds=1.0,
                budget_gb=1e6,
                frequency=2000,
                milestones=[1000, 4000, 9999],
            )
        )
    )
    s = setup_from_plan(report)
    assert s.milestone_positions == (1, 2, 5)  # 1000 -> 2000, 4000, 9999 -> 10000


def test_percentiles_of_counts_are_order_statistics_and_in_flight_shares_the_failures_denominator():
    report = plan(
        validate_arguments(
            dict(
                total_steps=2000,
                step_seconds=60.0,
                budget_gb=1e6,
                model_size_gb=100.0,
                write_gbps=1.0,
                mtbf_hours=50.0,
                frequency=5,
                max_loss_hours=100,
            )
        )
    )
    sim = simulate(report, runs=501, seed=4)
    for v in (sim.p50_failures, sim.p95_failures, sim.p99_failures):
        assert float(v).is_integer()
    assert sim.p50_failures in (0.0, 1.0, 2.0)
    # the in-flight share is of all failures (the Failures row): share x failures is a whole count
    total = round(sim.mean_failures * sim.runs)
    assert (
        abs(
            sim.in_flight_rollback_fraction * total - round(sim.in_flight_rollback_fraction * total)
        )
        < 1e-3
    )
    assert any("async saves" in c for c in sim.analytic_caveats)
    assert "pure compute" in sim.lost_definition
    sync = simulate(daly_plan(6.0), runs=300, seed=1)
    assert sync.analytic_caveats == []


# --- small contracts the statistical tests above do not pin (found by mutation testing, issue 18) -------------


class _AllCorrupt:  # a generator stand-in: every corruption draw says "corrupt for ever"
    def geometric(self, p, n):
        return np.full(n, 10**6)


def test_known_good_highest_is_the_highest_known_position_at_or_below_the_ceiling():
    from checkpoint_strategy.simulation.montecarlo import KnownGood

    kg = KnownGood(np.array([[0, 3, 6, -1], [0, 2, -1, -1]], dtype=np.int64))
    ids, a = np.arange(2), (lambda *v: np.array(v, dtype=np.int64))  # noqa: E731
    # the top (6) is above the ceiling 5: the row is scanned, padding (-1) and positions above c never count
    assert kg.highest(ids, a(5, 5)).tolist() == [3, 2]
    assert kg.highest(ids, a(6, 1)).tolist() == [6, 0]
    # among milestones only: none known at or below the ceiling is -1 (documented), not any other negative
    assert kg.highest(ids, a(5, 5), np.array([3, 4])).tolist() == [3, -1]
    assert kg.highest(ids, a(2, 5), np.array([3])).tolist() == [-1, -1]


def test_a_known_good_milestone_at_position_one_loads_again():
    s = _setup(keep_last=2, milestone_steps=(100,), corrupt_prob=0.5)  # milestone position 1
    a = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    known = np.array([[0, 1, 6]], dtype=np.int64)  # position 1 loaded before, then 6
    # a spike needs <= 4 with the window at 7..8: the milestone at position 1 loaded before, so it loads again
    t, src, skips = rollback(s, _AllCorrupt(), a(4), a(7), known)
    assert (t.tolist(), src.tolist(), skips.tolist()) == ([1], [1], [0])


def test_spike_rollback_adds_its_skips_to_the_runs_count():
    from checkpoint_strategy.simulation.montecarlo import KnownGood, _spike_rollback, _Tally

    s = _setup(keep_last=3, milestone_steps=(), corrupt_prob=0.5)
    tally = _Tally(2)
    tally.skips[:] = [3, 1]  # earlier failure rollbacks skipped corrupt checkpoints
    known = KnownGood.start(2)
    ids = np.arange(2)
    t = np.array([s.E_scalar(8) + 1.0] * 2)  # position 8 on storage: window 6..8
    rescue = np.array([7, 7], dtype=np.int64)
    target = _spike_rollback(
        s, _AllCorrupt(), known, tally, ids, t, np.zeros(2, dtype=np.int64), rescue
    )
    # 7 and 6 corrupt, nothing known in the window: step 0, two skips more for each run
    assert target.tolist() == [0, 0]
    assert tally.skips.tolist() == [5, 3]
    assert tally.sp_n.tolist() == [1, 1] and tally.sp_scratch.tolist() == [1, 1]


def test_setup_raises_a_persist_time_below_the_stall_to_the_stall():
    s = _setup(C=30.0, P=10.0)
    assert s.P == 30.0  # a checkpoint cannot be on storage before its save ends (P >= C)


def test_event_budget_error_names_the_events_and_the_advice():
    from checkpoint_strategy.errors import UsageError
    from checkpoint_strategy.simulation.montecarlo import run_monte_carlo

    with pytest.raises(
        UsageError, match=r"failures and spikes per run expected.*lower --spike-rate"
    ):
        run_monte_carlo(_setup(), runs=10, seed=0, expected_failures=1e6)


def test_async_caveat_without_an_exact_figure_when_saves_overlap():
    from checkpoint_strategy.simulation.montecarlo import analytic_caveats

    overlap = Setup(
        total_steps=1000,
        step_seconds=1.0,
        frequency=10,
        keep_last=2,
        milestone_steps=(),
        C=1.0,
        P=100.0,
        R=0.0,
        M=7200.0,
    )
    (caveat,) = analytic_caveats(overlap, 0.0, 0.0, in_flight=3)
    assert caveat.startswith("async saves") and "async_wall_hours" not in caveat
    assert analytic_caveats(overlap, 0.0, 0.0, in_flight=0) == []


def test_report_statistics_follow_their_definitions():
    report = plan(
        validate_arguments(
            dict(
                total_steps=2000,
                step_seconds=60.0,
                budget_gb=1e6,
                model_size_gb=100.0,
                write_gbps=1.0,
                mtbf_hours=20.0,
                frequency=50,
                max_loss_hours=100,
            )
        )
    )
    sim = simulate(report, runs=2001, seed=8)
    assert sim.async_wall_hours is not None and sim.wall_hours_stderr > 0
    # the z scores are (mean - expectation) / standard error (fields of the same report, 6 and 9 decimals)
    assert sim.async_z == pytest.approx(
        (sim.mean_wall_hours - sim.async_wall_hours) / sim.wall_hours_stderr, abs=0.01
    )
    assert sim.analytic_z == pytest.approx(
        (sim.mean_wall_hours - sim.analytic_wall_hours) / sim.wall_hours_stderr, abs=0.01
    )
    # lost = wall - compute for every run: the same order statistics, shifted by the compute
    for q in ("p50", "p95", "p99"):
        assert getattr(sim, f"{q}_lost_hours") == pytest.approx(
            getattr(sim, f"{q}_wall_hours") - sim.compute_hours, abs=2e-6
        ), q
    assert sim.spikes is None  # no --spike-rate: no spike statistics
    one = simulate(report, runs=1, seed=8)
    assert one.wall_hours_stderr == 0 and one.analytic_z is None  # one run has no standard error


def test_simulate_runs_ten_thousand_runs_by_default():
    report = plan(
        validate_arguments(
            dict(total_steps=100, step_seconds=1.0, budget_gb=1e6, mtbf_hours=1e6, frequency=50)
        )
    )
    assert simulate(report).runs == 10000  # docs/simulate.md: --runs, default 10 000
