"""File-level checks: safetensors headers, zip archives, DCP .metadata opcodes; hypothesis fuzzing."""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import pytest
from cliresult import run_captured
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.formats import filechecks as fc


def _st_file(path: Path, header: dict, data: bytes, pad: int = 0) -> Path:
    raw = json.dumps(header).encode() + b" " * pad
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_safetensors_rules(tmp_path, safetensors_file):
    c = zr.Counter()
    assert fc.check_safetensors(str(safetensors_file), c) == []
    ok = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "__metadata__": {"format": "pt"},
    }
    assert (
        fc.check_safetensors(str(_st_file(tmp_path / "ok.safetensors", ok, b"\0" * 8, pad=5)), c)
        == []
    )
    cases = {
        "shape": (
            {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
            b"\0" * 8,
            "needs 12 bytes",
        ),
        "dtype": (
            {"a": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}},
            b"\0" * 8,
            "unknown dtype",
        ),
        "gap": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "gap"),
        "overlap": (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
            },
            b"\0" * 8,
            "overlaps",
        ),
        "trailing": (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
            b"\0" * 9,
            "trailing",
        ),
        "short": (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
            b"\0" * 7,
            "truncated",
        ),
        "meta": ({"__metadata__": {"x": 1}}, b"", "__metadata__"),
    }
    for name, (header, data, expect) in cases.items():
        reasons = fc.check_safetensors(
            str(_st_file(tmp_path / f"{name}.safetensors", header, data)), c
        )
        assert reasons and expect in reasons[0], (name, reasons)


def test_dcp_metadata_read_as_data(dcp_checkpoint):
    from checkpoint_strategy.formats import dcp
    from checkpoint_strategy.formats import safepickle as tp

    data = (dcp_checkpoint / ".metadata").read_bytes()
    md = dcp.dcp_metadata(tp.read_pickle(data))
    assert md.keys == {"model", "optimizer"}
    assert md.needed == {"__0_0.distcp": (dcp_checkpoint / "__0_0.distcp").stat().st_size}
    assert "model.0.weight" in {t.fqn for t in md.tensors}
    assert all(c.offsets is not None and c.sizes is not None for t in md.tensors for c in t.chunks)
    with pytest.raises(dcp.DcpBroken):
        dcp.dcp_metadata(tp.read_pickle(data[: len(data) // 2]))


def test_no_checkpoint_content_is_ever_executed(tmp_path):
    """A pickle that would run code if loaded is only read: no side effect happens."""
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    root = tmp_path / "step-1"
    root.mkdir()
    (root / ".metadata").write_bytes(pickle.dumps(Evil()))
    (root / "__0_0.distcp").write_bytes(b"x")
    import zipfile

    with zipfile.ZipFile(tmp_path / "evil.ckpt", "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps(Evil()))
    assert run_captured(
        ["validate", str(root), str(tmp_path / "evil.ckpt"), "--level", "full"]
    ).rc in (0, 1)
    assert not marker.exists()


_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 1 << 40),
    st.text(max_size=8),
    st.sampled_from(["F32", "BF16", "I64", "F8_E4M3", "BOOL"]),
)
_tensor = st.fixed_dictionaries(
    {
        "dtype": st.one_of(st.sampled_from(["F32", "F16", "U8", "F4"]), _json_leaf),
        "shape": st.one_of(st.lists(st.integers(-1, 6), max_size=3), _json_leaf),
        "data_offsets": st.one_of(
            st.lists(st.integers(-2, 64), min_size=0, max_size=3), _json_leaf
        ),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    header=st.dictionaries(
        st.text(min_size=1, max_size=6), st.one_of(_tensor, _json_leaf), max_size=4
    ),
    data=st.binary(max_size=80),
    length_delta=st.integers(-4, 4),
    level=st.sampled_from(["quick", "full"]),
)
def test_fuzz_safetensors_headers(header, data, length_delta, level):
    with tempfile.TemporaryDirectory() as d:
        raw = json.dumps(header).encode()
        path = Path(d) / "model.safetensors"
        path.write_bytes(struct.pack("<Q", max(0, len(raw) + length_delta)) + raw + data)
        r = run_captured(["validate", str(path), "--level", level])
        assert r.rc in (0, 1) or r.usage_error()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    blob=st.binary(max_size=400),
    name=st.sampled_from(
        [
            "model.safetensors",
            "x.ckpt",
            "w.pt",
            "step-3/.metadata",
            "step-3/__0_0.distcp",
            "checkpoint-5/optimizer.pt",
            "checkpoint-5/trainer_state.json",
            "7/_CHECKPOINT_METADATA",
            "global_step4/mp_rank_00_model_states.pt",
        ]
    ),
    level=st.sampled_from(["quick", "full"]),
)
def test_fuzz_random_bytes_as_checkpoint_files(blob, name, level):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
        r = run_captured(["validate", d, "--level", level, "--format", "json"])
        assert r.rc in (0, 1) or r.usage_error()


def _same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b, strict=True))
        )
    return type(a) is type(b) and a == b


