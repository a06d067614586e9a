"""Hypothesis fuzzing of log files and arguments: exit code 0, 1 or 2, never 3; rc 2 prints one line."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.cli import main
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery import detect_spikes

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20))
values = st.one_of(numbers, st.none(), st.booleans(), st.text(max_size=5), st.lists(st.integers(), max_size=2))
steps = st.one_of(st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=3), st.none())
record = st.fixed_dictionaries({"step": steps, "loss": values},
                               optional={"grad_norm": values, "learning_rate": values, "eval_loss": values})
series_records = st.lists(st.fixed_dictionaries({"step": st.integers(0, 3000),
                                                 "loss": st.one_of(st.floats(-5, 1e6), st.sampled_from([math.nan, math.inf]))},
                                                optional={"grad_norm": numbers, "learning_rate": numbers}),
                          max_size=400)


def check(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 1, 2), err
    if rc == 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return rc


def _dump(obj) -> str:
    return json.dumps(obj, allow_nan=True)


@SETTINGS
@given(history=st.one_of(st.lists(record, max_size=60), series_records), wrap=st.booleans(),
       cut=st.integers(0, 400), as_lines=st.booleans())
def test_fuzzed_json_logs(tmp_path_factory, capsys, history, wrap, cut, as_lines):
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
@given(header=st.lists(st.sampled_from(["step", "loss", "Step", "r - train/loss", "r - train/loss__MIN", "lr",
                                         "grad_norm", "x", ""]), min_size=1, max_size=5),
       rows=st.lists(st.lists(st.one_of(st.integers(-3, 500).map(str), st.floats().map(str),
                                        st.sampled_from(["", "nan", "inf", "abc", '"', "1e400"])),
                              max_size=6), max_size=80))
def test_fuzzed_csv_logs(tmp_path_factory, capsys, header, rows):
    p = tmp_path_factory.mktemp("fzc") / "log.csv"
    p.write_text("\n".join(",".join(r) for r in [header, *rows]))
    check(capsys, ["recover", str(p)])
    check(capsys, ["verify-resume", str(p), "--resume-step", "10", "--format", "json"])


ARG = st.sampled_from(["--window", "--z", "--ratio", "--max-ratio", "--min-rise", "--tolerance", "--wait",
                       "--min-wait", "--margin", "--lr-multiplier", "--lr-steps", "--grad-clip",
                       "--skip-past-onset", "--checkpoints", "--milestones", "--format", "--log-format",
                       "--step-column", "--loss-column", "--run", "--tag"])
ARGVAL = st.one_of(st.integers(-10, 10**7).map(str), st.floats().map(str),
                   st.sampled_from(["", "json", "text", "csv", "1,2,3", "abc", "-1", "0", "nan", "1e308"]))


@SETTINGS
@given(opts=st.lists(st.tuples(ARG, ARGVAL), max_size=4), resume=ARGVAL)
def test_fuzzed_arguments(tmp_path_factory, capsys, opts, resume):
    d = tmp_path_factory.mktemp("fza")
    y = 2 + 0.02 * np.random.default_rng(0).standard_normal(400)
    y[300:] *= 4
    p = d / "log.jsonl"
    p.write_text("\n".join(json.dumps({"step": i + 1, "loss": float(v)}) for i, v in enumerate(y)))
    argv = [str(p)]
    for k, v in opts:
        argv += [k, v]
    check(capsys, ["recover", *argv])
    check(capsys, ["verify-resume", str(p), "--resume-step", resume, *[a for kv in opts[:1] for a in kv]])


@settings(max_examples=200, deadline=None)
@given(loss=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=300),
       window=st.integers(8, 300))
def test_detect_spikes_never_crashes(loss, window):
    try:
        spikes = detect_spikes(np.arange(len(loss)), np.array(loss, dtype=np.float64), window=window)
    except UsageError:
        return
    for s in spikes:
        for v in (s.peak_loss, s.baseline_loss, s.magnitude, s.z_score):
            assert v is None or math.isfinite(v)
        json.dumps(s.model_dump(mode="json"), allow_nan=False)
