"""Pydantic models of `recover` and `verify-resume`: the reports and the pieces they are made of.

schemas/recovery-report.schema.json and schemas/verify-resume-report.schema.json are generated
from these models (`python -m checkpoint_strategy.schemagen`).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from checkpoint_strategy.formats.models import OptimizerSteps, RunShape

SpikeKind = Literal["spike", "divergence", "level_shift", "nonfinite", "collapse", "grad_norm"]
Verdict = Literal["healthy", "recovering", "diverged"]
RecoverStatus = Literal["no_spike", "self_recovered", "wait", "rollback", "no_clean_checkpoint"]
LogFormat = Literal["hf", "json", "jsonl", "csv", "tensorboard"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class LogInfo(_Strict):
    """What was read: the file, its format, and the columns used."""

    path: str
    format: LogFormat
    step_key: str
    loss_key: str
    grad_norm_key: Optional[str] = None
    lr_key: Optional[str] = None
    entries: int = Field(description="loss values read, before restart de-duplication")
    points: int = Field(description="loss values on the merged timeline (latest segment wins)")
    first_step: int
    last_step: int
    log_interval: int = Field(description="median step difference between logged losses")


class Restart(_Strict):
    """A place where the log's steps go back (or repeat): a resumed run appending to the log."""

    step: int = Field(description="first step logged by the new segment")
    previous_step: int = Field(description="last step logged before the restart")
    repeated_steps: int = Field(description="steps logged twice; the newer segment's values win")
    entry: int = Field(description="0-based index of the restart's first entry in the file")


class Spike(_Strict):
    """One detected event. Steps are the log's optimizer steps."""

    kind: SpikeKind = Field(
        description="spike: short, comes back (or still inside the wait window); divergence: not back within the "
        "wait window, or only partly; level_shift: a step change or slow climb to a higher plateau with "
        "no single spike; nonfinite: NaN/inf loss; collapse: the loss pinned at one value (0.0 too); "
        "grad_norm: a grad-norm spike only"
    )
    onset_step: int
    peak_step: int
    peak_loss: Optional[float] = Field(
        description="highest loss in the event; null when the loss was NaN/inf"
    )
    baseline_loss: Optional[float] = Field(
        description="pre-spike level: median of the 20 logged losses before the onset; null if none was logged"
    )
    magnitude: Optional[float] = Field(
        description="peak_loss / baseline_loss; null for NaN/inf or a baseline <= 0"
    )
    z_score: Optional[float] = Field(
        description="robust z of the peak against the rolling median/MAD baseline"
    )
    recovered_step: Optional[int] = Field(
        description="first step back near the baseline; null if never"
    )
    recovery_steps: Optional[int] = Field(description="recovered_step - onset_step")
    detected_by: list[str] = Field(description="the rules that fired at detection")
    peak_grad_norm: Optional[float] = None
    baseline_grad_norm: Optional[float] = None
    grad_norm_precursor_step: Optional[int] = Field(
        None,
        description="a grad-norm spike that started shortly before the loss onset (onset moved to it)",
    )
    reference_loss: Optional[float] = Field(
        None,
        description="the healthy level it must come back to (a low quantile of the loss over a long window "
        "before the onset, frozen there; never above baseline_loss)",
    )
    detail: str = Field(
        "", description="more about the kind: plateau or climbing, pinned value, ..."
    )
    cause: Optional[str] = Field(
        None, description="a likely cause found in the log (an LR restart)"
    )


class CheckpointRef(_Strict):
    step: int
    path: Optional[str] = Field(description="null when checkpoints were given as a list of steps")
    kind: Literal["checkpoint", "milestone"] = "checkpoint"
    smoothed_loss: Optional[float] = Field(
        None,
        description="median of the losses logged just before and after this step (the weights' own loss)",
    )
    within_tolerance: Optional[bool] = Field(
        None,
        description="smoothed_loss <= baseline_loss * (1 + tolerance); null if no loss near it",
    )
    tag: Optional[Literal["resume", "post_event", "inside_event"]] = Field(
        None,
        description="post_event: saved after the onset of the trouble (do not resume from it); inside_event: "
        "saved during an earlier event; resume: the chosen resume point",
    )


class CheckpointsInfo(_Strict):
    source: Literal["folder", "list", "none"]
    root: Optional[str] = None
    count: int
    first_step: Optional[int] = None
    last_step: Optional[int] = None
    cutoff_step: Optional[int] = Field(
        None, description="newest step a resume checkpoint may have (onset - margin)"
    )
    margin_steps: Optional[int] = None
    post_event: list[CheckpointRef] = Field(
        default_factory=list,
        description="checkpoints saved at or after the onset: do not resume from them",
    )


class Thresholds(_Strict):
    window: int = Field(description="rolling window, in logged values")
    z_threshold: float
    ratio_threshold: float
    max_ratio: float
    min_rise: float
    tolerance: float
    wait_steps: int
    min_wait_steps: int


class EvalOpinion(_Strict):
    """The eval loss as a second opinion on the train loss."""

    key: str
    points: int
    best_step: int
    best_loss: float
    last_step: int
    last_loss: float
    overfitting: bool = Field(
        description="eval loss rose past the tolerance while the train loss fell or held"
    )
    rose_with_train_step: Optional[int] = Field(
        None,
        description="the first eval step after the best at which the eval loss and the train loss both rose "
        "past the tolerance: the start of the trouble, not overfitting",
    )
    healthy_step: Optional[int] = Field(
        None,
        description="the last eval step before rose_with_train_step (the last one both losses were healthy at)",
    )
    note: str


