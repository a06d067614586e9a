"""handoff: checkpoint metadata into session-handoff's state folder, merged without loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
from cliresult import CLI, checkout_env
from fuzzcheck import MUTATE, reached, reaches_core

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import runfacts
from checkpoint_strategy.integrations import statefolder
from checkpoint_strategy.integrations.models import AgentState, CheckpointLogLine
from checkpoint_strategy.resources import load_schema

HANDOFF_SCHEMA = load_schema("session-handoff.schema.json")
PLAN = ["100000", "2", "500", "--params", "1B"]

# the sibling's own files, with fields and lines we do not know
AGENT_STATE = {
    "schema_version": 2,
    "session_id": "sess-20250301-0900",
    "status": "in_progress",
    "last_updated": "2025-03-01T09:00:00Z",
    "next_step": "implement the data loader",
    "completed_steps": ["set up repo", {"id": "task-1", "evidence": "pytest: 4 passed"}],
    "notes": "remember the tokenizer",
    "pending_risks": ["flaky CI on arm64", {"risk": "disk 90% full", "owner": "ops"}],
    "plan": {"steps": [{"id": 1, "title": "loader"}], "version": 7},
    "changed_files": ["a.py", "b.py"],
    "unicode": "naïve — ünïcødé",
}
JSONL = [
    '{"ts": "2025-03-01T09:00:00Z", "step": "repo-setup", "status": "done", "detail": "ok"}',
    '{"ts": "2025-03-01T09:05:00Z", "step": 3, "status": "done", "detail": "x", "extra": [1, 2]}',
    "not json at all, but it is the sibling's line",
]
NEXT_ACTION = """# NEXT ACTION — training run

**Session:** `sess-20250301-0900`

## Current Objective

Train the 1B model.

## Context for Next Session

- The tokenizer is frozen.

## If Interrupted

