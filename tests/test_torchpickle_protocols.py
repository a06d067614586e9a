"""The symbolic pickle reader on every pickle protocol, and torch archives saved with old protocols.

Oracle: `pickle.loads` of plain data this test made itself (the package never loads a pickle), and
`torch.load` of the archives (what a resume would do).
"""

from __future__ import annotations

import pickle

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.formats import safepickle as tp
from checkpoint_strategy.validate import validate_checkpoint

PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(obj=PLAIN, protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
@example(
    obj={"a": [1, 2, (3, 4)], "b": {"c": "x"}, "t": (1,), "l": []}, protocol=0
)  # LIST then APPEND
@example(obj=[[[]]], protocol=0)
def test_plain_data_reads_back_as_pickle_loads_gives_it(obj, protocol):
    data = pickle.dumps(obj, protocol=protocol)
    scan = tp.read_pickle(data)
    assert scan.error is None and scan.complete
    assert scan.root == pickle.loads(data)  # the test may load: it made the bytes


def test_protocol_0_inst_object_is_kept_inside_its_list():
    # MARK LIST PUT, MARK INT INT INST collections.OrderedDict, APPEND, STOP (a Python-2-style instance)
    data = b"(lp0\n(I1\nI2\nicollections\nOrderedDict\np1\na."
    scan = tp.read_pickle(data)
    assert scan.error is None
    assert isinstance(scan.root, list) and len(scan.root) == 1
    call = scan.root[0]
    assert (
        isinstance(call, tp.Call)
        and call.func == tp.Global("collections", "OrderedDict")
        and call.args == (1, 2)
    )
    assert scan.globals == ["collections.OrderedDict"]


@pytest.mark.parametrize("protocol", [0, 1, 2])
def test_torch_archives_of_old_protocols(tmp_path, protocol):
    torch = pytest.importorskip("torch")
    path = tmp_path / f"p{protocol}.pt"
    torch.save({"w": torch.arange(6.0).view(2, 3)}, path, pickle_protocol=protocol)
    try:
        loaded = torch.load(path, weights_only=False)["w"]  # our own file
    except AssertionError:  # "saved_id must be a tuple"
        loaded = None
    for level in ("quick", "full", "deep"):
        r = validate_checkpoint(path, level=level)
        if loaded is None:
            assert r.status == "invalid", (level, r.problems)
            assert "pickle protocol 0" in r.problems[0].reason
        else:
            assert r.status != "invalid", (level, r.problems)
            if level == "deep":
                assert r.deep.weights_norm == pytest.approx(
                    float(torch.linalg.vector_norm(loaded)), rel=1e-7
                )
    assert (loaded is None) == (protocol == 0)
