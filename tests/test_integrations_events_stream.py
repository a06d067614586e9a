"""on-event on long event streams: the decision names the event it saves at, a NaN/inf loss shown only
as a LOSS_SPIKE's magnitude never saves (docs/callbacks.md, recover's NaN/inf rule), the launcher is looked
up once per run (not once per event), and orjson (when installed) reads the same events as the standard
library, hostile lines included."""

from __future__ import annotations

import json

import pytest

from checkpoint_strategy.cli.main import main
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import runfacts
from checkpoint_strategy.integrations import decide, decide_all
from checkpoint_strategy.integrations.events import SPIKE_WAIT_STEPS, event_stream
from checkpoint_strategy.recovery import records


def _on_event(capsys, path, *args):
    rc = main(["on-event", str(path), "--format", "json", *args])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else err)


def test_a_persistent_spike_stream_saves_at_its_first_event_and_says_so(tmp_path, capsys):
    """A loss spiking at every step from 0 (the shape of a 500 000-line monitor log): the save is at step 0,
    the first triggering event, and the reason is told from that event (it used to quote step 50, the first
    event past the wait window, next to 'step 0')."""
    p = tmp_path / "events.jsonl"
    n = 3 * SPIKE_WAIT_STEPS
    p.write_text("".join(json.dumps({"event": "LOSS_SPIKE", "step": i}) + "\n" for i in range(n)))
    rc, d = _on_event(capsys, p)
    assert rc == 0 and d["decision"] == "emergency_save" and d["save_at_step"] == 0
    assert d["reason"].startswith("loss spike at step 0, trigger loss_spike_detected: save now")
    assert "the spike is confirmed (persistent or critical)" in d["reason"]
    assert f"(confirmed by the spike at step {SPIKE_WAIT_STEPS})" in d["reason"]
    assert d["reason"].endswith(f"({n} events ask for an emergency save; one save is enough)")
    assert (
        d["events_total"] == n
        and d["next_command"] is not None
        and " recover " in d["next_command"]
    )


def test_a_grad_norm_save_before_a_confirmed_spike_names_both(tmp_path, capsys):
    p = tmp_path / "events.jsonl"
    p.write_text(
        '{"event": "GRADIENT_NORM_EXCEEDED", "step": 10, "value": 12, "threshold": 10}\n'
        '{"event": "LOSS_SPIKE", "step": 20}\n{"event": "LOSS_SPIKE", "step": 90}\n'
    )
    rc, d = _on_event(capsys, p)
    assert rc == 0 and d["save_at_step"] == 10
    assert d["reason"].startswith("gradient norm exceeded at step 10 (value 12, threshold 10)")
    assert "; then a loss spike at step 90: the spike is confirmed" in d["reason"]


def test_a_critical_first_spike_reads_as_before(tmp_path, capsys):
    """The golden case (docs/integrations.md): the first saving event is itself confirmed."""
    p = tmp_path / "events.json"
    p.write_text(
        '[{"event": "LOSS_SPIKE", "step": 2110, "magnitude": 3.1, "severity": "critical"}, '
        '{"event": "LOSS_SPIKE", "step": 2210, "magnitude": 3.0, "severity": "critical"}]'
    )
    rc, d = _on_event(capsys, p)
    assert d["save_at_step"] == 2110 and d["reason"].startswith(
        "loss spike at step 2110 (3.1x baseline)"
    )
    assert "confirmed by the spike" not in d["reason"]


