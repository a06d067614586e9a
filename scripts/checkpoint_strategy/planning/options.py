"""Plan options on the command line: parse, validate against schemas/arguments.schema.json, build
PlanArguments. Shared by every command that takes a plan (plan, simulate, tradeoffs, handoff)."""

from __future__ import annotations

import argparse
import math
import re

from checkpoint_strategy.errors import UsageError, pydantic_message
from checkpoint_strategy.planning import sizing
from checkpoint_strategy.planning.models import MAX_STEPS, PlanArguments

# schema property -> (how the user spells it, what is expected)
FIELDS: dict[str, tuple[str, str]] = {
    "total_steps": ("TOTAL_STEPS", f"a whole number of optimizer steps from 1 to {MAX_STEPS:.0e}"),
    "step_seconds": ("STEP_SECONDS", "seconds per step, a number > 0 and at most 10^6"),
    "budget_gb": ("BUDGET_GB", "a storage budget in GB, a number > 0 and at most 10^9"),
    "model_size_gb": ("--model_size_gb", "the weights in GB, a number > 0 and at most 10^9"),
    "weights_dtype": ("--weights-dtype", "one of fp32, bf16, fp16"),
    "params": ("--params", "a parameter count such as 7B, 350M or 1.3e9 (at most 10^15)"),
    "precision": ("--precision", "fp32, mixed or mixed-no-master"),
    "preset": ("--preset", "conservative, aggressive or auto"),
    "frequency": ("--frequency", "a whole number of steps between saves, 1 to 10^12"),
    "keep_last": ("--keep-last", "a whole number of checkpoints to keep, 1 to 100000"),
    "milestones": ("--milestones", "seed, pow2, none or a comma-separated list of steps"),
    "formats": ("--formats", "a comma-separated list of full_state_dict, sharded, safetensors"),
    "save_optimizer": ("--save-optimizer", "a flag"),
    "gpus": ("--gpus", "a whole number of GPUs, 1 to 10^7"),
    "gpu_mtbf_hours": ("--gpu-mtbf-hours", "hours between failures of one GPU, > 0 and at most 10^9"),
    "mtbf_hours": ("--mtbf-hours", "the job's mean time between failures in hours, > 0 and at most 10^9"),
    "checkpoint_write_seconds": ("--checkpoint-write-seconds", "seconds a save stalls training, 0 to 10^9"),
    "write_gbps": ("--write-gbps", "write bandwidth in GB/s, > 0 and at most 10^6"),
    "gpus_per_node": ("--gpus-per-node", "a whole number of GPUs per node, 1 to 1024"),
    "node_write_gbps": ("--node-write-gbps", "one node's write rate in GB/s, > 0 and at most 10^6"),
    "storage_gbps": ("--storage-gbps", "the storage's aggregate write rate in GB/s, > 0 and at most 10^7"),
    "min_interval_seconds": ("--min-interval-seconds", "the shortest time between saves in seconds, 0 to 10^9"),
    "restart_seconds": ("--restart-seconds", "seconds to restart after a failure, 0 to 10^9"),
    "async_save": ("--async", "a flag"),
    "max_loss_hours": ("--max-loss-hours", "hours of training you accept to lose, > 0 and at most 10^9"),
    "local_tier": ("--local-tier", "GB,GBPS: node-local space in GB and write rate in GB/s per node, each > 0"),
    "node_loss_fraction": ("--node-loss-fraction", "the share of failures that lose a node, > 0 and at most 1"),
    "format": ("--format", "text, markdown, json or yaml"),
}


