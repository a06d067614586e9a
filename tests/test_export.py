"""`export`: a plan as each framework's own settings. Fast tests: no framework is imported.

Real runs with the exported settings are in tests/test_export_frameworks.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex

import jsonschema
import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.export import common, export_plan
from checkpoint_strategy.planning.options import validate_arguments
from checkpoint_strategy.planning.planner import plan
from checkpoint_strategy.resources import load_schema

FRAMEWORKS = ("hf", "lightning", "orbax", "torchtitan", "megatron", "deepspeed")
PLAN = ["100000", "2", "5000", "--params", "1B"]

# torchtitan [checkpoint] fields per version, read from the tagged sources (dataclass fields):
#   0.1: pytorch/torchtitan v0.1.0 f7084fc78567f865d0c411f2c7b9bbbef6b155ac torchtitan/config_manager.py class Checkpoint
#   0.2: pytorch/torchtitan v0.2.0 29624e37fa6dd319fd671b009338651b5c665da2 torchtitan/config/job_config.py class Checkpoint
#   0.3: pytorch/torchtitan 0.3.0rc1 1fdf90d3f9b756ef709ce262bc839f1dab679b5e
#        torchtitan/components/checkpointer/base.py BaseCheckpointManager.Config + dcp.py Config (async_mode)
TORCHTITAN_KEYS = {
    "0.1": {
        "enable_checkpoint",
        "folder",
        "initial_load_path",
        "initial_load_model_weights_only",
        "interval",
        "last_save_model_weights_only",
        "export_dtype",
        "create_seed_checkpoint",
        "async_mode",
        "keep_latest_k",
        "load_step",
        "exclude_from_loading",
    },
    "0.2": {
        "enable",
        "enable_ft_dataloader_checkpoints",
        "folder",
        "interval",
        "initial_load_path",
        "initial_load_model_only",
        "initial_load_in_hf",
        "initial_load_in_hf_quantized",
        "last_save_model_only",
        "last_save_in_hf",
        "export_dtype",
        "async_mode",
        "keep_latest_k",
        "load_step",
        "exclude_from_loading",
        "enable_first_step_checkpoint",
        "create_seed_checkpoint",
        "load_only",
    },
    "0.3": {
        "enable",
        "folder",
        "interval",
        "initial_load_path",
        "initial_load_model_only",
        "initial_load_in_hf",
        "initial_load_in_hf_quantized",
        "last_save_model_only",
        "last_save_in_hf",
        "export_dtype",
        "keep_latest_k",
        "load_step",
        "exclude_from_loading",
        "enable_first_step_checkpoint",
        "create_seed_checkpoint",
        "load_only",
        "async_mode",
    },
}
# Megatron-LM checkpointing flags at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (megatron-core
# 0.20.0): megatron/training/config/training_config.py CheckpointConfig turned into flags by
# megatron/training/argument_utils.py (field -> --field-name; True-by-default bools -> --no-/--disable-), plus the
# flags added by hand in megatron/training/arguments.py _add_checkpointing_args.
MEGATRON_FLAGS = {
    "--save",
    "--save-interval",
    "--persistent-save-interval",
    "--save-params-interval",
    "--save-activations-interval",
    "--save-tokens-per-expert-interval",
    "--save-wgrads-interval",
    "--save-dgrads-interval",
    "--save-retain-interval",
    "--load",
    "--load-main-params-from-ckpt",
    "--non-persistent-save-interval",
    "--non-persistent-ckpt-type",
    "--non-persistent-global-ckpt-dir",
    "--non-persistent-local-ckpt-dir",
    "--non-persistent-local-ckpt-algo",
    "--finetune",
    "--pretrained-checkpoint",
    "--ckpt-step",
    "--use-checkpoint-args",
    "--use-mp-args-from-checkpoint-args",
    "--no-use-tokenizer-model-from-checkpoint-args",
    "--exit-on-missing-checkpoint",
    "--ckpt-format",
    "--auto-detect-ckpt-format",
    "--ckpt-convert-format",
    "--ckpt-convert-save",
    "--no-ckpt-fully-parallel-save",
    "--async-save",
    "--async-strategy",
    "--use-persistent-ckpt-worker",
    "--ckpt-fully-parallel-load",
    "--ckpt-assume-constant-structure",
    "--dist-ckpt-strictness",
    "--no-save-tokenizer-assets",
    "--verify-integrity",
    "--no-save-optim",
    "--no-save-rng",
    "--no-load-optim",
    "--no-load-rng",
    "--override-ckpt-iteration",
    "--dist-ckpt-workers",
    "--ckpt-drop-redundant-extra-state",
}


def report_for(*args, **kw):
    return plan(
        validate_arguments(
            dict(
                {"total_steps": 100000, "step_seconds": 2.0, "budget_gb": 5000.0, "params": 1e9},
                **kw,
            )
        )
    )


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_framework_text_and_json(framework, cli_run):
    rc, out, err = cli_run(*(["export", "--framework", framework] + PLAN))
    assert rc == 0 and err == ""
    assert f"=== Checkpoint Strategy Export: {framework} ===" in out
    assert "Not expressible in" in out and "Version:" in out
    rc, out, err = cli_run(*(["export", "--framework", framework, "--format", "json"] + PLAN))
    assert rc == 0 and err == ""
    data = json.loads(out)
    jsonschema.validate(data, load_schema("export-report.schema.json"))
    assert data["framework"] == framework and data["schedule"]["every_steps"] == 1000
    # every plan item a framework cannot hold says what to do instead
    assert all(g["instead"] for g in data["not_expressible"])


@pytest.mark.parametrize("fmt", ["text", "markdown", "python", "toml", "args"])
def test_own_advice_is_printed_as_written_not_escaped(fmt, cli_run):
    """The escape filter is for user-controlled names; the package's own advice must read as written."""
    for framework in FRAMEWORKS:
        rc, out, err = cli_run(*(["export", "--framework", framework, "--format", fmt] + PLAN))
        if rc == 2:  # a format this framework has no native form for
            continue
        assert rc == 0, err
        assert "\\x60" not in out and "\\|" not in out, (framework, fmt, out)


