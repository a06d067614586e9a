"""validate/coverage.py: what each level cannot see, per kind of data (the report's blind_spots).
The real saves (DCP, Orbax, Lightning) are in tests/test_checkpoints_misreads.py; these pin the table."""

from __future__ import annotations

from checkpoint_strategy.validate.coverage import blind_spots, families


def test_each_family_at_each_level():
    every = [("zip",), ("safetensors",), ("dcp",), ("orbax",)]
    quick, full, deep = (blind_spots(every, level) for level in ("quick", "full", "deep"))
    assert [line.split(":")[0] for line in quick] == ["torch zip archives (.pt/.bin/.ckpt)", "safetensors tensor data",
                                                      "DCP shard data (.distcp)", "Orbax/tensorstore array data"]
    assert "--level full checks the CRC-32" in quick[0] and "--level full checks the CRC-32" in quick[2]
    assert full == deep and full[0] == quick[1] and full[2] == quick[3]   # zip archives: CRC-32 at full
    assert "raw bytes" in full[1]             # DCP items are torch archives (CRC-32) unless written raw
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
