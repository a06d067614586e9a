"""The fast paths of the log readers give what the reference paths give.

JSON lines: batches parsed by orjson (when installed) and converted with numpy (`records.jsonl_batches` +
`Collector.add_many`) against the reference - every line parsed by the standard library and fed to
`Collector.add` one record at a time - on the real logs (tests/data/real-logs, their trainer_state
histories written out as JSON lines) and on hostile lines: NaN tokens, a 64 MB line, nesting past the
recursion limit, a torn last line, blank lines, a BOM, integers beyond 64 bits, strings where numbers
belong. The same arrays, notes and restarts, or the same one-line error.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery import logs, records
from checkpoint_strategy.recovery.logkeys import LogProblem

REAL = Path(__file__).parent / "data" / "real-logs"
ARRAYS = (
    "steps",
    "loss",
    "grad_norm",
    "lr",
    "eval_steps",
    "eval_loss",
    "raw_steps",
    "raw_loss",
    "raw_segment",
)


def _reference_jsonl(p: Path) -> logs.LogSeries:
    """The reference reader: every line parsed by json.loads, records added one at a time (a problem named as
    logs.read_log names it)."""
    try:
        return _reference_records(p)
    except LogProblem as exc:
        raise exc.named(p) from None


def _reference_records(p: Path) -> logs.LogSeries:
    col = records.Collector(logs.Columns(), what="line", offset=1)
    notes: list[str] = []
    raw_lines = p.read_bytes().split(b"\n")
    for n, raw in enumerate(raw_lines, 1):
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            if n < len(raw_lines):
                raise records._bad_line(n, exc) from None
            notes.append(
                f"log {p} line {n} is incomplete (no newline yet, not valid JSON: the trainer is "
                "probably still writing it): left out"
            )
            continue
        col.add(rec, n - 1)
    if col.count == 0:
        raise UsageError(
            f"log {p} is empty (0 bytes or only whitespace); expected training log entries"
        )
    series = logs._series_from(p, "jsonl", col)
    series.notes = notes
    return series


def _outcome(read) -> tuple:
    """What a reader gives: the error line, or every array (NaN-aware bytes), key, note and restart."""
    try:
        s = read()
    except UsageError as exc:
        return ("error", str(exc))
    arrays = tuple(
        None if getattr(s, a) is None else np.asarray(getattr(s, a), dtype=np.float64).tobytes()
        for a in ARRAYS
    )
    return (
        "series",
        arrays,
        s.step_key,
        s.loss_key,
        s.grad_norm_key,
        s.lr_key,
        s.eval_key,
        s.entries,
        tuple(s.notes),
        json.dumps(s.restarts),
    )


def _all_ways(p: Path, monkeypatch) -> dict[str, tuple]:
    """The outcome of the reference reader, the fast reader with orjson, and the fast reader without it."""
    out = {
        "reference": _outcome(lambda: _reference_jsonl(p)),
        "orjson": _outcome(lambda: logs.read_log(p)),
    }
    with monkeypatch.context() as m:
        m.setattr(records, "_orjson", None)
        out["stdlib"] = _outcome(lambda: logs.read_log(p))
    return out


def _assert_same(p: Path, monkeypatch) -> tuple:
    out = _all_ways(p, monkeypatch)
    assert out["orjson"] == out["reference"], (out["orjson"][:2], out["reference"][:2])
    assert out["stdlib"] == out["reference"], (out["stdlib"][:2], out["reference"][:2])
    return out["reference"]


def _history_as_jsonl(src: Path, dest: Path) -> bool:
    data = json.loads(src.read_text())
    hist = data.get("log_history") if isinstance(data, dict) else None
    if not hist:
        return False
    dest.write_text("".join(json.dumps(e) + "\n" for e in hist))  # NaN/Infinity stay tokens
    return True


REAL_JSON = sorted(q.name for q in REAL.glob("*.json") if q.name != "manifest.json")
REAL_JSONL = sorted(q.name for q in REAL.glob("*.jsonl"))


@pytest.mark.parametrize("name", REAL_JSONL + REAL_JSON)
def test_real_logs_as_json_lines_read_the_same_by_every_path(name, tmp_path, monkeypatch):
    src = REAL / name
    p = tmp_path / "train.jsonl"
    if name.endswith(".jsonl"):
        p.write_bytes(src.read_bytes())
    elif not _history_as_jsonl(src, p):
        pytest.skip("no log_history")
    got = _assert_same(p, monkeypatch)
    assert got[0] == "series", got  # every real log is read, not refused
    monkeypatch.setattr(records, "BLOCK_BYTES", 97)  # lines cut across many tiny blocks
    monkeypatch.setattr(records, "BATCH_LINES", 7)
    assert _assert_same(p, monkeypatch) == got


def test_nan_tokens_blank_lines_and_a_bom(tmp_path, monkeypatch):
    rows = [
        json.dumps(
            {
                "step": i,
                "loss": (math.nan if i == 300 else 2.0 + (i % 7) / 100),
                "grad_norm": math.inf if i == 500 else 1.0,
                "learning_rate": 1e-4,
            }
        )
        for i in range(1, 3001)
    ]
    rows[40] += "\n\n   \r"  # blank lines (a lone CR is blank too)
    p = tmp_path / "train.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + "\n".join(rows).encode() + b"\n")
    got = _assert_same(p, monkeypatch)
    assert got[0] == "series"
    s = logs.read_log(p)
    assert len(s.steps) == 3000 and math.isnan(s.loss[299]) and math.isinf(s.grad_norm[499])


def test_a_bad_value_after_blank_lines_is_named_by_its_line(tmp_path, monkeypatch):
    lines = [json.dumps({"step": i, "loss": 2.0}) for i in range(1, 2501)] + ["", ""]
    lines += [json.dumps({"step": 2501, "loss": "high"})]
    p = tmp_path / "train.jsonl"
    p.write_text("\n".join(lines) + "\n")
    got = _assert_same(p, monkeypatch)
    assert got == ("error", f"log {p}: loss at line 2503 is 'high', not a number")


def test_the_first_problem_in_file_order_is_reported(tmp_path, monkeypatch):
    lines = [json.dumps({"step": i, "loss": 2.0}) for i in range(1, 2101)]
    lines[2049] = "[1, 2]"  # not an object, line 2050
    lines[2079] = '{"step": 2080, "loss": '  # not JSON, later in the same batch
    p = tmp_path / "train.jsonl"
    p.write_text("\n".join(lines) + "\n")
    assert _assert_same(p, monkeypatch) == (
        "error",
        f"log {p} line 2050 is not a JSON object; expected one record per line",
    )
    lines[2049] = json.dumps({"step": 2050, "loss": "?"})  # a bad value before the bad JSON
    p.write_text("\n".join(lines) + "\n")
    assert _assert_same(p, monkeypatch) == (
        "error",
        f"log {p}: loss at line 2050 is '?', not a number",
    )


def test_a_torn_last_line_is_left_out_with_a_note(tmp_path, monkeypatch):
    p = tmp_path / "train.jsonl"
    p.write_text(
        "".join(json.dumps({"step": i, "loss": 2.0}) + "\n" for i in range(1, 100))
        + '{"step": 100, "lo'
    )
    got = _assert_same(p, monkeypatch)
    assert got[0] == "series" and got[8] == (
        f"log {p} line 100 is incomplete (no newline yet, not valid JSON: the "
        "trainer is probably still writing it): left out",
    )
    p.write_text(p.read_text() + "\n")  # the same line with its newline: bad input
    got = _assert_same(p, monkeypatch)
    assert got[0] == "error" and got[1].startswith(
        f"log {p} line 100 is not valid JSON (truncated?): "
    )


def test_a_64_mb_line_and_nesting_past_the_recursion_limit(tmp_path, monkeypatch):
    p = tmp_path / "train.jsonl"
    with open(p, "w") as fh:
        fh.write(json.dumps({"step": 1, "loss": 2.0}) + "\n")
        fh.write('{"step": 2, "loss": 2.5, "note": "' + "x" * (64 << 20) + '"}\n')
        fh.write(json.dumps({"step": 3, "loss": 2.1}) + "\n")
    got = _assert_same(p, monkeypatch)
    assert got[0] == "series" and np.frombuffer(got[1][1]).tolist() == [2.0, 2.5, 2.1]
    p.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n" + "[" * 200_000 + "]" * 200_000 + "\n")
    got = _assert_same(p, monkeypatch)
    assert got[0] == "error" and "line 2 is not valid JSON" in got[1]


def test_numbers_orjson_and_the_standard_library_read_differently_convert_the_same(
    tmp_path, monkeypatch
):
    """orjson makes integers past 64 bits floats and refuses 1e400; the standard library keeps the int and
    reads inf: the series hold the same float64 values. Strings and booleans go through the same rules."""
    lines = [json.dumps({"step": i, "loss": 2.0}) for i in range(1, 2100)]
    lines += [
        '{"step": 2100, "loss": 18446744073709551617}',
        '{"step": 2101, "loss": 1e400}',
        '{"step": 2102, "loss": "  3.5 "}',
        '{"step": 2103, "loss": -123456789012345678901234567890}',
        '{"step": 2104, "loss": 2.0, "loss": 4.0}',
    ]
    p = tmp_path / "train.jsonl"
    p.write_text("\n".join(lines) + "\n")
    got = _assert_same(p, monkeypatch)
    loss = np.frombuffer(got[1][1])
    assert loss[-5:].tolist() == [
        18446744073709551617.0,
        math.inf,
        3.5,
        -1.2345678901234568e29,
        4.0,
    ]
    p.write_text("\n".join(lines[:2100] + ['{"step": 2101, "loss": true}']) + "\n")
    assert _assert_same(p, monkeypatch) == (
        "error",
        f"log {p}: loss at line 2101 is true, not a number",
    )


LINE_KINDS = st.sampled_from(
    [
        '{"step": S, "loss": 2.5}',
        '{"step": S, "loss": NaN, "grad_norm": 1}',
        '{"step": S, "loss": Infinity}',
        '{"step": S, "loss": "2.5"}',
        '{"step": S, "loss": 2.5, "learning_rate": 1e-4}',
        '{"step": S}',
        '{"step": S, "loss": 2.5, "eval_loss": 2.4}',
        '{"step": S, "loss": 99999999999999999999999}',
        "",
        "  ",
        '{"step": S, "loss": 1e999}',
        '{"step": S, "loss": [1]}',
        "[1]",
        '{"step": S, "lo',
        "NaN",
        '{"step": S, "loss": 2.5, "x": "\\ud800"}',
        '\ufeff{"step": S, "loss": 2.5}',
        '{"step": "S", "loss": 2.5}',
        '{"step": S, "loss": 2.5}\r',
        "\x0c",
        '{"step": S, "loss": -0}',
        '{"step": S, "loss": 2.5, "grad_norm": null}',
        # lines that parse as one JSON array but not one by one (records._flat_block must refuse the block)
        '{"step": S, "loss": 2.5, "n": "}',
        '{"}',
        '{"step": S, "loss": 2.5},{"step": S, "loss": 2.6}',
        '{"step": S,',
        '"loss": 2.5}',
        '{"step": S, "loss": 2.5, "xs": [1, 2]}',
        ' {"step": S, "loss": 2.5} ',
    ]
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kinds=st.lists(LINE_KINDS, min_size=1, max_size=40),
    torn=st.booleans(),
    block=st.integers(1, 200),
    batch=st.integers(1, 9),
)
@example(kinds=['{"step": S, "loss": 2.5}', "NaN"], torn=True, block=3, batch=1)
def test_fuzz_jsonl_fast_path_matches_the_reference(
    kinds, torn, block, batch, tmp_path, monkeypatch
):
    p = tmp_path / "train.jsonl"
    text = "\n".join(k.replace("S", str(i + 1)) for i, k in enumerate(kinds)) + (
        "" if torn else "\n"
    )
    p.write_bytes(text.encode("utf-8", "surrogatepass"))
    with monkeypatch.context() as m:
        m.setattr(records, "KEY_SAMPLE", 3)  # the batched conversion is reached with few lines
        m.setattr(records, "BLOCK_BYTES", block)
        m.setattr(records, "BATCH_LINES", batch)
        _assert_same(p, m)


def test_a_block_of_flat_lines_is_one_array_and_anything_else_is_refused():
    """records._flat_block parses a block as one array only when each line is one flat object: an object whose
    string holds a brace would swallow the next line when joined (fewer elements than lines: refused)."""
    if records._orjson is None:
        pytest.skip("orjson not installed")
    good = b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.4, "lr": 1e-4}\r\n  {"loss": 2.3, "step": 3} '
    assert records._flat_block(good, good.count(b"\n") + 1) == [
        json.loads(x) for x in good.split(b"\n")
    ]
    for bad in (
        b'{"step": 1, "loss": 2.5, "n": "}\n{"}\n{"step": 3, "loss": 2.0}',  # a string spans lines
        b'{"step": 1, "loss": 2.5}\n\n{"step": 2, "loss": 2.5}',  # a blank line
        b'{"step": 1, "loss": 2.5},{"step": 2, "loss": 2.6}\n{"step": 3, "loss": 2.0}',  # two objects
        b'{"step": 1,\n"loss": 2.5}',  # one object, two lines
        b'{"step": 1, "loss": NaN}',  # orjson refuses
        b'{"step": 1, "loss": {"x": 1}}',  # nested
        b'"{}\n{}"\n{"a": 1}, 5',  # n elements, but a string and a number among them
        b'x{"step": 1}',
    ):  # text before
        assert records._flat_block(bad, bad.count(b"\n") + 1) is None, bad


def test_an_object_spanning_lines_in_a_string_is_reported_as_the_reference_does(
    tmp_path, monkeypatch
):
    lines = [json.dumps({"step": i, "loss": 2.0}) for i in range(1, 3001)]
    lines[2500:2502] = ['{"step": 2501, "loss": 2.0, "n": "}', '{"}']
    p = tmp_path / "train.jsonl"
    p.write_text("\n".join(lines) + "\n")
    assert _assert_same(p, monkeypatch) == (
        "error",
        f"log {p} line 2501 is not valid JSON (truncated?): Unterminated string starting at",
    )


def _each_line(block: bytes) -> list:
    """The reference: every line of a block parsed alone by the standard library, with each value's type."""
    return [[(k, type(v), v) for k, v in json.loads(line).items()] for line in block.split(b"\n")]


