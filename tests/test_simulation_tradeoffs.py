"""`tradeoffs`: the Pareto front by hand, the sweep against the planner, formats, the plot, bad input."""

from __future__ import annotations

import json
import math
import os
import sys
import xml.etree.ElementTree as ET

import jsonschema
import numpy as np
import pytest
from fuzzcheck import MUTATE, flatten, mutate, reached, reaches_core
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.planning.options import validate_arguments
from checkpoint_strategy.planning.planner import plan
from checkpoint_strategy.resources import load_schema
from checkpoint_strategy.simulation.sweep import (
    default_frequencies,
    pareto_front,
    spike_window_rescue_probability,
    tradeoffs,
)

SEED = ["tradeoffs", "100000", "2.5", "500", "--model_size_gb", "4"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_pareto_front_by_hand():
    # (storage GB, expected lost h) both lower-is-better
    pts = [
        (100, 5.0),  # A: front (least storage)
        (200, 2.0),  # B: front
        (300, 1.0),  # C: front (least loss)
        (250, 2.0),  # D: dominated by B (more storage, same loss)
        (300, 3.0),  # E: dominated by B and C
        (100, 6.0),  # F: dominated by A (same storage, more loss)
        (200, 2.0),  # G: equal to B: neither dominates, both stay
    ]
    assert pareto_front(pts, [False, False]) == [True, True, True, False, False, False, True]


def test_pareto_front_with_a_maximised_objective():
    # (storage lower, rescue probability higher)
    pts = [(10, 0.5), (20, 1.0), (30, 1.0), (10, 0.2), (5, 0.0)]
    assert pareto_front(pts, [False, True]) == [True, True, False, False, True]
    assert pareto_front([], [False]) == []
    assert pareto_front([(1, 1)], [False, True]) == [True]


@pytest.mark.parametrize(
    "f, k, expected",
    [
        (
            1000,
            1,
            0.8,
        ),  # H = 200 = 0.2 f: one save back reaches it unless a save fell in the 200 steps
        (1000, 2, 1.0),
        (100, 2, 0.0),  # H = 2 f exactly: needs 3 in the window
        (100, 3, 1.0),
        (150, 2, 2 / 3),  # H = 1.33 f: two in the window suffice unless a second save fell inside
        (150, 1, 0.0),
        (200, 2, 1.0),
        (50, 4, 0.0),
        (50, 5, 1.0),
    ],
)
def test_spike_window_rescue_probability_by_hand(f, k, expected):
    assert spike_window_rescue_probability(f, k, 100, 100) == pytest.approx(expected)


def test_every_point_is_the_planner_with_that_frequency_and_keep_last():
    pargs = validate_arguments(
        {"total_steps": 100000, "step_seconds": 2.5, "budget_gb": 500, "model_size_gb": 4}
    )
    report = tradeoffs(pargs, spike_rate=0.01)
    base = plan(pargs)
    assert report.recommended_frequency_steps == base.frequency_steps
    assert report.recommended_keep_last == base.keep_last
    assert sum(p.recommended for p in report.points) == 1
    assert len(report.keep_last_values) >= 10 and len(report.frequencies) >= 30
    assert len(report.points) == len(report.frequencies) * len(report.keep_last_values)
    for p in report.points[::17]:
        ref = plan(
            pargs.model_copy(update={"frequency": p.frequency_steps, "keep_last": p.keep_last})
        )
        assert p.peak_storage_gb == ref.total_storage_gb
        assert p.fits_budget == ref.fits_budget
        assert p.max_data_loss_hours == ref.max_data_loss_hours
        assert p.expected_overhead_fraction == ref.expected_overhead_fraction
        assert p.rollback_horizon_steps == ref.rollback_horizon_steps
        assert p.rollback_horizon_hours == pytest.approx(
            ref.rollback_horizon_steps * 2.5 / 3600, abs=1e-6
        )
    # the front agrees with a brute-force recomputation
    vecs = [
        (
            p.peak_storage_gb,
            p.expected_lost_hours,
            p.max_data_loss_hours,
            -p.spike_window_rescue_probability,
        )
        for p in report.points
    ]
    for i, p in enumerate(report.points):
        dominated = any(
            all(o <= s for o, s in zip(other, vecs[i], strict=True)) and other != vecs[i]
            for other in vecs
        )
        assert p.pareto == (not dominated)
    assert report.pareto_count == sum(p.pareto for p in report.points)


def test_small_sweep_front_is_the_expected_points():
    pargs = validate_arguments(
        {
            "total_steps": 10000,
            "step_seconds": 1.0,
            "budget_gb": 1000,
            "model_size_gb": 1,
            "milestones": "none",
            "formats": ["full_state_dict"],
            "mtbf_hours": 10,
            "checkpoint_write_seconds": 10,
        }
    )
    report = tradeoffs(pargs, frequencies=[100, 200, 1000], keep_lasts=[1, 2, 3])
    by = {(p.frequency_steps, p.keep_last): p for p in report.points}
    # storage is (keep_last + 1) x 3 GB, whatever the frequency
    assert by[(100, 1)].peak_storage_gb == 6 and by[(1000, 3)].peak_storage_gb == 12
    # at 100 steps a spike needs 3 in the window: keep 1 and 2 rescue only spikes near the start (step 0 is a
    # rollback point: 2.98% with keep 2, counted exactly over onsets), keep 3 all; each buys rescue with storage
    r = {k: by[(100, k)].spike_window_rescue_probability for k in (1, 2, 3)}
    assert r[1] < 0.001 and 0.02 < r[2] < 0.04 and r[3] == 1.0
    assert by[(100, 1)].pareto and by[(100, 2)].pareto and by[(100, 3)].pareto
    # at 200 steps keep 2 already rescues every spike: keep 3 only costs storage
    assert by[(200, 2)].pareto and not by[(200, 3)].pareto
    assert not by[(1000, 3)].pareto and by[(1000, 2)].pareto


def test_default_frequencies_span_the_optimum_and_include_the_recommendation():
    fs = default_frequencies(1000, 2939.0, 100000)
    assert 1000 in fs and fs == sorted(set(fs))
    assert fs[0] <= 100 and fs[-1] >= 29000
    assert len(fs) >= 30
    assert default_frequencies(7, 3.0, 10) == sorted(set(default_frequencies(7, 3.0, 10)))
    assert max(default_frequencies(7, 3.0, 10)) <= 10


def test_json_validates_and_text_marks_front_and_recommendation(cli_run):
    rc, out, err = cli_run(*(SEED + ["--format", "json"]))
    assert rc == 0 and err == ""
    data = json.loads(out)
    jsonschema.validate(data, load_schema("tradeoffs-report.schema.json"))
    assert data["plot"] is None and data["spike_rate_per_1000_steps"] is None
    assert all(p["spike_run_rescue_probability"] is None for p in data["points"])
    rc, text, _ = cli_run(*SEED)
    assert rc == 0
    assert "=== Checkpoint Storage vs Safety Tradeoffs ===" in text
    rows = [line for line in text.splitlines() if line[:2] in ("P ", " R", "PR")]
    assert len(rows) == data["pareto_count"] + (0 if data["recommended_on_front"] else 1)
    assert any(line[:2] in (" R", "PR") and " 1000 " in line for line in rows)
    rc, every, _ = cli_run(*(SEED + ["--all"]))
    assert sum(
        1
        for line in every.splitlines()
        if line[:2] in ("P ", " R", "PR", "  ") and line[2:8].strip().isdigit()
    ) == len(data["points"])


def test_spikes_add_the_run_rescue_column(cli_run):
    rc, out, _ = cli_run(*(SEED + ["--spike-rate", "0.05", "--format", "json"]))
    data = json.loads(out)
    assert data["spike_rate_per_1000_steps"] == 0.05
    p = next(p for p in data["points"] if p["keep_last"] == 1 and p["frequency_steps"] == 1000)
    # about 0.8 (a spike needs 200 of the 1000 steps back); exactly, early onsets are rescued by step 0
    w = p["spike_window_rescue_probability"]
    assert w == pytest.approx(0.8, abs=0.01)
    assert p["spike_run_rescue_probability"] == pytest.approx(math.exp(-5 * (1 - w)), abs=1e-6)
    rc, md, _ = cli_run(*(SEED + ["--spike-rate", "0.05", "--format", "markdown"]))
    assert (
        rc == 0
        and md.startswith("## Checkpoint storage vs safety tradeoffs")
        and "| run safe |" in md
    )


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_plot_is_a_valid_file_of_sensible_size(suffix, tmp_path, cli_run):
    target = tmp_path / f"tradeoffs.{suffix}"
    rc, out, err = cli_run(*(SEED + ["--spike-rate", "0.01", "--plot", str(target)]))
    assert rc == 0, err
    data = target.read_bytes()
    assert 10_000 < len(data) < 3_000_000
    if suffix == "png":
        assert data.startswith(PNG_SIGNATURE)
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert 600 <= width <= 3000 and 400 <= height <= 2000
    else:
        root = ET.fromstring(data)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert b"recommended" in data  # the label is drawn as text
    assert f"Plot:               {target}" in out


def test_plot_without_matplotlib_says_how_to_install(tmp_path, cli_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    target = tmp_path / "t.png"
    rc, out, err = cli_run(*(SEED + ["--plot", str(target)]))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "pip install 'checkpoint-strategy[plot]'" in err
    assert not target.exists()


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: d / "t.pdf", ".png or .svg"),
        (lambda d: d / "t", ".png or .svg"),
        (lambda d: d / "missing" / "t.png", "does not exist"),
        (lambda d: d / "folder.png", "is a folder"),
    ],
)
def test_bad_plot_paths_exit_2(make, needle, tmp_path, cli_run):
    (tmp_path / "folder.png").mkdir()
    rc, out, err = cli_run(*(SEED + ["--plot", str(make(tmp_path))]))
    assert rc == 2 and out == "" and err.count("\n") == 1 and needle in err


