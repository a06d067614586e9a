"""`recover` and `verify-resume` on the real HF Trainer run (tiny GPT-2, spike injected at step 120)."""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.resources import load_schema


def run_json(cli_run, *args):
    r = cli_run(*args, "--format", "json")
    return r.rc, r.json()


def test_recover_names_checkpoint_110_not_the_spiked_checkpoint_120(hf_run, cli_run):
    rc, rep = run_json(cli_run, "recover", str(hf_run.output_dir))
    assert rc == 0
    jsonschema.validate(rep, load_schema("recovery-report.schema.json"))
    assert rep["status"] == "rollback" and rep["self_recovered"] is False
    spike = rep["spike"]
    assert spike["onset_step"] == hf_run.spike_step + 1
    assert spike["peak_step"] in range(121, 126) and spike["peak_loss"] > 8
    assert 0.7 < spike["baseline_loss"] < 1.4 and spike["magnitude"] > 5
    assert rep["resume_checkpoint"]["step"] == 110
    assert rep["resume_checkpoint"]["path"] == str(hf_run.output_dir / "checkpoint-110")
    assert rep["skip_batches"][0] == 111 and rep["skip_batches"][1] > 121
    # the 500-step LR window is clipped to the run's max_steps (200, from trainer_state.json)
    assert rep["max_steps"] == hf_run.max_steps and rep["lr_reduced_until_step"] == hf_run.max_steps
    assert (rep["lr_multiplier"], rep["lr_reduced_steps"], rep["grad_clip"]) == (0.5, 90, 0.5)
    assert rep["restarts"] == []
    assert rep["log"]["path"].endswith("checkpoint-200/trainer_state.json")


def test_recover_from_the_trainer_state_file_and_an_explicit_list(hf_run, cli_run):
    _, rep = run_json(cli_run, "recover", str(hf_run.trainer_state))
    assert rep["resume_checkpoint"]["path"] == str(hf_run.output_dir / "checkpoint-110")
    _, rep = run_json(
        cli_run, "recover", str(hf_run.trainer_state), "--checkpoints", "50,100,110,120,130"
    )
    assert rep["resume_checkpoint"] == {
        "step": 110,
        "path": None,
        "kind": "checkpoint",
        "smoothed_loss": rep["resume_checkpoint"]["smoothed_loss"],
        "within_tolerance": True,
        "tag": "resume",
    }
    _, rep = run_json(cli_run, "recover", str(hf_run.trainer_state), "--checkpoints", "120,130,140")
    assert rep["status"] == "no_clean_checkpoint" and rep["resume_checkpoint"] is None
    assert "keep_last" in rep["policy_advice"]


def test_text_and_markdown_reports(hf_run, capsys):
    assert main(["recover", str(hf_run.output_dir)]) == 0
    text = capsys.readouterr().out
    assert "checkpoint-110 (step 110)" in text and "Onset step:      121" in text
    assert "trainer.train(resume_from_checkpoint=" in text
    assert main(["recover", str(hf_run.output_dir), "--format", "markdown"]) == 0
    assert "| resume from |" in capsys.readouterr().out


def test_verify_resume_on_a_real_resume_with_the_pasted_override(hf_run, tmp_path, capsys, cli_run):
    """Resume the real run from checkpoint-110 with the generated HF override, then check the resume."""
    import realruns
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    run_dir = tmp_path / "hf-run"
    run_dir.mkdir()
    shutil.copytree(hf_run.output_dir / "checkpoint-110", run_dir / "checkpoint-110")
    _, rep = run_json(cli_run, "recover", str(hf_run.trainer_state), "--checkpoints", str(run_dir))
    code = rep["overrides"]["hf_trainer"]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    )
    training_args = TrainingArguments(
        output_dir=str(run_dir),
        max_steps=200,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        warmup_steps=10,
        logging_steps=1,
        save_steps=30,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
        max_grad_norm=1.0,
    )
    seen: dict[int, float] = {}

    class Probe(TrainerCallback):  # the lr the optimizer really uses, relative to the schedule
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            def record(opt, a, k):
                seen[state.global_step + 1] = (
                    opt.param_groups[0]["lr"] / lr_scheduler.get_last_lr()[0]
                )

            getattr(optimizer, "optimizer", optimizer).register_step_pre_hook(record)

    class ProbedTrainer(Trainer):
        def __init__(self, *a, callbacks=None, **k):
            super().__init__(*a, callbacks=[*(callbacks or []), Probe()], **k)

    ns = {
        "Trainer": ProbedTrainer,
        "model": model,
        "training_args": training_args,
        "train_dataset": realruns._TokenDataset(4096, 16, 64),
    }
    exec(compile(code, "hf_override", "exec"), ns)  # the pasted snippet runs as is
    assert training_args.max_grad_norm == 0.5
    assert seen[111] == pytest.approx(0.5) and seen[200] == pytest.approx(0.5)
    state = json.loads((run_dir / "checkpoint-200" / "trainer_state.json").read_text())
    losses = {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}
    assert max(losses[s] for s in range(111, 201)) < 3  # no spike this time
    capsys.readouterr()  # the Trainer prints its logs to stdout
    rc = main(
        [
            "verify-resume",
            str(run_dir / "checkpoint-200" / "trainer_state.json"),
            "--resume-step",
            "110",
            "--format",
            "json",
        ]
    )
    ver = json.loads(capsys.readouterr().out)
    jsonschema.validate(ver, load_schema("verify-resume-report.schema.json"))
    assert ver["jump"] is False and ver["drop"] is False
    assert ver["lr_discontinuity"] is False  # HF logs the scheduler's lr, which the resume restored
    assert rc == 0 and ver["verdict"] == "ok"
