"""prune keeps what something else points at and never deletes on the word of an unchecked checkpoint
(issues 28 and 29), and says what it frees in the dry run's units (issue 27). Real checkpoints: copies
of the HF fixture run, and DeepSpeed tags of real torch.save archives (tests/layouts.py)."""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import layouts
import pytest


def _run(hf_run, base: Path, steps, name: str = "run") -> Path:
    root = base / name
    root.mkdir()
    for s in steps:
        shutil.copytree(hf_run.output_dir / f"checkpoint-{s}", root / f"checkpoint-{s}")
    return root


def flip_tensor_byte(archive: Path) -> str:
    """Flip one byte in the middle of the largest stored member of a torch.save zip: the headers still
    parse (the quick level passes), only the member's CRC-32 (level full) catches it."""
    with zipfile.ZipFile(archive) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    data = bytearray(archive.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.file_size // 2] ^= 0xFF
    archive.unlink()  # never write through a hard link to a shared copy
    archive.write_bytes(bytes(data))
    return info.filename


# --------------------------------------------------------------------------- issue 28: symlinks in ROOT


def test_the_checkpoint_an_in_root_symlink_names_is_kept_in_dry_run_and_apply(
    hf_run, tmp_path, cli_run
):
    root = _run(hf_run, tmp_path, range(10, 130, 10))
    (root / "best").symlink_to("checkpoint-90")
    os.rename(
        root / "checkpoint-30", root / "checkpoint-0030"
    )  # zero-padded: still a checkpoint name
    (root / "latest").symlink_to(root / "checkpoint-0030")  # absolute link into ROOT
    args = (
        "prune",
        root,
        "--keep-last",
        "1",
        "--milestones",
        "40,80",
        "--no-spike-check",
        "--format",
        "json",
    )
    dry = cli_run(*args).json()
    keep = {e["name"]: e for e in dry["keep"]}
    assert "link_target" in keep["checkpoint-90"]["reason_kinds"] and "best" in " ".join(
        keep["checkpoint-90"]["reasons"]
    )
    assert "link_target" in keep["checkpoint-0030"]["reason_kinds"]
    assert "latest" in " ".join(keep["checkpoint-0030"]["reasons"])
    assert (
        keep["best"]["reason_kinds"] == ["symlink"]
        and "checkpoint-90" in keep["best"]["reasons"][0]
    )
    applied = cli_run(*args, "--apply").json()
    assert {e["name"] for e in applied["delete"]} == {e["name"] for e in dry["delete"]}
    assert {e["name"] for e in applied["keep"]} == set(keep)
    assert all(e["deleted"] for e in applied["delete"]) and applied["delete"]
    assert (root / "best").resolve().is_dir() and (
        root / "latest"
    ).resolve().is_dir()  # no dangling link
    assert sorted(os.listdir(root)) == sorted(keep)


def test_a_symlink_out_of_root_is_reported_never_followed_or_deleted(hf_run, tmp_path, cli_run):
    root = _run(hf_run, tmp_path, (10, 20, 30))
    outside = tmp_path / "outside"
    shutil.copytree(hf_run.output_dir / "checkpoint-200", outside / "checkpoint-200")
    (root / "checkpoint-200").symlink_to(outside / "checkpoint-200")
    (root / "elsewhere").symlink_to(outside)
    before = sorted(str(p) for p in outside.rglob("*"))
    out = cli_run(
        "prune", root, "--keep-last", "1", "--no-spike-check", "--apply", "--format", "json"
    ).json()
    keep = {e["name"]: e for e in out["keep"]}
    for name in ("checkpoint-200", "elsewhere"):
        assert (
            keep[name]["status"] is None and "outside ROOT" in keep[name]["reasons"][0]
        )  # never validated
        assert any(
            n.startswith(name + " is a symlink to") and "outside ROOT" in n for n in out["notes"]
        )
    assert out["newest_valid"] == "checkpoint-30"  # the link never counts as the newest
    assert {e["name"] for e in out["delete"]} == {"checkpoint-10", "checkpoint-20"}
    assert sorted(str(p) for p in outside.rglob("*")) == before
    assert (root / "checkpoint-200").is_symlink() and (root / "elsewhere").is_symlink()


def test_dangling_self_and_chained_links_are_kept_and_said(hf_run, tmp_path, cli_run):
    root = _run(hf_run, tmp_path, (10, 20, 30))
    (root / "gone").symlink_to("checkpoint-999")
    (root / "self").symlink_to(".")
    (root / "latest").symlink_to("checkpoint-10")
    (root / "best").symlink_to("latest")  # a chain: best -> latest -> checkpoint-10
    out = cli_run(
        "prune", root, "--keep-last", "1", "--no-spike-check", "--apply", "--format", "json"
    ).json()
    keep = {e["name"]: e for e in out["keep"]}
    assert "best, latest" in keep["checkpoint-10"]["reasons"][0]
    assert (
        keep["self"]["reason_kinds"] == ["symlink"] and "outside" not in keep["self"]["reasons"][0]
    )
    assert any(
        "gone is a symlink to checkpoint-999, which does not exist" in n for n in out["notes"]
    )
    assert sorted(os.listdir(root)) == [
        "best",
        "checkpoint-10",
        "checkpoint-30",
        "gone",
        "latest",
        "self",
    ]


def test_the_callbacks_prune_honours_symlink_targets(hf_run, tmp_path):
    from checkpoint_strategy.callbacks import _retention

    root = _run(hf_run, tmp_path, (10, 20, 30, 40))
    (root / "best").symlink_to("checkpoint-10")
    report = _retention.prune(str(root), keep_last=1, milestones=[])
    assert sorted(e.name for e in report.delete if e.deleted) == ["checkpoint-20", "checkpoint-30"]
    assert (root / "checkpoint-10").is_dir() and (root / "best").resolve() == (
        root / "checkpoint-10"
    ).resolve()


def test_a_symlink_inside_a_kept_checkpoint_keeps_the_checkpoint_it_points_into(
    hf_run, tmp_path, cli_run
):
    # a deduplicated run: checkpoint-30's unchanged files are links into checkpoint-10 (a file, relative, and a
    # folder, absolute); the final export's model file is a link into checkpoint-20. Deleting 10 or 20 would
    # leave a kept checkpoint (or the export) with dangling files.
    root = _run(hf_run, tmp_path, (10, 20, 30, 40))
    (root / "checkpoint-30" / "training_args.bin").unlink()
    (root / "checkpoint-30" / "training_args.bin").symlink_to("../checkpoint-10/training_args.bin")
    (root / "checkpoint-10" / "extra").mkdir()
    (root / "checkpoint-30" / "extra").symlink_to(root / "checkpoint-10" / "extra")
    (root / "model.safetensors").symlink_to("checkpoint-20/model.safetensors")
    args = ("prune", root, "--keep-last", "2", "--no-spike-check", "--format", "json")
    dry = cli_run(*args).json()
    keep = {e["name"]: e for e in dry["keep"]}
    assert "link_target" in keep["checkpoint-10"]["reason_kinds"]
    assert "checkpoint-30/training_args.bin" in " ".join(keep["checkpoint-10"]["reasons"])
    assert "checkpoint-30/extra" in " ".join(keep["checkpoint-10"]["reasons"])
    assert "link_target" in keep["checkpoint-20"]["reason_kinds"]
    assert "model.safetensors" in " ".join(keep["checkpoint-20"]["reasons"])
    applied = cli_run(*args, "--apply").json()
    assert applied["deleted"] == 0 and sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "checkpoint-10",
        "checkpoint-20",
        "checkpoint-30",
        "checkpoint-40",
    ]
    assert cli_run("validate", root / "checkpoint-30").rc == 0
    # once the links are gone, the old checkpoints go as the keep rules say
    (root / "checkpoint-30" / "training_args.bin").unlink()
    shutil.copy(
        root / "checkpoint-10" / "training_args.bin", root / "checkpoint-30" / "training_args.bin"
    )
    (root / "checkpoint-30" / "extra").unlink()
    (root / "model.safetensors").unlink()
    again = cli_run(*args, "--apply").json()
    assert sorted(e["name"] for e in again["delete"] if e["deleted"]) == [
        "checkpoint-10",
        "checkpoint-20",
    ]


