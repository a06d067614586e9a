"""Pydantic models for `validate` and `prune` (inputs, results, reports).

`CheckpointResult` is the stable result of `validate_checkpoint()`; other capabilities
(release-gate, handoff) consume it, so fields are only ever added, never renamed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from checkpoint_strategy import storage
from checkpoint_strategy.errors import UsageError, pydantic_message
from checkpoint_strategy.formats.reasonkinds import ReasonKind
from checkpoint_strategy.planning.policytiers import PolicyTiers

Status = Literal["valid", "invalid", "incomplete"]
Level = Literal["quick", "full", "deep"]
LEVELS: tuple[str, ...] = get_args(Level)  # the one list of validation levels
ProblemKind = Literal["invalid", "incomplete", "not_resumable", "suspicious"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class Problem(_Model):
    """One thing wrong with a checkpoint: the file (relative to the checkpoint) and why."""

    file: str = Field(
        description="file or folder, relative to the checkpoint ('.' = the checkpoint itself)"
    )
    reason: str = Field(description="what is wrong, in one line")
    kind: ProblemKind = Field(
        "invalid",
        description="invalid = present but corrupt; incomplete = the save did not finish; "
        "not_resumable = loads, but a resume would lose or corrupt optimizer state (deep); "
        "suspicious = loads, but the values look damaged (deep)",
    )


class TensorStat(_Model):
    """Figures of one tensor from the deep level's single pass over its bytes."""

    file: str = Field(description="file relative to the checkpoint")
    tensor: str = Field(description="tensor name (dotted path in the state dict; DCP: the fqn)")
    role: Literal["weights", "optimizer", "other"]
    dtype: str
    shape: list[int]
    numel: int
    nan: int = 0
    inf: int = 0
    l2: Optional[float] = Field(
        None, description="L2 norm of the finite values; null when not a float tensor"
    )
    max_abs: Optional[float] = Field(
        None, description="largest |value| among the finite values (--stats only)"
    )
    note: Optional[str] = None


class OptimizerCheck(_Model):
    """Optimizer state as read from the checkpoint (deep level)."""

    kind: Literal["adam", "other", "none"] = Field(
        description="adam: per-parameter exp_avg/exp_avg_sq; "
        "other: state without Adam moments; none: no optimizer"
    )
    parameters: int = Field(
        0, description="parameters the optimizer lists (param_groups), or weights for DCP"
    )
    with_moments: int = Field(0, description="parameters with both exp_avg and exp_avg_sq")
    shape_mismatches: int = Field(
        0, description="moments whose shape matches no weight (or each other)"
    )
    step: Optional[int] = Field(
        None, description="the optimizer's own step count (largest per-parameter step)"
    )
    global_step: Optional[int] = Field(
        None, description="the trainer's global step, where the checkpoint records it"
    )


class DeepCheck(_Model):
    """Summary of the deep level: every float value read once."""

    tensors: int = Field(description="tensors found")
    float_tensors: int = Field(
        description="float32/float16/bfloat16/float64 tensors whose values were checked"
    )
    values: int = Field(description="values checked")
    bytes_scanned: int
    nonfinite_values: int
    nonfinite: list[str] = Field(
        default_factory=list,
        description="'file: tensor: N NaN, M Inf' for each tensor with non-finite values "
        "(first 20)",
    )
    weights_norm: Optional[float] = Field(None, description="global L2 norm of the model weights")
    weights_dtype: Optional[str] = None
    optimizer: OptimizerCheck
    previous: Optional[str] = Field(
        None, description="the previous checkpoint of the same run compared with"
    )
    norm_ratio: Optional[float] = Field(
        None, description="weights_norm / the previous checkpoint's"
    )
    seconds: float = 0.0


@dataclass(slots=True)
class Seen:
    """What the checker saw of a checkpoint while it checked it, kept on its result (`CheckpointResult._seen`) so
    the commands after it (the report's blind spots, world sizes, prune's survey) do not read it again. Not part of
    the report: a result read back from JSON has none, and every user falls back to reading."""

    families: Optional[tuple[str, ...]] = (
        None  # coverage.families, from the checker's listing of the folder
    )
    flat_names: Optional[tuple[str, ...]] = (
        None  # the folder's names, when they were all regular files (and the
    )
    #                                                folder no symlink): world sizes and prune sizes need no walk
    flat_read: int = 0  # with flat_names: the bytes of those the checker read whole ...
    flat_unread: tuple[
        str, ...
    ] = ()  # ... and the names of the others (prune's sizes lstat only these)
    marker: Optional[dict] = (
        None  # the emergency marker (marker.read_marker), as the checker found it
    )
    trainer_best: Optional[str] = None  # trainer_state.json's best_model_checkpoint (a string) ...
    state_read: bool = False  # ... once the checker parsed that file


