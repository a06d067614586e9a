"""Spike detection on a generated suite of loss curves, and the playbook on synthetic logs.

Curves are 10 000 steps: a warm-up decay towards a floor, optional slow drift and plateaus with
LR-decay drops, Gaussian or AR(1) noise with a relative standard deviation of 0.5-10 %. Spikes have
several real-looking shapes (one-step outlier, sharp rise with fast or slow decay, a ramp, a
sustained divergence, NaN). The claim (docs/readme-recover.md): >= 95 % of spikes found, no false
alarm on spike-free curves, for noise up to 10 % of the loss.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery import detect_spikes
from checkpoint_strategy.recovery.advice import advise_series
from checkpoint_strategy.recovery.logs import build_series

N = 10_000
NOISES = (0.005, 0.02, 0.05, 0.10)
SHAPES = ("outlier", "fast_decay", "slow_decay", "ramp", "sustained", "nan")


def base_curve(rng: np.random.Generator, kind: str) -> np.ndarray:
    t = np.arange(N, dtype=np.float64)
    floor = rng.uniform(1.5, 3.5)
    curve = floor + rng.uniform(2, 8) * np.exp(-t / rng.uniform(100, 1500))
    if kind == "drift_down":
        curve -= rng.uniform(0.1, 0.5) * t / N
    elif kind == "drift_up":  # e.g. a data-mixture change: slow rise of up to 10 % over the run
        curve *= 1 + rng.uniform(0.02, 0.10) * t / N
    elif kind == "plateaus":  # step LR decay: the loss drops at a few points and plateaus
        for at in sorted(rng.choice(np.arange(2000, 9000), size=3, replace=False)):
            curve[at:] -= rng.uniform(0.05, 0.2) * floor
    elif kind == "warmup":  # loss flat, then falls fast once the LR warms up
        w = int(rng.integers(200, 800))
        curve = np.concatenate((np.full(w, curve[0]), curve[: N - w]))
    return curve


def noisy(rng: np.random.Generator, curve: np.ndarray, sigma: float, ar: bool) -> np.ndarray:
    eps = rng.standard_normal(N)
    if ar:  # AR(1), phi 0.5, same marginal standard deviation
        phi = 0.5
        out = np.empty(N)
        out[0] = eps[0]
        for i in range(1, N):
            out[i] = phi * out[i - 1] + math.sqrt(1 - phi * phi) * eps[i]
        eps = out
    return curve * (1 + sigma * eps)


def add_spike(rng: np.random.Generator, y: np.ndarray, curve: np.ndarray, sigma: float, shape: str):
    """Returns (curve with spike, onset index, last index of the rise)."""
    y = y.copy()
    at = int(rng.integers(1000, 9000))
    mag = rng.uniform(max(1.6, 1 + 12 * sigma), 8.0)  # peak / level
    if shape == "outlier":
        y[at] = curve[at] * mag
        return y, at, at
    if shape == "nan":
        y[at : at + int(rng.integers(1, 50))] = np.nan
        return y, at, at
    if shape == "sustained":
        y[at:] = y[at:] * mag
        return y, at, at
    if shape == "ramp":
        rise = int(rng.integers(3, 30))
        prof = np.concatenate((np.linspace(1 / rise, 1, rise), np.exp(-np.arange(N) / 300.0)))[
            : N - at
        ]
        y[at:] += curve[at] * (mag - 1) * prof
        return y, at, at + rise
    tau = rng.uniform(2, 15) if shape == "fast_decay" else rng.uniform(100, 2000)
    prof = np.exp(-np.arange(N - at) / tau)
    y[at:] += curve[at] * (mag - 1) * prof
    return y, at, at


def events(y: np.ndarray):
    return detect_spikes(np.arange(1, N + 1), y)


@pytest.mark.parametrize("sigma", NOISES)
def test_no_false_alarm_on_spike_free_curves(sigma):
    rng = np.random.default_rng(int(sigma * 1000))
    kinds = ("plain", "drift_down", "drift_up", "plateaus", "warmup")
    alarms = []
    for k in range(15):
        kind = kinds[k % len(kinds)]
        y = noisy(rng, base_curve(rng, kind), sigma, ar=k % 3 == 0)
        found = events(y)
        if found:
            alarms.append((kind, [(s.onset_step, s.peak_loss) for s in found]))
    assert alarms == []


def test_at_least_95_percent_of_spikes_found():
    rng = np.random.default_rng(2024)
    kinds = ("plain", "drift_down", "drift_up", "plateaus", "warmup")
    total = found = 0
    missed = []
    for sigma in NOISES:
        for shape in SHAPES:
            for k in range(10):
                curve = base_curve(rng, kinds[k % len(kinds)])
                y0 = noisy(rng, curve, sigma, ar=k % 4 == 0)
                y, onset, rise_end = add_spike(rng, y0, curve, sigma, shape)
                total += 1
                hits = [s for s in events(y) if onset + 1 - 5 <= s.onset_step <= rise_end + 1 + 5]
                if hits:
                    found += 1
                else:
                    missed.append((sigma, shape, onset))
    assert total == 240
    assert (
        missed == [] and found == total
    )  # docs/recovery.md: all 240 found (the >= 95 % claim, with margin)


def test_nan_is_critical_and_onset_is_the_first_nan():
    y = np.linspace(3, 2, 400)
    y[300] = np.nan
    spikes = detect_spikes(np.arange(400), y)
    assert len(spikes) == 1 and spikes[0].kind == "nonfinite"
    assert spikes[0].onset_step == 300 and spikes[0].peak_loss is None
    assert any("NaN" in rule for rule in spikes[0].detected_by)


def test_grad_norm_spike_without_loss_spike_is_reported():
    rng = np.random.default_rng(1)
    loss = 2 + 0.01 * rng.standard_normal(1000)
    gn = 1 + 0.05 * rng.standard_normal(1000)
    gn[600:603] = 20.0
    spikes = detect_spikes(np.arange(1000), loss, gn)
    assert [s.kind for s in spikes] == ["grad_norm"]
    assert spikes[0].onset_step == 600 and spikes[0].peak_grad_norm == 20.0


def _series(loss, steps=None, grad=None, lr=None):
    steps = np.arange(1, len(loss) + 1) if steps is None else steps
    return build_series(
        steps,
        loss,
        grad,
        lr,
        grad_norm_key="grad_norm" if grad is not None else None,
        lr_key="lr" if lr is not None else None,
    )


def _curve(n=2000, onset=1200, mag=4.0, tau=None, sigma=0.02, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    y = (2 + 3 * np.exp(-t / 300)) * (1 + sigma * rng.standard_normal(n))
    if onset is not None:
        prof = np.ones(n - onset) if tau is None else np.exp(-np.arange(n - onset) / tau)
        y[onset:] += y[onset] * (mag - 1) * prof
    return y


def test_self_recovered_spike_says_keep_training():
    y = _curve(tau=5.0)
    ckpts = [(s, f"/ck/checkpoint-{s}") for s in range(100, 2001, 100)]
    r = advise_series(_series(y), ckpts)
    assert r.status == "self_recovered" and r.self_recovered is True
    assert r.spike.onset_step == 1201 and r.spike.recovery_steps <= 100
    assert r.resume_checkpoint is None and r.skip_batches is None


def test_sustained_spike_resumes_before_onset_with_playbook_numbers():
    y = _curve()
    ckpts = [(s, f"/ck/checkpoint-{s}") for s in range(100, 2001, 100)]
    r = advise_series(_series(y), ckpts)
    assert r.status == "rollback" and r.self_recovered is False
    assert r.spike.onset_step == 1201
    assert r.resume_checkpoint.step == 1100 and r.resume_checkpoint.path == "/ck/checkpoint-1100"
    assert r.resume_checkpoint.within_tolerance is True
    assert r.skip_batches == [1101, 1221]
    assert (r.lr_multiplier, r.lr_reduced_steps, r.lr_reduced_until_step, r.grad_clip) == (
        0.5,
        500,
        1600,
        0.5,
    )
    assert (
        "checkpoint-1100" in r.overrides.hf_trainer
        and "max_grad_norm = 0.5" in r.overrides.hf_trainer
    )
    assert "gradient_clip_val=0.5" in r.overrides.lightning
    # a checkpoint saved one step before the onset already holds the spiked weights
    r2 = advise_series(_series(y), [(1100, None), (1199, None), (1200, None)])
    assert r2.resume_checkpoint.step == 1199
    r3 = advise_series(_series(y), [(1100, None), (1200, None)])
    assert r3.resume_checkpoint.step == 1100


def test_early_in_the_wait_window_says_wait_but_has_the_plan_ready():
    y = _curve(n=1230)
    r = advise_series(_series(y), [(1000, None), (1100, None)])
    assert r.status == "wait" and r.wait_until_step == 1301
    assert r.resume_checkpoint.step == 1100


def test_no_checkpoint_predates_the_spike():
    y = _curve()
    ckpts = [(s, f"/ck/step-{s}") for s in (1300, 1400, 1500)]
    r = advise_series(_series(y), ckpts, milestones=[(5000, "/cold/5000")])
    assert r.status == "no_clean_checkpoint" and r.resume_checkpoint is None
    assert "keep_last" in r.policy_advice
    assert r.nearest_milestone.step == 5000
    r2 = advise_series(_series(y), ckpts, milestones=[(1000, "/cold/1000")])
    assert r2.status == "rollback" and r2.resume_checkpoint.kind == "milestone"
    assert r2.resume_checkpoint.step == 1000


def test_resume_checkpoint_skips_ones_inside_an_earlier_spike():
    y = _curve(tau=None)
    y[700:760] *= 4  # an earlier spike that recovered after 60 steps (longer than its checkpoints)
    ckpts = [(s, None) for s in (600, 720, 1300)]
    r = advise_series(_series(y), ckpts)
    assert [s.kind for s in r.spikes] == ["spike", "level_shift"]  # a step to 4x that stays
    assert r.resume_checkpoint.step == 600


def test_restarts_latest_segment_wins_and_is_reported():
    y = _curve(n=1500, onset=None)
    steps = np.concatenate((np.arange(1, 1001), np.arange(801, 1501)))
    loss = np.concatenate((y[:1000] * 1.0, y[800:1500]))
    loss[900:1000] = 50.0  # the first segment spiked near its end; the restart replaced those steps
    s = _series(loss, steps)
    assert s.restarts == [
        {"step": 801, "previous_step": 1000, "repeated_steps": 200, "entry": 1000}
    ]
    assert list(s.steps) == list(range(1, 1501))
    r = advise_series(s, [])
    assert r.status == "no_spike" and len(r.restarts) == 1


def test_unsorted_steps_are_rejected():
    with pytest.raises(UsageError, match="out of order"):
        _series(np.ones(5), np.array([5, 4, 3, 2, 1]))


def test_logging_interval_sets_the_margin():
    y = np.repeat(_curve(n=400, onset=250), 1)
    steps = np.arange(1, 401) * 10  # logged every 10 steps; onset at step 2510
    r = advise_series(
        _series(y, steps), [(s, None) for s in range(500, 4001, 500)] + [(2490, None), (2500, None)]
    )
    assert r.spike.onset_step == 2510
    assert r.checkpoints.margin_steps == 11
    assert r.resume_checkpoint.step == 2490


# --------------------------------------------------------------------------- thresholds at their edge (issue 18)


def _alternating(d: float, peak: float, n: int = 1001, at: int = 600) -> np.ndarray:
    """1 +- d alternating (rolling median exactly 1, MAD exactly d), one outlier `peak` at index `at`."""
    y = 1.0 + d * np.where(np.arange(n) % 2, -1.0, 1.0)
    y[at] = peak
    return y


def _found(y: np.ndarray) -> list[int]:
    """Onsets from the API (RecoveryOptions defaults) and from the detector itself (its own defaults)."""
    from checkpoint_strategy.recovery import detect

    api = [s.onset_step - 1 for s in detect_spikes(np.arange(1, len(y) + 1), y)]
    core = [e.onset for e in detect.find_events(y)]
    assert api == core
    return api


@pytest.mark.parametrize("z, found", [(7.2, True), (6.8, False)])
def test_z_rule_edge_at_seven_robust_sigmas(z, found):
    d = 0.01
    y = _alternating(
        d, 1.0 + z * 1.4826 * d
    )  # z from the median/MAD of the pattern, 10 % rise (below 2.5x)
    assert (_found(y) == [600]) is found and (found or _found(y) == [])


@pytest.mark.parametrize("ratio, found", [(2.55, True), (2.45, False)])
def test_ratio_rule_edge_at_two_and_a_half_medians(ratio, found):
    d = 0.2  # noisy: robust z of the outlier is (ratio - 1) / (1.4826 x 0.2) ~ 5.2, under the z rule's 7
    assert 3 <= (ratio - 1) / (1.4826 * d) < 7
    y = _alternating(d, ratio)
    assert (_found(y) == [600]) is found and (found or _found(y) == [])


def test_one_step_outliers_of_eleven_to_forty_percent_are_all_found():
    """200 one-step outliers of 11-40 % on a 1.3 % noise floor (robust z about 8.5 and up): every one is found."""
    rng = np.random.default_rng(18)
    missed = []
    for _ in range(200):
        y = 2.0 * (1 + 0.013 * rng.standard_normal(1500))
        rise = rng.uniform(0.11, 0.40)
        y[1000] = 2.0 * (1 + rise)
        if 1000 not in _found(y):
            missed.append(round(rise, 3))
    assert missed == []


def test_spikes_are_sorted_and_disjoint_on_a_plateau_with_repeated_outliers():
    """Issue 18: a small rise at step 600 followed by outliers every 20 steps made 36 'spikes' all starting at
    600; each event now starts after the previous one came back."""
    t = np.arange(1200)
    y = 1.0 + 0.001 * np.sin(t)
    y[600:] += np.where(t[600:] % 20 == 0, 3.0, 0.07)
    spikes = detect_spikes(t, y)
    assert spikes
    for a, b in zip(spikes, spikes[1:], strict=False):
        assert a.recovered_step is not None and a.recovered_step < b.onset_step


# --- edges found by mutation testing (issue 18): each curve is built so the right answer is known by hand ---------


def _flat(seed: int, n: int = 1000, level: float = 2.0, noise: float = 0.02) -> np.ndarray:
    return level + noise * np.random.default_rng(seed).standard_normal(n)


def _analyse(x, grad=None):
    from checkpoint_strategy.recovery.detect import analyse
    from checkpoint_strategy.recovery.settings import RecoveryOptions

    return analyse(np.arange(1, len(x) + 1), x, grad, RecoveryOptions())


def test_a_spikes_peak_is_inside_the_spike_not_in_a_later_one():
    from checkpoint_strategy.recovery.detect import find_events

    x = _flat(0, 1500)
    x[600:603] = 6.0
    x[1000:1003] = 12.0  # a later, bigger spike
    first, second = find_events(x)
    assert (first.onset, first.end is not None) == (600, True) and 600 <= first.peak <= 602
    assert second.onset == 1000 and 1000 <= second.peak <= 1002


def test_never_trained_onset_is_where_the_loss_left_the_start_and_peak_is_the_maximum():
    x = _flat(0, 600, level=3.0, noise=0.03)
    x[:4] = (
        2.0  # the untrained model's loss for four steps, then up for good (before any rolling history)
    )
    (ev,) = _analyse(x).events
    assert ev.kind == "divergence" and ev.end is None and "started from" in ev.rules[0]
    assert ev.onset == 4  # the first value above the start by more than the tolerance
    assert ev.peak == 4 + int(np.argmax(x[4:]))


def test_grad_norm_spike_just_before_the_loss_onset_is_its_precursor():
    x, g = _flat(1), _flat(2, level=1.0)
    x[600:603] = 6.0
    g[597] = 10.0  # three logged values before the loss onset
    (ev,) = _analyse(x, g).events
    assert (ev.kind, ev.onset, ev.precursor) == ("spike", 600, 597)


def test_collapse_that_comes_back_ends_at_the_first_value_off_the_pinned_one():
    x = _flat(3)
    x[400:450] = 0.0
    (ev,) = _analyse(x).events
    assert (ev.kind, ev.onset, ev.end) == ("collapse", 400, 450)


def test_rule_labels_name_the_thresholds_in_force():
    from checkpoint_strategy.recovery.detect import find_events

    x = _flat(4)
    x[600] = 4.0
    (ev,) = find_events(x, ratio_threshold=1.8)
    assert any("1.8x rolling median" in r for r in ev.rules), ev.rules


def test_spike_in_the_last_few_values_is_recovering_inside_the_minimum_wait():
    x = _flat(5)
    x[-6:] = 8.0 + 0.1 * np.random.default_rng(6).standard_normal(6)
    a = _analyse(x)
    assert [e.onset for e in a.events] == [
        994
    ] and a.verdict == "recovering"  # 6 steps < min_wait_steps 50


def test_projected_excess_follows_the_exponential_decay_seen_since_the_onset():
    """A spike decaying exactly as 4 e^(-0.05 (t - onset)) over a level of 1: the projection to a later step is the
    same exponential, from the centre of the last 5-value median (2 values before the end)."""
    from types import SimpleNamespace

    from checkpoint_strategy.recovery.advice import _projected_excess

    onset, n = 500, 40
    steps = np.arange(onset, onset + n)
    series = SimpleNamespace(steps=steps, loss=1.0 + 4.0 * np.exp(-0.05 * (steps - onset)))
    until = onset + 100
    got = _projected_excess(series, 0, 1.0, until)
    assert got == pytest.approx(4.0 * math.exp(-0.05 * (until - onset - 2)), rel=1e-9)
    assert got < 4.0 * math.exp(-0.05 * (n - 3))  # smaller than the excess now: it decays


def test_spike_reports_its_robust_z_score():
    x = _flat(7)
    x[600] = 4.0
    (spike,) = detect_spikes(np.arange(1, len(x) + 1), x)
    from checkpoint_strategy.recovery.detect import rolling_stats

    med, scale, _ = rolling_stats(x)
    assert spike.z_score == pytest.approx((4.0 - med[600]) / scale[600], abs=0.01)


def test_walk_back_reaches_the_first_value_and_at_most_window_values():
    from checkpoint_strategy.recovery.detect import walk_back

    high = np.full(12, 5.0)
    # an elevated stretch from the very first value: the onset walks back to index 0
    assert walk_back(high, 3, 1.0, 0.1, 0.1, window=10) == 0
    # a longer stretch: exactly `window` values back from the first flag, no further
    assert walk_back(high, 10, 1.0, 0.1, 0.1, window=4) == 6
    # the walk stops at the first value not above rolling median + 3 noise units (1.3), and at a NaN
    xv = np.array([1.0, 1.3, 1.31, 5.0, 5.0])
    assert walk_back(xv, 4, 1.0, 0.1, 0.1, window=10) == 2
    assert walk_back(np.array([5.0, np.nan, 5.0, 5.0]), 3, 1.0, 0.1, 0.1, window=10) == 2
    # the cap (the healthy level + 2 x tolerance inside a blow-up) lowers the bar
    assert walk_back(np.array([1.0, 1.2, 1.25, 5.0]), 3, 1.0, 0.1, 0.1, window=10, cap=1.1) == 1
