"""planning/planner.py and sizing.py: sizes, milestones, retention, risk and warnings."""

import math
import os
from pathlib import Path

import pytest

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning import PlanArguments, plan
from checkpoint_strategy.planning import planner, sizing


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
    assert (b.rolling_gb, b.in_flight_gb, b.milestones_gb, b.milestones_outside_window) == (120, 12, 48, 4)
    assert p.fits_budget is True
    assert p.rollback_points == 14


@pytest.mark.parametrize("text, value", [("7B", 7e9), ("1.3e9", 1.3e9), ("350M", 3.5e8), ("125k", 1.25e5),
                                         ("2t", 2e12), ("1000", 1000.0)])
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


@pytest.mark.parametrize("x, nice", [(1, 1), (3, 2), (4, 5), (2939, 2500), (6000, 5000), (7400, 10000), (0.2, 1)])
def test_nice_steps(x, nice):
    assert planner.nice_steps(x) == nice


def test_frequency_is_failure_optimum_capped_by_max_loss():
    # 8 GPUs -> job MTBF 6250 h: the optimum is hours apart, the 1 h default cap wins.
    p = mk(model_size_gb=4, step_seconds=2.5, total_steps=100000, budget_gb=500)
    assert p.frequency_steps * 2.5 <= 3600
    # the cap is kept: it is the reason for the interval (with its price), not a warning about the plan
    assert p.interval.reason == "max_loss_cap" and "--max-loss-hours 1 cap" in p.interval.explanation
    assert p.max_data_loss_hours <= 1 and not any("--max-loss-hours" in w for w in p.warnings)


def test_frequency_follows_mtbf_when_failures_are_frequent():
    # 16k GPUs at 50k GPU-hours each -> MTBF ~3 h: the optimum is well under the 1 h cap.
    p = mk(model_size_gb=4, step_seconds=1, total_steps=10**6, budget_gb=10**4, gpus=16384, write_gbps=1,
           min_interval_seconds=0)
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


def test_sharded_only_warns_hardware_specific():
    p = mk(model_size_gb=1, formats=["sharded"])
    assert any("hardware-specific" in w for w in p.warnings)


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
    p = mk(params=1e9, frequency=500, budget_gb=budget, formats=["full_state_dict"], milestones="none")
    assert fit == 7
    assert p.keep_last == fit and p.total_storage_gb == budget and p.fits_budget is True