class CheckpointResult(_Model):
    """Verdict on one checkpoint (the result of `validate_checkpoint`)."""

    path: str
    format: str = Field(
        description="hf-trainer, lightning, torch, safetensors, dcp, torchtitan, orbax, "
        "deepspeed, megatron, nemo, or unknown"
    )
    step: Optional[int] = None
    status: Status
    resumable: bool = Field(
        description="optimizer state present (training can resume), else weights-only"
    )
    sharded: bool = Field(
        description="per-rank shards (FSDP, DCP, ZeRO, TP/PP, Orbax) instead of a full state dict"
    )
    portability: str = Field(
        description="what this layout means for resuming on other hardware, and what converts it"
    )
    pointer: bool = Field(
        False,
        description="a resume pointer file (DeepSpeed's latest, Megatron-LM's tracker) "
        "naming no checkpoint, not a checkpoint itself",
    )
    level: Level
    files_checked: int = 0
    bytes_read: int = Field(0, description="bytes actually read (quick reads headers only)")
    manifest: Optional[Literal["written", "verified"]] = None
    problems: list[Problem] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    deep: Optional[DeepCheck] = Field(
        None, description="level deep: values, norms and optimizer state"
    )
    # what the checker saw while it checked this checkpoint (`Seen`); not a field
    _seen: Optional[Seen] = PrivateAttr(default=None)

    @property
    def seen(self) -> Optional[Seen]:
        """`_seen`, read without pydantic's __getattr__: a private attribute read costs ~2.5 us that way, ~0.1 us
        here, and the commands after the checker read it for every checkpoint of a big run."""
        private = self.__pydantic_private__
        return private.get("_seen") if private else None

    def passes_deep(self) -> bool:
        """Valid, and (at level deep) no non-resumable or suspicious finding."""
        return self.status == "valid" and not any(
            p.kind in ("not_resumable", "suspicious") for p in self.problems
        )


class CheckpointStats(_Model):
    path: str
    step: Optional[int] = None
    weights_norm: Optional[float] = None
    tensors: list[TensorStat]


class DeepStats(_Model):
    """`validate --level deep --stats FILE.json`: per-tensor figures of every checkpoint."""

    checkpoints: list[CheckpointStats]


class ValidationSummary(_Model):
    checkpoints: int
    valid: int
    invalid: int
    incomplete: int
    seconds: float


class RunSafety(_Model):
    """Which checkpoints of one run folder are safe to resume from (retention/safety.py)."""

    root: str = Field(description="the run folder")
    log: Optional[str] = Field(None, description="the training log read; null when none was found")
    spike_status: Optional[str] = Field(
        None, description="the recovery adviser's status; null when no log was read"
    )
    onset_step: Optional[int] = Field(
        None, description="onset of the unrecovered loss event, if any"
    )
    newest_safe: Optional[str] = Field(
        None,
        description="newest valid checkpoint not after the onset of an "
        "unrecovered loss event, resumable ones first: the one to "
        "resume from",
    )
    newest_safe_step: Optional[int] = None
    newest_safe_resumable: bool = Field(
        False, description="it holds optimizer state (else weights only)"
    )
    safe: int = Field(0, description="valid checkpoints not after the onset (the rollback points)")
    post_onset: list[str] = Field(
        default_factory=list,
        description="valid checkpoints saved after the onset: do not resume from them",
    )
    note: str = ""


class SavedWorldSize(_Model):
    """The processes a checkpoint was saved by, as its layout tells (formats/worldsize.py)."""

    path: str
    world_size: Optional[int] = Field(
        None, description="processes (GPUs) that wrote it; null when the layout does not record it"
    )
    data_parallel: Optional[int] = None
    tensor_parallel: Optional[int] = None
    pipeline_parallel: Optional[int] = None
    shards: Optional[int] = Field(
        None, description="shard files that must be consolidated or re-sharded"
    )
    rng_files: Optional[int] = Field(None, description="per-rank RNG state files (rng_state_N.pth)")
    layout: Literal["rng", "dcp", "zero", "megatron"]
    evidence: str = Field(description="the files that tell")


