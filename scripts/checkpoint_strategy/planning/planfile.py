"""A plan file: the JSON `plan --format json` prints, read back (handoff --plan-file, export --plan-file,
the training callbacks' policy). One check for all of them: plan.schema.json, then the model."""

from __future__ import annotations

from typing import Any

from checkpoint_strategy.errors import UsageError, pydantic_message
from checkpoint_strategy.planning.models import PlanReport
from checkpoint_strategy.resources import load_schema


def report_from_data(data: Any, name: str) -> PlanReport:
    """The PlanReport in parsed JSON `data` from plan file `name`, checked against plan.schema.json first (a
    mismatch is one UsageError line naming where)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(load_schema("plan.schema.json"))
    try:  # JSON nested a few hundred levels parses, but the schema walk recurses deeper
        error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    except RecursionError:
        raise UsageError(
            f"plan file {name} is nested too deeply: expected the output of "
            "`checkpoint-strategy plan ... --format json`"
        ) from None
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "top level"
        message = " ".join(error.message.split())
        message = message if len(message) <= 120 else message[:117] + "..."
        raise UsageError(f"plan file {name} does not match plan.schema.json at {where}: {message}")
    try:
        return PlanReport(**data)
    except Exception as exc:  # pydantic.ValidationError
        raise UsageError(pydantic_message(exc, f"plan file {name}")) from None
