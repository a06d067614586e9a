"""What a plan took without being told, and the choices made from the run's scale (issue 42).

- Assumed inputs: every number the user did not give that the plan used (write rate, MTBF, precision,
  async saves, ...), each with the option that sets it and whether the save interval depends on it.
- Resume formats: on more than one node the training is taken to be sharded (FSDP/ZeRO): a save writes each
  rank's shard in parallel, where a full state dict would gather the whole state onto one rank and write it
  from one node on every save. DCP and DeepSpeed ZeRO checkpoints reshard on load to another GPU count, so the
  sharded save is the resume format; the consolidated weights (safetensors) are exported at the milestones only.
- Budget use: the auto preset spends an unused budget on denser milestones and a longer rolling window, within
  limits it states (at most one milestone per MILESTONE_SHARE of the run, MAX_KEEP_LAST_AUTO checkpoints).
"""

from __future__ import annotations

import math

from checkpoint_strategy.planning import sizing
from checkpoint_strategy.planning.models import Assumption, PlanArguments
from checkpoint_strategy.planning.rounding import nice_floor
from checkpoint_strategy.planning.stages import Interval, SaveCost, Sizing

# the interval is set by the failure model's inputs under these reasons
_COST_REASONS = ("failure_model_optimum", "storage_floor")
# budget use: milestones no closer than this share of the run; the policy's peak stays under this share of
# the budget (the rest is headroom: a save that fails validation, a deletion that waits, other files)
MILESTONE_SHARE = 0.01
BUDGET_SHARE = 0.8
SHARDED_DEFAULT = ["sharded", "safetensors"]


def given(args: PlanArguments, *names: str) -> bool:
    return not args.model_fields_set.isdisjoint(names)


def default_formats(args: PlanArguments) -> list:
    """--formats, else sharded on more than one node (FSDP/ZeRO), else the spec's full_state_dict."""
    if args.formats:
        return list(args.formats)
    if math.ceil(args.gpus / args.gpus_per_node) > 1:
        return list(SHARDED_DEFAULT)
    return ["full_state_dict", "safetensors"]


def assumptions(
    args: PlanArguments, size: Sizing, cost: SaveCost, iv: Interval
) -> list[Assumption]:
    """Every input the plan used without being given it."""
    out: list[Assumption] = []
    # under the max-loss cap the save's time to storage moves the interval only when it changes the round number
    by_cost = iv.reason in _COST_REASONS or (
        iv.reason == "max_loss_cap"
        and iv.cap_steps != nice_floor(args.max_loss_hours * 3600.0 / args.step_seconds)
    )
    explicit_cost = given(args, "checkpoint_write_seconds")
    if not explicit_cost:
        out.extend(_save_cost(args, size, cost, by_cost))
    if not given(args, "mtbf_hours") and not (
        given(args, "gpu_mtbf_hours") and given(args, "gpus")
    ):
        out.append(_failure_rate(args, iv))
    if size.params is not None and not explicit_cost and not given(args, "precision"):
        out.append(_precision(args, size, by_cost))
    if not given(args, "async_save") and not explicit_cost:
        out.append(
            Assumption.model_construct(
                input="async saves",
                value="on: training stalls for the host snapshot only (10% of a synchronous save)",
                option="--no-async (or --async)",
                sets_interval=by_cost and size.size_gb is not None,
            )
        )
    out.extend(_limits(args, iv))
    if not args.formats and size.formats == SHARDED_DEFAULT:
        out.append(
            Assumption.model_construct(
                input="sharded training",
                value=f"FSDP or ZeRO over {cost.nodes} nodes: resume from sharded saves",
                option="--formats full_state_dict,safetensors (DDP: every rank holds it all)",
                sets_interval=False,
            )
        )
    return out


def _save_cost(
    args: PlanArguments, size: Sizing, cost: SaveCost, by_cost: bool
) -> list[Assumption]:
    """The storage write rate or the save cost, when no save time was given."""
    out: list[Assumption] = []
    if not given(args, "write_gbps", "node_write_gbps") and size.size_gb is not None:
        out.append(
            Assumption.model_construct(
                input="storage write rate per node",
                value=f"{cost.write_source}: {cost.write_gbps:g} GB/s for the job",
                option="--node-write-gbps G (per node) or --write-gbps G (the job) or "
                "--checkpoint-write-seconds S",
                sets_interval=by_cost,
            )
        )
    if size.size_gb is None:
        out.append(
            Assumption.model_construct(
                input="save cost",
                value=f"{cost.C:g} s a save (the model size is unknown)",
                option="--params N or --model-size-gb N, or --checkpoint-write-seconds S",
                sets_interval=by_cost,
            )
        )
    return out


