"""prune: retention plan, protections, policy YAML, refusals, and crash safety under SIGKILL."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cliresult import checkout_env

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.formats.models import CheckpointPolicy
from checkpoint_strategy.recovery import advise
from checkpoint_strategy.retention import prune as _prune
from checkpoint_strategy.validate import validate_paths

prune = functools.partial(
    _prune, advise=advise
)  # as prune_cli and the callbacks call it (the adviser is passed in)


def _names(entries):
    return sorted(e.name for e in entries)


def test_dry_run_by_default_keeps_newest_and_milestones(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    before = sorted(os.listdir(root))
    report = prune(root, keep_last=3, milestones=[50, 100], spike_check=False)
    assert sorted(os.listdir(root)) == before and report.applied is False
    kept = _names(report.keep)
    assert {
        "checkpoint-200",
        "checkpoint-190",
        "checkpoint-180",
        "checkpoint-50",
        "checkpoint-100",
    } <= set(kept)
    assert len(report.delete) == len(hf_run.checkpoint_steps) - 5
    assert report.newest_valid == "checkpoint-200"
    assert all(r for r in report.reasons.values())


def test_apply_deletes_only_older_valid_ones(hf_run, copy_of, capsys):
    root = copy_of(hf_run.output_dir, "run")
    (root / "notes").mkdir()
    assert main(["prune", str(root), "--keep-last", "2", "--apply", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["applied"] is True and all(e["deleted"] for e in out["delete"])
    # keep_last counts the checkpoints safe to resume from (100, 110: before the unrecovered spike at step
    # 121); the post-onset ones have their own window (190, 200), justified only among themselves
    assert sorted(os.listdir(root)) == sorted(
        ["checkpoint-100", "checkpoint-110", "checkpoint-190", "checkpoint-200", "notes"]
    )
    assert {c.status for c in validate_paths([str(root)]).checkpoints} == {"valid"}


def test_invalid_newest_is_never_trusted(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    (root / "checkpoint-200" / "model.safetensors").write_bytes(b"")
    report = prune(root, keep_last=1, spike_check=False)
    kept = {e.name: e for e in report.keep}
    assert "checkpoint-200" in kept and "invalid" in kept["checkpoint-200"].reasons[0]
    assert report.newest_valid == "checkpoint-190" and "checkpoint-190" in kept


def test_best_model_checkpoint_is_protected(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    state = root / "checkpoint-200" / "trainer_state.json"
    data = json.loads(state.read_text())
    data["best_model_checkpoint"] = "hf-run/checkpoint-70"
    state.write_text(json.dumps(data))
    report = prune(root, keep_last=1)
    assert "checkpoint-70" in _names(report.keep) and report.best_checkpoint == "checkpoint-70"


def test_best_model_checkpoint_is_protected_when_the_trainer_state_holds_nan(hf_run, copy_of):
    """HF's Trainer writes trainer_state.json with json.dumps, which writes a NaN metric as the bare token NaN;
    the state still names the best checkpoint."""
    root = copy_of(hf_run.output_dir, "run")
    state = root / "checkpoint-200" / "trainer_state.json"
    data = json.loads(state.read_text())
    data["best_model_checkpoint"] = "hf-run/checkpoint-70"
    data["best_metric"] = float("nan")
    state.write_text(json.dumps(data))
    assert "NaN" in state.read_text()  # what json.dumps (the Trainer's writer) makes of it
    report = prune(root, keep_last=1)
    assert "checkpoint-70" in _names(report.keep) and report.best_checkpoint == "checkpoint-70"


def test_policy_yaml_from_the_plan(hf_run, copy_of, tmp_path):
    root = copy_of(hf_run.output_dir, "run")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "checkpoint_policy:\n  frequency: every_10_steps\n  keep_last: 4\n"
        "  keep_milestone: [40, 80, ...]\n  save_optimizer: true\n"
        "  save_formats:\n    - full_state_dict\n    - safetensors\n"
        "  validate_on_save: true\n  async_save: true\n"
        "  emergency_save_on:\n    - loss_spike_detected\n"
    )
    p = CheckpointPolicy.from_file(policy)
    assert p.keep_last == 4 and p.keep_milestone[:3] == [40, 80, 160]
    report = prune(root, policy=str(policy), spike_check=False)
    kept = set(_names(report.keep))
    assert {
        "checkpoint-40",
        "checkpoint-80",
        "checkpoint-160",
        "checkpoint-200",
        "checkpoint-170",
    } <= kept
    assert len(kept) == 7


@pytest.mark.parametrize(
    "text, expect",
    [
        ("checkpoint_policy:\n  keep_last: 0\n", "keep_last"),
        ("checkpoint_policy:\n  keep_last: 3\n  colour: red\n", "colour"),
        ("checkpoint_policy:\n  frequency: hourly\n  keep_last: 3\n", "frequency"),
        ("checkpoint_policy: [1, 2\n", "not valid YAML"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("!!python/object/apply:os.system ['echo hi']\n", "not valid YAML"),
    ],
)
def test_bad_policy_exits_2(text, expect, hf_run, copy_of, tmp_path, capsys):
    root = copy_of(hf_run.output_dir, "run")
    policy = tmp_path / "p.yaml"
    policy.write_text(text)
    assert main(["prune", str(root), "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expect in err


def test_refuses_dangerous_roots(tmp_path, hf_run, capsys):
    for root in ("/", os.path.expanduser("~"), str(tmp_path / "missing")):
        assert main(["prune", root, "--keep-last", "2"]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["prune", str(f), "--keep-last", "2"]) == 2
    assert main(["prune", str(hf_run.output_dir / "checkpoint-10"), "--keep-last", "2"]) == 2
    assert main(["prune", str(tmp_path), "--keep-last", "0"]) == 2
    assert main(["prune", str(tmp_path)]) == 2
    assert main(["prune", str(tmp_path), "--keep-last", "2", "--milestones", "ten"]) == 2


def test_symlinks_and_unrecognised_entries_untouched(hf_run, tmp_path):
    outside = tmp_path / "outside"
    shutil.copytree(hf_run.output_dir / "checkpoint-10", outside / "checkpoint-5")
    root = tmp_path / "run"
    for step in (20, 30, 40, 50):
        shutil.copytree(hf_run.output_dir / f"checkpoint-{step}", root / f"checkpoint-{step}")
    (root / "checkpoint-5").symlink_to(outside / "checkpoint-5")
    (root / "data-link").symlink_to(outside)
    (root / "README.txt").write_text("keep me")
    report = prune(root, keep_last=1, apply=True)
    assert _names(report.delete) == ["checkpoint-20", "checkpoint-30", "checkpoint-40"]
    assert (outside / "checkpoint-5" / "model.safetensors").exists()
    assert (root / "checkpoint-5").is_symlink() and (root / "data-link").is_symlink()
    assert (root / "README.txt").read_text() == "keep me"


def test_deleting_names_prune_did_not_create_are_never_touched(hf_run, copy_of):
    """A `.deleting-*` name that is not in prune's journal (a user's folder, or a leftover of an
    older version) is reported and kept, never removed (issue 9, item 5)."""
    root = copy_of(hf_run.output_dir, "run")
    os.rename(root / "checkpoint-10", root / ".deleting-checkpoint-10")
    (root / ".deleting-my-notes").mkdir()
    (root / ".deleting-my-notes" / "n.txt").write_text("mine")
    assert all(".deleting-" not in c.path for c in validate_paths([str(root)]).checkpoints)
    report = prune(root, keep_last=30)
    assert (
        report.foreign_leftovers == [".deleting-checkpoint-10", ".deleting-my-notes"]
        and not report.leftovers
    )
    report = prune(root, keep_last=2, apply=True, spike_check=False)
    assert report.state == "done" and report.deleted == len(hf_run.checkpoint_steps) - 3
    assert (root / ".deleting-my-notes" / "n.txt").read_text() == "mine"
    assert (root / ".deleting-checkpoint-10" / "model.safetensors").exists()


def _snapshot(folder: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(folder, followlinks=False)):
        dirnames.sort()
        for n in sorted(filenames):
            p = Path(dirpath) / n
            st = p.lstat()
            h.update(f"{p.relative_to(folder)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def test_crash_safety_kill_prune_apply_at_random_points(hf_run, tmp_path):
    """SIGKILL `prune --apply` at 20+ random points: the newest valid checkpoint still
    validates, no recognised checkpoint is half-deleted, and nothing outside ROOT changes."""
    template = tmp_path / "template"
    shutil.copytree(hf_run.output_dir, template / "run")
    outside = template / "outside"
    shutil.copytree(hf_run.output_dir / "checkpoint-10", outside / "checkpoint-1")
    (outside / "precious.txt").write_text("do not touch")
    (template / "run" / "checkpoint-1").symlink_to(Path("..") / "outside" / "checkpoint-1")
    (template / "run" / "outside-link").symlink_to(Path("..") / "outside")
    env = checkout_env()
    newest = f"checkpoint-{max(hf_run.checkpoint_steps)}"
    # Bulk each checkpoint up with small extra files so that deleting takes long enough for
    # random kills to land mid-deletion, not only during interpreter start-up.
    for ckpt in (template / "run").glob("checkpoint-*"):
        if not ckpt.is_symlink():
            extra = ckpt / "extra"
            extra.mkdir()
            for k in range(400):
                (extra / f"{k}.txt").write_text("x")

    def fresh(i: int) -> Path:
        work = tmp_path / f"w{i}"
        shutil.copytree(template, work, symlinks=True)
        return work

    def cmd(work: Path):
        return [
            sys.executable,
            "-m",
            "checkpoint_strategy",
            "prune",
            str(work / "run"),
            "--keep-last",
            "2",
            "--apply",
            "--format",
            "json",
        ]

    work = fresh(0)
    t0 = time.perf_counter()
    dry = subprocess.run(
        cmd(work)[:-3] + ["--format", "json"], capture_output=True, text=True, env=env, timeout=120
    )
    dry_time = time.perf_counter() - t0  # start-up and validation, no deletion
    assert dry.returncode == 0, dry.stderr
    t0 = time.perf_counter()
    done = subprocess.run(cmd(work), capture_output=True, text=True, env=env, timeout=120)
    full_time = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    # keep_last counts safe checkpoints (100, 110 before the spike at 121); post-onset: 190, 200 kept
    assert len(json.loads(done.stdout)["delete"]) == len(hf_run.checkpoint_steps) - 4
    outside_before = _snapshot(template / "outside")

    rng = random.Random(1234)
    kills = mid_deletion = 0
    total = len(os.listdir(template / "run"))
    i = 0
    # Kill at random points until 20 runs were really killed and at least 5 of those kills
    # landed mid-deletion (some checkpoints gone, not all): a loaded machine shifts the timing,
    # so the loop adapts instead of assuming how long a run takes.
    while (kills < 20 or mid_deletion < 5) and i < 120:
        i += 1
        work = fresh(i)
        proc = subprocess.Popen(
            cmd(work), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
        time.sleep(rng.uniform(0.5 * dry_time, 1.1 * full_time))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
            left_now = len([n for n in os.listdir(work / "run") if not n.startswith(".deleting-")])
            if 4 < left_now < total:
                mid_deletion += 1
        proc.wait(timeout=60)
        report = validate_paths([str(work / "run")], progress=False)
        statuses = {os.path.basename(c.path): c.status for c in report.checkpoints}
        assert statuses[newest] == "valid"
        assert set(statuses.values()) == {"valid"}, (
            statuses
        )  # nothing half-deleted looks like a checkpoint
        assert _snapshot(work / "outside") == outside_before
        # a later run finishes the job from whatever state the kill left
        after = subprocess.run(cmd(work), capture_output=True, text=True, env=env, timeout=120)
        assert after.returncode == 0, after.stderr
        left = sorted(n for n in os.listdir(work / "run"))
        assert left == sorted(
            [
                "checkpoint-1",
                "outside-link",
                "checkpoint-100",
                "checkpoint-110",
                newest,
                f"checkpoint-{sorted(hf_run.checkpoint_steps)[-2]}",
            ]
        )
        shutil.rmtree(work)
    assert kills >= 20 and mid_deletion >= 5, (kills, mid_deletion, i)


def test_unrecovered_spike_keeps_the_rollback_checkpoint(hf_run, copy_of, capsys):
    """The real run spiked at step 121 and never recovered: a rolling window of 2 would rotate
    past every checkpoint from before the spike. prune reads the log first and keeps the one
    `recover` names (checkpoint-110; checkpoint-120 already holds the spiked weights)."""
    root = copy_of(hf_run.output_dir, "run")
    report = prune(root, keep_last=2)
    assert report.spike_guard.status == "rollback" and report.spike_guard.onset_step == 121
    assert (
        report.spike_guard.protected == "checkpoint-110" and report.spike_guard.cutoff_step == 119
    )
    # keep_last counts safe checkpoints only: 100 and 110; spiked 120-200 never justify deleting them
    assert report.newest_valid == "checkpoint-110"
    assert {"checkpoint-100", "checkpoint-110"} <= set(_names(report.keep))
    assert _names(report.delete) == sorted(
        f"checkpoint-{s}" for s in [*range(10, 100, 10), *range(120, 190, 10)]
    )
    for e in report.delete:  # a spiked checkpoint never justifies deleting a safe one
        assert e.justified_by == ("checkpoint-110" if e.step < 120 else "checkpoint-200")
    for e in report.keep:
        if e.step is not None and e.step >= 120:
            assert (
                e.reason_kinds == ["post_onset"]
                and "after the spike at step 121: do not resume" in e.reasons[0]
            )
    assert {e.name for e in report.keep if e.step and e.step >= 120} == {
        "checkpoint-190",
        "checkpoint-200",
    }
    assert any("loss spike at step 121" in r for r in report.reasons["checkpoint-110"])
    assert main(["prune", str(root), "--keep-last", "2", "--apply"]) == 0
    out = capsys.readouterr().out
    assert "Loss spike:" in out and "checkpoint-110" in out
    assert (root / "checkpoint-110").is_dir() and (root / "checkpoint-200").is_dir()
    assert not (root / "checkpoint-90").exists() and not (root / "checkpoint-120").exists()


def test_spike_check_can_be_turned_off(hf_run, copy_of, capsys):
    root = copy_of(hf_run.output_dir, "run")
    assert (
        main(["prune", str(root), "--keep-last", "2", "--no-spike-check", "--format", "json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["spike_guard"] is None
    assert "checkpoint-110" in {e["name"] for e in out["delete"]}


def test_recovered_spike_protects_nothing_extra(hf_run_self_recovering, copy_of):
    root = copy_of(hf_run_self_recovering.output_dir, "run")
    report = prune(root, keep_last=2)
    assert report.spike_guard.status == "self_recovered" and report.spike_guard.protected is None
    # nothing is post-onset; the one checkpoint before the (recovered) spike is kept: checkpoint-110
    assert _names(report.keep) == ["checkpoint-110", "checkpoint-190", "checkpoint-200"]
    assert report.keep[0].reason_kinds == ["pre_spike"] and "step 121" in report.keep[0].reasons[0]
    off = prune(root, keep_last=2, spike_check=False)
    assert _names(off.keep) == ["checkpoint-190", "checkpoint-200"]


def test_emergency_save_is_held_only_while_its_spike_is_unresolved(
    hf_run, hf_run_self_recovering, copy_of
):
    """An emergency save (post-event weights, marked by the callbacks) is kept while the spike has not recovered,
    and is an ordinary old checkpoint once the log shows the run came back by itself."""
    from checkpoint_strategy.formats.marker import write_marker

    recovered = copy_of(hf_run_self_recovering.output_dir, "recovered")
    write_marker(recovered / "checkpoint-130", event="loss_spike_detected", step=121)
    report = prune(recovered, keep_last=2)
    assert report.spike_guard.status == "self_recovered"
    assert "checkpoint-130" in _names(report.delete)
    assert _names(report.keep) == ["checkpoint-110", "checkpoint-190", "checkpoint-200"]

    diverged = copy_of(hf_run.output_dir, "diverged")
    write_marker(diverged / "checkpoint-130", event="loss_spike_detected", step=121)
    report = prune(diverged, keep_last=2)
    assert "checkpoint-130" in _names(report.keep)
    assert any(
        "kept until the loss spike at step 121 recovers" in r
        for r in report.reasons["checkpoint-130"]
    )
    assert "checkpoint-130" in _names(prune(diverged, keep_last=2, spike_check=False).delete)


def test_explicit_bad_log_exits_2(hf_run, copy_of, tmp_path, capsys):
    root = copy_of(hf_run.output_dir, "run")
    bad = tmp_path / "log.jsonl"
    bad.write_text("")
    assert main(["prune", str(root), "--keep-last", "2", "--log", str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(os.listdir(root)) == sorted(os.listdir(hf_run.output_dir))


def test_unreadable_trainer_state_does_not_block_pruning(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    (root / "checkpoint-200" / "trainer_state.json").write_text('{"log_history": []}')
    report = prune(root, keep_last=2)
    assert report.spike_guard is not None and report.spike_guard.status is None
    assert "no spike check" in report.spike_guard.note


def test_spike_still_inside_its_wait_window_keeps_the_rollback_checkpoint(
    hf_run, copy_of, tmp_path
):
    """The log read 4 steps after the onset (status wait, issue 18): the spike may yet need a rollback, so the
    checkpoint before it survives a window of 2 exactly as for status rollback."""
    root = copy_of(hf_run.output_dir, "run")
    state = json.loads((root / "checkpoint-200" / "trainer_state.json").read_text())
    early = tmp_path / "trainer_state.json"
    early.write_text(
        json.dumps(
            {**state, "log_history": [e for e in state["log_history"] if e.get("step", 0) <= 125]}
        )
    )
    report = prune(root, keep_last=2, log=str(early), apply=True)
    assert report.spike_guard.status == "wait" and report.spike_guard.onset_step == 121
    assert report.spike_guard.protected == "checkpoint-110"
    # keep_last counts safe checkpoints only (issue 17): 110 and 100 are the window, the older ones go
    assert (root / "checkpoint-110").is_dir() and (root / "checkpoint-100").is_dir()
    assert not (root / "checkpoint-90").exists()


def test_newest_checkpoint_breaking_between_planning_and_deletion_deletes_nothing(
    hf_run, copy_of, monkeypatch, capsys
):
    """The newest valid checkpoint justifies every deletion; it is validated again right before the first one.
    Here it is truncated on disk just after the plan is made (the real plan, a real truncation): exit 1,
    nothing deleted, the reason names it."""
    root = copy_of(hf_run.output_dir, "run")
    pm = sys.modules[
        "checkpoint_strategy.retention.prune"
    ]  # the module (the package exports the function)
    real_plan = pm.rt.plan_prune

    def plan_then_break(*args, **kwargs):
        plan = real_plan(*args, **kwargs)
        weights = root / "checkpoint-200" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        return plan

    monkeypatch.setattr(pm.rt, "plan_prune", plan_then_break)
    before = sorted(os.listdir(root))
    rc = main(
        ["prune", str(root), "--keep-last", "2", "--no-spike-check", "--apply", "--format", "json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert sorted(os.listdir(root)) == before and out["deleted"] == 0
    assert any(
        e["file"] == "checkpoint-200" and "no longer validates" in e["reason"]
        for e in out["errors"]
    )


@pytest.mark.parametrize(
    "failing_call, words",
    [
        (
            2,
            [
                "cannot write .checkpoint-strategy-prune.json",
                "no space left",
                "nothing (more) deleted",
            ],
        ),  # the batch entry, before any rename
        (
            3,
            ["could not update the journal", "no space left", "next prune --apply tidies it"],
        ),  # after the deletions
    ],
)
def test_journal_write_failures_are_problems_that_say_what_happened(
    hf_run, copy_of, monkeypatch, failing_call, words
):
    import errno
    import sys

    pm = sys.modules[
        "checkpoint_strategy.retention.prune"
    ]  # the module (the package exports the function)

    root = copy_of(hf_run.output_dir, "run")
    real, calls = pm._write_journal, []

    def flaky(where, pending):
        calls.append(1)
        if len(calls) == failing_call:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(where, pending)

    monkeypatch.setattr(pm, "_write_journal", flaky)
    report = prune(root, keep_last=2, apply=True, spike_check=False)
    (problem,) = [e for e in report.errors if e.file == pm.JOURNAL]
    assert all(w in problem.reason for w in words), problem.reason
    assert report.deleted == (0 if failing_call == 2 else len(report.delete))


def test_journal_that_cannot_be_written_names_the_root_and_deletes_nothing(
    hf_run, copy_of, monkeypatch
):
    import errno
    import sys

    pm = sys.modules[
        "checkpoint_strategy.retention.prune"
    ]  # the module (the package exports the function)
    from checkpoint_strategy.errors import UsageError

    root = copy_of(hf_run.output_dir, "run")

    def failing(where, pending):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(pm, "_write_journal", failing)
    with pytest.raises(UsageError, match="needs write access to ROOT") as err:
        prune(root, keep_last=2, apply=True, spike_check=False)
    # the OS error's own words, not only which file (EACCES here; a full disk says "no space left")
    assert str(err.value) == (
        f"cannot write the prune journal in {root}: permission denied; "
        "prune --apply needs write access to ROOT (nothing deleted)"
    )
    assert sorted(os.listdir(root)) == sorted(os.listdir(hf_run.output_dir))


def test_keep_last_below_one_is_a_usage_error_naming_it(hf_run, copy_of):
    from checkpoint_strategy.errors import UsageError

    with pytest.raises(UsageError, match="--keep-last must be an integer of at least 1"):
        prune(copy_of(hf_run.output_dir, "run"), keep_last=0)


def test_unrecognised_entries_are_reported_with_their_path(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    (root / "README.txt").write_text("notes")
    report = prune(root, keep_last=2, spike_check=False)
    (entry,) = [e for e in report.keep if e.name == "README.txt"]
    assert entry.path is not None and entry.path.endswith("README.txt")


def _refused_a_second_lock(root) -> None:
    """ROOT's lock is held: a second locker is refused."""
    from checkpoint_strategy.errors import UsageError
    from checkpoint_strategy.storage.locking import locked

    with pytest.raises(UsageError, match="busy"):
        with locked(root, 0.05, "busy"):
            pass


