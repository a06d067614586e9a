"""`simulate` end to end: formats, JSON keys and schema, determinism, bad input, fuzzing."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import jsonschema
import pytest
from cliresult import CLI, checkout_env
from fuzzcheck import MUTATE, SIM_OPTIONS, flatten, mutate, reached, reaches_core
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.resources import load_schema

SEED = ["simulate", "100000", "2.5", "500", "--model_size_gb", "4"]


def test_json_keys_schema_and_analytic_figure(cli_run):
    rc, out, err = cli_run(*(SEED + ["--runs", "2000", "--format", "json"]))
    assert rc == 0 and err == ""
    data = json.loads(out)
    for key in (
        "mean_wall_hours",
        "analytic_wall_hours",
        "p95_lost_hours",
        "mean_failures",
        "runs",
        "seed",
        "p50_wall_hours",
        "p95_wall_hours",
        "p99_wall_hours",
        "p99_lost_hours",
        "p95_failures",
        "overhead_fraction",
        "analytic_overhead_fraction",
    ):
        assert key in data
    assert data["runs"] == 2000 and data["seed"] == 0
    jsonschema.validate(data, load_schema("simulation-report.schema.json"))
    rc, plan_out, _ = cli_run("100000", "2.5", "500", "--model_size_gb", "4", "--format", "json")
    assert data["policy"]["frequency_steps"] == json.loads(plan_out)["frequency_steps"]
    assert data["spikes"] is None


def test_analytic_figure_is_dalys_formula(cli_run):
    """analytic_wall_hours computed here from docs/model.md's T(tau) = M e^(R/M) (e^((tau+C)/M) - 1) W / tau."""
    N, step, C, R, mtbf_h, f = 100000, 2.5, 30.0, 600.0, 10.0, 400
    data = cli_run(
        "simulate",
        N,
        step,
        500,
        "--model_size_gb",
        4,
        "--no-async",
        "--checkpoint-write-seconds",
        C,
        "--restart-seconds",
        R,
        "--mtbf-hours",
        mtbf_h,
        "--frequency",
        f,
        "--runs",
        10,
        "--format",
        "json",
    ).json()
    M, W, tau = mtbf_h * 3600.0, N * step, f * step
    daly = M * math.exp(R / M) * math.expm1((tau + C) / M) * W / tau
    assert data["analytic_wall_hours"] == pytest.approx(daly / 3600.0, rel=1e-6)
    assert data["analytic_overhead_fraction"] == pytest.approx(daly / W - 1.0, abs=1e-6)
    assert data["failure_free_wall_hours"] == pytest.approx((W + N / f * C) / 3600.0, rel=1e-6)


def test_same_seed_same_output_different_seed_differs(cli_run):
    argv = SEED + [
        "--runs",
        "3000",
        "--mtbf-hours",
        "20",
        "--spike-rate",
        "0.05",
        "--format",
        "json",
    ]
    _, a, _ = cli_run(*(argv + ["--seed", "42"]))
    _, b, _ = cli_run(*(argv + ["--seed", "42"]))
    _, c, _ = cli_run(*(argv + ["--seed", "43"]))
    assert a == b
    assert json.loads(a)["mean_wall_hours"] != json.loads(c)["mean_wall_hours"]
    assert json.loads(a)["seed"] == 42


def test_text_report_has_the_sections(cli_run):
    rc, out, err = cli_run(
        *(
            SEED
            + [
                "--runs",
                "2000",
                "--spike-rate",
                "0.02",
                "--keep-last",
                "1",
                "--corrupt-prob",
                "0.01",
            ]
        )
    )
    assert rc == 0 and err == ""
    order = [
        "=== Checkpoint Strategy Simulation ===",
        "Runs:               2000 (seed 0)",
        "Wall Time (h)",
        "Lost (h) *          ",
        "Failures            ",
        "Simulated vs Analytic:",
        "Rollbacks:",
        "Loss Spikes (0.02 per 1000 steps",
        "Window Missed:",
        "Only a Milestone:",
        "Warnings (from the plan):",
        "keep_last 1 cannot hold",
        "\nModel:",
    ]
    pos = [out.index(h) for h in order]
    assert pos == sorted(pos)
    assert "the analytic model has failures only" in out


def test_markdown_report(cli_run):
    rc, out, _ = cli_run(
        *(SEED + ["--runs", "1000", "--spike-rate", "0.01", "--format", "markdown"])
    )
    assert rc == 0
    assert out.startswith("## Checkpoint strategy simulation")
    assert "| Wall time (h) |" in out and "### Loss spikes" in out