def test_explicit_milestone_at_the_final_step_is_kept():
    assert planner.milestone_steps([1000, 50000], 50000) == [1000, 50000]
    assert planner.milestone_steps([1000, 50001], 50000) == [1000]
    p = mk(model_size_gb=1, frequency=500, milestones=[1000, 50000])
    assert p.milestone_steps == [1000, 50000]


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
    p = mk(model_size_gb=1, frequency=frequency, budget_gb=10**6)
    horizon = planner.SPIKE_HORIZON_STEPS
    needed = min(k for k in range(1, 100) if _oldest_reach(50000, frequency, k) >= horizon)
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
    auto = mk(model_size_gb=1, frequency=10, budget_gb=10**6, milestones="none")
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
    p = mk(total_steps=N, step_seconds=s, budget_gb=2000, params=params, precision="fp32", frequency=f, keep_last=k,
           formats=["full_state_dict", "safetensors"], milestones=[16000, 48000], gpus=64, mtbf_hours=mtbf_h,
           checkpoint_write_seconds=C, restart_seconds=R, async_save=False)
    d = p.model_dump(mode="json")
    jsonschema.validate(d, load_schema("plan.schema.json"))
    M, tau, ckpt, weights = mtbf_h * 3600, f * s, params * 12 / 1e9, params * 4 / 1e9

    def over(t):
        return M * math.exp(R / M) * math.expm1((t + C) / M) / t - 1

    taus = np.linspace(100.0, 20000.0, 1_990_001)
    t_opt = float(taus[np.argmin(M * np.exp(R / M) * np.expm1((taus + C) / M) / taus)])
    approx = pytest.approx
    assert (d["total_training_hours"], d["storage_budget_gb"], d["params"], d["precision"], d["preset"]) == (
        approx(N * s / 3600), 2000, params, "fp32", "auto")
    assert (d["model_size_gb"], d["checkpoint_size_gb"]) == (approx(weights), approx(ckpt))
    assert (d["frequency_steps"], d["frequency_hours"], d["keep_last"]) == (f, approx(tau / 3600, abs=1e-6), k)
    assert d["milestone_steps"] == [16000, 48000]
    b = d["storage_breakdown"]  # window = the 6 saves 44000..48000: 16000 lies outside, 48000 inside
    assert (b["rolling_gb"], b["in_flight_gb"], b["milestones_gb"], b["milestones_outside_window"]) == (
        approx(k * ckpt), approx(ckpt), approx(ckpt), 1)
    assert (b["safetensors_exports"], b["safetensors_exports_gb"]) == (2, approx(2 * weights))
    total = (k + 1) * ckpt + ckpt + 2 * weights
    assert d["rolling_storage_gb"] == approx(k * ckpt) and d["total_storage_gb"] == approx(total) == b["total_gb"]
    assert d["fits_budget"] is True and d["rollback_points"] == k + 1 and d["rollback_horizon_steps"] == k * f
    assert d["max_data_loss_hours"] == approx(tau / 3600, abs=1e-6)
    assert d["expected_overhead_fraction"] == approx(over(tau), abs=1e-6)
    assert d["expected_wall_hours"] == approx(N * s / 3600 * (1 + over(tau)), rel=1e-6)
    assert d["expected_failures"] == approx(N * s * (1 + over(tau)) / M, rel=1e-5)
    assert d["optimal_interval_seconds"] == approx(t_opt, abs=0.02)
    assert d["optimal_interval_steps"] == approx(t_opt / s, abs=0.01)
    fm = d["failure_model"]
    daly37 = math.sqrt(2 * C * M) * (1 + math.sqrt(C / (2 * M)) / 3 + C / (2 * M) / 9) - C
    assert (fm["mtbf_hours"], fm["gpus"], fm["checkpoint_write_seconds"], fm["persist_seconds"],
            fm["restart_seconds"], fm["async_save"]) == (mtbf_h, 64, C, C, R, False)
    assert fm["young_interval_seconds"] == approx(math.sqrt(2 * C * M), abs=1e-3)
    assert fm["daly_interval_seconds"] == approx(daly37, abs=1e-3)
    assert fm["optimal_interval_seconds"] == approx(t_opt, abs=0.02)
    iv = d["interval"]
    assert iv["reason"] == "frequency_option" and iv["optimum_steps"] == _nearest_nice(t_opt / s) == 1000
    assert iv["optimum_overhead_fraction"] == approx(over(1000 * s), abs=1e-6)
    assert iv["optimum_max_data_loss_hours"] == approx(1000 * s / 3600, abs=1e-6)
    w = d["storage_writes"]
    assert (w["nodes"], w["gpus_per_node"], w["write_gbps"]) == (8, 8, None)
    assert w["data_written_per_day_gb"] == approx(ckpt * 86400 / (tau + C), rel=1e-6)
    assert w["storage_busy_fraction"] == approx(C / (tau + C), abs=1e-6)
    assert d["policy"] == {"frequency": f"every_{f}_steps", "keep_last": k, "keep_milestone": [16000, 48000],
                           "save_optimizer": True, "save_formats": ["full_state_dict", "safetensors"],
                           "validate_on_save": True, "async_save": False,
                           "emergency_save_on": ["loss_spike_detected", "gradient_norm_exceeded"]}
    assert set(d["sources"]) == {"checkpoint_size", "gpu_mtbf", "interval", "spike_horizon", "async"}
    assert d["warnings"] == []


# the 1, 2, 2.5, 5 x 10^k grid, built here: the planner's rounding functions against brute force
GRID = sorted({int(m * 10**e) for e in range(0, 10) for m in (1, 2, 2.5, 5) if float(m * 10**e).is_integer()})
PROBES = sorted({1.0, 0.5, 1.5, *GRID[:30], *(g * 1.01 for g in GRID[:30]), *(g * 0.99 for g in GRID[:30]),
                 *(g * 1.3 for g in GRID[:30]), *(g * 0.77 for g in GRID[:30])})


