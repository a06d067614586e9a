"""read_pickle reads a pickle held in memory with its own opcode loop (`torchpickle._run_bytes`) and hands
everything that loop does not take whole to pickletools.genops; the two give the same PickleScan.

The pickles are real: torch.save's data.pkl of an optimizer, a model, a scheduler and RNG states, a DCP
.metadata, and plain pickles of every protocol; then each of them damaged at every byte (three other values)
and cut at every length.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import zipfile

import pytest
from hypothesis import given, settings, strategies as st

from checkpoint_strategy.formats import safepickle as tp

torch = pytest.importorskip("torch", reason="real torch.save pickles")


def _reference(data: bytes) -> str:
    return repr(tp.read_pickle(io.BytesIO(data)))   # a file: the genops path


def _data_pkl(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    z = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    return z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))


@pytest.fixture(scope="module")
def pickles(tmp_path_factory):
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 6)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 3)
    import random

    import numpy as np
    out = {"optimizer": _data_pkl(opt.state_dict()), "model": _data_pkl(model.state_dict()),
           "scheduler": _data_pkl(sched.state_dict()),
           "rng": _data_pkl({"python": random.getstate(), "numpy": np.random.get_state(),
                             "cpu": torch.random.get_rng_state()}),
           "view": _data_pkl({"w": torch.arange(10.0)[2:7], "h": torch.ones(3, dtype=torch.float16)})}
    import torch.distributed.checkpoint as dcp
    folder = tmp_path_factory.mktemp("dcp")
    dcp.save({"w": torch.ones(4)}, checkpoint_id=str(folder))
    out["dcp_metadata"] = (folder / ".metadata").read_bytes()
    value = {"a": [1, 2.5, -3, 2 ** 70, -2 ** 40, "x\u00e9\ud800", b"by", (1,), None, True, {1, 2}, frozenset([3])],
             "b": "y" * 300, "c": b"q" * 70_000, "d": bytearray(b"z")}
    for proto in range(6):
        out[f"protocol{proto}"] = pickle.dumps(value, protocol=proto)
    return out


def test_real_pickles_read_the_same_and_take_the_fast_loop(pickles):
    for name, data in pickles.items():
        scan = tp.PickleScan()
        took = tp._run_bytes(data, scan, tp._Machine(scan), tp.MAX_OPCODES)
        assert repr(tp.read_pickle(data)) == _reference(data), name
        # protocols 0 and 1 write text opcodes (INT, LONG, STRING...) for some values: genops reads them; so it
        # does protocols 4 and 5 here, whose 70 kB bytes object is written between frames (the fast loop takes
        # frames that follow each other, as in every DCP .metadata; genops checks no opcode crosses a frame's end)
        assert took == (name not in ("protocol0", "protocol1", "protocol4", "protocol5")), name
        assert scan.complete == took


@pytest.mark.parametrize("name", ["optimizer", "rng", "dcp_metadata", "protocol2", "protocol4", "protocol5"])
def test_damaged_pickles_read_the_same(pickles, name):
    data = pickles[name][:2000]   # the 70 kB bytes object of the plain pickles: its head is enough
    spots = [*range(min(250, len(data))), *range(250, len(data), 17)]   # every byte of the head, then a sample
    for at in spots:
        for x in (0x01, 0x80, 0xFF):
            bad = bytearray(data)
            bad[at] ^= x
            assert repr(tp.read_pickle(bytes(bad))) == _reference(bytes(bad)), (at, x)
    for cut in spots:
        assert repr(tp.read_pickle(data[:cut])) == _reference(data[:cut]), cut


def test_opcode_limit_and_global_names_with_escapes(pickles):
    data = pickles["optimizer"]
    for limit in (0, 1, 5, 50):
        assert repr(tp.read_pickle(data, limit)) == repr(tp.read_pickle(io.BytesIO(data), limit)), limit
    odd = b"\x80\x02c" + b"os\\x73\nsystem\n" + b"q\x00."   # an escape in a GLOBAL line: the genops path decodes it
    assert repr(tp.read_pickle(odd)) == _reference(odd)
    assert tp.read_pickle(odd).globals == [tp.read_pickle(io.BytesIO(odd)).globals[0]]
    for bad in (b"\x80\x02\x8b\xff\xff\xff\xff.",          # LONG4 with a negative byte count
                b"\x80\x02T\xfe\xff\xff\xffab.",           # BINSTRING with a negative byte count
                b"\x80\x02X\x05\x00\x00\x00ab.",           # BINUNICODE longer than the pickle
                b"\x80\x02cos\nsys\xe9tem\nq\x00.",         # a GLOBAL name that is not ASCII
                b"\x80\x02\x8a\x02\xff\x7f\x8a\x01\x80\x86.",  # LONG1 values, signed
                b"\x80\x02J\xff\xff\xff\xffM\xff\xff\x86."):   # BININT -1, BININT2 65535
        assert repr(tp.read_pickle(bad)) == _reference(bad), bad


# Opcode sequences for the ways `_run_bytes` takes inline (constants, new empty containers, TUPLE, TUPLE1-3):
# whole, and broken where each can break (no mark, too few items); each read the same as the genops path.
_P2 = b"\x80\x02"
_INLINE_CASES = {
    "constants": _P2 + b"N\x88\x89)\x85\x85.",                          # None True False () -> ((),)  (TUPLE1 twice)
    "fresh_dicts": _P2 + b"(}q\x01}lh\x01K\x01K\x02s0.",   # [{}, {}], then a SETITEM on the first: [{1: 2}, {}]
    "fresh_lists": _P2 + b"]q\x01]\x86h\x01K\x03a0.",      # ([], []), then an APPEND on the first: ([3], [])
    "tuples": _P2 + b"K\x01K\x02K\x03\x87K\x04K\x05\x86(K\x06K\x07t\x87.",
    "tuple_no_mark": _P2 + b"K\x01t.",
    "tuple2_underflow": _P2 + b"K\x01\x86.",
    "tuple3_underflow": _P2 + b"K\x01K\x02\x87.",
    "tuple1_empty": _P2 + b"\x85.",
    "long_binput_get": _P2 + b"K\x07r\x05\x00\x00\x00j\x05\x00\x00\x00\x86.",
    "long_binget_unknown": _P2 + b"K\x07j\x09\x00\x00\x00\x86.",
    "long_binput_cut": _P2 + b"K\x07r\x05\x00",
}


@pytest.mark.parametrize("name", sorted(_INLINE_CASES))
def test_inline_opcodes_read_as_the_genops_path(name):
    data = _INLINE_CASES[name]
    assert repr(tp.read_pickle(data)) == _reference(data)


def test_inline_empty_containers_are_new_each_time():
    assert tp.read_pickle(_INLINE_CASES["fresh_dicts"]).root == [{1: 2}, {}]
    assert tp.read_pickle(_INLINE_CASES["fresh_lists"]).root == ([3], [])
    scan = tp.PickleScan()   # and by the fast loop itself, not the genops path after it gave up
    assert tp._run_bytes(_INLINE_CASES["fresh_dicts"], scan, tp._Machine(scan), tp.MAX_OPCODES)
    assert scan.root == [{1: 2}, {}]
    assert scan.opcodes == sum(1 for _ in pickletools.genops(_INLINE_CASES["fresh_dicts"])) == 12


@pytest.mark.parametrize("limit", [1, 2, 5, 8, 9, 10, 100])
def test_opcode_limit_words_the_same(pickles, limit):
    """A pickle longer (in bytes) than the limit goes to genops whole; one within it cannot have more opcodes."""
    for data in (pickles["optimizer"], _INLINE_CASES["tuples"]):
        assert repr(tp.read_pickle(data, max_opcodes=limit)) == repr(tp.read_pickle(io.BytesIO(data),
                                                                                  max_opcodes=limit))


# Random opcode streams, mostly the ones `_run_bytes` takes itself, with arguments that may be cut short:
# whatever the stream, the fast loop and the genops path give the same scan (or the fast loop gives up).
_PIECES = [b"(", b"t", b"\x85", b"\x86", b"\x87", b")", b"}", b"]", b"N", b"\x88", b"\x89", b"0", b"1",
           b"K\x05", b"K", b"M\x01\x02", b"J\xff\xff\xff\xff", b"J\x01", b"q\x00", b"q\x01", b"h\x00", b"h\x01",
           b"r\x00\x00\x00\x00", b"j\x00\x00\x00\x00", b"r\x02\x00", b"X\x01\x00\x00\x00a", b"X\x09\x00\x00\x00a",
           b"\x8c\x01b", b"s", b"u", b"a", b"e", b"l", b"d", b"R", b"Q", b"b", b"\x94", b"c__main__\nX\n",
           b"ctorch._utils\n_rebuild_tensor_v2\n", b"ccollections\nOrderedDict\n", b".", b"\xff"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=40))
def test_random_opcode_streams_read_as_the_genops_path(pieces):
    data = b"\x80\x02" + b"".join(pieces)
    assert repr(tp.read_pickle(data)) == _reference(data)


_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 40), max_value=2 ** 40), st.text(max_size=5),
              st.binary(max_size=5), st.floats(allow_nan=False)),
    lambda inner: st.one_of(st.tuples(inner), st.tuples(inner, inner), st.tuples(inner, inner, inner),
                            st.lists(inner, max_size=5), st.tuples(*[inner] * 4),
                            st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 9)), inner, max_size=4)),
    max_leaves=30)


@settings(max_examples=60, deadline=None)
@given(_values, st.integers(min_value=3, max_value=5))
def test_whole_pickles_of_plain_values_are_read_whole_by_the_fast_loop(value, proto):
    """Plain data pickled by the standard library (a value shared twice makes a memo get): the fast loop reads
    it whole, gets the value back, and agrees with the genops path. (Protocol 2 writes bytes as a call of
    _codecs.encode or bytes(), which the reader records as a call: the real torch pickles above are protocol 2.)"""
    data = pickle.dumps([value, value], protocol=proto)
    scan = tp.PickleScan()
    assert tp._run_bytes(data, scan, tp._Machine(scan), tp.MAX_OPCODES)
    assert scan.root == [value, value]
    assert repr(tp.read_pickle(data)) == _reference(data)
