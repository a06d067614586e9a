"""planning/planner.py and sizing.py: sizes, milestones, retention, risk and warnings."""

import math
import os
from pathlib import Path

import pytest

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning import PlanArguments, failure, plan, planner, sizing


def mk(**kw):
    base = dict(total_steps=50000, step_seconds=10, budget_gb=200)
    base.update(kw)
    return plan(PlanArguments(**base))


def test_spec_storage_example():
    p = mk(params=1e9, precision="fp32", frequency=500, keep_last=10, formats=["full_state_dict"])
    assert p.checkpoint_size_gb == 12
    assert p.rolling_storage_gb == 120
    assert p.milestone_steps == [1000, 5000, 10000, 25000, 50000]
    assert p.total_storage_gb == 180
    b = p.storage_breakdown
    assert (b.rolling_gb, b.in_flight_gb, b.milestones_gb, b.milestones_outside_window) == (
        120,
        12,
        48,
        4,
    )
    assert p.fits_budget is True
    assert p.rollback_points == 14


@pytest.mark.parametrize(
    "text, value",
    [
        ("7B", 7e9),
        ("1.3e9", 1.3e9),
        ("350M", 3.5e8),
        ("125k", 1.25e5),
        ("2t", 2e12),
        ("1000", 1000.0),
    ],
)
def test_parse_params(text, value):
    assert sizing.parse_params(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "B", "7Q", "-1B", "nan", "inf", "1e400", "0"])
def test_parse_params_rejects(text):
    with pytest.raises(ValueError):
        sizing.parse_params(text)


def test_mixed_precision_is_14_bytes_per_param():
    p = mk(params=7e9, precision="mixed", formats=["full_state_dict"])
    assert p.checkpoint_size_gb == pytest.approx(98.0)
    assert p.model_size_gb == pytest.approx(14.0)


def test_model_size_gb_fp32_is_times_three():
    assert mk(model_size_gb=4).checkpoint_size_gb == pytest.approx(12.0)


def test_bf16_weights_default_to_mixed_precision():
    p = mk(model_size_gb=2, weights_dtype="bf16")  # 1B params
    assert p.precision == "mixed"
    assert p.checkpoint_size_gb == pytest.approx(14.0)


def test_without_optimizer_only_weights_and_a_warning():
    p = mk(params=1e9, save_optimizer=False)
    assert p.checkpoint_size_gb == pytest.approx(4.0)
    assert any("optimizer state not saved" in w for w in p.warnings)


def test_size_given_twice_is_a_usage_error():
    with pytest.raises(UsageError):
        mk(params=1e9, model_size_gb=4)


@pytest.mark.parametrize(
    "spec, total, expected",
    [
        ("seed", 50000, [1000, 5000, 10000, 25000, 50000]),
        ("seed", 300000, [1000, 5000, 10000, 25000, 50000, 100000, 250000, 300000]),
        ("seed", 800, [800]),
        ("pow2", 10000, [1000, 2000, 4000, 8000, 10000]),
        ("none", 10000, []),
        ([3000, 700, 20000], 10000, [700, 3000]),
    ],
)
def test_milestones(spec, total, expected):
    assert planner.milestone_steps(spec, total) == expected


@pytest.mark.parametrize(
    "x, nice", [(1, 1), (3, 2), (4, 5), (2939, 2500), (6000, 5000), (7400, 10000), (0.2, 1)]
)
def test_nice_steps(x, nice):
    assert planner.nice_steps(x) == nice


def test_frequency_is_failure_optimum_capped_by_max_loss():
    # 8 GPUs -> job MTBF 6250 h: the optimum is hours apart, the 1 h default cap wins.
    p = mk(model_size_gb=4, step_seconds=2.5, total_steps=100000, budget_gb=500)
    assert p.frequency_steps * 2.5 <= 3600
    # the cap is kept: it is the reason for the interval (with its price), not a warning about the plan
    assert (
        p.interval.reason == "max_loss_cap" and "--max-loss-hours 1 cap" in p.interval.explanation
    )
    assert p.max_data_loss_hours <= 1 and not any(w.startswith("max data loss") for w in p.warnings)
    # the 1 h cap was not given: listed as assumed, and the warning says it sets the interval (issue 42)
    assert [a.option for a in p.assumptions if a.sets_interval] == ["--max-loss-hours H"]
    assert any("assumed inputs (accepted loss)" in w for w in p.warnings)


def test_frequency_follows_mtbf_when_failures_are_frequent():
    # 16k GPUs at 50k GPU-hours each -> MTBF ~3 h: the optimum is well under the 1 h cap.
    p = mk(
        model_size_gb=4,
        step_seconds=1,
        total_steps=10**6,
        budget_gb=10**4,
        gpus=16384,
        write_gbps=1,
        min_interval_seconds=0,
    )
    opt = p.optimal_interval_seconds
    assert p.interval.reason == "failure_model_optimum"
    assert p.frequency_steps == planner.nice_steps(opt / 1.0)
    assert not any("--max-loss-hours" in w for w in p.warnings)


def test_conservative_preset_caps_frequency_at_500():
    p = mk(model_size_gb=1, preset="conservative", max_loss_hours=100, gpus=1)
    assert p.frequency_steps <= 500
    assert p.interval.reason == "preset" and "conservative preset" in p.interval.explanation
    assert not any("preset" in w for w in p.warnings)
    assert p.policy.emergency_save_on == []


def test_aggressive_preset_keeps_five_and_emergency_triggers():
    p = mk(model_size_gb=1, preset="aggressive")
    assert p.keep_last == 5
    assert p.policy.emergency_save_on == ["loss_spike_detected", "gradient_norm_exceeded"]


def test_keep_last_lowered_to_fit_budget():
    p = mk(params=1e9, frequency=500, budget_gb=100, formats=["full_state_dict"], milestones="none")
    assert p.total_storage_gb <= 100
    assert p.keep_last == 7  # (7 + 1) x 12 = 96 GB
    assert any("lowered" in w for w in p.warnings)


def test_budget_too_small_warns_and_keeps_two():
    p = mk(params=1e9, budget_gb=10)
    assert p.keep_last == 2
    assert p.fits_budget is False
    assert any("budget too small" in w for w in p.warnings)


def test_spike_horizon_warning_when_window_is_short():
    p = mk(model_size_gb=1, frequency=10, keep_last=5)
    assert any("spike horizon" in w for w in p.warnings)
    auto = mk(model_size_gb=1, frequency=10)
    assert auto.keep_last * 10 >= planner.SPIKE_HORIZON_STEPS  # auto widens the window
    assert not any("spike horizon" in w for w in auto.warnings)


def test_missing_model_size_still_plans_with_unknown_storage():
    p = mk()
    assert p.checkpoint_size_gb is None and p.total_storage_gb is None and p.fits_budget is None
    assert any("model size missing" in w for w in p.warnings)
    assert p.frequency_steps >= 1


def test_total_steps_below_interval():
    p = mk(total_steps=100, frequency=500, model_size_gb=1)
    assert p.frequency_steps == 100
    assert any("below the interval" in w for w in p.warnings)


def test_async_max_loss_adds_persist_time():
    a = mk(model_size_gb=10, frequency=100, async_save=True)
    s = mk(model_size_gb=10, frequency=100, async_save=False)
    assert a.max_data_loss_hours == pytest.approx(1000 / 3600 + 30 / 3600)
    assert s.max_data_loss_hours == pytest.approx(1000 / 3600)
    assert a.failure_model.checkpoint_write_seconds < s.failure_model.checkpoint_write_seconds


def test_sharded_only_warns_that_only_pytorchs_loader_reads_them():
    """DCP re-shards on load (no "hardware-specific" claim); the gap is other tools and a release."""
    p = mk(model_size_gb=1, formats=["sharded"])
    assert any(
        "only sharded" in w and "re-shards on load" in w and "milestones" in w for w in p.warnings
    )
    assert not any("hardware-specific" in w for w in p.warnings)


def test_safetensors_exports_counted():
    p = mk(params=1e9, frequency=500, keep_last=10, formats=["full_state_dict", "safetensors"])
    assert p.storage_breakdown.safetensors_exports == 5
    assert p.storage_breakdown.safetensors_exports_gb == pytest.approx(20.0)
    assert p.total_storage_gb == pytest.approx(200.0)


def test_short_mtbf_against_slow_saves_warns_about_overhead():
    p = mk(model_size_gb=1000, gpus=40000, async_save=False, write_gbps=1)
    assert p.expected_overhead_fraction > 0.5
    assert any("compute time" in w for w in p.warnings)


# --------------------------------------------------------------------------- boundaries (issue 18)


def test_budget_met_exactly_keeps_the_window_that_fits():
    """(keep_last + 1 in flight) x 12 GB: at a 96 GB budget 7 checkpoints fit exactly, so 7 are kept."""
    size = 12.0  # 1B params x 4 B x 3 (fp32 weights + Adam m, v)
    budget = 96.0
    fit = max(k for k in range(2, 11) if (k + 1) * size <= budget)
    p = mk(
        params=1e9, frequency=500, budget_gb=budget, formats=["full_state_dict"], milestones="none"
    )
    assert fit == 7
    assert p.keep_last == fit and p.total_storage_gb == budget and p.fits_budget is True


