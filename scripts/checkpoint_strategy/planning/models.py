"""Pydantic models of the planner: the validated arguments and the plan report."""

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from checkpoint_strategy.cli_options import BOUNDS, field_bounds

Preset = Literal["conservative", "aggressive", "auto"]
Precision = Literal["fp32", "mixed"]
WeightsDtype = Literal["fp32", "bf16", "fp16"]
SaveFormat = Literal["full_state_dict", "sharded", "safetensors"]
OutputFormat = Literal["text", "markdown", "json", "yaml"]
EmergencyTrigger = Literal["loss_spike_detected", "gradient_norm_exceeded"]

# Upper bounds reject absurd input (typos such as a step time in milliseconds) while leaving
# every real run far inside: 10^12 steps, a step of 11 days, an exabyte, a 10^15-parameter model.
# The numbers live in one table, checkpoint_strategy.cli_options.BOUNDS (the command line uses it too).
MAX_STEPS = int(BOUNDS["steps"].hi)
MAX_STEP_SECONDS = BOUNDS["step_seconds"].hi
MAX_GB = BOUNDS["gb"].hi
MAX_PARAMS = BOUNDS["params"].hi
MAX_HOURS = BOUNDS["hours"].hi
MAX_SECONDS = BOUNDS["seconds"].hi


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class PlanArguments(_Strict):
    """Every plan option as one object; schemas/arguments.schema.json is generated from it."""

    total_steps: int = Field(**field_bounds("steps"), description="optimizer steps in the whole run")
    step_seconds: float = Field(**field_bounds("step_seconds"), description="wall seconds per step")
    budget_gb: float = Field(**field_bounds("gb"), description="storage budget for checkpoints, GB (10^9 bytes)")
    model_size_gb: Optional[float] = Field(None, **field_bounds("gb"), description="model weights, GB")
    weights_dtype: WeightsDtype = Field("fp32", description="dtype of --model_size_gb's weights")
    params: Optional[float] = Field(None, **field_bounds("params"), description="parameter count")
    precision: Optional[Precision] = Field(None, description="fp32: 12 B/param; mixed: 14 B/param")
    preset: Preset = "auto"
    frequency: Optional[int] = Field(None, **field_bounds("steps"), description="save every N steps")
    keep_last: Optional[int] = Field(None, **field_bounds("keep"), description="rolling window size")
    milestones: Union[Literal["seed", "pow2", "none"], list[Annotated[int, Field(gt=0)]]] = "seed"
    formats: Optional[list[SaveFormat]] = Field(None, min_length=1)
    save_optimizer: bool = True
    gpus: int = Field(8, **field_bounds("gpus"))
    gpu_mtbf_hours: float = Field(50000.0, **field_bounds("hours"), description="MTBF of one GPU")
    mtbf_hours: Optional[float] = Field(None, **field_bounds("hours"), description="job MTBF")
    checkpoint_write_seconds: Optional[float] = Field(None, **field_bounds("seconds"))
    write_gbps: float = Field(1.0, **field_bounds("gbps"), description="checkpoint write bandwidth, GB/s")
    restart_seconds: float = Field(600.0, **field_bounds("seconds"))
    async_save: Optional[bool] = None
    max_loss_hours: float = Field(1.0, **field_bounds("hours"))
    format: OutputFormat = "text"


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


class StorageBreakdown(_Strict):
    checkpoint_size_gb: Optional[float]
    rolling_gb: Optional[float] = Field(description="keep_last checkpoints")
    in_flight_gb: Optional[float] = Field(description="the next checkpoint, written and validated before the oldest goes")
    milestones_gb: Optional[float] = Field(description="milestones outside the final rolling window")
    milestones_outside_window: int
    safetensors_exports_gb: Optional[float]
    safetensors_exports: int
    total_gb: Optional[float]


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
    policy: CheckpointPolicy
    warnings: list[str]
    sources: dict[str, str]


SCHEMAS = {
    "arguments.schema.json": PlanArguments,
    "plan.schema.json": PlanReport,
}
