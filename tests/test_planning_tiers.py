"""Two-tier plans (--local-tier GB,GBPS): the figures by hand, the YAML tiers block, bad input."""

import math

import pytest

from checkpoint_strategy.cli import main
from checkpoint_strategy.planning import PlanArguments, failure, plan, planner
from checkpoint_strategy.render import render as render_plan

SEVENTY_B = dict(total_steps=500_000, step_seconds=8, budget_gb=200_000, params=70e9, precision="mixed", gpus=2048,
                 write_gbps=0.1)


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
    expected = (C_l / tau_l + C_p / tau_p + ((1 - phi) * (tau_l / 2 + P_l) + phi * (tau_p / 2 + P_p) + 600) / M)
    assert t.expected_overhead_fraction == pytest.approx(expected, rel=1e-5)
    assert p.expected_overhead_fraction == t.expected_overhead_fraction
    assert t.local.max_data_loss_hours == pytest.approx((tau_l + P_l) / 3600, rel=1e-5)
    assert t.persistent.max_data_loss_hours == p.max_data_loss_hours
    assert (t.local.failures_covered_fraction, t.persistent.failures_covered_fraction) == (pytest.approx(0.22), 0.78)
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
    assert doc["tiers"]["local"] == {"frequency": f"every_{two.two_tier.local.frequency_steps}_steps",
                                     "keep_last": 10}
    assert doc["tiers"]["persistent"]["frequency"] == doc["frequency"]
    assert "Two Tiers" in render_plan(two, "text") and "Two Tiers" not in render_plan(one, "text")


def test_prune_reads_a_policy_with_tiers(tmp_path):
    from checkpoint_strategy.checkpoints.prune import load_policy

    two = plan(PlanArguments(**SEVENTY_B, local_tier={"gb_per_node": 2000, "gbps_per_node": 5}))
    f = tmp_path / "policy.yaml"
    f.write_text(render_plan(two, "yaml"), encoding="utf-8")
    policy = load_policy(f)
    assert policy.keep_last == two.keep_last and policy.tiers.local.keep_last == 10


@pytest.mark.parametrize("gb, keep, warned", [(5, 0, "holds no checkpoint"), (8, 1, "holds one checkpoint"),
                                              (12, 2, None)])
def test_local_space_sets_the_local_window(gb, keep, warned):
    p = plan(PlanArguments(**SEVENTY_B, local_tier={"gb_per_node": gb, "gbps_per_node": 5}))
    assert p.two_tier.local.keep_last == keep
    assert any(warned in w for w in p.warnings) if warned else not any("local tier holds" in w for w in p.warnings)


@pytest.mark.parametrize("value", ["5", "5,x", "0,1", "-1,2", "1,2,3", "nan,1", ","])
def test_bad_local_tier_is_one_line_exit_2(value, capsys):
    rc = main(["1000", "1", "100", "--local-tier", value])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--local-tier" in err


def test_node_loss_fraction_bounds(capsys):
    assert main(["1000", "1", "100", "--node-loss-fraction", "1.5"]) == 2
    assert "--node-loss-fraction" in capsys.readouterr().err
    assert main(["1000", "1", "100", "--local-tier", "100,2", "--node-loss-fraction", "0.5", "--format", "json"]) == 0
    assert math.isclose(__import__("json").loads(capsys.readouterr().out)["two_tier"]["node_loss_fraction"], 0.5)


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


@pytest.mark.parametrize("n, cap, expected", [(10000, 2000, 2000), (10000, 300, 250), (10001, 10000, 137),
                                              (7, 5, 1), (1, 1, 1), (5000, 2000, 1000), (10**12, 777, 500),
                                              (121, 12, 11)])  # 11 x 11: found by trial division up to sqrt(n)
def test_divisor_at_most(n, cap, expected):
    from checkpoint_strategy.planning.tiers import divisor_at_most

    assert divisor_at_most(n, cap) == expected


def test_local_tier_warnings_say_what_the_space_needs():
    """980 GB over 256 nodes: 3.83 GB shards; 5 GB holds none (two shards need 7.66 GB: one is written before the
    oldest goes); without a model size the local save cost is assumed."""
    shard = 980 / 256
    none = plan(PlanArguments(**SEVENTY_B, local_tier={"gb_per_node": 5, "gbps_per_node": 5}))
    assert (f"the local tier holds no checkpoint: a {shard:.3g} GB shard per node needs at least {2 * shard:.3g} GB "
            "of node-local space (one written before the oldest goes)") in none.warnings
    one = plan(PlanArguments(**SEVENTY_B, local_tier={"gb_per_node": 8, "gbps_per_node": 5}))
    assert ("the local tier holds one checkpoint: a corrupt newest local save leaves only the persistent tier; give "
            "it room for two") in one.warnings
    unknown = plan(PlanArguments(total_steps=1000, step_seconds=1, budget_gb=100,
                                 local_tier={"gb_per_node": 8, "gbps_per_node": 5}))
    assert "model size missing: the local tier's save cost is assumed 1 s" in unknown.warnings
    assert unknown.two_tier.local.checkpoint_write_seconds == 1.0
