"""Optimal checkpoint interval under exponential failures: pure functions, seconds throughout.

Sources
- Young, J. W. (1974). "A first order approximation to the optimum checkpoint interval."
  Communications of the ACM 17(9): tau = sqrt(2 C M).
- Daly, J. T. (2006). "A higher order estimate of the optimum checkpoint interval for restart
  dumps." Future Generation Computer Systems 22(3): the expected wall time (eq. 13/20)
      T(tau) = M e^(R/M) (e^((tau + C)/M) - 1) W / tau
  and its higher-order estimate (eq. 37)
      tau = sqrt(2 C M) [1 + 1/3 sqrt(C/2M) + 1/9 (C/2M)] - C   for C < 2M, else M.
  Test vectors (C = 5 min, R = 10 min): M = 24 h -> 116.69 min, M = 6 h -> 56.71 min,
  M = 15 min -> 9.14 min (eq. 37) and 9.17 min (exact optimum).
Symbols: C checkpoint cost (time training is stalled per save), R restart cost, M job MTBF,
W solve time (pure compute) of the whole run, tau compute time between checkpoints.
"""

from __future__ import annotations

import math


def young_interval(C: float, M: float) -> float:
    """Young 1974: tau = sqrt(2 C M)."""
    return math.sqrt(2.0 * C * M)


def daly_interval(C: float, M: float) -> float:
    """Daly 2006, eq. 37 (higher-order estimate)."""
    if C >= 2.0 * M:
        return M
    x = C / (2.0 * M)
    return math.sqrt(2.0 * C * M) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - C


def lambert_w0(z: float) -> float:
    """Principal branch of Lambert W for z >= -1/e (Halley's iteration)."""
    if z < -1.0 / math.e:
        raise ValueError("lambert_w0 is real only for z >= -1/e")
    if z == 0.0:
        return 0.0
    if z < -0.32:  # near the branch point: series in p = sqrt(2(e z + 1))
        p = math.sqrt(max(0.0, 2.0 * (math.e * z + 1.0)))
        w = -1.0 + p - p * p / 3.0 + 11.0 / 72.0 * p**3
    else:
        w = math.log1p(z) if z < 3 else math.log(z) - math.log(math.log(z))
    for _ in range(64):
        ew = math.exp(w)
        f = w * ew - z
        wp1 = w + 1.0
        if wp1 == 0.0:
            break
        denom = ew * wp1 - (w + 2.0) * f / (2.0 * wp1)
        step = f / denom
        w -= step
        if abs(step) <= 1e-15 * (1.0 + abs(w)):
            break
    return w


def exact_interval(C: float, M: float) -> float:
    """The exact minimiser of Daly's T(tau).

    dT/dtau = 0  <=>  e^((tau + C)/M) (1 - tau/M) = 1, whose root in (0, M) is
        tau = M (1 + W0(-e^(-(1 + C/M)))).
    """
    if C <= 0:
        return 0.0
    return M * (1.0 + lambert_w0(-math.exp(-(1.0 + C / M))))


def expected_wall_time(W: float, tau: float, C: float, R: float, M: float) -> float:
    """Daly's expected wall time of a run with W seconds of compute (M = inf: no failures).

    Uses the segment form: W/tau full segments of (tau + C) plus, to be exact for short runs,
    nothing else (the model treats the run as W/tau equal segments, as Daly does).
    """
    if tau <= 0:
        raise ValueError("tau must be positive")
    if math.isinf(M):
        return W * (tau + C) / tau
    return M * math.exp(R / M) * math.expm1((tau + C) / M) * W / tau


def overhead_fraction(tau: float, C: float, R: float, M: float) -> float:
    """Expected wall time over pure compute time, minus one: time lost to saves, rework, restarts."""
    return expected_wall_time(1.0, tau, C, R, M) - 1.0


def expected_failures(wall_time: float, M: float) -> float:
    return 0.0 if math.isinf(M) else wall_time / M