def test_on_start_runs_with_the_folder_locked_before_the_survey(hf_run, copy_of):
    """prune(on_start=...) (what the callbacks use to report the prune's start): called once, while ROOT's lock
    is held (a second locker is refused), before any checkpoint is deleted."""
    root = copy_of(hf_run.output_dir, "run")
    before = sorted(os.listdir(root))
    seen = []

    def started():
        seen.append(sorted(os.listdir(root)))
        _refused_a_second_lock(root)

    report = prune(
        root, keep_last=3, milestones=[], spike_check=False, apply=True, on_start=started
    )
    assert seen == [before] and report.delete
    assert not any((root / name).exists() for name in _names(report.delete))


def test_on_end_runs_with_the_folder_still_locked_after_the_deletions(hf_run, copy_of):
    """prune(on_end=...) (the callbacks stamp the prune's end with it): called once, after every deletion, while
    ROOT's lock is still held, so a save that waits for the lock begins after it. (Stamped after the lock was
    released, a loaded CI run saw a save start 21.6 ms before the prune's end stamp.)"""
    from checkpoint_strategy.storage.locking import locked

    root = copy_of(hf_run.output_dir, "run")
    seen = []

    def ended():
        seen.append(sorted(os.listdir(root)))
        _refused_a_second_lock(root)

    report = prune(
        root,
        keep_last=3,
        milestones=[],
        spike_check=False,
        apply=True,
        on_start=lambda: seen.append(0),
        on_end=ended,
    )
    assert seen[0] == 0 and len(seen) == 2 and report.delete
    assert not set(_names(report.delete)) & set(seen[1])  # the deletions were done
    with locked(root, 0.05, "busy"):  # and released after
        pass


