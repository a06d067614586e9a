"""training-stability-monitor events -> emergency-save decisions. Pure functions.

Input: one JSON event, a JSON list (or {"events": [...]}), JSON lines, or the monitor's text
report (`=== Training Stability Report ===` with `[PASS|WARN|FAIL] <check>` lines).
The decision follows the policy's `emergency_save_on` triggers and the spec's recovery
playbook: save the pre-rollback state on a spike, wait 50-100 steps before acting unless the
spike is confirmed, never save a NaN state.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Optional, Union

from checkpoint_strategy.errors import UsageError, pydantic_message
from checkpoint_strategy.integrations.models import (
    EVENT_TYPES,
    Decision,
    EmergencyDecision,
    StabilityEvent,
)
from checkpoint_strategy.planning.models import CheckpointPolicy
from checkpoint_strategy.recovery.records import loads_line
from checkpoint_strategy.recovery.settings import DEFAULTS as RECOVERY_DEFAULTS
from checkpoint_strategy.retention.safety import post_onset_note
from checkpoint_strategy.storage import ReadError, loads_yaml

TRIGGERS = ("loss_spike_detected", "gradient_norm_exceeded")
EVENT_TRIGGER = {
    "LOSS_SPIKE": "loss_spike_detected",
    "GRADIENT_NORM_EXCEEDED": "gradient_norm_exceeded",
}
# The spec's playbook: "wait 50-100 steps to see if it self-recovers". A spike still reported
# this many steps after the first one has not recovered: it is confirmed. The number is recover's
# minimum wait (recovery.settings.RecoveryOptions.min_wait_steps), so both commands agree.
SPIKE_WAIT_STEPS = RECOVERY_DEFAULTS.min_wait_steps  # 50
MAX_LISTED = 1000  # per-event decisions listed in the answer; the rest are counted (events_total)
CONFIRMING_SEVERITIES = ("error", "critical")
SEVERITIES = ("info", "warning", "error", "critical")
REPORT_HEADER = "=== Training Stability Report ==="
_HEADER = re.compile(re.escape(REPORT_HEADER), re.IGNORECASE)
_CHECK_LINE = re.compile(r"^\s*\[(PASS|WARN|FAIL)\]\s*(.+?)\s*$", re.IGNORECASE)
# Numbers are read as written: a sign and an exponent belong to the number ("step -56" is a
# negative step, refused; "1e308x" is 1e308, not 308).
_NUMBER = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
_STEP = re.compile(r"\bstep[s]?\s*[:=#]?\s*" + _NUMBER, re.IGNORECASE)
_MAGNITUDE = re.compile(_NUMBER + r"\s*x\b", re.IGNORECASE)
_REPORT_CHECKS = (  # (substring of the check name, event)
    ("loss spike", "LOSS_SPIKE"),
    ("gradient norm", "GRADIENT_NORM_EXCEEDED"),
    ("plateau", "LOSS_PLATEAU"),
    ("nan", "NAN_LOSS"),
)

PolicyLike = Union[CheckpointPolicy, dict, Sequence[str], None]


# --------------------------------------------------------------------------- parsing


def parse_events(text: str, source: str = "input") -> tuple[list[StabilityEvent], list[str]]:
    """Parse events from any accepted form. Returns (events, notes); raises UsageError."""
    items, notes = event_stream(text, source)
    raw = list(items())
    return [
        event_from(item, f"{source} event {i + 1}" if len(raw) > 1 else source)
        for i, item in enumerate(raw)
    ], notes


def event_stream(text: str, source: str = "input") -> tuple[Callable[[], Iterator[Any]], list[str]]:
    """(a function returning a fresh iterator over the raw events, notes). JSON lines are parsed
    lazily, one line at a time, so a 2-million-line event file is never held as objects."""
    if text.startswith("\ufeff"):
        text = text[1:]
    first = re.search(r"[^\s\ufeff]", text)  # no stripped/lowered copies of a big input
    if first is None:
        raise UsageError(f"{source} is empty: expected JSON events or a training-stability report")
    stripped = text
    if _HEADER.search(text) or (
        text[first.start()] not in "[{"
        and any(_CHECK_LINE.match(line) for line in text.splitlines())
    ):
        events, notes = parse_report(text.strip())
        return (lambda: iter(events)), notes
    try:
        data = json.loads(stripped)
    except RecursionError:
        raise UsageError(f"{source} is JSON nested too deeply: expected stability events") from None
    except ValueError:
        line_error = _json_line_error(stripped, source)
        if line_error is not None:
            raise line_error from None
        return (lambda: _iter_json_lines(stripped, source)), []
    if isinstance(data, dict) and "event" not in data and isinstance(data.get("events"), list):
        data = data["events"]
    if not isinstance(data, list):
        data = [data]
    return (lambda: iter(data)), []


def _lines(text: str) -> Iterator[str]:
    """The lines of a text one at a time (no list of every line, no second copy of the text)."""
    pos, n = 0, len(text)
    while pos < n:
        j = text.find("\n", pos)
        if j == -1:
            yield text[pos:]
            return
        yield text[pos:j]
        pos = j + 1


def _iter_json_lines(text: str, source: str) -> Iterator[Any]:
    for n, line in enumerate(_lines(text), 1):
        if not line.strip():
            continue
        try:
            yield loads_line(line)
        except (ValueError, RecursionError) as exc:
            raise _line_error(exc, n, source) from None


def _json_line_error(text: str, source: str) -> Optional[UsageError]:
    """The first bad line, checked once up front so that bad input fails before any decision."""
    for n, line in enumerate(_lines(text), 1):
        if not line.strip():
            continue
        try:
            loads_line(line)
        except (ValueError, RecursionError) as exc:
            return _line_error(exc, n, source)
    return None


def _line_error(exc: Exception, n: int, source: str) -> UsageError:
    what = "line 1" if n == 1 else f"line {n}"
    msg = getattr(exc, "msg", None) or (
        "nested too deeply" if isinstance(exc, RecursionError) else " ".join(str(exc).split())[:80]
    )
    return UsageError(
        f"{source} {what} is not valid JSON ({msg}): expected one JSON event, "
        "a JSON list, JSON lines or a training-stability report"
    )


def event_from(item: Any, where: str = "event") -> StabilityEvent:
    """One event from a mapping (or a StabilityEvent); raises UsageError naming what is wrong."""
    if isinstance(item, StabilityEvent):
        return item
    if not isinstance(item, dict):
        raise UsageError(
            f"{where} is a JSON {_json_kind(item)}: expected an object such as "
            '{"event": "LOSS_SPIKE", "step": 1200, "magnitude": 3.1}'
        )
    data = dict(item)
    kind = data.get("event")
    if kind is None:
        raise UsageError(f'{where} has no "event" field: expected one of {", ".join(EVENT_TYPES)}')
    if isinstance(kind, str) and kind.strip().upper() in EVENT_TYPES:
        data["event"] = kind.strip().upper()
    else:
        raise UsageError(
            f"{where}: unknown event type {_short(kind)}; expected one of {', '.join(EVENT_TYPES)}"
        )
    sev = data.get("severity")
    if isinstance(sev, str):
        if sev.strip().lower() not in SEVERITIES:
            raise UsageError(
                f"{where}: unknown severity {_short(sev)}; expected one of {', '.join(SEVERITIES)} "
                "(any case)"
            )
        data["severity"] = sev.strip().lower()
    try:
        return StabilityEvent(**{str(k): v for k, v in data.items()})
    except Exception as exc:  # pydantic.ValidationError
        raise UsageError(pydantic_message(exc, where)) from None


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _short(value: Any) -> str:
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (ValueError, RecursionError):
        text = f"a JSON {_json_kind(value)}"
    return text if len(text) <= 40 else text[:37] + "..."


def parse_report(text: str) -> tuple[list[StabilityEvent], list[str]]:
    """The monitor's text report: WARN/FAIL check lines become events; others become notes."""
    events: list[StabilityEvent] = []
    notes: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _CHECK_LINE.match(line)
        if not m:
            continue
        verdict, name = m.group(1).upper(), m.group(2)
        if verdict == "PASS":
            continue
        kind = next((ev for key, ev in _REPORT_CHECKS if key in name.lower()), None)
        if kind is None:
            if verdict == "FAIL":
                notes.append(
                    f"[FAIL] {name}: WARNING - a failing check this tool does not know; it is not an "
                    "emergency-save trigger, but look at it before you continue training"
                )
            else:
                notes.append(f"[{verdict}] {name}: not an emergency-save trigger (ignored)")
            continue
        detail = [name]  # the check line and the detail lines under it, up to the next check
        for follow in lines[i + 1 :]:
            if _CHECK_LINE.match(follow) or not follow.strip() or not follow[:1].isspace():
                break
            detail.append(follow)
        blob = " ".join(detail)
        step = _STEP.search(blob)
        magnitude = _MAGNITUDE.search(blob)
        events.append(
            StabilityEvent(
                event=kind,
                step=_report_step(step.group(1), i + 1) if step else None,
                magnitude=_report_number(magnitude.group(1), i + 1, "magnitude")
                if magnitude
                else None,
                severity="critical" if verdict == "FAIL" else "warning",
            )
        )
    if not events and not notes and not any(_CHECK_LINE.match(line) for line in lines):
        raise UsageError("the training-stability report has no [PASS|WARN|FAIL] check lines")
    return events, notes


