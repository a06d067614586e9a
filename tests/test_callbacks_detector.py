"""The callbacks' online detector flags what `recover`'s batch detector flags (same rules)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from checkpoint_strategy.callbacks._detector import OnlineDetector
from checkpoint_strategy.recovery import detect


def _series(seed: int, n: int = 600):
    rng = random.Random(seed)
    base = [2.0 * math.exp(-i / 300) + 0.5 + rng.gauss(0, 0.02) for i in range(n)]
    spikes = []
    i = 60 + rng.randrange(40)
    while i < n - 30:
        height = rng.choice([1.5, 3.0, 8.0])
        length = rng.choice([1, 5, 20, 400])
        for j in range(i, min(n, i + length)):
            base[j] *= height * (1 - (j - i) / (length + 1)) + 1
        spikes.append(i)
        i += length + 40 + rng.randrange(80)
    return base


def _batch_flags(x, grad=False):
    """Indices the batch detector flags (the rules of detect.find_events, vectorised)."""
    x = np.asarray(x, dtype=np.float64)
    med, scale, wmax = detect.rolling_stats(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (x - med) / scale
        fin, have = np.isfinite(x), np.isfinite(med)
        if grad:
            return set(np.flatnonzero(have & fin & (z >= 7) & (x >= 2.5 * med) & (med > 0)).tolist())
        a = have & fin & (z >= 7) & ((x - med) >= 0.05 * np.abs(med))
        b = have & fin & (med > 0) & (x >= 2.5 * med) & (z >= 3)
        c = have & fin & (wmax > 0) & (x >= 10 * wmax)
        return set(np.flatnonzero(a | b | c | ~fin).tolist())


@pytest.mark.parametrize("seed", range(12))
def test_online_events_match_batch_events(seed):
    x = _series(seed)
    det = OnlineDetector(triggers=("loss_spike_detected",))
    flagged, saves = set(), []
    for i, v in enumerate(x):
        f = det.update(i, v)
        if f is not None:
            flagged.add(i)
            if f.save:
                saves.append(i)
    assert flagged == _batch_flags(x)
    events = detect.find_events(np.asarray(x))
    # one emergency save per batch event, at the event's first flagged value
    assert len(saves) == len(events)
    for s, ev in zip(saves, events):
        assert ev.onset <= s <= ev.peak
        assert ev.end is None or s < ev.end


@pytest.mark.parametrize("seed", range(4))
def test_grad_norm_flags_match(seed):
    rng = random.Random(100 + seed)
    g = [1.0 + rng.gauss(0, 0.1) for _ in range(400)]
    for i in (150, 300):
        g[i] = 30.0
    det = OnlineDetector(triggers=("gradient_norm_exceeded",))
    got = {i for i, v in enumerate(g) if (f := det.update(i, 1.0, v)) is not None and f.kind == "gradient_norm_exceeded"}
    assert got == _batch_flags(g, grad=True) == {150, 300}


def test_nan_loss_never_saves_and_blocks_the_event():
    x = [1.0 + 0.01 * (i % 3) for i in range(100)] + [float("nan")] * 5 + [50.0] * 5
    det = OnlineDetector()
    flags = [f for i, v in enumerate(x) if (f := det.update(i, v)) is not None]
    assert flags and flags[0].kind == "nonfinite" and flags[0].step == 100
    assert not any(f.save for f in flags)


def test_spike_then_recovery_allows_a_second_save():
    x = [1.0 + 0.01 * (i % 5) for i in range(300)]
    x[100] = x[101] = 10.0
    x[220] = 10.0
    det = OnlineDetector()
    saves = [i for i, v in enumerate(x) if (f := det.update(i, v)) is not None and f.save]
    assert saves == [100, 220]


@pytest.mark.parametrize("seed", range(6))
def test_online_baseline_equals_rolling_stats(seed):
    """The per-value median/scale/max equal detect.rolling_stats, NaN gaps and leading NaNs included."""
    from checkpoint_strategy.callbacks._detector import _Series

    rng = random.Random(seed)
    x = [1.0 + rng.gauss(0, 0.1) for _ in range(400)]
    for i in rng.sample(range(400), 20):
        x[i] = float("nan")
    if seed % 2:
        x[:40] = [float("nan")] * 40
    s = _Series(False, 128, 7, 2.5, 10, 0.05, 0.1)
    got = []
    for v in x:
        got.append(s.stats)
        s.add(v)
    med, scale, wmax = detect.rolling_stats(np.asarray(x))
    want = list(zip(med.tolist(), scale.tolist(), wmax.tolist()))
    first = next(i for i, v in enumerate(x) if v == v)
    # before the first finite value the batch baseline borrows it from the future; online it is unknown
    for i, (g, w) in list(enumerate(zip(got, want)))[first + 1:]:
        assert np.allclose(g, w, rtol=1e-12, atol=0, equal_nan=True), (i, g, w)