1. Read `.claude/state/agent-state.json`
"""


def seeded_state(tmp_path: Path, jsonl_final_newline: bool = True) -> Path:
    state = tmp_path / ".claude" / "state"
    state.mkdir(parents=True)
    (state / "agent-state.json").write_text(json.dumps(AGENT_STATE, indent=4, ensure_ascii=False))
    (state / "checkpoint.jsonl").write_text(
        "\n".join(JSONL) + ("\n" if jsonl_final_newline else "")
    )
    (state / "NEXT_ACTION.md").write_text(NEXT_ACTION)
    return state


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def check_handoff_json(state: Path) -> dict:
    doc = json.loads((state / "checkpoint-strategy.json").read_text())
    jsonschema.validate(doc, HANDOFF_SCHEMA)
    return doc


def check_log_lines(state: Path, skip: int = 0) -> list[dict]:
    """Our lines in checkpoint.jsonl: valid JSON {ts, step, status, detail}."""
    lines = (state / "checkpoint.jsonl").read_text().splitlines()[skip:]
    records = [json.loads(line) for line in lines]
    for r in records:
        jsonschema.validate(r, CheckpointLogLine.model_json_schema())
        assert r["step"] == "checkpoint-strategy handoff"
    return records


# ----------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("final_newline", [True, False])
def test_round_trip_keeps_everything_we_do_not_own(tmp_path, cli_run, monkeypatch, final_newline):
    state = seeded_state(tmp_path, final_newline)
    monkeypatch.chdir(tmp_path)  # default --state-dir .claude/state
    rc, out, err = cli_run(
        "handoff", *PLAN[:2], "50", *PLAN[3:]
    )  # a 50 GB budget: the plan has warnings
    assert rc == 0, err
    data = json.loads((state / "agent-state.json").read_text())
    jsonschema.validate(data, AgentState.model_json_schema())
    for key, value in AGENT_STATE.items():
        if key not in ("next_step", "last_updated", "pending_risks"):
            assert data[key] == value, key
    assert list(data)[: len(AGENT_STATE)] == list(AGENT_STATE)  # order kept
    assert data["pending_risks"][:2] == AGENT_STATE["pending_risks"]
    ours = data["pending_risks"][2:]
    assert ours and all(r.startswith("[checkpoint-strategy] plan: ") for r in ours)
    doc = check_handoff_json(state)
    assert data["next_step"] == doc["next_step"] and data["last_updated"] == doc["generated_at"]

    lines = (state / "checkpoint.jsonl").read_text().splitlines()
    assert lines[:3] == JSONL
    assert len(lines) == 4 and check_log_lines(state, skip=3)[0]["status"] == "done"

    text = (state / "NEXT_ACTION.md").read_text()
    before, block_and_after = text.split(statefolder.BEGIN)
    assert before.startswith(NEXT_ACTION.split("## If Interrupted")[0].rstrip("\n"))
    assert "- The tokenizer is frozen." in before
    assert (
        block_and_after.split(statefolder.END)[1].lstrip("\n")
        == "## If Interrupted\n\n1. Read `.claude/state/agent-state.json`\n"
    )
    assert out.startswith(statefolder.BEGIN) and out.strip().endswith(statefolder.END)
    assert out.rstrip("\n") in text

    # run again: our block and our risks are replaced, not duplicated; the log grows by one line
    rc, _, err = cli_run("handoff", *PLAN, "--keep-last", "4")
    assert rc == 0, err
    again = json.loads((state / "agent-state.json").read_text())
    assert again["pending_risks"][:2] == AGENT_STATE["pending_risks"]
    assert len(
        [r for r in again["pending_risks"] if str(r).startswith("[checkpoint-strategy")]
    ) == len([r for r in again["pending_risks"][2:]])
    text2 = (state / "NEXT_ACTION.md").read_text()
    assert text2.count(statefolder.BEGIN) == 1 and "keep_last 4" in text2
    assert text2.split(statefolder.BEGIN)[0] == before
    assert len((state / "checkpoint.jsonl").read_text().splitlines()) == 5


def test_missing_files_are_created(tmp_path, cli_run):
    state = tmp_path / "deep" / "state"
    rc, out, err = cli_run("handoff", *PLAN, "--state-dir", str(state))
    assert rc == 0, err
    assert {p.name for p in state.iterdir()} >= {
        "checkpoint-strategy.json",
        "agent-state.json",
        "checkpoint.jsonl",
        "NEXT_ACTION.md",
    }
    data = json.loads((state / "agent-state.json").read_text())
    assert set(AgentState.model_fields) <= set(data)
    assert (
        (state / "NEXT_ACTION.md")
        .read_text()
        .startswith("# NEXT ACTION\n\n## Context for Next Session\n\n")
    )
    check_handoff_json(state)
    check_log_lines(state)
    umask = os.umask(0)
    os.umask(umask)
    for name in (
        "checkpoint-strategy.json",
        "agent-state.json",
        "checkpoint.jsonl",
        "NEXT_ACTION.md",
    ):
        # new files get the usual 0666 & ~umask (not the 0600 of the temp file they were written through)
        assert (state / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_next_action_without_context_section_gets_one_appended():
    new = statefolder.update_next_action(
        "# Plan\n\nDo things.", "BLOCK " + statefolder.BEGIN + statefolder.END
    )
    assert new.startswith("# Plan\n\nDo things.\n\n## Context for Next Session\n\n")
    with pytest.raises(UsageError, match="unmatched"):
        statefolder.update_next_action(f"x\n{statefolder.BEGIN}\n", "b")


def test_json_format_and_dry_run_write_nothing(tmp_path, cli_run):
    state = tmp_path / "s"
    rc, out, err = cli_run(
        "handoff", *PLAN, "--state-dir", str(state), "--dry-run", "--format", "json"
    )
    assert rc == 0, err
    jsonschema.validate(json.loads(out), HANDOFF_SCHEMA)
    assert not state.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--duration", "50h", "1.8", "500"],
        ["1.8", "500", "--duration", "50h"],
        ["50h", "1.8", "500"],
    ],
)
def test_duration_in_place_of_total_steps_as_plan_has_it(argv, tmp_path, cli_run):
    """handoff takes the run's length as plan does: the same plan and policy as the step count gives."""
    rc, want, _ = cli_run(
        "handoff", "100000", "1.8", "500", "--params", "1B", "--dry-run", "--format", "json"
    )
    rc2, got, err = cli_run("handoff", *argv, "--params", "1B", "--dry-run", "--format", "json")
    assert rc == rc2 == 0, err
    a, b = json.loads(want), json.loads(got)
    assert (
        a["plan"] == b["plan"]
        and a["policy"] == b["policy"]
        and b["plan"]["milestone_steps"][-1] == 100000
    )