class HardwareMove(_Model):
    """validate --target-gpus N: what must stay constant and what changes on the new GPU count."""

    target_gpus: int
    saved_world_size: Optional[int] = None
    keep_constant: list[str]
    set_on_target: list[str] = Field(default_factory=list)
    changes: list[str]
    replan: list[str] = Field(
        default_factory=list,
        description="what the new GPU count does to the failure "
        "model and the interval, and the plan command for the new hardware",
    )
    convert: Optional[str] = Field(
        None,
        description="the exact checkpoint-strategy convert command for this layout "
        "(docs/convert.md); null when none applies",
    )


class ValidationReport(_Model):
    level: Level
    manifest: Optional[Literal["write", "verify"]] = None
    hash_algorithm: Optional[str] = None
    checkpoints: list[CheckpointResult]
    summary: ValidationSummary
    safety: list[RunSafety] = Field(
        default_factory=list,
        description="per run folder given: the newest checkpoint "
        "safe to resume from, read against the training log",
    )
    hardware: list[SavedWorldSize] = Field(
        default_factory=list,
        description="valid checkpoints whose layout tells the world size they were saved with",
    )
    hardware_move: Optional[HardwareMove] = Field(
        None, description="--target-gpus N: what stays constant, what changes"
    )
    blind_spots: list[str] = Field(
        default_factory=list,
        description="per format checked: damage this level "
        "cannot see, and what does see it (docs/checkpoints.md, 'What each level sees')",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="what discovery left out, and why (e.g. Orbax "
        "steps soft-deleted into its todelete_subdir)",
    )


_FREQ = re.compile(r"^every_(\d+)_(steps|minutes)$")

PolicyKind = Literal["plan-yaml", "plan-json", "handoff-state", "policy-mapping"]
POLICY_EXPECTED = (
    "expected the plan (YAML with checkpoint_policy:, or plan --format json), the handoff state file "
    "checkpoint-strategy.json, or a policy mapping (keep_last, keep_milestone, ...)"
)
MAX_POLICY_BYTES = 16 << 20
#: keep_milestone: [1000, 5000, ...] continues by doubling (the spec's "powers of 2 * 1000"), this many times
CONTINUE_DOUBLINGS = 20


class CheckpointPolicy(_Model):
    """The `checkpoint_policy:` mapping printed by the plan (spec's policy templates).

    `CheckpointPolicy.from_file(path)` reads it from any file a command or callback is given, detected by content
    (not by name): the plan as YAML (``checkpoint_policy:``, `plan --format yaml`), the plan as JSON (its
    ``policy``), the handoff state file ``.claude/state/checkpoint-strategy.json`` (its ``policy``) or a bare
    mapping; `from_data` the same for a parsed document. The file is read through ``storage`` (regular files
    only, bounded) and parsed with ``json`` or ``yaml.safe_load``: nothing in it runs. Every failure is one
    UsageError line naming the file and what is expected. `file_kind` says which kind it was.
    """

    frequency: Optional[str] = None
    keep_last: Optional[int] = Field(None, ge=1)
    keep_milestone: list[int] = Field(default_factory=list)
    save_optimizer: Optional[bool] = None
    save_formats: list[str] = Field(default_factory=list)
    validate_on_save: Optional[bool] = None
    async_save: Optional[bool] = None
    emergency_save_on: list[str] = Field(default_factory=list)
    delete_invalid: Optional[bool] = Field(
        None,
        description="prune also deletes an invalid or incomplete checkpoint "
        "older than a newer valid one (prune --delete-invalid)",
    )
    tiers: Optional[PolicyTiers] = Field(
        None, description="two-tier plans: local and persistent saves"
    )
    _kind: PolicyKind = PrivateAttr("policy-mapping")
    _document: Any = PrivateAttr(None)

    @field_validator("frequency")
    @classmethod
    def _frequency(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _FREQ.match(value):
            raise ValueError("expected every_<N>_steps, e.g. every_500_steps")
        return value

    @field_validator("keep_milestone")
    @classmethod
    def _milestones(cls, value: list[int]) -> list[int]:
        if any(v < 0 for v in value):
            raise ValueError("milestones are step numbers >= 0")
        return value

    @property
    def file_kind(self) -> PolicyKind:
        """What the policy was read from: plan-yaml, plan-json, handoff-state or policy-mapping."""
        return self._kind

    @property
    def document(self) -> Any:
        """The whole parsed document it was read from (a plan's JSON holds more than its policy)."""
        return self._document

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], option: str = "--policy") -> CheckpointPolicy:
        """The policy in a file of any accepted kind (see the class docstring). UsageError on bad input."""
        p = os.fspath(path)
        if p == "":
            raise UsageError(f"{option}: empty path; {POLICY_EXPECTED}")
        where = f"{option} {p}"
        try:
            raw = storage.read_bytes(p, option, MAX_POLICY_BYTES)
        except storage.ReadError as exc:
            raise UsageError(f"{where}: cannot read ({exc.reason}); {POLICY_EXPECTED}") from None
        return cls.from_data(_parse_policy(raw, where), where)

    @classmethod
    def from_data(cls, data: Any, where: str = "policy") -> CheckpointPolicy:
        """A parsed plan / handoff state / mapping -> the policy (same detection as `from_file`);
        ``keep_milestone: [1000, 5000, ...]`` continues by doubling."""
        inner, kind = _policy_mapping(data, where)
        ms = inner.get("keep_milestone")
        cont = isinstance(ms, list) and bool(ms) and ms[-1] in ("...", Ellipsis, None)
        if cont and isinstance(ms, list):
            inner["keep_milestone"] = ms[:-1]
        try:
            policy = cls.model_validate(inner)
        except ValidationError as exc:
            raise UsageError(f"{where}: " + pydantic_message(exc, "checkpoint_policy")) from None
        if cont and policy.keep_milestone:
            last = policy.keep_milestone[-1]
            policy.keep_milestone = policy.keep_milestone + [
                last * 2**k for k in range(1, CONTINUE_DOUBLINGS + 1)
            ]
        policy._kind, policy._document = kind, data
        return policy


