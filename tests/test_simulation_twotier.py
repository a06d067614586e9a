"""simulate with two tiers (plan --local-tier): the engine against exact single-tier cases, and the CLI."""

from __future__ import annotations

import json
import math

import pytest

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.simulation.montecarlo import Setup, in_flight_wall_seconds
from checkpoint_strategy.simulation.twotier import TwoTierSetup, run_two_tier


def _mean_se(wall):
    return float(wall.mean()), float(wall.std(ddof=1) / math.sqrt(wall.size))


@pytest.mark.parametrize(
    "N, f_l, r, C_l, P_l", [(2000, 10, 5, 20.0, 200.0), (1503, 25, 4, 5.0, 5.0)]
)
def test_no_node_loss_and_free_persistent_saves_is_the_local_tier_alone(N, f_l, r, C_l, P_l):
    tt = TwoTierSetup(
        total_steps=N,
        step_seconds=60.0,
        f_local=f_l,
        f_persistent=f_l * r,
        C_local=C_l,
        P_local=P_l,
        C_persistent=0.0,
        P_persistent=0.0,
        R=300.0,
        M=3 * 3600.0,
        node_loss_fraction=0.0,
    )
    wall, fails, losses = run_two_tier(tt, 30000, 3, 20.0)
    exact = in_flight_wall_seconds(
        Setup(
            total_steps=N,
            step_seconds=60.0,
            frequency=f_l,
            keep_last=2,
            milestone_steps=(),
            C=C_l,
            P=P_l,
            R=300.0,
            M=3 * 3600.0,
        )
    )
    mean, se = _mean_se(wall)
    assert abs(mean - exact) <= 3 * se, (mean, exact, se)
    assert losses.sum() == 0 and fails.mean() > 1


def test_every_failure_a_node_loss_with_free_local_saves_is_the_persistent_tier_alone():
    tt = TwoTierSetup(
        total_steps=3000,
        step_seconds=60.0,
        f_local=10,
        f_persistent=100,
        C_local=0.0,
        P_local=0.0,
        C_persistent=60.0,
        P_persistent=900.0,
        R=300.0,
        M=4 * 3600.0,
        node_loss_fraction=1.0,
    )
    wall, fails, losses = run_two_tier(tt, 30000, 4, 20.0)
    exact = in_flight_wall_seconds(
        Setup(
            total_steps=3000,
            step_seconds=60.0,
            frequency=100,
            keep_last=2,
            milestone_steps=(),
            C=60.0,
            P=900.0,
            R=300.0,
            M=4 * 3600.0,
        )
    )
    mean, se = _mean_se(wall)
    assert abs(mean - exact) <= 3 * se, (mean, exact, se)
    assert (
        losses <= fails
    ).all() and losses.sum() > 0.9 * fails.sum()  # failures during a restart excepted


def test_local_tier_cuts_rework_and_node_losses_follow_the_fraction():
    base = dict(
        total_steps=3000,
        step_seconds=60.0,
        f_local=10,
        f_persistent=100,
        C_local=1.0,
        P_local=5.0,
        C_persistent=60.0,
        P_persistent=900.0,
        R=300.0,
        M=4 * 3600.0,
    )
    some, f1, l1 = run_two_tier(TwoTierSetup(**base, node_loss_fraction=0.5), 20000, 5, 20.0)
    all_, _, _ = run_two_tier(TwoTierSetup(**base, node_loss_fraction=1.0), 20000, 5, 20.0)
    assert some.mean() < all_.mean()  # half the failures roll back only to the last local save
    frac = l1.sum() / f1.sum()
    assert abs(frac - 0.5) < 4 * math.sqrt(0.25 / f1.sum()) + 0.01


def test_simulate_cli_two_tiers(capsys):
    argv = [
        "simulate",
        "500000",
        "8",
        "200000",
        "--params",
        "70B",
        "--precision",
        "mixed",
        "--gpus",
        "2048",
        "--write-gbps",
        "0.1",
        "--local-tier",
        "2000,5",
        "--runs",
        "500",
    ]
    assert main(argv + ["--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        data["two_tier"]["local_frequency_steps"] < data["two_tier"]["persistent_frequency_steps"]
    )
    assert data["policy"]["mtbf_hours"] == pytest.approx(
        50000 / 2048, rel=1e-4
    )  # the job MTBF: all failures
    assert 0.6 < data["two_tier"]["node_losses_per_run"] / data["mean_failures"] < 0.95
    assert any("two tiers" in c for c in data["analytic_caveats"])
    assert main(argv) == 0
    assert "Two Tiers:" in capsys.readouterr().out
    for extra in (["--spike-rate", "0.1"], ["--corrupt-prob", "0.1"]):
        assert main(argv + extra) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--local-tier" in err