def test_simulate_help_lists_its_options(cli_run):
    rc, out, _ = cli_run("simulate", "--help")
    assert rc == 0
    for opt in (
        "--runs",
        "--seed",
        "--spike-rate",
        "--corrupt-prob",
        "--model-size-gb",
        "--keep-last",
    ):
        assert opt in out


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--runs", "0"], "--runs"),
        (["--runs", "-5"], "--runs"),
        (["--runs", "2.5"], "--runs"),
        (["--runs", "abc"], "--runs"),
        (["--runs", "1e9"], "--runs"),
        (["--seed", "-1"], "--seed"),
        (["--seed", "1.5"], "--seed"),
        (["--seed", "x"], "--seed"),
        (["--seed", str(2**64)], "--seed"),
        (["--spike-rate", "-0.1"], "--spike-rate"),
        (["--spike-rate", "nan"], "--spike-rate"),
        (["--spike-rate", "inf"], "--spike-rate"),
        (["--spike-rate", "5000"], "--spike-rate"),
        (["--spike-rate", "lots"], "--spike-rate"),
        (["--corrupt-prob", "1"], "--corrupt-prob"),
        (["--corrupt-prob", "-0.2"], "--corrupt-prob"),
        (["--spike-wait-steps", "-3"], "--spike-wait-steps"),
        (["--format", "yaml"], "--format"),
        (["--frequency", "0"], "--frequency"),
    ],
)
def test_bad_input_exits_2_with_one_line(extra, needle, cli_run):
    rc, out, err = cli_run(*(SEED + extra))
    assert rc == 2, err
    assert out == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_degenerate_failure_models_are_bad_input_not_crashes(cli_run):
    # restart far longer than the MTBF: Daly's e^(R/M) overflows
    rc, _, err = cli_run(*(SEED + ["--restart-seconds", "1e9", "--mtbf-hours", "1"]))
    assert rc == 2 and err.count("\n") == 1 and "never finishes" in err
    # too many spikes per run to simulate
    rc, _, err = cli_run(
        "simulate", "1000000000", "1", "500", "--spike-rate", "100", "--runs", "10"
    )
    assert rc == 2 and err.count("\n") == 1 and "spike" in err


def test_real_entry_point_bad_runs_no_traceback():
    proc = subprocess.run(
        [*CLI, "simulate", "1000", "1", "10", "--runs", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=checkout_env(),
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_plan_start_up_does_not_import_numpy():
    code = (
        "import sys; from checkpoint_strategy.cli.main import main; import io, contextlib;"
        "buf = io.StringIO();\n"
        "with contextlib.redirect_stdout(buf): main(['1000', '1', '10'])\n"
        "import checkpoint_strategy.simulation.models, checkpoint_strategy.cli.simulate\n"
        "import checkpoint_strategy.cli.tradeoffs\n"
        "print('numpy' in sys.modules, 'matplotlib' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=checkout_env(),
    )
    assert proc.stdout.strip() == "False False", proc.stderr


_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)
_num = st.one_of(
    st.integers(-10, 10**7).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    _text,
)
_option = st.sampled_from(
    [
        "--runs",
        "--seed",
        "--spike-rate",
        "--corrupt-prob",
        "--spike-wait-steps",
        "--spike-margin-steps",
        "--frequency",
        "--keep-last",
        "--mtbf-hours",
        "--restart-seconds",
        "--checkpoint-write-seconds",
        "--model_size_gb",
        "--milestones",
        "--format",
    ]
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.one_of(st.integers(-5, 10**6).map(str), _text),
    pairs=st.lists(st.tuples(_option, _num), max_size=4),
)
def test_fuzz_bad_arguments_exit_2_with_one_line(steps, pairs, capsys):
    """Bad input on purpose (random values for every option): exit 2 with one line, never 3."""
    argv = ["simulate", steps, "2", "100", "--runs", "50"]
    for opt, val in pairs:
        argv += [opt, val]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 2), err
    if rc == 2:
        assert err.count("\n") == 1 and out == ""


@reaches_core()
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.integers(100, 10**5).map(str),
    secs=st.floats(0.1, 20).map(repr),
    options=st.lists(SIM_OPTIONS, max_size=5),
    runs=st.integers(1, 30).map(str),
    roll=MUTATE,
)
def test_fuzz_arguments_never_internal_error(steps, secs, options, runs, roll, capsys):
    """Valid simulations, one token in five replaced by garbage: exit 0 with a run no faster than failure-free
    and percentiles in order, or exit 2 with one line."""
    argv = [
        "simulate",
        *mutate([steps, secs, "100", *flatten(options)], roll),
        "--runs",
        runs,
        "--format",
        "json",
    ]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 2), err
    if reached(rc == 0):
        r = json.loads(out)
        assert (
            r["mean_wall_hours"]
            >= r["failure_free_wall_hours"] * (1 - 1e-9)
            >= r["compute_hours"] * (1 - 1e-9)
        )
        assert r["p50_wall_hours"] <= r["p95_wall_hours"] <= r["p99_wall_hours"]
    else:
        assert err.count("\n") == 1 and out == ""
