"""The interval that follows the measured save cost (callbacks/adaptive.py): the plan's model re-solved once."""

from __future__ import annotations

import logging
import time

import pytest

from checkpoint_strategy.callbacks.adaptive import AdaptiveInterval
from checkpoint_strategy.planning.models import PlanArguments
from checkpoint_strategy.planning.planner import plan


def _plan(cost: float, **kw):
    args = dict(
        total_steps=2000,
        step_seconds=1.0,
        budget_gb=100,
        checkpoint_write_seconds=cost,
        mtbf_hours=0.05,
        min_interval_seconds=1.0,
        async_save=False,
        restart_seconds=1,
    )
    return plan(PlanArguments(**{**args, **kw}))


def test_within_2x_nothing_changes_beyond_it_the_model_decides_once(caplog):
    r = _plan(0.3)
    a = AdaptiveInterval(r, r.frequency_steps)
    assert r.frequency_steps == a.solve(0.3) == 10  # the plan's own choice, re-derived
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        assert [a.observe(x) for x in (0.2, 0.5, 0.55, 0.3)] == [None] * 4  # median within 2x
        slow = AdaptiveInterval(r, r.frequency_steps)
        got = [slow.observe(x) for x in (1.2, 1.3, 1.25, 5.0, 9.0)]
    assert got[:2] == [None, None] and got[2] == slow.solve(1.25) > 10 and got[3:] == [None, None]
    assert [r_.getMessage() for r_ in caplog.records] == [
        f"checkpoint-strategy: interval 10 -> {got[2]} steps from the next save: saves block 1.25 s (median of the "
        "last 3), more than the plan's 0.3 s by over 2x; the plan's failure model re-solved for the measured values, "
        f"at most {r.interval.max_loss_cap_steps} (--max-loss-hours)"
    ]
    fast = AdaptiveInterval(r, r.frequency_steps)
    assert (
        [fast.observe(x) for x in (0.01, 0.01, 0.01)][-1] == fast.solve(0.01) < 10
    )  # cheaper saves: more often


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
        cb, _ = callbackruns.hf_train(
            tmp_path,
            report,
            max_steps=80,
            handoff_dir=None,
            hooks={"after_save_hook": lambda path: time.sleep(1.0)},
        )
    d = cb.adaptive.decided
    assert (
        d is not None
        and d["old"] == 10
        and d["new"] == cb.adaptive.solve(d["measured_save_seconds"]) > 10
    )
    saves = [r.step for r in cb.core.records if not r.emergency]
    new = d["new"]  # from the next save on, the Trainer saves at the multiples of the new interval
    every = list(range((30 // new + 1) * new, 81, new))
    # (the Trainer also saves its last step when the interval does not divide it: a measured cost that gives 25)
    assert saves[:3] == [10, 20, 30] and saves[3:] in (every, every + [80] if 80 % new else every)
    assert (
        len(saves) > 3
        and len([r for r in caplog.records if "interval 10 ->" in r.getMessage()]) == 1
    )


def test_more_interruptions_than_the_plan_assumed_shorten_the_interval_once(caplog):
    r = _plan(0.3)  # the plan: an MTBF of 0.05 h (180 s)
    a = AdaptiveInterval(r, r.frequency_steps)
    a.interruptions, a.run_seconds = 1, 30.0
    assert a.observe(0.3) is None  # one interruption says nothing about a rate
    a.interruptions, a.run_seconds = 3, 90.0  # every 30 s: 6x the plan's rate
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        new = a.observe(0.3)
    assert new == a.solve(0.3, 30.0) < 10 and a.decided["interruptions"] == 3
    assert (
        a.decided["measured_mtbf_hours"] == round(30 / 3600, 4) and a.observe(0.3) is None
    )  # once
    lines = [x.getMessage() for x in caplog.records]
    assert (
        len(lines) == 1
        and "3 interruptions in 0.025 h of training" in lines[0]
        and f"10 -> {new}" in lines[0]
    )


def test_each_resume_is_an_interruption_counted_over_the_launches(tmp_path):
    """HFCheckpointStrategy at the start of a resumed run: one interruption record in the loss log (a preemption's
    when it resumes from the preemption save), counted with the earlier launches' records; a rollback's resume
    (train_with_recovery) is not one. The records reach the handoff state."""
    import json
    from types import SimpleNamespace

    pytest.importorskip("transformers")
    from checkpoint_strategy.callbacks import HFCheckpointStrategy
    from checkpoint_strategy.callbacks.core import METRICS_FILE
    from checkpoint_strategy.callbacks.preempt import RECORD_FILE

    (tmp_path / RECORD_FILE).write_text(
        json.dumps({"event": "checkpoint-strategy:preemption", "step": 40})
    )
    counts = []
    for step, rollback in ((20, False), (40, False), (50, True)):
        cb = HFCheckpointStrategy(
            _plan(0.3), handoff_dir=str(tmp_path / "state"), preemption_signals=()
        )
        cb.core.root = str(tmp_path)
        cb.rollback_resume = rollback
        cb._interrupted(SimpleNamespace(global_step=step))
        counts.append(cb.adaptive.interruptions)
    assert counts == [1, 2, 0]
    recs = [json.loads(x) for x in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [(r["kind"], r["at_step"], r["count"]) for r in recs] == [
        ("resume", 20, 1),
        ("preemption", 40, 2),
    ]
    cb = HFCheckpointStrategy(
        _plan(0.3), handoff_dir=str(tmp_path / "state"), preemption_signals=()
    )
    cb.core.root = str(tmp_path)
    cb._interrupted(SimpleNamespace(global_step=60))
    cb.core.write_handoff()
    doc = json.loads((tmp_path / "state" / "checkpoint-strategy.json").read_text())
    assert [(a["event"], a["count"]) for a in doc["automatic_actions"]] == [
        ("checkpoint-strategy:interruption", 3)
    ]


@pytest.mark.slow
def test_a_slowed_save_in_a_real_lightning_fit_lengthens_the_interval_once(tmp_path, caplog):
    """LightningCheckpointStrategy: each save sleeps 1 s against a plan assuming 0.3 s; after the third save the
    interval is re-solved once, ModelCheckpoint saves at the new multiples, one line, one record in the loss log."""
    pytest.importorskip("pytorch_lightning")
    import json

    import callbackruns

    from checkpoint_strategy.callbacks.core import METRICS_FILE

    ckpts = tmp_path / "ckpts"
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        cb, trainer, _m = callbackruns.lightning_train(
            ckpts,
            _plan(0.3),
            max_steps=80,
            handoff_dir=None,
            hooks={"after_save_hook": lambda path: time.sleep(1.0)},
        )
    d = cb.adaptive.decided
    assert (
        d is not None
        and d["old"] == 10
        and d["new"] == cb.adaptive.solve(d["measured_save_seconds"]) > 10
    )
    new = d["new"]
    saves = [r.step for r in cb.core.records if not r.emergency]
    assert (
        saves[:3] == [10, 20, 30]
        and saves[3:] == list(range((30 // new + 1) * new, 81, new))
        and len(saves) > 3
    )
    assert trainer.checkpoint_callback._every_n_train_steps == new == cb.core.frequency
    lines = [r.getMessage() for r in caplog.records if "interval 10 ->" in r.getMessage()]
    assert (
        len(lines) == 1
        and f"interval 10 -> {new} steps from the next save: saves block" in lines[0]
    )
    recs = [
        json.loads(x) for x in (ckpts / METRICS_FILE).read_text().splitlines() if '"event"' in x
    ]
    assert [(r["event"], r["old"], r["new"], r["at_step"]) for r in recs] == [
        ("checkpoint-strategy:interval", 10, new, 30)
    ]


def _guard_loop(
    out, guard, steps: int, save_sleep: float, seconds=None, first: int = 1
) -> list[int]:
    """A plain PyTorch loop (a tiny MLP, Adam) asking `guard` each step; its save (torch.save, then `save_sleep`
    seconds more) is reported with guard.saved(step, path[, seconds=]). The steps it saved at."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    saved = []
    for step in range(first, steps + 1):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(32, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).tanh())
        opt.zero_grad()
        loss.backward()
        opt.step()
        d = guard.step(step, float(loss.detach()))
        if d.action == "save":
            path = out / f"step-{step}.pt"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
            time.sleep(save_sleep)
            guard.saved(step, path, **({} if seconds is None else {"seconds": seconds}))
            saved.append(step)
    guard.close()
    return saved


@pytest.mark.slow
def test_the_guards_interval_follows_the_measured_save_cost_once(tmp_path, caplog):
    """TrainingGuard with a plan: a loop whose save blocks 1 s (measured from the save answer to saved) gets the
    re-solved interval from the fourth save on, one line, one record in the guard's loss log; a loop that reports
    saves of 0.01 s (saved(..., seconds=)) gets a shorter one; a guard given frequency_steps keeps it."""
    import json

    from checkpoint_strategy.callbacks.guard import TrainingGuard
    from checkpoint_strategy.formats.runlog import METRICS_FILE

    report = _plan(0.3)
    (tmp_path / "slow").mkdir()
    guard = TrainingGuard(tmp_path / "slow", policy=report)
    with caplog.at_level(logging.INFO, logger="checkpoint_strategy.callbacks"):
        saved = _guard_loop(tmp_path / "slow", guard, 80, 1.0)
    d = guard.adaptive.decided
    assert (
        d is not None
        and d["old"] == 10
        and d["new"] == guard.adaptive.solve(d["measured_save_seconds"]) > 10
    )
    new = d["new"]
    assert (
        saved[:3] == [10, 20, 30]
        and saved[3:] == list(range((30 // new + 1) * new, 81, new))
        and len(saved) > 3
    )
    assert len([r for r in caplog.records if "interval 10 ->" in r.getMessage()]) == 1
    recs = [
        json.loads(x)
        for x in (tmp_path / "slow" / METRICS_FILE).read_text().splitlines()
        if '"event"' in x
    ]
    assert [(r["event"], r["old"], r["new"], r["at_step"]) for r in recs] == [
        ("checkpoint-strategy:interval", 10, new, 30)
    ]
    assert [a["event"] for a in guard.actions] == ["checkpoint-strategy:interval"]

    (tmp_path / "fast").mkdir()
    fast = TrainingGuard(tmp_path / "fast", policy=report)
    saved = _guard_loop(tmp_path / "fast", fast, 40, 0.0, seconds=0.01)
    short = fast.adaptive.solve(0.01)
    assert short < 10 and fast.adaptive.decided["new"] == short
    assert saved[:3] == [10, 20, 30] and saved[3:] == list(
        range((30 // short + 1) * short, 41, short)
    )

    (tmp_path / "fixed").mkdir()
    fixed = TrainingGuard(tmp_path / "fixed", policy=report, frequency_steps=10)
    assert fixed.adaptive is None and _guard_loop(
        tmp_path / "fixed", fixed, 40, 0.0, seconds=5.0
    ) == [10, 20, 30, 40]


def test_a_guard_that_starts_past_step_1_counts_an_interruption_over_the_launches(tmp_path):
    """The loop resumed (its first step is past 1): one interruption record in the guard's loss log, counted over the
    launches (a preemption's when the loop resumes from the recorded preemption save); the measured MTBF then feeds
    the model like the save cost."""
    import json

    from checkpoint_strategy.callbacks.guard import TrainingGuard
    from checkpoint_strategy.callbacks.preempt import RECORD_FILE
    from checkpoint_strategy.formats.runlog import METRICS_FILE

    report = _plan(0.3)
    (tmp_path / RECORD_FILE).write_text(
        json.dumps({"event": "checkpoint-strategy:preemption", "step": 40})
    )
    counts = []
    for first in (21, 41):
        g = TrainingGuard(tmp_path, policy=report)
        g.step(first, 1.0)
        counts.append(g.adaptive.interruptions)
        g.close()
    assert counts == [1, 2]
    recs = [
        json.loads(x) for x in (tmp_path / METRICS_FILE).read_text().splitlines() if '"event"' in x
    ]
    assert [(r["kind"], r["at_step"], r["count"]) for r in recs] == [
        ("resume", 20, 1),
        ("preemption", 40, 2),
    ]
    fresh = TrainingGuard(tmp_path, policy=report)
    fresh.step(1, 1.0)
    assert fresh.adaptive.interruptions == 0 and fresh.close()["actions"] == []