def _failure_rate(args: PlanArguments, iv: Interval) -> Assumption:
    gpus = "" if given(args, "gpus") else " (GPUs not given: 8)"
    return Assumption.model_construct(
        input="failure rate",
        value=(
            f"job MTBF {args.gpu_mtbf_hours / args.gpus:.4g} h: {args.gpu_mtbf_hours:g} GPU-hours per GPU "
            f"(Llama 3) / {args.gpus} GPUs{gpus}"
        ),
        option="--mtbf-hours H (measured), or --gpus N and --gpu-mtbf-hours H",
        sets_interval=iv.reason == "failure_model_optimum",
    )


def _precision(args: PlanArguments, size: Sizing, by_cost: bool) -> Assumption:
    assert size.precision is not None
    per = (
        sizing.STATE_BYTES[size.precision]
        if args.save_optimizer
        else sizing.WEIGHT_BYTES.get(size.precision, 2)
    )
    dtype = (
        ""
        if given(args, "weights_dtype") or args.model_size_gb is None
        else (f"; --model-size-gb read as {args.weights_dtype} weights")
    )
    return Assumption.model_construct(
        input="precision",
        value=f"{size.precision}: {per} bytes a parameter in a checkpoint{dtype}",
        option="--precision (fp32, mixed or mixed-no-master)"
        + ("" if not dtype else " and --weights-dtype"),
        sets_interval=by_cost,
    )


def _limits(args: PlanArguments, iv: Interval) -> list[Assumption]:
    out = []
    if iv.reason == "max_loss_cap" and not given(args, "max_loss_hours"):
        out.append(
            Assumption.model_construct(
                input="accepted loss",
                value=f"at most {args.max_loss_hours:g} h of training lost to one failure",
                option="--max-loss-hours H",
                sets_interval=True,
            )
        )
    if iv.reason == "min_interval" and not given(args, "min_interval_seconds"):
        out.append(
            Assumption.model_construct(
                input="shortest interval",
                value=f"{args.min_interval_seconds:g} s between saves",
                option="--min-interval-seconds S",
                sets_interval=True,
            )
        )
    if not given(args, "restart_seconds"):
        out.append(
            Assumption.model_construct(
                input="restart cost",
                value=f"{args.restart_seconds:g} s to restart after a failure",
                option="--restart-seconds S",
                sets_interval=False,
            )
        )
    return out


def assumption_warning(found: list[Assumption]) -> str | None:
    setting = [a for a in found if a.sets_interval]
    if not setting:
        return None
    names = ", ".join(a.input for a in setting)
    options = ", ".join(a.option.split(" ")[0].rstrip(",") for a in setting)
    return (
        f"the save interval rests on assumed inputs ({names}): give {options} with your own numbers "
        "(Assumed Inputs)"
    )


def formats_reason(args: PlanArguments, size: Sizing, cost: SaveCost) -> str | None:
    """Why these formats, with the cost of a sharded and of a full save; None for one node's default."""
    if cost.nodes <= 1 or size.size_gb is None or cost.write_gbps is None:
        return None
    node_gbps = (
        args.node_write_gbps if not given(args, "write_gbps") else cost.write_gbps / cost.nodes
    )
    sharded_s = size.size_gb / cost.write_gbps
    full_s = size.size_gb / node_gbps
    full = (
        f"a full_state_dict gathers all {size.size_gb:.4g} GB onto one rank (that much of its host memory, "
        f"over the network) and writes it from one node: {full_s:.4g} s at {node_gbps:g} GB/s, "
        f"{full_s / sharded_s:.3g}x the sharded save"
    )
    sharded = (
        f"a sharded save writes {size.size_gb / cost.nodes:.4g} GB from each of {cost.nodes} nodes at once: "
        f"{sharded_s:.4g} s at {cost.write_gbps:g} GB/s"
    )
    weights = (
        f"safetensors ({size.weights_gb:.4g} GB of weights)"
        if size.weights_gb is not None
        else "safetensors"
    )
    if "full_state_dict" in size.formats:
        return (
            f"{sharded}; {full}, on every save: resume from sharded saves (DCP and DeepSpeed ZeRO reshard on "
            f"load to another GPU count) and keep full copies for migration and release milestones"
        )
    return (
        f"sharded for resuming: {sharded}, and DCP and DeepSpeed ZeRO reshard on load to another GPU count; "
        f"{full}, so it is not saved for resuming; {weights} at the milestones and the final step for "
        "release and migration (convert --to full makes one full file from any sharded save)"
    )
