"""The examples in README.md and docs/*.md cannot drift: each pasted output is a golden file.

- ``test_example_output``: runs one example command per command on small, deterministic inputs
  built here (a synthetic training log, tiny safetensors checkpoints, a stability event) in a
  temporary folder and compares the output with ``tests/golden/examples/<name>.txt``. Volatile
  fields are normalised first: the temporary folder reads ``/data``, elapsed times ``(0.01 s)``,
  timestamps ``2026-01-01T00:00:00Z``.
- ``test_pasted_blocks_match_their_golden``: every fenced block right after a marker
  ``<!-- golden: NAME [lines=A-B] -->`` in README.md or docs/*.md equals that golden file (or
  lines A-B of it).

``UPDATE_GOLDEN=1 python3 -m pytest tests/test_examples.py tests/test_planning_cli.py`` rewrites the
golden files and then the pasted blocks.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = bool(os.environ.get("UPDATE_GOLDEN"))

SIZE = ["100000", "2.5", "500", "--model-size-gb", "4"]
EXAMPLES: dict[str, list[str]] = {
    "plan": ["plan", *SIZE],
    "simulate": ["simulate", *SIZE, "--runs", "2000"],
    "tradeoffs": ["tradeoffs", *SIZE, "--sweep-frequencies", "500,1000,2000", "--sweep-keep-last", "2,5,10"],
    "recover": ["recover", "train.jsonl", "--checkpoints", "500,1000,1500,2000,2500,3000"],
    "verify-resume": ["verify-resume", "resumed.jsonl", "--resume-step", "2000"],
    "validate": ["validate", "run"],
    "prune": ["prune", "run", "--keep-last", "1", "--milestones", "1000"],
    "handoff": ["handoff", *SIZE, "--checkpoints", "run", "--dry-run"],
    "release-gate": ["release-gate", "run/checkpoint-2000", "--require", "safetensors"],
    "on-event": ["on-event", "events.json", "--log", "train.jsonl", "--checkpoints", "run"],
    "export": ["export", "--framework", "hf", "--framework-version", "4.46", *SIZE],
    "convert": ["convert", "run/checkpoint-2000", "checkpoint-2000-dcp", "--to", "dcp"],
}
# More examples for the reference pages (docs/*.md).
MORE: dict[str, list[str]] = {
    "validate-damaged": ["validate", "damaged"],
    "prune-damaged": ["prune", "damaged", "--keep-last", "1"],
    "release-gate-fail": ["release-gate", "damaged/checkpoint-30"],
    "handoff-json": ["handoff", *SIZE, "--checkpoints", "run", "--log", "train.jsonl", "--dry-run", "--format", "json"],
    "on-event-json": ["on-event", "events.json", "--log", "train.jsonl", "--checkpoints", "run", "--format", "json"],
}
# Longer examples of the reference pages: the golden starts with the command line ("$ ...").
G2048 = ["100000", "2.5", "500", "--model_size_gb", "4", "--gpus", "2048", "--spike-rate", "0.02"]
SHOWN: dict[str, list[str]] = {
    "simulate-2048": ["simulate", *G2048, "--runs", "20000", "--seed", "1"],
    "simulate-2048-keep1": ["simulate", *G2048, "--runs", "20000", "--seed", "1", "--keep-last", "1"],
    "tradeoffs-2048": ["tradeoffs", *G2048, "--sweep-frequencies", "100,250,500,1000,2000,5000",
                       "--sweep-keep-last", "1,2,3,5,10"],
}


def _loss(step: int, rng: random.Random, spike_at: int | None) -> float:
    loss = (1.2 + 1.3 * math.exp(-step / 600)) * (1 + rng.gauss(0, 0.01))
    return round(loss * (3.0 if spike_at is not None and step >= spike_at else 1.0), 4)


def _safetensors(path: Path, n: int = 4) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]},
                         "__metadata__": {"format": "pt"}}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack(f"<{n}f", *range(n)))


def build_inputs(folder: Path) -> None:
    """The example inputs: deterministic, tiny, no framework needed."""
    rng = random.Random(0)
    rows = [{"step": s, "loss": _loss(s, rng, 2101), "learning_rate": 3e-4} for s in range(10, 3001, 10)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rng = random.Random(1)
    first = [{"step": s, "loss": _loss(s, rng, None), "learning_rate": 3e-4} for s in range(10, 2201, 10)]
    again = [{"step": s, "loss": _loss(s, rng, None), "learning_rate": 3e-4} for s in range(2010, 2301, 10)]
    (folder / "resumed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first + again))
    for step in (1000, 2000, 2500, 3000):
        _safetensors(folder / "run" / f"checkpoint-{step}" / "model.safetensors")
        (folder / "run" / f"checkpoint-{step}" / "trainer_state.json").write_text(
            json.dumps({"global_step": step, "log_history": [r for r in rows if r["step"] <= step]}))
    for step in (10, 20, 30, 40):  # checkpoint-30's weights cut short, as by an interrupted save
        target = folder / "damaged" / f"checkpoint-{step}" / "model.safetensors"
        _safetensors(target, n=64)
        (target.parent / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
        if step == 30:
            target.write_bytes(target.read_bytes()[:-100])
    (folder / "events.json").write_text(json.dumps(
        [{"event": "LOSS_SPIKE", "step": 2110, "magnitude": 3.1, "severity": "critical"},
         {"event": "LOSS_SPIKE", "step": 2210, "magnitude": 3.0, "severity": "critical"}]))


def normalise(text: str, folder: Path) -> str:
    from checkpoint_strategy.checkpoints.runfacts import launcher

    # the launcher's absolute path written into handoff commands: where the skill is installed
    text = text.replace(launcher(), 'python3 "${CLAUDE_SKILL_DIR}/scripts/checkpoint-strategy"')
    text = text.replace(str(folder.resolve()), "/data").replace(str(folder), "/data")
    text = re.sub(r"\(\d+(\.\d+)? s\)", "(0.01 s)", text)
    # timestamps of this run (the inputs' own, from 2025, are kept)
    return re.sub(r"(?!2025-)\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "2026-01-01T00:00:00Z", text)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("examples")
    build_inputs(folder)
    return folder


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden {name}: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), f"{name} changed: check it, then UPDATE_GOLDEN=1"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_output(name, inputs, cli_run, monkeypatch):
    monkeypatch.chdir(inputs)
    result = cli_run(*EXAMPLES[name])
    assert result.rc in (0, 1) and result.err == "", result.err
    check_golden(f"examples/{name}.txt", normalise(result.out, inputs))


@pytest.mark.parametrize("name", sorted(MORE))
def test_more_example_output(name, inputs, cli_run, monkeypatch):
    monkeypatch.chdir(inputs)
    result = cli_run(*MORE[name])
    assert result.rc in (0, 1) and result.err == "", result.err
    check_golden(f"examples/{name}.txt", normalise(result.out, inputs))


@pytest.mark.parametrize("name", sorted(SHOWN))
def test_shown_example_output(name, inputs, cli_run, monkeypatch):
    monkeypatch.chdir(inputs)
    result = cli_run(*SHOWN[name])
    assert result.rc == 0 and result.err == "", result.err
    check_golden(f"examples/{name}.txt", f"$ checkpoint-strategy {' '.join(SHOWN[name])}\n" + result.out)


AGENT_STATE = {"schema_version": 1, "session_id": "sess-20250301-0900", "status": "in_progress",
               "last_updated": "2025-03-01T09:00:00Z", "next_step": "launch the 1B run",
               "completed_steps": ["tokenizer", "data pipeline"], "notes": [],
               "pending_risks": ["eval set not frozen"], "changed_files": ["train.py"]}
JSONL_LINE = {"ts": "2025-03-01T09:00:00Z", "step": "data pipeline", "status": "done", "detail": "shards verified"}


def test_handoff_into_a_session_handoff_state_folder(inputs, cli_run, monkeypatch, tmp_path):
    """docs/integrations.md's walkthrough: what handoff prints and leaves in the state folder."""
    monkeypatch.chdir(inputs)
    state = inputs / ".claude" / "state"
    state.mkdir(parents=True, exist_ok=True)
    (state / "agent-state.json").write_text(json.dumps(AGENT_STATE, indent=2) + "\n")
    (state / "checkpoint.jsonl").write_text(json.dumps(JSONL_LINE) + "\n")
    result = cli_run("handoff", *SIZE, "--checkpoints", "run", "--log", "train.jsonl")
    assert result.rc == 0 and result.err == "", result.err
    check_golden("examples/handoff-walkthrough.txt", normalise(result.out, inputs))
    check_golden("examples/handoff-agent-state.txt", normalise((state / "agent-state.json").read_text(), inputs))
    check_golden("examples/handoff-checkpoint-jsonl.txt", normalise((state / "checkpoint.jsonl").read_text(), inputs))
    assert "<!-- checkpoint-strategy:begin -->" in (state / "NEXT_ACTION.md").read_text()