def test_a_link_out_of_root_or_to_its_own_checkpoint_protects_nothing(hf_run, tmp_path, cli_run):
    root = _run(hf_run, tmp_path, (10, 20, 30))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "checkpoint-30" / "notes").symlink_to(outside)
    (root / "checkpoint-20" / "self").symlink_to("../checkpoint-20/config.json")
    r = cli_run("prune", root, "--keep-last", "1", "--no-spike-check", "--format", "json").json()
    assert sorted(e["name"] for e in r["delete"]) == ["checkpoint-10", "checkpoint-20"]


# --------------------------------------------------------------------------- issue 29: never on an unchecked word


def test_a_newest_checkpoint_corrupt_past_its_headers_never_justifies_a_deletion(
    hf_run, tmp_path, cli_run
):
    root = _run(hf_run, tmp_path, (10, 20))
    member = flip_tensor_byte(root / "checkpoint-20" / "optimizer.pt")
    dry = cli_run("prune", root, "--keep-last", "1", "--no-spike-check")
    assert dry.rc == 0 and "--apply checks checkpoint-20 again at level full (CRC-32" in dry.out
    r = cli_run(
        "prune", root, "--keep-last", "1", "--no-spike-check", "--apply", "--format", "json"
    )
    assert r.rc == 1
    report = r.json()
    assert report["recheck_level"] == "full" and report["justifiers"] == ["checkpoint-20"]
    assert report["deleted"] == 0 and (root / "checkpoint-10").is_dir()
    (err,) = report["errors"]
    assert err["file"] == "checkpoint-20" and "CRC-32" in err["reason"] and member in err["reason"]
    assert "nothing deleted" in err["reason"]


