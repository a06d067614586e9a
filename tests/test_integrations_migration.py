"""`validate --target-gpus N`: a hardware move re-plans (issue 27). The failure-rate and interval lines agree with
the planner itself, and the plan command they end with runs once its placeholders are filled."""

from __future__ import annotations

import math
import shlex

import pytest
from test_examples import build_inputs


@pytest.fixture
def sample(tmp_path, monkeypatch):
    build_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _plan(cli_run, *args) -> dict:
    return cli_run("plan", *args, "--format", "json").json()


def test_move_to_16_gpus_replans_with_the_planners_own_numbers(sample, cli_run):
    move = cli_run("validate", "run", "--target-gpus", "16", "--format", "json").json()[
        "hardware_move"
    ]
    assert move["saved_world_size"] == 1 and move["target_gpus"] == 16
    failure, interval, command = move["replan"]
    # the same save stall on both: the job's write rate fixed (by default it grows with the nodes)
    same = ["3000", "2.5", "500", "--model-size-gb", "4", "--write-gbps", "1"]
    before = _plan(cli_run, *same, "--gpus", "1")["failure_model"]
    after = _plan(cli_run, *same, "--gpus", "16")["failure_model"]
    assert before["checkpoint_write_seconds"] == after["checkpoint_write_seconds"]
    assert (
        f"= {after['mtbf_hours']:g} h, was {before['mtbf_hours']:g} h on 1: failures come 16x as often"
        in failure
    )
    assert after["mtbf_source"].split(" / ")[0] in failure
    # the interval factor the line states is the planner's Daly optimum ratio at the same save stall (within 1 %)
    factor = float(interval.split("becomes about ")[1].split("x")[0])
    assert factor == pytest.approx(
        after["daly_interval_seconds"] / before["daly_interval_seconds"], rel=0.01
    )
    assert factor == pytest.approx(math.sqrt(1 / 16), abs=0.005)
    # the command: max_steps from the run's trainer_state.json, the rest named placeholders; filled in, it runs
    assert command.startswith("command: checkpoint-strategy plan 3000 NEW_STEP_SECONDS BUDGET_GB ")
    argv = shlex.split(command.split("command: ")[1].split("   (")[0])
    filled = [
        {"NEW_STEP_SECONDS": "1.5", "BUDGET_GB": "500", "WEIGHTS_GB": "4"}.get(a, a)
        for a in argv[1:]
    ]
    report = cli_run(*filled, "--format", "json").json()
    assert (
        report["failure_model"]["gpus"] == 16
        and report["failure_model"]["mtbf_hours"] == after["mtbf_hours"]
    )


def test_text_report_shows_the_replan_lines(sample, cli_run):
    out = cli_run("validate", "run", "--target-gpus", "16").out
    assert (
        "  - re-plan: failure rate: job MTBF" in out
        and "  - re-plan: command: checkpoint-strategy plan " in out
    )
    md = cli_run("validate", "run", "--target-gpus", "16", "--format", "markdown").out
    assert "- re-plan: interval: Daly's optimum" in md


def test_same_gpu_count_has_no_interval_change_and_no_move_without_the_option(sample, cli_run):
    move = cli_run("validate", "run", "--target-gpus", "1", "--format", "json").json()[
        "hardware_move"
    ]
    assert len(move["replan"]) == 2 and "was" not in move["replan"][0]
    assert cli_run("validate", "run", "--format", "json").json()["hardware_move"] is None


def test_weights_size_fills_the_command_when_the_checkpoint_has_real_weights(tmp_path):
    from checkpoint_strategy.integrations.migration import replan_lines, weights_gb

    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 3_000_000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 2_000_000)
    assert weights_gb(str(tmp_path)) == pytest.approx(0.005)
    assert weights_gb(str(tmp_path / "missing")) is None
    assert "--model-size-gb 0.005 --gpus 64" in replan_lines(8, 64, None, 0.005)[-1]
    assert "plan TOTAL_STEPS " in replan_lines(None, 64, None, None)[-1]