def test_every_command_has_an_example():
    from checkpoint_strategy.cli import COMMANDS

    assert set(EXAMPLES) == set(COMMANDS)


MARKER = re.compile(r"<!-- golden: (?P<name>\S+?)(?: lines=(?P<a>\d+)-(?P<b>\d+))? -->\n"
                    r"(?P<fence>```[a-z]*\n)(?P<body>.*?)```", re.S)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def expected_block(name: str, a: str | None, b: str | None) -> str:
    text = (GOLDEN / name).read_text(encoding="utf-8")
    if a is not None:
        text = "".join(text.splitlines(keepends=True)[int(a) - 1:int(b)])
    return text if text.endswith("\n") else text + "\n"


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_pasted_blocks_match_their_golden(doc):
    text = doc.read_text(encoding="utf-8")
    if UPDATE:
        new = MARKER.sub(lambda m: m.group(0).replace(m.group("fence") + m.group("body"),
                                                      m.group("fence") + expected_block(m["name"], m["a"], m["b"]),
                                                      1), text)
        if new != text:
            doc.write_text(new, encoding="utf-8")
            text = new
    for m in MARKER.finditer(text):
        assert (GOLDEN / m["name"]).is_file(), f"{doc.name}: no golden file {m['name']}"
        assert m["body"] == expected_block(m["name"], m["a"], m["b"]), \
            f"{doc.name}: the block after <!-- golden: {m['name']} --> differs; run with UPDATE_GOLDEN=1"


def test_markers_are_found():
    assert any(MARKER.search(p.read_text(encoding="utf-8")) for p in DOCS), "no golden-checked example at all"
