"""The planner and its storage: write rate from the cluster, the max-loss cap as a kept constraint, the floor
that keeps saves from overlapping, data written per day, and warnings computed on the final policy."""

import math

import pytest

from checkpoint_strategy.planning import PlanArguments, plan, planner

LLAMA3 = dict(
    total_steps=1_000_000,
    step_seconds=6.2,
    budget_gb=1_000_000,
    params=405e9,
    precision="mixed",
    gpus=16384,
)
SEVENTY_B = dict(
    total_steps=500_000,
    step_seconds=8,
    budget_gb=200_000,
    params=70e9,
    precision="mixed",
    gpus=2048,
    write_gbps=0.1,
)
BLOOM = dict(
    total_steps=115_311,
    step_seconds=105,
    budget_gb=100_000,
    params=176e9,
    precision="mixed",
    gpus=384,
    async_save=False,
)


def mk(**kw):
    return plan(PlanArguments(**kw))


def with_(base, **kw):
    return {**base, **kw}


def durable_ok(p) -> bool:
    """No save starts before the previous one is on storage: compute + stall >= time to storage."""
    fm = p.failure_model
    lag = fm.persist_seconds if fm.async_save and fm.persist_seconds is not None else 0.0
    return p.frequency_steps * p.step_seconds + fm.checkpoint_write_seconds >= lag - 1e-9


@pytest.mark.parametrize(
    "gpus, per_node, expected_gbps, nodes",
    [
        (8, 8, 1.0, 1),
        (9, 8, 2.0, 2),
        (2048, 8, 256.0, 256),
        (16384, 8, 2000.0, 2048),
        (64, 4, 16.0, 16),
    ],
)
def test_write_rate_scales_with_nodes_and_is_capped_by_storage(
    gpus, per_node, expected_gbps, nodes
):
    p = mk(
        total_steps=10000,
        step_seconds=1,
        budget_gb=1e6,
        params=7e9,
        gpus=gpus,
        gpus_per_node=per_node,
    )
    w = p.storage_writes
    assert (w.write_gbps, w.nodes, w.gpus_per_node) == (expected_gbps, nodes, per_node)
    assert f"x {nodes} node" in w.write_source
    assert ("capped by the storage's 2000 GB/s" in w.write_source) == (nodes > 2000)
    assert p.failure_model.persist_seconds == pytest.approx(
        p.checkpoint_size_gb / expected_gbps, rel=1e-6
    )


def test_write_rate_options_and_override():
    base = dict(total_steps=10000, step_seconds=1, budget_gb=1e6, params=7e9, gpus=1024)
    assert mk(**base, node_write_gbps=2.5).storage_writes.write_gbps == 320.0
    assert mk(**base, storage_gbps=50).storage_writes.write_gbps == 50.0
    over = mk(**base, write_gbps=3).storage_writes
    assert (over.write_gbps, over.write_source) == (3.0, "--write-gbps")
    given = mk(**base, checkpoint_write_seconds=40).storage_writes
    assert given.write_gbps is None and given.write_source == "--checkpoint-write-seconds"


def test_llama3_405b_overhead_under_ten_percent_and_loss_within_cap():
    p = mk(**LLAMA3)
    assert p.expected_overhead_fraction < 0.10  # the paper: > 90% effective training time
    assert p.max_data_loss_hours <= 1.0
    assert p.frequency_steps * 6.2 >= 300  # the default floor, not a save every minute
    assert p.interval.reason == "min_interval"
    assert p.interval.optimum_overhead_fraction <= p.expected_overhead_fraction
    assert not any("max data loss" in w for w in p.warnings)


def test_llama3_with_2tbps_storage_never_saves_every_minute_and_shows_volume():
    p = mk(**LLAMA3, write_gbps=2000)
    tau = p.frequency_steps * 6.2
    assert tau >= 300
    daily = p.checkpoint_size_gb * 86400 / (tau + p.failure_model.checkpoint_write_seconds)
    assert p.storage_writes.data_written_per_day_gb == pytest.approx(daily, rel=1e-6)


def test_daily_volume_warning_on_the_budget_share():
    p = mk(**with_(LLAMA3, write_gbps=2000, budget_gb=100_000))
    assert p.storage_writes.data_written_per_day_gb > planner.DAILY_BUDGET_WARN * 100_000
    assert any("of checkpoints a day" in w for w in p.warnings)
    assert not any("of checkpoints a day" in w for w in mk(**LLAMA3).warnings)


