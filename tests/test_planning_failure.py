"""planning/failure.py: Young 1974, Daly 2006 eq. 37 and the exact optimum of Daly's T(tau)."""

import math

import mpmath
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
        assert failure.expected_wall_time(1.0, float(tau[0]), C, restart, mtbf) == pytest.approx(
            wall[0], rel=1e-12
        )


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


# --- Lambert W against independent oracles (mpmath's lambertw at 50 digits, known values, w e^w = z) ---

KNOWN_W = [
    (0.0, 0.0),
    (math.e, 1.0),
    (1.0, 0.5671432904097838),
    (-1 / math.e, -1.0),
    (2 * math.exp(2), 2.0),
    (-math.exp(-0.5) / 2, -0.5),
]


@pytest.mark.parametrize("z, w", KNOWN_W)
def test_lambert_w0_known_values(z, w):
    """W(0) = 0, W(e) = 1, W(1) = omega (the omega constant), W(-1/e) = -1, W(2 e^2) = 2, W(-e^-1/2 / 2) = -1/2."""
    assert failure.lambert_w0(z) == pytest.approx(w, rel=1e-15, abs=1e-15)


ZS = (
    [-1 / math.e + 10 ** (-k / 4) for k in range(64, 4, -1)]
    + [
        -0.35,
        -0.33,
        -0.321,
        -0.3201,
        -0.32,
        -0.3199,
        -0.2,
        -1e-9,
        1e-9,
        0.5,
        2.9,
        2.99,
        3.0,
        3.01,
        5.0,
        50.0,
    ]
    + [10.0**k for k in range(2, 301, 7)]
    + [1e300, 1e305]
)


def test_lambert_w0_matches_a_50_digit_oracle_over_the_range():
    """Within a few ulps of the backward error everywhere. Near the branch point W is ill-conditioned
    (d(w e^w)/dw = e^w (1 + w) -> 0), so the bound there is the forward error a correctly-rounded z allows:
    2 ulp / (e^-1 (1 + w)); away from it, 1e-15 relative."""
    mpmath.mp.dps = 50
    for z in ZS:
        exact = mpmath.lambertw(mpmath.mpf(z)).real
        bound = 2 * 2.3e-16 * math.e / float(1 + exact) * (1 + abs(float(exact))) + 1e-15 * (
            1 + abs(float(exact))
        )
        w = failure.lambert_w0(z)
        assert abs(w - float(exact)) <= bound, (z, w, float(exact))
        if z > -0.36:  # away from the branch point w e^w is well conditioned
            assert w * math.exp(w) == pytest.approx(z, rel=1e-12, abs=1e-15)


def test_lambert_w0_below_the_branch_point_says_why():
    for z in (-0.5, math.nextafter(-1 / math.e, -1.0)):
        with pytest.raises(ValueError) as err:
            failure.lambert_w0(z)
        assert str(err.value) == "lambert_w0 is real only for z >= -1/e"
    assert (
        failure.lambert_w0(math.nextafter(-1 / math.e, 0.0)) > -1.0
    )  # the branch point itself is accepted


def test_exact_interval_without_save_cost_is_zero():
    assert failure.exact_interval(0.0, 1000.0) == 0.0
    assert failure.exact_interval(0.0, 1e7) == 0.0


@pytest.mark.parametrize("W", [1.0, 2.0, 3600.0, 1e6])
def test_expected_wall_time_is_daly_formula(W):
    """T = M e^(R/M) (e^((tau+C)/M) - 1) W / tau (docs/model.md), and W (tau + C) / tau without failures."""
    tau, C, R, M = 1800.0, 60.0, 600.0, 20 * HOUR
    assert failure.expected_wall_time(W, tau, C, R, M) == pytest.approx(
        M * math.exp(R / M) * (math.exp((tau + C) / M) - 1) * W / tau, rel=1e-12
    )
    assert failure.expected_wall_time(W, tau, C, R, math.inf) == pytest.approx(
        W * (tau + C) / tau, rel=1e-15
    )


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_expected_wall_time_needs_a_positive_interval(tau):
    with pytest.raises(ValueError) as err:
        failure.expected_wall_time(1.0, tau, 5.0, 600.0, 1000.0)
    assert str(err.value) == "tau must be positive"


def test_expected_failures_is_wall_time_over_mtbf():
    assert failure.expected_failures(100.0, 50.0) == 2.0
    assert failure.expected_failures(100.0, math.inf) == 0.0