def _torch_loads_the_same(data: bytes, original) -> bool:
    import io

    import torch

    try:
        return _same(torch.load(io.BytesIO(data), weights_only=True, map_location="cpu"), original)
    except Exception:  # noqa: BLE001 - any refusal by torch.load is the oracle's "not loadable"
        return False


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blob=st.binary(min_size=1, max_size=64), offset_frac=st.floats(0, 1), near_end=st.booleans())
def test_fuzz_corrupted_real_zip(blob, offset_frac, near_end, lightning_run):
    """A real Lightning .ckpt with bytes overwritten (half the time in the last 4 KB: the central directory
    and end record): full validation says valid only when torch.load, in this test, loads the same tensors."""
    import io

    import torch

    good = lightning_run.ckpt_files[0].read_bytes()
    original = torch.load(io.BytesIO(good), weights_only=True, map_location="cpu")
    data = bytearray(good)
    lo = max(0, len(data) - 4096) if near_end else 0
    at = lo + int(offset_frac * (len(data) - 1 - lo))
    data[at : at + len(blob)] = blob
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "epoch=0-step=10.ckpt"
        path.write_bytes(bytes(data))
        rc = run_captured(["validate", str(path), "--level", "full"]).rc
    assert rc in (0, 1)
    if rc == 0:
        assert _torch_loads_the_same(bytes(data), original), (
            f"validate passed a file torch.load refuses ({at=})"
        )


# (record, offset in it, struct format, value or None to OR the flag bits in, what validate must name or None)
ZIP_FIELDS = [
    ("cdh", 8, "<H", 0x0001, "encrypted"),
    ("cdh", 8, "<H", 0x0040, "encrypted"),
    ("cdh", 8, "<H", 0x2000, "encrypted"),
    ("cdh", 8, "<H", 0x0020, "patched"),
    ("cdh", 8, "<H", 0x0008, None),
    ("cdh", 34, "<H", 2, "multi-disk"),
    ("cdh", 34, "<H", 0xFFFF, "multi-disk"),
    ("cdh", 34, "<H", 1, None),
    ("loc", 16, "<I", 2, "multi-disk"),
    ("z64", 24, "<Q", 6, "multi-disk"),
    ("z64", 16, "<I", 1, "multi-disk"),
    ("z64", 4, "<Q", 40, "zip64"),
    ("z64", 32, "<Q", 1 << 33, "entries"),
    ("eocd", 4, "<H", 1, None),
    ("eocd", 8, "<H", 6, None),  # the 32-bit fields: torch.load reads zip64's instead
]


