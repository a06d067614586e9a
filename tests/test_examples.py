"""The examples in README.md and docs/*.md cannot drift: each pasted output is a golden file.

- ``test_example_output``: runs one example command per command on the README's sample run
  (``examples/make-example-run.py``: a synthetic training log, tiny HF Trainer checkpoints, a stability
  event) in a temporary folder and compares the output with ``tests/golden/examples/<name>.txt``. Volatile
  fields are normalised first: the temporary folder reads ``/data``, elapsed times ``(0.01 s)``,
  timestamps ``2026-01-01T00:00:00Z``.
- ``test_readme_examples_run_as_written_in_a_fresh_copy_of_the_repo`` (slow set): the same, as a new user
  runs them: in a copy of what git ships, the README's own lines (the sample builder, then each
  ``checkpoint-strategy ...`` line through the copy's launcher), compared with the same golden files.
- ``test_pasted_blocks_match_their_golden``: every fenced block right after a marker
  ``<!-- golden: tests/golden/NAME [lines=A-B] -->`` in README.md or docs/*.md equals that golden file (or
  lines A-B of it).

``UPDATE_GOLDEN=1 python3 -m pytest tests/test_examples.py tests/test_planning_cli.py`` rewrites the
golden files and then the pasted blocks.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = bool(os.environ.get("UPDATE_GOLDEN"))

SIZE = ["100000", "2.5", "500", "--model-size-gb", "4"]
EXAMPLES: dict[str, list[str]] = {
    "plan": ["plan", *SIZE],
    "simulate": ["simulate", *SIZE, "--runs", "2000"],
    "tradeoffs": [
        "tradeoffs",
        *SIZE,
        "--sweep-frequencies",
        "500,1000,2000",
        "--sweep-keep-last",
        "2,5,10",
    ],
    "recover": ["recover", "train.jsonl", "--checkpoints", "run"],
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
    "handoff-json": [
        "handoff",
        *SIZE,
        "--checkpoints",
        "run",
        "--log",
        "train.jsonl",
        "--dry-run",
        "--format",
        "json",
    ],
    "on-event-json": [
        "on-event",
        "events.json",
        "--log",
        "train.jsonl",
        "--checkpoints",
        "run",
        "--format",
        "json",
    ],
    "validate-target-gpus": ["validate", "run", "--target-gpus", "16"],
    "export-hf-sharded": [
        "export",
        "--framework",
        "hf",
        "--framework-version",
        "4.46",
        *SIZE,
        "--formats",
        "sharded,full_state_dict",
    ],
}
# Longer examples of the reference pages: the golden starts with the command line ("$ ...").
G2048 = ["100000", "2.5", "500", "--model_size_gb", "4", "--gpus", "2048", "--spike-rate", "0.02"]
SHOWN: dict[str, list[str]] = {
    "simulate-2048": ["simulate", *G2048, "--runs", "20000", "--seed", "1"],
    "simulate-2048-keep1": [
        "simulate",
        *G2048,
        "--runs",
        "20000",
        "--seed",
        "1",
        "--keep-last",
        "1",
    ],
    "tradeoffs-2048": [
        "tradeoffs",
        *G2048,
        "--sweep-frequencies",
        "100,250,500,1000,2000,5000",
        "--sweep-keep-last",
        "1,2,3,5,10",
    ],
}


def _example_builder():
    """examples/make-example-run.py, the script the README tells a user to run (the repo ships it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_example_run", ROOT / "examples" / "make-example-run.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_inputs(folder: Path) -> None:
    """The example inputs: the README's sample run (deterministic, tiny, no framework needed)."""
    _example_builder().build(folder)


def normalise(text: str, folder: Path) -> str:
    from checkpoint_strategy.formats.runfacts import launcher

    # the launcher's absolute path written into handoff commands: where the skill is installed
    text = text.replace(launcher(), 'python3 "${CLAUDE_SKILL_DIR}/scripts/checkpoint-strategy"')
    text = text.replace(str(folder.resolve()), "/data").replace(str(folder), "/data")
    text = re.sub(r"\(\d+(\.\d+)? s\)", "(0.01 s)", text)
    # the framework versions installed on this machine (export names them; a fresh install takes the newest)
    text = re.sub(r"(\S+) \d+(?:\.\d+)+\S*? is installed", r"\1 <installed> is installed", text)
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
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} changed: check it, then UPDATE_GOLDEN=1"
    )


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
    check_golden(
        f"examples/{name}.txt", f"$ checkpoint-strategy {' '.join(SHOWN[name])}\n" + result.out
    )


