"""`--policy FILE` (`CheckpointPolicy.from_file`): the plan as YAML or JSON and the handoff state
file, detected by content, all give prune the same retention."""

from __future__ import annotations

import json
import os

import pytest

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.models import CheckpointPolicy

PLAN = [
    "plan",
    "200",
    "1",
    "50",
    "--model_size_gb",
    "0.001",
    "--keep-last",
    "3",
    "--milestones",
    "40,80",
]


@pytest.fixture
def policy_files(tmp_path, capsys):
    """The three kinds of file, written by the real commands."""
    files = {}
    for fmt in ("yaml", "json"):
        assert main(PLAN + ["--format", fmt]) == 0
        files[f"plan-{fmt}"] = tmp_path / f"plan.{fmt}"
        files[f"plan-{fmt}"].write_text(capsys.readouterr().out)
    state = tmp_path / "state"
    assert (
        main(
            [
                "handoff",
                "--plan-file",
                str(files["plan-json"]),
                "--state-dir",
                str(state),
                "--format",
                "json",
            ]
        )
        == 0
    )
    capsys.readouterr()
    files["handoff-state"] = state / "checkpoint-strategy.json"
    # misleading names: detection is by content
    odd = tmp_path / "policy.json"
    odd.write_text(files["plan-yaml"].read_text())
    files["plan-yaml-named-json"] = odd
    return files


def test_every_kind_gives_the_same_policy(policy_files):
    loaded = {k: CheckpointPolicy.from_file(p) for k, p in policy_files.items()}
    assert {k: v.file_kind for k, v in loaded.items()} == {
        "plan-yaml": "plan-yaml",
        "plan-json": "plan-json",
        "handoff-state": "handoff-state",
        "plan-yaml-named-json": "plan-yaml",
    }
    policies = {k: (v.keep_last, v.keep_milestone) for k, v in loaded.items()}
    assert len(set(map(repr, policies.values()))) == 1, policies
    assert policies["plan-json"] == (3, [40, 80])


@pytest.mark.parametrize("kind", ["plan-yaml", "plan-json", "handoff-state"])
def test_prune_accepts_each_kind(kind, policy_files, hf_run, copy_of, capsys):
    root = copy_of(hf_run.output_dir, "run")
    assert (
        main(
            [
                "prune",
                str(root),
                "--policy",
                str(policy_files[kind]),
                "--no-spike-check",
                "--format",
                "json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["keep_last"] == 3 and out["milestones"] == [40, 80]
    assert {e["name"] for e in out["keep"]} == {
        "checkpoint-40",
        "checkpoint-80",
        "checkpoint-180",
        "checkpoint-190",
        "checkpoint-200",
    }


def test_handoff_state_without_a_plan_is_refused(tmp_path, capsys):
    state = tmp_path / "s.json"
    state.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "producer": "checkpoint-strategy",
                "policy": None,
                "next_step": "x",
                "generated_at": "2026-01-01T00:00:00Z",
            }
        )
    )
    with pytest.raises(UsageError, match="no policy"):
        CheckpointPolicy.from_file(state)


@pytest.mark.parametrize(
    "content, expect",
    [
        ("[" * 200000, "nested too deeply"),
        ("checkpoint_policy: " + "[" * 5000, "nested too deeply"),
        ("checkpoint_policy: [1, 2\n", "not valid YAML"),
        ("!!python/object/apply:os.system ['echo hi']\n", "not valid YAML"),
        ('{"policy": [1]}', "expected a mapping"),
        ('{"policy": {"keep_last": "x"}}', "keep_last"),
        ("keep_last: 3\ncolour: red\n", "colour"),
        ("\xff\xfe", "UTF-8"),
        ('{"keep_last": 1e999}', "keep_last"),
        ('{"keep_last": ' + "9" * 5000 + "}", "not valid JSON"),
        ('{"keep_last": NaN}', "not valid JSON"),
    ],
    ids=lambda v: v[:30] if isinstance(v, str) else v,
)
def test_bad_policy_files_are_one_line(content, expect, tmp_path, hf_run, copy_of, capsys):
    bad = tmp_path / "p"
    bad.write_bytes(content.encode("latin-1") if content.startswith("\xff") else content.encode())
    root = copy_of(hf_run.output_dir, "run")
    assert main(["prune", str(root), "--policy", str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expect in err and "Traceback" not in err


def test_special_files_are_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for p in (str(fifo), str(tmp_path), "/dev/zero", ""):
        with pytest.raises(UsageError) as exc:
            CheckpointPolicy.from_file(p)
        assert "\n" not in str(exc.value)