# --------------------------------------------------------------------------- policy


def policy_triggers(policy: PolicyLike) -> list[str]:
    """emergency_save_on of a policy (a CheckpointPolicy, a policy mapping, a plan or handoff
    document with a `policy`, `{checkpoint_policy: ...}`, or a list of triggers).
    None means the auto preset's triggers: both."""
    if policy is None:
        return list(TRIGGERS)
    if isinstance(policy, CheckpointPolicy):
        return list(policy.emergency_save_on)
    if isinstance(policy, dict):
        inner = policy.get("checkpoint_policy", policy.get("policy", policy))
        if not isinstance(inner, dict):
            raise UsageError("policy: expected a checkpoint_policy mapping")
        raw = inner.get("emergency_save_on", [])
        if raw is None:
            raw = []
    elif isinstance(policy, (list, tuple)):
        raw = list(policy)
    else:
        raise UsageError("policy: expected a checkpoint_policy mapping or a list of triggers")
    if not isinstance(raw, list) or any(t not in TRIGGERS for t in raw):
        raise UsageError(
            f"policy emergency_save_on: expected a list of {', '.join(TRIGGERS)}, got {_short(raw)}"
        )
    return list(dict.fromkeys(raw))


def _report_number(text: str, line: int, what: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UsageError(
            f"training-stability report line {line}: {what} {text} is not a finite number"
        )
    return value


def _report_step(text: str, line: int) -> int:
    """A step as written: 1200, 1.2e3; a negative or fractional step is bad input (exit 2)."""
    value: Optional[int]
    try:
        value = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            f = math.nan
        value = int(f) if math.isfinite(f) and f.is_integer() else None
    if value is None or value < 0:
        raise UsageError(
            f"training-stability report line {line}: step {text} is not a whole number >= 0"
        )
    return value


def load_policy(text: str, source: str) -> list[str]:
    """Triggers from a policy file: plan YAML/JSON, checkpoint-strategy.json, or a bare mapping."""
    try:
        data = loads_yaml(text, source)
    except ReadError as exc:
        raise UsageError(
            f"{source} is {exc.reason}: expected the plan's checkpoint_policy mapping "
            "(YAML or JSON)"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(
            f"{source}: expected a mapping with checkpoint_policy (or policy), "
            f"got a {_json_kind(data)}"
        )
    return policy_triggers(data)


# --------------------------------------------------------------------------- decisions


def recover_command(log: Optional[str] = None, checkpoints: Optional[str] = None) -> str:
    """Runnable in any later shell (the launcher's path, as handoff writes it), not a bare name on PATH."""
    from checkpoint_strategy.formats.runfacts import launcher

    return (
        f"{launcher()} recover {shlex.quote(log) if log else 'TRAIN_LOG'} "
        f"--checkpoints {shlex.quote(checkpoints) if checkpoints else 'CHECKPOINT_DIR'}"
    )


def verify_resume_command(log: Optional[str] = None, checkpoints: Optional[str] = None) -> str:
    """verify-resume needs the step resumed from (the event does not know it: RESUME_STEP); with the checkpoint
    folder it also compares the optimizer's step counter with the training step (a reset optimizer)."""
    from checkpoint_strategy.formats.runfacts import launcher

    ck = f" --checkpoints {shlex.quote(checkpoints)}" if checkpoints else ""
    return f"{launcher()} verify-resume {shlex.quote(log) if log else 'TRAIN_LOG'} --resume-step RESUME_STEP{ck}"


def _at(event: StabilityEvent) -> str:
    return f"step {event.step}" if event.step is not None else "an unknown step"


def _size(event: StabilityEvent) -> str:
    parts = []
    if event.magnitude is not None and math.isfinite(event.magnitude):
        parts.append(f"{event.magnitude:g}x baseline")
    if event.value is not None and math.isfinite(event.value):
        parts.append(f"value {event.value:g}")
    if event.threshold is not None and math.isfinite(event.threshold):
        parts.append(f"threshold {event.threshold:g}")
    return f" ({', '.join(parts)})" if parts else ""


def decide(
    event: Union[StabilityEvent, dict],
    policy: PolicyLike = None,
    *,
    confirmed: bool = False,
    log: Optional[str] = None,
    checkpoints: Optional[str] = None,
) -> Decision:
    """The decision for one event, for a training loop::

        d = decide({"event": "LOSS_SPIKE", "step": step, "magnitude": 3.2}, policy)
        if d.should_save: save_checkpoint(tag=f"emergency-{step}")   # outside keep_last

    `confirmed` marks a spike already known to persist (decide_all sets it for spikes still
    reported SPIKE_WAIT_STEPS after the first). Raises UsageError on a bad event or policy.
    """
    ev = event_from(event)
    return _decide(ev, policy_triggers(policy), confirmed, _Commands(log, checkpoints))


class _Commands:
    """The next commands of a decision, each written once (the launcher's path is looked up on disk)."""

    def __init__(self, log: Optional[str], checkpoints: Optional[str]) -> None:
        self.log, self.checkpoints = log, checkpoints
        self._recover: Optional[str] = None
        self._verify: Optional[str] = None

    @property
    def recover(self) -> str:
        if self._recover is None:
            self._recover = recover_command(self.log, self.checkpoints)
        return self._recover

    @property
    def verify(self) -> str:
        if self._verify is None:
            self._verify = verify_resume_command(self.log, self.checkpoints)
        return self._verify


def _decide(
    ev: StabilityEvent, triggers: list[str], confirmed: bool, commands: _Commands
) -> Decision:
    kind = ev.event
    if kind == "NAN_LOSS":
        return Decision(
            event=kind,
            step=ev.step,
            trigger=None,
            decision="none",
            confirmed_spike=True,
            reason=f"loss is NaN at {_at(ev)}: the weights or optimizer state are likely already "
            "non-finite, so an emergency save would only store them (and could rotate a good "
            "checkpoint out of keep_last); roll back to the last stable checkpoint instead",
            next_command=commands.recover,
        )
    if kind == "LOSS_PLATEAU":
        return Decision(
            event=kind,
            step=ev.step,
            trigger=None,
            decision="none",
            confirmed_spike=False,
            reason=f"loss plateau at {_at(ev)}{_size(ev)} is not an emergency-save trigger; if it "
            "began right after a resume, check that the optimizer state was restored",
            next_command=commands.verify,
        )
    nonfinite = _nonfinite(ev)
    if nonfinite is not None:
        what = "loss" if kind == "LOSS_SPIKE" else "gradient norm"
        return Decision(
            event=kind,
            step=ev.step,
            trigger=EVENT_TRIGGER[kind],
            decision="none",
            confirmed_spike=kind == "LOSS_SPIKE",
            reason=f"{what} is {nonfinite} at {_at(ev)}: a non-finite value means the weights or "
            "optimizer state may already be non-finite, so an emergency save would only store them "
            "(and could rotate a good checkpoint out of keep_last); never save it - roll back to "
            "the last stable checkpoint instead (recover's NaN/inf rule)",
            next_command=commands.recover if kind == "LOSS_SPIKE" else None,
        )
    enabled = EVENT_TRIGGER[kind] in triggers
    if kind == "GRADIENT_NORM_EXCEEDED":
        return _grad_norm_decision(ev, enabled)
    return _loss_spike_decision(ev, enabled, confirmed, commands.recover)


def _nonfinite(ev: StabilityEvent) -> Optional[str]:
    """How a non-finite observed value shows: `value` itself, or a LOSS_SPIKE's `magnitude` (value / baseline:
    NaN or inf only when the loss is, as recover's detector reads a NaN/inf loss); None when finite."""
    if ev.value is not None and not math.isfinite(ev.value):
        return str(ev.value)
    if ev.event == "LOSS_SPIKE" and ev.magnitude is not None and not math.isfinite(ev.magnitude):
        return f"{ev.magnitude} x its baseline (magnitude)"
    return None


def _grad_norm_decision(ev: StabilityEvent, enabled: bool) -> Decision:
    """GRADIENT_NORM_EXCEEDED: an emergency save when it really exceeds, is not info and the policy has the trigger."""
    kind, trigger = ev.event, EVENT_TRIGGER[ev.event]
    below = (
        ev.value is not None
        and ev.threshold is not None
        and math.isfinite(ev.value)
        and math.isfinite(ev.threshold)
        and ev.value <= ev.threshold
    )
    if below:
        return Decision(
            event=kind,
            step=ev.step,
            trigger=trigger,
            decision="none",
            confirmed_spike=False,
            reason=f"gradient norm at {_at(ev)}{_size(ev)} does not exceed its threshold",
            next_command=None,
        )
    if ev.severity == "info":
        return Decision(
            event=kind,
            step=ev.step,
            trigger=trigger,
            decision="none",
            confirmed_spike=False,
            reason=f"gradient norm event at {_at(ev)} has severity info: no action",
            next_command=None,
        )
    if not enabled:
        return Decision(
            event=kind,
            step=ev.step,
            trigger=trigger,
            decision="none",
            confirmed_spike=False,
            reason=f"gradient norm exceeded at {_at(ev)}{_size(ev)}, but the policy's "
            "emergency_save_on does not include gradient_norm_exceeded",
            next_command=None,
        )
    return Decision(
        event=kind,
        step=ev.step,
        trigger=trigger,
        decision="emergency_save",
        confirmed_spike=False,
        reason=f"gradient norm exceeded at {_at(ev)}{_size(ev)}, trigger gradient_norm_exceeded: save now, "
        "outside the keep_last rotation, so the state before any loss spike is kept; "
        "if it keeps happening, clip tighter (0.5 instead of 1.0) or lower the LR",
        next_command=None,
    )


_CONFIRMED_THEN = (
    "the spike is confirmed (persistent or critical): roll back to the last stable checkpoint "
    "(loss within 10% of the pre-spike level), halve the LR for 500 steps, skip the batch, clip at 0.5"
)


def _loss_spike_decision(
    ev: StabilityEvent, enabled: bool, confirmed: bool, recover: str
) -> Decision:
    """LOSS_SPIKE: an emergency save when the policy has the trigger; confirmed (persistent or error/critical)
    spikes are rolled back, the others watched through the wait window."""
    kind, trigger = ev.event, EVENT_TRIGGER[ev.event]
    is_confirmed = confirmed or ev.severity in CONFIRMING_SEVERITIES
    if ev.severity == "info" and not confirmed:
        return Decision(
            event=kind,
            step=ev.step,
            trigger=trigger,
            decision="none",
            confirmed_spike=False,
            reason=f"loss spike at {_at(ev)}{_size(ev)} has severity info: no action",
            next_command=None,
        )
    then = (
        _CONFIRMED_THEN
        if is_confirmed
        else f"keep training {SPIKE_WAIT_STEPS}-{RECOVERY_DEFAULTS.wait_steps} steps: most spikes recover on their own; run the recovery "
        "adviser if the loss has not come back"
    )
    if not enabled:
        return Decision(
            event=kind,
            step=ev.step,
            trigger=trigger,
            decision="none",
            confirmed_spike=is_confirmed,
            reason=f"loss spike at {_at(ev)}{_size(ev)}, but the policy's emergency_save_on does not "
            f"include loss_spike_detected; {then}",
            next_command=recover if is_confirmed else None,
        )
    return Decision(
        event=kind,
        step=ev.step,
        trigger=trigger,
        decision="emergency_save",
        confirmed_spike=is_confirmed,
        reason=f"loss spike at {_at(ev)}{_size(ev)}, trigger loss_spike_detected: save now, outside the "
        f"keep_last rotation, so the pre-rollback state is kept; {then}",
        next_command=recover if is_confirmed else None,
    )


def decide_all(
    events: Union[Iterable[Union[StabilityEvent, dict]], Callable[[], Iterator[Any]]],
    policy: PolicyLike = None,
    *,
    log: Optional[str] = None,
    checkpoints: Optional[str] = None,
    notes: Sequence[str] = (),
    log_report=None,
) -> EmergencyDecision:
    """One decision over a batch of events (what `on-event` prints). Memory stays bounded: events
    are decided one at a time and at most MAX_LISTED per-event decisions are listed.

    log_report: recover's RecoveryReport on the training log, when there is one: the same rules then
    confirm a spike (not back within the wait window, NaN, collapse) or say it came back."""
    if callable(events):
        fresh = events
    else:
        events = events if isinstance(events, (list, tuple)) else list(events)
        fresh = lambda: iter(events)  # noqa: E731
    triggers = policy_triggers(policy)
    first_spike = _first_spike(fresh())
    notes = list(notes)
    confirmed_by_log = False
    if log_report is not None:
        unresolved = log_report.status in ("rollback", "no_clean_checkpoint")
        confirmed_by_log = unresolved
        notes.append(
            f"the training log, by recover's rules: {log_report.status} - {log_report.summary}"
        )
        notes.extend(n for n in [_post_onset_note(log_report)] if n)
    agg = _Aggregate(triggers, log, checkpoints)
    for i, e in enumerate(fresh()):
        agg.add(event_from(e, f"event {i + 1}"), first_spike, confirmed_by_log)
    return agg.result(notes)


def _first_spike(items: Iterable[Any]) -> Optional[int]:
    """The lowest step of a LOSS_SPIKE. A plain event ({"event": "LOSS_SPIKE", "step": 120, ...}) is read
    directly; any other is checked by event_from. A bad event ends this pass: the deciding pass meets it
    (or an earlier one) in order and raises the same error."""
    first = None
    for e in items:
        if type(e) is dict and type(e.get("step")) is int and isinstance(e.get("event"), str):
            if e["event"].strip().upper() != "LOSS_SPIKE" or e["step"] < 0:
                continue  # not a spike, or refused (step >= 0) by the deciding pass
            step = e["step"]
        else:
            try:
                ev = event_from(e)
            except UsageError:
                return first
            if ev.event != "LOSS_SPIKE" or ev.step is None:
                continue
            step = ev.step
        first = step if first is None else min(first, step)
    return first


def _post_onset_note(log_report) -> Optional[str]:
    return post_onset_note(log_report)


def _nothing_decided(warnings: list[str], common: dict) -> EmergencyDecision:
    """No event decided: nothing to do (noting failing checks this tool does not know)."""
    reason = "no warning or failing stability event: nothing to do"
    if warnings:
        reason = f"no emergency-save trigger, but {len(warnings)} failing check(s) this tool does not know"
    return EmergencyDecision(
        decision="none", next_command=None, save_at_step=None, reason=reason, decisions=[], **common
    )


class _Aggregate:
    """What decide_all needs from every decision, without keeping them all."""

    def __init__(self, triggers: list[str], log: Optional[str], checkpoints: Optional[str]) -> None:
        self.triggers, self.log, self.checkpoints = triggers, log, checkpoints
        self.commands = _Commands(log, checkpoints)
        self.total = 0
        self.listed: list[Decision] = []
        self.nan: Optional[Decision] = None
        self.saving = 0
        self.save_steps: list[int] = []
        self.first_confirmed_save: Optional[Decision] = None
        self.earliest_save: Optional[Decision] = None
        self.earliest_event: Optional[StabilityEvent] = None
        self.persisted = False
        self.first_next: Optional[Decision] = None
        self.first: Optional[Decision] = None

    def add(
        self, ev: StabilityEvent, first_spike: Optional[int], confirmed_by_log: bool = False
    ) -> None:
        persisted = (
            ev.event == "LOSS_SPIKE"
            and first_spike is not None
            and ev.step is not None
            and ev.step - first_spike >= SPIKE_WAIT_STEPS
        ) or (ev.event == "LOSS_SPIKE" and confirmed_by_log)
        d = _decide(ev, self.triggers, persisted, self.commands)
        self.total += 1
        self.first = self.first or d
        if len(self.listed) < MAX_LISTED:
            self.listed.append(d)
        if (
            d.event == "NAN_LOSS" or (d.event == "LOSS_SPIKE" and "non-finite" in d.reason)
        ) and self.nan is None:
            self.nan = d
        if d.event == "LOSS_SPIKE" and d.confirmed_spike:
            self.persisted = True
        if d.should_save:
            self.saving += 1
            if d.step is not None:
                self.save_steps = [min(self.save_steps + [d.step])]
            if d.confirmed_spike and self.first_confirmed_save is None:
                self.first_confirmed_save = d
            key = (d.step is None, d.step or 0)
            if self.earliest_save is None or key < (
                self.earliest_save.step is None,
                self.earliest_save.step or 0,
            ):
                self.earliest_save, self.earliest_event = d, ev
        if d.next_command and self.first_next is None:
            self.first_next = d

    def _save_reason(self) -> str:
        """The reason of the save, told from the event it saves at (save_at_step, the first triggering one);
        when a later spike of the run is what confirms the episode, that is said too."""
        lead, ev, confirmed = self.earliest_save, self.earliest_event, self.first_confirmed_save
        assert lead is not None and ev is not None, "a saving decision is the earliest save"
        if confirmed is None or lead.confirmed_spike:
            return lead.reason
        at = f"step {confirmed.step}" if confirmed.step is not None else "an unknown step"
        if lead.event == "LOSS_SPIKE":  # the same episode: decided as confirmed
            return f"{_decide(ev, self.triggers, True, self.commands).reason} (confirmed by the spike at {at})"
        return f"{lead.reason}; then a loss spike at {at}: {_CONFIRMED_THEN}"

    def _listed_decisions(self) -> list:
        """The listed decisions; in a confirmed episode every spike leads to the adviser."""
        if not self.persisted:
            return self.listed
        return [
            d.model_copy(update={"next_command": self.commands.recover})
            if d.event == "LOSS_SPIKE" and d.next_command is None
            else d
            for d in self.listed
        ]

    def result(self, notes: Sequence[str]) -> EmergencyDecision:
        notes = list(notes)
        warnings = [n for n in notes if n.startswith("[FAIL]")]
        common = dict(
            policy_triggers=self.triggers, notes=notes, warnings=warnings, events_total=self.total
        )
        recover = self.commands.recover
        listed = self._listed_decisions()
        if self.total > len(listed):
            notes.append(
                f"{self.total - len(listed)} more events were decided but are not listed "
                f"(the first {len(listed)} are)"
            )
        if self.total == 0:
            return _nothing_decided(warnings, common)
        next_command = (
            recover
            if (self.persisted or self.nan)
            else (self.first_next.next_command if self.first_next else None)
        )
        if self.nan is not None:  # the state is non-finite now: never save it
            return EmergencyDecision(
                decision="none",
                next_command=recover,
                save_at_step=None,
                reason=self.nan.reason,
                decisions=listed,
                **common,
            )
        if self.saving:
            reason = self._save_reason()
            if self.saving > 1:
                reason += f" ({self.saving} events ask for an emergency save; one save is enough)"
            return EmergencyDecision(
                decision="emergency_save",
                next_command=next_command,
                save_at_step=self.save_steps[0] if self.save_steps else None,
                reason=reason,
                decisions=listed,
                **common,
            )
        lead = self.first_next or self.first
        assert lead is not None, "total > 0: there is a first decision"
        return EmergencyDecision(
            decision="none",
            next_command=next_command,
            save_at_step=None,
            reason=lead.reason,
            decisions=listed,
            **common,
        )