@pytest.mark.parametrize("magnitude", ["NaN", "Infinity", "-Infinity"])
def test_a_loss_spike_with_a_non_finite_magnitude_never_saves(tmp_path, capsys, magnitude):
    """magnitude = value / baseline is NaN or inf only when the loss is: the NaN/inf rule applies as for value
    (docs/callbacks.md: a NaN/inf loss never triggers a save)."""
    p = tmp_path / "events.jsonl"
    p.write_text(f'{{"event": "LOSS_SPIKE", "step": 61, "magnitude": {magnitude}}}\n')
    rc, d = _on_event(capsys, p)
    assert rc == 0 and d["decision"] == "none" and d["save_at_step"] is None
    assert (
        "never save" in d["reason"]
        and "magnitude" in d["reason"]
        and " recover " in d["next_command"]
    )
    p.write_text(
        '{"event": "LOSS_SPIKE", "step": 60, "magnitude": 3.0}\n'
        f'{{"event": "LOSS_SPIKE", "step": 61, "magnitude": {magnitude}}}\n'
    )
    rc, d = _on_event(capsys, p)  # an event that saw a NaN: nothing is saved afterwards
    assert d["decision"] == "none" and [x["decision"] for x in d["decisions"]] == [
        "emergency_save",
        "none",
    ]
    assert (
        decide({"event": "LOSS_SPIKE", "step": 3, "magnitude": float("inf")}).should_save is False
    )
    # a grad norm's magnitude is not a loss: a finite grad norm over its threshold still saves
    assert (
        decide(
            {
                "event": "GRADIENT_NORM_EXCEEDED",
                "step": 3,
                "magnitude": float("nan"),
                "value": 20,
                "threshold": 10,
            }
        ).should_save
        is True
    )


def test_the_launcher_is_looked_up_once_per_run_not_per_event(monkeypatch):
    calls = []
    real = runfacts.launcher
    monkeypatch.setattr(runfacts, "launcher", lambda: calls.append(1) or real())
    events = [{"event": "LOSS_SPIKE", "step": i} for i in range(500)]
    events += [{"event": "LOSS_PLATEAU", "step": 600 + i} for i in range(500)]
    d = decide_all(events)
    assert d.events_total == 1000 and d.decision == "emergency_save"
    assert len(calls) == 2  # the recover command and the verify-resume command, each written once


HOSTILE_EVENT_FILES = {
    "nan tokens": '{"event": "LOSS_SPIKE", "step": 5, "value": NaN}\n{"event": "LOSS_SPIKE", "step": 6}\n',
    "blank lines and CR": '\n{"event": "LOSS_SPIKE", "step": 5}\r\n\n   \n{"event": "NAN_LOSS", "step": 9}\n',
    "lone surrogate": '{"event": "LOSS_SPIKE", "step": 5, "note": "\\ud800"}\n{"event": "LOSS_PLATEAU"}\n',
    "bad json line": '{"event": "LOSS_SPIKE", "step": 5}\n{"event": "LOSS_SPIKE", "step": }\n',
    "bad event before bad json": '{"event": "LOSS_SPIKE", "step": 5}\n{"event": "BOOM"}\n{"event": \n',
    "bad event after spikes": "".join(
        f'{{"event": "LOSS_SPIKE", "step": {i}}}\n' for i in range(60)
    )
    + '{"event": "LOSS_SPIKE", "step": -1}\n',
    "big integer step": '{"event": "LOSS_SPIKE", "step": 18446744073709551617}\n',
    "string step": '{"event": "LOSS_SPIKE", "step": "70"}\n{"event": "LOSS_SPIKE", "step": 5}\n',
    "deep nesting": '{"event": "LOSS_SPIKE", "step": 5, "x": ' + "[" * 5000 + "]" * 5000 + "}\n"
    '{"event": "LOSS_SPIKE", "step": 6}\n',
    "magnitude infinity": '{"event": "LOSS_SPIKE", "step": 5, "magnitude": Infinity}\n',
}


def _decision(text: str):
    try:
        items, notes = event_stream(text, "events.jsonl")
        return decide_all(items, notes=notes).model_dump(mode="json")
    except UsageError as exc:
        return str(exc)


@pytest.mark.parametrize("name", sorted(HOSTILE_EVENT_FILES))
def test_orjson_and_the_standard_library_decide_the_same(name, monkeypatch):
    text = HOSTILE_EVENT_FILES[name]
    fast = _decision(text)
    monkeypatch.setattr(records, "_orjson", None)
    assert _decision(text) == fast
