"""Hypothesis fuzzing of log files and arguments: exit code 0, 1 or 2, never 3; rc 2 prints one line."""

from __future__ import annotations

import json
import math

import curves
import numpy as np
from cliresult import Result
from fuzzcheck import LOSS_CURVES, MUTATE, assert_events_in_order, reached, reaches_core
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery import detect_spikes

SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**20), 10**20))
values = st.one_of(
    numbers, st.none(), st.booleans(), st.text(max_size=5), st.lists(st.integers(), max_size=2)
)
steps = st.one_of(st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=3), st.none())
record = st.fixed_dictionaries(
    {"step": steps, "loss": values},
    optional={"grad_norm": values, "learning_rate": values, "eval_loss": values},
)
series_records = st.lists(
    st.fixed_dictionaries(
        {
            "step": st.integers(0, 3000),
            "loss": st.one_of(st.floats(-5, 1e6), st.sampled_from([math.nan, math.inf])),
        },
        optional={"grad_norm": numbers, "learning_rate": numbers},
    ),
    max_size=400,
)


def check(capsys, argv):
    return run(capsys, argv).rc


def run(capsys, argv) -> Result:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 1, 2), err
    if rc == 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return Result(rc, out, err)


def _dump(obj) -> str:
    return json.dumps(obj, allow_nan=True)


@SETTINGS
@given(
    history=st.one_of(st.lists(record, max_size=60), series_records),
    wrap=st.booleans(),
    cut=st.integers(0, 400),
    as_lines=st.booleans(),
)
def test_fuzz_bad_json_logs_exit_2_with_one_line(
    tmp_path_factory, capsys, history, wrap, cut, as_lines
):
    d = tmp_path_factory.mktemp("fz")
    if as_lines:
        p = d / "m.jsonl"
        p.write_text("\n".join(_dump(r) for r in history))
    else:
        p = d / "trainer_state.json"
        text = _dump({"log_history": history} if wrap else history)
        p.write_text(text[: len(text) - cut] if cut and cut < len(text) else text)
    check(capsys, ["recover", str(p), "--format", "json"])
    check(capsys, ["recover", str(p), "--checkpoints", "1,50,100"])
    check(capsys, ["verify-resume", str(p), "--resume-step", "50"])


@SETTINGS
@given(
    header=st.lists(
        st.sampled_from(
            [
                "step",
                "loss",
                "Step",
                "r - train/loss",
                "r - train/loss__MIN",
                "lr",
                "grad_norm",
                "x",
                "",
            ]
        ),
        min_size=1,
        max_size=5,
    ),
    rows=st.lists(
        st.lists(
            st.one_of(
                st.integers(-3, 500).map(str),
                st.floats().map(str),
                st.sampled_from(["", "nan", "inf", "abc", '"', "1e400"]),
            ),
            max_size=6,
        ),
        max_size=80,
    ),
)
def test_fuzz_bad_csv_logs_exit_2_with_one_line(tmp_path_factory, capsys, header, rows):
    p = tmp_path_factory.mktemp("fzc") / "log.csv"
    p.write_text("\n".join(",".join(r) for r in [header, *rows]))
    check(capsys, ["recover", str(p)])
    check(capsys, ["verify-resume", str(p), "--resume-step", "10", "--format", "json"])


ARG = st.sampled_from(
    [
        "--window",
        "--z",
        "--ratio",
        "--max-ratio",
        "--min-rise",
        "--tolerance",
        "--wait",
        "--min-wait",
        "--margin",
        "--lr-multiplier",
        "--lr-steps",
        "--grad-clip",
        "--skip-past-onset",
        "--checkpoints",
        "--milestones",
        "--format",
        "--log-format",
        "--step-column",
        "--loss-column",
        "--run",
        "--tag",
    ]
)
ARGVAL = st.one_of(
    st.integers(-10, 10**7).map(str),
    st.floats().map(str),
    st.sampled_from(["", "json", "text", "csv", "1,2,3", "abc", "-1", "0", "nan", "1e308"]),
)


@SETTINGS
@given(opts=st.lists(st.tuples(ARG, ARGVAL), max_size=4), resume=ARGVAL)
def test_fuzz_bad_recover_arguments_exit_2_with_one_line(tmp_path_factory, capsys, opts, resume):
    d = tmp_path_factory.mktemp("fza")
    y = 2 + 0.02 * np.random.default_rng(0).standard_normal(400)
    y[300:] *= 4
    p = d / "log.jsonl"
    p.write_text("\n".join(json.dumps({"step": i + 1, "loss": float(v)}) for i, v in enumerate(y)))
    argv = [str(p)]
    for k, v in opts:
        argv += [k, v]
    check(capsys, ["recover", *argv])
    check(
        capsys,
        ["verify-resume", str(p), "--resume-step", resume, *[a for kv in opts[:1] for a in kv]],
    )


