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

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from checkpoint_strategy.errors import UsageError, pydantic_message

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
    delete_invalid: bool = False        # the keep rules also delete an invalid checkpoint older than a newer valid one
    report: Any = field(default=None, compare=False)   # the PlanReport when the policy came from a plan
    source: str = field(default="policy", compare=False)


def _from_mapping(data: dict, source: str, report=None) -> Settings:
    from pydantic import ValidationError

    from checkpoint_strategy.checkpoints.models import CheckpointPolicy

    data = dict(data)
    ms = data.get("keep_milestone")
    cont = False
    if isinstance(ms, list) and ms and ms[-1] in ("...", Ellipsis, None):
        data["keep_milestone"] = [m for m in ms[:-1]]
        cont = True
    try:
        pol = CheckpointPolicy.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"{source}: " + pydantic_message(exc, "checkpoint_policy")) from None
    if pol.frequency is None:
        raise UsageError(f"{source}: checkpoint_policy has no frequency; expected every_N_steps, e.g. every_500_steps")
    n, unit = pol.frequency[len("every_"):].rsplit("_", 1)
    if unit != "steps" or int(n) < 1:
        raise UsageError(f"{source}: frequency {pol.frequency} cannot drive a training callback; "
                         "expected every_N_steps with N >= 1")
    bad = [t for t in pol.emergency_save_on if t not in TRIGGERS]
    if bad:
        raise UsageError(f"{source}: emergency_save_on has {bad[0]!r}; expected any of {', '.join(TRIGGERS)}")
    milestones = sorted(set(pol.keep_milestone))
    if cont and milestones:
        milestones += [milestones[-1] * 2 ** k for k in range(1, 21)]
    return Settings(frequency_steps=int(n), keep_last=pol.keep_last, milestones=tuple(milestones),
                    validate_on_save=pol.validate_on_save is not False, async_save=bool(pol.async_save),
                    emergency_save_on=tuple(dict.fromkeys(pol.emergency_save_on)),
                    save_optimizer=pol.save_optimizer, delete_invalid=bool(pol.delete_invalid), report=report,
                    source=source)


def _from_plan_dict(data: dict, source: str) -> Settings:
    import json

    from checkpoint_strategy.integrations.handoff import load_plan_file

    report = load_plan_file(json.dumps(data), source)
    return _from_mapping(report.policy.model_dump(mode="json"), source, report)


def _looks_like_plan(data: dict) -> bool:
    return "policy" in data and "frequency_steps" in data


def resolve(policy: Any) -> Settings:
    """Settings from any accepted form (see the module docstring)."""
    from pydantic import BaseModel

    if isinstance(policy, Settings):
        return policy
    if isinstance(policy, BaseModel):
        from checkpoint_strategy.planning.models import PlanReport

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
            raise UsageError("policy dict: checkpoint_policy is not a mapping; expected frequency, keep_last, ...")
        return _from_mapping(inner, "policy dict")
    if isinstance(policy, (str, os.PathLike)):
        return _from_file(os.fspath(policy))
    raise UsageError(f"policy: got {type(policy).__name__}; expected a plan JSON/YAML file path, a PlanReport "
                     "or a dict of checkpoint_policy keys")


def _from_file(path: str) -> Settings:
    import yaml

    from checkpoint_strategy.storage import loads_json, read_bytes

    raw = read_bytes(path, "policy file")
    text = raw.decode("utf-8", errors="replace").lstrip("\ufeff")
    if text.lstrip().startswith("{"):
        data = loads_json(raw, f"policy file {path}", expect=dict)
        if _looks_like_plan(data):
            return _from_plan_dict(data, f"plan file {path}")
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" at line {mark.line + 1}" if mark is not None else ""
            raise UsageError(f"policy file {path}: not valid YAML{line}; expected a checkpoint_policy: mapping "
                             "or the JSON of `plan --format json`") from None
        except RecursionError:
            raise UsageError(f"policy file {path}: nested too deeply; expected a checkpoint_policy: mapping") from None
    if not isinstance(data, dict):
        raise UsageError(f"policy file {path}: expected a checkpoint_policy: mapping (frequency, keep_last, ...) "
                         "or the JSON of `plan --format json`")
    inner = data.get("checkpoint_policy", data)
    if not isinstance(inner, dict):
        raise UsageError(f"policy file {path}: checkpoint_policy is not a mapping; expected frequency, keep_last, ...")
    return _from_mapping(inner, f"policy file {path}")
