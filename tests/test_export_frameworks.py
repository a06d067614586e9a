"""Exported settings run in the real frameworks on CPU, and the validator reads their real checkpoints.

- hf, lightning, orbax: the emitted code builds the real objects, and a short real run saves at exactly the
  planned steps and keeps exactly the planned set (milestones included where the framework can hold them).
- Orbax, torchtitan (plain DCP with torchtitan's folder names and keys) and DeepSpeed ZeRO-1 checkpoints made
  here are valid; their torn copies are incomplete or invalid with the file named.

Orbax and DeepSpeed are in the `frameworks` extra; without it those tests skip with the reason.
"""

from __future__ import annotations

import os
import shutil

import pytest
import realruns

from checkpoint_strategy.export import export_plan, render_export
from checkpoint_strategy.export.common import grid_saves, kept_at_end
from checkpoint_strategy.planning.options import validate_arguments
from checkpoint_strategy.planning.planner import plan
from checkpoint_strategy.validate import validate_checkpoint, validate_paths


def exported(framework, version, **plan_args):
    report = plan(validate_arguments(dict({"step_seconds": 1.0, "budget_gb": 10.0}, **plan_args)))
    export = export_plan(report, framework, version)
    return export, render_export(export, "python")


def run_code(code: str) -> dict:
    ns: dict = {}
    exec(compile(code, "exported", "exec"), ns)  # our own emitted settings, not user content
    return ns


# --------------------------------------------------------------------------- hf


def test_hf_exported_kwargs_build_training_arguments_and_keep_exactly_the_plan(tmp_path):
    from transformers import TrainingArguments

    export, code = exported("hf", None, total_steps=23, frequency=5, keep_last=2, milestones=[20])
    kwargs = run_code(code)["checkpoint_kwargs"]
    assert kwargs["save_total_limit"] == 2
    TrainingArguments(output_dir=str(tmp_path / "probe"), **kwargs)
    run = realruns.run_hf_with_kwargs(tmp_path, kwargs)
    assert run.saved == grid_saves(export.schedule) == [5, 10, 15, 20, 23]
    assert run.kept == kept_at_end(export.schedule) == [20, 23]


def test_hf_milestones_outside_the_window_leave_rotation_to_the_callback(tmp_path):
    export, code = exported("hf", None, total_steps=20, frequency=5, keep_last=2, milestones=[5])
    kwargs = run_code(code)["checkpoint_kwargs"]
    assert "save_total_limit" not in kwargs
    assert "HFCheckpointStrategy" in code  # the emitted file says what holds the milestones
    run = realruns.run_hf_with_kwargs(tmp_path, kwargs)
    assert run.saved == grid_saves(export.schedule) == [5, 10, 15, 20]
    assert run.kept == [5, 10, 15, 20]  # nothing rotated natively: the callback's job


# --------------------------------------------------------------------------- lightning


def test_lightning_exported_callbacks_save_and_keep_exactly_the_plan(tmp_path):
    export, code = exported(
        "lightning", None, total_steps=25, frequency=5, keep_last=2, milestones=[10, 20]
    )
    ns = run_code(code)
    assert export.schedule.async_save  # the emitted AsyncCheckpointIO plugin is used too
    run = realruns.run_lightning_with_callbacks(
        tmp_path, ns["checkpoint_callbacks"], max_steps=25, plugins=ns["trainer_plugins"]()
    )
    assert sorted(set(run.saved)) == grid_saves(export.schedule) == [5, 10, 15, 20, 25]
    assert run.kept == kept_at_end(export.schedule) == [10, 20, 25]
    assert run.names == [
        "milestone-step=10.ckpt",
        "milestone-step=20.ckpt",
        "step=20.ckpt",
        "step=25.ckpt",
    ]
    report = validate_paths([str(run.folder)])
    assert report.summary.valid == 4 and all(c.resumable for c in report.checkpoints)


# --------------------------------------------------------------------------- orbax