AGENT_STATE = {
    "schema_version": 1,
    "session_id": "sess-20250301-0900",
    "status": "in_progress",
    "last_updated": "2025-03-01T09:00:00Z",
    "next_step": "launch the 1B run",
    "completed_steps": ["tokenizer", "data pipeline"],
    "notes": [],
    "pending_risks": ["eval set not frozen"],
    "changed_files": ["train.py"],
}
JSONL_LINE = {
    "ts": "2025-03-01T09:00:00Z",
    "step": "data pipeline",
    "status": "done",
    "detail": "shards verified",
}


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
    check_golden(
        "examples/handoff-agent-state.txt",
        normalise((state / "agent-state.json").read_text(), inputs),
    )
    check_golden(
        "examples/handoff-checkpoint-jsonl.txt",
        normalise((state / "checkpoint.jsonl").read_text(), inputs),
    )
    assert "<!-- checkpoint-strategy:begin -->" in (state / "NEXT_ACTION.md").read_text()


def test_every_command_has_an_example():
    from checkpoint_strategy.cli.main import COMMANDS

    assert set(EXAMPLES) == set(COMMANDS)


MARKER = re.compile(
    r"<!-- golden: (?P<name>\S+?)(?: lines=(?P<a>\d+)-(?P<b>\d+))? -->\n"
    r"(?P<fence>```[a-z]*\n)(?P<body>.*?)```",
    re.S,
)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def expected_block(name: str, a: str | None, b: str | None) -> str:
    text = (ROOT / name).read_text(
        encoding="utf-8"
    )  # the marker names the file from the repository's root
    if a is not None:
        text = "".join(text.splitlines(keepends=True)[int(a) - 1 : int(b)])
    return text if text.endswith("\n") else text + "\n"


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_pasted_blocks_match_their_golden(doc):
    text = doc.read_text(encoding="utf-8")
    if UPDATE:
        new = MARKER.sub(
            lambda m: m.group(0).replace(
                m.group("fence") + m.group("body"),
                m.group("fence") + expected_block(m["name"], m["a"], m["b"]),
                1,
            ),
            text,
        )
        if new != text:
            doc.write_text(new, encoding="utf-8")
            text = new
    for m in MARKER.finditer(text):
        assert m["name"].startswith("tests/golden/") and (ROOT / m["name"]).is_file(), (
            f"{doc.name}: no golden file {m['name']} (named from the repository's root: tests/golden/...)"
        )
        assert m["body"] == expected_block(m["name"], m["a"], m["b"]), (
            f"{doc.name}: the block after <!-- golden: {m['name']} --> differs; run with UPDATE_GOLDEN=1"
        )


def test_markers_are_found():
    assert any(MARKER.search(p.read_text(encoding="utf-8")) for p in DOCS), (
        "no golden-checked example at all"
    )


# --------------------------------------------------------------------------- the README, as a new user runs it


def fenced_blocks(text: str):
    """(language, body lines, the line after the closing fence) of every fenced block in `text`."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            yield lines[i][3:].strip(), lines[i + 1 : j], lines[j + 1] if j + 1 < len(lines) else ""
            i = j + 1
        else:
            i += 1


GOLDEN_MARK = re.compile(
    r"<!-- golden: tests/golden/examples/(?P<name>\S+?)\.txt(?: lines=\d+-\d+)? -->"
)


def readme_examples(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(the sample-building commands, [(example command line, its golden name)]) of the README: every
    `checkpoint-strategy ...` line of a shell block is an example, and the block right after it must be
    its golden output; `python3 examples/...` lines build the sample the examples run on."""
    setup: list[str] = []
    examples: list[tuple[str, str]] = []
    for lang, body, after in fenced_blocks(text):
        if lang not in ("", "bash"):
            continue
        for line in body:
            if line.startswith("python3 examples/"):
                setup.append(line)
            elif line.startswith("checkpoint-strategy "):
                mark = GOLDEN_MARK.fullmatch(after.strip())
                assert mark, f"README example without its golden output right after it: {line}"
                examples.append((line, mark["name"]))
    return setup, examples


def test_readme_has_one_example_per_command_and_they_are_the_golden_ones():
    import shlex

    from checkpoint_strategy.cli.main import COMMANDS

    setup, examples = readme_examples((ROOT / "README.md").read_text(encoding="utf-8"))
    assert setup == ["python3 examples/make-example-run.py example-run && cd example-run"]
    names = [name for _, name in examples]
    assert sorted(names) == sorted(COMMANDS), "one README example per command"
    for line, name in examples:
        argv = shlex.split(line)[1:]
        assert argv in (EXAMPLES[name], EXAMPLES[name][1:]), (
            f"README's {name} example is not the golden-checked one"
        )


def test_readme_is_read_in_five_minutes():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the detail to docs/"


