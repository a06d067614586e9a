"""validate --level deep on real checkpoints overwritten in place, the pickle reader, the allow-list.

The package never loads a pickle; these tests do (torch.load) to cross-check its figures.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.validate import validate_checkpoint, validate_paths

# what torch.load raises for an archive it cannot open (not Exception: a typo in the test must not pass)
TORCH_REFUSES = (
    RuntimeError,
    pickle.UnpicklingError,
    EOFError,
    IndexError,
)  # IndexError: a truncated pickle

torch = pytest.importorskip("torch")


# ----------------------------------------------------------------------------- helpers (independent of the package)


def _st_tensors(path: Path) -> dict[str, tuple[str, list, int]]:
    """safetensors name -> (dtype, shape, absolute byte offset), from the header."""
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + hlen])
    return {
        k: (v["dtype"], v["shape"], 8 + hlen + v["data_offsets"][0])
        for k, v in header.items()
        if k != "__metadata__"
    }


def _poke(path: Path, offset: int, values, dtype) -> None:
    """Overwrite values in place; in a torch zip archive the CRC-32s are then made to match, as torch.save
    writes them for these bytes (a NaN saved by the training, not a flipped byte: deep includes full's CRC)."""
    data = np.asarray(values, dtype=dtype).tobytes()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    if path.read_bytes()[:4] == b"PK\x03\x04":
        fix_zip_crcs(path)


def fix_zip_crcs(path: Path) -> None:
    """Recompute the CRC-32 of every stored entry of a zip archive in place (local and central headers)."""
    import zlib

    blob = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        infos, cd = zf.infolist(), zf.start_dir
    pos = cd
    for info in infos:
        assert blob[pos : pos + 4] == b"PK\x01\x02"
        nlen, xlen, clen = struct.unpack("<HHH", blob[pos + 28 : pos + 34])
        lh = info.header_offset
        lnlen, lxlen = struct.unpack("<HH", blob[lh + 26 : lh + 30])
        start = lh + 30 + lnlen + lxlen
        crc = struct.pack("<I", zlib.crc32(bytes(blob[start : start + info.compress_size])))
        blob[pos + 16 : pos + 20] = crc
        blob[lh + 14 : lh + 18] = crc
        pos += 46 + nlen + xlen + clen
    path.write_bytes(bytes(blob))


def _entry_offset(path: Path, raw: bytes) -> int:
    """Byte offset in a torch zip of the data entry whose bytes start with `raw` (found by content)."""
    blob = path.read_bytes()
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if "/data/" not in info.filename:
                continue
            nlen, xlen = struct.unpack(
                "<HH", blob[info.header_offset + 26 : info.header_offset + 30]
            )
            start = info.header_offset + 30 + nlen + xlen
            if blob[start : start + len(raw)] == raw and info.file_size >= len(raw):
                return start
    raise AssertionError("tensor bytes not found in any data entry")


def _problems(result) -> list[tuple[str, str, str]]:
    return [(p.file, p.reason, p.kind) for p in result.problems]


# ----------------------------------------------------------------------------- real checkpoints: clean


def test_real_checkpoints_pass_deep(hf_run, lightning_run, dcp_checkpoint):
    report = validate_paths(
        [
            str(hf_run.output_dir / "checkpoint-100"),
            str(lightning_run.ckpt_files[-1]),
            str(dcp_checkpoint),
        ],
        level="deep",
    )
    for c in report.checkpoints:
        assert c.status == "valid" and c.passes_deep(), (c.path, _problems(c))
        assert c.deep.nonfinite_values == 0 and c.deep.float_tensors > 0
        assert c.deep.optimizer.kind == "adam"
        assert c.deep.optimizer.with_moments == c.deep.optimizer.parameters > 0
    hf = report.checkpoints[0]
    assert (hf.deep.optimizer.step, hf.deep.optimizer.global_step) == (100, 100)
    pl = report.checkpoints[1]
    assert pl.deep.optimizer.step == pl.deep.optimizer.global_step == 30


def test_norms_and_counts_match_torch(hf_run, tmp_path):
    ckpt = hf_run.output_dir / "checkpoint-50"
    stats = tmp_path / "stats.json"
    assert (
        main(["validate", str(ckpt), "--level", "deep", "--stats", str(stats), "--format", "json"])
        == 0
    )
    figures = {
        (t["file"], t["tensor"]): t
        for t in json.loads(stats.read_text())["checkpoints"][0]["tensors"]
    }
    from safetensors.torch import load_file

    expected = {
        ("model.safetensors", k): v for k, v in load_file(str(ckpt / "model.safetensors")).items()
    }
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    for pid, st in opt["state"].items():
        for leaf, v in st.items():
            expected[("optimizer.pt", f"state.{pid}.{leaf}")] = v
    assert set(expected) <= set(figures)
    for key, t in expected.items():
        f = figures[key]
        d = t.double()
        assert f["numel"] == t.numel() and f["shape"] == list(t.shape) and f["nan"] == f["inf"] == 0
        assert f["l2"] == pytest.approx(float(torch.linalg.vector_norm(d)), rel=1e-6, abs=1e-12), (
            key
        )
        assert f["max_abs"] == pytest.approx(
            float(d.abs().max()) if t.numel() else 0.0, rel=1e-7
        ), key
    weights = [v.double() for (f, _k), v in expected.items() if f == "model.safetensors"]
    norm = float(torch.sqrt(sum((w * w).sum() for w in weights)))
    r = validate_checkpoint(ckpt, level="deep")
    assert r.deep.weights_norm == pytest.approx(norm, rel=1e-6)


# ----------------------------------------------------------------------------- values overwritten in place


def test_nan_and_inf_in_weights_named_exactly(hf_run, copy_of):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-40")
    st = ckpt / "model.safetensors"
    name = "transformer.h.1.mlp.c_proj.weight"
    dtype, shape, off = _st_tensors(st)[name]
    assert dtype == "F32"
    _poke(st, off + 4 * 7, [np.nan, np.nan, np.nan], np.float32)
    _poke(st, off + 4 * 100, [np.inf, -np.inf], np.float32)
    r = validate_checkpoint(ckpt, level="deep")
    assert r.status == "invalid"
    assert (
        "model.safetensors",
        f"invalid: 3 NaN and 2 Inf values in {name}",
        "invalid",
    ) in _problems(r)
    assert r.deep.nonfinite == [f"model.safetensors: {name}: 3 NaN and 2 Inf"]
    from safetensors.torch import load_file

    t = load_file(str(st))[name]
    assert int(torch.isnan(t).sum()) == 3 and int(torch.isinf(t).sum()) == 2
    # quick and full levels cannot see it (the bytes are well-formed): only deep does
    assert validate_checkpoint(ckpt, level="full").status == "valid"


def test_nan_in_optimizer_moment_named_exactly(hf_run, copy_of):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-40")
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    target = opt["state"][5]["exp_avg_sq"]
    off = _entry_offset(ckpt / "optimizer.pt", target.numpy().tobytes())
    _poke(ckpt / "optimizer.pt", off + 4 * 3, [np.nan], np.float32)
    r = validate_checkpoint(ckpt, level="deep")
    assert ("optimizer.pt", "invalid: 1 NaN values in state.5.exp_avg_sq", "invalid") in _problems(
        r
    )
    again = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert int(torch.isnan(again["state"][5]["exp_avg_sq"]).sum()) == 1


@pytest.mark.parametrize("way", ["numpy", "compiled"])
def test_lightning_bf16_fp16_and_a_view_with_storage_offset(
    lightning_run, tmp_path, monkeypatch, way
):
    from checkpoint_strategy.formats import tensors as tensorscan

    if way == "compiled":
        pytest.importorskip("numba", reason="the compiled 16-bit kernels need numba")
    monkeypatch.setattr(tensorscan, "KERNEL_MIN_BYTES", 0)
    monkeypatch.setenv("CHECKPOINT_STRATEGY_KERNELS", "on" if way == "compiled" else "off")
    ck = torch.load(lightning_run.ckpt_files[-1], weights_only=True)
    base = torch.arange(64, dtype=torch.float32) / 7 - 3
    ck["state_dict"]["layer.weight"] = ck["state_dict"]["layer.weight"].to(torch.bfloat16)
    ck["state_dict"]["extra.half"] = torch.linspace(-2, 2, 40).to(torch.float16)
    ck["state_dict"]["extra.base"] = base
    ck["state_dict"]["extra.view"] = base[10:30]  # shares base's storage, offset 10
    ck["state_dict"]["extra.strided"] = base.view(8, 8).t()  # non-contiguous
    path = tmp_path / "epoch=0-step=30.ckpt"
    torch.save(ck, path)
    clean = validate_checkpoint(path, level="deep")
    assert clean.status == "valid", _problems(clean)
    off_bf16 = _entry_offset(
        path, ck["state_dict"]["layer.weight"].view(torch.int16).numpy().tobytes()
    )
    _poke(path, off_bf16 + 2 * 2, [0x7FC0], np.uint16)  # bfloat16 NaN
    off_half = _entry_offset(path, ck["state_dict"]["extra.half"].numpy().tobytes())
    _poke(path, off_half + 2 * 5, [np.inf, np.inf], np.float16)
    off_base = _entry_offset(path, base.numpy().tobytes())
    _poke(
        path, off_base + 4 * 12, [np.nan], np.float32
    )  # inside extra.view (index 2) and extra.base
    r = validate_checkpoint(path, level="deep")
    got = {reason for _f, reason, _k in _problems(r)}
    assert "invalid: 1 NaN values in state_dict.layer.weight" in got
    assert "invalid: 2 Inf values in state_dict.extra.half" in got
    assert "invalid: 1 NaN values in state_dict.extra.view" in got
    assert "invalid: 1 NaN values in state_dict.extra.base" in got
    assert "invalid: 1 NaN values in state_dict.extra.strided" in got
    # figures equal torch's on the same file
    stats = tmp_path / "s.json"
    validate_paths([str(path)], level="deep", stats=str(stats))
    fig = {t["tensor"]: t for t in json.loads(stats.read_text())["checkpoints"][0]["tensors"]}
    loaded = torch.load(path, weights_only=True)["state_dict"]
    for name in ("layer.weight", "extra.half", "extra.view", "extra.strided", "extra.base"):
        t = loaded[name].double()
        fin = t[torch.isfinite(t)]
        f = fig[f"state_dict.{name}"]
        assert (f["nan"], f["inf"]) == (int(torch.isnan(t).sum()), int(torch.isinf(t).sum())), name
        assert f["l2"] == pytest.approx(float(torch.linalg.vector_norm(fin)), rel=1e-6), name
        assert f["shape"] == list(t.shape)


def test_dcp_value_overwritten(dcp_checkpoint, copy_of, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = copy_of(dcp_checkpoint)
    dcp_to_torch_save(str(ckpt), str(tmp_path / "full.pt"))
    full = torch.load(
        tmp_path / "full.pt", weights_only=False
    )  # DCP's own converter output (test only)
    weight = full["model"]["2.weight"]
    blob = (ckpt / "__0_0.distcp").read_bytes()
    at = blob.index(weight.numpy().tobytes())
    _poke(ckpt / "__0_0.distcp", at + 4 * 9, [np.inf], np.float32)
    # a byte changed after the save: the CRC-32 of the torch archive that item is (level full) says so first
    for level in ("full", "deep"):
        r = validate_checkpoint(ckpt, level=level)
        assert r.status == "invalid" and any(
            "item model.2.weight" in p.reason and "CRC-32 mismatch" in p.reason for p in r.problems
        ), level
    dcp_to_torch_save(str(ckpt), str(tmp_path / "after.pt"))
    after = torch.load(tmp_path / "after.pt", weights_only=False)
    assert (
        int(torch.isinf(after["model"]["2.weight"]).sum()) == 1
    )  # (dcp.load does not check that CRC)
    # an Inf the training itself saved (CRC-32 whole): deep names it
    import torch.distributed.checkpoint as dcp

    weight[0, 9] = float("inf")
    saved = tmp_path / "saved-inf" / "step-1"
    dcp.save({"model": full["model"]}, checkpoint_id=str(saved))
    r = validate_checkpoint(saved, level="deep")
    assert ("__0_0.distcp", "invalid: 1 Inf values in model.2.weight", "invalid") in _problems(r)


def test_dcp_norms_match_torch(dcp_checkpoint, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(dcp_checkpoint), str(tmp_path / "full.pt"))
    full = torch.load(tmp_path / "full.pt", weights_only=False)
    stats = tmp_path / "s.json"
    validate_paths([str(dcp_checkpoint)], level="deep", stats=str(stats))
    fig = {t["tensor"]: t for t in json.loads(stats.read_text())["checkpoints"][0]["tensors"]}
    for name, t in full["model"].items():
        assert fig[f"model.{name}"]["l2"] == pytest.approx(
            float(torch.linalg.vector_norm(t.double())), rel=1e-6
        )
    for pid, st in full["optimizer"]["state"].items():
        for leaf in ("exp_avg", "exp_avg_sq"):
            assert fig[f"optimizer.state.{pid}.{leaf}"]["l2"] == pytest.approx(
                float(torch.linalg.vector_norm(st[leaf].double())), rel=1e-6
            )


def test_dcp_deep_parses_each_item_archive_once(dcp_checkpoint, monkeypatch):
    """Level deep includes full, which parses every item's torch archive (CRC-32 included): the value scan takes
    those, it does not parse an item again (issue 40: each was read twice), and still scans every tensor. The
    optimizer step counters deep reports (train_state's bytes entries of a few hundred bytes) are read from those
    archives too (formats/optstep.py): every parse is counted."""
    from checkpoint_strategy.formats import filechecks as fc

    calls = {"n": 0}
    real = fc.scan_embedded_zip

    def counted(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(fc, "scan_embedded_zip", counted)
    assert validate_checkpoint(dcp_checkpoint, level="full").status == "valid"
    full, calls["n"] = calls["n"], 0
    r = validate_checkpoint(dcp_checkpoint, level="deep")
    assert r.status == "valid", r.problems
    assert full > 0 and calls["n"] == full, (full, calls["n"])
    assert r.deep.tensors >= 4 and r.deep.weights_norm


def _dcp_tensor_byte(folder: Path) -> tuple[Path, int]:
    """A .distcp file of `folder` and the offset of a byte of the largest tensor item's values (inside its
    archive's data/ entry)."""
    from checkpoint_strategy.formats import filechecks as fc
    from checkpoint_strategy.formats.dcp import dcp_metadata

    md = dcp_metadata(tp.read_pickle((folder / ".metadata").read_bytes()))
    it = max((c for t in md.tensors for c in t.chunks), key=lambda c: c.length)
    with open(folder / it.rel, "rb") as fh:
        z = fc.scan_embedded_zip(fh, it.offset, it.length, fc.Counter())
    data = max(z.entries, key=lambda e: e.csize)
    return folder / it.rel, it.offset + data.data_start + data.csize // 2


def _flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x10
    path.write_bytes(bytes(raw))


def test_dcp_deep_checks_the_archives_crc_in_the_value_scan_pass(dcp_sharded, copy_of, monkeypatch):
    """Level deep reads each DCP storage file's bytes once (issue 40): full's CRC-32 pass over the item archives is
    not made, the value scan computes the CRC-32s from the bytes it reduces; a flipped value byte is found by it
    with level full's words (the item, the entry, the CRC-32s). The optimizer step counters deep reports (small
    bytes entries) are read from the archives level full parsed (formats/optstep.py): no CRC-32 pass of their own."""
    from checkpoint_strategy.formats import archive as zr

    calls = {"n": 0}
    real = zr.crc_entries

    def counted(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(zr, "crc_entries", counted)
    r = validate_checkpoint(dcp_sharded, level="deep")
    assert r.status == "valid" and r.deep.tensors >= 4, r.problems
    assert calls["n"] == 0
    assert validate_checkpoint(dcp_sharded, level="full").status == "valid" and calls["n"] > 0

    folder = copy_of(dcp_sharded)
    path, offset = _dcp_tensor_byte(folder)
    _flip(path, offset)
    full = validate_checkpoint(folder, level="full")
    deep = validate_checkpoint(folder, level="deep")
    assert full.status == deep.status == "invalid"
    assert [(p.file, p.reason) for p in deep.problems] == [
        (p.file, p.reason) for p in full.problems
    ]
    assert (
        deep.problems[0].reason.startswith("item ") and "CRC-32 mismatch" in deep.problems[0].reason
    )


def test_dcp_deep_checks_the_archives_crc_when_another_problem_stops_the_value_scan(
    dcp_sharded, copy_of
):
    """Another file's problem: no value scan, and the CRC-32s it would have checked are checked as level full
    checks them (the same problems, worded the same)."""
    folder = copy_of(dcp_sharded)
    path, offset = _dcp_tensor_byte(folder)
    _flip(path, offset)
    (folder / "__9_9.distcp").write_bytes(b"left over")
    full = validate_checkpoint(folder, level="full")
    deep = validate_checkpoint(folder, level="deep")
    assert deep.status == full.status == "invalid" and deep.deep is None
    assert sorted((p.file, p.reason) for p in deep.problems) == sorted(
        (p.file, p.reason) for p in full.problems
    )
    assert any("CRC-32 mismatch" in p.reason for p in deep.problems)
    assert any("not referenced" in p.reason for p in deep.problems)


# ----------------------------------------------------------------------------- optimizer state


def test_optimizer_entries_removed(hf_run, copy_of):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-60")
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    n = len(opt["state"])
    for pid in list(opt["state"])[::2]:
        del opt["state"][pid]["exp_avg"], opt["state"][pid]["exp_avg_sq"]
    torch.save(opt, ckpt / "optimizer.pt")
    r = validate_checkpoint(ckpt, level="deep")
    expect = f"not resumable: optimizer state has moments for {n - len(list(range(0, n, 2)))} of {n} parameters"
    assert ("optimizer.pt", expect, "not_resumable") in _problems(r)
    assert r.status == "valid" and not r.resumable and not r.passes_deep()
    assert main(["validate", str(ckpt), "--level", "deep"]) == 1


def test_optimizer_step_ahead_of_the_trainer(hf_run, copy_of):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-60")
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state["global_step"] = 50
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    r = validate_checkpoint(ckpt, level="deep")
    assert any(
        k == "not_resumable"
        and "optimizer step 60 is ahead of the trainer's global step 50" in reason
        for _f, reason, k in _problems(r)
    )


def test_moments_of_another_model(hf_run, copy_of):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-60")
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    opt["state"][0]["exp_avg"] = torch.zeros(3, 5)
    opt["state"][0]["exp_avg_sq"] = torch.zeros(3, 5)
    torch.save(opt, ckpt / "optimizer.pt")
    r = validate_checkpoint(ckpt, level="deep")
    assert any(
        "1 optimizer moments match no weight's shape" in reason for _f, reason, _k in _problems(r)
    )


def test_problems_of_a_single_file_checkpoint_name_the_file(tmp_path, capsys):
    """A .pt / .safetensors passed directly: its problem lines say the file's name, never '.'."""
    evil = _evil_zip(tmp_path / "model.pt", {"state_dict": {"w": 1}, "x": _Evil(os.getcwd)})
    r = validate_checkpoint(evil)
    assert [(p.file, p.kind) for p in r.problems] == [("model.pt", "invalid")]
    assert main(["validate", str(evil)]) == 1
    assert (
        "- model.pt: unsafe pickle: would execute posix.getcwd on load" in capsys.readouterr().out
    )
    weights = tmp_path / "w.safetensors"
    from safetensors.torch import save_file

    save_file({"w": torch.ones(4)}, str(weights))
    r = validate_checkpoint(weights, level="deep")
    assert r.problems and all(p.file == "w.safetensors" for p in r.problems), r.problems


def test_weights_only_checkpoints(hf_run, copy_of):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-60")
    (ckpt / "optimizer.pt").unlink()
    r = validate_checkpoint(ckpt, level="deep")
    assert (
        ".",
        "not resumable: model-only (float32 weights, no optimizer)",
        "not_resumable",
    ) in _problems(r)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / "model.safetensors"))
    save_file(
        {k: v.to(torch.bfloat16) for k, v in tensors.items()},
        str(ckpt / "model.safetensors"),
        metadata={"format": "pt"},
    )
    r = validate_checkpoint(ckpt, level="deep")
    assert (
        ".",
        "not resumable: model-only (bfloat16 weights, no optimizer)",
        "not_resumable",
    ) in _problems(r)
    assert r.deep.weights_dtype == "bfloat16"
    norm = float(
        torch.sqrt(sum((v.to(torch.bfloat16).double() ** 2).sum() for v in tensors.values()))
    )
    assert r.deep.weights_norm == pytest.approx(norm, rel=1e-6)
    # a model-only export is reported, but validate's exit code and a release gate do not fail on it
    assert main(["validate", str(ckpt), "--level", "deep"]) == 0
    assert main(["release-gate", str(ckpt), "--level", "deep"]) == 0
    assert main(["release-gate", str(ckpt), "--level", "deep", "--require", "resumable"]) == 1


def test_weight_norm_jump_between_consecutive_checkpoints(hf_run):
    """hf_run's weights get noise of 4x their std at the end of step 120: checkpoint-120 already holds them."""
    steps = [110, 120, 130]
    report = validate_paths(
        [str(hf_run.output_dir / f"checkpoint-{s}") for s in steps], level="deep"
    )
    by_step = {c.step: c for c in report.checkpoints}
    jump = [
        p for p in by_step[120].problems if p.kind == "suspicious" and "weights norm" in p.reason
    ]
    assert len(jump) == 1 and "the previous checkpoint's (checkpoint-110)" in jump[0].reason
    assert by_step[120].deep.norm_ratio > 2 and by_step[120].deep.previous == "checkpoint-110"
    assert not [p for p in by_step[130].problems if "weights norm" in p.reason]
    assert 0.5 < by_step[130].deep.norm_ratio < 2
    one = validate_checkpoint(
        hf_run.output_dir / "checkpoint-120",
        level="deep",
        previous=hf_run.output_dir / "checkpoint-110",
    )
    assert not one.passes_deep() and any("weights norm" in p.reason for p in one.problems)


def test_prune_at_deep_keeps_the_older_when_the_newer_has_nans(hf_run, tmp_path):
    from checkpoint_strategy.retention import prune

    root = tmp_path / "run"
    root.mkdir()
    for s in (30, 40):
        shutil.copytree(hf_run.output_dir / f"checkpoint-{s}", root / f"checkpoint-{s}")
    st = root / "checkpoint-40" / "model.safetensors"
    _dtype, _shape, off = _st_tensors(st)["transformer.wte.weight"]
    _poke(st, off, [np.nan], np.float32)
    report = prune(str(root), keep_last=1, level="deep", apply=True, spike_check=False)
    assert (root / "checkpoint-30").is_dir() and (root / "checkpoint-40").is_dir()
    assert not report.delete or all(not e.deleted for e in report.delete)


def test_prune_at_deep_a_norm_jump_never_justifies_a_deletion(hf_run, tmp_path):
    """checkpoint-120 holds the weights blown up at step 120 (norm jump vs checkpoint-110): at level deep
    it is suspicious, so it is not the newest valid and checkpoint-110 is kept (issue 12)."""
    from checkpoint_strategy.retention import prune

    root = tmp_path / "run"
    root.mkdir()
    for s in (110, 120):
        shutil.copytree(hf_run.output_dir / f"checkpoint-{s}", root / f"checkpoint-{s}")
    report = prune(str(root), keep_last=1, level="deep", apply=True, spike_check=False)
    assert (root / "checkpoint-110").is_dir() and (root / "checkpoint-120").is_dir()
    assert not report.delete and report.newest_valid == "checkpoint-110"
    kept = {e.name: e for e in report.keep}
    assert kept["checkpoint-120"].reason_kinds == ["not_valid"] and kept[
        "checkpoint-110"
    ].reason_kinds == ["newest"]


# ----------------------------------------------------------------------------- the pickle reader and the allow-list


class _Evil:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def _evil_zip(path: Path, obj) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps(obj, protocol=2))
        zf.writestr("archive/version", b"3\n")
    return path


@pytest.mark.parametrize(
    "func,args,name",
    [
        (os.system, ("touch {marker}",), "posix.system"),
        (eval, ("open('{marker}', 'w')",), "builtins.eval"),
        (__import__("subprocess").call, (["touch", "{marker}"],), "subprocess.call"),
    ],
)
def test_malicious_pickles_reported_never_run(tmp_path, capsys, func, args, name):
    marker = tmp_path / "pwned"
    args = tuple(
        a.format(marker=marker) if isinstance(a, str) else [x.format(marker=marker) for x in a]
        for a in args
    )
    evil = _evil_zip(tmp_path / "model.pt", {"state_dict": {"w": 1}, "x": _Evil(func, *args)})
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(pickle.dumps(_Evil(func, *args), protocol=2))
    dcp = tmp_path / "step-1"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(pickle.dumps(_Evil(func, *args)))
    (dcp / "__0_0.distcp").write_bytes(b"x")
    for target in (evil, legacy, dcp):
        for level in ("quick", "full", "deep"):
            r = validate_checkpoint(target, level=level)
            assert r.status == "invalid", (target, level)
            assert f"unsafe pickle: would execute {name} on load" in r.problems[0].reason
        assert main(["release-gate", str(target), "--format", "json"]) == 1
        gate = json.loads(capsys.readouterr().out)
        assert gate["gate"] == "fail" and "unsafe pickle" in gate["reasons"][0]
    assert not marker.exists()


def test_allow_list_follows_weights_only():
    assert tp.classify_global("torch._utils._rebuild_tensor_v2") == "allowed"
    assert tp.classify_global("collections.OrderedDict") == "allowed"
    assert tp.classify_global("torch.BFloat16Storage") == "allowed"
    assert tp.classify_global("numpy._core.multiarray._reconstruct") == "allowed"
    assert tp.classify_global("transformers.training_args.TrainingArguments") == "framework"
    for bad in (
        "posix.system",
        "builtins.eval",
        "builtins.exec",
        "subprocess.Popen",
        "os.system",
        "torch.load",
        "torch.hub.load",
        "numpy.testing._private.utils.runstring",
        "builtins.getattr",
        "torch.utils.cpp_extension.load_inline",
        "nt.system",
        "webbrowser.open",
    ):
        assert tp.classify_global(bad) == "unsafe", bad
    assert (
        tp.classify_global("torch.distributed.checkpoint.metadata.Metadata", dcp=True) == "allowed"
    )
    # what torch itself accepts with weights_only=True is allowed here too
    from torch._weights_only_unpickler import _get_allowed_globals

    assert {g for g in _get_allowed_globals() if tp.classify_global(g) != "allowed"} == set()


def test_reader_matches_torch_on_storages_and_views(tmp_path):
    base = torch.arange(30, dtype=torch.float64)
    obj = {
        "a": base[5:17].view(3, 4),
        "b": torch.zeros(2, 3, dtype=torch.bfloat16).t(),
        "c": base,
        "d": torch.zeros(4, dtype=torch.float8_e4m3fn),
        "p": torch.nn.Parameter(torch.ones(2)),
    }
    torch.save(obj, tmp_path / "x.pt")
    with zipfile.ZipFile(tmp_path / "x.pt") as zf:
        scan = tp.read_pickle(zf.read("x/data.pkl"))
    assert scan.complete and scan.error is None and scan.unsafe() == []
    found = dict(tp.walk_tensors(scan.root))
    for name in ("a", "b", "c", "d", "p"):
        t = obj[name]
        ref = found[name]
        assert (ref.shape, ref.stride, ref.offset) == (
            tuple(t.shape),
            t.stride(),
            t.storage_offset(),
        ), name
        assert ref.dtype == str(t.dtype).removeprefix("torch."), name
    assert (
        found["a"].storage is found["c"].storage or found["a"].storage.key == found["c"].storage.key
    )
    assert found["a"].storage.nbytes == 30 * 8


@pytest.mark.parametrize(
    "case",
    [
        "empty-pkl",
        "garbage-pkl",
        "no-version",
        "missing-storage",
        "short-storage",
        "duplicate-entry",
        "truncated-pkl",
    ],
)
def test_full_level_archives_torch_cannot_open(lightning_run, tmp_path, case):
    src = lightning_run.ckpt_files[0]
    with zipfile.ZipFile(src) as zf:
        entries = [(i.filename, zf.read(i)) for i in zf.infolist()]
    out = tmp_path / "epoch=0-step=10.ckpt"
    pkl = next(n for n, _ in entries if n.endswith("data.pkl"))
    data_entries = [n for n, _ in entries if "/data/" in n]
    rows = []
    for name, data in entries:
        if case == "empty-pkl" and name == pkl:
            data = b""
        elif case == "garbage-pkl" and name == pkl:
            data = b"\x80\x02garbage that is no pickle"
        elif case == "truncated-pkl" and name == pkl:
            data = data[: len(data) // 2]
        elif case == "no-version" and name.endswith("/version"):
            continue
        elif case == "missing-storage" and name == data_entries[0]:
            continue
        elif case == "short-storage" and name == data_entries[0]:
            data = data[:-4]
        rows.append((name, data))
    if case == "duplicate-entry":
        rows.append((data_entries[0], dict(entries)[data_entries[0]]))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(out, "w") as zf:
            for name, data in rows:
                zf.writestr(name, data)
    r = validate_checkpoint(out, level="full")
    assert r.status == "invalid", (case, _problems(r))
    if (
        case != "duplicate-entry"
    ):  # torch silently reads one of the two: ambiguous, still invalid here
        with pytest.raises(TORCH_REFUSES):
            torch.load(out, weights_only=True)


def test_legacy_torch_file_parsed(tmp_path):
    path = tmp_path / "old.pt"
    torch.save(
        {"w": torch.randn(4, 4), "opt": {"lr": 0.1}}, path, _use_new_zipfile_serialization=False
    )
    r = validate_checkpoint(path, level="full")
    assert r.status == "valid" and any("legacy" in n and "checked" in n for n in r.notes)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    r = validate_checkpoint(path, level="full")
    assert r.status != "valid" and "legacy torch file" in r.problems[0].reason
    path.write_bytes(b"\x80\x02" + b"\x00" * 64)
    assert validate_checkpoint(path).status == "invalid"


def test_stats_needs_deep_and_writes_atomically(hf_run, tmp_path, capsys):
    assert (
        main(
            [
                "validate",
                str(hf_run.output_dir / "checkpoint-10"),
                "--stats",
                str(tmp_path / "s.json"),
            ]
        )
        == 2
    )
    assert "--stats needs --level deep" in capsys.readouterr().err
    assert (
        main(
            [
                "validate",
                str(hf_run.output_dir / "checkpoint-10"),
                "--level",
                "deep",
                "--stats",
                str(tmp_path / "missing-dir" / "s.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot write" in err


def test_hypothesis_pickle_reader_never_raises():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=300))
    def run(blob):
        scan = tp.read_pickle(b"\x80\x02" + blob)
        assert scan.complete or scan.error

    run()


def test_hostile_names_cannot_forge_report_lines(tmp_path, capsys):
    """A global or tensor name with a newline is escaped in the one-line reason."""
    data = b"\x80\x02cposix\nsystem\nq\x00."  # GLOBAL 'posix system'
    evil = tmp_path / "x.pt"
    forged = b"\x80\x02X\x10\x00\x00\x00posix\nVALID  x\n\nX\x06\x00\x00\x00system\x93q\x00."
    for blob in (data, forged):
        with zipfile.ZipFile(evil, "w") as zf:
            zf.writestr("archive/data.pkl", blob)
            zf.writestr("archive/version", b"3\n")
        assert main(["validate", str(evil)]) == 1
        out = capsys.readouterr().out
        problem_lines = [line for line in out.splitlines() if "unsafe pickle" in line]
        assert len(problem_lines) == 1 and "VALID  x" not in out.replace(problem_lines[0], "")
    w = torch.zeros(4)
    w[1] = float("nan")
    path = tmp_path / "w.pt"
    torch.save({"state_dict": {"layer\nVALID      forged": w}}, path)
    r = validate_checkpoint(path, level="deep")
    assert (
        r.problems and "\n" not in r.problems[0].reason and "layer\\nVALID" in r.problems[0].reason
    )


def test_hostile_pickle_shapes():
    """Pathological but parseable pickles: deep nesting, self-reference, unhashable keys, bad memo."""
    deep_list = b"\x80\x02" + b"]" * 50_000 + b"a" * 49_999 + b"."  # 50 000 nested lists
    scan = tp.read_pickle(deep_list)
    assert scan.complete and list(tp.walk_tensors(scan.root)) == []
    self_ref = b"\x80\x02]q\x00h\x00a."  # a list holding itself
    scan = tp.read_pickle(self_ref)
    assert scan.complete and list(tp.walk_tensors(scan.root)) == []
    bad_key = b"\x80\x02}](K\x01e\x88s."  # a list as a dict key
    scan = tp.read_pickle(bad_key)  # refused as Python's unpickler (and torch.load) refuse it
    assert not scan.complete and "unhashable" in scan.error
    assert not tp.read_pickle(b"\x80\x02h\x05.").complete  # memo read before write


def test_documented_layouts_have_no_false_positives_at_deep(tmp_path):
    """DeepSpeed ZeRO shards (flat partitions), Megatron TP ranks, Orbax, NeMo, torchtitan DCP."""
    import layouts

    roots = [
        layouts.build_orbax(tmp_path / "orbax"),
        layouts.build_deepspeed(tmp_path / "ds"),
        layouts.build_megatron(tmp_path / "meg", tp=2),
        layouts.build_nemo(tmp_path / "nemo"),
        layouts.build_torchtitan(tmp_path / "tt"),
    ]
    report = validate_paths([str(r) for r in roots], level="deep")
    assert len(report.checkpoints) >= 10
    for c in report.checkpoints:
        assert c.status == "valid" and c.passes_deep(), (c.path, _problems(c))


def test_view_past_its_storage_is_invalid(tmp_path):
    """A pickle whose _rebuild_tensor_v2 offset points past the storage: torch.load fails; so do we."""
    good = tmp_path / "w.pt"
    torch.save({"w": torch.arange(8, dtype=torch.float32)[2:6]}, good)
    with zipfile.ZipFile(good) as zf:
        rows = [(i.filename, zf.read(i)) for i in zf.infolist()]
    pkl = next(n for n, _ in rows if n.endswith("data.pkl"))
    data = dict(rows)[pkl]
    # BININT1 2 (the storage offset) -> BININT1 7: the 4-element view now ends at element 11 of 8
    i = data.index(b"K\x02")
    bad = tmp_path / "bad.pt"
    with zipfile.ZipFile(bad, "w") as zf:
        for name, blob in rows:
            zf.writestr(name, blob[:i] + b"K\x07" + blob[i + 2 :] if name == pkl else blob)
    with pytest.raises(TORCH_REFUSES):
        torch.load(bad, weights_only=True)
    r = validate_checkpoint(bad)
    assert r.status == "invalid" and "runs past the end of its storage" in r.problems[0].reason
    assert validate_checkpoint(good, level="deep").status == "valid"


def test_stats_output_checked_before_the_scan(hf_run, tmp_path, capsys):
    for bad in (tmp_path, tmp_path / "no" / "s.json"):
        assert (
            main(
                [
                    "validate",
                    str(hf_run.output_dir / "checkpoint-10"),
                    "--level",
                    "deep",
                    "--stats",
                    str(bad),
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--stats: cannot write" in err


def test_hostile_weight_map_values_never_crash(hf_run, copy_of):
    ckpt = copy_of(hf_run.output_dir / "checkpoint-10")
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": [1], "b": 5, "c": "../x"}})
    )
    r = validate_checkpoint(ckpt)
    reasons = sorted(p.reason for p in r.problems)
    assert (
        r.status == "invalid" and len(reasons) == 3 and all("invalid shard" in x for x in reasons)
    )


def test_deep_reads_a_torch_archive_once_and_checks_every_crc(hf_run, copy_of):
    """Level deep checks the CRC-32 of every entry of optimizer.pt in the pass that reads its values (the archive is
    read once): a clean checkpoint reads no more bytes than level full does, not full's and then the scan's; a byte flipped anywhere in an
    entry's data (a moment's value, the pickle, a record, bytes no tensor covers) gives exactly level full's finding,
    with no deep outcome, as when full's pass ran first; and with another problem in the checkpoint (no value
    scan) the CRC finding is still there."""
    ckpt = copy_of(hf_run.output_dir / "checkpoint-40")
    opt = ckpt / "optimizer.pt"
    full, deep = validate_checkpoint(ckpt, level="full"), validate_checkpoint(ckpt, level="deep")
    assert (
        deep.status == "valid"
        and deep.deep is not None
        and deep.deep.bytes_scanned > opt.stat().st_size // 2
    )
    assert (
        deep.bytes_read <= full.bytes_read
    )  # (before: full's pass over optimizer.pt, then the value scan's)
    clean = opt.read_bytes()
    with zipfile.ZipFile(opt) as z:
        infos = [i for i in z.infolist() if i.file_size]
    picks = {i.filename.rsplit("/", 1)[-1]: i for i in infos}
    flips = [picks[k] for k in ("data.pkl", "version", "serialization_id") if k in picks]
    flips += sorted((i for i in infos if "/data/" in i.filename), key=lambda i: -i.file_size)[:2]
    for info in flips:
        raw = bytearray(clean)
        lh = info.header_offset
        start = (
            lh
            + 30
            + struct.unpack_from("<H", raw, lh + 26)[0]
            + struct.unpack_from("<H", raw, lh + 28)[0]
        )
        at = start + info.file_size // 2
        raw[at] ^= 0x01
        opt.write_bytes(bytes(raw))
        full, deep = (
            validate_checkpoint(ckpt, level="full"),
            validate_checkpoint(ckpt, level="deep"),
        )
        assert _problems(deep) == _problems(full), info.filename
        assert len(full.problems) == 1, full.problems
        assert "CRC-32 mismatch" in full.problems[0].reason or info.filename.endswith(
            "data.pkl"
        )  # (or it does
        #                                                                  not parse: found before any CRC)
        assert deep.deep is None
    (ckpt / "trainer_state.json").write_text("{")  # another problem: the value scan does not run
    full, deep = validate_checkpoint(ckpt, level="full"), validate_checkpoint(ckpt, level="deep")
    assert sorted(_problems(deep)) == sorted(_problems(full))
    assert any("CRC-32 mismatch" in reason for _f, reason, _k in _problems(deep))
    opt.write_bytes(clean)
