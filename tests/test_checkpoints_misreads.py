"""Misreads of real framework checkpoints (issue 26 "Validation", issue 29 deep items), each on a save the real
framework wrote on CPU: DeepSpeed ZeRO-2 and its ds_to_universal conversion, Lightning, torch DCP and torchtitan's
layout, Orbax with a todelete_subdir.

Damage is done the way it happens: a flipped byte on disk (CRC-32 no longer matches), or a value the training
saved (torch.save of a changed state: the archive is consistent, only the number is impossible).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import realruns

from checkpoint_strategy.validate import validate_checkpoint, validate_paths

torch = pytest.importorskip("torch")
LEVELS = ("quick", "full", "deep")


def _problems(result) -> list[tuple[str, str, str]]:
    return [(p.file, p.reason, p.kind) for p in result.problems]


def _flip_data_byte(path: Path, entry_suffix: str = "") -> str:
    """Flip the lowest bit of the first byte of the largest data entry (a float stays finite): returns the entry."""
    blob = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = max(
            (
                i
                for i in zf.infolist()
                if "/data/" in i.filename and i.filename.endswith(entry_suffix)
            ),
            key=lambda i: i.file_size,
        )
    nlen, xlen = struct.unpack("<HH", blob[info.header_offset + 26 : info.header_offset + 30])
    blob[info.header_offset + 30 + nlen + xlen] ^= 0x01
    path.write_bytes(bytes(blob))
    return info.filename


# --------------------------------------------------------------------------- 1. deep includes full


def test_deep_sees_every_byte_flip_full_sees(deepspeed_zero2_run, lightning_run, copy_of):
    step = copy_of(deepspeed_zero2_run / "global_step6")
    optim = step / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    entry = _flip_data_byte(optim)
    ckpt = copy_of(lightning_run.ckpt_files[-1])
    pl_entry = _flip_data_byte(ckpt)
    for path, name, e in ((step, optim.name, entry), (ckpt, ckpt.name, pl_entry)):
        assert validate_checkpoint(path, level="quick").status == "valid"  # headers are intact
        for level in ("full", "deep"):
            r = validate_checkpoint(path, level=level)
            assert r.status == "invalid", (level, _problems(r))
            assert [(f, k) for f, _r, k in _problems(r)] == [(name, "invalid")]
            assert f"entry '{e}': CRC-32 mismatch" in r.problems[0].reason


def test_deep_reads_every_safetensors_byte_once(safetensors_file):
    """Full's pass over a safetensors file is reading every byte (no checksum in the format); deep's value scan
    reads them all (the int64 tensor read through, not reduced), so it does not read the file twice."""
    size = safetensors_file.stat().st_size
    (hlen,) = struct.unpack("<Q", safetensors_file.read_bytes()[:8])
    deep = validate_checkpoint(safetensors_file, level="deep")
    full = validate_checkpoint(safetensors_file, level="full")
    assert deep.deep.bytes_scanned == size - 8 - hlen
    assert size <= deep.bytes_read < full.bytes_read + 8 + hlen < 2 * size


# --------------------------------------------------------------------------- 2. ZeRO-2 optimizer shards


def test_zero2_save_is_resumable_at_deep(deepspeed_zero2_run):
    for tag in ("global_step3", "global_step6"):
        r = validate_checkpoint(deepspeed_zero2_run / tag, level="deep")
        assert r.status == "valid" and r.resumable and r.passes_deep(), _problems(r)
        assert r.deep.optimizer.kind == "adam" and not any(
            "not resumable" in p.reason for p in r.problems
        )
        assert (
            r.deep.nonfinite_values == 0 and r.deep.float_tensors >= 5
        )  # weights, fp32 partition, moments, step


def test_last_valid_checkpoint_at_deep_picks_the_resumable_zero2_save(
    deepspeed_zero2_run, tmp_path
):
    from checkpoint_strategy.callbacks.resume import last_valid_checkpoint

    root = tmp_path / "ds"
    root.mkdir()
    for name in ("global_step3", "global_step6", "latest"):
        src = deepspeed_zero2_run / name
        shutil.copytree(src, root / name) if src.is_dir() else shutil.copy2(src, root / name)
    assert last_valid_checkpoint(root, level="deep", spike_check=False) == str(
        root / "global_step6"
    )
    # the newest saved an impossible second moment (torch.save of the changed state: a consistent archive)
    optim = root / "global_step6" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    state = torch.load(optim, weights_only=False)
    base = state["optimizer_state_dict"]["base_optimizer_state"]["state"][0]
    base["exp_avg_sq"][7] = -0.25
    torch.save(state, optim)
    r = validate_checkpoint(root / "global_step6", level="deep")
    name = "optimizer_state_dict.base_optimizer_state.state.0.exp_avg_sq"
    assert r.status == "invalid" and any(
        f == optim.name and k == "invalid" and f"1 negative values in {name}" in why
        for f, why, k in _problems(r)
    ), _problems(r)
    assert (
        validate_checkpoint(root / "global_step6", level="full").status == "valid"
    )  # bytes are consistent
    picked = last_valid_checkpoint(root, level="deep", spike_check=False)
    assert (
        picked == str(root / "global_step3") and validate_checkpoint(picked, level="deep").resumable
    )


def test_latest_adds_only_a_missing_target(deepspeed_zero2_run, tmp_path):
    """`latest` names global_step6: validating global_step3 alone checks global_step3 only, two siblings are
    listed once each, and a `latest` naming a folder that is gone is still reported incomplete."""
    one = validate_paths([str(deepspeed_zero2_run / "global_step3")])
    assert [os.path.basename(c.path) for c in one.checkpoints] == ["global_step3"]
    both = validate_paths(
        [str(deepspeed_zero2_run / "global_step3"), str(deepspeed_zero2_run / "global_step6")]
    )
    assert sorted(os.path.basename(c.path) for c in both.checkpoints) == [
        "global_step3",
        "global_step6",
    ]
    root = tmp_path / "ds"
    root.mkdir()
    shutil.copytree(deepspeed_zero2_run / "global_step3", root / "global_step3")
    shutil.copy2(deepspeed_zero2_run / "latest", root / "latest")
    gone = validate_paths([str(root / "global_step3")])
    assert [(os.path.basename(c.path), c.status) for c in gone.checkpoints] == [
        ("global_step3", "valid"),
        ("global_step6", "incomplete"),
    ]


# --------------------------------------------------------------------------- 3. DeepSpeed universal checkpoint


def test_universal_checkpoint_is_one_whole_checkpoint(deepspeed_zero2_run):
    uni = deepspeed_zero2_run / "global_step6_universal"
    assert (deepspeed_zero2_run / "latest_universal").read_text().strip() == uni.name
    params = sorted(p.name for p in (uni / "zero").iterdir() if p.is_dir())
    assert params == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for level in LEVELS:
        report = validate_paths([str(deepspeed_zero2_run)], level=level)
        assert sorted(os.path.basename(c.path) for c in report.checkpoints) == [
            "global_step3",
            "global_step6",
            "global_step6_universal",
        ], level
        r = next(c for c in report.checkpoints if c.path.endswith("_universal"))
        assert (r.format, r.step, r.status, r.resumable, r.sharded) == (
            "deepspeed",
            6,
            "valid",
            True,
            False,
        ), (level, _problems(r))
        assert "universal" in r.portability and r.files_checked >= 2 + 4 * len(params)
    deep = validate_checkpoint(uni, level="deep")
    opt = deep.deep.optimizer
    assert deep.passes_deep() and (opt.kind, opt.parameters, opt.with_moments, opt.step) == (
        "adam",
        4,
        4,
        6,
    )
    fp32 = {
        p: torch.load(uni / "zero" / p / "fp32.pt", weights_only=False)["param"] for p in params
    }
    module = torch.load(uni / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    norm = math.sqrt(sum(float((t.double() ** 2).sum()) for t in module.values()))
    assert deep.deep.weights_norm == pytest.approx(norm, rel=1e-6)
    assert {p: tuple(t.shape) for p, t in fp32.items()} == {
        p: tuple(t.shape) for p, t in module.items()
    }


@pytest.mark.parametrize(
    "damage", ["truncated-fp32", "missing-exp_avg", "missing-param", "latest-universal"]
)
def test_universal_checkpoint_damage_is_seen_at_every_level(deepspeed_zero2_run, tmp_path, damage):
    root = tmp_path / "ds"
    shutil.copytree(deepspeed_zero2_run, root)
    uni = root / "global_step6_universal"
    expect: tuple[str, str]
    if damage == "truncated-fp32":
        f = uni / "zero" / "0.weight" / "fp32.pt"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        expect = ("zero/0.weight/fp32.pt", "invalid")
    elif damage == "missing-exp_avg":
        os.remove(uni / "zero" / "2.bias" / "exp_avg.pt")
        expect = ("zero/2.bias/exp_avg.pt", "incomplete")
    elif damage == "missing-param":
        shutil.rmtree(uni / "zero" / "2.weight")
        expect = ("zero/2.weight/fp32.pt", "incomplete")
    else:
        shutil.rmtree(uni)  # latest_universal still names it
        expect = (".", "incomplete")
    for level in LEVELS:
        report = validate_paths([str(root)], level=level)
        r = next(c for c in report.checkpoints if c.path.endswith("_universal"))
        assert r.status == expect[1], (level, _problems(r))
        assert expect[0] in [p.file for p in r.problems] or damage == "latest-universal", (
            level,
            _problems(r),
        )
        assert all(
            c.status == "valid" for c in report.checkpoints if not c.path.endswith("_universal")
        )


def test_universal_checkpoint_hostile_folders(deepspeed_zero2_run, tmp_path):
    """A parameter folder linked to outside is not read; a FIFO for fp32.pt is named; an extra folder with a
    newline and a '|' in its name is a note that cannot forge a report line."""
    from checkpoint_strategy.render import render

    uni = tmp_path / "global_step6_universal"
    shutil.copytree(deepspeed_zero2_run / "global_step6_universal", uni)
    outside = tmp_path / "outside"
    shutil.copytree(uni / "zero" / "0.bias", outside)
    (uni / "zero" / "evil").symlink_to(outside)
    shutil.copytree(uni / "zero" / "0.bias", uni / "zero" / "new\nline|x")
    os.remove(uni / "zero" / "2.bias" / "fp32.pt")
    os.mkfifo(uni / "zero" / "2.bias" / "fp32.pt")
    for level in LEVELS:
        r = validate_checkpoint(uni, level=level)
        assert r.status == "invalid"
        assert [p.file for p in r.problems] == ["zero/evil", "zero/2.bias/fp32.pt"], (
            level,
            _problems(r),
        )
        assert "outside the checkpoint" in r.problems[0].reason and "FIFO" in r.problems[1].reason
        assert r.files_checked < 30 and any("do not list" in n for n in r.notes)
    text = render(validate_paths([str(uni)]), "text")
    assert not any(line.startswith("line|x") for line in text.splitlines())


def test_universal_checkpoint_negative_second_moment_is_named(deepspeed_zero2_run, tmp_path):
    uni = tmp_path / "global_step6_universal"
    shutil.copytree(deepspeed_zero2_run / "global_step6_universal", uni)
    f = uni / "zero" / "0.weight" / "exp_avg_sq.pt"
    state = torch.load(f, weights_only=False)
    state["param"][3, 4] = -1e-3
    torch.save(state, f)
    r = validate_checkpoint(uni, level="deep")
    assert r.status == "invalid"
    assert [(p.file, p.kind) for p in r.problems] == [("zero/0.weight/exp_avg_sq.pt", "invalid")]
    assert "1 negative values in 0.weight.exp_avg_sq" in r.problems[0].reason
    assert validate_checkpoint(uni, level="full").status == "valid"


# --------------------------------------------------------------------------- 4. Orbax soft-deleted steps


def test_orbax_soft_deleted_steps_are_not_listed(tmp_path, cli_run):
    ocp = pytest.importorskip("orbax.checkpoint", reason="Orbax is in the frameworks extra")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=2, todelete_subdir="trash", enable_async_checkpointing=False
    )
    run = realruns.run_orbax_with_options(tmp_path, options, 5)
    assert run.kept == [4, 5] and sorted(p.name for p in (run.folder / "trash").iterdir()) == [
        "1",
        "2",
        "3",
    ]
    for level in LEVELS:
        report = validate_paths([str(run.folder)], level=level)
        assert [c.step for c in report.checkpoints] == run.kept, level
        assert len(report.notes) == 1 and report.notes[0].startswith(
            "trash/: 3 Orbax steps (1, 2, 3)"
        )
    out = cli_run("validate", str(run.folder))
    assert out.rc == 0 and "Note: trash/: 3 Orbax steps" in out.out and "trash/1" not in out.out
    plan = cli_run("prune", str(run.folder), "--keep-last", "1", "--format", "json").json()
    assert "trash/1" not in json.dumps(plan)
    # the folder itself, named on the command line, is still checked
    assert [c.step for c in validate_paths([str(run.folder / "trash")]).checkpoints] == [1, 2, 3]


# --------------------------------------------------------------------------- 5. torch DCP vs torchtitan


def test_plain_loop_dcp_in_a_step_folder_is_dcp_not_torchtitan(dcp_checkpoint, torchtitan_layout):
    assert dcp_checkpoint.name == "step-100"  # a plain training loop's dcp.save into step-N
    for level in LEVELS:
        r = validate_checkpoint(dcp_checkpoint, level=level)
        assert (r.format, r.status, r.resumable) == ("dcp", "valid", True), level
        assert not any("torchtitan" in n for n in r.notes)
    by_step = {c.step: c for c in validate_paths([str(torchtitan_layout)]).checkpoints}
    assert (
        by_step[10].format == by_step[20].format == "torchtitan"
    )  # train_state beside a flattened model
    assert any("last_save_model_only" in n for n in by_step[20].notes)
    # a lone model-only step-N (no torchtitan step beside it) is a plain DCP save of weights
    alone = validate_checkpoint(torchtitan_layout / "step-20")
    assert alone.format == "torchtitan"
    lone_root = Path(str(dcp_checkpoint)).parent
    assert [c.format for c in validate_paths([str(lone_root)]).checkpoints] == ["dcp"]


def test_fsdp2_plain_loop_save_is_dcp(fsdp2_run):
    for level in LEVELS:
        report = validate_paths([str(fsdp2_run)], level=level)
        assert [
            (c.step, c.format, c.status, c.resumable, c.sharded) for c in report.checkpoints
        ] == [(2, "dcp", "valid", True, True), (4, "dcp", "valid", True, True)], level
    r = validate_checkpoint(fsdp2_run / "step-4", level="deep")
    assert r.passes_deep() and r.deep.optimizer.with_moments == r.deep.optimizer.parameters == 4
    assert sorted(p.name for p in (fsdp2_run / "step-4").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]


# --------------------------------------------------------------------------- 6. Lightning last.ckpt


def test_lightning_last_ckpt_step_comes_from_its_content(tmp_path, cli_run):
    from pytorch_lightning.callbacks import ModelCheckpoint

    def callbacks(folder):
        return [
            ModelCheckpoint(dirpath=folder, every_n_train_steps=10, save_top_k=-1),
            ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=0, save_last=True),
        ]

    run = realruns.run_lightning_with_callbacks(tmp_path, callbacks, 25)
    assert run.names == ["epoch=0-step=10.ckpt", "epoch=0-step=20.ckpt", "last.ckpt"]
    saved = torch.load(run.folder / "last.ckpt", weights_only=False)["global_step"]
    assert saved == 25
    report = validate_paths([str(run.folder)])
    assert {os.path.basename(c.path): c.step for c in report.checkpoints}["last.ckpt"] == saved
    out = cli_run("validate", str(run.folder), "--format", "json").json()
    assert out["safety"][0]["newest_safe_step"] == 25 and out["safety"][0]["newest_safe"].endswith(
        "last.ckpt"
    )
    # the callbacks' resume helper and their "previous checkpoint" order by the same content step, even when
    # last.ckpt is the oldest file by time
    from checkpoint_strategy.callbacks import _retention, last_valid_checkpoint

    os.utime(run.folder / "last.ckpt", (1, 1))
    assert [
        (s, os.path.basename(p)) for s, p in _retention.checkpoints_newest_first(str(run.folder))
    ] == [(25, "last.ckpt"), (20, "epoch=0-step=20.ckpt"), (10, "epoch=0-step=10.ckpt")]
    assert last_valid_checkpoint(str(run.folder)) == str(run.folder / "last.ckpt")
    (run.folder / "last.ckpt").write_bytes(b"torn")  # unreadable: ordered last, never picked
    assert _retention.checkpoints_newest_first(str(run.folder))[-1] == (
        None,
        str(run.folder / "last.ckpt"),
    )
    assert last_valid_checkpoint(str(run.folder)) == str(run.folder / "epoch=0-step=20.ckpt")


# --------------------------------------------------------------------------- 7. what each level cannot see


def _flip_in_dcp_data(folder: Path) -> None:
    shard = next(p for p in folder.iterdir() if p.suffix == ".distcp")
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    shard.write_bytes(bytes(blob))


def test_dcp_and_orbax_data_flips_are_said_unseen_and_the_manifest_sees_them(
    dcp_checkpoint, copy_of, tmp_path, cli_run
):
    from checkpoint_strategy.formats.manifest import (
        verify_checkpoint_manifest,
        write_checkpoint_manifest,
    )

    ocp = pytest.importorskip("orbax.checkpoint", reason="Orbax is in the frameworks extra")
    dcp = copy_of(dcp_checkpoint)
    orbax = (
        realruns.run_orbax_with_options(
            tmp_path / "o", ocp.CheckpointManagerOptions(enable_async_checkpointing=False), 1
        ).folder
        / "1"
    )
    for ckpt in (dcp, orbax):
        assert write_checkpoint_manifest(ckpt) == str(ckpt / "integrity.json")
    _flip_in_dcp_data(dcp)
    chunk = max(
        (p for p in (orbax / "default").rglob("*") if p.is_file() and p.parent.name == "d"),
        key=lambda p: p.stat().st_size,
    )
    blob = bytearray(chunk.read_bytes())
    blob[-5] ^= 0x01
    chunk.write_bytes(bytes(blob))
    for ckpt, family in ((dcp, "DCP shard data"), (orbax, "Orbax/tensorstore array data")):
        for level in LEVELS:
            report = validate_paths([str(ckpt)], level=level)
            line = next(b for b in report.blind_spots if b.startswith(family))
            if (
                level != "quick"
            ):  # each .distcp item is a torch archive (CRC-32); the small arrays of this Orbax
                assert report.checkpoints[0].status == "invalid", (
                    level
                )  # save live in OCDBT nodes (CRC-32C)
                assert ("raw bytes" in line or "outside" in line) and "--manifest verify" in line
                continue
            assert report.checkpoints[0].status == "valid", (ckpt, level)  # the blind spot itself
            assert (
                "not seen" in line and "--manifest verify" in line
            ) or "--level full checks the CRC-32" in line
        assert verify_checkpoint_manifest(ckpt) != []
        verified = validate_paths([str(ckpt)], manifest="verify")
        assert verified.checkpoints[0].status == "invalid" and verified.blind_spots == []
    text = cli_run("validate", str(dcp), "--level", "full").out
    assert (
        "Not seen at level full:" in text
        and "DCP shard data (.distcp): items stored as raw bytes" in text
    )


def test_zip_formats_have_no_blind_spot_at_full(lightning_run):
    assert validate_paths([str(lightning_run.ckpt_dir)], level="full").blind_spots == []
    quick = validate_paths([str(lightning_run.ckpt_dir)]).blind_spots
    assert len(quick) == 1 and "--level full checks the CRC-32" in quick[0]


# --------------------------------------------------------------------------- 8, 9. impossible optimizer state


def _lightning_saved(src: Path, dest: Path, change) -> Path:
    """A copy of a real Lightning checkpoint whose state the training changed before torch.save (consistent)."""
    ckpt = torch.load(src, weights_only=False)
    change(ckpt["optimizer_states"][0]["state"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, dest)
    return dest


@pytest.mark.parametrize(
    "value,why",
    [(-3.0, "-3 is negative"), (2.5, "2.5 is not a whole number"), (float("nan"), "NaN")],
)
def test_impossible_step_is_a_finding_named_by_tensor(lightning_run, tmp_path, value, why):
    src = lightning_run.ckpt_files[-1]
    path = _lightning_saved(
        src, tmp_path / src.name, lambda st: st[0].__setitem__("step", torch.tensor(value))
    )
    r = validate_checkpoint(path, level="deep")
    assert r.status == "invalid" and validate_checkpoint(path, level="full").status == "valid"
    reasons = [p.reason for p in r.problems if p.kind == "invalid"]
    assert any("optimizer_states.0.state.0.step" in x and why in x for x in reasons), reasons
    assert r.deep.optimizer.step == 30  # the other parameter's step is still read


def test_negative_second_moment_named_in_lightning_and_dcp(lightning_run, dcp_checkpoint, tmp_path):
    src = lightning_run.ckpt_files[-1]

    def negate(st):
        st[1]["exp_avg_sq"][0] = -2.0

    r = validate_checkpoint(_lightning_saved(src, tmp_path / src.name, negate), level="deep")
    assert (
        "epoch=0-step=30.ckpt",
        "invalid: 1 negative values in optimizer_states.0.state.1.exp_avg_sq (a second "
        "moment is a mean of squares: never negative; the next Adam step takes its square root)",
        "invalid",
    ) in _problems(r)
    import torch.distributed.checkpoint as dcp

    # the plain loop's model and optimizer (realruns.build_dcp_checkpoint), loaded from its save, one moment changed
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    dcp.load(state, checkpoint_id=str(dcp_checkpoint))
    state["optimizer"]["state"][2]["exp_avg_sq"][0, 0] = -1.0
    out = tmp_path / "dcp" / "step-100"
    dcp.save(state, checkpoint_id=str(out))
    r = validate_checkpoint(out, level="deep")
    assert r.status == "invalid"
    assert any(
        k == "invalid" and "1 negative values in optimizer.state.2.exp_avg_sq" in why
        for _f, why, k in _problems(r)
    ), _problems(r)


def test_nan_step_never_exit_3_in_any_command(lightning_run, tmp_path, cli_run):
    root = tmp_path / "ckpts"
    root.mkdir()
    for src in lightning_run.ckpt_files[:-1]:
        shutil.copy2(src, root / src.name)
    newest = lightning_run.ckpt_files[-1]
    _lightning_saved(
        newest,
        root / newest.name,
        lambda st: [s.__setitem__("step", torch.tensor(float("nan"))) for s in st.values()],
    )
    v = cli_run("validate", str(root), "--level", "deep", "--format", "json")
    assert v.rc == 1 and not v.err
    bad = next(c for c in v.json()["checkpoints"] if c["path"].endswith(newest.name))
    assert bad["status"] == "invalid" and bad["deep"]["optimizer"]["step"] is None
    g = cli_run("release-gate", str(root / newest.name), "--level", "deep", "--no-spike-check")
    assert g.rc == 1 and "internal error" not in g.err
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 31)))
    rec = cli_run(
        "recover", str(log), "--checkpoints", str(root), "--level", "deep", "--format", "json"
    )
    assert rec.rc in (0, 1) and "internal error" not in rec.err, rec.err
    assert newest.name in json.dumps(rec.json())  # named as skipped, not crashed on
    pr = cli_run(
        "prune",
        str(root),
        "--keep-last",
        "1",
        "--level",
        "deep",
        "--no-spike-check",
        "--format",
        "json",
    )
    assert pr.rc in (0, 1) and "internal error" not in pr.err, pr.err
    assert all(c.exists() for c in root.iterdir())  # a dry run
    kept = json.dumps(pr.json())
    assert "epoch=0-step=20.ckpt" in kept


def test_step_problem_wording():
    from checkpoint_strategy.validate.deep import optimizer_step, step_problem

    assert [step_problem(v) for v in (0.0, 7.0, -1.0, 0.5, float("nan"), float("inf"))] == [
        None,
        None,
        "-1 is negative",
        "0.5 is not a whole number",
        "is NaN",
        "is inf",
    ]
    assert (
        optimizer_step([3.0, float("nan"), 5.0, -2.0]) == 5
        and optimizer_step([float("nan")]) is None
    )