def test_version_is_said_and_follows_the_flag(cli_run):
    rc, out, _ = cli_run(
        *(
            ["export", "--framework", "hf", "--framework-version", "4.46.3", "--format", "json"]
            + PLAN
        )
    )
    data = json.loads(out)
    assert (
        rc == 0
        and data["framework_version"] == "4"
        and data["version_source"] == "--framework-version"
    )
    assert data["settings"][0]["values"]["save_safetensors"] is True
    rc, out, _ = cli_run(
        *(["export", "--framework", "hf", "--framework-version", "5", "--format", "json"] + PLAN)
    )
    data = json.loads(out)
    assert "save_safetensors" not in data["settings"][0]["values"]
    assert "save_safetensors was removed" in data["settings"][0]["note"]


def test_installed_version_is_read_from_metadata_without_importing(monkeypatch):
    import sys
    from importlib import metadata

    before = set(sys.modules)
    r = common.resolve_version(
        "hf", __import__("checkpoint_strategy.export.hf", fromlist=["SPEC"]).SPEC, None
    )
    assert r.source == "installed" and r.key == metadata.version("transformers").split(".")[0]
    assert "transformers" not in set(sys.modules) - before
    # not installed: the newest known, and the note says so
    monkeypatch.setattr(common, "installed_version", lambda packages: (None, None))
    r = common.resolve_version(
        "torchtitan",
        __import__("checkpoint_strategy.export.torchtitan", fromlist=["SPEC"]).SPEC,
        None,
    )
    assert (r.key, r.source) == ("0.3", "newest known") and "not installed" in r.note
    # installed but unknown: newest known plus a warning
    monkeypatch.setattr(common, "installed_version", lambda packages: ("transformers", "9.1.0"))
    r = common.resolve_version(
        "hf", __import__("checkpoint_strategy.export.hf", fromlist=["SPEC"]).SPEC, None
    )
    assert (r.key, r.source) == ("5", "newest known") and "9.1.0" in r.warnings[0]


