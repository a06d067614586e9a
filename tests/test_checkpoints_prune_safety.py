"""prune never loses a rollback point: each case of issue 9 ("Data loss in prune") reproduced on
copies of the real fixture runs, then checked fixed."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import realruns
from cliresult import checkout_env

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery import advise
from checkpoint_strategy.retention import prune as _prune
from checkpoint_strategy.validate import validate_paths

prune = functools.partial(
    _prune, advise=advise
)  # as prune_cli and the callbacks call it (the adviser is passed in)

ENV = checkout_env()

pm = sys.modules["checkpoint_strategy.retention.prune"]


def _names(entries):
    return sorted(e.name for e in entries)


def _run_json(args, capsys):
    rc = main(args + ["--format", "json"])
    cap = capsys.readouterr()
    return rc, (json.loads(cap.out) if cap.out else None), cap.err


def _weights_only(ckpt: Path) -> None:
    for n in ("optimizer.pt", "scheduler.pt"):
        (ckpt / n).unlink()


# --------------------------------------------------------------------------- item 1: resumable first


def test_weights_only_newest_never_justifies_deleting_resumable_ones(hf_run, copy_of, capsys):
    """Reproduced: a newest checkpoint-200 without optimizer.pt/scheduler.pt counted as newest
    valid and `--keep-last 1 --apply` deleted every resumable checkpoint."""
    root = copy_of(hf_run.output_dir, "run")
    _weights_only(root / "checkpoint-200")
    rc, out, _err = _run_json(
        ["prune", str(root), "--keep-last", "1", "--no-spike-check", "--apply"], capsys
    )
    assert rc == 0
    assert out["counts_resumable"] is True and out["newest_valid"] == "checkpoint-190"
    assert sorted(os.listdir(root)) == ["checkpoint-190", "checkpoint-200"]
    by_name = {e["name"]: e for e in out["keep"] + out["delete"]}
    assert (
        by_name["checkpoint-200"]["resumable"] is False
        and by_name["checkpoint-190"]["resumable"] is True
    )
    assert by_name["checkpoint-200"]["reason_kinds"] == ["unjustified"]
    assert all(e["justified_by"] == "checkpoint-190" for e in out["delete"])
    assert validate_paths([str(root / "checkpoint-190")]).checkpoints[0].resumable


def test_each_line_says_resumable_or_weights_only(hf_run, copy_of, capsys):
    root = copy_of(hf_run.output_dir, "run")
    _weights_only(root / "checkpoint-200")
    _weights_only(root / "checkpoint-100")
    assert main(["prune", str(root), "--keep-last", "3", "--no-spike-check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = {ln.split()[1]: ln for ln in lines if ln.startswith(("KEEP", "DELETE"))}
    assert (
        "[valid, weights-only, " in line["checkpoint-200"]
        and "[valid, weights-only, " in line["checkpoint-100"]
    )
    assert "[valid, resumable, " in line["checkpoint-190"]
    assert "weights-only; older than keep_last=3" in line["checkpoint-100"]
    assert any(ln.startswith("Keep last:") and "resumable" in ln for ln in lines)


def test_copy_in_progress_newest_is_kept_and_never_counts(hf_run, copy_of):
    """A checkpoint-210 still being copied (weights only, no trainer_state.json yet) is incomplete:
    kept, and it justifies nothing."""
    root = copy_of(hf_run.output_dir, "run")
    part = root / "checkpoint-210"
    part.mkdir()
    shutil.copy2(root / "checkpoint-200" / "model.safetensors", part / "model.safetensors")
    report = prune(root, keep_last=1, apply=True, spike_check=False)
    assert report.newest_valid == "checkpoint-200"
    assert sorted(os.listdir(root)) == ["checkpoint-200", "checkpoint-210"]
    kept = {e.name: e for e in report.keep}
    assert (
        kept["checkpoint-210"].status == "incomplete"
        and kept["checkpoint-210"].reason_kinds[0] == "not_valid"
    )


def test_run_with_only_weights_only_checkpoints_counts_valid_ones(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    for step in hf_run.checkpoint_steps:
        _weights_only(root / f"checkpoint-{step}")
    report = prune(root, keep_last=2, spike_check=False)
    assert report.counts_resumable is False and report.newest_valid == "checkpoint-200"
    assert _names(report.keep) == ["checkpoint-190", "checkpoint-200"]


# --------------------------------------------------------------------------- item 2: strict names


LOOSE = ["checkpoint-50-KEEP-before-lr-change", "best-checkpoint-100.bak", "checkpoint-100 (copy)"]


def test_loosely_named_copies_are_not_recognised_and_kept(hf_run, lightning_run, copy_of, capsys):
    """Reproduced: all five names of the issue were marked DELETE."""
    root = copy_of(hf_run.output_dir, "run")
    for name, step in zip(LOOSE, (50, 100, 100), strict=False):
        shutil.copytree(root / f"checkpoint-{step}", root / name)
    shutil.copy2(
        root / "checkpoint-50" / "model.safetensors", root / "final-model-step=50.safetensors"
    )
    shutil.copy2(lightning_run.ckpt_files[0], root / "epoch=0-step=10-val_loss=0.123.ckpt")
    rc, out, _ = _run_json(
        ["prune", str(root), "--keep-last", "1", "--no-spike-check", "--apply"], capsys
    )
    assert rc == 0
    left = set(os.listdir(root))
    assert (
        set(LOOSE) | {"final-model-step=50.safetensors", "epoch=0-step=10-val_loss=0.123.ckpt"}
        <= left
    )
    kinds = {e["name"]: e["reason_kinds"] for e in out["keep"]}
    for name in LOOSE + ["final-model-step=50.safetensors"]:
        assert kinds[name] == ["unrecognised"], name
    assert "trainer_best" in kinds["epoch=0-step=10-val_loss=0.123.ckpt"]
    assert {e["name"] for e in out["delete"]} == {
        f"checkpoint-{s}" for s in hf_run.checkpoint_steps[:-1]
    }


def test_lightning_template_from_the_run_and_monitored_top_k(lightning_run, copy_of, capsys):
    root = copy_of(lightning_run.ckpt_dir, "ckpts")
    shutil.copy2(root / "epoch=0-step=10.ckpt", root / "epoch=0-step=5-val_loss=0.500.ckpt")
    shutil.copy2(root / "epoch=0-step=30.ckpt", root / "last.ckpt")
    shutil.copy2(root / "epoch=0-step=10.ckpt", root / "epoch=0-step=10 (1).ckpt")
    rc, out, _ = _run_json(["prune", str(root), "--keep-last", "1", "--apply"], capsys)
    assert rc == 0, out
    assert out["lightning_templates"] == ["epoch={}-step={}", "epoch={}-step={}-val_loss={}"]
    assert sorted(os.listdir(root)) == [
        "epoch=0-step=10 (1).ckpt",
        "epoch=0-step=30.ckpt",
        "epoch=0-step=5-val_loss=0.500.ckpt",
        "last.ckpt",
    ]
    why = {e["name"]: e["reasons"] for e in out["keep"]}
    assert any("top-k by val_loss" in r for r in why["epoch=0-step=5-val_loss=0.500.ckpt"])
    assert out["newest_valid"] == "epoch=0-step=30.ckpt" and out["counts_resumable"] is True


# --------------------------------------------------------------------------- item 3: symlinks


def test_symlink_out_of_root_never_counts_as_the_newer_checkpoint(hf_run, tmp_path):
    """Reproduced: a symlinked checkpoint-500 (outside ROOT) became the newest valid and justified
    deleting every real checkpoint."""
    outside = tmp_path / "elsewhere"
    shutil.copytree(hf_run.output_dir / "checkpoint-200", outside / "checkpoint-500")
    root = tmp_path / "run"
    for step in (10, 20, 30):
        shutil.copytree(hf_run.output_dir / f"checkpoint-{step}", root / f"checkpoint-{step}")
    (root / "checkpoint-500").symlink_to(outside / "checkpoint-500")
    report = prune(root, keep_last=1, apply=True, spike_check=False)
    assert report.newest_valid == "checkpoint-30"
    assert sorted(os.listdir(root)) == ["checkpoint-30", "checkpoint-500"]
    link = next(e for e in report.keep if e.name == "checkpoint-500")
    assert link.symlink and link.reason_kinds == ["symlink"]
    assert (outside / "checkpoint-500" / "optimizer.pt").exists()


def test_only_symlinked_newer_checkpoints_delete_nothing(hf_run, tmp_path):
    outside = tmp_path / "elsewhere"
    root = tmp_path / "run"
    shutil.copytree(hf_run.output_dir / "checkpoint-10", root / "checkpoint-10")
    for step in (20, 30):
        shutil.copytree(hf_run.output_dir / f"checkpoint-{step}", outside / f"checkpoint-{step}")
        (root / f"checkpoint-{step}").symlink_to(outside / f"checkpoint-{step}")
    report = prune(root, keep_last=1, apply=True, spike_check=False)
    assert not report.delete and report.deleted == 0
    assert (root / "checkpoint-10" / "model.safetensors").exists()


# --------------------------------------------------------------------------- item 4: HF output_dir


def _output_dir_with_final_export(hf_run, copy_of) -> Path:
    root = copy_of(hf_run.output_dir, "out")
    for n in ("model.safetensors", "config.json", "trainer_state.json", "generation_config.json"):
        shutil.copy2(root / "checkpoint-200" / n, root / n)
    return root


def test_hf_output_dir_is_a_run_folder_for_validate(hf_run, copy_of, capsys):
    """Reproduced: validate read the output_dir as one checkpoint and gave a false all-clear for
    a corrupt checkpoint-40 inside it."""
    root = _output_dir_with_final_export(hf_run, copy_of)
    st = root / "checkpoint-40" / "model.safetensors"
    st.write_bytes(st.read_bytes()[:100])
    report = validate_paths([str(root)], progress=False)
    by_path = {c.path: c for c in report.checkpoints}
    assert by_path[str(root / "checkpoint-40")].status != "valid"
    assert len(report.checkpoints) == len(hf_run.checkpoint_steps) + 1
    export = by_path[str(root)]
    assert export.status == "valid" and any("final export" in n for n in export.notes)
    assert main(["validate", str(root)]) == 1
    capsys.readouterr()


def test_hf_output_dir_final_export_is_validated_as_such(hf_run, copy_of):
    root = _output_dir_with_final_export(hf_run, copy_of)
    (root / "model.safetensors").write_bytes(b"")
    report = validate_paths([str(root)], progress=False)
    export = next(c for c in report.checkpoints if c.path == str(root))
    assert export.status != "valid" and export.problems[0].file == "model.safetensors"


def test_hf_output_dir_prunes_its_checkpoints_and_keeps_the_export(hf_run, copy_of):
    """Reproduced: prune refused the output_dir ("is itself a checkpoint")."""
    root = _output_dir_with_final_export(hf_run, copy_of)
    report = prune(root, keep_last=2, apply=True, spike_check=False)
    assert report.final_export == str(root) and report.state == "done"
    assert sorted(os.listdir(root)) == sorted(
        [
            "checkpoint-190",
            "checkpoint-200",
            "model.safetensors",
            "config.json",
            "trainer_state.json",
            "generation_config.json",
        ]
    )
    export = next(e for e in report.keep if e.name == ".")
    assert export.reason_kinds == ["final_export"]


def test_hf_output_dir_handoff_counts_every_rollback_point(hf_run, copy_of, tmp_path, capsys):
    """Reproduced: handoff counted one rollback point for the whole output_dir."""
    root = _output_dir_with_final_export(hf_run, copy_of)
    state = tmp_path / "state"
    assert (
        main(["handoff", "--checkpoints", str(root), "--state-dir", str(state), "--format", "json"])
        == 0
    )
    doc = json.loads((state / "checkpoint-strategy.json").read_text())
    steps = {c["step"] for c in doc["rollback_points"]}
    # rollback points are the checkpoints safe to resume from: 120-200 come after the unrecovered spike at 121
    assert set(range(10, 111, 10)) == steps
    assert {200, 190, 180} <= {c["step"] for c in doc["post_onset_checkpoints"]}
    capsys.readouterr()


# --------------------------------------------------------------------------- item 5: journal


def test_failed_deletion_is_half_deleted_then_finished_by_a_rerun(
    hf_run, copy_of, monkeypatch, capsys
):
    """A deletion that stops half-way (I/O error while removing) leaves a journalled
    .deleting-* folder: exit 1, "half deleted, rerun" in the report; the rerun finishes it."""
    root = copy_of(hf_run.output_dir, "run")
    real_remove = pm._remove
    calls = {"n": 0}

    def flaky(path):
        calls["n"] += 1
        if calls["n"] == 3:  # remove one file, then fail like a disk error
            os.unlink(os.path.join(path, "config.json"))
            raise OSError(5, "Input/output error")
        real_remove(path)

    monkeypatch.setattr(pm, "_remove", flaky)
    assert main(["prune", str(root), "--keep-last", "2", "--no-spike-check", "--apply"]) == 1
    out = capsys.readouterr().out
    assert "HALF DELETED" in out and "rerun" in out
    assert "FAILED  checkpoint-30" in out
    journal = json.loads((root / pm.JOURNAL).read_text())
    assert [e["name"] for e in journal["pending"]] == ["checkpoint-30"]
    half = journal["pending"][0]["renamed"]
    assert (root / half).is_dir() and not (root / half / "config.json").exists()
    assert "17 deleted" in out  # 18 planned, 17 really deleted
    monkeypatch.setattr(pm, "_remove", real_remove)
    rc, rep, _ = _run_json(
        ["prune", str(root), "--keep-last", "2", "--no-spike-check", "--apply"], capsys
    )
    assert rc == 0 and rep["state"] == "done" and rep["leftovers"] == [half]
    assert sorted(os.listdir(root)) == ["checkpoint-190", "checkpoint-200"]


def test_rename_failure_leaves_the_checkpoint_intact_and_exits_1(
    hf_run, copy_of, monkeypatch, capsys
):
    root = copy_of(hf_run.output_dir, "run")
    real_rename = os.rename

    def rename(src, dst, *a, **k):
        if os.path.basename(src) == "checkpoint-50":
            raise PermissionError(13, "Permission denied")
        return real_rename(src, dst, *a, **k)

    monkeypatch.setattr(pm.os, "rename", rename)
    rc, out, _ = _run_json(
        ["prune", str(root), "--keep-last", "2", "--no-spike-check", "--apply"], capsys
    )
    assert rc == 1 and out["state"] == "failed" and out["failed"] == 1
    assert out["deleted"] == len(hf_run.checkpoint_steps) - 3
    bad = next(e for e in out["delete"] if e["name"] == "checkpoint-50")
    assert not bad["deleted"] and "permission denied" in bad["error"] and "intact" in bad["error"]
    assert validate_paths([str(root / "checkpoint-50")]).checkpoints[0].status == "valid"
    assert not (root / pm.JOURNAL).exists()


@pytest.mark.parametrize(
    "pending",
    [
        [{"name": "x", "renamed": "../outside"}],
        [{"name": "x", "renamed": "checkpoint-200"}],
        [{"name": "x", "renamed": ".deleting-0123456789abcdef", "sidecar": "../../etc"}],
        "nope",
    ],
)
def test_forged_journal_is_refused_before_anything_is_deleted(pending, hf_run, copy_of, capsys):
    root = copy_of(hf_run.output_dir, "run")
    (root / pm.JOURNAL).write_text(json.dumps({"version": 1, "pending": pending}))
    before = sorted(os.listdir(root))
    assert main(["prune", str(root), "--keep-last", "2", "--apply"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "journal" in err
    assert sorted(os.listdir(root)) == before


def test_deeply_nested_journal_is_one_line(hf_run, copy_of, capsys):
    root = copy_of(hf_run.output_dir, "run")
    (root / pm.JOURNAL).write_text("[" * 200000)
    assert main(["prune", str(root), "--keep-last", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_journal_over_16_mb_is_refused_with_one_line_before_anything_is_deleted(
    hf_run, copy_of, capsys
):
    """The journal is read with its own 16 MB bound (not the 64 MB of other JSON inputs): a well-formed
    journal of nothing pending, padded past 16 MB, is refused and nothing is deleted."""
    root = copy_of(hf_run.output_dir, "run")
    body = json.dumps({"version": 1, "pending": []}).encode()
    (root / pm.JOURNAL).write_bytes(body + b" " * ((16 << 20) + 1 - len(body)))
    before = sorted(os.listdir(root))
    assert main(["prune", str(root), "--keep-last", "2", "--no-spike-check", "--apply"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"prune journal {root / pm.JOURNAL} is larger than 16 MB" in line
    assert sorted(os.listdir(root)) == before


# --------------------------------------------------------------------------- item 6: two at once


def _hold_lock(root: Path, seconds: float) -> subprocess.Popen:
    code = (
        "import sys,time\nfrom checkpoint_strategy.storage.locking import locked\n"
        f"with locked({str(root)!r}, 1, 'busy'):\n    print('held', flush=True)\n    time.sleep({seconds})\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_prune_waits_then_exits_2_with_one_line(hf_run, copy_of, capsys):
    root = copy_of(hf_run.output_dir, "run")
    holder = _hold_lock(root, 30)
    try:
        t0 = time.monotonic()
        with pytest.raises(UsageError, match="being pruned by another"):
            prune(root, keep_last=2, apply=True, lock_timeout=0.3)
        assert (
            time.monotonic() - t0 >= 0.3
        )  # it waited its lock_timeout (at least: a load can only add to it)
        assert sorted(os.listdir(root)) == sorted(os.listdir(hf_run.output_dir))
    finally:
        holder.kill()
        holder.wait()
    assert prune(root, keep_last=2, apply=True, spike_check=False, lock_timeout=0.3).state == "done"


def test_two_prunes_at_once_both_succeed_without_spurious_errors(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    cmd = [
        sys.executable,
        "-m",
        "checkpoint_strategy",
        "prune",
        str(root),
        "--keep-last",
        "2",
        "--apply",
        "--no-spike-check",
        "--format",
        "json",
    ]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    for _out, err, rc in results:
        assert rc == 0 and err == "", err
    reports = [json.loads(out) for out, _err, _rc in results]
    assert sorted(r["deleted"] for r in reports) == [0, len(hf_run.checkpoint_steps) - 2]
    assert all(not r["errors"] for r in reports)
    assert sorted(os.listdir(root)) == ["checkpoint-190", "checkpoint-200"]


# --------------------------------------------------------------------------- read-only ROOT


def _run_readonly(root: Path, args: list[str]) -> subprocess.CompletedProcess:
    """Run prune on ROOT bind-mounted read-only (root: a private mount namespace), or with the
    write bits removed (any other user)."""
    cmd = [sys.executable, "-m", "checkpoint_strategy", "prune", str(root)] + args
    if os.geteuid() != 0:
        os.chmod(root, 0o555)
        try:
            return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
        finally:
            os.chmod(root, 0o755)
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare to make a read-only folder as root")
    quoted = " ".join(f"'{c}'" for c in cmd)
    script = f"mount --bind '{root}' '{root}' && mount -o remount,ro,bind '{root}' && exec {quoted}"
    res = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=ENV, timeout=120
    )
    if "mount" in res.stderr and res.returncode not in (0, 1, 2):
        pytest.skip(f"cannot make a read-only mount here: {res.stderr.strip()}")
    return res


def test_read_only_root_dry_run_works_and_apply_exits_2(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    before = sorted(os.listdir(root))
    dry = _run_readonly(root, ["--keep-last", "2", "--format", "json"])
    assert dry.returncode == 0, dry.stderr
    # keep_last 2 counts the safe checkpoints (100, 110); of the post-onset ones 190, 200 stay
    assert len(json.loads(dry.stdout)["delete"]) == len(hf_run.checkpoint_steps) - 4
    res = _run_readonly(root, ["--keep-last", "2", "--apply"])
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and ("read-only" in lines[0] or "permission denied" in lines[0])
    assert "nothing deleted" in lines[0]
    assert sorted(os.listdir(root)) == before


# --------------------------------------------------------------------------- hostile names


@pytest.mark.parametrize(
    "name",
    [
        "checkpoint-10\nKEEP checkpoint-20",
        "checkpoint-10 | rm",
        "my checkpoint 10",
        "checkpoint-10\r",
        "checkpoint-10\n",
        " checkpoint-10",
        "checkpoint-１０",
        "epoch=0-step=10.ckpt\n",
    ],
)
def test_hostile_names_are_kept_and_reported(name, hf_run, copy_of, capsys):
    root = copy_of(hf_run.output_dir, "run")
    shutil.copytree(root / "checkpoint-10", root / name)
    rc, out, _ = _run_json(
        ["prune", str(root), "--keep-last", "2", "--no-spike-check", "--apply"], capsys
    )
    assert rc == 0
    assert (root / name / "model.safetensors").exists()
    entry = next(e for e in out["keep"] if e["name"] == name)
    assert entry["reason_kinds"] == ["unrecognised"]
    assert not (root / "checkpoint-10").exists()


def test_summary_counts_real_deletions(hf_run, copy_of, capsys):
    root = copy_of(hf_run.output_dir, "run")
    rc, out, _ = _run_json(
        ["prune", str(root), "--keep-last", "5", "--milestones", "50", "--apply"], capsys
    )
    gone = set(os.listdir(hf_run.output_dir)) - set(os.listdir(root))
    assert rc == 0 and out["deleted"] == len(gone) == sum(e["deleted"] for e in out["delete"])
    assert out["freed_bytes"] > 0 and out["state"] == "done"


def test_journal_temp_left_by_a_kill_is_cleaned_even_with_nothing_to_delete(hf_run, copy_of):
    root = copy_of(hf_run.output_dir, "run")
    prune(root, keep_last=2, apply=True, spike_check=False)
    tmp = root / ("." + pm.JOURNAL + ".abc123.tmp")
    tmp.write_text('{"version": 1, "pen')
    report = prune(root, keep_last=2, apply=True, spike_check=False)
    assert report.state == "done" and report.deleted == 0
    assert sorted(os.listdir(root)) == ["checkpoint-190", "checkpoint-200"]


def test_kill_between_journal_and_rename_leaves_the_checkpoint_to_the_next_run(hf_run, copy_of):
    """A journal entry whose .deleting-* name never appeared (killed right after the journal
    write): the checkpoint is intact, the entry is dropped, the next run deletes it normally."""
    root = copy_of(hf_run.output_dir, "run")
    (root / pm.JOURNAL).write_text(
        json.dumps(
            {
                "version": 1,
                "pending": [
                    {
                        "name": "checkpoint-10",
                        "renamed": ".deleting-00112233445566ff",
                        "sidecar": None,
                    }
                ],
            }
        )
    )
    dry = prune(root, keep_last=2, spike_check=False)
    assert dry.leftovers == [] and "checkpoint-10" in _names(dry.delete)
    report = prune(root, keep_last=2, apply=True, spike_check=False)
    assert report.state == "done" and not (root / pm.JOURNAL).exists()
    assert sorted(os.listdir(root)) == ["checkpoint-190", "checkpoint-200"]


# --------------------------------------------------------------------------- Lightning top-k from the state


@pytest.fixture(scope="module")
def lightning_topk(tmp_path_factory):
    """A real Lightning run with two ModelCheckpoints in one folder: top-2 by a monitored `score`
    (best = oldest: score = -step) named epoch=E-step=N.ckpt, and every 5 steps named
    step=N-epoch=E.ckpt. The metric is not in the top-k names: only the state says they are best."""
    return realruns.build_lightning_topk(
        tmp_path_factory.mktemp("pl-topk"),
        lambda step: -float(step),
        samples=64,
        max_steps=30,
        top_name="{epoch}-{step}",
        every_name="{step}-{epoch}",
    )


def test_lightning_top_k_named_by_the_trainer_state_is_kept(lightning_topk, copy_of, capsys):
    root = copy_of(lightning_topk, "ckpts")
    top_k = sorted(n for n in os.listdir(root) if n.startswith("epoch="))
    assert len(top_k) == 2  # the trainer's own top-2 by score
    rc, out, _ = _run_json(["prune", str(root), "--keep-last", "1", "--apply"], capsys)
    assert rc == 0 and out["newest_valid"] == "step=30-epoch=0.ckpt"
    left = sorted(os.listdir(root))
    assert (
        set(top_k) <= set(left)
        and "step=30-epoch=0.ckpt" in left
        and "step=5-epoch=0.ckpt" not in left
    )
    why = {e["name"]: e for e in out["keep"]}
    for name in top_k:
        assert "trainer_best" in why[name]["reason_kinds"]
        assert any("top-k by score" in r for r in why[name]["reasons"])


def test_dcp_step_folders(dcp_checkpoint, tmp_path, capsys):
    """torchtitan-style step-N/ DCP folders: exact names only; an unfinished save (no .metadata)
    is kept and never counts as the newest."""
    root = tmp_path / "dcp"
    for name in ("step-100", "step-200", "step-300", "step-150-old", "step_250"):
        shutil.copytree(dcp_checkpoint, root / name)
    (root / "step-300" / ".metadata").unlink()
    rc, out, _ = _run_json(["prune", str(root), "--keep-last", "1", "--apply"], capsys)
    assert rc == 0 and out["newest_valid"] == "step-200" and out["counts_resumable"] is True
    assert sorted(os.listdir(root)) == ["step-150-old", "step-200", "step-300", "step_250"]
    kinds = {e["name"]: e["reason_kinds"] for e in out["keep"]}
    assert kinds["step-300"][0] == "not_valid" and kinds["step_250"] == ["unrecognised"]


def test_hf_output_dir_with_only_trainer_state_has_no_final_export(hf_run, copy_of, capsys):
    """Trainer.save_state() without save_model(): a trainer_state.json at the top is not a
    (broken) final export; the checkpoints are validated one by one and all pass."""
    root = copy_of(hf_run.output_dir, "out")
    state = json.loads((root / "checkpoint-200" / "trainer_state.json").read_text())
    state["best_model_checkpoint"] = str(root / "checkpoint-30")
    (root / "trainer_state.json").write_text(json.dumps(state))
    report = validate_paths([str(root)], progress=False)
    assert len(report.checkpoints) == len(hf_run.checkpoint_steps)
    assert {c.status for c in report.checkpoints} == {"valid"}
    pr = prune(root, keep_last=2, spike_check=False)
    assert pr.final_export is None and "trainer_state.json" in {e.name for e in pr.keep}
    assert "checkpoint-30" in {e.name for e in pr.keep} and pr.best_checkpoint == "checkpoint-30"