def test_unwritable_plot_folder_exits_2(cli_run):
    # /proc refuses new files even to root, so this runs as root in CI too
    rc, out, err = cli_run(*(SEED + ["--plot", "/proc/checkpoint-strategy-t.png"]))
    assert rc == 2 and out == "" and err.count("\n") == 1 and "--plot" in err
    assert not os.path.exists("/proc/checkpoint-strategy-t.png")


def test_unwritable_plot_path_exits_2_even_for_root(tmp_path, cli_run):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    rc, out, err = cli_run(*(SEED + ["--plot", str(blocker / "t.png")]))
    assert rc == 2 and out == "" and err.count("\n") == 1 and "--plot" in err


def test_plot_needs_the_model_size(tmp_path, cli_run):
    rc, _, err = cli_run("tradeoffs", "100000", "2.5", "500", "--plot", str(tmp_path / "t.png"))
    assert rc == 2 and "--model_size_gb" in err and err.count("\n") == 1
    rc, out, _ = cli_run("tradeoffs", "100000", "2.5", "500")  # the table works without it
    assert rc == 0 and "unknown" in out


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--sweep-frequencies", "0,100"], "--sweep-frequencies"),
        (["--sweep-frequencies", "abc"], "--sweep-frequencies"),
        (["--sweep-frequencies", "200000"], "--sweep-frequencies"),
        (["--sweep-keep-last", "1,nan"], "--sweep-keep-last"),
        (["--sweep-keep-last", ""], "--sweep-keep-last"),
        (["--spike-rate", "-1"], "--spike-rate"),
        (["--format", "yaml"], "--format"),
    ],
)
def test_bad_sweep_input_exits_2(extra, needle, cli_run):
    rc, out, err = cli_run(*(SEED + extra))
    assert rc == 2 and out == "" and err.count("\n") == 1 and needle in err