def _orbax():
    return pytest.importorskip(
        "orbax.checkpoint",
        reason="Orbax is in the frameworks extra: pip install "
        "orbax-checkpoint 'jax[cpu]' (or '.[test,frameworks]')",
    )


@pytest.mark.parametrize(
    "plan_args, saved, kept",
    [
        (
            dict(total_steps=22, frequency=4, keep_last=2, milestones=[6, 10]),
            [4, 6, 8, 10, 12, 16, 20, 22],
            [6, 10, 20, 22],
        ),
        (
            dict(total_steps=24, frequency=3, keep_last=2, milestones=[8, 16, 24]),
            [3, 6, 8, 9, 12, 15, 16, 18, 21, 24],
            [8, 16, 21, 24],
        ),
    ],
)
def test_orbax_exported_options_save_and_keep_exactly_the_plan(plan_args, saved, kept, tmp_path):
    _orbax()
    export, code = exported("orbax", None, **plan_args)
    options = run_code(code)["options"]
    run = realruns.run_orbax_with_options(tmp_path, options, plan_args["total_steps"])
    assert run.saved == grid_saves(export.schedule) == saved
    assert run.kept == kept_at_end(export.schedule) == kept
    assert sorted(int(n) for n in run.names if n.isdigit()) == kept
    # the validator reads the real layout: commit_success.txt, _CHECKPOINT_METADATA, ocdbt; optimizer state seen
    report = validate_paths([str(run.folder)], level="full")
    assert [c.step for c in report.checkpoints] == kept
    assert all(
        c.status == "valid" and c.format == "orbax" and c.resumable for c in report.checkpoints
    )


@pytest.fixture(scope="module")
def orbax_folder(tmp_path_factory):
    _orbax()
    export, code = exported(
        "orbax", None, total_steps=8, frequency=4, keep_last=2, milestones="none"
    )
    return realruns.run_orbax_with_options(
        tmp_path_factory.mktemp("orbax"), run_code(code)["options"], 8
    ).folder


def test_orbax_step_without_its_commit_file_is_incomplete(orbax_folder, tmp_path):
    root = tmp_path / "torn"
    shutil.copytree(orbax_folder, root)
    os.remove(root / "8" / "commit_success.txt")
    report = validate_paths([str(root)])
    by_step = {c.step: c for c in report.checkpoints}
    assert by_step[4].status == "valid"
    assert by_step[8].status == "incomplete"
    assert [p.file for p in by_step[8].problems] == ["commit_success.txt"]


def test_orbax_truncated_item_metadata_is_invalid(orbax_folder, tmp_path):
    root = tmp_path / "torn"
    shutil.copytree(orbax_folder, root)
    meta = root / "4" / "default" / "_METADATA"
    meta.write_bytes(meta.read_bytes()[:40])
    result = validate_checkpoint(root / "4")
    assert result.status == "invalid"
    assert any(
        p.file == os.path.join("default", "_METADATA") and "JSON" in p.reason
        for p in result.problems
    )


def test_orbax_save_killed_mid_write_is_in_flight(orbax_killed_save):
    report = validate_paths([str(orbax_killed_save)])
    by_name = {os.path.basename(c.path): c for c in report.checkpoints}
    assert by_name["1"].status == "valid"
    tmp = by_name["2.orbax-checkpoint-tmp"]
    assert tmp.status == "incomplete" and tmp.step == 2 and "in-flight" in tmp.problems[0].reason


# --------------------------------------------------------------------------- torchtitan layout (plain DCP)


def test_torchtitan_full_step_resumes_and_model_only_final_does_not(torchtitan_layout):
    report = validate_paths([str(torchtitan_layout)], level="full")
    by_step = {c.step: c for c in report.checkpoints}
    assert by_step[10].format == by_step[20].format == "torchtitan"
    assert by_step[10].status == by_step[20].status == "valid"
    assert by_step[10].resumable and not any("not resumable" in n for n in by_step[10].notes)
    assert not by_step[20].resumable
    note = next(n for n in by_step[20].notes if n.startswith("not resumable"))
    assert "step-20" in note and "last_save_model_only" in note