class Overrides(_Strict):
    hf_trainer: str
    lightning: str


class RecoveryReport(_Strict):
    """The result of `recover` / `checkpoint_strategy.recovery.advise`."""

    status: RecoverStatus
    summary: str = Field(description="one line: what to do")
    log: LogInfo
    spike: Optional[Spike] = Field(
        description="the event the advice is about (the latest); null when none"
    )
    spikes: list[Spike] = Field(description="every event found, oldest first")
    self_recovered: Optional[bool] = Field(description="null when there is no spike")
    wait_until_step: Optional[int] = Field(
        description="onset + wait window: decide no later than this step"
    )
    resume_checkpoint: Optional[CheckpointRef] = Field(
        description="where to resume; null when none predates"
    )
    nearest_milestone: Optional[CheckpointRef] = None
    checkpoints: CheckpointsInfo
    skip_batches: Optional[list[int]] = Field(
        description="[start, end] optimizer steps (inclusive) whose batches to skip or reshuffle",
        min_length=2,
        max_length=2,
    )
    lr_multiplier: Optional[float]
    lr_reduced_steps: Optional[int]
    lr_reduced_until_step: Optional[int] = None
    grad_clip: Optional[float]
    overrides: Optional[Overrides] = None
    policy_advice: Optional[str] = Field(
        None, description="the policy change that would have prevented this"
    )
    verdict: Verdict = Field(
        description="the run at the end of the log: healthy, recovering or diverged"
    )
    verdict_detail: str = ""
    recovery_rate: Optional[float] = Field(
        None, description="recovering: fraction of the excess over the healthy level shed per step"
    )
    back_by_step: Optional[int] = Field(
        None, description="recovering: step by which it would be back within tolerance"
    )
    last_good_step: Optional[int] = Field(
        None, description="the last logged step before the trouble began"
    )
    best_model_checkpoint: Optional[str] = Field(
        None, description="the log's best_model_checkpoint (HF Trainer)"
    )
    eval: Optional[EvalOpinion] = Field(
        None, description="eval loss as a second opinion; null when none is logged"
    )
    restarts: list[Restart]
    thresholds: Thresholds
    reasons: list[str] = Field(description="why, in plain sentences")
    warnings: list[str]
    framework: Optional[Literal["hf_trainer", "lightning"]] = Field(
        None,
        description="the training framework the log and checkpoints show; the text report prints only its "
        "snippet (null: both)",
    )
    max_steps: Optional[int] = Field(
        None,
        description="the run's max_steps, when its files say (LR and skip "
        "windows are clipped to it)",
    )
    previous_grad_clip: Optional[float] = Field(
        None,
        description="the run's own max_grad_norm when a training_args.json says so (never guessed; "
        "training_args.bin is a pickle and is not read)",
    )
    run_facts: dict[str, str] = Field(
        default_factory=dict,
        description="fact -> the file it was read from (max_steps, max_grad_norm, ...)",
    )
    actions: list[str] = Field(
        default_factory=list,
        description="ready commands and steps, in order (pin the rollback checkpoint, move "
        "the post-onset ones aside or resume into a new folder); never executed",
    )


class VerifyResumeReport(_Strict):
    """The result of `verify-resume` / `checkpoint_strategy.recovery.verify_resume`."""

    verdict: Literal["ok", "suspicious"]
    summary: str
    log: LogInfo
    resume_step: int
    restart_found: bool = Field(
        description="the log has a restart segment starting just after resume_step"
    )
    pre_steps: list[int] = Field(
        description="[first, last] steps of the pre-save window", min_length=2, max_length=2
    )
    post_steps: list[int] = Field(
        description="[first, last] steps of the post-resume window", min_length=2, max_length=2
    )
    pre_loss: float = Field(description="median loss of the pre-save window")
    post_loss: Optional[float] = Field(
        description="median loss just after the resume; null if NaN/inf"
    )
    change: Optional[float] = Field(description="post_loss - pre_loss")
    relative_change: Optional[float] = Field(description="change / |pre_loss|")
    noise: float = Field(description="robust per-step noise (1.4826 * MAD) of the pre-save window")
    band: float = Field(
        description="allowed |change|: max(tolerance * |pre_loss|, 3 * standard error of the post median)"
    )
    jump: bool
    drop: bool
    lr_before: Optional[float] = None
    lr_after: Optional[float] = None
    lr_expected: Optional[float] = None
    lr_discontinuity: Optional[bool] = Field(
        None, description="null when no learning rate is logged"
    )
    reasons: list[str]
    warnings: list[str]
    checkpoints: list[OptimizerSteps] = Field(
        default_factory=list,
        description="--checkpoints: the checkpoint resumed from (first) and the resumed run's "
        "checkpoints after the resume step, each with the optimizer's step counter "
        "against the training step",
    )
    optimizer_reset: Optional[bool] = Field(
        None,
        description="a checkpoint after the resume has an optimizer step "
        "counter that restarted at the resume (or went down); "
        "null without --checkpoints or when not recorded",
    )
    shape_before: Optional[RunShape] = Field(
        None, description="world size and batch of the checkpoint resumed from"
    )
    shape_after: Optional[RunShape] = Field(
        None, description="world size and batch of the first checkpoint after the resume"
    )
    batch_changed: Optional[bool] = Field(
        None, description="the global batch differs between the two (null: not recorded)"
    )


SCHEMAS: dict[str, type[BaseModel]] = {
    "recovery-report.schema.json": RecoveryReport,
    "verify-resume-report.schema.json": VerifyResumeReport,
}