@pytest.mark.parametrize("x", PROBES)
def test_nice_rounding_against_brute_force(x):
    assert planner.nice_steps(x) == (1 if x <= 1 else min(GRID, key=lambda v: (abs(math.log(v / x)), v)))
    assert planner.nice_ceil(x) == (1 if x <= 1 else min(v for v in GRID if v >= x))
    assert planner.nice_floor(x) == (1 if x < 1 else max(v for v in GRID if v <= x))


@pytest.mark.parametrize("spec, total, expected", [
    ("seed", 1000, [1000]), ("seed", 999, [999]), ("seed", 5000, [1000, 5000]),
    ("seed", 10000, [1000, 5000, 10000]), ("seed", 25000, [1000, 5000, 10000, 25000]),
    ("seed", 100000, [1000, 5000, 10000, 25000, 50000, 100000]),
    ("seed", 1000000, [1000, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000]),
    ("pow2", 1000, [1000]), ("pow2", 4000, [1000, 2000, 4000]), ("pow2", 3999, [1000, 2000, 3999]),
    ([0, 1, 2, 10], 10, [1, 2, 10]),
])
def test_milestone_rules_at_their_edges(spec, total, expected):
    """docs/model.md: seed = 1000, 5000, then 1, 2.5, 5 x 10^k from 10 000; pow2 = 1000 x 2^k; both keep the
    final step; a list keeps its steps in 1..total_steps."""
    assert planner.milestone_steps(spec, total) == expected


@pytest.mark.parametrize("formats, copies", [(["full_state_dict"], 1), (["sharded"], 1),
                                             (["full_state_dict", "sharded"], 2), (["safetensors"], 1)])
def test_each_resumable_format_is_a_copy_of_the_checkpoint(formats, copies):
    """Storage per save = checkpoint size x resumable formats (full and sharded both: two copies; none: one)."""
    p = mk(model_size_gb=1, frequency=500, keep_last=4, milestones="none", formats=formats, budget_gb=10**6)
    assert p.checkpoint_size_gb == pytest.approx(3.0 * copies)
    assert p.storage_breakdown.rolling_gb == pytest.approx(4 * 3.0 * copies)


def test_window_of_a_run_ending_on_a_save_holds_keep_last_distinct_saves():
    """10 000 steps saved every 500, keep 4: the window is 8500, 9000, 9500, 10000 (the final save is a regular
    one), so a milestone at 8500 is inside it and costs nothing extra; at 8000 it is outside."""
    assert planner.saved_steps_tail(10000, 500, 4) == [8500, 9000, 9500, 10000]
    assert planner.saved_steps_tail(10100, 500, 4) == [9000, 9500, 10000, 10100]
    inside = mk(total_steps=10000, model_size_gb=1, frequency=500, keep_last=4, milestones=[8500], budget_gb=10**6)
    outside = mk(total_steps=10000, model_size_gb=1, frequency=500, keep_last=4, milestones=[8000], budget_gb=10**6)
    assert inside.storage_breakdown.milestones_outside_window == 0
    assert outside.storage_breakdown.milestones_outside_window == 1


def test_synchronous_save_stalls_for_the_whole_write():
    """--no-async: C = checkpoint size / write rate (docs/model.md); async: 10 % of it."""
    sync = mk(model_size_gb=10, write_gbps=2.0, async_save=False)
    asyn = mk(model_size_gb=10, write_gbps=2.0, async_save=True)
    assert sync.failure_model.checkpoint_write_seconds == pytest.approx(30 / 2.0)
    assert asyn.failure_model.checkpoint_write_seconds == pytest.approx(0.1 * 30 / 2.0)
    assert sync.failure_model.persist_seconds == asyn.failure_model.persist_seconds == pytest.approx(15.0)


