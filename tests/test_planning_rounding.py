"""The plan says when and why the chosen interval differs from the exact optimum, plain rounding included."""

from __future__ import annotations

import math


def test_rounding_is_named_with_both_numbers(cli_run):
    rep = cli_run(
        "20000",
        "2.1",
        "5000",
        "--params",
        "7B",
        "--precision",
        "mixed",
        "--gpus",
        "64",
        "--max-loss-hours",
        "5",
        "--format",
        "json",
    ).json()
    iv = rep["interval"]
    exact = rep["optimal_interval_seconds"] / 2.1
    assert iv["reason"] == "failure_model_optimum" and rep["frequency_steps"] != round(exact)
    assert (
        f"optimum {exact:.0f} steps ({rep['optimal_interval_seconds'] / 60:.1f} min), rounded to "
        f"{rep['frequency_steps']}" in iv["explanation"]
    )
    text = cli_run(
        "20000",
        "2.1",
        "5000",
        "--params",
        "7B",
        "--precision",
        "mixed",
        "--gpus",
        "64",
        "--max-loss-hours",
        "5",
    ).out
    assert f"rounded to {rep['frequency_steps']} (a round number of steps" in text


def test_a_cap_names_the_exact_optimum_too(cli_run):
    rep = cli_run("100000", "2.5", "500", "--model_size_gb", "4", "--format", "json").json()
    iv = rep["interval"]
    exact = rep["optimal_interval_seconds"] / 2.5
    assert iv["reason"] == "max_loss_cap" and "--max-loss-hours 1 cap" in iv["explanation"]
    # and the price of the round number itself (issue 42): the overhead at the exact optimum and at the round one
    assert (
        f"the exact optimum is {exact:.0f} steps ({exact * 2.5 / 3600:.2f} h, " in iv["explanation"]
    )
    assert iv["explanation"].endswith(
        f"expected overhead), {iv['optimum_steps']} as a round number "
        f"({iv['optimum_overhead_fraction']:.3%})"
    )


def test_no_note_when_the_interval_is_the_exact_optimum(cli_run):
    rep = cli_run(
        "100000", "2.5", "500", "--model_size_gb", "4", "--frequency", "1000", "--format", "json"
    ).json()
    exact = rep["optimal_interval_seconds"] / 2.5
    assert (
        math.isfinite(exact)
        and round(exact) != 1000
        and "exact optimum is" in rep["interval"]["explanation"]
    )