@pytest.mark.parametrize("record, offset, fmt, value, refused", ZIP_FIELDS)
def test_zip_fields_torch_load_refuses_are_invalid(tmp_path, record, offset, fmt, value, refused):
    """Issue 18's real misses: an entry marked encrypted, or on another disk, passed full validation though
    torch.load refuses it; so did end records that torch.load reads from zip64. The oracle is torch.load itself."""
    import io

    import torch

    buf = io.BytesIO()
    original = {"w": torch.arange(6.0), "step": 3}
    torch.save(original, buf)
    data = bytearray(buf.getvalue())
    sig = {"cdh": b"PK\x01\x02", "loc": b"PK\x06\x07", "z64": b"PK\x06\x06", "eocd": b"PK\x05\x06"}[
        record
    ]
    at = (data.index if record == "cdh" else data.rindex)(
        sig
    ) + offset  # first entry (data.pkl), last records
    flags = record == "cdh" and offset == 8
    struct.pack_into(
        fmt, data, at, (struct.unpack_from(fmt, data, at)[0] | value) if flags else value
    )
    assert _torch_loads_the_same(bytes(data), original) is (refused is None)
    path = tmp_path / "model.pt"
    path.write_bytes(bytes(data))
    r = run_captured(["validate", str(path), "--level", "full", "--format", "json"])
    assert r.rc == (0 if refused is None else 1)
    if refused:
        reasons = [x["reason"] for x in r.json()["checkpoints"][0]["problems"]]
        assert any(refused in x for x in reasons), reasons


def _multi_entry_zip(path, n=6, size=200_000):
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        for i in range(n):
            zf.writestr(f"archive/data/{i}", bytes([i]) * size)
        zf.writestr("archive/version", b"3\n")  # torch.load refuses an archive without it
    return path


def test_parallel_crc_matches_sequential_and_finds_the_first_bad_entry(tmp_path, monkeypatch):
    from checkpoint_strategy.formats import filechecks as fc

    good = _multi_entry_zip(tmp_path / "good.pt")
    monkeypatch.setattr(zr, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(zr, "CRC_WORKERS", 3)
    c = zr.Counter()
    reasons, _ = fc.check_zip(str(good), c, full=True)
    assert reasons == []
    assert c.bytes_read >= 6 * 200_000
    bad = tmp_path / "bad.pt"
    data = bytearray(good.read_bytes())
    for i in (
        4,
        2,
    ):  # corrupt entries 2 and 4: the report names entry 2, the first in archive order
        at = data.index(bytes([i]) * 1000) + 500
        data[at] ^= 0xFF
    bad.write_bytes(bytes(data))
    reasons, _ = fc.check_zip(str(bad), zr.Counter(), full=True)
    assert len(reasons) == 1 and "archive/data/2" in reasons[0] and "CRC-32 mismatch" in reasons[0]
    seen = []
    reasons, _ = fc.check_zip(
        str(good), zr.Counter(), full=True, update=lambda update_bytes: seen.append(update_bytes)
    )
    assert reasons == [] and sum(seen) >= 6 * 200_000


@pytest.mark.parametrize(
    "offset, fmt", [(10, "<H"), (12, "<I"), (16, "<I")]
)  # entries, cd size, cd offset
def test_one_zip64_sentinel_without_a_zip64_record_is_invalid(tmp_path, offset, fmt):
    """An archive with no zip64 records (re-zipped by Python's zipfile) whose 32-bit end record says "see zip64"
    (0xFFFF / 0xFFFFFFFF) in one field only: torch.load refuses it, and validate names the missing zip64 record."""
    import io
    import zipfile

    import torch

    buf = io.BytesIO()
    original = {"w": torch.arange(6.0), "step": 3}
    torch.save(original, buf)
    src, out = zipfile.ZipFile(io.BytesIO(buf.getvalue())), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info.filename))
    data = bytearray(out.getvalue())
    assert (
        b"PK\x06\x06" not in data and b"PK\x06\x07" not in data
    )  # no zip64 end record, no locator
    assert _torch_loads_the_same(bytes(data), original)  # the re-zipped archive loads as it is
    struct.pack_into(
        fmt, data, data.rindex(b"PK\x05\x06") + offset, 0xFFFF if fmt == "<H" else 0xFFFFFFFF
    )
    assert not _torch_loads_the_same(bytes(data), original)
    path = tmp_path / "model.pt"
    path.write_bytes(bytes(data))
    r = run_captured(["validate", str(path), "--level", "full", "--format", "json"])
    assert r.rc == 1
    reasons = [x["reason"] for x in r.json()["checkpoints"][0]["problems"]]
    assert any("zip64" in x for x in reasons), reasons