def test_export_command_imports_no_framework():
    import subprocess
    import sys

    code = (
        "import sys; from checkpoint_strategy.cli.main import main; "
        "[main(['export', '--framework', f, '100', '1', '10', '--format', 'json']) for f in "
        "('hf', 'lightning', 'orbax', 'megatron', 'deepspeed')]; "
        "bad = [m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning', 'jax', 'orbax', "
        "'deepspeed', 'numpy') if m in sys.modules]; print(bad, file=sys.stderr); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("version", ["0.1", "0.2"])
def test_torchtitan_toml_parses_and_every_key_exists_in_that_version(version, cli_run):
    rc, out, err = cli_run(
        "export",
        "--framework",
        "torchtitan",
        "--framework-version",
        version,
        "--format",
        "toml",
        "100",
        "2",
        "50",
        "--frequency",
        "10",
        "--keep-last",
        "3",
    )
    assert rc == 0 and err == ""
    table = tomllib.loads(out)["checkpoint"]
    assert set(table) <= TORCHTITAN_KEYS[version]
    enable = "enable_checkpoint" if version == "0.1" else "enable"
    last_only = "last_save_model_weights_only" if version == "0.1" else "last_save_model_only"
    assert table[enable] is True and table[last_only] is False
    assert (
        table["interval"] == 10
        and table["keep_latest_k"] == 3
        and table["async_mode"] in ("async", "disabled")
    )


@pytest.mark.parametrize("version", ["0.1", "0.2", "0.3"])
def test_torchtitan_cli_overrides_name_real_fields(version, cli_run):
    rc, out, err = cli_run(
        "export",
        "--framework",
        "torchtitan",
        "--framework-version",
        version,
        "--format",
        "args",
        "100",
        "2",
        "50",
        "--frequency",
        "10",
        "--keep-last",
        "3",
        "--no-async",
    )
    assert rc == 0 and err == ""
    tokens = shlex.split(out)
    fields = set()
    for tok in tokens:
        if tok.startswith("--"):
            m = re.fullmatch(r"--checkpoint\.(no_)?([a-z_]+)", tok)
            assert m, tok
            fields.add(m.group(2))
    assert fields <= TORCHTITAN_KEYS[version]
    assert (
        "--checkpoint.no_"
        + ("last_save_model_weights_only" if version == "0.1" else "last_save_model_only")
        in tokens
    )
    assert tokens[tokens.index("--checkpoint.keep_latest_k") + 1] == "3"
    assert tokens[tokens.index("--checkpoint.async_mode") + 1] == "disabled"


def test_torchtitan_03_has_no_toml(cli_run):
    rc, out, err = cli_run(
        *(
            [
                "export",
                "--framework",
                "torchtitan",
                "--framework-version",
                "0.3",
                "--format",
                "toml",
            ]
            + PLAN
        )
    )
    assert rc == 2 and out == "" and len(err.splitlines()) == 1
    assert "--format toml is not available for torchtitan 0.3" in err


@pytest.mark.parametrize(
    "extra", [[], ["--no-save-optimizer", "--no-async"], ["--milestones", "5000,10000,15000"]]
)
def test_megatron_flags_exist_in_the_targeted_source(extra, cli_run):
    rc, out, err = cli_run(
        *(
            [
                "export",
                "--framework",
                "megatron",
                "--format",
                "args",
                "20000",
                "2",
                "5000",
                "--frequency",
                "1000",
            ]
            + extra
        )
    )
    assert rc == 0
    flags = [t for t in shlex.split(out) if t.startswith("--")]
    assert flags and set(flags) <= MEGATRON_FLAGS
    assert shlex.split(out)[shlex.split(out).index("--save-interval") + 1] == "1000"
    assert ("--no-save-optim" in flags) == ("--no-save-optimizer" in extra)
    assert ("--async-save" in flags) == ("--no-async" not in extra)


def test_keep_last_1_cannot_go_to_torchtitan(cli_run):
    rc, out, err = cli_run(
        "export",
        "--framework",
        "torchtitan",
        "100",
        "2",
        "50",
        "--frequency",
        "10",
        "--keep-last",
        "1",
    )
    assert rc == 2 and out == "" and len(err.splitlines()) == 1
    assert "keep_latest_k=1" in err and "--keep-last 2" in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--framework", "tensorflow"] + PLAN, "invalid choice"),
        (
            ["--framework", "hf", "--framework-version", "3"] + PLAN,
            "expected transformers major version 4, 5",
        ),
        (["--framework", "torchtitan", "--framework-version", "0.4"] + PLAN, "0.1, 0.2, 0.3"),
        (
            ["--framework", "orbax", "--framework-version", "0.11.5"] + PLAN,
            "0.11 means 0.11.13 or later",
        ),
        (
            ["--framework", "orbax", "--framework-version", "0.12\nimport os"] + PLAN,
            "not a version number",
        ),
        (["--framework", "hf", "--framework-version", ""] + PLAN, "not a version number"),
        (["--framework", "hf", "--format", "toml"] + PLAN, "--format toml is not available for hf"),
        (
            ["--framework", "megatron", "--format", "python"] + PLAN,
            "--format python is not available for megatron",
        ),
        (["--framework", "hf"], "nothing to export"),
        (["--framework", "hf", "100", "2"], "all three"),
        (["--framework", "hf", "--keep-last", "3"], "nothing to export"),
        (["100", "2", "50"], "--framework"),
    ],
)
def test_bad_input_one_line_exit_2(argv, words, cli_run):
    rc, out, err = cli_run(*(["export"] + argv))
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err, err


