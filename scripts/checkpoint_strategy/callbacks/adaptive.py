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

Shared by the adapters (hf.py, lightning.py, guard.py): ``for_settings`` (the adapter's AdaptiveInterval, or None),
``measured`` (one save's blocking time; under many processes the slowest rank's, so every rank decides the same
interval and the ranks keep saving together), ``interruption`` (the record of a resumed launch, counted over the
launches from the earlier records).
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
MIN_INTERRUPTIONS = 2  # fewer say nothing about a rate


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

    def measured(self, seconds: float, step: int, ranks: Any = None) -> Optional[int]:
        """One save's blocking time at `step` (training time so far: step x the plan's step seconds). Under many
        processes the slowest rank's (one all_reduce, every rank calls it at the same save), so the decision is
        the same on every rank. The new interval when it changes, else None."""
        if ranks is not None and ranks.multi:
            out = ranks.reduce([float(seconds)], "a save's blocking time", "max")
            seconds = out[0] if out else seconds
        self.run_seconds = int(step) * self.step_seconds
        return self.observe(seconds)

    def record(self, step: int) -> dict:
        """The decision's record (for the loss log and the handoff state)."""
        return {**(self.decided or {}), "at_step": int(step)}

    def observe(self, seconds: float) -> Optional[int]:
        """One save's blocking time. The new interval when it changes (once a run), else None."""
        self.samples.append(float(seconds))
        if self.decided is not None or self.reason in FIXED or self.assumed <= 0:
            return None
        cost = statistics.median(self.samples[-SAMPLES:]) if len(self.samples) >= SAMPLES else None
        cost_off = cost is not None and not (self.assumed / RATIO <= cost <= self.assumed * RATIO)
        mtbf = (
            self.run_seconds / self.interruptions
            if self.interruptions >= MIN_INTERRUPTIONS
            else None
        )
        mtbf_off = mtbf is not None and not (
            self.mtbf_seconds / RATIO <= mtbf <= self.mtbf_seconds * RATIO
        )
        if not (cost_off or mtbf_off):
            return None
        use_cost = cost if cost_off and cost is not None else self.assumed
        use_mtbf = mtbf if mtbf_off and mtbf is not None else self.mtbf_seconds
        new = self.solve(use_cost, use_mtbf)
        self.decided = {
            "event": "checkpoint-strategy:interval",
            "old": self.frequency,
            "new": new,
            "measured_save_seconds": round(cost, 4) if cost is not None else None,
            "assumed_save_seconds": self.assumed,
            "interruptions": self.interruptions,
            "measured_mtbf_hours": round(mtbf / 3600, 4) if mtbf is not None else None,
            "assumed_mtbf_hours": self.mtbf_seconds / 3600,
        }
        why = self._why(cost if cost_off else None, mtbf if mtbf_off else None)
        self.decided["why"] = why
        return self._apply(new, why)

    def _why(self, cost: Optional[float], mtbf: Optional[float]) -> str:
        """Why the model was re-solved: the measured save cost and / or MTBF that departed from the plan's."""
        whys = []
        if cost is not None:
            whys.append(
                f"saves block {cost:.3g} s (median of the last {SAMPLES}), "
                f"{'more' if cost > self.assumed else 'less'} than the plan's {self.assumed:.3g} s by over {RATIO:g}x"
            )
        if mtbf is not None:
            whys.append(
                f"{self.interruptions} interruptions in {self.run_seconds / 3600:.3g} h of training: an MTBF of "
                f"{mtbf / 3600:.3g} h against the plan's {self.mtbf_seconds / 3600:.3g} h"
            )
        return "; ".join(whys)

    def _apply(self, new: int, why: str) -> Optional[int]:
        """The re-solved interval logged once: the new frequency when it changes, else None (the interval kept)."""
        if new == self.frequency:
            log.info(
                PREFIX
                + f"{why}; the plan's model keeps the interval at {new} steps"
                + (
                    " (the --max-loss-hours cap)"
                    if self.cap is not None and new == self.cap
                    else ""
                )
            )
            return None
        log.info(
            PREFIX
            + f"interval {self.frequency} -> {new} steps from the next save: {why}; the plan's "
            "failure model re-solved for the measured values"
            + (f", at most {self.cap} (--max-loss-hours)" if self.cap is not None else "")
        )
        self.frequency = new
        return new

    def solve(self, cost_seconds: float, mtbf_seconds: Optional[float] = None) -> int:
        """The plan's interval for a save cost (and MTBF): Daly's exact optimum, rounded, within the cap and the floor."""
        steps = nice_steps(
            exact_interval(cost_seconds, mtbf_seconds or self.mtbf_seconds) / self.step_seconds
        )
        if self.cap is not None:
            steps = min(steps, self.cap)
        return max(1, steps, min(self.floor, self.cap) if self.cap is not None else self.floor)


def for_settings(settings: Any, frequency: int, enabled: bool = True) -> Optional[AdaptiveInterval]:
    """The adaptive interval of a policy that came from a plan (``settings.report``), else None."""
    report = getattr(settings, "report", None)
    return AdaptiveInterval(report, frequency) if enabled and report is not None else None


def interruption(
    root: Optional[str],
    step: int,
    previous: list[dict],
    ranks: Any = None,
    adaptive: Optional[AdaptiveInterval] = None,
) -> dict:
    """A launch that resumed at `step`: its record (``checkpoint-strategy:interruption``; kind preemption when it
    resumes from the preemption save recorded under `root`), its count over the run's launches from `previous`
    (the earlier launches' records), logged as one line (rank 0). Under many processes rank 0's count (one
    broadcast). Sets ``adaptive.interruptions``."""
    from checkpoint_strategy.callbacks.preempt import read_record

    n = (
        max(
            [len(previous)]
            + [int(r.get("count") or 0) for r in previous if isinstance(r.get("count"), int)]
        )
        + 1
    )
    pre = read_record(root) if root else None
    kind = "preemption" if pre is not None and pre.get("step") == int(step) else "resume"
    zero = ranks is None or not ranks.multi or ranks.rank == 0
    if ranks is not None and ranks.multi:
        out = ranks.broadcast(
            [float(n), float(kind == "preemption")], "the run's interruption count"
        )
        if out:
            n, kind = int(out[0]), "preemption" if out[1] else "resume"
    line = f"resumed at step {int(step)} ({kind}): interruption {n} of this run"
    if zero:
        log.info(PREFIX + line)
    if adaptive is not None:
        adaptive.interruptions = n
    return {
        "event": "checkpoint-strategy:interruption",
        "kind": kind,
        "at_step": int(step),
        "count": n,
        "message": line,
    }
