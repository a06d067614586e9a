"""planning/failure.py: Young 1974, Daly 2006 eq. 37 and the exact optimum of Daly's T(tau)."""

import math

import numpy as np
import pytest

from checkpoint_strategy.planning import failure

MIN = 60.0
HOUR = 3600.0


@pytest.mark.parametrize(
    "mtbf, eq37_min, exact_min",
    [(24 * HOUR, 116.69, 116.69), (6 * HOUR, 56.71, 56.71), (15 * MIN, 9.14, 9.17)],
)
def test_daly_published_vectors(mtbf, eq37_min, exact_min):
    C, R = 5 * MIN, 10 * MIN
    assert failure.daly_interval(C, mtbf) / MIN == pytest.approx(eq37_min, abs=0.005)
    assert failure.exact_interval(C, mtbf) / MIN == pytest.approx(exact_min, abs=0.005)
    # R does not move the optimum in Daly's model: T(tau) = M e^(R/M) (e^((tau+C)/M) - 1) W / tau only scales
    # with R. Checked on a dense grid here, from the formula (docs/model.md), with R and without it.
    tau = np.linspace(0.2, 5.0, 400_001) * failure.exact_interval(C, mtbf)
    for restart in (R, 0.0, 6 * R):
        wall = mtbf * math.exp(restart / mtbf) * np.expm1((tau + C) / mtbf) / tau
        assert tau[np.argmin(wall)] == pytest.approx(exact_min * MIN, abs=0.005 * MIN)
        assert failure.expected_wall_time(1.0, float(tau[0]), C, restart, mtbf) == pytest.approx(wall[0], rel=1e-12)


def test_young_is_sqrt_2cm():
    assert failure.young_interval(300, 86400) == pytest.approx(math.sqrt(2 * 300 * 86400))


def test_daly_eq37_saturates_at_m_when_c_at_least_2m():
    assert failure.daly_interval(100.0, 50.0) == 50.0


@pytest.mark.parametrize("C, M", [(5, 1000), (300, 900), (30, 86400), (1, 10**7), (3000, 4000)])
def test_exact_interval_is_the_minimum_of_daly_wall_time(C, M):
    R = 600
    tau = failure.exact_interval(C, M)
    t_opt = failure.expected_wall_time(1.0, tau, C, R, M)
    for factor in (0.9, 0.99, 1.01, 1.1):
        assert failure.expected_wall_time(1.0, tau * factor, C, R, M) > t_opt


@pytest.mark.parametrize("z", [-1 / math.e + 1e-12, -0.3, -0.1, 0.0, 0.5, 1.0, 10.0, 1e6])
def test_lambert_w0_inverts_w_exp_w(z):
    w = failure.lambert_w0(z)
    assert w * math.exp(w) == pytest.approx(z, rel=1e-9, abs=1e-9)
    assert w >= -1.0


def test_lambert_w0_rejects_below_branch_point():
    with pytest.raises(ValueError):
        failure.lambert_w0(-0.5)


def test_overhead_without_failures_is_checkpoint_cost_only():
    assert failure.overhead_fraction(100.0, 5.0, 600.0, math.inf) == pytest.approx(0.05)


def test_overhead_grows_with_failure_rate():
    few = failure.overhead_fraction(3600, 30, 600, 1000 * HOUR)
    many = failure.overhead_fraction(3600, 30, 600, 10 * HOUR)
    assert many > few > 30 / 3600