def finite_number(text: str) -> float:
    """argparse type: any finite number (underscores allowed), one clear message otherwise."""
    try:
        value = float(str(text).replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_number(text: str) -> float:
    value = finite_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def nonneg_number(text: str) -> float:
    value = finite_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def whole_number(text: str) -> int:
    value = finite_number(text)
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    if value > 10**15:
        raise argparse.ArgumentTypeError(f"expected a whole number at most 10^15, got {text!r}")
    return int(value)


def params_count(text: str) -> float:
    try:
        return sizing.parse_params(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def milestones_spec(text: str):
    t = str(text).strip().lower()
    if t in ("seed", "pow2", "none"):
        return t
    parts = [p for p in re.split(r"[,\s]+", t) if p]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected seed, pow2, none or a list like 1000,5000, got {text!r}")
    try:
        return sorted({whole_number(p) for p in parts})
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected seed, pow2, none or a comma-separated list of whole steps, got {text!r}") from None


def tier_spec(text: str) -> dict:
    """argparse type for --local-tier GB,GBPS."""
    parts = [p for p in re.split(r"[,\s]+", str(text).strip()) if p]
    try:
        gb, gbps = (positive_number(p) for p in parts) if len(parts) == 2 else (None, None)
    except argparse.ArgumentTypeError:
        gb = gbps = None
    if gb is None or gbps is None:
        raise argparse.ArgumentTypeError(f"expected GB,GBPS (node-local space and write rate per node, e.g. "
                                         f"2000,5), got {text!r}")
    return {"gb_per_node": gb, "gbps_per_node": gbps}


def formats_list(text: str) -> list[str]:
    allowed = ("full_state_dict", "sharded", "safetensors")
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    bad = [p for p in parts if p not in allowed]
    if not parts or bad:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(allowed)}, got {text!r}")
    return list(dict.fromkeys(parts))


def _opt(parser, *names, **kw):
    spellings = []
    for n in names:
        spellings.append(n)
        alt = n.replace("-", "_") if n.startswith("--") and "-" in n[2:] else n.replace("_", "-")
        if alt.startswith("--") and alt not in spellings and alt != n:
            spellings.append("--" + alt[2:])
    parser.add_argument(*spellings, **kw)


def add_plan_options(parser: argparse.ArgumentParser, positionals: bool = True) -> None:
    if positionals:
        parser.add_argument("total_steps", metavar="TOTAL_STEPS", type=whole_number, help="optimizer steps in the run")
        parser.add_argument("step_seconds", metavar="STEP_SECONDS", type=positive_number, help="wall seconds per step")
        parser.add_argument("budget_gb", metavar="BUDGET_GB", type=positive_number, help="storage budget, GB")
    size = parser.add_argument_group("model size")
    _opt(size, "--model_size_gb", dest="model_size_gb", type=positive_number, metavar="N",
         help="model weights in GB (fp32 unless --weights-dtype); checkpoint = 3x for fp32")
    _opt(size, "--weights-dtype", dest="weights_dtype", choices=["fp32", "bf16", "fp16"])
    _opt(size, "--params", dest="params", type=params_count, metavar="N", help="parameter count: 7B, 350M, 1.3e9")
    _opt(size, "--precision", dest="precision", choices=["fp32", "mixed", "mixed-no-master"],
         help="fp32: 12 bytes/param; mixed: 14 bytes/param (ZeRO accounting without gradients); "
              "mixed-no-master: 10 bytes/param (16-bit weights, fp32 Adam moments, as OPT-175B)")
    pol = parser.add_argument_group("policy")
    _opt(pol, "--preset", dest="preset", choices=["conservative", "aggressive", "auto"], help="default auto")
    _opt(pol, "--frequency", dest="frequency", type=whole_number, metavar="N", help="save every N steps")
    _opt(pol, "--keep-last", dest="keep_last", type=whole_number, metavar="N", help="rolling window size")
    _opt(pol, "--milestones", dest="milestones", type=milestones_spec, metavar="SPEC",
         help="seed (default: 1000, 5000, 10000, 25000, 50000, ...), pow2, none, or 1000,5000,...")
    _opt(pol, "--formats", dest="formats", type=formats_list, metavar="LIST",
         help="full_state_dict,sharded,safetensors (default full_state_dict,safetensors)")
    pol.add_argument("--save-optimizer", "--save_optimizer", dest="save_optimizer", action="store_const", const=True)
    pol.add_argument("--no-save-optimizer", "--no_save_optimizer", dest="save_optimizer", action="store_const",
                     const=False, help="weights only (warned: resuming resets Adam)")
    fm = parser.add_argument_group("failure model")
    _opt(fm, "--gpus", dest="gpus", type=whole_number, metavar="N", help="GPUs in the job (default 8)")
    _opt(fm, "--gpu-mtbf-hours", dest="gpu_mtbf_hours", type=positive_number, metavar="H",
         help="per-GPU MTBF (default 50000, from the Llama 3 paper)")
    _opt(fm, "--mtbf-hours", dest="mtbf_hours", type=positive_number, metavar="H", help="job MTBF (overrides --gpus)")
    _opt(fm, "--checkpoint-write-seconds", dest="checkpoint_write_seconds", type=nonneg_number, metavar="S",
         help="seconds one save stalls training (Daly's C)")
    _opt(fm, "--write-gbps", dest="write_gbps", type=positive_number, metavar="G",
         help="the job's write rate GB/s (default: --node-write-gbps x nodes, capped by --storage-gbps)")
    _opt(fm, "--gpus-per-node", dest="gpus_per_node", type=whole_number, metavar="N", help="default 8")
    _opt(fm, "--node-write-gbps", dest="node_write_gbps", type=positive_number, metavar="G",
         help="one node's write rate GB/s (default 1)")
    _opt(fm, "--storage-gbps", dest="storage_gbps", type=positive_number, metavar="G",
         help="aggregate rate the storage sustains GB/s (default 2000, Llama 3's Tectonic)")
    _opt(fm, "--min-interval-seconds", dest="min_interval_seconds", type=nonneg_number, metavar="S",
         help="the planner never saves more often (default 300)")
    _opt(fm, "--restart-seconds", dest="restart_seconds", type=nonneg_number, metavar="S", help="default 600")
    fm.add_argument("--async", dest="async_save", action="store_const", const=True, help="async saves (default)")
    fm.add_argument("--no-async", "--no_async", dest="async_save", action="store_const", const=False)
    _opt(fm, "--max-loss-hours", dest="max_loss_hours", type=positive_number, metavar="H",
         help="cap on training lost to one failure (default 1)")
    _opt(fm, "--local-tier", dest="local_tier", type=tier_spec, metavar="GB,GBPS",
         help="plan two tiers: node-local space and write rate per node (frequent saves) + persistent storage")
    _opt(fm, "--node-loss-fraction", dest="node_loss_fraction", type=positive_number, metavar="F",
         help="share of failures that lose a node's local checkpoints (default 0.78, Llama 3)")


def add_format_option(parser: argparse.ArgumentParser, choices=("text", "markdown", "json", "yaml")) -> None:
    parser.add_argument("--format", dest="format", choices=list(choices), default="text")


def plan_arguments(ns: argparse.Namespace) -> PlanArguments:
    """Namespace -> one object, validated by schemas/arguments.schema.json, then the model."""
    data = {k: getattr(ns, k) for k in PlanArguments.model_fields if getattr(ns, k, None) is not None}
    if data.get("format") not in (None, "text", "markdown", "json", "yaml"):
        data.pop("format")
    return validate_arguments(data)


def validate_arguments(data: dict) -> PlanArguments:
    import jsonschema

    from checkpoint_strategy.resources import load_schema

    schema = load_schema("arguments.schema.json")
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        field = next((p for p in error.absolute_path if isinstance(p, str)), None)
        if field is None and error.validator == "required":
            field = next((f for f in FIELDS if f"'{f}'" in error.message), None)
        if field is None and error.validator == "additionalProperties":
            raise UsageError(f"unknown argument: {error.message}")
        flag, expected = FIELDS.get(field, (field or "arguments", "a valid value"))
        value = data.get(field, "missing") if field else "missing"
        raise UsageError(f"argument {flag}: expected {expected}, got {value!r}")
    if "checkpoint_write_seconds" in data and "write_gbps" in data:
        raise UsageError("argument --checkpoint-write-seconds: give the save cost once, either "
                         "--checkpoint-write-seconds S or --write-gbps G, not both")
    try:
        return PlanArguments(**data)
    except Exception as exc:  # pydantic.ValidationError
        raise UsageError(pydantic_message(exc, "arguments")) from None