def test_explicit_milestone_at_the_final_step_is_kept():
    assert planner.milestone_steps([1000, 50000], 50000) == [1000, 50000]
    assert planner.milestone_steps([1000, 50001], 50000) == [1000]
    p = mk(model_size_gb=1, frequency=500, milestones=[1000, 50000])
    assert p.milestone_steps == [1000, 50000]


def _no_room(keep: int, **kw):
    """The auto plan with a budget the rule's own window fills past inputs.BUDGET_SHARE: nothing to spend."""
    from checkpoint_strategy.planning import inputs

    kw.setdefault("milestones", "seed")
    need = mk(keep_last=keep, **kw).total_storage_gb
    return mk(budget_gb=need / inputs.BUDGET_SHARE * 0.99, **kw)


def _oldest_reach(total: int, frequency: int, keep_last: int) -> int:
    """Worst case over detection steps t: how far back the oldest of the keep_last newest saves lies."""
    worst = None
    for t in range(total // 2, total // 2 + 3 * frequency):
        newest = (t // frequency) * frequency
        reach = t - (newest - (keep_last - 1) * frequency)
        worst = reach if worst is None else min(worst, reach)
    return worst


@pytest.mark.parametrize("frequency", [10, 20, 25, 30, 40, 100])
def test_auto_window_reaches_the_spike_horizon_at_every_detection_step(frequency):
    """A spike noticed at step t (wait steps after its onset) needs a checkpoint margin steps before the
    onset: t - 200 or older must still be in the window, whatever t is; auto keeps the fewest that do."""
    horizon = planner.SPIKE_HORIZON_STEPS
    needed = min(k for k in range(1, 100) if _oldest_reach(50000, frequency, k) >= horizon)
    p = _no_room(model_size_gb=1, frequency=frequency, keep=max(10, needed))
    assert p.keep_last == max(10, needed)
    assert _oldest_reach(50000, frequency, p.keep_last) >= horizon
    assert not any("spike horizon" in w for w in p.warnings)


def test_spike_horizon_warning_at_the_edge_and_advice_the_auto_rule_keeps():
    """--keep-last 20 --frequency 10 reaches back only 190 steps in the worst case: warned, and the advice is
    the auto window, which then draws no warning (simulate: every spike rescued by the window)."""
    from checkpoint_strategy.simulation.montecarlo import simulate

    short = mk(model_size_gb=1, frequency=10, keep_last=20, budget_gb=10**6, milestones="none")
    warned = [w for w in short.warnings if "spike horizon" in w]
    assert len(warned) == 1
    auto = _no_room(model_size_gb=1, frequency=10, milestones="none", keep=21)
    assert f"keep at least {auto.keep_last} checkpoints" in warned[0]
    assert not any("spike horizon" in w for w in auto.warnings)
    miss_short = simulate(short, runs=200, seed=3, spike_rate=1.0).spikes.window_miss_fraction
    miss_auto = simulate(auto, runs=200, seed=3, spike_rate=1.0).spikes.window_miss_fraction
    assert miss_short > 0.5 and miss_auto == 0


def _nearest_nice(x: float) -> int:
    """docs/model.md: the optimum rounded to the nearest 1, 2, 2.5 or 5 x 10^k in log space."""
    grid = [m * 10**e for e in range(0, 8) for m in (1, 2, 2.5, 5)]
    return int(min(grid, key=lambda v: abs(math.log(v / x))))


def test_every_report_field_from_the_documented_formulas():
    """One synchronous plan, every number computed here from docs/model.md (sizes, storage, Daly, writes), and
    the report valid against its schema: a field dropped, mistyped or computed another way fails here."""
    import jsonschema
    import numpy as np

    from checkpoint_strategy.resources import load_schema

    N, s, f, k, C, R, mtbf_h, params = 48000, 3.0, 800, 6, 45.0, 300.0, 20.0, 2e9
    p = mk(
        total_steps=N,
        step_seconds=s,
        budget_gb=2000,
        params=params,
        precision="fp32",
        frequency=f,
        keep_last=k,
        formats=["full_state_dict", "safetensors"],
        milestones=[16000, 48000],
        gpus=64,
        mtbf_hours=mtbf_h,
        checkpoint_write_seconds=C,
        restart_seconds=R,
        async_save=False,
    )
    d = p.model_dump(mode="json")
    jsonschema.validate(d, load_schema("plan.schema.json"))
    M, tau, ckpt, weights = mtbf_h * 3600, f * s, params * 12 / 1e9, params * 4 / 1e9

    def over(t):
        return M * math.exp(R / M) * math.expm1((t + C) / M) / t - 1

    taus = np.linspace(100.0, 20000.0, 1_990_001)
    t_opt = float(taus[np.argmin(M * np.exp(R / M) * np.expm1((taus + C) / M) / taus)])
    approx = pytest.approx
    assert (
        d["total_training_hours"],
        d["storage_budget_gb"],
        d["params"],
        d["precision"],
        d["preset"],
    ) == (approx(N * s / 3600), 2000, params, "fp32", "auto")
    assert (d["model_size_gb"], d["checkpoint_size_gb"]) == (approx(weights), approx(ckpt))
    assert (d["frequency_steps"], d["frequency_hours"], d["keep_last"]) == (
        f,
        approx(tau / 3600, abs=1e-6),
        k,
    )
    assert d["milestone_steps"] == [16000, 48000]
    b = d[
        "storage_breakdown"
    ]  # window = the 6 saves 44000..48000: 16000 lies outside, 48000 inside
    assert (
        b["rolling_gb"],
        b["in_flight_gb"],
        b["milestones_gb"],
        b["milestones_outside_window"],
    ) == (approx(k * ckpt), approx(ckpt), approx(ckpt), 1)
    assert (b["safetensors_exports"], b["safetensors_exports_gb"]) == (2, approx(2 * weights))
    total = (k + 1) * ckpt + ckpt + 2 * weights
    assert (
        d["rolling_storage_gb"] == approx(k * ckpt)
        and d["total_storage_gb"] == approx(total) == b["total_gb"]
    )
    assert (
        d["fits_budget"] is True
        and d["rollback_points"] == k + 1
        and d["rollback_horizon_steps"] == k * f
    )
    assert d["max_data_loss_hours"] == approx(tau / 3600, abs=1e-6)
    assert d["expected_overhead_fraction"] == approx(over(tau), abs=1e-6)
    assert d["expected_wall_hours"] == approx(N * s / 3600 * (1 + over(tau)), rel=1e-6)
    assert d["expected_failures"] == approx(N * s * (1 + over(tau)) / M, rel=1e-5)
    assert d["optimal_interval_seconds"] == approx(t_opt, abs=0.02)
    assert d["optimal_interval_steps"] == approx(t_opt / s, abs=0.01)
    fm = d["failure_model"]
    daly37 = math.sqrt(2 * C * M) * (1 + math.sqrt(C / (2 * M)) / 3 + C / (2 * M) / 9) - C
    assert (
        fm["mtbf_hours"],
        fm["gpus"],
        fm["checkpoint_write_seconds"],
        fm["persist_seconds"],
        fm["restart_seconds"],
        fm["async_save"],
    ) == (mtbf_h, 64, C, C, R, False)
    assert fm["young_interval_seconds"] == approx(math.sqrt(2 * C * M), abs=1e-3)
    assert fm["daly_interval_seconds"] == approx(daly37, abs=1e-3)
    assert fm["optimal_interval_seconds"] == approx(t_opt, abs=0.02)
    iv = d["interval"]
    assert (
        iv["reason"] == "frequency_option"
        and iv["optimum_steps"] == _nearest_nice(t_opt / s) == 1000
    )
    assert iv["optimum_overhead_fraction"] == approx(over(1000 * s), abs=1e-6)
    assert iv["optimum_max_data_loss_hours"] == approx(1000 * s / 3600, abs=1e-6)
    w = d["storage_writes"]
    assert (w["nodes"], w["gpus_per_node"], w["write_gbps"]) == (8, 8, None)
    assert w["data_written_per_day_gb"] == approx(ckpt * 86400 / (tau + C), rel=1e-6)
    assert w["storage_busy_fraction"] == approx(C / (tau + C), abs=1e-6)
    assert d["policy"] == {
        "frequency": f"every_{f}_steps",
        "keep_last": k,
        "keep_milestone": [16000, 48000],
        "save_optimizer": True,
        "save_formats": ["full_state_dict", "safetensors"],
        "validate_on_save": True,
        "async_save": False,
        "emergency_save_on": ["loss_spike_detected", "gradient_norm_exceeded"],
    }
    assert set(d["sources"]) == {
        "checkpoint_size",
        "gpu_mtbf",
        "interval",
        "spike_horizon",
        "async",
    }
    assert d["warnings"] == []


# the 1, 2, 2.5, 5 x 10^k grid, built here: the planner's rounding functions against brute force
GRID = sorted(
    {int(m * 10**e) for e in range(0, 10) for m in (1, 2, 2.5, 5) if float(m * 10**e).is_integer()}
)
PROBES = sorted(
    {
        1.0,
        0.5,
        1.5,
        *GRID[:30],
        *(g * 1.01 for g in GRID[:30]),
        *(g * 0.99 for g in GRID[:30]),
        *(g * 1.3 for g in GRID[:30]),
        *(g * 0.77 for g in GRID[:30]),
        *(i / 10 for i in range(11, 100, 2)),
    }
)  # 1.1 .. 9.9: 2.5 (not a whole step) never wins


@pytest.mark.parametrize("x", PROBES)
def test_nice_rounding_against_brute_force(x):
    assert planner.nice_steps(x) == (
        1 if x <= 1 else min(GRID, key=lambda v: (abs(math.log(v / x)), v))
    )
    assert planner.nice_ceil(x) == (1 if x <= 1 else min(v for v in GRID if v >= x))
    assert planner.nice_floor(x) == (1 if x < 1 else max(v for v in GRID if v <= x))


@pytest.mark.parametrize(
    "spec, total, expected",
    [
        ("seed", 1000, [1000]),
        ("seed", 999, [999]),
        ("seed", 5000, [1000, 5000]),
        ("seed", 10000, [1000, 5000, 10000]),
        ("seed", 25000, [1000, 5000, 10000, 25000]),
        ("seed", 100000, [1000, 5000, 10000, 25000, 50000, 100000]),
        ("seed", 1000000, [1000, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000]),
        ("pow2", 1000, [1000]),
        ("pow2", 4000, [1000, 2000, 4000]),
        ("pow2", 3999, [1000, 2000, 3999]),
        ([0, 1, 2, 10], 10, [1, 2, 10]),
    ],
)
def test_milestone_rules_at_their_edges(spec, total, expected):
    """docs/model.md: seed = 1000, 5000, then 1, 2.5, 5 x 10^k from 10 000; pow2 = 1000 x 2^k; both keep the
    final step; a list keeps its steps in 1..total_steps."""
    assert planner.milestone_steps(spec, total) == expected


@pytest.mark.parametrize(
    "formats, copies",
    [
        (["full_state_dict"], 1),
        (["sharded"], 1),
        (["full_state_dict", "sharded"], 2),
        (["safetensors"], 1),
    ],
)
def test_each_resumable_format_is_a_copy_of_the_checkpoint(formats, copies):
    """Storage per save = checkpoint size x resumable formats (full and sharded both: two copies; none: one)."""
    p = mk(
        model_size_gb=1,
        frequency=500,
        keep_last=4,
        milestones="none",
        formats=formats,
        budget_gb=10**6,
    )
    assert p.checkpoint_size_gb == pytest.approx(3.0 * copies)
    assert p.storage_breakdown.rolling_gb == pytest.approx(4 * 3.0 * copies)


def test_window_of_a_run_ending_on_a_save_holds_keep_last_distinct_saves():
    """10 000 steps saved every 500, keep 4: the window is 8500, 9000, 9500, 10000 (the final save is a regular
    one), so a milestone at 8500 is inside it and costs nothing extra; at 8000 it is outside."""
    assert planner.saved_steps_tail(10000, 500, 4) == [8500, 9000, 9500, 10000]
    assert planner.saved_steps_tail(10100, 500, 4) == [9000, 9500, 10000, 10100]
    inside = mk(
        total_steps=10000,
        model_size_gb=1,
        frequency=500,
        keep_last=4,
        milestones=[8500],
        budget_gb=10**6,
    )
    outside = mk(
        total_steps=10000,
        model_size_gb=1,
        frequency=500,
        keep_last=4,
        milestones=[8000],
        budget_gb=10**6,
    )
    assert inside.storage_breakdown.milestones_outside_window == 0
    assert outside.storage_breakdown.milestones_outside_window == 1


def test_synchronous_save_stalls_for_the_whole_write():
    """--no-async: C = checkpoint size / write rate (docs/model.md); async: 10 % of it."""
    sync = mk(model_size_gb=10, write_gbps=2.0, async_save=False)
    asyn = mk(model_size_gb=10, write_gbps=2.0, async_save=True)
    assert sync.failure_model.checkpoint_write_seconds == pytest.approx(30 / 2.0)
    assert asyn.failure_model.checkpoint_write_seconds == pytest.approx(0.1 * 30 / 2.0)
    assert (
        sync.failure_model.persist_seconds
        == asyn.failure_model.persist_seconds
        == pytest.approx(15.0)
    )


def test_edges_of_the_rules_the_mutation_run_found_unpinned():
    # seed milestones of 1 000 000 when the run is 1.5 M steps (10^6 <= N < 11^6)
    assert planner.milestone_steps("seed", 1500000)[-3:] == [500000, 1000000, 1500000]
    # fewer saves than keep_last: only the steps that exist, never step 0 or a negative one
    assert planner.saved_steps_tail(1000, 500, 4) == [500, 1000]
    assert planner.saved_steps_tail(3, 1, 5) == [1, 2, 3]
    # auto keeps its 10 when they fit: nothing "lowered"; lowered to fit exactly: said so
    roomy = _no_room(model_size_gb=1, frequency=500, keep=10)
    assert roomy.keep_last == 10 and not any("lowered" in w for w in roomy.warnings)
    exact = mk(
        params=1e9, frequency=500, budget_gb=96, formats=["full_state_dict"], milestones="none"
    )
    assert exact.keep_last == 7 and any("keep_last lowered to 7" in w for w in exact.warnings)
    # unknown model size: every storage field present, sizes unknown, counts still counted
    unknown = mk(frequency=500, precision="mixed", formats=["full_state_dict", "safetensors"])
    assert unknown.precision == "mixed"
    b = unknown.model_dump(mode="json")["storage_breakdown"]
    assert b == {
        "checkpoint_size_gb": None,
        "rolling_gb": None,
        "in_flight_gb": None,
        "milestones_gb": None,
        "milestones_outside_window": 4,
        "safetensors_exports_gb": None,
        "safetensors_exports": 5,
        "total_gb": None,
    }
    # the warnings carry text, and the MTBF says where it came from
    past = mk(model_size_gb=1, frequency=500, milestones=[1000, 60000])
    assert any("milestones past total_steps 50000 were dropped" in w for w in past.warnings)
    only_weights = mk(model_size_gb=1, frequency=500, formats=["safetensors"])
    assert any(w.startswith("no resumable format in --formats") for w in only_weights.warnings)
    assert (
        "GPU-hours per GPU (Llama 3) / 8 GPUs"
        in mk(model_size_gb=1, gpus=8).failure_model.mtbf_source
    )


def test_interval_exactly_at_its_limits_is_not_limited():
    """An optimum that equals the --max-loss-hours cap is the optimum (nothing is capped, no warning); a
    --frequency equal to the run's length needs no 'below the interval' warning."""
    at_cap = mk(
        total_steps=100000,
        step_seconds=3.6,
        model_size_gb=1,
        checkpoint_write_seconds=36,
        mtbf_hours=50,
        async_save=False,
        max_loss_hours=1,
    )
    assert at_cap.frequency_steps == 1000 == at_cap.interval.max_loss_cap_steps
    assert at_cap.interval.reason == "failure_model_optimum"
    assert not any("beyond --max-loss-hours" in w for w in at_cap.warnings)
    whole = mk(total_steps=5000, model_size_gb=1, frequency=5000)
    assert whole.frequency_steps == 5000 and whole.interval.reason == "frequency_option"
    assert not any("below the interval" in w for w in whole.warnings)


# --------------------------------------------------------------------------- what the user reads (issue 18)
# Representative plans, one per warning branch and per interval reason. Each golden file is the report exactly
# as `plan --format json` prints it (every warning, the explanation, the sources), so a changed word or number
# fails here. The scenario's own assertions say what it is meant to exercise (so a golden regenerated after a
# behaviour change that leaves the branch is caught too); the sentences whose numbers follow from docs/model.md
# are checked separately below, with the numbers computed in the test.

GOLDEN_PLANS = Path(__file__).parent / "golden" / "planner"
BASE = dict(total_steps=50000, step_seconds=10, budget_gb=200)
SCENARIOS = {
    # the README's seed example: the --max-loss-hours cap sets the interval
    "seed-cap": (
        dict(total_steps=100000, step_seconds=2.5, budget_gb=500, model_size_gb=4),
        "max_loss_cap",
        [],
    ),
    # --frequency past the cap (and past --min-interval-seconds in hours): the cap warning names the interval
    "frequency-over-cap": (
        dict(model_size_gb=1, frequency=5000, gpus=16, min_interval_seconds=86400),
        "frequency_option",
        [
            "with --frequency 5000: saving every 250 steps keeps it",
            "more often than --min-interval-seconds 86400",
        ],
    ),
    # one step is longer than the cap: no interval keeps it, the cap gives the shortest (one step)
    "step-beyond-cap": (
        dict(
            total_steps=1000,
            step_seconds=7200,
            budget_gb=10**5,
            model_size_gb=100,
            gpus=1,
            async_save=False,
            write_gbps=1,
        ),
        "max_loss_cap",
        ["one step of 7200 s"],
    ),
    # an async save takes longer to reach storage than the cap itself
    "save-longer-than-cap": (
        dict(budget_gb=10**5, model_size_gb=1000, write_gbps=0.5),
        "storage_floor",
        ["longer than the cap itself", "the storage spends"],
    ),
    # the cap needs saves closer than the storage sustains
    "cap-below-storage-floor": (
        dict(budget_gb=10**5, model_size_gb=1000, write_gbps=1),
        "storage_floor",
        ["staying within it needs a save every 50 steps"],
    ),
    # --frequency below the storage floor: saves would overlap
    "overlap": (
        dict(budget_gb=10**5, model_size_gb=100, write_gbps=1, frequency=10),
        "storage_floor",
        ["saves would overlap"],
    ),
    # the optimum itself is below the storage floor (no --max-loss-hours clause in the explanation)
    "optimum-below-storage-floor": (
        dict(
            step_seconds=1,
            budget_gb=10**5,
            model_size_gb=100,
            write_gbps=1,
            mtbf_hours=0.5,
            min_interval_seconds=0,
        ),
        "storage_floor",
        ["saves would overlap"],
    ),
    # slow synchronous saves and a short MTBF: busy storage, TB a day, and a run that takes ~5x its compute
    "busy-daily-overhead": (
        dict(
            step_seconds=1,
            budget_gb=10,
            model_size_gb=1000,
            gpus=40000,
            async_save=False,
            write_gbps=1,
        ),
        "failure_model_optimum",
        ["budget too small", "TB of checkpoints a day", "x its compute time"],
    ),
    # petabytes a day, from 2048 nodes capped by the storage
    "petabytes-a-day": (
        dict(
            step_seconds=1,
            budget_gb=10**6,
            model_size_gb=10000,
            gpus=16384,
            frequency=100,
            keep_last=2,
            milestones="none",
        ),
        "frequency_option",
        ["PB of checkpoints a day"],
    ),
    # a small budget written many times a day: GB
    "gigabytes-a-day": (
        dict(
            budget_gb=1,
            model_size_gb=0.1,
            frequency=100,
            keep_last=2,
            milestones="none",
            formats=["full_state_dict"],
        ),
        "frequency_option",
        ["GB of checkpoints a day"],
    ),
    # the conservative preset; 7 off-grid milestones (the list is cut at 6) and one past the end
    "preset-and-milestones": (
        dict(
            model_size_gb=1,
            preset="conservative",
            max_loss_hours=100,
            gpus=1,
            milestones=[700, 1300, 2100, 3300, 4700, 5900, 7100, 60000],
        ),
        "preset",
        ["were dropped", "5900, ... are not multiples of 500"],
    ),
    # the aggressive preset with --mtbf-hours and --checkpoint-write-seconds (their own sources)
    "aggressive-explicit-cost": (
        dict(
            model_size_gb=1,
            preset="aggressive",
            mtbf_hours=2000,
            max_loss_hours=100,
            checkpoint_write_seconds=120,
            async_save=False,
        ),
        "preset",
        [],
    ),
    # no model size, no optimizer, no resumable format, keep_last 1, a run shorter than the interval
    "unknown-size": (
        dict(
            total_steps=100,
            frequency=500,
            save_optimizer=False,
            formats=["safetensors"],
            keep_last=1,
        ),
        "total_steps",
        [
            "model size missing",
            "optimizer state not saved",
            "no resumable format",
            "checkpoint cost unknown",
            "below the interval 500",
            "keep_last 1 cannot",
        ],
    ),
    # --min-interval-seconds sets the interval; 16 384 GPUs
    "min-interval": (
        dict(model_size_gb=1, gpus=16384, min_interval_seconds=3000),
        "min_interval",
        [],
    ),
    # the optimum, rounded (minutes); exactly 6 off-grid milestones (the whole list is shown)
    "optimum-rounded": (
        dict(
            total_steps=10**6,
            step_seconds=1,
            budget_gb=10**4,
            model_size_gb=4,
            gpus=16384,
            write_gbps=1,
            min_interval_seconds=0,
            milestones=[1001, 2001, 3001, 4001, 5001, 6001],
        ),
        "failure_model_optimum",
        ["1001, 2001, 3001, 4001, 5001, 6001 are not multiples of 200"],
    ),
    # --frequency below --min-interval-seconds (minutes), sharded only
    "frequency-below-min-interval": (
        dict(model_size_gb=1, frequency=10, formats=["sharded"]),
        "frequency_option",
        ["re-shards on load", "saves every 1.7 min", "TB of checkpoints a day"],
    ),
    # keep_last lowered to fit the budget
    "lowered-to-fit": (
        dict(
            budget_gb=100, params=1e9, frequency=500, formats=["full_state_dict"], milestones="none"
        ),
        "frequency_option",
        ["keep_last lowered to 7"],
    ),
    # two tiers: the persistent plan's MTBF source says it covers node losses only
    "two-tier": (
        dict(
            total_steps=100000,
            step_seconds=2.5,
            budget_gb=5000,
            params=7e9,
            gpus=512,
            local_tier={"gb_per_node": 2000, "gbps_per_node": 5},
        ),
        "min_interval",
        [],
    ),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_rendered_plan_matches_its_golden(name):
    """Regenerate after an intended change of wording or numbers: UPDATE_GOLDEN=1 pytest -k golden (then read
    the diff of tests/golden/planner/)."""
    from checkpoint_strategy.render import render

    kw, reason, phrases = SCENARIOS[name]
    p = plan(PlanArguments(**{**BASE, **kw}))
    assert p.interval.reason == reason
    for phrase in phrases:
        assert any(phrase in w for w in p.warnings), (phrase, p.warnings)
    text = render(p, "json")
    golden = GOLDEN_PLANS / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.is_file(), f"no golden {golden.name}: run with UPDATE_GOLDEN=1"
    assert text == golden.read_text(encoding="utf-8"), (
        f"{golden.name} changed: check the diff, then UPDATE_GOLDEN=1"
    )


# --------------------------------------------------------------------------- choose_interval at its boundaries


def test_cap_of_exactly_one_step_is_a_cap_of_one_step():
    """--max-loss-hours 1 with one-hour steps (synchronous: nothing to persist after the save): the cap is
    3600 s = one step, so it is a cap of 1 step (not "no interval keeps it"), kept exactly: no cap warning."""
    p = mk(step_seconds=3600, total_steps=1000, model_size_gb=1, async_save=False)
    assert p.interval.max_loss_cap_steps == 1
    assert (p.frequency_steps, p.interval.reason, p.max_data_loss_hours) == (1, "max_loss_cap", 1.0)
    assert not any("max data loss" in w for w in p.warnings)


def test_cap_equal_to_the_storage_floor_is_kept_as_the_cap():
    """1200 GB at 1 GB/s, async: on storage 1200 s after it starts, stall C = 120 s, so saves must be
    1200 - 120 = 1080 s apart: nice_ceil(1080) = 2000 one-second steps. The cap: 3600 - 1200 = 2400 s,
    nice_floor(2400) = 2000. The cap is the floor: the cap sets it, and nothing overlaps."""
    p = mk(step_seconds=1, total_steps=10**6, budget_gb=10**6, model_size_gb=400, write_gbps=1)
    assert planner.nice_ceil(1200 - 120) == planner.nice_floor(3600 - 1200) == 2000
    assert (p.frequency_steps, p.interval.reason, p.interval.max_loss_cap_steps) == (
        2000,
        "max_loss_cap",
        2000,
    )
    assert p.interval.min_interval_steps == 2000
    assert p.interval.min_interval_source == "a save is on storage 1200 s after it starts"
    assert p.max_data_loss_hours == pytest.approx((2000 + 1200) / 3600, abs=1e-6)
    assert not any("overlap" in w or "max data loss" in w for w in p.warnings)
    # the same storage with --frequency 5000: the cap warning names the cap, which the storage sustains
    f = mk(
        step_seconds=1,
        total_steps=10**6,
        budget_gb=10**6,
        model_size_gb=400,
        write_gbps=1,
        frequency=5000,
    )
    loss = (5000 + 1200) / 3600
    assert (
        f"max data loss {loss:.3g} h is over --max-loss-hours 1 with --frequency 5000: saving every 2000 steps "
        "keeps it" in f.warnings
    )


def test_optimum_of_one_step_against_an_unkeepable_cap_is_still_the_optimum():
    """Two-hour steps: no interval keeps a 1 h cap (no cap in steps); the optimum is 1 step anyway, which is
    also the storage floor (3 GB async at 1 GB/s: 2.7 s of the 7200 s step): the optimum set it."""
    p = mk(step_seconds=7200, total_steps=1000, model_size_gb=1, budget_gb=10**5)
    assert p.interval.max_loss_cap_steps is None
    assert (p.frequency_steps, p.interval.reason) == (1, "failure_model_optimum")
    # the exact optimum, ~sqrt(2 C M) = sqrt(2 x 0.3 x 6250 x 3600) = 3674 s = 0.51 steps, rounds to 1: no note
    assert round(math.sqrt(2 * 0.3 * 6250 * 3600) / 7200) == 1
    assert p.interval.explanation == "the failure-model optimum (exact minimiser of Daly 2006)"
    assert (
        f"max data loss {(7200 + 3) / 3600:.3g} h is over --max-loss-hours 1: one step of 7200 s is already "
        "beyond it" in p.warnings
    )


def test_cap_equal_to_the_preset_limit_is_the_cap():
    """7.2 s steps, synchronous: the 1 h cap is 500 steps, the conservative preset's limit is 500 too: the
    cap sets it (the preset would not change it)."""
    p = mk(
        step_seconds=7.2, model_size_gb=4, async_save=False, preset="conservative", budget_gb=10**4
    )
    assert (p.frequency_steps, p.interval.reason, p.interval.max_loss_cap_steps) == (
        500,
        "max_loss_cap",
        500,
    )
    assert p.interval.explanation.startswith("the --max-loss-hours 1 cap: ")
    assert p.max_data_loss_hours == 1.0 and not any("max data loss" in w for w in p.warnings)


def test_optimum_equal_to_the_min_interval_is_the_optimum():
    """C = 36 s, M = 50 h: the exact optimum is ~998 steps of 3.6 s, rounded to 1000 = the 1 h cap =
    --min-interval-seconds 3600: the optimum stands, named as such, the floor named after the option."""
    p = mk(
        total_steps=100000,
        step_seconds=3.6,
        model_size_gb=1,
        checkpoint_write_seconds=36,
        mtbf_hours=50,
        async_save=False,
        min_interval_seconds=3600,
    )
    assert (p.frequency_steps, p.interval.reason) == (1000, "failure_model_optimum")
    assert (p.interval.min_interval_steps, p.interval.min_interval_source) == (
        1000,
        "--min-interval-seconds 3600",
    )
    assert p.interval.explanation.startswith(
        "the failure-model optimum (exact minimiser of Daly 2006)"
    )


def test_frequency_at_the_storage_floor_and_below_the_min_interval():
    """300 GB at 1 GB/s, async (C = 30 s): saves 270 s apart at least, nice_ceil(27) = 50 steps of 10 s.
    --frequency 50 is exactly that: no overlap, but 500 s is under --min-interval-seconds 600: warned."""
    p = mk(model_size_gb=100, write_gbps=1, frequency=50, min_interval_seconds=600, budget_gb=10**5)
    assert (p.frequency_steps, p.interval.reason) == (50, "frequency_option")
    assert not any("overlap" in w for w in p.warnings)
    assert (
        "--frequency 50 saves every 8.3 min, more often than --min-interval-seconds 600: each save costs "
        "30 s of training" in p.warnings
    )
    # 30 steps x 10 s = the 300 s minimum exactly: not "more often"
    exact = mk(model_size_gb=1, frequency=30, min_interval_seconds=300)
    assert not any("more often than --min-interval-seconds" in w for w in exact.warnings)


def test_save_taking_exactly_the_cap_to_persist():
    """3600 GB at 1 GB/s, async: a save is on storage 3600 s after it starts, exactly the 1 h cap, so no
    interval keeps it (not "one step is beyond it"); 10 000 s steps: the storage floor is 1 step (no
    "saves closer than" clause), 10 s steps: nice_ceil(3240 / 10) = 500."""
    need = 3600 * (2 - 0.1) / 3600  # GB/s so that (lag - C) + lag = the cap: size (2 - C/lag) / cap
    long = mk(
        step_seconds=10000, total_steps=1000, model_size_gb=1200, write_gbps=1, budget_gb=10**6
    )
    loss = (10000 + 3600) / 3600
    assert (long.frequency_steps, long.interval.reason, long.interval.max_loss_cap_steps) == (
        1,
        "max_loss_cap",
        None,
    )
    assert (
        f"max data loss {loss:.3g} h is over --max-loss-hours 1: one save takes 3600 s to reach storage, longer "
        f"than the cap itself; keeping the cap needs about {need:.3g} GB/s (now 1) or a faster local tier"
    ) in long.warnings
    short = mk(model_size_gb=1200, write_gbps=1, budget_gb=10**6)
    loss = (5000 + 3600) / 3600
    assert (short.frequency_steps, short.interval.reason) == (500, "storage_floor")
    assert (
        f"max data loss {loss:.3g} h is over --max-loss-hours 1: one save takes 3600 s to reach storage, longer "
        "than the cap itself; saves closer than 500 steps would overlap (a save must be on storage before the "
        "next starts), so every 500 steps is as close to the cap as the storage sustains; keeping the cap needs "
        f"about {need:.3g} GB/s (now 1) or a faster local tier"
    ) in short.warnings


# --------------------------------------------------------------------------- policy checks at their thresholds


def test_policy_checks_at_their_thresholds_do_not_warn():
    """Each check warns strictly past its threshold: keep_last 2, a window of exactly 200 steps, a max loss of
    exactly 1 h, storage busy exactly half the time, exactly 10x the budget written a day."""
    keep2 = mk(model_size_gb=1, frequency=250, keep_last=2)
    assert not any("keep_last" in w and "cannot" in w for w in keep2.warnings)
    horizon = mk(model_size_gb=1, frequency=100, keep_last=3)  # (3 - 1) x 100 = 200
    assert not any("spike horizon" in w for w in horizon.warnings)
    loss = mk(model_size_gb=1, frequency=360, async_save=False)  # 3600 s, synchronous
    assert loss.max_data_loss_hours == 1.0 and not any("max data loss" in w for w in loss.warnings)
    busy = mk(
        model_size_gb=1, frequency=10, checkpoint_write_seconds=100, async_save=False
    )  # 100 / (100 + 100)
    assert busy.storage_writes.storage_busy_fraction == 0.5
    assert not any("the storage spends" in w for w in busy.warnings)
    # 3 GB x 86400 / (80 x 10 + 64) = 300 GB a day = 10 x 30 GB
    daily = mk(
        model_size_gb=1,
        frequency=80,
        checkpoint_write_seconds=64,
        async_save=False,
        budget_gb=30,
        milestones="none",
        keep_last=2,
    )
    assert daily.storage_writes.data_written_per_day_gb == 300.0
    assert not any("a day" in w for w in daily.warnings)
    over = mk(
        model_size_gb=1,
        frequency=80,
        checkpoint_write_seconds=64,
        async_save=False,
        budget_gb=29.9,
        milestones="none",
        keep_last=2,
    )
    assert (
        f"the policy writes 300 GB of checkpoints a day, {300 / 29.9:.3g}x the 29.9 GB budget: check the "
        "storage's write endurance and delete rate, or save less often" in over.warnings
    )
    fits = mk(
        params=1e9, frequency=500, budget_gb=96, formats=["full_state_dict"], milestones="none"
    )
    assert fits.total_storage_gb == 96 and not any("budget too small" in w for w in fits.warnings)


# --------------------------------------------------------------------------- sentences from docs/model.md


def _daly_overhead(tau, C, R, M):
    """docs/model.md: T(tau) / W - 1 = M e^(R/M) (e^((tau + C)/M) - 1) / tau - 1."""
    return M * math.exp(R / M) * math.expm1((tau + C) / M) / tau - 1


def test_overlap_and_busy_warnings_from_the_formulas():
    """300 GB (100 GB fp32 weights x 3) at 1 GB/s, async: on storage P = 300 s after it starts, stall C = 30 s.
    --frequency 10 (100 s): the next save would start before this one is on storage; it needs
    300 GB x (1 - C/P) / 100 s = 2.7 GB/s; the floor is nice_ceil((P - C) / 10 s) = 50 steps, where the storage
    writes P / (500 + C) = 57 % of the time."""
    p = mk(budget_gb=10**5, model_size_gb=100, write_gbps=1, frequency=10)
    P, C = 300.0, 30.0
    floor = min(v for v in GRID if v >= (P - C) / 10)
    assert floor == 50 and p.frequency_steps == floor
    # async saves were not asked for: the storage floor depends on them, so it is said (issue 42)
    assert p.warnings[2:] == [
        "the save interval rests on assumed inputs (precision, async saves): give --precision, "
        "--no-async with your own numbers (Assumed Inputs)"
    ]
    assert p.warnings[:2] == [
        f"saves would overlap: every 10 steps starts a save each 100 s of training, but one save takes 300 s to reach "
        f"storage (300 GB at 1 GB/s); every 10 steps needs at least {300 * (1 - C / P) / 100:.3g} GB/s; saving every "
        f"{floor} steps instead, the shortest interval the storage sustains",
        f"the storage spends {P / (floor * 10 + C):.0%} of the time writing checkpoints (300 s per save, one every "
        f"{floor * 10 + C:g} s): leave bandwidth for data loading and other jobs, or save less often",
    ]


def test_cap_warning_when_the_storage_cannot_keep_the_cap():
    """3000 GB at 1 GB/s, async (P = 3000 s, C = 300 s): the cap needs saves every (3600 - P) / 10 = 60 steps, a
    nice 50, but saves must be (P - C) / 10 = 270 steps apart, a nice 500. Keeping the cap needs a rate r with
    (P - C) + P <= 3600 s: r = 3000 GB x (2 - C/P) / 3600 s."""
    p = mk(budget_gb=10**5, model_size_gb=1000, write_gbps=1)
    loss = (500 * 10 + 3000) / 3600
    need = 3000 * (2 - 0.1) / 3600
    assert (p.frequency_steps, p.interval.reason, p.interval.max_loss_cap_steps) == (
        500,
        "storage_floor",
        50,
    )
    assert p.warnings[0] == (
        f"max data loss {loss:.3g} h is over --max-loss-hours 1: staying within it needs a save every 50 steps, but "
        "one save takes 3000 s to reach storage; saves closer than 500 steps would overlap (a save must be on "
        "storage before the next starts), so every 500 steps is as close to the cap as the storage sustains; "
        f"keeping the cap needs about {need:.3g} GB/s (now 1) or a faster local tier"
    )
    M, R = 6250 * 3600.0, 600.0
    chosen, opt = (
        _daly_overhead(5000, 300, R, M),
        _daly_overhead(p.interval.optimum_steps * 10, 300, R, M),
    )
    assert p.interval.explanation.startswith(
        "the storage: a save is on storage 3000 s after it starts, so saves are no closer (the nearest to the "
        f"--max-loss-hours 1 cap it sustains); {chosen:.2%} expected overhead against {opt:.2%} at the failure-model "
        f"optimum of {p.interval.optimum_steps} steps; the exact optimum is "
    )


def test_overhead_warning_and_frequency_price_from_the_formulas():
    """40 000 GPUs at 50 000 GPU-hours: M = 1.25 h; 3000 GB synchronous at 1 GB/s: C = 3000 s; R = 600 s.
    Every 2500 one-second steps the run takes 1 + overhead times its compute (Daly's T(tau) / W)."""
    p = mk(
        step_seconds=1,
        budget_gb=10**6,
        model_size_gb=1000,
        gpus=40000,
        async_save=False,
        write_gbps=1,
        frequency=2500,
    )
    M, C, R = 4500.0, 3000.0, 600.0
    over = _daly_overhead(2500, C, R, M)
    assert p.expected_overhead_fraction == pytest.approx(over, abs=1e-6)
    assert p.warnings[-1] == (
        f"the failure model expects the run to take {1 + over:.3g}x its compute time: a job MTBF of 1.25 h is short "
        "against saves of 3e+03 s and restarts of 600 s; use async saves, faster storage, fewer GPUs per job or a "
        "cheaper restart"
    )
    opt_steps = p.interval.optimum_steps
    assert opt_steps == _nearest_nice(failure.exact_interval(C, M))
    assert p.interval.explanation.startswith(
        f"--frequency 2500: {over:.2%} expected overhead against {_daly_overhead(opt_steps, C, R, M):.2%} at the "
        f"failure-model optimum of {opt_steps} steps"
    )


def test_max_loss_cap_explanation_prices_the_cap():
    """The seed example: 12 GB async at 1 GB/s (C = 1.2 s, on storage after 12 s), M = 6250 h, R = 600 s,
    2.5 s steps. The cap: (3600 - 12) / 2.5 = 1435 steps, a nice 1000; the optimum: Daly's exact minimiser
    tau*, rounded to the grid; its max loss (2500 x 2.5 + 12) / 3600 h rounded up to two digits is the cap
    that would let the optimum stand."""
    p = mk(total_steps=100000, step_seconds=2.5, budget_gb=500, model_size_gb=4)
    M, C, R = 6250 * 3600.0, 1.2, 600.0
    tau = failure.exact_interval(C, M)
    opt = _nearest_nice(tau / 2.5)
    assert (p.frequency_steps, p.interval.max_loss_cap_steps, p.interval.optimum_steps) == (
        1000,
        1000,
        opt,
    )
    chosen, at_opt = _daly_overhead(2500, C, R, M), _daly_overhead(opt * 2.5, C, R, M)
    opt_loss = (opt * 2.5 + 12) / 3600
    assert opt == 2500 and math.ceil(opt_loss * 10) / 10 == 1.8
    assert p.interval.explanation == (
        f"the --max-loss-hours 1 cap: {chosen:.2%} expected overhead against {at_opt:.2%} at the failure-model "
        f"optimum of {opt} steps; the cap costs {(chosen - at_opt) * 100:.2g} points, --max-loss-hours 1.8 gives "
        f"{at_opt:.2%}; the exact optimum is {tau / 2.5:.0f} steps ({tau / 3600:.2f} h, "
        f"{_daly_overhead(tau, C, R, M):.3%} expected overhead), {opt} as a round number ({at_opt:.3%})"
    )
    assert p.interval.optimum_max_data_loss_hours == pytest.approx(opt_loss, abs=1e-6)


def test_rounded_optimum_note_from_the_formulas():
    """16 384 GPUs: M = 50 000 / 16 384 h; 12 GB async at 1 GB/s: C = 1.2 s. The exact optimum in one-second
    steps is rounded to the grid; the note gives both overheads (Daly's T(tau) / W - 1) and the time in minutes."""
    p = mk(
        total_steps=10**6,
        step_seconds=1,
        budget_gb=10**4,
        model_size_gb=4,
        gpus=16384,
        write_gbps=1,
        min_interval_seconds=0,
    )
    M, C, R = 50000 / 16384 * 3600, 1.2, 600.0
    tau = failure.exact_interval(C, M)
    f = _nearest_nice(tau)
    assert (p.frequency_steps, p.interval.reason) == (f, "failure_model_optimum") and tau < 3600
    assert p.interval.explanation == (
        f"the failure-model optimum (exact minimiser of Daly 2006); optimum {tau:.0f} steps ({tau / 60:.1f} min), "
        f"rounded to {f} (a round number of steps: {_daly_overhead(f, C, R, M):.2%} expected overhead against "
        f"{_daly_overhead(tau, C, R, M):.2%} at the exact optimum)"
    )


def test_spike_horizon_and_budget_sentences():
    """(keep_last - 1) x interval against 100 + 100 steps, and keep ceil(200 / f) + 1; the budget: 1B params
    fp32 = 12 GB a checkpoint, keep 2 + 1 in flight, 4 seed milestones outside the window (1000 ... 25000), 5
    safetensors exports of 4 GB: 3 x 12 + 4 x 12 + 5 x 4 = 104 GB."""
    short = mk(model_size_gb=1, frequency=10, keep_last=5)
    assert (
        f"rolling window reaches back {4 * 10} steps ((keep_last 5 - 1) x 10), shorter than the spike horizon "
        "of 200 steps (100 waiting + 100 before onset): a spike may leave no checkpoint to roll back to; keep "
        f"at least {math.ceil(200 / 10) + 1} checkpoints"
    ) in short.warnings
    tight = mk(params=1e9, budget_gb=10)
    assert tight.keep_last == 2 and tight.total_storage_gb == 3 * 12 + 4 * 12 + 5 * 4
    assert (
        "budget too small: the policy needs 104 GB at peak but the budget is 10 GB; raise the budget, drop "
        "milestones or safetensors exports, or accept a rolling window below 2 (no validated fallback)"
    ) in tight.warnings
    assert not any(
        "lowered" in w for w in tight.warnings
    )  # lowered, but it still does not fit: not "to fit"


def test_storage_floor_at_the_optimum_claims_no_cap():
    """M = 1.2 h: the optimum is 50 steps, which is also the storage floor --frequency 10 is raised to: the
    explanation does not call the floor "the nearest to the cap" (the optimum itself is there), and both
    overheads are the optimum's."""
    p = mk(budget_gb=10**5, model_size_gb=100, write_gbps=1, frequency=10, mtbf_hours=1.2)
    over = _daly_overhead(500, 30, 600, 1.2 * 3600)
    assert (p.frequency_steps, p.interval.reason, p.interval.optimum_steps) == (
        50,
        "storage_floor",
        50,
    )
    assert p.interval.explanation.startswith(
        f"the storage: a save is on storage 300 s after it starts, so saves are no closer; {over:.2%} expected "
        f"overhead against {over:.2%} at the failure-model optimum of 50 steps; the exact optimum is "
    )


def test_a_run_that_never_finishes_is_bad_input_with_its_numbers():
    """M = 3.6 s against a 3600 s restart: Daly's T(tau) overflows. No model size: C = 60 s assumed; the
    interval is the 300 s --min-interval-seconds floor, nice_ceil(30) = 50 steps = 500 s."""
    with pytest.raises(UsageError) as err:
        mk(mtbf_hours=0.001, restart_seconds=3600)
    assert str(err.value) == (
        "the failure model says this run never finishes: a job MTBF of 0.001 h against a restart of 3600 s and "
        "saves costing 60 s every 500 s; expected --mtbf-hours well above the restart and save times (or fewer "
        "--gpus)"
    )


def test_units_of_the_reported_times_and_sizes_switch_at_exactly_one():
    """An hour is "1.00 h", not "60.0 min"; 1000 GB is "1 TB", 10^6 GB "1 PB"."""
    p = mk(model_size_gb=1, frequency=360, min_interval_seconds=7200)
    assert any(
        w.startswith("--frequency 360 saves every 1.00 h, more often than") for w in p.warnings
    )
    q = mk(model_size_gb=1, frequency=359, min_interval_seconds=7200)
    assert any(
        w.startswith(f"--frequency 359 saves every {3590 / 60:.1f} min, more often than")
        for w in q.warnings
    )
    assert [planner._gb(x) for x in (999.4, 1000.0, 1e6, 2.5e7)] == [
        "999 GB",
        "1 TB",
        "1 PB",
        "25 PB",
    ]


@pytest.mark.parametrize(
    "x",
    [
        0.0,
        0.05,
        0.0123,
        0.1,
        0.99,
        1.0,
        1.7394,
        1.8,
        1.80001,
        9.99,
        10.0,
        12.01,
        99.5,
        100.0,
        123.0,
        4567.0,
    ],
)
def test_cap_suggestion_rounds_up_to_two_significant_digits(x):
    """--max-loss-hours N gives the optimum: N is the optimum's max loss rounded up to two significant digits
    (a number that already has two is kept)."""
    two_digits = [0.0] + [n * 10**e for e in range(-4, 6) for n in range(10, 100)]
    assert planner._ceil2(x) == pytest.approx(
        min(c for c in two_digits if c >= x * (1 - 1e-12)), rel=1e-12
    )


# --------------------------------------------------------------------------- more edges the mutation run found


def test_unkeepable_cap_at_one_step_is_set_by_the_cap_not_the_storage():
    """Two-hour steps: no interval keeps the 1 h cap; the optimum (C = 0.03 s, M = 10^6 h) is 2 steps; the planner
    goes as close to the cap as it can, one step. The storage (on storage 0.3 s after a save starts) allows one
    step, so it is not what set the interval: the reason is the cap (it was called storage_floor before)."""
    p = mk(step_seconds=7200, total_steps=1000, model_size_gb=0.1, mtbf_hours=1e6, budget_gb=10**5)
    assert p.failure_model.persist_seconds == pytest.approx(0.3)
    assert (p.frequency_steps, p.interval.reason, p.interval.optimum_steps) == (
        1,
        "max_loss_cap",
        2,
    )
    assert p.interval.explanation.startswith("the --max-loss-hours 1 cap: ")
    # --frequency 1 there: the cap warning says why no interval keeps it (there is no "every N steps keeps it")
    f1 = mk(
        step_seconds=7200,
        total_steps=1000,
        model_size_gb=0.1,
        mtbf_hours=1e6,
        budget_gb=10**5,
        frequency=1,
    )
    assert (
        f"max data loss {(7200 + 0.3) / 3600:.3g} h is over --max-loss-hours 1: one step of 7200 s is already "
        "beyond it" in f1.warnings
    )


def test_storage_floor_with_sub_second_steps():
    """0.1 s steps, 3 GB async at 3 GB/s: on storage after 1 s, C = 0.1 s: saves 0.9 s apart at least, nice_ceil(9)
    = 10 steps; --frequency 5 (0.5 s) needs 3 GB x 0.9 / 0.5 s = 5.4 GB/s. The explanation names the storage's
    time (not the larger --min-interval-seconds floor) and no cap: the interval was --frequency, raised."""
    p = mk(
        step_seconds=0.1,
        total_steps=10**6,
        model_size_gb=1,
        write_gbps=3,
        frequency=5,
        budget_gb=10**5,
    )
    assert (p.frequency_steps, p.interval.reason) == (10, "storage_floor")
    assert p.warnings[0] == (
        "saves would overlap: every 5 steps starts a save each 0.5 s of training, but one save takes 1 s to reach "
        f"storage (3 GB at 3 GB/s); every 5 steps needs at least {3 * 0.9 / 0.5:.3g} GB/s; saving every 10 steps "
        "instead, the shortest interval the storage sustains"
    )
    assert p.interval.explanation.startswith(
        "the storage: a save is on storage 1 s after it starts, so saves are no closer; "
    )
    # the same with 0.5 s steps and --frequency 1: the --min-interval-seconds floor (600 steps) is larger, but it
    # is the storage that raised the interval (to nice_ceil(2.7 / 0.5) = 10)
    q = mk(model_size_gb=1, frequency=1, step_seconds=0.5)
    assert (q.frequency_steps, q.interval.reason, q.interval.min_interval_steps) == (
        10,
        "storage_floor",
        1000,
    )
    assert q.interval.min_interval_source == "--min-interval-seconds 300"
    assert q.interval.explanation.startswith(
        "the storage: a save is on storage 3 s after it starts, so saves are no closer; "
    )


def test_min_interval_floor_in_steps():
    """--min-interval-seconds 1 with 0.1 s steps is 10 steps; 0 is no floor (1 step); synchronous saves add none."""
    one = mk(
        step_seconds=0.1,
        total_steps=10**6,
        model_size_gb=1,
        async_save=False,
        min_interval_seconds=1,
    )
    assert (one.interval.min_interval_steps, one.interval.min_interval_source) == (
        10,
        "--min-interval-seconds 1",
    )
    none = mk(model_size_gb=1, async_save=False, min_interval_seconds=0)
    assert none.interval.min_interval_steps == 1


def test_cap_in_steps_is_floored_to_the_grid():
    """3.6005 s steps, synchronous: 3600 / 3.6005 = 999.86 steps fit in the hour, so the cap is 500 (1000 steps
    would be 3600.5 s)."""
    p = mk(step_seconds=3.6005, model_size_gb=1, async_save=False, budget_gb=10**4)
    assert 3600 / 3.6005 < 1000
    assert (p.frequency_steps, p.interval.reason, p.interval.max_loss_cap_steps) == (
        500,
        "max_loss_cap",
        500,
    )


def test_free_saves_have_no_optimum_to_round():
    """--checkpoint-write-seconds 0: Daly's optimum is tau = 0, so there is no rounding note; the optimum in steps
    is the grid's smallest (1), the --min-interval-seconds floor (nice_ceil(30) = 50 steps) sets the interval."""
    p = mk(model_size_gb=1, checkpoint_write_seconds=0, async_save=False)
    M, R = 6250 * 3600.0, 600.0
    assert (p.frequency_steps, p.interval.reason, p.interval.optimum_steps) == (
        50,
        "min_interval",
        1,
    )
    assert p.interval.explanation == (
        f"--min-interval-seconds 300: {_daly_overhead(500, 0, R, M):.2%} expected overhead against "
        f"{_daly_overhead(10, 0, R, M):.2%} at the failure-model optimum of 1 steps"
    )


def test_rounding_note_of_a_one_step_frequency_and_of_an_optimum_near_an_hour():
    """--frequency 1 of 0.5 s steps (synchronous, nothing raises it): the note still gives the exact optimum.
    C = 10 s, M = 183 h: the exact optimum is just over an hour, shown in hours."""
    p = mk(model_size_gb=1, frequency=1, step_seconds=0.5, async_save=False, min_interval_seconds=0)
    M, C = 6250 * 3600.0, 3.0  # 3 GB at 1 GB/s, synchronous
    tau = failure.exact_interval(C, M)
    assert p.interval.reason == "frequency_option"
    R = 600.0
    nice = _nearest_nice(tau / 0.5)
    assert p.interval.explanation.endswith(
        f"; the exact optimum is {tau / 0.5:.0f} steps ({tau / 3600:.2f} h, {_daly_overhead(tau, C, R, M):.3%} "
        f"expected overhead), {nice} as a round number ({_daly_overhead(nice * 0.5, C, R, M):.3%})"
    )
    tau = failure.exact_interval(10.0, 183 * 3600.0)
    assert 3600 < tau < 3660
    q = mk(
        model_size_gb=1,
        checkpoint_write_seconds=10,
        mtbf_hours=183,
        max_loss_hours=10,
        frequency=500,
    )
    nice = _nearest_nice(tau / 10)
    assert q.interval.explanation.endswith(
        f"; the exact optimum is {tau / 10:.0f} steps ({tau / 3600:.2f} h, "
        f"{_daly_overhead(tau, 10.0, R, 183 * 3600.0):.3%} expected overhead), {nice} as a round number "
        f"({_daly_overhead(nice * 10, 10.0, R, 183 * 3600.0):.3%})"
    )


def test_rounded_optimum_note_with_two_second_steps():
    """The same note as test_rounded_optimum_note_from_the_formulas with 2 s steps: the overhead of the rounded
    interval is taken at interval x step seconds."""
    p = mk(
        total_steps=10**6,
        step_seconds=2,
        budget_gb=10**4,
        model_size_gb=4,
        gpus=16384,
        write_gbps=1,
        min_interval_seconds=0,
    )
    M, C, R = 50000 / 16384 * 3600, 1.2, 600.0
    tau = failure.exact_interval(C, M)
    f = _nearest_nice(tau / 2)
    assert (p.frequency_steps, p.interval.reason) == (f, "failure_model_optimum")
    assert p.interval.explanation == (
        f"the failure-model optimum (exact minimiser of Daly 2006); optimum {tau / 2:.0f} steps ({tau / 60:.1f} min), "
        f"rounded to {f} (a round number of steps: {_daly_overhead(f * 2, C, R, M):.2%} expected overhead against "
        f"{_daly_overhead(tau, C, R, M):.2%} at the exact optimum)"
    )


def test_write_rate_equal_to_the_storage_rate_is_not_capped():
    """16 GPUs = 2 nodes x 1 GB/s = 2 GB/s, exactly --storage-gbps 2: the nodes' rate, not "capped"."""
    p = mk(model_size_gb=1, gpus=16, storage_gbps=2)
    assert (p.storage_writes.write_gbps, p.storage_writes.write_source) == (
        2,
        "1 GB/s per node x 2 nodes of 8 GPUs",
    )
    q = mk(model_size_gb=1, gpus=16, storage_gbps=1.5)
    assert (q.storage_writes.write_gbps, q.storage_writes.write_source) == (
        1.5,
        "1 GB/s per node x 2 nodes of 8 GPUs, capped by the storage's 1.5 GB/s",
    )


def test_cap_warning_for_a_slow_save_of_unknown_rate_and_at_two_steps():
    """--checkpoint-write-seconds 4000 (async: on storage after 4000 s, longer than the cap): no write rate, so no
    "needs about N GB/s". 15 000 GB at 1 GB/s with 10 000 s steps: saves (15 000 - 1500) / 10 000 = 1.35 steps
    apart at least, a floor of 2 steps."""
    p = mk(model_size_gb=1, checkpoint_write_seconds=4000, budget_gb=10**4)
    assert (
        f"max data loss {(p.frequency_steps * 10 + 4000) / 3600:.3g} h is over --max-loss-hours 1: one save "
        "takes 4000 s to reach storage, longer than the cap itself" in p.warnings
    )
    two = mk(
        step_seconds=10000, total_steps=1000, model_size_gb=5000, write_gbps=1, budget_gb=10**6
    )
    need = 15000 * (2 - 0.1) / 3600
    assert (two.frequency_steps, two.interval.reason) == (2, "storage_floor")
    assert (
        f"max data loss {(20000 + 15000) / 3600:.3g} h is over --max-loss-hours 1: one save takes 1.5e+04 s to "
        "reach storage, longer than the cap itself; saves closer than 2 steps would overlap (a save must be on "
        "storage before the next starts), so every 2 steps is as close to the cap as the storage sustains; "
        f"keeping the cap needs about {need:.3g} GB/s (now 1) or a faster local tier"
    ) in two.warnings


def test_needed_rate_is_over_the_cap_in_seconds():
    """1904.4 GB at 1 GB/s (async): the cap needs size x (2 - C/P) / 3600 s = 1.0051 GB/s, printed with 3 digits as
    1.01 (a rate computed over a slightly longer cap would print 1)."""
    p = mk(model_size_gb=634.8, write_gbps=1, budget_gb=10**5)
    need = 3 * 634.8 * (2 - 0.1) / 3600
    assert f"{need:.3g}" == "1.01"
    assert any(
        w.endswith(f"; keeping the cap needs about {need:.3g} GB/s (now 1) or a faster local tier")
        for w in p.warnings
    )


def test_two_tier_plan_keeps_the_local_tiers_warnings():
    """7B fp32 = 84 GB over 64 nodes: 1.3125 GB shards; 2.7 GB of local space holds 2, one kept: warned."""
    p = mk(
        total_steps=100000,
        step_seconds=2.5,
        budget_gb=5000,
        params=7e9,
        gpus=512,
        local_tier={"gb_per_node": 2.7, "gbps_per_node": 5},
    )
    assert p.two_tier.local.keep_last == 1
    assert (
        "the local tier holds one checkpoint: a corrupt newest local save leaves only the persistent tier; give "
        "it room for two"
    ) in p.warnings
    M = 50000 / 512
    assert p.failure_model.mtbf_source == (
        f"node losses only: job MTBF {M:.4g} h / --node-loss-fraction 0.78 (the "
        "local tier covers the other failures)"
    )


def test_preset_below_the_storage_floor_at_the_optimum():
    """300 GB at 0.3 GB/s, async: on storage after 1000 s, C = 100 s, a floor of nice_ceil(900) = 1000 one-second
    steps; M = 1.5 h puts the optimum at 1000 steps too. The conservative preset lowers it to 500, the storage
    raises it back to 1000: the storage sets it, at the optimum, so no "nearest to the cap" clause."""
    p = mk(
        step_seconds=1,
        total_steps=10**6,
        budget_gb=10**6,
        model_size_gb=100,
        write_gbps=0.3,
        preset="conservative",
        mtbf_hours=1.5,
    )
    assert (p.frequency_steps, p.interval.reason, p.interval.optimum_steps) == (
        1000,
        "storage_floor",
        1000,
    )
    over = _daly_overhead(1000, 100, 600, 1.5 * 3600)
    assert p.interval.explanation.startswith(
        f"the storage: a save is on storage 1000 s after it starts, so saves are no closer; {over:.2%} expected "
        f"overhead against {over:.2%} at the failure-model optimum of 1000 steps"
    )
    assert p.warnings[0].startswith(
        "saves would overlap: every 500 steps starts a save each 500 s of training"
    )


def test_cap_warning_for_a_sub_second_cap():
    """--max-loss-hours 0.0001 (0.36 s) against 3 GB async at 6 GB/s (on storage after 0.5 s, C = 0.05 s): the
    save alone outlasts the cap; keeping it needs 3 GB x (2 - 0.1) / 0.36 s."""
    p = mk(
        step_seconds=1, model_size_gb=1, write_gbps=6, max_loss_hours=0.0001, min_interval_seconds=0
    )
    need = 3 * (2 - 0.1) / 0.36
    assert p.interval.max_loss_cap_steps is None and p.frequency_steps == 1
    assert (
        f"max data loss {(1 + 0.5) / 3600:.3g} h is over --max-loss-hours 0.0001: one save takes 0.5 s to reach "
        f"storage, longer than the cap itself; keeping the cap needs about {need:.3g} GB/s (now 6) or a faster "
        "local tier"
    ) in p.warnings


# ----------------------------------------------------------------------------------------- issue 42: a big run


BIG = dict(total_steps=1008000, step_seconds=1.8, budget_gb=40000, params=7e9, gpus=256)


def test_presets_differ_where_the_spec_templates_differ():
    """conservative: 1000 x 2^k milestones, keep_last 10; aggressive: 10k, 50k, 100k, keep_last 5; auto spends the
    budget. On the 256-GPU run the three are three different plans (before: conservative == default)."""
    auto, cons, aggr = (mk(**BIG, preset=p) for p in ("auto", "conservative", "aggressive"))
    assert cons.milestone_steps == [1000 * 2**k for k in range(10)] + [1008000]
    assert cons.keep_last == 10 and cons.policy.emergency_save_on == []
    assert aggr.milestone_steps == [10000, 50000, 100000, 1008000] and aggr.keep_last == 5
    assert auto.keep_last > 10 and len(auto.milestone_steps) > len(cons.milestone_steps)
    assert (
        "the conservative preset keeps its template" in cons.budget_use
        and "--preset auto" in cons.budget_use
    )
    # --milestones given wins over the preset's own
    assert mk(**BIG, preset="conservative", milestones="seed").milestone_steps[:4] == [
        1000,
        5000,
        10000,
        25000,
    ]


def test_budget_use_stops_at_its_stated_limits():
    """Milestones no closer than 1% of the run (on the interval's grid), at most MAX_KEEP_LAST_AUTO rolling saves,
    the peak within 80% of the budget; a tight budget is left as the seed rule had it."""
    from checkpoint_strategy.planning import inputs

    roomy = mk(**{**BIG, "budget_gb": 10**6})
    gaps = {b - a for a, b in zip(roomy.milestone_steps, roomy.milestone_steps[1:], strict=False)}
    assert min(gaps) >= 1000 and roomy.keep_last == planner.MAX_KEEP_LAST_AUTO
    assert all(m % roomy.frequency_steps == 0 for m in roomy.milestone_steps)
    assert roomy.total_storage_gb <= inputs.BUDGET_SHARE * 10**6
    tight = mk(**{**BIG, "budget_gb": 2300})
    assert tight.milestone_steps == planner.milestone_steps("seed", 1008000)
    assert tight.budget_use.startswith("the policy needs") and "keep_last" not in tight.budget_use
    # a user's --frequency: the policy is theirs (tradeoffs' sweep rows compare like with like)
    fixed = mk(**BIG, frequency=500)
    assert (
        fixed.milestone_steps == planner.milestone_steps("seed", 1008000)
        and "--frequency as given" in fixed.budget_use
    )


def test_multi_node_resumes_from_sharded_saves_single_node_as_before():
    big = mk(**BIG)
    assert big.policy.save_formats == ["sharded", "safetensors"]
    assert not any("only sharded" in w for w in big.warnings)
    assert (
        "gathers all 84 GB onto one rank" in big.formats_reason
        and "32x the sharded save" in big.formats_reason
    )
    small = mk(params=1e9, gpus=8)
    assert (
        small.policy.save_formats == ["full_state_dict", "safetensors"]
        and small.formats_reason is None
    )
    assert not any(a.input == "sharded training" for a in small.assumptions)
    # DDP over many nodes: full_state_dict kept as asked, and the price of it said
    ddp = mk(**BIG, formats=["full_state_dict", "safetensors"])
    assert ddp.policy.save_formats == ["full_state_dict", "safetensors"]
    assert "on every save: resume from sharded saves" in ddp.formats_reason


def test_assumptions_list_only_what_was_not_given():
    p = mk(params=1e9, gpus=8)
    assert {a.input for a in p.assumptions} >= {
        "storage write rate per node",
        "failure rate",
        "precision",
        "async saves",
        "restart cost",
    }
    given = mk(
        params=1e9,
        gpus=8,
        write_gbps=5,
        mtbf_hours=100,
        precision="mixed",
        async_save=False,
        restart_seconds=300,
    )
    assert given.assumptions == []
    unknown = mk(frequency=None)
    assert any(
        a.input == "save cost" and "--checkpoint-write-seconds" in a.option
        for a in unknown.assumptions
    )


def test_rounding_the_optimum_shows_its_price():
    """--gpus 16: the exact optimum 1470 steps is 2000 as a round number; both overheads are printed."""
    p = mk(total_steps=100000, step_seconds=2.5, budget_gb=500, model_size_gb=4, gpus=16)
    assert "the exact optimum is 1470 steps" in p.interval.explanation
    assert (
        "2000 as a round number (0.040%)" in p.interval.explanation
        and "0.038% expected overhead" in p.interval.explanation
    )
