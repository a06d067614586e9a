"""verify-resume --checkpoints on real resumes (issue 26, "Resume checks"): the optimizer's step counter
against the training step in every layout, and a resume on another world size.

Each framework wrote the checkpoint resumed from and the resumed run's own checkpoints on CPU
(tests/resumeruns.py, tests/realruns.py). The logs carry no learning rate, so the loss is all the
log check has: on these small models at a low learning rate a fresh AdamW does not move it, and the
checkpoints are the evidence.
"""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest

from checkpoint_strategy.formats.optstep import judge, read_optimizer_steps
from checkpoint_strategy.formats.runshape import check_resume_shape, read_run_shape
from checkpoint_strategy.recovery.models import VerifyResumeReport
from checkpoint_strategy.resources import load_schema


def _no_lr(src, dst):
    """The JSON lines log without its learning rate (a user logging the loss only)."""
    recs = [
        json.loads(line) for line in src.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    dst.write_text(
        "".join(json.dumps({"step": r["step"], "loss": r["loss"]}) + "\n" for r in recs),
        encoding="utf-8",
    )
    return dst


def _verify(cli_run, log, resume_step, *checkpoints, extra=()):
    argv = [
        "verify-resume",
        str(log),
        "--resume-step",
        str(resume_step),
        "--format",
        "json",
        *extra,
    ]
    for c in checkpoints:
        argv += ["--checkpoints", str(c)]
    r = cli_run(*argv)
    assert r.rc in (0, 1), r.err
    out = r.json()
    jsonschema.validate(out, load_schema("verify-resume-report.schema.json"))
    assert set(out) == set(VerifyResumeReport.model_fields)
    return r.rc, out


def _after(out):
    return [c for c in out["checkpoints"][1:]]


# --------------------------------------------------------------------------- HF Trainer: optimizer.pt deleted


def test_hf_resume_without_optimizer_pt_is_caught_by_the_checkpoints_not_the_loss(
    hf_resumes, cli_run, tmp_path
):
    r = hf_resumes
    log = _no_lr(r.logs["no_optimizer"], tmp_path / "no_optimizer.jsonl")
    rc, out = _verify(cli_run, log, r.resume_step)
    assert rc == 0 and out["verdict"] == "ok"  # the miss the issue reports: loss alone says ok
    rc, out = _verify(
        cli_run,
        log,
        r.resume_step,
        r.checkpoints["no_optimizer"].parent,
        r.resumed_dirs["no_optimizer"],
    )
    assert rc == 1 and out["verdict"] == "suspicious" and out["optimizer_reset"] is True
    assert out["jump"] is False and out["drop"] is False
    first = out["checkpoints"][0]
    assert first["path"].endswith(f"checkpoint-{r.resume_step}")
    # the copy resumed from has no optimizer.pt: nothing to compare there
    assert first["optimizer_step"] is None and first["verdict"] == "unknown"
    later = _after(out)
    assert [c["training_step"] for c in later] == [110, 120, 130]
    assert [c["optimizer_step"] for c in later] == [10, 20, 30]  # restarted at the resume
    assert all(c["verdict"] == "reset" and c["restart_step"] == r.resume_step for c in later)
    # HF's scheduler was reset with the optimizer (its _load_optimizer_and_scheduler needs both files)
    assert [c["scheduler_step"] for c in later] == [10, 20, 30]
    assert "optimizer state reset at step 100" in out["summary"]
    (reset_line,) = [x for x in out["reasons"] if "started from nothing" in x]
    assert (
        reset_line.startswith(str(later[0]["path"]))
        and "(and 2 later checkpoints likewise)" in reset_line
    )
    assert any(
        "LR scheduler last_epoch 10 at training step 110: the schedule restarted" in x
        for x in out["reasons"]
    )


def test_hf_intact_resume_stays_ok_with_checkpoints(hf_resumes, cli_run, tmp_path):
    import torch

    r = hf_resumes
    log = _no_lr(r.logs["normal"], tmp_path / "normal.jsonl")
    rc, out = _verify(
        cli_run, log, r.resume_step, r.checkpoints["normal"].parent, r.resumed_dirs["normal"]
    )
    assert rc == 0 and out["verdict"] == "ok" and out["optimizer_reset"] is False
    assert [
        (c["training_step"], c["optimizer_step"], c["verdict"]) for c in out["checkpoints"]
    ] == [
        (100, 100, "consistent"),
        (110, 110, "consistent"),
        (120, 120, "consistent"),
        (130, 130, "consistent"),
    ]
    assert out["batch_changed"] is False and out["shape_before"]["global_batch"] == 16
    assert not any("scheduler" in x for x in out["reasons"] + out["warnings"])
    # cross-check the opcode read against torch's own loader (tests may load; the package never does)
    sd = torch.load(r.resumed_dirs["normal"] / "checkpoint-120" / "optimizer.pt", weights_only=True)
    assert max(int(s["step"]) for s in sd["state"].values()) == 120


# --------------------------------------------------------------------------- plain loop + DCP


def test_plain_loop_with_a_new_adamw_is_flagged_and_the_intact_one_is_not(loop_resumes, cli_run):
    r = loop_resumes
    rc, out = _verify(cli_run, r.logs["reset"], r.resume_step)
    assert rc == 0, out["reasons"]  # the loss barely moves: the log check alone passes
    rc, out = _verify(cli_run, r.logs["reset"], r.resume_step, r.base, r.resumed["reset"])
    assert rc == 1 and out["optimizer_reset"] is True
    (later,) = _after(out)
    assert (later["training_step"], later["optimizer_step"], later["verdict"]) == (
        r.until,
        r.until - r.resume_step,
        "reset",
    )
    assert later["training_step_from"].startswith("train_state.step")  # an int: a DCP bytes item
    rc, out = _verify(cli_run, r.logs["intact"], r.resume_step, r.base, r.resumed["intact"])
    assert rc == 0 and out["optimizer_reset"] is False
    assert [(c["training_step"], c["optimizer_step"]) for c in out["checkpoints"]] == [
        (r.resume_step, r.resume_step),
        (r.until, r.until),
    ]


def test_torchtitan_train_state_tensor_and_flattened_optimizer_are_read(torchtitan_layout):
    full = read_optimizer_steps(str(torchtitan_layout / "step-10"))
    # the fixture stores train_state.step = tensor(10) after 2 optimizer steps, lr_scheduler last_epoch 2
    assert (full.training_step, full.optimizer_step, full.scheduler_step) == (10, 2, 2)
    assert full.verdict == "behind" and full.restart_step == 8
    assert judge(full, resume_step=8).verdict == "reset"
    model_only = read_optimizer_steps(str(torchtitan_layout / "step-20"))
    assert model_only.optimizer_step is None and model_only.verdict == "unknown"


# --------------------------------------------------------------------------- Lightning


def test_lightning_resume_with_cleared_optimizer_is_flagged(lightning_resumes, cli_run):
    import torch

    r = lightning_resumes
    rc, out = _verify(
        cli_run,
        r.logs["reset"],
        r.resume_step,
        r.base,
        r.resumed["reset"],
        extra=("--pre-points", "5", "--post-points", "3"),
    )
    assert rc == 1 and out["optimizer_reset"] is True
    reset = [c for c in _after(out) if c["training_step"] == 20]
    assert reset and reset[0]["optimizer_step"] == 10 and reset[0]["verdict"] == "reset"
    rc, out = _verify(
        cli_run,
        r.logs["intact"],
        r.resume_step,
        r.base,
        r.resumed["intact"],
        extra=("--pre-points", "5", "--post-points", "3"),
    )
    assert out["optimizer_reset"] is False
    assert all(c["verdict"] == "consistent" for c in out["checkpoints"])
    ckpt = next(r.resumed["intact"].glob("*step=20.ckpt"))
    sd = torch.load(ckpt, weights_only=False)
    assert (
        int(max(s["step"] for s in sd["optimizer_states"][0]["state"].values()))
        == read_optimizer_steps(str(ckpt)).optimizer_step
        == sd["global_step"]
    )


# --------------------------------------------------------------------------- DeepSpeed


def test_deepspeed_load_without_optimizer_states_is_flagged(deepspeed_resumes, cli_run):
    r = deepspeed_resumes
    rc, out = _verify(
        cli_run,
        r.logs["reset"],
        r.resume_step,
        r.base,
        r.resumed["reset"],
        extra=("--pre-points", "3", "--post-points", "1", "--tolerance", "100"),
    )
    assert rc == 1 and out["optimizer_reset"] is True
    (later,) = _after(out)
    assert (later["training_step"], later["skipped_steps"], later["optimizer_step"]) == (6, 0, 3)
    assert later["training_step_from"].endswith("global_steps")
    rc, out = _verify(
        cli_run,
        r.logs["intact"],
        r.resume_step,
        r.base,
        r.resumed["intact"],
        extra=("--pre-points", "3", "--post-points", "1", "--tolerance", "100"),
    )
    assert rc == 0 and out["optimizer_reset"] is False
    assert out["shape_before"]["world_size"] == out["shape_after"]["world_size"] == 1
    assert out["shape_before"]["global_batch"] == 4  # global_samples / global_steps


# --------------------------------------------------------------------------- 2 processes -> 1


def test_resume_on_one_process_after_two_warns_global_batch_halved(hf_world_change, cli_run):
    out_dir = hf_world_change
    log = out_dir / "checkpoint-6" / "trainer_state.json"
    rc, out = _verify(
        cli_run,
        log,
        4,
        out_dir,
        extra=("--pre-points", "3", "--post-points", "1", "--tolerance", "100"),
    )
    assert rc == 1 and out["batch_changed"] is True and out["optimizer_reset"] is False
    before, after = out["shape_before"], out["shape_after"]
    assert (
        before["world_size"],
        before["per_device_batch"],
        before["accumulation"],
        before["global_batch"],
    ) == (2, 16, 1, 32)
    assert (after["world_size"], after["global_batch"]) == (1, 16)
    line = next(x for x in out["reasons"] if x.startswith("global batch changed"))
    assert "32" in line and "16" in line and "gradient accumulation to 2" in line
    assert "global batch changed" in out["summary"]


def test_check_resume_shape_for_callbacks(hf_world_change):
    ckpt = str(hf_world_change / "checkpoint-4")
    assert read_run_shape(ckpt).world_size == 2
    assert check_resume_shape(ckpt, world_size=2) == []
    (halved,) = check_resume_shape(ckpt, world_size=1)
    assert "32" in halved and "-> 16" in halved and "gradient accumulation to 2" in halved
    (kept,) = check_resume_shape(ckpt, world_size=1, accumulation=2)
    assert "kept at 32" in kept
    with pytest.raises(ValueError):
        check_resume_shape(ckpt, world_size=0)


def test_world_change_without_batch_record_is_a_warning(hf_world_change, cli_run, tmp_path):
    """Without training_args.bin (per-device batch and accumulation) and trainer_state.json's train_batch_size the
    global batch is not recorded: the world size change (rng_state_N.pth files) is a warning with the advice."""
    out_dir = tmp_path / "run"
    shutil.copytree(hf_world_change, out_dir)
    for c in out_dir.glob("checkpoint-*"):
        (c / "training_args.bin").unlink()
        state = json.loads((c / "trainer_state.json").read_text())
        state.pop("train_batch_size")
        (c / "trainer_state.json").write_text(json.dumps(state))
    rc, out = _verify(
        cli_run,
        out_dir / "checkpoint-6" / "trainer_state.json",
        4,
        out_dir,
        extra=("--pre-points", "3", "--post-points", "1", "--tolerance", "100"),
    )
    assert out["batch_changed"] is None and rc == 0
    assert any(
        "world size changed at the resume: 2 -> 1 process" in w and "2/1" in w
        for w in out["warnings"]
    )


def test_validate_deep_compares_the_dcp_train_state_with_the_optimizer_counter(loop_resumes):
    """The deep level reads HF's and Lightning's counters itself; a DCP train_state.step (and DeepSpeed's
    global_steps) come from formats/optstep.py."""
    from checkpoint_strategy.validate.engine import validate_paths

    r = loop_resumes
    (reset,) = validate_paths([str(r.resumed["reset"])], level="deep").checkpoints
    assert (reset.deep.optimizer.step, reset.deep.optimizer.global_step) == (
        r.until - r.resume_step,
        r.until,
    )
    assert [p.kind for p in reset.problems] == ["suspicious"]
    assert f"restarted at step {r.resume_step}" in reset.problems[0].reason
    (intact,) = validate_paths([str(r.resumed["intact"])], level="deep").checkpoints
    assert (intact.deep.optimizer.step, intact.deep.optimizer.global_step) == (r.until, r.until)
    assert intact.problems == [] and intact.resumable is True


def test_resume_into_the_same_folder_reads_the_resumed_checkpoints(hf_run_restarted, cli_run):
    """trainer.train(resume_from_checkpoint=True) in the crashed run's own folder: its later checkpoints are the
    resume's, with the optimizer counter carried on."""
    r = hf_run_restarted
    _rc, out = _verify(cli_run, r.log, r.resume_step, r.output_dir)
    assert out["checkpoints"][0]["path"].endswith(f"checkpoint-{r.resume_step}")
    later = _after(out)
    assert later and all(
        c["verdict"] == "consistent" and c["optimizer_step"] == c["training_step"] for c in later
    )
    assert out["optimizer_reset"] is False and out["batch_changed"] is False


@pytest.mark.parametrize(
    "accumulation, kind, expect",
    [
        (1, "global batch changed", "gradient accumulation to 2"),
        (2, "world size changed", "kept at 32"),
    ],
)
def test_hf_callback_warns_at_a_resume_on_fewer_processes(
    hf_world_change, tmp_path, caplog, accumulation, kind, expect
):
    """The HF callback's on_train_begin on a resume (global_step 4 loaded from checkpoint-4, saved by 2 torchrun
    processes) in this one process, with real TrainingArguments: the global batch halving is a warning that says
    what keeps the schedule; scaling the accumulation by 2/1 keeps it (and says so)."""
    import logging

    from transformers import TrainerControl, TrainerState, TrainingArguments

    from checkpoint_strategy.callbacks import HFCheckpointStrategy

    out_dir = tmp_path / "run"
    shutil.copytree(hf_world_change, out_dir)
    args = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=16,
        gradient_accumulation_steps=accumulation,
        report_to=[],
        use_cpu=True,
    )
    assert args.world_size == 1
    cb = HFCheckpointStrategy({"frequency": "every_2_steps", "keep_last": 2}, handoff_dir=None)
    with caplog.at_level(logging.WARNING, logger="checkpoint_strategy"):
        cb.on_train_begin(args, TrainerState(global_step=4), TrainerControl())
    cb.core.end()
    (line,) = cb.core.resume_warnings
    assert line.startswith(kind) and expect in line
    assert any(expect in r.getMessage() for r in caplog.records)
    # a fresh run (global_step 0) and a resume from a checkpoint not in this folder: nothing to compare
    fresh = HFCheckpointStrategy({"frequency": "every_2_steps", "keep_last": 2}, handoff_dir=None)
    fresh.on_train_begin(args, TrainerState(global_step=0), TrainerControl())
    fresh.on_train_begin(args, TrainerState(global_step=999), TrainerControl())
    fresh.core.end()
    assert fresh.core.resume_warnings == []
