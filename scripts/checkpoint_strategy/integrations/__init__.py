"""Integrations with sibling skills: session-handoff, release-readiness, training-stability-monitor.

Python API for a training loop::

    from checkpoint_strategy.integrations import decide
    d = decide({"event": "LOSS_SPIKE", "step": 1200, "magnitude": 3.1}, policy)
    if d.should_save:
        ...
"""

from checkpoint_strategy.integrations.events import decide, decide_all, parse_events
from checkpoint_strategy.integrations.models import Decision, EmergencyDecision, StabilityEvent

__all__ = [
    "Decision",
    "EmergencyDecision",
    "StabilityEvent",
    "decide",
    "decide_all",
    "parse_events",
]