def _parse_policy(raw: bytes, where: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not UTF-8 text; {POLICY_EXPECTED}") from None
    try:  # syntax (with its line), deep nesting, integers past the digit limit: one line each
        if text.lstrip().startswith(("{", "[")):
            return storage.loads_json(text, where)
        return storage.loads_yaml(text, where)
    except storage.ReadError as exc:
        raise UsageError(f"{where}: {exc.reason}; {POLICY_EXPECTED}") from None


def _policy_mapping(data: Any, where: str) -> tuple[dict, PolicyKind]:
    if not isinstance(data, dict):
        raise UsageError(
            f"{where}: expected a mapping, got a {type(data).__name__}; {POLICY_EXPECTED}"
        )
    kind: PolicyKind
    if "checkpoint_policy" in data:
        inner, kind = data["checkpoint_policy"], "plan-yaml"
    elif "policy" in data and (
        "producer" in data or "next_step" in data or "schema_version" in data
    ):
        inner, kind = data["policy"], "handoff-state"
        if inner is None:
            raise UsageError(
                f"{where}: the handoff state holds no policy (handoff ran without a plan); "
                "pass the plan instead"
            )
    elif "policy" in data:
        inner, kind = data["policy"], "plan-json"
    else:
        inner, kind = data, "policy-mapping"
    if not isinstance(inner, dict):
        raise UsageError(
            f"{where}: expected a mapping as the policy, got a {type(inner).__name__}; {POLICY_EXPECTED}"
        )
    return dict(inner), kind


class PruneEntry(_Model):
    path: str
    name: str
    format: str
    step: Optional[int] = None
    status: Optional[Status] = Field(
        None, description="validation status (None when not recognised)"
    )
    resumable: Optional[bool] = Field(
        None,
        description="optimizer state present (resumable) or weights-only; None when not validated",
    )
    layout: Optional[str] = Field(
        None,
        description="the known name pattern it matches exactly (checkpoint-<int>, "
        "global_step<int>, ...); None = not recognised, kept",
    )
    symlink: bool = Field(
        False, description="a symlink or outside ROOT: never deleted, never justifies a deletion"
    )
    action: Literal["keep", "delete"]
    reasons: list[str]
    reason_kinds: list[ReasonKind] = Field(
        default_factory=list,
        description="the kind of each reason, in order (formats.reasonkinds.REASON_KINDS)",
    )
    justified_by: Optional[str] = Field(
        None, description="delete: the newer validated checkpoint that stands in"
    )
    bytes: Optional[int] = Field(
        None, description="bytes on disk (a recognised checkpoint; symlinks not followed)"
    )
    deleted: bool = False
    error: Optional[str] = Field(
        None,
        description="why this deletion failed (the checkpoint is intact unless "
        "half_deleted says otherwise)",
    )


class SpikeGuard(_Model):
    """What the training log says about a loss spike, read before anything is deleted."""

    log: str = Field(
        description="the training log read (--log, else the run folder's: formats/runlog.py)"
    )
    status: Optional[str] = Field(
        None, description="the recovery adviser's status, None when the log was unreadable"
    )
    onset_step: Optional[int] = None
    cutoff_step: Optional[int] = Field(
        None,
        description="unrecovered spike: checkpoints above this step (onset - margin, recover's cut) hold "
        "spiked weights: do not resume from them",
    )
    protected: Optional[str] = Field(
        None, description="the checkpoint `recover` would resume from, kept"
    )
    pre_spike: dict[str, str] = Field(
        default_factory=dict,
        description="name -> why: the newest checkpoint before each loss spike in the log "
        "(recovered ones too), kept unless --no-spike-check",
    )
    note: str


PruneState = Literal["dry_run", "done", "half_deleted", "failed"]


class PruneSuggestion(_Model):
    """The plan frees nothing: what would."""

    keep_last: int = Field(
        description="the smallest keep_last that still keeps every rollback point and frees space"
    )
    delete: list[str] = Field(description="what that keep_last would delete")
    bytes: int = Field(description="bytes on disk those checkpoints take (what it would free)")
    rollback_points: list[str] = Field(
        default_factory=list,
        description="the rollback points it still keeps (the "
        "spike guard's rollback checkpoint, the checkpoint before each spike)",
    )
    best: list[str] = Field(
        default_factory=list,
        description="the trainer's best now, which every keep_last keeps "
        "(HF: the newest trainer_state.json's best_model_checkpoint; Lightning: the monitored "
        "ModelCheckpoint's best_k_models in the newest checkpoint)",
    )


class PruneReport(_Model):
    root: str
    applied: bool
    level: Level
    keep_last: int
    milestones: list[int]
    best_checkpoint: Optional[str] = Field(
        None,
        description="the trainer's best now: HF's best_model_checkpoint in the "
        "newest trainer_state.json (the newest valid checkpoint's, or the run "
        "folder's when as new), Lightning's best_model_path in the newest valid "
        "checkpoint's monitored ModelCheckpoint state",
    )
    newest_valid: Optional[str] = Field(
        None, description="the newest checkpoint keep_last counts (resumable when the run has any)"
    )
    counts_resumable: bool = Field(
        False,
        description="keep_last counts resumable checkpoints (the run has some); "
        "weights-only ones never justify deleting them",
    )
    final_export: Optional[str] = Field(
        None,
        description="the run folder's own top-level model files (HF "
        "output_dir): validated, never deleted",
    )
    lightning_templates: list[str] = Field(
        default_factory=list,
        description="Lightning ModelCheckpoint filename templates found in ROOT",
    )
    keep: list[PruneEntry]
    delete: list[PruneEntry]
    leftovers: list[str] = Field(
        default_factory=list,
        description="'.deleting-*' folders of an interrupted prune (in its journal; "
        "finished by --apply)",
    )
    foreign_leftovers: list[str] = Field(
        default_factory=list, description="'.deleting-*' names prune did not create: never touched"
    )
    reasons: dict[str, list[str]] = Field(
        description="name -> reasons for its keep/delete decision"
    )
    deleted: int = Field(0, description="checkpoints actually deleted by this run")
    failed: int = Field(0, description="deletions that failed")
    freed_bytes: int = Field(0, description="bytes of the checkpoints actually deleted")
    bytes_to_free: int = Field(
        0, description="bytes the checkpoints marked delete take on disk (what --apply frees)"
    )
    proposed: Optional[str] = Field(
        None,
        description="no --keep-last/--policy given: the retention proposed from "
        "the run itself, and where each number came from",
    )
    state: PruneState = Field(
        "dry_run",
        description="dry_run; done; half_deleted = a deletion stopped half-way "
        "(rerun prune --apply to finish); failed = nothing half-done "
        "but some deletions failed",
    )
    errors: list[Problem] = Field(default_factory=list)
    spike_guard: Optional[SpikeGuard] = Field(
        None,
        description="unrecovered loss spike in the training log: its rollback checkpoint is kept",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="symlinks out of ROOT or dangling, resume-pointer trouble, and what the "
        "storage adds (object storage: a versioned bucket keeps deleted objects as "
        "old versions; finished or dropped journal entries)",
    )
    justifiers: list[str] = Field(
        default_factory=list,
        description="the newer checkpoints that justify the "
        "deletions: checked again at recheck_level right before anything is deleted",
    )
    delete_invalid: bool = Field(
        False,
        description="--delete-invalid: invalid or incomplete checkpoints older "
        "than a newer valid one (not a save in flight) may be deleted",
    )
    old_invalid: list[str] = Field(
        default_factory=list,
        description="invalid or incomplete checkpoints older than a "
        "newer valid one, kept (without --delete-invalid; or another rule keeps them)",
    )
    old_invalid_bytes: int = Field(
        0, description="bytes those take on disk (what --delete-invalid would free)"
    )
    recheck_level: Level = Field(
        "full",
        description="the level the justifiers are checked at before deleting: at "
        "least full (CRC-32 of every file), whatever --level the survey used",
    )
    suggestion: Optional[PruneSuggestion] = Field(
        None,
        description="nothing to delete: the smallest keep_last that "
        "still keeps every rollback point, and the bytes it frees",
    )


StepVerdict = Literal["consistent", "reset", "behind", "ahead", "unknown"]


class OptimizerSteps(_Model):
    """The optimizer's own step counter against the training step, as one checkpoint records them
    (formats/optstep.py; read as pickle opcodes and DCP metadata, nothing loaded)."""

    path: str
    format: str
    training_step: Optional[int] = Field(
        None,
        description="the training step the checkpoint records (optimizer "
        "steps taken: HF global_step, Lightning global_step, "
        "DeepSpeed global_steps, DCP/torchtitan train_state.step)",
    )
    training_step_from: Optional[str] = Field(None, description="where training_step was read")
    skipped_steps: Optional[int] = Field(
        None,
        description="steps the optimizer skipped on purpose (DeepSpeed "
        "skipped_steps: fp16 overflow); not counted by it",
    )
    optimizer_step: Optional[int] = Field(
        None,
        description="the optimizer's step counter (largest per-parameter "
        "'step'; summed over a Lightning checkpoint's optimizers)",
    )
    optimizer_step_from: Optional[str] = Field(None, description="where optimizer_step was read")
    scheduler_step: Optional[int] = Field(
        None, description="the LR scheduler's last_epoch (steps it has taken), where recorded"
    )
    scheduler_step_from: Optional[str] = None
    verdict: StepVerdict = Field(
        "unknown",
        description="consistent: counter = training step - skipped steps; "
        "reset: the counter covers only the steps since the resume; "
        "behind / ahead: other mismatches; unknown: a number is "
        "not recorded",
    )
    restart_step: Optional[int] = Field(
        None,
        description="training_step - optimizer_step: the step at which a "
        "counter that lags would have started from zero",
    )
    reason: str = ""


class RunShape(_Model):
    """The processes and batch a checkpoint was trained with, as its own files record them (formats/runshape.py)."""

    path: str
    world_size: Optional[int] = Field(
        None, description="data-parallel processes; null when not recorded"
    )
    world_from: Optional[str] = None
    per_device_batch: Optional[int] = None
    accumulation: Optional[int] = Field(None, description="gradient accumulation steps")
    global_batch: Optional[int] = Field(
        None, description="samples per optimizer step over all processes"
    )
    batch_from: Optional[str] = None


@dataclass
class DcpItem:
    """One stored item a DCP .metadata names: a tensor chunk (its sizes and dtype) or a bytes object (read by
    formats/dcp.py `dcp_metadata`, checked by formats/filechecks.py `check_dcp_file`: here, below both)."""

    fqn: str
    rel: str
    offset: int
    length: int
    sizes: tuple | None = None
    dtype: str | None = None
    transformed: bool = False
    offsets: tuple | None = None  # a tensor chunk's place in its tensor (None: a bytes entry)


SCHEMAS: dict[str, type[BaseModel]] = {
    "validation-report.schema.json": ValidationReport,
    "deep-stats.schema.json": DeepStats,
    "prune-report.schema.json": PruneReport,
}