def _rows_as_lines(rows) -> list:
    return [[(k, type(v), v) for k, v in rec.items()] for rec in rows.dicts()]


SHAPED_GOOD = [
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": -0.25e-3}\n{"step": 3, "loss": 7}',
    b'{"step": 1, "loss": 2.5}\r\n{"step": 2, "loss": 1E+2}\r\n{"step": 3, "loss": -0}\r',  # CRLF
    b'\t{ "loss":2.5 ,"step" :10,"grad_norm":\t0.5 }  \n\t{ "loss":2.4 ,"step" :11,"grad_norm":\t1 }  ',
    b'{"step": 1, "loss": 18446744073709551615, "lr": -0.0}\n{"step": 2, "loss": 0.1, "lr": 3}',
    '{"step": 1, "p\u00e9rte": 2.5}\n{"step": 2, "p\u00e9rte": 2.25}'.encode(),  # UTF-8 key
    b'{"loss": 2.5}',
    b'{"": 1, "step": 1, "loss": 2}\n{"": 2, "step": 2, "loss": 3}',
]

SHAPED_BAD = [
    b'{"step": 1, "loss": 2.5}\n{"step": 2}',  # a record missing the loss
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.5, "lr": 1}',  # an extra key
    b'{"step": 1, "loss": 2.5}\n{"loss": 2.5, "step": 2}',  # keys in another order
    b'{"step": 1, "loss": 2.5}\n{"step": 2,  "loss": 2.5}',  # other spacing
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": NaN}',  # NaN/Infinity tokens
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": Infinity}',
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": -Infinity}',
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": {"x": 1}}',  # a nested object
    b'{"step": 1, "loss": {"x": 1}}\n{"step": 2, "loss": 2.5}',
    b'{"step": 1, "loss": 2.5}\n\n{"step": 2, "loss": 2.5}',  # a blank line
    b'\xef\xbb\xbf{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.5}',  # a BOM
    b'{"step": 1, "loss": "2.5"}\n{"step": 2, "loss": "2.5"}',  # a string loss
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": "2.5"}',
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": true}',
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": null}',
    b'{"step": 1, "loss": 2.5, "loss": 3}\n{"step": 2, "loss": 2.5, "loss": 3}',  # a key twice
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.5}{"step": 3, "loss": 2.5}',
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.5}, {"step": 3, "loss": 2.5}',
    b'{"step": 1, "loss": 1.2.3}\n{"step": 2, "loss": 2.5}',  # not numbers
    b'{"step": 1, "loss": +1}\n{"step": 2, "loss": 2.5}',
    b'{"step": 1, "loss": 1e400}\n{"step": 2, "loss": 2.5}',  # orjson refuses
    b'{"step": 1, "loss": 01}\n{"step": 2, "loss": 2.5}',
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": -}',
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": }',
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.5',  # no closing brace
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.5}}',
    b'{"st\\u0065p": 1, "loss": 2.5}\n{"st\\u0065p": 2, "loss": 2.5}',  # an escape in a key
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.5}\x0c',  # not JSON whitespace
    b'{"step": 1, "loss": 2.5}\n{"step": 2\x02 2.5}',  # a raw marker byte for a piece
    b'{"step": 1, "loss": 2.5}\n{"step": 2\x022.5}',
    b'{"step": 1, "loss": 2.5}\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x002, "loss": 2.5}',  # a fake line break
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.5}\n{"step": 3\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00'
    b'\x004, "loss": 2.5}',
    b'{"a": 1, "b": 2}\n{"a": 1\x022}\n{"a": 1, "b": 2, "b": 2}',  # a fake marker, a piece twice
    b'{"step": 1, "loss": 2.5}\n{"step": 1, "step": 1, "loss": 2.5}',
    b'{"step": 1, "loss": 2.5}\n{"step": 1, "loss": 2.5}\n',  # a final newline (no block ends so)
    b'{"step": 1, "lo\xffss": 2.5}\n{"step": 2, "lo\xffss": 2.5}',  # not UTF-8
    b'{"step": 1, "lo\xed\xa0\x80ss": 2.5}',  # a surrogate in UTF-8
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.5, "x": [1]}',
    b"[1, 2]\n[3, 4]",
    b"{}\n{}",
    b'{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.5}\n{"step"',
]


