"""Pydantic models of the simulate and tradeoffs reports (schemas generated from them)."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SimulatedPolicy(_Strict):
    """The plan that was simulated, as the simulation saw it."""

    total_steps: int
    step_seconds: float
    frequency_steps: int
    keep_last: int
    milestone_steps: list[int]
    checkpoints_per_run: int = Field(
        description="saves in a failure-free run (the final step included)"
    )
    mtbf_hours: float
    checkpoint_write_seconds: float = Field(description="C: seconds a save stalls training")
    persist_seconds: float = Field(
        description="seconds from the start of a save until it is on storage"
    )
    restart_seconds: float
    async_save: bool


class SpikeStats(_Strict):
    spike_rate_per_1000_steps: float
    wait_steps: int = Field(description="a spike is noticed this many steps after its onset")
    margin_steps: int = Field(
        description="the rescue checkpoint must be this many steps before the onset"
    )
    mean_spikes: float = Field(description="spikes per run")
    spikes: int = Field(description="spikes handled over all runs")
    window_miss_fraction: Optional[float] = Field(
        description="of spikes: the rolling window no longer held a checkpoint from before onset - margin"
    )
    milestone_rescue_fraction: Optional[float] = Field(
        description="of spikes: a milestone outside the rolling window saved the run, because the window missed "
        "or every window checkpoint from before the onset was corrupt"
    )
    scratch_fraction: Optional[float] = Field(
        description="of spikes: nothing from before onset - margin was left; restart from step 0 (a spike in the "
        "first margin steps is rescued by step 0 and not counted here)"
    )
    runs_with_window_miss_fraction: float = Field(
        description="of runs: at least one spike the window missed"
    )
    runs_saved_only_by_milestone_fraction: float = Field(
        description="of runs: at least one spike that only a milestone rescued"
    )
    runs_from_scratch_fraction: float = Field(
        description="of runs: at least one restart from step 0"
    )


class TwoTierSimulation(_Strict):
    """Two-tier plans: local saves, persistent saves, and the failures that lost a node."""

    local_frequency_steps: int
    persistent_frequency_steps: int
    node_loss_fraction: float
    node_losses_per_run: float = Field(
        description="failures that lost a node (rolled back to persistent), per run"
    )


class SimulationReport(_Strict):
    runs: int
    seed: int
    policy: SimulatedPolicy
    corrupt_prob: float = Field(
        description="probability that a saved checkpoint is unloadable when needed"
    )
    compute_hours: float = Field(description="pure training compute of the run, W")
    failure_free_wall_hours: float = Field(description="compute plus save stalls, no failure")
    mean_wall_hours: float
    wall_hours_stderr: float = Field(description="standard error of mean_wall_hours")
    p50_wall_hours: float
    p95_wall_hours: float
    p99_wall_hours: float
    analytic_wall_hours: float = Field(description="the planner's Daly 2006 expectation")
    analytic_z: Optional[float] = Field(
        description="(mean_wall_hours - analytic_wall_hours) / wall_hours_stderr"
    )
    async_wall_hours: Optional[float] = Field(
        None,
        description="async saves: the exact expectation with rework of saves still in flight (failures only)",
    )
    async_z: Optional[float] = Field(
        None, description="(mean_wall_hours - async_wall_hours) / wall_hours_stderr"
    )
    mean_lost_hours: float = Field(
        description="wall time beyond pure compute: save stalls, rework, restarts, "
        "spikes (lost_definition)"
    )
    p50_lost_hours: float
    p95_lost_hours: float
    p99_lost_hours: float
    max_lost_hours: float
    mean_failures: float = Field(
        description="failures per run, those during saves and restarts included"
    )
    p50_failures: float = Field(description="percentiles are order statistics: values some run had")
    p95_failures: float
    p99_failures: float
    max_failures: int
    overhead_fraction: float = Field(description="simulated mean wall time / compute - 1")
    analytic_overhead_fraction: float = Field(
        description="the planner's expected_overhead_fraction"
    )
    in_flight_rollback_fraction: Optional[float] = Field(
        description="of all failures (the failures row): the newest checkpoint was still being written, the "
        "rollback went one further"
    )
    corrupt_skips_per_run: float = Field(
        description="corrupt checkpoints skipped during rollbacks, per run"
    )
    failure_scratch_fraction: float = Field(
        description="of runs: a failure found no loadable checkpoint left (restart from step 0); a failure before "
        "the first save restarts from step 0 too but is not counted: step 0 is a rollback point"
    )
    spikes: Optional[SpikeStats]
    plan_warnings: list[str]
    assumptions: list[str]
    lost_definition: str
    analytic_caveats: list[str] = Field(
        description="why the analytic figure may differ beyond sampling noise"
    )
    two_tier: Optional[TwoTierSimulation] = Field(
        None, description="only for plans with --local-tier"
    )


class TradeoffPoint(_Strict):
    frequency_steps: int
    keep_last: int
    frequency_hours: float
    peak_storage_gb: Optional[float]
    fits_budget: Optional[bool]
    max_data_loss_hours: float
    expected_overhead_fraction: float
    expected_lost_hours: float = Field(
        description="compute hours x expected_overhead_fraction: wall time beyond "
        "pure compute (save stalls, rework, restarts), as in simulate"
    )
    rollback_horizon_steps: int
    rollback_horizon_hours: float
    spike_window_rescue_probability: float = Field(
        description="per spike: the rolling window holds a checkpoint from before onset - margin when acted on "
        "(exact over onsets, saves in flight included; step 0 counts as a rollback point)"
    )
    spike_run_rescue_probability: Optional[float] = Field(
        description="per run: every spike at --spike-rate is rescued from the rolling window"
    )
    pareto: bool
    recommended: bool


class TradeoffsReport(_Strict):
    total_steps: int
    step_seconds: float
    compute_hours: float
    storage_budget_gb: float
    checkpoint_size_gb: Optional[float]
    spike_rate_per_1000_steps: Optional[float]
    spike_wait_steps: int
    spike_margin_steps: int
    recommended_frequency_steps: int
    recommended_keep_last: int
    frequencies: list[int]
    keep_last_values: list[int]
    pareto_objectives: list[str]
    pareto_count: int
    recommended_on_front: bool
    points: list[TradeoffPoint]
    plot: Optional[str] = Field(description="file the plot was written to")
    plan_warnings: list[str]
    lost_definition: str


SCHEMAS = {
    "simulation-report.schema.json": SimulationReport,
    "tradeoffs-report.schema.json": TradeoffsReport,
}
