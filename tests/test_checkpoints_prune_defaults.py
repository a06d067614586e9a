"""prune for a full disk: bytes per checkpoint and in total in the dry run, and retention proposed from the
run itself (save_steps / max_steps in trainer_state.json) when --keep-last is not given."""

from __future__ import annotations

import json
import os
import shutil


def _du(path) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _s, fs in os.walk(path) for f in fs)


def test_dry_run_reports_bytes_per_checkpoint_and_total(hf_run, copy_of, cli_run):
    run = copy_of(hf_run.output_dir, "run")
    rep = cli_run("prune", str(run), "--keep-last", "3", "--format", "json").json()
    assert rep["state"] == "dry_run" and rep["freed_bytes"] == 0
    for e in rep["keep"] + rep["delete"]:
        assert e["bytes"] == _du(run / e["name"]) > 100_000
    assert rep["bytes_to_free"] == sum(_du(run / e["name"]) for e in rep["delete"]) > 0
    text = cli_run("prune", str(run), "--keep-last", "3").out
    mb = rep["bytes_to_free"] / 1e6
    assert text.rstrip().endswith(
        f"14 to delete: frees {mb:.3g} MB."
    )  # 10-80, and post-onset 120-170
    assert (
        f"DELETE  checkpoint-10 [valid, resumable, {_du(run / 'checkpoint-10') / 1e3:.3g} KB]"
        in text
    )
    applied = cli_run("prune", str(run), "--keep-last", "3", "--apply", "--format", "json").json()
    assert applied["freed_bytes"] == rep["bytes_to_free"]


def test_without_keep_last_the_run_proposes_its_own(hf_run, copy_of, cli_run):
    run = copy_of(hf_run.output_dir, "run")
    before = sorted(os.listdir(run))
    r = cli_run("prune", str(run), "--format", "json")
    assert r.rc == 0, r.err
    rep = r.json()
    state = str(run / "checkpoint-200" / "trainer_state.json")
    # 100-step wait window / save_steps 10 + 1: a pre-spike checkpoint survives until the spike is judged
    assert rep["keep_last"] == 11 and rep["milestones"] == []
    assert (
        f"save_steps 10 (from {state})" in rep["proposed"]
        and f"max_steps 200, from {state}" in rep["proposed"]
    )
    text = cli_run("prune", str(run)).out
    assert "Proposed:      keep_last 11" in text.splitlines()[2]
    line = cli_run("prune", str(run), "--apply").usage_error("--keep-last")
    assert "nothing deleted on proposed numbers" in line and "keep_last 11" in line
    assert sorted(os.listdir(run)) == before


def test_without_trainer_state_the_names_give_the_interval(hf_run, copy_of, cli_run):
    run = copy_of(hf_run.output_dir, "run")
    for ckpt in run.iterdir():
        (ckpt / "trainer_state.json").unlink()
        if ckpt.name in ("checkpoint-10", "checkpoint-30"):
            shutil.rmtree(ckpt)
    rep = cli_run("prune", str(run), "--format", "json").json()
    assert (
        rep["keep_last"] == 11
        and "save_steps 10 (from the spacing of the checkpoint names)" in rep["proposed"]
    )


def test_a_run_saved_every_step_proposes_a_window_of_101(hf_run, tmp_path, cli_run):
    """No save_steps anywhere (no trainer_state.json): checkpoint-1, -2, -3 are a save every step, so the
    window spans the 100-step wait window with 101 checkpoints (an interval read as 2 would keep 51)."""
    run = tmp_path / "run"
    for step in (1, 2, 3):
        shutil.copytree(hf_run.output_dir / "checkpoint-10", run / f"checkpoint-{step}")
        (run / f"checkpoint-{step}" / "trainer_state.json").unlink()
    rep = cli_run("prune", run, "--format", "json").json()
    assert rep["keep_last"] == 101 and rep["delete"] == []
    assert "save_steps 1 (from the spacing of the checkpoint names)" in rep["proposed"]


def test_proposed_retention_names_the_milestones_it_keeps(hf_run, copy_of, cli_run):
    """The proposal's note prints the milestones: given ones, and the plan's pow2 schedule up to max_steps
    (a longer run than the fixture's 200 steps, whose schedule is empty)."""
    run = copy_of(hf_run.output_dir, "run")
    rep = cli_run("prune", run, "--milestones", "50,100", "--format", "json").json()
    assert rep["keep_last"] == 11 and rep["milestones"] == [50, 100]
    assert rep["proposed"].endswith("milestones 50, 100")
    state = run / "checkpoint-200" / "trainer_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "max_steps": 5000}))
    rep = cli_run("prune", run, "--format", "json").json()
    ms = rep["milestones"]
    assert ms and ms == sorted(ms) and ms[-1] <= 5000
    shown = ", ".join(map(str, ms))
    assert (
        f"milestones {shown} (the plan's pow2 schedule up to max_steps 5000, from {state})"
        in (rep["proposed"])
    )