def test_seventy_b_at_100_mbps_warns_overlap_and_proposes_a_sustainable_interval():
    p = mk(**SEVENTY_B)
    assert durable_ok(p)
    # the storage floor (8820 s of compute between saves -> 2000 steps) meets the failure-model optimum
    assert p.frequency_steps == 2000 == p.interval.min_interval_steps
    cap = [w for w in p.warnings if w.startswith("max data loss")]
    assert len(cap) == 1 and "would overlap" in cap[0] and "every 2000 steps is as close" in cap[0]
    # the bandwidth the cap needs: tau + P <= 1 h with tau = 0.9 P  ->  P <= 3600 / 1.9
    need = 980 * 1.9 / 3600
    assert f"{need:.3g} GB/s" in cap[0]
    assert any("storage spends" in w for w in p.warnings)  # 9800 s writes, one every ~10600 s


def test_explicit_frequency_that_overlaps_is_changed_with_the_needed_bandwidth():
    p = mk(**SEVENTY_B, frequency=250)
    assert p.frequency_steps > 250 and durable_ok(p)
    w = next(w for w in p.warnings if w.startswith("saves would overlap"))
    need = 980 * 0.9 / (250 * 8)
    assert f"{need:.3g} GB/s" in w and f"saving every {p.frequency_steps} steps" in w


def test_cap_is_kept_and_priced():
    p = mk(**BLOOM)
    assert p.max_data_loss_hours <= 1.0
    assert p.interval.reason == "max_loss_cap"
    iv = p.interval
    assert iv.optimum_steps > p.frequency_steps
    assert iv.optimum_overhead_fraction < p.expected_overhead_fraction
    assert "--max-loss-hours 1 cap" in iv.explanation
    # the suggested cap reproduces the optimum's overhead
    suggested = float(iv.explanation.split("--max-loss-hours ")[-1].split(" gives")[0])
    again = mk(**BLOOM, max_loss_hours=suggested)
    assert again.frequency_steps == iv.optimum_steps
    assert again.expected_overhead_fraction == pytest.approx(iv.optimum_overhead_fraction)


def test_async_cap_subtracts_the_write_time():
    # 12 GB at 1 GB/s: 12 s to storage; cap 0.1 h = 360 s -> tau <= 348 s -> 348 steps -> nice 250
    p = mk(
        total_steps=100000,
        step_seconds=1,
        budget_gb=1e5,
        model_size_gb=4,
        max_loss_hours=0.1,
        min_interval_seconds=0,
    )
    assert p.frequency_steps == 250
    assert p.max_data_loss_hours <= 0.1


def test_frequency_option_is_checked_against_the_cap():
    p = mk(**BLOOM, frequency=100)
    assert p.max_data_loss_hours == pytest.approx(100 * 105 / 3600)
    w = [w for w in p.warnings if w.startswith("max data loss")]
    assert (
        len(w) == 1
        and "--frequency 100" in w[0]
        and f"every {p.interval.max_loss_cap_steps} steps" in w[0]
    )
    assert p.interval.reason == "frequency_option"


def test_preset_result_is_checked_like_any_other():
    p = mk(
        total_steps=100000,
        step_seconds=30,
        budget_gb=1e5,
        model_size_gb=100,
        gpus=1,
        preset="conservative",
        max_loss_hours=2,
    )
    assert p.frequency_steps == 200  # the 2 h cap (240 steps) -> 200
    q = mk(
        total_steps=100000,
        step_seconds=30,
        budget_gb=1e5,
        model_size_gb=1,
        preset="conservative",
        max_loss_hours=0.001,
    )
    assert any(w.startswith("max data loss") for w in q.warnings)


def test_one_step_beyond_the_cap_says_so():
    p = mk(total_steps=100, step_seconds=7200, budget_gb=1e5, model_size_gb=1, async_save=False)
    w = [w for w in p.warnings if w.startswith("max data loss")]
    assert len(w) == 1 and "one step of 7200 s" in w[0]
    assert p.frequency_steps == 1 and p.interval.reason == "max_loss_cap"


def test_min_interval_floor_is_configurable_and_yields_to_the_cap():
    base = dict(total_steps=10**6, step_seconds=1, budget_gb=1e6, model_size_gb=4, gpus=16384)
    assert mk(**base).frequency_steps >= 300
    assert mk(**base, min_interval_seconds=0).frequency_steps < 300
    capped = mk(**base, max_loss_hours=0.02)  # 72 s cap beats the 300 s default floor
    assert capped.max_data_loss_hours <= 0.02
    explicit = mk(**base, frequency=10)
    assert explicit.frequency_steps == 10
    assert any("--min-interval-seconds" in w for w in explicit.warnings)
    # 310 s is above the 300 s floor although the floor rounds up to 500 steps on the 1/2/2.5/5 grid
    assert not any("--min-interval-seconds" in w for w in mk(**base, frequency=310).warnings)


