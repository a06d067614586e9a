"""The policy a callback applies: from the plan's JSON/YAML file, a PlanReport, or a dict.

Accepted forms of ``policy``:
  * a path to the JSON `plan --format json` prints (a PlanReport, checked against plan.schema.json);
  * a path to YAML/JSON holding a ``checkpoint_policy:`` mapping (what `plan --format yaml` prints,
    the spec's policy templates; ``keep_milestone: [1000, 5000, ...]`` continues by doubling);
  * a ``PlanReport`` object, a ``CheckpointPolicy`` object (planning or checkpoints model);
  * a dict with the checkpoint_policy keys, or ``{"checkpoint_policy": {...}}``, or a plan dict.

Bad input raises ``UsageError`` with one line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import BaseModel

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats.models import CheckpointPolicy
from checkpoint_strategy.integrations.handoff import load_plan_file
from checkpoint_strategy.planning.models import PlanReport

TRIGGERS = ("loss_spike_detected", "gradient_norm_exceeded")


@dataclass(frozen=True)
class Settings:
    """What the callbacks need from a policy (steps, never minutes)."""

    frequency_steps: int
    keep_last: Optional[int]
    milestones: tuple[int, ...] = ()
    validate_on_save: bool = True
    async_save: bool = False
    emergency_save_on: tuple[str, ...] = ()
    save_optimizer: Optional[bool] = None
    delete_invalid: bool = (
        False  # the keep rules also delete an invalid checkpoint older than a newer valid one
    )
    report: Any = field(
        default=None, compare=False
    )  # the PlanReport when the policy came from a plan
    source: str = field(default="policy", compare=False)


def _from_mapping(data: dict, source: str, report=None) -> Settings:
    return _settings(CheckpointPolicy.from_data(dict(data), source), source, report)


def _settings(pol, source: str, report=None) -> Settings:
    """Settings of a formats.models.CheckpointPolicy (keep_milestone's "..." already continued)."""
    if pol.frequency is None:
        raise UsageError(
            f"{source}: checkpoint_policy has no frequency; expected every_N_steps, e.g. every_500_steps"
        )
    n, unit = pol.frequency[len("every_") :].rsplit("_", 1)
    if unit != "steps" or int(n) < 1:
        raise UsageError(
            f"{source}: frequency {pol.frequency} cannot drive a training callback; "
            "expected every_N_steps with N >= 1"
        )
    bad = [t for t in pol.emergency_save_on if t not in TRIGGERS]
    if bad:
        raise UsageError(
            f"{source}: emergency_save_on has {bad[0]!r}; expected any of {', '.join(TRIGGERS)}"
        )
    milestones = sorted(set(pol.keep_milestone))
    return Settings(
        frequency_steps=int(n),
        keep_last=pol.keep_last,
        milestones=tuple(milestones),
        validate_on_save=pol.validate_on_save is not False,
        async_save=bool(pol.async_save),
        emergency_save_on=tuple(dict.fromkeys(pol.emergency_save_on)),
        save_optimizer=pol.save_optimizer,
        delete_invalid=bool(pol.delete_invalid),
        report=report,
        source=source,
    )


def _from_plan_dict(data: dict, source: str) -> Settings:
    report = load_plan_file(json.dumps(data), source)
    return _from_mapping(report.policy.model_dump(mode="json"), source, report)


def _looks_like_plan(data: dict) -> bool:
    return "policy" in data and "frequency_steps" in data


def resolve(policy: Any) -> Settings:
    """Settings from any accepted form (see the module docstring)."""
    if isinstance(policy, Settings):
        return policy
    if isinstance(policy, BaseModel):
        if isinstance(policy, PlanReport):
            return _from_mapping(policy.policy.model_dump(mode="json"), "plan", policy)
        data = policy.model_dump(mode="json")
        if _looks_like_plan(data):
            return _from_plan_dict(data, "plan")
        return _from_mapping(data, type(policy).__name__)
    if isinstance(policy, dict):
        if _looks_like_plan(policy):
            return _from_plan_dict(policy, "plan dict")
        inner = policy.get("checkpoint_policy", policy)
        if not isinstance(inner, dict):
            raise UsageError(
                "policy dict: checkpoint_policy is not a mapping; expected frequency, keep_last, ..."
            )
        return _from_mapping(inner, "policy dict")
    if isinstance(policy, (str, os.PathLike)):
        return _from_file(os.fspath(policy))
    raise UsageError(
        f"policy: got {type(policy).__name__}; expected a plan JSON/YAML file path, a PlanReport "
        "or a dict of checkpoint_policy keys"
    )


def _from_file(path: str) -> Settings:
    """A policy file of any kind `CheckpointPolicy.from_file` reads; a plan's JSON is also checked against
    plan.schema.json and kept (`Settings.report`: the adaptive interval reads it)."""
    pol = CheckpointPolicy.from_file(path, "policy file")
    if isinstance(pol.document, dict) and _looks_like_plan(pol.document):
        return _from_plan_dict(pol.document, f"plan file {path}")
    return _settings(pol, f"policy file {path}")