def _run_line(line: str, cwd: Path, copy: Path) -> tuple[Path, str]:
    """Run one README command line in the copy the way a shell would: `python3 ...`, `cd DIR`,
    `checkpoint-strategy ...` (the copy's launcher), joined by `&&`. Returns (the new cwd, stdout)."""
    import shlex
    import subprocess
    import sys

    from cliresult import checkout_env

    out = ""
    for part in line.split("&&"):
        argv = shlex.split(part)
        if argv[0] == "cd":
            cwd = cwd / argv[1]
            assert cwd.is_dir(), f"{line}: no folder {argv[1]}"
            continue
        program = {
            "python3": [sys.executable],
            "checkpoint-strategy": [sys.executable, str(copy / "scripts" / "checkpoint-strategy")],
        }
        if argv[:3] == [
            "python3",
            "-m",
            "checkpoint_strategy",
        ]:  # the installed package: this copy's
            argv = ["checkpoint-strategy", *argv[3:]]
        assert argv[0] in program, f"README command the test cannot run as written: {line}"
        proc = subprocess.run(
            program[argv[0]] + argv[1:],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
            env=checkout_env(PYTHONPATH=str(copy / "scripts")),
        )
        assert proc.returncode in (0, 1) and proc.stderr == "", (
            f"{line}: exit {proc.returncode}: {proc.stderr}"
        )
        out = proc.stdout
    return cwd, out


QUICK_START = "python3 -m pip install -e . && python3 -m checkpoint_strategy "


def test_readme_examples_run_as_written_in_a_fresh_copy_of_the_repo(tmp_path):
    """Only what the repository ships (git ls-files), no test fixture: the quick start's plan (after its
    `pip install`, which the test environment has done) prints the plan golden; the README's setup line builds
    the sample, then every example runs as written and prints its golden output."""
    import shlex

    from cliresult import shipped_copy

    copy = shipped_copy(tmp_path / "checkpoint-strategy")
    readme = (copy / "README.md").read_text(encoding="utf-8")
    (quick,) = [
        line
        for _, body, _ in fenced_blocks(readme)
        for line in body
        if line.startswith(QUICK_START)
    ]
    _, out = _run_line(quick.split(" && ", 1)[1], copy, copy)
    assert out == (GOLDEN / "examples" / "plan.txt").read_text(encoding="utf-8"), (
        "the quick start's plan changed"
    )
    setup, examples = readme_examples(readme)
    cwd = copy
    for line in setup:
        cwd, _ = _run_line(line, cwd, copy)
    launcher = "python3 " + shlex.quote(os.path.realpath(copy / "scripts" / "checkpoint-strategy"))
    for line, name in examples:
        _, out = _run_line(line, cwd, copy)
        out = out.replace(launcher, 'python3 "${CLAUDE_SKILL_DIR}/scripts/checkpoint-strategy"')
        assert normalise(out, cwd) == (GOLDEN / "examples" / f"{name}.txt").read_text(
            encoding="utf-8"
        ), f"README example {line!r} in a fresh copy differs from its golden examples/{name}.txt"


# --------------------------------------------------------------------------- the sample builder itself


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_sample_is_the_same_bytes_every_time_and_small(tmp_path):
    build_inputs(tmp_path / "a")
    build_inputs(tmp_path / "b")
    a = _tree(tmp_path / "a")
    assert a == _tree(tmp_path / "b")
    assert sum(len(v) for v in a.values()) < 150_000
    names = {Path(k).name for k in a if k.startswith("run/checkpoint-2000/")}
    assert names == {
        "model.safetensors",
        "config.json",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "training_args.bin",
        "trainer_state.json",
    }


def test_sample_pickles_are_what_torch_load_reads(tmp_path, cli_run):
    """The hand-written torch zip archives: torch.load(weights_only=True) reads the optimizer, scheduler and RNG
    state (the Adam moments are the values the deep check reads), and refuses training_args.bin, as it refuses
    the Trainer's own (a pickled TrainingArguments)."""
    torch = pytest.importorskip("torch")
    build_inputs(tmp_path)
    ckpt = tmp_path / "run" / "checkpoint-2000"
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert set(opt["state"][0]) == {"step", "exp_avg", "exp_avg_sq"} and opt["param_groups"][0][
        "params"
    ] == [0]
    assert float(opt["state"][0]["step"]) == 2000.0 and opt["state"][0]["exp_avg"].shape == (4,)
    assert torch.load(ckpt / "scheduler.pt", weights_only=True)["last_epoch"] == 2000
    assert torch.load(ckpt / "rng_state.pth", weights_only=True)["cpu"].dtype == torch.uint8
    with pytest.raises(Exception, match="TrainingArguments"):
        torch.load(ckpt / "training_args.bin", weights_only=True)
    deep = cli_run("validate", str(ckpt), "--level", "deep", "--format", "json").json()[
        "checkpoints"
    ][0]
    assert deep["status"] == "valid" and deep["deep"]["optimizer"]["kind"] == "adam"
    from safetensors.torch import load_file

    weights = load_file(ckpt / "model.safetensors")["w"]
    assert deep["deep"]["weights_norm"] == pytest.approx(
        float(torch.linalg.vector_norm(weights)), rel=1e-6
    )


def test_sample_builder_bad_target_is_one_line_exit_2(tmp_path):
    import subprocess
    import sys

    from cliresult import checkout_env

    (tmp_path / "a-file").write_text("x")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "make-example-run.py"), str(tmp_path / "a-file")],
        capture_output=True,
        text=True,
        timeout=60,
        env=checkout_env(),
    )
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, (
        proc.stderr
    )