# 100,000 steps at 1.8 s a step is 50 h: the same run given by its length (issue 42)
BY_STEPS = ["100000", "1.8", "5000", "--params", "1B"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--duration", "50h", "1.8", "5000"],
        ["1.8", "5000", "--duration", "3000min"],
        ["50h", "1.8", "5000"],
        ["--duration=50h", "100000", "1.8", "5000"],
    ],
)
def test_duration_in_place_of_total_steps_as_plan_has_it(argv, cli_run):
    """export takes the run's length as plan does (cli.planoptions.add_optional_run): the export is the
    one the step count gives, and the schedule's total is the duration over the step time."""
    rc, want, _ = cli_run("export", "--framework", "megatron", "--format", "json", *BY_STEPS)
    rc2, got, err = cli_run(
        "export", "--framework", "megatron", "--format", "json", *argv, "--params", "1B"
    )
    assert rc == rc2 == 0, err
    assert (
        json.loads(got) == json.loads(want) and json.loads(got)["schedule"]["total_steps"] == 100000
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["--duration", "50h", "1.8"],
            "all three of TOTAL_STEPS (or --duration) STEP_SECONDS BUDGET_GB",
        ),
        (["--duration", "50h"], "all three"),
        (
            ["--duration", "50h", "200000", "1.8", "5000"],
            "is 100000 steps, but TOTAL_STEPS is 200000",
        ),
        (["--duration", "50h", "50h", "1.8", "5000"], "give the run's length once"),
        (
            ["--duration", "3 fortnights", "1.8", "5000"],
            "argument --duration: expected a run length",
        ),
        (["--duration", "50h", "1.8", "-5"], "BUDGET_GB"),
        (["1.8", "5000", "10"], "argument TOTAL_STEPS: expected a whole number of steps"),
        (["--duration", "50h", "--plan-file", "plan.json"], "not both"),
    ],
)
def test_duration_given_wrongly_is_one_line_exit_2(argv, words, cli_run):
    rc, out, err = cli_run("export", "--framework", "hf", *argv)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err, err


def test_installed_version_differs_from_the_asked_one_warns(cli_run):
    rc, out, _ = cli_run(
        *(["export", "--framework", "hf", "--framework-version", "4", "--format", "json"] + PLAN)
    )
    data = json.loads(out)
    assert any("is installed here" in w for w in data["warnings"])