def test_default_milestones_align_with_the_interval():
    # OLMo 3 7B-like: the optimum is not a divisor of the seed milestone 1000
    p = mk(total_steps=100000, step_seconds=2, budget_gb=1e6, params=7e9, gpus=64, frequency=2500)
    assert all(m % 2500 == 0 or m == 100000 for m in p.milestone_steps)
    assert 2500 in p.milestone_steps and 1000 not in p.milestone_steps
    assert not any("not multiples" in w for w in p.warnings)
    given = mk(
        total_steps=100000,
        step_seconds=2,
        budget_gb=1e6,
        params=7e9,
        gpus=64,
        frequency=2500,
        milestones=[1000, 5000],
    )
    assert given.milestone_steps == [1000, 5000]
    assert any("not multiples" in w for w in given.warnings)


@pytest.mark.parametrize(
    "precision, per_param", [("fp32", 12), ("mixed", 14), ("mixed-no-master", 10)]
)
def test_precision_bytes_per_param(precision, per_param):
    p = mk(
        total_steps=1000,
        step_seconds=1,
        budget_gb=1e6,
        params=175e9,
        precision=precision,
        formats=["full_state_dict"],
    )
    assert p.checkpoint_size_gb == pytest.approx(175 * per_param)
    assert p.model_size_gb == pytest.approx(175 * (4 if precision == "fp32" else 2))


def test_plan_function_is_split_into_short_steps():
    import inspect

    for name, fn in inspect.getmembers(planner, inspect.isfunction):
        if fn.__module__ == planner.__name__:
            lines = len(inspect.getsource(fn).splitlines())
            assert lines <= 60, f"{name} has {lines} lines"
            if not name.startswith("_"):
                assert fn.__doc__, f"{name} has no docstring"


def test_nice_ceil():
    assert [planner.nice_ceil(x) for x in (0.3, 1, 1.1, 37.5, 1102.5, 9001, 48.4)] == [
        1,
        1,
        2,
        50,
        2000,
        10000,
        50,
    ]
    assert all(planner.nice_ceil(x) >= x for x in (3.3, 47, 121, 999.5, 12345))
    assert math.isclose(planner._ceil2(1.74), 1.8)


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from checkpoint_strategy.errors import UsageError  # noqa: E402


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.integers(1, 10**7),
    secs=st.floats(0.01, 1e4),
    params=st.one_of(st.none(), st.floats(1e6, 1e13)),
    gpus=st.integers(1, 100000),
    per_node=st.integers(1, 16),
    gbps=st.one_of(st.none(), st.floats(1e-3, 1e4)),
    min_s=st.floats(0, 1e5),
    cap=st.floats(1e-3, 1e3),
    freq=st.one_of(st.none(), st.integers(1, 10**6)),
    async_save=st.booleans(),
    tier=st.one_of(st.none(), st.tuples(st.floats(0.1, 1e5), st.floats(0.01, 100))),
)
def test_final_policy_invariants_hold_for_any_input(
    steps, secs, params, gpus, per_node, gbps, min_s, cap, freq, async_save, tier
):
    kw = dict(
        total_steps=steps,
        step_seconds=secs,
        budget_gb=1e6,
        params=params,
        gpus=gpus,
        gpus_per_node=per_node,
        write_gbps=gbps,
        min_interval_seconds=min_s,
        max_loss_hours=cap,
        frequency=freq,
        async_save=async_save,
    )
    if tier:
        kw["local_tier"] = {"gb_per_node": tier[0], "gbps_per_node": tier[1]}
    try:
        p = mk(**kw)
    except UsageError:
        return
    if (
        p.frequency_steps < steps
    ):  # more than one save: none may start before the previous is on storage
        assert durable_ok(p)
    over = p.max_data_loss_hours > cap * (1 + 1e-9) + 1e-6
    assert over == any(w.startswith("max data loss") for w in p.warnings)
    assert all(m % p.frequency_steps == 0 or m == steps for m in p.milestone_steps)
    assert p.interval.explanation and p.expected_overhead_fraction >= 0
    if tier:
        assert p.two_tier is not None and p.frequency_steps % p.two_tier.local.frequency_steps == 0