def test_plan_file_from_the_plan_command(tmp_path, cli_run):
    rc, out, _ = cli_run("plan", *PLAN, "--format", "json")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(out)
    rc, out, err = cli_run(
        "handoff",
        "--plan-file",
        str(plan_file),
        "--state-dir",
        str(tmp_path / "s"),
        "--format",
        "json",
    )
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["policy"] == json.loads(plan_file.read_text())["policy"]
    assert doc == check_handoff_json(tmp_path / "s")


# ----------------------------------------------------------------------------- real checkpoints


def test_handoff_on_a_real_hf_run_with_a_spike(hf_run, copy_of, tmp_path, cli_run):
    run = copy_of(hf_run.output_dir, "hf-run")
    newest = run / f"checkpoint-{hf_run.checkpoint_steps[-1]}"
    (newest / "model.safetensors").write_bytes(
        (newest / "model.safetensors").read_bytes()[:1000]
    )  # torn save
    state = tmp_path / "state"
    rc, out, err = cli_run("handoff", *PLAN, "--checkpoints", str(run), "--state-dir", str(state))
    assert rc == 0, err
    doc = check_handoff_json(state)
    latest = doc["latest_valid_checkpoint"]
    # the newest checkpoint safe to resume from: valid, resumable, before the unrecovered spike at step 121
    assert latest["step"] == 110 and latest["resumable"] and not latest["after_spike_onset"]
    assert set(latest["formats"]) == {"safetensors", "full_state_dict"}
    assert [b["step"] for b in doc["bad_checkpoints"]] == [hf_run.checkpoint_steps[-1]]
    assert [c["step"] for c in doc["rollback_points"]] == list(range(110, 0, -10))
    assert [c["step"] for c in doc["post_onset_checkpoints"]] == list(range(190, 119, -10))
    # the adviser read the newest trainer_state.json: the spike at 121 is not recovered
    rec = doc["recovery"]
    assert rec["status"] == "rollback" and rec["spike_onset_step"] == hf_run.spike_step + 1
    assert rec["resume_step"] == 110
    assert all(c["after_spike_onset"] for c in doc["post_onset_checkpoints"])
    assert not any(c["after_spike_onset"] for c in doc["rollback_points"])
    assert doc["next_step"].startswith("pin now: cp -a ") and doc["next_step"].endswith(
        rec["summary"]
    )
    assert any("not whole" in r for r in doc["pending_risks"])
    cs = runfacts.launcher()
    assert cs.startswith("python3 /") or cs == "python3 -m checkpoint_strategy"
    commands = doc["recovery_commands"]
    assert commands[0].startswith(f"cp -a {run / 'checkpoint-110'} {run / 'pinned-checkpoint-110'}")
    assert commands[1] == f"{cs} validate {run} --level full"
    assert any(
        c.startswith(f"{cs} verify-resume") and f"--resume-step {rec['resume_step']}" in c
        for c in commands
    )
    assert not any(c.startswith("checkpoint-strategy") for c in commands)
    assert "After the spike" in out and str(newest) in out
    data = json.loads((state / "agent-state.json").read_text())
    tag = statefolder.risk_tag(os.path.realpath(run))
    assert any(r.startswith(tag) for r in data["pending_risks"])
    assert check_log_lines(state)[0]["status"] == "warning"


def test_handoff_with_an_explicit_log_and_empty_run(tmp_path, hf_run, cli_run):
    empty = tmp_path / "empty-run"
    empty.mkdir()
    rc, out, err = cli_run(
        "handoff",
        "--checkpoints",
        str(empty),
        "--state-dir",
        str(tmp_path / "s"),
        "--format",
        "json",
    )
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["latest_valid_checkpoint"] is None and doc["recovery"] is None
    assert any("no checkpoint found" in r for r in doc["pending_risks"])
    rc, _, err = cli_run(
        "handoff",
        "--checkpoints",
        str(empty),
        "--log",
        str(tmp_path / "nope.csv"),
        "--state-dir",
        str(tmp_path / "s"),
    )
    assert rc == 2 and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- concurrency

