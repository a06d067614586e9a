"""formats/{dcp,deepspeed,orbax,hf}.py: what a framework's own metadata says, read without executing it."""

from __future__ import annotations

import os
import pickle
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_strategy.formats import dcp, deepspeed, orbax


def model_states(tmp_path, state) -> str:
    """A torch-style zip archive holding data.pkl (written with pickle.dumps; never loaded here)."""
    path = tmp_path / "mp_rank_00_model_states.pt"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("mp_rank_00_model_states/data.pkl", pickle.dumps(state, protocol=2))
    return str(path)


def test_zero_stage_and_world_size_from_the_pickle(tmp_path):
    state = {
        "module": {"w": [1, 2]},
        "dp_world_size": 4,
        "ds_config": {
            "pipeline": {"stage": 7},
            "zero_optimization": {"offload": {"x": 1}, "stage": 2},
        },
    }
    assert deepspeed.deepspeed_zero_layout(deepspeed.zip_pickle(model_states(tmp_path, state))) == (
        2,
        4,
    )


def test_no_zero_config_means_unknown(tmp_path):
    assert deepspeed.deepspeed_zero_layout(
        deepspeed.zip_pickle(model_states(tmp_path, {"module": {}}))
    ) == (None, None)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_garbage_pickles_never_raise(data):
    stage, dp = deepspeed.deepspeed_zero_layout(data)
    assert stage is None or isinstance(stage, int)
    assert dp is None or isinstance(dp, int)


