"""Plan options: what each field is called on the command line and expects (`FIELDS`), the namespace checked against
schemas/arguments.schema.json and built into PlanArguments (the argparse side: `cli/planoptions.py`).
Shared by every command that takes a plan (plan, simulate, tradeoffs, handoff)."""

from __future__ import annotations

from typing import Any, Optional

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning.models import PlanArguments
from checkpoint_strategy.resources import load_schema
from checkpoint_strategy.vocabulary import BOUNDS, MILESTONES_EXPECTED

B = BOUNDS

# schema property -> (how the user spells it, what is expected); the ranges come from the one table
FIELDS: dict[str, tuple[str, str]] = {
    "total_steps": ("TOTAL_STEPS", B["steps"].expected().replace("steps", "optimizer steps", 1)),
    "duration_hours": (
        "--duration",
        "a run length such as 3w, 21d, 504h or 90min (weeks, days, hours, minutes)",
    ),
    "step_seconds": ("STEP_SECONDS", B["step_seconds"].expected()),
    "budget_gb": (
        "BUDGET_GB",
        "a storage budget in GB" + B["gb"].expected().removeprefix("a size in GB"),
    ),
    "model_size_gb": (
        "--model-size-gb",
        "the weights in GB" + B["gb"].expected().removeprefix("a size in GB"),
    ),
    "weights_dtype": ("--weights-dtype", "one of fp32, bf16, fp16"),
    "params": (
        "--params",
        f"a parameter count such as 7B, 350M or 1.3e9 (1 to {B['params'].hi:.0e})",
    ),
    "precision": ("--precision", "fp32, mixed or mixed-no-master"),
    "preset": ("--preset", "conservative, aggressive or auto"),
    "frequency": ("--frequency", B["steps"].expected() + " between saves"),
    "keep_last": ("--keep-last", B["keep"].expected() + " to keep"),
    "milestones": ("--milestones", MILESTONES_EXPECTED),
    "formats": ("--formats", "a comma-separated list of full_state_dict, sharded, safetensors"),
    "save_optimizer": ("--save-optimizer", "a flag"),
    "gpus": ("--gpus", B["gpus"].expected()),
    "gpu_mtbf_hours": (
        "--gpu-mtbf-hours",
        "hours between failures of one GPU" + B["hours"].expected()[5:],
    ),
    "mtbf_hours": (
        "--mtbf-hours",
        "the job's mean time between failures in hours" + B["hours"].expected()[5:],
    ),
    "checkpoint_write_seconds": (
        "--checkpoint-write-seconds",
        "seconds a save stalls training" + B["seconds"].expected()[7:],
    ),
    "write_gbps": ("--write-gbps", B["gbps"].expected()),
    "gpus_per_node": ("--gpus-per-node", B["gpus_per_node"].expected()),
    "node_write_gbps": (
        "--node-write-gbps",
        "one node's write rate in GB/s" + B["gbps"].expected()[25:],
    ),
    "storage_gbps": ("--storage-gbps", B["storage_gbps"].expected()),
    "min_interval_seconds": (
        "--min-interval-seconds",
        "the shortest time between saves in seconds" + B["seconds"].expected()[7:],
    ),
    "restart_seconds": (
        "--restart-seconds",
        "seconds to restart after a failure" + B["seconds"].expected()[7:],
    ),
    "async_save": ("--async", "a flag"),
    "max_loss_hours": (
        "--max-loss-hours",
        "hours of training you accept to lose" + B["hours"].expected()[5:],
    ),
    "local_tier": (
        "--local-tier",
        "GB,GBPS: node-local space in GB and write rate in GB/s per node, each > 0",
    ),
    "node_loss_fraction": (
        "--node-loss-fraction",
        "the share of failures that lose a node" + B["fraction"].expected()[10:],
    ),
    "format": ("--format", "text, markdown, json or yaml"),
}


# TOTAL_STEPS and --duration both given: they must agree within this share of the run
DURATION_TOLERANCE = 0.01


