"""Fuzz the detector, the advice and the online detector with hostile series: never an exception
other than UsageError, and the online detector never raises on finite steps."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from fuzzcheck import LOSS_CURVES, assert_events_in_order, reached, reaches_core
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery import OnlineDetector, advise
from checkpoint_strategy.recovery.advice import advise_series
from checkpoint_strategy.recovery.logs import build_series

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # no numpy warning reaches stderr

values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.0, -0.0, 1.0, 1e308, -1e308, 5e-324, math.nan, math.inf]),
)


@reaches_core()
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(st.lists(values, min_size=1, max_size=400), LOSS_CURVES.map(list)),
    st.integers(1, 60),
    st.booleans(),
)
# a NaN that came back and the never-trained rule (ends above the starting loss) share onset step 2: two detectors
@example([-1.0, 0.0, math.nan] + [0.0] * 11 + [-1.0, 0.0, 0.0, -1.0, -1.0, 0.0], 1, False)
def test_advice_never_crashes(loss, every, with_lr):
    """Garbage floats and real curves (tests/curves.py): a report whose numbers are all finite, or one UsageError."""
    steps = np.arange(1, len(loss) + 1) * every
    lr = np.linspace(1e-3, 0, len(loss)) if with_lr else None
    try:
        series = build_series(steps, loss, None, lr, lr_key="lr" if with_lr else None)
        r = advise_series(series, [(s, None) for s in steps[::7].tolist()])
    except UsageError:
        reached(False)
        return
    reached(True)
    assert_events_in_order(r.spikes)
    assert r.status in ("no_spike", "self_recovered", "wait", "rollback", "no_clean_checkpoint")
    assert r.verdict in ("healthy", "recovering", "diverged")
    if r.resume_checkpoint is not None:
        assert r.resume_checkpoint.step <= r.checkpoints.cutoff_step
    json.dumps(r.model_dump(mode="json"), allow_nan=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(st.lists(values, min_size=1, max_size=600), LOSS_CURVES.map(list)),
    st.lists(values, min_size=0, max_size=600),
)
def test_online_detector_never_crashes(loss, grad):
    """Events arrive in order: a new spike starts after the previous one was reported back (a collapse or level
    shift is another detector and may start inside a spike that "came back", as in the batch detector)."""
    det = OnlineDetector(window=16)
    onset = back = 0
    for i, v in enumerate(loss):
        ev = det.update(i + 1, v, grad[i] if i < len(grad) else None)
        if ev is None:
            continue
        assert ev.onset_step <= ev.step == i + 1
        if ev.kind == "grad_norm":
            continue
        if ev.kind in ("collapse", "level_shift"):
            continue
        assert ev.onset_step >= onset
        if ev.onset_step != onset:  # a new spike (or NaN)
            assert ev.onset_step > back
            onset = ev.onset_step
        if ev.kind == "recovered":
            back = ev.step


def test_booleans_are_not_numbers_in_documents(tmp_path):
    p = tmp_path / "trainer_state.json"
    p.write_text(
        json.dumps(
            {"log_history": [{"step": i, "loss": True if i == 5 else 1.0} for i in range(1, 50)]}
        )
    )
    try:
        advise(p, [])
    except UsageError as exc:
        assert "loss at entry 4 is true, not a number" in str(exc)
    else:
        raise AssertionError("a boolean loss was read as a number")


def test_online_spike_never_starts_inside_the_one_that_just_came_back():
    """Found by the fuzzer above (issue 18): on this slow climb a spike came back at step 106 and the next one was
    reported with its onset walked back to step 104, inside it; the batch detector had the same bug."""
    import curves

    det = OnlineDetector(window=16)
    back, starts = 0, []
    for i, v in enumerate(curves.sample(0, "slow_climb", 0.005, 150)):
        ev = det.update(i + 1, float(v))
        if ev is not None and ev.kind == "recovered":
            back = ev.step
        elif ev is not None and ev.kind == "spike":
            starts.append((back, ev.onset_step))
    assert starts and all(onset > back for back, onset in starts), starts
