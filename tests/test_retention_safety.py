"""retention/safety.py called in-process on the real HF run (spike at step 121, unrecovered; checkpoint-120
already holds spiked weights; recover's cut-off is step 119) and its self-recovering twin: the run folder's
safety summary, the release-gate check of one checkpoint, the post-onset note of on-event/recover and the
per-checkpoint "safe to resume" verdict. In-process so that bench/mutation.py (mutmut maps tests to functions
in-process) runs them for the mutants of these functions (docs/mutation.md, retention/safety.py)."""

from __future__ import annotations

from pathlib import Path

from checkpoint_strategy.recovery import advise
from checkpoint_strategy.retention import safety
from checkpoint_strategy.validate import validate_paths

SPIKE = "after the spike at step 121: do not resume"


def _weights_only(ckpt: Path) -> None:
    for n in ("optimizer.pt", "scheduler.pt"):
        (ckpt / n).unlink()


def _summary(root: Path, **kw):
    report = validate_paths([str(root)])
    (s,) = safety.annotate_validation(report, [str(root)], advise=advise, **kw).safety
    return report, s


def test_run_summary_names_the_newest_safe_checkpoint_and_the_post_onset_ones(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    report, s = _summary(root)
    assert (s.spike_status, s.onset_step, s.safe) == ("rollback", 121, 11)
    assert (s.newest_safe, s.newest_safe_step, s.newest_safe_resumable) == (
        str(root / "checkpoint-110"),
        110,
        True,
    )
    assert [Path(p).name for p in s.post_onset] == [f"checkpoint-{n}" for n in range(120, 201, 10)]
    assert s.note.startswith("loss spike at step 121 has not recovered (rollback): checkpoint-110")
    notes = {Path(r.path).name: r.notes for r in report.checkpoints}
    assert f"{SPIKE} (holds spiked weights)" in notes["checkpoint-120"]
    assert not any(SPIKE in n for n in notes["checkpoint-110"])


def test_run_summary_prefers_a_resumable_checkpoint_to_a_newer_weights_only_one(hf_run, copy_of):
    """checkpoint-110 without optimizer/scheduler state: the one to resume from is checkpoint-100."""
    root = copy_of(hf_run.output_dir, "run")
    _weights_only(root / "checkpoint-110")
    _report, s = _summary(root)
    assert (Path(s.newest_safe).name, s.newest_safe_resumable, s.safe) == (
        "checkpoint-100",
        True,
        11,
    )


def test_run_summary_without_a_log_or_with_the_check_off(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    _r, off = _summary(root, spike_check=False)
    assert (off.note, off.log, off.onset_step, off.post_onset) == (
        "spike check off (--no-spike-check)",
        None,
        None,
        [],
    )
    assert off.newest_safe == str(root / "checkpoint-200")
    for (
        ckpt
    ) in root.iterdir():  # no trainer_state.json anywhere: no log to read (and nothing valid)
        (ckpt / "trainer_state.json").unlink()
    _r, nolog = _summary(root)
    assert nolog.note == "no training log found: not checked for loss spikes" and nolog.log is None


def test_self_recovered_run_has_no_onset_and_is_safe_to_the_newest(hf_run_self_recovering):
    root = hf_run_self_recovering.output_dir
    _r, s = _summary(root)
    assert s.spike_status == "self_recovered" and s.onset_step is None and s.post_onset == []
    assert s.newest_safe == str(root / "checkpoint-200")
    valid = [(n, str(root / f"checkpoint-{n}")) for n in range(10, 201, 10)]
    guard = safety.read_spike(valid, advise=advise)
    assert guard.onset_step is not None  # the spike is in the log, only recovered
    assert not safety.after_onset(150, guard) and safety.safe_to_resume("valid", True, 150, guard)


def test_lowest_steps_newest_is_step_one_not_step_zero(hf_run, tmp_path):
    """Steps 0 and 1 (a run saved before its first step and after it): the newest is step 1."""
    root = tmp_path / "run"
    root.mkdir()
    for src, n in ((10, 0), (20, 1)):
        (root / f"checkpoint-{n}").symlink_to(hf_run.output_dir / f"checkpoint-{src}")
    report = validate_paths([str(root / "checkpoint-0"), str(root / "checkpoint-1")])
    s = safety.run_safety(str(root), report.checkpoints, spike_check=False)
    assert (s.newest_safe_step, Path(s.newest_safe).name) == (1, "checkpoint-1")


def test_safe_to_resume_on_every_real_checkpoint(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    _weights_only(root / "checkpoint-100")
    (root / "checkpoint-90" / "model.safetensors").write_bytes(b"torn")
    report = validate_paths([str(root)])
    valid = [(r.step, r.path) for r in report.checkpoints if r.status == "valid"]
    guard = safety.read_spike(valid, advise=advise)
    safe = sorted(
        r.step
        for r in report.checkpoints
        if safety.safe_to_resume(r.status, r.resumable, r.step, guard)
    )
    assert safe == [10, 20, 30, 40, 50, 60, 70, 80, 110]
    assert not safety.after_onset(None, guard)  # no step (a loose weights file): never "after"


def test_default_log_is_the_newest_valid_checkpoints_trainer_state(hf_run, copy_of):
    """checkpoint-200 torn (invalid): its trainer_state.json is not the run's log, checkpoint-190's is."""
    root = copy_of(hf_run.output_dir, "run")
    (root / "checkpoint-200" / "model.safetensors").write_bytes(b"torn")
    report = validate_paths([str(root)])
    valid = sorted((r.step, r.path) for r in report.checkpoints if r.status == "valid")
    assert valid[-1][0] == 190
    assert safety.default_log(valid) == str(root / "checkpoint-190" / "trainer_state.json")


def test_checkpoint_spike_is_the_release_gates_check(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    ok, detail = safety.checkpoint_spike(str(root / "checkpoint-120"), 120, advise=advise)
    assert not ok and detail == (
        f"{SPIKE} or release: saved after the onset (recover's cut-off step 119); "
        "resume point: checkpoint-110"
    )
    ok, detail = safety.checkpoint_spike(str(root / "checkpoint-110"), 110, advise=advise)
    assert ok and detail.startswith("saved before the loss spike at step 121 (at or before")
    assert safety.checkpoint_spike(str(root / "checkpoint-120"), 120, spike_check=False) is None


def test_checkpoint_spike_of_a_checkpoint_whose_folder_is_gone(hf_run, copy_of, tmp_path):
    """The run folder is gone (uploaded, then cleaned): no siblings to offer, the explicit log still judges it."""
    log = copy_of(hf_run.output_dir / "checkpoint-200" / "trainer_state.json")
    gone = tmp_path / "gone" / "checkpoint-150"
    ok, detail = safety.checkpoint_spike(str(gone), 150, log=str(log), advise=advise)
    assert not ok and detail.endswith("resume point: none left")


def _report(root: Path, upto: int):
    ckpts = [(n, str(root / f"checkpoint-{n}")) for n in range(10, upto + 1, 10)]
    return advise(
        str(root / "checkpoint-200" / "trainer_state.json"), checkpoints=ckpts, level=None
    )


def test_post_onset_note_names_six_then_counts_the_rest(hf_run):
    root = hf_run.output_dir
    assert safety.post_onset_note(_report(root, 200)) == (
        f"{SPIKE}: checkpoint-120, checkpoint-130, checkpoint-140, checkpoint-150, checkpoint-160, "
        f"checkpoint-170 and 3 more; the newest safe checkpoint is {root}/checkpoint-110"
    )
    assert safety.post_onset_note(
        _report(root, 170)
    ) == (  # exactly six: all named, no "and 0 more"
        f"{SPIKE}: checkpoint-120, checkpoint-130, checkpoint-140, checkpoint-150, checkpoint-160, "
        f"checkpoint-170; the newest safe checkpoint is {root}/checkpoint-110"
    )
    assert safety.post_onset_note(_report(root, 110)) is None  # nothing saved after the onset


def test_post_onset_note_is_none_for_a_recovered_run(hf_run_self_recovering):
    root = hf_run_self_recovering.output_dir
    assert safety.post_onset_note(_report(root, 200)) is None