WRITER = textwrap.dedent("""
    import sys
    from checkpoint_strategy.integrations import statefolder
    state, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for i in range(n):
        statefolder.write_state(state, statefolder.StateWrite(
            handoff_json='{"writer": "%s", "i": %d}\\n' % (name, i),
            risks=[f"risk {i} of {name}"], next_step=f"{name} step {i}",
            block=f"{statefolder.BEGIN}\\n{name} {i}\\n{statefolder.END}\\n",
            log_record={"ts": "t", "step": "checkpoint-strategy handoff", "status": "done", "detail": f"{name} {i}"},
            now="t", scope=name))
""")


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    state = seeded_state(tmp_path)
    n = 25
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(state), name, str(n)],
            stderr=subprocess.PIPE,
            env=checkout_env(),
        )
        for name in ("alpha", "beta")
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    data = json.loads((state / "agent-state.json").read_text())
    assert data["pending_risks"][:2] == AGENT_STATE["pending_risks"]
    assert {r for r in data["pending_risks"][2:]} == {
        f"[checkpoint-strategy alpha] risk {n - 1} of alpha",
        f"[checkpoint-strategy beta] risk {n - 1} of beta",
    }
    assert all(
        data[k] == v
        for k, v in AGENT_STATE.items()
        if k not in ("next_step", "last_updated", "pending_risks")
    )
    lines = (state / "checkpoint.jsonl").read_text().splitlines()
    assert lines[:3] == JSONL
    details = [json.loads(line)["detail"] for line in lines[3:]]
    assert sorted(details) == sorted(f"{w} {i}" for w in ("alpha", "beta") for i in range(n))
    text = (state / "NEXT_ACTION.md").read_text()
    assert text.count(statefolder.BEGIN) == 1 and text.count(statefolder.END) == 1
    assert json.loads((state / "checkpoint-strategy.json").read_text())["i"] == n - 1
    assert not [p for p in state.iterdir() if p.name.endswith(".tmp")]


def test_two_handoff_commands_at_once(tmp_path):
    state = seeded_state(tmp_path)
    runs = []
    for name in ("run-a", "run-b"):
        (tmp_path / name).mkdir()
        runs.append(tmp_path / name)
    procs = [
        subprocess.Popen(
            [*CLI, "handoff", *PLAN, "--checkpoints", str(r), "--state-dir", str(state)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=checkout_env(),
        )
        for r in runs
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()
    data = json.loads((state / "agent-state.json").read_text())
    for r in runs:
        assert any(
            x.startswith(statefolder.risk_tag(os.path.realpath(r)))
            for x in data["pending_risks"]
            if isinstance(x, str)
        )
    assert len(check_log_lines(state, skip=3)) == 2
    check_handoff_json(state)


# ----------------------------------------------------------------------------- bad input


def one_line_exit_2(cli_run, *argv) -> str:
    rc, out, err = cli_run(*argv)
    assert rc == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def test_malformed_agent_state_is_left_alone(tmp_path, cli_run):
    state = seeded_state(tmp_path)
    (state / "agent-state.json").write_text('{"session_id": "x", ')
    before = snapshot(state)
    err = one_line_exit_2(cli_run, "handoff", *PLAN, "--state-dir", str(state))
    assert "agent-state.json is not valid JSON" in err
    after = snapshot(state)
    assert {k: v for k, v in after.items() if k != ".checkpoint-strategy.lock"} == before
    (state / "agent-state.json").write_text("[1, 2]")
    assert "not a JSON object" in one_line_exit_2(
        cli_run, "handoff", *PLAN, "--state-dir", str(state)
    )


def test_state_folder_that_is_a_file_or_unwritable(tmp_path, cli_run):
    f = tmp_path / "state-file"
    f.write_text("I am a file")
    assert "is a file" in one_line_exit_2(cli_run, "handoff", *PLAN, "--state-dir", str(f))
    assert f.read_text() == "I am a file"
    assert "a parent of it is a file" in one_line_exit_2(
        cli_run, "handoff", *PLAN, "--state-dir", str(f / "x")
    )
    for unwritable in ("/proc/checkpoint-strategy-test", "/proc/self"):
        one_line_exit_2(cli_run, "handoff", *PLAN, "--state-dir", unwritable)
    state = seeded_state(tmp_path)
    (state / "NEXT_ACTION.md").unlink()
    (state / "NEXT_ACTION.md").mkdir()
    before = snapshot(state)
    assert "is a folder" in one_line_exit_2(cli_run, "handoff", *PLAN, "--state-dir", str(state))
    assert {k: v for k, v in snapshot(state).items() if k != ".checkpoint-strategy.lock"} == before


@pytest.mark.parametrize(
    "argv, message",
    [
        (["handoff"], "nothing to hand off"),
        (["handoff", "1000", "2"], "all three"),
        (["handoff", "--keep-last", "3"], "need TOTAL_STEPS"),
        (
            ["handoff", "1000", "2", "10", "--plan-file", "p.json"],
            "either --plan-file or plan arguments",
        ),
        (["handoff", "--plan-file", "does-not-exist.json"], "does not exist"),
        (["handoff", "--checkpoints", "/no/such/run"], "no such folder"),
        (["handoff", "1000", "-2", "10"], "STEP_SECONDS"),
        (["handoff", "--duration", "50h", "1.8"], "all three of TOTAL_STEPS (or --duration)"),
        (
            ["handoff", "--duration", "50h", "200000", "1.8", "500"],
            "is 100000 steps, but TOTAL_STEPS is 200000",
        ),
        (
            ["handoff", "--duration", "50h", "--plan-file", "p.json"],
            "either --plan-file or plan arguments",
        ),
    ],
)
def test_bad_arguments(tmp_path, cli_run, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert message in one_line_exit_2(cli_run, *argv)
    assert not (tmp_path / ".claude").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"total_steps": 5}', "does not match plan.schema.json"),
    ],
)
def test_bad_plan_file(tmp_path, cli_run, content, message):
    p = tmp_path / "plan.json"
    p.write_text(content)
    assert message in one_line_exit_2(
        cli_run, "handoff", "--plan-file", str(p), "--state-dir", str(tmp_path / "s")
    )
    assert not (tmp_path / "s").exists()


