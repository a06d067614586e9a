"""simulate against exact values: a small run solved by value iteration over (position, checkpoints known to
load), with corruption drawn once per checkpoint file (a checkpoint that loaded once loads again until training
rewrites it)."""

from __future__ import annotations

import math

import numpy as np

from checkpoint_strategy.simulation.montecarlo import Setup, run_monte_carlo

STEP, M, R = (
    1800.0,
    3600.0,
    600.0,
)  # sync saves with no stall: checkpoint p is on storage at p x STEP
N, K, MILESTONES, Q = 6, 1, (2,), 0.5


def walk(c: int, lo: int, known: frozenset, remember: bool) -> dict[int, float]:
    """Where a rollback from ceiling c lands, with probabilities: the rolling window c..lo, then the
    milestones below it, then step 0; a position in `known` loads for sure, any other with 1 - Q."""
    out: dict[int, float] = {}
    reach = 1.0
    window = [p for p in range(c, max(lo, 1) - 1, -1)]
    rest = [] if lo <= 0 else [m for m in sorted(MILESTONES, reverse=True) if m <= min(c, lo - 1)]
    for p in window + rest:
        if p in known and remember:
            out[p] = out.get(p, 0.0) + reach
            return out
        out[p] = out.get(p, 0.0) + reach * (1 - Q)
        reach *= Q
    out[0] = out.get(0, 0.0) + reach
    return out


def exact_mean_wall(remember_all: bool) -> float:
    """Value iteration. remember_all=False is the old model: only the position last loaded is remembered."""
    restart = M * math.expm1(R / M)  # a restart of R seconds that starts again on a failure

    def key(pos, known):
        return (pos, known if remember_all else frozenset({pos}))

    V: dict = {}
    for _ in range(2000):
        delta = 0.0
        todo = [(0, frozenset({0}))] if not V else list(V)
        seen = set()
        while todo:
            pos, known = todo.pop()
            if (pos, known) in seen:
                continue
            seen.add((pos, known))
            end = (N - pos) * STEP
            value = end * math.exp(-end / M)
            for j in range(pos, N):
                a, b = (j - pos) * STEP, (j + 1 - pos) * STEP
                p_seg = math.exp(-a / M) - math.exp(-b / M)
                partial = (a + M) * math.exp(-a / M) - (b + M) * math.exp(-b / M)
                nxt = 0.0
                for t, pt in walk(j, j - K + 1, known, True).items():
                    new = key(t, frozenset({g for g in known if g <= t} | {t}))
                    nxt += pt * V.get(new, 0.0)
                    if new not in seen:
                        todo.append(new)
                value += partial + p_seg * (restart + nxt)
            delta = max(delta, abs(value - V.get((pos, known), 0.0)))
            V[(pos, known)] = value
        if delta < 1e-9:
            break
    return V[(0, frozenset({0}))] / 3600.0


def test_corruption_drawn_once_matches_value_iteration_within_three_standard_errors():
    setup = Setup(
        total_steps=N,
        step_seconds=STEP,
        frequency=1,
        keep_last=K,
        milestone_steps=MILESTONES,
        C=0.0,
        P=0.0,
        R=R,
        M=M,
        corrupt_prob=Q,
    )
    raw = run_monte_carlo(setup, runs=200_000, seed=2026, expected_failures=5.0)
    wall = raw.wall / 3600.0
    mean, se = float(wall.mean()), float(wall.std(ddof=1) / math.sqrt(wall.size))
    exact = exact_mean_wall(remember_all=True)
    forgetful = exact_mean_wall(remember_all=False)
    assert abs(mean - exact) <= 3 * se, (mean, exact, se)
    # the test can tell the models apart: remembering only the last checkpoint loaded is far outside
    assert abs(forgetful - exact) > 6 * se, (forgetful, exact, se)
    assert raw.corrupt_skips.mean() > 0.5


def test_a_milestone_that_loaded_loads_again():
    """Spike rollbacks below the newest loaded checkpoint reach a milestone that loaded before: it loads."""
    from checkpoint_strategy.simulation.montecarlo import push_known, rollback

    s = Setup(
        total_steps=1000,
        step_seconds=1.0,
        frequency=100,
        keep_last=2,
        milestone_steps=(300,),
        C=0.0,
        P=0.0,
        R=0.0,
        M=1e9,
        corrupt_prob=0.999999,
    )
    known = np.zeros((1, 1), dtype=np.int64)
    rng = np.random.default_rng(0)
    a = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    known = push_known(known, a(0), a(3))  # milestone 3 loaded once
    known = push_known(known, a(0), a(6))  # then position 6
    assert known[0].tolist()[:3] == [0, 3, 6]
    t, src, _ = rollback(
        s, rng, a(5), a(8), known
    )  # a spike needs <= 5, the window is 8..9: milestone 3
    assert (t.tolist(), src.tolist()) == ([3], [1])
    known = push_known(known, a(0), a(2))  # a rollback to 2 rewrites 3 and 6: forgotten
    assert [x for x in known[0].tolist() if x >= 0] == [0, 2]