class RunLength(float):
    """TOTAL_STEPS given as a run length: its hours."""


def plan_arguments(ns: Any) -> PlanArguments:
    """Namespace -> one object, validated by schemas/arguments.schema.json, then the model."""
    data = {
        k: getattr(ns, k) for k in PlanArguments.model_fields if getattr(ns, k, None) is not None
    }
    data.update(run_numbers(ns))
    if data.get("format") not in (None, "text", "markdown", "json", "yaml"):
        data.pop("format")
    return validate_arguments(data)


def run_numbers(ns: Any) -> dict:
    """TOTAL_STEPS from --duration or a run length given as TOTAL_STEPS (the duration over the step time);
    both given: they must agree within DURATION_TOLERANCE."""
    steps, hours = getattr(ns, "total_steps", None), getattr(ns, "duration_hours", None)
    if isinstance(steps, RunLength):
        if hours is not None:
            raise UsageError(
                "argument --duration: give the run's length once, as TOTAL_STEPS or --duration"
            )
        steps, hours = None, float(steps)  # type: ignore[arg-type]  # a RunLength is a float
    if hours is None or getattr(ns, "step_seconds", None) is None:
        return {} if steps is None else {"total_steps": steps}
    return {"duration_hours": hours, "total_steps": _steps_for(hours, ns.step_seconds, steps)}


def _steps_for(hours: float, step_seconds: float, total_steps: int | None) -> int:
    steps = round(hours * 3600.0 / step_seconds)
    if hours * 3600.0 < step_seconds:
        raise UsageError(
            f"argument --duration: {hours:g} h is shorter than one step of {step_seconds:g} s"
        )
    if not BOUNDS["steps"].contains(steps):
        raise UsageError(
            f"argument --duration: {hours:g} h at {step_seconds:g} s a step is {steps:.3g} steps: "
            f"expected {B['steps'].expected()}"
        )
    if total_steps is not None and abs(total_steps - steps) > DURATION_TOLERANCE * steps:
        raise UsageError(
            f"argument --duration: {hours:g} h at {step_seconds:g} s a step is {steps} steps, but "
            f"TOTAL_STEPS is {total_steps}; give one of them, or both within "
            f"{DURATION_TOLERANCE:.0%} of each other"
        )
    return total_steps if total_steps is not None else steps


def validate_arguments(data: dict) -> PlanArguments:
    import jsonschema

    schema = load_schema("arguments.schema.json")
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        field = next((p for p in error.absolute_path if isinstance(p, str)), None)
        if field is None and error.validator == "required":
            field = next((f for f in FIELDS if f"'{f}'" in error.message), None)
        if field is None and error.validator == "additionalProperties":
            raise UsageError(f"unknown argument: {error.message}")
        flag, expected = FIELDS.get(field or "", (field or "arguments", "a valid value"))
        value = data.get(field, "missing") if field else "missing"
        raise UsageError(f"argument {flag}: expected {expected}, got {value!r}")
    if "checkpoint_write_seconds" in data and "write_gbps" in data:
        raise UsageError(
            "argument --checkpoint-write-seconds: give the save cost once, either "
            "--checkpoint-write-seconds S or --write-gbps G, not both"
        )
    return _construct(data)


def _construct(data: dict) -> PlanArguments:
    """PlanArguments from data the JSON schema (generated from the model) has just accepted: built
    without validating a second time, numbers made floats where the model says float."""
    floats = {
        name
        for name, f in PlanArguments.model_fields.items()
        if f.annotation in (float, Optional[float])
    }
    clean: dict[str, Any] = {
        k: float(v) if k in floats and isinstance(v, int) and not isinstance(v, bool) else v
        for k, v in data.items()
    }
    if any(
        isinstance(v, dict) for v in clean.values()
    ):  # a nested model (--local-tier): built by pydantic
        return PlanArguments.model_validate(clean)
    return PlanArguments.model_construct(**clean)