def test_a_block_of_same_shaped_lines_is_rows_and_anything_else_is_refused():
    """records._rows_block reads a block as numbers only when every line is the first line's shape: the same
    keys in the same order with the same spacing, every value a JSON number. Its records are each line's own
    parse (keys, values and int/float types); every other block - a missing or extra key, NaN tokens, nested
    objects, blank lines, a BOM, strings or booleans, a key twice, raw marker bytes forging a piece - is refused."""
    if records._orjson is None:
        pytest.skip("orjson not installed")
    for block in SHAPED_GOOD:
        rows = records._rows_block(block, block.count(b"\n") + 1)
        assert rows is not None, block
        assert _rows_as_lines(rows) == _each_line(block), block
    for block in SHAPED_BAD:
        assert records._rows_block(block, block.count(b"\n") + 1) is None, block
    for width in (27, 28, 29, 40):  # more keys than marker bytes: refused, never misread
        block = b"\n".join(
            json.dumps({f"k{j}": j + i for j in range(width)}).encode() for i in range(3)
        )
        rows = records._rows_block(block, block.count(b"\n") + 1)
        assert (rows is not None) == (width <= 28) and (
            rows is None or _rows_as_lines(rows) == _each_line(block)
        )


NUMBER = st.one_of(
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, width=64).map(repr),
    st.sampled_from(["-0", "0.0", "1e5", "1E-5", "2.5e+3", "-0.0"]),
)
MUTATION = st.sampled_from(
    [
        "",
        "",
        "",
        " ",
        "\r",
        ",",
        "}",
        "{",
        '"',
        "\x01",
        "\x02",
        "\x00",
        "NaN",
        "[1]",
        "\n",
        '"loss": 1, ',
        "e",
        "--",
        ".",
        "\ufeff",
        "\\",
    ]
)


