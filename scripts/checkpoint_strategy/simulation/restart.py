"""The event loop's shared pieces: the restart phase (a failure during a restart starts it again) and the
iteration budget. A leaf: the single-tier (montecarlo.py) and the two-tier (twotier.py) simulations both use it."""

from __future__ import annotations

import math

from checkpoint_strategy.errors import UsageError

# Work limit that keeps a bad combination of arguments from running for hours (montecarlo.py has the others).
MAX_EVENTS_PER_RUN = 20000


def event_budget(expected_events: float, what: str, advice: str) -> int:
    """Iterations the event loop may take: refuses (UsageError) a run expecting more events than the simulation
    handles. `what` names the events ("failures and spikes"), `advice` the options that lower them."""
    if not math.isfinite(expected_events) or expected_events > MAX_EVENTS_PER_RUN:
        raise UsageError(
            f"about {expected_events:.3g} {what} per run expected: the simulation "
            f"handles at most {MAX_EVENTS_PER_RUN}; {advice}"
        )
    return int(100 * (expected_events + 1) + 10000)


def restart_phase(X, need, R: float, wall, fails):
    """Runs that need a restart spend R seconds on it; a failure during it (X < R) starts it again. Adds to
    wall and fails in place; returns (X left after the restart, the runs still restarting)."""
    import numpy as np

    rf = need & (X < R)
    restarted = need & ~rf
    wall += np.where(rf, X, 0.0) + np.where(restarted, R, 0.0)
    fails += rf
    return np.where(restarted, X - R, X), rf
