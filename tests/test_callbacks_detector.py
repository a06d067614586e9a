"""The callbacks' detector adapter over recovery.online: one save per event, never on NaN."""

from __future__ import annotations

import math
import random

import pytest

from checkpoint_strategy.callbacks._detector import OnlineDetector


def _flat(n, seed=0):
    rng = random.Random(seed)
    return [1.0 + rng.gauss(0, 0.01) for _ in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_one_save_per_spike_and_again_after_recovery(seed):
    x = _flat(400, seed)
    x[150] = x[151] = 10.0
    x[300] = 10.0
    det = OnlineDetector()
    saves = [i for i, v in enumerate(x) if (f := det.update(i, v)) is not None and f.save]
    assert saves == [150, 300]


def test_persistent_spike_saves_once():
    x = _flat(200) + [8.0 + 0.01 * i for i in range(100)]
    det = OnlineDetector(triggers=("loss_spike_detected",))
    saves = [i for i, v in enumerate(x) if (f := det.update(i, v)) is not None and f.save]
    assert saves == [200]


def test_nan_loss_never_saves():
    x = _flat(100) + [math.nan] * 5 + [50.0] * 5
    det = OnlineDetector()
    flags = [f for i, v in enumerate(x) if (f := det.update(i, v)) is not None]
    assert flags and flags[0].kind == "nonfinite" and not any(f.save for f in flags)


def test_trigger_not_in_policy_saves_nothing():
    x = _flat(300)
    x[150] = 10.0
    det = OnlineDetector(triggers=("gradient_norm_exceeded",))
    flags = [f for i, v in enumerate(x) if (f := det.update(i, v)) is not None]
    assert flags and flags[0].kind == "loss_spike_detected" and not any(f.save for f in flags)