def _shaped_block(numbers: list, mutations: list) -> bytes:
    lines = []
    for i, (a, b) in enumerate(numbers):
        mut, where = mutations[i % len(mutations)]
        line = '{"step": %s, "loss": %s}' % (a, b)
        where = where % (len(line) + 1)
        lines.append(line[:where] + mut + line[where:])
    return "\n".join(lines).encode("utf-8", "surrogatepass")


@settings(max_examples=300, deadline=None)
@given(
    numbers=st.lists(st.tuples(NUMBER, NUMBER), min_size=1, max_size=6),
    mutations=st.lists(st.tuples(MUTATION, st.integers(0, 60)), min_size=1, max_size=6),
)
@example(
    numbers=[(1, 2), (3, 4)],
    mutations=[("", 0), ("\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", 0)],
)
def test_fuzz_rows_block_is_each_line_parsed_alone(numbers, mutations):
    """Whenever _rows_block takes a block, each line parses alone (by the standard library) to the same keys,
    values and types; mutations (a brace, a quote, a marker byte, a newline, NaN, text) must never slip through."""
    if records._orjson is None:
        pytest.skip("orjson not installed")
    block = _shaped_block(numbers, mutations)
    rows = records._rows_block(block, block.count(b"\n") + 1)
    if rows is None:
        return
    expected = _each_line(
        block
    )  # raises when a line is not JSON: then the block must have been refused
    assert _rows_as_lines(rows) == [[_as_orjson(*item) for item in line] for line in expected]


def _as_orjson(key: str, kind: type, value):
    """orjson reads an integer outside [-2**63, 2**64) as the nearest float (the standard library as an int:
    the collector converts both to the same float64)."""
    if kind is int and not -(2**63) <= value < 2**64:
        return key, float, float(value)
    return key, kind, value


def _count_rows(monkeypatch) -> list:
    """Wrap records._rows_block: the list fills with the size of every block it took (the path was used)."""
    taken: list = []
    real = records._rows_block

    def counted(block, n):
        rows = real(block, n)
        if rows is not None:
            taken.append(rows.n)
        return rows

    monkeypatch.setattr(records, "_rows_block", counted)
    return taken