# ----------------------------------------------------------------------------- fuzzing

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)


# What a sibling's state folder holds: agent-state.json an object with its known fields and others, of any JSON
# value; NEXT_ACTION.md lines of text and headings (ours among them), now and then an earlier handoff's block.
_KEYS = st.one_of(
    st.sampled_from(
        [
            "schema_version",
            "session_id",
            "status",
            "last_updated",
            "next_step",
            "completed_steps",
            "notes",
            "pending_risks",
            "plan",
        ]
    ),
    st.text(max_size=12),
)
_LINES = st.lists(
    st.one_of(
        st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30),
        st.sampled_from(
            [
                "# NEXT ACTION",
                f"## {statefolder.CONTEXT_HEADING}",
                "## If Interrupted",
                "### Details",
                "",
                f"{statefolder.BEGIN}\nold\n{statefolder.END}",
            ]
        ),
    ),
    max_size=8,
)


@reaches_core()
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    state=st.dictionaries(_KEYS, _json, max_size=6),
    lines=_LINES,
    newline=st.sampled_from(["\n", "\r\n"]),
    roll=MUTATE,
)
def test_fuzz_state_folder_contents(tmp_path_factory, capsys, state, lines, newline, roll):
    """Real state folders, damaged one time in five (agent-state.json cut or replaced by garbage, a marker of ours
    left unmatched in NEXT_ACTION.md): handoff merges without losing a field or a risk of theirs, or refuses with one
    line and leaves every file as it was."""
    folder = tmp_path_factory.mktemp("fuzz")
    text, next_action = json.dumps(state), newline.join(lines)
    chance, where, garbage = roll
    if chance >= 16:  # damage
        if where % 3 == 0:
            text = garbage
        elif where % 3 == 1:
            text = text[: where % max(1, len(text))]
        else:
            next_action += newline + (statefolder.BEGIN, statefolder.END)[where % 2]
    (folder / "agent-state.json").write_text(text)
    (folder / "NEXT_ACTION.md").write_text(next_action)
    before = snapshot(folder)
    rc = main(["handoff", "1000", "1", "10", "--state-dir", str(folder)])
    out, err = capsys.readouterr()
    assert rc in (0, 2), err
    if not reached(rc == 0):
        assert len(err.strip().splitlines()) == 1
        assert {
            k: v for k, v in snapshot(folder).items() if k != ".checkpoint-strategy.lock"
        } == before
        return
    data = json.loads((folder / "agent-state.json").read_text())
    original = json.loads(text) if text.strip() else {}
    for key, value in original.items():
        if key not in ("next_step", "last_updated", "pending_risks"):
            assert data[key] == value
    theirs = original.get("pending_risks")
    theirs = [] if theirs is None else theirs if isinstance(theirs, list) else [theirs]
    assert data["pending_risks"][: len(theirs)] == theirs
    assert (folder / "NEXT_ACTION.md").read_text().count(statefolder.BEGIN) == 1


