"""An interval that follows the measured save cost (CheckFreq, FAST'21): the plan's model, re-solved once.

The plan chose its interval from an assumed save cost C (``failure_model.checkpoint_write_seconds``,
the seconds a save stalls training). The callback measures each save's blocking time (from the step end
that asks for the save to the end of ``on_save``, its inline validation included). When the median of
the last three measurements departs from C by more than 2x (either way), the interval is recomputed with
the planner's own model: the exact optimum of Daly's expected time (planning/failure.exact_interval) for
the measured C and the plan's job MTBF, in the plan's step seconds, rounded as the plan rounds
(planning/rounding.nice_steps), then bounded by the plan's max-loss cap (``--max-loss-hours``) and its
minimum interval. It is applied from the next save and logged once (``old -> new`` and why). A plan whose
interval was fixed by the user (``--frequency``), a preset or the run length is left alone.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

from checkpoint_strategy.callbacks._log import PREFIX, log

FIXED = ("frequency_option", "preset", "total_steps")
RATIO = 2.0
SAMPLES = 3


class AdaptiveInterval:
    """``observe(seconds) -> new frequency | None``; see the module docstring."""

    def __init__(self, report: Any, frequency: int) -> None:
        fm = report.failure_model
        self.assumed = float(fm.checkpoint_write_seconds)
        self.mtbf_seconds = float(fm.mtbf_hours) * 3600.0
        self.step_seconds = float(report.step_seconds)
        self.cap: Optional[int] = report.interval.max_loss_cap_steps
        self.floor = int(report.interval.min_interval_steps)
        self.reason = report.interval.reason
        self.frequency = int(frequency)
        self.samples: list[float] = []
        self.decided: Optional[dict] = None

    def observe(self, seconds: float) -> Optional[int]:
        """One save's blocking time. The new interval when it changes (once a run), else None."""
        self.samples.append(float(seconds))
        if self.decided is not None or self.reason in FIXED or len(self.samples) < SAMPLES or self.assumed <= 0:
            return None
        measured = statistics.median(self.samples[-SAMPLES:])
        if self.assumed / RATIO <= measured <= self.assumed * RATIO:
            return None
        new = self.solve(measured)
        direction = "more" if measured > self.assumed else "less"
        self.decided = {"event": "checkpoint-strategy:interval", "old": self.frequency, "new": new,
                        "measured_save_seconds": round(measured, 4), "assumed_save_seconds": self.assumed}
        why = (f"saves block {measured:.3g} s (median of the last {SAMPLES}), {direction} than the plan's "
               f"{self.assumed:.3g} s by over {RATIO:g}x")
        if new == self.frequency:
            log.info(PREFIX + f"{why}; the plan's model keeps the interval at {new} steps"
                     + (" (the --max-loss-hours cap)" if self.cap is not None and new == self.cap else ""))
            return None
        log.info(PREFIX + f"interval {self.frequency} -> {new} steps from the next save: {why}; the plan's "
                 "failure model re-solved for the measured cost" + (f", at most {self.cap} (--max-loss-hours)"
                                                                     if self.cap is not None else ""))
        self.frequency = new
        return new

    def solve(self, cost_seconds: float) -> int:
        """The plan's interval for a save cost: Daly's exact optimum, rounded, within the cap and the floor."""
        from checkpoint_strategy.planning.failure import exact_interval
        from checkpoint_strategy.planning.rounding import nice_steps

        steps = nice_steps(exact_interval(cost_seconds, self.mtbf_seconds) / self.step_seconds)
        if self.cap is not None:
            steps = min(steps, self.cap)
        return max(1, steps, min(self.floor, self.cap) if self.cap is not None else self.floor)