def test_files_of_same_shaped_blocks_read_as_the_reference_reads_them(tmp_path, monkeypatch):
    """Whole files through Rows blocks (tiny blocks so that many are taken) and the other paths: a learning
    rate logged in rows of its own (carried to the next loss rows), eval rows, rows missing the loss, a grad
    norm only in some blocks, NaN tokens, blank lines, a BOM, CRLF, nested objects, repeated steps and a restart,
    a loss as a string, a log with no step key: the same arrays and errors as every line parsed alone."""
    p = tmp_path / "train.jsonl"  # past the 64 KB read_log takes first (it is one block)
    rows = [
        json.dumps({"step": 1, "loss": 2.1, "grad_norm": 0.5, "learning_rate": 1e-5}),  # the keys
        json.dumps({"step": 1, "eval_loss": 2.2}),
        json.dumps({"step": 2, "loss": 2.1, "grad_norm": 0.5}),
    ]
    rows += [json.dumps({"step": i, "loss": 2.0 + (i % 13) / 100}) for i in range(3, 2200)]
    rows += [json.dumps({"learning_rate": 1e-4 * k}) for k in range(1, 6)]
    rows += [json.dumps({"step": i, "loss": 2.5, "grad_norm": i / 7}) for i in range(2200, 2260)]
    rows += [json.dumps({"step": i, "eval_loss": 2.4}) for i in range(2260, 2280)]
    rows += [json.dumps({"eval_loss": 2.3})] * 40  # no step: not an eval point
    rows += [json.dumps({"step": i, "loss": 2.0, "learning_rate": 3e-4}) for i in range(2280, 2300)]
    rows += [json.dumps({"step": i, "loss": 2.0}) for i in range(2290, 2330)]  # a restart at 2290
    rows += [json.dumps({"step": 2330, "loss": 2.0})] * 4  # one step logged 4 times
    rows += [
        '{"step": 2331, "loss": NaN}',
        '{"step": 2332, "loss": Infinity}',
        '{"step": 2333, "loss": 2, "m": {"x": 1}}',
    ]
    rows += [json.dumps({"step": i, "loss": 2.0}) for i in range(2334, 2400)]
    for crlf, bom, blank in ((False, False, False), (True, True, True)):
        lines = rows[:2350] + ["", "  "] + rows[2350:] if blank else rows
        text = ("\r\n" if crlf else "\n").join(lines) + "\n"
        p.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
        for block in (1 << 16, 300, 97):
            with monkeypatch.context() as m:
                m.setattr(records, "KEY_SAMPLE", 3)
                m.setattr(records, "BLOCK_BYTES", block)
                taken = _count_rows(m)
                got = _assert_same(p, m)
            assert got[0] == "series", got
            assert taken or block > 1000 or records._orjson is None, (
                "no block went through records.Rows"
            )
    s = logs.read_log(p)
    assert (
        s.lr_key == "learning_rate" and s.eval_key == "eval_loss" and s.grad_norm_key == "grad_norm"
    )
    assert s.restarts and s.restarts[0]["step"] == 2290
    bad = rows[:2300] + [json.dumps({"step": 2300, "loss": "2.0x"})] + rows[2300:]
    p.write_text("\n".join(bad) + "\n")
    with monkeypatch.context() as m:
        m.setattr(records, "KEY_SAMPLE", 3)
        m.setattr(records, "BLOCK_BYTES", 300)
        assert _assert_same(p, m) == (
            "error",
            f"log {p}: loss at line 2301 is '2.0x', not a number",
        )
    p.write_text(
        "".join(json.dumps({"loss": 2.0, "n": i}) + "\n" for i in range(5000))
    )  # no step anywhere
    assert _assert_same(p, monkeypatch)[0] == "error"


@pytest.mark.parametrize("shape", ["jsonl", "trainer_state"])
def test_nesting_that_crashed_old_orjson_is_a_clean_usage_error(shape, tmp_path):
    """orjson before 3.9.15 recursed without a limit (CVE-2024-27454): 200 000 nested arrays killed the
    process with SIGSEGV. Such a version only parses lines of at most SHORT_LINE bytes; the rest goes to the
    standard library, whose RecursionError is exit 2 with one line. Run in a child: a crash must not take
    pytest down with it."""
    import subprocess

    import cliresult

    deep = "[" * 200_000 + "]" * 200_000
    if shape == "jsonl":
        p = tmp_path / "train.jsonl"
        p.write_text(
            json.dumps({"step": 1, "loss": 2.0}) + "\n" + '{"step": 2, "loss": ' + deep + "}\n"
        )
    else:
        p = tmp_path / "trainer_state.json"
        hist = ",".join(json.dumps({"step": i, "loss": 2.0}) for i in range(1, 50))
        p.write_text(
            '{"global_step": 50, "log_history": ['
            + hist
            + ', {"step": 50, "loss": 2.0, "x": '
            + deep
            + "}]}"
        )
    proc = subprocess.run(
        [*cliresult.CLI, "recover", str(p)],
        capture_output=True,
        text=True,
        timeout=120,
        env=cliresult.checkout_env(),
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-300:])
    assert len(proc.stderr.strip().splitlines()) == 1 and "nested" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- a streamed trainer_state.json


def _doc_ways(p: Path, monkeypatch) -> dict[str, tuple]:
    """A JSON document read whole (the reference: sliced in memory, or parsed whole), and streamed in tiny
    slices and blocks, with and without orjson."""
    out = {}
    with monkeypatch.context() as m:
        m.setattr(logs, "STREAM_MIN_BYTES", 1 << 62)
        out["whole"] = _outcome(lambda: logs.read_log(p))
    for name, fast in (("streamed", True), ("streamed stdlib", False)):
        with monkeypatch.context() as m:
            m.setattr(logs, "STREAM_MIN_BYTES", 0)
            m.setattr(records, "STREAM_SLICE_BYTES", 173)
            m.setattr(records, "BLOCK_BYTES", 211)
            if not fast:
                m.setattr(records, "_orjson", None)
            out[name] = _outcome(lambda: logs.read_log(p))
    return out