def test_the_callbacks_prune_checks_the_justifier_at_level_full(hf_run, tmp_path):
    from checkpoint_strategy.callbacks import _retention

    root = _run(hf_run, tmp_path, (10, 20, 30))
    flip_tensor_byte(root / "checkpoint-30" / "optimizer.pt")
    report = _retention.prune(str(root), keep_last=1, milestones=[], level="quick")
    assert not any(e.deleted for e in report.delete)
    assert sorted(os.listdir(root)) == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    assert report.errors and "CRC-32" in report.errors[0].reason


@pytest.fixture
def ds_run(tmp_path):
    """DeepSpeed tags global_step5/10/15 (real torch.save archives) with `latest` naming global_step5."""
    root = layouts.build_deepspeed(tmp_path / "ds", steps=(5, 10, 15))
    (root / "latest").write_text("global_step5")
    return root


def test_deepspeed_latest_is_kept_and_newer_tags_are_in_flight(ds_run, cli_run):
    args = ("prune", ds_run, "--keep-last", "1", "--no-spike-check", "--format", "json")
    out = cli_run(*args, "--apply").json()
    keep = {e["name"]: e for e in out["keep"]}
    assert out["delete"] == [] and out["newest_valid"] == "global_step5"
    assert "latest" in keep["global_step5"]["reason_kinds"] and "DeepSpeed" in " ".join(
        keep["global_step5"]["reasons"]
    )
    for tag in ("global_step10", "global_step15"):
        assert keep[tag]["status"] == "valid" and keep[tag]["reason_kinds"] == ["in_flight"]
    (ds_run / "latest").write_text("global_step15")  # every rank finished: latest moves
    out = cli_run(*args, "--apply").json()
    assert sorted(e["name"] for e in out["delete"] if e["deleted"]) == [
        "global_step10",
        "global_step5",
    ]
    assert sorted(p.name for p in ds_run.iterdir() if p.name.startswith("global_step")) == [
        "global_step15"
    ]


def test_deepspeed_latest_naming_a_missing_tag_keeps_everything_newer(ds_run, cli_run):
    shutil.rmtree(ds_run / "global_step5")
    out = cli_run(
        "prune", ds_run, "--keep-last", "1", "--no-spike-check", "--format", "json"
    ).json()
    assert out["delete"] == [] and out["newest_valid"] is None
    assert any(
        "latest names global_step5, which is not in ROOT: resuming from latest fails" in n
        for n in out["notes"]
    )


def test_megatron_tracker_file_is_a_resume_pointer_too(tmp_path, cli_run):
    root = layouts.build_megatron(tmp_path / "mg", iterations=(500, 1000, 1500))
    (root / "latest_checkpointed_iteration.txt").write_text("1000")
    out = cli_run(
        "prune", root, "--keep-last", "1", "--no-spike-check", "--apply", "--format", "json"
    ).json()
    kinds = {e["name"]: e["reason_kinds"] for e in out["keep"]}
    assert kinds["iter_0001000"][0] == "latest" and kinds["iter_0001500"] == ["in_flight"]
    assert [e["name"] for e in out["delete"] if e["deleted"]] == ["iter_0000500"]