_val = st.one_of(
    st.integers(-3, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=10).filter(lambda s: "\x00" not in s),
    st.lists(st.integers(-2, 10**5), min_size=1, max_size=4).map(lambda xs: ",".join(map(str, xs))),
)
_opt = st.sampled_from(
    [
        "--sweep-frequencies",
        "--sweep-keep-last",
        "--spike-rate",
        "--frequency",
        "--keep-last",
        "--mtbf-hours",
        "--model_size_gb",
        "--format",
        "--spike-margin-steps",
    ]
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pairs=st.lists(st.tuples(_opt, _val), max_size=3))
def test_fuzz_bad_tradeoffs_arguments_exit_2_with_one_line(pairs, capsys):
    """Bad input on purpose (random values for every option): exit 2 with one line, never 3."""
    argv = ["tradeoffs", "20000", "1.5", "300", "--model_size_gb", "1"]
    for opt, val in pairs:
        argv += [opt, val]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 2), err
    if rc == 2:
        assert err.count("\n") == 1 and out == ""


_sweep = st.lists(st.integers(1, 5000), min_size=1, max_size=5, unique=True).map(
    lambda xs: ",".join(map(str, xs))
)
_keeps = st.lists(st.integers(1, 40), min_size=1, max_size=5, unique=True).map(
    lambda xs: ",".join(map(str, xs))
)
TRADEOFF_OPTIONS = st.one_of(
    st.tuples(st.just("--sweep-frequencies"), _sweep),
    st.tuples(st.just("--sweep-keep-last"), _keeps),
    st.tuples(st.just("--spike-rate"), st.floats(0, 3).map(repr)),
    st.tuples(st.just("--spike-margin-steps"), st.integers(0, 300).map(str)),
    st.tuples(st.just("--mtbf-hours"), st.floats(0.5, 1e4).map(repr)),
    st.tuples(st.just("--frequency"), st.integers(1, 5000).map(str)),
    st.tuples(st.just("--keep-last"), st.integers(1, 40).map(str)),
)


