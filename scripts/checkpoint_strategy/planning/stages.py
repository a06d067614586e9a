"""The planner's intermediate results (size, save cost, interval): shared by planner.py and inputs.py, which
planner imports (a small module below both, docs/DEVELOPING.md "Layers")."""

from __future__ import annotations

from dataclasses import dataclass

from checkpoint_strategy.planning.models import IntervalReason, Precision, SaveFormat


@dataclass
class Sizing:
    """Checkpoint and export sizes (GB; None when the model size is unknown) and the formats."""

    params: float | None
    precision: Precision | None
    size_gb: float | None
    weights_gb: float | None
    formats: list[SaveFormat]


@dataclass
class SaveCost:
    """What one save costs: Daly's C, the time until it is on storage, and the failure model."""

    write_gbps: float | None
    write_source: str
    nodes: int
    C: float
    persist: float | None
    async_save: bool
    mtbf_h: float
    mtbf_source: str
    M: float
    R: float
    tau_exact: float
    tau_young: float
    tau_daly: float

    @property
    def lag(self) -> float:
        """Seconds after a save starts until it can be rolled back to (added to max data loss)."""
        return self.persist if self.async_save and self.persist is not None else 0.0

    @property
    def durable_gap(self) -> float:
        """Async: the shortest compute time between saves so one is on storage before the next starts."""
        return max(0.0, self.lag - self.C)


@dataclass
class Interval:
    """The chosen interval in steps and why."""

    frequency: int
    reason: IntervalReason
    optimum_steps: int
    floor_steps: int
    floor_source: str
    cap_steps: int | None
    durable_steps: int
