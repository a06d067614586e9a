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

The failure rate too: the adapter counts the run's interruptions (each resume of the run, a preemption's
included: ``interruptions``) over its training time (``run_seconds``: steps x the plan's step seconds);
from MIN_INTERRUPTIONS on, when the measured MTBF departs from the plan's by more than 2x, the model is
re-solved for it (with the measured save cost when that departs too), once, the same way.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

from checkpoint_strategy.callbacks._log import PREFIX, log
from checkpoint_strategy.planning.failure import exact_interval
from checkpoint_strategy.planning.rounding import nice_steps

FIXED = ("frequency_option", "preset", "total_steps")
RATIO = 2.0
SAMPLES = 3
MIN_INTERRUPTIONS = 2   # fewer say nothing about a rate


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
        self.interruptions = 0
        self.run_seconds = 0.0

    def observe(self, seconds: float) -> Optional[int]:
        """One save's blocking time. The new interval when it changes (once a run), else None."""
        self.samples.append(float(seconds))
        if self.decided is not None or self.reason in FIXED or self.assumed <= 0:
            return None
        cost = statistics.median(self.samples[-SAMPLES:]) if len(self.samples) >= SAMPLES else None
        cost_off = cost is not None and not (self.assumed / RATIO <= cost <= self.assumed * RATIO)
        mtbf = self.run_seconds / self.interruptions if self.interruptions >= MIN_INTERRUPTIONS else None
        mtbf_off = mtbf is not None and not (self.mtbf_seconds / RATIO <= mtbf <= self.mtbf_seconds * RATIO)
        if not (cost_off or mtbf_off):
            return None
        use_cost = cost if cost_off and cost is not None else self.assumed
        use_mtbf = mtbf if mtbf_off and mtbf is not None else self.mtbf_seconds
        new = self.solve(use_cost, use_mtbf)
        self.decided = {"event": "checkpoint-strategy:interval", "old": self.frequency, "new": new,
                        "measured_save_seconds": round(cost, 4) if cost is not None else None,
                        "assumed_save_seconds": self.assumed, "interruptions": self.interruptions,
                        "measured_mtbf_hours": round(mtbf / 3600, 4) if mtbf is not None else None,
                        "assumed_mtbf_hours": self.mtbf_seconds / 3600}
        whys = []
        if cost_off and cost is not None:
            whys.append(f"saves block {cost:.3g} s (median of the last {SAMPLES}), "
                        f"{'more' if cost > self.assumed else 'less'} than the plan's {self.assumed:.3g} s by over {RATIO:g}x")
        if mtbf_off and mtbf is not None:
            whys.append(f"{self.interruptions} interruptions in {self.run_seconds / 3600:.3g} h of training: an MTBF of "
                        f"{mtbf / 3600:.3g} h against the plan's {self.mtbf_seconds / 3600:.3g} h")
        why = "; ".join(whys)
        self.decided["why"] = why
        if new == self.frequency:
            log.info(PREFIX + f"{why}; the plan's model keeps the interval at {new} steps"
                     + (" (the --max-loss-hours cap)" if self.cap is not None and new == self.cap else ""))
            return None
        log.info(PREFIX + f"interval {self.frequency} -> {new} steps from the next save: {why}; the plan's "
                 "failure model re-solved for the measured values" + (f", at most {self.cap} (--max-loss-hours)"
                                                                      if self.cap is not None else ""))
        self.frequency = new
        return new

    def solve(self, cost_seconds: float, mtbf_seconds: Optional[float] = None) -> int:
        """The plan's interval for a save cost (and MTBF): Daly's exact optimum, rounded, within the cap and the floor."""
        steps = nice_steps(exact_interval(cost_seconds, mtbf_seconds or self.mtbf_seconds) / self.step_seconds)
        if self.cap is not None:
            steps = min(steps, self.cap)
        return max(1, steps, min(self.floor, self.cap) if self.cap is not None else self.floor)
