"""Five everyday requests, answered with the commands SKILL.md prescribes for them, on copies of the real HF
run (spike at step 121 that never recovers: checkpoint-120 already holds spiked weights; max_steps 200).

Each scenario takes its command lines from SKILL.md's own section (so the instructions and the test cannot
drift), fills the UPPERCASE words the way an agent would and runs them with bash through the launcher.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from cliresult import checkout_env
from test_skill import expand, frontmatter

PREFIX = 'python3 "${CLAUDE_SKILL_DIR}/scripts/checkpoint-strategy"'
PLACEHOLDER = re.compile(
    r"\b(TOTAL_STEPS|STEP_SECONDS|BUDGET_GB|TRAIN_LOG|CHECKPOINT_DIR|RUN_DIR|LOG|N)\b"
)


def section(skill_root, title: str) -> list[str]:
    """The launcher lines of the bash blocks under the SKILL.md heading that starts with `title`."""
    _, body = frontmatter(skill_root)
    parts = re.split(r"^## ", body, flags=re.M)
    (text,) = [p for p in parts if p.startswith(title)]
    return [
        ln.strip()
        for block in re.findall(r"```bash\n(.*?)```", text, re.S)
        for ln in block.splitlines()
        if ln.strip().startswith(PREFIX)
    ]


def run(line: str, skill_root, values: dict, cwd, ok=(0,)) -> str:
    for word, value in values.items():
        line = re.sub(rf"\b{word}\b", value, line)
    command = expand(line, "", skill_root)
    proc = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=checkout_env(),
    )
    assert proc.returncode in ok, f"{command}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.stdout


@pytest.fixture
def run_copy(hf_run, copy_of):
    return copy_of(hf_run.output_dir, "run")


def test_plan_7b_on_64_h100s_with_lustre(skill_root, tmp_path):
    """'Plan a 7B run on 64 H100s, Lustre at 20 GB/s, HF Trainer with bf16 autocast.'"""
    (line,) = [ln for ln in section(skill_root, "Starting a new training run") if "--gpus 64" in ln]
    assert (
        "--params 7B" in line
        and "--storage-gbps 20" in line
        and "--no-async" in line
        and "--precision fp32" in line
    )
    out = run(line, skill_root, {}, tmp_path)
    first = out.splitlines()[:12]
    assert first[0] == "=== Checkpoint Strategy Report ===" and any(
        "Frequency:" in ln for ln in first
    )
    data = json.loads(run(line + " --format json", skill_root, {}, tmp_path))
    fm = data["failure_model"]
    assert fm["gpus"] == 64 and fm["async_save"] is False and data["policy"]["async_save"] is False
    assert (
        data["precision"] == "fp32" and data["checkpoint_size_gb"] == 84
    )  # 7B x (4 + 4 + 4) bytes
    # 8 nodes x 1 GB/s per node, under the 20 GB/s aggregate cap; HF saves synchronously: the whole write stalls
    assert data["storage_writes"]["write_gbps"] == 8 and fm[
        "checkpoint_write_seconds"
    ] == pytest.approx(84 / 8)
    assert (
        "Interval Set By:" in out and "optimum" in out.split("Interval Set By:")[1].splitlines()[0]
    )


def test_pretraining_7b_on_256_h100s_for_3_weeks_writes_the_callbacks_plan(skill_root, tmp_path):
    """Issue 42: 'Pretraining a 7B model on 256 H100s for 3 weeks, 1.8 s a step, 40 TB on Lustre', run as SKILL.md
    writes it: the steps from the duration, a sharded resume format, and plan.json that the callbacks read."""
    from checkpoint_strategy.planning.planfile import report_from_data

    (line,) = [
        ln for ln in section(skill_root, "Starting a new training run") if "--duration 3w" in ln
    ]
    assert run(line, skill_root, {}, tmp_path) == ""
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["total_steps"] == 1008000 and data["policy"]["save_formats"] == [
        "sharded",
        "safetensors",
    ]
    assert report_from_data(data, "plan.json").total_steps == 1008000
    assert any(a["sets_interval"] for a in data["assumptions"]) and data["warnings"]


def test_my_loss_spiked(skill_root, run_copy, hf_run, tmp_path):
    """'My loss spiked.' recover headlines checkpoint-110 (never a post-onset one), windows end by max_steps."""
    recover = section(skill_root, '"My loss spiked"')[0]
    values = {"RUN_DIR": str(run_copy)}
    text = run(recover, skill_root, values, tmp_path)
    lines = text.splitlines()
    assert lines[0] == "=== Loss-Spike Recovery: ROLL BACK ==="
    assert (
        lines[3]
        == f"=> loss spike at step 121 not recovered: resume from {run_copy}/checkpoint-110"
    )
    assert lines[4].startswith("   1. pin checkpoint-110 now: cp -a ")
    rep = json.loads(run(recover + " --format json", skill_root, values, tmp_path))
    assert rep["resume_checkpoint"]["step"] == 110
    assert rep["resume_checkpoint"]["step"] not in {
        c["step"] for c in rep["checkpoints"]["post_event"]
    }
    assert (
        rep["lr_reduced_until_step"] <= hf_run.max_steps
        and rep["skip_batches"][1] <= hf_run.max_steps
    )
    assert "Lightning:\n" not in text
    safe = run(section(skill_root, "Which checkpoint is safe")[0], skill_root, values, tmp_path)
    assert safe.splitlines()[1].startswith(f"=> Resume from: {run_copy}/checkpoint-110 (step 110)")


def test_we_move_from_8_a100s_to_16_h100s(skill_root, run_copy, dcp_checkpoint, copy_of, tmp_path):
    """'We move from 8 A100s to 16 H100s next week': validate -> recover (spike check) -> manifest write/verify."""
    lines = section(skill_root, '"We move from')
    assert [ln.split('"', 2)[2].split()[0] for ln in lines] == [
        "validate",
        "recover",
        "validate",
        "validate",
    ]
    values = {"RUN_DIR": str(run_copy), "CHECKPOINT": str(run_copy / "checkpoint-110")}
    out = run(lines[0], skill_root, values, tmp_path)
    assert out.splitlines()[1].startswith(f"=> Resume from: {run_copy}/checkpoint-110")
    assert "Saved world size:\n  - 1 process" in out and "Moving to 16 GPUs (saved with 1):" in out
    assert (
        "keep constant: global batch = per-device batch x gradient accumulation x world size" in out
    )
    rep = json.loads(run(lines[1], skill_root, values, tmp_path))
    assert rep["resume_checkpoint"]["path"] == values["CHECKPOINT"]
    assert "manifest written" in run(lines[2], skill_root, values, tmp_path)
    assert "manifest verified" in run(lines[3], skill_root, values, tmp_path)
    # a sharded DCP checkpoint: the saved world size comes from its rank files
    dcp = copy_of(dcp_checkpoint)
    out = run(lines[0], skill_root, {"RUN_DIR": str(dcp)}, tmp_path)
    assert "Saved world size:\n  - 1 process: DCP shard files 1 written by rank 0" in out
    assert (
        "nothing to convert: dcp.load re-shards them to the new world size" in out
    )  # one answer: no convert line
    assert (
        "convert "
        not in out.split("Moving to", 1)[1]
        .split("shards:", 1)[1]
        .split("\n", 1)[0]
        .split("(one file", 1)[0]
    )


def test_the_disk_is_filling_up(skill_root, run_copy, tmp_path):
    """'The disk is filling up, clean it.' The dry run says how much it frees and keeps the newest safe one."""
    (line,) = section(skill_root, '"The disk is filling up"')
    before = sorted(p.name for p in run_copy.iterdir())
    out = run(line, skill_root, {"RUN_DIR": str(run_copy)}, tmp_path)
    assert sorted(p.name for p in run_copy.iterdir()) == before
    assert (
        "Proposed:      keep_last 11: save_steps 10" in out
        and "Newest safe:   checkpoint-110" in out
    )
    rep = json.loads(
        run(line + " --keep-last 3 --format json", skill_root, {"RUN_DIR": str(run_copy)}, tmp_path)
    )
    assert rep["bytes_to_free"] == sum(e["bytes"] for e in rep["delete"]) > 0
    assert rep["newest_valid"] == "checkpoint-110"
    # safe window 90-110; the post-onset ones keep their own window (180-200) and justify only each other
    assert {e["name"] for e in rep["delete"]} == {
        f"checkpoint-{s}" for s in [*range(10, 90, 10), *range(120, 180, 10)]
    }
    assert all(e["justified_by"] == "checkpoint-110" for e in rep["delete"] if e["step"] < 120)
    text = run(line + " --keep-last 3", skill_root, {"RUN_DIR": str(run_copy)}, tmp_path)
    assert re.search(r"14 to delete: frees \d[\d.]* MB\.$", text.rstrip())


def test_im_ending_my_session(skill_root, run_copy, tmp_path):
    """'I'm ending my session, hand off.' No placeholders; every written command runs as written."""
    line = section(skill_root, '"I\'m ending my session"')[0]
    assert " 100000 " not in line, "the plan-free form comes first"
    work = tmp_path / "session"
    work.mkdir()
    run(line, skill_root, {"RUN_DIR": str(run_copy)}, work)
    state = work / ".claude" / "state"
    next_action = (state / "NEXT_ACTION.md").read_text()
    doc = json.loads((state / "checkpoint-strategy.json").read_text())
    assert not PLACEHOLDER.search(next_action), PLACEHOLDER.search(next_action)
    assert f"**Resume from (newest safe checkpoint):** `{run_copy}/checkpoint-110`" in next_action
    assert "**Rollback points (safe to resume from):** 11 " in next_action
    assert doc["latest_valid_checkpoint"]["step"] == 110
    commands = doc["recovery_commands"]
    assert commands[0].startswith(f"cp -a {run_copy}/checkpoint-110 ")
    assert all(not c.startswith("checkpoint-strategy") for c in commands)
    for c in commands:  # from another folder, as the next session would
        proc = subprocess.run(
            ["bash", "-c", c],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env=checkout_env(),
        )
        assert proc.returncode in (0, 1), f"{c}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr and "error:" not in proc.stderr
    assert (run_copy / "pinned-checkpoint-110" / "optimizer.pt").is_file()


def test_handoff_pins_for_a_run_still_writing_checkpoints(
    skill_root, hf_run_self_recovering, copy_of, tmp_path
):
    run_dir = copy_of(hf_run_self_recovering.output_dir, "run")
    state = run_dir / "checkpoint-200" / "trainer_state.json"
    data = json.loads(state.read_text())
    data["max_steps"] = 400  # the job is at step 200 of 400: still writing and rotating checkpoints
    state.write_text(json.dumps(data))
    line = section(skill_root, '"I\'m ending my session"')[0]
    work = tmp_path / "s"
    work.mkdir()
    run(line, skill_root, {"RUN_DIR": str(run_dir)}, work)
    doc = json.loads((work / ".claude" / "state" / "checkpoint-strategy.json").read_text())
    assert doc["next_step"].startswith(
        f"pin now: cp -a {run_dir}/checkpoint-200 {run_dir}/pinned-checkpoint-200"
    )
    assert "pin checkpoint-200 now" in (work / ".claude" / "state" / "NEXT_ACTION.md").read_text()