def test_crlf_next_action_is_kept_byte_for_byte(tmp_path, capsys):
    state = tmp_path / "s"
    state.mkdir()
    original = NEXT_ACTION.replace("\n", "\r\n").encode()
    (state / "NEXT_ACTION.md").write_bytes(original)
    assert main(["handoff", *PLAN, "--state-dir", str(state)]) == 0
    capsys.readouterr()
    new = (state / "NEXT_ACTION.md").read_bytes()
    begin, end = new.index(statefolder.BEGIN.encode()), new.index(statefolder.END.encode())
    head, tail = new[:begin], new[end + len(statefolder.END) + 1 :]
    a, b = original.split(b"## If Interrupted")
    assert head == a and tail == b"\n## If Interrupted" + b


# --------------------------------------------------------------------------- verify-resume on the resumed run's log


def _verify_args(commands: list[str]) -> list[str]:
    import shlex

    (cmd,) = [c for c in commands if " verify-resume " in c]
    argv = shlex.split(cmd.split("   # ")[0])
    return argv[argv.index("verify-resume") + 1 :]


def test_verify_resume_points_at_the_resumed_runs_log_not_the_old_one(
    tmp_path, cli_run, monkeypatch
):
    """The old run's newest trainer_state.json stops at the spike; the resumed run writes its log into the first
    checkpoint it saves after the resume step. The handoff command names that file and runs as written once the
    resumed run has saved it."""
    from test_examples import build_inputs

    build_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    doc = cli_run("handoff", "--checkpoints", "run", "--dry-run", "--format", "json").json()
    assert doc["recovery"]["log"].endswith("checkpoint-3000/trainer_state.json")
    args = _verify_args(doc["recovery_commands"])
    assert args == [
        str(tmp_path / "run" / "checkpoint-2500" / "trainer_state.json"),
        "--resume-step",
        "2000",
        "--checkpoints",
        str(tmp_path / "run"),
    ]
    assert doc["recovery"]["log"] not in " ".join(args)
    (cmd,) = [c for c in doc["recovery_commands"] if " verify-resume " in c]
    assert (
        "saving checkpoint-2500 again: its new trainer_state.json is the resumed run's log" in cmd
    )
    # the resumed run (from checkpoint-2000, spike batches skipped) saves checkpoint-2500 anew
    old = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    resumed = [r for r in old if r["step"] <= 2000] + [
        {"step": s, "loss": r["loss"], "learning_rate": r["learning_rate"]}
        for s, r in zip(
            range(2010, 2501, 10), [r for r in old if 1510 <= r["step"] <= 2000], strict=True
        )
    ]
    (tmp_path / "run" / "checkpoint-2500" / "trainer_state.json").write_text(
        json.dumps({"global_step": 2500, "log_history": resumed})
    )
    rep = cli_run("verify-resume", *args, "--format", "json").json()
    assert (
        rep["log"]["path"] == args[0] and rep["log"]["last_step"] == 2500 and rep["verdict"] == "ok"
    )


def test_verify_resume_on_a_log_file_keeps_the_file_and_says_so(tmp_path, cli_run, monkeypatch):
    from test_examples import build_inputs

    build_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    doc = cli_run(
        "handoff", "--checkpoints", "run", "--log", "train.jsonl", "--dry-run", "--format", "json"
    ).json()
    args = _verify_args(doc["recovery_commands"])
    assert args == [
        str(tmp_path / "train.jsonl"),
        "--resume-step",
        "2000",
        "--checkpoints",
        str(tmp_path / "run"),
    ]
    (cmd,) = [c for c in doc["recovery_commands"] if " verify-resume " in c]
    assert "the resumed run's log (this file when the resumed run appends to it" in cmd


def test_verify_resume_with_no_later_checkpoint_reads_the_run_folder(tmp_path):
    from checkpoint_strategy.integrations.handoff import resumed_log
    from checkpoint_strategy.integrations.models import CheckpointRef

    early = CheckpointRef(
        path=str(tmp_path / "checkpoint-100"),
        step=100,
        layout="hf-trainer",
        resumable=True,
        sharded=False,
        formats=["safetensors"],
        validated_at="2026-01-01T00:00:00Z",
        level="quick",
    )
    log, why = resumed_log(
        str(tmp_path / "checkpoint-100" / "trainer_state.json"), str(tmp_path), 100, [early]
    )
    assert log == str(tmp_path) and "newest trainer_state.json in the run folder" in why