# --------------------------------------------------------------------------- mutation survivors (docs/mutation.md)


def _nan_in_first_weight(weights: Path) -> None:
    """One NaN written over the first float32 value of a safetensors file (its header read here, not by the
    package): a value only level deep reads; the headers and sizes stay as they were."""
    raw = weights.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    start = min(v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    weights.unlink()  # never write through a hard link to a shared copy
    weights.write_bytes(raw[: 8 + size + start] + b"\x00\x00\xc0\x7f" + raw[8 + size + start + 4 :])


def test_level_deep_surveys_at_deep_so_a_newest_only_deep_refuses_justifies_nothing(
    hf_run, tmp_path, cli_run
):
    """prune --level deep validates the survey at deep, not at the default level. checkpoint-120 holds the
    weights blown up by the spike (a norm jump against checkpoint-110, which only the survey sees: the check
    right before deleting looks at one checkpoint): surveyed at quick it would be the newest valid and
    checkpoint-110 would be deleted. A NaN in the newest's weights: surveyed at quick the dry run would promise
    a deletion its own --apply refuses."""
    root = tmp_path / "jump"
    root.mkdir()
    for s in (110, 120):
        shutil.copytree(hf_run.output_dir / f"checkpoint-{s}", root / f"checkpoint-{s}")
    argv = ("prune", root, "--keep-last", "1", "--no-spike-check", "--level", "deep")
    r = cli_run(*argv, "--apply", "--format", "json")
    assert r.rc == 0, r.err
    rep = r.json()
    assert rep["delete"] == [] and rep["newest_valid"] == "checkpoint-110"
    kept = {e["name"]: e["reason_kinds"] for e in rep["keep"]}
    assert kept == {"checkpoint-110": ["newest"], "checkpoint-120": ["not_valid"]}
    assert sorted(os.listdir(root)) == ["checkpoint-110", "checkpoint-120"]

    nan = tmp_path / "nan"
    nan.mkdir()
    for s in (30, 40):
        shutil.copytree(hf_run.output_dir / f"checkpoint-{s}", nan / f"checkpoint-{s}")
    _nan_in_first_weight(nan / "checkpoint-40" / "model.safetensors")
    dry = cli_run(*argv[:1], nan, *argv[2:], "--format", "json").json()
    assert dry["delete"] == [] and dry["newest_valid"] == "checkpoint-30"


def test_refuses_another_users_home_folder_from_the_password_database(cli_run):
    """Every home folder the password database names (not only /, /root, /home and $HOME) is refused: a
    service account's home (/var/mail, /var/backups, ...) on this machine, dry run only (nothing is written
    to it either way)."""
    pwd = pytest.importorskip("pwd")
    ours = {os.path.realpath(p) for p in ("/", "/root", "/home", os.path.expanduser("~"))}
    homes = sorted(
        {
            e.pw_dir
            for e in pwd.getpwall()
            if e.pw_dir not in ("", "/nonexistent")
            and os.path.isdir(e.pw_dir)
            and os.path.realpath(e.pw_dir) not in ours
        }
    )
    if not homes:
        pytest.skip("no home folder in the password database besides /, /root, /home and $HOME")
    home = min(homes, key=lambda h: len(os.listdir(h)) if os.access(h, os.R_OK | os.X_OK) else 0)
    line = cli_run("prune", home, "--keep-last", "2").usage_error("home folder")
    assert line.endswith(
        f"{home}: refusing to prune / or a home folder; pass the run's checkpoint folder"
    )
