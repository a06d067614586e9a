"""Two-tier plans (--local-tier GB,GBPS): the figures by hand, the YAML tiers block, bad input."""

import math

import pytest

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.planning import PlanArguments, failure, plan, planner
from checkpoint_strategy.render import render as render_plan

SEVENTY_B = dict(
    total_steps=500_000,
    step_seconds=8,
    budget_gb=200_000,
    params=70e9,
    precision="mixed",
    gpus=2048,
    write_gbps=0.1,
)


def test_two_tier_figures_by_hand():
    p = plan(PlanArguments(**SEVENTY_B, local_tier={"gb_per_node": 2000, "gbps_per_node": 5}))
    t = p.two_tier
    M = 50000 / 2048 * 3600  # the job MTBF: every failure
    phi = 0.78
    shard = 980 / 256  # 2048 GPUs / 8 per node
    P_l = shard / 5
    C_l = 0.1 * P_l  # async: the host snapshot only
    assert t.local.shard_gb == pytest.approx(shard, rel=1e-5)
    assert t.local.persist_seconds == pytest.approx(P_l, rel=1e-5)
    assert t.local.checkpoint_write_seconds == pytest.approx(C_l, rel=1e-5)
    assert t.local.frequency_steps == planner.nice_steps(failure.exact_interval(C_l, M) / 8)
    assert t.local.keep_last == 10  # 2000 GB holds 521 shards: capped at 10
    assert t.local.storage_per_node_gb == pytest.approx(11 * shard, rel=1e-5)
    # the persistent tier is the single-tier plan for node losses only (MTBF M / phi)
    single = plan(PlanArguments(**SEVENTY_B, mtbf_hours=M / 3600 / phi))
    assert t.persistent.frequency_steps == p.frequency_steps == single.frequency_steps
    assert p.frequency_steps % t.local.frequency_steps == 0
    tau_l, tau_p = t.local.frequency_steps * 8, p.frequency_steps * 8
    P_p = 980 / 0.1  # the persistent tier: 980 GB at 0.1 GB/s
    C_p = 0.1 * P_p
    expected = (
        C_l / tau_l
        + C_p / tau_p
        + ((1 - phi) * (tau_l / 2 + P_l) + phi * (tau_p / 2 + P_p) + 600) / M
    )
    assert t.expected_overhead_fraction == pytest.approx(expected, rel=1e-5)
    assert p.expected_overhead_fraction == t.expected_overhead_fraction
    assert t.local.max_data_loss_hours == pytest.approx((tau_l + P_l) / 3600, rel=1e-5)
    assert t.persistent.max_data_loss_hours == p.max_data_loss_hours
    assert (t.local.failures_covered_fraction, t.persistent.failures_covered_fraction) == (
        pytest.approx(0.22),
        0.78,
    )
    assert "node losses only" in p.failure_model.mtbf_source
    assert p.expected_failures == pytest.approx(p.expected_wall_hours * 3600 / M, rel=1e-5)


def test_yaml_gains_tiers_only_for_two_tiers():
    one = plan(PlanArguments(**SEVENTY_B))
    two = plan(PlanArguments(**SEVENTY_B, local_tier={"gb_per_node": 2000, "gbps_per_node": 5}))
    y1, y2 = render_plan(one, "yaml"), render_plan(two, "yaml")
    assert "tiers" not in y1 and "tiers" not in one.model_dump(mode="json")["policy"]
    assert "two_tier" not in one.model_dump(mode="json")
    import yaml

    doc = yaml.safe_load(y2)["checkpoint_policy"]
    assert doc["tiers"]["local"] == {
        "frequency": f"every_{two.two_tier.local.frequency_steps}_steps",
        "keep_last": 10,
    }
    assert doc["tiers"]["persistent"]["frequency"] == doc["frequency"]
    assert "Two Tiers" in render_plan(two, "text") and "Two Tiers" not in render_plan(one, "text")


