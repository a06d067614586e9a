"""read_pickle is Python's C unpickler restricted to the package's own records: it accepts and refuses what Python's
unpickler accepts and refuses, and refuses before the C unpickler runs what would make it allocate without bound.

Oracles: `pickle.load` of the same bytes from a file (what DCP's reader does with a .metadata; the test may load:
it made or damaged the bytes itself, and only where `_walk_refusal`, the exact opcode walk, finds no memo index or
length past the pickle), and that walk for the bounds: the walk the reader runs, which steps over runs of opcodes
with one regular expression in C, must agree with it (the same refusal, the same FRAME opcodes). The pickles are real (torch.save's data.pkl of an optimizer, a model, RNG states, a DCP
.metadata, plain pickles of every protocol), damaged at every byte of their head and cut at every length.
"""

from __future__ import annotations

import io
import pickle
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_strategy.formats import safepickle as tp

torch = pytest.importorskip("torch", reason="real torch.save pickles")


def _data_pkl(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    z = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    return z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))


@pytest.fixture(scope="module")
def pickles(tmp_path_factory):
    import random

    import numpy as np
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 6)).sum().backward()
    opt.step()
    out = {
        "optimizer": _data_pkl(opt.state_dict()),
        "model": _data_pkl(model.state_dict()),
        "rng": _data_pkl(
            {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "cpu": torch.random.get_rng_state(),
            }
        ),
    }
    folder = tmp_path_factory.mktemp("dcp")
    dcp.save({"w": torch.ones(4)}, checkpoint_id=str(folder))
    out["dcp_metadata"] = (folder / ".metadata").read_bytes()
    value = {
        "a": [1, 2.5, -3, 2**70, "x\u00e9", b"by", (1,), None, True, {1, 2}, frozenset([3])],
        "b": "y" * 300,
        "c": b"q" * 70_000,
        "d": bytearray(b"z"),
        "r": "param_groups" * 3,
    }
    for proto in range(6):
        out[f"protocol{proto}"] = pickle.dumps(value, protocol=proto)
    return out


class _Anything:
    """The oracle's stand-in for a class a pickle names: takes any arguments, state, items."""

    def __init__(self, *args, **kwargs) -> None:
        self.items: dict = {}

    def __setstate__(self, state) -> None:
        self.state = state

    def __setitem__(self, key, value) -> None:
        self.items[key] = value

    def extend(self, values) -> None:
        pass


