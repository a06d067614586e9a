"""validate/coverage.py: what each level cannot see, per kind of data (the report's blind_spots).
The real saves (DCP, Orbax, Lightning) are in tests/test_checkpoints_misreads.py; these pin the table."""

from __future__ import annotations

import pytest

from checkpoint_strategy.validate.coverage import blind_spots, families


def test_each_family_at_each_level():
    every = [("zip",), ("safetensors",), ("dcp",), ("orbax",)]
    quick, full, deep = (blind_spots(every, level) for level in ("quick", "full", "deep"))
    assert [line.split(":")[0] for line in quick] == [
        "torch zip archives (.pt/.bin/.ckpt)",
        "safetensors tensor data",
        "DCP shard data (.distcp)",
        "Orbax/tensorstore array data",
    ]
    assert (
        "--level full checks the CRC-32" in quick[0]
        and "--level full checks the CRC-32" in quick[2]
    )
    assert full == deep and full[0] == quick[1]  # zip archives: CRC-32 at full
    assert "read at --level full only" in quick[3] and "outside OCDBT's nodes" in full[2]
    assert "raw bytes" in full[1]  # DCP items are torch archives (CRC-32) unless written raw
    assert all("--manifest verify" in line and "not seen" in line for line in full)
    assert blind_spots(every, "deep", manifest="verify") == []
    assert blind_spots([("zip",)], "full") == [] and blind_spots([], "quick") == []


def test_families_from_format_and_folder(tmp_path):
    assert families("hf-trainer", str(tmp_path)) == ("zip", "safetensors")
    (tmp_path / "pytorch_model_fsdp_0").mkdir()
    assert families("hf-trainer", str(tmp_path)) == ("zip", "safetensors", "dcp")
    sharded = tmp_path / "last.ckpt"
    sharded.mkdir()
    assert families("lightning", str(sharded)) == ("zip",)
    (sharded / ".metadata").write_bytes(b"")
    assert families("lightning", str(sharded)) == ("zip", "dcp")
    assert families("torchtitan", "x") == families("dcp", "x") == ("dcp",)
    assert families("orbax", "x") == ("orbax",) and families("unknown", "x") == ()


def test_orbax_frames_name_zstandard_when_it_is_missing(monkeypatch):
    """Full decodes Orbax's zstd frames only with the optional zstandard package: without it the blind spot says
    what to install; with it, only a flip that still decodes is left (Orbax's frames carry no checksum)."""
    import sys

    monkeypatch.setitem(sys.modules, "zstandard", None)  # (import then raises ImportError)
    (missing,) = blind_spots([("orbax",)], "full")
    assert "install zstandard to check Orbax values stored as zstd frames" in missing
    from checkpoint_strategy.formats import orbax

    frame = (
        b"\x28\xb5\x2f\xfd\xa0"
        + (301).to_bytes(4, "little")
        + (1 | 300 << 3).to_bytes(3, "little")
        + bytes(300)
    )
    assert (
        orbax.ocdbt_nodes(frame, manifest=False) is None
    )  # a content size its block does not fill: not decoded
    monkeypatch.undo()
    pytest.importorskip(
        "zstandard", reason="optional: pip install zstandard (frameworks/test extras)"
    )
    (decoded,) = blind_spots([("orbax",)], "deep")
    assert "are decoded" in decoded and "install" not in decoded
    assert "the zstd frame of array values at byte 0: does not decode" in orbax.ocdbt_nodes(
        frame, manifest=False
    )