def test_edges_of_the_rules_the_mutation_run_found_unpinned():
    # seed milestones of 1 000 000 when the run is 1.5 M steps (10^6 <= N < 11^6)
    assert planner.milestone_steps("seed", 1500000)[-3:] == [500000, 1000000, 1500000]
    # fewer saves than keep_last: only the steps that exist, never step 0 or a negative one
    assert planner.saved_steps_tail(1000, 500, 4) == [500, 1000]
    assert planner.saved_steps_tail(3, 1, 5) == [1, 2, 3]
    # auto keeps its 10 when they fit: nothing "lowered"; lowered to fit exactly: said so
    roomy = mk(model_size_gb=1, frequency=500, budget_gb=10**6)
    assert roomy.keep_last == 10 and not any("lowered" in w for w in roomy.warnings)
    exact = mk(params=1e9, frequency=500, budget_gb=96, formats=["full_state_dict"], milestones="none")
    assert exact.keep_last == 7 and any("keep_last lowered to 7" in w for w in exact.warnings)
    # unknown model size: every storage field present, sizes unknown, counts still counted
    unknown = mk(frequency=500, precision="mixed", formats=["full_state_dict", "safetensors"])
    assert unknown.precision == "mixed"
    b = unknown.model_dump(mode="json")["storage_breakdown"]
    assert b == {"checkpoint_size_gb": None, "rolling_gb": None, "in_flight_gb": None, "milestones_gb": None,
                 "milestones_outside_window": 4, "safetensors_exports_gb": None, "safetensors_exports": 5,
                 "total_gb": None}
    # the warnings carry text, and the MTBF says where it came from
    past = mk(model_size_gb=1, frequency=500, milestones=[1000, 60000])
    assert any("milestones past total_steps 50000 were dropped" in w for w in past.warnings)
    only_weights = mk(model_size_gb=1, frequency=500, formats=["safetensors"])
    assert any(w.startswith("no resumable format in --formats") for w in only_weights.warnings)
    assert "GPU-hours per GPU (Llama 3) / 8 GPUs" in mk(model_size_gb=1, gpus=8).failure_model.mtbf_source


