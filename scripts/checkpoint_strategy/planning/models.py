"""Pydantic models of the planner: the validated arguments and the plan report."""

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, model_serializer

from checkpoint_strategy.planning.policytiers import PolicyTiers, _Strict
from checkpoint_strategy.vocabulary import BOUNDS, field_bounds

Preset = Literal["conservative", "aggressive", "auto"]
Precision = Literal["fp32", "mixed", "mixed-no-master"]
WeightsDtype = Literal["fp32", "bf16", "fp16"]
SaveFormat = Literal["full_state_dict", "sharded", "safetensors"]
OutputFormat = Literal["text", "markdown", "json", "yaml"]
EmergencyTrigger = Literal["loss_spike_detected", "gradient_norm_exceeded"]

# Upper bounds reject absurd input (typos such as a step time in milliseconds) while leaving
# every real run far inside: 10^12 steps, a step of 11 days, an exabyte, a 10^15-parameter model.
# The numbers live in one table, checkpoint_strategy.vocabulary.BOUNDS (the command line uses it too).
MAX_STEPS = int(BOUNDS["steps"].hi)
MAX_STEP_SECONDS = BOUNDS["step_seconds"].hi
MAX_GB = BOUNDS["gb"].hi
MAX_PARAMS = BOUNDS["params"].hi
MAX_HOURS = BOUNDS["hours"].hi
MAX_SECONDS = BOUNDS["seconds"].hi


class LocalTier(_Strict):
    """`--local-tier GB,GBPS`: node-local checkpoint space and write rate, per node."""

    gb_per_node: float = Field(gt=0, le=MAX_GB)
    gbps_per_node: float = Field(gt=0, le=1e6)


class PlanArguments(_Strict):
    """Every plan option as one object; schemas/arguments.schema.json is generated from it."""

    total_steps: int = Field(
        **field_bounds("steps"), description="optimizer steps in the whole run"
    )
    duration_hours: Optional[float] = Field(
        None,
        **field_bounds("hours"),
        description="the run's length (--duration); total_steps is it over "
        "step_seconds when not given",
    )
    step_seconds: float = Field(**field_bounds("step_seconds"), description="wall seconds per step")
    budget_gb: float = Field(
        **field_bounds("gb"), description="storage budget for checkpoints, GB (10^9 bytes)"
    )
    model_size_gb: Optional[float] = Field(
        None, **field_bounds("gb"), description="model weights, GB"
    )
    weights_dtype: WeightsDtype = Field("fp32", description="dtype of --model_size_gb's weights")
    params: Optional[float] = Field(None, **field_bounds("params"), description="parameter count")
    precision: Optional[Precision] = Field(
        None,
        description="fp32: 12 B/param; mixed: 14 B/param; mixed-no-master (16-bit weights, fp32 Adam): 10",
    )
    preset: Preset = "auto"
    frequency: Optional[int] = Field(
        None, **field_bounds("steps"), description="save every N steps"
    )
    keep_last: Optional[int] = Field(
        None, **field_bounds("keep"), description="rolling window size"
    )
    milestones: Union[Literal["seed", "pow2", "none"], list[Annotated[int, Field(gt=0)]]] = "seed"
    formats: Optional[list[SaveFormat]] = Field(None, min_length=1)
    save_optimizer: bool = True
    gpus: int = Field(8, **field_bounds("gpus"))
    gpu_mtbf_hours: float = Field(50000.0, **field_bounds("hours"), description="MTBF of one GPU")
    mtbf_hours: Optional[float] = Field(None, **field_bounds("hours"), description="job MTBF")
    checkpoint_write_seconds: Optional[float] = Field(None, **field_bounds("seconds"))
    write_gbps: Optional[float] = Field(
        None,
        **field_bounds("gbps"),
        description="the job's checkpoint write rate, GB/s (overrides the node rate)",
    )
    gpus_per_node: int = Field(
        8, ge=1, le=1024, description="GPUs per node: nodes = ceil(gpus / gpus_per_node)"
    )
    node_write_gbps: float = Field(
        1.0, **field_bounds("gbps"), description="write rate of one node, GB/s"
    )
    storage_gbps: float = Field(
        2000.0, gt=0, le=1e7, description="aggregate rate the storage sustains, GB/s"
    )
    min_interval_seconds: float = Field(
        300.0, **field_bounds("seconds"), description="the planner saves at most this often"
    )
    restart_seconds: float = Field(600.0, **field_bounds("seconds"))
    async_save: Optional[bool] = None
    max_loss_hours: float = Field(1.0, **field_bounds("hours"))
    local_tier: Optional[LocalTier] = Field(
        None, description="plan two tiers: node-local and persistent"
    )
    node_loss_fraction: float = Field(
        0.78,
        gt=0,
        le=1,
        description="share of failures that lose a node's local storage (two-tier plans)",
    )
    format: OutputFormat = "text"


def _without_none(data, keys: tuple[str, ...]):
    for k in keys:
        if k in data and data[k] is None:
            del data[k]
    return data


class CheckpointPolicy(_Strict):
    """The spec's `checkpoint_policy:` mapping."""

    frequency: str = Field(description="every_N_steps")
    keep_last: int
    keep_milestone: list[int]
    save_optimizer: bool
    save_formats: list[SaveFormat]
    validate_on_save: bool
    async_save: bool
    emergency_save_on: list[EmergencyTrigger]
    tiers: Optional[PolicyTiers] = Field(
        None, description="two-tier plans only: local and persistent saves"
    )

    @model_serializer(mode="wrap")
    def omit_single_tier(self, handler):
        """Single-tier policies keep the spec's keys only."""
        return _without_none(handler(self), ("tiers",))