# --------------------------------------------------------------------------- plan files


def _plan_json(tmp_path, cli_run, *args):
    rc, out, _ = cli_run(*(list(args) + ["--format", "json"]))
    assert rc == 0
    path = tmp_path / "plan.json"
    path.write_text(out)
    return path


def test_plan_file_gives_the_same_export_as_the_arguments(tmp_path, cli_run):
    path = _plan_json(tmp_path, cli_run, *PLAN)
    _, a, _ = cli_run(
        "export", "--framework", "orbax", "--format", "python", "--plan-file", str(path)
    )
    _, b, _ = cli_run(*(["export", "--framework", "orbax", "--format", "python"] + PLAN))
    assert a == b and "FixedIntervalPolicy(interval=1000)" in a


@pytest.mark.parametrize(
    "content, words",
    [
        ("{", "not valid JSON"),
        ("[" * 100000 + "]" * 100000, "nested too deeply"),
        ("[1]", "not a JSON object"),
        ('{"total_steps": 5}', "does not match plan.schema.json"),
    ],
)
def test_bad_plan_files(content, words, tmp_path, cli_run):
    p = tmp_path / "plan.json"
    p.write_text(content)
    rc, out, err = cli_run("export", "--framework", "hf", "--plan-file", str(p))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err, err


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("frequency_steps", 0, "frequency_steps 0"),
        ("keep_last", 10**9, "keep_last"),
        ("milestone_steps", [0, 5], "milestone step 0"),
        ("total_steps", 10**13, "total_steps"),
    ],
)
def test_hand_edited_plan_file_numbers_are_bad_input(field, value, words, tmp_path, cli_run):
    path = _plan_json(tmp_path, cli_run, "1000", "2", "50", "--frequency", "100")
    data = json.loads(path.read_text())
    data[field] = value
    path.write_text(json.dumps(data))
    rc, out, err = cli_run("export", "--framework", "orbax", "--plan-file", str(path))
    assert rc == 2 and out == "" and words in err and len(err.strip().splitlines()) == 1


def test_plan_file_from_stdin_and_too_big(tmp_path, monkeypatch, cli_run):
    import io
    import sys

    path = _plan_json(tmp_path, cli_run, *PLAN)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    rc, out, err = cli_run(
        "export", "--framework", "megatron", "--format", "args", "--plan-file", "-"
    )
    assert rc == 0 and out.split()[:2] == ["--save-interval", "1000"]
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(65 << 20)  # sparse: no 65 MB written
    rc, out, err = cli_run("export", "--framework", "hf", "--plan-file", str(big))
    assert rc == 2 and out == "" and "larger than" in err and len(err.strip().splitlines()) == 1


def test_plan_file_fifo_folder_and_both_inputs(tmp_path, cli_run):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    rc, _, err = cli_run("export", "--framework", "hf", "--plan-file", str(fifo))
    assert rc == 2 and "FIFO" in err
    rc, _, err = cli_run("export", "--framework", "hf", "--plan-file", str(tmp_path))
    assert rc == 2 and "folder" in err
    path = _plan_json(tmp_path, cli_run, *PLAN)
    rc, _, err = cli_run(*(["export", "--framework", "hf", "--plan-file", str(path)] + PLAN))
    assert rc == 2 and "not both" in err
    # every plan option counts, the two-tier and node-rate ones too (they were once left out of export's list)
    for option in (
        ["--gpus-per-node", "4"],
        ["--local-tier", "100,5"],
        ["--min-interval-seconds", "60"],
    ):
        rc, out, err = cli_run("export", "--framework", "hf", "--plan-file", str(path), *option)
        assert rc == 2 and out == "" and "not both" in err, option


# --------------------------------------------------------------------------- what each exporter writes


