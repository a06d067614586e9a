"""The one output path (render.render / render.emit) and the compiled-template cache."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

from checkpoint_strategy import render

PLAN = ["plan", "100000", "2.5", "500", "--model-size-gb", "4"]
SPIKE = {"event": "LOSS_SPIKE", "step": 1190, "magnitude": 3.2, "severity": "critical"}


@pytest.fixture
def fresh_env(monkeypatch, tmp_path):
    """A Jinja environment built again with XDG_CACHE_HOME under tmp_path (and rebuilt after the test)."""

    def _use(cache_home):
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
        render._env.cache_clear()

    yield _use
    render._env.cache_clear()


def cache_files(cache_home):
    return sorted(p for p in cache_home.rglob("*.jbc"))


def test_templates_compile_once_then_load_from_the_cache(fresh_env, tmp_path, cli_run):
    home = tmp_path / "cache"
    fresh_env(home)
    first = cli_run(*PLAN)
    files = cache_files(home)
    assert first.rc == 0 and files, "the first run fills the cache"
    folder = files[0].parent
    assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0
    fresh_env(home)
    stamps = {p: p.stat().st_mtime_ns for p in files}
    assert cli_run(*PLAN).out == first.out
    assert {p: p.stat().st_mtime_ns for p in cache_files(home)} == stamps, (
        "the second run only reads"
    )


@pytest.mark.parametrize(
    "damage", [b"", b"garbage", b"checkpoint-strategy jinja bytecode 1\n", None]
)
def test_damaged_cache_files_are_ignored(fresh_env, tmp_path, cli_run, damage):
    home = tmp_path / "cache"
    fresh_env(home)
    good = cli_run(*PLAN).out
    for p in cache_files(home):
        if damage is None:  # right header and checksum, truncated code
            p.write_bytes(p.read_bytes()[:-40])
        else:
            p.write_bytes(damage)
    fresh_env(home)
    again = cli_run(*PLAN)
    assert again.rc == 0 and again.out == good and again.err == ""


def test_cache_folder_others_can_write_is_not_used(fresh_env, tmp_path, cli_run):
    home = tmp_path / "cache"
    fresh_env(home)
    cli_run(*PLAN)
    folder = cache_files(home)[0].parent
    for p in cache_files(home):
        p.unlink()
    folder.chmod(0o777)
    fresh_env(home)
    assert cli_run(*PLAN).rc == 0
    assert cache_files(home) == []


@pytest.mark.parametrize("where", ["a file", "read-only"])
def test_unusable_cache_home_falls_back_silently(fresh_env, tmp_path, cli_run, where):
    if where == "a file":
        home = tmp_path / "not-a-folder"
        home.write_text("x")
    else:
        home = tmp_path / "ro"
        home.mkdir()
        home.chmod(0o500)
    try:
        fresh_env(home)
        result = cli_run(*PLAN)
        assert (
            result.rc == 0
            and result.err == ""
            and "=== Checkpoint Strategy Report ===" in result.out
        )
    finally:
        home.chmod(0o700)


def test_render_gives_every_format_from_the_model(cli_run):
    from checkpoint_strategy.planning.models import PlanReport

    report = PlanReport.model_validate(cli_run(*PLAN, "--format", "json").json())
    assert json.loads(render.render(report, "json")) == report.model_dump(mode="json")
    assert render.render(report, "yaml").startswith("checkpoint_policy:\n")
    assert render.render(report, "text") == cli_run(*PLAN).out
    assert render.render(report, "markdown") == cli_run(*PLAN, "--format", "markdown").out


def test_every_report_model_has_its_templates():
    from checkpoint_strategy.resources import data_dir

    for stem, _name in render.TEMPLATES.values():
        for suffix in ("txt", "md"):
            assert (data_dir("templates") / f"{stem}.{suffix}.j2").is_file(), (stem, suffix)


def test_on_event_markdown(tmp_path, cli_run):
    from checkpoint_strategy.formats.runfacts import launcher

    f = tmp_path / "events.json"
    f.write_text(json.dumps([SPIKE, dict(SPIKE, step=1300)]))
    md = cli_run("on-event", str(f), "--format", "markdown", "--log", "train.log")
    assert md.rc == 0 and md.out.startswith("## Emergency checkpoint decision")
    assert "- **Decision:** EMERGENCY SAVE (step 1190)" in md.out
    assert "| LOSS_SPIKE | 1190 |" in md.out and f"`{launcher()} recover train.log" in md.out


def test_handoff_text_is_the_markdown_block(tmp_path, cli_run):
    argv = ["handoff", "1000", "1", "50", "--dry-run", "--state-dir", str(tmp_path)]
    text, md = cli_run(*argv, "--format", "text"), cli_run(*argv)

    def stamp(s):  # the two runs may fall in different seconds
        return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "T", s)

    assert text.rc == md.rc == 0 and stamp(text.out) == stamp(md.out)
    assert "### Checkpoints (checkpoint-strategy" in md.out
    assert not os.listdir(tmp_path)


def test_verify_resume_markdown(tmp_path, cli_run):
    rows = [{"step": i + 1, "loss": 2.0 - i / 1000, "learning_rate": 1e-3} for i in range(300)]
    rows += [
        {"step": i + 1, "loss": 2.0 - i / 1000, "learning_rate": 1e-3} for i in range(200, 260)
    ]
    log = tmp_path / "train.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in rows))
    md = cli_run("verify-resume", str(log), "--resume-step", "200", "--format", "markdown")
    assert md.rc == 0 and md.out.startswith("## Resume check: OK")
    assert "| resume step | 200 (restart found in the log) |" in md.out
