"""The skill package: SKILL.md (Agent Skills spec), skill.yaml (manifest) and scripted skill tests."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import yaml
from cliresult import BIN, checkout_env

from checkpoint_strategy.cli.main import COMMANDS, available_commands

SPEC_FIELDS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}


def frontmatter(skill_root: Path) -> tuple[dict, str]:
    text = (skill_root / "SKILL.md").read_text(encoding="utf-8")
    m = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    assert m, "SKILL.md must start with YAML frontmatter"
    return yaml.safe_load(m.group(1)), m.group(2)


def manifest(skill_root: Path) -> dict:
    return yaml.safe_load((skill_root / "skill.yaml").read_text(encoding="utf-8"))


def test_frontmatter_uses_only_spec_fields(skill_root):
    meta, body = frontmatter(skill_root)
    assert set(meta) <= SPEC_FIELDS
    assert meta["name"] == "checkpoint-strategy"
    assert len(meta["description"]) <= 1024
    assert len((skill_root / "SKILL.md").read_text().splitlines()) < 500


def _agentskills(folder: Path) -> subprocess.CompletedProcess:
    exe = BIN / "agentskills"  # next to the running interpreter, not whichever is first on PATH
    assert exe.is_file(), (
        "skills-ref (its command is agentskills) must be installed by the test extra"
    )
    return subprocess.run(
        [str(exe), "validate", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        env=checkout_env(),
    )


def test_reference_validator_passes_on_a_copy(skill_root, tmp_path):
    exe = BIN / "agentskills"
    assert exe.is_file(), "skills-ref (agentskills) must be installed by the test extra"
    dest = tmp_path / "checkpoint-strategy"
    dest.mkdir()
    for name in ("SKILL.md", "skill.yaml"):
        shutil.copy2(skill_root / name, dest / name)
    for folder in ("scripts", "templates", "schemas"):
        shutil.copytree(
            skill_root / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    proc = _agentskills(dest)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_install_steps_hold_for_the_validator(tmp_path):
    """What README says about installing the skill: the validator is the `agentskills` command of the pip package
    skills-ref, it passes on what the repository ships (git ls-files) in a folder named checkpoint-strategy,
    and it refuses the same files in a folder of another name."""
    from importlib.metadata import distribution

    from cliresult import shipped_copy

    assert any(str(f).endswith("bin/agentskills") for f in distribution("skills-ref").files or ())
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    install = readme[readme.index("## Install as a Claude Code skill") :]
    install = install[: install.index("\n## ", 3)]
    for said in (
        "must be named `checkpoint-strategy`",
        "pip install skills-ref",
        "`agentskills`",
        "agentskills validate ~/.claude/skills/checkpoint-strategy",
    ):
        assert said in install, said
    copy = shipped_copy(tmp_path / "checkpoint-strategy")
    proc = _agentskills(copy)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    other = copy.rename(tmp_path / "my-skill")
    proc = _agentskills(other)
    assert (
        proc.returncode != 0
        and "must match skill name 'checkpoint-strategy'" in proc.stdout + proc.stderr
    )


def test_no_positional_placeholders_besides_arguments(skill_root):
    text = (skill_root / "SKILL.md").read_text(encoding="utf-8")
    assert not re.search(r"\$[0-9]", text)
    assert not re.search(r"\$ARGUMENTS\[", text)
    assert "$ARGUMENTS" in text


def test_manifest_validates_against_its_schema(skill_root):
    schema = json.loads((skill_root / "schemas" / "skill-manifest.schema.json").read_text())
    jsonschema.validate(manifest(skill_root), schema)


def test_manifest_agrees_with_skill_md_and_cli(skill_root):
    m = manifest(skill_root)
    meta, body = frontmatter(skill_root)
    assert m["name"] == meta["name"]
    slash = m["slash_commands"][0]
    assert slash["name"] == "/checkpoint-strategy"
    assert (
        slash["argument_hint"]
        == "[total_steps] [step_duration_seconds] [storage_budget_gb] [--model_size_gb N]"
    )
    assert meta["metadata"]["argument-hint"] == slash["argument_hint"]
    assert slash["command"] in body, "SKILL.md must give the manifest's command verbatim"
    listed = [s["name"] for s in m["subcommands"]]
    assert listed and set(listed) <= set(available_commands()), (
        "every listed subcommand must exist in the CLI"
    )
    assert set(available_commands()) <= set(listed), "every CLI command must be in the manifest"
    for name in listed:
        assert name in body, f"SKILL.md does not mention {name}"
    assert (skill_root / m["entry_point"]["launcher"]).exists()
    assert set(COMMANDS) >= set(listed)


def test_manifest_lists_every_schema_and_template_that_exists(skill_root):
    m = manifest(skill_root)
    schemas = {s["output_schema"] for s in m["subcommands"]} | {
        s.get("input_schema") for s in m["subcommands"]
    }
    schemas |= set(m["input_schemas"].values()) | {i["schema"] for i in m.get("integrations", [])}
    schemas.discard(None)
    templates = {t for s in m["subcommands"] for t in s["templates"]}
    for rel in schemas | templates:
        assert (skill_root / rel).exists(), f"{rel} listed in skill.yaml but missing"
    on_disk = {f"schemas/{p.name}" for p in (skill_root / "schemas").glob("*.schema.json")}
    assert on_disk - {"schemas/skill-manifest.schema.json"} <= schemas, (
        "schema files missing from skill.yaml"
    )
    on_disk_t = {f"templates/{p.name}" for p in (skill_root / "templates").glob("*.j2")}
    assert on_disk_t <= templates, "template files missing from skill.yaml"


def skill_commands(skill_root: Path) -> list[str]:
    """Every command line in SKILL.md's bash blocks that takes $ARGUMENTS."""
    _, body = frontmatter(skill_root)
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", body, re.S):
        cmds += [line.strip() for line in block.splitlines() if "$ARGUMENTS" in line]
    return cmds