import pytest  # noqa: E402

from checkpoint_strategy.simulation.montecarlo import in_flight_wall_seconds  # noqa: E402


@pytest.mark.parametrize(
    "N, f, C, P, Mh, R",
    [
        (
            2000,
            5,
            30.0,
            300.0,
            2.0,
            600.0,
        ),  # frequent failures, the newest save in flight most of the time
        (1003, 50, 10.0, 1500.0, 1.0, 120.0),  # a partial last segment, a long lag
        (400, 100, 5.0, 5000.0, 3.0, 300.0),  # four segments, lag near the compute between saves
        (230, 100, 5.0, 5000.0, 2.0, 300.0),  # the run ends before the second save is on storage
        (90, 100, 20.0, 200.0, 0.5, 60.0),  # one save only: nothing in flight can be lost
    ],
)
def test_async_in_flight_expectation_is_exact_within_three_standard_errors(N, f, C, P, Mh, R):
    setup = Setup(
        total_steps=N,
        step_seconds=60.0,
        frequency=f,
        keep_last=3,
        milestone_steps=(),
        C=C,
        P=P,
        R=R,
        M=Mh * 3600.0,
    )
    exact = in_flight_wall_seconds(setup)
    assert exact is not None
    raw = run_monte_carlo(setup, runs=40_000, seed=7, expected_failures=50.0)
    mean, se = float(raw.wall.mean()), float(raw.wall.std(ddof=1) / math.sqrt(raw.wall.size))
    assert abs(mean - exact) <= 3 * se, (mean, exact, se)


def test_in_flight_expectation_is_dalys_without_a_lag_and_none_when_saves_overlap():
    from checkpoint_strategy.planning import failure

    s = Setup(
        total_steps=1000,
        step_seconds=60.0,
        frequency=100,
        keep_last=2,
        milestone_steps=(),
        C=30.0,
        P=30.0,
        R=600.0,
        M=7200.0,
    )
    assert in_flight_wall_seconds(s) == pytest.approx(
        failure.expected_wall_time(60000.0, 6000.0, 30.0, 600.0, 7200.0)
    )
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
    assert in_flight_wall_seconds(overlap) is None


def test_tracking_memory_is_bounded_with_a_clear_error(monkeypatch):
    from checkpoint_strategy.errors import UsageError
    from checkpoint_strategy.simulation import montecarlo

    monkeypatch.setattr(montecarlo, "MAX_KNOWN_CELLS", 1000)
    setup = Setup(
        total_steps=200,
        step_seconds=60.0,
        frequency=1,
        keep_last=2,
        milestone_steps=(),
        C=0.0,
        P=0.0,
        R=60.0,
        M=600.0,
        corrupt_prob=0.1,
    )
    with pytest.raises(UsageError, match="too many rollbacks"):
        run_monte_carlo(setup, runs=500, seed=1, expected_failures=30.0)


def test_failure_rollbacks_consult_the_runs_own_known_good_checkpoints_closed_form():
    """Two saves (the second is the end), keep_last 1, no milestones: a failure in segment 2 rolls back to checkpoint
    1, which is corrupt with probability Q the first time it is needed (then nothing is left: step 0, one skip) and
    loads for sure once it has loaded. So every visit to segment 2 with checkpoint 1 untested ends in a skip with
    probability p q (p = 1 - e^(-T/M), a failure before the end), and the number of skips K per run is geometric:
    P(K = k) = (p q)^k (1 - p q). A failure rollback that forgot what loaded (or read another table) would redraw
    checkpoint 1 on every failure: P(skip before the end) = p q / (1 - p + p q), far above p q."""
    T, MTBF, q = 1800.0, 1800.0, 0.5
    setup = Setup(
        total_steps=2,
        step_seconds=T,
        frequency=1,
        keep_last=1,
        milestone_steps=(),
        C=0.0,
        P=0.0,
        R=300.0,
        M=MTBF,
        corrupt_prob=q,
    )
    runs = 40_000
    raw = run_monte_carlo(setup, runs=runs, seed=18, expected_failures=5.0)
    p = -math.expm1(-T / MTBF)
    r = p * q
    skips = np.asarray(raw.corrupt_skips)
    for k in range(3):
        expected = r**k * (1 - r)
        se = math.sqrt(expected * (1 - expected) / runs)
        assert abs(np.mean(skips == k) - expected) <= 4 * se, (k, np.mean(skips == k), expected, se)
    se_mean = math.sqrt(r / (1 - r) ** 2 / runs)  # variance of a geometric count: r / (1 - r)^2
    assert abs(skips.mean() - r / (1 - r)) <= 4 * se_mean
    # a skip here always means nothing loadable was left: the run restarted from step 0
    assert np.array_equal(np.asarray(raw.failure_scratch), skips > 0)
    forgetful = r / (1 - p + r)
    assert forgetful - r > 20 * math.sqrt(r * (1 - r) / runs)  # the test can tell the models apart
