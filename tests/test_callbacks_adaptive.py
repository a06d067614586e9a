"""The interval that follows the measured save cost (callbacks/adaptive.py): the plan's model re-solved once."""

from __future__ import annotations

import logging
import time

import pytest

from checkpoint_strategy.callbacks.adaptive import AdaptiveInterval
from checkpoint_strategy.planning.models import PlanArguments
from checkpoint_strategy.planning.planner import plan


def _plan(cost: float, **kw):
    args = dict(total_steps=2000, step_seconds=1.0, budget_gb=100, checkpoint_write_seconds=cost, mtbf_hours=0.05,
                min_interval_seconds=1.0, async_save=False, restart_seconds=1)
    return plan(PlanArguments(**{**args, **kw}))


def test_within_2x_nothing_changes_beyond_it_the_model_decides_once(caplog):
    r = _plan(0.3)
    a = AdaptiveInterval(r, r.frequency_steps)
    assert r.frequency_steps == a.solve(0.3) == 10                 # the plan's own choice, re-derived
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        assert [a.observe(x) for x in (0.2, 0.5, 0.55, 0.3)] == [None] * 4   # median within 2x
        slow = AdaptiveInterval(r, r.frequency_steps)
        got = [slow.observe(x) for x in (1.2, 1.3, 1.25, 5.0, 9.0)]
    assert got[:2] == [None, None] and got[2] == slow.solve(1.25) > 10 and got[3:] == [None, None]
    assert [r_.getMessage() for r_ in caplog.records] == [
        f"checkpoint-strategy: interval 10 -> {got[2]} steps from the next save: saves block 1.25 s (median of the "
        "last 3), more than the plan's 0.3 s by over 2x; the plan's failure model re-solved for the measured cost, "
        f"at most {r.interval.max_loss_cap_steps} (--max-loss-hours)"]
    fast = AdaptiveInterval(r, r.frequency_steps)
    assert [fast.observe(x) for x in (0.01, 0.01, 0.01)][-1] == fast.solve(0.01) < 10   # cheaper saves: more often


def test_the_max_loss_cap_bounds_it_and_a_fixed_frequency_is_left_alone():
    capped = _plan(0.3, max_loss_hours=15 / 3600)
    a = AdaptiveInterval(capped, capped.frequency_steps)
    assert a.cap is not None and max(a.solve(c) for c in (5.0, 50.0)) <= a.cap
    fixed = _plan(0.3, frequency=10)
    f = AdaptiveInterval(fixed, 10)
    assert [f.observe(9.0) for _ in range(4)] == [None] * 4 and f.decided is None


def test_a_slowed_save_in_a_real_trainer_lengthens_the_interval_once(tmp_path, caplog):
    pytest.importorskip("transformers")
    import callbackruns

    report = _plan(0.3)
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        cb, _ = callbackruns.hf_train(tmp_path, report, max_steps=80, handoff_dir=None,
                                      hooks={"after_save_hook": lambda path: time.sleep(1.0)})
    d = cb.adaptive.decided
    assert d is not None and d["old"] == 10 and d["new"] == cb.adaptive.solve(d["measured_save_seconds"]) > 10
    saves = [r.step for r in cb.core.records if not r.emergency]
    new = d["new"]   # from the next save on, the Trainer saves at the multiples of the new interval
    assert saves[:3] == [10, 20, 30] and saves[3:] == list(range((30 // new + 1) * new, 81, new))
    assert len(saves) > 3 and len([r for r in caplog.records if "interval 10 ->" in r.getMessage()]) == 1