def test_torchtitan_torn_copy_names_the_missing_shard(torchtitan_layout, copy_of):
    step = copy_of(torchtitan_layout / "step-10")
    shard = next(p for p in step.iterdir() if p.suffix == ".distcp")
    os.remove(shard)
    result = validate_checkpoint(step)
    assert result.status == "incomplete" and [p.file for p in result.problems] == [shard.name]


# --------------------------------------------------------------------------- deepspeed


def test_deepspeed_zero1_save_is_valid(deepspeed_run):
    report = validate_paths([str(deepspeed_run)], level="full")
    assert [c.step for c in report.checkpoints] == [3, 6]
    assert all(
        c.status == "valid" and c.format == "deepspeed" and c.resumable and c.sharded
        for c in report.checkpoints
    )
    assert (deepspeed_run / "latest").read_text().strip() == "global_step6"


def test_deepspeed_torn_copies(deepspeed_run, tmp_path):
    root = tmp_path / "torn"
    shutil.copytree(deepspeed_run, root)
    optim = root / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    optim.write_bytes(optim.read_bytes()[: optim.stat().st_size // 2])
    shutil.rmtree(root / "global_step6")  # `latest` still names it
    report = validate_paths([str(root)])
    by_step = {c.step: c for c in report.checkpoints}
    assert by_step[3].status == "invalid"
    assert [p.file for p in by_step[3].problems] == [optim.name]
    assert by_step[6].status == "incomplete"
    model = root / "global_step3" / "mp_rank_00_model_states.pt"
    os.remove(model)
    result = validate_checkpoint(root / "global_step3")
    assert any(p.file == model.name and p.kind == "incomplete" for p in result.problems)


def test_deepspeed_copy_without_its_zero_optimizer_shard_is_incomplete(deepspeed_run, tmp_path):
    step = tmp_path / "global_step6"
    shutil.copytree(deepspeed_run / "global_step6", step)
    os.remove(step / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    result = validate_checkpoint(step)
    # the model states say ZeRO stage 1 (read from their pickle opcodes), so this is a torn copy, not weights-only
    assert result.status == "incomplete"
    assert [p.file for p in result.problems] == ["zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert "ZeRO stage 1" in result.problems[0].reason


def test_deepspeed_resume_target_is_what_a_plain_resume_loads_not_its_universal_twin(
    deepspeed_run, tmp_path, cli_run
):
    """ds_to_universal beside a real ZeRO-1 save: global_step6 and global_step6_universal are both valid at step 6;
    only global_step6 loads without `checkpoint.load_universal: true`, so validate, handoff and recover name it,
    whatever the listing order. An empty `latest` is shown as the resume pointer it is, not as a checkpoint."""
    root = tmp_path / "ds"
    shutil.copytree(deepspeed_run, root)
    realruns.build_deepspeed_universal(root)
    assert validate_checkpoint(root / "global_step6_universal").status == "valid"
    (root / "latest").write_text("")
    out = cli_run("validate", root, "--format", "json").json()
    assert [s["newest_safe"] for s in out["safety"]] == [str(root / "global_step6")]
    pointer = next(c for c in out["checkpoints"] if c["path"].endswith("latest"))
    assert pointer["pointer"] is True and pointer["status"] == "invalid"
    assert "resume pointer (what resuming loads), not a checkpoint" in cli_run("validate", root).out
    assert not any(c["pointer"] for c in out["checkpoints"] if not c["path"].endswith("latest"))
    handoff = cli_run(
        "handoff", "--checkpoints", root, "--state-dir", tmp_path / "state", "--format", "json"
    ).json()
    assert handoff["latest_valid_checkpoint"]["path"] == str(root / "global_step6")