@reaches_core()
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(options=st.lists(TRADEOFF_OPTIONS, max_size=3), roll=MUTATE)
def test_fuzz_tradeoffs_never_internal_error(options, roll, capsys):
    """Valid sweeps, one token in five replaced by garbage: exit 0 with every (frequency, keep_last) pair of the
    grid once and storage growing with keep_last, or exit 2 with one line."""
    argv = [
        "tradeoffs",
        *mutate(["20000", "1.5", "300", "--model_size_gb", "1", *flatten(options)], roll),
        "--format",
        "json",
    ]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 2), err
    if reached(rc == 0):
        r = json.loads(out)
        pairs = [(p["frequency_steps"], p["keep_last"]) for p in r["points"]]
        assert sorted(pairs) == sorted(
            {(f, k) for f in r["frequencies"] for k in r["keep_last_values"]}
        )
        by = {(p["frequency_steps"], p["keep_last"]): p["peak_storage_gb"] for p in r["points"]}
        for (f, k), gb in by.items():
            assert all(gb <= by[f, k2] for k2 in r["keep_last_values"] if k2 > k)
    else:
        assert err.count("\n") == 1 and out == ""


def _brute_rescue(setup, K, wait, margin):
    """The rule, onset by onset (no periodic shortcut)."""
    import numpy as np

    s = np.arange(1, setup.total_steps + 1, dtype=np.int64)
    d = np.minimum(s + wait, setup.total_steps)
    k = setup.newest_durable(setup.step_time(d).astype(float))
    rescue = np.where(s >= margin, (s - margin) // setup.frequency, 0)
    c = np.minimum(rescue, k)
    return float(np.mean(c >= k - K + 1))


@pytest.mark.parametrize(
    "N, f, P, C, wait, margin",
    [
        (10000, 100, 0.0, 0.0, 100, 100),
        (10007, 37, 5.0, 1.0, 100, 100),
        (5000, 300, 400.0, 40.0, 50, 120),
        (999, 1000, 0.0, 0.0, 100, 100),
        (20000, 7, 30.0, 3.0, 100, 100),
        (3000, 250, 900.0, 90.0, 0, 0),
    ],
)
def test_exact_rescue_equals_onset_by_onset_enumeration(N, f, P, C, wait, margin):
    from checkpoint_strategy.simulation.montecarlo import Setup
    from checkpoint_strategy.simulation.sweep import spike_window_rescue_exact

    setup = Setup(
        total_steps=N,
        step_seconds=1.0,
        frequency=min(f, N),
        keep_last=1,
        milestone_steps=(),
        C=C,
        P=P,
        R=0.0,
        M=1e9,
    )
    keeps = [1, 2, 3, 5, 40]
    exact = spike_window_rescue_exact(setup, keeps, wait, margin)
    for K in keeps:
        assert exact[K] == pytest.approx(_brute_rescue(setup, K, wait, margin), abs=1e-12)


@pytest.mark.parametrize(
    "f, K, async_save",
    [
        (100, 2, False),
        (150, 2, True),
        (120, 2, False),
        (300, 1, True),
        (200, 1, False),
        (100, 3, True),
    ],
)
def test_tradeoffs_rescue_equals_simulate_within_three_standard_errors(f, K, async_save):
    from checkpoint_strategy.planning.planner import plan
    from checkpoint_strategy.simulation.montecarlo import simulate

    pargs = validate_arguments(
        dict(
            total_steps=20000,
            step_seconds=1.0,
            budget_gb=1e6,
            model_size_gb=30.0,
            write_gbps=2.0,
            mtbf_hours=1e9,
            async_save=async_save,
            milestones="none",
            min_interval_seconds=0,
            max_loss_hours=1000,
        )
    )
    report = tradeoffs(pargs, frequencies=[f], keep_lasts=[K])
    p = next(p for p in report.points if p.frequency_steps == f and p.keep_last == K)
    sim = simulate(
        plan(pargs.model_copy(update={"frequency": f, "keep_last": K})),
        runs=3000,
        seed=21,
        spike_rate=0.1,
    )
    n = sim.spikes.spikes
    rescued = 1.0 - sim.spikes.window_miss_fraction
    se = math.sqrt(max(rescued * (1 - rescued), 1.0 / n) / n)
    assert abs(rescued - p.spike_window_rescue_probability) <= 3 * se, (
        rescued,
        p.spike_window_rescue_probability,
    )


def _daly_overhead(tau: float, C: float, R: float, M: float) -> float:
    """docs/model.md: T(tau) = M e^(R/M) (e^((tau+C)/M) - 1) W / tau; overhead = T/W - 1."""
    return M * math.exp(R / M) * math.expm1((tau + C) / M) / tau - 1.0


def test_sweep_points_match_the_documented_formulas():
    """Every point against values computed here from docs/model.md and docs/simulate.md, not from plan():
    storage (keep_last + 1 in flight) x 3 B/param-equivalent, max loss = one interval (synchronous saves),
    overhead = Daly's T(tau)/W - 1, lost hours = overhead x compute hours, horizon = keep_last x frequency."""
    N, step, C, R, mtbf_h, size = 60000, 2.0, 40.0, 300.0, 12.0, 2.0
    r = json.loads(
        _run_json(
            [
                "tradeoffs",
                str(N),
                str(step),
                "1000",
                "--model_size_gb",
                str(size),
                "--no-async",
                "--checkpoint-write-seconds",
                str(C),
                "--restart-seconds",
                str(R),
                "--mtbf-hours",
                str(mtbf_h),
                "--milestones",
                "none",
                "--formats",
                "full_state_dict",
                "--sweep-frequencies",
                "100,250,600,1500,4000",
                "--sweep-keep-last",
                "1,2,5,12",
            ]
        )
    )
    M, W = mtbf_h * 3600.0, N * step
    assert {100, 250, 600, 1500, 4000} <= set(r["frequencies"]) and {1, 2, 5, 12} <= set(
        r["keep_last_values"]
    )
    assert len(r["points"]) == len(r["frequencies"]) * len(
        r["keep_last_values"]
    )  # plus the recommendation's
    for p in r["points"]:
        f, k = p["frequency_steps"], p["keep_last"]
        tau = f * step
        over = _daly_overhead(tau, C, R, M)
        assert p["peak_storage_gb"] == pytest.approx((k + 1) * size * 3, abs=1e-6)
        assert p["fits_budget"] == ((k + 1) * size * 3 <= 1000)
        assert p["max_data_loss_hours"] == pytest.approx(tau / 3600.0, abs=1e-6)
        assert p["frequency_hours"] == pytest.approx(tau / 3600.0, abs=1e-6)
        assert p["expected_overhead_fraction"] == pytest.approx(over, abs=1e-6)
        assert p["expected_lost_hours"] == pytest.approx(over * W / 3600.0, rel=1e-5)
        assert p["rollback_horizon_steps"] == k * f
        assert p["rollback_horizon_hours"] == pytest.approx(k * tau / 3600.0, abs=1e-6)
    # the cheapest overhead of the sweep is the one nearest Daly's optimum, found here on a dense grid
    taus = np.linspace(10.0, 20000.0, 2_000_001)
    best = taus[np.argmin(M * np.exp(R / M) * np.expm1((taus + C) / M) / taus)]
    nearest = min(r["frequencies"], key=lambda f: abs(math.log(f * step / best)))
    cheapest = min(r["points"], key=lambda p: p["expected_overhead_fraction"])
    assert cheapest["frequency_steps"] == nearest


def _run_json(argv):
    from cliresult import run_captured

    res = run_captured([*argv, "--format", "json"])
    assert res.rc == 0, res.err
    return res.out
