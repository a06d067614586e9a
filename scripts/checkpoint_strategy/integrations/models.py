"""Pydantic models of the integrations with sibling skills.

Our own objects (the handoff document, the release gate record, the emergency decision) forbid
unknown fields. The sibling's files are kept open: an agent-state.json may hold fields we do not
know, and a stability event may carry extra keys a newer monitor adds; both are preserved or
ignored, never rejected for that alone.
"""

from __future__ import annotations

from typing import Any, Final, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from checkpoint_strategy import __version__
from checkpoint_strategy.planning.models import CheckpointPolicy, EmergencyTrigger

SCHEMA_VERSION: Final = "1.0"
PRODUCER_NAME: Final = "checkpoint-strategy"

EventType = Literal["LOSS_SPIKE", "GRADIENT_NORM_EXCEEDED", "LOSS_PLATEAU", "NAN_LOSS"]
EVENT_TYPES: tuple[str, ...] = ("LOSS_SPIKE", "GRADIENT_NORM_EXCEEDED", "LOSS_PLATEAU", "NAN_LOSS")
Severity = Literal["info", "warning", "error", "critical"]
RequireItem = Literal["safetensors", "full_state_dict", "sharded", "resumable"]
FormatPresent = Literal["safetensors", "full_state_dict", "sharded"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Producer(_Strict):
    name: Literal["checkpoint-strategy"] = PRODUCER_NAME
    version: str = __version__


# --------------------------------------------------------------------------- session-handoff


class CheckpointRef(_Strict):
    """One checkpoint that the validator found whole."""

    path: str
    step: Optional[int] = Field(description="optimizer step, when the layout names it")
    layout: str = Field(
        description="the validator's format: hf-trainer, lightning, torch, safetensors, dcp, ..."
    )
    formats: list[FormatPresent] = Field(
        description="save formats present: safetensors, full_state_dict, sharded"
    )
    resumable: bool = Field(description="optimizer state present: training can resume from it")
    sharded: bool
    validated_at: str = Field(description="UTC ISO 8601 time of the validation")
    level: Literal["quick", "full", "deep"]
    after_spike_onset: Optional[bool] = Field(
        None,
        description="saved after the onset of the loss spike the recovery adviser found (holds spiked "
        "weights: not a rollback target); null when no spike is known",
    )


class BadCheckpoint(_Strict):
    path: str
    step: Optional[int]
    status: Literal["invalid", "incomplete"]
    reason: str = Field(description="the first problem the validator found")


class PlanSummary(_Strict):
    frequency_steps: int
    keep_last: int
    milestone_steps: list[int]
    max_data_loss_hours: float
    total_storage_gb: Optional[float]
    fits_budget: Optional[bool]


class RecoveryNote(_Strict):
    """What the recovery adviser said about the training log (when one was found or given)."""

    log: str
    status: Literal["no_spike", "self_recovered", "wait", "rollback", "no_clean_checkpoint"]
    summary: str
    spike_onset_step: Optional[int]
    wait_until_step: Optional[int]
    resume_checkpoint: Optional[str] = Field(
        description="path (or step) of the checkpoint to resume from"
    )
    resume_step: Optional[int]


class SessionHandoff(_Strict):
    """`checkpoint-strategy.json` in the session-handoff state folder."""

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    producer: Producer = Field(default_factory=Producer)
    generated_at: str = Field(description="UTC ISO 8601")
    policy: Optional[CheckpointPolicy] = Field(
        description="the checkpoint_policy mapping, when a plan was given"
    )
    plan: Optional[PlanSummary] = None
    checkpoints_root: Optional[str] = None
    latest_valid_checkpoint: Optional[CheckpointRef] = Field(
        None,
        description="the checkpoint to resume from: the newest valid, resumable checkpoint not after the onset "
        "of an unrecovered loss spike (the newest weights-only one when none is resumable)",
    )
    rollback_points: list[CheckpointRef] = Field(
        default_factory=list,
        description="the valid checkpoints safe to resume from (none after the onset of an "
        "unrecovered loss spike), newest first (the latest included)",
    )
    post_onset_checkpoints: list[CheckpointRef] = Field(
        default_factory=list,
        description="valid checkpoints saved after the onset of an unrecovered loss spike: "
        "do not resume from them",
    )
    bad_checkpoints: list[BadCheckpoint] = Field(default_factory=list)
    recovery: Optional[RecoveryNote] = Field(
        None, description="the recovery adviser on the training log"
    )
    recovery_commands: list[str] = Field(
        default_factory=list, description="commands to run next, in order"
    )
    pending_risks: list[str] = Field(
        default_factory=list, description="warnings for the next session"
    )
    automatic_actions: list[dict[str, Any]] = Field(
        default_factory=list,
        description="what the training callbacks did by themselves, oldest first (the last 50): "
        "rollbacks, resume checks, stops, preemption saves, interval changes, "
        "interruptions; each as recorded in the run's loss log",
    )
    next_step: str


class AgentState(BaseModel):
    """session-handoff's `.claude/state/agent-state.json`. Unknown fields are kept as they are."""

    model_config = ConfigDict(extra="allow")

    schema_version: Union[int, str, None] = None
    session_id: Optional[str] = None
    status: Optional[str] = None
    last_updated: Optional[str] = None
    next_step: Union[str, dict, None] = None
    completed_steps: Optional[list] = None
    notes: Union[list, str, None] = None
    pending_risks: Optional[list] = None


class CheckpointLogLine(BaseModel):
    """One line of session-handoff's `.claude/state/checkpoint.jsonl`."""

    model_config = ConfigDict(extra="allow")

    ts: str
    step: Union[str, int]
    status: str
    detail: str


# --------------------------------------------------------------------------- release-readiness


class FileChecksum(_Strict):
    file: str = Field(description="relative to the checkpoint")
    bytes: int
    sha256: str


class NotForRelease(_Strict):
    file: str = Field(description="relative to the checkpoint")
    reason: str


class GateCheck(_Strict):
    name: str
    ok: bool
    detail: str


class ValuesSummary(_Strict):
    """Release record of the deep level: every float value read once (nothing executed)."""

    tensors: int
    values: int
    nonfinite_values: int
    weights_norm: Optional[float]
    weights_dtype: Optional[str]
    optimizer: str = Field(description="adam / other / none")
    optimizer_parameters: int
    parameters_with_moments: int
    verdicts: list[str] = Field(
        default_factory=list, description="not resumable / suspicious / invalid findings"
    )


class ReleaseGate(_Strict):
    """The release-readiness gate record for one checkpoint."""

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    producer: Producer = Field(default_factory=Producer)
    checkpoint: str
    layout: str
    step: Optional[int]
    level: Literal["quick", "full", "deep"]
    validated_at: str
    loads_ok: bool = Field(
        description="the validator found every file whole (nothing is unpickled or executed)"
    )
    status: Literal["valid", "invalid", "incomplete"]
    formats_present: list[FormatPresent]
    required: list[RequireItem]
    resumable: bool
    sharded: bool
    integrity: Literal["manifest", "checksums"] = Field(
        description="manifest: the checkpoint's own manifest was verified; checksums: sha256 of every file"
    )
    manifest: Optional[str] = Field(None, description="path of the verified manifest")
    checksums: list[FileChecksum] = Field(default_factory=list)
    checks: list[GateCheck]
    not_for_release: list[NotForRelease] = Field(
        default_factory=list,
        description="files in the checkpoint a model release should not ship: training state "
        "(optimizer, scheduler, RNG, TrainingArguments pickles; trainer_state.json) "
        "and pickled copies of weights that are also in safetensors",
    )
    release_set: list[str] = Field(
        default_factory=list,
        description="--require safetensors: the files a release ships (the safetensors weights, "
        "their index, configs, tokenizer): every file not in not_for_release",
    )
    values: Optional[ValuesSummary] = Field(
        None, description="level deep: what the value pass found"
    )
    notes: list[str] = Field(
        default_factory=list,
        description="what a release needs beyond the gate: tokenizer "
        "files missing from the release set; whether this is "
        "the trainer's eval-best checkpoint",
    )
    gate: Literal["pass", "fail"]
    reasons: list[str] = Field(description="why the gate failed (empty on pass)")


# --------------------------------------------------------------------------- training-stability-monitor


class StabilityEvent(BaseModel):
    """An event from training-stability-monitor. Extra keys a newer monitor adds are ignored."""

    model_config = ConfigDict(extra="ignore")

    event: EventType
    step: Optional[int] = Field(None, ge=0)
    value: Optional[float] = Field(None, description="the observed loss or gradient norm")
    magnitude: Optional[float] = Field(
        None, description="value / baseline (a spike of 3x has magnitude 3)"
    )
    threshold: Optional[float] = None
    severity: Severity = "warning"
    ts: Union[str, float, None] = Field(None, description="ISO 8601 or Unix seconds")

    @field_validator("step", "value", "magnitude", "threshold", mode="before")
    @classmethod
    def _no_bool(cls, value):
        if isinstance(value, bool):
            raise ValueError("expected a number, not true/false")
        return value


class Decision(_Strict):
    """What to do about one event."""

    event: EventType
    step: Optional[int]
    trigger: Optional[EmergencyTrigger] = Field(
        description="the emergency_save_on trigger it maps to"
    )
    decision: Literal["emergency_save", "none"]
    confirmed_spike: bool = Field(
        description="the spike is persistent or critical: roll back, do not wait"
    )
    reason: str
    next_command: Optional[str] = Field(description="the command to run next, if any")

    @property
    def should_save(self) -> bool:
        return self.decision == "emergency_save"


class EmergencyDecision(_Strict):
    """The answer of `on-event`: one decision over every event given, and the per-event decisions."""

    schema_version: Literal["1.0"] = SCHEMA_VERSION
    producer: Producer = Field(default_factory=Producer)
    policy_triggers: list[EmergencyTrigger] = Field(description="the policy's emergency_save_on")
    decision: Literal["emergency_save", "none"]
    reason: str
    next_command: Optional[str]
    save_at_step: Optional[int] = Field(
        description="the step to save at (the first triggering event's step)"
    )
    decisions: list[Decision] = Field(description="per-event decisions, at most the first 1000")
    events_total: Optional[int] = Field(
        None, description="events decided (may exceed the decisions listed)"
    )
    notes: list[str] = Field(
        default_factory=list, description="input that was read but is not an event"
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="failing checks of a monitor report that this tool does not know",
    )

    @property
    def should_save(self) -> bool:
        return self.decision == "emergency_save"


SCHEMAS: dict[str, type[BaseModel]] = {
    "session-handoff.schema.json": SessionHandoff,
    "release-readiness.schema.json": ReleaseGate,
    "stability-event.schema.json": StabilityEvent,
    "emergency-decision.schema.json": EmergencyDecision,
}
