"""The plan command end to end: formats, golden files, schema, bad input, fuzzing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from cliresult import BIN, CLI, checkout_env
from fuzzcheck import MUTATE, PLAN_OPTIONS, PLAN_POSITIONALS, flatten, mutate, reached, reaches_core
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.resources import load_schema

GOLDEN = Path(__file__).parent / "golden"
SEED = ["100000", "2.5", "500", "--model_size_gb", "4"]


def test_seed_example_text_has_spec_headings_in_order(cli_run):
    rc, out, err = cli_run(*SEED)
    assert rc == 0 and err == ""
    order = [
        "=== Checkpoint Strategy Report ===",
        "Total Steps:        100000",
        "Step Duration:",
        "Total Training Time: 69.44 hours",
        "Storage Budget:     500 GB",
        "Model Size:         4 GB",
        "Recommended Policy:",
        "  Frequency:        every ",
        "  Keep Last:        ",
        "  Milestone Steps:  ",
        "  Total Storage:    ",
        "Risk Assessment:",
        "  Max Data Loss on Failure: ",
        "  Recovery Options:         ",
        "Warnings:",
    ]
    pos = [out.index(h) for h in order]
    assert pos == sorted(pos)


@pytest.mark.parametrize(
    "fmt, suffix", [("text", "txt"), ("markdown", "md"), ("json", "json"), ("yaml", "yaml")]
)
def test_golden(fmt, suffix, cli_run):
    rc, out, _ = cli_run(*(SEED + ["--format", fmt]))
    assert rc == 0
    golden = GOLDEN / f"plan-seed.{suffix}"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(out, encoding="utf-8")
    assert out == golden.read_text(encoding="utf-8")


def test_plan_subcommand_is_the_default(cli_run):
    _, a, _ = cli_run(*(SEED + ["--format", "json"]))
    _, b, _ = cli_run(*(["plan"] + SEED + ["--format", "json"]))
    assert a == b


def test_json_has_required_keys_and_validates(cli_run):
    rc, out, _ = cli_run(*(SEED + ["--format", "json"]))
    data = json.loads(out)
    jsonschema.validate(data, load_schema("plan.schema.json"))
    for key in [
        "checkpoint_size_gb",
        "frequency_steps",
        "frequency_hours",
        "keep_last",
        "milestone_steps",
        "rolling_storage_gb",
        "total_storage_gb",
        "storage_breakdown",
        "max_data_loss_hours",
        "rollback_points",
        "expected_overhead_fraction",
        "optimal_interval_seconds",
        "policy",
        "warnings",
    ]:
        assert key in data
    assert set(data["failure_model"]) >= {
        "mtbf_hours",
        "checkpoint_write_seconds",
        "restart_seconds",
    }
    assert all(isinstance(w, str) for w in data["warnings"])


def test_spec_storage_example_through_cli(cli_run):
    rc, out, _ = cli_run(
        "50000",
        "10",
        "200",
        "--params",
        "1B",
        "--precision",
        "fp32",
        "--frequency",
        "500",
        "--keep-last",
        "10",
        "--formats",
        "full_state_dict",
        "--format",
        "json",
    )
    d = json.loads(out)
    assert (d["checkpoint_size_gb"], d["rolling_storage_gb"], d["total_storage_gb"]) == (
        12,
        120,
        180,
    )
    assert d["milestone_steps"] == [1000, 5000, 10000, 25000, 50000]


@pytest.mark.parametrize(
    "mtbf_h, eq37, exact", [("24", 116.69, 116.69), ("6", 56.71, 56.71), ("0.25", 9.14, 9.17)]
)
def test_daly_vectors_through_cli(mtbf_h, eq37, exact, cli_run):
    rc, out, _ = cli_run(
        "100000",
        "1",
        "1000",
        "--mtbf-hours",
        mtbf_h,
        "--checkpoint-write-seconds",
        "300",
        "--restart-seconds",
        "600",
        "--format",
        "json",
    )
    fm = json.loads(out)["failure_model"]
    assert fm["daly_interval_seconds"] / 60 == pytest.approx(eq37, abs=0.005)
    assert fm["optimal_interval_seconds"] / 60 == pytest.approx(exact, abs=0.005)


def test_yaml_is_the_spec_policy_mapping(cli_run):
    rc, out, _ = cli_run(*(SEED + ["--format", "yaml", "--preset", "aggressive"]))
    policy = yaml.safe_load(out)["checkpoint_policy"]
    assert set(policy) == {
        "frequency",
        "keep_last",
        "keep_milestone",
        "save_optimizer",
        "save_formats",
        "validate_on_save",
        "async_save",
        "emergency_save_on",
    }
    assert policy["frequency"].startswith("every_") and policy["frequency"].endswith("_steps")
    assert policy["emergency_save_on"] == ["loss_spike_detected", "gradient_norm_exceeded"]


def test_both_spellings_of_the_seed_flag(cli_run):
    _, a, _ = cli_run("1000", "1", "50", "--model_size_gb", "2", "--format", "json")
    _, b, _ = cli_run("1000", "1", "50", "--model-size-gb", "2", "--format", "json")
    assert a == b


BAD = [
    ([], "TOTAL_STEPS"),
    (["100"], "STEP_SECONDS"),
    (["0", "1", "1"], "TOTAL_STEPS"),
    (["-5", "1", "1"], "TOTAL_STEPS"),
    (["1.5", "1", "1"], "TOTAL_STEPS"),
    (["abc", "1", "1"], "TOTAL_STEPS"),
    (["1e13", "1", "1"], "TOTAL_STEPS"),
    (["10", "0", "1"], "STEP_SECONDS"),
    (["10", "nan", "1"], "STEP_SECONDS"),
    (["10", "1", "inf"], "BUDGET_GB"),
    (["10", "1", "-inf"], "BUDGET_GB"),
    (["10", "1", "1e30"], "BUDGET_GB"),
    (["10", "1", "1", "--model_size_gb", "0"], "--model-size-gb"),
    (["10", "1", "1", "--model_size_gb", "1e12"], "--model-size-gb"),
    (["10", "1", "1", "--params", "7Q"], "--params"),
    (["10", "1", "1", "--preset", "yolo"], "--preset"),
    (["10", "1", "1", "--format", "xml"], "--format"),
    (["10", "1", "1", "--bogus"], "--bogus"),
    (["10", "1", "1", "--keep-last", "0"], "--keep-last"),
    (["10", "1", "1", "--frequency", "-3"], "--frequency"),
    (["10", "1", "1", "--milestones", "10,x"], "--milestones"),
    (["10", "1", "1", "--formats", "pickle"], "--formats"),
    (["10", "1", "1", "--gpus", "0"], "--gpus"),
    (["10", "1", "1", "--mtbf-hours", "nan"], "--mtbf-hours"),
    (["10", "1", "1", "--restart-seconds", "-1"], "--restart-seconds"),
    (["10", "1", "1", "--write-gbps", "0"], "--write-gbps"),
    (["10", "1", "1", "--max-loss-hours", "0"], "--max-loss-hours"),
    (["10", "1", "1", "--params", "1B", "--model_size_gb", "4"], "--params"),
    (["10", "1", "1", "--checkpoint-write-seconds", "30", "--write-gbps", "2"], "--write-gbps"),
    (["10", "1", "1", "--gpus-per-node", "0"], "--gpus-per-node"),
    (["10", "1", "1", "--gpus-per-node", "2000"], "--gpus-per-node"),
    (["10", "1", "1", "--node-write-gbps", "-1"], "--node-write-gbps"),
    (["10", "1", "1", "--storage-gbps", "0"], "--storage-gbps"),
    (["10", "1", "1", "--storage-gbps", "1e99"], "--storage-gbps"),
    (["10", "1", "1", "--min-interval-seconds", "-5"], "--min-interval-seconds"),
    (["10", "1", "1", "--min-interval-seconds", "inf"], "--min-interval-seconds"),
    (["10", "1", "1", "--precision", "half"], "--precision"),
]


@pytest.mark.parametrize("argv, names", BAD)
def test_bad_input_one_line_exit_2(argv, names, cli_run):
    rc, out, err = cli_run(*argv)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert names in lines[0]
    assert "Traceback" not in err


TOKENS = st.one_of(
    st.sampled_from(
        [
            "--model_size_gb",
            "--params",
            "--frequency",
            "--keep-last",
            "--milestones",
            "--formats",
            "--gpus",
            "--mtbf-hours",
            "--preset",
            "--format",
            "--precision",
            "--no-async",
            "--async",
            "--restart-seconds",
            "--write-gbps",
            "--checkpoint-write-seconds",
            "--max-loss-hours",
            "--weights-dtype",
            "--no-save-optimizer",
            "plan",
            "json",
            "auto",
            "pow2",
            "7B",
            "nan",
            "--gpus-per-node",
            "--node-write-gbps",
            "--storage-gbps",
            "--min-interval-seconds",
            "mixed-no-master",
            "--local-tier",
            "100,2",
            "1e-9,1e6",
            "--node-loss-fraction",
            "-1",
            "0",
            "1e308",
            "1,2,3",
            "full_state_dict",
        ]
    ),
    st.text(max_size=8),
    st.integers(-(10**16), 10**16).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(argv=st.lists(TOKENS, max_size=8))
def test_fuzz_bad_arguments_exit_2_with_one_line(argv, capsys):
    """Bad input on purpose (most of these token soups die in the parser): exit 2 with one stderr line."""
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 2), err
    if rc == 2:
        assert len(err.strip().splitlines()) == 1 and out == ""


@reaches_core()
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(positionals=PLAN_POSITIONALS, options=st.lists(PLAN_OPTIONS, max_size=6), roll=MUTATE)
def test_fuzz_arguments_never_crash(positionals, options, roll, capsys):
    """Valid plans (every option in range), one token in five replaced by garbage: exit 0 with a JSON plan
    whose numbers add up, or exit 2 with one line; never 3."""
    argv = mutate([*positionals, *flatten(options)], roll) + ["--format", "json"]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 2), err
    if reached(rc == 0):
        plan = json.loads(out)
        assert plan["keep_last"] >= 1 and plan["frequency_steps"] >= 1
        assert plan["rollback_horizon_steps"] == plan["keep_last"] * plan["frequency_steps"]
        if plan["total_storage_gb"] is not None:
            assert plan["fits_budget"] == (plan["total_storage_gb"] <= plan["storage_budget_gb"])
    else:
        assert len(err.strip().splitlines()) == 1 and out == ""


@reaches_core()
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.integers(1, 10**9),
    secs=st.floats(1e-3, 1e4),
    budget=st.floats(1e-2, 1e7),
    size=st.one_of(st.none(), st.floats(1e-3, 1e5)),
    gpus=st.integers(1, 10**6),
)
def test_fuzz_valid_plans_validate_against_schema(steps, secs, budget, size, gpus, capsys):
    argv = [str(steps), repr(secs), repr(budget), "--gpus", str(gpus), "--format", "json"]
    if size is not None:
        argv += ["--model_size_gb", repr(size)]
    rc = main(argv)
    out, err = capsys.readouterr()
    if not reached(
        rc != 2
    ):  # only a failure model whose expected time overflows a float is refused
        assert "never finishes" in err and len(err.strip().splitlines()) == 1
        return
    assert rc == 0, err
    data = json.loads(out)
    jsonschema.validate(data, load_schema("plan.schema.json"))
    assert 1 <= data["frequency_steps"] <= steps
    assert data["keep_last"] >= 2 or any("keep_last" in w for w in data["warnings"])
    if data["fits_budget"] is not None:
        assert data["fits_budget"] == (data["total_storage_gb"] <= budget)


@reaches_core()
@settings(max_examples=150, deadline=None)
@given(
    positionals=PLAN_POSITIONALS,
    options=st.lists(PLAN_OPTIONS, max_size=5),
    keep=st.integers(1, 59),
)
def test_fuzz_plan_storage_grows_with_keep_last(positionals, options, keep):
    """Any valid plan: one more checkpoint kept never needs less storage, nor changes the interval."""
    from cliresult import run_captured

    argv = [*positionals, *flatten(o for o in options if o[0] != "--keep-last")]
    first = run_captured([*argv, "--keep-last", keep, "--format", "json"])
    if not reached(first.rc == 0):
        return
    a, b = (
        json.loads(first.out),
        json.loads(run_captured([*argv, "--keep-last", keep + 1, "--format", "json"]).out),
    )
    assert (a["keep_last"], b["keep_last"]) == (keep, keep + 1)
    assert a["frequency_steps"] == b["frequency_steps"]
    if a["total_storage_gb"] is not None:
        assert a["total_storage_gb"] <= b["total_storage_gb"]
        assert a["rolling_storage_gb"] < b["rolling_storage_gb"]


def test_console_script_module_and_launcher_agree(skill_root):
    env = checkout_env()
    outs = []
    console = (
        BIN / "checkpoint-strategy"
    )  # this environment's console script, not whichever is first on PATH
    assert console.is_file(), f"{console}: install the checkout (pip install -e '.[test]')"
    for cmd in (
        [str(console)],
        CLI,
        [sys.executable, str(skill_root / "scripts" / "checkpoint-strategy")],
    ):
        proc = subprocess.run(
            cmd + SEED + ["--format", "json"], capture_output=True, text=True, env=env, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1] == outs[2]


def test_subprocess_bad_input_has_no_traceback(skill_root):
    proc = subprocess.run(
        [sys.executable, str(skill_root / "scripts" / "checkpoint-strategy"), "10", "x", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=checkout_env(),
    )
    assert proc.returncode == 2
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_text_plan_builds_no_pydantic_validator(skill_root):
    """Cold start (bench/bench_plan.py, issue 10): the text plan constructs its results without validating them
    again, so pydantic never builds a validator and never scans installed packages for its plugins
    (importlib.metadata, about 10 ms); numpy and torch stay unloaded."""
    code = (
        "import sys, contextlib, io\n"
        f"sys.path.insert(0, {str(skill_root / 'scripts')!r})\n"
        "from checkpoint_strategy.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main({SEED!r})\n"
        "print(sorted(m for m in ('pydantic.plugin._loader', 'importlib.metadata', 'numpy', 'torch')"
        " if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=checkout_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_top_level_help_lists_commands(cli_run):
    rc, out, _ = cli_run("--help")
    assert rc == 0 and "plan" in out


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--preset", "conservative"],
        ["--milestones", "none"],
        ["--formats", "sharded", "--no-async", "--no-save-optimizer"],
    ],
)
def test_yaml_template_round_trips_to_the_policy(extra, cli_run):
    _, out_yaml, _ = cli_run(*(SEED + extra + ["--format", "yaml"]))
    _, out_json, _ = cli_run(*(SEED + extra + ["--format", "json"]))
    assert yaml.safe_load(out_yaml) == {"checkpoint_policy": json.loads(out_json)["policy"]}


@reaches_core()
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    mtbf=st.floats(1e-6, 1e9),
    restart=st.floats(0, 1e9),
    write=st.floats(0, 1e9),
    steps=st.integers(1, 10**12),
    secs=st.floats(1e-6, 1e6),
)
def test_fuzz_extreme_failure_models_exit_0_or_2(mtbf, restart, write, steps, secs, capsys):
    rc = main(
        [
            str(steps),
            repr(secs),
            "100",
            "--mtbf-hours",
            repr(mtbf),
            "--restart-seconds",
            repr(restart),
            "--checkpoint-write-seconds",
            repr(write),
            "--format",
            "json",
        ]
    )
    out, err = capsys.readouterr()
    assert rc in (0, 2), err
    if reached(rc == 0):
        jsonschema.validate(json.loads(out), load_schema("plan.schema.json"))
    else:
        assert len(err.strip().splitlines()) == 1 and "--mtbf-hours" in err


# Issue 42: "pretraining a 7B model on 256 H100s for 3 weeks, 1.8 s a step, 40 TB on Lustre", as the user says it
BIG_RUN = ["--duration", "3w", "1.8", "40000", "--params", "7B", "--gpus", "256"]


def test_big_run_from_a_duration_matches_its_golden(cli_run):
    """The whole answer: 1,008,000 steps from the duration, every assumed input listed with its option and the
    interval's assumptions warned about, a sharded resume format with the cost of each, the budget used."""
    rc, out, err = cli_run(*BIG_RUN)
    assert rc == 0 and err == ""
    golden = GOLDEN / "plan-256-h100.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(out, encoding="utf-8")
    assert out == golden.read_text(encoding="utf-8")
    assert "Total Steps:        1008000 (--duration 3 weeks: 504 h at 1.8 s a step)" in out
    assert "  - none" not in out.split("Warnings:")[1].split("\n\n")[0]