def _python_refuses(data: bytes) -> bool:
    class Plain(
        pickle.Unpickler
    ):  # the oracle: Python's own unpickler, no global resolved (the tests' plain data
        def find_class(
            self, module, name
        ):  # has none but the builtins protocol 2 writes bytes and sets with)
            return {
                "_codecs.encode": lambda s, enc="latin-1": s.encode(enc),
                "builtins.set": set,
                "builtins.frozenset": frozenset,
                "builtins.bytearray": bytearray,
                "builtins.bytes": bytes,
                "__builtin__.set": set,
            }.get(f"{module}.{name}", _Anything)

        def persistent_load(self, pid):
            return pid

    try:
        Plain(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - any refusal of Python's unpickler
        return True
    return False


def _agrees(data: bytes) -> None:
    """read_pickle against the exact walk and Python's unpickler."""
    scan = tp.read_pickle(data)
    frames: list[int] = []
    walked = tp._walk_refusal(data, frames)
    fast_frames: list[int] = []
    assert tp._walk_refusal(data, fast_frames, fast=True) == walked and fast_frames == frames, data[
        :40
    ]
    if walked is not None:
        assert not scan.complete and scan.error is not None
        return
    assert (
        scan.error is None or "memo index" not in scan.error and "more than the" not in scan.error
    ), scan.error
    if not tp.read_pickle(data).globals or set(tp.read_pickle(data).globals) <= {
        "_codecs.encode",
        "builtins.set",
        "builtins.frozenset",
        "builtins.bytearray",
    }:
        assert scan.complete == (not _python_refuses(data)), (scan.error, data[:40])


def test_real_pickles_read_whole(pickles):
    for name, data in pickles.items():
        scan = tp.read_pickle(data)
        assert scan.complete and scan.error is None, name
        assert tp._walk_refusal(data) is None
        assert repr(tp.read_pickle(io.BytesIO(data))) == repr(scan), (
            name
        )  # from a file: the same records
    assert (
        len(tp.read_pickle(pickles["optimizer"]).tensors) == 12
    )  # 4 parameters: step, exp_avg, exp_avg_sq


@pytest.mark.parametrize(
    "name", ["optimizer", "rng", "dcp_metadata", "protocol0", "protocol2", "protocol4", "protocol5"]
)
def test_damaged_pickles_are_refused_as_python_refuses_them(pickles, name):
    data = pickles[name][:1500]
    spots = [*range(min(200, len(data))), *range(200, len(data), 13)]
    for at in spots:
        for x in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[at] ^= x
            _agrees(bytes(bad))
    for cut in spots:
        _agrees(data[:cut])


_P2 = b"\x80\x02"
HOSTILE = {
    "long_binput_huge": _P2 + b"K\x01r\xff\xff\xff\x7f.",  # index 2**31 - 1: a 32 GB memo
    "long_binput_after_strings": _P2 + b"X\x0c\x00\x00\x00param_groupsr\x00\x00\x00\x10.",
    "put_text_huge": b"I1\np99999999999\n.",  # protocol 0 PUT
    "put_text_spaces": b"I1\np  4000000000 \n.",
    "long_binput_in_a_frame": b"\x80\x04\x95\x07\x00\x00\x00\x00\x00\x00\x00K\x01r\xff\xff\xff\x7f.",
    "binbytes8_huge": _P2 + b"\x8e\xff\xff\xff\xff\xff\xff\x00\x00.",
    "bytearray8_huge": _P2 + b"\x96\x00\x00\x00\x00\x00\x01\x00\x00.",
    "binunicode8_huge": _P2 + b"\x8d\x00\x00\x00\x00\x01\x00\x00\x00.",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_pickle_that_would_allocate_without_bound_is_refused_first(name, capfd):
    scan = tp.read_pickle(HOSTILE[name])
    assert not scan.complete and ("memo index" in scan.error or "more than the" in scan.error), (
        scan.error
    )
    assert tp._walk_refusal(HOSTILE[name]) is not None
    assert (
        capfd.readouterr().err == ""
    )  # (a MemoryError inside the unpickler prints a SystemError of its own)


def test_a_suspect_byte_inside_a_string_is_not_an_opcode(pickles):
    """'r' and 'p' followed by text, inside strings (short ones, stepped over in C, and one longer than a run takes):
    read whole, by the walk that tells them apart."""
    data = pickle.dumps(
        {
            "param_groups": "rrrr\x01\x02\x03\x04",
            "p": "p123456789\n" * 3,
            "x": [1] * 300,
            "long": "r\xff\xff\xff\x7f" * 40,
        },
        protocol=2,
    )
    assert tp._suspect_in(data)
    scan = tp.read_pickle(data)
    assert scan.complete and scan.root == pickle.loads(data)


def test_the_size_and_depth_bounds(pickles):
    assert "more than the 100" in tp.read_pickle(pickles["optimizer"], max_bytes=100).error
    deep = _P2 + b")" + b"\x85" * 200_000 + b"."  # ((((...)))) 200 000 deep
    scan = tp.read_pickle(deep)
    assert not scan.complete and "nested more than" in scan.error
    key = _P2 + b"}" + b")" + b"\x85" * 120_000 + b"Ns."  # hashed as a dict key: read in a
    assert "nested more than" in tp.read_pickle(key).error  # thread with the stack for it
    wide = _P2 + b"(" + b")" * 60_000 + b"t."  # many tuples, none nested
    assert tp.read_pickle(wide).complete


def test_what_python_refuses_in_dcp_metadata_is_refused(pickles):
    """The issue-40 gaps: an odd SETITEMS, PROTO mid-stream past 5, a FRAME in mid-stream, a BUILD state an
    OrderedDict cannot take: each read as Python's unpickler reads it, refused with its words."""
    meta = pickles["dcp_metadata"]
    odd = _P2 + b"}(K\x01K\x02K\x03u."
    assert "odd number of items" in tp.read_pickle(odd).error
    assert "unsupported pickle protocol" in tp.read_pickle(_P2 + b"K\x01\x80\x09.").error
    for at in (
        11,
        40,
        200,
    ):  # a FRAME opcode inserted in mid-stream: as pickle.load of a file (DCP's) reads it
        inner = meta[:at] + b"\x95" + (5).to_bytes(8, "little") + meta[at:]
        assert tp.read_pickle(inner).complete == (not _python_refuses(inner)), at
    state = _P2 + b"ccollections\nOrderedDict\n)RK\x05b."
    assert "state is not a dictionary" in tp.read_pickle(state).error


_PIECES = [
    b"(",
    b"t",
    b"\x85",
    b"\x86",
    b")",
    b"}",
    b"]",
    b"N",
    b"\x88",
    b"0",
    b"K\x05",
    b"M\x01\x02",
    b"J\xff\xff\xff\xff",
    b"q\x00",
    b"h\x00",
    b"r\x00\x00\x00\x00",
    b"r\x00\x00\x01\x00",
    b"r\xff\xff\xff\x7f",
    b"j\x00\x00\x00\x00",
    b"X\x01\x00\x00\x00r",
    b"X\x05\x00\x00\x00r\x00\x00\x01",
    b"X\x09\x00\x00\x00a",
    b"\x8c\x01r",
    b"C\x04rrrr",
    b"s",
    b"u",
    b"a",
    b"e",
    b"R",
    b"b",
    b"\x94",
    b"ccollections\nOrderedDict\n",
    b"p99999999\n",
    b"p1\n",
    b"I12\n",
    b"\x95\x03\x00\x00\x00\x00\x00\x00\x00",
    b"\x8e\x03\x00\x00\x00\x00\x00",
    b"\x96\x01\x00\x00\x00\x00\x00\x00\x00r",
    b".",
    b"\xff",
    # the edges of what the fast walk's one expression steps over (tp._RUN_LENGTHS, 2**16, 4 digits)
    b"X\x3f\x00\x00\x00" + b"r" * 63,
    b"X\x40\x00\x00\x00" + b"r" * 64,
    b"\x8c\x3fr" + b"\x00" * 62,
    b"\x8c\x40" + b"r" * 64,
    b"r\xff\xff\x00\x00",
    b"p1234\n",
    b"p12345\n",
    b"p+12\n",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=30))
def test_random_opcode_streams_agree_with_the_walk_and_python(pieces):
    _agrees(b"\x80\x02" + b"".join(pieces))


def _bytesio_load(data: bytes) -> str | None:
    """What torch.load's way of unpickling (a BytesIO of the record: no peek) says: None, or its error."""
    try:
        pickle.Unpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("protocol, text", [(2, "value-"), (4, "value-"), (4, "rarer river ")])
def test_a_frame_length_reaching_into_the_next_frame_is_read_as_torch_load_reads_it(protocol, text):
    """The reader hands a pickle buffered whole to the unpickler only where that reads what a BytesIO gives it: a
    protocol-4 pickle of two frames whose first frame's length is 64 bytes too long is refused as
    `Unpickler(BytesIO)` refuses it (a whole-buffer read would take it); the same pickle intact, and a protocol-2
    one (no FRAME), read complete either way. Text full of 'r' (bytes that could be a LONG_BINPUT) has the opcodes
    walked first, and the walk's FRAME decides; without, the 0x95 byte does."""
    obj = {f"k{i}": f"{text}{i}" * 3 for i in range(3000)}
    data = pickle.dumps(obj, protocol=protocol)
    scan = tp.read_pickle(data)
    assert scan.complete and scan.root == obj and _bytesio_load(data) is None
    if protocol < 4:
        return
    damaged = bytearray(data)
    damaged[damaged.index(b"\x95") + 1] ^= 1 << 6
    damaged_bytes = bytes(damaged)
    assert tp._suspect_in(damaged_bytes) == ("r" in text)
    assert (
        pickle.Unpickler(io.BufferedReader(io.BytesIO(damaged_bytes), len(damaged_bytes))).load()
        == obj
    )
    refused = _bytesio_load(damaged_bytes)
    assert refused is not None
    scan = tp.read_pickle(damaged_bytes)
    assert not scan.complete and scan.error == refused


def test_a_view_past_its_storage_is_found_as_the_tensors_are_made():
    """`past_end`: the first tensor whose view reads past its storage's end (torch.load fails on it); an empty view
    reads nothing, whatever its offset; a view of another dtype counts the storage in its own elements."""
    base = torch.arange(8, dtype=torch.float32)
    data = _data_pkl({"a": base[2:6], "b": base[0:0], "c": base[6:8]})
    scan = tp.read_pickle(data)
    assert scan.complete and scan.past_end is None and len(scan.tensors) == 3
    at = data.index(b"K\x06")  # c's offset 6 -> 7: its 2 elements end at element 9 of 8
    scan = tp.read_pickle(data[:at] + b"K\x07" + data[at + 2 :])
    assert scan.past_end is scan.tensors[2] and scan.past_end.offset == 7
    empty = data.index(
        b"K\x00", data.index(b"X\x01\x00\x00\x00b")
    )  # b's offset 0 -> 9: an empty view past
    scan = tp.read_pickle(data[:empty] + b"K\x09" + data[empty + 2 :])  # the end reads nothing
    assert scan.tensors[1].offset == 9 and scan.tensors[1].shape == (0,) and scan.past_end is None


def test_frame_refusal_takes_whole_frames_and_protocols_python_reads():
    """`frame_refusal` (what convert asks of a DCP .metadata): pickle.dumps' own frames chain to the end; one frame
    length off, a FRAME cut short or protocol 6 are named; protocol 2 has no frames to check."""
    data = pickle.dumps({"k": list(range(50)), "s": "x" * 200}, protocol=4)
    assert data[2] == 0x95 and tp.frame_refusal(data) is None
    assert tp.frame_refusal(pickle.dumps([1, 2], protocol=2)) is None
    longer = data[:3] + (int.from_bytes(data[3:11], "little") + 1).to_bytes(8, "little") + data[11:]
    assert (
        tp.frame_refusal(longer)
        == f"its FRAME lengths end at byte {len(data) + 1}, the pickle at {len(data)}"
    )
    assert tp.frame_refusal(data[:6]) == "a FRAME record cut short"
    assert tp.frame_refusal(b"\x80\x06" + data[2:]) == "pickle protocol 6: Python reads 0-5"
    with pytest.raises(ValueError, match="unsupported pickle protocol"):
        pickle.loads(b"\x80\x06" + data[2:])