def test_hf_save_total_limit_only_without_the_callback():
    inside = export_plan(
        report_for(total_steps=100, frequency=10, keep_last=3, milestones=[80, 100]), "hf", "5"
    )
    assert inside.settings[0].values["save_total_limit"] == 3 and not any(
        g.item == "keep_milestone" for g in inside.not_expressible
    )
    outside = export_plan(
        report_for(total_steps=100, frequency=10, keep_last=3, milestones=[20, 55]), "hf", "5"
    )
    assert "save_total_limit" not in outside.settings[0].values
    gap = next(g for g in outside.not_expressible if g.item == "keep_milestone")
    assert (
        "checkpoint_strategy.callbacks.HFCheckpointStrategy" in gap.instead
        and "20, 55" in gap.reason
    )


def test_lightning_second_callback_only_for_periodic_milestones():
    periodic = export_plan(
        report_for(total_steps=100, frequency=5, keep_last=2, milestones=[20, 40, 60, 80]),
        "lightning",
        "2",
    )
    names = [s.name for s in periodic.settings]
    assert "ModelCheckpoint (milestones)" in names
    assert (
        periodic.settings[names.index("ModelCheckpoint (milestones)")].values["every_n_train_steps"]
        == 20
    )
    seed = export_plan(
        report_for(milestones="seed"), "lightning", "2"
    )  # the seed rule as given (no budget fill)
    assert "ModelCheckpoint (milestones)" not in [s.name for s in seed.settings]
    gap = next(g for g in seed.not_expressible if g.item == "keep_milestone")
    assert "checkpoint_strategy.callbacks.LightningCheckpointStrategy" in gap.instead
    off = export_plan(
        report_for(total_steps=103, frequency=10, keep_last=2, milestones="none"), "lightning", "2"
    )
    assert any(g.item == "final step" and "103" in g.reason for g in off.not_expressible)


def test_orbax_milestone_needs_a_save_rule_and_a_keep_rule():
    ex = export_plan(
        report_for(total_steps=20, frequency=4, keep_last=2, milestones=[6]), "orbax", "0.12"
    )
    v = ex.settings[0].values
    assert v["save_decision_policy"]["SpecificStepsPolicy"]["steps"] == [6]
    assert v["preservation_policy"]["CustomSteps"]["steps"] == [6]
    assert v["preservation_policy"]["LatestN"]["n"] == 2
    periodic = export_plan(
        report_for(total_steps=40, frequency=4, keep_last=2, milestones=[8, 16, 24, 32, 40]),
        "orbax",
        "0.12",
    )
    assert periodic.settings[0].values["preservation_policy"]["EveryNSteps"] == {
        "interval_steps": 8
    }


def test_megatron_milestones_off_the_interval_are_never_written():
    ex = export_plan(
        report_for(total_steps=20000, frequency=1000, milestones=[1500, 5000]), "megatron", "0.20"
    )
    gap = next(g for g in ex.not_expressible if g.item == "keep_milestone")
    assert "1500" in gap.reason and "5000" not in gap.reason
    keep = next(g for g in ex.not_expressible if g.item == "keep_last")
    assert "checkpoint-strategy prune" in keep.instead


def test_megatron_periodic_milestones_do_not_emit_save_retain_interval():
    """--save-retain-interval keeps its multiples and only the newest save between them (a window of 1):
    with keep_last 10 it would delete the rolling window, so it is named under "not expressible" instead."""
    ex = export_plan(
        report_for(
            total_steps=20000, frequency=1000, keep_last=10, milestones=[5000, 10000, 15000, 20000]
        ),
        "megatron",
        "0.20",
    )
    assert "--save-retain-interval" not in ex.settings[0].values
    keep = next(g for g in ex.not_expressible if g.item == "keep_last")
    assert "--save-retain-interval 5000" in keep.reason and "window of 1" in keep.reason
    off = export_plan(
        report_for(total_steps=20000, frequency=1000, milestones=[1500]), "megatron", "0.20"
    )
    assert (
        "would keep the milestones"
        not in next(g for g in off.not_expressible if g.item == "keep_last").reason
    )