def test_big_run_json_says_what_was_assumed_and_why_sharded(cli_run):
    data = cli_run(*BIG_RUN, "--format", "json").json()
    assert data["total_steps"] == 1008000 and data["run_length"].startswith("--duration 3 weeks")
    assumed = {a["input"]: a for a in data["assumptions"]}
    assert {
        "storage write rate per node",
        "failure rate",
        "precision",
        "async saves",
        "sharded training",
    } <= set(assumed)
    assert "--node-write-gbps" in assumed["storage write rate per node"]["option"]
    assert "1 GB/s per node" in assumed["storage write rate per node"]["value"]
    interval_setters = [a["input"] for a in data["assumptions"] if a["sets_interval"]]
    assert interval_setters and all(name in data["warnings"][-1] for name in interval_setters)
    # sharded for resuming; full weights (safetensors) only at the milestones; why, with the cost of each
    assert data["policy"]["save_formats"] == ["sharded", "safetensors"]
    assert (
        "84 s at 1 GB/s" in data["formats_reason"]
        and "2.625 s at 32 GB/s" in data["formats_reason"]
    )
    assert data["storage_breakdown"]["safetensors_exports"] == len(data["milestone_steps"])
    # the budget: more than the seed rule's 5%, milestones far closer than 125-250 h
    assert data["total_storage_gb"] > 0.2 * 40000 and data["fits_budget"]
    gaps = [
        b - a for a, b in zip(data["milestone_steps"], data["milestone_steps"][1:], strict=False)
    ]
    assert max(gaps) * 1.8 / 3600 <= 12 and "of the 40 TB budget" in data["budget_use"]
    # given measured numbers instead, nothing that sets the interval is assumed
    measured = cli_run(
        *BIG_RUN,
        "--node-write-gbps",
        "4",
        "--mtbf-hours",
        "150",
        "--precision",
        "mixed",
        "--async",
        "--format",
        "json",
    ).json()
    assert not [a for a in measured["assumptions"] if a["sets_interval"]]
    assert not any("assumed inputs" in w for w in measured["warnings"])


