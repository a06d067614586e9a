"""on-event shares recover's rules: a non-finite value never saves, enums in any case, unknown failing
checks are warnings, and a long event stream is decided in bounded memory."""

from __future__ import annotations

import json

import pytest

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.formats.runfacts import launcher
from checkpoint_strategy.integrations import decide, decide_all, parse_events
from checkpoint_strategy.integrations.events import MAX_LISTED, SPIKE_WAIT_STEPS
from checkpoint_strategy.recovery.settings import DEFAULTS

LAUNCHER = launcher()  # how the next command is written (runnable from any shell)


def run(capsys, tmp_path, content, *args):
    p = tmp_path / "events.jsonl"
    p.write_text(content)
    rc = main(["on-event", str(p), "--format", "json", *args])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_value_never_saves(tmp_path, capsys, value):
    rc, d, _ = run(
        capsys,
        tmp_path,
        f'{{"event": "LOSS_SPIKE", "step": 10, "value": {value}, "magnitude": 3}}\n',
    )
    assert rc == 0 and d["decision"] == "none" and d["save_at_step"] is None
    assert "never save" in d["reason"] and d["next_command"].startswith(LAUNCHER + " recover")
    rc, d, _ = run(
        capsys,
        tmp_path,
        '{"event": "GRADIENT_NORM_EXCEEDED", "step": 10, "value": NaN}\n'
        '{"event": "LOSS_SPIKE", "step": 12, "value": 7.0}\n',
    )
    # a NaN grad norm alone (fp16 skips the step) is not saved; the finite spike after it is
    assert [x["decision"] for x in d["decisions"]] == ["none", "emergency_save"] and d[
        "save_at_step"
    ] == 12
    assert decide({"event": "LOSS_SPIKE", "step": 3, "value": float("nan")}).should_save is False


def test_enums_in_any_case(tmp_path, capsys):
    rc, d, _ = run(capsys, tmp_path, '{"event": "loss_spike", "step": 5, "severity": "CRITICAL"}\n')
    assert (
        rc == 0
        and d["decisions"][0]["event"] == "LOSS_SPIKE"
        and d["decisions"][0]["confirmed_spike"] is True
    )
    rc, d, err = run(capsys, tmp_path, '{"event": "LOSS_SPIKE", "severity": "fatal"}\n')
    assert rc == 2 and err.strip().count("\n") == 0 and "unknown severity 'fatal'" in err


def test_unknown_failing_check_is_a_warning(tmp_path, capsys):
    report = (
        "=== Training Stability Report ===\n[FAIL] Dead Neurons\n    34% of units never fire\n"
        "[PASS] Loss Spike Detection\n"
    )
    events, notes = parse_events(report)
    assert events == [] and notes[0].startswith("[FAIL] Dead Neurons: WARNING")
    p = tmp_path / "report.txt"
    p.write_text(report)
    assert main(["on-event", str(p), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["warnings"] == notes and "failing check" in d["reason"]
    assert main(["on-event", str(p)]) == 0
    assert "Warnings:" in capsys.readouterr().out


def test_the_wait_window_is_recovers():
    assert SPIKE_WAIT_STEPS == DEFAULTS.min_wait_steps


def test_long_stream_is_decided_with_a_bounded_list(tmp_path, capsys):
    n = 20_000
    lines = "".join(
        f'{{"event": "GRADIENT_NORM_EXCEEDED", "step": {i}, "value": 9, "threshold": 10}}\n'
        for i in range(n)
    )
    lines += '{"event": "LOSS_SPIKE", "step": 30000, "value": 8}\n'
    rc, d, _ = run(capsys, tmp_path, lines)
    assert rc == 0 and d["events_total"] == n + 1 and len(d["decisions"]) == MAX_LISTED
    assert d["decision"] == "emergency_save" and d["save_at_step"] == 30000
    assert any("more events were decided but are not listed" in x for x in d["notes"])
    assert decide_all(lambda: iter([{"event": "LOSS_SPIKE", "step": 1}])).events_total == 1


def test_bad_line_fails_before_any_decision(tmp_path, capsys):
    rc, _, err = run(capsys, tmp_path, '{"event": "LOSS_SPIKE", "step": 1}\n{"event": \n')
    assert rc == 2 and "line 2 is not valid JSON" in err and err.strip().count("\n") == 0
    rc, _, err = run(capsys, tmp_path, "[" * 100_000)
    assert rc == 2 and err.strip().count("\n") == 0


def test_log_given_confirms_the_spike_by_recovers_rules(tmp_path, capsys):
    import numpy as np

    y = 2 + 0.01 * np.random.default_rng(0).standard_normal(800)
    y[600:] *= 3  # not back 200 steps later: recover says roll back
    log = tmp_path / "train.jsonl"
    log.write_text("".join(f'{{"step": {i + 1}, "loss": {v:.4f}}}\n' for i, v in enumerate(y)))
    ev = tmp_path / "ev.json"
    ev.write_text('{"event": "LOSS_SPIKE", "step": 601, "value": 6.0, "magnitude": 3}')
    assert main(["on-event", str(ev), "--log", str(log), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["decisions"][0]["confirmed_spike"] is True and d["next_command"].startswith(
        LAUNCHER + " recover"
    )
    assert any("by recover's rules: rollback" in n for n in d["notes"])
    y2 = y.copy()
    y2[603:] = y[:197]  # a blip that came back
    log.write_text("".join(f'{{"step": {i + 1}, "loss": {v:.4f}}}\n' for i, v in enumerate(y2)))
    assert main(["on-event", str(ev), "--log", str(log), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["decisions"][0]["confirmed_spike"] is False
    assert any("self_recovered" in n for n in d["notes"])
