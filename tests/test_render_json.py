"""render.to_json lays JSON out itself (the stdlib's indenting encoder is pure Python): its output must be
json.dumps(indent=2, allow_nan=False)'s, character for character, and what json.dumps refuses it refuses the
same way."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_strategy.render import to_json

# what a report's model_dump(mode="json") holds, and the names a hostile folder gives it: any unicode (lone
# surrogates from undecodable bytes included), control characters, quotes and backslashes
_text = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=12)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(_text, inner, max_size=5)),
    max_leaves=40,
)


def _reference(data) -> str:
    return json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n"


@settings(max_examples=150, deadline=None)
@given(_json)
def test_same_characters_as_json_dumps(data):
    assert to_json(data) == _reference(data)


@pytest.mark.parametrize(
    "data",
    [
        {},
        [],
        "",
        0,
        -0.0,
        1e16,
        1e-05,
        5e-324,
        True,
        None,
        {"a": []},
        [[], {}],
        {"k": {"n": {"m": [1, [2, {}]]}}},
        (1, "two", (3.5,)),  # tuples are lists to json.dumps
        {
            7: "int key",
            None: "none key",
            2.5: "float key",
            False: "bool key",
        },  # keys json.dumps turns into strings
        {"a": {"b": [{1: 2}]}},  # such a key deep inside
    ],
)
def test_edge_values_and_the_fallback(data):
    assert to_json(data) == _reference(data)


@pytest.mark.parametrize(
    "bad",
    [math.nan, math.inf, -math.inf, {"x": [math.nan]}, {"x": object()}, {(1, 2): 3}, [b"bytes"]],
)
def test_what_json_dumps_refuses_is_refused_alike(bad):
    with pytest.raises((ValueError, TypeError)) as ours:
        to_json(bad)
    with pytest.raises((ValueError, TypeError)) as ref:
        _reference(bad)
    assert type(ours.value) is type(ref.value) and str(ours.value) == str(ref.value)


def test_subclasses_of_json_types_are_written_as_json_dumps_writes_them():
    import enum

    class Level(str, enum.Enum):
        QUICK = "quick"

    class Count(int):
        pass

    data = {"level": Level.QUICK, "n": Count(3), "flag": True, "f": 1.5}
    assert to_json(data) == _reference(data)


def test_deep_nesting_json_dumps_writes_is_written_alike():
    """A document nested as deep as json.dumps(indent=2) still writes (user JSON kept in a handoff can be): the
    same characters, no RecursionError first."""

    def nested(pairs: int) -> list:
        doc = inner = []
        for _ in range(pairs):
            inner.append({"k": []})
            inner = inner[0]["k"]
        return doc

    deep = nested(400)  # 800 levels
    assert to_json(deep) == _reference(deep)
    too_deep = nested(5000)  # past the interpreter's limit: both give up the same way
    with pytest.raises(RecursionError):
        _reference(too_deep)
    with pytest.raises(RecursionError):
        to_json(too_deep)