def test_deepspeed_cadence_includes_off_grid_milestones_and_the_final_step(cli_run):
    rc, out, _ = cli_run(
        "export",
        "--framework",
        "deepspeed",
        "--format",
        "python",
        "1003",
        "2",
        "50",
        "--frequency",
        "100",
        "--milestones",
        "150,500",
    )
    ns: dict = {}
    exec(
        compile(out, "export-deepspeed", "exec"), ns
    )  # the emitted code is plain data and one function
    saves = [s for s in range(1, 1004) if ns["should_save"](s)]
    assert saves == sorted(set(range(100, 1001, 100)) | {150, 1003})
    assert ns["checkpoint_config"]["tag_validation"] == "Fail"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    framework=st.sampled_from(FRAMEWORKS),
    total=st.integers(1, 10**6),
    freq=st.integers(1, 10**6),
    keep=st.integers(1, 60),
    ms=st.lists(st.integers(1, 10**6), max_size=6),
    fmt=st.sampled_from(["text", "json", "python", "toml", "args"]),
    version=st.sampled_from([None, "4", "5", "2", "0.1", "0.3", "0.12", "0", "7.7", "x"]),
)
def test_fuzz_never_exit_3(framework, total, freq, keep, ms, fmt, version, cli_run):
    argv = [
        "export",
        "--framework",
        framework,
        "--format",
        fmt,
        str(total),
        "2",
        "100",
        "--frequency",
        str(freq),
        "--keep-last",
        str(keep),
    ]
    if ms:
        argv += ["--milestones", ",".join(map(str, ms))]
    if version is not None:
        argv += ["--framework-version", version]
    rc, out, err = cli_run(*argv)
    assert rc in (0, 2), err
    if rc == 2:
        assert len(err.strip().splitlines()) == 1 and out == ""


# --------------------------------------------------------------------------- FSDP state-dict settings (issue 27)


def _hf(cli_run, formats: str) -> dict:
    return cli_run(
        "export",
        "--framework",
        "hf",
        "--framework-version",
        "4.46",
        "100000",
        "2.5",
        "500",
        "--model-size-gb",
        "4",
        "--formats",
        formats,
        "--format",
        "json",
    ).json()


def test_hf_export_names_the_fsdp_state_dict_type_when_the_plan_is_sharded(cli_run, tmp_path):
    """The plan says sharded: export names fsdp_config's fsdp_state_dict_type, and the real libraries take it
    (transformers' TrainingArguments keeps it as state_dict_type; torch's StateDictType has the member)."""
    sharded = _hf(cli_run, "sharded,full_state_dict")
    (fsdp,) = [s for s in sharded["settings"] if s["name"] == "fsdp_config"]
    assert fsdp["values"] == {"fsdp_state_dict_type": "SHARDED_STATE_DICT"}
    assert "FULL_STATE_DICT" in fsdp["note"] and "before moving to other hardware" in fsdp["note"]
    assert not [
        s
        for s in _hf(cli_run, "full_state_dict,safetensors")["settings"]
        if s["name"] == "fsdp_config"
    ]
    only = [s for s in _hf(cli_run, "sharded")["settings"] if s["name"] == "fsdp_config"]
    assert only and "before moving to other hardware" not in only[0]["note"]
    py = cli_run(
        "export",
        "--framework",
        "hf",
        "--framework-version",
        "4.46",
        "100000",
        "2.5",
        "500",
        "--model-size-gb",
        "4",
        "--formats",
        "sharded",
        "--format",
        "python",
    ).out
    namespace: dict = {}
    exec(
        compile(py.replace("from transformers import TrainingArguments", ""), "export.py", "exec"),
        namespace,
    )
    transformers = pytest.importorskip("transformers")
    fsdp_module = pytest.importorskip("torch.distributed.fsdp")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        fsdp=True if transformers.__version__[0] >= "5" else "full_shard",
        fsdp_config=namespace["fsdp_config"],
        use_cpu=True,
    )
    assert args.fsdp_config["state_dict_type"] == "SHARDED_STATE_DICT"
    assert (
        fsdp_module.StateDictType[args.fsdp_config["state_dict_type"]].name == "SHARDED_STATE_DICT"
    )