@settings(max_examples=200, deadline=None)
@given(
    loss=st.lists(
        st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=300
    ),
    window=st.integers(8, 300),
)
def test_detect_spikes_on_garbage_floats_never_crashes(loss, window):
    try:
        spikes = detect_spikes(
            np.arange(len(loss)), np.array(loss, dtype=np.float64), window=window
        )
    except UsageError:
        return
    for s in spikes:
        for v in (s.peak_loss, s.baseline_loss, s.magnitude, s.z_score):
            assert v is None or math.isfinite(v)
        json.dumps(s.model_dump(mode="json"), allow_nan=False)


# --------------------------------------------------------------------------- real logs, then mutated (issue 18)


def _records(y, every: int, extras: bool) -> list[dict]:
    n = len(y)
    out = [{"step": (i + 1) * every, "loss": float(v)} for i, v in enumerate(y)]
    if extras:
        for i, r in enumerate(out):
            r["grad_norm"] = 1.0 + 0.1 * math.sin(i) + (5.0 if i == n // 2 else 0.0)
            r["learning_rate"] = 1e-3 * 0.5 * (1 + math.cos(math.pi * i / n))
    return out


def _mutate_records(records: list[dict], roll) -> list[dict]:
    """One realistic damage one time in five: a value replaced by garbage, a key dropped, or a restart (the
    run resumed from an earlier step and logged those steps again)."""
    chance, where, garbage = roll
    if chance < 16:
        return records
    out = [dict(r) for r in records]
    i = where % len(out)
    how = where % 3
    if how == 0:
        out[i]["loss"] = garbage
    elif how == 1:
        del out[i]["loss"]
    else:
        out += [dict(r) for r in out[i // 2 : i]]
    return out


def _check_report(out: str, *, spikes_key: str = "spikes") -> None:
    r = json.loads(out)
    assert_events_in_order(r[spikes_key])
    if r["status"] == "rollback" and r["resume_checkpoint"] is not None and r["spike"] is not None:
        assert r["resume_checkpoint"]["step"] < r["spike"]["onset_step"]


@reaches_core()
@SETTINGS
@given(
    y=LOSS_CURVES,
    every=st.integers(1, 20),
    extras=st.booleans(),
    shape=st.sampled_from(["hf", "list", "jsonl"]),
    roll=MUTATE,
)
# found by this fuzzer: a grad-norm precursor moved two spikes' onsets back to the same step
@example(
    y=curves.sample(17, "level_shift", 0.005, 150, 2),
    every=1,
    extras=True,
    shape="hf",
    roll=(0, 0, ""),
)
def test_fuzzed_json_logs(tmp_path_factory, capsys, y, every, extras, shape, roll):
    """Real log shapes (HF trainer_state.json, a JSON list, JSON lines) of real-looking curves, damaged one time in
    five: recover reports events in order and a resume point before the spike; verify-resume runs."""
    records = _mutate_records(_records(y, every, extras), roll)
    d = tmp_path_factory.mktemp("fzv")
    p = d / ("m.jsonl" if shape == "jsonl" else "trainer_state.json")
    if shape == "jsonl":
        p.write_text("\n".join(_dump(r) for r in records))
    else:
        p.write_text(_dump({"log_history": records} if shape == "hf" else records))
    ck = ",".join(str(every * k) for k in (10, 50, 100, 300))
    r = run(capsys, ["recover", str(p), "--format", "json", "--checkpoints", ck])
    if reached(r.rc != 2):
        _check_report(r.out)
    check(capsys, ["verify-resume", str(p), "--resume-step", str(every * len(y) // 2)])


CSV_GARBAGE = st.sampled_from(["", "nan", "inf", "abc", '"', "1e400", "-1"])


@reaches_core()
@SETTINGS
@given(
    y=LOSS_CURVES,
    every=st.integers(1, 20),
    names=st.sampled_from([("step", "loss"), ("Step", "r - train/loss"), ("step", "train/loss")]),
    lr=st.booleans(),
    roll=MUTATE,
    cell=CSV_GARBAGE,
)
def test_fuzzed_csv_logs(tmp_path_factory, capsys, y, every, names, lr, roll, cell):
    """CSV logs as W&B and Lightning write them, one cell or row damaged one time in five."""
    header = [*names, *(["lr"] if lr else [])]
    rows = [
        [str((i + 1) * every), repr(float(v)), *([repr(1e-3 / (1 + i))] if lr else [])]
        for i, v in enumerate(y)
    ]
    chance, where, _ = roll
    if chance >= 16:
        row = rows[where % len(rows)]
        if where % 2:
            row[where % len(row)] = cell
        else:
            del row[-1]
    p = tmp_path_factory.mktemp("fzcv") / "log.csv"
    p.write_text("\n".join(",".join(r) for r in [header, *rows]))
    r = run(capsys, ["recover", str(p), "--format", "json"])
    if reached(r.rc != 2):
        _check_report(r.out)
    check(
        capsys,
        ["verify-resume", str(p), "--resume-step", str(every * len(y) // 2), "--format", "json"],
    )


RECOVER_OPTIONS = st.one_of(
    st.tuples(st.just("--window"), st.integers(8, 512).map(str)),
    st.tuples(st.just("--z"), st.floats(3, 20).map(repr)),
    st.tuples(st.just("--ratio"), st.floats(1.5, 10).map(repr)),
    st.tuples(st.just("--max-ratio"), st.floats(2, 50).map(repr)),
    st.tuples(st.just("--min-rise"), st.floats(0, 0.5).map(repr)),
    st.tuples(st.just("--tolerance"), st.floats(0.01, 1).map(repr)),
    st.tuples(st.just("--wait"), st.integers(50, 500).map(str)),
    st.tuples(st.just("--min-wait"), st.integers(0, 50).map(str)),
    st.tuples(st.just("--margin"), st.integers(0, 300).map(str)),
    st.tuples(st.just("--lr-multiplier"), st.floats(0.01, 1).map(repr)),
    st.tuples(st.just("--lr-steps"), st.integers(0, 2000).map(str)),
    st.tuples(st.just("--grad-clip"), st.floats(0.1, 10).map(repr)),
    st.tuples(st.just("--skip-past-onset"), st.integers(0, 100).map(str)),
    st.tuples(st.just("--checkpoints"), st.sampled_from(["100,200,290", "50", "10,20,30,40"])),
    st.tuples(st.just("--milestones"), st.sampled_from(["50", "100,250"])),
    st.tuples(st.just("--log-format"), st.sampled_from(["auto", "jsonl"])),
)


@reaches_core()
@SETTINGS
@given(opts=st.lists(RECOVER_OPTIONS, max_size=4), roll=MUTATE, resume=st.integers(1, 399))
def test_fuzzed_arguments(tmp_path_factory, capsys, opts, roll, resume):
    """Every recover option in range (one value in five replaced by garbage) on a log with a 4x spike at 300."""
    d = tmp_path_factory.mktemp("fzva")
    y = 2 + 0.02 * np.random.default_rng(0).standard_normal(400)
    y[300:] *= 4
    p = d / "log.jsonl"
    p.write_text("\n".join(json.dumps({"step": i + 1, "loss": float(v)}) for i, v in enumerate(y)))
    chance, where, garbage = roll
    flat = [t for kv in opts for t in kv]
    if chance >= 16 and flat:
        flat[where % len(flat)] = garbage
    r = run(capsys, ["recover", str(p), *flat, "--format", "json"])
    if reached(r.rc != 2):
        _check_report(r.out)
    check(capsys, ["verify-resume", str(p), "--resume-step", str(resume), *flat[:2]])


@reaches_core()
@settings(max_examples=200, deadline=None)
@given(y=LOSS_CURVES, window=st.integers(8, 300), every=st.integers(1, 10))
# found by this fuzzer: a level shift's onset refined back into the previous shift
@example(y=curves.sample(1082, "level_shift", 0.1, 569, 0), window=8, every=5)
def test_detect_spikes_never_crashes(y, window, every):
    """Real curves (with trouble and outliers): events come sorted and disjoint, every number finite."""
    spikes = detect_spikes(np.arange(1, len(y) + 1) * every, y, window=window)
    reached(bool(spikes))  # an example with no event checks only that nothing crashed
    assert_events_in_order(spikes)
    for s in spikes:
        for v in (s.peak_loss, s.baseline_loss, s.magnitude, s.z_score):
            assert v is None or math.isfinite(v)
        json.dumps(s.model_dump(mode="json"), allow_nan=False)