def _rezipped(original: dict, compression: int, keep=lambda name: True) -> bytes:
    """torch.save(original) re-zipped entry by entry with `compression`, only the entries `keep` accepts."""
    import io
    import zipfile

    import torch

    buf, out = io.BytesIO(), io.BytesIO()
    torch.save(original, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    with zipfile.ZipFile(out, "w", compression) as z:
        for info in src.infolist():
            if keep(info.filename):
                z.writestr(info.filename, src.read(info.filename))
    return out.getvalue()


def test_deflated_archive_that_torch_loads_is_valid_and_its_strings_are_read(tmp_path):
    """torch.save stores entries; an archive re-zipped with deflate (data.pkl and a 6 MB storage, more than one
    4 MB streaming chunk) still loads with torch.load (the oracle), so full validation must pass it, and the pickle's
    strings (inside lists and tuples too) are read."""
    import zipfile

    import torch

    original = {
        "w": torch.randn(1_500_000, generator=torch.Generator().manual_seed(0)),
        "names": ["a", ("b", "c")],
    }
    data = _rezipped(original, zipfile.ZIP_DEFLATED)
    assert _torch_loads_the_same(data, original)
    path = tmp_path / "model.pt"
    path.write_bytes(data)
    r = run_captured(["validate", str(path), "--level", "full", "--format", "json"])
    assert r.rc == 0, r.json()["checkpoints"][0]["problems"]
    findings, strings = fc.check_zip(str(path), zr.Counter(), full=True, want_pickle=True)
    assert findings == []
    assert {"w", "names", "a", "b", "c"} <= set(strings)


def test_pickle_strings_are_string_constants_not_global_names():
    import collections
    import pickle

    data = pickle.dumps(
        collections.OrderedDict(alpha=1), protocol=2
    )  # GLOBAL 'collections OrderedDict'
    assert fc.pickle_strings(data) == ["alpha"]


def test_zip64_extra_holds_only_the_fields_the_header_marks():
    """APPNOTE 4.5.3: the zip64 extra field lists, in the order uncompressed size, compressed size, offset, only the
    values whose 32-bit header field is 0xFFFFFFFF."""
    big = 5 << 32
    only_usize = struct.pack("<HHQ", 1, 8, big)
    assert zr._zip64_extra(only_usize, 10, 0xFFFFFFFF, 7) == (10, big, 7)
    only_offset = struct.pack("<HHQ", 1, 8, big)
    assert zr._zip64_extra(only_offset, 10, 20, 0xFFFFFFFF) == (10, 20, big)
    all_three = struct.pack("<HHQQQ", 1, 24, 1, 2, 3)
    assert zr._zip64_extra(all_three, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF) == (2, 1, 3)


def test_streaming_counts_every_byte_read(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(2 * zr.CHUNK + 12345))  # three chunks
    counter = zr.Counter()
    assert fc.stream_file(str(path), counter) == []
    assert counter.bytes_read == 2 * zr.CHUNK + 12345


def test_missing_storages_are_named_five_at_most(tmp_path):
    """An archive whose data.pkl references 7 storages none of which is in the zip (torch.load fails on the first):
    the check names the first five in key order and stops there (one line each, not one per storage)."""
    import zipfile

    import torch

    data = _rezipped(
        {f"t{i}": torch.full((3,), float(i)) for i in range(7)},
        zipfile.ZIP_STORED,
        keep=lambda name: "/data/" not in name,
    )
    path = tmp_path / "model.pt"
    path.write_bytes(data)
    prefix = zipfile.ZipFile(path).namelist()[0].split("/")[0]
    with pytest.raises(RuntimeError):
        torch.load(path, weights_only=True)  # the oracle: this archive cannot be loaded
    findings, _ = fc.check_zip(str(path), zr.Counter(), full=False, want_pickle=True)
    assert [str(f) for f in findings] == [
        f"storage data/{k} referenced by {prefix}/data.pkl is missing from the archive"
        for k in range(5)
    ]
