"""Generated loss curves for the detector's sweeps: clean ones of every healthy shape, and ones with
each kind of trouble (the kind a correct detector must name)."""

from __future__ import annotations

import numpy as np

N = 4000
CLEAN = ("gaussian", "heavy_tailed", "warmup", "lr_decay_steps", "epoch_boundaries")
TROUBLE = {  # generator -> the kind `recover` must name for the first unrecovered event
    "divergence": "divergence",
    "level_shift": "level_shift",
    "slow_climb": "divergence",
    "nan": "nonfinite",
    "collapse": "collapse",
}


def healthy(rng: np.random.Generator, shape: str, sigma: float, n: int = N) -> np.ndarray:
    t = np.arange(n, dtype=np.float64)
    floor = rng.uniform(1.5, 3.5)
    curve = floor + rng.uniform(2, 8) * np.exp(-t / rng.uniform(100, 800))
    if shape == "warmup":  # flat while the LR warms up, then the usual fall
        w = int(rng.integers(100, 400))
        curve = np.concatenate((np.full(w, curve[0]), curve[: n - w]))
    elif shape == "lr_decay_steps":  # step LR decay: the loss drops and plateaus
        for at in sorted(rng.choice(np.arange(800, n - 200), size=3, replace=False)):
            curve[at:] -= rng.uniform(0.05, 0.15) * floor
    elif (
        shape == "epoch_boundaries"
    ):  # a drop at each epoch (seen data), a one-batch blip at the boundary
        epoch = int(rng.integers(500, 1000))
        for at in range(epoch, n, epoch):
            curve[at:] *= 1 - rng.uniform(0.03, 0.10)
    if shape == "heavy_tailed":
        eps = rng.standard_t(3, size=n) / np.sqrt(3.0)
    else:
        eps = rng.standard_normal(n)
    y = curve * (1 + sigma * eps)
    if shape == "epoch_boundaries":
        for at in range(epoch, n, epoch):
            y[at] *= rng.uniform(1.5, 2.5)
    return y


def troubled(
    rng: np.random.Generator, kind: str, sigma: float, n: int = N
) -> tuple[np.ndarray, int]:
    """(curve, onset index) with one kind of trouble starting between 40% and 75% of the run."""
    y = healthy(rng, "gaussian", sigma, n)
    at = int(rng.integers(int(0.4 * n), int(0.75 * n)))
    level = float(np.median(y[at - 50 : at]))
    k = np.arange(n - at, dtype=np.float64)
    if kind == "divergence":  # blows up, comes partly down, stays 1.3-3x above
        peak = rng.uniform(4, 10)
        stay = rng.uniform(1.3, min(3.0, peak / 2))
        rise = int(rng.integers(1, 15))
        prof = np.where(
            k < rise,
            (k + 1) / rise * (peak - 1),
            (stay - 1) + (peak - stay) * np.exp(-(k - rise) / rng.uniform(10, 80)),
        )
        y[at:] += level * prof * (1 + sigma * rng.standard_normal(n - at))
    elif kind == "level_shift":  # a step to a higher plateau, no spike above it
        y[at:] *= rng.uniform(1.25, 2.0)
    elif kind == "slow_climb":  # after an LR restart: creeps up by 40-150% over the rest of the run
        y[at:] *= 1 + rng.uniform(0.4, 1.5) * k / (n - at)
    elif kind == "nan":
        y[at : at + int(rng.integers(1, 60))] = np.nan
        if rng.random() < 0.5:
            y[at:] = np.nan
    elif kind == "collapse":
        pinned = 0.0 if rng.random() < 0.5 else round(float(rng.uniform(5, 11)), 4)
        blow = int(rng.integers(0, 6))
        y[at : at + blow] = level * rng.uniform(3, 20)
        y[at + blow :] = pinned
    else:
        raise ValueError(kind)
    return y, at


def sample(seed: int, kind: str | None, sigma: float, n: int, spikes: int = 0) -> np.ndarray:
    """One real-looking loss curve for the fuzzers: healthy (gaussian or heavy-tailed noise) or with one kind of
    trouble from TROUBLE, plus `spikes` one-step outliers of 1.5-6x that come straight back."""
    rng = np.random.default_rng(seed)
    if kind is None:
        y = healthy(rng, "heavy_tailed" if seed % 3 == 0 else "gaussian", sigma, n)
    else:
        y, _ = troubled(rng, kind, sigma, n)
    for at in rng.integers(n // 4, n, size=spikes):
        if np.isfinite(y[at]):
            y[at] *= rng.uniform(1.5, 6.0)
    return y
