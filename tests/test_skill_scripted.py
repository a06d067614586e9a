"""Scripted skill tests: run every command SKILL.md gives, as an agent would, on real runs.

The agent replaces the UPPERCASE words with the user's real paths and `${CLAUDE_SKILL_DIR}` with
the skill folder, then runs the line with bash. Here the paths are the shared real HF run.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from cliresult import checkout_env
from test_skill import expand, frontmatter, manifest

PREFIX = 'python3 "${CLAUDE_SKILL_DIR}/scripts/checkpoint-strategy"'
EXPECTED_RC = {"verify-resume": {0, 1}}


def documented_commands(skill_root):
    _, body = frontmatter(skill_root)
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", body, re.S):
        lines += [ln.strip() for ln in block.splitlines() if ln.strip().startswith(PREFIX)]
    return [ln for ln in lines if "$ARGUMENTS" not in ln]


@pytest.fixture
def workdir(tmp_path, hf_run, copy_of):
    run_dir = copy_of(hf_run.output_dir, "run")
    event = {
        "event": "LOSS_SPIKE",
        "step": 121,
        "value": 10.1,
        "threshold": 2.5,
        "severity": "critical",
        "ts": "2026-11-29T08:00:00Z",
    }
    (tmp_path / "events.json").write_text(json.dumps(event))
    return {
        "RUN_DIR": str(run_dir),
        "CHECKPOINT": str(run_dir / "checkpoint-110"),
        # convert --check-only: the checkpoint against the one file `convert CHECKPOINT OUT.pt --to full` wrote
        "SHARDS": str(run_dir / "checkpoint-110"),
        "CONSOLIDATED": "OUT.pt",
        "LOG": str(run_dir / "checkpoint-200" / "trainer_state.json"),
        "RESUME_STEP": "110",
        "EVENTS_FILE": str(tmp_path / "events.json"),
        "FRAMEWORK": "hf",
        "cwd": tmp_path,
    }


def fill(line: str, values: dict) -> str:
    for word, value in values.items():
        if word.isupper():
            line = re.sub(rf"\b{word}\b", value, line)
    return line


def test_skill_md_documents_every_command(skill_root):
    documented = {ln[len(PREFIX) :].split()[0] for ln in documented_commands(skill_root)}
    documented = {("plan" if d[0].isdigit() else d) for d in documented}
    assert documented == {s["name"] for s in manifest(skill_root)["subcommands"]}


def test_every_documented_command_runs_on_a_real_run(skill_root, workdir):
    ran = []
    for line in documented_commands(skill_root):
        command = fill(expand(line, "", skill_root), workdir)
        args = command.split("checkpoint-strategy", 1)[1].split(" #", 1)[
            0
        ]  # a shell comment may say "FSDP"
        assert not re.search(r"\b[A-Z][A-Z_]{3,}\b(?!\.)", args), command
        proc = subprocess.run(
            ["bash", "-c", command],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=workdir["cwd"],
            env=checkout_env(),
        )
        word = line[len(PREFIX) :].split()[0]
        name = "plan" if word[0].isdigit() else word
        assert proc.returncode in EXPECTED_RC.get(name, {0}), f"{command}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr
        out = re.search(r"(?:^|\s)(?:-o|--output) (\S+)", args)
        if out:  # the report went to the named file (written whole), not stdout
            written = Path(workdir["cwd"], out.group(1)).read_text()
            assert written.strip() and not proc.stdout.strip(), command
        else:
            assert proc.stdout.strip(), command
        ran.append(name)
    cwd = workdir["cwd"]
    assert (cwd / "tradeoffs.png").read_bytes().startswith(b"\x89PNG")
    state = json.loads((cwd / ".claude" / "state" / "checkpoint-strategy.json").read_text())
    assert state["producer"]
    assert {"plan", "recover", "validate", "handoff", "release-gate", "on-event"} <= set(ran)


def test_slash_command_with_a_subcommand(skill_root, workdir):
    command = expand(
        manifest(skill_root)["slash_commands"][0]["command"],
        f"recover {workdir['RUN_DIR']} --format json",
        skill_root,
    )
    proc = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=120, env=checkout_env()
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["resume_checkpoint"]["step"] == 110