def _assert_doc_same(p: Path, monkeypatch) -> tuple:
    out = _doc_ways(p, monkeypatch)
    assert out["streamed"] == out["whole"], (out["streamed"][:2], out["whole"][:2])
    assert out["streamed stdlib"] == out["whole"], (out["streamed stdlib"][:2], out["whole"][:2])
    return out["whole"]


@pytest.mark.parametrize("name", REAL_JSON)
def test_real_trainer_states_stream_the_same(name, tmp_path, monkeypatch):
    p = tmp_path / "trainer_state.json"
    p.write_bytes((REAL / name).read_bytes())
    got = _assert_doc_same(p, monkeypatch)
    assert got[0] == "series", got


def _state(
    entries: str, tail: str = ', "logging_steps": 10, "best_model_checkpoint": "out/checkpoint-20"}'
) -> str:
    return '{"global_step": 40, "best_metric": null, "log_history": [' + entries + "]" + tail


FLAT = ", ".join(
    json.dumps({"loss": 2.0 + i / 100, "step": i, "learning_rate": 1e-4}) for i in range(1, 41)
)
HOSTILE_DOCS = {
    "plain": _state(FLAT),
    "indented": json.dumps(
        {"log_history": [{"loss": 2.0, "step": i} for i in range(1, 41)], "x": [1]}, indent=2
    ),
    "nan tokens": _state(
        FLAT.replace('"loss": 2.05', '"loss": NaN').replace('"loss": 2.1,', '"loss": Infinity,')
    ),
    "string holding a boundary": _state(
        FLAT.replace(
            '"learning_rate": 0.0001}, {"loss": 2.2',
            '"learning_rate": 0.0001, "note": "a},{b"}, {"loss": 2.2',
        )
    ),
    "an entry holding a list": _state(FLAT.replace('"step": 30,', '"step": 30, "xs": [1, 2],')),
    "an entry holding a list of objects": _state(
        FLAT.replace('"step": 30,', '"step": 30, "xs": [{"a": 1}],')
    ),
    "empty history": _state(" "),
    "history not a list": '{"global_step": 4, "log_history": {"loss": 1}}',
    "two histories": _state(FLAT)[:-1] + ', "log_history": [{"loss": 9.0, "step": 1}]}',
    "truncated": _state(FLAT)[:-300],
    "trailing garbage": _state(FLAT) + " x",
    "a bad loss": _state(FLAT.replace('"loss": 2.2,', '"loss": "high",')),
    "a bad loss and trailing garbage": _state(FLAT.replace('"loss": 2.2,', '"loss": "high",'))
    + " x",
    "bom": "\ufeff" + _state(FLAT),
    "whitespace": " " * 5000,
    "a list of records": "[" + FLAT + "]",
    "history key inside a string": '{"note": "\\"log_history\\": [", ' + _state(FLAT)[1:],
    "deep nesting after the history": _state(FLAT, ', "x": ' + "[" * 3000 + "]" * 3000 + "}"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_DOCS))
def test_hostile_documents_stream_the_same(name, tmp_path, monkeypatch):
    p = tmp_path / "trainer_state.json"
    p.write_text(HOSTILE_DOCS[name], encoding="utf-8")
    _assert_doc_same(p, monkeypatch)