def test_zip_pickle_refuses_fifos_truncation_and_non_zips(tmp_path):
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    assert deepspeed.zip_pickle(str(fifo)) is None
    good = model_states(tmp_path, {"dp_world_size": 1})
    raw = open(good, "rb").read()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(raw[: len(raw) // 2])
    assert deepspeed.zip_pickle(str(cut)) is None
    (tmp_path / "text.pt").write_text("not a zip")
    assert deepspeed.zip_pickle(str(tmp_path / "text.pt")) is None
    assert deepspeed.zip_pickle(str(tmp_path / "missing.pt")) is None


@pytest.mark.parametrize(
    "meta, expected",
    [
        (
            {
                "tree_metadata": {
                    "('opt_state', 'mu')": {"key_metadata": [{"key": "opt_state"}, {"key": "mu"}]}
                }
            },
            True,
        ),
        (
            {
                "tree_metadata": {
                    "('params', 'opt')": {"key_metadata": [{"key": "params"}, {"key": "opt"}]}
                }
            },
            False,
        ),
        ({"tree_metadata": {"x": {"key_metadata": "opt"}}}, False),
        ({"tree_metadata": []}, False),
        ([1, 2], False),
        (None, False),
    ],
)
def test_orbax_optimizer_key_at_the_top_of_the_tree(meta, expected):
    assert orbax.orbax_item_has_optimizer(meta) is expected


def test_torchtitan_reason_only_for_model_only_keys():
    assert (
        dcp.torchtitan_model_only_reason(
            {"tok_embeddings", "layers", "optimizer", "train_state"}, 10
        )
        is None
    )
    assert dcp.torchtitan_model_only_reason(set(), 10) is None
    reason = dcp.torchtitan_model_only_reason({"tok_embeddings", "layers", "norm", "output"}, 20)
    assert (
        reason.startswith("not resumable")
        and "step-20" in reason
        and "last_save_model_only" in reason
    )


def _orbax_entry(keys: list[tuple[str, int]], shape=(2, 3)) -> dict:
    return {
        "key_metadata": [{"key": k, "key_type": t} for k, t in keys],
        "value_metadata": {
            "value_type": "jax.Array",
            "skip_deserialize": False,
            "write_shape": list(shape),
        },
    }


def test_orbax_params_are_a_value_or_a_refusal_by_type():
    """orbax_params: the params, a Refused with the reason, or None (a layout it does not judge); never a bare str."""
    tree = {
        "('params', 'w')": _orbax_entry([("params", 2), ("w", 2)]),
        "('opt', '0')": _orbax_entry([("opt", 2), ("0", 1)]),
    }
    assert orbax.orbax_params({"use_ocdbt": True, "tree_metadata": tree}) == {
        "params.w": [2, 3],
        "opt.0": [2, 3],
    }
    assert orbax.orbax_params({"use_ocdbt": True}) == orbax.Refused("no tree_metadata object")
    assert orbax.orbax_params({"use_ocdbt": "yes", "tree_metadata": tree}) == orbax.Refused(
        "use_ocdbt is not true or false"
    )
    flipped = {"('opt', 'x')": _orbax_entry([("opt", 2), ("x", 1)])}
    got = orbax.orbax_params({"use_ocdbt": True, "tree_metadata": flipped})
    assert isinstance(got, orbax.Refused) and "sequence key 'x' that is not an index" in got.reason
    assert (
        orbax.orbax_params(["not", "a", "dict"]) is None
        and orbax.orbax_params({"tree_metadata": {"a": 1}}) is None
    )


# --------------------------------------------------------------------------- Orbax: zstd frames before OCDBT nodes


def _ocdbt_node(payload: bytes) -> bytes:
    import struct

    body = b"\x0c\xdb\x20\xde" + struct.pack("<Q", 4 + 8 + len(payload) + 4) + payload
    return body + struct.pack("<I", orbax.crc32c(body))


def _zstd_raw_frame(content: bytes, fcs: int | None = None) -> bytes:
    """A zstd frame (RFC 8878) of one raw last block: single segment, a 4-byte content size."""
    size = len(content) if fcs is None else fcs
    header = b"\x28\xb5\x2f\xfd" + bytes([0xA0]) + size.to_bytes(4, "little")
    return header + (1 | len(content) << 3).to_bytes(3, "little") + content


def test_an_ocdbt_data_file_of_a_zstd_frame_then_a_node_is_walked_to_its_node():
    """A big Orbax array's chunk is a zstd frame at the start of an OCDBT data file, the nodes after it
    (tests/test_oracle_mutations.py's real one): full walks the frame and checks the node's CRC-32C."""
    frame, node = _zstd_raw_frame(bytes(300)), _ocdbt_node(b"n" * 40)
    assert orbax.zstd_frame_end(frame + node, 0) == len(frame)
    assert orbax.ocdbt_nodes(frame + node, manifest=False) is None
    damaged = bytearray(frame + node)
    damaged[len(frame) + 20] ^= 1
    assert "CRC-32C mismatch" in orbax.ocdbt_nodes(bytes(damaged), manifest=False)
    assert "truncated" in orbax.ocdbt_nodes(frame[:200], manifest=False)
    assert "more than its 1 blocks can hold" in orbax.ocdbt_nodes(
        _zstd_raw_frame(bytes(300), 300 | 1 << 20) + node, manifest=False
    )
    reserved = bytearray(frame)
    reserved[9] |= 0b110  # block type 3
    assert "reserved block type" in orbax.ocdbt_nodes(bytes(reserved) + node, manifest=False)
    assert "neither a frame nor an OCDBT node" in orbax.ocdbt_nodes(
        frame + b"junk" * 10, manifest=False
    )


# --------------------------------------------------------------------------- zstd frames decoded (optional zstandard)


def _rle_frame(blocks: int, fcs: int | None = None) -> bytes:
    """A zstd frame of `blocks` RLE blocks of 128 KiB each (4 bytes a block): a tiny file that regenerates
    blocks * 128 KiB. Window 128 KiB; a 4-byte content size when fcs is given, else none."""
    if fcs is None:
        header = b"\x28\xb5\x2f\xfd" + bytes([0x00, 0x38])
    else:
        header = b"\x28\xb5\x2f\xfd" + bytes([0x80, 0x38]) + fcs.to_bytes(4, "little")
    block = orbax.ZSTD_MAX_BLOCK << 3 | 1 << 1
    body = b"".join(
        ((block | (i == blocks - 1)).to_bytes(3, "little") + b"\x07") for i in range(blocks)
    )
    return header + body


def test_a_zstd_frame_whose_content_is_not_what_its_header_declares_is_refused_when_decoded():
    """With zstandard installed full decodes each frame the walk found (formats/zstd.py): a content size one more
    than the block holds (within what its blocks can hold, so the walk alone passes) is refused, as tensorstore
    refuses it; without zstandard the walk alone decides (today's verdict, and the blind spot names the package)."""
    from checkpoint_strategy.formats import zstd

    node = _ocdbt_node(b"n" * 40)
    short = _zstd_raw_frame(bytes(300), 301) + node
    assert orbax.zstd_frame_end(short, 0) == len(short) - len(node)
    reason = orbax.ocdbt_nodes(short, manifest=False)
    if not zstd.available():
        assert reason is None
        return
    assert reason is not None and reason.startswith("the zstd frame of array values at byte 0: ")
    assert "\n" not in reason and len(reason) < 300
    assert orbax.ocdbt_nodes(_zstd_raw_frame(bytes(300)) + node, manifest=False) is None


def test_every_flip_zstandard_refuses_in_a_real_frame_is_refused_and_a_checksum_catches_the_rest():
    """Real frames (zstandard's compressor, with and without a content checksum) before an OCDBT node, each bit of
    the compressed block flipped in turn: full refuses every flip zstandard's own decoder refuses (the oracle); with a
    checksum every flip is refused; without one, flips that decode to other bytes of the right size are the blind
    spot (docs/deep-validation.md)."""
    zstandard = pytest.importorskip(
        "zstandard", reason="optional: pip install zstandard (frameworks/test extras)"
    )
    node = _ocdbt_node(b"n" * 40)
    content = bytes(range(256)) * 64 + b"values" * 500
    for checksum in (False, True):
        frame = zstandard.ZstdCompressor(write_checksum=checksum).compress(content)
        assert orbax.ocdbt_nodes(frame + node, manifest=False) is None
        refused = missed = 0
        for at in range(orbax._zstd_header(frame, 0)[0] + 3, len(frame)):
            damaged = bytearray(frame)
            damaged[at] ^= 1 << (at % 8)
            try:
                oracle = zstandard.ZstdDecompressor().decompress(bytes(damaged)) is None
            except zstandard.ZstdError:
                oracle = True
            ours = orbax.ocdbt_nodes(bytes(damaged) + node, manifest=False)
            assert not oracle or ours is not None, (checksum, at)
            assert ours is None or "\n" not in ours
            refused += oracle
            missed += ours is None
        assert refused > 0 and (missed == 0 if checksum else missed < len(frame))
    magic = bytearray(frame + node)
    magic[2] ^= 4  # the frame's magic number: the bytes would read as uncompressed values
    assert "magic number has a flipped bit" in orbax.ocdbt_nodes(bytes(magic), manifest=False)


def test_hostile_zstd_frames_give_one_reason_in_bounded_memory():
    """A frame of a few KB can regenerate gigabytes (RLE blocks): decoding streams and counts, never holding the
    output, and stops one read past the declared size or the caller's limit."""
    import tracemalloc

    pytest.importorskip(
        "zstandard", reason="optional: pip install zstandard (frameworks/test extras)"
    )
    from checkpoint_strategy.formats import zstd

    big = _rle_frame(512)  # 2 KB that decode to 64 MiB, no content size declared
    tracemalloc.start()
    try:
        assert zstd.frame_problem(big, 0, len(big), -1, 1 << 30) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert (
        zstd.frame_problem(big, 0, len(big), -1, 1 << 20) == f"decodes to more than {1 << 20} bytes"
    )
    lying = _rle_frame(512, fcs=1000)  # declares 1000 bytes, its blocks hold 64 MiB
    reason = zstd.frame_problem(lying, 0, len(lying), 1000, 1 << 30)
    assert reason is not None and "\n" not in reason
    assert "more than its" not in (orbax.ocdbt_nodes(lying, manifest=False) or "more than its")
    truncated = big[: len(big) // 2]
    assert "truncated" in orbax.ocdbt_nodes(truncated, manifest=False)
    whole = _rle_frame(
        512, fcs=512 * orbax.ZSTD_MAX_BLOCK
    )  # (the walk finds a frame's end; cut, it decodes short)
    assert orbax.ocdbt_nodes(whole, manifest=False) is None
    assert zstd.frame_problem(
        whole, 0, len(whole) // 2, 512 * orbax.ZSTD_MAX_BLOCK, 1 << 30
    ).startswith("decodes to ")