def test_prune_reads_a_policy_with_tiers(tmp_path):
    from checkpoint_strategy.formats.models import CheckpointPolicy

    two = plan(PlanArguments(**SEVENTY_B, local_tier={"gb_per_node": 2000, "gbps_per_node": 5}))
    f = tmp_path / "policy.yaml"
    f.write_text(render_plan(two, "yaml"), encoding="utf-8")
    policy = CheckpointPolicy.from_file(f)
    assert policy.keep_last == two.keep_last and policy.tiers.local.keep_last == 10


@pytest.mark.parametrize(
    "gb, keep, warned",
    [(5, 0, "holds no checkpoint"), (8, 1, "holds one checkpoint"), (12, 2, None)],
)
def test_local_space_sets_the_local_window(gb, keep, warned):
    p = plan(PlanArguments(**SEVENTY_B, local_tier={"gb_per_node": gb, "gbps_per_node": 5}))
    assert p.two_tier.local.keep_last == keep
    assert (
        any(warned in w for w in p.warnings)
        if warned
        else not any("local tier holds" in w for w in p.warnings)
    )


@pytest.mark.parametrize("value", ["5", "5,x", "0,1", "-1,2", "1,2,3", "nan,1", ","])
def test_bad_local_tier_is_one_line_exit_2(value, capsys):
    rc = main(["1000", "1", "100", "--local-tier", value])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--local-tier" in err


def test_node_loss_fraction_bounds(capsys):
    assert main(["1000", "1", "100", "--node-loss-fraction", "1.5"]) == 2
    assert "--node-loss-fraction" in capsys.readouterr().err
    assert (
        main(
            [
                "1000",
                "1",
                "100",
                "--local-tier",
                "100,2",
                "--node-loss-fraction",
                "0.5",
                "--format",
                "json",
            ]
        )
        == 0
    )
    assert math.isclose(
        __import__("json").loads(capsys.readouterr().out)["two_tier"]["node_loss_fraction"], 0.5
    )


@pytest.mark.parametrize("extra", [["tradeoffs"], ["simulate", "--spike-rate", "0.5"]])
def test_tradeoffs_and_simulate_with_spikes_refuse_two_tiers_in_one_line(extra, capsys):
    rc = main([extra[0], "1000", "1", "100", "--local-tier", "100,2"] + extra[1:])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--local-tier" in err


def test_tier_functions_are_short_and_documented():
    import inspect

    from checkpoint_strategy.planning import tiers

    for name, fn in inspect.getmembers(tiers, inspect.isfunction):
        if fn.__module__ == tiers.__name__:
            assert len(inspect.getsource(fn).splitlines()) <= 60, name
            assert name.startswith("_") or fn.__doc__, name


@pytest.mark.parametrize(
    "n, cap, expected",
    [
        (10000, 2000, 2000),
        (10000, 300, 250),
        (10001, 10000, 137),
        (7, 5, 1),
        (1, 1, 1),
        (5000, 2000, 1000),
        (10**12, 777, 500),
        (121, 12, 11),
    ],
)  # 11 x 11: found by trial division up to sqrt(n)
def test_divisor_at_most(n, cap, expected):
    from checkpoint_strategy.planning.tiers import divisor_at_most

    assert divisor_at_most(n, cap) == expected


