"""Pydantic models of `export`: a plan translated into one framework's own settings."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Framework = Literal["hf", "lightning", "orbax", "torchtitan", "megatron", "deepspeed"]
VersionSource = Literal["installed", "--framework-version", "newest known"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Schedule(_Strict):
    """What the plan asks for, in steps (the exported settings are checked against it)."""

    total_steps: int
    every_steps: int = Field(description="a save at every multiple of this step")
    extra_save_steps: list[int] = Field(
        description="saves off the grid: milestones that are not multiples, and the final step"
    )
    keep_last: int = Field(description="rolling window: the newest N saves")
    keep_steps: list[int] = Field(
        description="milestones kept for good, on top of the rolling window"
    )
    periodic_milestones: Optional[int] = Field(
        None, description="P when the milestones (final step aside) are exactly every multiple of P"
    )
    save_optimizer: bool
    async_save: bool


class Setting(_Strict):
    """One native block: keyword arguments, a TOML table, a config mapping or command-line flags."""

    name: str = Field(
        description="what the values configure, e.g. TrainingArguments or [checkpoint]"
    )
    kind: Literal["kwargs", "toml", "config", "flags", "code"]
    values: dict[str, Any] = Field(
        description="option name -> value (flags: value null for a switch)"
    )
    note: str = ""


class NotExpressible(_Strict):
    """A part of the policy the framework cannot hold natively, and what to do instead."""

    item: str = Field(description="the policy item, e.g. keep_milestone")
    reason: str
    instead: str


class ExportReport(_Strict):
    framework: Framework
    package: str = Field(description="the distribution whose version decides the output")
    framework_version: str = Field(description="the version the settings are written for")
    version_source: VersionSource
    version_note: str = Field(description="one sentence: which version was assumed and why")
    schedule: Schedule
    settings: list[Setting]
    not_expressible: list[NotExpressible]
    warnings: list[str]
    sources: list[str] = Field(description="where the option names come from")


SCHEMAS = {"export-report.schema.json": ExportReport}
