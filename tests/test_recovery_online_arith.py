"""The online detector's per-step arithmetic in plain floats (recovery/online.py `_Rolling._close`, `_median`,
`_low_quantile`; detect.spike_flags_one) gives the doubles numpy's version gives, value by value: the batch
`recover` and the callbacks must keep naming the same onsets."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.recovery import detect, online

FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, 1e308]),
    st.floats(min_value=0.5, max_value=5.0),
)
RULES = dict(z_threshold=6.0, ratio_threshold=2.0, max_ratio=3.0, min_rise=0.2)


def _numpy_close(cur: list[float], stats: list[tuple], medians: list[float], decimals: int):
    """The block close as numpy computed it before (the reference)."""
    arr = np.asarray(cur, dtype=np.float64)
    if np.isnan(arr).all():
        arr = np.full(len(arr), math.nan)
    else:
        first = arr[np.isfinite(arr)][0]
        arr = np.where(np.isfinite(arr), arr, first)
    with np.errstate(invalid="ignore"):
        m = float(np.median(arr))
        stats = stats + [(m, float(np.median(np.abs(arr - m))), float(arr.max()))]
        medians = (medians + [m])[
            -detect.REFERENCE_BLOCKS :
        ]  # the detector's deque keeps the last ones
        meds, mads, maxs = (np.array([s[i] for s in stats]) for i in range(3))
        med = float(np.nanmedian(meds)) if np.isfinite(meds).any() else math.nan
        scale = max(
            1.4826 * float(np.nanmedian(mads)) if np.isfinite(mads).any() else math.nan,
            1e-4 * abs(med) + 1e-12,
            detect.quantum_of(decimals),
        )
        wmax = float(np.nanmax(maxs)) if np.isfinite(maxs).any() else math.nan
    return stats, medians, (med, scale, wmax, detect.low_quantile(medians))


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.one_of(st.floats(min_value=-1e6, max_value=1e6), st.just(math.nan)),
        min_size=40,
        max_size=400,
    ),
    st.sampled_from([16, 32, 64, 200]),
)
@example([math.nan] * 20 + [1.0, 2.0, 3.0, 4.0] * 10, 16)
@example([2.0, 2.0, 2.0, 3.0] * 30, 32)
def test_rolling_figures_are_numpys(values, window):
    r = online._Rolling(window)
    for x in values:
        r.push(x)
    # replay with the reference, block by block (push's rule: a non-finite value repeats the last finite one)
    b = detect.block_size(window)
    vals = [x if math.isfinite(x) else math.nan for x in values]
    last, cur = math.nan, []
    ref_stats, ref_medians, figures = [], [], None
    for x in vals:
        v = x if math.isfinite(x) else last
        last = v if math.isfinite(v) else last
        cur.append(v if math.isfinite(v) else math.nan)
        if len(cur) == b:
            ref_stats, ref_medians, figs = _numpy_close(
                cur, ref_stats[-(r.k - 1) :], ref_medians, r.decimals
            )
            if len(ref_medians) >= 2:
                figures = figs
            cur = []
    got = list(r.stats)
    assert len(got) == len(ref_stats[-r.k :]) and all(
        all(_same(x, y) for x, y in zip(g, e, strict=True))
        for g, e in zip(got, ref_stats[-r.k :], strict=True)
    ), (got, ref_stats)
    if figures is not None:
        assert all(
            _same(x, y) for x, y in zip((r.med, r.scale, r.wmax, r.ref), figures, strict=True)
        ), ((r.med, r.scale, r.wmax, r.ref), figures)


@settings(max_examples=300, deadline=None)
@given(FLOATS, FLOATS, FLOATS, FLOATS, st.booleans())
@example(1.0, 0.5, 0.0, 0.4, False)  # a zero scale: numpy gives inf, plain division would raise
@example(0.5, 0.5, -0.0, 0.4, False)  # 0 / -0.0: NaN
@example(math.inf, 1.0, 0.1, 1.0, False)
@example(2.0, math.nan, 0.1, 1.0, True)
def test_one_values_spike_rules_are_the_arrays(x, med, scale, wmax, grad):
    want = detect.spike_flags(x, med, scale, wmax, grad=grad, **RULES)
    got = detect.spike_flags_one(x, med, scale, wmax, grad=grad, **RULES)
    assert tuple(bool(v) for v in want) == got and all(type(v) is bool for v in got)