def test_local_tier_warnings_say_what_the_space_needs():
    """980 GB over 256 nodes: 3.83 GB shards; 5 GB holds none (two shards need 7.66 GB: one is written before the
    oldest goes); without a model size the local save cost is assumed."""
    shard = 980 / 256
    none = plan(PlanArguments(**SEVENTY_B, local_tier={"gb_per_node": 5, "gbps_per_node": 5}))
    assert (
        f"the local tier holds no checkpoint: a {shard:.3g} GB shard per node needs at least {2 * shard:.3g} GB "
        "of node-local space (one written before the oldest goes)"
    ) in none.warnings
    one = plan(PlanArguments(**SEVENTY_B, local_tier={"gb_per_node": 8, "gbps_per_node": 5}))
    assert (
        "the local tier holds one checkpoint: a corrupt newest local save leaves only the persistent tier; give "
        "it room for two"
    ) in one.warnings
    unknown = plan(
        PlanArguments(
            total_steps=1000,
            step_seconds=1,
            budget_gb=100,
            local_tier={"gb_per_node": 8, "gbps_per_node": 5},
        )
    )
    assert "model size missing: the local tier's save cost is assumed 1 s" in unknown.warnings
    assert unknown.two_tier.local.checkpoint_write_seconds == 1.0


NICE = {m * 10**k for m in (1, 2, 5) for k in range(14)} | {
    25 * 10**k for k in range(13)
}  # 1, 2, 2.5, 5 x 10^k


def divisor_oracle(n, cap):
    """By brute force, from the docstring: cap itself when it divides n; else the largest round (1, 2, 2.5, 5 x 10^k)
    divisor below cap when it is within a factor 10 of cap; else the largest divisor at most cap."""
    divs = [v for v in range(1, cap + 1) if n % v == 0]
    if divs[-1] == cap:
        return cap
    g = max(v for v in divs if v in NICE)
    return g if 10 * g >= cap else divs[-1]


def test_divisor_at_most_matches_brute_force():
    from checkpoint_strategy.planning.tiers import divisor_at_most

    for n in range(1, 130):
        for cap in range(1, n + 40):
            got = divisor_at_most(n, cap)
            assert type(got) is int and got == divisor_oracle(n, cap), (n, cap, got)
    for n, cap in [
        (4, 3),
        (30, 105),
        (30, 100),
        (7, 100),
        (2 * 3 * 7 * 11, 40),
        (2**10 * 3, 700),
        (9973 * 2, 3000),
    ]:
        assert divisor_at_most(n, cap) == divisor_oracle(n, cap), (n, cap)


def by_hand(p, args, phi=0.78):
    """The two-tier figures from the module docstring's model, computed here from the plan's inputs."""
    t, fm = p.two_tier, p.failure_model
    M = fm.mtbf_hours * 3600 * phi
    size = p.storage_breakdown.checkpoint_size_gb
    shard = size / p.storage_writes.nodes
    P_l = shard / args["local_tier"]["gbps_per_node"]
    C_l = P_l * (0.1 if fm.async_save else 1.0)
    lag_l = P_l if fm.async_save else 0.0
    lag_p = (fm.persist_seconds or 0.0) if fm.async_save else 0.0
    tau_l, tau_p = (
        t.local.frequency_steps * args["step_seconds"],
        p.frequency_steps * args["step_seconds"],
    )
    lost = (1 - phi) * (tau_l / 2 + lag_l) + phi * (tau_p / 2 + lag_p) + fm.restart_seconds
    return dict(
        C_l=C_l,
        P_l=P_l,
        lag_l=lag_l,
        tau_l=tau_l,
        M=M,
        overhead=C_l / tau_l + fm.checkpoint_write_seconds / tau_p + lost / M,
        lost_hours=lost / 3600,
    )


def test_synchronous_two_tier_figures_by_hand():
    """Without --async a local save stalls for the whole write (C_l = P_l) and is on storage when training resumes
    (no lag, on either tier)."""
    args = dict(SEVENTY_B, local_tier={"gb_per_node": 2000, "gbps_per_node": 5}, async_save=False)
    p = plan(PlanArguments(**args))
    t, h = p.two_tier, by_hand(p, args)
    assert p.failure_model.async_save is False
    assert (
        t.local.checkpoint_write_seconds
        == pytest.approx(h["P_l"], rel=1e-5)
        == t.local.persist_seconds
    )
    assert t.local.max_data_loss_hours == pytest.approx(h["tau_l"] / 3600, rel=1e-5)
    assert t.expected_overhead_fraction == pytest.approx(h["overhead"], rel=1e-5)
    assert t.expected_lost_hours_per_failure == pytest.approx(h["lost_hours"], rel=1e-5)
    assert t.local.frequency_steps == planner.nice_steps(
        failure.exact_interval(h["C_l"], h["M"]) / 8
    )