@pytest.mark.parametrize(
    "argv",
    [
        ["--duration", "3w", "1.8", "40000"],
        ["3w", "1.8", "40000"],
        ["1.8", "40000", "--duration", "21d"],
        ["--duration", "504h", "1008000", "1.8", "40000"],
        ["--duration=30240min", "1.8", "40000"],
    ],
)
def test_duration_in_place_of_total_steps(argv, cli_run):
    assert cli_run(*argv, "--format", "json").json()["total_steps"] == 1008000


@pytest.mark.parametrize(
    "argv, match",
    [
        (
            ["--duration", "3w", "1200000", "1.8", "40000"],
            "is 1008000 steps, but TOTAL_STEPS is 1200000",
        ),
        (["--duration", "3w", "3w", "1.8", "40000"], "give the run's length once"),
        (
            ["--duration", "3 fortnights", "1.8", "40000"],
            "argument --duration: expected a run length",
        ),
        (["--duration", "0w", "1.8", "40000"], "argument --duration"),
        (
            ["--duration", "1min", "100", "40000"],
            "argument --duration: 0.0166667 h is shorter than one step of 100 s",
        ),
        (["--duration", "3w", "1.8"], "BUDGET_GB"),
    ],
)
def test_duration_given_inconsistently_is_one_line_exit_2(argv, match, cli_run):
    cli_run(*argv).usage_error(match)
