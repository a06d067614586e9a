"""Nice rounding: numbers on the 1, 2, 2.5, 5 x 10^k grid the planner and the two-tier plan use
(intervals, milestones, divisors). A leaf: planner.py and tiers.py both import it."""

from __future__ import annotations

import math

_NICE = (1, 2, 2.5, 5)


def nice_steps(x: float) -> int:
    """Round to the nearest 1, 2, 2.5 or 5 x 10^k (in log space), at least 1 step."""
    if x <= 1:
        return 1
    best, best_err = 1, float("inf")
    k = int(math.floor(math.log10(x)))
    for exp in (k - 1, k, k + 1):
        for m in _NICE:
            v = m * 10**exp
            if v < 1 or not float(v).is_integer():
                continue
            err = abs(math.log(v / x))
            if err < best_err:
                best, best_err = int(v), err
    return best


def nice_ceil(x: float) -> int:
    """The smallest 1, 2, 2.5 or 5 x 10^k that is >= x (at least 1): a floor raised to the grid the optimum
    and the seed milestones use, so milestones stay multiples of the interval."""
    if x <= 1:
        return 1
    k = int(math.floor(math.log10(x)))
    for exp in (k - 1, k, k + 1):
        for m in _NICE:
            v = m * 10**exp
            if float(v).is_integer() and v >= x:
                return int(v)
    return math.ceil(x)


def nice_floor(x: float) -> int:
    """The largest 1, 2, 2.5 or 5 x 10^k that is <= x (at least 1)."""
    if x < 1:
        return 1
    k = int(math.floor(math.log10(x)))
    best = 1
    for exp in (k - 1, k):
        for m in _NICE:
            v = m * 10**exp
            if float(v).is_integer() and best < v <= x:
                best = int(v)
    return best