class FailureModel(_Strict):
    mtbf_hours: float
    mtbf_source: str
    gpus: int
    checkpoint_write_seconds: float = Field(description="C: seconds training is stalled per save")
    persist_seconds: Optional[float] = Field(description="seconds until a save is on storage")
    restart_seconds: float
    async_save: bool
    young_interval_seconds: float
    daly_interval_seconds: float
    optimal_interval_seconds: float


IntervalReason = Literal[
    "failure_model_optimum",
    "max_loss_cap",
    "preset",
    "frequency_option",
    "storage_floor",
    "min_interval",
    "total_steps",
]


class IntervalChoice(_Strict):
    """What set the interval, and what the unconstrained optimum would have cost."""

    reason: IntervalReason
    explanation: str = Field(description="one sentence naming what set the interval and its price")
    optimum_steps: int = Field(
        description="the failure-model optimum, rounded to a round number of steps"
    )
    optimum_overhead_fraction: float = Field(
        description="expected overhead when saving every optimum_steps"
    )
    optimum_max_data_loss_hours: float
    min_interval_steps: int = Field(
        description="saves are never closer: the previous one must be on storage "
        "and --min-interval-seconds apart"
    )
    min_interval_source: str
    max_loss_cap_steps: Optional[int] = Field(
        description="the longest interval within --max-loss-hours; None when no interval keeps it"
    )


class StorageWrites(_Strict):
    """Where the write rate comes from and how much the policy writes."""

    write_gbps: Optional[float] = Field(
        description="None when --checkpoint-write-seconds gives the cost directly"
    )
    write_source: str
    nodes: int
    gpus_per_node: int
    data_written_per_day_gb: Optional[float] = Field(
        description="checkpoint data written per day of training"
    )
    storage_busy_fraction: Optional[float] = Field(
        description="share of wall time the storage spends writing checkpoints"
    )


class TierPlan(_Strict):
    frequency_steps: int
    keep_last: int
    storage_gb: Optional[float] = Field(None, description="peak storage of the tier")
    checkpoint_write_seconds: float = Field(description="seconds a save stalls training")
    persist_seconds: Optional[float] = Field(
        description="seconds until a save is on the tier's storage"
    )
    max_data_loss_hours: float = Field(description="for the failures this tier recovers")
    failures_covered_fraction: float = Field(
        description="share of failures that roll back to this tier"
    )


class LocalTierPlan(TierPlan):
    shard_gb: Optional[float] = Field(description="one node's part of a checkpoint")
    gb_per_node: float
    gbps_per_node: float
    storage_per_node_gb: Optional[float] = Field(description="(keep_last + 1) x shard")
    optimal_interval_steps: float


class TwoTierPlan(_Strict):
    """`--local-tier`: figures per tier and combined (model in planning/tiers.py)."""

    local: LocalTierPlan
    persistent: TierPlan
    node_loss_fraction: float
    job_mtbf_hours: float = Field(
        description="all failures; node losses alone are job_mtbf / node_loss_fraction"
    )
    expected_overhead_fraction: float
    expected_lost_hours_per_failure: float


class StorageBreakdown(_Strict):
    checkpoint_size_gb: Optional[float]
    rolling_gb: Optional[float] = Field(description="keep_last checkpoints")
    in_flight_gb: Optional[float] = Field(
        description="the next checkpoint, written and validated before the oldest goes"
    )
    milestones_gb: Optional[float] = Field(
        description="milestones outside the final rolling window"
    )
    milestones_outside_window: int
    safetensors_exports_gb: Optional[float]
    safetensors_exports: int
    total_gb: Optional[float]


class Assumption(_Strict):
    """An input the user did not give: the value the plan took, and the option that sets it."""

    input: str = Field(description="what was assumed, e.g. 'write rate'")
    value: str = Field(description="the value the plan used, with its source")
    option: str = Field(description="the option(s) that set it")
    sets_interval: bool = Field(description="the save interval depends on it")


class PlanReport(_Strict):
    total_steps: int
    step_seconds: float
    total_training_hours: float
    storage_budget_gb: float
    model_size_gb: Optional[float] = Field(description="weights, GB")
    params: Optional[float]
    precision: Optional[Precision]
    preset: Preset
    checkpoint_size_gb: Optional[float]
    frequency_steps: int
    frequency_hours: float
    keep_last: int
    milestone_steps: list[int]
    rolling_storage_gb: Optional[float]
    total_storage_gb: Optional[float]
    fits_budget: Optional[bool]
    storage_breakdown: StorageBreakdown
    max_data_loss_hours: float
    rollback_points: int
    rollback_horizon_steps: int
    expected_overhead_fraction: float
    expected_wall_hours: float
    expected_failures: float
    optimal_interval_seconds: float
    optimal_interval_steps: float
    failure_model: FailureModel
    interval: IntervalChoice
    storage_writes: StorageWrites
    policy: CheckpointPolicy
    warnings: list[str]
    sources: dict[str, str]
    two_tier: Optional[TwoTierPlan] = Field(
        None, description="only when --local-tier plans two tiers"
    )
    run_length: Optional[str] = Field(
        None, description="where total_steps comes from when --duration gave it"
    )
    assumptions: list[Assumption] = Field(
        default_factory=list, description="inputs not given: the value taken and the option"
    )
    formats_reason: Optional[str] = Field(
        None, description="why these save formats, with the cost of each"
    )
    budget_use: Optional[str] = Field(
        None, description="how much of the budget the policy uses and why not more"
    )

    @model_serializer(mode="wrap")
    def omit_single_tier(self, handler):
        """Single-tier reports are unchanged by the two-tier fields."""
        return _without_none(handler(self), ("two_tier", "run_length"))


SCHEMAS = {"arguments.schema.json": PlanArguments, "plan.schema.json": PlanReport}
