"""recover's advice completed for the run it read (recovery/advice.py: complete), on the real HF run: spike at step
121 never recovers, max_steps 200, checkpoints every 10 steps."""

from __future__ import annotations

import json
import subprocess

from cliresult import checkout_env

POST = [f"checkpoint-{s}" for s in range(120, 201, 10)]


def test_windows_end_at_max_steps_and_only_hf_code_in_text(hf_run, copy_of, cli_run):
    run = copy_of(hf_run.output_dir, "run")
    rep = cli_run("recover", str(run), "--format", "json").json()
    assert rep["framework"] == "hf_trainer" and rep["max_steps"] == 200
    assert rep["run_facts"]["max_steps"].endswith("checkpoint-200/trainer_state.json")
    assert (
        rep["lr_reduced_until_step"] <= hf_run.max_steps
        and rep["skip_batches"][1] <= hf_run.max_steps
    )
    assert rep["lr_reduced_steps"] == hf_run.max_steps - 110
    assert (
        "111 <= self.step <= 200" in rep["overrides"]["hf_trainer"]
        and rep["overrides"]["lightning"]
    )
    # no invented old value: neither the log nor a training_args.json says what max_grad_norm was
    assert rep["previous_grad_clip"] is None
    assert "was 1.0" not in json.dumps(rep) and "instead of 1.0" not in json.dumps(rep)
    text = cli_run("recover", str(run)).out
    assert "HF Trainer (paste into your training script):" in text and "\nLightning:\n" not in text
    assert "pytorch_lightning" not in text and "(The Lightning snippet is in --format json" in text
    assert "instead of" not in text and len(text.splitlines()) < 70
    assert "steps 111-200 (clipped to the run's max_steps 200)" in text


def test_actions_pin_and_move_aside_are_ready_and_never_run(hf_run, copy_of, cli_run):
    run = copy_of(hf_run.output_dir, "run")
    before = sorted(p.name for p in run.iterdir())
    rep = cli_run("recover", str(run), "--format", "json").json()
    assert sorted(p.name for p in run.iterdir()) == before, "recover must not move or copy anything"
    pin, move, new_folder, verify = rep["actions"]
    assert pin.startswith(
        f"pin checkpoint-110 now: cp -a {run}/checkpoint-110 {run}/pinned-checkpoint-110"
    )
    assert "new output folder" in new_folder
    assert " verify-resume RESUMED_LOG --resume-step 110 " in verify  # the step after resuming
    command = move.split(": ", 1)[1]
    assert command.startswith(f"mkdir -p {run}/post-spike-121 && mv ")
    text = cli_run("recover", str(run)).out.splitlines()
    assert text[4].startswith("   1. pin checkpoint-110 now") and text[5].startswith(
        "   2. move the 9"
    )
    # the commands run as printed; afterwards the run folder holds only checkpoints safe to resume from
    for line in (pin.split(": ", 1)[1].split("   (")[0], command):
        subprocess.run(["bash", "-c", line], check=True, timeout=60, env=checkout_env())
    assert sorted(p.name for p in (run / "post-spike-121").iterdir()) == sorted(POST)
    assert (run / "pinned-checkpoint-110" / "optimizer.pt").is_file()
    safety = cli_run("validate", str(run), "--format", "json").json()["safety"][0]
    assert safety["newest_safe"] in (f"{run}/checkpoint-110", f"{run}/pinned-checkpoint-110")
    assert safety["newest_safe_step"] == 110 and safety["post_onset"] == []


def test_old_clip_only_from_a_training_args_json(hf_run, copy_of, cli_run):
    run = copy_of(hf_run.output_dir, "run")
    (run / "training_args.json").write_text(
        json.dumps({"max_grad_norm": 1.0, "learning_rate": 3e-3})
    )
    rep = cli_run("recover", str(run), "--format", "json").json()
    assert rep["previous_grad_clip"] == 1.0 and rep["run_facts"]["max_grad_norm"] == str(
        run / "training_args.json"
    )
    assert "# tighter clipping (was 1)" in rep["overrides"]["hf_trainer"]
    assert "Grad clipping:   0.5 (instead of 1)" in cli_run("recover", str(run)).out


def test_a_log_without_framework_shows_both_snippets(hf_run, tmp_path, cli_run):
    history = json.loads(hf_run.trainer_state.read_text())["log_history"]
    log = tmp_path / "metrics.jsonl"
    log.write_text(
        "".join(
            json.dumps({"step": h["step"], "loss": h["loss"]}) + "\n"
            for h in history
            if "loss" in h
        )
    )
    rep = cli_run("recover", str(log), "--checkpoints", "100,110,120", "--format", "json").json()
    assert rep["framework"] is None and rep["max_steps"] is None and rep["status"] == "rollback"
    # checkpoints given as steps: nothing to pin or move; only the check after resuming
    assert (
        len(rep["actions"]) == 1 and "verify-resume RESUMED_LOG --resume-step" in rep["actions"][0]
    )
    assert "metrics.jsonl again if the resumed run appends to it" in rep["actions"][0]
    assert rep["lr_reduced_steps"] == 500  # nothing says where the run ends: not clipped
    text = cli_run("recover", str(log), "--checkpoints", "100,110,120").out
    assert "HF Trainer (paste" in text and "\nLightning:\n" in text