def test_local_interval_is_one_step_when_its_optimum_is():
    """A tiny shard on fast local storage with long steps: the local optimum is under one step, so every step is a
    local save (nothing raises it to two)."""
    args = dict(
        total_steps=100_000,
        step_seconds=300,
        budget_gb=100_000,
        params=1e6,
        gpus=8,
        async_save=False,
        write_gbps=1e-4,
        local_tier={"gb_per_node": 100, "gbps_per_node": 10},
    )
    p = plan(PlanArguments(**args))
    h = by_hand(p, args)
    assert failure.exact_interval(h["C_l"], h["M"]) < 300 * 1.4  # nice_steps rounds it to 1
    assert p.two_tier.local.frequency_steps == 1 and p.frequency_steps % 2 == 0


def test_slow_local_storage_saves_no_more_often_than_it_persists():
    """Async local saves on slow node storage: a local save takes P_l to reach the disk, so the local interval is
    raised to the round number of steps >= P_l - C_l (then to a divisor of the persistent interval)."""
    args = dict(
        total_steps=1_000_000,
        step_seconds=2,
        budget_gb=10**7,
        params=7e9,
        precision="mixed",
        gpus=8,
        mtbf_hours=1,
        max_loss_hours=100,
        write_gbps=0.00565,
        local_tier={"gb_per_node": 1000, "gbps_per_node": 0.049},
    )
    p = plan(PlanArguments(**args))
    h = by_hand(p, args)
    floor_steps = (h["lag_l"] - h["C_l"]) / 2
    optimum_steps = failure.exact_interval(h["C_l"], h["M"]) / 2
    assert optimum_steps < floor_steps  # the floor binds
    local_f = p.two_tier.local.frequency_steps
    assert local_f >= floor_steps and p.frequency_steps % local_f == 0
    expected = divisor_oracle(
        p.frequency_steps,
        max(
            min(planner.nice_steps(optimum_steps), p.frequency_steps),
            planner.nice_ceil(floor_steps),
        ),
    )
    assert local_f == expected
    assert p.two_tier.expected_overhead_fraction == pytest.approx(h["overhead"], rel=1e-5)


def test_unknown_size_local_tier_by_hand():
    """No model size: C_l = P_l = 1 s assumed, one local checkpoint kept, no persist lag on the persistent tier."""
    args = dict(
        total_steps=1000,
        step_seconds=1,
        budget_gb=100,
        local_tier={"gb_per_node": 8, "gbps_per_node": 5},
    )
    p = plan(PlanArguments(**args))
    t, fm, phi = p.two_tier, p.failure_model, 0.78
    assert t.local.keep_last == 1 and fm.async_save and fm.persist_seconds is None
    tau_l, tau_p = t.local.frequency_steps, p.frequency_steps
    lost = (1 - phi) * (tau_l / 2 + 1.0) + phi * tau_p / 2 + fm.restart_seconds
    assert t.expected_lost_hours_per_failure == pytest.approx(
        lost / 3600, abs=1e-6
    )  # reported to 6 decimals


def test_given_job_mtbf_is_split_by_node_losses():
    """--mtbf-hours is the job MTBF (all failures); the persistent tier plans for node losses only: MTBF / phi."""
    p = plan(
        PlanArguments(
            **SEVENTY_B, mtbf_hours=10, local_tier={"gb_per_node": 2000, "gbps_per_node": 5}
        )
    )
    assert p.failure_model.mtbf_hours == pytest.approx(10 / 0.78, rel=1e-6)
    assert p.two_tier.job_mtbf_hours == pytest.approx(10, rel=1e-6)
