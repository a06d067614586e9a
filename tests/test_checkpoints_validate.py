"""validate: real checkpoints (0 false positives), documented layouts, the corruption matrix,
manifests, bad input and the CLI contract."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import layouts
import pytest
from cliresult import CLI, checkout_env

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.validate import validate_checkpoint, validate_paths


@pytest.fixture(scope="module")
def layout_roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("layouts")
    return {
        "orbax": layouts.build_orbax(base / "orbax"),
        "deepspeed": layouts.build_deepspeed(base / "ds"),
        "megatron": layouts.build_megatron(base / "meg", tp=2),
        "nemo": layouts.build_nemo(base / "nemo"),
        "torchtitan": layouts.build_torchtitan(base / "tt"),
    }


def _statuses(report) -> dict[str, str]:
    return {c.path: c.status for c in report.checkpoints}


# ----------------------------------------------------------------------------- real checkpoints


def test_every_real_checkpoint_validates_quick_and_full(
    hf_run, lightning_run, dcp_checkpoint, safetensors_file
):
    paths = [
        str(hf_run.output_dir),
        str(lightning_run.ckpt_dir),
        str(dcp_checkpoint),
        str(safetensors_file),
    ]
    for level in ("quick", "full"):
        report = validate_paths(paths, level=level, progress=False)
        bad = [(c.path, c.problems) for c in report.checkpoints if c.status != "valid"]
        assert bad == [], bad
        assert (
            report.summary.checkpoints
            == len(hf_run.checkpoint_steps) + len(lightning_run.ckpt_files) + 2
        )


def test_accelerate_fsdp_sharded_state_is_said_to_reshard_on_load(hf_run, dcp_sharded, tmp_path):
    """An HF Trainer checkpoint of an accelerate FSDP run with SHARDED_STATE_DICT: pytorch_model_fsdp_0/ and
    optimizer_0/ are torch.distributed.checkpoint folders (accelerate.utils.fsdp_utils.save_fsdp_model writes
    them with dist_cp.save, load_fsdp_model reads them with dist_cp.load at any world size). Built from the real
    trainer checkpoint with its weights and optimizer replaced by real DCP folders (4 shards, as 4 ranks write):
    the advice says it re-shards on load, not that it is tied to its hardware."""
    ckpt = shutil.copytree(hf_run.output_dir / "checkpoint-110", tmp_path / "checkpoint-110")
    for name in ("model.safetensors", "optimizer.pt"):
        (ckpt / name).unlink()
    shutil.copytree(dcp_sharded, ckpt / "pytorch_model_fsdp_0")
    shutil.copytree(dcp_sharded, ckpt / "optimizer_0")
    r = validate_checkpoint(ckpt, level="full")
    assert (r.format, r.status, r.step, r.sharded, r.resumable) == (
        "hf-trainer",
        "valid",
        110,
        True,
        True,
    ), r.problems
    assert (
        "re-shards to the new world size" in r.portability
        and "needs no conversion" in r.portability
    )
    assert "hardware-specific" not in r.portability
    # the single-file copy is still named, for publishing
    assert "convert DIR/pytorch_model_fsdp_0 OUT.pt --to full" in r.portability


def test_real_checkpoint_properties(hf_run, lightning_run, dcp_checkpoint, safetensors_file):
    hf = validate_checkpoint(hf_run.output_dir / "checkpoint-200")
    assert (hf.format, hf.step, hf.status, hf.resumable, hf.sharded) == (
        "hf-trainer",
        200,
        "valid",
        True,
        False,
    )
    assert "any hardware" in hf.portability
    pl = validate_checkpoint(lightning_run.ckpt_files[-1])
    assert (pl.format, pl.step, pl.resumable, pl.sharded) == ("lightning", 30, True, False)
    d = validate_checkpoint(dcp_checkpoint)
    assert (d.step, d.resumable, d.sharded) == (100, True, True)
    assert "dcp_to_torch" in d.portability
    st = validate_checkpoint(safetensors_file)
    assert (st.format, st.resumable, st.sharded) == ("safetensors", False, False)


def test_full_level_reads_every_byte_quick_reads_headers(hf_run):
    ckpt = hf_run.output_dir / "checkpoint-100"
    total = sum(p.stat().st_size for p in ckpt.iterdir())
    quick = validate_checkpoint(ckpt, level="quick")
    full = validate_checkpoint(ckpt, level="full")
    assert (
        full.bytes_read
        >= 0.95 * (ckpt / "model.safetensors").stat().st_size
        + (ckpt / "optimizer.pt").stat().st_size
    )
    assert quick.bytes_read < full.bytes_read and full.bytes_read <= 2 * total


def _long_run_state(path: Path, entries: int, best: str | None = None) -> None:
    """A trainer_state.json of a long run: `entries` log_history records (about 100 bytes each), written once."""
    state = json.loads(path.read_text())
    state["best_model_checkpoint"] = best
    head, _sep, tail = json.dumps(state).partition('"log_history": [')
    lines = ",".join(
        f'{{"epoch": {i / 4096:.6f}, "grad_norm": 0.958928346633911, "learning_rate": 0.0003, '
        f'"loss": {1 + (i % 997) / 1000:.6f}, "step": {i}}}'
        for i in range(1, entries + 1)
    )
    with open(path, "w") as fh:
        fh.write(head + '"log_history": [' + lines + "], " + tail.partition("], ")[2])


def test_trainer_state_larger_than_64_mb_is_valid(hf_run, copy_of):
    """An 800k-entry log_history (a long run) is a healthy checkpoint, not "larger than 64 MB" (issue 13)."""
    from checkpoint_strategy.retention.prune import prune

    root = copy_of(hf_run.output_dir, "run")
    state = root / "checkpoint-200" / "trainer_state.json"
    _long_run_state(state, 800_000, best="run/checkpoint-70")
    assert state.stat().st_size > 64 << 20 and json.loads(state.read_text())["global_step"] == 200
    r = validate_checkpoint(root / "checkpoint-200")
    assert (r.status, r.step, r.problems) == ("valid", 200, [])
    report = prune(root, keep_last=1, spike_check=False)  # its best_model_checkpoint is read too
    assert report.newest_valid == "checkpoint-200" and report.best_checkpoint == "checkpoint-70"


def test_documented_layouts_validate(layout_roots):
    for name, root in layout_roots.items():
        report = validate_paths([str(root)], progress=False)
        assert report.checkpoints, name
        assert all(c.status == "valid" for c in report.checkpoints), (
            name,
            [c.problems for c in report.checkpoints],
        )
    ds = validate_paths([str(layout_roots["deepspeed"])]).checkpoints[-1]
    assert (ds.format, ds.step, ds.resumable, ds.sharded) == ("deepspeed", 20, True, True)
    assert "zero_to_fp32" in ds.portability
    meg = validate_paths([str(layout_roots["megatron"])]).checkpoints[-1]
    assert (meg.format, meg.step, meg.resumable, meg.sharded) == ("megatron", 1000, True, True)
    tt = validate_paths([str(layout_roots["torchtitan"])]).checkpoints
    assert [c.format for c in tt] == ["torchtitan", "torchtitan"]


def test_python_api_after_a_save(hf_run, tmp_path):
    result = validate_checkpoint(str(hf_run.output_dir / "checkpoint-10"), level="quick")
    assert result.status == "valid" and result.problems == []
    data = result.model_dump()
    for key in (
        "path",
        "format",
        "step",
        "status",
        "resumable",
        "sharded",
        "problems",
        "portability",
    ):
        assert key in data


# ----------------------------------------------------------------------------- corruption matrix


def _truncate(p: Path) -> None:
    size = p.stat().st_size
    with open(p, "r+b") as fh:
        fh.truncate(max(1, size // 2))


def _zero(p: Path) -> None:
    p.write_bytes(b"")


def _flip(offset):
    def op(p: Path) -> None:
        data = bytearray(p.read_bytes())
        i = offset(len(data), data)
        data[i] ^= 0xFF
        p.write_bytes(bytes(data))

    return op


def _missing(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p)
    else:
        p.unlink()


def _broken_header(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[:8] = b"\xde\xad\xbe\xef\xde\xad\xbe\xef"
    p.write_bytes(bytes(data))


def _st_data_offset(n, data):
    hlen = int.from_bytes(data[:8], "little")
    return 8 + hlen + (n - 8 - hlen) // 2


def _st_header_offset(n, data):
    return 8 + data[8:].index(b'"data_offsets"') + 16  # inside the first offsets list


def _zip_data_offset(n, data):
    import io
    import zipfile

    zf = zipfile.ZipFile(io.BytesIO(bytes(data)))
    info = max(zf.infolist(), key=lambda i: i.compress_size)
    import struct

    nlen, xlen = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    return info.header_offset + 30 + nlen + xlen + info.compress_size // 2


def _zip_cd_offset(n, data):
    return data.rindex(b"PK\x01\x02") + 20  # compressed size field of the last central entry


# (case id, source, checkpoint relative to the copied root, target relative to the root, op, level)
MATRIX = [
    # Hugging Face Trainer
    (
        "hf-truncated-safetensors",
        "hf",
        "checkpoint-20",
        "checkpoint-20/model.safetensors",
        _truncate,
        "quick",
    ),
    (
        "hf-truncated-optimizer",
        "hf",
        "checkpoint-20",
        "checkpoint-20/optimizer.pt",
        _truncate,
        "quick",
    ),
    (
        "hf-zero-safetensors",
        "hf",
        "checkpoint-20",
        "checkpoint-20/model.safetensors",
        _zero,
        "quick",
    ),
    ("hf-zero-scheduler", "hf", "checkpoint-20", "checkpoint-20/scheduler.pt", _zero, "quick"),
    (
        "hf-missing-weights",
        "hf",
        "checkpoint-20",
        "checkpoint-20/model.safetensors",
        _missing,
        "quick",
    ),
    (
        "hf-missing-trainer-state",
        "hf",
        "checkpoint-20",
        "checkpoint-20/trainer_state.json",
        _missing,
        "quick",
    ),
    (
        "hf-broken-st-header",
        "hf",
        "checkpoint-20",
        "checkpoint-20/model.safetensors",
        _broken_header,
        "quick",
    ),
    (
        "hf-flip-st-header",
        "hf",
        "checkpoint-20",
        "checkpoint-20/model.safetensors",
        _flip(_st_header_offset),
        "quick",
    ),
    (
        "hf-flip-zip-cd",
        "hf",
        "checkpoint-20",
        "checkpoint-20/optimizer.pt",
        _flip(_zip_cd_offset),
        "quick",
    ),
    (
        "hf-flip-zip-data",
        "hf",
        "checkpoint-20",
        "checkpoint-20/optimizer.pt",
        _flip(_zip_data_offset),
        "full",
    ),
    (
        "hf-flip-st-data",
        "hf",
        "checkpoint-20",
        "checkpoint-20/model.safetensors",
        _flip(_st_data_offset),
        "manifest",
    ),
    (
        "hf-broken-trainer-state",
        "hf",
        "checkpoint-20",
        "checkpoint-20/trainer_state.json",
        _broken_header,
        "quick",
    ),
    # Lightning
    ("pl-truncated", "pl", "epoch=0-step=20.ckpt", "epoch=0-step=20.ckpt", _truncate, "quick"),
    ("pl-zero", "pl", "epoch=0-step=20.ckpt", "epoch=0-step=20.ckpt", _zero, "quick"),
    (
        "pl-broken-header",
        "pl",
        "epoch=0-step=20.ckpt",
        "epoch=0-step=20.ckpt",
        _broken_header,
        "quick",
    ),
    (
        "pl-flip-data",
        "pl",
        "epoch=0-step=20.ckpt",
        "epoch=0-step=20.ckpt",
        _flip(_zip_data_offset),
        "full",
    ),
    (
        "pl-flip-cd",
        "pl",
        "epoch=0-step=20.ckpt",
        "epoch=0-step=20.ckpt",
        _flip(_zip_cd_offset),
        "quick",
    ),
    # torch.distributed.checkpoint
    ("dcp-truncated-data", "dcp", ".", "__0_0.distcp", _truncate, "quick"),
    ("dcp-truncated-metadata", "dcp", ".", ".metadata", _truncate, "quick"),
    ("dcp-zero-data", "dcp", ".", "__0_0.distcp", _zero, "quick"),
    ("dcp-missing-data", "dcp", ".", "__0_0.distcp", _missing, "quick"),
    ("dcp-missing-metadata", "dcp", ".", ".metadata", _missing, "quick"),
    ("dcp-broken-metadata", "dcp", ".", ".metadata", _broken_header, "quick"),
    ("dcp-flip-data", "dcp", ".", "__0_0.distcp", _flip(lambda n, d: n // 2), "manifest"),
    # plain safetensors
    ("st-truncated", "st", "model.safetensors", "model.safetensors", _truncate, "quick"),
    ("st-zero", "st", "model.safetensors", "model.safetensors", _zero, "quick"),
    ("st-broken-header", "st", "model.safetensors", "model.safetensors", _broken_header, "quick"),
    (
        "st-flip-header",
        "st",
        "model.safetensors",
        "model.safetensors",
        _flip(_st_header_offset),
        "quick",
    ),
    (
        "st-flip-data",
        "st",
        "model.safetensors",
        "model.safetensors",
        _flip(_st_data_offset),
        "manifest",
    ),
    # DeepSpeed (documented layout)
    (
        "ds-truncated-optim",
        "deepspeed",
        "global_step20",
        "global_step20/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
        _truncate,
        "quick",
    ),
    (
        "ds-zero-model",
        "deepspeed",
        "global_step20",
        "global_step20/mp_rank_00_model_states.pt",
        _zero,
        "quick",
    ),
    (
        "ds-missing-model",
        "deepspeed",
        "global_step20",
        "global_step20/mp_rank_00_model_states.pt",
        _missing,
        "quick",
    ),
    (
        "ds-missing-rank0-optim",
        "deepspeed",
        "global_step20",
        "global_step20/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
        _missing,
        "quick",
    ),
    ("ds-missing-latest-target", "deepspeed", "global_step20", "global_step20", _missing, "quick"),
    (
        "ds-flip-data",
        "deepspeed",
        "global_step20",
        "global_step20/mp_rank_00_model_states.pt",
        _flip(_zip_data_offset),
        "full",
    ),
    (
        "ds-broken-header",
        "deepspeed",
        "global_step20",
        "global_step20/mp_rank_00_model_states.pt",
        _broken_header,
        "quick",
    ),
    # Megatron-LM (documented layout)
    (
        "meg-truncated",
        "megatron",
        "iter_0001000",
        "iter_0001000/mp_rank_01/model_optim_rng.pt",
        _truncate,
        "quick",
    ),
    (
        "meg-zero",
        "megatron",
        "iter_0001000",
        "iter_0001000/mp_rank_00/model_optim_rng.pt",
        _zero,
        "quick",
    ),
    (
        "meg-missing",
        "megatron",
        "iter_0001000",
        "iter_0001000/mp_rank_00/model_optim_rng.pt",
        _missing,
        "quick",
    ),
    ("meg-missing-tracked-iter", "megatron", "iter_0001000", "iter_0001000", _missing, "quick"),
    (
        "meg-flip-data",
        "megatron",
        "iter_0001000",
        "iter_0001000/mp_rank_00/model_optim_rng.pt",
        _flip(_zip_data_offset),
        "full",
    ),
    (
        "meg-broken-header",
        "megatron",
        "iter_0001000",
        "iter_0001000/mp_rank_00/model_optim_rng.pt",
        _broken_header,
        "quick",
    ),
    # Orbax (documented layout)
    ("orbax-missing-commit", "orbax", "200", "200/commit_success.txt", _missing, "quick"),
    ("orbax-broken-metadata", "orbax", "200", "200/_CHECKPOINT_METADATA", _broken_header, "quick"),
    ("orbax-zero-metadata", "orbax", "200", "200/_CHECKPOINT_METADATA", _zero, "quick"),
    ("orbax-truncated-item-metadata", "orbax", "200", "200/default/_METADATA", _truncate, "quick"),
    ("orbax-zero-ocdbt", "orbax", "200", "200/default/manifest.ocdbt", _zero, "quick"),
    (
        "orbax-flip-data",
        "orbax",
        "200",
        "200/default/d/0a1b2c",
        _flip(lambda n, d: n // 2),
        "manifest",
    ),
    ("orbax-truncated-data", "orbax", "200", "200/default/d/0a1b2c", _truncate, "manifest"),
    # NeMo (documented layout)
    (
        "nemo-truncated",
        "nemo",
        "megatron_gpt--val_loss=1.23-step=200-consumed_samples=1600.0.ckpt",
        "megatron_gpt--val_loss=1.23-step=200-consumed_samples=1600.0.ckpt",
        _truncate,
        "quick",
    ),
    (
        "nemo-flip-data",
        "nemo",
        "megatron_gpt--val_loss=1.23-step=200-consumed_samples=1600.0.ckpt",
        "megatron_gpt--val_loss=1.23-step=200-consumed_samples=1600.0.ckpt",
        _flip(_zip_data_offset),
        "full",
    ),
    # torchtitan
    ("tt-missing-metadata", "torchtitan", "step-20", "step-20/.metadata", _missing, "quick"),
    ("tt-truncated-data", "torchtitan", "step-20", "step-20/__0_0.distcp", _truncate, "quick"),
]


def _source(kind, hf_run, lightning_run, dcp_checkpoint, safetensors_file, layout_roots) -> Path:
    return {
        "hf": hf_run.output_dir,
        "pl": lightning_run.ckpt_dir,
        "dcp": dcp_checkpoint,
        "st": safetensors_file.parent,
        **layout_roots,
    }[kind]


@pytest.mark.parametrize("case", MATRIX, ids=[c[0] for c in MATRIX])
def test_corruption_matrix(
    case, hf_run, lightning_run, dcp_checkpoint, safetensors_file, layout_roots, copy_of
):
    _id, kind, ckpt_rel, target_rel, op, level = case
    root = copy_of(
        _source(kind, hf_run, lightning_run, dcp_checkpoint, safetensors_file, layout_roots), "root"
    )
    ckpt = os.path.normpath(str(root / ckpt_rel))
    if level == "manifest":
        assert validate_checkpoint(ckpt, manifest="write").manifest == "written"
    before = _statuses(validate_paths([str(root)], level="quick"))
    assert before[ckpt] == "valid"
    op(root / target_rel)
    if level == "manifest":
        after = validate_checkpoint(ckpt, manifest="verify")
        assert after.status == "invalid", after
        return
    report = validate_paths([str(root)], level=level)
    result = next(c for c in report.checkpoints if c.path == ckpt)
    assert result.status in ("invalid", "incomplete"), result
    assert result.problems and all(p.file and p.reason for p in result.problems)
    # every other checkpoint in the root is still valid: no collateral false positives
    others = [c for c in report.checkpoints if c.path != ckpt]
    assert all(c.status == "valid" for c in others), [(c.path, c.problems) for c in others]


def test_flipped_zip_byte_passes_quick_but_fails_full(hf_run, copy_of):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-30")
    _flip(_zip_data_offset)(ckpt / "optimizer.pt")
    assert validate_checkpoint(ckpt).status == "valid"
    full = validate_checkpoint(ckpt, level="full")
    assert full.status == "invalid"
    assert full.problems[0].file == "optimizer.pt" and "CRC-32" in full.problems[0].reason


def test_in_flight_temp_folders(hf_run, layout_roots, copy_of, tmp_path):
    root = copy_of(layout_roots["orbax"], "orbax")
    layouts.build_orbax(tmp_path / "x", steps=(), in_flight=300)
    shutil.move(str(tmp_path / "x" / "300.orbax-checkpoint-tmp-1700000000"), str(root))
    report = validate_paths([str(root)])
    tmp = [c for c in report.checkpoints if "orbax-checkpoint-tmp" in c.path]
    assert tmp and tmp[0].status == "incomplete" and tmp[0].step == 300
    hf = copy_of(hf_run.output_dir / "checkpoint-40", "tmp-checkpoint-50")
    r = validate_checkpoint(hf)
    assert r.status == "incomplete" and "in-flight" in r.problems[0].reason


def test_nemo_unfinished_marker(tmp_path):
    root = layouts.build_nemo(tmp_path / "nemo", unfinished=200)
    report = validate_paths([str(root)])
    by_step = {c.step: c for c in report.checkpoints}
    assert by_step[100].status == "valid"
    assert by_step[200].status == "incomplete" and "-unfinished" in by_step[200].problems[0].reason


def test_missing_index_shard_is_incomplete(hf_run, copy_of, tmp_path):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-60")
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    keys = sorted(tensors)
    half = len(keys) // 2
    shards = {
        "model-00001-of-00002.safetensors": keys[:half],
        "model-00002-of-00002.safetensors": keys[half:],
    }
    for name, ks in shards.items():
        save_file({k: tensors[k].contiguous() for k in ks}, str(ckpt / name))
    (ckpt / "model.safetensors").unlink()
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: n for n, ks in shards.items() for k in ks}})
    )
    assert validate_checkpoint(ckpt).status == "valid"
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    r = validate_checkpoint(ckpt)
    assert r.status == "incomplete"
    assert r.problems[0].file == "model-00002-of-00002.safetensors"


# ----------------------------------------------------------------------------- manifests


def test_manifest_write_then_verify(hf_run, copy_of, capsys):
    root = copy_of(hf_run.output_dir, "run")
    assert main(["validate", str(root), "--manifest", "write"]) == 0
    assert (root / "checkpoint-10" / "integrity.json").exists()
    manifest = json.loads((root / "checkpoint-10" / "integrity.json").read_text())
    assert manifest["algorithm"] == "sha256" and "model.safetensors" in manifest["files"]
    assert main(["validate", str(root), "--manifest", "verify"]) == 0
    (root / "checkpoint-10" / "config.json").write_text("{}")
    capsys.readouterr()
    assert main(["validate", str(root), "--manifest", "verify", "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    bad = [c for c in out["checkpoints"] if c["status"] != "valid"]
    assert len(bad) == 1 and bad[0]["problems"][0]["file"] == "config.json"


def test_manifest_verify_without_manifest_is_a_problem(safetensors_file, copy_of):
    f = copy_of(safetensors_file)
    r = validate_checkpoint(f, manifest="verify")
    assert r.status == "invalid" and "no manifest" in r.problems[0].reason


# ----------------------------------------------------------------------------- bad input


def _one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1


def test_missing_path_exits_2(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert _one_line(err) and "no such file" in err


def test_unrecognised_folder_exits_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hi")
    assert main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert _one_line(err) and "no checkpoint recognised" in err and "expected" in err


def test_file_where_folder_expected(tmp_path, hf_run, capsys):
    root = tmp_path / "run"
    shutil.copytree(hf_run.output_dir / "checkpoint-10", root / "checkpoint-10")
    (root / "checkpoint-20").write_text("oops")
    assert main(["validate", str(root), "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    bad = next(c for c in out["checkpoints"] if c["path"].endswith("checkpoint-20"))
    assert (
        bad["status"] == "invalid"
        and "expected a hf-trainer checkpoint folder" in bad["problems"][0]["reason"]
    )


def test_unreadable_files_give_problems(hf_run, copy_of, capsys):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-10")
    (ckpt / "optimizer.pt").unlink()
    (ckpt / "optimizer.pt").symlink_to(ckpt / "no-such-target")  # dangling
    (ckpt / "scheduler.pt").unlink()
    (ckpt / "scheduler.pt").mkdir()  # a folder where a file is expected
    (ckpt / "rng_state.pth").chmod(0)  # unreadable
    if os.geteuid() != 0:
        rc = main(["validate", str(ckpt), "--format", "json"])
        out = json.loads(capsys.readouterr().out)
    else:  # root reads a mode-0 file: run without the capabilities that let it (setpriv, util-linux)
        if shutil.which("setpriv") is None:
            pytest.skip("running as root and setpriv is missing: cannot make a file unreadable")
        proc = subprocess.run(
            [
                "setpriv",
                "--bounding-set=-dac_override,-dac_read_search",
                "--",
                *CLI,
                "validate",
                str(ckpt),
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=checkout_env(),
        )
        rc, out = proc.returncode, json.loads(proc.stdout)
    assert rc == 1
    reasons = {p["file"]: p["reason"] for p in out["checkpoints"][0]["problems"]}
    assert reasons["optimizer.pt"] == "cannot read: does not exist"
    assert reasons["scheduler.pt"] == "is a folder: expected a regular file"
    assert reasons["rng_state.pth"] == "cannot read: permission denied"


def test_symlink_loops_never_traceback(hf_run, tmp_path, capsys):
    root = tmp_path / "run"
    shutil.copytree(hf_run.output_dir / "checkpoint-10", root / "checkpoint-10")
    (root / "loop").symlink_to(root)  # folder loop
    (root / "a.ckpt").symlink_to(root / "b.ckpt")  # file loop
    (root / "b.ckpt").symlink_to(root / "a.ckpt")
    (root / "checkpoint-10" / "model.safetensors").unlink()
    (root / "checkpoint-10" / "model.safetensors").symlink_to(
        root / "checkpoint-10" / "model.safetensors"
    )
    rc = main(["validate", str(root), "--format", "json"])
    captured = capsys.readouterr()
    assert rc == 1 and "Traceback" not in captured.err
    out = json.loads(captured.out)
    assert {c["status"] for c in out["checkpoints"]} == {"invalid"}
    assert main(["validate", str(root / "a.ckpt")]) == 2
    assert _one_line(capsys.readouterr().err)


def test_bad_arguments_exit_2(hf_run, capsys):
    assert main(["validate", str(hf_run.output_dir), "--level", "deeper"]) == 2
    assert _one_line(capsys.readouterr().err)
    assert main(["validate"]) == 2


# ----------------------------------------------------------------------------- CLI


def test_text_and_markdown_output(hf_run, dcp_checkpoint, capsys):
    assert main(["validate", str(hf_run.output_dir / "checkpoint-200"), str(dcp_checkpoint)]) == 0
    out = capsys.readouterr().out
    assert "VALID" in out and "resumable" in out and "Resuming across hardware" in out
    assert main(["validate", str(dcp_checkpoint), "--format", "markdown"]) == 0
    assert "| valid |" in capsys.readouterr().out


def test_cli_subprocess_quiet_when_piped(hf_run):
    env = checkout_env()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_strategy",
            "validate",
            str(hf_run.output_dir),
            "--level",
            "full",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no progress bar when stderr is not a terminal


def test_progress_bar_only_on_terminal_after_a_second(monkeypatch):
    import io

    from checkpoint_strategy.validate.progress import Progress

    class TTY(io.StringIO):
        def isatty(self):
            return True

    fast = TTY()
    with Progress(total=3, stream=fast) as bar:
        bar.update(checkpoints=3)
    assert fast.getvalue() == ""
    slow = TTY()
    with Progress(total=3, stream=slow, delay=0.0) as bar:
        bar.update(checkpoints=1)
    assert "validating [" in slow.getvalue()
    piped = io.StringIO()
    with Progress(total=3, stream=piped, delay=0.0) as bar:
        bar.update(checkpoints=1)
    assert piped.getvalue() == ""


@pytest.mark.parametrize("bf16", [True, False])
def test_deepspeed_tag_missing_a_ranks_shard_is_incomplete_even_without_ds_config(tmp_path, bf16):
    """The model states record dp_world_size 2 but no ds_config (no ZeRO stage): the ZeRO shard files themselves
    say it is ZeRO, so the missing rank is named with the shards' own prefix (bf16_ or none)."""
    root = layouts.build_deepspeed(tmp_path / "ds", steps=(10,), bf16=bf16)
    prefix = "bf16_" if bf16 else ""
    (root / "global_step10" / f"{prefix}zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    (c,) = validate_paths([str(root / "global_step10")]).checkpoints
    assert c.status == "incomplete"
    assert [p.file for p in c.problems] == [f"{prefix}zero_pp_rank_1_mp_rank_00_optim_states.pt"]


@pytest.mark.slow  # five fresh interpreters
def test_two_index_files_report_in_name_order_whatever_the_hash_seed(tmp_path):
    """An HF folder with a safetensors and a .bin index, each naming a missing shard: the problems come in the
    indexes' name order in every process (the checker walks its sorted listing, not a set)."""
    ckpt = tmp_path / "checkpoint-10"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    for idx, shard in (
        ("pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin"),
        ("model.safetensors.index.json", "model-00001-of-00002.safetensors"),
    ):
        (ckpt / idx).write_text(json.dumps({"weight_map": {"w": shard}}))
    orders = set()
    for seed in ("1", "2", "3", "4", "5"):
        out = subprocess.run(
            [*CLI, "validate", str(ckpt), "--format", "json"],
            capture_output=True,
            text=True,
            env=checkout_env(PYTHONHASHSEED=seed),
            check=False,
        )
        assert out.returncode == 1, out.stderr
        problems = json.loads(out.stdout)["checkpoints"][0]["problems"]
        orders.add(tuple(p["file"] for p in problems if "shard listed in" in p["reason"]))
    assert orders == {("model-00001-of-00002.safetensors", "pytorch_model-00001-of-00002.bin")}, (
        orders
    )
