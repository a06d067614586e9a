"""planning/options.py and cli/planoptions.py in-process and fast: every plan option reaches its field with its
type and bounds, the help text a user reads is pinned (tests/golden/plan-options-help.json), the errors say what is
expected."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from checkpoint_strategy.cli import planoptions
from checkpoint_strategy.cli.main import ArgumentParser
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning import options, sizing

GOLDEN = Path(__file__).parent / "golden" / "plan-options-help.json"
POS = ["1000", "2", "100"]


def parse(*argv):
    parser = ArgumentParser(prog="plan")
    planoptions.add_plan_options(parser)
    return options.plan_arguments(parser.parse_args([*POS, *argv]))


def test_plan_options_help_matches_its_golden():
    """Each option as `plan --help` shows it: its group, spellings, metavar, choices and help (as data, so the
    golden does not depend on argparse's layout in one Python version). Regenerate after an intended change:
    UPDATE_GOLDEN=1 python3 -m pytest tests/test_planning_options.py -k golden (then read the diff)."""
    parser = ArgumentParser(prog="plan")
    planoptions.add_plan_options(parser)
    shown = [
        {
            "group": group.title,
            "options": action.option_strings or [action.dest],
            "dest": action.dest,
            "metavar": action.metavar,
            "choices": action.choices,
            "const": action.const,
            "help": action.help,
        }
        for group in parser._action_groups
        for action in group._group_actions
    ]
    text = json.dumps(shown, indent=1) + "\n"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text, encoding="utf-8")
    assert GOLDEN.is_file(), "no golden: run with UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text(encoding="utf-8"), (
        f"{GOLDEN.name} changed: check the diff, then UPDATE_GOLDEN=1"
    )


def test_every_option_reaches_its_field():
    a = parse(
        "--params",
        "7B",
        "--precision",
        "mixed",
        "--preset",
        "aggressive",
        "--frequency",
        "50",
        "--keep-last",
        "3",
        "--milestones",
        "none",
        "--formats",
        "sharded,safetensors",
        "--no-save-optimizer",
        "--gpus",
        "64",
        "--gpu-mtbf-hours",
        "40000",
        "--checkpoint-write-seconds",
        "12",
        "--gpus-per-node",
        "4",
        "--node-write-gbps",
        "2",
        "--storage-gbps",
        "50",
        "--min-interval-seconds",
        "30",
        "--restart-seconds",
        "120",
        "--no-async",
        "--max-loss-hours",
        "2",
        "--local-tier",
        "100,2",
        "--node-loss-fraction",
        "0.5",
    )
    assert (a.total_steps, a.step_seconds, a.budget_gb) == (1000, 2.0, 100.0)
    assert (a.params, a.precision, a.preset, a.frequency, a.keep_last) == (
        7e9,
        "mixed",
        "aggressive",
        50,
        3,
    )
    assert (a.milestones, a.formats, a.save_optimizer) == (
        "none",
        ["sharded", "safetensors"],
        False,
    )
    assert (a.gpus, a.gpu_mtbf_hours, a.checkpoint_write_seconds, a.gpus_per_node) == (
        64,
        40000.0,
        12.0,
        4,
    )
    assert (a.node_write_gbps, a.storage_gbps, a.min_interval_seconds, a.restart_seconds) == (
        2.0,
        50.0,
        30.0,
        120.0,
    )
    assert (a.async_save, a.max_loss_hours, a.node_loss_fraction) == (False, 2.0, 0.5)
    assert (a.local_tier.gb_per_node, a.local_tier.gbps_per_node) == (100.0, 2.0)
    b = parse(
        "--model-size-gb",
        "4",
        "--weights-dtype",
        "bf16",
        "--mtbf-hours",
        "100",
        "--write-gbps",
        "3",
        "--async",
        "--save-optimizer",
    )
    assert (
        b.model_size_gb,
        b.weights_dtype,
        b.mtbf_hours,
        b.write_gbps,
        b.async_save,
        b.save_optimizer,
    ) == (4.0, "bf16", 100.0, 3.0, True, True)


@pytest.mark.parametrize(
    "option, value",
    [
        ("--mtbf-hours", "0"),
        ("--mtbf-hours", "x"),
        ("--min-interval-seconds", "-1"),
        ("--gpus-per-node", "0"),
        ("--gpus-per-node", "1.5"),
        ("--checkpoint-write-seconds", "-5"),
        ("--frequency", "0"),
        ("--gpus", "0"),
        ("--max-loss-hours", "0"),
        ("--storage-gbps", "0"),
        ("--node-write-gbps", "0"),
        ("--keep-last", "0"),
    ],
)
def test_each_numeric_option_is_checked_by_its_bounds(option, value):
    with pytest.raises(UsageError, match=f"argument {option}"):
        parse(option, value)


def test_write_rate_alone_is_not_a_conflict():
    assert parse("--write-gbps", "2").write_gbps == 2.0
    assert parse("--checkpoint-write-seconds", "2").checkpoint_write_seconds == 2.0
    with pytest.raises(UsageError) as err:
        parse("--write-gbps", "2", "--checkpoint-write-seconds", "2")
    assert str(err.value) == (
        "argument --checkpoint-write-seconds: give the save cost once, either "
        "--checkpoint-write-seconds S or --write-gbps G, not both"
    )


def test_bad_values_say_what_is_expected():
    with pytest.raises(UsageError) as err:
        parse("--local-tier", "5")
    assert str(err.value) == (
        "argument --local-tier: expected GB,GBPS (node-local space and write rate per node, "
        "e.g. 2000,5), got '5'"
    )
    with pytest.raises(ValueError) as err:
        sizing.parse_params("7Q")
    assert str(err.value) == "expected a parameter count such as 7B, 350M or 1.3e9, got '7Q'"


@pytest.mark.parametrize(
    "precision, per_param", [("fp32", 4), ("mixed", 2), ("mixed-no-master", 2)]
)
def test_checkpoint_without_optimizer_is_the_weights(precision, per_param):
    """No optimizer state: fp32 weights (4 B/param) or 16-bit weights (2 B/param)."""
    assert sizing.checkpoint_gb(1e9, precision, False) == per_param


BASE = {"total_steps": 1000, "step_seconds": 2, "budget_gb": 100}


def usage_error(data) -> str:
    with pytest.raises(UsageError) as err:
        options.validate_arguments(data)
    return str(err.value)


def test_schema_errors_name_the_option_and_what_it_expects():
    """The one-line error of a value the JSON schema refuses (a plan from the library or a policy file, not argv):
    the option as the user spells it, what it expects (FIELDS, the text users read) and the value given."""
    assert usage_error({}) == (
        "argument TOTAL_STEPS: expected a whole number of optimizer steps, from 1 to 10^12, "
        "got 'missing'"
    )
    assert usage_error({"total_steps": 10, "step_seconds": 1}) == (
        "argument BUDGET_GB: expected a storage budget in GB, > 0 and at most 10^9, got 'missing'"
    )
    assert usage_error({**BASE, "total_steps": 0}) == (
        "argument TOTAL_STEPS: expected a whole number of optimizer steps, from 1 to 10^12, got 0"
    )
    assert (
        usage_error({**BASE, "gpus": "x"})
        == "argument --gpus: expected a whole number of GPUs, from 1 to 10^7, got 'x'"
    )
    assert (
        usage_error({**BASE, "format": "pdf"})
        == "argument --format: expected text, markdown, json or yaml, got 'pdf'"
    )
    assert usage_error({**BASE, "bogus": 1}) == (
        "unknown argument: Additional properties are not allowed ('bogus' was unexpected)"
    )
    tier = (
        "argument --local-tier: expected GB,GBPS: node-local space in GB and write rate in GB/s per node, "
        "each > 0, got "
    )
    assert usage_error({**BASE, "local_tier": {"gb_per_node": -1, "gbps_per_node": 1}}) == (
        tier + "{'gb_per_node': -1, 'gbps_per_node': 1}"
    )
    assert (
        usage_error({**BASE, "local_tier": {"gb_per_node": 1}}) == tier + "{'gb_per_node': 1}"
    )  # nested required
    assert (
        usage_error([]) == "argument arguments: expected a valid value, got 'missing'"
    )  # not an object at all


def test_validated_numbers_are_floats_where_the_model_says_float():
    a = options.validate_arguments({**BASE, "save_optimizer": True, "gpus": 16})
    assert (type(a.total_steps), type(a.step_seconds), type(a.budget_gb), type(a.gpus)) == (
        int,
        float,
        float,
        int,
    )
    assert a.save_optimizer is True and (a.total_steps, a.step_seconds, a.budget_gb) == (
        1000,
        2.0,
        100.0,
    )
    b = options.validate_arguments({**BASE, "local_tier": {"gb_per_node": 10, "gbps_per_node": 1}})
    assert type(b.step_seconds) is float and b.local_tier.gb_per_node == 10.0


@pytest.mark.parametrize("fmt", ["text", "markdown", "json", "yaml"])
def test_plan_formats_reach_the_arguments(fmt):
    import argparse

    assert options.plan_arguments(argparse.Namespace(**BASE, format=fmt)).format == fmt


def test_another_commands_format_is_not_the_plans():
    """A command whose --format is not a plan format (e.g. csv) gets the plan's default, not an error."""
    import argparse

    a = options.plan_arguments(argparse.Namespace(**BASE, format="csv"))
    assert a.format == "text"


def test_formats_list_accepts_each_format_once_and_says_what_is_expected():
    assert planoptions.formats_list("full_state_dict") == ["full_state_dict"]
    assert planoptions.formats_list(" sharded, safetensors ,sharded") == ["sharded", "safetensors"]
    for bad in ("pickle", "sharded,pickle", " , "):
        with pytest.raises(argparse.ArgumentTypeError) as err:
            planoptions.formats_list(bad)
        assert (
            str(err.value)
            == f"expected a comma-separated list of full_state_dict, sharded, safetensors, got {bad!r}"
        )


def test_params_count_errors():
    with pytest.raises(argparse.ArgumentTypeError) as err:
        planoptions.params_count("7Q")
    assert str(err.value) == "expected a parameter count such as 7B, 350M or 1.3e9, got '7Q'"
    with pytest.raises(argparse.ArgumentTypeError) as err:
        planoptions.params_count("1e20")
    assert (
        str(err.value)
        == "expected a parameter count such as 7B, 350M or 1.3e9 (1 to 1e+15), got '1e20'"
    )
    assert planoptions.params_count("1e15") == 1e15


@pytest.mark.parametrize("text", ["x,5", "-1,5", "5,0", "1,2,3"])
def test_tier_spec_refuses_a_bad_pair(text):
    with pytest.raises(argparse.ArgumentTypeError) as err:
        planoptions.tier_spec(text)
    assert str(err.value) == (
        f"expected GB,GBPS (node-local space and write rate per node, e.g. 2000,5), got {text!r}"
    )


def test_parse_params_bounds_and_messages():
    assert sizing.parse_params("1") == 1.0
    assert sizing.parse_params("1.5") == 1.5
    with pytest.raises(ValueError) as err:
        sizing.parse_params("0.5")
    assert str(err.value) == "expected a parameter count of at least 1, got '0.5'"


def test_model_size_given_twice_says_so():
    with pytest.raises(UsageError) as err:
        sizing.resolve_params(7e9, 14.0, "fp32")
    assert (
        str(err.value) == "give the model size once: either --model_size_gb or --params, not both"
    )