def test_interval_exactly_at_its_limits_is_not_limited():
    """An optimum that equals the --max-loss-hours cap is the optimum (nothing is capped, no warning); a
    --frequency equal to the run's length needs no 'below the interval' warning."""
    at_cap = mk(total_steps=100000, step_seconds=3.6, model_size_gb=1, checkpoint_write_seconds=36, mtbf_hours=50,
                async_save=False, max_loss_hours=1)
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
    "seed-cap": (dict(total_steps=100000, step_seconds=2.5, budget_gb=500, model_size_gb=4),
                 "max_loss_cap", []),
    # --frequency past the cap (and past --min-interval-seconds in hours): the cap warning names the interval
    "frequency-over-cap": (dict(model_size_gb=1, frequency=5000, gpus=16, min_interval_seconds=86400),
                           "frequency_option", ["with --frequency 5000: saving every 250 steps keeps it",
                                                "more often than --min-interval-seconds 86400"]),
    # one step is longer than the cap: no interval keeps it, the cap gives the shortest (one step)
    "step-beyond-cap": (dict(total_steps=1000, step_seconds=7200, budget_gb=10**5, model_size_gb=100, gpus=1,
                             async_save=False, write_gbps=1), "max_loss_cap", ["one step of 7200 s"]),
    # an async save takes longer to reach storage than the cap itself
    "save-longer-than-cap": (dict(budget_gb=10**5, model_size_gb=1000, write_gbps=0.5), "storage_floor",
                             ["longer than the cap itself", "the storage spends"]),
    # the cap needs saves closer than the storage sustains
    "cap-below-storage-floor": (dict(budget_gb=10**5, model_size_gb=1000, write_gbps=1), "storage_floor",
                                ["staying within it needs a save every 50 steps"]),
    # --frequency below the storage floor: saves would overlap
    "overlap": (dict(budget_gb=10**5, model_size_gb=100, write_gbps=1, frequency=10), "storage_floor",
                ["saves would overlap"]),
    # the optimum itself is below the storage floor (no --max-loss-hours clause in the explanation)
    "optimum-below-storage-floor": (dict(step_seconds=1, budget_gb=10**5, model_size_gb=100, write_gbps=1,
                                         mtbf_hours=0.5, min_interval_seconds=0), "storage_floor",
                                    ["saves would overlap"]),
    # slow synchronous saves and a short MTBF: busy storage, TB a day, and a run that takes ~5x its compute
    "busy-daily-overhead": (dict(step_seconds=1, budget_gb=10, model_size_gb=1000, gpus=40000, async_save=False,
                                 write_gbps=1), "failure_model_optimum",
                            ["budget too small", "TB of checkpoints a day", "x its compute time"]),
    # petabytes a day, from 2048 nodes capped by the storage
    "petabytes-a-day": (dict(step_seconds=1, budget_gb=10**6, model_size_gb=10000, gpus=16384, frequency=100,
                             keep_last=2, milestones="none"), "frequency_option",
                        ["PB of checkpoints a day"]),
    # a small budget written many times a day: GB
    "gigabytes-a-day": (dict(budget_gb=1, model_size_gb=0.1, frequency=100, keep_last=2, milestones="none",
                             formats=["full_state_dict"]), "frequency_option",
                        ["GB of checkpoints a day"]),
    # the conservative preset; 7 off-grid milestones (the list is cut at 6) and one past the end
    "preset-and-milestones": (dict(model_size_gb=1, preset="conservative", max_loss_hours=100, gpus=1,
                                   milestones=[700, 1300, 2100, 3300, 4700, 5900, 7100, 60000]), "preset",
                              ["were dropped", "5900, ... are not multiples of 500"]),
    # the aggressive preset with --mtbf-hours and --checkpoint-write-seconds (their own sources)
    "aggressive-explicit-cost": (dict(model_size_gb=1, preset="aggressive", mtbf_hours=2000, max_loss_hours=100,
                                      checkpoint_write_seconds=120, async_save=False), "preset", []),
    # no model size, no optimizer, no resumable format, keep_last 1, a run shorter than the interval
    "unknown-size": (dict(total_steps=100, frequency=500, save_optimizer=False, formats=["safetensors"],
                          keep_last=1), "total_steps",
                     ["model size missing", "optimizer state not saved", "no resumable format",
                      "checkpoint cost unknown", "below the interval 500", "keep_last 1 cannot"]),
    # --min-interval-seconds sets the interval; 16 384 GPUs
    "min-interval": (dict(model_size_gb=1, gpus=16384, min_interval_seconds=3000), "min_interval", []),
    # the optimum, rounded (minutes); exactly 6 off-grid milestones (the whole list is shown)
    "optimum-rounded": (dict(total_steps=10**6, step_seconds=1, budget_gb=10**4, model_size_gb=4, gpus=16384,
                             write_gbps=1, min_interval_seconds=0,
                             milestones=[1001, 2001, 3001, 4001, 5001, 6001]), "failure_model_optimum",
                        ["1001, 2001, 3001, 4001, 5001, 6001 are not multiples of 200"]),
    # --frequency below --min-interval-seconds (minutes), sharded only
    "frequency-below-min-interval": (dict(model_size_gb=1, frequency=10, formats=["sharded"]), "frequency_option",
                                     ["hardware-specific", "saves every 1.7 min", "TB of checkpoints a day"]),
    # keep_last lowered to fit the budget
    "lowered-to-fit": (dict(budget_gb=100, params=1e9, frequency=500, formats=["full_state_dict"],
                            milestones="none"), "frequency_option", ["keep_last lowered to 7"]),
    # two tiers: the persistent plan's MTBF source says it covers node losses only
    "two-tier": (dict(total_steps=100000, step_seconds=2.5, budget_gb=5000, params=7e9, gpus=512,
                      local_tier={"gb_per_node": 2000, "gbps_per_node": 5}), "min_interval", []),
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
    assert text == golden.read_text(encoding="utf-8"), f"{golden.name} changed: check the diff, then UPDATE_GOLDEN=1"