def expand(command: str, arguments: str, skill_root: Path) -> str:
    """What an agent runs: $ARGUMENTS replaced by the user's text, the skill folder filled in."""
    return command.replace("${CLAUDE_SKILL_DIR}", str(skill_root)).replace("$ARGUMENTS", arguments)


def run_as_agent(
    skill_root: Path, arguments: str, command: str | None = None
) -> subprocess.CompletedProcess:
    command = command or manifest(skill_root)["slash_commands"][0]["command"]
    line = expand(command, arguments, skill_root)
    return subprocess.run(
        ["bash", "-c", line],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=skill_root,
        env=checkout_env(),
    )


def test_scripted_slash_command_seed_example(skill_root):
    proc = run_as_agent(skill_root, "100000 2.5 500 --model_size_gb 4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("=== Checkpoint Strategy Report ===")
    assert "Total Storage:" in proc.stdout and "Max Data Loss on Failure:" in proc.stdout


def test_scripted_slash_command_json(skill_root):
    proc = run_as_agent(
        skill_root,
        "50000 10 200 --params 1B --frequency 500 --keep-last 10 "
        "--formats full_state_dict --format json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["total_storage_gb"] == 180


def test_scripted_slash_command_bad_input(skill_root):
    proc = run_as_agent(skill_root, "100000 fast 500")
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert "STEP_SECONDS" in proc.stderr


def test_every_skill_md_command_runs_its_help(skill_root):
    """Each $ARGUMENTS command in SKILL.md resolves to a real command (checked with --help)."""
    cmds = skill_commands(skill_root)
    assert cmds
    for command in cmds:
        proc = run_as_agent(skill_root, "--help", command)
        assert proc.returncode == 0, f"{command}: {proc.stderr}"
        assert "usage:" in proc.stdout


def test_shell_quoting_of_arguments_is_safe(skill_root):
    proc = run_as_agent(skill_root, shlex.quote("100000; echo pwned") + " 2.5 500")
    assert proc.returncode == 2 and "pwned" not in proc.stdout