def test_a_sliceable_document_is_never_held_whole(tmp_path, monkeypatch):
    """The streamed read keeps the text before log_history, one slice, one block and the text after it: the
    whole-file reader is not called (and its result is the same series)."""
    p = tmp_path / "trainer_state.json"
    p.write_text(HOSTILE_DOCS["indented"])
    expected = _outcome(lambda: logs.read_log(p))
    monkeypatch.setattr(logs, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(records, "STREAM_SLICE_BYTES", 300)
    monkeypatch.setattr(records, "BLOCK_BYTES", 256)

    def whole(*_a):
        raise AssertionError("read whole")

    monkeypatch.setattr(logs, "_read_rest", whole)
    assert _outcome(lambda: logs.read_log(p)) == expected


# --------------------------------------------------------------------------- the analysis in chunks

REAL_ALL = sorted(q.name for q in REAL.iterdir() if q.name != "manifest.json")


def _analysis(p: Path) -> dict:
    from checkpoint_strategy.recovery import advise

    try:
        return advise(p, []).model_dump(mode="json")
    except UsageError as exc:  # a log that needs --loss-column: the same refusal
        return {"error": str(exc)}


@pytest.mark.parametrize("name", REAL_ALL)
def test_the_analysis_in_tiny_chunks_is_the_same(name, tmp_path, monkeypatch):
    """detect's bounded temporaries (block statistics, the reference's partition, the spike rules and the
    rounding-step check, each a chunk at a time) give the same report as one pass over the whole series."""
    from checkpoint_strategy.recovery import detect

    p = REAL / name
    whole = _analysis(p)
    monkeypatch.setattr(detect, "STATS_ROWS", 3)
    monkeypatch.setattr(detect, "STATS_VALUES", 7)
    monkeypatch.setattr(detect, "QUANTUM_CHUNK", 5)
    assert _analysis(p) == whole


@pytest.mark.parametrize("name", REAL_ALL)
def test_the_analysis_with_shared_block_medians_is_the_same(name, monkeypatch):
    """detect.SharedBlocks (the block medians and the reference the three passes over the loss take once) gives the
    report each pass gives computing its own."""
    from checkpoint_strategy.recovery import detect

    p = REAL / name
    shared = _analysis(p)
    monkeypatch.setattr(detect, "shared_blocks", lambda *_a: None)
    assert _analysis(p) == shared


@pytest.mark.parametrize("n", [40, 61, 517, 20_003])
def test_shared_block_medians_on_spikes_nan_shifts_and_a_partial_block(n, tmp_path, monkeypatch):
    """The same with a partial last block (n not a multiple of the block), a short log (its level-shift block of 3
    is not the shared block of 2), NaN, a spike and a level shift; and the shared medians are never written to."""
    from checkpoint_strategy.recovery import detect

    rng = np.random.default_rng(n)
    loss = np.round(2.5 * np.exp(-np.arange(n) / 5000) + 1 + 0.02 * rng.standard_normal(n), 4)
    loss[n // 5] = 40.0
    loss[n // 2 : n // 2 + 3] = np.nan
    loss[3 * n // 4 :] += 1.5
    p = tmp_path / "train.jsonl"
    p.write_text(
        "".join(json.dumps({"step": i + 1, "loss": float(v)}) + "\n" for i, v in enumerate(loss))
    )
    made = []
    real = detect.shared_blocks

    def kept(*a):
        made.append(real(*a))
        return made[-1]

    monkeypatch.setattr(detect, "shared_blocks", kept)
    shared = _analysis(p)
    assert (
        made
        and made[0] is not None
        and made[0].ref_b is not None
        and not made[0].bmed.flags.writeable
    )
    monkeypatch.setattr(detect, "shared_blocks", lambda *_a: None)
    assert _analysis(p) == shared


@pytest.mark.parametrize("n", [64, 517, 20_003])
@pytest.mark.parametrize("window", [16, 24, 128])
def test_each_pass_gives_the_same_figures_from_shared_block_medians(n, window):
    """reference_blocks, _rolling_blocks and _shift_blocks from SharedBlocks: bit for bit the figures each computes
    alone (NaN, a spike, a shift; a partial last block; a level-shift block of 3 against a shared block of 2)."""
    from checkpoint_strategy.recovery import detect

    rng = np.random.default_rng(n + window)
    x = 2 + 0.05 * rng.standard_normal(n)
    x[n // 3] = 50.0
    x[n // 2] = np.nan
    x[2 * n // 3 :] += 1.0
    shared = detect.shared_blocks(x, window)
    assert shared is not None

    def same(a, b):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()

    same(
        detect.reference_blocks(x, window, shared).per_block,
        detect.reference_blocks(x, window).per_block,
    )
    for a, b in zip(
        detect._rolling_blocks(x, window, shared), detect._rolling_blocks(x, window), strict=True
    ):
        same(a, b)
    b = max(3, detect.block_size(window))
    xf = detect._ffill(x)
    spans = [(n // 3, n // 3 + 2)]
    for a, c in zip(
        detect._shift_blocks(xf, n // b, b, window, 0.1, spans, shared),
        detect._shift_blocks(xf, n // b, b, window, 0.1, spans),
        strict=True,
    ):
        same(a, c)


def test_a_long_series_with_spikes_and_nan_analyses_the_same_in_chunks(tmp_path, monkeypatch):
    from checkpoint_strategy.recovery import detect

    rng = np.random.default_rng(7)
    n = 20_000
    loss = np.round(2.5 * np.exp(-np.arange(n) / 5000) + 1 + 0.02 * rng.standard_normal(n), 4)
    loss[4000] = 40.0  # a spike that comes back
    loss[9000:9050] = np.nan  # NaN for a while
    loss[15000:] += 1.5  # a level shift that stays
    p = tmp_path / "train.jsonl"
    p.write_text(
        "".join(
            json.dumps({"step": i + 1, "loss": float(v), "grad_norm": float(abs(v))}) + "\n"
            for i, v in enumerate(loss)
        )
    )
    whole = _analysis(p)
    assert whole["status"] != "no_spike"
    for rows, values, quantum in ((5, 11, 3), (64, 1000, 999)):
        monkeypatch.setattr(detect, "STATS_ROWS", rows)
        monkeypatch.setattr(detect, "STATS_VALUES", values)
        monkeypatch.setattr(detect, "QUANTUM_CHUNK", quantum)
        assert _analysis(p) == whole


@pytest.mark.parametrize("k", [1, 2, 3, 7, 8, 16, 17])
def test_row_medians_are_numpys_bit_for_bit(k):
    """detect's sort-based row medians (block statistics) give np.median's and np.nanmedian's bits: signed zeros,
    NaN and inf rows, values whose sum overflows, rounded values with ties."""
    import warnings

    from checkpoint_strategy.recovery import detect

    rng = np.random.default_rng(k)
    for trial in range(40):
        a = rng.standard_normal((300, k)) * 10.0 ** float(rng.integers(-300, 300))
        if trial % 3 == 0:
            a = np.round(a, int(rng.integers(0, 6)))
        if trial % 4 == 1:
            a[rng.random(a.shape) < 0.2] = np.nan
        if trial % 5 == 2:
            a[rng.random(a.shape) < 0.1] = np.inf
        if trial % 5 == 3:
            a[rng.random(a.shape) < 0.1] = -np.inf
        if trial % 7 == 4:
            a = 1.7e308 * np.sign(a)
        if trial % 11 == 5:
            a[:] = -0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert detect._row_median(a).tobytes() == np.median(a, axis=1).tobytes(), trial
            assert detect._row_nanmedian(a).tobytes() == np.nanmedian(a, axis=1).tobytes(), trial


def test_steps_become_int64_in_the_readers_array_only(tmp_path, monkeypatch):
    """build_series converts a reader's own float64 steps in place (no second copy of a long series), a chunk at a
    time; an array passed by a caller is left alone, and a bad step in a later chunk is named by its entry."""
    steps = np.arange(1.0, 1001.0)
    loss = np.full(1000, 2.0)
    monkeypatch.setattr(logs, "STEP_CHUNK", 64)
    s = logs.build_series(steps, loss)
    assert steps.dtype == np.float64 and steps[999] == 1000.0  # the caller's array is untouched
    own = np.arange(1.0, 1001.0)
    s2 = logs.build_series(own, loss, reuse_steps=True)
    assert np.shares_memory(s2.raw_steps, own) and s2.raw_steps.tolist() == s.raw_steps.tolist()
    assert s2.steps.dtype == np.int64 and s2.steps.tolist() == list(range(1, 1001))
    for bad, shown in (
        (700.5, "700.5"),
        (math.nan, "missing"),
        (-3.0, "-3.0"),
        (2.0**60, repr(2.0**60)),
    ):
        arr = np.arange(1.0, 1001.0)
        arr[699] = bad
        with pytest.raises(
            UsageError, match=rf"step at entry 700 is {re.escape(shown)}; expected a whole number"
        ):
            logs.build_series(arr, loss, reuse_steps=True)
    p = tmp_path / "train.jsonl"
    p.write_text(
        "".join(
            json.dumps({"step": i + 0.5 * (i == 900), "loss": 2.0}) + "\n" for i in range(1, 1001)
        )
    )
    assert _assert_same(p, monkeypatch) == (
        "error",
        f"log {p}: step at entry 900 is 900.5; expected a whole number of steps, from 0 to 2^53",
    )


def test_the_reference_held_per_block_is_the_per_value_one():
    from checkpoint_strategy.recovery import detect, settings

    rng = np.random.default_rng(5)
    for n in (5, 17, 1000, 4099):
        x = 2 + 0.05 * rng.standard_normal(n)
        x[n // 2] = np.nan
        ref = detect.healthy_reference(x, 128)
        blocked = detect.reference_blocks(x, 128)
        assert len(blocked) == n
        assert np.array_equal(np.array([blocked[i] for i in range(n)]), ref, equal_nan=True)
        assert (
            np.array_equal(blocked.values(), ref, equal_nan=True)
            and np.isfinite(ref[n // 2 + 40 :]).all()
        )
        with pytest.raises(IndexError):
            blocked[n]
        an = detect.analyse(np.arange(n), x, None, settings.build(None))
        assert np.array_equal(
            an.reference,
            detect.healthy_reference(x, detect.effective_window(n, 128)),
            equal_nan=True,
        )


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 16])
def test_runs_of_equal_values_found_a_chunk_at_a_time(chunk, monkeypatch):
    """detect._same_runs (the collapse rule's runs of equal values) gives the edges of the whole comparison padded
    with False, whatever the chunk: runs crossing chunk borders, at the start, at the end, NaN breaking a run."""
    from checkpoint_strategy.recovery import detect

    monkeypatch.setattr(detect, "FLAG_VALUES", chunk)
    x = np.array(
        [
            1.0,
            1.0,
            1.0,
            2.0,
            3.0,
            3.0,
            3.0,
            3.0,
            np.nan,
            3.0,
            3.0,
            4.0,
            5.0,
            5.0 + 1e-9,
            5.0,
            5.0,
            5.0,
        ]
    )
    for xs in (x, x[1:], x[:-1], x[3:12], np.full(9, 0.0), np.arange(9.0)):
        with np.errstate(invalid="ignore"):
            same = (
                np.abs(np.diff(xs)) <= detect.COLLAPSE_RELATIVE * np.abs(xs[1:]) + 1e-12
            ) & np.isfinite(xs[1:])
        edges = np.diff(np.concatenate(([0], same.astype(np.int8), [0])))
        starts, ends = detect._same_runs(xs)
        assert starts.tolist() == np.flatnonzero(edges == 1).tolist()
        assert ends.tolist() == np.flatnonzero(edges == -1).tolist()
        assert detect._all_finite(xs) == bool(np.isfinite(xs).all())


def test_a_divergence_early_in_a_long_log_is_analysed_the_same_in_chunks(tmp_path, monkeypatch):
    """The unrecovered-event paths (never back below the start; divergence or plateau after a blow-up) take their
    medians of 5 a chunk at a time: the same report as in one pass."""
    from checkpoint_strategy.recovery import detect

    rng = np.random.default_rng(11)
    n = 6000
    climb = np.round(
        3.0 + np.arange(n) / 1500 + 0.02 * rng.standard_normal(n), 4
    )  # never gets below the start
    plateau = np.round(2.0 + 0.02 * rng.standard_normal(n), 4)
    plateau[1200:] += 1.0  # steps up and stays
    never = np.round(3.0 + 0.03 * rng.standard_normal(n), 4)
    never[:4] = 2.0  # the untrained model's loss, then up for good (never back below the start)
    for name, loss in (("climb", climb), ("plateau", plateau), ("never", never)):
        p = tmp_path / f"{name}.jsonl"
        p.write_text(
            "".join(
                json.dumps({"step": i + 1, "loss": float(v)}) + "\n" for i, v in enumerate(loss)
            )
        )
        whole = _analysis(p)
        assert whole["status"] == "rollback" and whole["spikes"], (name, whole["status"])
        with monkeypatch.context() as m:
            m.setattr(detect, "STATS_VALUES", 7)
            m.setattr(detect, "STATS_ROWS", 3)
            assert _analysis(p) == whole, name


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(
        st.one_of(st.floats(allow_nan=False), st.lists(st.floats(allow_nan=False), max_size=9000)),
        max_size=30,
    )
)
def test_a_column_keeps_single_values_and_batches_in_order(parts):
    """records._Column: values appended one at a time and numpy batches, in any interleaving, read back in order
    (the buffer doubling past 4096 values, the waiting single values moved in before each batch)."""
    col = records._Column()
    expected: list[float] = []
    for part in parts:
        if isinstance(part, list):
            col.extend(np.asarray(part, dtype=np.float64))
            expected += part
        else:
            col.append(part)
            expected.append(part)
        assert len(col) == len(expected)
    got = col.array()
    assert got.dtype == np.float64 and got.tolist() == expected
    assert col.array().tolist() == expected  # reading twice gives the same
    more = np.arange(
        5000, dtype=np.float64
    )  # growing while a view of it is out: a new map, the view unchanged
    col.extend(more)
    assert got.tolist() == expected and col.array().tolist() == expected + more.tolist()