def test_a_stray_latest_file_in_an_hf_run_is_not_a_pointer(hf_run, tmp_path, cli_run):
    root = _run(hf_run, tmp_path, (10, 20, 30))
    (root / "latest").write_text("checkpoint-10")
    out = cli_run("prune", root, "--keep-last", "1", "--no-spike-check", "--format", "json").json()
    assert sorted(e["name"] for e in out["delete"]) == ["checkpoint-10", "checkpoint-20"]
    assert any("not a DeepSpeed checkpoint name; ignored" in n for n in out["notes"])


def test_a_log_that_vanishes_mid_prune_makes_prune_refuse(hf_run, tmp_path, cli_run, monkeypatch):
    import checkpoint_strategy.recovery as recovery

    root = _run(hf_run, tmp_path, (10, 20, 30))
    real = recovery.advise

    def vanishing(log, *a, **k):  # the log is deleted between prune finding it and reading it
        os.unlink(log)
        return real(log, *a, **k)

    monkeypatch.setattr(recovery, "advise", vanishing)
    cli_run("prune", root, "--keep-last", "1", "--apply").usage_error("disappeared")
    assert sorted(os.listdir(root)) == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]


# --------------------------------------------------------------------------- issue 27: what it frees


def test_nothing_to_free_proposes_the_smallest_keep_last_with_its_bytes(hf_run, tmp_path, cli_run):
    root = _run(hf_run, tmp_path, (10, 20, 30, 40, 50))
    r = cli_run("prune", root)
    assert r.rc == 0 and "0 to delete" in r.out
    report = cli_run("prune", root, "--format", "json").json()
    s = report["suggestion"]
    smaller = cli_run("prune", root, "--keep-last", str(s["keep_last"]), "--format", "json").json()
    assert s["keep_last"] == 1 and s["delete"] == [e["name"] for e in smaller["delete"]]
    assert s["bytes"] == smaller["bytes_to_free"] > 0
    assert f"To free space: --keep-last 1 would delete {len(s['delete'])}" in r.out
    assert (
        cli_run("prune", root, "--keep-last", "1").out.rsplit("frees ", 1)[1].strip().rstrip(".")
        in r.out
    )
    md = cli_run("prune", root, "--format", "markdown").out
    assert f"**To free space:** `--keep-last 1` would delete {len(s['delete'])}" in md


def test_the_suggestion_keeps_every_rollback_point(hf_run, tmp_path, cli_run):
    root = _run(hf_run, tmp_path, range(100, 210, 10))  # the spike at step 121 has not recovered
    report = cli_run("prune", root, "--keep-last", "11", "--format", "json").json()
    s = report["suggestion"]
    guard = report["spike_guard"]
    assert (
        guard["protected"]
        and guard["protected"] in s["rollback_points"]
        and guard["protected"] not in s["delete"]
    )
    smaller = cli_run("prune", root, "--keep-last", str(s["keep_last"]), "--format", "json").json()
    assert (
        guard["protected"] in {e["name"] for e in smaller["keep"]}
        and s["bytes"] == smaller["bytes_to_free"]
    )


def test_apply_reports_the_bytes_the_dry_run_promised_in_the_same_units(hf_run, tmp_path, cli_run):
    root = _run(hf_run, tmp_path, (10, 20, 30, 40))
    args = ("prune", root, "--keep-last", "1", "--no-spike-check")
    dry, dry_text = cli_run(*args, "--format", "json").json(), cli_run(*args).out
    applied = cli_run(*args, "--apply", "--format", "json").json()
    assert applied["freed_bytes"] == dry["bytes_to_free"] > 0
    assert {e["name"]: e["bytes"] for e in applied["delete"]} == {
        e["name"]: e["bytes"] for e in dry["delete"]
    }
    shown = dry_text.rsplit("frees ", 1)[1].strip().rstrip(".")
    again = _run(hf_run, tmp_path, (10, 20, 30, 40), "again")
    text = cli_run("prune", again, "--keep-last", "1", "--no-spike-check", "--apply").out
    assert f"({shown} freed)" in text and " 0 B]" not in text, text
    md = cli_run(
        "prune",
        _run(hf_run, tmp_path, (10, 20, 30, 40), "md"),
        "--keep-last",
        "1",
        "--no-spike-check",
        "--apply",
        "--format",
        "markdown",
    ).out
    assert (
        f"3 deleted ({shown} freed)" in md
        and "Checked again right before deleting, at level full" in md
    )
